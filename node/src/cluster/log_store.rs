//! openraft `RaftLogStorage` (storage-v2) over the group-committed `ftkv-log`.
//!
//! Mapping (REPLICATION.md, "Contracts"):
//! - entry `i` -> log record `i` = `[LOG_RECORD_VERSION] ++ postcard(Entry)`; the log adds length,
//!   index and crc32c per record.
//! - `append(entries, cb)` -> `Log::append` whose callback fires only after fdatasync and then calls
//!   `cb.log_io_completed` (MySQL semi-sync `AFTER_SYNC`: a follower acknowledges only durable
//!   entries).
//! - `save_vote` -> durable meta `raft.vote` (read back uncommitted after a restart, so a former
//!   leader restarts as a follower: see [`LogStore::new`]); `save_committed` -> kept in memory and written as
//!   meta `raft.committed` together with the next `append` (and at shutdown), so it rides that
//!   group flush instead of costing an fsync of its own (openraft issue 1511: a restarted node
//!   re-applies committed entries). A stale saved value only shortens the replay at restart; the
//!   rest is re-committed by the leader.
//! - `purge(id)` -> first waits until the state machine holds everything up to `id` durably
//!   (`state_machine::Durable`): openraft queues the purge of what a received snapshot covers
//!   before the state machine has installed it, and a crash in between must not leave a log
//!   purged past both its own last entry and the engine. Then durable meta `raft.last_purged`,
//!   then `Log::purge`; a crash between the two is finished at the next open, and until then
//!   nothing at or below the purge point is reported or read.
//! - `get_log_state` never reports a last log id below the purge point (openraft's contract).
//! - `truncate(id)` -> `Log::truncate` (durable before return).
//!
//! Every call that fsyncs runs on the blocking pool so the Raft core task never blocks a runtime
//! worker on disk I/O.

use std::fmt::Debug;
use std::ops::{Bound, RangeBounds};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use ftkv_log::Log;
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{ErrorSubject, OptionalSend, RaftLogReader};
use parking_lot::Mutex;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::crash_point;
use super::state_machine::Durable;
use super::types::{
    io_error, read_error, write_error, Entry, LogId, LogState, NodeId, StorageError, TypeConfig, Vote,
};

/// Format version byte in front of every Raft entry record and Raft meta value.
pub const LOG_RECORD_VERSION: u8 = 1;
/// Most bytes returned by one `limited_get_log_entries` call (one AppendEntries payload). Must
/// stay well under the peer message limit, and small enough that sending it plus the follower's
/// fsync fits in the AppendEntries timeout (openraft 0.9 uses the heartbeat interval).
pub const APPEND_ENTRIES_MAX_BYTES: usize = 2 * 1024 * 1024;
/// Chunk size for unlimited reads.
const READ_CHUNK_BYTES: usize = 16 * 1024 * 1024;

pub(super) const META_VOTE: &str = "raft.vote";
const META_COMMITTED: &str = "raft.committed";
const META_LAST_PURGED: &str = "raft.last_purged";

/// Encodes `value` as `[LOG_RECORD_VERSION] ++ postcard(value)`.
pub fn encode_versioned<T: Serialize>(value: &T) -> Result<Vec<u8>, postcard::Error> {
    let mut out = vec![LOG_RECORD_VERSION];
    out.extend_from_slice(&postcard::to_stdvec(value)?);
    Ok(out)
}

/// Decodes what [`encode_versioned`] wrote; errors name the bad version.
pub fn decode_versioned<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&LOG_RECORD_VERSION, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        Some((v, _)) => Err(format!(
            "unsupported record version {v} (this build reads {LOG_RECORD_VERSION})"
        )),
        None => Err("empty record".to_string()),
    }
}

struct Shared {
    log: Log,
    /// Last log id present (or the purge point when the log is empty).
    last_log_id: Mutex<Option<LogId>>,
    last_purged: Mutex<Option<LogId>>,
    /// Latest committed index saved (for status).
    committed_index: AtomicU64,
    /// Latest committed log id not yet written to the log (written with the next append).
    pending_committed: Mutex<Option<Option<LogId>>>,
    /// Byte cap of one `limited_get_log_entries` answer.
    append_entries_max_bytes: usize,
    /// TEST ONLY canary: complete appends before fsync (breaks durability on purpose).
    unsafe_ack_before_fsync: bool,
    /// The vote found at open, as reported to openraft until the next `save_vote`: a committed
    /// vote is reported uncommitted (see [`LogStore::new`]).
    vote_at_open: Mutex<Option<Vote>>,
    /// How far the state machine's durable state reaches: purges wait for it.
    durable: tokio::sync::watch::Receiver<Durable>,
}

