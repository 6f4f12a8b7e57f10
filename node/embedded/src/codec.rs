//! The two on-disk encodings of embedded mode, byte by byte. Every integer is little-endian and
//! fixed-width; every length is a `u32` byte count.
//!
//! # Log record payload: one write batch (format version 1)
//!
//! One [`crate::Db::write`] call is one log record whose log index is the batch's LSN (as one
//! TokuDB transaction commit is one entry of PerconaFT's recovery log, and one RocksDB
//! `WriteBatch` is one WAL record). The log adds the length, the index and a crc32c around the
//! payload, so the payload carries no checksum of its own:
//!
//! ```text
//! version  u8   = 1
//! count    u32  number of ops
//! op*      count times:
//!   tag u8
//!   1 Put          key:bytes  value:bytes
//!   2 Delete       key:bytes
//!   3 Upsert       key:bytes  upsert
//!   4 DeleteRange  start:bytes end:opt_bytes
//!   5 UpsertRange  start:bytes end:opt_bytes upsert
//! bytes     = len u32, then len bytes
//! opt_bytes = 0u8 (None) | 1u8 then bytes (Some)
//! upsert    = tag u8: 1 SetIfAbsent bytes | 2 Add i64 | 3 Append bytes | 4 Max bytes
//! ```
//!
//! Decoding is strict: an unknown version, op tag or upsert tag, a length running past the end,
//! an option flag other than 0/1, or bytes left over after `count` ops are errors, never skipped.
//!
//! # Engine metadata blob (format version 1, 28 bytes)
//!
//! Stored with [`ftkv_engine::Engine::write`]'s `meta` argument, atomically with the data of the
//! batch it describes, and persisted by every engine checkpoint (PerconaFT keeps the checkpoint
//! LSN in the FT header the same way; RocksDB keeps the flushed sequence number in the MANIFEST):
//!
//! ```text
//! 0..4    magic        b"FTEM"
//! 4..8    version      u32 = 1
//! 8..16   db_id        u64   identity shared with the log (see below)
//! 16..24  applied_lsn  u64   last log index whose batch this engine state contains
//! 24..28  crc32c       u32   of bytes 0..24
//! ```
//!
//! # Log identity meta (format version 1, 16 bytes)
//!
//! Stored durably in the log as the meta [`LOG_IDENTITY_KEY`] when the database is created:
//! `magic b"FTEL" | version u32 = 1 | db_id u64`. The log checksums its metas. It lets
//! [`crate::Db::open`] refuse an engine and a log that do not belong together (a log directory
//! deleted or swapped), instead of replaying the wrong records or silently restarting at LSN 1.

use ftkv_engine::{UpsertOp, WriteOp};

use crate::Lsn;

/// Format version of a batch payload written by this build.
pub const BATCH_FORMAT_VERSION: u8 = 1;
/// Format version of the engine metadata blob written by this build.
pub const META_FORMAT_VERSION: u32 = 1;
/// Format version of the log identity written by this build.
pub const LOG_IDENTITY_VERSION: u32 = 1;
/// Length of an encoded [`EngineMeta`], in bytes.
pub const ENGINE_META_LEN: usize = 28;
/// Length of an encoded log identity, in bytes.
pub const LOG_IDENTITY_LEN: usize = 16;
/// Name of the log meta holding the log identity.
pub const LOG_IDENTITY_KEY: &str = "ftkv-embedded.identity";

const META_MAGIC: &[u8; 4] = b"FTEM";
const LOG_IDENTITY_MAGIC: &[u8; 4] = b"FTEL";

const TAG_PUT: u8 = 1;
const TAG_DELETE: u8 = 2;
const TAG_UPSERT: u8 = 3;
const TAG_DELETE_RANGE: u8 = 4;
const TAG_UPSERT_RANGE: u8 = 5;

const UPSERT_SET_IF_ABSENT: u8 = 1;
const UPSERT_ADD: u8 = 2;
const UPSERT_APPEND: u8 = 3;
const UPSERT_MAX: u8 = 4;

/// Smallest encoding of one op (a tag and one empty byte string), to bound `count` by the
/// payload length before allocating.
const MIN_OP_BYTES: usize = 1 + 4;

