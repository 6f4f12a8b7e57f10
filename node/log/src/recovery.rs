//! Opening a log directory: scan every segment, verify every record, rebuild the in-memory state,
//! and zero a torn tail of the last segment after its last valid record.
//!
//! Rules (see FORMAT.md, "Recovery"):
//! * Trailing segments with an invalid header and no valid record anywhere in them are torn
//!   creations (the crash hit between renaming the preallocated file and syncing its first
//!   write): removed.
//! * Every segment's length must equal the length in its header (`LogError::SegmentLength`).
//! * A segment's records end at the first invalid record. For every segment but the last, that
//!   end must equal `prev_segment_end` in the next segment's header and only zeros may follow;
//!   for the last one it must not be below its durable mark (`LogError::SyncedRecordsLost`).
//! * In the last segment, an invalid record with no valid record anywhere after it is a torn tail:
//!   the bytes from there to the last non-zero byte are zeroed (+ fdatasync), with a warning.
//! * With `SyncMode::Periodic` only, an invalid record in the last segment is cut there even if
//!   valid records follow (point-in-time recovery; see [`recover`]), still never below the mark.
//! * Anything else invalid (a bad record followed by valid ones, any bad byte in an earlier
//!   segment, a missing segment number, entry indexes that do not follow each other) is
//!   `LogError::Corruption` naming the segment and offset: never skipped silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use ftkv_vfs::{Vfs, VfsFile};

use crate::format::{
    check_segment_header, decode_mark, decode_meta_payload, decode_record, encode_mark, mark_slot_offset,
    parse_segment_name, DurableMark, RecordType, SlotState, RECORDS_START, RECORD_OVERHEAD_BYTES,
};
use crate::index::{EntryIndex, EntryLoc};
use crate::LogError;

/// The state rebuilt from disk.
#[derive(Debug, Default)]
pub(crate) struct Recovered {
    pub(crate) index: EntryIndex,
    pub(crate) metas: BTreeMap<String, Bytes>,
    pub(crate) purged_up_to: Option<u64>,
    pub(crate) segments: BTreeMap<u64, Arc<dyn VfsFile>>,
    /// The last segment, where appends continue.
    pub(crate) last: Option<LastSegment>,
    /// Highest segment number ever seen (including removed torn creations).
    pub(crate) max_seq_seen: u64,
}

/// The newest segment after recovery.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LastSegment {
    pub(crate) seq: u64,
    /// End of the last valid record, in bytes (appends continue here; zeros follow).
    pub(crate) valid_end: u64,
    /// Records in it.
    pub(crate) records: u64,
    /// Preallocated length, in bytes.
    pub(crate) size_bytes: u64,
    /// Its durable mark after recovery (covers `valid_end`, written by recovery if needed).
    pub(crate) mark: DurableMark,
}

fn io_err(context: String, source: std::io::Error) -> LogError {
    LogError::Io { context, source }
}

fn corruption(path: &Path, offset: u64, detail: String) -> LogError {
    LogError::Corruption {
        location: format!("segment {} at offset {offset}", path.display()),
        detail,
    }
}

fn read_whole(file: &dyn VfsFile, path: &Path) -> Result<Bytes, LogError> {
    let len = file
        .len()
        .map_err(|e| io_err(format!("stat {}", path.display()), e))?;
    let len = usize::try_from(len)
        .map_err(|_| corruption(path, 0, format!("segment length {len} does not fit in memory")))?;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, 0)
        .map_err(|e| io_err(format!("read {}", path.display()), e))?;
    Ok(Bytes::from(buf))
}

/// Offset of the first position at or after `from` where a valid record decodes, if any.
fn valid_record_at_or_after(buf: &Bytes, from: usize) -> Option<usize> {
    let last_start = buf.len().checked_sub(RECORD_OVERHEAD_BYTES)?;
    (from..=last_start).find(|&pos| {
        // Cheap filters first: type byte and length must be plausible.
        let type_ok = matches!(buf.get(pos + 4), Some(1..=4));
        type_ok && decode_record(&buf.slice(pos..)).is_ok()
    })
}

