//! Spilling: a gorged buffer whose child is not cached writes its messages to a run.

use super::*;

impl Tree {
    /// When child `i` is not cached, writes buffer `i`'s point messages as a run on disk instead
    /// of reading the child (see [`RunRef`]); true when it did and the child's runs are still
    /// below a node's worth (so the flush into the child can wait). Buffers holding range
    /// messages are flushed normally (range messages never go to runs).
    pub(crate) fn spill_if_child_uncached(&mut self, n: &mut Internal, i: usize) -> Result<bool> {
        let (Some(b), Some(&cid)) = (n.buffers.get(i), n.children.get(i)) else {
            return Ok(false);
        };
        if self.store.is_cached(cid) || !b.range_msgs().is_empty() || b.bytes() == 0 {
            return Ok(false);
        }
        let Some(b) = n.buffers.get_mut(i) else {
            return Ok(false);
        };
        let msgs = b.take_points();
        let run = self.write_run(msgs)?;
        b.push_spilled(run);
        self.spill_stats.runs_spilled += 1;
        self.after_spill(n, i)
    }

    /// After a run was added to buffer `i` of `n` (child not cached): starts a background flush
    /// of the child's runs once they add up to a node, or merges many small runs into one; true
    /// when the flush into the child can wait, false when the caller must flush now.
    pub(crate) fn after_spill(&mut self, n: &mut Internal, i: usize) -> Result<bool> {
        let (Some(b), Some(&cid)) = (n.buffers.get_mut(i), n.children.get(i)) else {
            return Ok(false);
        };
        if self.flush_busy(cid) {
            // The oldest runs are being applied to the leaf in the background: keep spilling
            // (no compaction of the runs it reads); with too many runs the normal flush waits
            // for it.
            return Ok(b.spilled().len() < 2 * MAX_RUNS_PER_BUFFER);
        }
        if b.spilled_bytes() >= self.params.node_size_bytes {
            let spilled_bytes = b.spilled_bytes();
            if self.start_leaf_flush(n, i)? {
                return Ok(true);
            }
            // The flusher is busy (or its memory share is taken): keep spilling up to twice a
            // node's worth rather than flushing on the writer, whose decoded runs and leaf are
            // memory outside the budget; beyond that the writer flushes (bounded).
            return Ok(self.flusher.is_some()
                && n.height == 1
                && spilled_bytes < 2 * self.params.node_size_bytes);
        }
        if b.spilled().len() >= MAX_RUNS_PER_BUFFER {
            // Many small runs: merge them into one (size-tiered, the child is not touched).
            let runs = b.take_spilled();
            self.spill_stats.runs_compacted += 1;
            let mut msgs = self.take_runs(runs)?;
            crate::fractal::msg::sort_points_by_key(&mut msgs);
            drop_superseded(&mut msgs);
            let run = self.write_run(msgs)?;
            if let Some(b) = n.buffers.get_mut(i) {
                b.push_spilled(run);
            }
        }
        Ok(true)
    }

    /// Writes `msgs` (point messages sorted by (key, MSN)) as a new run block.
    pub(crate) fn write_run(&mut self, msgs: Vec<Msg>) -> Result<RunRef> {
        let id = self.alloc_id();
        let mut hashes = Vec::with_capacity(msgs.len());
        let mut bytes = 0u64;
        let mut min_key: Option<&[u8]> = None;
        let mut max_key: Option<&[u8]> = None;
        for m in &msgs {
            if let Msg::Point { key, .. } = m {
                hashes.push(key_hash(key));
                min_key = Some(min_key.map_or(key.as_slice(), |k| k.min(key.as_slice())));
                max_key = Some(max_key.map_or(key.as_slice(), |k| k.max(key.as_slice())));
            }
            bytes += m.size_bytes() as u64;
        }
        let run = RunRef {
            id,
            msgs: len_u32(msgs.len(), "run messages")?,
            bytes,
            min_key: min_key.unwrap_or_default().to_vec(),
            max_key: max_key.unwrap_or_default().to_vec(),
            filter: KeyFilter::build_with_bits(
                hashes.into_iter(),
                RUN_FILTER_BITS_PER_KEY,
                RUN_FILTER_PROBES,
            ),
        };
        // The writeback thread encodes and writes it when it can take it (readable from memory
        // meanwhile); otherwise the writer does.
        if let Some(msgs) = self.store.try_defer_run(id, msgs, bytes as usize) {
            let enc = encode_run(id, &msgs, self.store.compression_level())?;
            match self.store.write_run(id, enc) {
                Ok(()) => {}
                // A full disk: the run stays in memory, pending, until a write succeeds.
                Err(e) if e.is_no_space() => self.store.keep_run_pending(id, msgs, bytes as usize, &e),
                Err(e) => return Err(e),
            }
        }
        Ok(run)
    }

    /// Reads and frees the spilled runs of a buffer: their messages, run after run (each run in
    /// (key, MSN) order; callers sort as they need).
    pub(crate) fn take_runs(&mut self, runs: Vec<RunRef>) -> Result<Vec<Msg>> {
        let mut out = Vec::new();
        for r in &runs {
            let msgs = self.store.read_run(r.id)?;
            if msgs.len() != r.msgs as usize {
                return Err(corrupt(
                    format!("{} run {}", self.store.path().display(), r.id),
                    format!("{} messages, parent says {}", msgs.len(), r.msgs),
                ));
            }
            out.extend(msgs);
        }
        for r in runs {
            self.store.delete(r.id);
        }
        Ok(out)
    }
}
