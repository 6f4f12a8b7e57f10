//! Client side of the peer network: openraft `RaftNetworkFactory` / `RaftNetwork` over gRPC
//! `ftkv.raft.v1.Raft`.
//!
//! One lazily connected tonic `Channel` per peer address, cached and shared by every Raft
//! replication stream to that peer; message limits raised to `peer_max_message_bytes`. Each RPC
//! carries the postcard-encoded openraft request; the response carries the openraft response or,
//! with `is_error`, the serialized `RaftError`. gRPC `Unavailable` maps to `Unreachable` (openraft
//! backs off), other failures to `NetworkError`. Snapshots go through openraft's chunked transport
//! (`install_snapshot`, `snapshot_max_chunk_size` per chunk). A peer's membership refusal
//! (`PERMISSION_DENIED` from `peer_guard`) and any later acceptance are recorded in
//! [`Refusals`] (see `removal`).

use std::collections::HashMap;
use std::error::Error;
use std::sync::Arc;

use ftkv_proto::raft::v1::raft_client::RaftClient;
use ftkv_proto::raft::v1::{NodeInfo, NodeInfoRequest, RaftMessage};
use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::transport::{Channel, Endpoint};

use super::cluster_id::ClusterIdentity;
use super::peer_guard;
use super::removal::Refusals;
use super::types::{NodeId, TypeConfig};
use super::NodeAddr;

/// A peer-network failure that is not an openraft error (for `GetNodeInfo`).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PeerCallError(pub String);

/// Shared cache of peer channels, keyed by peer address, with a fault filter for tests (TiKV
/// `transport_simulate.rs`): RPCs to a blocked address fail as `Unreachable` without being sent.
#[derive(Clone, Default)]
pub struct Channels {
    inner: Arc<Mutex<HashMap<String, Channel>>>,
    blocked: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Peer TLS (`https://`, this node's peer certificate as client identity) and the
    /// generation of it the cached channels were made with: a reload empties the cache, so
    /// connections opened afterwards present the new certificate (RPCs on channels already
    /// handed out finish on theirs).
    tls: Option<Arc<crate::tls::peer_client::PeerClientTls>>,
    tls_generation: Arc<Mutex<u64>>,
}

impl Channels {
    /// A cache whose channels speak TLS when `tls` is set.
    pub fn with_tls(tls: Option<Arc<crate::tls::peer_client::PeerClientTls>>) -> Self {
        Self {
            tls,
            ..Self::default()
        }
    }

    /// Drops every outgoing Raft RPC to `peer_addr` (a one-way partition) until unblocked.
    #[cfg(test)]
    pub fn block(&self, peer_addr: &str) {
        self.blocked.lock().insert(peer_addr.to_string());
    }

    /// Lifts every block.
    #[cfg(test)]
    pub fn unblock_all(&self) {
        self.blocked.lock().clear();
    }

    fn is_blocked(&self, peer_addr: &str) -> bool {
        let blocked = self.blocked.lock();
        !blocked.is_empty() && blocked.contains(peer_addr)
    }

