//! The block layer and the cachetable: one file of copy-on-write node blocks addressed through a
//! block translation table (BTT), two alternating headers, a free-extent allocator, and a
//! CLOCK-evicted node cache with a byte budget (PerconaFT `ft/serialize/block_table.cc`,
//! `ft/cachetable/cachetable.cc`).
//!
//! Space rules (module `space`): a block referenced by one of the last two durable checkpoints
//! or by the checkpoint being written is never overwritten; blocks written and superseded
//! between two checkpoints are reused at once. Free space at the end of the file is cut off with
//! `set_len` at each commit, so a steady overwrite workload reuses space instead of growing the
//! file.
//!
//! Checkpoints do not stop the world (PerconaFT's "checkpoint pending" clones,
//! `ft/cachetable/checkpoint.cc`): [`Store::begin_checkpoint`] takes a reference to every dirty
//! node (nodes are shared `Arc`s; a writer that modifies one while the checkpoint holds it
//! copies it first) and a copy of the BTT; [`CheckpointJob::run`] encodes, writes and syncs them
//! and the new BTT and header without the engine lock; [`Store::finish_checkpoint`] adopts the
//! written blocks of nodes nobody changed meanwhile.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use ftkv_vfs::VfsFile;

use super::codec::{
    decode_basement_frame, decode_buffer_frame, decode_internal_info, decode_leaf_info, decode_leaf_skeleton,
    decode_node, decode_node_index, decode_partition, decode_run_frames, decode_run_index, decode_run_range,
    encode_btt, encode_header, encode_node, encode_run, lookup_in_frame, node_block_sizes, node_header_len,
    recycle_block_buf, run_index_len, take_block_buf, BasementFrames, BlockLoc, BttImage, Header,
    InternalInfo, LeafInfo, NodeIndex, PartEntry, RunIndex, DATA_START, HEADER_SLOT_BYTES,
    NODE_FIXED_HEADER_BYTES, NODE_MAGIC, RUN_FIXED_HEADER_BYTES,
};

use super::limits::len_u32;
use super::msg::{count_at_or_below, key_cmp, key_prefix, Msg, Msn};
use super::node::{child_index, Basement, Node, NodeId};
use super::space::Space;
pub(crate) use crate::fractal::limits::MAX_CHECKPOINT_LANES;
use crate::{EngineError, Result};

/// Write batches a dirty node must stay unmodified before the incremental writer takes it.
pub(crate) const IDLE_EPOCHS: u64 = 8;

/// Share of the cache budget the run frame indexes may take (1/N).
pub(crate) const RUN_INDEX_CACHE_SHARE: usize = 32;

/// CLOCK count given to a node when it is loaded or touched, and its maximum.
pub(crate) const CLOCK_MAX: u8 = 3;
/// The tree file, its BTT and the node cache.
pub(crate) struct Store {
    pub(crate) file: Arc<dyn VfsFile>,
    pub(crate) path: PathBuf,
    /// `path` for [`BlockName`]s (shared, so naming a block copies no path).
    pub(crate) name_path: Arc<Path>,
    /// Doorkeeper of the side cache's decoded basement frames (see [`FrameDoorkeeper`]).
    pub(crate) frame_doorkeeper: FrameDoorkeeper,
    /// Basement frames read from uncached leaves, and their stored bytes (counted by readers
    /// under the shared lock too).
    pub(crate) frame_reads: AtomicU64,
    pub(crate) frame_read_bytes: AtomicU64,
    /// Of `frame_reads`, those read under the shared lock.
    pub(crate) frames_shared: AtomicU64,
    pub(crate) compression_level: Option<i32>,
    /// Current node map (durable entries plus blocks written since the last checkpoint).
    pub(crate) btt: HashMap<NodeId, BlockLoc>,
    /// Free extents and the checkpoints' claims on blocks; shared with a checkpoint in progress.
    pub(crate) space: Arc<Mutex<Space>>,
    /// Bytes of the node blocks written, before and after compression; shared with the jobs.
    pub(crate) block_bytes: Arc<BlockBytes>,
    /// Counter of the last durable checkpoint.
    pub(crate) counter: u64,
    /// A checkpoint has begun and not finished.
    pub(crate) checkpoint_running: bool,
    /// The cached nodes, eviction's CLOCK ring and the budget's accounting.
    pub(crate) cachetable: Cachetable,
    /// Basements of uncached leaves read for point lookups (at most a quarter of the budget).
    pub(crate) partial: HashMap<NodeId, PartialLeaf>,
    /// Internal nodes read partially for point lookups (same quarter of the budget).
    pub(crate) partial_internal: HashMap<NodeId, PartialInternal>,
    pub(crate) partial_bytes: usize,
    /// Partial reads done so far (see [`PartialReadStats`]).
    pub(crate) partial_stats: PartialReadStats,
    /// Frame indexes of spilled runs read by lookups (at most [`RUN_INDEX_CACHE_SHARE`] of the
    /// budget) and the run read counters.
    pub(crate) run_indexes: Mutex<RunIndexCache>,
    /// Leaf lookups answered from frame tables alone (see [`PartialReadStats`]).
    pub(crate) leaf_reads_avoided: std::sync::atomic::AtomicU64,
    /// Spilled runs the writer handed to the writeback thread to encode and write: readable
    /// from memory (sorted by (key, MSN)) until a written block is adopted. A checkpoint writes
    /// those still pending itself.
    pub(crate) pending_runs: HashMap<u64, Arc<Vec<Msg>>>,
    /// Counted bytes of the pending runs' messages (part of [`Store::memory_bytes`]).
    pub(crate) pending_run_bytes: usize,
    /// Pending runs no writeback job has taken yet.
    pub(crate) runs_not_handed_over: usize,
    /// Set while a full disk keeps dirty data in memory (module `no_space`).
    pub(crate) space_hold: Option<SpaceHold>,
}

