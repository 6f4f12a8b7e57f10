//! `DATA_DIR/node.toml`: the identity of the node that owns a data dir, and the evidence that
//! its Raft log once held state.
//!
//! Written (fsynced, then the directory synced) once this node has durably voted. On every
//! start: a data dir that belongs to another node id is refused; and a data dir whose identity
//! file exists while the Raft log holds neither a vote nor an entry nor a purge point is refused,
//! because its log was lost or zeroed (a disk fault): such a node may have acknowledged entries
//! it no longer has, and letting it rejoin would count it toward a quorum with nothing on disk
//! (Jepsen scenario 02; etcd 14098). The operator wipes the data dir and rejoins the node under
//! a new id, as for any lost disk.

use std::path::Path;

use super::data_dir_file;
use super::types::Raft;
use super::ClusterError;

const FILE_NAME: &str = "node.toml";
const FORMAT_VERSION: u32 = 1;

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Identity {
    format_version: u32,
    node_id: u64,
}

fn read(data_dir: &Path) -> Result<Option<Identity>, ClusterError> {
    data_dir_file::read(data_dir, FILE_NAME, FORMAT_VERSION, |id: &Identity| {
        id.format_version
    })
}

fn write(data_dir: &Path, node_id: u64) -> std::io::Result<()> {
    data_dir_file::write(
        data_dir,
        FILE_NAME,
        "Written by ftkv-node: this data dir belongs to this node id. Do not edit.",
        &Identity {
            format_version: FORMAT_VERSION,
            node_id,
        },
    )
}

/// Checks the data dir against the opened log before Raft starts (see the module docs).
pub fn check(data_dir: &Path, node_id: u64, log: &ftkv_log::Log) -> Result<(), ClusterError> {
    let log_has_state = log.get_meta(super::log_store::META_VOTE).is_some()
        || log.last_index().is_some()
        || log.purged_up_to().is_some();
    match read(data_dir)? {
        Some(id) if id.node_id != node_id => Err(ClusterError::Invalid(format!(
            "data dir {} belongs to node {}, not node {node_id}; start it with --id {} or use another data dir",
            data_dir.display(),
            id.node_id,
            id.node_id
        ))),
        Some(_) if !log_has_state => Err(ClusterError::Storage(format!(
            "the Raft log in {} is empty, but this node had voted before: the log was lost or \
             damaged, and entries this node acknowledged may be gone. Refusing to start. Wipe {} \
             and rejoin this machine under a new node id (see README: a wiped node rejoins under \
             a new id)",
            data_dir.join("log").display(),
            data_dir.display()
        ))),
        Some(_) => Ok(()),
        None if log_has_state => write(data_dir, node_id)
            .map_err(|e| ClusterError::Storage(format!("cannot write {FILE_NAME}: {e}"))),
        None => Ok(()),
    }
}

/// Writes the identity file once this node's vote is durable (openraft publishes the vote in
/// its metrics only after `save_vote` returned).
pub fn record_when_voted(data_dir: &Path, node_id: u64, raft: &Raft) {
    if data_dir.join(FILE_NAME).exists() {
        return;
    }
    let mut metrics = raft.metrics();
    let dir = data_dir.to_path_buf();
    tokio::spawn(async move {
        loop {
            let voted = metrics.borrow_and_update().vote.leader_id().term > 0;
            if voted {
                let d = dir.clone();
                match tokio::task::spawn_blocking(move || write(&d, node_id)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::error!(error = %e, "cannot write {FILE_NAME}"),
                    Err(e) => tracing::error!(error = %e, "writing {FILE_NAME} failed"),
                }
                return;
            }
            if metrics.changed().await.is_err() {
                return;
            }
        }
    });
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn open_log(dir: &Path) -> ftkv_log::Log {
        ftkv_log::Log::open(
            std::sync::Arc::new(ftkv_vfs::RealVfs),
            &dir.join("log"),
            ftkv_log::LogOptions::default(),
        )
        .unwrap()
    }

    #[test]
    fn empty_log_with_identity_is_refused_and_wrong_id_too() {
        let dir = tempfile::tempdir().unwrap();
        let log = open_log(dir.path());
        // A fresh node: no identity, no log state: fine, nothing written.
        check(dir.path(), 1, &log).unwrap();
        assert!(!dir.path().join(FILE_NAME).exists());
        // Once voted, the identity is recorded (here: found at start).
        log.put_meta(
            super::super::log_store::META_VOTE,
            bytes::Bytes::from_static(b"\x01v"),
            true,
        )
        .unwrap();
        check(dir.path(), 1, &log).unwrap();
        assert!(dir.path().join(FILE_NAME).exists());
        assert!(matches!(
            check(dir.path(), 2, &log),
            Err(ClusterError::Invalid(_))
        ));
        drop(log);
        // The log is lost: refuse.
        std::fs::remove_dir_all(dir.path().join("log")).unwrap();
        let log = open_log(dir.path());
        let err = check(dir.path(), 1, &log).unwrap_err();
        assert!(err.to_string().contains("Refusing to start"), "{err}");
    }
}
