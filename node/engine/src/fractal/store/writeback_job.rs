//! Writeback jobs: dirty nodes and spilled runs encoded and written beside the writer.

use super::*;

/// A dirty node as a checkpoint found it.
pub(crate) struct PendingNode {
    pub(crate) id: NodeId,
    pub(crate) node: Arc<Node>,
    /// Its BTT entry then (`None` for a node never written).
    pub(crate) loc_at_begin: Option<BlockLoc>,
    /// Writeback only: evict the node once its written block is adopted.
    pub(crate) evict_after: bool,
}

/// A node the checkpoint wrote.
pub(crate) struct WrittenNode {
    pub(crate) id: NodeId,
    pub(crate) node: Arc<Node>,
    pub(crate) loc_at_begin: Option<BlockLoc>,
    pub(crate) loc: BlockLoc,
    pub(crate) evict_after: bool,
    /// A leaf's skeleton, kept when the block is adopted.
    pub(crate) skeleton: Option<LeafSkeleton>,
}

/// A node or run block to read without the store (from [`Store::detached`]).
pub(crate) struct DetachedBlock {
    pub(crate) file: Arc<dyn VfsFile>,
    pub(crate) path: PathBuf,
    pub(crate) id: u64,
    pub(crate) loc: BlockLoc,
    /// A spilled run not written yet: its messages.
    pub(crate) pending: Option<Arc<Vec<Msg>>>,
}

impl DetachedBlock {
    pub(crate) fn location(&self, what: &str) -> String {
        format!(
            "{} {what} {} block @ offset {} ({} bytes)",
            self.path.display(),
            self.id,
            self.loc.offset,
            self.loc.size
        )
    }

