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
    decode_basement_frame, decode_basement_partition, decode_buffer_frame, decode_buffer_partition,
    decode_internal_info, decode_leaf_info, decode_leaf_skeleton, decode_node, decode_node_index,
    decode_partition, decode_run_frames, decode_run_index, decode_run_range, encode_btt, encode_header,
    encode_node, encode_run, lookup_in_frame, node_header_len, recycle_block_buf, run_index_len,
    take_block_buf, BasementFrames, BlockLoc, BttImage, Header, InternalInfo, LeafInfo, NodeIndex, PartEntry,
    RunIndex, DATA_START, HEADER_SLOT_BYTES, NODE_FIXED_HEADER_BYTES, NODE_MAGIC, RUN_FIXED_HEADER_BYTES,
};
use super::msg::{count_at_or_below, key_cmp, key_prefix, Buffer, Msg, Msn};
use super::node::{child_index, Basement, Node, NodeId};
use super::space::Space;
use crate::{EngineError, Result};

/// Threads a checkpoint encodes its nodes on, at most.
const MAX_CHECKPOINT_LANES: usize = 4;

/// Write batches a dirty node must stay unmodified before the incremental writer takes it.
const IDLE_EPOCHS: u64 = 8;

/// Share of the cache budget the run frame indexes may take (1/N).
const RUN_INDEX_CACHE_SHARE: usize = 32;

/// CLOCK count given to a node when it is loaded or touched, and its maximum.
const CLOCK_MAX: u8 = 3;

struct Entry {
    /// Shared with a checkpoint in progress while it writes this node (then copied on take).
    node: Arc<Node>,
    dirty: bool,
    /// CLOCK count; atomic so readers under a shared lock can mark use.
    clock: AtomicU8,
    bytes: usize,
    /// [`Store::write_epoch`] when the node was last put (modified).
    modified_epoch: u64,
    /// An eviction victim queued for the writeback thread (in `write_soon`): evicted once its
    /// written block is adopted, and not counted against the cache's target meanwhile (its
    /// bytes are in [`Store::evicting_bytes`]). A modified node is a new entry without it.
    evicting: bool,
}

/// What the engine counts against its memory budget (`engine.cache_size`), in bytes, as
/// estimated from the structures' sizes (not measured from the allocator).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MemoryUse {
    /// The budget.
    pub budget_bytes: usize,
    /// Nodes in the cachetable (dirty ones included).
    pub cached_bytes: usize,
    /// Of those, dirty nodes.
    pub dirty_bytes: usize,
    /// The side cache of partial reads (skeletons, partition 0 of internal nodes, frames).
    pub side_cache_bytes: usize,
    /// Spilled runs waiting for the writeback thread.
    pub pending_run_bytes: usize,
    /// Held by background leaf flushes in flight.
    pub reserved_bytes: usize,
    /// Left free for background work (flushes in flight, writeback copies, eviction victims
    /// queued for the writeback thread).
    pub background_share_bytes: usize,
    /// Cached dirty nodes evicted once the writeback thread has written them (counted in
    /// `cached_bytes` and, against the budget, in the background share).
    pub evicting_bytes: usize,
}

/// Pieces of a leaf read without the rest of it (partial eviction's read side): its pivots and
/// some basements, valid while the BTT still points at `loc`.
struct PartialLeaf {
    loc: BlockLoc,
    index: NodeIndex,
    pivots: Vec<Vec<u8>>,
    /// [`key_prefix`] of each pivot, for [`PartialLeaf::spot`].
    pivot_prefixes: Vec<u64>,
    /// Frame tables per basement (format 3; `None`: basements are read whole).
    frames: Option<Vec<BasementFrames>>,
    /// Decoded pieces by (basement, frame): one frame, or the whole basement (frame 0) before
    /// format 3.
    basements: HashMap<(usize, usize), Basement>,
    bytes: usize,
}

/// Where a key's entry lives in a partial leaf: its basement and frame, or `Absent` (with the
/// basement's applied MSN) when the frame table shows the basement cannot hold it or a newer
/// message overrides whatever it holds.
enum LeafSpot {
    Piece(usize, usize),
    Absent(Msn),
}

impl PartialLeaf {
    fn spot(&self, key: &[u8], overriding: Option<Msn>) -> LeafSpot {
        let bi = count_at_or_below(&self.pivot_prefixes, key, |i| {
            self.pivots.get(i).is_some_and(|p| key_cmp(p, key).is_le())
        });
        debug_assert_eq!(bi, child_index(&self.pivots, key));
        match self.frames.as_ref().and_then(|f| f.get(bi)) {
            Some(bf) if overriding.is_some_and(|m| m > bf.max_msn) => LeafSpot::Absent(bf.max_msn),
            Some(bf) => match bf.frame_for(key) {
                Some(fi) => LeafSpot::Piece(bi, fi),
                None => LeafSpot::Absent(bf.max_msn),
            },
            None => LeafSpot::Piece(bi, 0),
        }
    }
}

/// Pieces of an internal node read without the rest of it: partition 0 (pivots, children,
/// per-child key filters) and the buffers point reads needed, valid while the BTT still points
/// at `loc`.
struct PartialInternal {
    loc: BlockLoc,
    index: NodeIndex,
    info: InternalInfo,
    /// Whole buffers by child (blocks before format 4).
    buffers: HashMap<usize, Buffer>,
    /// Decoded buffer frames by (child, frame) (format 4): point messages in (key, MSN) order.
    frames: HashMap<(usize, usize), Vec<Msg>>,
    bytes: usize,
}

/// A leaf block's partition table and partition 0 (pivots, frame tables), parsed when the
/// block is written or read whole: when the cache evicts the (clean) leaf, this stays in the
/// side cache of partial reads, so the leaf's basements leave memory but a later point read
/// reads one frame, not the header and partition 0 first (PerconaFT's partial eviction keeps
/// an evicted leaf's pivots in memory likewise).
pub struct LeafSkeleton {
    index: NodeIndex,
    info: LeafInfo,
}

/// Parses the skeleton of the encoded block `enc` of node `id` (`None` for internal nodes and
/// leaves before format 3). The block was just encoded or verified, so a parse failure is a
/// bug; it is reported in debug builds and costs only the skeleton otherwise.
fn leaf_skeleton(enc: &[u8], id: NodeId) -> Option<LeafSkeleton> {
    match decode_leaf_skeleton(enc, id, "encoded leaf") {
        Ok(sk) => sk.map(|(index, info)| LeafSkeleton { index, info }),
        Err(e) => {
            debug_assert!(false, "skeleton of node {id}: {e}");
            None
        }
    }
}

/// What a point read needs from a partial internal node's buffer on the key's path.
enum BufferNeed {
    /// Nothing beyond partition 0 (the filter rules the key out, or no frame can hold it).
    Nothing,
    /// The whole buffer partition (before format 4).
    Whole,
    /// One frame of the buffer partition (format 4).
    Frame(usize),
}

/// The tree file, its BTT and the node cache.
pub struct Store {
    file: Arc<dyn VfsFile>,
    path: PathBuf,
    /// `path` for [`BlockName`]s (shared, so naming a block copies no path).
    name_path: Arc<Path>,
    /// Doorkeeper of the side cache's decoded basement frames (see [`FrameDoorkeeper`]).
    frame_doorkeeper: FrameDoorkeeper,
    /// Basement frames read from uncached leaves, and their stored bytes (counted by readers
    /// under the shared lock too).
    frame_reads: AtomicU64,
    frame_read_bytes: AtomicU64,
    /// Of `frame_reads`, those read under the shared lock.
    frames_shared: AtomicU64,
    compression_level: Option<i32>,
    /// Current node map (durable entries plus blocks written since the last checkpoint).
    btt: HashMap<NodeId, BlockLoc>,
    /// Free extents and the checkpoints' claims on blocks; shared with a checkpoint in progress.
    space: Arc<Mutex<Space>>,
    /// Counter of the last durable checkpoint.
    counter: u64,
    /// A checkpoint has begun and not finished.
    checkpoint_running: bool,
    cache: HashMap<NodeId, Entry>,
    ring: Vec<NodeId>,
    ring_members: HashSet<NodeId>,
    hand: usize,
    cached_bytes: usize,
    budget_bytes: usize,
    /// Basements of uncached leaves read for point lookups (at most a quarter of the budget).
    partial: HashMap<NodeId, PartialLeaf>,
    /// Internal nodes read partially for point lookups (same quarter of the budget).
    partial_internal: HashMap<NodeId, PartialInternal>,
    partial_bytes: usize,
    /// Memory held outside the cache by background leaf flushes in flight (their leaves and
    /// runs, decoded): taken from the budget, so the process stays within it.
    reserved_bytes: usize,
    /// Share of the budget kept free for background work (decoded leaves and runs of a flush
    /// in flight, nodes a writeback job holds and copies of them, encode buffers); the cache
    /// is evicted to the budget minus this (or minus what flushes reserve, if more).
    background_share_bytes: usize,
    /// Bytes of dirty cached nodes (written ahead of checkpoints to keep them short).
    dirty_bytes: usize,
    /// Partial reads done so far (see [`PartialReadStats`]).
    partial_stats: PartialReadStats,
    eviction_stats: EvictionStats,
    /// Frame indexes of spilled runs read by lookups (at most [`RUN_INDEX_CACHE_SHARE`] of the
    /// budget) and the run read counters.
    run_indexes: Mutex<RunIndexCache>,
    /// Leaf lookups answered from frame tables alone (see [`PartialReadStats`]).
    leaf_reads_avoided: std::sync::atomic::AtomicU64,
    /// Count of [`Store::write_some_dirty`] calls (one per write batch): the clock by which the
    /// incremental writer tells recently modified nodes from idle ones.
    write_epoch: u64,
    /// A background writer adopts what [`Store::begin_writeback`] hands out (set by the engine);
    /// otherwise [`Store::write_and_evict_soon`] writes inline.
    background_writes: bool,
    /// Spilled runs the writer handed to the writeback thread to encode and write: readable
    /// from memory (sorted by (key, MSN)) until a written block is adopted. A checkpoint writes
    /// those still pending itself.
    pending_runs: HashMap<u64, Arc<Vec<Msg>>>,
    /// Counted bytes of the pending runs' messages (part of [`Store::memory_bytes`]).
    pending_run_bytes: usize,
    /// Pending runs no writeback job has taken yet.
    runs_not_handed_over: usize,
    /// Dirty nodes to write and evict with the next writeback (leaves a flush of spilled runs
    /// just rewrote), oldest first.
    write_soon: Vec<NodeId>,
    /// Bytes of cached entries marked `evicting` (dirty victims the writeback thread writes
    /// before they are dropped); within the background share, beside `reserved_bytes`.
    evicting_bytes: usize,
}

/// What [`Store::push_in_place`] did.
pub enum InPlacePush {
    /// The message is in the node, which stays within the limit.
    Done,
    /// The message is in the node, which is now over the limit (flush it).
    Gorged,
    /// The node could not take it in place: the message, for the take-and-put path.
    NotHere(Msg),
}

/// Counters of cachetable eviction since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EvictionStats {
    /// Clean nodes dropped from the cache.
    pub clean: u64,
    /// Dirty leaves the evicting thread encoded and wrote itself.
    pub inline_leaves: u64,
    /// Dirty internal nodes the evicting thread encoded and wrote itself.
    pub inline_internal: u64,
    /// Bytes (counted node sizes) of those inline writes.
    pub inline_bytes: u64,
    /// Dirty victims handed to the writeback thread instead (evicted once written).
    pub handed_to_writeback: u64,
}

