//! The one mapping from internal errors to gRPC statuses. Every status carries an
//! `ftkv.v1.ErrorInfo` in its details so clients can tell a redirect from an ambiguous write:
//! wrapped as the one `Any` of a `google.rpc.Status` ([`ftkv_proto::status_details`]), the
//! standard `grpc-status-details-bin` encoding that stock gRPC tooling decodes.

use ftkv_proto::v1::{error_info::Kind, ErrorInfo};
use tonic::{Code, Status};

use crate::cluster::ClusterError;
use crate::limits::LimitError;

/// Builds a status with an `ErrorInfo` detail.
pub fn status(code: Code, info: ErrorInfo) -> Status {
    let details = ftkv_proto::status_details::encode(code as i32, &info.message, &info);
    Status::with_details(code, info.message, details.into())
}

fn info(kind: Kind, message: String) -> ErrorInfo {
    ErrorInfo {
        kind: kind as i32,
        message,
        ..Default::default()
    }
}

/// A request over a limit: `INVALID_ARGUMENT` naming the limit.
pub fn limit(err: &LimitError) -> Status {
    let mut i = info(Kind::Limit, err.to_string());
    i.limit = err.limit_name().to_string();
    status(Code::InvalidArgument, i)
}

/// Whether `status` is tonic's refusal of a received message over the decoding limit (its codec
/// says `OUT_OF_RANGE` "decoded message length too large", or `RESOURCE_EXHAUSTED` when a
/// compressed message inflates past it).
pub fn is_decode_size_limit(status: &Status) -> bool {
    let message = status.message();
    (status.code() == Code::OutOfRange && message.contains("decoded message length too large"))
        || (status.code() == Code::ResourceExhausted && message.contains("size limit"))
}

/// A request message over the server's decoding limit: `RESOURCE_EXHAUSTED` with KIND_LIMIT
/// naming `max_request_message_bytes`, and tonic's own text (it holds both sizes).
pub fn request_too_large(transport_message: &str) -> Status {
    let mut i = info(
        Kind::Limit,
        format!(
            "request message over the server's limit max_request_message_bytes = {}: \
             {transport_message}",
            crate::limits::MAX_REQUEST_MESSAGE_BYTES
        ),
    );
    i.limit = "max_request_message_bytes".into();
    status(Code::ResourceExhausted, i)
}

/// Why a `Kv.Batch` request stream could not be read further: a message over the decoding
/// limit is [`request_too_large`]; anything else (garbage, a broken stream) `INVALID_ARGUMENT`.
pub fn broken_request_stream(cause: &Status) -> Status {
    if is_decode_size_limit(cause) {
        return request_too_large(cause.message());
    }
    invalid(format!(
        "the batch request stream could not be read further ({}: {}); every item taken before \
         was answered",
        cause.code(),
        cause.message()
    ))
}

/// An answer of `bytes` encoded bytes, over what any response message may carry
/// (`max_response_message_bytes`, what a stock gRPC client accepts). For a read nothing was
/// applied: `RESOURCE_EXHAUSTED` with KIND_LIMIT. An answer to a request that wrote (a Txn
/// with writes) must not claim the writes were not applied: `UNKNOWN` with KIND_AMBIGUOUS.
pub fn response_too_large(what: &str, bytes: usize, wrote: bool) -> Status {
    let limit = crate::limits::MAX_RESPONSE_MESSAGE_BYTES;
    if wrote {
        return ambiguous(format!(
            "{what} is {bytes} bytes, over the limit max_response_message_bytes = {limit}; its \
             writes may have been applied (read fewer keys per request)"
        ));
    }
    let mut i = info(
        Kind::Limit,
        format!(
            "{what} is {bytes} bytes, over the limit max_response_message_bytes = {limit} \
             (read fewer keys per request)"
        ),
    );
    i.limit = "max_response_message_bytes".into();
    status(Code::ResourceExhausted, i)
}

/// A malformed request: `INVALID_ARGUMENT`.
pub fn invalid(message: impl Into<String>) -> Status {
    status(Code::InvalidArgument, info(Kind::Invalid, message.into()))
}

