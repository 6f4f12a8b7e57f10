//! `ftkvctl snapshot save FILE` (etcdctl's `snapshot save`): a backup of one node.
//!
//! Streams `Maintenance.Snapshot` of the first `--endpoints` entry into `FILE.part` with a
//! progress bar on stderr (hidden when stderr is not a terminal), checks the trailer (length and
//! xxh3-128 of everything before it, as the node hashed it while sending), fsyncs, renames it
//! to `FILE` and fsyncs the directory. A failure leaves no `FILE` (and removes `FILE.part`).
//! `ftkv-node snapshot status FILE` checks it again, to the last frame.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use crate::Client;

/// `snapshot ...`.
#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCommand {
    /// Save a consistent point-in-time backup of one node (the first of --endpoints) to FILE.
    Save {
        /// Where to write it (FILE.part meanwhile).
        file: PathBuf,
    },
}

/// Bytes of the file's trailer: magic, body length u64, xxh3-128.
const TRAILER_BYTES: usize = 32;
const TRAILER_MAGIC: &[u8; 8] = b"FTKVBEND";
/// Offset of the applied index in the header (see `node/src/backup/format.rs`).
const APPLIED_INDEX_AT: usize = 28;

fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
}

/// Runs `snapshot save`; returns the line to print.
pub async fn run(client: &Client, endpoints: &[String], cmd: &SnapshotCommand) -> anyhow::Result<String> {
    let SnapshotCommand::Save { file } = cmd;
    let Some(endpoint) = endpoints.first() else {
        bail!("snapshot save needs one endpoint (--endpoints)");
    };
    let part = PathBuf::from(format!("{}.part", file.display()));
    let result = save(client, endpoint, file, &part).await;
    if result.is_err() {
        let _ = std::fs::remove_file(&part);
    }
    result
}

async fn save(client: &Client, endpoint: &str, file: &Path, part: &Path) -> anyhow::Result<String> {
    let mut stream = client
        .snapshot_stream(endpoint)
        .await
        .with_context(|| format!("snapshot of {endpoint}"))?;
    let mut out = std::fs::File::create(part).with_context(|| format!("cannot create {}", part.display()))?;
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{bytes}/{total_bytes} {wide_bar} {bytes_per_sec} {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    // The last TRAILER_BYTES received are held back: they are not hashed.
    let mut tail: Vec<u8> = Vec::new();
    let mut head: Vec<u8> = Vec::new();
    let mut received = 0u64;
    let mut total = 0u64;
    while let Some(msg) = stream
        .message()
        .await
        .with_context(|| format!("snapshot stream from {endpoint} broke off"))?
    {
        if total == 0 {
            total = msg.total_bytes;
            bar.set_length(total);
        }
        received += msg.blob.len() as u64;
        out.write_all(&msg.blob)
            .with_context(|| format!("cannot write {}", part.display()))?;
        if head.len() < 64 {
            head.extend(msg.blob.iter().take(64));
        }
        tail.extend_from_slice(&msg.blob);
        if tail.len() > TRAILER_BYTES {
            let cut = tail.len() - TRAILER_BYTES;
            hasher.update(tail.get(..cut).unwrap_or_default());
            tail.drain(..cut);
        }
        bar.set_position(received);
    }
    bar.finish_and_clear();
    if received != total || tail.len() != TRAILER_BYTES {
        bail!("snapshot stream from {endpoint} ended after {received} of {total} bytes");
    }
    let body_len = received - TRAILER_BYTES as u64;
    let hash = hasher.digest128();
    let recorded = tail
        .get(16..32)
        .and_then(|b| b.try_into().ok())
        .map(u128::from_le_bytes);
    if tail.get(..8) != Some(TRAILER_MAGIC.as_slice())
        || le_u64(&tail, 8) != Some(body_len)
        || recorded != Some(hash)
    {
        bail!("the snapshot received from {endpoint} does not match its trailer (damaged in transit)");
    }
    out.sync_all()
        .with_context(|| format!("cannot fsync {}", part.display()))?;
    drop(out);
    std::fs::rename(part, file)
        .with_context(|| format!("cannot rename {} to {}", part.display(), file.display()))?;
    let dir = file
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."));
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("cannot fsync {}", dir.display()))?;
    Ok(format!(
        "Snapshot saved at {} ({received} bytes, applied index {}, hash {hash:032x})\n",
        file.display(),
        le_u64(&head, APPLIED_INDEX_AT).unwrap_or(0)
    ))
}