/// Scans and verifies `dir`, repairing only a torn tail / torn creation of the newest segment.
///
/// `point_in_time`: in the newest segment, also cut at an invalid record that valid records follow
/// (RocksDB's `kPointInTimeRecovery`). Used for `SyncMode::Periodic`, where several unsynced writes
/// can be pending and a power loss may persist a later one without an earlier one. With
/// `SyncMode::Always` at most one write is ever unsynced, so such a hole means damage to synced
/// data: `Corruption`.
pub(crate) fn recover(vfs: &dyn Vfs, dir: &Path, point_in_time: bool) -> Result<Recovered, LogError> {
    let mut found: Vec<(u64, PathBuf)> = vfs
        .list_dir(dir)
        .map_err(|e| io_err(format!("list {}", dir.display()), e))?
        .into_iter()
        .filter_map(|p| parse_segment_name(&p).map(|seq| (seq, p)))
        .collect();
    found.sort();
    let mut out = Recovered {
        max_seq_seen: found.last().map_or(0, |(s, _)| *s),
        ..Default::default()
    };

    // Pass 1: drop trailing torn creations (newest first; one segment in memory at a time).
    while let Some((seq, path)) = found.last() {
        let file = vfs
            .open(path, false)
            .map_err(|e| io_err(format!("open {}", path.display()), e))?;
        let buf = read_whole(&*file, path)?;
        if check_segment_header(&buf, *seq).is_ok() || valid_record_at_or_after(&buf, 0).is_some() {
            break;
        }
        tracing::warn!(
            segment = %path.display(),
            len_bytes = buf.len(),
            "log recovery: removing newest segment with a torn header and no valid record (crash during creation)"
        );
        vfs.remove_file(path)
            .map_err(|e| io_err(format!("remove {}", path.display()), e))?;
        vfs.sync_dir(dir)
            .map_err(|e| io_err(format!("sync dir {}", dir.display()), e))?;
        found.pop();
    }

    // Pass 2: verify and replay in order.
    let count = found.len();
    // The previous segment: (seq, path, end of its valid records).
    let mut prev: Option<(u64, PathBuf, u64)> = None;
    for (i, (seq, path)) in found.into_iter().enumerate() {
        let file = vfs
            .open(&path, false)
            .map_err(|e| io_err(format!("open {}", path.display()), e))?;
        let buf = read_whole(&*file, &path)?;
        let header = check_segment_header(&buf, seq).map_err(|d| corruption(&path, 0, d))?;
        if buf.len() as u64 != header.segment_size_bytes {
            return Err(LogError::SegmentLength {
                path,
                expected_bytes: header.segment_size_bytes,
                actual_bytes: buf.len() as u64,
            });
        }
        if let Some((p, prev_path, prev_end)) = &prev {
            if seq != p + 1 {
                return Err(corruption(
                    &path,
                    0,
                    format!("segment {} is missing (found {p} then {seq})", p + 1),
                ));
            }
            if *prev_end < header.prev_segment_end {
                return Err(LogError::SyncedRecordsLost {
                    path: prev_path.clone(),
                    valid_end: *prev_end,
                    durable_end: header.prev_segment_end,
                    evidence: format!("the end recorded in the header of {}", path.display()),
                });
            }
            if *prev_end > header.prev_segment_end {
                return Err(corruption(
                    prev_path,
                    header.prev_segment_end,
                    format!(
                        "valid records continue to offset {prev_end}, past the end {} recorded by the next \
                         segment {}",
                        header.prev_segment_end,
                        path.display()
                    ),
                ));
            }
        }
        let is_last = i + 1 == count;
        if !is_last {
            let (valid_end, _) = replay_segment(&mut out, seq, &path, &buf, false, point_in_time)?;
            prev = Some((seq, path, valid_end));
            out.segments.insert(seq, file);
            continue;
        }
        let mark = read_mark(&buf, seq, &path)?;
        let (valid_end, records) = replay_segment(&mut out, seq, &path, &buf, true, point_in_time)?;
        if valid_end < mark.durable_end {
            return Err(LogError::SyncedRecordsLost {
                path,
                valid_end,
                durable_end: mark.durable_end,
                evidence: format!("its durable mark, generation {}", mark.generation),
            });
        }
        let tail = buf.get(valid_end as usize..).unwrap_or_default();
        if let Some(last_nonzero) = tail.iter().rposition(|&b| b != 0) {
            let zeroed_bytes = zero_nonzero_blocks(&*file, &path, &buf, valid_end)?;
            tracing::warn!(
                segment = %path.display(),
                from_offset = valid_end,
                last_nonzero_offset = valid_end + last_nonzero as u64,
                zeroed_bytes,
                durable_mark = mark.durable_end,
                "log recovery: zeroing non-zero bytes after the last valid record of the newest segment \
                 (a torn unsynced write, never acknowledged in sync=always mode, or stray damage in the \
                 preallocated zeros; every record up to the durable mark is intact)"
            );
        }
        // Everything up to `valid_end` is now known durable: sync, then record it in the mark (the
        // mark itself is persisted by the next flush).
        file.sync_data()
            .map_err(|e| io_err(format!("sync {}", path.display()), e))?;
        let mark = if valid_end > mark.durable_end {
            let next = DurableMark {
                generation: mark.generation + 1,
                durable_end: valid_end,
            };
            file.write_all_at(&encode_mark(seq, next), mark_slot_offset(next.generation))
                .map_err(|e| io_err(format!("write durable mark of {}", path.display()), e))?;
            next
        } else {
            mark
        };
        out.last = Some(LastSegment {
            seq,
            valid_end,
            records,
            size_bytes: header.segment_size_bytes,
            mark,
        });
        out.segments.insert(seq, file);
    }
    Ok(out)
}

