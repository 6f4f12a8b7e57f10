//! Server side of the peer network: the `ftkv.raft.v1.Raft` tonic service.
//!
//! Each RPC decodes the postcard-encoded openraft request from `payload`, checks what it claims
//! (`peer_guard`: ranges, sender, shape), hands it to the local Raft, and answers with the
//! encoded response, or with `is_error = true` and the encoded `RaftError` (which the caller
//! turns into an openraft `RemoteError`). Undecodable or malformed payloads are
//! `INVALID_ARGUMENT`, senders outside the membership `PERMISSION_DENIED`, and so is a message
//! whose claimed sender is not the node its connection's peer certificate names
//! (`crate::tls::identity`, when peer TLS is on). `GetNodeInfo` answers
//! this node's id and advertised addresses.
//!
//! InstallSnapshot chunks are assembled here (openraft's `Chunked` receiver over this server's
//! own streaming state) rather than by `Raft::install_snapshot`, so that a finished file is
//! verified end to end before the Raft core is asked to install it. A damaged or truncated
//! stream is discarded and refused to the leader (which retries with a fresh snapshot after a
//! back-off); the Raft core of this node never sees it, so it keeps running.

use std::sync::Arc;

use ftkv_proto::raft::v1::raft_server::Raft as RaftService;
use ftkv_proto::raft::v1::{NodeInfo, NodeInfoRequest, RaftMessage};
use openraft::error::{Fatal, InstallSnapshotError, RaftError};
use openraft::network::snapshot_transport::{Chunked, SnapshotTransport, Streaming};
use openraft::raft::{InstallSnapshotRequest, InstallSnapshotResponse};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::peer_guard::{self, MembershipView};
use super::snapshot::SnapshotDir;
use super::types::{read_error, NodeId, Raft, TypeConfig};
use super::NodeAddr;

/// The peer service of one node.
#[derive(Clone)]
pub(crate) struct PeerServer {
    /// This node's id.
    pub node_id: NodeId,
    /// This node's advertised addresses.
    pub addr: NodeAddr,
    /// The local Raft.
    pub raft: Raft,
    /// The snapshot being received, if any (one at a time, as openraft's own receiver).
    pub streaming: Arc<tokio::sync::Mutex<Option<Streaming<TypeConfig>>>>,
    /// The snapshot directory (received files are verified through its file layer).
    pub snapshots: SnapshotDir,
    /// Records each AppendEntries accepted from a leader (for `/readyz`).
    pub contact: Arc<super::observe::LeaderContact>,
    /// This node's cluster id: every message must carry the same (see `cluster_id`).
    pub cluster: Arc<super::cluster_id::ClusterIdentity>,
    /// The node itself: a draining node refuses to take the leadership (`TimeoutNow`).
    pub local: super::ClusterNode,
}

fn decode<T: DeserializeOwned>(msg: &RaftMessage) -> Result<T, Status> {
    postcard::from_bytes(&msg.payload).map_err(|e| {
        Status::invalid_argument(format!("undecodable raft message from node {}: {e}", msg.from))
    })
}

fn encode<T: Serialize, E: Serialize>(
    from: NodeId,
    cluster_id: u64,
    result: Result<T, E>,
) -> Result<Response<RaftMessage>, Status> {
    let (payload, is_error) = match result {
        Ok(v) => (postcard::to_stdvec(&v), false),
        Err(e) => (postcard::to_stdvec(&e), true),
    };
    let payload = payload.map_err(|e| Status::internal(format!("encode raft response: {e}")))?;
    Ok(Response::new(RaftMessage {
        payload,
        from,
        is_error,
        cluster_id,
    }))
}

type SnapshotResult = Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>;

impl PeerServer {
    fn membership(&self) -> MembershipView {
        MembershipView::of(&self.raft.metrics().borrow().membership_config)
    }

