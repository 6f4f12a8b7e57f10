//! Unit tests of the status classification.

use prost::Message;

use super::*;

fn status_with(code: tonic::Code, info: ErrorInfo) -> tonic::Status {
    tonic::Status::with_details(code, "node message", info.encode_to_vec().into())
}

fn info(kind: Kind) -> ErrorInfo {
    ErrorInfo {
        kind: kind as i32,
        ..Default::default()
    }
}

#[test]
fn not_leader_carries_the_leader_endpoint() {
    let st = status_with(
        tonic::Code::FailedPrecondition,
        ErrorInfo {
            leader_id: 2,
            leader_endpoint: "127.0.0.1:7479".into(),
            ..info(Kind::NotLeader)
        },
    );
    let f = classify_status(&st);
    assert_eq!(
        f.error,
        Error::NotLeader {
            leader_id: 2,
            leader_endpoint: Some("127.0.0.1:7479".into())
        }
    );
    assert!(f.not_applied && f.retry);
    assert!(f.error.is_retryable());
    assert!(f.error.to_string().contains("127.0.0.1:7479"));
}

#[test]
fn not_leader_without_hint_has_no_endpoint() {
    let f = classify_status(&status_with(tonic::Code::Unavailable, info(Kind::NotLeader)));
    assert_eq!(
        f.error,
        Error::NotLeader {
            leader_id: 0,
            leader_endpoint: None
        }
    );
}

#[test]
fn limit_names_the_limit_and_is_final() {
    let st = status_with(
        tonic::Code::InvalidArgument,
        ErrorInfo {
            limit: "max_key_bytes".into(),
            message: "key is 20000 bytes".into(),
            ..info(Kind::Limit)
        },
    );
    let f = classify_status(&st);
    assert_eq!(
        f.error,
        Error::InvalidArgument {
            message: "key is 20000 bytes".into(),
            limit: Some("max_key_bytes".into())
        }
    );
    assert!(!f.retry && f.not_applied);
    assert!(!f.error.is_retryable());
    assert!(f.error.to_string().contains("max_key_bytes"));
}

#[test]
fn ambiguous_is_retried_with_the_session_but_not_retryable_for_callers() {
    let f = classify_status(&status_with(tonic::Code::Unavailable, info(Kind::Ambiguous)));
    assert!(matches!(f.error, Error::Ambiguous { .. }));
    assert!(f.retry && !f.not_applied);
    assert!(f.error.is_ambiguous());
    assert!(!f.error.is_retryable());
}

#[test]
fn a_stale_sequence_is_final_and_flags_the_session() {
    let st = status_with(
        tonic::Code::Unknown,
        ErrorInfo {
            reason: ftkv_proto::status_details::REASON_STALE_SEQUENCE.into(),
            ..info(Kind::Ambiguous)
        },
    );
    let f = classify_status(&st);
    assert!(f.error.is_ambiguous() && !f.not_applied, "{f:?}");
    assert!(f.stale_session && !f.retry, "{f:?}");
    let other = classify_status(&status_with(tonic::Code::Unknown, info(Kind::Ambiguous)));
    assert!(!other.stale_session && other.retry);
    // The reason decides, never the text: the old message alone is a plain ambiguous answer.
    let text_only = classify_status(&status_with(
        tonic::Code::Unknown,
        ErrorInfo {
            message: "session sequence is below the server's window for this client".into(),
            ..info(Kind::Ambiguous)
        },
    ));
    assert!(!text_only.stale_session && text_only.retry, "{text_only:?}");
}

#[test]
fn not_on_all_replicas_reads_the_index_from_the_message() {
    let st = status_with(
        tonic::Code::DeadlineExceeded,
        ErrorInfo {
            message: "ack=all timed out, log_index=42".into(),
            ..info(Kind::NotOnAllReplicas)
        },
    );
    let f = classify_status(&st);
    assert!(matches!(
        f.error,
        Error::NotOnAllReplicas {
            log_index: Some(42),
            ..
        }
    ));
    assert!(!f.retry);
}

#[test]
fn resource_exhausted_with_no_space_is_a_definite_refusal() {
    let mut i = info(Kind::NoSpace);
    i.limit = "space.quota_bytes".into();
    i.reason = "NO_SPACE".into();
    i.metadata.insert("node_id".into(), "2".into());
    let f = classify_status(&status_with(tonic::Code::ResourceExhausted, i));
    assert!(f.not_applied && !f.retry, "{f:?}");
    match f.error {
        Error::NoSpace { limit, metadata, .. } => {
            assert_eq!(limit.as_deref(), Some("space.quota_bytes"));
            assert_eq!(metadata["node_id"], "2");
        }
        other => panic!("{other:?}"),
    }
    // A bare RESOURCE_EXHAUSTED (a codec's) stays ambiguous.
    let bare = classify_status(&tonic::Status::resource_exhausted("no space"));
    assert!(!bare.not_applied);
}

#[test]
fn unavailable_and_storage_fault() {
    let f = classify_status(&status_with(tonic::Code::Unavailable, info(Kind::Unavailable)));
    assert!(matches!(f.error, Error::Unavailable { .. }) && f.retry && f.not_applied);
    let f = classify_status(&status_with(tonic::Code::Internal, info(Kind::StorageFault)));
    assert!(matches!(f.error, Error::StorageFault { .. }) && !f.retry);
}

