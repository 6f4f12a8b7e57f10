//! The flusher thread: group commit (PerconaFT logger, MySQL binlog group commit).
//!
//! Each round takes everything queued, writes it (one `write_all_at` per segment touched), then
//! fdatasyncs once and fires every callback it took. Ordering rules that recovery relies on:
//! * a segment is fdatasynced before any byte of the next segment is written, so only the newest
//!   segment can ever hold a torn tail;
//! * a new segment's name is made durable (directory sync) before callbacks of records in it fire;
//! * a new segment is a preallocated file (zero-filled and fsynced under [`PREPARED_NAME`] by the
//!   preparer thread, [`run_preparer`]) renamed to its segment name, so record writes never
//!   change the file's size and fdatasync has no metadata to write;
//! * after a synced round, once its callbacks have fired, the flusher writes the segment's
//!   durable mark (the synced end offset) into a header slot without syncing it: the next round's
//!   fdatasync (or the OS) persists it. At most one mark write per [`MARK_INTERVAL`] while busy,
//!   always when the queue is empty.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ftkv_vfs::{Vfs, VfsFile};

use crate::format::{encode_mark, mark_slot_offset, segment_path, DurableMark, RECORDS_START};
use crate::{io_err, AppendCallback, Chunk, LogError, Shared, SyncMode};

/// File name of the next segment while it is being preallocated (ignored by recovery).
pub(crate) const PREPARED_NAME: &str = "next-segment.tmp";

/// While commits keep arriving, durable marks are written at most this often.
pub(crate) const MARK_INTERVAL: Duration = Duration::from_millis(10);

/// Zero bytes written per call while preallocating, in bytes.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

/// Creates (or resets) [`PREPARED_NAME`] in `dir` as `size_bytes` of zeros, fdatasynced.
/// Zeros are written, not only allocated: fdatasync of a later overwrite then has no extent or
/// size metadata to update (etcd's WAL, PostgreSQL's WAL files).
pub(crate) fn prepare_file(vfs: &dyn Vfs, dir: &Path, size_bytes: u64) -> Result<Arc<dyn VfsFile>, LogError> {
    let path = dir.join(PREPARED_NAME);
    let ctx = |what: &str| format!("{what} {}", path.display());
    let file = vfs.open(&path, true).map_err(|e| io_err(ctx("create"), e))?;
    file.set_len(0).map_err(|e| io_err(ctx("reset"), e))?;
    let filled = (|| {
        let zeros = vec![0u8; ZERO_CHUNK_BYTES.min(size_bytes) as usize];
        let mut offset = 0u64;
        while offset < size_bytes {
            let n = (size_bytes - offset).min(zeros.len() as u64) as usize;
            #[allow(clippy::indexing_slicing)] // n <= zeros.len() (the min above)
            file.write_all_at(&zeros[..n], offset)
                .map_err(|e| io_err(ctx("zero-fill"), e))?;
            offset += n as u64;
        }
        file.sync_data().map_err(|e| io_err(ctx("sync"), e))
    })();
    if let Err(e) = filled {
        // Give back what the half-made file took (a full disk must not stay full because of it).
        let _ = file.set_len(0);
        return Err(e);
    }
    Ok(file)
}

/// Whether `err` is the file system saying it is full (`ENOSPC`, or `EDQUOT`).
pub(crate) fn is_no_space(err: &LogError) -> bool {
    matches!(err, LogError::Io { source, .. }
        if matches!(source.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded))
}

/// Longest wait between two attempts to create a segment on a full disk.
const NO_SPACE_RETRY_MAX: Duration = Duration::from_secs(1);