/// The newest valid durable mark of segment `seq` (generation 0 at `RECORDS_START` if none).
/// A damaged slot (torn mark write) is ignored with a warning: the other slot holds the previous
/// mark, which is only lower.
fn read_mark(buf: &Bytes, seq: u64, path: &Path) -> Result<DurableMark, LogError> {
    let mut best = DurableMark {
        generation: 0,
        durable_end: RECORDS_START,
    };
    for slot in 0..2u64 {
        let at = mark_slot_offset(slot) as usize;
        // decode_mark takes the slot's first MARK_SLOT_BYTES (a short one is Invalid).
        match decode_mark(buf.get(at..).unwrap_or_default(), seq) {
            SlotState::Empty => {}
            SlotState::Invalid => tracing::warn!(
                segment = %path.display(),
                offset = at,
                "log recovery: durable mark slot is damaged (torn mark write?); using the other slot"
            ),
            SlotState::Valid(m) if m.generation > best.generation => best = m,
            SlotState::Valid(_) => {}
        }
    }
    if best.durable_end < RECORDS_START || best.durable_end > buf.len() as u64 {
        return Err(corruption(
            path,
            mark_slot_offset(best.generation),
            format!(
                "durable mark offset {} outside the segment's record area {RECORDS_START}..{}",
                best.durable_end,
                buf.len()
            ),
        ));
    }
    Ok(best)
}

/// Block size in which recovery looks for (and overwrites) non-zero bytes after the records.
const ZERO_BLOCK_BYTES: usize = 4096;