impl Store {
    /// A store over `file` whose durable state is `image` at `btt_loc` (`None` for a file that
    /// has no checkpoint yet).
    pub(crate) fn new(
        file: Arc<dyn VfsFile>,
        path: PathBuf,
        compression_level: Option<i32>,
        budget_bytes: usize,
        image: Option<(&BttImage, BlockLoc)>,
        previous: Option<(&BttImage, BlockLoc)>,
    ) -> Self {
        let live: Vec<(u64, u64)> = image
            .map(|(img, _)| {
                img.entries
                    .iter()
                    .map(|(_, l)| (l.offset, l.alloc_bytes()))
                    .collect()
            })
            .unwrap_or_default();
        let claims = |c: Option<(&BttImage, BlockLoc)>| -> Vec<(u64, u64)> {
            c.map(|(img, loc)| {
                img.entries
                    .iter()
                    .map(|(_, l)| (l.offset, l.alloc_bytes()))
                    .chain(std::iter::once((loc.offset, loc.alloc_bytes())))
                    .collect()
            })
            .unwrap_or_default()
        };
        let space = Space::new(&live, &claims(image), &claims(previous));
        Store {
            file,
            name_path: Arc::from(path.as_path()),
            frame_doorkeeper: FrameDoorkeeper::new(),
            frame_reads: AtomicU64::new(0),
            frame_read_bytes: AtomicU64::new(0),
            frames_shared: AtomicU64::new(0),
            path,
            compression_level,
            btt: image
                .map(|(img, _)| img.entries.iter().copied().collect())
                .unwrap_or_default(),
            space: Arc::new(Mutex::new(space)),
            block_bytes: Arc::default(),
            counter: image.map_or(0, |(img, _)| img.counter),
            checkpoint_running: false,
            cachetable: Cachetable::new(budget_bytes),
            partial: HashMap::new(),
            partial_internal: HashMap::new(),
            partial_bytes: 0,
            partial_stats: PartialReadStats::default(),
            run_indexes: Mutex::new(RunIndexCache::default()),
            leaf_reads_avoided: std::sync::atomic::AtomicU64::new(0),
            pending_runs: HashMap::new(),
            pending_run_bytes: 0,
            runs_not_handed_over: 0,
            space_hold: None,
        }
    }

    /// Path of the tree file (for error messages).
    pub(crate) fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Bytes of the tree file.
    pub(crate) fn file_len(&self) -> Result<u64> {
        self.file.len().map_err(io_err("tree file length"))
    }

