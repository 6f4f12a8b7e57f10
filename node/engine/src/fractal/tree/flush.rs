//! Flushing a buffer into its child, and handing merged runs down past uncached children.

use super::*;

impl Tree {
    /// Moves every message of buffer `i` into child `i` (applying them if it is a leaf), then
    /// cascades, splits or merges the child.
    pub(crate) fn flush_into_child(&mut self, parent: &mut Internal, i: usize, ce: Edges) -> Result<()> {
        self.flush_into_child_inner(parent, i, ce, true)
    }

    /// `may_merge`: an underfull child merges with a neighbour after the flush. Before a merge the
    /// neighbour's buffer is flushed too, so both parent buffers are empty and every message that
    /// later enters the merged subtree is newer than all it holds (the MSN invariant that lets a
    /// split leaf give all its basements the leaf's highest MSN).
    pub(crate) fn flush_into_child_inner(
        &mut self,
        parent: &mut Internal,
        i: usize,
        ce: Edges,
        may_merge: bool,
    ) -> Result<()> {
        let Some(&cid) = parent.children.get(i) else {
            return Err(corrupt(format!("node child {i}"), "flush of a missing child"));
        };
        self.install_flush_in_flight(parent, i, cid)?;
        let (msgs, had_runs) = self.take_buffer(parent, i)?;
        let mut child = self.store.take(cid)?;
        self.apply_to_child(&mut child, cid, parent.height, ce, msgs, had_runs)?;
        let extras = self.split_if_needed(&mut child, ce);
        let underfull = extras.is_empty() && self.is_underfull(&child);
        let is_leaf = child.height() == 0;
        self.store.put(cid, child);
        let added = extras.len();
        self.insert_siblings(parent, i, extras);
        if had_runs && is_leaf {
            self.evict_run_fed_leaves(parent, i, added)?;
        }
        if may_merge && underfull && parent.children.len() > 1 {
            self.merge_underfull_child(parent, i, cid)?;
        }
        Ok(())
    }

    /// A background flush into child `cid` (at `i`) comes first: waits for it and installs it.
    fn install_flush_in_flight(&mut self, parent: &mut Internal, i: usize, cid: NodeId) -> Result<()> {
        if let Some((flight, r)) = self.flusher.as_mut().and_then(|f| {
            let r = f.wait_for(cid);
            f.totals.waited += u64::from(r.is_some());
            r
        }) {
            self.install_leaf_flush(parent, i, flight, r?)?;
        }
        Ok(())
    }

    /// Empties buffer `i`: its messages, after those of its spilled runs (older) when it had
    /// any, and whether it had.
    fn take_buffer(&mut self, parent: &mut Internal, i: usize) -> Result<(Vec<Msg>, bool)> {
        let Some(buf) = parent.buffers.get_mut(i) else {
            return Err(corrupt(format!("node child {i}"), "flush of a missing child"));
        };
        let runs = buf.take_spilled();
        let had_runs = !runs.is_empty();
        let mut msgs = buf.take_all();
        if !runs.is_empty() {
            self.spill_stats.runs_merged += runs.len() as u64;
            // Runs hold older messages than the buffer (sorted by MSN below).
            let mut all = self.take_runs(runs)?;
            all.append(&mut msgs);
            msgs = all;
        }
        Ok((msgs, had_runs))
    }

    /// Applies the flushed `msgs` to `child` (node `cid`, under a parent of `parent_height`): a
    /// leaf applies them, an internal node takes them into its buffers (messages from runs go
    /// on to its uncached children as runs) and flushes on while gorged.
    fn apply_to_child(
        &mut self,
        child: &mut Node,
        cid: NodeId,
        parent_height: u32,
        ce: Edges,
        msgs: Vec<Msg>,
        had_runs: bool,
    ) -> Result<()> {
        let mut msgs = match child {
            // Messages from runs go on to the child's own uncached children as runs.
            Node::Internal(c) if had_runs && c.height + 1 == parent_height => {
                self.hand_down(c, ce, msgs)?;
                Vec::new()
            }
            _ => msgs,
        };
        if had_runs {
            // One MSN-ordered stream for the child.
            msgs.sort_by_key(Msg::msn);
        }
        if child.height() + 1 != parent_height {
            return Err(corrupt(
                format!("node {cid}"),
                format!(
                    "height {} under a parent of height {}",
                    child.height(),
                    parent_height
                ),
            ));
        }
        match child {
            Node::Leaf(l) => {
                l.apply_batch(msgs);
                l.normalize(self.params.basement_size_bytes);
            }
            Node::Internal(c) => {
                for m in msgs {
                    c.push_msg(m);
                }
                self.flush_while_gorged(c, ce, false)?;
            }
        }
        Ok(())
    }

    /// A leaf that received spilled runs (at `i`, and the `added` siblings it split into) was
    /// not cached and will not get messages again until another node's worth has spilled:
    /// write it now and drop it from the cache, keeping the cache for internal nodes (and out
    /// of the incremental writer's way).
    fn evict_run_fed_leaves(&mut self, parent: &Internal, i: usize, added: usize) -> Result<()> {
        let ids: Vec<NodeId> = parent
            .children
            .get(i..=i + added)
            .map(<[_]>::to_vec)
            .unwrap_or_default();
        for id in ids {
            self.store.write_and_evict_soon(id)?;
        }
        Ok(())
    }

