//! The one mapping from internal errors to gRPC statuses. Every status carries an encoded
//! `ftkv.v1.ErrorInfo` in its details so clients can tell a redirect from an ambiguous write.

use ftkv_proto::v1::{error_info::Kind, ErrorInfo};
use prost::Message;
use tonic::{Code, Status};

use crate::cluster::ClusterError;
use crate::limits::LimitError;

/// Builds a status with an `ErrorInfo` detail.
pub fn status(code: Code, info: ErrorInfo) -> Status {
    let message = info.message.clone();
    Status::with_details(code, message, info.encode_to_vec().into())
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

/// A malformed request: `INVALID_ARGUMENT`.
pub fn invalid(message: impl Into<String>) -> Status {
    status(Code::InvalidArgument, info(Kind::Invalid, message.into()))
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
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn not_leader_carries_the_leader_endpoint() {
        let s = cluster(ClusterError::NotLeader {
            leader_id: Some(2),
            leader_client_addr: Some("h:1".into()),
        });
        assert_eq!(s.code(), Code::FailedPrecondition);
        let i = ErrorInfo::decode(s.details()).unwrap();
        assert_eq!(i.kind, Kind::NotLeader as i32);
        assert_eq!(i.leader_endpoint, "h:1");
        assert_eq!(i.leader_id, 2);
    }

    #[test]
    fn limit_names_the_limit() {
        let s = limit(&LimitError::EmptyKey);
        assert_eq!(s.code(), Code::InvalidArgument);
        let i = ErrorInfo::decode(s.details()).unwrap();
        assert_eq!(i.limit, "empty_key");
    }
}