/// The Raft log store. Cheap to clone; clones share the log (also used as the log reader).
#[derive(Clone)]
pub struct LogStore {
    shared: Arc<Shared>,
}

impl LogStore {
    /// Wraps an opened log, recovering the last log id and the purge point from it.
    /// `append_entries_max_bytes` caps one AppendEntries payload (at least one entry is sent).
    /// `unsafe_ack_before_fsync` (TEST ONLY canary for the Jepsen harness) reports appends
    /// durable before they are, which must make the harness find lost acknowledged writes.
    /// `durable` is the state machine's [`Durable`] watch; purges wait for it.
    pub fn new(
        log: Log,
        append_entries_max_bytes: usize,
        unsafe_ack_before_fsync: bool,
        durable: tokio::sync::watch::Receiver<Durable>,
    ) -> Result<Self, StorageError> {
        let last_purged: Option<LogId> = match log.get_meta(META_LAST_PURGED) {
            Some(b) => decode_versioned(&b).map_err(|e| read_error(ErrorSubject::Logs, e))?,
            None => None,
        };
        if let Some(p) = last_purged {
            // A crash after `raft.last_purged` was saved but before `Log::purge` was durable:
            // finish the purge, so the log holds nothing at or below the purge point.
            if log.first_index().is_some_and(|first| first <= p.index) {
                log.purge(p.index)
                    .map_err(|e| write_error(ErrorSubject::Logs, e))?;
            }
        }
        let committed: Option<LogId> = match log.get_meta(META_COMMITTED) {
            Some(b) => decode_versioned(&b).map_err(|e| read_error(ErrorSubject::Logs, e))?,
            None => None,
        };
        // openraft 0.9 restarts a node whose saved vote is its own committed leadership straight
        // into the Leader state in the same term. A leader may have acknowledged entries that a
        // majority of followers fsynced but it had not yet written itself (Raft counts any
        // majority); after a kill -9 it comes back without them, serves ReadIndex reads from
        // that shorter log (stale reads: Jepsen scenario 10 found one) and proposes new entries
        // under log ids the followers already hold for other entries. Reporting the saved vote
        // uncommitted keeps the term and whom this node voted for (no double vote) but makes it
        // start as a follower: leadership comes back only through a new election in a higher
        // term, which a node missing committed entries cannot win.
        let vote_at_open: Option<Vote> = match log.get_meta(META_VOTE) {
            Some(b) => {
                let mut vote: Vote = decode_versioned(&b).map_err(|e| read_error(ErrorSubject::Vote, e))?;
                vote.committed = false;
                Some(vote)
            }
            None => None,
        };
        let store = LogStore {
            shared: Arc::new(Shared {
                vote_at_open: Mutex::new(vote_at_open),
                log,
                last_log_id: Mutex::new(None),
                last_purged: Mutex::new(last_purged),
                committed_index: AtomicU64::new(committed.map_or(0, |c| c.index)),
                pending_committed: Mutex::new(None),
                append_entries_max_bytes,
                unsafe_ack_before_fsync,
                durable,
            }),
        };
        let last = store.read_last_log_id()?;
        *store.shared.last_log_id.lock() = last;
        Ok(store)
    }

    /// Last log id held, or the purge point when the log holds nothing above it.
    pub fn last_log_id(&self) -> Option<LogId> {
        (*self.shared.last_log_id.lock()).max(*self.shared.last_purged.lock())
    }

    /// The last purged log id (the log holds nothing at or below it).
    pub fn last_purged_log_id(&self) -> Option<LogId> {
        *self.shared.last_purged.lock()
    }

    /// The underlying log (for `sync` at shutdown and counters).
    pub fn log(&self) -> &Log {
        &self.shared.log
    }

    /// Latest commit index this node has saved (0 when none).
    pub fn committed_index(&self) -> u64 {
        self.shared.committed_index.load(Ordering::Relaxed)
    }

    /// Queues the latest committed log id saved by openraft for the next group flush.
    pub fn write_pending_committed(&self) -> Result<(), StorageError> {
        let Some(mut committed) = self.shared.pending_committed.lock().take() else {
            return Ok(());
        };
        // What the log says is committed, it holds (or the engine does, up to the purge point):
        // a commit index learnt with a snapshot not yet installed is not written ahead of it.
        let last = *self.shared.last_log_id.lock();
        if committed.is_some_and(|c| last.is_none_or(|l| c.index > l.index)) {
            committed = last;
        }
        let bytes = encode_versioned(&committed).map_err(|e| write_error(ErrorSubject::Store, e))?;
        self.shared
            .log
            .put_meta(META_COMMITTED, Bytes::from(bytes), false)
            .map_err(|e| write_error(ErrorSubject::Store, e))
    }

