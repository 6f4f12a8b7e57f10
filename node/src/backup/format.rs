//! The backup file (`ftkvctl snapshot save`), every integer fixed-width little-endian:
//!
//! ```text
//! offset      field            type
//! 0           magic            8 bytes "FTKVBKUP"
//! 8           format_version   u32     BACKUP_FORMAT_VERSION
//! 12          cluster_id       u64     the cluster it was taken from
//! 20          node_id          u64     the node that answered
//! 28          applied_index    u64     the Raft log index the image is at (0: none)
//! 36          applied_term     u64     that entry's term
//! 44          created_unix_ms  u64
//! 52          membership_len   u32
//! 56          membership       JSON    [{"id":1,"client":"h:7379","peer":"h:7380","voter":true},..]
//! 56+m        snapshot_len     u64
//! 64+m        snapshot         the node's Raft snapshot file as it is (node/src/cluster/snapshot.rs:
//!                              header with the openraft meta, zstd body of checksummed frames)
//! 64+m+s      trailer          8 bytes "FTKVBEND" | body_len u64 | xxh3-128 (u128) of the body
//! ```
//!
//! The body is everything before the trailer (`body_len` = file size - 32). A file is sound
//! when its trailer is there, its hash matches, its header parses and its lengths add up; the
//! snapshot inside is then checked frame by frame when it is read.

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// First bytes of a backup file.
pub const BACKUP_MAGIC: &[u8; 8] = b"FTKVBKUP";
/// First bytes of its trailer.
pub const TRAILER_MAGIC: &[u8; 8] = b"FTKVBEND";
/// Format version written and read by this build.
pub const BACKUP_FORMAT_VERSION: u32 = 1;
/// Bytes of the trailer.
pub const TRAILER_BYTES: u64 = 32;
/// Bytes of the header before the membership.
const FIXED_HEADER_BYTES: u64 = 56;
/// Largest membership JSON accepted (guards the allocation on a damaged file).
const MAX_MEMBERSHIP_BYTES: u32 = 1 << 20;

/// Errors reading a backup file.
#[derive(Debug, thiserror::Error)]
pub enum BackupError {
    /// File system error.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Not a sound backup file.
    #[error("{path} is not a sound ftkv backup: {detail}")]
    Corrupt {
        /// The file.
        path: String,
        /// What did not match.
        detail: String,
    },
}

/// One member of the membership a backup was taken in.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BackupMember {
    /// Node id.
    pub id: u64,
    /// Client endpoint.
    pub client: String,
    /// Peer endpoint.
    pub peer: String,
    /// Voter (else learner).
    pub voter: bool,
}

/// The header of a backup file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupHeader {
    /// Cluster it was taken from.
    pub cluster_id: u64,
    /// Node that answered.
    pub node_id: u64,
    /// Raft log index of the image.
    pub applied_index: u64,
    /// Its term.
    pub applied_term: u64,
    /// When it was taken.
    pub created_unix_ms: u64,
    /// The membership then.
    pub members: Vec<BackupMember>,
    /// Bytes of the embedded Raft snapshot.
    pub snapshot_len: u64,
}

impl BackupHeader {
    /// The encoded header (everything before the snapshot bytes).
    pub fn encode(&self) -> Result<Vec<u8>, serde_json::Error> {
        let members = serde_json::to_vec(&self.members)?;
        let mut out = Vec::with_capacity(FIXED_HEADER_BYTES as usize + members.len() + 8);
        out.extend_from_slice(BACKUP_MAGIC);
        out.extend_from_slice(&BACKUP_FORMAT_VERSION.to_le_bytes());
        for v in [
            self.cluster_id,
            self.node_id,
            self.applied_index,
            self.applied_term,
            self.created_unix_ms,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(members.len() as u32).to_le_bytes());
        out.extend_from_slice(&members);
        out.extend_from_slice(&self.snapshot_len.to_le_bytes());
        Ok(out)
    }

    /// Bytes [`BackupHeader::encode`] writes.
    pub fn encoded_len(&self) -> Result<u64, serde_json::Error> {
        Ok(self.encode()?.len() as u64)
    }
}