/// Counters of partial (one-partition) reads by point lookups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PartialReadStats {
    /// Whole basements read from leaves that were not cached (leaves written before format 3).
    pub basements: u64,
    /// Single basement frames read from leaves that were not cached (format 3).
    pub frames: u64,
    /// Of `frames`, those read by readers under the engine's shared lock (the frame table was
    /// cached and the frame was not kept: [`Store::read_frame_value_shared`]).
    pub frames_shared: u64,
    /// Leaf lookups answered from a frame table alone: the key sorts before the basement's
    /// first frame, or a pending Put/Delete newer than the basement overrides it.
    pub leaf_reads_avoided: u64,
    /// Partition 0 (pivots, children, key filters) of internal nodes that were not cached.
    pub internal_infos: u64,
    /// Buffers of uncached internal nodes read because the key filter let the key through.
    pub internal_buffers: u64,
    /// Spilled-run reads of a key range that read only the frames that can hold it.
    pub run_frame_reads: u64,
    /// Frames those reads decompressed.
    pub run_frames: u64,
    /// Spilled runs read whole (merges, compactions, integrity checks, full scans).
    pub run_whole_reads: u64,
    /// Partition 0 (pivots, frame tables) of leaves that were not cached.
    pub leaf_infos: u64,
    /// Bytes read from disk for internal nodes' partition 0 (with their headers).
    pub internal_info_bytes: u64,
    /// Bytes read from disk for internal nodes' buffer partitions.
    pub internal_buffer_bytes: u64,
    /// Bytes read from disk for leaves' partition 0 (with their headers).
    pub leaf_info_bytes: u64,
    /// Bytes read from disk for single basement frames and whole basements.
    pub basement_bytes: u64,
    /// Bytes read from disk for spilled runs: frame indexes and frames (not whole reads).
    pub run_bytes: u64,
}

/// Frame indexes of spilled runs, shared by readers under the engine's shared lock. Runs are
/// immutable and their ids never reused, so an entry is never stale.
#[derive(Default)]
struct RunIndexCache {
    map: HashMap<u64, Arc<RunIndex>>,
    bytes: usize,
    frame_reads: u64,
    frames: u64,
    whole_reads: u64,
    read_bytes: u64,
}

/// The data partition of a node that holds `key` (child or basement `i` is partition `i + 1`).
fn data_partition(
    index: &NodeIndex,
    pivots: &[Vec<u8>],
    key: &[u8],
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<(usize, PartEntry)> {
    let i = child_index(pivots, key);
    Ok((i, partition_of(index, i, location)?))
}

/// Data partition of child or basement `i` (partition `i + 1`). Errors: `Corruption` naming
/// `location` when the node has no such partition.
fn partition_of(
    index: &NodeIndex,
    i: usize,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<PartEntry> {
    index
        .parts
        .get(i + 1)
        .copied()
        .ok_or_else(|| EngineError::Corruption {
            location: location.to_string(),
            detail: format!("no partition for child or basement {i}"),
        })
}

/// Reads `len` bytes at `offset` of `file` into a (reused) block buffer. Errors: `Corruption`
/// naming `location` when the file ends first, `Io` otherwise.
/// Admission to the side cache for decoded basement frames: a frame is kept only when it is
/// read a second time while its first read is still remembered here (direct-mapped, one slot
/// per hash; the doorkeeper of TinyLFU, Einziger et al., ACM ToS 2017, in its simplest form).
/// Point reads spread over more data than memory rarely read a frame twice: a decoded frame
/// kept on every read only displaced the page cache (which holds the same data compressed,
/// about half the size) and fragmented the heap, while a hot frame still gets in on its
/// second read.
struct FrameDoorkeeper {
    slots: Box<[AtomicU64]>,
}

impl FrameDoorkeeper {
    /// Frames remembered (64 KiB of slots).
    const SLOTS: usize = 8192;

    fn new() -> Self {
        FrameDoorkeeper {
            slots: (0..Self::SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// Whether frame `fi` of basement `bi` of the block at `offset` was seen recently; remembers
    /// it when it was not.
    /// Readers under the shared lock race on slots; a lost update only delays an admission.
    fn admit(&self, offset: u64, bi: usize, fi: usize) -> bool {
        let mut id = [0u8; 24];
        id[..8].copy_from_slice(&offset.to_le_bytes());
        id[8..16].copy_from_slice(&(bi as u64).to_le_bytes());
        id[16..].copy_from_slice(&(fi as u64).to_le_bytes());
        let h = xxhash_rust::xxh3::xxh3_64(&id).max(1);
        let slot = (h % Self::SLOTS as u64) as usize;
        match self.slots.get(slot) {
            Some(s) if s.load(Ordering::Relaxed) == h => true,
            Some(s) => {
                s.store(h, Ordering::Relaxed);
                false
            }
            None => false,
        }
    }
}

/// A block named in error messages (`<file> node 7 block @ offset 8192 (4096 bytes)`), formatted
/// only when an error is built: a point read beyond memory names two or three blocks and
/// formatting the names was 3% of its CPU time.
#[derive(Clone)]
struct BlockName {
    path: Arc<Path>,
    /// `node` or `run`.
    kind: &'static str,
    id: u64,
    loc: BlockLoc,
}

impl std::fmt::Display for BlockName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} {} {} block @ offset {} ({} bytes)",
            self.path.display(),
            self.kind,
            self.id,
            self.loc.offset,
            self.loc.size
        )
    }
}

fn read_at(
    file: &dyn VfsFile,
    offset: u64,
    len: u64,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<u8>> {
    let mut buf = take_block_buf(len as usize);
    buf.resize(len as usize, 0);
    file.read_exact_at(&mut buf, offset)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::UnexpectedEof => EngineError::Corruption {
                location: location.to_string(),
                detail: "block past end of file".into(),
            },
            _ => EngineError::Io {
                context: format!("read {location}"),
                source,
            },
        })?;
    Ok(buf)
}

fn bump(clock: &AtomicU8) {
    let c = clock.load(Ordering::Relaxed);
    if c < CLOCK_MAX {
        clock.store(c + 1, Ordering::Relaxed);
    }
}

