//! ftkv's group-committed, append-only log of opaque records: the Raft log store's storage
//! (PerconaFT `ft/logger/` group commit, MySQL binlog group commit).
//!
//! Never depends on Raft or the engine: records are `(index, bytes)` plus small named values
//! ("metas", e.g. the Raft vote).
//!
//! # How it works
//! * **Segments**: files `<dir>/<seq as 20 digits>.seg`, each **preallocated** at its full size
//!   (`segment_size_bytes`, zero-filled and fsynced before it becomes active, prepared ahead by a
//!   background thread), starting with a 64-byte checksummed header (which records that size), two
//!   durable-mark slots, then records `len u32 | type u8 | index u64 | payload | crc32c u32` up to
//!   the first invalid record (zeros = end). Format byte by byte in `node/log/FORMAT.md`. The log
//!   rolls to a new segment when the next record does not fit in the active one.
//! * **Durable marks**: after a synced flush the flusher writes "records up to offset E are
//!   fsynced" into a header slot (no extra fsync; persisted by the next flush's fdatasync). On open,
//!   valid records ending before the mark, or a segment whose length differs from its header, is
//!   loss of synced data: the open is refused ([`LogError::SyncedRecordsLost`],
//!   [`LogError::SegmentLength`]) instead of silently cutting acknowledged records.
//! * **Group commit**: [`Log::append`] encodes the records into an in-memory write queue, indexes them
//!   (readable at once) and queues the callback, without any I/O. One flusher thread takes
//!   everything queued, writes it (one write per segment), fdatasyncs **once**, and only then fires
//!   all the callbacks it took. Under concurrency many appends share one fsync.
//! * **Durable operations**: [`Log::truncate`], [`Log::purge`], [`Log::put_meta`] with
//!   `durable = true` and [`Log::sync`] queue their marker and wait for the flush that syncs it.
//! * **Metas survive purge**: each new segment starts with a snapshot of every live meta and the
//!   purge point, so segments below the purge point can be deleted without losing them.
//! * **Purge** deletes whole segments only after the purge marker is durable, oldest first, with a
//!   directory sync after each.
//! * **Recovery** ([`Log::open`]): every record is verified; a torn tail of the newest segment after
//!   its durable mark is zeroed (only records whose callback never fired can be lost, see
//!   FORMAT.md "What is and is not detected"); any other damage is [`LogError::Corruption`],
//!   [`LogError::SegmentLength`] or [`LogError::SyncedRecordsLost`] naming the segment (with
//!   [`SyncMode::Periodic`], recovery is point-in-time: the newest segment is cut at its first
//!   invalid record even if valid ones follow, since unsynced writes may persist out of order).
//! * **Poisoning** (fjall `poison.rs`): a failed write or fsync fails every pending callback and every
//!   later call returns [`LogError::Poisoned`]; the process must reopen the log.
//! * **A full disk** (`ENOSPC`/`EDQUOT`) can only hit the creation of a new segment (record
//!   writes go into preallocated, zero-filled segments and never allocate): it does not poison
//!   the log. The flusher keeps what it wrote, holds the records queued for the new segment
//!   (their callbacks wait: nothing is acknowledged), gives back the half-made file and retries
//!   until space is freed ([`Log::space_error`] says so meanwhile); then appends go on.
//! * **Memory**: the index holds a small location per live entry; payloads stay cached only while
//!   not yet written or within a byte budget ([`limits::DEFAULT_CACHE_SIZE_BYTES`]); older
//!   entries are read back with a positional read and checksum verification.
//!
//! # Durability
//! With [`SyncMode::Always`] (default) a callback fires only after the records are fdatasynced.
//! With [`SyncMode::Periodic`] callbacks fire after the write reaches the OS and an fdatasync
//! happens every `period_ms`: a power loss (not a process crash) can lose up to `period_ms` of
//! acknowledged appends (like `tokudb_fsync_log_period` or `sync_binlog=0`). Truncate, purge,
//! durable metas and `sync()` stay durable before they return in both modes.

#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::host_endian_bytes,
    clippy::big_endian_bytes
)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]
mod flusher;
mod format;
mod index;
pub mod limits;
mod recovery;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, ThreadId};

use bytes::Bytes;
use ftkv_vfs::{Vfs, VfsFile};
use parking_lot::{Condvar, Mutex};

