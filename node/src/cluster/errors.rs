//! Mapping of openraft errors to [`ClusterError`] (openraft's taxonomy: fatal errors stop the
//! node; API errors such as `ForwardToLeader` go back to the caller).

use openraft::error::{CheckIsLeaderError, Fatal, RaftError};

use super::types::{NodeId, Raft};
use super::{ClusterError, NodeAddr};

/// A fatal Raft error: `Stopped` -> `Unavailable`, a storage fault or panic -> `Storage`.
pub fn fatal_to_error(fatal: Fatal<NodeId>) -> ClusterError {
    match fatal {
        Fatal::Stopped => ClusterError::Unavailable("raft is shutting down".into()),
        Fatal::StorageError(e) => ClusterError::Storage(e.to_string()),
        Fatal::Panicked => ClusterError::Storage("raft core panicked".into()),
    }
}

/// `NotLeader` with the leader's client address, from the hint or else from the membership.
pub fn not_leader(raft: &Raft, leader_id: Option<NodeId>, leader_node: Option<NodeAddr>) -> ClusterError {
    let metrics = raft.metrics();
    let m = metrics.borrow();
    let leader_id = leader_id.or(m.current_leader);
    let addr = leader_node
        .or_else(|| leader_id.and_then(|id| m.membership_config.membership().get_node(&id).cloned()));
    ClusterError::NotLeader {
        leader_id,
        leader_client_addr: addr.map(|a| a.client).filter(|c| !c.is_empty()),
    }
}

/// Maps a ReadIndex failure.
pub fn read_error_to_cluster(
    raft: &Raft,
    err: RaftError<NodeId, CheckIsLeaderError<NodeId, NodeAddr>>,
) -> ClusterError {
    match err {
        RaftError::APIError(CheckIsLeaderError::ForwardToLeader(f)) => {
            not_leader(raft, f.leader_id, f.leader_node)
        }
        RaftError::APIError(CheckIsLeaderError::QuorumNotEnough(q)) => {
            ClusterError::Unavailable(format!("no quorum confirmed leadership: {q}"))
        }
        RaftError::Fatal(f) => fatal_to_error(f),
    }
}