fn io_err(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EngineError {
    let context = context.into();
    move |source| EngineError::Io { context, source }
}

impl Store {
    /// A store over `file` whose durable state is `image` at `btt_loc` (`None` for a file that
    /// has no checkpoint yet).
    pub fn new(
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
            counter: image.map_or(0, |(img, _)| img.counter),
            checkpoint_running: false,
            cache: HashMap::new(),
            ring: Vec::new(),
            ring_members: HashSet::new(),
            hand: 0,
            cached_bytes: 0,
            budget_bytes,
            partial: HashMap::new(),
            partial_internal: HashMap::new(),
            partial_bytes: 0,
            reserved_bytes: 0,
            background_share_bytes: 0,
            dirty_bytes: 0,
            partial_stats: PartialReadStats::default(),
            eviction_stats: EvictionStats::default(),
            run_indexes: Mutex::new(RunIndexCache::default()),
            leaf_reads_avoided: std::sync::atomic::AtomicU64::new(0),
            write_epoch: 0,
            background_writes: false,
            pending_runs: HashMap::new(),
            pending_run_bytes: 0,
            runs_not_handed_over: 0,
            write_soon: Vec::new(),
            evicting_bytes: 0,
        }
    }

    /// Counter of the last durable checkpoint.
    pub fn counter(&self) -> u64 {
        self.counter
    }

    /// Path of the tree file (for error messages).
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Bytes of the tree file.
    pub fn file_len(&self) -> Result<u64> {
        self.file.len().map_err(io_err("tree file length"))
    }

    /// Node ids with a block in the current BTT.
    pub fn btt_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.btt.keys().copied()
    }

    /// Node ids in the cache.
    pub fn cached_ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.cache.keys().copied()
    }

    /// Bytes of cached nodes.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// Evictions since open.
    pub fn eviction_stats(&self) -> EvictionStats {
        self.eviction_stats
    }

    /// Partial reads done since open.
    pub fn partial_stats(&self) -> PartialReadStats {
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
    pub fn memory_use(&self) -> MemoryUse {
        MemoryUse {
            budget_bytes: self.budget_bytes,
            cached_bytes: self.cached_bytes,
            dirty_bytes: self.dirty_bytes,
            side_cache_bytes: self.partial_bytes,
            pending_run_bytes: self.pending_run_bytes,
            reserved_bytes: self.reserved_bytes,
            background_share_bytes: self.background_share_bytes,
            evicting_bytes: self.evicting_bytes,
        }
    }

    /// Memory the engine holds against its budget: cached nodes, the side cache of partial
    /// reads, pending spilled runs, and background work (flushes in flight and eviction victims
    /// queued for the writeback thread, or the share kept for them if that is more).
    pub fn memory_bytes(&self) -> usize {
        (self.cached_bytes - self.evicting_bytes)
            + self.partial_bytes
            + self.pending_run_bytes
            + self.background_bytes()
    }

    /// What background work holds against the budget: flushes in flight and eviction victims
    /// queued for the writeback thread, or the share kept free for them if that is more.
    fn background_bytes(&self) -> usize {
        (self.reserved_bytes + self.evicting_bytes).max(self.background_share_bytes)
    }

    /// Hands spilled run `id` (point messages sorted by (key, MSN), `bytes` their counted size)
    /// to the writeback thread when there is one and fewer than an eighth of the budget's worth
    /// of runs are pending; returns the messages back when the caller must write the run itself.
    pub fn try_defer_run(&mut self, id: u64, msgs: Vec<Msg>, bytes: usize) -> Option<Vec<Msg>> {
        if !self.background_writes || self.pending_run_bytes + bytes > self.budget_bytes / 8 {
            return Some(msgs);
        }
        debug_assert!(!self.btt.contains_key(&id) && !self.pending_runs.contains_key(&id));
        self.pending_runs.insert(id, Arc::new(msgs));
        self.pending_run_bytes += bytes;
        self.runs_not_handed_over += 1;
        None
    }

    /// Whether pending runs or eviction victims wait for a writeback job to take them.
    pub fn runs_to_hand_over(&self) -> bool {
        self.runs_not_handed_over > 0 || self.evicting_bytes > 0 && !self.write_soon.is_empty()
    }

    /// The pending runs, for a job that writes them (they stay pending, and readable, until it
    /// is adopted).
    fn take_pending_for_job(&mut self) -> Vec<(u64, Arc<Vec<Msg>>)> {
        self.runs_not_handed_over = 0;
        self.pending_runs
            .iter()
            .map(|(id, m)| (*id, Arc::clone(m)))
            .collect()
    }

    /// Ids of spilled runs not written yet (see [`Store::try_defer_run`]).
    pub fn pending_run_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.pending_runs.keys().copied()
    }

    /// Drops pending run `id`; returns whether it was pending.
    fn forget_pending_run(&mut self, id: u64) -> bool {
        match self.pending_runs.remove(&id) {
            Some(m) => {
                self.pending_run_bytes -= m.iter().map(Msg::size_bytes).sum::<usize>();
                true
            }
            None => false,
        }
    }

    /// Bytes background flushes in flight hold (reserved from the budget).
    pub fn reserved_bytes(&self) -> usize {
        self.reserved_bytes
    }

    /// Cache budget in bytes.
    pub fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Checks that allocated blocks, pending blocks and free extents never overlap and lie in
    /// the block area; returns a description of the first violation.
    pub fn check_space(&self) -> std::result::Result<(), String> {
        let cached: usize = self.cache.values().map(|e| e.bytes).sum();
        let dirty: usize = self.cache.values().filter(|e| e.dirty).map(|e| e.bytes).sum();
        let evicting: usize = self.cache.values().filter(|e| e.evicting).map(|e| e.bytes).sum();
        if (cached, dirty, evicting) != (self.cached_bytes, self.dirty_bytes, self.evicting_bytes) {
            return Err(format!(
                "cache counters (cached {}, dirty {}, evicting {}) != recomputed ({cached}, {dirty}, {evicting})",
                self.cached_bytes, self.dirty_bytes, self.evicting_bytes
            ));
        }
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

    // --------------------------------------------------------------------------------------
    // Allocation
    // --------------------------------------------------------------------------------------

    fn release(&mut self, loc: BlockLoc) {
        self.space.lock().release(loc.offset, loc.alloc_bytes());
    }

    // --------------------------------------------------------------------------------------
    // Block I/O
    // --------------------------------------------------------------------------------------

    fn location(&self, id: NodeId, loc: &BlockLoc) -> BlockName {
        BlockName {
            path: self.name_path.clone(),
            kind: "node",
            id,
            loc: *loc,
        }
    }

    /// Reads and verifies node `id` from disk.
    pub fn read_node(&self, id: NodeId) -> Result<Node> {
        self.detached(id)?.read_node()
    }

    /// Block `id` as the BTT has it now, to read later without the store (a background job:
    /// the caller keeps the block in the tree until the job ends).
    ///
    /// Errors: `Corruption` when `id` has no BTT entry.
    pub fn detached(&self, id: u64) -> Result<DetachedBlock> {
        if let Some(msgs) = self.pending_runs.get(&id) {
            return Ok(DetachedBlock {
                file: Arc::clone(&self.file),
                path: self.path.clone(),
                id,
                loc: BlockLoc::default(),
                pending: Some(Arc::clone(msgs)),
            });
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("block {id} is referenced but has no BTT entry"),
        })?;
        Ok(DetachedBlock {
            file: Arc::clone(&self.file),
            path: self.path.clone(),
            id,
            loc,
            pending: None,
        })
    }

    /// Writes `node` to a fresh block (copy-on-write) and points the BTT at it.
    pub fn write_node(&mut self, id: NodeId, node: &Node) -> Result<()> {
        let enc = encode_node(id, node, self.compression_level)?;
        self.write_encoded(id, enc)
    }

    /// Writes an encoded node block to a fresh extent and points the BTT at it.
    fn write_encoded(&mut self, id: NodeId, enc: Vec<u8>) -> Result<()> {
        let size = u32::try_from(enc.len())
            .map_err(|_| EngineError::InvalidArgument(format!("node {id} encodes to {} bytes", enc.len())))?;
        let offset = self.space.lock().alloc(enc.len() as u64);
        let loc = BlockLoc {
            offset,
            size,
            crc: crc32c::crc32c(&enc),
        };
        if let Err(source) = self.file.write_all_at(&enc, offset) {
            self.space.lock().unalloc(offset, loc.alloc_bytes());
            return Err(EngineError::Io {
                context: format!("write node {id} @ {offset}"),
                source,
            });
        }
        let sk = if enc.starts_with(NODE_MAGIC) {
            leaf_skeleton(&enc, id)
        } else {
            None
        };
        recycle_block_buf(enc);
        if let Some(old) = self.btt.insert(id, loc) {
            self.release(old);
        }
        self.keep_skeleton(id, loc, sk);
        Ok(())
    }

    /// Writes spilled run `id` (an encoded run block, [`super::codec::encode_run`]) to a fresh
    /// extent and registers it in the BTT.
    pub fn write_run(&mut self, id: u64, enc: Vec<u8>) -> Result<()> {
        self.write_encoded(id, enc)
    }

    /// Compression level for new blocks.
    pub fn compression_level(&self) -> Option<i32> {
        self.compression_level
    }

    /// Reads and verifies spilled run `id`: its messages sorted by (key, MSN). Needs no cache,
    /// so readers under a shared lock can call it.
    pub fn read_run(&self, id: u64) -> Result<Vec<Msg>> {
        self.read_run_range(id, &[], None)
    }

    /// Reads and verifies spilled run `id`, materializing only the messages in `[lo, hi)`.
    fn read_run_range(&self, id: u64, lo: &[u8], hi: Option<&[u8]>) -> Result<Vec<Msg>> {
        if let Some(msgs) = self.pending_runs.get(&id) {
            let at = msgs.partition_point(|m| m.key_or_start() < lo);
            return Ok(msgs[at..]
                .iter()
                .take_while(|m| hi.is_none_or(|h| m.key_or_start() < h))
                .cloned()
                .collect());
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("run {id} is referenced but has no block"),
        })?;
        let location = BlockName {
            path: self.name_path.clone(),
            kind: "run",
            id,
            loc,
        };
        let index = if lo.is_empty() && hi.is_none() {
            None
        } else {
            Some(self.run_index(id, &loc, &location)?)
        };
        // A format-2 run is one frame without a crc of its own: it is read whole, like a whole
        // run, so the BTT crc of the block checks it.
        let Some(index) = index.filter(|ix| ix.version >= 3) else {
            // Whole run: one read, checked against the BTT crc of the whole block.
            self.run_indexes.lock().whole_reads += 1;
            let buf = self.read_span(id, &loc, 0, u64::from(loc.size))?;
            let crc = crc32c::crc32c(&buf);
            if crc != loc.crc {
                return Err(EngineError::Corruption {
                    location: location.to_string(),
                    detail: format!("crc32c mismatch (BTT {:#010x}, block {crc:#010x})", loc.crc),
                });
            }
            let msgs = decode_run_range(&buf, id, &location, lo, hi);
            recycle_block_buf(buf);
            return msgs;
        };
        // A key range: the frame index (cached), then only the frames that can hold the range,
        // each checked against its own crc in the index.
        let frames = index.frames_for(lo, hi);
        let mut out = Vec::new();
        let (Some(first), Some(last)) = (
            index.frames.get(frames.start),
            index.frames.get(frames.end.wrapping_sub(1)),
        ) else {
            return Ok(out);
        };
        let span_end = last.offset + u64::from(last.stored_len);
        let data = self.read_span(id, &loc, first.offset, span_end - first.offset)?;
        {
            let mut runs = self.run_indexes.lock();
            runs.frame_reads += 1;
            runs.frames += frames.len() as u64;
            runs.read_bytes += data.len() as u64;
        }
        decode_run_frames(&data, &index, frames, lo, hi, &location, &mut out)?;
        Ok(out)
    }

    /// The frame index of run `id` at `loc`, from the cache or read (fixed header, then index).
    fn run_index(
        &self,
        id: u64,
        loc: &BlockLoc,
        location: &(impl std::fmt::Display + ?Sized),
    ) -> Result<Arc<RunIndex>> {
        if let Some(ix) = self.run_indexes.lock().map.get(&id) {
            return Ok(Arc::clone(ix));
        }
        let fixed_len = (RUN_FIXED_HEADER_BYTES as u64).min(u64::from(loc.size));
        let fixed = self.read_span(id, loc, 0, fixed_len)?;
        let index_len = run_index_len(&fixed, id, location)? as u64;
        let mut head = fixed;
        if index_len > 0 {
            // Only the index follows; the fixed header is already here.
            head.extend(self.read_span(id, loc, RUN_FIXED_HEADER_BYTES as u64, index_len)?);
        }
        let index = Arc::new(decode_run_index(&head, u64::from(loc.size), id, location)?);
        let cap = self.budget_bytes / RUN_INDEX_CACHE_SHARE;
        let mut runs = self.run_indexes.lock();
        runs.read_bytes += head.len() as u64;
        // Another reader may have cached it meanwhile: count each entry once.
        if let Some(old) = runs.map.insert(id, Arc::clone(&index)) {
            runs.bytes -= old.size_bytes();
        }
        runs.bytes += index.size_bytes();
        if runs.bytes > cap {
            // Drop entries (in map order) down to three quarters of the share.
            let victims: Vec<u64> = runs.map.keys().copied().filter(|k| *k != id).collect();
            for k in victims {
                if runs.bytes <= cap / 4 * 3 {
                    break;
                }
                if let Some(ix) = runs.map.remove(&k) {
                    runs.bytes -= ix.size_bytes();
                }
            }
        }
        Ok(index)
    }

    /// Writes a node straight to disk without caching it (bulk load).
    pub fn write_uncached(&mut self, id: NodeId, node: &Node) -> Result<()> {
        self.write_node(id, node)
    }

    // --------------------------------------------------------------------------------------
    // Cache
    // --------------------------------------------------------------------------------------

    fn touch_ring(&mut self, id: NodeId) {
        if self.ring_members.insert(id) {
            self.ring.push(id);
        }
    }

    /// The node `id`, loaded from disk if not cached.
    pub fn get(&mut self, id: NodeId) -> Result<&Node> {
        if !self.cache.contains_key(&id) {
            let block = self.detached(id)?;
            let (node, sk) = block.read_node_and_skeleton()?;
            self.insert(id, node, false, 1);
            self.keep_skeleton(id, block.loc, sk);
        }
        match self.cache.get_mut(&id) {
            Some(e) => {
                bump(&e.clock);
                Ok(&*e.node)
            }
            None => Err(EngineError::Corruption {
                location: format!("{} cache", self.path.display()),
                detail: format!("node {id} vanished from the cache"),
            }),
        }
    }

    /// Whether node `id` is in the cache.
    pub fn is_cached(&self, id: NodeId) -> bool {
        self.cache.contains_key(&id)
    }

    /// Value of `key` in uncached leaf `id` from already-read basements, with the basement's
    /// applied MSN; `None` when that basement has not been read (or the leaf moved).
    pub fn partial_value(
        &self,
        id: NodeId,
        key: &[u8],
        overriding: Option<Msn>,
    ) -> Option<(Option<Vec<u8>>, Msn)> {
        let p = self.partial.get(&id)?;
        if self.btt.get(&id) != Some(&p.loc) {
            return None;
        }
        match p.spot(key, overriding) {
            LeafSpot::Absent(msn) => {
                self.leaf_reads_avoided.fetch_add(1, Ordering::Relaxed);
                Some((None, msn))
            }
            LeafSpot::Piece(bi, fi) => {
                let b = p.basements.get(&(bi, fi))?;
                Some((b.get(key).map(<[u8]>::to_vec), b.max_msn))
            }
        }
    }

    fn read_span(&self, id: NodeId, loc: &BlockLoc, off: u64, len: u64) -> Result<Vec<u8>> {
        let location = self.location(id, loc);
        if off + len > u64::from(loc.size) {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: format!("span {off}+{len} outside block"),
            });
        }
        read_at(&*self.file, loc.offset + off, len, &location)
    }

    fn read_partition(&self, id: NodeId, loc: &BlockLoc, e: &PartEntry, compressed: bool) -> Result<Vec<u8>> {
        let data = self.read_span(id, loc, u64::from(e.offset), u64::from(e.len))?;
        decode_partition(&data, e, compressed, &self.location(id, loc))
    }

    /// Reads the one basement of uncached leaf `id` that holds `key` (header, pivots and that
    /// partition only; each verified by its crc32c) and returns the key's value and the
    /// basement's applied MSN. The pieces are kept in a small side cache.
    pub fn read_partial_value(
        &mut self,
        id: NodeId,
        key: &[u8],
        overriding: Option<Msn>,
    ) -> Result<(Option<Vec<u8>>, Msn)> {
        if let Some(v) = self.partial_value(id, key, overriding) {
            return Ok(v);
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("node {id} is referenced but has no block"),
        })?;
        let location = self.location(id, &loc);
        if self.partial.get(&id).is_none_or(|p| p.loc != loc) {
            if let Some(old) = self.partial.remove(&id) {
                self.partial_bytes -= old.bytes;
            }
            let index = self.read_index(id, &loc)?;
            if index.height != 0 || index.parts.len() < 2 {
                return Err(EngineError::Corruption {
                    location: location.to_string(),
                    detail: "expected a leaf".into(),
                });
            }
            let p0 = index.parts[0];
            let raw = self.read_partition(id, &loc, &p0, index.compressed)?;
            let info = decode_leaf_info(&raw, index.parts.len() - 1, index.version, &location)?;
            self.partial_stats.leaf_infos += 1;
            self.partial_stats.leaf_info_bytes += u64::from(p0.len) + index.parts.len() as u64 * 16;
            self.insert_partial_leaf(id, loc, LeafSkeleton { index, info });
        }
        let Some(p) = self.partial.get(&id) else {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: "partial leaf vanished".into(),
            });
        };
        let (bi, fi) = match p.spot(key, overriding) {
            LeafSpot::Absent(msn) => {
                self.leaf_reads_avoided.fetch_add(1, Ordering::Relaxed);
                return Ok((None, msn));
            }
            LeafSpot::Piece(bi, fi) => (bi, fi),
        };
        // Basement `bi` (from `spot`).
        let entry = partition_of(&p.index, bi, &location)?;
        let b = match p.frames.as_ref().and_then(|f| f.get(bi)) {
            Some(_) if !self.frame_doorkeeper.admit(loc.offset, bi, fi) => {
                // Not kept: look the key up in the frame as read (the skeleton may be new).
                let result = self.lookup_frame(id, p, bi, fi, key)?;
                self.trim_partial(id);
                return Ok(result);
            }
            Some(bf) => {
                // Format 3: one frame, checked against its crc in the (verified) frame table.
                let data = self.read_frame(id, p, bi, fi)?;
                let b = decode_basement_frame(&data, bf, fi, p.index.compressed, &location)?;
                self.frame_reads.fetch_add(1, Ordering::Relaxed);
                self.frame_read_bytes
                    .fetch_add(data.len() as u64, Ordering::Relaxed);
                recycle_block_buf(data);
                b
            }
            None => {
                let compressed = p.index.compressed;
                let raw = self.read_partition(id, &loc, &entry, compressed)?;
                let b = decode_basement_partition(&raw, &location)?;
                self.partial_stats.basements += 1;
                self.partial_stats.basement_bytes += u64::from(entry.len);
                b
            }
        };
        let result = (b.get(key).map(<[u8]>::to_vec), b.max_msn);
        let size = b.size_bytes();
        if let Some(p) = self.partial.get_mut(&id) {
            p.bytes += size;
            p.basements.insert((bi, fi), b);
            self.partial_bytes += size;
        }
        self.trim_partial(id);
        Ok(result)
    }

    /// For a point read under the engine's shared lock: the value of `key` in uncached leaf `id`
    /// and the basement's applied MSN, from the frame table in the side cache and the one frame
    /// that can hold the key, read from the file and not kept ([`FrameDoorkeeper`]). Point reads
    /// beyond memory then need neither the exclusive lock nor a second descent, and run their
    /// reads side by side. `None` when this needs the exclusive path
    /// ([`Store::read_partial_value`]): no frame table cached for the leaf's current block, a
    /// leaf written before format 3, or a frame the doorkeeper admits to the side cache.
    /// Errors: `Io`, or `Corruption` naming the block.
    pub fn read_frame_value_shared(
        &self,
        id: NodeId,
        key: &[u8],
        overriding: Option<Msn>,
    ) -> Result<Option<(Option<Vec<u8>>, Msn)>> {
        let Some(p) = self.partial.get(&id) else {
            return Ok(None);
        };
        if self.btt.get(&id) != Some(&p.loc) {
            return Ok(None);
        }
        let (bi, fi) = match p.spot(key, overriding) {
            LeafSpot::Absent(msn) => {
                self.leaf_reads_avoided.fetch_add(1, Ordering::Relaxed);
                return Ok(Some((None, msn)));
            }
            LeafSpot::Piece(bi, fi) => (bi, fi),
        };
        if p.frames.as_ref().and_then(|f| f.get(bi)).is_none()
            || p.basements.contains_key(&(bi, fi))
            || self.frame_doorkeeper.admit(p.loc.offset, bi, fi)
        {
            return Ok(None);
        }
        let result = self.lookup_frame(id, p, bi, fi, key)?;
        self.frames_shared.fetch_add(1, Ordering::Relaxed);
        Ok(Some(result))
    }

    /// Reads frame `fi` of basement `bi` of partial leaf `p` (leaf `id`, format 3) and looks
    /// `key` up in it without decoding the frame into a [`Basement`]: the value and the
    /// basement's applied MSN.
    fn lookup_frame(
        &self,
        id: NodeId,
        p: &PartialLeaf,
        bi: usize,
        fi: usize,
        key: &[u8],
    ) -> Result<(Option<Vec<u8>>, Msn)> {
        let location = self.location(id, &p.loc);
        let Some(bf) = p.frames.as_ref().and_then(|f| f.get(bi)) else {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: format!("basement {bi} has no frame table"),
            });
        };
        let data = self.read_frame(id, p, bi, fi)?;
        let v = lookup_in_frame(&data, bf, fi, p.index.compressed, key, &location)?;
        self.frame_reads.fetch_add(1, Ordering::Relaxed);
        self.frame_read_bytes
            .fetch_add(data.len() as u64, Ordering::Relaxed);
        recycle_block_buf(data);
        Ok((v, bf.max_msn))
    }

    /// The stored bytes of frame `fi` of basement `bi` of partial leaf `p` (leaf `id`, format
    /// 3), after checking that the frame table has it within the basement's partition (the
    /// frame's own crc is checked by its decoder).
    fn read_frame(&self, id: NodeId, p: &PartialLeaf, bi: usize, fi: usize) -> Result<Vec<u8>> {
        let corrupt = |detail: String| EngineError::Corruption {
            location: self.location(id, &p.loc).to_string(),
            detail,
        };
        let entry = partition_of(&p.index, bi, &self.location(id, &p.loc))?;
        let f = p
            .frames
            .as_ref()
            .and_then(|t| t.get(bi))
            .and_then(|bf| bf.frames.get(fi))
            .ok_or_else(|| corrupt(format!("basement {bi} has no frame {fi}")))?;
        if u64::from(f.offset) + u64::from(f.stored_len) > u64::from(entry.len) {
            return Err(corrupt(format!(
                "frame {fi} of basement {bi} beyond its partition"
            )));
        }
        self.read_span(
            id,
            &p.loc,
            u64::from(entry.offset) + u64::from(f.offset),
            u64::from(f.stored_len),
        )
    }

    /// Puts leaf `id`'s skeleton for its block at `loc` into the side cache of partial reads,
    /// replacing what it held for `id`.
    fn insert_partial_leaf(&mut self, id: NodeId, loc: BlockLoc, sk: LeafSkeleton) {
        let LeafSkeleton { index, info } = sk;
        let bytes = info.pivots.iter().map(|p| p.len() + 24).sum::<usize>()
            + index.parts.len() * 16
            + info
                .frames
                .iter()
                .flatten()
                .map(BasementFrames::size_bytes)
                .sum::<usize>();
        if let Some(old) = self.partial.remove(&id) {
            self.partial_bytes -= old.bytes;
        }
        self.partial_bytes += bytes;
        self.partial.insert(
            id,
            PartialLeaf {
                loc,
                index,
                pivot_prefixes: info.pivots.iter().map(|p| key_prefix(p)).collect(),
                pivots: info.pivots,
                frames: info.frames,
                basements: HashMap::new(),
                bytes,
            },
        );
    }

    /// Keeps the skeleton of leaf `id`, whose block now is `loc` (just written or read whole):
    /// partial eviction, see [`LeafSkeleton`].
    fn keep_skeleton(&mut self, id: NodeId, loc: BlockLoc, sk: Option<LeafSkeleton>) {
        if let Some(sk) = sk {
            self.insert_partial_leaf(id, loc, sk);
            self.trim_partial(id);
        }
    }

    /// For a point read of `key` (hash `hash`) through internal node `id` without loading it
    /// whole: appends the messages for the key from the one buffer on its path (skipped when the
    /// stored key filter rules the key out) and returns the child to descend into. Reads the
    /// header, partition 0 and at most that one buffer partition, each verified by its crc32c.
    pub fn read_partial_internal(
        &mut self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        out: &mut Vec<Msg>,
    ) -> Result<NodeId> {
        if let Some(c) = self.partial_internal_probe(id, key, hash, out)? {
            return Ok(c);
        }
        let loc = *self.btt.get(&id).ok_or_else(|| EngineError::Corruption {
            location: format!("{} BTT", self.path.display()),
            detail: format!("node {id} is referenced but has no block"),
        })?;
        let location = self.location(id, &loc);
        if self.partial_internal.get(&id).is_none_or(|p| p.loc != loc) {
            if let Some(old) = self.partial_internal.remove(&id) {
                self.partial_bytes -= old.bytes;
            }
            let index = self.read_index(id, &loc)?;
            if index.height == 0 || index.parts.len() < 2 {
                return Err(EngineError::Corruption {
                    location: location.to_string(),
                    detail: "expected an internal node".into(),
                });
            }
            let p0 = index.parts[0];
            let raw = self.read_partition(id, &loc, &p0, index.compressed)?;
            let info = decode_internal_info(
                &raw,
                index.parts.len() - 1,
                index.version,
                index.compressed,
                &location,
            )?;
            self.partial_stats.internal_infos += 1;
            self.partial_stats.internal_info_bytes += u64::from(p0.len) + index.parts.len() as u64 * 16;
            let bytes = raw.len() + info.tables_size_bytes() + index.parts.len() * 16 + 64;
            self.partial_bytes += bytes;
            self.partial_internal.insert(
                id,
                PartialInternal {
                    loc,
                    index,
                    info,
                    buffers: HashMap::new(),
                    frames: HashMap::new(),
                    bytes,
                },
            );
        }
        if let Some(c) = self.partial_internal_probe(id, key, hash, out)? {
            return Ok(c);
        }
        // The filter says the key may be in the buffer, and that piece has not been read yet.
        let Some(p) = self.partial_internal.get(&id) else {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: "partial node vanished".into(),
            });
        };
        let (i, entry) = data_partition(&p.index, &p.info.pivots, key, &location)?;
        let frame = match p.info.tables.as_ref().and_then(|t| t.get(i)) {
            Some(t) => match t.frame_for(key) {
                Some(fi) => {
                    let f = t.points.frames.get(fi).ok_or_else(|| EngineError::Corruption {
                        location: location.to_string(),
                        detail: format!("buffer {i} has no frame {fi}"),
                    })?;
                    if f.offset + u64::from(f.stored_len) > u64::from(entry.len) {
                        return Err(EngineError::Corruption {
                            location: location.to_string(),
                            detail: format!("frame {fi} of buffer {i} beyond its partition"),
                        });
                    }
                    let data = self.read_span(
                        id,
                        &loc,
                        u64::from(entry.offset) + f.offset,
                        u64::from(f.stored_len),
                    )?;
                    let msgs = decode_buffer_frame(&data, t, fi, &location)?;
                    self.partial_stats.internal_buffer_bytes += data.len() as u64;
                    Some((fi, msgs))
                }
                None => None,
            },
            None => None,
        };
        let compressed = p.index.compressed;
        let framed = p.info.tables.is_some();
        self.partial_stats.internal_buffers += 1;
        if let Some((fi, msgs)) = frame {
            let size = msgs.iter().map(Msg::size_bytes).sum::<usize>() + 64;
            if let Some(p) = self.partial_internal.get_mut(&id) {
                p.bytes += size;
                let old = p.frames.insert((i, fi), msgs);
                debug_assert!(old.is_none(), "frame read twice into the side cache");
                self.partial_bytes += size;
            }
        } else if !framed {
            let raw = self.read_partition(id, &loc, &entry, compressed)?;
            let buffer = decode_buffer_partition(&raw, &location)?;
            self.partial_stats.internal_buffer_bytes += u64::from(entry.len);
            let size = buffer.bytes() + 64;
            if let Some(p) = self.partial_internal.get_mut(&id) {
                p.bytes += size;
                p.buffers.insert(i, buffer);
                self.partial_bytes += size;
            }
        }
        let child = self.partial_internal_probe(id, key, hash, out)?;
        self.trim_partial(id);
        child.ok_or_else(|| EngineError::Corruption {
            location: location.to_string(),
            detail: "partial node lost its buffer".into(),
        })
    }

    /// [`Store::read_partial_internal`] from pieces already read (spilled runs that may hold
    /// the key are read from the file); `None` when a piece is missing.
    pub fn partial_internal_probe(
        &self,
        id: NodeId,
        key: &[u8],
        hash: u64,
        out: &mut Vec<Msg>,
    ) -> Result<Option<NodeId>> {
        let Some(p) = self.partial_internal.get(&id) else {
            return Ok(None);
        };
        if self.btt.get(&id) != Some(&p.loc) {
            return Ok(None);
        }
        let i = child_index(&p.info.pivots, key);
        let (Some(&child), Some(f)) = (p.info.children.get(i), p.info.filters.get(i)) else {
            return Ok(None);
        };
        let table = p.info.tables.as_ref().and_then(|t| t.get(i));
        let need = match table {
            Some(t) if f.keys.may_contain(hash) => {
                t.frame_for(key).map_or(BufferNeed::Nothing, BufferNeed::Frame)
            }
            Some(_) => BufferNeed::Nothing,
            None if f.has_ranges || f.keys.may_contain(hash) => BufferNeed::Whole,
            None => BufferNeed::Nothing,
        };
        let missing = match need {
            BufferNeed::Nothing => false,
            BufferNeed::Whole => !p.buffers.contains_key(&i),
            BufferNeed::Frame(fi) => !p.frames.contains_key(&(i, fi)),
        };
        if missing {
            return Ok(None);
        }
        for r in f.runs.iter().filter(|r| r.may_hold(key, hash)) {
            self.run_msgs_for_key(r.id, key, out)?;
        }
        if let Some(t) = table {
            out.extend(t.ranges.iter().filter(|r| r.covers(key)).cloned().map(Msg::Range));
        }
        match need {
            BufferNeed::Nothing => {}
            BufferNeed::Whole => {
                if let Some(b) = p.buffers.get(&i) {
                    b.collect_for_key(key, hash, out);
                }
            }
            BufferNeed::Frame(fi) => {
                if let Some(msgs) = p.frames.get(&(i, fi)) {
                    let at = msgs.partition_point(|m| m.key_or_start() < key);
                    out.extend(msgs[at..].iter().take_while(|m| m.key_or_start() == key).cloned());
                }
            }
        }
        Ok(Some(child))
    }

    /// Appends the messages for `key` in spilled run `id` (in MSN order).
    pub fn run_msgs_for_key(&self, id: u64, key: &[u8], out: &mut Vec<Msg>) -> Result<()> {
        let mut next = key.to_vec();
        next.push(0);
        out.extend(self.read_run_range(id, key, Some(&next))?);
        Ok(())
    }

    /// Appends the messages of spilled run `id` with keys in `[lo, hi)`.
    pub fn run_msgs_for_range(
        &self,
        id: u64,
        lo: &[u8],
        hi: Option<&[u8]>,
        out: &mut Vec<Msg>,
    ) -> Result<()> {
        out.extend(self.read_run_range(id, lo, hi)?);
        Ok(())
    }

    /// Reads and decodes the header (partition table) of node `id`'s block at `loc`.
    fn read_index(&self, id: NodeId, loc: &BlockLoc) -> Result<NodeIndex> {
        let location = self.location(id, loc);
        let fixed = self.read_span(id, loc, 0, NODE_FIXED_HEADER_BYTES as u64)?;
        let header_len = node_header_len(&fixed, &location)?;
        let header = self.read_span(id, loc, 0, header_len as u64)?;
        decode_node_index(&header, id, &location)
    }

    /// The partial-read side cache's share of the budget: a quarter, or whatever the node
    /// cache and the background share leave free if that is more (a read-only phase after a
    /// load keeps few nodes cached whole; [`Store::evict_to_budget`] takes the room back).
    fn partial_cap_bytes(&self) -> usize {
        let others =
            (self.cached_bytes - self.evicting_bytes) + self.pending_run_bytes + self.background_bytes();
        (self.budget_bytes / 4).max(self.budget_bytes.saturating_sub(others))
    }

    /// Keeps the partial-read side cache under its share ([`Store::partial_cap_bytes`]).
    fn trim_partial(&mut self, keep: NodeId) {
        let cap = self.partial_cap_bytes();
        self.trim_partial_to(cap, keep, true);
    }

    /// Trims the side cache to `cap` bytes, cheapest-to-lose first: decoded basement frames
    /// (one per lookup, rarely read twice), then decoded internal buffers (read when a key
    /// filter lets a key through), then leaves' partition 0 (pivots and frame tables: one per
    /// leaf, serving every later lookup in it), and internal nodes' partition 0 (pivots and
    /// key filters, serving every lookup below them) last. With `margin`, goes down to three
    /// quarters of `cap` once it starts, so trimming is not paid on every lookup.
    fn trim_partial_to(&mut self, cap: usize, keep: NodeId, margin: bool) {
        if self.partial_bytes <= cap {
            return;
        }
        let target = if margin { cap / 4 * 3 } else { cap };
        for (id, p) in self.partial.iter_mut() {
            if self.partial_bytes <= target {
                return;
            }
            if *id == keep {
                continue;
            }
            let freed: usize = p.basements.drain().map(|(_, b)| b.size_bytes()).sum();
            p.bytes -= freed;
            self.partial_bytes -= freed;
        }
        for (id, p) in self.partial_internal.iter_mut() {
            if self.partial_bytes <= target {
                return;
            }
            if *id == keep {
                continue;
            }
            let freed: usize = p.buffers.drain().map(|(_, b)| b.bytes() + 64).sum::<usize>()
                + p.frames
                    .drain()
                    .map(|(_, m)| m.iter().map(Msg::size_bytes).sum::<usize>() + 64)
                    .sum::<usize>();
            p.bytes -= freed;
            self.partial_bytes -= freed;
        }
        let leaves: Vec<NodeId> = self.partial.keys().copied().filter(|k| *k != keep).collect();
        for victim in leaves {
            if self.partial_bytes <= target {
                return;
            }
            if let Some(p) = self.partial.remove(&victim) {
                self.partial_bytes -= p.bytes;
            }
        }
        let internals: Vec<NodeId> = self
            .partial_internal
            .keys()
            .copied()
            .filter(|k| *k != keep)
            .collect();
        for victim in internals {
            if self.partial_bytes <= target {
                return;
            }
            if let Some(p) = self.partial_internal.remove(&victim) {
                self.partial_bytes -= p.bytes;
            }
        }
    }

    /// The cached node `id` without loading (readers under a shared lock); `None` on a miss.
    pub fn peek(&self, id: NodeId) -> Option<&Node> {
        self.cache.get(&id).map(|e| {
            bump(&e.clock);
            &*e.node
        })
    }

    /// Cached node `id` without touching its CLOCK count (for scans of the cache that must not
    /// change what gets evicted).
    pub fn peek_quiet(&self, id: NodeId) -> Option<&Node> {
        self.cache.get(&id).map(|e| &*e.node)
    }

    /// Removes a cache entry, keeping the byte counters exact.
    fn remove_entry(&mut self, id: NodeId) -> Option<Entry> {
        let e = self.cache.remove(&id)?;
        self.cached_bytes -= e.bytes;
        if e.dirty {
            self.dirty_bytes -= e.bytes;
        }
        if e.evicting {
            self.evicting_bytes -= e.bytes;
        }
        Some(e)
    }

    fn insert(&mut self, id: NodeId, node: Node, dirty: bool, clock: u8) {
        self.remove_entry(id);
        let bytes = node.size_bytes();
        self.cached_bytes += bytes;
        if dirty {
            self.dirty_bytes += bytes;
        }
        if let Some(old) = self.cache.insert(
            id,
            Entry {
                node: Arc::new(node),
                dirty,
                clock: AtomicU8::new(clock),
                bytes,
                modified_epoch: self.write_epoch,
                evicting: false,
            },
        ) {
            self.cached_bytes -= old.bytes;
        }
        self.touch_ring(id);
    }

    /// Removes node `id` from the cache (loading it if needed) for modification; returns it and
    /// whether it was dirty. Put it back with [`Store::put`].
    pub fn take(&mut self, id: NodeId) -> Result<Node> {
        match self.remove_entry(id) {
            // Copied only when a checkpoint in progress still holds it.
            Some(e) => Ok(Arc::unwrap_or_clone(e.node)),
            None => self.read_node(id),
        }
    }

    /// Puts a (modified) node into the cache as dirty. Internal nodes (touched by every flush
    /// through them) start at the highest CLOCK count, leaves at one: under pressure leaves go
    /// first.
    pub fn put(&mut self, id: NodeId, node: Node) {
        let clock = if node.height() > 0 { CLOCK_MAX } else { 1 };
        self.insert(id, node, true, clock);
    }

    /// Pushes `msg` into the buffers of cached internal node `id` where it sits in the cache
    /// (no take and put: the root takes every message), marking it modified as
    /// [`Store::put`] would. `NotHere` (the message back) when the node is not cached, is a
    /// leaf, has one child, or is shared with a checkpoint or writeback job in progress;
    /// `Gorged` when the message is in and the node is now over `limit_bytes`.
    pub fn push_in_place(&mut self, id: NodeId, msg: Msg, limit_bytes: usize) -> InPlacePush {
        let Some(e) = self.cache.get_mut(&id) else {
            return InPlacePush::NotHere(msg);
        };
        let Some(Node::Internal(n)) = Arc::get_mut(&mut e.node) else {
            return InPlacePush::NotHere(msg);
        };
        if n.children.len() < 2 {
            return InPlacePush::NotHere(msg);
        }
        n.push_msg(msg);
        let bytes = n.size_bytes();
        // The entry's counters, as remove_entry and insert would leave them.
        self.cached_bytes = self.cached_bytes - e.bytes + bytes;
        if e.dirty {
            self.dirty_bytes -= e.bytes;
        }
        if e.evicting {
            self.evicting_bytes -= e.bytes;
            e.evicting = false;
        }
        e.dirty = true;
        self.dirty_bytes += bytes;
        e.bytes = bytes;
        e.modified_epoch = self.write_epoch;
        *e.clock.get_mut() = CLOCK_MAX;
        if bytes > limit_bytes {
            InPlacePush::Gorged
        } else {
            InPlacePush::Done
        }
    }

    /// Whether the cache is under pressure: the engine's memory ([`Store::memory_bytes`], which
    /// counts the share kept for background work) over three quarters of the budget. With
    /// background threads (a share of a quarter), cached nodes alone never get there, since
    /// eviction keeps them under the budget less that share. Comparing them alone left every
    /// internal node at a whole node's size beyond memory, too many to stay cached: each was
    /// evicted dirty and read back whole, a third of the writer's time (measured 390K -> 508K
    /// rows/s at 20 M rows in 256 MiB).
    pub fn under_pressure(&self) -> bool {
        self.memory_bytes() > self.budget_bytes / 4 * 3
    }

    /// Forgets node `id` (merged away): drops it from the cache and frees its block.
    pub fn delete(&mut self, id: NodeId) {
        if let Some(p) = self.partial.remove(&id) {
            self.partial_bytes -= p.bytes;
        }
        if let Some(p) = self.partial_internal.remove(&id) {
            self.partial_bytes -= p.bytes;
        }
        self.remove_entry(id);
        self.forget_pending_run(id);
        let mut runs = self.run_indexes.lock();
        if let Some(ix) = runs.map.remove(&id) {
            runs.bytes -= ix.size_bytes();
        }
        drop(runs);
        if let Some(loc) = self.btt.remove(&id) {
            self.release(loc);
        }
    }

    /// Evicts nodes with CLOCK until the cache fits its budget. Clean victims go first; a dirty
    /// one is taken only after the hand passed a ring's length of dirty victims, and then
    /// queued for the writeback thread (evicted once written, counted in the background share)
    /// or, when that share is full or there is no thread, written here (copy-on-write); the
    /// writeback thread writes dirty nodes on the other core (clean-first measured on the
    /// 10 M-row beyond-memory load: 409,663 and 384,526 rows/s against 386,082 and 320,596 when
    /// every dirty victim was written inline, together with [`super::msg::key_cmp`]). `pinned`
    /// (the root) is never evicted. Errors: `Io` from writing a dirty victim.
    pub fn evict_to_budget(&mut self, pinned: NodeId) -> Result<()> {
        let mut steps = 0usize;
        // The side cache of partial reads gives back what it borrowed beyond its quarter first,
        // just the overshoot (a read phase's working set survives one write).
        let over = self.memory_bytes().saturating_sub(self.budget_bytes);
        if over > 0 {
            let cap = (self.budget_bytes / 4).max(self.partial_bytes.saturating_sub(over));
            self.trim_partial_to(cap, pinned, false);
        }
        let budget = self
            .budget_bytes
            .saturating_sub(self.partial_bytes + self.pending_run_bytes + self.background_bytes());
        // A dirty victim costs the caller an encode (zstd) and a write, which the writeback
        // thread does on the other core for nodes it has time to reach: clean victims go first;
        // after a whole turn of the ring found too few, dirty ones are queued for the writeback
        // thread (evicted once written, within the background share), and written here only
        // beyond that.
        let mut dirty_skips = 0usize;
        let ring_len_at_start = self.ring.len();
        while self.cached_bytes - self.evicting_bytes > budget
            && self.cache.len() > 1
            && !self.ring.is_empty()
        {
            steps += 1;
            if steps > 8 * (ring_len_at_start + 8) {
                break;
            }
            if self.hand >= self.ring.len() {
                self.hand = 0;
            }
            let id = self.ring[self.hand];
            let Some(e) = self.cache.get_mut(&id) else {
                self.ring.swap_remove(self.hand);
                self.ring_members.remove(&id);
                continue;
            };
            if id == pinned || (e.evicting && e.dirty) {
                self.hand += 1;
                continue;
            }
            let c = e.clock.get_mut();
            if *c > 0 {
                *c -= 1;
                self.hand += 1;
                continue;
            }
            if e.dirty {
                if dirty_skips < ring_len_at_start {
                    dirty_skips += 1;
                    self.hand += 1;
                    continue;
                }
                // Queued victims live in the background share, beside flushes in flight.
                if self.background_writes
                    && Arc::strong_count(&e.node) == 1
                    && (self.evicting_bytes == 0
                        || self.reserved_bytes + self.evicting_bytes + e.bytes <= self.background_share_bytes)
                {
                    e.evicting = true;
                    self.evicting_bytes += e.bytes;
                    self.eviction_stats.handed_to_writeback += 1;
                    self.write_soon.push(id);
                    self.hand += 1;
                    continue;
                }
                if e.node.height() == 0 {
                    self.eviction_stats.inline_leaves += 1;
                } else {
                    self.eviction_stats.inline_internal += 1;
                }
                self.eviction_stats.inline_bytes += e.bytes as u64;
                let enc = encode_node(id, &e.node, self.compression_level)?;
                self.write_encoded(id, enc)?;
            } else {
                self.eviction_stats.clean += 1;
            }
            self.remove_entry(id);
            self.ring.swap_remove(self.hand);
            self.ring_members.remove(&id);
        }
        Ok(())
    }

    /// Memory a background job holds outside the cache: `add` when it starts, `sub` when it
    /// ends. Eviction keeps the cache within the budget minus what is reserved.
    pub fn reserve(&mut self, add: usize, sub: usize) {
        debug_assert!(self.reserved_bytes + add >= sub, "released more than reserved");
        self.reserved_bytes = (self.reserved_bytes + add).saturating_sub(sub);
    }

    /// Keeps `bytes` of the budget free for background threads (see `background_share_bytes`).
    pub fn set_background_share(&mut self, bytes: usize) {
        self.background_share_bytes = bytes.min(self.budget_bytes / 2);
    }

    /// Declares that a background writer adopts the jobs of [`Store::begin_writeback`].
    pub fn set_background_writes(&mut self, on: bool) {
        self.background_writes = on;
        if !on {
            for id in std::mem::take(&mut self.write_soon) {
                self.unmark_evicting(id);
            }
        }
    }

    /// Like [`Store::write_and_evict`], but with a background writer the node is handed to the
    /// next writeback job and evicted once it is written, so the writer does not encode it.
    pub fn write_and_evict_soon(&mut self, id: NodeId) -> Result<()> {
        if !self.background_writes {
            return self.write_and_evict(id);
        }
        match self.cache.get(&id) {
            Some(e) if e.dirty => self.write_soon.push(id),
            Some(_) => {
                self.remove_entry(id);
            }
            None => {}
        }
        Ok(())
    }

    /// Writes node `id` if it is cached and dirty (copy-on-write), then drops it from the cache.
    pub fn write_and_evict(&mut self, id: NodeId) -> Result<()> {
        if let Some(e) = self.cache.get(&id) {
            if e.dirty {
                let enc = encode_node(id, &e.node, self.compression_level)?;
                self.write_encoded(id, enc)?;
            }
            self.remove_entry(id);
            // The CLOCK ring drops ids without a cache entry when its hand reaches them.
        }
        Ok(())
    }

    /// Returns a victim queued for the writeback thread to the CLOCK ring's normal course.
    fn unmark_evicting(&mut self, id: NodeId) {
        if let Some(e) = self.cache.get_mut(&id) {
            if e.evicting {
                e.evicting = false;
                self.evicting_bytes -= e.bytes;
            }
        }
    }

    fn mark_clean(&mut self, id: NodeId) {
        if let Some(e) = self.cache.get_mut(&id) {
            if e.dirty {
                e.dirty = false;
                self.dirty_bytes -= e.bytes;
            }
        }
    }

    /// Bytes of dirty cached nodes.
    pub fn dirty_bytes(&self) -> usize {
        self.dirty_bytes
    }

    /// Incremental checkpointing: when dirty nodes exceed `limit_bytes`, writes those left
    /// unmodified for the longest (at least `IDLE_EPOCHS` = 8 write batches; copy-on-write; they
    /// stay cached, now clean) until half the limit is left, so a checkpoint only has a bounded
    /// amount left to write. Nodes modified in the last few batches (the root and the internal
    /// nodes taking flushes) are left for eviction or the checkpoint: writing them now would be
    /// undone by the next flush. `pinned` (the root) is never written here.
    pub fn write_some_dirty(&mut self, limit_bytes: usize, pinned: NodeId) -> Result<()> {
        self.write_epoch += 1;
        if self.dirty_bytes <= limit_bytes {
            return Ok(());
        }
        let idle_before = self.write_epoch.saturating_sub(IDLE_EPOCHS);
        let mut dirty: Vec<(u64, u8, NodeId)> = self
            .cache
            .iter()
            // A node a checkpoint in progress holds is being written by it (and adopted after).
            .filter(|(id, e)| {
                e.dirty
                    && **id != pinned
                    && e.modified_epoch <= idle_before
                    && Arc::strong_count(&e.node) == 1
            })
            .map(|(id, e)| (e.modified_epoch, e.clock.load(Ordering::Relaxed), *id))
            .collect();
        dirty.sort_unstable();
        for (_, _, id) in dirty {
            if self.dirty_bytes <= limit_bytes / 2 {
                break;
            }
            let Some(e) = self.cache.get(&id) else { continue };
            let enc = encode_node(id, &e.node, self.compression_level)?;
            self.write_encoded(id, enc)?;
            self.mark_clean(id);
        }
        Ok(())
    }

    /// Starts a new write epoch (one per write batch): the clock by which writeback tells
    /// recently modified nodes from idle ones. [`Store::write_some_dirty`] does it itself.
    pub fn next_write_epoch(&mut self) {
        self.write_epoch += 1;
    }

    /// Background writeback (PerconaFT's cachetable writes dirty pairs on background threads,
    /// `ft/cachetable/cachetable.cc`): takes references to the nodes queued by
    /// [`Store::write_and_evict_soon`], then, when dirty nodes exceed `limit_bytes`, to idle
    /// dirty leaves (one batch unmodified: a flush leaves a leaf alone afterwards), oldest
    /// first, and above 1.5x the limit also to internal nodes idle for [`IDLE_EPOCHS`] batches,
    /// until half the limit would be left or the job holds an eighth of the budget. The job
    /// encodes and writes them without the engine lock ([`WritebackJob::run`]). Nodes a
    /// checkpoint or another writeback holds are left out. `None` when nothing is due. Call
    /// [`Store::next_write_epoch`] once per write batch.
    pub fn begin_writeback(&mut self, limit_bytes: usize, pinned: NodeId) -> Option<WritebackJob> {
        // A job holds at most an eighth of the budget (at least one node): small jobs are
        // adopted sooner, and a node the writer changes while a job holds it is copied.
        let cap = (self.budget_bytes / 8).max(1);
        let mut job_bytes = 0usize;
        // Pending runs first: they hold memory until written.
        let runs = self.take_pending_for_job();
        // Then the nodes to write and evict (held by a checkpoint: left to eviction).
        let mut nodes = Vec::new();
        let mut soon = std::mem::take(&mut self.write_soon).into_iter();
        for id in soon.by_ref() {
            let Some(e) = self.cache.get(&id) else { continue };
            // Queued eviction victims, and leaves (a flush rewrote them, or a victim leaf was
            // modified since: written and evicted all the same); an internal victim modified
            // since it was queued is a new entry, back in the CLOCK ring's course.
            let queued = e.evicting || e.node.height() == 0;
            if queued && e.dirty && id != pinned && Arc::strong_count(&e.node) == 1 {
                nodes.push(PendingNode {
                    id,
                    node: Arc::clone(&e.node),
                    loc_at_begin: self.btt.get(&id).copied(),
                    evict_after: true,
                });
                job_bytes += e.bytes;
                if job_bytes >= cap {
                    break;
                }
            } else if e.evicting {
                // Written meanwhile (a checkpoint) or held by one: a clean victim goes now,
                // a held one back to the CLOCK ring.
                if e.dirty || id == pinned {
                    self.unmark_evicting(id);
                } else {
                    self.remove_entry(id);
                }
            }
        }
        self.write_soon.extend(soon);
        if self.dirty_bytes <= limit_bytes || job_bytes >= cap {
            return (!nodes.is_empty() || !runs.is_empty()).then(|| self.writeback_job(nodes, runs));
        }
        let idle_internal = self.write_epoch.saturating_sub(IDLE_EPOCHS);
        let idle_leaf = self.write_epoch.saturating_sub(1);
        // Internal nodes take a flush every few batches, so writing them early is mostly undone
        // by the next flush: only when dirty nodes reach 1.5x the limit.
        let internal_ok = self.dirty_bytes > limit_bytes / 2 * 3;
        let mut dirty: Vec<(bool, u64, u8, NodeId, usize)> = self
            .cache
            .iter()
            .filter(|(id, e)| {
                let leaf = e.node.height() == 0;
                let idle_before = if leaf { idle_leaf } else { idle_internal };
                e.dirty
                    && (leaf || internal_ok)
                    && **id != pinned
                    && e.modified_epoch <= idle_before
                    && Arc::strong_count(&e.node) == 1
            })
            .map(|(id, e)| {
                (
                    e.node.height() > 0,
                    e.modified_epoch,
                    e.clock.load(Ordering::Relaxed),
                    *id,
                    e.bytes,
                )
            })
            .collect();
        // Leaves first, then the longest idle.
        dirty.sort_unstable();
        let mut left = self.dirty_bytes;
        for (_, _, _, id, bytes) in dirty {
            if left <= limit_bytes / 2 || job_bytes >= cap {
                break;
            }
            job_bytes += bytes;
            let e = &self.cache[&id];
            nodes.push(PendingNode {
                id,
                node: Arc::clone(&e.node),
                loc_at_begin: self.btt.get(&id).copied(),
                evict_after: false,
            });
            left -= bytes;
        }
        (!nodes.is_empty() || !runs.is_empty()).then(|| self.writeback_job(nodes, runs))
    }

    fn writeback_job(&self, nodes: Vec<PendingNode>, runs: Vec<(u64, Arc<Vec<Msg>>)>) -> WritebackJob {
        WritebackJob {
            file: Arc::clone(&self.file),
            path: self.path.clone(),
            compression_level: self.compression_level,
            space: Arc::clone(&self.space),
            nodes,
            runs,
        }
    }

    /// Adopts run `id` written to `loc` by a background job: the BTT points at it when the run
    /// is still pending; otherwise (merged or flushed meanwhile, or written by another job) the
    /// block is released.
    fn adopt_run(&mut self, id: u64, loc: BlockLoc) -> bool {
        if self.forget_pending_run(id) {
            debug_assert!(!self.btt.contains_key(&id));
            self.btt.insert(id, loc);
            true
        } else {
            self.release(loc);
            false
        }
    }

    /// Ends a writeback [`WritebackJob::run`] did: a node still cached, dirty, unmodified and at
    /// the same BTT entry since [`Store::begin_writeback`] now lives in the written block and is
    /// clean; otherwise (modified, evicted after an inline write, or written by a checkpoint
    /// meanwhile) the written block is released. Memory work only.
    pub fn finish_writeback(&mut self, done: WritebackDone, root: NodeId) -> WritebackStats {
        let mut stats = done.stats;
        for (id, loc) in done.written_runs {
            self.adopt_run(id, loc);
        }
        for mut w in done.written {
            if self.adopt_written(&w, true) {
                self.keep_skeleton(w.id, w.loc, w.skeleton.take());
                if w.evict_after && w.id != root {
                    // The CLOCK ring drops ids without a cache entry when its hand reaches them.
                    self.remove_entry(w.id);
                } else if w.evict_after {
                    // Became the root meanwhile: it stays.
                    self.unmark_evicting(w.id);
                }
                stats.adopted += 1;
            } else if w.evict_after {
                // Modified meanwhile (then a new entry, unmarked) or written otherwise: back to
                // the CLOCK ring.
                self.unmark_evicting(w.id);
            }
        }
        stats
    }

    /// Adopts a block a background job wrote for `w.id` when the node is unchanged since the
    /// job began (the same cached `Arc`, still dirty if `require_dirty`, the same BTT entry):
    /// the BTT points at the new block, the old one is released and the node is clean. Otherwise
    /// the written block is released. Returns whether it adopted.
    fn adopt_written(&mut self, w: &WrittenNode, require_dirty: bool) -> bool {
        let unchanged = self
            .cache
            .get(&w.id)
            .is_some_and(|e| (e.dirty || !require_dirty) && Arc::ptr_eq(&e.node, &w.node))
            && self.btt.get(&w.id).copied() == w.loc_at_begin;
        if unchanged {
            self.btt.insert(w.id, w.loc);
            if let Some(old) = w.loc_at_begin {
                self.release(old);
            }
            self.mark_clean(w.id);
        } else {
            self.release(w.loc);
        }
        unchanged
    }

    /// Starts a checkpoint of the tree as it is now (`root`, counters and `meta`): takes a
    /// reference to every dirty node and a copy of the BTT. Costs memory references only, no
    /// I/O: the engine lock is held for well under a millisecond per thousand nodes. Until
    /// [`Store::finish_checkpoint`], the blocks the checkpoint refers to are kept.
    ///
    /// Panics if a checkpoint is already in progress (callers serialize checkpoints).
    pub fn begin_checkpoint(
        &mut self,
        root: NodeId,
        next_msn: Msn,
        next_node_id: NodeId,
        meta: Option<Vec<u8>>,
    ) -> CheckpointJob {
        assert!(
            !self.checkpoint_running,
            "checkpoints are serialized by the engine"
        );
        let started = Instant::now();
        self.checkpoint_running = true;
        let mut nodes: Vec<PendingNode> = self
            .cache
            .iter()
            .filter(|(_, e)| e.dirty)
            .map(|(id, e)| PendingNode {
                id: *id,
                node: Arc::clone(&e.node),
                loc_at_begin: self.btt.get(id).copied(),
                evict_after: false,
            })
            .collect();
        nodes.sort_unstable_by_key(|n| n.id);
        let dirty: HashSet<NodeId> = nodes.iter().map(|n| n.id).collect();
        let clean: Vec<(NodeId, BlockLoc)> = self
            .btt
            .iter()
            .filter(|(id, _)| !dirty.contains(id))
            .map(|(id, l)| (*id, *l))
            .collect();
        self.space.lock().begin(clean.iter().map(|(_, l)| l.offset));
        CheckpointJob {
            file: Arc::clone(&self.file),
            path: self.path.clone(),
            compression_level: self.compression_level,
            space: Arc::clone(&self.space),
            counter: self.counter + 1,
            root,
            next_msn,
            next_node_id,
            meta,
            clean,
            nodes,
            runs: self
                .pending_runs
                .iter()
                .map(|(id, m)| (*id, Arc::clone(m)))
                .collect(),
            begin_us: started.elapsed().as_micros() as u64,
        }
    }

    /// Ends a checkpoint [`CheckpointJob::run`] wrote: the nodes nobody modified or rewrote
    /// since [`Store::begin_checkpoint`] now live in the blocks the checkpoint wrote (and are
    /// clean); the others keep their newer state and the checkpoint's copies are released. Then
    /// the space forgets the checkpoint before the previous one, and the file is cut back to
    /// the allocated end. Memory work plus one `set_len`.
    ///
    /// Errors: `Io` when the file length cannot be read or cut.
    pub fn finish_checkpoint(&mut self, done: CheckpointDone) -> Result<CheckpointStats> {
        let started = Instant::now();
        let mut stats = done.stats;
        for (id, loc) in done.written_runs {
            self.adopt_run(id, loc);
        }
        for mut w in done.written {
            if self.adopt_written(&w, false) {
                self.keep_skeleton(w.id, w.loc, w.skeleton.take());
                stats.adopted += 1;
            }
        }
        self.counter = done.counter;
        self.checkpoint_running = false;
        // The space mutex is held until the file is cut: a writeback job allocating at the end
        // meanwhile must find the file long enough (its block would otherwise be cut off).
        let mut space = self.space.lock();
        space.commit();
        let end = space.end();
        let file_len = self.file_len()?;
        if file_len > end {
            self.file.set_len(end).map_err(io_err("truncate tree file"))?;
        }
        drop(space);
        stats.finish_us = started.elapsed().as_micros() as u64;
        Ok(stats)
    }

    /// Forgets a checkpoint whose [`CheckpointJob::run`] failed (the engine is poisoned; the
    /// file still holds the previous checkpoint).
    pub fn abort_checkpoint(&mut self) {
        self.checkpoint_running = false;
        self.space.lock().abort();
    }

    /// Writes a whole checkpoint on the calling thread (begin, run, finish).
    pub fn checkpoint(
        &mut self,
        root: NodeId,
        next_msn: Msn,
        next_node_id: NodeId,
        meta: Option<Vec<u8>>,
    ) -> Result<CheckpointStats> {
        let job = self.begin_checkpoint(root, next_msn, next_node_id, meta);
        match job.run() {
            Ok(done) => self.finish_checkpoint(done),
            Err(e) => {
                self.abort_checkpoint();
                Err(e)
            }
        }
    }
}