use crate::format::{
    encode_meta_payload, encode_record, encode_segment_header, segment_path, RecordType, SegmentHeader,
    RECORDS_START, RECORD_OVERHEAD_BYTES,
};
use crate::index::{EntryIndex, EntryLoc};
use crate::limits::{
    DEFAULT_CACHE_SIZE_BYTES, DEFAULT_SEGMENT_SIZE_BYTES, MAX_META_KEY_BYTES, MAX_RECORD_PAYLOAD_BYTES,
    MIN_SEGMENT_SIZE_BYTES, MIN_SYNC_PERIOD_MS,
};

/// When appended records become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// fdatasync before any append callback fires (default; group-committed).
    #[default]
    Always,
    /// Callbacks fire after the write; fdatasync every `period_ms` (weaker durability,
    /// like `tokudb_fsync_log_period` / `sync_binlog=0`): a power loss can lose up to
    /// `period_ms` of acknowledged appends. Truncate, purge and durable metas are still synced.
    Periodic {
        /// Sync period in milliseconds (>= 1).
        period_ms: u64,
    },
}

/// Log options.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// Size of each preallocated segment file, in bytes; the log rolls to a new one when the next
    /// record does not fit (>= [`limits::MIN_SEGMENT_SIZE_BYTES`]; default 64 MiB, like RocksDB's
    /// WAL file size). Opening a new log writes this many zero bytes; existing segments keep the
    /// size in their header.
    pub segment_size_bytes: u64,
    /// Sync mode.
    pub sync: SyncMode,
}

impl Default for LogOptions {
    fn default() -> Self {
        LogOptions {
            segment_size_bytes: DEFAULT_SEGMENT_SIZE_BYTES,
            sync: SyncMode::Always,
        }
    }
}

/// Errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// I/O failure; after a failed write/fsync the log is poisoned.
    #[error("log I/O error during {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Poisoned by an earlier failure.
    #[error("log is poisoned by an earlier I/O failure")]
    Poisoned,
    /// A record in the middle (not the tail) failed its checksum.
    #[error("log corruption in {location}: {detail}")]
    Corruption {
        /// Segment and offset.
        location: String,
        /// What did not match.
        detail: String,
    },
    /// API misuse (non-contiguous append, ...).
    #[error("invalid log operation: {0}")]
    Invalid(String),
    /// A segment file's length differs from the length recorded in its header: it was truncated
    /// or extended outside ftkv (segments are preallocated and never change size). Refused at open.
    #[error(
        "log segment {path} is {actual_bytes} bytes but its header says {expected_bytes}: the file was \
         truncated or extended outside ftkv; refusing to open (acknowledged records may be lost)"
    )]
    SegmentLength {
        /// The segment file.
        path: PathBuf,
        /// Length recorded in the header, in bytes.
        expected_bytes: u64,
        /// Length of the file, in bytes.
        actual_bytes: u64,
    },
    /// The valid records of a segment end before an offset that the log had proved fsynced (the
    /// segment's durable mark, or the end recorded by the next segment's header): synced
    /// records were damaged or removed. Refused at open.
    #[error(
        "log segment {path}: valid records end at offset {valid_end} but records up to offset \
         {durable_end} were fsynced ({evidence}): synced log records are lost or damaged; refusing to open"
    )]
    SyncedRecordsLost {
        /// The segment file.
        path: PathBuf,
        /// End of the last valid record, in bytes from the start of the file.
        valid_end: u64,
        /// Offset the log had proved durable, in bytes from the start of the file.
        durable_end: u64,
        /// Where `durable_end` comes from.
        evidence: String,
    },
}

/// Callback fired once the appended records are durable (or failed). It runs on the flusher
/// thread: it must not block on the log (no `sync`/`truncate`/`purge`/durable `put_meta` inside).
pub type AppendCallback = Box<dyn FnOnce(Result<(), LogError>) + Send + 'static>;

/// Log counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogStats {
    /// Records appended.
    pub records_appended: u64,
    /// fdatasync calls.
    pub fsyncs: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// `append` calls (each queues one callback); `append_calls / fsyncs` is the group-commit factor.
    pub append_calls: u64,
    /// Flush rounds of the flusher thread (one write batch each).
    pub flushes: u64,
    /// Directory syncs (segment creation and deletion).
    pub dir_syncs: u64,
    /// Segment files currently part of the log.
    pub segments: u64,
    /// Payload bytes cached in memory.
    pub cached_bytes: u64,
}