    /// Node ids with a block in the current BTT.
    pub(crate) fn btt_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.btt.keys().copied()
    }

    /// Node ids in the cache.
    pub(crate) fn cached_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.cachetable.ids()
    }

    /// Bytes of cached nodes.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.cachetable.cached_bytes()
    }

    /// Bytes of dirty cached nodes.
    pub(crate) fn dirty_bytes(&self) -> usize {
        self.cachetable.dirty_bytes()
    }

    /// Evictions since open.
    pub(crate) fn eviction_stats(&self) -> EvictionStats {
        self.cachetable.eviction_stats()
    }

    /// Partial reads done since open.
    pub(crate) fn partial_stats(&self) -> PartialReadStats {
        let runs = self.run_indexes.lock();
        PartialReadStats {
            run_frame_reads: runs.frame_reads,
            run_frames: runs.frames,
            run_whole_reads: runs.whole_reads,
            run_bytes: runs.read_bytes,
            leaf_reads_avoided: self.leaf_reads_avoided.load(Ordering::Relaxed),
            frames: self.frame_reads.load(Ordering::Relaxed),
            frames_shared: self.frames_shared.load(Ordering::Relaxed),
            basement_bytes: self.partial_stats.basement_bytes + self.frame_read_bytes.load(Ordering::Relaxed),
            ..self.partial_stats
        }
    }

    /// The parts of [`Store::memory_bytes`], for diagnostics.
    pub(crate) fn memory_use(&self) -> MemoryUse {
        let ct = &self.cachetable;
        MemoryUse {
            budget_bytes: ct.budget_bytes(),
            cached_bytes: ct.cached_bytes(),
            dirty_bytes: ct.dirty_bytes(),
            side_cache_bytes: self.partial_bytes,
            pending_run_bytes: self.pending_run_bytes,
            reserved_bytes: ct.reserved_bytes(),
            background_share_bytes: ct.background_share_bytes(),
            evicting_bytes: ct.evicting_bytes(),
        }
    }

    /// Memory the engine holds against its budget: cached nodes, the side cache of partial
    /// reads, pending spilled runs, and background work (flushes in flight and eviction victims
    /// queued for the writeback thread, or the share kept for them if that is more).
    pub(crate) fn memory_bytes(&self) -> usize {
        self.cachetable.held_bytes()
            + self.partial_bytes
            + self.pending_run_bytes
            + self.cachetable.background_bytes()
    }

    /// Bytes background flushes in flight hold (reserved from the budget).
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.cachetable.reserved_bytes()
    }

    /// Memory budget in bytes.
    pub(crate) fn budget_bytes(&self) -> usize {
        self.cachetable.budget_bytes()
    }

    /// Memory a background job holds outside the cache (see [`Cachetable::reserve`]).
    pub(crate) fn reserve(&mut self, add: usize, sub: usize) {
        self.cachetable.reserve(add, sub);
    }

    /// Keeps `bytes` of the budget free for background threads (see
    /// [`Cachetable::set_background_share`]).
    pub(crate) fn set_background_share(&mut self, bytes: usize) {
        self.cachetable.set_background_share(bytes);
    }

    /// Whether the cache is under pressure: the engine's memory ([`Store::memory_bytes`], which
    /// counts the share kept for background work) over three quarters of the budget. With
    /// background threads (a share of a quarter), cached nodes alone never get there, since
    /// eviction keeps them under the budget less that share. Comparing them alone left every
    /// internal node at a whole node's size beyond memory, too many to stay cached: each was
    /// evicted dirty and read back whole, a third of the writer's time (measured 390K -> 508K
    /// rows/s at 20 M rows in 256 MiB).
    pub(crate) fn under_pressure(&self) -> bool {
        self.memory_bytes() > self.budget_bytes() / 4 * 3
    }

    /// Checks the cachetable's byte counters against its entries, and that allocated blocks,
    /// pending blocks and free extents never overlap and lie in the block area; returns a
    /// description of the first violation.
    pub(crate) fn check_space(&self) -> std::result::Result<(), String> {
        self.cachetable.check_counters()?;
        let mut spans: Vec<(u64, u64, String)> = Vec::new();
        for (id, l) in &self.btt {
            spans.push((l.offset, l.alloc_bytes(), format!("node {id}")));
        }
        let space = self.space.lock();
        for (o, l, what) in space.spans() {
            spans.push((o, l, what.to_string()));
        }
        let end = space.end();
        drop(space);
        spans.sort_by_key(|s| s.0);
        let mut prev_end = DATA_START;
        let mut prev_name = "headers".to_string();
        for (o, l, name) in spans {
            if o < prev_end {
                return Err(format!("{name} at {o} overlaps {prev_name} ending at {prev_end}"));
            }
            if o + l > end {
                return Err(format!("{name} at {o}+{l} beyond allocated end {end}"));
            }
            prev_end = o + l;
            prev_name = name;
        }
        Ok(())
    }
}

mod block_io;
mod cache_io;
mod cachetable;
pub(crate) mod checkpoint;
mod no_space;
mod partial_cache;
mod partial_internal;
mod partial_leaf;
mod runs;
pub(crate) mod stats;
#[cfg(test)]
mod tests;
mod writeback_job;

pub(crate) use self::block_io::*;
pub(crate) use self::cachetable::Cachetable;
pub(crate) use self::checkpoint::*;
pub(crate) use self::no_space::*;
pub(crate) use self::partial_cache::*;
pub(crate) use self::partial_leaf::*;
pub(crate) use self::runs::*;
pub(crate) use self::stats::*;
pub(crate) use self::writeback_job::*;