/// A dirty node as a checkpoint found it.
struct PendingNode {
    id: NodeId,
    node: Arc<Node>,
    /// Its BTT entry then (`None` for a node never written).
    loc_at_begin: Option<BlockLoc>,
    /// Writeback only: evict the node once its written block is adopted.
    evict_after: bool,
}

/// A node the checkpoint wrote.
pub struct WrittenNode {
    id: NodeId,
    node: Arc<Node>,
    loc_at_begin: Option<BlockLoc>,
    loc: BlockLoc,
    evict_after: bool,
    /// A leaf's skeleton, kept when the block is adopted.
    skeleton: Option<LeafSkeleton>,
}

/// A node or run block to read without the store (from [`Store::detached`]).
pub struct DetachedBlock {
    file: Arc<dyn VfsFile>,
    path: PathBuf,
    id: u64,
    loc: BlockLoc,
    /// A spilled run not written yet: its messages.
    pending: Option<Arc<Vec<Msg>>>,
}

impl DetachedBlock {
    fn location(&self, what: &str) -> String {
        format!(
            "{} {what} {} block @ offset {} ({} bytes)",
            self.path.display(),
            self.id,
            self.loc.offset,
            self.loc.size
        )
    }

    /// The whole block, checked against its BTT crc.
    fn read_checked(&self, location: &(impl std::fmt::Display + ?Sized)) -> Result<Vec<u8>> {
        let buf = read_at(&*self.file, self.loc.offset, u64::from(self.loc.size), location)?;
        let crc = crc32c::crc32c(&buf);
        if crc != self.loc.crc {
            return Err(EngineError::Corruption {
                location: location.to_string(),
                detail: format!("crc32c mismatch (BTT {:#010x}, block {crc:#010x})", self.loc.crc),
            });
        }
        Ok(buf)
    }