/// Why bytes did not decode. Every variant names the structure (`what`) it was decoding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The format version is not one this build reads (written by a newer build, or garbage).
    #[error("unsupported {what} format version {found} (this build reads {supported})")]
    UnsupportedVersion {
        /// Which structure.
        what: &'static str,
        /// Version found.
        found: u32,
        /// Version this build reads.
        supported: u32,
    },
    /// The bytes do not start with the structure's magic (not written by embedded mode: e.g. the
    /// engine directory of a cluster node, whose metadata is the Raft state machine's).
    #[error("{what} has magic {found:02x?}, expected {expected:02x?} (not written by ftkv-embedded)")]
    BadMagic {
        /// Which structure.
        what: &'static str,
        /// The first bytes found.
        found: Vec<u8>,
        /// The magic expected.
        expected: &'static [u8],
    },
    /// The stored checksum does not match the bytes.
    #[error("{what} checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum {
        /// Which structure.
        what: &'static str,
        /// crc32c stored.
        stored: u32,
        /// crc32c of the bytes read.
        computed: u32,
    },
    /// The bytes end before the structure does, or the structure has the wrong fixed length.
    #[error("{what} truncated: needs {needed} bytes at offset {offset}, {available} available")]
    Truncated {
        /// Which structure.
        what: &'static str,
        /// Offset (bytes) where the read started.
        offset: usize,
        /// Bytes needed from `offset`.
        needed: usize,
        /// Bytes left from `offset`.
        available: usize,
    },
    /// A tag byte (op, upsert op or option flag) this build does not know.
    #[error("unknown {what} tag {tag} at offset {offset}")]
    UnknownTag {
        /// Which field.
        what: &'static str,
        /// The tag byte.
        tag: u8,
        /// Offset (bytes) of the tag.
        offset: usize,
    },
    /// Bytes are left after the structure's end.
    #[error("{what} has {extra} trailing bytes after offset {offset}")]
    TrailingBytes {
        /// Which structure.
        what: &'static str,
        /// Offset (bytes) where the structure ended.
        offset: usize,
        /// Bytes left over.
        extra: usize,
    },
}

// ------------------------------------------------------------------------------------------
// Batches
// ------------------------------------------------------------------------------------------

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    // Lengths above u32::MAX never reach here: `Db::write` bounds batches far below (the log's
    // record limit is 64 MiB).
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn put_opt_bytes(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => out.push(0),
        Some(b) => {
            out.push(1);
            put_bytes(out, b);
        }
    }
}

fn put_upsert(out: &mut Vec<u8>, op: &UpsertOp) {
    match op {
        UpsertOp::SetIfAbsent(v) => {
            out.push(UPSERT_SET_IF_ABSENT);
            put_bytes(out, v);
        }
        UpsertOp::Add(d) => {
            out.push(UPSERT_ADD);
            out.extend_from_slice(&d.to_le_bytes());
        }
        UpsertOp::Append(v) => {
            out.push(UPSERT_APPEND);
            put_bytes(out, v);
        }
        UpsertOp::Max(v) => {
            out.push(UPSERT_MAX);
            put_bytes(out, v);
        }
    }
}

/// Bytes [`encode_batch`] produces for `ops`, computed without encoding (to refuse an oversized
/// batch before copying it).
pub fn encoded_batch_len(ops: &[WriteOp]) -> usize {
    fn upsert_len(op: &UpsertOp) -> usize {
        1 + match op {
            UpsertOp::Add(_) => 8,
            UpsertOp::SetIfAbsent(v) | UpsertOp::Append(v) | UpsertOp::Max(v) => 4 + v.len(),
        }
    }
    let opt_len = |b: &Option<Vec<u8>>| 1 + b.as_ref().map_or(0, |b| 4 + b.len());
    let ops_len: usize = ops
        .iter()
        .map(|op| {
            1 + match op {
                WriteOp::Put { key, value } => 8 + key.len() + value.len(),
                WriteOp::Delete { key } => 4 + key.len(),
                WriteOp::Upsert { key, op } => 4 + key.len() + upsert_len(op),
                WriteOp::DeleteRange { start, end } => 4 + start.len() + opt_len(end),
                WriteOp::UpsertRange { start, end, op } => 4 + start.len() + opt_len(end) + upsert_len(op),
            }
        })
        .sum();
    1 + 4 + ops_len
}

