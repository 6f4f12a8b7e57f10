//! Replication glue: the only module that names openraft types.
//!
//! Pieces: the Raft log store over `ftkv-log`, the state machine over an [`ftkv_engine::Engine`]
//! (with client sessions for exactly-once writes), the peer network (gRPC `ftkv.raft.v1`), the
//! proposal batcher in front of `client_write`, coalesced ReadIndex reads, snapshots and
//! membership. `server/` talks to this module only through [`ClusterNode`].
//!
//! Submodules: `types` (the openraft `TypeConfig`, the only place its parameters are spelled),
//! `log_store`, `state_machine` (+ `session`, `session_store`, `reserved_keys`, `snapshot`), `network` (peer client) and
//! `peer_server` (peer service) behind `peer_guard` (what a peer message may claim), `batcher`
//! (proposal batching), `reads` (coalesced ReadIndex), `membership` (changes and their rules, the
//! watch that rolls joint configurations forward) with `removal` (a removed node stops
//! campaigning), `observe` (leader changes, leader contact, the read-path check of `/readyz`),
//! `crash_point` (TEST ONLY named crash points), `drain` (graceful stop: refuse new requests,
//! finish those in flight, hand leadership over), `cluster_id` (the cluster identity every peer
//! RPC carries and checks), `backup_image` (the state machine copied for a backup, read back
//! by a restore).

// openraft's storage traits fix the (large) `StorageError` type of our adapters.
#![allow(clippy::result_large_err)]

mod apply;
mod auth_store;
pub mod backup_image;
mod batcher;
pub mod bulk;
pub mod cluster_id;
pub mod command;
mod crash_point;
mod data_dir_file;
mod drain;
mod errors;
mod identity;
mod log_store;
mod membership;
mod network;
mod observe;
mod peer_guard;
mod peer_server;
mod reads;
mod removal;
pub mod reserved_keys;
mod session;
mod session_store;
mod snapshot;
mod state_machine;
#[cfg(test)]
mod tests;
mod types;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use ftkv_engine::Engine;

pub use command::{Command, CommandResult, Compare, CompareOp, CompareTarget, Session, TxnOp};
pub use drain::DrainOutcome;

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
    /// TEST ONLY canary (Jepsen harness): acknowledge log appends before they are fsynced.
    pub unsafe_ack_before_fsync: bool,
    /// TEST ONLY (Jepsen `lose-unsynced`): open the log through `ftkv_vfs::UnsyncedBufferVfs`, so
    /// that a SIGKILL loses every write not yet fsynced.
    pub lose_unsynced_on_kill: bool,
    /// With `lose_unsynced_on_kill`: simulated fdatasync latency, ms.
    pub lose_unsynced_sync_latency_ms: u64,
    /// Data dir quota and disk reserve (the NOSPACE alarm, `crate::space`).
    pub space: crate::space::SpaceOptions,
    /// Peer TLS of outgoing Raft connections (`None`: plaintext), reloaded in place.
    pub peer_tls: Option<std::sync::Arc<crate::tls::peer_client::PeerClientTls>>,
    /// Sort memory of a committed bulk load before it spills (`engine.loader_memory_size`).
    pub loader_memory_bytes: u64,
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
    /// "leader" | "follower" | "candidate" | "learner" | "removed" | "shutdown".
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

fn leader_hint(id: Option<u64>, addr: Option<&str>) -> String {
    match (id, addr) {
        (Some(id), Some(addr)) => format!("the leader is node {id} at {addr}"),
        (Some(id), None) => format!("the leader is node {id}"),
        _ => "no leader is known yet".to_string(),
    }
}

/// Errors of the cluster layer. `server/` maps each to one gRPC status.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterError {
    /// Not the leader; `leader_client_addr` says where to go when known.
    #[error("not the leader; {}", leader_hint(*leader_id, leader_client_addr.as_deref()))]
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
    #[error("{0}")]
    Invalid(String),
    /// Refused before proposing: this node's NOSPACE alarm is raised. Not applied.
    #[error("{}; writes other than deletes are refused (reads go on) {}", .0.message, .0.until())]
    NoSpace(Box<crate::space::Alarm>),
    /// Refused before it started: this node is draining (shutting down). Not applied.
    #[error("node {node_id} is draining (shutting down): request refused, not applied; use another member")]
    Draining {
        /// This node.
        node_id: u64,
    },
}

