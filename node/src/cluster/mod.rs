//! Replication glue: the only module that names openraft types.
//!
//! Pieces: the Raft log store over `ftkv-log`, the state machine over an [`ftkv_engine::Engine`]
//! (with client sessions for exactly-once writes), the peer network (gRPC `ftkv.raft.v1`), the
//! proposal batcher in front of `client_write`, coalesced ReadIndex reads, snapshots and
//! membership. `server/` talks to this module only through [`ClusterNode`].
//!
//! API CONTRACT (the bodies below are being written; signatures are fixed):

pub mod command;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use ftkv_engine::Engine;

pub use command::{Command, CommandResult, Compare, CompareOp, CompareTarget, Session, TxnOp};

/// Network addresses of one member, as stored in the Raft membership.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct NodeAddr {
    /// `host:port` clients use (gRPC `ftkv.v1`).
    pub client: String,
    /// `host:port` peers use (gRPC `ftkv.raft.v1`).
    pub peer: String,
}

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AckPolicy {
    /// Leader + enough followers for a majority have it on disk (MySQL semi-sync AFTER_SYNC).
    #[default]
    Quorum,
    /// Every voter has it on disk; after `ack_all_timeout_ms`: `ClusterError::NotOnAllReplicas`.
    All,
}

/// Everything the cluster layer needs to start.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// This node's id (never 0).
    pub node_id: u64,
    /// This node's advertised addresses.
    pub addr: NodeAddr,
    /// Directory for `log/` and `snapshots/`.
    pub data_dir: PathBuf,
    /// Log sync mode.
    pub log_sync: ftkv_log::SyncMode,
    /// Log segment size.
    pub log_segment_size_bytes: u64,
    /// Ack policy.
    pub ack: AckPolicy,
    /// Wait for every voter at most this long with `AckPolicy::All`.
    pub ack_all_timeout_ms: u64,
    /// Raft heartbeat interval.
    pub heartbeat_interval_ms: u64,
    /// Election timeout range.
    pub election_timeout_min_ms: u64,
    /// Election timeout range.
    pub election_timeout_max_ms: u64,
    /// Build a snapshot (engine checkpoint) after this many applied entries since the last.
    pub snapshot_every_entries: u64,
    /// Keep this many entries in the log behind a snapshot for lagging followers.
    pub max_in_snapshot_log_to_keep: u64,
    /// Proposal batcher: most ops packed in one entry.
    pub batch_max_ops: usize,
    /// Proposal batcher: most payload bytes packed in one entry.
    pub batch_max_bytes: usize,
    /// Proposal batcher: most entries in flight at once.
    pub batch_max_in_flight: usize,
    /// Max gRPC message size between peers.
    pub peer_max_message_bytes: usize,
    /// TEST ONLY canary (Jepsen harness): serve linearizable reads locally without ReadIndex.
    pub unsafe_local_reads: bool,
}

/// Status of this node as the cluster layer sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStatus {
    /// This node's id.
    pub node_id: u64,
    /// Known leader (None when unknown).
    pub leader_id: Option<u64>,
    /// Leader's client address, when known.
    pub leader_client_addr: Option<String>,
    /// Current term.
    pub term: u64,
    /// Last log index in this node's log.
    pub last_log_index: u64,
    /// Last applied log index.
    pub applied_index: u64,
    /// Commit index known to this node.
    pub commit_index: u64,
    /// "leader" | "follower" | "candidate" | "learner" | "shutdown".
    pub role: String,
    /// Mean ops per Raft entry proposed by this node's batcher (0 if none).
    pub ops_per_entry: f64,
}

/// One member of the membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberInfo {
    /// Node id.
    pub id: u64,
    /// Addresses.
    pub addr: NodeAddr,
    /// Voter (true) or learner (false).
    pub is_voter: bool,
}

/// Errors of the cluster layer. `server/` maps each to one gRPC status.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// Not the leader; `leader_client_addr` says where to go when known.
    #[error("not the leader (leader: {leader_id:?} at {leader_client_addr:?})")]
    NotLeader {
        /// Known leader.
        leader_id: Option<u64>,
        /// Its client address.
        leader_client_addr: Option<String>,
    },
    /// The write may or may not have been applied.
    #[error("outcome unknown: {0}")]
    Ambiguous(String),
    /// Committed, but not every voter had it within `ack_all_timeout_ms`.
    #[error("committed at log index {log_index}, not yet on all replicas")]
    NotOnAllReplicas {
        /// Index of the entry.
        log_index: u64,
    },
    /// Cannot serve now (no quorum / shutting down).
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A storage fault stopped this node (failed fsync, checksum mismatch).
    #[error("storage fault: {0}")]
    Storage(String),
    /// Bad request (e.g. membership change naming an unknown node).
    #[error("invalid: {0}")]
    Invalid(String),
}

