//! The cachetable: decoded nodes under a byte budget (PerconaFT `ft/cachetable/cachetable.cc`).
//!
//! [`Cachetable`] owns the cached entries, the CLOCK ring eviction sweeps over (module `clock`),
//! and the byte accounting the engine's memory budget is kept by: cached, dirty and evicting
//! bytes, what background work reserves or is given as its share, and the queue of dirty nodes
//! to write and evict soon. It does no I/O: the store loads nodes on a miss and writes the dirty
//! victims eviction hands it (module `cache_io` of the store).
//!
//! Invariants (checked by [`Cachetable::check_counters`] and, cheaply, by debug assertions after
//! every change): `cached_bytes` is the sum of the entries' bytes, `dirty_bytes` that of the
//! dirty ones and `evicting_bytes` that of those marked evicting, so neither exceeds
//! `cached_bytes`.

use super::*;

mod clock;
mod clock_ring;
#[cfg(test)]
mod tests;

use self::clock_ring::ClockRing;

/// One cached node.
pub(crate) struct Entry {
    /// Shared with a checkpoint in progress while it writes this node (then copied on take).
    pub(crate) node: Arc<Node>,
    pub(crate) dirty: bool,
    /// CLOCK count; atomic so readers under a shared lock can mark use.
    pub(crate) clock: AtomicU8,
    pub(crate) bytes: usize,
    /// [`Cachetable::write_epoch`] when the node was last put (modified).
    pub(crate) modified_epoch: u64,
    /// An eviction victim queued for the writeback thread (in the write-soon queue): evicted
    /// once its written block is adopted, and not counted against the cache's target meanwhile
    /// (its bytes are in [`Cachetable::evicting_bytes`]). A modified node is a new entry
    /// without it.
    pub(crate) evicting: bool,
}

/// Cached nodes, their CLOCK ring and their byte accounting.
pub(crate) struct Cachetable {
    entries: HashMap<NodeId, Entry>,
    /// The order in which eviction visits cached nodes.
    ring: ClockRing,
    /// Bytes of all cached entries.
    cached_bytes: usize,
    /// Bytes of dirty cached entries (written ahead of checkpoints to keep them short).
    dirty_bytes: usize,
    /// Bytes of cached entries marked `evicting` (dirty victims the writeback thread writes
    /// before they are dropped); within the background share, beside `reserved_bytes`.
    evicting_bytes: usize,
    /// The engine's memory budget.
    budget_bytes: usize,
    /// Memory held outside the cache by background leaf flushes in flight (their leaves and
    /// runs, decoded): taken from the budget, so the process stays within it.
    reserved_bytes: usize,
    /// Share of the budget kept free for background work (decoded leaves and runs of a flush
    /// in flight, nodes a writeback job holds and copies of them, encode buffers); the cache
    /// is evicted to the budget minus this (or minus what flushes reserve, if more).
    background_share_bytes: usize,
    /// Count of write batches: the clock by which the incremental writer tells recently
    /// modified nodes from idle ones.
    write_epoch: u64,
    /// A background writer adopts what the store's writeback hands out (set by the engine):
    /// dirty victims may be queued for it instead of written inline.
    background_writes: bool,
    /// Dirty nodes to write and evict with the next writeback (leaves a flush of spilled runs
    /// just rewrote, queued eviction victims), oldest first.
    write_soon: Vec<NodeId>,
    eviction_stats: EvictionStats,
}

impl Cachetable {
    /// An empty cachetable with a budget of `budget_bytes`.
    pub(crate) fn new(budget_bytes: usize) -> Self {
        Cachetable {
            entries: HashMap::new(),
            ring: ClockRing::default(),
            cached_bytes: 0,
            dirty_bytes: 0,
            evicting_bytes: 0,
            budget_bytes,
            reserved_bytes: 0,
            background_share_bytes: 0,
            write_epoch: 0,
            background_writes: false,
            write_soon: Vec::new(),
            eviction_stats: EvictionStats::default(),
        }
    }

    // --------------------------------------------------------------------------------------
    // Figures
    // --------------------------------------------------------------------------------------

    /// The memory budget in bytes.
    pub(crate) fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Bytes of cached nodes (dirty and evicting ones included).
    pub(crate) fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// Bytes of dirty cached nodes.
    pub(crate) fn dirty_bytes(&self) -> usize {
        self.dirty_bytes
    }

    /// Bytes of cached nodes queued for the writeback thread to write and evict.
    pub(crate) fn evicting_bytes(&self) -> usize {
        self.evicting_bytes
    }

