//! `DATA_DIR/cluster.toml`: the identity of the cluster a node belongs to (etcd's cluster ID).
//!
//! A cluster id is a random non-zero `u64`, created by the node that initializes a new cluster
//! (before it proposes the first membership) and by `ftkv-node snapshot restore` (a restored
//! cluster is a new cluster: it gets a new id, so it can never join the old one). Every peer
//! RPC carries the sender's id (`RaftMessage.cluster_id`, `NodeInfo.cluster_id`; responses too),
//! and a message from another cluster is refused before the Raft core sees it
//! (`FAILED_PRECONDITION`, "cluster ID mismatch"): a node started on another cluster's data
//! dir, or a peer address that now belongs to another cluster, cannot disturb this one.
//!
//! A node with no id yet (a fresh node waiting to be added, a member of the initial cluster
//! before the first message of its initializer, a data dir from a build without cluster ids)
//! takes the id of the first peer message that carries one, writing it durably (file fsynced,
//! then its directory) before it answers. Id 0 on the wire means "none yet" and is accepted.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::Status;

use super::data_dir_file;
use super::types::NodeId;
use super::ClusterError;

const FILE_NAME: &str = "cluster.toml";
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format_version: u32,
    /// Hexadecimal, as `ftkvctl` and the logs print it.
    cluster_id: String,
}

/// How a cluster id is printed: 16 hexadecimal digits.
pub fn format_cluster_id(id: u64) -> String {
    format!("{id:016x}")
}

/// Reads `DATA_DIR/cluster.toml` (`Ok(None)` when absent).
pub fn read_cluster_id(data_dir: &Path) -> Result<Option<u64>, ClusterError> {
    let Some(file) = data_dir_file::read(data_dir, FILE_NAME, FORMAT_VERSION, |f: &File| f.format_version)?
    else {
        return Ok(None);
    };
    match u64::from_str_radix(&file.cluster_id, 16) {
        Ok(id) if id != 0 => Ok(Some(id)),
        _ => Err(ClusterError::Storage(format!(
            "{} is corrupt: cluster_id {:?} is not a non-zero hexadecimal u64",
            data_dir.join(FILE_NAME).display(),
            file.cluster_id
        ))),
    }
}

/// Writes `DATA_DIR/cluster.toml` durably (temporary file fsynced, renamed, directory fsynced).
pub fn write_cluster_id(data_dir: &Path, id: u64) -> std::io::Result<()> {
    data_dir_file::write(
        data_dir,
        FILE_NAME,
        "Written by ftkv-node: the cluster this data dir belongs to. Do not edit.",
        &File {
            format_version: FORMAT_VERSION,
            cluster_id: format_cluster_id(id),
        },
    )
}

/// A random non-zero cluster id.
pub fn random_cluster_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}

/// This node's cluster id, shared by the peer server and client. Cheap to share (`Arc`).
#[derive(Debug)]
pub(crate) struct ClusterIdentity {
    node_id: NodeId,
    data_dir: PathBuf,
    /// 0 while none is known.
    id: AtomicU64,
    /// Serializes the first write of the file.
    adopt: parking_lot::Mutex<()>,
    /// When a refusal was last logged (at most one line per 10 s).
    refusal_logged: parking_lot::Mutex<Option<std::time::Instant>>,
}

impl ClusterIdentity {
    /// Loads the id of the node `node_id` from its data dir.
    pub(crate) fn load(node_id: NodeId, data_dir: &Path) -> Result<Self, ClusterError> {
        let id = read_cluster_id(data_dir)?.unwrap_or(0);
        if id != 0 {
            tracing::info!(cluster_id = %format_cluster_id(id), "cluster identity");
        }
        Ok(ClusterIdentity {
            node_id,
            data_dir: data_dir.to_path_buf(),
            id: AtomicU64::new(id),
            adopt: parking_lot::Mutex::new(()),
            refusal_logged: parking_lot::Mutex::new(None),
        })
    }

