//! Checkpoint jobs: begin under the lock, write beside the writers, finish under the lock.

use super::*;

/// A checkpoint between [`Store::begin_checkpoint`] and [`Store::finish_checkpoint`]: the
/// snapshot to write. Holds no engine lock; run it on any thread.
pub(crate) struct CheckpointJob {
    pub(crate) file: Arc<dyn VfsFile>,
    pub(crate) path: PathBuf,
    pub(crate) compression_level: Option<i32>,
    pub(crate) space: Arc<Mutex<Space>>,
    pub(crate) block_bytes: Arc<BlockBytes>,
    pub(crate) counter: u64,
    pub(crate) root: NodeId,
    pub(crate) next_msn: Msn,
    pub(crate) next_node_id: NodeId,
    pub(crate) meta: Option<Vec<u8>>,
    /// BTT entries of nodes that were clean at the begin (their blocks are already written).
    pub(crate) clean: Vec<(NodeId, BlockLoc)>,
    /// Dirty nodes to write, by id.
    pub(crate) nodes: Vec<PendingNode>,
    /// Spilled runs not written yet (the checkpoint refers to them, so it writes them).
    pub(crate) runs: Vec<(u64, Arc<Vec<Msg>>)>,
    pub(crate) begin_us: u64,
}

/// What [`CheckpointJob::run`] wrote, for [`Store::finish_checkpoint`].
pub(crate) struct CheckpointDone {
    pub(crate) counter: u64,
    pub(crate) written: Vec<WrittenNode>,
    pub(crate) written_runs: Vec<(u64, BlockLoc)>,
    pub(crate) stats: CheckpointStats,
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
    /// Bytes of free space inside the file given back to the file system by this checkpoint
    /// (holes punched in free extents of at least `limits::PUNCH_MIN_BYTES`).
    pub punched_bytes: u64,
}

impl CheckpointJob {
    /// Encodes and writes every node of the snapshot to fresh blocks, then the BTT block, syncs,
    /// writes the alternate header and syncs again: the checkpoint is durable when this
    /// returns. Takes only the space mutex (per allocation), never the engine lock.
    ///
    /// Errors: `NoSpace` when writing a block met a full disk: nothing durable changed, the
    /// blocks written are free again, and the checkpoint may be retried once space is freed;
    /// `Io` for any other failed write, for the header write and for a failed sync (the engine
    /// must then stop writing: the caller poisons it); `InvalidArgument` for a node or BTT above
    /// 4 GiB encoded.
    pub(crate) fn run(self) -> Result<CheckpointDone> {
        let space = Arc::clone(&self.space);
        let mut wrote = Vec::new();
        let r = self.run_writing(&mut wrote);
        if let Err(e) = &r {
            if e.is_no_space() {
                let mut space = space.lock();
                for loc in wrote {
                    space.unalloc(loc.offset, loc.alloc_bytes());
                }
            }
        }
        r
    }

    /// The body of [`CheckpointJob::run`]; the blocks written before the header are pushed to
    /// `wrote`.
    fn run_writing(mut self, wrote: &mut Vec<BlockLoc>) -> Result<CheckpointDone> {
        let started = Instant::now();
        let mut stats = CheckpointStats {
            counter: self.counter,
            begin_us: self.begin_us,
            ..CheckpointStats::default()
        };
        let mut entries = self.clean.clone();
        let written_runs = self.write_runs(wrote, &mut stats)?;
        entries.extend(written_runs.iter().copied());
        let nodes = std::mem::take(&mut self.nodes);
        let mut written = Vec::with_capacity(nodes.len());
        for (lane_written, bytes) in self.write_nodes(nodes, wrote)? {
            stats.nodes_written += lane_written.len() as u64;
            stats.bytes_written += bytes;
            entries.extend(lane_written.iter().map(|w| (w.id, w.loc)));
            written.extend(lane_written);
        }
        entries.sort_unstable_by_key(|e| e.0);
        self.write_btt_and_header(entries, wrote, &mut stats)?;
        stats.write_us = started.elapsed().as_micros() as u64;
        Ok(CheckpointDone {
            counter: self.counter,
            written,
            written_runs,
            stats,
        })
    }

    /// Encodes and writes the pending runs; returns where each went.
    fn write_runs(
        &mut self,
        wrote: &mut Vec<BlockLoc>,
        stats: &mut CheckpointStats,
    ) -> Result<Vec<(u64, BlockLoc)>> {
        let mut written_runs = Vec::with_capacity(self.runs.len());
        for (id, msgs) in std::mem::take(&mut self.runs) {
            let enc = encode_run(id, &msgs, self.compression_level)?;
            let loc = self.write_block(&enc, || format!("checkpoint run {id}"))?;
            wrote.push(loc);
            stats.bytes_written += enc.len() as u64;
            recycle_block_buf(enc);
            written_runs.push((id, loc));
        }
        Ok(written_runs)
    }