/// [`take_prepared`], waiting while the disk is full: a new segment that cannot be created for
/// lack of space (`ENOSPC`) does not poison the log. Everything written so far stays durable
/// and readable; the records queued for the new segment wait (their callbacks do not fire, so
/// nothing is acknowledged) and the attempt is repeated (every 50 ms, backing off to 1 s) until
/// it succeeds or the log shuts down. [`crate::Log::space_error`] reports the wait meanwhile.
fn take_prepared_waiting_for_space(sh: &Shared, size_bytes: u64) -> Result<Arc<dyn VfsFile>, LogError> {
    let mut delay = Duration::from_millis(50);
    loop {
        match take_prepared(sh, size_bytes) {
            Ok(file) => {
                if sh.space_error.lock().take().is_some() {
                    tracing::warn!(dir = %sh.dir.display(), "log: disk space is available again; appends go on");
                }
                return Ok(file);
            }
            Err(e) if is_no_space(&e) => {
                {
                    let mut space = sh.space_error.lock();
                    if space.is_none() {
                        tracing::error!(
                            dir = %sh.dir.display(),
                            error = %e,
                            "log: the disk is full: no new segment can be created; appends wait \
                             (none is acknowledged, nothing is lost) until space is freed"
                        );
                        *space = Some(e.to_string());
                    }
                }
                let mut st = sh.state.lock();
                if st.shutdown {
                    return Err(e);
                }
                sh.work_cv.wait_for(&mut st, delay);
                delay = (delay * 2).min(NO_SPACE_RETRY_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

/// The preparer thread: whenever the flusher asks (the active segment is a quarter full), it
/// preallocates the next segment file so that a roll only renames it.
pub(crate) fn run_preparer(sh: Arc<Shared>) {
    loop {
        {
            let mut p = sh.prep.lock();
            loop {
                if p.shutdown {
                    return;
                }
                if p.wanted && p.file.is_none() && !p.busy {
                    break;
                }
                sh.prep_cv.wait(&mut p);
            }
            p.wanted = false;
            p.busy = true;
        }
        let size = sh.opts.segment_size_bytes;
        let result = prepare_file(&*sh.vfs, &sh.dir, size);
        let mut p = sh.prep.lock();
        p.busy = false;
        match result {
            Ok(file) => p.file = Some((file, size)),
            // The flusher prepares the file itself at the roll and reports the error then.
            Err(e) => {
                tracing::warn!(dir = %sh.dir.display(), error = %e, "log: preallocating the next segment failed")
            }
        }
        drop(p);
        sh.prep_cv.notify_all();
    }
}

/// Asks the preparer for the next segment file unless one is ready or being made.
fn request_prepared(sh: &Shared) {
    let mut p = sh.prep.lock();
    if p.file.is_none() && !p.busy && !p.wanted {
        p.wanted = true;
        drop(p);
        sh.prep_cv.notify_all();
    }
}

/// Takes the prepared file if it has `size_bytes`, else preallocates one now (slow path: the
/// preparer fell behind, or an oversized record needs a larger segment).
///
/// The slow path holds `busy` while it writes, exactly as the preparer does: both write the one
/// file name [`PREPARED_NAME`], and a preparer woken by an earlier request must not reopen (and
/// reset) that name while the flusher fills and renames it, or keep a handle to what has become
/// a live segment.
fn take_prepared(sh: &Shared, size_bytes: u64) -> Result<Arc<dyn VfsFile>, LogError> {
    let mut p = sh.prep.lock();
    while p.busy {
        sh.prep_cv.wait(&mut p);
    }
    // The flusher asks again after the roll (`request_prepared`), once the new name is taken.
    p.wanted = false;
    if let Some((file, size)) = p.file.take() {
        if size == size_bytes {
            return Ok(file);
        }
    }
    p.busy = true;
    drop(p);
    let result = prepare_file(&*sh.vfs, &sh.dir, size_bytes);
    sh.prep.lock().busy = false;
    sh.prep_cv.notify_all();
    result
}

/// One round of work taken from the queue.
struct Batch {
    chunks: Vec<Chunk>,
    callbacks: Vec<AppendCallback>,
    ticket: u64,
    want_sync: bool,
}

/// What the flusher remembers between rounds.
struct Flusher {
    /// The segment last written to.
    current: Option<(u64, Arc<dyn VfsFile>)>,
    /// Whether `current` has bytes written since its last fdatasync.
    current_unsynced: bool,
    /// End of the bytes written to `current` by this flusher (None until known).
    current_end: Option<u64>,
    /// Preallocated size of `current`, in bytes.
    current_size: u64,
    /// (segment, end offset) known fdatasynced.
    synced: Option<(u64, u64)>,
    /// The last durable mark written, and to which segment.
    mark_seq: u64,
    mark: DurableMark,
    last_mark_at: Instant,
    /// A mark was written to `current` since its last fdatasync.
    mark_unsynced: bool,
    /// A segment was created and the directory not synced since.
    dir_dirty: bool,
    last_sync: Instant,
}

/// Marks the log poisoned (first error wins) and wakes every waiter.
pub(crate) fn poison(sh: &Shared, err: &LogError) {
    let mut st = sh.state.lock();
    if st.poison.is_none() {
        tracing::error!(dir = %sh.dir.display(), error = %err, "log poisoned by an I/O failure");
        st.poison = Some(err.to_string());
    }
    drop(st);
    sh.done_cv.notify_all();
    sh.work_cv.notify_all();
}

fn period(sh: &Shared) -> Option<Duration> {
    match sh.opts.sync {
        SyncMode::Always => None,
        SyncMode::Periodic { period_ms } => Some(Duration::from_millis(period_ms)),
    }
}

/// Runs until shutdown (after a final flush) or until the log is poisoned.
pub(crate) fn run(sh: Arc<Shared>) {
    let (mark_seq, mark) = {
        let st = sh.state.lock();
        (st.active_seq, st.open_mark)
    };
    let mut fl = Flusher {
        current: None,
        current_unsynced: false,
        current_end: None,
        current_size: 0,
        synced: None,
        mark_seq,
        mark,
        last_mark_at: Instant::now(),
        mark_unsynced: false,
        dir_dirty: false,
        last_sync: Instant::now(),
    };
    while let Some(batch) = next_batch(&sh, &fl) {
        let ticket = batch.ticket;
        let synced = batch.want_sync;
        match process(&sh, &mut fl, batch.chunks, batch.want_sync) {
            Ok(()) => {
                if synced {
                    sh.state.lock().durable_ticket = ticket;
                    sh.done_cv.notify_all();
                }
                for cb in batch.callbacks {
                    cb(Ok(()));
                }
                if let Err(e) = write_mark(&sh, &mut fl) {
                    poison(&sh, &e);
                    let later = std::mem::take(&mut sh.state.lock().callbacks);
                    for cb in later {
                        cb(Err(LogError::Poisoned));
                    }
                    return;
                }
            }
            Err(e) => {
                poison(&sh, &e);
                let later = std::mem::take(&mut sh.state.lock().callbacks);
                let msg = e.to_string();
                for cb in batch.callbacks {
                    cb(Err(io_err("log flush", std::io::Error::other(msg.clone()))));
                }
                for cb in later {
                    cb(Err(LogError::Poisoned));
                }
                return;
            }
        }
    }
    // Clean shutdown: make the last mark durable too (one fdatasync, off every commit's path).
    if let (true, Some((seq, file))) = (fl.mark_unsynced, &fl.current) {
        if sh.state.lock().poison.is_none() {
            match file.sync_data() {
                Ok(()) => {
                    sh.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(segment = seq, error = %e, "log: syncing the final durable mark failed")
                }
            }
        }
    }
}

/// Waits for work; None on shutdown with nothing left to write or sync.
fn next_batch(sh: &Shared, fl: &Flusher) -> Option<Batch> {
    let period = period(sh);
    let mut st = sh.state.lock();
    loop {
        if st.poison.is_some() {
            let later = std::mem::take(&mut st.callbacks);
            drop(st);
            for cb in later {
                cb(Err(LogError::Poisoned));
            }
            return None;
        }
        let unsynced = fl.current_unsynced || fl.dir_dirty;
        let periodic_due = period.is_some_and(|p| unsynced && fl.last_sync.elapsed() >= p);
        let has_work = !st.queue.is_empty() || !st.callbacks.is_empty() || st.sync_requested || periodic_due;
        if has_work || (st.shutdown && unsynced) {
            let want_sync = period.is_none() || st.sync_requested || periodic_due || st.shutdown;
            st.sync_requested = false;
            return Some(Batch {
                chunks: std::mem::take(&mut st.queue),
                callbacks: std::mem::take(&mut st.callbacks),
                ticket: st.queued_ticket,
                want_sync,
            });
        }
        if st.shutdown {
            return None;
        }
        match period {
            Some(p) if unsynced => {
                let wait = p.saturating_sub(fl.last_sync.elapsed());
                sh.work_cv.wait_for(&mut st, wait);
            }
            _ => sh.work_cv.wait(&mut st),
        }
    }
}

impl Flusher {
    fn sync_current(&mut self, sh: &Shared) -> Result<(), LogError> {
        if let (true, Some((seq, file))) = (self.current_unsynced, &self.current) {
            file.sync_data()
                .map_err(|e| io_err(format!("fdatasync segment {seq}"), e))?;
            sh.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
            self.current_unsynced = false;
            self.mark_unsynced = false;
        }
        Ok(())
    }

    /// Makes `seq` the current segment, syncing the previous one first (creating `seq` if asked,
    /// from a preallocated file of `size_bytes`).
    fn switch_to(
        &mut self,
        sh: &Shared,
        seq: u64,
        create: bool,
        size_bytes: u64,
    ) -> Result<Arc<dyn VfsFile>, LogError> {
        if let Some((cur, file)) = &self.current {
            if *cur == seq {
                return Ok(Arc::clone(file));
            }
        }
        self.sync_current(sh)?;
        let file = if create {
            let path = segment_path(&sh.dir, seq);
            let file = take_prepared_waiting_for_space(sh, size_bytes)?;
            let tmp = sh.dir.join(PREPARED_NAME);
            sh.vfs
                .rename(&tmp, &path)
                .map_err(|e| io_err(format!("rename {} to {}", tmp.display(), path.display()), e))?;
            sh.state.lock().segments.insert(seq, Some(Arc::clone(&file)));
            self.dir_dirty = true;
            self.mark_seq = seq;
            self.mark = DurableMark {
                generation: 0,
                durable_end: RECORDS_START,
            };
            file
        } else {
            let found = sh.state.lock().segments.get(&seq).cloned().flatten();
            found.ok_or_else(|| {
                io_err(
                    format!("write to segment {seq}"),
                    std::io::Error::other("segment has no open file (deleted while still being written)"),
                )
            })?
        };
        self.current = Some((seq, Arc::clone(&file)));
        self.current_end = create.then_some(0);
        self.current_size = size_bytes;
        Ok(file)
    }
}

fn process(sh: &Shared, fl: &mut Flusher, chunks: Vec<Chunk>, want_sync: bool) -> Result<(), LogError> {
    let mut written = None;
    for chunk in &chunks {
        let file = fl.switch_to(sh, chunk.seq, chunk.create, chunk.size_bytes)?;
        debug_assert!(
            chunk.offset + chunk.data.len() as u64 <= fl.current_size,
            "record beyond the preallocated segment"
        );
        // The queue is contiguous per segment: every write lands exactly at the end of the last.
        debug_assert!(
            fl.current_end.is_none_or(|end| end == chunk.offset),
            "write queue has a gap"
        );
        file.write_all_at(&chunk.data, chunk.offset).map_err(|e| {
            io_err(
                format!("write segment {} at offset {}", chunk.seq, chunk.offset),
                e,
            )
        })?;
        fl.current_unsynced = true;
        fl.current_end = Some(chunk.offset + chunk.data.len() as u64);
        sh.counters
            .bytes_written
            .fetch_add(chunk.data.len() as u64, Ordering::Relaxed);
        written = Some((chunk.seq, chunk.offset + chunk.data.len() as u64));
    }
    if !chunks.is_empty() {
        sh.counters.flushes.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(w) = written {
        let mut st = sh.state.lock();
        st.written = w;
        let limit = st.cache_limit_bytes;
        st.index.evict(limit, w);
    }
    if let Some(end) = fl.current_end {
        if end >= fl.current_size / 4 {
            request_prepared(sh);
        }
    }
    if want_sync {
        fl.sync_current(sh)?;
        if let (Some((seq, _)), Some(end)) = (&fl.current, fl.current_end) {
            fl.synced = Some((*seq, end));
        }
        if fl.dir_dirty {
            sh.vfs
                .sync_dir(&sh.dir)
                .map_err(|e| io_err(format!("sync dir {}", sh.dir.display()), e))?;
            sh.counters.dir_syncs.fetch_add(1, Ordering::Relaxed);
            fl.dir_dirty = false;
        }
        fl.last_sync = Instant::now();
    }
    Ok(())
}

/// Writes the current segment's durable mark (its fdatasynced end) if it advanced, without syncing:
/// always when nothing is queued, at most every [`MARK_INTERVAL`] otherwise.
fn write_mark(sh: &Shared, fl: &mut Flusher) -> Result<(), LogError> {
    let Some((seq, end)) = fl.synced else {
        return Ok(());
    };
    let Some((cur, file)) = &fl.current else {
        return Ok(());
    };
    if *cur != seq || fl.mark_seq != seq || end <= fl.mark.durable_end {
        return Ok(());
    }
    if fl.last_mark_at.elapsed() < MARK_INTERVAL && !sh.state.lock().queue.is_empty() {
        return Ok(());
    }
    let mark = DurableMark {
        generation: fl.mark.generation + 1,
        durable_end: end,
    };
    let offset = mark_slot_offset(mark.generation);
    file.write_all_at(&encode_mark(seq, mark), offset)
        .map_err(|e| io_err(format!("write durable mark of segment {seq}"), e))?;
    fl.mark = mark;
    fl.last_mark_at = Instant::now();
    fl.mark_unsynced = true;
    Ok(())
}
