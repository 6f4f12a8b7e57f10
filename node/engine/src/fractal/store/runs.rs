//! Spilled runs: deferred runs waiting for writeback, run blocks, the run index cache.

use super::*;

/// Frame indexes of spilled runs, shared by readers under the engine's shared lock. Runs are
/// immutable and their ids never reused, so an entry is never stale.
#[derive(Default)]
pub(crate) struct RunIndexCache {
    pub(crate) map: HashMap<u64, Arc<RunIndex>>,
    pub(crate) bytes: usize,
    pub(crate) frame_reads: u64,
    pub(crate) frames: u64,
    pub(crate) whole_reads: u64,
    pub(crate) read_bytes: u64,
}

impl Store {
    /// Hands spilled run `id` (point messages sorted by (key, MSN), `bytes` their counted size)
    /// to the writeback thread when there is one and fewer than an eighth of the budget's worth
    /// of runs are pending; returns the messages back when the caller must write the run itself.
    pub(crate) fn try_defer_run(&mut self, id: u64, msgs: Vec<Msg>, bytes: usize) -> Option<Vec<Msg>> {
        if !self.cachetable.background_writes() || self.pending_run_bytes + bytes > self.budget_bytes() / 8 {
            return Some(msgs);
        }
        debug_assert!(!self.btt.contains_key(&id) && !self.pending_runs.contains_key(&id));
        self.pending_runs.insert(id, Arc::new(msgs));
        self.pending_run_bytes += bytes;
        self.runs_not_handed_over += 1;
        None
    }

    /// Whether pending runs or eviction victims wait for a writeback job to take them.
    pub(crate) fn runs_to_hand_over(&self) -> bool {
        self.runs_not_handed_over > 0 || self.cachetable.victims_queued()
    }

    /// The pending runs, for a job that writes them (they stay pending, and readable, until it
    /// is adopted).
    pub(crate) fn take_pending_for_job(&mut self) -> Vec<(u64, Arc<Vec<Msg>>)> {
        self.runs_not_handed_over = 0;
        self.pending_runs
            .iter()
            .map(|(id, m)| (*id, Arc::clone(m)))
            .collect()
    }

    /// Ids of spilled runs not written yet (see [`Store::try_defer_run`]).
    pub(crate) fn pending_run_ids(&self) -> impl Iterator<Item = u64> + '_ {
        self.pending_runs.keys().copied()
    }

    /// Drops pending run `id`; returns whether it was pending.
    pub(crate) fn forget_pending_run(&mut self, id: u64) -> bool {
        match self.pending_runs.remove(&id) {
            Some(m) => {
                self.pending_run_bytes -= m.iter().map(Msg::size_bytes).sum::<usize>();
                true
            }
            None => false,
        }
    }

    /// Writes spilled run `id` (an encoded run block, [`crate::fractal::codec::encode_run`]) to a fresh
    /// extent and registers it in the BTT.
    pub(crate) fn write_run(&mut self, id: u64, enc: Vec<u8>) -> Result<()> {
        self.write_encoded(id, enc)
    }

    /// Compression level for new blocks.
    pub(crate) fn compression_level(&self) -> Option<i32> {
        self.compression_level
    }

    /// Reads and verifies spilled run `id`: its messages sorted by (key, MSN). Needs no cache,
    /// so readers under a shared lock can call it.
    pub(crate) fn read_run(&self, id: u64) -> Result<Vec<Msg>> {
        self.read_run_range(id, &[], None)
    }

    /// Reads and verifies spilled run `id`, materializing only the messages in `[lo, hi)`.
    pub(crate) fn read_run_range(&self, id: u64, lo: &[u8], hi: Option<&[u8]>) -> Result<Vec<Msg>> {
        if let Some(msgs) = self.pending_runs.get(&id) {
            let at = msgs.partition_point(|m| m.key_or_start() < lo);
            return Ok(msgs
                .get(at..)
                .unwrap_or_default()
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
        let Some(index) = index else {
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
    pub(crate) fn run_index(
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
        let cap = self.budget_bytes() / RUN_INDEX_CACHE_SHARE;
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

    /// Appends the messages for `key` in spilled run `id` (in MSN order).
    pub(crate) fn run_msgs_for_key(&self, id: u64, key: &[u8], out: &mut Vec<Msg>) -> Result<()> {
        let mut next = key.to_vec();
        next.push(0);
        out.extend(self.read_run_range(id, key, Some(&next))?);
        Ok(())
    }

    /// Appends the messages of spilled run `id` with keys in `[lo, hi)`.
    pub(crate) fn run_msgs_for_range(
        &self,
        id: u64,
        lo: &[u8],
        hi: Option<&[u8]>,
        out: &mut Vec<Msg>,
    ) -> Result<()> {
        out.extend(self.read_run_range(id, lo, hi)?);
        Ok(())
    }
}
