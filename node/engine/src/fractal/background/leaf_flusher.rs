//! Background flushing of spilled runs into leaves (PerconaFT's cleaner thread flushes gorged
//! buffers in the background, `ft/ft-flusher.cc`): when a buffer's spilled runs add up to a
//! node and its leaf is not cached, the writer hands the leaf's block and the runs' blocks to
//! this thread, which reads and decompresses them, and applies the messages to the leaf in
//! MSN order; the writer goes on injecting meanwhile. The writer then installs the result
//! ([`super::tree::Tree`]: the runs leave the buffer, anything newer in the buffer is applied on
//! top, the leaf splits, and the new leaves go to the writeback thread to be written and
//! evicted).
//!
//! While a flush is in flight the leaf and the runs stay in the tree unchanged, so readers and
//! checkpoints see the state before it; any other change to that leaf first waits for the
//! flush and installs it. The thread never takes the engine lock and reads only blocks the
//! tree keeps until the install.

use std::collections::VecDeque;

use super::worker::Worker;
pub(crate) use crate::fractal::limits::MAX_IN_FLIGHT;
use crate::fractal::msg::Msg;
use crate::fractal::node::{Leaf, Node, NodeId};
use crate::fractal::store::DetachedBlock;
use crate::{EngineError, Result};

/// One leaf flush to run in the background.
pub(crate) struct LeafFlushJob {
    pub(crate) child: NodeId,
    pub(crate) leaf: DetachedBlock,
    /// The runs, oldest first, with the message count their parent recorded.
    pub(crate) runs: Vec<(u32, DetachedBlock)>,
    pub(crate) basement_size_bytes: usize,
}

/// A finished leaf flush: the leaf with the runs applied (not split yet).
pub(crate) struct LeafFlushDone {
    pub(crate) child: NodeId,
    pub(crate) leaf: Leaf,
}

impl LeafFlushJob {
    pub(crate) fn run(self) -> Result<LeafFlushDone> {
        let mut msgs: Vec<Msg> = Vec::new();
        for (count, run) in &self.runs {
            let m = run.read_run()?;
            if m.len() != *count as usize {
                return Err(EngineError::Corruption {
                    location: format!("run of leaf {} flush", self.child),
                    detail: format!("{} messages, parent says {count}", m.len()),
                });
            }
            msgs.extend(m);
        }
        msgs.sort_by_key(Msg::msn);
        let Node::Leaf(mut leaf) = self.leaf.read_node()? else {
            return Err(EngineError::Corruption {
                location: format!("node {}", self.child),
                detail: "expected a leaf under a node of height 1".into(),
            });
        };
        leaf.apply_batch(msgs);
        leaf.normalize(self.basement_size_bytes);
        Ok(LeafFlushDone {
            child: self.child,
            leaf,
        })
    }
}

/// A flush the writer handed out and has not installed.
pub(crate) struct InFlight {
    pub(crate) child: NodeId,
    /// Ids of the runs it applies (the oldest runs of the child's buffer).
    pub(crate) run_ids: Vec<u64>,
    /// A key in the leaf's range (to find its parent again from the root).
    pub(crate) probe_key: Vec<u8>,
    /// Memory the flush holds (reserved from the cache budget until it is installed).
    pub(crate) reserved_bytes: usize,
}

/// Totals of background leaf flushes since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushTotals {
    /// Flushes handed to the thread.
    pub started: u64,
    /// Flushes installed after the writer went on meanwhile.
    pub installed: u64,
    /// Flushes the writer had to wait for (another change to the same leaf came first).
    pub waited: u64,
}

/// The flusher thread and the flushes in flight (oldest first).
pub(crate) struct Flusher {
    pub(crate) worker: Worker<LeafFlushJob, (NodeId, Result<LeafFlushDone>)>,
    pub(crate) in_flight: VecDeque<InFlight>,
    /// Results received but not installed yet.
    pub(crate) ready: Vec<(NodeId, Result<LeafFlushDone>)>,
    pub(crate) totals: FlushTotals,
}

impl Flusher {
    /// Starts the thread; `None` when it cannot be started (flushes then stay on the writer).
    pub(crate) fn start() -> Option<Flusher> {
        let worker = Worker::start("ftkv-flusher", |job: LeafFlushJob| (job.child, job.run()))?;
        Some(Flusher {
            worker,
            in_flight: VecDeque::new(),
            ready: Vec::new(),
            totals: FlushTotals::default(),
        })
    }

    /// Whether a flush of `child` is in flight.
    pub(crate) fn busy(&self, child: NodeId) -> bool {
        self.in_flight.iter().any(|f| f.child == child)
    }

    /// Whether another flush may start.
    pub(crate) fn has_room(&self) -> bool {
        self.in_flight.len() < MAX_IN_FLIGHT
    }

    /// Hands `job` to the thread. Errors: `Io` when the thread is gone.
    pub(crate) fn submit(&mut self, job: LeafFlushJob, flight: InFlight) -> Result<()> {
        self.worker.submit(job)?;
        self.in_flight.push_back(flight);
        self.totals.started += 1;
        Ok(())
    }

    /// Takes a finished flush (with its record) if there is one, without waiting.
    pub(crate) fn take_finished(&mut self) -> Option<(InFlight, Result<LeafFlushDone>)> {
        while let Ok(Some(r)) = self.worker.try_recv() {
            self.ready.push(r);
        }
        loop {
            let (child, r) = self.ready.pop()?;
            if let Some(pos) = self.in_flight.iter().position(|f| f.child == child) {
                let flight = self.in_flight.remove(pos)?;
                return Some((flight, r));
            }
        }
    }

    /// Waits for the flush of `child` and takes it (its result is `Io` when the thread is
    /// gone); `None` when no flush of `child` is in flight.
    pub(crate) fn wait_for(&mut self, child: NodeId) -> Option<(InFlight, Result<LeafFlushDone>)> {
        let pos = self.in_flight.iter().position(|f| f.child == child)?;
        loop {
            if let Some(k) = self.ready.iter().position(|(c, _)| *c == child) {
                let (_, r) = self.ready.swap_remove(k);
                let flight = self.in_flight.remove(pos)?;
                return Some((flight, r));
            }
            match self.worker.recv() {
                Ok(r) => self.ready.push(r),
                Err(e) => {
                    let flight = self.in_flight.remove(pos)?;
                    return Some((flight, Err(e)));
                }
            }
        }
    }

    /// Waits for every flush in flight and forgets them (the tree is being replaced).
    pub(crate) fn cancel_all(&mut self) {
        while let Some(child) = self.in_flight.front().map(|f| f.child) {
            let _ = self.wait_for(child);
        }
        self.ready.clear();
    }
}