    fn read_entry(&self, index: u64) -> Result<Option<Entry>, StorageError> {
        let records = self
            .shared
            .log
            .read_range(index, index + 1, usize::MAX)
            .map_err(|e| read_error(ErrorSubject::Log(log_id_at(index)), e))?;
        match records.into_iter().next() {
            Some((i, bytes)) if i == index => Ok(Some(decode_entry(i, &bytes)?)),
            _ => Ok(None),
        }
    }

    fn read_last_log_id(&self) -> Result<Option<LogId>, StorageError> {
        match self.shared.log.last_index() {
            Some(i) => match self.read_entry(i)? {
                Some(e) => Ok(Some(e.log_id)),
                None => Err(read_error(
                    ErrorSubject::Logs,
                    format!("last log record {i} is missing"),
                )),
            },
            None => Ok(*self.shared.last_purged.lock()),
        }
    }

    /// Waits until the state machine holds everything up to `index` durably.
    async fn wait_durable(&self, index: u64) -> Result<(), StorageError> {
        let mut durable = self.shared.durable.clone();
        let waited = durable
            .wait_for(|d| d.index >= index || d.failed.is_some())
            .await
            .map(|d| d.failed.clone());
        match waited {
            Ok(None) => Ok(()),
            Ok(Some(failed)) => Err(write_error(
                ErrorSubject::Logs,
                format!("not purging the log to {index}: the snapshot install failed ({failed})"),
            )),
            Err(_) => Err(write_error(
                ErrorSubject::Logs,
                format!("not purging the log to {index}: the state machine is gone"),
            )),
        }
    }

    async fn blocking<T, F>(&self, subject: ErrorSubject<NodeId>, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Log) -> Result<T, ftkv_log::LogError> + Send + 'static,
    {
        let log = self.shared.log.clone();
        match tokio::task::spawn_blocking(move || f(&log)).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(write_error(subject, e)),
            Err(e) => Err(write_error(subject, format!("blocking task failed: {e}"))),
        }
    }
}

fn log_id_at(index: u64) -> LogId {
    openraft::LogId::new(openraft::CommittedLeaderId::new(0, 0), index)
}

fn decode_entry(index: u64, bytes: &[u8]) -> Result<Entry, StorageError> {
    let entry: Entry =
        decode_versioned(bytes).map_err(|e| read_error(ErrorSubject::Log(log_id_at(index)), e))?;
    if entry.log_id.index != index {
        return Err(read_error(
            ErrorSubject::Log(entry.log_id),
            format!("record {index} holds entry {}", entry.log_id.index),
        ));
    }
    Ok(entry)
}