/// Measures this node's space every `space.check_interval_ms` until the node is dropped or
/// stopped (raising the NOSPACE alarm, see `crate::space`).
async fn watch_space(inner: std::sync::Weak<Inner>) {
    loop {
        let Some(node) = inner.upgrade() else { return };
        if node.stopped.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let period = std::time::Duration::from_millis(node.config.space.check_interval_ms.max(10));
        let _ = tokio::task::spawn_blocking(move || {
            let disk_error = node.disk_space_error();
            node.space.check(disk_error.as_deref());
        })
        .await;
        tokio::time::sleep(period).await;
    }
}

impl Inner {
    /// A real `ENOSPC` met by the log (creating a segment), the engine (writing blocks) or a
    /// snapshot build, while it waits for space (see `crate::space`).
    fn disk_space_error(&self) -> Option<String> {
        self.log_store
            .log()
            .space_error()
            .or_else(|| self.state_machine.space_error())
    }
}

/// How long a proposal may wait for its outcome before it is reported ambiguous, at least.
const WRITE_TIMEOUT_MIN_MS: u64 = 5_000;
/// Most time a read barrier waits for the state machine to reach the read index.
const READ_APPLY_TIMEOUT_MS: u64 = 5_000;
/// Per-chunk timeout when streaming a snapshot to a follower.
const INSTALL_SNAPSHOT_TIMEOUT_MS: u64 = 20_000;
/// Snapshot chunk size upper bound (also bounded by half the peer message limit).
const SNAPSHOT_CHUNK_MAX_BYTES: u64 = 4 * 1024 * 1024;
/// Entries per AppendEntries (bytes are capped separately by the log store).
const MAX_PAYLOAD_ENTRIES: u64 = 4096;
/// Most log entries purged per purge call (fewer when snapshots are more frequent, so a purge
/// follows every few snapshots).
const PURGE_BATCH_SIZE_MAX: u64 = 1024;

struct Inner {
    config: ClusterConfig,
    raft: types::Raft,
    log_store: log_store::LogStore,
    state_machine: state_machine::StateMachine,
    batcher: batcher::Batcher,
    reads: Arc<reads::ReadBarrier>,
    channels: network::Channels,
    refusals: removal::Refusals,
    /// Set while peers refuse this node as removed (see `removal`).
    removed: std::sync::atomic::AtomicBool,
    /// When a leader last reached this node (see `observe`).
    contact: Arc<observe::LeaderContact>,
    stopped: std::sync::atomic::AtomicBool,
    /// The NOSPACE alarm of this node.
    space: crate::space::SpaceMonitor,
    /// Refusal of new requests and count of those in flight while draining (see `drain`).
    drain: drain::DrainState,
    /// The cluster this node belongs to (see `cluster_id`).
    cluster: Arc<cluster_id::ClusterIdentity>,
}

/// A running Raft node. Cheap to clone.
#[derive(Clone)]
pub struct ClusterNode {
    inner: Arc<Inner>,
}

fn raft_config(config: &ClusterConfig) -> Result<openraft::Config, ClusterError> {
    let chunk = SNAPSHOT_CHUNK_MAX_BYTES.min((config.peer_max_message_bytes / 2).max(64 * 1024) as u64);
    let raft_config = openraft::Config {
        cluster_name: "ftkv".to_string(),
        heartbeat_interval: config.heartbeat_interval_ms,
        election_timeout_min: config.election_timeout_min_ms,
        election_timeout_max: config.election_timeout_max_ms,
        install_snapshot_timeout: INSTALL_SNAPSHOT_TIMEOUT_MS,
        max_payload_entries: MAX_PAYLOAD_ENTRIES,
        snapshot_policy: openraft::SnapshotPolicy::LogsSinceLast(config.snapshot_every_entries.max(1)),
        snapshot_max_chunk_size: chunk,
        max_in_snapshot_log_to_keep: config.max_in_snapshot_log_to_keep,
        purge_batch_size: (config.snapshot_every_entries / 4).clamp(1, PURGE_BATCH_SIZE_MAX),
        ..Default::default()
    };
    raft_config
        .validate()
        .map_err(|e| ClusterError::Invalid(format!("raft settings: {e}")))
}

