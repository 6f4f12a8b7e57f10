//! Bulk loads in the state machine (`Kv.BulkLoad`, `ftkvctl load`): staged chunks, commit, cancel.
//!
//! **Design: rows through Raft, staged in the engine, ingested by one entry.** The leader packs
//! the rows it receives into chunks of about [`CHUNK_TARGET_BYTES`] (encoded below, zstd
//! compressed) and proposes each as a [`Command::BulkStage`] entry: Raft replicates it, every
//! replica fsyncs it in its log (group commit) and applies it as one engine put under the
//! reserved key space ([`staging_key`]: `0xFF 0xFF 'b' ++ term ++ nonce ++ seq`), where no
//! client read or scan reaches. The load's [`Command::BulkCommit`] entry, alone in its entry,
//! then feeds every staged row, in chunk order, to `Engine::bulk_load` together with the
//! deletion of the staging range and the new state-machine metadata: the rows become visible
//! together, on every replica, at the same log index, or not at all.
//!
//! Why not ship files to followers and ingest them by checksum (TiKV's SST import)? A replica
//! that was down while the files were shipped, or that installs a snapshot between the upload
//! and the ingest, would need a second transfer protocol with its own retention and
//! retries; here the log and the snapshot (the staging keys are engine keys) carry everything,
//! so every recovery path Raft already has (catch-up, snapshot install, crash replay) covers
//! loads too. The cost per replica: each row is written compressed to the Raft log once and
//! to the engine twice (staged chunk, then the ingested row) plus the staging's deletion.
//!
//! **Cancellation is deterministic.** A load belongs to the term of the leader that took it
//! ([`LoadId::term`]). Applying any entry of a later term cancels every load of an earlier
//! term (a new leader's first entry is its blank entry, so a leader change cancels at once on
//! every replica), and a `BulkStage` or `BulkCommit` of a term other than its entry's is
//! refused. A stream that ends without commit is cancelled by a [`Command::BulkAbort`].
//! A crash replays the log from the engine's applied index: staged chunks are re-applied,
//! committed loads were ingested atomically with the metadata. Nothing leaks.

use std::collections::{BTreeMap, BTreeSet};

use ftkv_engine::{BulkLoadOptions, Engine, EngineError, KeyValue, OnDuplicate, WriteOp};

use super::command::{CommandResult, LoadId};
use super::reserved_keys::RESERVED_KEY_PREFIX;

/// Tag after the reserved prefix of a staging key.
pub(crate) const STAGING_TAG: u8 = b'b';

/// Bytes of rows (uncompressed, with their length fields) the leader packs into one chunk.
pub const CHUNK_TARGET_BYTES: usize = 1 << 20;

/// Version byte of an encoded chunk.
const CHUNK_VERSION: u8 = 1;

/// `version u8, rows u32, raw_len u32, xxh3-64 of the compressed bytes u64` (little-endian).
const CHUNK_HEADER_BYTES: usize = 1 + 4 + 4 + 8;

/// Default memory the sort of a committed load may use before it spills sorted runs
/// (`engine.loader_memory_size`).
pub const DEFAULT_LOADER_MEMORY_BYTES: u64 = 64 << 20;

/// Errors of the chunk codec. A chunk in the log or the engine that fails to decode is a
/// storage fault (the leader encoded it): it stops the node, it is never skipped.
#[derive(Debug, thiserror::Error)]
pub enum ChunkError {
    /// The chunk is malformed or fails its checksum.
    #[error("bulk-load chunk {what}: {detail}")]
    Bad {
        /// Which chunk.
        what: String,
        /// What did not match.
        detail: String,
    },
}