    /// The whole block, checked against its BTT crc.
    pub(crate) fn read_checked(&self, location: &(impl std::fmt::Display + ?Sized)) -> Result<Vec<u8>> {
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
    pub(crate) fn read_node(&self) -> Result<Node> {
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
    pub(crate) fn read_node_and_skeleton(&self) -> Result<(Node, Option<LeafSkeleton>)> {
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
    pub(crate) fn read_run(&self) -> Result<Vec<Msg>> {
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
pub(crate) struct WritebackJob {
    pub(crate) file: Arc<dyn VfsFile>,
    pub(crate) path: PathBuf,
    pub(crate) compression_level: Option<i32>,
    pub(crate) space: Arc<Mutex<Space>>,
    pub(crate) block_bytes: Arc<BlockBytes>,
    pub(crate) nodes: Vec<PendingNode>,
    /// Pending spilled runs to encode and write.
    pub(crate) runs: Vec<(u64, Arc<Vec<Msg>>)>,
}

/// What [`WritebackJob::run`] wrote, for [`Store::finish_writeback`].
pub(crate) struct WritebackDone {
    pub(crate) written: Vec<WrittenNode>,
    pub(crate) written_runs: Vec<(u64, BlockLoc)>,
    pub(crate) stats: WritebackStats,
}

/// Figures of one background writeback.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct WritebackStats {
    /// Nodes encoded and written.
    pub(crate) nodes_written: u64,
    /// Bytes written.
    pub(crate) bytes_written: u64,
    /// Of those, bytes of leaves.
    pub(crate) leaf_bytes_written: u64,
    /// Written nodes adopted by the live tree (unchanged meanwhile).
    pub(crate) adopted: u64,
    /// Pending spilled runs encoded and written.
    pub(crate) runs_written: u64,
    /// Time encoding and writing took (engine lock not held), in microseconds.
    pub(crate) write_us: u64,
}

impl WritebackJob {
    #[cfg(test)]
    /// Whether the job holds no node and no run.
    pub(crate) fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.runs.is_empty()
    }

    /// Writes `enc` to a fresh block (not claimed by a checkpoint); `what` names it in errors.
    pub(crate) fn write_block(&self, enc: &[u8], what: impl Fn() -> String) -> Result<BlockLoc> {
        write_fresh_block(
            self.file.as_ref(),
            &self.path,
            &self.space,
            &self.block_bytes,
            BlockClaim::Writeback,
            enc,
            what,
        )
    }

    /// Encodes and writes every node of the job to a fresh block (copy-on-write; nothing
    /// durable refers to these blocks until a checkpoint does, so no sync). Takes only the space
    /// mutex (per allocation), never the engine lock.
    ///
    /// Errors: `NoSpace` for a full disk (the caller keeps the nodes dirty and retries later),
    /// `Io` for any other failed write (the caller poisons the engine); `InvalidArgument` for a
    /// node above 4 GiB encoded. On an error the blocks the job wrote are free again (nothing
    /// refers to them).
    pub(crate) fn run(self) -> Result<WritebackDone> {
        let space = Arc::clone(&self.space);
        let mut wrote = Vec::new();
        let r = self.run_writing(&mut wrote);
        if r.is_err() {
            let mut space = space.lock();
            for loc in wrote {
                space.unalloc(loc.offset, loc.alloc_bytes());
            }
        }
        r
    }

    /// The body of [`WritebackJob::run`]; every block written is pushed to `wrote`.
    fn run_writing(mut self, wrote: &mut Vec<BlockLoc>) -> Result<WritebackDone> {
        let started = Instant::now();
        let mut stats = WritebackStats::default();
        let mut written_runs = Vec::with_capacity(self.runs.len());
        for (id, msgs) in std::mem::take(&mut self.runs) {
            let enc = encode_run(id, &msgs, self.compression_level)?;
            let loc = self.write_block(&enc, || format!("run {id}"))?;
            wrote.push(loc);
            stats.runs_written += 1;
            stats.bytes_written += enc.len() as u64;
            recycle_block_buf(enc);
            written_runs.push((id, loc));
        }
        let mut written = Vec::with_capacity(self.nodes.len());
        for n in std::mem::take(&mut self.nodes) {
            let enc = encode_node(n.id, &n.node, self.compression_level)?;
            let loc = self.write_block(&enc, || format!("node {}", n.id))?;
            wrote.push(loc);
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

impl Store {
    /// Background writeback (PerconaFT's cachetable writes dirty pairs on background threads,
    /// `ft/cachetable/cachetable.cc`): takes references to the nodes queued by
    /// [`Store::write_and_evict_soon`], then, when dirty nodes exceed `limit_bytes`, to idle
    /// dirty leaves (one batch unmodified: a flush leaves a leaf alone afterwards), oldest
    /// first, and above 1.5x the limit also to internal nodes idle for [`IDLE_EPOCHS`] batches,
    /// until half the limit would be left or the job holds an eighth of the budget. The job
    /// encodes and writes them without the engine lock ([`WritebackJob::run`]). Nodes a
    /// checkpoint or another writeback holds are left out. `None` when nothing is due. Call
    /// [`Store::next_write_epoch`] once per write batch.
    pub(crate) fn begin_writeback(&mut self, limit_bytes: usize, pinned: NodeId) -> Option<WritebackJob> {
        // A job holds at most an eighth of the budget (at least one node): small jobs are
        // adopted sooner, and a node the writer changes while a job holds it is copied.
        let cap = (self.budget_bytes() / 8).max(1);
        let mut job_bytes = 0usize;
        // Pending runs first: they hold memory until written.
        let runs = self.take_pending_for_job();
        // Then the nodes to write and evict (held by a checkpoint: left to eviction).
        let mut nodes = Vec::new();
        let mut soon = self.cachetable.take_write_soon().into_iter();
        for id in soon.by_ref() {
            let Some(e) = self.cachetable.entry(id) else {
                continue;
            };
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
                    self.cachetable.unmark_evicting(id);
                } else {
                    self.cachetable.remove(id);
                }
            }
        }
        self.cachetable.requeue_write_soon(soon);
        if self.cachetable.dirty_bytes() <= limit_bytes || job_bytes >= cap {
            return (!nodes.is_empty() || !runs.is_empty()).then(|| self.writeback_job(nodes, runs));
        }
        let idle_internal = self.cachetable.write_epoch().saturating_sub(IDLE_EPOCHS);
        let idle_leaf = self.cachetable.write_epoch().saturating_sub(1);
        // Internal nodes take a flush every few batches, so writing them early is mostly undone
        // by the next flush: only when dirty nodes reach 1.5x the limit.
        let internal_ok = self.cachetable.dirty_bytes() > limit_bytes / 2 * 3;
        let mut dirty: Vec<(bool, u64, u8, NodeId, usize)> = self
            .cachetable
            .entries()
            .filter(|(id, e)| {
                let leaf = e.node.height() == 0;
                let idle_before = if leaf { idle_leaf } else { idle_internal };
                e.dirty
                    && (leaf || internal_ok)
                    && *id != pinned
                    && e.modified_epoch <= idle_before
                    && Arc::strong_count(&e.node) == 1
            })
            .map(|(id, e)| {
                (
                    e.node.height() > 0,
                    e.modified_epoch,
                    e.clock.load(Ordering::Relaxed),
                    id,
                    e.bytes,
                )
            })
            .collect();
        // Leaves first, then the longest idle.
        dirty.sort_unstable();
        let mut left = self.cachetable.dirty_bytes();
        for (_, _, _, id, bytes) in dirty {
            if left <= limit_bytes / 2 || job_bytes >= cap {
                break;
            }
            let Some(e) = self.cachetable.entry(id) else {
                continue;
            };
            job_bytes += bytes;
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

    pub(crate) fn writeback_job(
        &self,
        nodes: Vec<PendingNode>,
        runs: Vec<(u64, Arc<Vec<Msg>>)>,
    ) -> WritebackJob {
        WritebackJob {
            file: Arc::clone(&self.file),
            path: self.path.clone(),
            compression_level: self.compression_level,
            space: Arc::clone(&self.space),
            block_bytes: Arc::clone(&self.block_bytes),
            nodes,
            runs,
        }
    }

    /// Adopts run `id` written to `loc` by a background job: the BTT points at it when the run
    /// is still pending; otherwise (merged or flushed meanwhile, or written by another job) the
    /// block is released.
    pub(crate) fn adopt_run(&mut self, id: u64, loc: BlockLoc) -> bool {
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
    pub(crate) fn finish_writeback(&mut self, done: WritebackDone, root: NodeId) -> WritebackStats {
        let mut stats = done.stats;
        for (id, loc) in done.written_runs {
            self.adopt_run(id, loc);
        }
        for mut w in done.written {
            if self.adopt_written(&w, true) {
                self.keep_skeleton(w.id, w.loc, w.skeleton.take());
                if w.evict_after && w.id != root {
                    // The CLOCK ring drops ids without a cache entry when its hand reaches them.
                    self.cachetable.remove(w.id);
                } else if w.evict_after {
                    // Became the root meanwhile: it stays.
                    self.cachetable.unmark_evicting(w.id);
                }
                stats.adopted += 1;
            } else if w.evict_after {
                // Modified meanwhile (then a new entry, unmarked) or written otherwise: back to
                // the CLOCK ring.
                self.cachetable.unmark_evicting(w.id);
            }
        }
        stats
    }

    /// Adopts a block a background job wrote for `w.id` when the node is unchanged since the
    /// job began (the same cached `Arc`, still dirty if `require_dirty`, the same BTT entry):
    /// the BTT points at the new block, the old one is released and the node is clean. Otherwise
    /// the written block is released. Returns whether it adopted.
    pub(crate) fn adopt_written(&mut self, w: &WrittenNode, require_dirty: bool) -> bool {
        let unchanged = self
            .cachetable
            .entry(w.id)
            .is_some_and(|e| (e.dirty || !require_dirty) && Arc::ptr_eq(&e.node, &w.node))
            && self.btt.get(&w.id).copied() == w.loc_at_begin;
        if unchanged {
            self.btt.insert(w.id, w.loc);
            if let Some(old) = w.loc_at_begin {
                self.release(old);
            }
            self.cachetable.mark_clean(w.id);
        } else {
            self.release(w.loc);
        }
        unchanged
    }
}