impl ClusterNode {
    /// Opens the log (`data_dir/log`), the state machine over `engine` (snapshots in
    /// `data_dir/snapshots`) and starts Raft. Does not initialize a cluster.
    ///
    /// Errors: `Invalid` for bad settings (node id 0, election timeouts), `Storage` when the log or
    /// the engine metadata cannot be read.
    pub async fn start(config: ClusterConfig, engine: Arc<dyn Engine>) -> Result<Self, ClusterError> {
        if config.node_id == 0 {
            return Err(ClusterError::Invalid("node id 0 is reserved".into()));
        }
        let raft_config = Arc::new(raft_config(&config)?);
        let log_dir = config.data_dir.join("log");
        let snapshot_dir = config.data_dir.join("snapshots");
        let log_options = ftkv_log::LogOptions {
            segment_size_bytes: config.log_segment_size_bytes,
            sync: config.log_sync,
        };
        // One file layer for the log and the snapshots (lose-unsynced mode loses both alike).
        let vfs: Arc<dyn ftkv_vfs::Vfs> = if config.lose_unsynced_on_kill {
            ftkv_vfs::UnsyncedBufferVfs::over_real(std::time::Duration::from_millis(
                config.lose_unsynced_sync_latency_ms,
            ))
        } else {
            Arc::new(ftkv_vfs::RealVfs)
        };
        let log = {
            let dir = log_dir.clone();
            let meter = crate::telemetry::vfs::DiskMeter::new(
                crate::telemetry::WAL_WRITE_BYTES_TOTAL,
                crate::telemetry::WAL_FSYNC_DURATION_SECONDS,
            );
            let vfs = crate::telemetry::vfs::MeteredVfs::wrap(vfs.clone(), meter);
            tokio::task::spawn_blocking(move || ftkv_log::Log::open(vfs, &dir, log_options))
                .await
                .map_err(|e| ClusterError::Storage(format!("opening the log: {e}")))?
                .map_err(|e| {
                    ClusterError::Storage(format!("opening the log in {}: {e}", log_dir.display()))
                })?
        };
        identity::check(&config.data_dir, config.node_id, &log)?;
        let cluster = Arc::new(cluster_id::ClusterIdentity::load(
            config.node_id,
            &config.data_dir,
        )?);
        let append_max = log_store::APPEND_ENTRIES_MAX_BYTES
            .min(config.peer_max_message_bytes / 2)
            .max(64 * 1024);
        let state_machine = {
            let snapshots = snapshot::SnapshotDir::new(vfs, &snapshot_dir);
            tokio::task::spawn_blocking(move || state_machine::StateMachine::open_in(engine, snapshots))
                .await
                .map_err(|e| ClusterError::Storage(format!("opening the state machine: {e}")))?
                .map_err(|e| ClusterError::Storage(e.to_string()))?
        };
        state_machine.set_loader_memory_bytes(config.loader_memory_bytes);
        let log_store = log_store::LogStore::new(
            log,
            append_max,
            config.unsafe_ack_before_fsync,
            state_machine.durable(),
        )
        .map_err(|e| ClusterError::Storage(e.to_string()))?;
        // openraft requires the snapshot to reach the log's purge point, and the log (or the
        // snapshot) to reach what the engine applied. A crash between the engine taking a
        // snapshot and its file becoming current leaves the file behind both: the purge waited
        // only for the engine (a purge can even finish before the file is renamed), so the
        // snapshot is rebuilt from the engine, which holds at least the purged range durably.
        let applied = state_machine.applied_index();
        let purged = log_store.last_purged_log_id().map_or(0, |l| l.index);
        let need = if log_store.last_log_id().is_none_or(|l| l.index < applied) {
            applied
        } else {
            purged
        };
        if need > 0 {
            let sm = state_machine.clone();
            tokio::task::spawn_blocking(move || sm.ensure_snapshot_covers(need))
                .await
                .map_err(|e| ClusterError::Storage(format!("snapshot at start: {e}")))?
                .map_err(|e| ClusterError::Storage(e.to_string()))?;
        }
        let channels = network::Channels::with_tls(config.peer_tls.clone());
        let refusals = removal::Refusals::default();
        let factory = network::NetworkFactory {
            node_id: config.node_id,
            channels: channels.clone(),
            max_message_bytes: config.peer_max_message_bytes,
            refusals: refusals.clone(),
            cluster: cluster.clone(),
        };
        let raft = types::Raft::new(
            config.node_id,
            raft_config,
            factory,
            log_store.clone(),
            state_machine.clone(),
        )
        .await
        .map_err(|e| ClusterError::Storage(format!("starting raft: {e}")))?;
        let write_timeout_ms = WRITE_TIMEOUT_MIN_MS.max(5 * config.election_timeout_max_ms);
        let batcher = batcher::Batcher::start(
            raft.clone(),
            batcher::BatcherConfig {
                max_ops: config.batch_max_ops.max(1),
                max_bytes: config.batch_max_bytes.max(1),
                max_in_flight: config.batch_max_in_flight.max(1),
                ack: config.ack,
                ack_all_timeout: std::time::Duration::from_millis(config.ack_all_timeout_ms),
                write_timeout: std::time::Duration::from_millis(write_timeout_ms),
            },
        );
        identity::record_when_voted(&config.data_dir, config.node_id, &raft);
        observe::spawn_leader_change_counter(&raft);
        let reads = reads::ReadBarrier::new(
            raft.clone(),
            std::time::Duration::from_millis(READ_APPLY_TIMEOUT_MS),
        );
        let space = crate::space::SpaceMonitor::new(config.node_id, &config.data_dir, config.space);
        let node = ClusterNode {
            inner: Arc::new(Inner {
                config,
                raft,
                log_store,
                state_machine,
                batcher,
                reads,
                channels,
                refusals,
                removed: std::sync::atomic::AtomicBool::new(false),
                contact: Default::default(),
                stopped: std::sync::atomic::AtomicBool::new(false),
                space,
                drain: Default::default(),
                cluster,
            }),
        };
        tokio::spawn(membership::watch(Arc::downgrade(&node.inner)));
        tokio::spawn(watch_space(Arc::downgrade(&node.inner)));
        Ok(node)
    }