/// `[start, end)` of a range bound, `end = None` for unbounded.
fn range_to_half_open<RB: RangeBounds<u64>>(range: &RB) -> (u64, Option<u64>) {
    let start = match range.start_bound() {
        Bound::Included(s) => *s,
        Bound::Excluded(s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(e) => Some(e.saturating_add(1)),
        Bound::Excluded(e) => Some(*e),
        Bound::Unbounded => None,
    };
    (start, end)
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let log = &self.shared.log;
        let (Some(first), Some(last)) = (log.first_index(), log.last_index()) else {
            return Ok(Vec::new());
        };
        let (start, end) = range_to_half_open(&range);
        let start = start.max(first);
        let end = end.map_or(last + 1, |e| e.min(last + 1));
        let mut out = Vec::new();
        let mut next = start;
        while next < end {
            let records = log
                .read_range(next, end, READ_CHUNK_BYTES)
                .map_err(|e| read_error(ErrorSubject::Logs, e))?;
            let Some(&(last_read, _)) = records.last() else {
                break;
            };
            for (i, bytes) in records {
                out.push(decode_entry(i, &bytes)?);
            }
            next = last_read + 1;
        }
        Ok(out)
    }

    async fn limited_get_log_entries(&mut self, start: u64, end: u64) -> Result<Vec<Entry>, StorageError> {
        let records = self
            .shared
            .log
            .read_range(start, end, self.shared.append_entries_max_bytes)
            .map_err(|e| read_error(ErrorSubject::Logs, e))?;
        records.into_iter().map(|(i, b)| decode_entry(i, &b)).collect()
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState, StorageError> {
        let last_purged_log_id = *self.shared.last_purged.lock();
        let last_log_id = (*self.shared.last_log_id.lock()).max(last_purged_log_id);
        Ok(LogState {
            last_purged_log_id,
            last_log_id,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        *self.shared.vote_at_open.lock() = None;
        let bytes = encode_versioned(vote).map_err(|e| write_error(ErrorSubject::Vote, e))?;
        self.blocking(ErrorSubject::Vote, move |log| {
            log.put_meta(META_VOTE, Bytes::from(bytes), true)
        })
        .await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        if let Some(vote) = *self.shared.vote_at_open.lock() {
            return Ok(Some(vote));
        }
        match self.shared.log.get_meta(META_VOTE) {
            Some(b) => Ok(Some(
                decode_versioned(&b).map_err(|e| read_error(ErrorSubject::Vote, e))?,
            )),
            None => Ok(None),
        }
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        *self.shared.pending_committed.lock() = Some(committed);
        if let Some(c) = committed {
            self.shared.committed_index.fetch_max(c.index, Ordering::Relaxed);
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        if let Some(pending) = *self.shared.pending_committed.lock() {
            return Ok(pending);
        }
        match self.shared.log.get_meta(META_COMMITTED) {
            Some(b) => decode_versioned(&b).map_err(|e| read_error(ErrorSubject::Store, e)),
            None => Ok(None),
        }
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<TypeConfig>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        // Entries at or below the purge point are already covered by the state machine (openraft
        // purges only applied entries) and the log refuses them; skip them. The callback still
        // goes through the log so completions stay in order with earlier appends.
        let purged_index = (*self.shared.last_purged.lock()).map(|p| p.index);
        let mut records = Vec::new();
        let mut last = None;
        for entry in entries {
            if purged_index.is_some_and(|p| entry.log_id.index <= p) {
                continue;
            }
            let bytes =
                encode_versioned(&entry).map_err(|e| write_error(ErrorSubject::Log(entry.log_id), e))?;
            records.push((entry.log_id.index, Bytes::from(bytes)));
            last = Some(entry.log_id);
        }
        // Readable once `append` returns; `last_log_id` follows the in-memory state.
        let done: ftkv_log::AppendCallback = if self.shared.unsafe_ack_before_fsync {
            callback.log_io_completed(Ok(()));
            Box::new(|res| {
                if let Err(e) = res {
                    tracing::error!(error = %e, "log flush failed after early acknowledgement (unsafe canary)");
                }
            })
        } else {
            let started = std::time::Instant::now();
            Box::new(move |res| {
                metrics::histogram!("ftkv_log_append_flush_seconds").record(started.elapsed());
                callback.log_io_completed(res.map_err(io_error))
            })
        };
        self.shared
            .log
            .append(records, done)
            .map_err(|e| write_error(ErrorSubject::Logs, e))?;
        self.write_pending_committed()?;
        if let Some(last) = last {
            *self.shared.last_log_id.lock() = Some(last);
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let from = log_id.index;
        self.blocking(ErrorSubject::Logs, move |log| log.truncate(from))
            .await?;
        let last = self.read_last_log_id()?;
        *self.shared.last_log_id.lock() = last;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let bytes = encode_versioned(&Some(log_id)).map_err(|e| write_error(ErrorSubject::Logs, e))?;
        let up_to = log_id.index;
        self.wait_durable(up_to).await?;
        self.blocking(ErrorSubject::Logs, move |log| {
            log.put_meta(META_LAST_PURGED, Bytes::from(bytes), true)?;
            crash_point::hit("purge:meta-saved");
            log.purge(up_to)
        })
        .await?;
        crash_point::hit("purge:done");
        *self.shared.last_purged.lock() = Some(log_id);
        let mut last = self.shared.last_log_id.lock();
        if last.is_none_or(|l| l.index <= log_id.index) {
            *last = Some(log_id);
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use openraft::storage::RaftLogStorage;

    fn open(dir: &std::path::Path) -> LogStore {
        let opts = ftkv_log::LogOptions {
            segment_size_bytes: 1 << 20,
            sync: ftkv_log::SyncMode::Always,
        };
        let log = ftkv_log::Log::open(Arc::new(ftkv_vfs::RealVfs), dir, opts).unwrap();
        let (_, durable) = tokio::sync::watch::channel(Durable {
            index: u64::MAX,
            failed: None,
        });
        LogStore::new(log, 1 << 20, false, durable).unwrap()
    }

    #[tokio::test]
    async fn a_restarted_leader_reads_its_vote_uncommitted_until_it_votes_again() {
        let dir = tempfile::tempdir().unwrap();
        let leader_vote = Vote::new_committed(7, 1);
        {
            let mut store = open(dir.path());
            store.save_vote(&leader_vote).await.unwrap();
            // Within one run the vote reads back as saved.
            assert_eq!(store.read_vote().await.unwrap(), Some(leader_vote));
        }
        let mut store = open(dir.path());
        // After a restart: same term and candidate, not committed (starts as a follower).
        assert_eq!(store.read_vote().await.unwrap(), Some(Vote::new(7, 1)));
        let next = Vote::new(8, 2);
        store.save_vote(&next).await.unwrap();
        assert_eq!(store.read_vote().await.unwrap(), Some(next));
    }
}