/// Encodes one write batch as a log record payload (format above). The caller bounds the batch
/// (`Db::write` refuses batches above `EmbeddedOptions::max_batch_bytes`), so every length fits
/// its `u32`.
pub fn encode_batch(ops: &[WriteOp]) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_batch_len(ops));
    out.push(BATCH_FORMAT_VERSION);
    out.extend_from_slice(&(ops.len() as u32).to_le_bytes());
    for op in ops {
        match op {
            WriteOp::Put { key, value } => {
                out.push(TAG_PUT);
                put_bytes(&mut out, key);
                put_bytes(&mut out, value);
            }
            WriteOp::Delete { key } => {
                out.push(TAG_DELETE);
                put_bytes(&mut out, key);
            }
            WriteOp::Upsert { key, op } => {
                out.push(TAG_UPSERT);
                put_bytes(&mut out, key);
                put_upsert(&mut out, op);
            }
            WriteOp::DeleteRange { start, end } => {
                out.push(TAG_DELETE_RANGE);
                put_bytes(&mut out, start);
                put_opt_bytes(&mut out, end.as_deref());
            }
            WriteOp::UpsertRange { start, end, op } => {
                out.push(TAG_UPSERT_RANGE);
                put_bytes(&mut out, start);
                put_opt_bytes(&mut out, end.as_deref());
                put_upsert(&mut out, op);
            }
        }
    }
    out
}

/// A bounds-checked reader over a byte slice.
struct Reader<'a> {
    what: &'static str,
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        let available = self.buf.len() - self.pos;
        if n > available {
            return Err(CodecError::Truncated {
                what: self.what,
                offset: self.pos,
                needed: n,
                available,
            });
        }
        let s = self
            .buf
            .get(self.pos..self.pos + n)
            .ok_or(CodecError::Truncated {
                what: self.what,
                offset: self.pos,
                needed: n,
                available,
            })?;
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], CodecError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }

    fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.array::<1>()?[0])
    }

    fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    fn bytes(&mut self) -> Result<Vec<u8>, CodecError> {
        let len = self.u32()? as usize;
        Ok(self.take(len)?.to_vec())
    }

    fn opt_bytes(&mut self) -> Result<Option<Vec<u8>>, CodecError> {
        let offset = self.pos;
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.bytes()?)),
            tag => Err(CodecError::UnknownTag {
                what: "range end flag",
                tag,
                offset,
            }),
        }
    }

    fn upsert(&mut self) -> Result<UpsertOp, CodecError> {
        let offset = self.pos;
        Ok(match self.u8()? {
            UPSERT_SET_IF_ABSENT => UpsertOp::SetIfAbsent(self.bytes()?),
            UPSERT_ADD => UpsertOp::Add(i64::from_le_bytes(self.array()?)),
            UPSERT_APPEND => UpsertOp::Append(self.bytes()?),
            UPSERT_MAX => UpsertOp::Max(self.bytes()?),
            tag => {
                return Err(CodecError::UnknownTag {
                    what: "upsert op",
                    tag,
                    offset,
                })
            }
        })
    }

    fn finish(&self) -> Result<(), CodecError> {
        match self.buf.len() - self.pos {
            0 => Ok(()),
            extra => Err(CodecError::TrailingBytes {
                what: self.what,
                offset: self.pos,
                extra,
            }),
        }
    }
}

/// Decodes a log record payload written by [`encode_batch`].
///
/// Errors: `UnsupportedVersion` for a version other than [`BATCH_FORMAT_VERSION`],
/// `UnknownTag`, `Truncated`, `TrailingBytes` (see the module docs). Never panics, and never
/// allocates more than the payload's length implies.
pub fn decode_batch(payload: &[u8]) -> Result<Vec<WriteOp>, CodecError> {
    let mut r = Reader {
        what: "write batch",
        buf: payload,
        pos: 0,
    };
    let version = r.u8()?;
    if version != BATCH_FORMAT_VERSION {
        return Err(CodecError::UnsupportedVersion {
            what: "write batch",
            found: u32::from(version),
            supported: u32::from(BATCH_FORMAT_VERSION),
        });
    }
    let count = r.u32()? as usize;
    let remaining = payload.len() - r.pos;
    if count > remaining / MIN_OP_BYTES {
        return Err(CodecError::Truncated {
            what: "write batch",
            offset: r.pos,
            needed: count.saturating_mul(MIN_OP_BYTES),
            available: remaining,
        });
    }
    let mut ops = Vec::with_capacity(count);
    for _ in 0..count {
        let offset = r.pos;
        let op = match r.u8()? {
            TAG_PUT => WriteOp::Put {
                key: r.bytes()?,
                value: r.bytes()?,
            },
            TAG_DELETE => WriteOp::Delete { key: r.bytes()? },
            TAG_UPSERT => WriteOp::Upsert {
                key: r.bytes()?,
                op: r.upsert()?,
            },
            TAG_DELETE_RANGE => WriteOp::DeleteRange {
                start: r.bytes()?,
                end: r.opt_bytes()?,
            },
            TAG_UPSERT_RANGE => WriteOp::UpsertRange {
                start: r.bytes()?,
                end: r.opt_bytes()?,
                op: r.upsert()?,
            },
            tag => {
                return Err(CodecError::UnknownTag {
                    what: "write op",
                    tag,
                    offset,
                })
            }
        };
        ops.push(op);
    }
    r.finish()?;
    Ok(ops)
}

