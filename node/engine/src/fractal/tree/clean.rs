//! The cleaner's step: flush the fullest cached internal buffer once writes pause.

use super::*;

impl Tree {
    /// One step of background flushing, run by the cleaner thread between write batches
    /// (PerconaFT's cleaner thread, `toku_cleaner_thread` in `ft/cachetable/cachetable.cc` and
    /// `toku_ftnode_cleaner_callback` in `ft/ft-flusher.cc`: it picks the node with the most
    /// buffered bytes and flushes its heaviest child buffer). Installs finished leaf flushes,
    /// then, among the cached internal nodes holding at least `min_fullness_1024` / 1024 of
    /// their gorge limit ([`Tree::gorge_limit_bytes`]), takes the fullest (its size, buffers and
    /// pivots, over its limit; on a tie the first found, parents before children, left to right) and flushes its heaviest buffer (delete-heavy buffers weigh more)
    /// into the child, or spills it when the child is not cached, cascading like a writer's
    /// flush. The writer then finds buffers with room, so ingest (a gorged root) and cache
    /// pressure (internal nodes gorge at a quarter node) are drained between batches instead of
    /// inside them (the cleaner passes [`CLEAN_IDLE_FULLNESS_1024`]). Returns true when it
    /// flushed something (call again), false when no node was worth it. Errors: as a writer's
    /// flush (`Io`, `Corruption`).
    pub(crate) fn clean_step(&mut self, min_fullness_1024: u64) -> Result<bool> {
        self.install_finished_flushes()?;
        let Some(path) = self.cleaning_target(min_fullness_1024) else {
            return Ok(false);
        };
        let root_id = self.root;
        let mut root = self.store.take(root_id)?;
        let r = match &mut root {
            Node::Internal(n) => self.clean_at(n, ROOT_EDGES, &path),
            Node::Leaf(_) => Ok(()),
        };
        self.fix_root(root_id, root)?;
        r?;
        self.spill_stats.cleaner_flushes += 1;
        Ok(true)
    }

    /// Size above which internal node `n` is gorged: a node at the root, or any node while the
    /// cache has room; a quarter node below the root under cache pressure (see
    /// [`Tree::flush_while_gorged`]).
    pub(crate) fn gorge_limit_bytes(&self, is_root: bool, pressure: bool) -> usize {
        if is_root || !pressure {
            self.params.node_size_bytes
        } else {
            self.params.node_size_bytes / 4
        }
    }

    /// Child indexes from the root to the cached internal node the cleaner should flush
    /// (empty: the root), or `None` when none holds `min_fullness_1024` / 1024 of its gorge
    /// limit. Looks only at cached nodes and leaves their CLOCK counts alone.
    pub(crate) fn cleaning_target(&self, min_fullness_1024: u64) -> Option<Vec<usize>> {
        let pressure = self.store.under_pressure();
        let mut best: Option<(u64, Vec<usize>)> = None;
        let mut stack = vec![(self.root, Vec::new())];
        while let Some((id, path)) = stack.pop() {
            let Some(Node::Internal(n)) = self.store.peek_quiet(id) else {
                continue;
            };
            let limit = self.gorge_limit_bytes(path.is_empty(), pressure).max(1);
            let size = n.size_bytes();
            // Fullness in 1/1024ths of the limit; ties go to the node found first.
            let fullness = (size as u64).saturating_mul(1024) / limit as u64;
            if fullness >= min_fullness_1024
                && n.heaviest_buffer().is_some()
                && best.as_ref().is_none_or(|(f, _)| fullness > *f)
            {
                best = Some((fullness, path.clone()));
            }
            if n.height > 1 {
                for (i, &c) in n.children.iter().enumerate().rev() {
                    let mut p = path.clone();
                    p.push(i);
                    stack.push((c, p));
                }
            }
        }
        best.map(|(_, p)| p)
    }

    /// Follows `path` from `n` and flushes the heaviest buffer of the node it ends at.
    pub(crate) fn clean_at(&mut self, n: &mut Internal, edges: Edges, path: &[usize]) -> Result<()> {
        if let Some((&i, rest)) = path.split_first() {
            return self.below_child(n, i, edges, |t, c, ce| t.clean_at(c, ce, rest));
        }
        let Some(i) = n.heaviest_buffer() else {
            return Ok(());
        };
        if !self.spill_if_child_uncached(n, i)? {
            let ce = child_edges(edges, i, n.children.len());
            self.flush_into_child(n, i, ce)?;
        }
        Ok(())
    }

    /// Waits for every background flush and forgets it (before the tree is replaced).
    pub(crate) fn cancel_flushes(&mut self) {
        if let Some(f) = self.flusher.as_mut() {
            let reserved: usize = f.in_flight.iter().map(|x| x.reserved_bytes).sum();
            f.cancel_all();
            self.store.reserve(0, reserved);
        }
    }
}