/// The answer to a plaintext client of a TLS port: `FAILED_PRECONDITION`, `KIND_INVALID`,
/// reason [`ftkv_proto::status_details::REASON_TLS_REQUIRED`] (what clients match on).
pub fn tls_required() -> Status {
    let mut i = info(
        Kind::Invalid,
        "this port requires TLS: connect with TLS (https://, ftkvctl --cacert) instead of plaintext".into(),
    );
    i.reason = ftkv_proto::status_details::REASON_TLS_REQUIRED.to_string();
    status(Code::FailedPrecondition, i)
}

/// No valid credentials: `UNAUTHENTICATED`, KIND_UNAUTHENTICATED.
pub fn unauthenticated(message: impl Into<String>) -> Status {
    status(Code::Unauthenticated, info(Kind::Unauthenticated, message.into()))
}

/// The caller's roles do not allow the call: `PERMISSION_DENIED`, KIND_PERMISSION_DENIED (the
/// message names the user, the range and the permission).
pub fn permission_denied(message: impl Into<String>) -> Status {
    status(
        Code::PermissionDenied,
        info(Kind::PermissionDenied, message.into()),
    )
}

/// A user or role that does not exist: `NOT_FOUND`.
pub fn not_found(message: impl Into<String>) -> Status {
    let mut i = info(Kind::Unspecified, message.into());
    i.reason = ftkv_proto::status_details::REASON_AUTH_REFUSED.to_string();
    status(Code::NotFound, i)
}

/// `Authenticate` while auth is disabled: `FAILED_PRECONDITION`, reason
/// [`ftkv_proto::status_details::REASON_AUTH_NOT_ENABLED`] (a client then sends no token).
pub fn auth_not_enabled() -> Status {
    let mut i = info(
        Kind::Unspecified,
        "auth is not enabled: requests need no token (ftkvctl auth enable turns it on)".into(),
    );
    i.reason = ftkv_proto::status_details::REASON_AUTH_NOT_ENABLED.to_string();
    status(Code::FailedPrecondition, i)
}

/// An auth change the state machine refused: `NOT_FOUND`, `ALREADY_EXISTS`,
/// `FAILED_PRECONDITION` or `INVALID_ARGUMENT`; nothing changed.
pub fn auth_refused(refusal: &crate::auth::AuthRefusal) -> Status {
    use crate::auth::AuthRefusalKind as K;
    let (code, kind) = match refusal.kind {
        K::NotFound => (Code::NotFound, Kind::Unspecified),
        K::AlreadyExists => (Code::AlreadyExists, Kind::Unspecified),
        K::FailedPrecondition => (Code::FailedPrecondition, Kind::Unspecified),
        K::Invalid => (Code::InvalidArgument, Kind::Invalid),
    };
    let mut i = info(kind, refusal.message.clone());
    i.reason = ftkv_proto::status_details::REASON_AUTH_REFUSED.to_string();
    status(code, i)
}

/// A write whose session sequence is below this node's window for its client id
/// (`CommandResult::StaleSequence`): `UNKNOWN` with KIND_AMBIGUOUS and the reason
/// [`ftkv_proto::status_details::REASON_STALE_SEQUENCE`], what clients match on.
pub fn stale_sequence() -> Status {
    let mut i = info(
        Kind::Ambiguous,
        "session sequence is below the server's window for this client: its outcome was \
         forgotten (start a new client session to keep writing)"
            .to_string(),
    );
    i.reason = ftkv_proto::status_details::REASON_STALE_SEQUENCE.to_string();
    status(Code::Unknown, i)
}

/// A write whose outcome this node cannot tell: `UNKNOWN` with KIND_AMBIGUOUS.
pub fn ambiguous(message: impl Into<String>) -> Status {
    status(Code::Unknown, info(Kind::Ambiguous, message.into()))
}

/// An engine error while serving a read: the node's storage is at fault.
pub fn engine(err: &ftkv_engine::EngineError) -> Status {
    status(
        Code::Internal,
        info(Kind::StorageFault, format!("storage engine: {err}")),
    )
}