    /// The cached channel to `peer_addr` (`host:port`), created lazily (no connection attempt
    /// until the first call).
    pub fn get(&self, peer_addr: &str) -> Result<Channel, PeerCallError> {
        let mut map = self.inner.lock();
        let tls = self.tls.as_ref().map(|t| t.current());
        if let Some((generation, _)) = &tls {
            let mut seen = self.tls_generation.lock();
            if *seen != *generation {
                map.clear();
                *seen = *generation;
            }
        }
        if let Some(ch) = map.get(peer_addr) {
            return Ok(ch.clone());
        }
        let bare = peer_addr.split_once("://").map_or(peer_addr, |(_, rest)| rest);
        let uri = match &tls {
            Some(_) => format!("https://{bare}"),
            None => format!("http://{bare}"),
        };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| PeerCallError(format!("bad peer address {peer_addr:?}: {e}")))?
            .connect_timeout(std::time::Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(std::time::Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if let Some((_, config)) = tls {
            endpoint = endpoint
                .tls_config(config)
                .map_err(|e| PeerCallError(format!("peer TLS for {peer_addr:?}: {e}")))?;
        }
        let channel = endpoint.connect_lazy();
        map.insert(peer_addr.to_string(), channel.clone());
        Ok(channel)
    }

    /// A gRPC client to `peer_addr` with raised message limits.
    pub fn client(
        &self,
        peer_addr: &str,
        max_message_bytes: usize,
    ) -> Result<RaftClient<Channel>, PeerCallError> {
        Ok(RaftClient::new(self.get(peer_addr)?)
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes))
    }
}

/// Asks the node at `peer_addr` who it is (`GetNodeInfo`).
pub async fn get_node_info(
    channels: &Channels,
    peer_addr: &str,
    max_message_bytes: usize,
    timeout: std::time::Duration,
) -> Result<NodeInfo, PeerCallError> {
    let mut client = channels.client(peer_addr, max_message_bytes)?;
    let mut req = tonic::Request::new(NodeInfoRequest {});
    req.set_timeout(timeout);
    client
        .get_node_info(req)
        .await
        .map(|r| r.into_inner())
        .map_err(|s| PeerCallError(s.to_string()))
}

/// Asks the node at `peer_addr` to start an election at once (`TimeoutNow`; a draining leader
/// handing its leadership over). `from` is this node, `cluster_id` its cluster.
pub async fn timeout_now(
    channels: &Channels,
    peer_addr: &str,
    from: NodeId,
    cluster_id: u64,
    timeout: std::time::Duration,
) -> Result<(), PeerCallError> {
    let mut client = channels.client(peer_addr, 64 * 1024)?;
    let mut req = tonic::Request::new(RaftMessage {
        payload: Vec::new(),
        from,
        is_error: false,
        cluster_id,
    });
    req.set_timeout(timeout);
    client
        .timeout_now(req)
        .await
        .map(|_| ())
        .map_err(|s| PeerCallError(format!("{}: {}", s.code(), s.message())))
}

/// Creates one [`PeerNetwork`] per replication target, sharing [`Channels`].
#[derive(Clone)]
pub struct NetworkFactory {
    /// This node's id (sent as `from`).
    pub node_id: NodeId,
    /// Channel cache.
    pub channels: Channels,
    /// Peer message limit in bytes.
    pub max_message_bytes: usize,
    /// Peers' refusals of this node.
    pub refusals: Refusals,
    /// This node's cluster id, sent with every message and checked in every answer.
    pub cluster: Arc<ClusterIdentity>,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &NodeAddr) -> PeerNetwork {
        let client = self.channels.client(&node.peer, self.max_message_bytes);
        PeerNetwork {
            from: self.node_id,
            target,
            addr: node.clone(),
            client,
            channels: self.channels.clone(),
            refusals: self.refusals.clone(),
            cluster: self.cluster.clone(),
            mismatch_logged: None,
        }
    }
}

/// Connection to one peer, used by one openraft replication stream.
pub struct PeerNetwork {
    from: NodeId,
    target: NodeId,
    addr: NodeAddr,
    client: Result<RaftClient<Channel>, PeerCallError>,
    channels: Channels,
    refusals: Refusals,
    cluster: Arc<ClusterIdentity>,
    /// When a cluster-ID mismatch with this peer was last logged.
    mismatch_logged: Option<std::time::Instant>,
}

/// How often a persisting cluster-ID mismatch with one peer is logged.
const MISMATCH_LOG_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

#[derive(Clone, Copy)]
enum Rpc {
    AppendEntries,
    Vote,
    InstallSnapshot,
}

impl Rpc {
    /// Metric label.
    fn name(self) -> &'static str {
        match self {
            Rpc::AppendEntries => "append_entries",
            Rpc::Vote => "vote",
            Rpc::InstallSnapshot => "install_snapshot",
        }
    }
}

type RpcResult<T, E> = Result<T, RPCError<NodeId, NodeAddr, RaftError<NodeId, E>>>;