    /// Whether peers refuse this node as removed from the cluster (see `removal`).
    pub fn is_removed(&self) -> bool {
        self.inner.removed.load(std::sync::atomic::Ordering::Acquire)
    }

    fn refuse_if_removed(&self) -> Result<(), ClusterError> {
        if self.is_removed() {
            return Err(ClusterError::Unavailable(format!(
                "node {} was removed from the cluster (its peers refuse it as not a member); \
                 use another member",
                self.inner.config.node_id
            )));
        }
        Ok(())
    }

    /// The tonic service for the peer port (`ftkv.raft.v1.Raft`), message limits raised to
    /// `peer_max_message_bytes`.
    pub fn peer_service(
        &self,
    ) -> ftkv_proto::raft::v1::raft_server::RaftServer<impl ftkv_proto::raft::v1::raft_server::Raft> {
        let limit = self.inner.config.peer_max_message_bytes;
        ftkv_proto::raft::v1::raft_server::RaftServer::new(peer_server::PeerServer {
            node_id: self.inner.config.node_id,
            addr: self.inner.config.addr.clone(),
            raft: self.inner.raft.clone(),
            streaming: Default::default(),
            snapshots: self.inner.state_machine.snapshots().clone(),
            contact: self.inner.contact.clone(),
            cluster: self.inner.cluster.clone(),
            local: self.clone(),
        })
        .max_decoding_message_size(limit)
        .max_encoding_message_size(limit)
    }

