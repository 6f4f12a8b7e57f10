//! ftkv's wire protocol: types and tonic client/server stubs generated from
//! `proto/ftkv/v1/kv.proto` (client API: `ftkv.v1.Kv`, `ftkv.v1.Cluster`),
//! `proto/ftkv/v1/maintenance.proto`, `proto/ftkv/v1/auth.proto` (`ftkv.v1.Auth`: users, roles,
//! tokens) and
//! `proto/ftkv/raft/v1/raft.proto` (peer RPCs: `ftkv.raft.v1.Raft`).
//!
//! Generated at build time in pure Rust (protox + tonic-prost-build); needs no
//! system `protoc`. Depends on nothing of ftkv itself.
#![allow(clippy::all, missing_docs)]

/// Client API, version 1.
pub mod v1 {
    tonic::include_proto!("ftkv.v1");
}

/// Peer-to-peer Raft transport.
pub mod raft {
    /// Version 1 of the peer protocol.
    pub mod v1 {
        tonic::include_proto!("ftkv.raft.v1");
    }
}

/// Encoded `FileDescriptorSet` of every ftkv proto file, for gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ftkv_descriptor");

/// How an `ftkv.v1.ErrorInfo` travels in a status: as the one `google.protobuf.Any` detail of a
/// `google.rpc.Status` (the standard richer-error model), encoded into the status details
/// (`grpc-status-details-bin`), so stock gRPC tooling (grpcurl, `tonic-types`' `StatusExt`,
/// grpc-go's `status.FromError`) decodes it. Batch item errors (`ItemError.details`) carry the
/// same bytes.
pub mod status_details {
    use prost::Message;

    use crate::v1::ErrorInfo;

    /// `ErrorInfo.reason` of a write whose session sequence is below the node's window for its
    /// client id (KIND_AMBIGUOUS): its outcome was forgotten, and every retry under that client
    /// id gets the same answer.
    pub const REASON_STALE_SEQUENCE: &str = "STALE_SEQUENCE";

    /// `ErrorInfo.reason` of a request refused because the node is draining (shutting down,
    /// KIND_UNAVAILABLE): not applied; clients send it to another node.
    pub const REASON_DRAINING: &str = "DRAINING";

    /// `ErrorInfo.reason` of the answer a TLS port gives a plaintext client
    /// (`FAILED_PRECONDITION`, KIND_INVALID): the client must connect with TLS.
    pub const REASON_TLS_REQUIRED: &str = "TLS_REQUIRED";

    /// `ErrorInfo.reason` of `Auth.Authenticate` while auth is disabled (`FAILED_PRECONDITION`):
    /// requests need no token.
    pub const REASON_AUTH_NOT_ENABLED: &str = "AUTH_NOT_ENABLED";

    /// `ErrorInfo.reason` of an auth administration call the cluster refused under its users
    /// and roles (`NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION`): nothing changed.
    pub const REASON_AUTH_REFUSED: &str = "AUTH_REFUSED";

    /// `ErrorInfo.reason` of a bulk load (ON_DUPLICATE_ERROR) that met a key twice
    /// (`ALREADY_EXISTS`, KIND_INVALID); `metadata`: `key` (hex), `first_row` (absent when the key
    /// existed before the load), `second_row`. Nothing of the load is visible.
    pub const REASON_DUPLICATE_KEY: &str = "DUPLICATE_KEY";

    /// `ErrorInfo.reason` of a bulk load cancelled before it committed (a leader change, a
    /// broken stream; KIND_UNAVAILABLE): not applied, run it again.
    pub const REASON_LOAD_CANCELLED: &str = "LOAD_CANCELLED";

    /// `type_url` of the `Any` that wraps an `ErrorInfo`.
    pub const ERROR_INFO_TYPE_URL: &str = "type.googleapis.com/ftkv.v1.ErrorInfo";

    /// Encodes a `google.rpc.Status` of `code` and `message` whose one detail is `info`.
    pub fn encode(code: i32, message: &str, info: &ErrorInfo) -> Vec<u8> {
        tonic_types::Status {
            code,
            message: message.to_string(),
            details: vec![prost_types::Any {
                type_url: ERROR_INFO_TYPE_URL.to_string(),
                value: info.encode_to_vec(),
            }],
        }
        .encode_to_vec()
    }

    /// The `ErrorInfo` in status details: the first `Any` of type `ftkv.v1.ErrorInfo` in a
    /// `google.rpc.Status`, or, from nodes older than this encoding, a bare `ErrorInfo`.
    /// `None` when there are no details or none decodes.
    pub fn decode(details: &[u8]) -> Option<ErrorInfo> {
        if details.is_empty() {
            return None;
        }
        if let Ok(status) = tonic_types::Status::decode(details) {
            if let Some(any) = status
                .details
                .iter()
                .find(|any| any.type_url == ERROR_INFO_TYPE_URL)
            {
                return ErrorInfo::decode(any.value.as_slice()).ok();
            }
        }
        ErrorInfo::decode(details).ok()
    }

    #[cfg(test)]
    #[allow(clippy::unwrap_used)]
    mod tests {
        use super::*;
        use crate::v1::error_info::Kind;

        #[test]
        fn error_info_round_trips_inside_a_google_rpc_status() {
            let info = ErrorInfo {
                kind: Kind::NotLeader as i32,
                leader_id: 3,
                leader_endpoint: "h:1".into(),
                message: "not the leader".into(),
                ..Default::default()
            };
            let bytes = encode(9, "not the leader", &info);
            let status = tonic_types::Status::decode(bytes.as_slice()).unwrap();
            assert_eq!(status.code, 9);
            assert_eq!(status.message, "not the leader");
            assert_eq!(status.details.len(), 1);
            assert_eq!(status.details[0].type_url, ERROR_INFO_TYPE_URL);
            assert_eq!(decode(&bytes), Some(info.clone()));
            // what nodes sent before: a bare ErrorInfo
            assert_eq!(decode(&info.encode_to_vec()), Some(info));
            assert_eq!(decode(&[]), None);
        }
    }
}
