//! Checkpoints through the tree and bulk build (replace_all).

use super::*;

impl Tree {
    /// Writes every dirty node, then commits the BTT, metadata and header, on this thread.
    pub(crate) fn checkpoint(&mut self) -> Result<()> {
        self.store
            .checkpoint(self.root, self.next_msn, self.next_node_id, self.meta.clone())
            .map(|_| ())
    }

    /// Starts a checkpoint of the tree as it is now; run the job without the engine lock, then
    /// hand its result to [`Store::finish_checkpoint`] (see [`Store::begin_checkpoint`]).
    pub(crate) fn begin_checkpoint(&mut self) -> CheckpointJob {
        self.store
            .begin_checkpoint(self.root, self.next_msn, self.next_node_id, self.meta.clone())
    }

    /// Builds a fresh tree bottom-up from sorted `pairs` (leaves filled to 7/8 of the node size,
    /// PerconaFT's loader), then switches to it and checkpoints. On error before the switch the
    /// old tree is untouched and the new blocks are released.
    pub(crate) fn replace_all(
        &mut self,
        pairs: &mut dyn Iterator<Item = Result<KeyValue>>,
        meta: &[u8],
    ) -> Result<()> {
        self.cancel_flushes();
        let old_ids: HashSet<NodeId> = self
            .store
            .btt_ids()
            .chain(self.store.cached_ids())
            .chain(self.store.pending_run_ids())
            .collect();
        let mut new_ids = Vec::new();
        match self.build(pairs, &mut new_ids) {
            Ok((root, _leaves)) => {
                for id in old_ids {
                    self.store.delete(id);
                }
                self.root = root;
                self.meta = Some(meta.to_vec());
                self.checkpoint()
            }
            Err(e) => {
                for id in new_ids {
                    self.store.delete(id);
                }
                Err(e)
            }
        }
    }

    /// Builds a tree bottom-up from strictly ascending `pairs`, writing every node (uncached) as
    /// it goes; returns the root and the number of leaves. The ids of the nodes written are
    /// pushed to `ids` (for the caller to delete on error).
    pub(crate) fn build(
        &mut self,
        pairs: &mut dyn Iterator<Item = Result<KeyValue>>,
        ids: &mut Vec<NodeId>,
    ) -> Result<(NodeId, u64)> {
        let p = self.params;
        let fill = p.node_size_bytes * 7 / 8;
        let mut level: Vec<(Vec<u8>, NodeId)> = Vec::new();
        let mut cur: Vec<KeyValue> = Vec::new();
        let mut cur_bytes = 0usize;
        let mut last: Option<Vec<u8>> = None;
        for pair in pairs {
            let (k, v) = pair?;
            if last.as_ref().is_some_and(|l| *l >= k) {
                return Err(EngineError::InvalidArgument(
                    "replace_all pairs not strictly ascending".into(),
                ));
            }
            last = Some(k.clone());
            cur_bytes += k.len() + v.len() + crate::fractal::node::ENTRY_OVERHEAD_BYTES;
            cur.push((k, v));
            if cur_bytes >= fill {
                self.emit_leaf(std::mem::take(&mut cur), &mut level, ids)?;
                cur_bytes = 0;
            }
        }
        if !cur.is_empty() || level.is_empty() {
            self.emit_leaf(cur, &mut level, ids)?;
        }
        let leaves = level.len() as u64;
        let mut height = 1;
        while level.len() > 1 {
            let mut next = Vec::new();
            let per = p.fanout.max(2);
            for group in level.chunks(per) {
                let first_key = group.first().map(|g| g.0.clone()).unwrap_or_default();
                let node = Node::Internal(Internal {
                    height,
                    pivots: group.iter().skip(1).map(|g| g.0.clone()).collect(),
                    children: group.iter().map(|g| g.1).collect(),
                    buffers: vec![Buffer::new(); group.len()],
                });
                let id = self.alloc_id();
                ids.push(id);
                self.store.write_uncached(id, &node)?;
                next.push((first_key, id));
            }
            level = next;
            height += 1;
        }
        level
            .first()
            .map(|l| (l.1, leaves))
            .ok_or_else(|| corrupt("bulk load", "no root built"))
    }

    pub(crate) fn emit_leaf(
        &mut self,
        entries: Vec<KeyValue>,
        level: &mut Vec<(Vec<u8>, NodeId)>,
        ids: &mut Vec<NodeId>,
    ) -> Result<()> {
        let first_key = entries.first().map(|e| e.0.clone()).unwrap_or_default();
        let leaf = Node::Leaf(Leaf::from_entries(entries, 0, self.params.basement_size_bytes));
        let id = self.alloc_id();
        ids.push(id);
        self.store.write_uncached(id, &leaf)?;
        level.push((first_key, id));
        Ok(())
    }

    /// The rebuild of a bulk load: builds `pairs` (strictly ascending: the tree's live pairs
    /// merged with the load, so nothing of the old tree is lost) into a new tree and switches
    /// to it, dropping the old tree (its buffered messages are already resolved into `pairs`). The new leaves start at MSN 0 like any built tree, and every later message has a
    /// higher MSN. Returns the number of leaves built. On error before the switch the old tree
    /// is untouched and the new blocks are released. Nothing is checkpointed: the old
    /// checkpoint keeps its blocks until the next one commits (as with any deleted node).
    pub(crate) fn graft_whole(&mut self, pairs: &mut dyn Iterator<Item = Result<KeyValue>>) -> Result<u64> {
        self.cancel_flushes();
        let old_ids: HashSet<NodeId> = self
            .store
            .btt_ids()
            .chain(self.store.cached_ids())
            .chain(self.store.pending_run_ids())
            .collect();
        let mut new_ids = Vec::new();
        match self.build(pairs, &mut new_ids) {
            Ok((root, leaves)) => {
                for id in old_ids {
                    self.store.delete(id);
                }
                self.root = root;
                // The root stays cached (it is pinned by eviction and read by every call).
                self.store.get(root)?;
                Ok(leaves)
            }
            Err(e) => {
                for id in new_ids {
                    self.store.delete(id);
                }
                Err(e)
            }
        }
    }

    // --------------------------------------------------------------------------------------
    // Integrity
    // --------------------------------------------------------------------------------------
}
