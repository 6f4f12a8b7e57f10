//! The cluster layer's part of backups (`crate::backup`): a point-in-time copy of the state
//! machine in the Raft snapshot format, and reading one back into a fresh engine.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ftkv_engine::{Engine, EngineError};

use super::snapshot::SnapshotDir;
use super::state_machine::{encode_meta, PersistedMeta};
use super::{ClusterError, ClusterNode, MemberInfo};

/// A snapshot file written for a backup; removed when dropped.
#[derive(Debug)]
pub struct BackupImage {
    /// The snapshot file (Raft snapshot format).
    pub path: PathBuf,
    /// Its size.
    pub snapshot_len: u64,
    /// Applied log index (0: none) and term of the image.
    pub applied_index: u64,
    /// Term of that entry.
    pub applied_term: u64,
    /// The membership of the image.
    pub members: Vec<MemberInfo>,
    /// This node's cluster id.
    pub cluster_id: u64,
    /// This node.
    pub node_id: u64,
}

impl Drop for BackupImage {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot remove a backup's snapshot copy");
        }
    }
}

impl ClusterNode {
    /// Writes a copy of the state machine as applied now (one point in time, the apply lock
    /// held while it is written) for a backup.
    pub async fn backup_image(&self) -> Result<BackupImage, ClusterError> {
        let _in_flight = self.inner.drain.enter(self.inner.config.node_id)?;
        let sm = self.inner.state_machine.clone();
        let seq = rand::random::<u32>();
        let name = format!("backup-{seq}.tmp");
        let (meta, path) = tokio::task::spawn_blocking(move || sm.write_copy(&name))
            .await
            .map_err(|e| ClusterError::Storage(format!("backup task: {e}")))?
            .map_err(|e| ClusterError::Storage(format!("writing the backup copy: {e}")))?;
        let snapshot_len = std::fs::metadata(&path)
            .map_err(|e| ClusterError::Storage(format!("{}: {e}", path.display())))?
            .len();
        let membership = meta.last_membership.membership();
        let voters: std::collections::BTreeSet<u64> = membership.voter_ids().collect();
        let members = membership
            .nodes()
            .map(|(id, addr)| MemberInfo {
                id: *id,
                addr: addr.clone(),
                is_voter: voters.contains(id),
            })
            .collect();
        Ok(BackupImage {
            path,
            snapshot_len,
            applied_index: meta.last_log_id.map_or(0, |l| l.index),
            applied_term: meta.last_log_id.map_or(0, |l| l.leader_id.term),
            members,
            cluster_id: self.inner.cluster.get(),
            node_id: self.inner.config.node_id,
        })
    }
}

fn snapshots_of(path: &Path) -> SnapshotDir {
    SnapshotDir::new(
        ftkv_vfs::RealVfs::new(),
        path.parent().unwrap_or_else(|| Path::new(".")),
    )
}

/// Counts the user keys of a Raft snapshot file, checking every frame (client sessions, under
/// the reserved prefix, are not counted). Returns (keys, applied index).
pub fn count_snapshot_keys(path: &Path) -> Result<(u64, u64), String> {
    let (mut reader, meta, _) = snapshots_of(path).reader(path).map_err(|e| e.to_string())?;
    let mut keys = 0u64;
    while let Some((key, _)) = reader.next_pair().map_err(|e| e.to_string())? {
        if !super::reserved_keys::is_reserved(&key) {
            keys += 1;
        }
    }
    Ok((keys, meta.last_log_id.map_or(0, |l| l.index)))
}

/// Fills `engine` (fresh) with the user keys of a Raft snapshot file, checked frame by frame,
/// as the state of a new cluster: no applied log id, no membership (the cluster is
/// initialized anew from `initial_cluster`), no client sessions (those of the old cluster mean
/// nothing here). Returns the keys written.
pub fn restore_into(path: &Path, engine: &Arc<dyn Engine>) -> Result<u64, String> {
    let (mut reader, _, _) = snapshots_of(path).reader(path).map_err(|e| e.to_string())?;
    let meta = encode_meta(&PersistedMeta::default()).map_err(|e| e.to_string())?;
    let mut keys = 0u64;
    let location = path.display().to_string();
    let mut pairs = std::iter::from_fn(|| loop {
        match reader.next_pair() {
            Ok(Some((key, _))) if super::reserved_keys::is_reserved(&key) => continue,
            Ok(Some(pair)) => {
                keys += 1;
                return Some(Ok(pair));
            }
            Ok(None) => return None,
            Err(e) => {
                return Some(Err(EngineError::Corruption {
                    location: location.clone(),
                    detail: e.to_string(),
                }))
            }
        }
    });
    engine.replace_all(&mut pairs, &meta).map_err(|e| e.to_string())?;
    engine.checkpoint().map_err(|e| e.to_string())?;
    Ok(keys)
}
