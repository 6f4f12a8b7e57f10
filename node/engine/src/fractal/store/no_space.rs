//! A full disk: dirty nodes and spilled runs the store could not write stay in memory.
//!
//! Writing a node or a run is optional until a checkpoint needs it: writeback and eviction only
//! free memory. When a block write meets `ENOSPC` or `EDQUOT` ([`EngineError::NoSpace`]), the
//! store *holds* dirty data: the node stays cached and dirty (a spilled run stays pending, in
//! memory), eviction takes clean nodes only, the incremental writer and writeback jobs pause,
//! and the cache may outgrow its budget. Every [`NO_SPACE_RETRY_MS`] writes are tried again; the
//! first block written clears the hold. A checkpoint that meets the full disk writes nothing
//! durable (the file keeps the last checkpoint) and is retried by the caller. A failed fsync or
//! a checksum mismatch is still a fault that poisons the engine.

use super::*;

/// How long after a full-disk error the store leaves dirty data unwritten before trying again.
pub(crate) const NO_SPACE_RETRY_MS: u64 = 1_000;

/// The full-disk error the store met and when it tries writing again.
#[derive(Debug, Clone)]
pub(crate) struct SpaceHold {
    /// The error, as the engine reports it ([`crate::Engine::space_error`]).
    pub(crate) error: String,
    /// Until then dirty data is not written (except by a checkpoint).
    pub(crate) retry_at: Instant,
}

/// The error of a failed block write: [`EngineError::NoSpace`] for a full disk or quota,
/// otherwise `Io`.
pub(crate) fn block_write_error(context: String, source: std::io::Error) -> EngineError {
    if crate::is_no_space_io(&source) {
        EngineError::NoSpace { context, source }
    } else {
        EngineError::Io { context, source }
    }
}

impl Store {
    /// Records a full-disk error: dirty data stays in memory for [`NO_SPACE_RETRY_MS`].
    pub(crate) fn hold_dirty(&mut self, err: &EngineError) {
        let retry_at = Instant::now() + std::time::Duration::from_millis(NO_SPACE_RETRY_MS);
        self.space_hold = Some(SpaceHold {
            error: err.to_string(),
            retry_at,
        });
    }

    /// Whether dirty data is held in memory now (a full disk met less than
    /// [`NO_SPACE_RETRY_MS`] ago).
    pub(crate) fn holding_dirty(&self) -> bool {
        self.space_hold
            .as_ref()
            .is_some_and(|h| Instant::now() < h.retry_at)
    }

    /// A block was written: the disk has room again.
    pub(crate) fn space_regained(&mut self) {
        self.space_hold = None;
    }

    /// The full-disk error held (see [`crate::Engine::space_error`]).
    pub(crate) fn space_error(&self) -> Option<String> {
        self.space_hold.as_ref().map(|h| h.error.clone())
    }

    /// A writeback job failed on a full disk: its nodes stay cached and dirty (queued victims go
    /// back to the CLOCK ring), its runs stay pending, and writing pauses.
    pub(crate) fn writeback_failed(&mut self, err: &EngineError) {
        self.hold_dirty(err);
        self.cachetable.clear_write_soon();
        self.cachetable.unmark_all_evicting();
        self.runs_not_handed_over = self.pending_runs.len();
    }

    /// Keeps spilled run `id` pending in memory because writing it met a full disk (a
    /// checkpoint or a later writeback writes it).
    pub(crate) fn keep_run_pending(&mut self, id: u64, msgs: Vec<Msg>, bytes: usize, err: &EngineError) {
        self.hold_dirty(err);
        debug_assert!(!self.btt.contains_key(&id) && !self.pending_runs.contains_key(&id));
        self.pending_runs.insert(id, Arc::new(msgs));
        self.pending_run_bytes += bytes;
        if self.cachetable.background_writes() {
            self.runs_not_handed_over += 1;
        }
    }
}
