//! The background writer: one thread that encodes (compresses) and writes idle dirty nodes
//! beside the writer, so the thread applying writes spends its time in the tree and a second
//! core does the zstd work (PerconaFT writes dirty cachetable pairs on background threads,
//! `ft/cachetable/cachetable.cc`; InnoDB's page cleaner does the same for dirty pages).
//!
//! The writer owns the exchange: after each write batch it adopts a finished job, starts the
//! next when dirty nodes exceed the limit, and waits for the running job (back-pressure) only
//! when dirty nodes keep growing past twice the limit or the cache is well over budget. The
//! thread never takes the engine lock: jobs carry `Arc` references to the nodes, and adoption
//! ([`super::store::Store::finish_writeback`]) runs on the writer under its lock. When the thread
//! cannot be started the writer writes the same nodes inline.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

use parking_lot::Mutex;

use super::store::{WritebackDone, WritebackJob, WritebackStats};
use crate::{EngineError, Result};

/// Totals of background writeback since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WritebackTotals {
    /// Jobs run.
    pub jobs: u64,
    /// Nodes encoded and written by the background thread.
    pub nodes_written: u64,
    /// Bytes it wrote.
    pub bytes_written: u64,
    /// Of those, bytes of leaves.
    pub leaf_bytes_written: u64,
    /// Written nodes the live tree adopted (the rest were modified or written otherwise
    /// meanwhile and their blocks released).
    pub adopted: u64,
    /// Times the writer waited for a running job (back-pressure).
    pub writer_waits: u64,
    /// Time the writer spent waiting, in microseconds.
    pub writer_wait_us: u64,
}

/// The writeback thread and its two channels.
pub(crate) struct Writeback {
    jobs: Option<Sender<WritebackJob>>,
    /// Behind a mutex only so the engine stays `Sync`: the writer alone uses it.
    done: Mutex<Receiver<Result<WritebackDone>>>,
    thread: Option<JoinHandle<()>>,
    running: bool,
    pub(crate) totals: WritebackTotals,
}

impl Writeback {
    /// Starts the thread; `None` when it cannot be started (writes then stay inline).
    pub(crate) fn start() -> Option<Writeback> {
        let (job_tx, job_rx) = channel::<WritebackJob>();
        let (done_tx, done_rx) = channel();
        let thread = std::thread::Builder::new()
            .name("ftkv-writeback".into())
            .spawn(move || {
                for job in job_rx {
                    if done_tx.send(job.run()).is_err() {
                        break;
                    }
                }
            })
            .ok()?;
        Some(Writeback {
            jobs: Some(job_tx),
            done: Mutex::new(done_rx),
            thread: Some(thread),
            running: false,
            totals: WritebackTotals::default(),
        })
    }

    /// Whether a job is running.
    pub(crate) fn running(&self) -> bool {
        self.running
    }

    /// Hands `job` to the thread. Errors: `Io` when the thread is gone.
    pub(crate) fn submit(&mut self, job: WritebackJob) -> Result<()> {
        debug_assert!(!self.running, "one writeback job at a time");
        let sent = self.jobs.as_ref().is_some_and(|tx| tx.send(job).is_ok());
        if !sent {
            return Err(gone());
        }
        self.running = true;
        Ok(())
    }

    /// The running job's result if it has finished (`wait`: waits for it). `None` when no job
    /// runs or (without `wait`) it has not finished.
    pub(crate) fn poll(&mut self, wait: bool) -> Option<Result<WritebackDone>> {
        if !self.running {
            return None;
        }
        let r = if wait {
            let started = Instant::now();
            let r = self.done.get_mut().recv().map_err(|_| gone());
            self.totals.writer_waits += 1;
            self.totals.writer_wait_us += started.elapsed().as_micros() as u64;
            r
        } else {
            match self.done.get_mut().try_recv() {
                Ok(r) => Ok(r),
                Err(std::sync::mpsc::TryRecvError::Empty) => return None,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => Err(gone()),
            }
        };
        self.running = false;
        Some(r.and_then(|r| r))
    }

    /// Adds a finished job's figures to the totals.
    pub(crate) fn count(&mut self, s: WritebackStats) {
        self.totals.jobs += 1;
        self.totals.nodes_written += s.nodes_written;
        self.totals.bytes_written += s.bytes_written;
        self.totals.leaf_bytes_written += s.leaf_bytes_written;
        self.totals.adopted += s.adopted;
    }
}

fn gone() -> EngineError {
    EngineError::Io {
        context: "writeback thread".into(),
        source: std::io::Error::other("the writeback thread stopped"),
    }
}

impl Drop for Writeback {
    /// Lets a running job finish (its blocks are simply never adopted) and joins the thread.
    fn drop(&mut self) {
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
