//! The flusher thread: group commit (PerconaFT logger, MySQL binlog group commit).
//!
//! Each round takes everything queued, writes it (one `write_all_at` per segment touched), then
//! fdatasyncs once and fires every callback it took. Ordering rules that recovery relies on:
//! * a segment is fdatasynced before any byte of the next segment is written, so only the newest
//!   segment can ever hold a torn tail;
//! * a new segment's name is made durable (directory sync) before callbacks of records in it fire.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ftkv_vfs::VfsFile;

use crate::format::segment_path;
use crate::{io_err, AppendCallback, Chunk, LogError, Shared, SyncMode};

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
    let mut fl = Flusher {
        current: None,
        current_unsynced: false,
        current_end: None,
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
        }
        Ok(())
    }

    /// Makes `seq` the current segment, syncing the previous one first (creating `seq` if asked).
    fn switch_to(&mut self, sh: &Shared, seq: u64, create: bool) -> Result<Arc<dyn VfsFile>, LogError> {
        if let Some((cur, file)) = &self.current {
            if *cur == seq {
                return Ok(Arc::clone(file));
            }
        }
        self.sync_current(sh)?;
        let file = if create {
            let path = segment_path(&sh.dir, seq);
            let file = sh
                .vfs
                .open(&path, true)
                .map_err(|e| io_err(format!("create {}", path.display()), e))?;
            if file
                .len()
                .map_err(|e| io_err(format!("stat {}", path.display()), e))?
                > 0
            {
                file.set_len(0)
                    .map_err(|e| io_err(format!("reset {}", path.display()), e))?;
            }
            sh.state.lock().segments.insert(seq, Some(Arc::clone(&file)));
            self.dir_dirty = true;
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
        Ok(file)
    }
}

fn process(sh: &Shared, fl: &mut Flusher, chunks: Vec<Chunk>, want_sync: bool) -> Result<(), LogError> {
    let mut written = None;
    for chunk in &chunks {
        let file = fl.switch_to(sh, chunk.seq, chunk.create)?;
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
    if want_sync {
        fl.sync_current(sh)?;
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