    /// Initializes a new cluster whose voters are `peers` (node id -> peer address, this node
    /// included). Learns each member's client address with the `GetNodeInfo` peer RPC
    /// (retrying until every peer answers or `timeout_ms` passes). Idempotent: Ok when this
    /// node already has a membership.
    ///
    /// Errors: `Invalid` when this node is not in `peers` or a peer reports another id;
    /// `Unavailable` when a peer does not answer in time.
    pub async fn initialize(
        &self,
        peers: BTreeMap<u64, String>,
        timeout_ms: u64,
    ) -> Result<(), ClusterError> {
        let me = self.inner.config.node_id;
        if !peers.contains_key(&me) {
            return Err(ClusterError::Invalid(format!(
                "node {me} is not among the initial members"
            )));
        }
        if self.is_initialized().await? {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(timeout_ms);
        // A new cluster gets its id now (a restored data dir has one already).
        let cluster_id = self.inner.cluster.create_if_missing()?;
        let mut members = BTreeMap::new();
        for (&id, peer) in &peers {
            if id == me {
                members.insert(id, self.inner.config.addr.clone());
                continue;
            }
            let info = self.node_info_until(peer, deadline).await?;
            if info.id != id {
                return Err(ClusterError::Invalid(format!(
                    "{peer} is node {}, not node {id}",
                    info.id
                )));
            }
            if info.cluster_id != 0 && info.cluster_id != cluster_id {
                return Err(ClusterError::Invalid(cluster_id::mismatch_message(
                    "initializing the cluster",
                    me,
                    cluster_id,
                    id,
                    info.cluster_id,
                )));
            }
            members.insert(
                id,
                NodeAddr {
                    client: info.client_endpoint,
                    peer: peer.clone(),
                },
            );
        }
        match self.inner.raft.initialize(members).await {
            Ok(()) => Ok(()),
            Err(openraft::error::RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => {
                Ok(())
            }
            Err(openraft::error::RaftError::APIError(e)) => Err(ClusterError::Invalid(e.to_string())),
            Err(openraft::error::RaftError::Fatal(f)) => Err(errors::fatal_to_error(f)),
        }
    }

    /// Whether this node already belongs to a cluster (has a membership log entry or vote).
    pub async fn is_initialized(&self) -> Result<bool, ClusterError> {
        self.inner
            .raft
            .is_initialized()
            .await
            .map_err(errors::fatal_to_error)
    }

    async fn node_info_until(
        &self,
        peer: &str,
        deadline: tokio::time::Instant,
    ) -> Result<ftkv_proto::raft::v1::NodeInfo, ClusterError> {
        loop {
            let attempt = network::get_node_info(
                &self.inner.channels,
                peer,
                self.inner.config.peer_max_message_bytes,
                std::time::Duration::from_millis(1_000),
            )
            .await;
            match attempt {
                Ok(info) => return Ok(info),
                Err(e) if tokio::time::Instant::now() >= deadline => {
                    return Err(ClusterError::Unavailable(format!(
                        "peer {peer} did not answer GetNodeInfo: {e}"
                    )));
                }
                Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
            }
        }
    }

    /// Proposes `command` through the batcher; returns its result and log index once
    /// committed and applied (and, with `AckPolicy::All`, on every voter).
    ///
    /// Errors: `NotLeader` (not applied), `Ambiguous` (outcome unknown: leader change or timeout
    /// after proposing), `NotOnAllReplicas` (committed; `AckPolicy::All` only), `Unavailable`
    /// (shutting down; not applied), `Storage`.
    pub async fn write(&self, command: Command) -> Result<(CommandResult, u64), ClusterError> {
        let _in_flight = self.inner.drain.enter(self.inner.config.node_id)?;
        if self.inner.stopped.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ClusterError::Unavailable("node is shutting down".into()));
        }
        self.refuse_if_removed()?;
        if let Some(alarm) = self.inner.space.alarm() {
            if !crate::space::only_frees_space(&command) {
                return Err(ClusterError::NoSpace(Box::new(alarm)));
            }
        }
        self.inner.batcher.write(command).await
    }