    /// Cached bytes counted against the cache's target: all but the queued victims (those are
    /// in the background share).
    pub(crate) fn held_bytes(&self) -> usize {
        self.cached_bytes - self.evicting_bytes
    }

    /// Bytes background flushes in flight hold (reserved from the budget).
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.reserved_bytes
    }

    /// Bytes of the budget kept free for background work.
    pub(crate) fn background_share_bytes(&self) -> usize {
        self.background_share_bytes
    }

    /// What background work holds against the budget: flushes in flight and eviction victims
    /// queued for the writeback thread, or the share kept free for them if that is more.
    pub(crate) fn background_bytes(&self) -> usize {
        (self.reserved_bytes + self.evicting_bytes).max(self.background_share_bytes)
    }

    /// Evictions since open.
    pub(crate) fn eviction_stats(&self) -> EvictionStats {
        self.eviction_stats
    }

    /// The current write epoch (see [`Cachetable::next_write_epoch`]).
    pub(crate) fn write_epoch(&self) -> u64 {
        self.write_epoch
    }

    /// Starts a new write epoch (one per write batch).
    pub(crate) fn next_write_epoch(&mut self) {
        self.write_epoch += 1;
    }

    /// Whether a background writer takes the write-soon queue.
    pub(crate) fn background_writes(&self) -> bool {
        self.background_writes
    }

    /// Checks the byte counters against the entries; returns a description of a mismatch.
    pub(crate) fn check_counters(&self) -> std::result::Result<(), String> {
        let cached: usize = self.entries.values().map(|e| e.bytes).sum();
        let dirty: usize = self.entries.values().filter(|e| e.dirty).map(|e| e.bytes).sum();
        let evicting: usize = self
            .entries
            .values()
            .filter(|e| e.evicting)
            .map(|e| e.bytes)
            .sum();
        if (cached, dirty, evicting) != (self.cached_bytes, self.dirty_bytes, self.evicting_bytes) {
            return Err(format!(
                "cache counters (cached {}, dirty {}, evicting {}) != recomputed ({cached}, {dirty}, {evicting})",
                self.cached_bytes, self.dirty_bytes, self.evicting_bytes
            ));
        }
        Ok(())
    }

    /// The invariants that cost nothing to check, after every change (debug builds).
    fn debug_check(&self) {
        debug_assert!(
            self.dirty_bytes <= self.cached_bytes,
            "dirty bytes {} beyond cached bytes {}",
            self.dirty_bytes,
            self.cached_bytes
        );
        debug_assert!(
            self.evicting_bytes <= self.cached_bytes,
            "evicting bytes {} beyond cached bytes {}",
            self.evicting_bytes,
            self.cached_bytes
        );
    }

    // --------------------------------------------------------------------------------------
    // Lookup
    // --------------------------------------------------------------------------------------

    /// Node ids in the cache.
    pub(crate) fn ids(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.entries.keys().copied()
    }

    /// The cached entries (for writeback and checkpoints choosing nodes to write).
    pub(crate) fn entries(&self) -> impl Iterator<Item = (NodeId, &Entry)> + '_ {
        self.entries.iter().map(|(id, e)| (*id, e))
    }

    /// The entry of node `id`, if cached.
    pub(crate) fn entry(&self, id: NodeId) -> Option<&Entry> {
        self.entries.get(&id)
    }

    /// Whether node `id` is in the cache.
    pub(crate) fn contains(&self, id: NodeId) -> bool {
        self.entries.contains_key(&id)
    }

    /// The cached node `id`, marking its use in the CLOCK count; `None` on a miss.
    pub(crate) fn peek(&self, id: NodeId) -> Option<&Node> {
        self.entries.get(&id).map(|e| {
            bump(&e.clock);
            &*e.node
        })
    }

    /// Cached node `id` without touching its CLOCK count (for scans of the cache that must not
    /// change what gets evicted).
    pub(crate) fn peek_quiet(&self, id: NodeId) -> Option<&Node> {
        self.entries.get(&id).map(|e| &*e.node)
    }

    // --------------------------------------------------------------------------------------
    // Insert and remove
    // --------------------------------------------------------------------------------------

    /// Caches `node` as `id` (replacing an entry there), dirty or clean, at CLOCK count `clock`.
    pub(crate) fn insert(&mut self, id: NodeId, node: Node, dirty: bool, clock: u8) {
        self.remove(id);
        let bytes = node.size_bytes();
        self.cached_bytes += bytes;
        if dirty {
            self.dirty_bytes += bytes;
        }
        if let Some(old) = self.entries.insert(
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
        self.ring.touch(id);
        self.debug_check();
    }

    /// Removes a cache entry, keeping the byte counters exact. The CLOCK ring drops ids without
    /// a cache entry when its hand reaches them.
    pub(crate) fn remove(&mut self, id: NodeId) -> Option<Entry> {
        let e = self.entries.remove(&id)?;
        self.cached_bytes -= e.bytes;
        if e.dirty {
            self.dirty_bytes -= e.bytes;
        }
        if e.evicting {
            self.evicting_bytes -= e.bytes;
        }
        self.debug_check();
        Some(e)
    }

    /// Pushes `msg` into the buffers of cached internal node `id` where it sits, marking it
    /// modified as [`Cachetable::insert`] of a dirty node at [`CLOCK_MAX`] would (see
    /// [`Store::push_in_place`]).
    pub(crate) fn push_in_place(&mut self, id: NodeId, msg: Msg, limit_bytes: usize) -> InPlacePush {
        let Some(e) = self.entries.get_mut(&id) else {
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
        // The entry's counters, as remove and insert would leave them.
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
        self.debug_check();
        if bytes > limit_bytes {
            InPlacePush::Gorged
        } else {
            InPlacePush::Done
        }
    }

    // --------------------------------------------------------------------------------------
    // Dirty and evicting marks
    // --------------------------------------------------------------------------------------

    /// Node `id` now lives in a written block: no longer dirty.
    pub(crate) fn mark_clean(&mut self, id: NodeId) {
        if let Some(e) = self.entries.get_mut(&id) {
            if e.dirty {
                e.dirty = false;
                self.dirty_bytes -= e.bytes;
            }
        }
        self.debug_check();
    }

    /// Returns a victim queued for the writeback thread to the CLOCK ring's normal course.
    pub(crate) fn unmark_evicting(&mut self, id: NodeId) {
        if let Some(e) = self.entries.get_mut(&id) {
            if e.evicting {
                e.evicting = false;
                self.evicting_bytes -= e.bytes;
            }
        }
        self.debug_check();
    }

    /// Returns every queued victim to the CLOCK ring's normal course.
    pub(crate) fn unmark_all_evicting(&mut self) {
        let evicting: Vec<NodeId> = self
            .entries
            .iter()
            .filter(|(_, e)| e.evicting)
            .map(|(id, _)| *id)
            .collect();
        for id in evicting {
            self.unmark_evicting(id);
        }
    }

    // --------------------------------------------------------------------------------------
    // The write-soon queue
    // --------------------------------------------------------------------------------------

    /// Queues node `id` to be written and evicted by the next writeback job.
    pub(crate) fn queue_write_soon(&mut self, id: NodeId) {
        self.write_soon.push(id);
    }

    /// Takes the write-soon queue (put back what is left with [`Cachetable::requeue_write_soon`]).
    pub(crate) fn take_write_soon(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.write_soon)
    }

    /// Puts ids taken from the write-soon queue back behind those queued meanwhile.
    pub(crate) fn requeue_write_soon(&mut self, ids: impl Iterator<Item = NodeId>) {
        self.write_soon.extend(ids);
    }

    /// Empties the write-soon queue (the victims in it keep their evicting mark).
    pub(crate) fn clear_write_soon(&mut self) {
        self.write_soon.clear();
    }

    /// Whether eviction victims wait for a writeback job to take them.
    pub(crate) fn victims_queued(&self) -> bool {
        self.evicting_bytes > 0 && !self.write_soon.is_empty()
    }

    // --------------------------------------------------------------------------------------
    // Background work's part of the budget
    // --------------------------------------------------------------------------------------

    /// Memory a background job holds outside the cache: `add` when it starts, `sub` when it
    /// ends. Eviction keeps the cache within the budget minus what is reserved.
    pub(crate) fn reserve(&mut self, add: usize, sub: usize) {
        debug_assert!(self.reserved_bytes + add >= sub, "released more than reserved");
        self.reserved_bytes = (self.reserved_bytes + add).saturating_sub(sub);
    }

    /// Keeps `bytes` of the budget (at most half) free for background threads.
    pub(crate) fn set_background_share(&mut self, bytes: usize) {
        self.background_share_bytes = bytes.min(self.budget_bytes / 2);
    }

    /// Declares whether a background writer takes the write-soon queue; without one, queued
    /// victims go back to the CLOCK ring's course.
    pub(crate) fn set_background_writes(&mut self, on: bool) {
        self.background_writes = on;
        if !on {
            for id in std::mem::take(&mut self.write_soon) {
                self.unmark_evicting(id);
            }
        }
    }
}
