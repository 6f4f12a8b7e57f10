//! One background thread fed through a job channel, with a result channel back to the writer:
//! the shape both [`super::writeback`] and [`super::leaf_flusher`] use. The thread never takes the
//! engine lock; dropping the worker lets a running job finish and joins the thread.

use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::thread::JoinHandle;

use parking_lot::Mutex;

use crate::{EngineError, Result};

/// A named thread running `J -> R` jobs in order.
pub(crate) struct Worker<J, R> {
    pub(crate) name: &'static str,
    pub(crate) jobs: Option<Sender<J>>,
    /// Behind a mutex only so the engine stays `Sync`: the writer alone uses it.
    pub(crate) done: Mutex<Receiver<R>>,
    pub(crate) thread: Option<JoinHandle<()>>,
}

impl<J: Send + 'static, R: Send + 'static> Worker<J, R> {
    /// Starts thread `name` running `run` on each job; `None` when it cannot be started.
    pub(crate) fn start(name: &'static str, run: impl Fn(J) -> R + Send + 'static) -> Option<Self> {
        let (job_tx, job_rx) = channel::<J>();
        let (done_tx, done_rx) = channel();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                for job in job_rx {
                    if done_tx.send(run(job)).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Worker {
            name,
            jobs: Some(job_tx),
            done: Mutex::new(done_rx),
            thread: Some(thread),
        })
    }

    /// Hands `job` to the thread. Errors: `Io` when the thread is gone.
    pub(crate) fn submit(&self, job: J) -> Result<()> {
        match self.jobs.as_ref().map(|tx| tx.send(job)) {
            Some(Ok(())) => Ok(()),
            _ => Err(self.gone()),
        }
    }

    /// A finished job's result, without waiting (`Ok(None)`: none yet). Errors: `Io` when the
    /// thread is gone.
    pub(crate) fn try_recv(&mut self) -> Result<Option<R>> {
        match self.done.get_mut().try_recv() {
            Ok(r) => Ok(Some(r)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(self.gone()),
        }
    }

    /// Waits for the next result. Errors: `Io` when the thread is gone.
    pub(crate) fn recv(&mut self) -> Result<R> {
        self.done.get_mut().recv().map_err(|_| self.gone())
    }

    pub(crate) fn gone(&self) -> EngineError {
        EngineError::Io {
            context: format!("{} thread", self.name),
            source: std::io::Error::other(format!("the {} thread stopped", self.name)),
        }
    }
}

impl<J, R> Drop for Worker<J, R> {
    /// Lets a running job finish (its result is dropped) and joins the thread.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