/// One queued write: bytes to put at `offset` of segment `seq` (created first, preallocated at
/// `size_bytes`, if `create`).
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) seq: u64,
    pub(crate) create: bool,
    pub(crate) size_bytes: u64,
    pub(crate) offset: u64,
    pub(crate) data: Vec<u8>,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) records_appended: AtomicU64,
    pub(crate) append_calls: AtomicU64,
    pub(crate) fsyncs: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) flushes: AtomicU64,
    pub(crate) dir_syncs: AtomicU64,
}

/// Everything behind the state lock.
pub(crate) struct State {
    pub(crate) index: EntryIndex,
    pub(crate) metas: BTreeMap<String, Bytes>,
    pub(crate) purged_up_to: Option<u64>,
    /// Segment seq -> file (None until the flusher creates it).
    pub(crate) segments: BTreeMap<u64, Option<Arc<dyn VfsFile>>>,
    pub(crate) active_seq: u64,
    /// Logical end of the active segment, queued bytes included.
    pub(crate) active_end: u64,
    /// Preallocated length of the active segment, in bytes (records must end at or before it).
    pub(crate) active_size_bytes: u64,
    /// Records in the active segment after its snapshot.
    pub(crate) active_records: u64,
    /// Write queue, in log order.
    pub(crate) queue: Vec<Chunk>,
    pub(crate) callbacks: Vec<AppendCallback>,
    pub(crate) sync_requested: bool,
    /// Bumped by every queued operation.
    pub(crate) queued_ticket: u64,
    /// Every operation with ticket <= this is durable.
    pub(crate) durable_ticket: u64,
    /// (seq, end offset) the flusher has written up to.
    pub(crate) written: (u64, u64),
    pub(crate) poison: Option<String>,
    pub(crate) shutdown: bool,
    pub(crate) cache_limit_bytes: u64,
    /// The active segment's durable mark at open (generation, durable end), for the flusher.
    pub(crate) open_mark: format::DurableMark,
}

/// The next segment file, preallocated ahead of the roll by the preparer thread.
#[derive(Default)]
pub(crate) struct Prepared {
    /// A zero-filled, fsynced file at `flusher::PREPARED_NAME` and its size in bytes.
    pub(crate) file: Option<(Arc<dyn VfsFile>, u64)>,
    /// The flusher asked for a file.
    pub(crate) wanted: bool,
    /// The preparer is writing one now (the flusher waits instead of racing it).
    pub(crate) busy: bool,
    pub(crate) shutdown: bool,
}

pub(crate) struct Shared {
    pub(crate) vfs: Arc<dyn Vfs>,
    pub(crate) dir: PathBuf,
    pub(crate) opts: LogOptions,
    pub(crate) state: Mutex<State>,
    /// The flusher waits on this for work.
    pub(crate) work_cv: Condvar,
    /// Durable-operation waiters wait on this.
    pub(crate) done_cv: Condvar,
    /// Serializes segment deletion (oldest first, one directory sync each).
    pub(crate) purge_lock: Mutex<()>,
    /// The next segment file, prepared off the flusher's path.
    pub(crate) prep: Mutex<Prepared>,
    /// Preparer and flusher wait on this for `prep` changes.
    pub(crate) prep_cv: Condvar,
    pub(crate) counters: Counters,
    /// Set while the flusher waits for disk space to create a segment (the `ENOSPC` it got).
    pub(crate) space_error: Mutex<Option<String>>,
}

struct Handle {
    shared: Arc<Shared>,
    flusher: Mutex<Option<JoinHandle<()>>>,
    flusher_id: ThreadId,
    preparer: Mutex<Option<JoinHandle<()>>>,
}

impl Drop for Handle {
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.work_cv.notify_all();
        // The last handle may be dropped by a callback running on the flusher itself: the
        // flusher cannot join itself (it stops after this callback), but the preparer is joined
        // so that it cannot still be filling `next-segment.tmp` when the directory is reopened.
        if std::thread::current().id() == self.flusher_id {
            self.shared.prep.lock().shutdown = true;
            self.shared.prep_cv.notify_all();
            if let Some(j) = self.preparer.lock().take() {
                if j.join().is_err() {
                    tracing::error!("log segment preparer thread panicked");
                }
            }
            return;
        }
        if let Some(j) = self.flusher.lock().take() {
            if j.join().is_err() {
                tracing::error!("log flusher thread panicked");
            }
        }
        // After the flusher: its final flush may still take a prepared file.
        self.shared.prep.lock().shutdown = true;
        self.shared.prep_cv.notify_all();
        if let Some(j) = self.preparer.lock().take() {
            if j.join().is_err() {
                tracing::error!("log segment preparer thread panicked");
            }
        }
    }
}