/// Engine key of chunk `seq` of `load`. Integers are big-endian here (only here): keys compare
/// bytewise, so chunks of a load sort in sequence order and loads by (term, nonce).
pub(crate) fn staging_key(load: LoadId, seq: u32) -> Vec<u8> {
    let mut k = load_prefix(load);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// `0xFF 0xFF 'b' ++ term ++ nonce`: the prefix of every chunk key of `load`.
fn load_prefix(load: LoadId) -> Vec<u8> {
    let mut k = Vec::with_capacity(RESERVED_KEY_PREFIX.len() + 1 + 20);
    k.extend_from_slice(RESERVED_KEY_PREFIX);
    k.push(STAGING_TAG);
    k.extend_from_slice(&load.term.to_be_bytes());
    k.extend_from_slice(&load.nonce.to_be_bytes());
    k
}

/// `[start, end)` of every chunk key of `load`.
fn load_range(load: LoadId) -> (Vec<u8>, Vec<u8>) {
    let start = load_prefix(load);
    let mut end = start.clone();
    end.extend_from_slice(&[0xFF; 5]);
    (start, end)
}

/// The whole staging area: `[0xFF 0xFF 'b', 0xFF 0xFF 'c')`.
pub(crate) fn staging_area() -> (Vec<u8>, Vec<u8>) {
    let mut start = RESERVED_KEY_PREFIX.to_vec();
    start.push(STAGING_TAG);
    let mut end = RESERVED_KEY_PREFIX.to_vec();
    end.push(STAGING_TAG + 1);
    (start, end)
}

/// Chunks staged in `engine` (every load's).
pub fn staged_chunks(engine: &dyn Engine) -> Result<u64, EngineError> {
    let staged = StagedLoads::load(engine)?;
    Ok(staged.loads.values().map(|seqs| seqs.len() as u64).sum())
}

/// Parses a staging key into its load and chunk number.
pub(crate) fn parse_staging_key(key: &[u8]) -> Option<(LoadId, u32)> {
    let rest = key
        .strip_prefix(RESERVED_KEY_PREFIX)?
        .strip_prefix(&[STAGING_TAG])?;
    if rest.len() != 20 {
        return None;
    }
    let term = u64::from_be_bytes(rest.get(0..8)?.try_into().ok()?);
    let nonce = u64::from_be_bytes(rest.get(8..16)?.try_into().ok()?);
    let seq = u32::from_be_bytes(rest.get(16..20)?.try_into().ok()?);
    Some((LoadId { term, nonce }, seq))
}

/// Builds chunks out of rows (the leader's side).
#[derive(Debug, Default)]
pub struct ChunkBuilder {
    raw: Vec<u8>,
    rows: u32,
}

impl ChunkBuilder {
    /// Adds one row.
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        self.raw.extend_from_slice(&(key.len() as u32).to_le_bytes());
        self.raw.extend_from_slice(key);
        self.raw.extend_from_slice(&(value.len() as u32).to_le_bytes());
        self.raw.extend_from_slice(value);
        self.rows += 1;
    }

    /// Whether the chunk reached [`CHUNK_TARGET_BYTES`].
    pub fn is_full(&self) -> bool {
        self.raw.len() >= CHUNK_TARGET_BYTES
    }

    /// Rows added since the last [`ChunkBuilder::finish`].
    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// The encoded chunk of the rows added so far (the builder starts again empty).
    pub fn finish(&mut self) -> Result<Vec<u8>, ChunkError> {
        let raw = std::mem::take(&mut self.raw);
        let rows = std::mem::take(&mut self.rows);
        let compressed = zstd::bulk::compress(&raw, 1).map_err(|e| ChunkError::Bad {
            what: "being built".into(),
            detail: format!("zstd: {e}"),
        })?;
        let mut out = Vec::with_capacity(CHUNK_HEADER_BYTES + compressed.len());
        out.push(CHUNK_VERSION);
        out.extend_from_slice(&rows.to_le_bytes());
        out.extend_from_slice(&(raw.len() as u32).to_le_bytes());
        out.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&compressed).to_le_bytes());
        out.extend_from_slice(&compressed);
        Ok(out)
    }
}