impl PeerNetwork {
    /// Logs a cluster-ID mismatch with this peer, at most every 10 s.
    fn warn_mismatch(&mut self, text: &str) {
        let now = std::time::Instant::now();
        if self
            .mismatch_logged
            .is_some_and(|t| now.duration_since(t) < MISMATCH_LOG_PERIOD)
        {
            return;
        }
        self.mismatch_logged = Some(now);
        tracing::error!(peer = self.target, peer_addr = %self.addr.peer, "{text}");
    }

    async fn call<Req, Resp, E>(&mut self, rpc: Rpc, req: &Req, option: &RPCOption) -> RpcResult<Resp, E>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: Error + DeserializeOwned,
    {
        if self.channels.is_blocked(&self.addr.peer) {
            let e = PeerCallError(format!("peer {} is blocked by the fault filter", self.addr.peer));
            return Err(RPCError::Unreachable(Unreachable::new(&e)));
        }
        let client = match &mut self.client {
            Ok(c) => c,
            Err(e) => {
                return Err(RPCError::Unreachable(Unreachable::new(&PeerCallError(
                    e.0.clone(),
                ))))
            }
        };
        let payload = postcard::to_stdvec(req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let cluster_id = self.cluster.get();
        let mut request = tonic::Request::new(RaftMessage {
            payload,
            from: self.from,
            is_error: false,
            cluster_id,
        });
        request.set_timeout(option.hard_ttl());
        let started = std::time::Instant::now();
        let response = match rpc {
            Rpc::AppendEntries => client.append_entries(request).await,
            Rpc::Vote => client.vote(request).await,
            Rpc::InstallSnapshot => client.install_snapshot(request).await,
        };
        metrics::histogram!("ftkv_peer_rpc_seconds", "rpc" => rpc.name()).record(started.elapsed());
        let msg = match response {
            Ok(r) => {
                self.refusals.accepted(self.target);
                r.into_inner()
            }
            Err(status) if status.code() == tonic::Code::Unavailable => {
                return Err(RPCError::Unreachable(Unreachable::new(&status)));
            }
            Err(status) => {
                if status.code() == tonic::Code::FailedPrecondition {
                    self.warn_mismatch(status.message());
                }
                if let Some(index) = peer_guard::refusal_membership_index(&status) {
                    tracing::warn!(
                        peer = self.target,
                        membership_index = index,
                        message = status.message(),
                        "peer refuses this node as not a member"
                    );
                    self.refusals.refused(self.target, index);
                }
                return Err(RPCError::Network(NetworkError::new(&status)));
            }
        };
        if msg.cluster_id != 0 && cluster_id != 0 && msg.cluster_id != cluster_id {
            let text = super::cluster_id::mismatch_message(
                rpc.name(),
                self.from,
                cluster_id,
                self.target,
                msg.cluster_id,
            );
            self.warn_mismatch(&text);
            return Err(RPCError::Network(NetworkError::new(&PeerCallError(text))));
        }
        if msg.is_error {
            let err: RaftError<NodeId, E> =
                postcard::from_bytes(&msg.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
            return Err(RPCError::RemoteError(RemoteError::new_with_node(
                self.target,
                self.addr.clone(),
                err,
            )));
        }
        postcard::from_bytes(&msg.payload).map_err(|e| RPCError::Network(NetworkError::new(&e)))
    }
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<NodeId>, openraft::error::Infallible> {
        // A heartbeat (no entries) costs the follower no fsync: its duration is the round trip.
        let heartbeat = rpc.entries.is_empty();
        let started = std::time::Instant::now();
        let out = self.call(Rpc::AppendEntries, &rpc, &option).await;
        if heartbeat && out.is_ok() {
            metrics::histogram!(crate::telemetry::PEER_ROUND_TRIP_TIME_SECONDS, "To" => self.target.to_string())
                .record(started.elapsed());
        }
        out
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<NodeId>, InstallSnapshotError> {
        self.call(Rpc::InstallSnapshot, &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> RpcResult<VoteResponse<NodeId>, openraft::error::Infallible> {
        self.call(Rpc::Vote, &rpc, &option).await
    }
}