#[test]
fn statuses_without_error_info_are_classified_by_code() {
    let f = classify_status(&tonic::Status::unavailable("connection reset"));
    assert!(matches!(f.error, Error::Transport { .. }));
    assert!(
        f.retry && !f.not_applied,
        "a broken connection leaves the outcome unknown"
    );
    let f = classify_status(&tonic::Status::invalid_argument("bad"));
    assert_eq!(
        f.error,
        Error::InvalidArgument {
            message: "bad".into(),
            limit: None
        }
    );
    let f = classify_status(&tonic::Status::unimplemented("nope"));
    assert!(matches!(f.error, Error::Server { ref code, .. } if code == "Unimplemented"));
    assert!(!f.not_applied && !f.retry);
    let f = classify_status(&tonic::Status::internal("boom"));
    assert!(!f.not_applied && !f.retry);
}

#[test]
fn statuses_without_the_servers_error_info_never_mean_not_applied() {
    // Transport and codec statuses (e.g. a response over the message limit: OUT_OF_RANGE or
    // RESOURCE_EXHAUSTED) can come after the server committed the write.
    for code in [
        tonic::Code::OutOfRange,
        tonic::Code::InvalidArgument,
        tonic::Code::ResourceExhausted,
        tonic::Code::FailedPrecondition,
        tonic::Code::Unimplemented,
        tonic::Code::PermissionDenied,
        tonic::Code::NotFound,
        tonic::Code::Internal,
    ] {
        let f = classify_status(&tonic::Status::new(
            code,
            "Error, encoded message length too large",
        ));
        assert!(!f.not_applied, "{code:?} without ErrorInfo: {f:?}");
        let garbage = tonic::Status::with_details(code, "x", vec![0xff, 0xff, 0xff].into());
        assert!(
            !classify_status(&garbage).not_applied,
            "{code:?} with garbage details"
        );
        let unspecified = status_with(code, info(Kind::Unspecified));
        assert!(
            !classify_status(&unspecified).not_applied,
            "{code:?} with KIND_UNSPECIFIED"
        );
    }
    // The server's own refusals still mean not applied.
    for kind in [
        Kind::Limit,
        Kind::Invalid,
        Kind::NotLeader,
        Kind::Unavailable,
        Kind::NoSpace,
        Kind::Unauthenticated,
        Kind::PermissionDenied,
    ] {
        let f = classify_status(&status_with(tonic::Code::InvalidArgument, info(kind)));
        assert!(f.not_applied, "{kind:?}: {f:?}");
    }
}

#[test]
fn a_storage_fault_leaves_a_write_maybe_applied() {
    // The node may have failed its own fsync after sending the entry to its followers.
    let f = classify_status(&status_with(tonic::Code::Internal, info(Kind::StorageFault)));
    assert!(matches!(f.error, Error::StorageFault { .. }) && !f.retry);
    assert!(!f.not_applied, "{f:?}");
}

#[test]
fn garbage_details_fall_back_to_the_code() {
    let st = tonic::Status::with_details(tonic::Code::InvalidArgument, "x", vec![0xff, 0xff, 0xff].into());
    let f = classify_status(&st);
    assert!(matches!(f.error, Error::InvalidArgument { limit: None, .. }));
}

#[test]
fn requests_over_a_client_limit_are_final_and_not_applied() {
    let f = classify_status(&over_client_limit("max_message_bytes", "request is 9 bytes"));
    assert_eq!(
        f.error,
        Error::InvalidArgument {
            message: "request is 9 bytes".into(),
            limit: Some("max_message_bytes".into())
        }
    );
    assert!(f.not_applied && !f.retry);
    let f = classify_status(&not_sent("queued"));
    assert!(matches!(f.error, Error::Unavailable { .. }) && f.not_applied && f.retry);
}

#[test]
fn connect_errors_mean_not_sent() {
    let st = tonic::Status::from_error(Box::new(tonic::ConnectError(Box::new(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "refused",
    )))));
    assert_eq!(st.code(), tonic::Code::Unavailable);
    let f = classify_status(&st);
    assert!(
        matches!(f.error, Error::Unavailable { ref message } if message.contains("refused")),
        "{f:?}"
    );
    assert!(f.not_applied && f.retry);
}

#[test]
fn auth_refusals_and_denials_are_typed_and_definite() {
    let f = classify_status(&status_with(
        tonic::Code::Unauthenticated,
        info(Kind::Unauthenticated),
    ));
    assert!(matches!(f.error, Error::Unauthenticated { .. }) && f.not_applied && !f.retry);
    let f = classify_status(&status_with(
        tonic::Code::PermissionDenied,
        info(Kind::PermissionDenied),
    ));
    assert!(matches!(f.error, Error::PermissionDenied { .. }) && f.not_applied && !f.retry);
    let refused = ErrorInfo {
        reason: ftkv_proto::status_details::REASON_AUTH_REFUSED.into(),
        message: "user \"x\" not found".into(),
        ..info(Kind::Unspecified)
    };
    let f = classify_status(&status_with(tonic::Code::NotFound, refused));
    assert_eq!(
        f.error,
        Error::Server {
            code: "NotFound".into(),
            message: "user \"x\" not found".into()
        }
    );
    assert!(f.not_applied && !f.retry);
}