    /// The id (0 while none is known).
    pub(crate) fn get(&self) -> u64 {
        self.id.load(Ordering::Acquire)
    }

    /// Records `id` durably when this node has none yet; returns the id this node has now.
    fn adopt(&self, id: u64) -> Result<u64, ClusterError> {
        let _guard = self.adopt.lock();
        let current = self.get();
        if current != 0 || id == 0 {
            return Ok(current);
        }
        write_cluster_id(&self.data_dir, id).map_err(|e| {
            ClusterError::Storage(format!(
                "cannot write {}: {e}",
                self.data_dir.join(FILE_NAME).display()
            ))
        })?;
        self.id.store(id, Ordering::Release);
        tracing::info!(cluster_id = %format_cluster_id(id), "joined cluster");
        Ok(id)
    }

    /// A new cluster is initialized by this node: creates its id unless it has one (restored).
    pub(crate) fn create_if_missing(&self) -> Result<u64, ClusterError> {
        self.adopt(random_cluster_id())
    }

    /// The check of every peer message: `peer_cluster` (0: the peer has none yet) must be this
    /// node's cluster. A node with none takes the peer's. `what` names the RPC for the error.
    pub(crate) fn check_peer(&self, what: &str, peer: NodeId, peer_cluster: u64) -> Result<(), Status> {
        let mut mine = self.get();
        if mine == 0 && peer_cluster != 0 {
            mine = self
                .adopt(peer_cluster)
                .map_err(|e| Status::unavailable(e.to_string()))?;
        }
        if peer_cluster == 0 || mine == 0 || peer_cluster == mine {
            return Ok(());
        }
        let text = mismatch_message(what, self.node_id, mine, peer, peer_cluster);
        {
            let now = std::time::Instant::now();
            let mut logged = self.refusal_logged.lock();
            if logged.is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_secs(10)) {
                *logged = Some(now);
                tracing::error!(peer, "{text}");
            }
        }
        Err(Status::failed_precondition(text))
    }
}

/// The text of a cluster-ID mismatch (both ends log it).
pub(crate) fn mismatch_message(what: &str, me: NodeId, mine: u64, peer: NodeId, theirs: u64) -> String {
    format!(
        "cluster ID mismatch: node {me} belongs to cluster {}, node {peer} to cluster {}; {what} \
         refused (a data dir or a peer of another cluster: restored clusters get a new id)",
        format_cluster_id(mine),
        format_cluster_id(theirs)
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn adopts_the_first_id_then_refuses_another() {
        let dir = tempfile::tempdir().unwrap();
        let c = ClusterIdentity::load(2, dir.path()).unwrap();
        assert_eq!(c.get(), 0);
        c.check_peer("Vote", 1, 0).unwrap();
        assert_eq!(c.get(), 0, "id 0 on the wire is not adopted");
        c.check_peer("AppendEntries", 1, 0xabc).unwrap();
        assert_eq!(c.get(), 0xabc);
        let err = c.check_peer("AppendEntries", 7, 0xdef).unwrap_err();
        assert_eq!(err.code(), tonic::Code::FailedPrecondition);
        assert!(err.message().contains("cluster ID mismatch"), "{}", err.message());
        assert!(err.message().contains("0000000000000abc"), "{}", err.message());
        // Persisted: a restart knows it.
        let again = ClusterIdentity::load(2, dir.path()).unwrap();
        assert_eq!(again.get(), 0xabc);
        assert_eq!(again.create_if_missing().unwrap(), 0xabc);
    }

    #[test]
    fn a_damaged_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(FILE_NAME),
            "format_version = 1\ncluster_id = \"zz\"\n",
        )
        .unwrap();
        let err = ClusterIdentity::load(1, dir.path()).unwrap_err();
        assert!(err.to_string().contains("corrupt"), "{err}");
    }
}
