//! Injection: messages enter at the root (or straight into an edge leaf), the root splits.

use super::*;

impl Tree {
    pub(crate) fn alloc_id(&mut self) -> NodeId {
        let id = self.next_node_id;
        self.next_node_id += 1;
        id
    }

    /// Assigns the next MSN.
    pub(crate) fn next_msn(&mut self) -> Msn {
        let m = self.next_msn;
        self.next_msn += 1;
        m
    }

    // --------------------------------------------------------------------------------------
    // Write path
    // --------------------------------------------------------------------------------------

    /// Injects `msg` at the root; flushes and rebalances as needed. Never reads a leaf unless the
    /// root is one or a flush reaches it.
    pub(crate) fn inject(&mut self, msg: Msg) -> Result<()> {
        let Some(msg) = self.try_edge_insert(msg)? else {
            return Ok(());
        };
        let root_id = self.root;
        // A cached internal root takes the message where it sits; it is taken out of the cache
        // only to flush (or when it cannot, see `push_in_place`).
        let limit = self.gorge_limit_bytes(true, false);
        let msg = match self.store.push_in_place(root_id, msg, limit) {
            InPlacePush::Done => return Ok(()),
            InPlacePush::Gorged => None,
            InPlacePush::NotHere(msg) => Some(msg),
        };
        let mut root = self.store.take(root_id)?;
        match (&mut root, msg) {
            (Node::Leaf(l), Some(msg)) => {
                l.apply(&msg);
                l.normalize(self.params.basement_size_bytes);
            }
            (Node::Leaf(_), None) => {
                return Err(corrupt(
                    format!("node {root_id}"),
                    "root changed to a leaf during a push",
                ));
            }
            (Node::Internal(n), msg) => {
                if let Some(msg) = msg {
                    n.push_msg(msg);
                }
                self.flush_while_gorged(n, ROOT_EDGES, true)?;
            }
        }
        self.fix_root(root_id, root)
    }

    /// The sequential-insert fast path (PerconaFT's "promotion" of edge inserts): a point
    /// message whose key lies beyond the last (or before the first) key of the rightmost (or
    /// leftmost) leaf is applied straight to that leaf when every node on the way is cached and
    /// the buffers on the way hold nothing for the edge child, so the leaf is exactly up to date
    /// and the message is the newest for its key. Falls back (returns the message) when the
    /// leaf would outgrow a node: the normal path then buffers it and the flush splits the leaf
    /// unevenly. Consecutive edge inserts thus fill leaves without passing through buffers.
    pub(crate) fn try_edge_insert(&mut self, msg: Msg) -> Result<Option<Msg>> {
        let Msg::Point { key, .. } = &msg else {
            return Ok(Some(msg));
        };
        let mut id = self.root;
        let mut right: Option<bool> = None;
        loop {
            let Some(node) = self.store.peek(id) else {
                return Ok(Some(msg));
            };
            match node {
                Node::Internal(n) => {
                    let i = child_index(&n.pivots, key);
                    let last = n.children.len().saturating_sub(1);
                    let side = if i == last && i > 0 {
                        true
                    } else if i == 0 && last > 0 {
                        false
                    } else {
                        return Ok(Some(msg));
                    };
                    if right.is_some_and(|r| r != side) || n.buffers.get(i).is_none_or(|b| !b.is_empty()) {
                        return Ok(Some(msg));
                    }
                    right = Some(side);
                    let Some(&c) = n.children.get(i) else {
                        return Ok(Some(msg));
                    };
                    id = c;
                }
                Node::Leaf(l) => {
                    // The root itself (right is None) takes messages directly anyway.
                    let beyond = match right {
                        Some(true) => l
                            .basements
                            .iter()
                            .rev()
                            .find_map(Basement::last_key)
                            .is_none_or(|k| key.as_slice() > k),
                        Some(false) => l
                            .basements
                            .iter()
                            .find_map(Basement::first_key)
                            .is_none_or(|k| key.as_slice() < k),
                        None => false,
                    };
                    if !beyond || l.size_bytes() + msg.size_bytes() > self.params.node_size_bytes {
                        return Ok(Some(msg));
                    }
                    break;
                }
            }
        }
        let mut leaf = self.store.take(id)?;
        if let Node::Leaf(l) = &mut leaf {
            l.apply(&msg);
            l.normalize(self.params.basement_size_bytes);
        }
        self.store.put(id, leaf);
        self.spill_stats.edge_inserts += 1;
        Ok(None)
    }

    /// Splits an oversized root (growing the tree) or collapses a root with one child.
    pub(crate) fn fix_root(&mut self, mut root_id: NodeId, mut root: Node) -> Result<()> {
        loop {
            let extras = self.split_if_needed(&mut root, ROOT_EDGES);
            if extras.is_empty() {
                if let Node::Internal(n) = &mut root {
                    if let &[child] = n.children.as_slice() {
                        if n.buffers.first().is_some_and(|b| !b.is_empty()) {
                            self.flush_into_child(n, 0, ROOT_EDGES)?;
                            continue;
                        }
                        self.store.delete(root_id);
                        self.root = child;
                        return Ok(());
                    }
                }
                self.store.put(root_id, root);
                self.root = root_id;
                return Ok(());
            }
            let height = root.height() + 1;
            self.store.put(root_id, root);
            let mut children = vec![root_id];
            let mut pivots = Vec::new();
            for (p, node) in extras {
                let id = self.alloc_id();
                self.store.put(id, node);
                pivots.push(p);
                children.push(id);
            }
            let buffers = vec![Buffer::new(); children.len()];
            root = Node::Internal(Internal {
                height,
                pivots,
                children,
                buffers,
            });
            root_id = self.alloc_id();
        }
    }

    /// Flushes (or spills) the heaviest buffers of `n` while it is gorged. A node below the root
    /// counts as gorged at a quarter of the node size while the cache is under pressure (the
    /// engine's memory over three quarters of the budget, [`Store::under_pressure`]), so
    /// internal nodes stay small enough to stay cached and spill to runs early instead of being
    /// evicted and re-read whole (flushing driven by cache pressure, as the module docs of `crate::fractal` describe).
    pub(crate) fn flush_while_gorged(&mut self, n: &mut Internal, edges: Edges, is_root: bool) -> Result<()> {
        let mut rounds = 0;
        let limit = self.gorge_limit_bytes(is_root, self.store.under_pressure());
        while n.size_bytes() > limit && rounds < 4 * self.params.fanout + 16 {
            let Some(i) = n.heaviest_buffer() else { break };
            rounds += 1;
            if self.spill_if_child_uncached(n, i)? {
                continue;
            }
            let ce = child_edges(edges, i, n.children.len());
            self.flush_into_child(n, i, ce)?;
        }
        Ok(())
    }
}