/// The log. Cheap to clone; thread safe. Dropping the last clone flushes and syncs what is
/// queued, fires the remaining callbacks and stops the flusher thread. Open at most one `Log`
/// per directory at a time (there is no lock file).
#[derive(Clone)]
pub struct Log {
    handle: Arc<Handle>,
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("dir", &self.handle.shared.dir)
            .finish_non_exhaustive()
    }
}

fn io_err(context: impl Into<String>, source: std::io::Error) -> LogError {
    LogError::Io {
        context: context.into(),
        source,
    }
}

impl State {
    /// Encodes one record at the end of the active segment (rolling first if it is full);
    /// returns (segment, offset) of the record.
    fn push_record(
        &mut self,
        segment_size_bytes: u64,
        kind: RecordType,
        index: u64,
        payload: &[u8],
    ) -> (u64, u64) {
        let record_bytes = (RECORD_OVERHEAD_BYTES + payload.len()) as u64;
        if self.active_end + record_bytes > self.active_size_bytes {
            self.roll(segment_size_bytes, record_bytes);
        }
        let (seq, offset) = (self.active_seq, self.active_end);
        let needs_chunk = !matches!(self.queue.last(), Some(c) if c.seq == seq);
        if needs_chunk {
            self.queue.push(Chunk {
                seq,
                create: false,
                size_bytes: self.active_size_bytes,
                offset,
                data: Vec::new(),
            });
        }
        let used = match self.queue.last_mut() {
            Some(chunk) => {
                debug_assert_eq!(
                    chunk.offset + chunk.data.len() as u64,
                    offset,
                    "queue not contiguous"
                );
                encode_record(kind, index, payload, &mut chunk.data)
            }
            None => 0, // unreachable: a chunk was pushed above
        };
        self.active_end += used as u64;
        self.active_records += 1;
        (seq, offset)
    }

    /// Starts a new segment: header, empty mark slots, then a snapshot of every meta and the purge
    /// point. The segment is `segment_size_bytes` long, or larger (rounded up to 4 KiB) when the
    /// snapshot plus the next record of `record_bytes` would not fit.
    fn roll(&mut self, segment_size_bytes: u64, record_bytes: u64) {
        let seq = self.active_seq + 1;
        let mut snapshot = Vec::new();
        for (key, value) in &self.metas {
            encode_record(
                RecordType::Meta,
                0,
                &encode_meta_payload(key, value),
                &mut snapshot,
            );
        }
        if let Some(p) = self.purged_up_to {
            encode_record(RecordType::Purge, p, &[], &mut snapshot);
        }
        let needed = RECORDS_START + snapshot.len() as u64 + record_bytes;
        let size_bytes = if needed <= segment_size_bytes {
            segment_size_bytes
        } else {
            needed.div_ceil(4096) * 4096
        };
        let mut data = Vec::with_capacity(RECORDS_START as usize + snapshot.len());
        encode_segment_header(
            &SegmentHeader {
                seq,
                segment_size_bytes: size_bytes,
                prev_segment_end: self.active_end,
            },
            &mut data,
        );
        data.resize(RECORDS_START as usize, 0); // empty mark slots
        data.extend_from_slice(&snapshot);
        self.active_seq = seq;
        self.active_end = data.len() as u64;
        self.active_size_bytes = size_bytes;
        self.active_records = 0;
        self.segments.insert(seq, None);
        self.queue.push(Chunk {
            seq,
            create: true,
            size_bytes,
            offset: 0,
            data,
        });
    }

    fn check_poison(&self) -> Result<(), LogError> {
        match self.poison {
            Some(_) => Err(LogError::Poisoned),
            None => Ok(()),
        }
    }

    /// Queues an operation; returns its ticket.
    fn enqueue(&mut self) -> u64 {
        self.queued_ticket += 1;
        self.queued_ticket
    }
}

