//! Tree algorithms: message injection at the root, flushing of the heaviest buffer (cascading),
//! splits and merges, reads that apply pending ancestor messages, bulk load, and the integrity
//! walk (PerconaFT `ft/ft-ops.cc`, `ft/ft-flusher.cc`).

use std::collections::HashSet;

use super::background::leaf_flusher::{Flusher, InFlight, LeafFlushDone, LeafFlushJob};
use super::codec::encode_run;
use super::filter::KeyFilter;
use super::limits::len_u32;
use super::msg::{apply_point, apply_range, key_hash, Buffer, Msg, Msn, PointOp, RangeMsg, RangeOp, RunRef};
use super::node::{
    child_bounds, child_index, chunk_entries, split_entries_even, Basement, Internal, Leaf, Node, NodeId,
};

use super::store::{CheckpointJob, InPlacePush, Store};
use crate::{EngineError, IntegrityReport, KeyValue, Result};

pub(crate) use super::options::TreeParams;
pub(crate) use crate::fractal::limits::MAX_RUNS_PER_BUFFER;

/// The cleaner's threshold, in 1/1024ths of a node's gorge limit: once writes pause it drains
/// cached internal nodes to half their limit.
pub(crate) const CLEAN_IDLE_FULLNESS_1024: u64 = 512;
/// Bloom filter bits per key and probes of a spilled run (about 0.1% false positives).
pub(crate) const RUN_FILTER_BITS_PER_KEY: usize = 14;
/// See [`RUN_FILTER_BITS_PER_KEY`].
pub(crate) const RUN_FILTER_PROBES: u8 = 10;

/// Whether a node lies on the left / right edge of the tree (for uneven edge splits).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Edges {
    pub(crate) left: bool,
    pub(crate) right: bool,
}

pub(crate) const ROOT_EDGES: Edges = Edges {
    left: true,
    right: true,
};

pub(crate) const NO_EDGES: Edges = Edges {
    left: false,
    right: false,
};

pub(crate) fn child_edges(e: Edges, i: usize, n: usize) -> Edges {
    Edges {
        left: e.left && i == 0,
        right: e.right && i + 1 == n,
    }
}

pub(crate) fn corrupt(location: impl Into<String>, detail: impl Into<String>) -> EngineError {
    EngineError::Corruption {
        location: location.into(),
        detail: detail.into(),
    }
}

/// Applies one message to the value of `key`.
pub(crate) fn apply_msg_to_value(value: Option<Vec<u8>>, key: &[u8], msg: &Msg) -> Option<Vec<u8>> {
    match msg {
        Msg::Point { op, .. } => apply_point(value, op),
        Msg::Range(r) => {
            if r.covers(key) {
                value.and_then(|v| apply_range(&v, &r.op))
            } else {
                value
            }
        }
    }
}

/// The in-memory state of an open tree.
pub(crate) struct Tree {
    pub(crate) params: TreeParams,
    pub(crate) store: Store,
    pub(crate) root: NodeId,
    pub(crate) next_msn: Msn,
    pub(crate) next_node_id: NodeId,
    pub(crate) meta: Option<Vec<u8>>,
    pub(crate) spill_stats: SpillStats,
    /// Background leaf flushes (`None`: flushes run on the writer).
    pub(crate) flusher: Option<Flusher>,
}

/// Counters of spilled runs since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpillStats {
    /// Runs written by spills (buffers of children that were not cached).
    pub runs_spilled: u64,
    /// Times a buffer's small runs were merged into one (size-tiered compaction).
    pub runs_compacted: u64,
    /// Runs merged into their child (read, applied or pushed down, freed).
    pub runs_merged: u64,
    /// Point messages applied straight to an edge leaf (the sequential-insert fast path).
    pub edge_inserts: u64,
    /// Buffers flushed (or spilled) by the cleaner thread between write batches.
    pub cleaner_flushes: u64,
    /// Runs written straight from the runs of a flush into an internal node, for its children
    /// that were not cached (see [`Tree::hand_down`]); also counted in `runs_spilled`.
    pub runs_handed_down: u64,
}

mod bulk;
mod clean;
mod fetch;
mod flush;
#[cfg(test)]
mod hand_down_tests;
mod inject;
mod integrity;
mod leaf_flush;
mod read;
mod reshape;
mod spill;

pub(crate) use self::fetch::*;
pub(crate) use self::flush::*;
pub(crate) use self::integrity::*;