    /// Encodes and writes `nodes`. Encoding (zstd) dominates: the nodes are dealt round-robin
    /// to one lane per core, each encoding and writing its nodes (one encoded block in memory
    /// per lane). Returns each lane's written nodes and bytes; the blocks of every lane that
    /// finished are pushed to `wrote` before an error of another is returned.
    fn write_nodes(
        &self,
        nodes: Vec<PendingNode>,
        wrote: &mut Vec<BlockLoc>,
    ) -> Result<Vec<(Vec<WrittenNode>, u64)>> {
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
        let mut first_error = None;
        let mut finished = Vec::with_capacity(lanes);
        for r in self.run_lanes(dealt) {
            match r {
                Ok(lane) => {
                    wrote.extend(lane.0.iter().map(|w| w.loc));
                    finished.push(lane);
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(finished),
        }
    }

    /// Runs [`CheckpointJob::write_lane`] for each lane of `dealt`, on a thread each when there
    /// is more than one.
    fn run_lanes(&self, dealt: Vec<Vec<PendingNode>>) -> Vec<Result<(Vec<WrittenNode>, u64)>> {
        if dealt.len() == 1 {
            return dealt.into_iter().map(|lane| self.write_lane(lane)).collect();
        }
        std::thread::scope(|scope| {
            let handles: Vec<_> = dealt
                .into_iter()
                .map(|lane| scope.spawn(move || self.write_lane(lane)))
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
    }

    /// Writes the new BTT (`entries`, sorted by id), syncs, writes this checkpoint's header
    /// slot and syncs again: from then on the checkpoint is durable.
    fn write_btt_and_header(
        &mut self,
        entries: Vec<(NodeId, BlockLoc)>,
        wrote: &mut Vec<BlockLoc>,
        stats: &mut CheckpointStats,
    ) -> Result<()> {
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
        wrote.push(btt_loc);
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
        Ok(())
    }

    /// Encodes and writes `nodes` (one lane of [`CheckpointJob::run`]); returns what it wrote
    /// and the bytes.
    /// On an error the blocks the lane wrote are free again.
    pub(crate) fn write_lane(&self, nodes: Vec<PendingNode>) -> Result<(Vec<WrittenNode>, u64)> {
        let mut written = Vec::with_capacity(nodes.len());
        let r = self.write_lane_into(nodes, &mut written);
        if r.is_err() {
            let mut space = self.space.lock();
            for w in &written {
                space.unalloc(w.loc.offset, w.loc.alloc_bytes());
            }
        }
        r.map(|bytes| (written, bytes))
    }

    /// The body of [`CheckpointJob::write_lane`]: pushes each node written to `written` and
    /// returns the bytes.
    fn write_lane_into(&self, nodes: Vec<PendingNode>, written: &mut Vec<WrittenNode>) -> Result<u64> {
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
        Ok(bytes)
    }

    /// Writes `enc` to a block the checkpoint in progress claims.
    pub(crate) fn write_block(&self, enc: &[u8], what: impl Fn() -> String) -> Result<BlockLoc> {
        write_fresh_block(
            self.file.as_ref(),
            &self.path,
            &self.space,
            &self.block_bytes,
            BlockClaim::Checkpoint,
            enc,
            what,
        )
    }
}

impl Store {
    /// Starts a checkpoint of the tree as it is now (`root`, counters and `meta`): takes a
    /// reference to every dirty node and a copy of the BTT. Costs memory references only, no
    /// I/O: the engine lock is held for well under a millisecond per thousand nodes. Until
    /// [`Store::finish_checkpoint`], the blocks the checkpoint refers to are kept.
    ///
    /// Panics if a checkpoint is already in progress (callers serialize checkpoints).
    pub(crate) fn begin_checkpoint(
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
            .cachetable
            .entries()
            .filter(|(_, e)| e.dirty)
            .map(|(id, e)| PendingNode {
                id,
                node: Arc::clone(&e.node),
                loc_at_begin: self.btt.get(&id).copied(),
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
            block_bytes: Arc::clone(&self.block_bytes),
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
    /// the space forgets the checkpoint before the previous one, the file is cut back to the
    /// allocated end, and free extents of at least `limits::PUNCH_MIN_BYTES` that no checkpoint refers
    /// to any more are given back to the file system (`punch_hole`, each once: a bulk load's
    /// staging space or a deleted range does not keep its disk blocks while it waits for reuse;
    /// reused space is written again as usual). Memory work plus one `set_len` and a
    /// `punch_hole` per new free extent.
    ///
    /// Errors: `Io` when the file length cannot be read or cut, or a hole cannot be punched.
    pub(crate) fn finish_checkpoint(&mut self, done: CheckpointDone) -> Result<CheckpointStats> {
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
        // Under the space mutex: no allocation can hand out a range while it is punched.
        for (offset, len) in space.take_new_holes() {
            self.file
                .punch_hole(offset, len)
                .map_err(io_err("punch a free extent of the tree file"))?;
            stats.punched_bytes += len;
        }
        drop(space);
        stats.finish_us = started.elapsed().as_micros() as u64;
        Ok(stats)
    }

    /// Forgets a checkpoint whose [`CheckpointJob::run`] failed (the file still holds the
    /// previous checkpoint; after a full disk the dirty nodes are still dirty, and the
    /// checkpoint may be taken again).
    pub(crate) fn abort_checkpoint(&mut self) {
        self.checkpoint_running = false;
        self.space.lock().abort();
    }

    /// Writes a whole checkpoint on the calling thread (begin, run, finish).
    pub(crate) fn checkpoint(
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
