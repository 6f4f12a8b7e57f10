//! Backup and restore (etcd's `snapshot save` / `etcdutl snapshot status|restore`).
//!
//! - **Save**: `ftkvctl snapshot save FILE` streams `Maintenance.Snapshot` of one node
//!   (`crate::server::maintenance`) into `FILE.part`, checks the trailer, fsyncs, renames.
//! - **Status**: [`status`] (`ftkv-node snapshot status FILE`) verifies a file end to end and
//!   counts its keys.
//! - **Restore**: [`restore`] (`ftkv-node snapshot restore FILE --data-dir D --id N
//!   --initial-cluster ...`) builds the data dir of one member of a **new** cluster from a
//!   backup: every user key of the image in a fresh engine, no Raft log, no membership (the
//!   node with the lowest id of `--initial-cluster` initializes the cluster at its first start,
//!   as for any new cluster), no client sessions, and a new cluster id written to
//!   `cluster.toml` (so the restored nodes can never exchange messages with the old cluster).
//!   Every member is restored from the same file with the same `--initial-cluster` (and
//!   `--initial-cluster-token`): the new id is derived from the file's hash and those, so they
//!   agree without talking.
//!
//! The file format: [`format`].

pub mod format;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::cluster::cluster_id::{format_cluster_id, write_cluster_id};
use crate::config::Config;
use format::VerifiedBackup;

/// What [`status`] reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupStatus {
    /// The verified file.
    pub backup: VerifiedBackup,
    /// User keys in it.
    pub keys: u64,
}

impl BackupStatus {
    /// `key: value` lines, as `ftkv-node snapshot status` prints them.
    pub fn lines(&self) -> Vec<String> {
        let h = &self.backup.header;
        let members: Vec<String> = h
            .members
            .iter()
            .map(|m| {
                format!(
                    "{}={} (client {}{})",
                    m.id,
                    m.peer,
                    m.client,
                    if m.voter { "" } else { ", learner" }
                )
            })
            .collect();
        vec![
            format!("hash: {:032x}", self.backup.hash),
            format!("applied index: {} (term {})", h.applied_index, h.applied_term),
            format!("keys: {}", self.keys),
            format!("size: {} bytes", self.backup.file_bytes),
            format!("cluster id: {}", format_cluster_id(h.cluster_id)),
            format!("taken from node: {}", h.node_id),
            format!("created (unix ms): {}", h.created_unix_ms),
            format!("membership: {}", members.join(", ")),
        ]
    }
}

/// Verifies `file` (checksum, header, every frame of the snapshot inside) and counts its keys.
pub fn status(file: &Path) -> anyhow::Result<BackupStatus> {
    let backup = format::verify(file)?;
    let dir = tempfile::tempdir().context("cannot create a temporary directory")?;
    let snap = dir.path().join("snapshot");
    format::extract_snapshot(file, &backup, &snap)?;
    let (keys, _) = crate::cluster::backup_image::count_snapshot_keys(&snap)
        .map_err(|e| anyhow::anyhow!("{} is not a sound ftkv backup: {e}", file.display()))?;
    Ok(BackupStatus { backup, keys })
}

/// `ftkv-node snapshot restore`'s options.
#[derive(Debug, Clone)]
pub struct RestoreOptions {
    /// The backup file.
    pub file: PathBuf,
    /// The node configuration the restored data dir is for (`data_dir`, `id`,
    /// `initial_cluster`, the engine settings).
    pub config: Config,
    /// Distinguishes clusters restored from the same file with the same `initial_cluster`.
    pub initial_cluster_token: String,
}

/// What [`restore`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreReport {
    /// Keys written.
    pub keys: u64,
    /// The new cluster id.
    pub cluster_id: u64,
    /// The id of the cluster the backup was taken from.
    pub old_cluster_id: u64,
}

/// The id of the cluster restored from a backup hashing to `hash` into `initial_cluster`
/// (never 0, never `old`).
pub fn restored_cluster_id(hash: u128, initial_cluster: &str, token: &str, old: u64) -> u64 {
    let mut input = Vec::new();
    input.extend_from_slice(b"ftkv-restore\0");
    input.extend_from_slice(&hash.to_le_bytes());
    input.extend_from_slice(initial_cluster.as_bytes());
    input.push(0);
    input.extend_from_slice(token.as_bytes());
    let mut id = xxhash_rust::xxh3::xxh3_64(&input);
    while id == 0 || id == old {
        id = xxhash_rust::xxh3::xxh3_64(&id.to_le_bytes());
    }
    id
}