/// A running Raft node. Cheap to clone.
#[derive(Clone)]
pub struct ClusterNode {
    _private: Arc<()>,
}

impl ClusterNode {
    /// Opens the log, the state machine over `engine`, and starts Raft. Does not initialize.
    pub async fn start(_config: ClusterConfig, _engine: Arc<dyn Engine>) -> Result<Self, ClusterError> {
        todo!("cluster helper")
    }

    /// The tonic service for the peer port (`ftkv.raft.v1.Raft`), message limits raised.
    pub fn peer_service(
        &self,
    ) -> ftkv_proto::raft::v1::raft_server::RaftServer<impl ftkv_proto::raft::v1::raft_server::Raft> {
        ftkv_proto::raft::v1::raft_server::RaftServer::new(Unimplemented)
    }

    /// Initializes a new cluster whose voters are `peers` (node id -> peer address, this node
    /// included). Learns each member's client address with the `GetNodeInfo` peer RPC
    /// (retrying until every peer answers or `timeout_ms` passes). Idempotent: Ok when this
    /// node already has a membership.
    pub async fn initialize(&self, _peers: BTreeMap<u64, String>, _timeout_ms: u64) -> Result<(), ClusterError> {
        todo!()
    }

    /// Proposes `command` through the batcher; returns its result and log index once
    /// committed and applied (and, with `AckPolicy::All`, on every voter).
    pub async fn write(&self, _command: Command) -> Result<(CommandResult, u64), ClusterError> {
        todo!()
    }

    /// Linearizable read barrier: one shared ReadIndex round, then waits until applied >=
    /// read index. Returns the read index. After it, read `engine()` directly.
    pub async fn read_barrier(&self) -> Result<u64, ClusterError> {
        todo!()
    }

    /// The state machine's engine (for reads).
    pub fn engine(&self) -> Arc<dyn Engine> {
        todo!()
    }

    /// Current status.
    pub fn status(&self) -> NodeStatus {
        todo!()
    }

    /// Current membership.
    pub fn members(&self) -> Vec<MemberInfo> {
        todo!()
    }

    /// Adds a learner (blocking until it has caught up is not required).
    pub async fn add_learner(&self, _id: u64, _addr: NodeAddr) -> Result<(), ClusterError> {
        todo!()
    }

    /// Promotes a learner to voter.
    pub async fn promote(&self, _id: u64) -> Result<(), ClusterError> {
        todo!()
    }

    /// Removes a voter or learner.
    pub async fn remove(&self, _id: u64) -> Result<(), ClusterError> {
        todo!()
    }

    /// Stops Raft, flushes the log and checkpoints the engine.
    pub async fn shutdown(&self) -> Result<(), ClusterError> {
        todo!()
    }
}

struct Unimplemented;
#[tonic::async_trait]
impl ftkv_proto::raft::v1::raft_server::Raft for Unimplemented {
    async fn append_entries(
        &self,
        _r: tonic::Request<ftkv_proto::raft::v1::RaftMessage>,
    ) -> Result<tonic::Response<ftkv_proto::raft::v1::RaftMessage>, tonic::Status> {
        Err(tonic::Status::unimplemented("x"))
    }
    async fn vote(
        &self,
        _r: tonic::Request<ftkv_proto::raft::v1::RaftMessage>,
    ) -> Result<tonic::Response<ftkv_proto::raft::v1::RaftMessage>, tonic::Status> {
        Err(tonic::Status::unimplemented("x"))
    }
    async fn install_snapshot(
        &self,
        _r: tonic::Request<ftkv_proto::raft::v1::RaftMessage>,
    ) -> Result<tonic::Response<ftkv_proto::raft::v1::RaftMessage>, tonic::Status> {
        Err(tonic::Status::unimplemented("x"))
    }
    async fn get_node_info(
        &self,
        _r: tonic::Request<ftkv_proto::raft::v1::NodeInfoRequest>,
    ) -> Result<tonic::Response<ftkv_proto::raft::v1::NodeInfo>, tonic::Status> {
        Err(tonic::Status::unimplemented("x"))
    }
}