// ------------------------------------------------------------------------------------------
// Engine metadata and log identity
// ------------------------------------------------------------------------------------------

/// What embedded mode stores in the engine's metadata blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineMeta {
    /// Identity of the database (equal to the log's identity).
    pub db_id: u64,
    /// The last log index (LSN) whose batch the engine state contains; 0 = none.
    pub applied_lsn: Lsn,
}

/// Checks the 4-byte magic and the u32 format version after it (`BadMagic`, then `Truncated`,
/// then `UnsupportedVersion`); returns a reader positioned after them.
fn versioned_reader<'a>(
    what: &'static str,
    buf: &'a [u8],
    magic: &'static [u8; 4],
    supported: u32,
) -> Result<Reader<'a>, CodecError> {
    let head = buf.get(..4).unwrap_or(buf);
    if head != magic {
        return Err(CodecError::BadMagic {
            what,
            found: head.to_vec(),
            expected: magic,
        });
    }
    let mut r = Reader { what, buf, pos: 4 };
    let version = r.u32()?;
    if version != supported {
        return Err(CodecError::UnsupportedVersion {
            what,
            found: version,
            supported,
        });
    }
    Ok(r)
}

impl EngineMeta {
    /// The 28-byte encoding (module docs).
    pub fn encode(&self) -> [u8; ENGINE_META_LEN] {
        let mut out = [0u8; ENGINE_META_LEN];
        out[0..4].copy_from_slice(META_MAGIC);
        out[4..8].copy_from_slice(&META_FORMAT_VERSION.to_le_bytes());
        out[8..16].copy_from_slice(&self.db_id.to_le_bytes());
        out[16..24].copy_from_slice(&self.applied_lsn.to_le_bytes());
        let crc = crc32c::crc32c(&out[0..24]);
        out[24..28].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// Decodes the engine metadata blob. Checks, in order: magic (`BadMagic`), version
    /// (`UnsupportedVersion`: checked before the length, so a newer, longer layout is reported
    /// as a version error), length (`Truncated` / `TrailingBytes`), crc32c (`Checksum`).
    pub fn decode(buf: &[u8]) -> Result<Self, CodecError> {
        const WHAT: &str = "engine meta";
        let mut r = versioned_reader(WHAT, buf, META_MAGIC, META_FORMAT_VERSION)?;
        let db_id = r.u64()?;
        let applied_lsn = r.u64()?;
        let stored = r.u32()?;
        r.finish()?;
        let computed = crc32c::crc32c(buf.get(..24).unwrap_or(buf));
        if stored != computed {
            return Err(CodecError::Checksum {
                what: WHAT,
                stored,
                computed,
            });
        }
        Ok(EngineMeta { db_id, applied_lsn })
    }
}

/// The 16-byte log identity for `db_id` (module docs).
pub fn encode_log_identity(db_id: u64) -> [u8; LOG_IDENTITY_LEN] {
    let mut out = [0u8; LOG_IDENTITY_LEN];
    out[0..4].copy_from_slice(LOG_IDENTITY_MAGIC);
    out[4..8].copy_from_slice(&LOG_IDENTITY_VERSION.to_le_bytes());
    out[8..16].copy_from_slice(&db_id.to_le_bytes());
    out
}

/// Decodes a log identity into its `db_id`. Errors: `BadMagic`, `UnsupportedVersion`,
/// `Truncated`, `TrailingBytes`.
pub fn decode_log_identity(buf: &[u8]) -> Result<u64, CodecError> {
    let mut r = versioned_reader("log identity", buf, LOG_IDENTITY_MAGIC, LOG_IDENTITY_VERSION)?;
    let db_id = r.u64()?;
    r.finish()?;
    Ok(db_id)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn sample() -> Vec<WriteOp> {
        vec![
            WriteOp::Put {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            },
            WriteOp::Delete { key: vec![] },
            WriteOp::Upsert {
                key: b"c".to_vec(),
                op: UpsertOp::Add(-3),
            },
            WriteOp::DeleteRange {
                start: b"a".to_vec(),
                end: None,
            },
            WriteOp::UpsertRange {
                start: b"a".to_vec(),
                end: Some(b"z".to_vec()),
                op: UpsertOp::Max(b"m".to_vec()),
            },
            WriteOp::Upsert {
                key: b"s".to_vec(),
                op: UpsertOp::SetIfAbsent(b"x".to_vec()),
            },
            WriteOp::Upsert {
                key: b"s".to_vec(),
                op: UpsertOp::Append(b"y".to_vec()),
            },
        ]
    }

    #[test]
    fn batch_round_trips_and_length_is_exact() {
        let ops = sample();
        let enc = encode_batch(&ops);
        assert_eq!(enc.len(), encoded_batch_len(&ops));
        assert_eq!(decode_batch(&enc).unwrap(), ops);
        assert_eq!(decode_batch(&encode_batch(&[])).unwrap(), vec![]);
    }

    #[test]
    fn every_truncation_and_bad_tag_is_an_error() {
        let enc = encode_batch(&sample());
        for cut in 0..enc.len() {
            assert!(decode_batch(&enc[..cut]).is_err(), "cut at {cut}");
        }
        let mut extra = enc.clone();
        extra.push(0);
        assert!(matches!(
            decode_batch(&extra),
            Err(CodecError::TrailingBytes { .. })
        ));
        let mut v2 = enc.clone();
        v2[0] = 2;
        assert!(matches!(
            decode_batch(&v2),
            Err(CodecError::UnsupportedVersion { found: 2, .. })
        ));
        let mut bad_op = enc.clone();
        bad_op[5] = 9;
        assert!(matches!(
            decode_batch(&bad_op),
            Err(CodecError::UnknownTag {
                tag: 9,
                offset: 5,
                ..
            })
        ));
        // A huge count with few bytes is refused before allocating.
        let mut huge = vec![BATCH_FORMAT_VERSION];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode_batch(&huge), Err(CodecError::Truncated { .. })));
    }

    #[test]
    fn meta_round_trips_and_rejects_damage() {
        let m = EngineMeta {
            db_id: 0xdead_beef_1234,
            applied_lsn: 77,
        };
        let enc = m.encode();
        assert_eq!(EngineMeta::decode(&enc).unwrap(), m);
        let mut v9 = enc;
        v9[4] = 9;
        assert!(matches!(
            EngineMeta::decode(&v9),
            Err(CodecError::UnsupportedVersion { found: 9, .. })
        ));
        let mut flipped = enc;
        flipped[17] ^= 1;
        assert!(matches!(
            EngineMeta::decode(&flipped),
            Err(CodecError::Checksum { .. })
        ));
        assert!(matches!(
            EngineMeta::decode(b"raft state machine"),
            Err(CodecError::BadMagic { .. })
        ));
        assert!(EngineMeta::decode(&enc[..20]).is_err());
        assert!(EngineMeta::decode(&[]).is_err());
        assert_eq!(decode_log_identity(&encode_log_identity(5)).unwrap(), 5);
        assert!(decode_log_identity(&encode_log_identity(5)[..12]).is_err());
    }
}

/// Property tests of every record kind's decoder (write batches, the engine meta, the log
/// identity): arbitrary bytes (the log's crc32c has already passed) decode to an error or a
/// value, never a panic, and never an allocation sized by an untrusted count.
#[cfg(test)]
mod decode_props {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn batches_of_arbitrary_bytes_never_panic(payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode_batch(&payload);
        }

        #[test]
        fn batches_with_a_valid_prefix_never_panic(
            ops in proptest::collection::vec(any::<u8>(), 0..40),
            tail in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            // A real batch's leading bytes (magic, version), then arbitrary bytes.
            let real = encode_batch(&[WriteOp::Put { key: ops.clone(), value: ops }]);
            let mut payload = real.get(..real.len().min(8)).unwrap_or_default().to_vec();
            payload.extend_from_slice(&tail);
            let _ = decode_batch(&payload);
        }

        #[test]
        fn engine_meta_and_log_identity_never_panic(buf in proptest::collection::vec(any::<u8>(), 0..100)) {
            let _ = EngineMeta::decode(&buf);
            let _ = decode_log_identity(&buf);
        }
    }
}
