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
    pub(crate) cache: HashMap<NodeId, Entry>,
    /// The order in which eviction visits cached nodes.
    pub(crate) ring: ClockRing,
    pub(crate) cached_bytes: usize,
    pub(crate) budget_bytes: usize,
    /// Basements of uncached leaves read for point lookups (at most a quarter of the budget).
    pub(crate) partial: HashMap<NodeId, PartialLeaf>,
    /// Internal nodes read partially for point lookups (same quarter of the budget).
    pub(crate) partial_internal: HashMap<NodeId, PartialInternal>,
    pub(crate) partial_bytes: usize,
    /// Memory held outside the cache by background leaf flushes in flight (their leaves and
    /// runs, decoded): taken from the budget, so the process stays within it.
    pub(crate) reserved_bytes: usize,
    /// Share of the budget kept free for background work (decoded leaves and runs of a flush
    /// in flight, nodes a writeback job holds and copies of them, encode buffers); the cache
    /// is evicted to the budget minus this (or minus what flushes reserve, if more).
    pub(crate) background_share_bytes: usize,
    /// Bytes of dirty cached nodes (written ahead of checkpoints to keep them short).
    pub(crate) dirty_bytes: usize,
    /// Partial reads done so far (see [`PartialReadStats`]).
    pub(crate) partial_stats: PartialReadStats,
    pub(crate) eviction_stats: EvictionStats,
    /// Frame indexes of spilled runs read by lookups (at most [`RUN_INDEX_CACHE_SHARE`] of the
    /// budget) and the run read counters.
    pub(crate) run_indexes: Mutex<RunIndexCache>,
    /// Leaf lookups answered from frame tables alone (see [`PartialReadStats`]).
    pub(crate) leaf_reads_avoided: std::sync::atomic::AtomicU64,
    /// Count of [`Store::write_some_dirty`] calls (one per write batch): the clock by which the
    /// incremental writer tells recently modified nodes from idle ones.
    pub(crate) write_epoch: u64,
    /// A background writer adopts what [`Store::begin_writeback`] hands out (set by the engine);
    /// otherwise [`Store::write_and_evict_soon`] writes inline.
    pub(crate) background_writes: bool,
    /// Spilled runs the writer handed to the writeback thread to encode and write: readable
    /// from memory (sorted by (key, MSN)) until a written block is adopted. A checkpoint writes
    /// those still pending itself.
    pub(crate) pending_runs: HashMap<u64, Arc<Vec<Msg>>>,
    /// Counted bytes of the pending runs' messages (part of [`Store::memory_bytes`]).
    pub(crate) pending_run_bytes: usize,
    /// Pending runs no writeback job has taken yet.
    pub(crate) runs_not_handed_over: usize,
    /// Dirty nodes to write and evict with the next writeback (leaves a flush of spilled runs
    /// just rewrote), oldest first.
    pub(crate) write_soon: Vec<NodeId>,
    /// Bytes of cached entries marked `evicting` (dirty victims the writeback thread writes
    /// before they are dropped); within the background share, beside `reserved_bytes`.
    pub(crate) evicting_bytes: usize,
    /// Set while a full disk keeps dirty data in memory (module `no_space`).
    pub(crate) space_hold: Option<SpaceHold>,
}

mod block_io;
mod cachetable;
pub(crate) mod checkpoint;
mod clock_ring;
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
pub(crate) use self::checkpoint::*;
pub(crate) use self::clock_ring::ClockRing;
pub(crate) use self::no_space::*;
pub(crate) use self::partial_cache::*;
pub(crate) use self::partial_leaf::*;
pub(crate) use self::runs::*;
pub(crate) use self::stats::*;
pub(crate) use self::writeback_job::*;
