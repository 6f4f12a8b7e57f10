//! The figures the store reports.

use super::*;

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

/// Node blocks written since open: their uncompressed and stored bytes (the compression
/// ratio). Shared with the checkpoint and writeback jobs, which write blocks off the lock.
#[derive(Debug, Default)]
pub(crate) struct BlockBytes {
    raw: AtomicU64,
    stored: AtomicU64,
}

impl BlockBytes {
    /// Counts `enc` if it is a node block (spilled runs are not counted).
    pub(crate) fn count(&self, enc: &[u8]) {
        if let Some((raw, stored)) = node_block_sizes(enc) {
            self.raw.fetch_add(raw, Ordering::Relaxed);
            self.stored.fetch_add(stored, Ordering::Relaxed);
        }
    }

    pub(crate) fn stats(&self) -> CompressionStats {
        CompressionStats {
            raw_bytes: self.raw.load(Ordering::Relaxed),
            stored_bytes: self.stored.load(Ordering::Relaxed),
        }
    }
}

/// Node blocks the engine wrote since open, before and after compression.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompressionStats {
    /// Uncompressed bytes of the blocks (headers included).
    pub raw_bytes: u64,
    /// Bytes of the blocks as written.
    pub stored_bytes: u64,
}

impl CompressionStats {
    /// `raw_bytes / stored_bytes` (`None` before the first block).
    pub fn ratio(&self) -> Option<f64> {
        (self.stored_bytes > 0).then(|| self.raw_bytes as f64 / self.stored_bytes as f64)
    }
}

/// What [`Store::push_in_place`] did.
pub(crate) enum InPlacePush {
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
    /// Whole basements read from leaves that were not cached: always 0 (format 4, the only one
    /// read, stores basements as frames; see `frames`). Kept for the API.
    pub basements: u64,
    /// Single basement frames read from leaves that were not cached.
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