fn is_empty_dir(dir: &Path) -> anyhow::Result<bool> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_none()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(true),
        Err(e) => Err(e).with_context(|| format!("cannot read data dir {}", dir.display())),
    }
}

/// Restores a backup into a new, empty data dir (see the module docs). Refuses a non-empty
/// data dir, an id outside `initial_cluster`, and a damaged or truncated file (before writing
/// anything). On a failure after it began, removes what it wrote.
pub fn restore(options: &RestoreOptions) -> anyhow::Result<RestoreReport> {
    let config = &options.config;
    let data_dir = &config.data_dir;
    if !is_empty_dir(data_dir)? {
        bail!(
            "data dir {} is not empty: a restore builds a new data dir (stop the node and move \
             the old one away, or pick another --data-dir)",
            data_dir.display()
        );
    }
    let peers = config.initial_peers()?;
    if !peers.contains_key(&config.id) {
        bail!(
            "node {} is not in --initial-cluster {:?}: every member of the restored cluster is \
             listed there, this one included",
            config.id,
            config.initial_cluster
        );
    }
    let backup = format::verify(&options.file)?;
    let created = !data_dir.exists();
    let result = restore_into(options, &backup);
    if result.is_err() {
        let cleanup = if created {
            std::fs::remove_dir_all(data_dir)
        } else {
            clear_dir(data_dir)
        };
        if let Err(e) = cleanup {
            tracing::warn!(data_dir = %data_dir.display(), error = %e, "cannot remove a failed restore");
        }
    }
    result
}

fn clear_dir(dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

fn restore_into(options: &RestoreOptions, backup: &VerifiedBackup) -> anyhow::Result<RestoreReport> {
    let config = &options.config;
    let lock = crate::run::DataDirLock::acquire(&config.data_dir)?;
    let snapshots = config.data_dir.join("snapshots");
    std::fs::create_dir_all(&snapshots).with_context(|| format!("cannot create {}", snapshots.display()))?;
    let snap = snapshots.join("restore.tmp");
    format::extract_snapshot(&options.file, backup, &snap)?;
    let engine = crate::run::open_engine(config)?;
    let keys = crate::cluster::backup_image::restore_into(&snap, &engine)
        .map_err(|e| anyhow::anyhow!("{} is not a sound ftkv backup: {e}", options.file.display()))?;
    drop(engine);
    std::fs::remove_file(&snap).with_context(|| format!("cannot remove {}", snap.display()))?;
    let cluster_id = restored_cluster_id(
        backup.hash,
        &config.initial_cluster,
        &options.initial_cluster_token,
        backup.header.cluster_id,
    );
    write_cluster_id(&config.data_dir, cluster_id)
        .with_context(|| format!("cannot write the cluster id into {}", config.data_dir.display()))?;
    drop(lock);
    Ok(RestoreReport {
        keys,
        cluster_id,
        old_cluster_id: backup.header.cluster_id,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_restored_id_is_shared_by_the_members_and_new() {
        let a = restored_cluster_id(7, "1=a:1,2=b:1", "", 5);
        assert_eq!(a, restored_cluster_id(7, "1=a:1,2=b:1", "", 5));
        assert_ne!(a, restored_cluster_id(7, "1=a:1,2=b:1", "t", 5));
        assert_ne!(a, restored_cluster_id(8, "1=a:1,2=b:1", "", 5));
        assert_ne!(restored_cluster_id(7, "x", "", a), a);
    }

    #[test]
    fn a_non_empty_data_dir_is_refused_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("precious"), b"x").unwrap();
        let config = Config {
            data_dir: dir.path().to_path_buf(),
            initial_cluster: "1=127.0.0.1:1".into(),
            ..Config::default()
        };
        let err = restore(&RestoreOptions {
            file: dir.path().join("none.db"),
            config,
            initial_cluster_token: String::new(),
        })
        .unwrap_err();
        assert!(err.to_string().contains("is not empty"), "{err}");
        assert_eq!(std::fs::read(dir.path().join("precious")).unwrap(), b"x");
    }
}