fn le_u32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Decodes a chunk into its rows. Bounded: the raw length is checked against twice the target
/// before anything is allocated, and every length inside against what is left.
pub fn decode_chunk(chunk: &[u8], what: &str) -> Result<Vec<KeyValue>, ChunkError> {
    let bad = |detail: String| ChunkError::Bad {
        what: what.to_string(),
        detail,
    };
    let header = chunk
        .get(..CHUNK_HEADER_BYTES)
        .ok_or_else(|| bad(format!("{} bytes, shorter than its header", chunk.len())))?;
    if header.first() != Some(&CHUNK_VERSION) {
        return Err(bad(format!("unknown version {:?}", header.first())));
    }
    let rows = le_u32(header, 1).unwrap_or(0) as usize;
    let raw_len = le_u32(header, 5).unwrap_or(0) as usize;
    let sum = header
        .get(9..17)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_le_bytes)
        .unwrap_or(0);
    let compressed = chunk.get(CHUNK_HEADER_BYTES..).unwrap_or_default();
    if xxhash_rust::xxh3::xxh3_64(compressed) != sum {
        return Err(bad("checksum mismatch".into()));
    }
    if raw_len > 2 * CHUNK_TARGET_BYTES + (64 << 20) {
        return Err(bad(format!("raw length {raw_len} is out of bounds")));
    }
    let raw = zstd::bulk::decompress(compressed, raw_len).map_err(|e| bad(format!("zstd: {e}")))?;
    if raw.len() != raw_len {
        return Err(bad(format!("{} raw bytes, header says {raw_len}", raw.len())));
    }
    let mut out = Vec::with_capacity(rows.min(raw_len / 8 + 1));
    let mut at = 0usize;
    let field = |at: &mut usize| -> Result<Vec<u8>, ChunkError> {
        let len = le_u32(&raw, *at).ok_or_else(|| bad(format!("truncated length at byte {at}")))? as usize;
        let start = *at + 4;
        let bytes = raw
            .get(start..start.saturating_add(len))
            .ok_or_else(|| bad(format!("field of {len} bytes at byte {start} runs past the end")))?;
        *at = start + len;
        Ok(bytes.to_vec())
    };
    while at < raw.len() {
        let key = field(&mut at)?;
        let value = field(&mut at)?;
        out.push((key, value));
    }
    if out.len() != rows {
        return Err(bad(format!("{} rows, header says {rows}", out.len())));
    }
    Ok(out)
}

/// The loads with staged chunks, as the replicated state says (rebuilt from the engine at
/// open and after a snapshot install; kept in step by every apply).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct StagedLoads {
    loads: BTreeMap<LoadId, BTreeSet<u32>>,
}

impl StagedLoads {
    /// Reads the staging area of `engine` (keys only matter; values are read a page at a time).
    pub(crate) fn load(engine: &dyn Engine) -> Result<Self, EngineError> {
        let (start, end) = staging_area();
        let mut loads: BTreeMap<LoadId, BTreeSet<u32>> = BTreeMap::new();
        let mut from = start;
        loop {
            let page = engine.scan(&from, Some(&end), 16)?;
            let full = page.len() >= 16;
            for (k, _) in page {
                let (load, seq) = parse_staging_key(&k).ok_or_else(|| EngineError::Corruption {
                    location: "state machine staging area".into(),
                    detail: format!("key {k:02x?} is not a staging key"),
                })?;
                loads.entry(load).or_default().insert(seq);
                from = k;
            }
            if !full {
                return Ok(StagedLoads { loads });
            }
            from.push(0);
        }
    }

    /// Loads staged now.
    #[cfg(test)]
    pub(crate) fn ids(&self) -> Vec<LoadId> {
        self.loads.keys().copied().collect()
    }

    /// Cancels every load of a term before `term`: pushes the deletion of their staging.
    pub(crate) fn cancel_before(&mut self, term: u64, ops: &mut Vec<WriteOp>) {
        while let Some((&load, _)) = self.loads.first_key_value() {
            if load.term >= term {
                return;
            }
            self.loads.remove(&load);
            tracing::info!(
                term = load.term,
                nonce = load.nonce,
                "bulk load cancelled by a leader change"
            );
            ops.push(delete_load(load));
        }
    }

