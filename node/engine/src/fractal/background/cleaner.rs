//! The cleaner thread: background flushing of internal buffers between write batches
//! (PerconaFT's cleaner thread, `toku_cleaner_thread` in `ft/cachetable/cachetable.cc`, which
//! every `cleaner_period` seconds runs `cleaner_iterations` flushes of the node with the most
//! buffered bytes).
//!
//! It wakes every period; once no write came for a period it drains what ingest left: every
//! cached internal node down to half its gorge limit (which under cache pressure is a quarter
//! node below the root, so pressure drives it too). Each round runs steps until a step finds
//! nothing worth flushing (at most [`MAX_STEPS_PER_ROUND`]). A step
//! ([`crate::fractal::tree::Tree::clean_step`]) holds the engine's exclusive lock for one buffer flush and
//! hands the lock straight to a waiting writer or reader when it ends, so a write that comes
//! meanwhile waits for at most one step (one buffer's flush with its cascade, possibly waiting
//! for a background leaf flush or a writeback job).
//!
//! While writes come it stays out of the way: the tree has one writer at a time, so a cleaner
//! could only take turns with the state machine's writes, not run beside them, and measured
//! that way (woken by every batch that left the root near or past its limit, acceptance 4's
//! 18.6 M rows with a 64 MiB cache, alternating binaries) it cost 5-10% of insert speed, and one
//! run's peak RSS reached 283 MiB (runs of one binary vary by about 20 MiB, so the RSS cost is
//! not measured well). Flushing beside the writer needs node-level locks (PerconaFT's pair
//! locks), not built (issue 3 in the project's issue tracker).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

pub(crate) use crate::fractal::limits::MAX_STEPS_PER_ROUND;
use parking_lot::{Condvar, Mutex};

/// Default time between rounds when nobody wakes the thread, in milliseconds (PerconaFT's
/// `cleaner_period` default is 1 s).
pub const DEFAULT_CLEANER_PERIOD_MS: u64 = 1_000;

/// What a step reports.
pub(crate) enum Step {
    /// It flushed something: run another step.
    Again,
    /// Nothing worth flushing: sleep until woken.
    Idle,
    /// The engine is poisoned: stop the thread.
    Stop,
}

#[derive(Default)]
pub(crate) struct State {
    pub(crate) wake: bool,
    pub(crate) stop: bool,
}

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    pub(crate) cv: Condvar,
}

/// Handle of the cleaner thread; dropping it stops and joins the thread.
pub(crate) struct Cleaner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) thread: Option<JoinHandle<()>>,
}

impl Cleaner {
    /// Starts the thread, running `step` in rounds every `period_ms` (and when a test wakes it); `None`
    /// when the thread cannot be started (then nothing flushes in the background and writers
    /// flush as before).
    pub(crate) fn start(period_ms: u64, mut step: impl FnMut() -> Step + Send + 'static) -> Option<Cleaner> {
        let shared = Arc::new(Shared {
            state: Mutex::new(State::default()),
            cv: Condvar::new(),
        });
        let theirs = Arc::clone(&shared);
        let period = Duration::from_millis(period_ms.max(1));
        let thread = std::thread::Builder::new()
            .name("ftkv-cleaner".into())
            .spawn(move || loop {
                {
                    let mut st = theirs.state.lock();
                    if !st.wake && !st.stop {
                        theirs.cv.wait_for(&mut st, period);
                    }
                    if st.stop {
                        return;
                    }
                    st.wake = false;
                }
                for _ in 0..MAX_STEPS_PER_ROUND {
                    match step() {
                        Step::Again => {
                            if theirs.state.lock().stop {
                                return;
                            }
                        }
                        Step::Idle => break,
                        Step::Stop => return,
                    }
                }
            })
            .ok()?;
        Some(Cleaner {
            shared,
            thread: Some(thread),
        })
    }

    /// Asks for a round now (cheap: a mutex and a notify); tests use it to skip the wait.
    #[cfg(test)]
    pub(crate) fn wake(&self) {
        let mut st = self.shared.state.lock();
        if !st.wake {
            st.wake = true;
            self.shared.cv.notify_one();
        }
    }
}

impl Drop for Cleaner {
    /// Stops the thread after its current step and joins it.
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