    /// openraft's `Raft::install_snapshot`, with the finished file verified before the core
    /// installs it.
    async fn receive_snapshot(&self, req: InstallSnapshotRequest<TypeConfig>) -> SnapshotResult {
        let req_vote = req.vote;
        let my_vote = self.raft.with_raft_state(|state| *state.vote_ref()).await?;
        let resp = InstallSnapshotResponse { vote: my_vote };
        if !matches!(
            req_vote.partial_cmp(&my_vote),
            Some(std::cmp::Ordering::Greater | std::cmp::Ordering::Equal)
        ) {
            return Ok(resp);
        }
        let finished = {
            let mut streaming = self.streaming.lock().await;
            let received = Chunked::receive_snapshot(&mut *streaming, &self.raft, req).await;
            if received.is_err() {
                // A chunk that could not be written ends the transfer; the leader starts over.
                *streaming = None;
            }
            received?
        };
        let Some(snapshot) = finished else {
            return Ok(resp);
        };
        let path = snapshot.snapshot.path.clone();
        let checked = path.clone();
        let snapshots = self.snapshots.clone();
        let verdict = tokio::task::spawn_blocking(move || snapshots.verify_file(&checked))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        if let Err(detail) = verdict {
            tracing::error!(
                leader = req_vote.leader_id.node_id,
                snapshot = %snapshot.meta.snapshot_id,
                error = %detail,
                "discarding a damaged snapshot received from the leader"
            );
            drop(snapshot);
            if let Err(e) = self.snapshots.remove(&path) {
                tracing::warn!(path = %path.display(), error = %e, "could not remove the damaged snapshot");
            }
            // A remote Fatal makes the leader back off and retry with a fresh snapshot; nothing
            // here reaches this node's Raft core.
            let err = read_error(
                openraft::ErrorSubject::Snapshot(None),
                format!("received snapshot is damaged, discarded: {detail}"),
            );
            return Err(RaftError::Fatal(Fatal::StorageError(err)));
        }
        let installed = self.raft.install_full_snapshot(req_vote, snapshot).await?;
        Ok(installed.into())
    }
}

#[tonic::async_trait]
impl RaftService for PeerServer {
    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let started = std::time::Instant::now();
        let msg = request.get_ref();
        crate::tls::identity::check_peer_claim(request.extensions(), "AppendEntries", msg.from)?;
        self.cluster
            .check_peer("AppendEntries", msg.from, msg.cluster_id)?;
        let req: openraft::raft::AppendEntriesRequest<TypeConfig> = decode(msg)?;
        peer_guard::check_append_entries(&req, msg.from, &self.membership())?;
        metrics::histogram!("ftkv_peer_append_entries_entries").record(req.entries.len() as f64);
        let result = self.raft.append_entries(req).await;
        if matches!(&result, Ok(r) if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_))) {
            self.contact.record();
        }
        let out = encode(self.node_id, self.cluster.get(), result);
        metrics::histogram!("ftkv_peer_handle_seconds", "rpc" => "append_entries").record(started.elapsed());
        out
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let msg = request.get_ref();
        crate::tls::identity::check_peer_claim(request.extensions(), "Vote", msg.from)?;
        self.cluster.check_peer("Vote", msg.from, msg.cluster_id)?;
        let req: openraft::raft::VoteRequest<NodeId> = decode(msg)?;
        peer_guard::check_vote_request(&req, msg.from, &self.membership())?;
        encode(self.node_id, self.cluster.get(), self.raft.vote(req).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let msg = request.get_ref();
        crate::tls::identity::check_peer_claim(request.extensions(), "InstallSnapshot", msg.from)?;
        self.cluster
            .check_peer("InstallSnapshot", msg.from, msg.cluster_id)?;
        let req: InstallSnapshotRequest<TypeConfig> = decode(msg)?;
        peer_guard::check_install_snapshot(&req, msg.from, &self.membership())?;
        encode(self.node_id, self.cluster.get(), self.receive_snapshot(req).await)
    }

    async fn timeout_now(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let msg = request.get_ref();
        crate::tls::identity::check_peer_claim(request.extensions(), "TimeoutNow", msg.from)?;
        self.cluster.check_peer("TimeoutNow", msg.from, msg.cluster_id)?;
        super::drain::accept_timeout_now(&self.raft, self.node_id, msg.from, self.local.is_draining())
            .await?;
        encode(self.node_id, self.cluster.get(), Ok::<(), ()>(()))
    }

    async fn get_node_info(&self, _request: Request<NodeInfoRequest>) -> Result<Response<NodeInfo>, Status> {
        Ok(Response::new(NodeInfo {
            id: self.node_id,
            client_endpoint: self.addr.client.clone(),
            peer_endpoint: self.addr.peer.clone(),
            cluster_id: self.cluster.get(),
        }))
    }
}
