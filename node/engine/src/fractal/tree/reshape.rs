//! Reshaping: splits of full nodes and merges of underfull children.

use super::*;

impl Tree {
    pub(crate) fn insert_siblings(&mut self, parent: &mut Internal, i: usize, extras: Vec<(Vec<u8>, Node)>) {
        for (k, (p, node)) in extras.into_iter().enumerate() {
            let id = self.alloc_id();
            self.store.put(id, node);
            parent.pivots.insert(i + k, p);
            parent.children.insert(i + 1 + k, id);
            parent.buffers.insert(i + 1 + k, Buffer::new());
        }
    }

    pub(crate) fn is_underfull(&self, node: &Node) -> bool {
        match node {
            Node::Leaf(l) => l.size_bytes() < self.params.node_size_bytes / 4,
            Node::Internal(n) => n.children.len() < (self.params.fanout / 4).max(2),
        }
    }

    /// Merges child `i` with a neighbour (their buffers merge too), re-splitting if too big.
    pub(crate) fn merge_children(&mut self, parent: &mut Internal, a: usize) -> Result<()> {
        let b = a + 1;
        let (Some(&a_id), Some(&b_id)) = (parent.children.get(a), parent.children.get(b)) else {
            return Ok(());
        };
        if self.flush_busy(a_id) || self.flush_busy(b_id) {
            // Merging can wait; the leaf being flushed in the background may not change.
            return Ok(());
        }
        let mut left = self.store.take(a_id)?;
        let right = match self.store.take(b_id) {
            Ok(r) => r,
            Err(e) => {
                self.store.put(a_id, left);
                return Err(e);
            }
        };
        let pivot = parent.pivots.remove(a);
        parent.children.remove(b);
        let bbuf = parent.buffers.remove(b);
        #[allow(clippy::indexing_slicing)] // a < b and remove(b) just succeeded
        parent.buffers[a].absorb(bbuf);
        match (&mut left, right) {
            (Node::Leaf(l), Node::Leaf(r)) => {
                l.pivots.push(pivot);
                l.pivots.extend(r.pivots);
                l.basements.extend(r.basements);
                l.normalize(self.params.basement_size_bytes);
            }
            (Node::Internal(l), Node::Internal(r)) if l.height == r.height => {
                l.pivots.push(pivot);
                l.pivots.extend(r.pivots);
                l.children.extend(r.children);
                l.buffers.extend(r.buffers);
            }
            _ => {
                return Err(corrupt(
                    format!("nodes {a_id} and {b_id}"),
                    "siblings of different heights",
                ))
            }
        }
        self.store.delete(b_id);
        let extras = self.split_if_needed(&mut left, NO_EDGES);
        self.store.put(a_id, left);
        self.insert_siblings(parent, a, extras);
        Ok(())
    }

    /// Splits an oversized node; returns the new right siblings with their left pivots.
    pub(crate) fn split_if_needed(&self, node: &mut Node, edges: Edges) -> Vec<(Vec<u8>, Node)> {
        let p = self.params;
        match node {
            Node::Leaf(l) => {
                let total = l.size_bytes();
                if total <= p.node_size_bytes || l.entry_count() < 2 {
                    return Vec::new();
                }
                let appending = edges.right && l.appending;
                let prepending = edges.left && l.prepending && !appending;
                let max_msn = l.max_msn();
                let entries = std::mem::take(l).into_entries();
                // Edge leaves under sequential inserts split unevenly so the full part stays full.
                let pieces = if appending {
                    chunk_entries(entries, p.node_size_bytes * 15 / 16)
                } else if prepending {
                    let mut rev = entries;
                    rev.reverse();
                    let mut chunks = chunk_entries(rev, p.node_size_bytes * 15 / 16);
                    chunks.reverse();
                    for c in &mut chunks {
                        c.reverse();
                    }
                    chunks
                } else {
                    let n = (total * 2).div_ceil(p.node_size_bytes).max(2);
                    split_entries_even(entries, n)
                };
                let mut leaves = pieces.into_iter().map(|c| {
                    let pivot = c.first().map(|e| e.0.clone()).unwrap_or_default();
                    (pivot, Leaf::from_entries(c, max_msn, p.basement_size_bytes))
                });
                if let Some((_, first)) = leaves.next() {
                    *l = first;
                }
                leaves.map(|(pv, leaf)| (pv, Node::Leaf(leaf))).collect()
            }
            Node::Internal(n) => {
                let len = n.children.len();
                if len <= p.fanout {
                    return Vec::new();
                }
                let pieces = len.div_ceil(p.fanout).max(2);
                let per = len.div_ceil(pieces);
                let mut out = Vec::new();
                let mut rest_children = n.children.split_off(per);
                let mut rest_buffers = n.buffers.split_off(per);
                let mut rest_pivots = n.pivots.split_off(per - 1);
                while !rest_children.is_empty() {
                    let up = rest_pivots.remove(0);
                    let take = per.min(rest_children.len());
                    let next_children = rest_children.split_off(take);
                    let next_buffers = rest_buffers.split_off(take);
                    let next_pivots = rest_pivots.split_off((take - 1).min(rest_pivots.len()));
                    out.push((
                        up,
                        Node::Internal(Internal {
                            height: n.height,
                            pivots: std::mem::replace(&mut rest_pivots, next_pivots),
                            children: std::mem::replace(&mut rest_children, next_children),
                            buffers: std::mem::replace(&mut rest_buffers, next_buffers),
                        }),
                    ));
                }
                out
            }
        }
    }

    // --------------------------------------------------------------------------------------
    // Read path
    // --------------------------------------------------------------------------------------
}
