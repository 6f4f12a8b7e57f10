//! Nodes in and out of the cachetable: loading on a miss, taking a node for modification and
//! putting it back, writing dirty nodes (eviction to the budget, write-and-evict, the
//! incremental writer) and forgetting merged-away nodes. The accounting lives in
//! [`Cachetable`]; this module adds the block I/O.

use super::*;

impl Store {
    /// The node `id`, loaded from disk if not cached.
    pub(crate) fn get(&mut self, id: NodeId) -> Result<&Node> {
        if !self.cachetable.contains(id) {
            let block = self.detached(id)?;
            let (node, sk) = block.read_node_and_skeleton()?;
            self.cachetable.insert(id, node, false, 1);
            self.keep_skeleton(id, block.loc, sk);
        }
        match self.cachetable.peek(id) {
            Some(node) => Ok(node),
            None => Err(EngineError::Corruption {
                location: format!("{} cache", self.path.display()),
                detail: format!("node {id} vanished from the cache"),
            }),
        }
    }

    /// Whether node `id` is in the cache.
    pub(crate) fn is_cached(&self, id: NodeId) -> bool {
        self.cachetable.contains(id)
    }

    /// The cached node `id` without loading (readers under a shared lock); `None` on a miss.
    pub(crate) fn peek(&self, id: NodeId) -> Option<&Node> {
        self.cachetable.peek(id)
    }

    /// Cached node `id` without touching its CLOCK count (for scans of the cache that must not
    /// change what gets evicted).
    pub(crate) fn peek_quiet(&self, id: NodeId) -> Option<&Node> {
        self.cachetable.peek_quiet(id)
    }

    /// Removes node `id` from the cache (loading it if needed) for modification. Put it back
    /// with [`Store::put`].
    pub(crate) fn take(&mut self, id: NodeId) -> Result<Node> {
        match self.cachetable.remove(id) {
            // Copied only when a checkpoint in progress still holds it.
            Some(e) => Ok(Arc::unwrap_or_clone(e.node)),
            None => self.read_node(id),
        }
    }

    /// Puts a (modified) node into the cache as dirty. Internal nodes (touched by every flush
    /// through them) start at the highest CLOCK count, leaves at one: under pressure leaves go
    /// first.
    pub(crate) fn put(&mut self, id: NodeId, node: Node) {
        let clock = if node.height() > 0 { CLOCK_MAX } else { 1 };
        self.cachetable.insert(id, node, true, clock);
    }

    /// Pushes `msg` into the buffers of cached internal node `id` where it sits in the cache
    /// (no take and put: the root takes every message), marking it modified as
    /// [`Store::put`] would. `NotHere` (the message back) when the node is not cached, is a
    /// leaf, has one child, or is shared with a checkpoint or writeback job in progress;
    /// `Gorged` when the message is in and the node is now over `limit_bytes`.
    pub(crate) fn push_in_place(&mut self, id: NodeId, msg: Msg, limit_bytes: usize) -> InPlacePush {
        self.cachetable.push_in_place(id, msg, limit_bytes)
    }

