//! The state under the engine lock, poisoning, writeback steps, and the cleaner's step.

use super::*;

pub(crate) struct Inner {
    pub(crate) tree: Tree,
    pub(crate) poisoned: bool,
    /// Background writer of idle dirty nodes (`None`: written inline).
    pub(crate) writeback: Option<Writeback>,
    /// The error that poisoned the engine on the cleaner thread, returned by the next write
    /// (then writes get `Poisoned`).
    pub(crate) background_error: Option<EngineError>,
    /// When the last write batch ended (the cleaner drains further once writes stop).
    pub(crate) last_write: std::time::Instant,
}

/// One cleaner step, once no write came for `idle_after` (checked under the shared lock, so
/// a busy engine never sees the cleaner take the exclusive one): under the exclusive lock,
/// flush one buffer ([`Tree::clean_step`], nodes down to half their gorge limit; it installs
/// finished leaf flushes first), keep the cache in budget, and adopt or start writeback; the
/// lock then goes straight to a waiting writer or reader. A panic inside is caught. An error
/// (or panic) poisons the engine and is kept for the next write.
pub(crate) fn clean_step(inner: &RwLock<Inner>, idle_after: std::time::Duration) -> Step {
    {
        let g = inner.read();
        if g.poisoned {
            return Step::Stop;
        }
        if g.last_write.elapsed() < idle_after {
            return Step::Idle;
        }
    }
    let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        clean_step_locked(inner, idle_after)
    }));
    step.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let mut g = inner.write();
        g.poisoned = true;
        g.background_error = Some(EngineError::Corruption {
            location: format!("{} (cleaner thread)", g.tree.store.path().display()),
            detail: format!("the cleaner panicked mid-flush: {what}"),
        });
        Step::Stop
    })
}

pub(crate) fn clean_step_locked(inner: &RwLock<Inner>, idle_after: std::time::Duration) -> Step {
    let mut g = inner.write();
    if g.poisoned {
        return Step::Stop;
    }
    if g.last_write.elapsed() < idle_after {
        return Step::Idle;
    }
    let r = g
        .mutate(|t| {
            let flushed = t.clean_step(tree::CLEAN_IDLE_FULLNESS_1024)?;
            t.store.evict_to_budget(t.root)?;
            Ok(flushed)
        })
        .and_then(|flushed| {
            // Also when nothing was flushed: installed leaf flushes and finished writeback jobs
            // are adopted now, not at the next write.
            g.writeback_step()?;
            Ok(flushed)
        });
    match r {
        Ok(true) => {
            RwLockWriteGuard::unlock_fair(g);
            Step::Again
        }
        Ok(false) => Step::Idle,
        Err(e) => {
            g.poisoned = true;
            g.background_error = Some(e);
            Step::Stop
        }
    }
}

impl Inner {
    /// Runs a mutation; any error poisons the engine (the in-memory tree may be half-updated;
    /// the file still holds the last checkpoint).
    pub(crate) fn mutate<T>(&mut self, f: impl FnOnce(&mut Tree) -> Result<T>) -> Result<T> {
        if self.poisoned {
            return Err(EngineError::Poisoned);
        }
        let r = f(&mut self.tree);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    /// After a write batch: adopts a finished writeback job, starts the next one when dirty
    /// nodes exceed half the cache budget (or leaves wait to be written and evicted), and makes
    /// the writer wait for the running job (smooth back-pressure) when dirty nodes pass seven
    /// eighths of the budget or the engine's memory (cache, side cache, flushes in flight) is
    /// over budget. Without the thread, writes inline (above a quarter of the
    /// budget).
    pub(crate) fn writeback_step(&mut self) -> Result<()> {
        self.writeback_round(false)
    }

    /// Within a write batch, when spilled runs were handed over since the last job began: adopts
    /// a finished job and, when the thread is idle, starts the next one at once, pending runs
    /// first (a batch's flush cascade can spill many runs; waiting for the batch's end would make
    /// the writer encode them itself once an eighth of the budget is pending).
    pub(crate) fn hand_over_runs(&mut self) -> Result<()> {
        self.writeback_round(true)
    }

    /// [`Inner::writeback_step`] (`runs_only` false) or [`Inner::hand_over_runs`] (true).
    pub(crate) fn writeback_round(&mut self, runs_only: bool) -> Result<()> {
        if self.poisoned {
            return Err(EngineError::Poisoned);
        }
        let budget = self.tree.store.budget_bytes();
        let Some(wb) = self.writeback.as_mut() else {
            if runs_only {
                return Ok(());
            }
            return self.mutate(|t| t.store.write_some_dirty(budget / 4, t.root));
        };
        let limit = budget / 2;
        if !runs_only {
            self.tree.store.next_write_epoch();
        }
        let mut finished = wb.poll(false);
        if finished.is_none() && wb.running() && !runs_only {
            let store = &self.tree.store;
            if store.dirty_bytes() > budget / 8 * 7 || store.memory_bytes() > budget {
                finished = wb.poll(true);
            }
        }
        if let Some(r) = finished {
            match r {
                Ok(done) => {
                    let root = self.tree.root;
                    if done.stats.nodes_written + done.stats.runs_written > 0 {
                        self.tree.store.space_regained();
                    }
                    let stats = self.tree.store.finish_writeback(done, root);
                    wb.count(stats);
                }
                // A full disk: the job's nodes stay dirty and cached, its runs pending; the
                // next job starts once writes are tried again (module `store::no_space`).
                Err(e) if e.is_no_space() => self.tree.store.writeback_failed(&e),
                Err(e) => {
                    self.poisoned = true;
                    return Err(e);
                }
            }
        }
        if !wb.running() && !self.tree.store.holding_dirty() {
            let root = self.tree.root;
            // After a full disk, writes are tried again with whatever is idle and dirty (the
            // first block written clears the hold); with nothing to write, nothing is held.
            let retrying = self.tree.store.space_hold.is_some();
            let limit = if retrying { 0 } else { limit };
            // Pending runs go first in any job.
            if let Some(job) = self.tree.store.begin_writeback(limit, root) {
                if let Err(e) = wb.submit(job) {
                    self.poisoned = true;
                    return Err(e);
                }
            } else if retrying && !runs_only {
                self.tree.store.space_regained();
            }
        }
        Ok(())
    }
}
