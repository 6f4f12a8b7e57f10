//! Background leaf flushes: starting them on the flusher thread and installing the result.

use super::*;

impl Tree {
    /// Whether a background flush into `child` is in flight.
    pub(crate) fn flush_busy(&self, child: NodeId) -> bool {
        self.flusher.as_ref().is_some_and(|f| f.busy(child))
    }

    /// Buffer `i` of `n` (height 1) holds a node's worth of spilled runs and its leaf is not
    /// cached: hands the flush to the background flusher when there is one with room (true),
    /// otherwise false (the caller flushes on the writer).
    pub(crate) fn start_leaf_flush(&mut self, n: &mut Internal, i: usize) -> Result<bool> {
        let (Some(b), Some(&cid)) = (n.buffers.get(i), n.children.get(i)) else {
            return Ok(false);
        };
        if n.height != 1 || b.bytes() != 0 || !self.flusher.as_ref().is_some_and(Flusher::has_room) {
            return Ok(false);
        }
        let mut runs = Vec::with_capacity(b.spilled().len());
        for r in b.spilled() {
            runs.push((r.msgs, self.store.detached(r.id)?));
        }
        // Decoded messages take their counted bytes (the count includes their in-memory
        // overhead); the leaf up to a node, and as much again while its basements are rebuilt.
        let reserved_bytes = b.spilled_bytes() + self.params.node_size_bytes * 2;
        // Flushes in flight hold at most a quarter of the budget (the share the cache leaves
        // free for background work), except that one flush may always run; beyond, the writer
        // keeps spilling or flushes itself.
        let reserved = self.store.reserved_bytes();
        if reserved > 0 && reserved + reserved_bytes > self.store.budget_bytes() / 4 {
            return Ok(false);
        }
        let flight = InFlight {
            child: cid,
            run_ids: b.spilled().iter().map(|r| r.id).collect(),
            probe_key: b.spilled().first().map(|r| r.min_key.clone()).unwrap_or_default(),
            reserved_bytes,
        };
        let job = LeafFlushJob {
            child: cid,
            leaf: self.store.detached(cid)?,
            runs,
            basement_size_bytes: self.params.basement_size_bytes,
        };
        if let Some(f) = self.flusher.as_mut() {
            f.submit(job, flight)?;
            self.store.reserve(reserved_bytes, 0);
        }
        Ok(true)
    }

    /// Installs a finished background flush into `parent`, whose child `i` it flushed: the
    /// flushed runs leave the buffer (their blocks are freed) and the flushed leaf replaces
    /// the child in the cache (dirty, not split yet: [`Tree::flush_into_child_inner`] applies
    /// what the buffer still holds and splits it).
    pub(crate) fn install_leaf_flush(
        &mut self,
        parent: &mut Internal,
        i: usize,
        flight: InFlight,
        done: LeafFlushDone,
    ) -> Result<()> {
        self.store.reserve(0, flight.reserved_bytes);
        let location = || format!("{} node {}", self.store.path().display(), flight.child);
        if parent.children.get(i) != Some(&flight.child) || done.child != flight.child || parent.height != 1 {
            return Err(corrupt(
                location(),
                "background flush installed under the wrong parent",
            ));
        }
        let Some(b) = parent.buffers.get_mut(i) else {
            return Err(corrupt(location(), "missing buffer"));
        };
        let runs = b.take_spilled();
        let n = flight.run_ids.len();
        if runs.len() < n || runs.iter().zip(&flight.run_ids).any(|(r, id)| r.id != *id) {
            return Err(corrupt(
                location(),
                "the buffer lost the runs a background flush applied",
            ));
        }
        let mut runs = runs.into_iter();
        for r in runs.by_ref().take(n) {
            self.store.delete(r.id);
        }
        for r in runs {
            b.push_spilled(r);
        }
        self.spill_stats.runs_merged += n as u64;
        // The old leaf's block is released when the new leaf is written.
        self.store.put(flight.child, Node::Leaf(done.leaf));
        Ok(())
    }