/// The trailer of a body of `body_len` bytes hashing to `hash` (xxh3-128).
pub fn trailer(body_len: u64, hash: u128) -> [u8; TRAILER_BYTES as usize] {
    let mut out = [0u8; TRAILER_BYTES as usize];
    let (magic, rest) = out.split_at_mut(8);
    magic.copy_from_slice(TRAILER_MAGIC);
    let (len, digest) = rest.split_at_mut(8);
    len.copy_from_slice(&body_len.to_le_bytes());
    digest.copy_from_slice(&hash.to_le_bytes());
    out
}

fn le_u64(bytes: &[u8], at: usize) -> Option<u64> {
    bytes
        .get(at..at + 8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
}

fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(u32::from_le_bytes)
}

/// A verified backup file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedBackup {
    /// Its header.
    pub header: BackupHeader,
    /// Offset of the embedded snapshot in the file.
    pub snapshot_offset: u64,
    /// Size of the file.
    pub file_bytes: u64,
    /// Its xxh3-128 (the trailer's).
    pub hash: u128,
}

/// Reads `path` end to end: trailer, hash, header, lengths (see the module docs).
pub fn verify(path: &Path) -> Result<VerifiedBackup, BackupError> {
    let shown = path.display().to_string();
    let io = |source| BackupError::Io {
        path: shown.clone(),
        source,
    };
    let corrupt = |detail: String| BackupError::Corrupt {
        path: shown.clone(),
        detail,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let file_bytes = file.metadata().map_err(io)?.len();
    if file_bytes < FIXED_HEADER_BYTES + 8 + TRAILER_BYTES {
        return Err(corrupt(format!(
            "{file_bytes} bytes is shorter than the smallest backup (truncated?)"
        )));
    }
    let body_len = file_bytes - TRAILER_BYTES;
    let mut tail = [0u8; TRAILER_BYTES as usize];
    file.seek(SeekFrom::Start(body_len)).map_err(io)?;
    file.read_exact(&mut tail).map_err(io)?;
    if tail.get(..8) != Some(TRAILER_MAGIC.as_slice()) {
        return Err(corrupt("no trailer at its end (truncated or damaged)".into()));
    }
    if le_u64(&tail, 8) != Some(body_len) {
        return Err(corrupt(format!(
            "the trailer records {} body bytes, the file holds {body_len} (truncated or damaged)",
            le_u64(&tail, 8).unwrap_or(0)
        )));
    }
    let recorded = tail
        .get(16..32)
        .and_then(|b| b.try_into().ok())
        .map(u128::from_le_bytes)
        .unwrap_or(0);
    file.seek(SeekFrom::Start(0)).map_err(io)?;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let mut head: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut left = body_len;
    while left > 0 {
        let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
        let chunk = buf.get_mut(..want).ok_or_else(|| corrupt("buffer".into()))?;
        file.read_exact(chunk).map_err(io)?;
        hasher.update(chunk);
        if head.len() < (FIXED_HEADER_BYTES + MAX_MEMBERSHIP_BYTES as u64 + 8) as usize {
            head.extend_from_slice(chunk);
        }
        left -= want as u64;
    }
    let hash = hasher.digest128();
    if hash != recorded {
        return Err(corrupt(format!(
            "checksum mismatch: the body hashes to {hash:032x}, the trailer records {recorded:032x}"
        )));
    }
    if head.get(..8) != Some(BACKUP_MAGIC.as_slice()) {
        return Err(corrupt("bad magic (not an ftkv backup file)".into()));
    }
    let version = le_u32(&head, 8).unwrap_or(0);
    if version != BACKUP_FORMAT_VERSION {
        return Err(corrupt(format!(
            "format version {version}; this build reads {BACKUP_FORMAT_VERSION}"
        )));
    }
    let field = |at: usize| le_u64(&head, at).ok_or_else(|| corrupt("header cut short".into()));
    let membership_len = le_u32(&head, 52).ok_or_else(|| corrupt("header cut short".into()))?;
    if membership_len > MAX_MEMBERSHIP_BYTES {
        return Err(corrupt(format!("membership of {membership_len} bytes")));
    }
    let m_end = FIXED_HEADER_BYTES as usize + membership_len as usize;
    let members: Vec<BackupMember> = head
        .get(FIXED_HEADER_BYTES as usize..m_end)
        .ok_or_else(|| corrupt("membership cut short".into()))
        .and_then(|b| serde_json::from_slice(b).map_err(|e| corrupt(format!("membership: {e}"))))?;
    let snapshot_len = field(m_end)?;
    let snapshot_offset = m_end as u64 + 8;
    if snapshot_offset.checked_add(snapshot_len) != Some(body_len) {
        return Err(corrupt(format!(
            "the header's snapshot of {snapshot_len} bytes at offset {snapshot_offset} does not end \
             where the body does ({body_len})"
        )));
    }
    Ok(VerifiedBackup {
        header: BackupHeader {
            cluster_id: field(12)?,
            node_id: field(20)?,
            applied_index: field(28)?,
            applied_term: field(36)?,
            created_unix_ms: field(44)?,
            members,
            snapshot_len,
        },
        snapshot_offset,
        file_bytes,
        hash,
    })
}

/// Copies the embedded snapshot of a verified backup to `to` (fsynced).
pub fn extract_snapshot(path: &Path, backup: &VerifiedBackup, to: &Path) -> Result<(), BackupError> {
    let io = |p: &Path| {
        let shown = p.display().to_string();
        move |source| BackupError::Io { path: shown, source }
    };
    let mut from = std::fs::File::open(path).map_err(io(path))?;
    from.seek(SeekFrom::Start(backup.snapshot_offset))
        .map_err(io(path))?;
    let mut out = std::fs::File::create(to).map_err(io(to))?;
    let copied = std::io::copy(&mut from.take(backup.header.snapshot_len), &mut out).map_err(io(to))?;
    if copied != backup.header.snapshot_len {
        return Err(BackupError::Corrupt {
            path: path.display().to_string(),
            detail: format!("snapshot cut short at {copied} bytes"),
        });
    }
    out.sync_all().map_err(io(to))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn write_backup(dir: &Path, snapshot: &[u8]) -> std::path::PathBuf {
        let header = BackupHeader {
            cluster_id: 0x1234,
            node_id: 2,
            applied_index: 99,
            applied_term: 3,
            created_unix_ms: 1,
            members: vec![BackupMember {
                id: 1,
                client: "h:1".into(),
                peer: "h:2".into(),
                voter: true,
            }],
            snapshot_len: snapshot.len() as u64,
        };
        let mut body = header.encode().unwrap();
        body.extend_from_slice(snapshot);
        let hash = xxhash_rust::xxh3::xxh3_128(&body);
        let mut file = body.clone();
        file.extend_from_slice(&trailer(body.len() as u64, hash));
        let path = dir.join("b.db");
        std::fs::write(&path, file).unwrap();
        path
    }

    #[test]
    fn round_trip_and_every_damage_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_backup(dir.path(), b"FTKVSNAP-and-more");
        let v = verify(&path).unwrap();
        assert_eq!(v.header.applied_index, 99);
        assert_eq!(v.header.cluster_id, 0x1234);
        assert_eq!(v.header.members.len(), 1);
        let out = dir.path().join("snap");
        extract_snapshot(&path, &v, &out).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), b"FTKVSNAP-and-more");

        let good = std::fs::read(&path).unwrap();
        // A flipped byte anywhere in the body: checksum mismatch.
        for at in [0, 13, 60, good.len() - 40] {
            let mut bad = good.clone();
            bad[at] ^= 0x40;
            std::fs::write(&path, &bad).unwrap();
            let err = verify(&path).unwrap_err().to_string();
            assert!(err.contains("checksum mismatch"), "{at}: {err}");
        }
        // Truncated anywhere: no trailer or a wrong length.
        for keep in [0, 10, good.len() / 2, good.len() - 1] {
            std::fs::write(&path, &good[..keep]).unwrap();
            let err = verify(&path).unwrap_err().to_string();
            assert!(err.contains("not a sound ftkv backup"), "{keep}: {err}");
        }
    }
}