    /// Forgets node `id` (merged away): drops it from the cache and frees its block.
    pub(crate) fn delete(&mut self, id: NodeId) {
        if let Some(p) = self.partial.remove(&id) {
            self.partial_bytes -= p.bytes;
        }
        if let Some(p) = self.partial_internal.remove(&id) {
            self.partial_bytes -= p.bytes;
        }
        self.cachetable.remove(id);
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

    /// Evicts nodes with CLOCK until the cache fits its budget (see module `clock` of the
    /// cachetable). Clean victims go first; a dirty one is taken only after the hand passed a
    /// ring's length of dirty victims, and then queued for the writeback thread (evicted once
    /// written, counted in the background share) or, when that share is full or there is no
    /// thread, written here (copy-on-write); the writeback thread writes dirty nodes on the
    /// other core (clean-first measured on the 10 M-row beyond-memory load: 409,663 and 384,526
    /// rows/s against 386,082 and 320,596 when every dirty victim was written inline, together
    /// with [`crate::fractal::msg::key_cmp`]). `pinned` (the root) is never evicted. Errors:
    /// `Io` from writing a dirty victim.
    pub(crate) fn evict_to_budget(&mut self, pinned: NodeId) -> Result<()> {
        self.give_back_partial_overshoot(pinned);
        let target = self.cache_target_bytes();
        // A full disk: dirty nodes stay cached (the cache outgrows its budget) until writes are
        // tried again (module `no_space`).
        let hold = self.holding_dirty();
        if hold && self.cachetable.all_dirty() {
            // Nothing clean to evict: no walk of the ring on every message meanwhile.
            return Ok(());
        }
        let mut walk = self.cachetable.eviction_walk(target, pinned, hold);
        while let Some(victim) = self.cachetable.next_inline_victim(&mut walk) {
            let enc = encode_node(victim.id, &victim.node, self.compression_level)?;
            drop(victim.node);
            match self.write_encoded(victim.id, enc) {
                Ok(()) => self.cachetable.evict_victim(victim.id),
                Err(err) if err.is_no_space() => {
                    self.hold_dirty(&err);
                    walk.hold = true;
                    self.cachetable.pass_victim();
                }
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// The side cache of partial reads gives back what it borrowed beyond its quarter of the
    /// budget first, just the overshoot (a read phase's working set survives one write).
    fn give_back_partial_overshoot(&mut self, pinned: NodeId) {
        let budget = self.budget_bytes();
        let over = self.memory_bytes().saturating_sub(budget);
        if over > 0 {
            let cap = (budget / 4).max(self.partial_bytes.saturating_sub(over));
            self.trim_partial_to(cap, pinned, false);
        }
    }

    /// What eviction keeps the cache's held bytes within: the budget less the side cache, the
    /// pending runs and background work.
    fn cache_target_bytes(&self) -> usize {
        self.budget_bytes()
            .saturating_sub(self.partial_bytes + self.pending_run_bytes + self.cachetable.background_bytes())
    }

    /// Declares that a background writer adopts the jobs of [`Store::begin_writeback`].
    pub(crate) fn set_background_writes(&mut self, on: bool) {
        self.cachetable.set_background_writes(on);
    }

    /// Like [`Store::write_and_evict`], but with a background writer the node is handed to the
    /// next writeback job and evicted once it is written, so the writer does not encode it.
    pub(crate) fn write_and_evict_soon(&mut self, id: NodeId) -> Result<()> {
        if !self.cachetable.background_writes() {
            return self.write_and_evict(id);
        }
        match self.cachetable.entry(id) {
            Some(e) if e.dirty => self.cachetable.queue_write_soon(id),
            Some(_) => {
                self.cachetable.remove(id);
            }
            None => {}
        }
        Ok(())
    }

    /// Writes node `id` if it is cached and dirty (copy-on-write), then drops it from the cache.
    /// On a full disk, or while the store holds dirty data, a dirty node stays cached.
    pub(crate) fn write_and_evict(&mut self, id: NodeId) -> Result<()> {
        let hold = self.holding_dirty();
        if let Some(e) = self.cachetable.entry(id) {
            if e.dirty {
                if hold {
                    return Ok(());
                }
                let enc = encode_node(id, &e.node, self.compression_level)?;
                match self.write_encoded(id, enc) {
                    Ok(()) => {}
                    Err(err) if err.is_no_space() => {
                        self.hold_dirty(&err);
                        return Ok(());
                    }
                    Err(err) => return Err(err),
                }
            }
            self.cachetable.remove(id);
        }
        Ok(())
    }

    /// Incremental checkpointing: when dirty nodes exceed `limit_bytes`, writes those left
    /// unmodified for the longest (at least `IDLE_EPOCHS` = 8 write batches; copy-on-write; they
    /// stay cached, now clean) until half the limit is left, so a checkpoint only has a bounded
    /// amount left to write. Nodes modified in the last few batches (the root and the internal
    /// nodes taking flushes) are left for eviction or the checkpoint: writing them now would be
    /// undone by the next flush. `pinned` (the root) is never written here.
    pub(crate) fn write_some_dirty(&mut self, limit_bytes: usize, pinned: NodeId) -> Result<()> {
        self.cachetable.next_write_epoch();
        if self.cachetable.dirty_bytes() <= limit_bytes || self.holding_dirty() {
            return Ok(());
        }
        let idle_before = self.cachetable.write_epoch().saturating_sub(IDLE_EPOCHS);
        let mut dirty: Vec<(u64, u8, NodeId)> = self
            .cachetable
            .entries()
            // A node a checkpoint in progress holds is being written by it (and adopted after).
            .filter(|(id, e)| {
                e.dirty && *id != pinned && e.modified_epoch <= idle_before && Arc::strong_count(&e.node) == 1
            })
            .map(|(id, e)| (e.modified_epoch, e.clock.load(Ordering::Relaxed), id))
            .collect();
        dirty.sort_unstable();
        for (_, _, id) in dirty {
            if self.cachetable.dirty_bytes() <= limit_bytes / 2 {
                break;
            }
            let Some(e) = self.cachetable.entry(id) else {
                continue;
            };
            let enc = encode_node(id, &e.node, self.compression_level)?;
            match self.write_encoded(id, enc) {
                Ok(()) => self.cachetable.mark_clean(id),
                Err(err) if err.is_no_space() => {
                    self.hold_dirty(&err);
                    break;
                }
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }

    /// Starts a new write epoch (one per write batch): the clock by which writeback tells
    /// recently modified nodes from idle ones. [`Store::write_some_dirty`] does it itself.
    pub(crate) fn next_write_epoch(&mut self) {
        self.cachetable.next_write_epoch();
    }
}