    /// Applies a `BulkStage` of an entry of term `entry_term`.
    pub(crate) fn stage(
        &mut self,
        load: LoadId,
        seq: u32,
        chunk: Vec<u8>,
        entry_term: u64,
        ops: &mut Vec<WriteOp>,
    ) -> CommandResult {
        if load.term != entry_term {
            return CommandResult::BulkCancelled {
                reason: format!(
                    "load of term {} staged in an entry of term {entry_term}: the leader changed",
                    load.term
                ),
            };
        }
        self.loads.entry(load).or_default().insert(seq);
        ops.push(WriteOp::Put {
            key: staging_key(load, seq),
            value: chunk,
        });
        CommandResult::BulkStaged
    }

    /// Applies a `BulkAbort`.
    pub(crate) fn abort(&mut self, load: LoadId, ops: &mut Vec<WriteOp>) -> CommandResult {
        if self.loads.remove(&load).is_some() {
            ops.push(delete_load(load));
        }
        CommandResult::BulkCancelled {
            reason: "the load was cancelled".into(),
        }
    }

    /// Checks a `BulkCommit` of an entry of term `entry_term`: `Ok` when every chunk
    /// `0..chunks` is staged (the load is then forgotten here: the caller ingests it), else
    /// the refusal (the load's staging deletion pushed to `ops`).
    pub(crate) fn take_for_commit(
        &mut self,
        load: LoadId,
        chunks: u32,
        entry_term: u64,
        ops: &mut Vec<WriteOp>,
    ) -> Result<(), CommandResult> {
        let staged = self.loads.remove(&load);
        let refuse = |reason: String, ops: &mut Vec<WriteOp>| {
            ops.push(delete_load(load));
            Err(CommandResult::BulkCancelled { reason })
        };
        if load.term != entry_term {
            return refuse(
                format!(
                    "load of term {} committed in term {entry_term}: the leader changed",
                    load.term
                ),
                ops,
            );
        }
        let staged = staged.unwrap_or_default();
        let complete = staged.len() == chunks as usize && staged.iter().copied().eq(0..chunks);
        if !complete {
            return refuse(format!("{} of its {chunks} chunks are staged", staged.len()), ops);
        }
        Ok(())
    }
}

/// The deletion of every staged chunk of `load`.
pub(crate) fn delete_load(load: LoadId) -> WriteOp {
    let (start, end) = load_range(load);
    WriteOp::DeleteRange {
        start,
        end: Some(end),
    }
}

/// Ingests the staged chunks `0..chunks` of `load` into `engine` with `bulk_load`: the rows,
/// then the staging's deletion and `extra_ops`, with `meta`, in one atomic step. A duplicate
/// under [`OnDuplicate::Error`] is a result (nothing applied; the caller deletes the staging);
/// any other error is a storage fault.
pub(crate) fn ingest(
    engine: &dyn Engine,
    load: LoadId,
    chunks: u32,
    on_duplicate: OnDuplicate,
    sort_memory_bytes: u64,
    mut extra_ops: Vec<WriteOp>,
    meta: &[u8],
) -> Result<CommandResult, EngineError> {
    let mut rows = StagedRows {
        engine,
        load,
        chunks,
        next_seq: 0,
        current: Vec::new().into_iter(),
    };
    let opts = BulkLoadOptions {
        on_duplicate,
        sort_memory_bytes,
    };
    let mut ops = vec![delete_load(load)];
    ops.append(&mut extra_ops);
    match engine.bulk_load(&mut rows, &opts, &ops, Some(meta)) {
        Ok(report) => Ok(CommandResult::BulkLoaded {
            rows_read: report.rows_read,
            rows_written: report.rows_written,
            rows_replaced: report.rows_replaced,
            rows_skipped: report.rows_skipped,
        }),
        Err(EngineError::DuplicateKey {
            key,
            first_index,
            second_index,
        }) => Ok(CommandResult::BulkDuplicate {
            key,
            first_row: first_index,
            second_row: second_index,
        }),
        Err(e) => Err(e),
    }
}

/// The rows of a staged load, read chunk by chunk from the engine.
struct StagedRows<'a> {
    engine: &'a dyn Engine,
    load: LoadId,
    chunks: u32,
    next_seq: u32,
    current: std::vec::IntoIter<KeyValue>,
}