    /// Reads and verifies the block as a node.
    ///
    /// Errors: `Io` from the file, `Corruption` for a crc mismatch or a malformed block.
    pub fn read_node(&self) -> Result<Node> {
        let location = self.location("node");
        if self.pending.is_some() {
            return Err(EngineError::Corruption {
                location,
                detail: "a spilled run not written yet is referenced as a node".into(),
            });
        }
        let buf = self.read_checked(&location)?;
        let node = decode_node(&buf, self.id, &location);
        recycle_block_buf(buf);
        node
    }

    /// [`DetachedBlock::read_node`], with the skeleton of a leaf (for partial eviction).
    fn read_node_and_skeleton(&self) -> Result<(Node, Option<LeafSkeleton>)> {
        let location = self.location("node");
        let buf = self.read_checked(&location)?;
        let node = decode_node(&buf, self.id, &location);
        let sk = match &node {
            Ok(n) if n.height() == 0 => leaf_skeleton(&buf, self.id),
            _ => None,
        };
        recycle_block_buf(buf);
        Ok((node?, sk))
    }

    /// Reads and verifies the block as a spilled run: its messages sorted by (key, MSN).
    ///
    /// Errors: as [`DetachedBlock::read_node`].
    pub fn read_run(&self) -> Result<Vec<Msg>> {
        if let Some(msgs) = &self.pending {
            return Ok(msgs.as_ref().clone());
        }
        let location = self.location("run");
        let buf = self.read_checked(&location)?;
        let msgs = decode_run_range(&buf, self.id, &location, &[], None);
        recycle_block_buf(buf);
        msgs
    }
}