/// Overwrites with zeros every 4 KiB-aligned block part of `buf[from..]` (the file's contents)
/// that holds a non-zero byte; returns how many bytes were written.
fn zero_nonzero_blocks(file: &dyn VfsFile, path: &Path, buf: &[u8], from: u64) -> Result<u64, LogError> {
    let zeros = [0u8; ZERO_BLOCK_BYTES];
    let mut written = 0u64;
    let mut start = from as usize;
    while start < buf.len() {
        let end = ((start / ZERO_BLOCK_BYTES + 1) * ZERO_BLOCK_BYTES).min(buf.len());
        let block = buf.get(start..end).unwrap_or_default();
        if block.iter().any(|&b| b != 0) {
            #[allow(clippy::indexing_slicing)]
            // end - start <= ZERO_BLOCK_BYTES: end is at most the next block boundary
            file.write_all_at(&zeros[..end - start], start as u64)
                .map_err(|e| io_err(format!("zero torn tail of {}", path.display()), e))?;
            written += (end - start) as u64;
        }
        start = end;
    }
    Ok(written)
}

/// Whether `buf[pos..]` is all zeros (preallocated space); false when `pos` is past the end.
fn only_zeros_from(buf: &[u8], pos: usize) -> bool {
    buf.get(pos..).is_some_and(|t| t.iter().all(|&b| b == 0))
}

/// Replays one segment's records into `out`; returns (end of the last valid record, record count).
fn replay_segment(
    out: &mut Recovered,
    seq: u64,
    path: &Path,
    buf: &Bytes,
    is_last: bool,
    point_in_time: bool,
) -> Result<(u64, u64), LogError> {
    let mut pos = RECORDS_START as usize;
    let mut records = 0u64;
    while pos < buf.len() {
        let (rec, used) = match decode_record(&buf.slice(pos..)) {
            Ok(ok) => ok,
            Err(e) => {
                if !is_last {
                    // A completed segment was fully synced before the next one was written: its
                    // records end where only zeros follow (the end is checked against the next
                    // segment's header by the caller).
                    if only_zeros_from(buf, pos) {
                        return Ok((pos as u64, records));
                    }
                    return Err(corruption(
                        path,
                        pos as u64,
                        format!("{e} (not the newest segment)"),
                    ));
                }
                // The common case, the clean end of the records: only preallocated zeros follow.
                if only_zeros_from(buf, pos) {
                    return Ok((pos as u64, records));
                }
                if let Some(next) = valid_record_at_or_after(buf, pos + 1) {
                    if point_in_time {
                        tracing::warn!(
                            segment = %path.display(),
                            offset = pos,
                            next_valid_offset = next,
                            error = %e,
                            "log recovery (periodic sync): invalid record followed by valid ones; \
                             cutting at the first invalid record (unsynced writes persisted out of order)"
                        );
                        return Ok((pos as u64, records));
                    }
                    return Err(corruption(
                        path,
                        pos as u64,
                        format!("{e}, but a valid record follows at offset {next}: not a torn tail"),
                    ));
                }
                return Ok((pos as u64, records));
            }
        };
        apply(out, seq, path, pos as u64, rec.kind, rec.index, &rec.payload)?;
        records += 1;
        pos += used;
    }
    Ok((pos as u64, records))
}

fn apply(
    out: &mut Recovered,
    seq: u64,
    path: &Path,
    offset: u64,
    kind: RecordType,
    index: u64,
    payload: &Bytes,
) -> Result<(), LogError> {
    match kind {
        RecordType::Entry => {
            if let Some(next) = out.index.next_index() {
                if index != next {
                    return Err(corruption(
                        path,
                        offset,
                        format!("log continuity: entry index {index} where {next} was expected"),
                    ));
                }
            }
            let payload_len = crate::limits::payload_len_u32(payload.len());
            out.index.push(
                index,
                EntryLoc {
                    seq,
                    offset,
                    payload_len,
                    payload: None,
                },
            );
        }
        RecordType::Meta => {
            let (key, value) = decode_meta_payload(payload)
                .ok_or_else(|| corruption(path, offset, "malformed meta record payload".to_string()))?;
            out.metas.insert(key, value);
        }
        RecordType::Truncate => out.index.truncate_from(index),
        RecordType::Purge => {
            out.index.purge_up_to(index);
            out.purged_up_to = Some(out.purged_up_to.map_or(index, |p| p.max(index)));
        }
    }
    Ok(())
}
