//! Server side of the peer network: the `ftkv.raft.v1.Raft` tonic service.
//!
//! Each RPC decodes the postcard-encoded openraft request from `payload`, hands it to the local
//! Raft, and answers with the encoded response, or with `is_error = true` and the encoded
//! `RaftError` (which the caller turns into an openraft `RemoteError`). Undecodable payloads are
//! `INVALID_ARGUMENT`. `GetNodeInfo` answers this node's id and advertised addresses.

use ftkv_proto::raft::v1::raft_server::Raft as RaftService;
use ftkv_proto::raft::v1::{NodeInfo, NodeInfoRequest, RaftMessage};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tonic::{Request, Response, Status};

use super::types::{NodeId, Raft};
use super::NodeAddr;

/// The peer service of one node.
#[derive(Clone)]
pub struct PeerServer {
    /// This node's id.
    pub node_id: NodeId,
    /// This node's advertised addresses.
    pub addr: NodeAddr,
    /// The local Raft.
    pub raft: Raft,
}

fn decode<T: DeserializeOwned>(msg: &RaftMessage) -> Result<T, Status> {
    postcard::from_bytes(&msg.payload).map_err(|e| {
        Status::invalid_argument(format!("undecodable raft message from node {}: {e}", msg.from))
    })
}

fn encode<T: Serialize, E: Serialize>(
    from: NodeId,
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
    }))
}

#[tonic::async_trait]
impl RaftService for PeerServer {
    async fn append_entries(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let started = std::time::Instant::now();
        let req: openraft::raft::AppendEntriesRequest<super::types::TypeConfig> = decode(request.get_ref())?;
        metrics::histogram!("ftkv_peer_append_entries_entries").record(req.entries.len() as f64);
        let out = encode(self.node_id, self.raft.append_entries(req).await);
        metrics::histogram!("ftkv_peer_handle_seconds", "rpc" => "append_entries").record(started.elapsed());
        out
    }

    async fn vote(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let req = decode(request.get_ref())?;
        encode(self.node_id, self.raft.vote(req).await)
    }

    async fn install_snapshot(&self, request: Request<RaftMessage>) -> Result<Response<RaftMessage>, Status> {
        let req = decode(request.get_ref())?;
        encode(self.node_id, self.raft.install_snapshot(req).await)
    }

    async fn get_node_info(&self, _request: Request<NodeInfoRequest>) -> Result<Response<NodeInfo>, Status> {
        Ok(Response::new(NodeInfo {
            id: self.node_id,
            client_endpoint: self.addr.client.clone(),
            peer_endpoint: self.addr.peer.clone(),
        }))
    }
}