/// Idle dirty nodes to write in the background, from [`Store::begin_writeback`]. Holds no
/// engine lock; run it on any thread.
pub struct WritebackJob {
    file: Arc<dyn VfsFile>,
    path: PathBuf,
    compression_level: Option<i32>,
    space: Arc<Mutex<Space>>,
    nodes: Vec<PendingNode>,
    /// Pending spilled runs to encode and write.
    runs: Vec<(u64, Arc<Vec<Msg>>)>,
}

/// What [`WritebackJob::run`] wrote, for [`Store::finish_writeback`].
pub struct WritebackDone {
    written: Vec<WrittenNode>,
    written_runs: Vec<(u64, BlockLoc)>,
    stats: WritebackStats,
}

/// Figures of one background writeback.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WritebackStats {
    /// Nodes encoded and written.
    pub nodes_written: u64,
    /// Bytes written.
    pub bytes_written: u64,
    /// Of those, bytes of leaves.
    pub leaf_bytes_written: u64,
    /// Written nodes adopted by the live tree (unchanged meanwhile).
    pub adopted: u64,
    /// Pending spilled runs encoded and written.
    pub runs_written: u64,
    /// Time encoding and writing took (engine lock not held), in microseconds.
    pub write_us: u64,
}

impl WritebackJob {
    /// Nodes and runs in the job.
    pub fn len(&self) -> usize {
        self.nodes.len() + self.runs.len()
    }

