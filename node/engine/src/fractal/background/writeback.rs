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

use std::time::Instant;

use super::worker::Worker;
use crate::fractal::store::{WritebackDone, WritebackJob, WritebackStats};
use crate::Result;

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
    /// Spilled runs the writer handed over, encoded and written by the background thread.
    pub runs_written: u64,
    /// Times the writer waited for a running job (back-pressure).
    pub writer_waits: u64,
    /// Time the writer spent waiting, in microseconds.
    pub writer_wait_us: u64,
}

/// The writeback thread and whether it runs a job.
pub(crate) struct Writeback {
    pub(crate) worker: Worker<WritebackJob, Result<WritebackDone>>,
    pub(crate) running: bool,
    pub(crate) totals: WritebackTotals,
}

impl Writeback {
    /// Starts the thread; `None` when it cannot be started (writes then stay inline).
    pub(crate) fn start() -> Option<Writeback> {
        let worker = Worker::start("ftkv-writeback", WritebackJob::run)?;
        Some(Writeback {
            worker,
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
        self.worker.submit(job)?;
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
            let r = self.worker.recv();
            self.totals.writer_waits += 1;
            self.totals.writer_wait_us += started.elapsed().as_micros() as u64;
            r
        } else {
            match self.worker.try_recv() {
                Ok(None) => return None,
                Ok(Some(r)) => Ok(r),
                Err(e) => Err(e),
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
        self.totals.runs_written += s.runs_written;
    }
}
