//! The cachetable: cached nodes under a byte budget, CLOCK eviction, dirty-node accounting.

use super::*;

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
            cache: HashMap::new(),
            ring: ClockRing::default(),
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
        self.cache.keys().copied()
    }

    /// Bytes of cached nodes.
    pub(crate) fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }

    /// Evictions since open.
    pub(crate) fn eviction_stats(&self) -> EvictionStats {
        self.eviction_stats
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
    pub(crate) fn memory_bytes(&self) -> usize {
        (self.cached_bytes - self.evicting_bytes)
            + self.partial_bytes
            + self.pending_run_bytes
            + self.background_bytes()
    }

    /// What background work holds against the budget: flushes in flight and eviction victims
    /// queued for the writeback thread, or the share kept free for them if that is more.
    pub(crate) fn background_bytes(&self) -> usize {
        (self.reserved_bytes + self.evicting_bytes).max(self.background_share_bytes)
    }

    /// Bytes background flushes in flight hold (reserved from the budget).
    pub(crate) fn reserved_bytes(&self) -> usize {
        self.reserved_bytes
    }

    /// Cache budget in bytes.
    pub(crate) fn budget_bytes(&self) -> usize {
        self.budget_bytes
    }

    /// Checks that allocated blocks, pending blocks and free extents never overlap and lie in
    /// the block area; returns a description of the first violation.
    pub(crate) fn check_space(&self) -> std::result::Result<(), String> {
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

    pub(crate) fn touch_ring(&mut self, id: NodeId) {
        self.ring.touch(id);
    }

    /// The node `id`, loaded from disk if not cached.
    pub(crate) fn get(&mut self, id: NodeId) -> Result<&Node> {
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
    pub(crate) fn is_cached(&self, id: NodeId) -> bool {
        self.cache.contains_key(&id)
    }

    /// The cached node `id` without loading (readers under a shared lock); `None` on a miss.
    pub(crate) fn peek(&self, id: NodeId) -> Option<&Node> {
        self.cache.get(&id).map(|e| {
            bump(&e.clock);
            &*e.node
        })
    }

    /// Cached node `id` without touching its CLOCK count (for scans of the cache that must not
    /// change what gets evicted).
    pub(crate) fn peek_quiet(&self, id: NodeId) -> Option<&Node> {
        self.cache.get(&id).map(|e| &*e.node)
    }

    /// Removes a cache entry, keeping the byte counters exact.
    pub(crate) fn remove_entry(&mut self, id: NodeId) -> Option<Entry> {
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

    pub(crate) fn insert(&mut self, id: NodeId, node: Node, dirty: bool, clock: u8) {
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
    pub(crate) fn take(&mut self, id: NodeId) -> Result<Node> {
        match self.remove_entry(id) {
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
        self.insert(id, node, true, clock);
    }

    /// Pushes `msg` into the buffers of cached internal node `id` where it sits in the cache
    /// (no take and put: the root takes every message), marking it modified as
    /// [`Store::put`] would. `NotHere` (the message back) when the node is not cached, is a
    /// leaf, has one child, or is shared with a checkpoint or writeback job in progress;
    /// `Gorged` when the message is in and the node is now over `limit_bytes`.
    pub(crate) fn push_in_place(&mut self, id: NodeId, msg: Msg, limit_bytes: usize) -> InPlacePush {
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
    pub(crate) fn under_pressure(&self) -> bool {
        self.memory_bytes() > self.budget_bytes / 4 * 3
    }

    /// Forgets node `id` (merged away): drops it from the cache and frees its block.
    pub(crate) fn delete(&mut self, id: NodeId) {
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
    /// every dirty victim was written inline, together with [`crate::fractal::msg::key_cmp`]). `pinned`
    /// (the root) is never evicted. Errors: `Io` from writing a dirty victim.
    pub(crate) fn evict_to_budget(&mut self, pinned: NodeId) -> Result<()> {
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
        // A full disk: dirty nodes stay cached (the cache outgrows its budget) until writes are
        // tried again (module `no_space`).
        let mut hold = self.holding_dirty();
        if hold && self.cached_bytes.saturating_sub(self.dirty_bytes) == 0 {
            // Nothing clean to evict: no walk of the ring on every message meanwhile.
            return Ok(());
        }
        while self.cached_bytes - self.evicting_bytes > budget
            && self.cache.len() > 1
            && !self.ring.is_empty()
        {
            steps += 1;
            if steps > 8 * (ring_len_at_start + 8) {
                break;
            }
            let Some(id) = self.ring.current() else {
                break;
            };
            let Some(e) = self.cache.get_mut(&id) else {
                self.ring.remove_current();
                continue;
            };
            if id == pinned || (e.evicting && e.dirty) {
                self.ring.advance();
                continue;
            }
            let c = e.clock.get_mut();
            if *c > 0 {
                *c -= 1;
                self.ring.advance();
                continue;
            }
            if e.dirty {
                if hold {
                    self.ring.advance();
                    continue;
                }
                if dirty_skips < ring_len_at_start {
                    dirty_skips += 1;
                    self.ring.advance();
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
                    self.ring.advance();
                    continue;
                }
                if e.node.height() == 0 {
                    self.eviction_stats.inline_leaves += 1;
                } else {
                    self.eviction_stats.inline_internal += 1;
                }
                self.eviction_stats.inline_bytes += e.bytes as u64;
                let enc = encode_node(id, &e.node, self.compression_level)?;
                match self.write_encoded(id, enc) {
                    Ok(()) => {}
                    Err(err) if err.is_no_space() => {
                        self.hold_dirty(&err);
                        hold = true;
                        self.ring.advance();
                        continue;
                    }
                    Err(err) => return Err(err),
                }
            } else {
                self.eviction_stats.clean += 1;
            }
            self.remove_entry(id);
            self.ring.remove_current();
        }
        Ok(())
    }

    /// Memory a background job holds outside the cache: `add` when it starts, `sub` when it
    /// ends. Eviction keeps the cache within the budget minus what is reserved.
    pub(crate) fn reserve(&mut self, add: usize, sub: usize) {
        debug_assert!(self.reserved_bytes + add >= sub, "released more than reserved");
        self.reserved_bytes = (self.reserved_bytes + add).saturating_sub(sub);
    }

    /// Keeps `bytes` of the budget free for background threads (see `background_share_bytes`).
    pub(crate) fn set_background_share(&mut self, bytes: usize) {
        self.background_share_bytes = bytes.min(self.budget_bytes / 2);
    }

    /// Declares that a background writer adopts the jobs of [`Store::begin_writeback`].
    pub(crate) fn set_background_writes(&mut self, on: bool) {
        self.background_writes = on;
        if !on {
            for id in std::mem::take(&mut self.write_soon) {
                self.unmark_evicting(id);
            }
        }
    }

    /// Like [`Store::write_and_evict`], but with a background writer the node is handed to the
    /// next writeback job and evicted once it is written, so the writer does not encode it.
    pub(crate) fn write_and_evict_soon(&mut self, id: NodeId) -> Result<()> {
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
    /// On a full disk, or while the store holds dirty data, a dirty node stays cached.
    pub(crate) fn write_and_evict(&mut self, id: NodeId) -> Result<()> {
        let hold = self.holding_dirty();
        if let Some(e) = self.cache.get(&id) {
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
            self.remove_entry(id);
            // The CLOCK ring drops ids without a cache entry when its hand reaches them.
        }
        Ok(())
    }

    /// Returns a victim queued for the writeback thread to the CLOCK ring's normal course.
    pub(crate) fn unmark_evicting(&mut self, id: NodeId) {
        if let Some(e) = self.cache.get_mut(&id) {
            if e.evicting {
                e.evicting = false;
                self.evicting_bytes -= e.bytes;
            }
        }
    }

    pub(crate) fn mark_clean(&mut self, id: NodeId) {
        if let Some(e) = self.cache.get_mut(&id) {
            if e.dirty {
                e.dirty = false;
                self.dirty_bytes -= e.bytes;
            }
        }
    }

    /// Bytes of dirty cached nodes.
    pub(crate) fn dirty_bytes(&self) -> usize {
        self.dirty_bytes
    }

    /// Incremental checkpointing: when dirty nodes exceed `limit_bytes`, writes those left
    /// unmodified for the longest (at least `IDLE_EPOCHS` = 8 write batches; copy-on-write; they
    /// stay cached, now clean) until half the limit is left, so a checkpoint only has a bounded
    /// amount left to write. Nodes modified in the last few batches (the root and the internal
    /// nodes taking flushes) are left for eviction or the checkpoint: writing them now would be
    /// undone by the next flush. `pinned` (the root) is never written here.
    pub(crate) fn write_some_dirty(&mut self, limit_bytes: usize, pinned: NodeId) -> Result<()> {
        self.write_epoch += 1;
        if self.dirty_bytes <= limit_bytes || self.holding_dirty() {
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
            match self.write_encoded(id, enc) {
                Ok(()) => self.mark_clean(id),
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
        self.write_epoch += 1;
    }
}