    /// Whether the job holds no node and no run.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.runs.is_empty()
    }

    /// Writes `enc` to a fresh block (not claimed by a checkpoint); `what` names it in errors.
    fn write_block(&self, enc: &[u8], what: impl Fn() -> String) -> Result<BlockLoc> {
        let size = u32::try_from(enc.len()).map_err(|_| {
            EngineError::InvalidArgument(format!("{} encodes to {} bytes", what(), enc.len()))
        })?;
        let offset = self.space.lock().alloc(enc.len() as u64);
        if let Err(source) = self.file.write_all_at(enc, offset) {
            self.space.lock().unalloc(offset, enc.len() as u64);
            return Err(EngineError::Io {
                context: format!("write {} @ {offset} of {}", what(), self.path.display()),
                source,
            });
        }
        Ok(BlockLoc {
            offset,
            size,
            crc: crc32c::crc32c(enc),
        })
    }

    /// Encodes and writes every node of the job to a fresh block (copy-on-write; nothing
    /// durable refers to these blocks until a checkpoint does, so no sync). Takes only the space
    /// mutex (per allocation), never the engine lock.
    ///
    /// Errors: `Io` for a failed write (the caller poisons the engine); `InvalidArgument` for a
    /// node above 4 GiB encoded. Blocks written before the error stay allocated until reopen.
    pub fn run(mut self) -> Result<WritebackDone> {
        let started = Instant::now();
        let mut stats = WritebackStats::default();
        let mut written_runs = Vec::with_capacity(self.runs.len());
        for (id, msgs) in std::mem::take(&mut self.runs) {
            let enc = encode_run(id, &msgs, self.compression_level)?;
            let loc = self.write_block(&enc, || format!("run {id}"))?;
            stats.runs_written += 1;
            stats.bytes_written += enc.len() as u64;
            recycle_block_buf(enc);
            written_runs.push((id, loc));
        }
        let mut written = Vec::with_capacity(self.nodes.len());
        for n in std::mem::take(&mut self.nodes) {
            let enc = encode_node(n.id, &n.node, self.compression_level)?;
            let loc = self.write_block(&enc, || format!("node {}", n.id))?;
            let enc_len = enc.len() as u64;
            // A skeleton serves once the leaf leaves the cache: kept for leaves evicted after.
            let skeleton = (n.evict_after && n.node.height() == 0)
                .then(|| leaf_skeleton(&enc, n.id))
                .flatten();
            recycle_block_buf(enc);
            stats.nodes_written += 1;
            stats.bytes_written += enc_len;
            if n.node.height() == 0 {
                stats.leaf_bytes_written += enc_len;
            }
            written.push(WrittenNode {
                id: n.id,
                node: n.node,
                loc_at_begin: n.loc_at_begin,
                evict_after: n.evict_after,
                loc,
                skeleton,
            });
        }
        stats.write_us = started.elapsed().as_micros() as u64;
        Ok(WritebackDone {
            written,
            written_runs,
            stats,
        })
    }
}