    /// [`ClusterNode::write`] of a bulk-load command, waiting up to `timeout` for its outcome
    /// (a commit ingests a whole load in one apply). Refused unless this node leads in `term`
    /// (the load's term): a load never outlives its leader.
    pub async fn write_bulk(
        &self,
        command: Command,
        term: u64,
        timeout: std::time::Duration,
    ) -> Result<(CommandResult, u64), ClusterError> {
        let _in_flight = self.inner.drain.enter(self.inner.config.node_id)?;
        if self.inner.stopped.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ClusterError::Unavailable("node is shutting down".into()));
        }
        self.refuse_if_removed()?;
        if let Some(alarm) = self.inner.space.alarm() {
            if !crate::space::only_frees_space(&command) {
                return Err(ClusterError::NoSpace(Box::new(alarm)));
            }
        }
        let status = self.status();
        if status.role != "leader" || status.term != term {
            return Err(ClusterError::NotLeader {
                leader_id: status.leader_id,
                leader_client_addr: status.leader_client_addr,
            });
        }
        self.inner.batcher.write_within(command, Some(timeout)).await
    }

    /// The id of the cluster this node belongs to (0: none yet; see `cluster_id`).
    pub fn cluster_id(&self) -> u64 {
        self.inner.cluster.get()
    }

    /// This node's NOSPACE alarm, if raised (see `crate::space`).
    pub fn alarm(&self) -> Option<crate::space::Alarm> {
        self.inner.space.alarm()
    }

    /// This node's space settings and what its last check measured.
    pub fn space_usage(&self) -> (crate::space::SpaceOptions, crate::space::SpaceUsage) {
        (self.inner.space.options(), self.inner.space.usage())
    }

    /// Clears this node's NOSPACE alarm once its cause is gone (measures again first).
    ///
    /// Errors: `NoSpace` naming what is still over its limit (the alarm stays).
    pub async fn disarm_alarm(&self) -> Result<(), ClusterError> {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let disk_error = inner.disk_space_error();
            inner.space.disarm(disk_error.as_deref())
        })
        .await
        .map_err(|e| ClusterError::Unavailable(format!("space check task: {e}")))?
        .map_err(|alarm| ClusterError::NoSpace(Box::new(alarm)))
    }

    /// Linearizable read barrier: one shared ReadIndex round, then waits until applied >=
    /// read index. Returns the read index. After it, read `engine()` directly.
    ///
    /// Errors: `NotLeader` on a follower, `Unavailable` without a quorum or while stopping.
    pub async fn read_barrier(&self) -> Result<u64, ClusterError> {
        let _in_flight = self.inner.drain.enter(self.inner.config.node_id)?;
        if self.inner.stopped.load(std::sync::atomic::Ordering::Acquire) {
            return Err(ClusterError::Unavailable("node is shutting down".into()));
        }
        self.refuse_if_removed()?;
        if self.inner.config.unsafe_local_reads {
            return Ok(self.inner.state_machine.applied_index());
        }
        self.inner.reads.barrier().await
    }

    /// The users, roles and auth flag as this node applied them last (`crate::auth`).
    pub fn auth_state(&self) -> Arc<crate::auth::AuthState> {
        self.inner.state_machine.auth()
    }

    /// The state machine's engine (for reads).
    pub fn engine(&self) -> Arc<dyn Engine> {
        self.inner.state_machine.engine()
    }

    /// Resolves once the Raft core has stopped: it reported `Shutdown` after a fatal error, or
    /// its task ended without doing so (a panic drops the metrics sender).
    pub async fn core_stopped(&self) {
        let mut metrics = self.inner.raft.metrics();
        loop {
            if metrics.borrow_and_update().state == openraft::ServerState::Shutdown {
                return;
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    }

    /// Current status.
    pub fn status(&self) -> NodeStatus {
        let metrics = self.inner.raft.metrics();
        let m = metrics.borrow();
        let membership = m.membership_config.membership();
        let leader_client_addr = m
            .current_leader
            .and_then(|id| membership.get_node(&id))
            .map(|n| n.client.clone());
        let role = match m.state {
            _ if self.is_removed() => "removed",
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Candidate => "candidate",
            openraft::ServerState::Follower => "follower",
            openraft::ServerState::Learner => "learner",
            openraft::ServerState::Shutdown => "shutdown",
        };
        let applied_index = m.last_applied.map_or(0, |l| l.index);
        NodeStatus {
            node_id: self.inner.config.node_id,
            leader_id: m.current_leader,
            leader_client_addr,
            term: m.current_term,
            last_log_index: m.last_log_index.unwrap_or(0),
            applied_index,
            commit_index: self.inner.log_store.committed_index().max(applied_index),
            role: role.to_string(),
            ops_per_entry: self.inner.batcher.stats().ops_per_entry(),
        }
    }

    /// Stops Raft, flushes the log and checkpoints the engine. Idempotent.
    pub async fn shutdown(&self) -> Result<(), ClusterError> {
        if self.inner.stopped.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return Ok(());
        }
        self.inner
            .raft
            .shutdown()
            .await
            .map_err(|e| ClusterError::Storage(format!("raft shutdown: {e}")))?;
        self.inner
            .log_store
            .write_pending_committed()
            .map_err(|e| ClusterError::Storage(e.to_string()))?;
        let log = self.inner.log_store.log().clone();
        let sm = self.inner.state_machine.clone();
        tokio::task::spawn_blocking(move || -> Result<(), ClusterError> {
            log.sync()
                .map_err(|e| ClusterError::Storage(format!("log sync at shutdown: {e}")))?;
            sm.checkpoint()
                .map_err(|e| ClusterError::Storage(format!("engine checkpoint at shutdown: {e}")))
        })
        .await
        .map_err(|e| ClusterError::Storage(format!("shutdown task: {e}")))?
    }
}