    /// Merges underfull child `cid` (at `i`) with a neighbour: flushes the neighbour's buffer
    /// first, then merges with an adjacent child whose buffer is empty.
    fn merge_underfull_child(&mut self, parent: &mut Internal, i: usize, cid: NodeId) -> Result<()> {
        let j = if i + 1 < parent.children.len() {
            i + 1
        } else {
            i - 1
        };
        if parent.buffers.get(j).is_some_and(|b| !b.is_empty()) {
            let je = Edges {
                left: false,
                right: false,
            };
            self.flush_into_child_inner(parent, j, je, false)?;
        }
        // The neighbour may have split; find the child again and merge with an adjacent
        // child whose buffer is empty.
        let Some(i) = parent.children.iter().position(|&c| c == cid) else {
            return Ok(());
        };
        let j = if i + 1 < parent.children.len() {
            i + 1
        } else {
            i.wrapping_sub(1)
        };
        if parent.buffers.get(j).is_some_and(Buffer::is_empty)
            && parent.buffers.get(i).is_some_and(Buffer::is_empty)
        {
            self.merge_children(parent, i.min(j))?;
        }
        Ok(())
    }

    /// Run hand-down: of the messages flushed into internal node `c` together with spilled
    /// runs (any order), those for a child of `c` that is not cached go straight into a new run
    /// for that child, merged with the point messages `c`'s buffer holds for it (older, so the
    /// run stays older than anything left in memory), instead of being pushed into `c`'s
    /// buffers one by one, only to be taken out, sorted and spilled again when `c` gorges
    /// (SplinterDB flushes whole branches the same way, Conway et al., USENIX ATC 2020). A
    /// child's share goes this way when it is at least a 32nd of a node with its buffer; smaller
    /// shares, shares for cached children or for buffers holding range messages, and all of a
    /// batch with range messages are pushed into `c`'s buffers in MSN order. Only then are the
    /// children whose runs add up to a node flushed ([`Tree::after_spill`]): such a flush may
    /// merge a child with a neighbour after flushing the neighbour's buffer, which must by then
    /// hold every message for it (a merged leaf's basements take the newest MSN of both, so a
    /// message pushed after the merge would be taken as already applied).
    pub(crate) fn hand_down(&mut self, c: &mut Internal, ce: Edges, mut msgs: Vec<Msg>) -> Result<()> {
        if msgs.iter().any(|m| matches!(m, Msg::Range(_))) {
            msgs.sort_by_key(Msg::msn);
            for m in msgs {
                c.push_msg(m);
            }
            return Ok(());
        }
        let min_bytes = self.params.node_size_bytes / 32;
        let mut groups: Vec<(Vec<Msg>, usize)> = (0..c.children.len()).map(|_| (Vec::new(), 0)).collect();
        for m in msgs {
            if let Msg::Point { key, .. } = &m {
                let j = child_index(&c.pivots, key);
                let Some(g) = groups.get_mut(j) else {
                    return Err(corrupt(
                        format!("{} internal node", self.store.path().display()),
                        format!("child index {j} of {} children", c.children.len()),
                    ));
                };
                g.1 += m.size_bytes();
                g.0.push(m);
            }
        }
        let mut rest = Vec::new();
        let mut spilled_into = Vec::new();
        for (j, (group, bytes)) in groups.into_iter().enumerate() {
            if group.is_empty() {
                continue;
            }
            let (Some(b), Some(&gc)) = (c.buffers.get_mut(j), c.children.get(j)) else {
                rest.extend(group);
                continue;
            };
            if self.store.is_cached(gc) || !b.range_msgs().is_empty() || bytes + b.bytes() < min_bytes {
                rest.extend(group);
                continue;
            }
            let mut run = b.take_points();
            run.extend(group);
            crate::fractal::msg::sort_points_by_key(&mut run);
            drop_superseded(&mut run);
            let r = self.write_run(run)?;
            b.push_spilled(r);
            self.spill_stats.runs_spilled += 1;
            self.spill_stats.runs_handed_down += 1;
            spilled_into.push(gc);
        }
        rest.sort_by_key(Msg::msn);
        for m in rest {
            c.push_msg(m);
        }
        // Children whose runs now add up to a node are flushed (in the background when the
        // flusher has room). Found by id: a flush may split or merge children.
        for gc in spilled_into {
            let Some(j) = c.children.iter().position(|&x| x == gc) else {
                continue;
            };
            if !self.after_spill(c, j)? {
                let je = child_edges(ce, j, c.children.len());
                self.flush_into_child(c, j, je)?;
            }
        }
        Ok(())
    }
}

/// Drops, from point messages sorted by (key, MSN), exact duplicates (the same key and MSN,
/// re-delivered) and messages a newer `Put` or `Delete` of the same key supersedes, as
/// [`Buffer::push`] does.
pub(crate) fn drop_superseded(msgs: &mut Vec<Msg>) {
    let mut out: Vec<Msg> = Vec::with_capacity(msgs.len());
    for m in msgs.drain(..) {
        if let Msg::Point { key, msn, op } = &m {
            let supersedes = matches!(op, PointOp::Put(_) | PointOp::Delete);
            while let Some(Msg::Point { key: pk, msn: pm, .. }) = out.last() {
                if pk != key || !(pm == msn || supersedes) {
                    break;
                }
                out.pop();
            }
        }
        out.push(m);
    }
    *msgs = out;
}