/// A checkpoint between [`Store::begin_checkpoint`] and [`Store::finish_checkpoint`]: the
/// snapshot to write. Holds no engine lock; run it on any thread.
pub struct CheckpointJob {
    file: Arc<dyn VfsFile>,
    path: PathBuf,
    compression_level: Option<i32>,
    space: Arc<Mutex<Space>>,
    counter: u64,
    root: NodeId,
    next_msn: Msn,
    next_node_id: NodeId,
    meta: Option<Vec<u8>>,
    /// BTT entries of nodes that were clean at the begin (their blocks are already written).
    clean: Vec<(NodeId, BlockLoc)>,
    /// Dirty nodes to write, by id.
    nodes: Vec<PendingNode>,
    /// Spilled runs not written yet (the checkpoint refers to them, so it writes them).
    runs: Vec<(u64, Arc<Vec<Msg>>)>,
    begin_us: u64,
}

/// What [`CheckpointJob::run`] wrote, for [`Store::finish_checkpoint`].
pub struct CheckpointDone {
    counter: u64,
    written: Vec<WrittenNode>,
    written_runs: Vec<(u64, BlockLoc)>,
    stats: CheckpointStats,
}

/// Figures of one checkpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Checkpoint counter committed.
    pub counter: u64,
    /// Dirty nodes written.
    pub nodes_written: u64,
    /// Bytes written (node blocks and the BTT block).
    pub bytes_written: u64,
    /// Written nodes adopted by the live tree (unchanged while the checkpoint ran).
    pub adopted: u64,
    /// Time the begin held the engine lock, in microseconds.
    pub begin_us: u64,
    /// Time writing and syncing took (engine lock not held), in microseconds.
    pub write_us: u64,
    /// Time the finish held the engine lock, in microseconds.
    pub finish_us: u64,
}

impl CheckpointJob {
    /// Encodes and writes every node of the snapshot to fresh blocks, then the BTT block, syncs,
    /// writes the alternate header and syncs again: the checkpoint is durable when this
    /// returns. Takes only the space mutex (per allocation), never the engine lock.
    ///
    /// Errors: `Io` for a failed write or sync (the engine must then stop writing: the caller
    /// poisons it); `InvalidArgument` for a node or BTT above 4 GiB encoded.
    pub fn run(mut self) -> Result<CheckpointDone> {
        let started = Instant::now();
        let mut stats = CheckpointStats {
            counter: self.counter,
            begin_us: self.begin_us,
            ..CheckpointStats::default()
        };
        let mut entries = self.clean.clone();
        let mut written_runs = Vec::with_capacity(self.runs.len());
        for (id, msgs) in std::mem::take(&mut self.runs) {
            let enc = encode_run(id, &msgs, self.compression_level)?;
            let loc = self.write_block(&enc, || format!("checkpoint run {id}"))?;
            stats.bytes_written += enc.len() as u64;
            recycle_block_buf(enc);
            written_runs.push((id, loc));
        }
        entries.extend(written_runs.iter().copied());
        let nodes = std::mem::take(&mut self.nodes);
        let mut written = Vec::with_capacity(nodes.len());
        // Encoding (zstd) dominates: the nodes are dealt round-robin to one lane per core, each
        // encoding and writing its nodes (one encoded block in memory per lane).
        let lanes = if nodes.len() < 8 {
            1
        } else {
            std::thread::available_parallelism().map_or(1, |n| n.get().min(MAX_CHECKPOINT_LANES))
        };
        let mut dealt: Vec<Vec<PendingNode>> = (0..lanes).map(|_| Vec::new()).collect();
        for (i, n) in nodes.into_iter().enumerate() {
            if let Some(lane) = dealt.get_mut(i % lanes) {
                lane.push(n);
            }
        }
        let job = &self;
        let results: Vec<Result<(Vec<WrittenNode>, u64)>> = if lanes == 1 {
            dealt.into_iter().map(|lane| job.write_lane(lane)).collect()
        } else {
            std::thread::scope(|scope| {
                let handles: Vec<_> = dealt
                    .into_iter()
                    .map(|lane| scope.spawn(move || job.write_lane(lane)))
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(EngineError::Io {
                                context: "checkpoint encoder".into(),
                                source: std::io::Error::other("an encoding thread panicked"),
                            })
                        })
                    })
                    .collect()
            })
        };
        for r in results {
            let (lane_written, bytes) = r?;
            stats.nodes_written += lane_written.len() as u64;
            stats.bytes_written += bytes;
            entries.extend(lane_written.iter().map(|w| (w.id, w.loc)));
            written.extend(lane_written);
        }
        entries.sort_unstable_by_key(|e| e.0);
        let img = BttImage {
            counter: self.counter,
            root: self.root,
            next_msn: self.next_msn,
            next_node_id: self.next_node_id,
            meta: self.meta.take(),
            entries,
        };
        let enc = encode_btt(&img);
        let btt_loc = self.write_block(&enc, || "BTT".to_string())?;
        stats.bytes_written += enc.len() as u64;
        self.file
            .sync_data()
            .map_err(io_err("sync tree file before header"))?;
        let header = encode_header(&Header {
            counter: self.counter,
            btt: btt_loc,
        });
        let slot = (self.counter % 2) * HEADER_SLOT_BYTES;
        self.file
            .write_all_at(&header, slot)
            .map_err(io_err("write header"))?;
        self.file.sync_data().map_err(io_err("sync header"))?;
        // The BTT block is never part of the live tree: it waits until no checkpoint needs it.
        self.space.lock().release(btt_loc.offset, btt_loc.alloc_bytes());
        stats.write_us = started.elapsed().as_micros() as u64;
        Ok(CheckpointDone {
            counter: self.counter,
            written,
            written_runs,
            stats,
        })
    }

    /// Encodes and writes `nodes` (one lane of [`CheckpointJob::run`]); returns what it wrote
    /// and the bytes.
    fn write_lane(&self, nodes: Vec<PendingNode>) -> Result<(Vec<WrittenNode>, u64)> {
        let mut written = Vec::with_capacity(nodes.len());
        let mut bytes = 0u64;
        for n in nodes {
            let enc = encode_node(n.id, &n.node, self.compression_level)?;
            let loc = self.write_block(&enc, || format!("checkpoint node {}", n.id))?;
            bytes += enc.len() as u64;
            recycle_block_buf(enc);
            written.push(WrittenNode {
                id: n.id,
                node: n.node,
                loc_at_begin: n.loc_at_begin,
                loc,
                evict_after: false,
                // The checkpoint's nodes stay cached: their skeletons would only crowd out
                // those of evicted leaves.
                skeleton: None,
            });
        }
        Ok((written, bytes))
    }

    /// Writes `enc` to a block the checkpoint in progress claims.
    fn write_block(&self, enc: &[u8], what: impl Fn() -> String) -> Result<BlockLoc> {
        let size = u32::try_from(enc.len()).map_err(|_| {
            EngineError::InvalidArgument(format!("{} encodes to {} bytes", what(), enc.len()))
        })?;
        let offset = self.space.lock().alloc_for_checkpoint(enc.len() as u64);
        self.file
            .write_all_at(enc, offset)
            .map_err(|source| EngineError::Io {
                context: format!("write {} @ {offset} of {}", what(), self.path.display()),
                source,
            })?;
        Ok(BlockLoc {
            offset,
            size,
            crc: crc32c::crc32c(enc),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::Path;

    use ftkv_vfs::{FaultVfs, Vfs};

    use super::*;
    use crate::fractal::codec::{encode_run, encode_run_v2};
    use crate::fractal::msg::PointOp;

    fn msgs() -> Vec<Msg> {
        (0..3000u32)
            .map(|i| Msg::Point {
                msn: u64::from(i) + 1,
                key: format!("key{i:06}").into_bytes(),
                op: PointOp::Put(vec![b'a' + (i % 26) as u8; 60]),
            })
            .collect()
    }

    /// A run of either format, read by key range from the store, returns exactly its messages
    /// in the range; a flipped bit in its payload is `Corruption` (format 2 through the BTT crc
    /// of the whole block, format 3 through the frame crc), never data.
    #[test]
    fn runs_of_both_formats_read_by_range_and_catch_flips() {
        let vfs = FaultVfs::new(5);
        vfs.create_dir_all(Path::new("/s")).unwrap();
        let file = vfs.open(Path::new("/s/tree"), true).unwrap();
        let mut store = Store::new(file, "/s/tree".into(), Some(1), 1 << 20, None, None);
        let all = msgs();
        // Format 2 stored raw: only the BTT crc of the whole block can catch damage in it.
        store.write_run(10, encode_run_v2(10, &all, false)).unwrap();
        store
            .write_run(11, encode_run(11, &all, Some(1)).unwrap())
            .unwrap();
        let (lo, hi) = (b"key001000".to_vec(), b"key001100".to_vec());
        let want: Vec<Msg> = all[1000..1100].to_vec();
        for id in [10, 11] {
            assert_eq!(
                store.read_run_range(id, &lo, Some(&hi)).unwrap(),
                want,
                "run {id}"
            );
            let mut one = Vec::new();
            store.run_msgs_for_key(id, b"key002345", &mut one).unwrap();
            assert_eq!(one, vec![all[2345].clone()], "run {id}");
        }
        let st = store.partial_stats();
        assert_eq!((st.run_whole_reads, st.run_frame_reads), (2, 2), "{st:?}");
        // Flip one bit in the middle of each run's payload (past headers and index).
        for id in [10, 11] {
            let loc = store.btt[&id];
            let at = loc.offset + u64::from(loc.size) / 2;
            vfs.inject_bytes(Path::new("/s/tree"), at, &[0x5a]).unwrap();
            // The frame holding the middle key of the block (format 3) or the whole payload
            // (format 2) is read: both report corruption.
            let mut hits = 0;
            for i in (0..3000usize).step_by(25) {
                let k = format!("key{i:06}").into_bytes();
                let mut out = Vec::new();
                match store.run_msgs_for_key(id, &k, &mut out) {
                    Err(EngineError::Corruption { .. }) => hits += 1,
                    Ok(()) => assert_eq!(out, vec![all[i].clone()], "run {id}: wrong data returned"),
                    Err(e) => panic!("run {id}: {e}"),
                }
            }
            assert!(hits > 0, "run {id}: a damaged payload byte went unnoticed");
        }
    }
}