    /// Installs every finished background flush: finds each leaf's parent from the root (the
    /// parent may have split meanwhile), installs, applies the rest of the buffer, splits, and
    /// hands the new leaves to writeback to be written and evicted. Errors of the flush itself
    /// (`Io`, `Corruption`) are returned.
    pub(crate) fn install_finished_flushes(&mut self) -> Result<()> {
        while let Some((flight, r)) = self.flusher.as_mut().and_then(Flusher::take_finished) {
            let done = r?;
            if let Some(f) = self.flusher.as_mut() {
                f.totals.installed += 1;
            }
            let root_id = self.root;
            let mut root = self.store.take(root_id)?;
            let r = match &mut root {
                Node::Internal(n) => self.install_below(n, ROOT_EDGES, flight, done),
                Node::Leaf(_) => Err(corrupt(
                    format!("{} node {}", self.store.path().display(), flight.child),
                    "background flush of a leaf the tree no longer has",
                )),
            };
            self.fix_root(root_id, root)?;
            r?;
        }
        Ok(())
    }

    pub(crate) fn install_below(
        &mut self,
        n: &mut Internal,
        edges: Edges,
        flight: InFlight,
        done: LeafFlushDone,
    ) -> Result<()> {
        if n.height == 1 {
            let Some(i) = n.children.iter().position(|&c| c == flight.child) else {
                return Err(corrupt(
                    format!("{} node {}", self.store.path().display(), flight.child),
                    "background flush of a leaf not under its key's parent",
                ));
            };
            let child = flight.child;
            self.install_leaf_flush(n, i, flight, done)?;
            let before = n.children.len();
            self.flush_into_child_inner(n, i, child_edges(edges, i, before), false)?;
            let added = n.children.len().saturating_sub(before);
            let ids: Vec<NodeId> = n
                .children
                .get(i..=i + added)
                .map(<[_]>::to_vec)
                .unwrap_or_default();
            debug_assert_eq!(ids.first(), Some(&child));
            for id in ids {
                self.store.write_and_evict_soon(id)?;
            }
            return Ok(());
        }
        let i = child_index(&n.pivots, &flight.probe_key);
        self.below_child(n, i, edges, |t, c, ce| t.install_below(c, ce, flight, done))
    }

    /// Runs `f` on internal child `i` of `n` (taken from the cache, with its edges), then puts
    /// the child back, splitting it when it outgrew a node and buffer `i` is empty: a split adds
    /// pivots to `n`, and buffer `i` may hold messages for the whole old range, so otherwise the
    /// child stays over the fanout until the next flush into it (which empties the buffer
    /// first) splits it. Errors: `Corruption` when the child is missing or is a leaf.
    pub(crate) fn below_child(
        &mut self,
        n: &mut Internal,
        i: usize,
        edges: Edges,
        f: impl FnOnce(&mut Self, &mut Internal, Edges) -> Result<()>,
    ) -> Result<()> {
        let Some(&cid) = n.children.get(i) else {
            return Err(corrupt(format!("node child {i}"), "missing child"));
        };
        let ce = child_edges(edges, i, n.children.len());
        let mut child = self.store.take(cid)?;
        let r = match &mut child {
            Node::Internal(c) => f(self, c, ce),
            Node::Leaf(_) => Err(corrupt(format!("node {cid}"), "a leaf above height 1")),
        };
        if n.buffers.get(i).is_some_and(Buffer::is_empty) {
            let extras = self.split_if_needed(&mut child, ce);
            self.store.put(cid, child);
            self.insert_siblings(n, i, extras);
        } else {
            self.store.put(cid, child);
        }
        r
    }

    // --------------------------------------------------------------------------------------
    // Background flushing of internal buffers (the cleaner)
    // --------------------------------------------------------------------------------------
}