impl Log {
    /// Opens or creates the log in `dir`, zeroing a torn tail after the last valid record of the
    /// newest segment (never below its durable mark).
    ///
    /// Errors: `Invalid` for bad options; `SegmentLength` for a segment truncated or extended
    /// outside ftkv; `SyncedRecordsLost` when records the log had proved fsynced are missing or
    /// damaged; `Corruption` for other damage that is not a torn tail of the newest segment (and
    /// for a format version 1 log); `Io` for file-system failures.
    pub fn open(vfs: Arc<dyn Vfs>, dir: &Path, opts: LogOptions) -> Result<Log, LogError> {
        if opts.segment_size_bytes < MIN_SEGMENT_SIZE_BYTES {
            return Err(LogError::Invalid(format!(
                "segment_size_bytes {} below the minimum {MIN_SEGMENT_SIZE_BYTES}",
                opts.segment_size_bytes
            )));
        }
        if let SyncMode::Periodic { period_ms } = opts.sync {
            if period_ms < MIN_SYNC_PERIOD_MS {
                return Err(LogError::Invalid(format!(
                    "sync period_ms {period_ms} below {MIN_SYNC_PERIOD_MS}"
                )));
            }
        }
        vfs.create_dir_all(dir)
            .map_err(|e| io_err(format!("create {}", dir.display()), e))?;
        let point_in_time = matches!(opts.sync, SyncMode::Periodic { .. });
        let rec = recovery::recover(&*vfs, dir, point_in_time)?;
        let mut segments: BTreeMap<u64, Option<Arc<dyn VfsFile>>> =
            rec.segments.into_iter().map(|(s, f)| (s, Some(f))).collect();
        let (active_seq, active_end, active_records, active_size_bytes, open_mark) = match rec.last {
            Some(last) => (last.seq, last.valid_end, last.records, last.size_bytes, last.mark),
            None => {
                let seq = rec.max_seq_seen + 1;
                let size_bytes = opts.segment_size_bytes;
                let file = create_segment(&*vfs, dir, seq, size_bytes)?;
                segments.insert(seq, Some(file));
                let mark = format::DurableMark {
                    generation: 0,
                    durable_end: RECORDS_START,
                };
                (seq, RECORDS_START, 0, size_bytes, mark)
            }
        };
        let state = State {
            index: rec.index,
            metas: rec.metas,
            purged_up_to: rec.purged_up_to,
            segments,
            active_seq,
            active_end,
            active_size_bytes,
            active_records,
            queue: Vec::new(),
            callbacks: Vec::new(),
            sync_requested: false,
            queued_ticket: 0,
            durable_ticket: 0,
            written: (active_seq, active_end),
            poison: None,
            shutdown: false,
            cache_limit_bytes: DEFAULT_CACHE_SIZE_BYTES,
            open_mark,
        };
        let shared = Arc::new(Shared {
            vfs,
            dir: dir.to_path_buf(),
            opts,
            state: Mutex::new(state),
            work_cv: Condvar::new(),
            done_cv: Condvar::new(),
            purge_lock: Mutex::new(()),
            // Ask for the next segment at once if the active one is already a quarter full.
            prep: Mutex::new(Prepared {
                wanted: active_end >= active_size_bytes / 4,
                ..Prepared::default()
            }),
            prep_cv: Condvar::new(),
            counters: Counters::default(),
            space_error: Mutex::new(None),
        });
        let for_thread = Arc::clone(&shared);
        let join = std::thread::Builder::new()
            .name("ftkv-log-flusher".to_string())
            .spawn(move || flusher::run(for_thread))
            .map_err(|e| io_err("spawn log flusher thread", e))?;
        let flusher_id = join.thread().id();
        let handle = Handle {
            shared: Arc::clone(&shared),
            flusher: Mutex::new(Some(join)),
            flusher_id,
            preparer: Mutex::new(None),
        };
        let for_preparer = Arc::clone(&shared);
        let preparer = std::thread::Builder::new()
            .name("ftkv-log-prealloc".to_string())
            .spawn(move || flusher::run_preparer(for_preparer))
            .map_err(|e| io_err("spawn log segment preparer thread", e))?;
        *handle.preparer.lock() = Some(preparer);
        Ok(Log {
            handle: Arc::new(handle),
        })
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// Appends records with contiguous indexes (first = last_index + 1, or any index above the
    /// purge point when the log is empty). Readable when this returns; `done` fires after they
    /// are durable.
    ///
    /// No I/O happens here. Errors (`done` is then dropped uncalled): `Invalid` for a gap, an
    /// index at or below [`Log::purged_up_to`], or a payload above
    /// [`limits::MAX_RECORD_PAYLOAD_BYTES`]; `Poisoned` after an I/O failure.
    /// An empty `records` queues `done` to fire after the next flush.
    pub fn append(&self, records: Vec<(u64, Bytes)>, done: AppendCallback) -> Result<(), LogError> {
        for (i, (index, payload)) in records.iter().enumerate() {
            if payload.len() > MAX_RECORD_PAYLOAD_BYTES {
                return Err(LogError::Invalid(format!(
                    "record {index} is {} bytes, above the limit of {MAX_RECORD_PAYLOAD_BYTES}",
                    payload.len()
                )));
            }
            if let Some((prev, _)) = i.checked_sub(1).and_then(|p| records.get(p)) {
                if *index != prev + 1 {
                    return Err(LogError::Invalid(format!(
                        "append batch not contiguous: {prev} then {index}"
                    )));
                }
            }
        }
        let sh = self.shared();
        let mut st = sh.state.lock();
        st.check_poison()?;
        if let Some((first, _)) = records.first() {
            if let Some(next) = st.index.next_index() {
                if *first != next {
                    return Err(LogError::Invalid(format!(
                        "append at index {first}, expected {next}"
                    )));
                }
            }
            if let Some(purged) = st.purged_up_to.filter(|p| first <= p) {
                return Err(LogError::Invalid(format!(
                    "append at index {first}, at or below the purge point {purged}"
                )));
            }
        }
        let count = records.len() as u64;
        for (index, payload) in records {
            let (seq, offset) =
                st.push_record(sh.opts.segment_size_bytes, RecordType::Entry, index, &payload);
            let payload_len = limits::payload_len_u32(payload.len());
            st.index.push(
                index,
                EntryLoc {
                    seq,
                    offset,
                    payload_len,
                    payload: Some(payload),
                },
            );
        }
        st.callbacks.push(done);
        st.enqueue();
        drop(st);
        sh.counters.records_appended.fetch_add(count, Ordering::Relaxed);
        sh.counters.append_calls.fetch_add(1, Ordering::Relaxed);
        sh.work_cv.notify_one();
        Ok(())
    }

    /// Records with index in `[start, end)` that the log holds, in order, stopping once the
    /// payload total would exceed `max_bytes` (at least one record is returned if any is held).
    /// Indexes below `first_index()` or above `last_index()` are simply absent.
    ///
    /// Errors: `Corruption` if a record read back from disk fails its checksum, `Io`, `Poisoned`.
    pub fn read_range(&self, start: u64, end: u64, max_bytes: usize) -> Result<Vec<(u64, Bytes)>, LogError> {
        enum Slot {
            Ready(Bytes),
            Disk {
                file: Arc<dyn VfsFile>,
                seq: u64,
                offset: u64,
                payload_len: u32,
            },
        }
        let mut slots: Vec<(u64, Slot)> = Vec::new();
        {
            let st = self.shared().state.lock();
            st.check_poison()?;
            let (Some(first), Some(last)) = (st.index.first_index(), st.index.last_index()) else {
                return Ok(Vec::new());
            };
            let mut total: usize = 0;
            for index in start.max(first)..end.min(last.saturating_add(1)) {
                let Some(loc) = st.index.get(index) else { break };
                let len = loc.payload_len as usize;
                if !slots.is_empty() && total.saturating_add(len) > max_bytes {
                    break;
                }
                total = total.saturating_add(len);
                let slot = match &loc.payload {
                    Some(p) => Slot::Ready(p.clone()),
                    None => match st.segments.get(&loc.seq) {
                        Some(Some(file)) => Slot::Disk {
                            file: Arc::clone(file),
                            seq: loc.seq,
                            offset: loc.offset,
                            payload_len: loc.payload_len,
                        },
                        _ => {
                            return Err(LogError::Corruption {
                                location: format!("segment {} (index {index})", loc.seq),
                                detail: "entry indexed in a segment that has no open file".to_string(),
                            })
                        }
                    },
                };
                slots.push((index, slot));
            }
        }
        let dir = &self.shared().dir;
        slots
            .into_iter()
            .map(|(index, slot)| match slot {
                Slot::Ready(p) => Ok((index, p)),
                Slot::Disk {
                    file,
                    seq,
                    offset,
                    payload_len,
                } => read_entry(&*file, dir, seq, offset, index, payload_len).map(|p| (index, p)),
            })
            .collect()
    }

    /// Lowest index still held (None when empty).
    pub fn first_index(&self) -> Option<u64> {
        self.shared().state.lock().index.first_index()
    }

    /// Highest index held (None when empty).
    pub fn last_index(&self) -> Option<u64> {
        self.shared().state.lock().index.last_index()
    }

    /// Highest purge point ever requested (entries <= it are gone), None if never purged.
    pub fn purged_up_to(&self) -> Option<u64> {
        self.shared().state.lock().purged_up_to
    }

    /// The directory holding the segments.
    pub fn dir(&self) -> &Path {
        &self.shared().dir
    }

    /// Whether an I/O failure has poisoned the log.
    pub fn is_poisoned(&self) -> bool {
        self.shared().state.lock().poison.is_some()
    }

    /// While the disk is full: the error (`ENOSPC`) that stops the flusher from creating the
    /// next segment. Appends then wait, unacknowledged, and go on by themselves once space is
    /// freed; the log is not poisoned and its records stay readable. `None` otherwise.
    pub fn space_error(&self) -> Option<String> {
        self.shared().space_error.lock().clone()
    }

    /// Sets the byte budget for cached payloads of written entries (default
    /// [`limits::DEFAULT_CACHE_SIZE_BYTES`]). Entries not yet written are always cached.
    pub fn set_cache_limit_bytes(&self, limit_bytes: u64) {
        let mut st = self.shared().state.lock();
        st.cache_limit_bytes = limit_bytes;
        let written = st.written;
        st.index.evict(limit_bytes, written);
    }

    /// Removes every record with index >= `from`. Durable before it returns.
    pub fn truncate(&self, from: u64) -> Result<(), LogError> {
        let sh = self.shared();
        let mut st = sh.state.lock();
        st.check_poison()?;
        st.index.truncate_from(from);
        st.push_record(sh.opts.segment_size_bytes, RecordType::Truncate, from, &[]);
        let ticket = st.enqueue();
        self.wait_durable(st, ticket)
    }

    /// Forgets every record with index <= `up_to`. The purge point is durable before it returns;
    /// then whole segments holding only purged entries are deleted (oldest first).
    pub fn purge(&self, up_to: u64) -> Result<(), LogError> {
        let sh = self.shared();
        let mut st = sh.state.lock();
        st.check_poison()?;
        st.index.purge_up_to(up_to);
        st.purged_up_to = Some(st.purged_up_to.map_or(up_to, |p| p.max(up_to)));
        let (marker_seq, _) = st.push_record(sh.opts.segment_size_bytes, RecordType::Purge, up_to, &[]);
        let ticket = st.enqueue();
        self.wait_durable(st, ticket)?;
        self.delete_purged_segments(marker_seq)
    }

    /// Deletes segments below both the purge marker's segment and the lowest live entry's
    /// segment. Everything in them was queued before the marker, hence is written and synced; the
    /// metas and purge point they held are in the snapshot of a later segment.
    fn delete_purged_segments(&self, marker_seq: u64) -> Result<(), LogError> {
        let sh = self.shared();
        let _serial = sh.purge_lock.lock();
        let victims: Vec<u64> = {
            let mut st = sh.state.lock();
            let limit = st.index.first_segment().map_or(marker_seq, |s| s.min(marker_seq));
            let victims: Vec<u64> = st.segments.range(..limit).map(|(s, _)| *s).collect();
            for s in &victims {
                st.segments.remove(s);
            }
            victims
        };
        for seq in victims {
            let path = segment_path(&sh.dir, seq);
            let result = sh
                .vfs
                .remove_file(&path)
                .map_err(|e| io_err(format!("remove purged segment {}", path.display()), e))
                .and_then(|()| {
                    sh.vfs
                        .sync_dir(&sh.dir)
                        .map_err(|e| io_err(format!("sync dir {}", sh.dir.display()), e))
                });
            sh.counters.dir_syncs.fetch_add(1, Ordering::Relaxed);
            if let Err(e) = result {
                flusher::poison(sh, &e);
                return Err(e);
            }
        }
        Ok(())
    }

    /// Stores a small named value (key <= [`limits::MAX_META_KEY_BYTES`] bytes). `durable = true`:
    /// fsynced before return; false: durable with the next group flush. Survives purges.
    pub fn put_meta(&self, key: &str, value: Bytes, durable: bool) -> Result<(), LogError> {
        if key.len() > MAX_META_KEY_BYTES {
            return Err(LogError::Invalid(format!(
                "meta key of {} bytes above {MAX_META_KEY_BYTES}",
                key.len()
            )));
        }
        if 2 + key.len() + value.len() > MAX_RECORD_PAYLOAD_BYTES {
            return Err(LogError::Invalid(format!(
                "meta value of {} bytes too large",
                value.len()
            )));
        }
        let payload = encode_meta_payload(key, &value);
        let sh = self.shared();
        let mut st = sh.state.lock();
        st.check_poison()?;
        st.metas.insert(key.to_string(), value);
        st.push_record(sh.opts.segment_size_bytes, RecordType::Meta, 0, &payload);
        let ticket = st.enqueue();
        if durable {
            self.wait_durable(st, ticket)
        } else {
            drop(st);
            sh.work_cv.notify_one();
            Ok(())
        }
    }

    /// Latest value stored under `key`.
    pub fn get_meta(&self, key: &str) -> Option<Bytes> {
        self.shared().state.lock().metas.get(key).cloned()
    }

    /// Makes everything appended so far durable (also in periodic mode).
    pub fn sync(&self) -> Result<(), LogError> {
        let st = self.shared().state.lock();
        st.check_poison()?;
        let ticket = st.queued_ticket;
        self.wait_durable(st, ticket)
    }

    fn wait_durable(&self, mut st: parking_lot::MutexGuard<'_, State>, ticket: u64) -> Result<(), LogError> {
        let sh = self.shared();
        if st.durable_ticket >= ticket {
            return Ok(());
        }
        st.sync_requested = true;
        sh.work_cv.notify_one();
        while st.durable_ticket < ticket {
            if let Some(msg) = &st.poison {
                return Err(io_err(
                    "waiting for a log flush",
                    std::io::Error::other(msg.clone()),
                ));
            }
            sh.done_cv.wait(&mut st);
        }
        Ok(())
    }

    /// Counters.
    pub fn stats(&self) -> LogStats {
        let sh = self.shared();
        let c = &sh.counters;
        let (segments, cached_bytes) = {
            let st = sh.state.lock();
            (st.segments.len() as u64, st.index.cached_bytes())
        };
        LogStats {
            records_appended: c.records_appended.load(Ordering::Relaxed),
            fsyncs: c.fsyncs.load(Ordering::Relaxed),
            bytes_written: c.bytes_written.load(Ordering::Relaxed),
            append_calls: c.append_calls.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
            dir_syncs: c.dir_syncs.load(Ordering::Relaxed),
            segments,
            cached_bytes,
        }
    }
}

/// Creates the first segment `seq` of an empty log durably: preallocated (zero-filled, synced)
/// under the temporary name, header written and synced, renamed, directory synced.
fn create_segment(
    vfs: &dyn Vfs,
    dir: &Path,
    seq: u64,
    size_bytes: u64,
) -> Result<Arc<dyn VfsFile>, LogError> {
    let file = flusher::prepare_file(vfs, dir, size_bytes)?;
    let path = segment_path(dir, seq);
    let mut header = Vec::new();
    encode_segment_header(
        &SegmentHeader {
            seq,
            segment_size_bytes: size_bytes,
            prev_segment_end: 0,
        },
        &mut header,
    );
    file.write_all_at(&header, 0)
        .map_err(|e| io_err(format!("write {}", path.display()), e))?;
    file.sync_data()
        .map_err(|e| io_err(format!("sync {}", path.display()), e))?;
    let tmp = dir.join(flusher::PREPARED_NAME);
    vfs.rename(&tmp, &path)
        .map_err(|e| io_err(format!("rename {} to {}", tmp.display(), path.display()), e))?;
    vfs.sync_dir(dir)
        .map_err(|e| io_err(format!("sync dir {}", dir.display()), e))?;
    Ok(file)
}

/// Reads entry `index` back from disk and verifies it.
fn read_entry(
    file: &dyn VfsFile,
    dir: &Path,
    seq: u64,
    offset: u64,
    index: u64,
    payload_len: u32,
) -> Result<Bytes, LogError> {
    let location = || format!("segment {} at offset {offset}", segment_path(dir, seq).display());
    let mut buf = vec![0u8; format::RECORD_OVERHEAD_BYTES + payload_len as usize];
    file.read_exact_at(&mut buf, offset)
        .map_err(|e| io_err(format!("read {}", location()), e))?;
    let (rec, _) = format::decode_record(&Bytes::from(buf)).map_err(|e| LogError::Corruption {
        location: location(),
        detail: e.to_string(),
    })?;
    if rec.kind != RecordType::Entry || rec.index != index {
        return Err(LogError::Corruption {
            location: location(),
            detail: format!(
                "expected entry {index}, found {:?} record with index {}",
                rec.kind, rec.index
            ),
        });
    }
    Ok(rec.payload)
}
