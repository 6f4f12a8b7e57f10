//! Opening a log directory: scan every segment, verify every record, rebuild the in-memory state,
//! and cut a torn tail of the last segment back to its last valid record.
//!
//! Rules (see FORMAT.md, "Recovery"):
//! * Trailing segments with an invalid header and no valid record anywhere in them are torn
//!   creations (the crash hit between creating the file and syncing its first write): removed.
//! * In the last segment, an invalid record with no valid record anywhere after it is a torn tail:
//!   the file is cut (`set_len` + fdatasync) to the end of the last valid record, with a warning.
//! * With `SyncMode::Periodic` only, an invalid record in the last segment is cut there even if
//!   valid records follow (point-in-time recovery; see [`recover`]).
//! * Anything else invalid (a bad record followed by valid ones, any bad byte in an earlier
//!   segment, a missing segment number, entry indexes that do not follow each other) is
//!   `LogError::Corruption` naming the segment and offset: never skipped silently.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use ftkv_vfs::{Vfs, VfsFile};

use crate::format::{
    check_segment_header, decode_meta_payload, decode_record, parse_segment_name, RecordType,
    RECORD_OVERHEAD_BYTES, SEGMENT_HEADER_BYTES,
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
    /// The last segment: (seq, valid length in bytes, records in it).
    pub(crate) last: Option<(u64, u64, u64)>,
    /// Highest segment number ever seen (including removed torn creations).
    pub(crate) max_seq_seen: u64,
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
        let type_ok = matches!(buf[pos + 4], 1..=4);
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
    let mut prev_seq: Option<u64> = None;
    for (i, (seq, path)) in found.into_iter().enumerate() {
        let file = vfs
            .open(&path, false)
            .map_err(|e| io_err(format!("open {}", path.display()), e))?;
        let buf = read_whole(&*file, &path)?;
        if let Some(p) = prev_seq {
            if seq != p + 1 {
                return Err(corruption(
                    &path,
                    0,
                    format!("segment {} is missing (found {p} then {seq})", p + 1),
                ));
            }
        }
        prev_seq = Some(seq);
        let is_last = i + 1 == count;
        check_segment_header(&buf, seq).map_err(|d| corruption(&path, 0, d))?;
        let (valid_end, records) = replay_segment(&mut out, seq, &path, &buf, is_last, point_in_time)?;
        if (valid_end as usize) < buf.len() {
            debug_assert!(is_last);
            tracing::warn!(
                segment = %path.display(),
                cut_from_offset = valid_end,
                cut_bytes = buf.len() as u64 - valid_end,
                "log recovery: cutting torn tail of the newest segment back to its last valid record"
            );
            file.set_len(valid_end)
                .map_err(|e| io_err(format!("cut tail of {}", path.display()), e))?;
            file.sync_data()
                .map_err(|e| io_err(format!("sync {}", path.display()), e))?;
        }
        if is_last {
            out.last = Some((seq, valid_end, records));
        }
        out.segments.insert(seq, file);
    }
    Ok(out)
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
    let mut pos = SEGMENT_HEADER_BYTES as usize;
    let mut records = 0u64;
    while pos < buf.len() {
        let (rec, used) = match decode_record(&buf.slice(pos..)) {
            Ok(ok) => ok,
            Err(e) => {
                if !is_last {
                    return Err(corruption(
                        path,
                        pos as u64,
                        format!("{e} (not the newest segment)"),
                    ));
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
            let payload_len = payload.len() as u32;
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
