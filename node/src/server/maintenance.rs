//! `ftkv.v1.Maintenance`: backups (`Snapshot`), answered by the node asked (never forwarded).
//!
//! `Snapshot` writes a point-in-time copy of the state machine (`ClusterNode::backup_image`, in
//! the Raft snapshot format), then streams the backup file of `crate::backup::format`: its
//! header, the copy's bytes, and the trailer with the xxh3-128 of everything before it,
//! hashed as it is sent. The copy is removed once the stream ends (or the client goes away).

use std::io::Read;

use ftkv_proto::v1 as pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::backup::format::{trailer, BackupHeader, BackupMember};
use crate::cluster::ClusterNode;

/// Bytes of snapshot per message.
const CHUNK_BYTES: usize = 1 << 20;

/// The service.
#[derive(Clone)]
pub struct MaintenanceService {
    cluster: ClusterNode,
    auth: std::sync::Arc<super::auth::AuthGuard>,
}

impl MaintenanceService {
    /// The service of this node; `Snapshot` needs the role root while auth is enabled.
    pub fn new(cluster: ClusterNode, auth: std::sync::Arc<super::auth::AuthGuard>) -> Self {
        Self { cluster, auth }
    }
}

fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[tonic::async_trait]
impl pb::maintenance_server::Maintenance for MaintenanceService {
    type SnapshotStream = ReceiverStream<Result<pb::SnapshotResponse, Status>>;

    async fn snapshot(
        &self,
        request: Request<pb::SnapshotRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        self.auth.require_root(&request, "snapshot save").await?;
        let image = self
            .cluster
            .backup_image()
            .await
            .map_err(super::errors::cluster)?;
        let header = BackupHeader {
            cluster_id: image.cluster_id,
            node_id: image.node_id,
            applied_index: image.applied_index,
            applied_term: image.applied_term,
            created_unix_ms: now_unix_ms(),
            members: image
                .members
                .iter()
                .map(|m| BackupMember {
                    id: m.id,
                    client: m.addr.client.clone(),
                    peer: m.addr.peer.clone(),
                    voter: m.is_voter,
                })
                .collect(),
            snapshot_len: image.snapshot_len,
        }
        .encode()
        .map_err(|e| Status::internal(format!("encoding the backup header: {e}")))?;
        let file = std::fs::File::open(&image.path)
            .map_err(|e| Status::internal(format!("{}: {e}", image.path.display())))?;
        let body_len = header.len() as u64 + image.snapshot_len;
        let total = body_len + crate::backup::format::TRAILER_BYTES;
        tracing::info!(
            applied_index = image.applied_index,
            bytes = total,
            "streaming a backup"
        );
        let (tx, rx) = mpsc::channel(4);
        tokio::task::spawn_blocking(move || {
            let _image = image; // removed once sent
            let mut file = file;
            let mut hasher = xxhash_rust::xxh3::Xxh3::new();
            let mut sent = 0u64;
            let mut send = |blob: Vec<u8>, hasher: &mut xxhash_rust::xxh3::Xxh3, hash: bool| {
                if hash {
                    hasher.update(&blob);
                }
                sent += blob.len() as u64;
                let msg = pb::SnapshotResponse {
                    blob,
                    total_bytes: total,
                    remaining_bytes: total.saturating_sub(sent),
                };
                tx.blocking_send(Ok(msg)).is_ok()
            };
            if !send(header, &mut hasher, true) {
                return;
            }
            let mut buf = vec![0u8; CHUNK_BYTES];
            loop {
                match file.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => {
                        let chunk = buf.get(..n).map(<[u8]>::to_vec).unwrap_or_default();
                        if !send(chunk, &mut hasher, true) {
                            return;
                        }
                    }
                    Err(e) => {
                        let _ =
                            tx.blocking_send(Err(Status::internal(format!("reading the backup copy: {e}"))));
                        return;
                    }
                }
            }
            let end = trailer(body_len, hasher.digest128());
            let _ = send(end.to_vec(), &mut hasher, false);
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