/// Maps a cluster error.
pub fn cluster(err: ClusterError) -> Status {
    let message = err.to_string();
    match err {
        ClusterError::NotLeader {
            leader_id,
            leader_client_addr,
        } => {
            let mut i = info(Kind::NotLeader, message);
            i.leader_id = leader_id.unwrap_or(0);
            i.leader_endpoint = leader_client_addr.unwrap_or_default();
            status(Code::FailedPrecondition, i)
        }
        ClusterError::Ambiguous(_) => status(Code::Unknown, info(Kind::Ambiguous, message)),
        ClusterError::NotOnAllReplicas { log_index } => {
            let mut i = info(Kind::NotOnAllReplicas, message);
            i.log_index = log_index;
            status(Code::DeadlineExceeded, i)
        }
        ClusterError::Unavailable(_) => status(Code::Unavailable, info(Kind::Unavailable, message)),
        ClusterError::Storage(_) => status(Code::Internal, info(Kind::StorageFault, message)),
        ClusterError::Invalid(_) => status(Code::InvalidArgument, info(Kind::Invalid, message)),
        ClusterError::NoSpace(alarm) => no_space(Code::ResourceExhausted, &alarm, message),
        ClusterError::Draining { node_id } => {
            let mut i = info(Kind::Unavailable, message);
            i.reason = ftkv_proto::status_details::REASON_DRAINING.to_string();
            i.metadata.insert("node_id".into(), node_id.to_string());
            status(Code::Unavailable, i)
        }
    }
}

/// A write refused (or an alarm kept) because of the NOSPACE alarm: `code` with KIND_NO_SPACE,
/// reason `NO_SPACE`, `limit` naming the quota and `metadata` the node, data dir and figures.
pub fn no_space(code: Code, alarm: &crate::space::Alarm, message: String) -> Status {
    let mut i = info(Kind::NoSpace, message);
    i.limit = alarm.limit.to_string();
    i.reason = crate::space::NO_SPACE_REASON.to_string();
    i.metadata = alarm.metadata.clone().into_iter().collect();
    status(code, i)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn not_leader_carries_the_leader_endpoint() {
        let s = cluster(ClusterError::NotLeader {
            leader_id: Some(2),
            leader_client_addr: Some("h:1".into()),
        });
        assert_eq!(s.code(), Code::FailedPrecondition);
        let i = ftkv_proto::status_details::decode(s.details()).unwrap();
        assert_eq!(i.kind, Kind::NotLeader as i32);
        assert_eq!(i.leader_endpoint, "h:1");
        assert_eq!(i.leader_id, 2);
    }

    #[test]
    fn error_info_travels_in_a_google_rpc_status() {
        let s = limit(&LimitError::EmptyKey);
        let rpc = tonic_types::Status::decode(s.details()).unwrap();
        assert_eq!(rpc.code, Code::InvalidArgument as i32);
        assert_eq!(rpc.message, s.message());
        assert_eq!(rpc.details.len(), 1);
        assert_eq!(rpc.details[0].type_url, "type.googleapis.com/ftkv.v1.ErrorInfo");
        let i = ErrorInfo::decode(rpc.details[0].value.as_slice()).unwrap();
        assert_eq!(i.limit, "empty_key");
    }

    #[test]
    fn draining_is_unavailable_with_its_reason() {
        let s = cluster(ClusterError::Draining { node_id: 3 });
        assert_eq!(s.code(), Code::Unavailable);
        let i = ftkv_proto::status_details::decode(s.details()).unwrap();
        assert_eq!(i.kind, Kind::Unavailable as i32);
        assert_eq!(i.reason, ftkv_proto::status_details::REASON_DRAINING);
        assert!(i.message.contains("draining"), "{}", i.message);
    }

    #[test]
    fn a_stale_sequence_carries_its_reason() {
        let s = stale_sequence();
        assert_eq!(s.code(), Code::Unknown);
        let i = ftkv_proto::status_details::decode(s.details()).unwrap();
        assert_eq!(i.kind, Kind::Ambiguous as i32);
        assert_eq!(i.reason, ftkv_proto::status_details::REASON_STALE_SEQUENCE);
    }

    #[test]
    fn limit_names_the_limit() {
        let s = limit(&LimitError::EmptyKey);
        assert_eq!(s.code(), Code::InvalidArgument);
        let i = ftkv_proto::status_details::decode(s.details()).unwrap();
        assert_eq!(i.limit, "empty_key");
    }
}