impl Iterator for StagedRows<'_> {
    type Item = Result<KeyValue, EngineError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(row) = self.current.next() {
                return Some(Ok(row));
            }
            if self.next_seq >= self.chunks {
                return None;
            }
            let seq = self.next_seq;
            self.next_seq += 1;
            let key = staging_key(self.load, seq);
            let what = format!("{seq} of load {}-{}", self.load.term, self.load.nonce);
            let chunk = match self.engine.get(&key) {
                Ok(Some(chunk)) => chunk,
                Ok(None) => {
                    return Some(Err(EngineError::Corruption {
                        location: "state machine staging area".into(),
                        detail: format!("chunk {what} is missing"),
                    }))
                }
                Err(e) => return Some(Err(e)),
            };
            match decode_chunk(&chunk, &what) {
                Ok(rows) => self.current = rows.into_iter(),
                Err(e) => {
                    return Some(Err(EngineError::Corruption {
                        location: "state machine staging area".into(),
                        detail: e.to_string(),
                    }))
                }
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn chunks_round_trip_and_refuse_damage() {
        let mut b = ChunkBuilder::default();
        let rows: Vec<KeyValue> = (0..1000u32)
            .map(|i| (i.to_be_bytes().to_vec(), format!("value {i}").into_bytes()))
            .collect();
        for (k, v) in &rows {
            b.push(k, v);
        }
        assert_eq!(b.rows(), 1000);
        let chunk = b.finish().unwrap();
        assert_eq!(b.rows(), 0);
        assert_eq!(decode_chunk(&chunk, "t").unwrap(), rows);
        for at in [0, 3, 10, CHUNK_HEADER_BYTES + 2, chunk.len() - 1] {
            let mut bad = chunk.clone();
            bad[at] ^= 0x40;
            assert!(decode_chunk(&bad, "t").is_err(), "damage at byte {at} passed");
        }
        assert!(decode_chunk(&chunk[..chunk.len() - 1], "t").is_err());
        assert!(decode_chunk(&[], "t").is_err());
    }

    #[test]
    fn staging_keys_sort_by_load_then_chunk_and_parse_back() {
        let a = LoadId { term: 2, nonce: 9 };
        let b = LoadId { term: 3, nonce: 1 };
        let keys = [
            staging_key(a, 0),
            staging_key(a, 1),
            staging_key(a, 256),
            staging_key(b, 0),
        ];
        assert!(keys.windows(2).all(|w| w[0] < w[1]));
        let (start, end) = staging_area();
        for k in &keys {
            assert!(k.as_slice() >= start.as_slice() && k.as_slice() < end.as_slice());
        }
        assert_eq!(parse_staging_key(&keys[2]), Some((a, 256)));
        assert_eq!(parse_staging_key(b"\xff\xffs12345678"), None);
        let (ls, le) = load_range(a);
        assert!(keys[..3]
            .iter()
            .all(|k| k.as_slice() >= ls.as_slice() && k.as_slice() < le.as_slice()));
        assert!(keys[3].as_slice() >= le.as_slice());
    }

    #[test]
    fn a_later_term_cancels_older_loads_and_refuses_their_chunks() {
        let mut staged = StagedLoads::default();
        let mut ops = Vec::new();
        let old = LoadId { term: 2, nonce: 1 };
        let new = LoadId { term: 3, nonce: 1 };
        assert_eq!(
            staged.stage(old, 0, vec![1], 2, &mut ops),
            CommandResult::BulkStaged
        );
        assert_eq!(
            staged.stage(new, 0, vec![1], 3, &mut ops),
            CommandResult::BulkStaged
        );
        staged.cancel_before(3, &mut ops);
        assert_eq!(staged.ids(), vec![new]);
        assert!(matches!(ops.last(), Some(WriteOp::DeleteRange { .. })));
        assert!(matches!(
            staged.stage(old, 1, vec![1], 3, &mut ops),
            CommandResult::BulkCancelled { .. }
        ));
        assert!(
            staged.take_for_commit(new, 2, 3, &mut ops).is_err(),
            "chunk 1 is missing"
        );
        assert!(staged.ids().is_empty());
    }
}
