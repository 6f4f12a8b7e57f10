//! Reads: point lookups and scans that apply the messages pending in ancestor buffers.

use super::*;

impl Tree {
    /// Value of `key`: the leaf's entry with every pending ancestor message for the key applied
    /// in MSN order.
    pub(crate) fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let root = self.root;
        get_from(&mut Loading(&mut self.store), root, key).map(|r| r.unwrap_or_default())
    }

    /// Like [`Tree::get`] from cached nodes only (a shared lock suffices); `None` on a miss.
    pub(crate) fn get_cached(&self, key: &[u8]) -> Option<Result<Option<Vec<u8>>>> {
        get_from(&mut CachedOnly(&self.store), self.root, key).transpose()
    }

    /// Up to `limit` pairs in `[start, end)`, leaf by leaf and basement by basement, with pending
    /// ancestor messages applied.
    pub(crate) fn scan(&mut self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>> {
        let root = self.root;
        scan_from(&mut Loading(&mut self.store), root, start, end, limit).map(|r| r.unwrap_or_default())
    }

    /// Like [`Tree::scan`] from cached nodes only; `None` on a miss.
    pub(crate) fn scan_cached(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        limit: usize,
    ) -> Option<Result<Vec<KeyValue>>> {
        scan_from(&mut CachedOnly(&self.store), self.root, start, end, limit).transpose()
    }
}

/// Point read over `src`; `Ok(None)` when `src` missed a node.
pub(crate) fn get_from(src: &mut impl Fetch, root: NodeId, key: &[u8]) -> Result<Option<Option<Vec<u8>>>> {
    let mut msgs = Vec::new();
    let mut id = root;
    let hash = key_hash(key);
    // Height of `id` once known from its parent (the root is always cached).
    let mut height: Option<u32> = None;
    loop {
        match height {
            // An uncached leaf is read one basement at a time.
            Some(0) => match src.probe_leaf(id, key, overriding_msn(&msgs))? {
                LeafProbe::Value(v, floor) => return Ok(Some(finish_point_read(v, floor, key, msgs))),
                LeafProbe::Miss => return Ok(None),
                LeafProbe::UseNode => {}
            },
            // An uncached internal node: partition 0 and at most one buffer.
            Some(h) => match src.probe_internal(id, key, hash, &mut msgs)? {
                InternalProbe::Child(c) => {
                    id = c;
                    height = Some(h - 1);
                    continue;
                }
                InternalProbe::Miss => return Ok(None),
                InternalProbe::UseNode => {}
            },
            None => {}
        }
        let Some(node) = src.fetch(id)? else {
            return Ok(None);
        };
        match node {
            Node::Internal(n) => {
                let i = child_index(&n.pivots, key);
                let (Some(b), Some(&c)) = (n.buffers.get(i), n.children.get(i)) else {
                    return Err(corrupt(format!("node {id}"), "pivot/child count mismatch"));
                };
                if n.height == 0 {
                    return Err(corrupt(format!("node {id}"), "internal node of height 0"));
                }
                b.collect_for_key(key, hash, &mut msgs);
                let runs: Vec<u64> = b
                    .spilled()
                    .iter()
                    .filter(|r| r.may_hold(key, hash))
                    .map(|r| r.id)
                    .collect();
                height = Some(n.height - 1);
                id = c;
                for r in runs {
                    src.store().run_msgs_for_key(r, key, &mut msgs)?;
                }
            }
            Node::Leaf(l) => {
                let bi = child_index(&l.pivots, key);
                let Some(b) = l.basements.get(bi) else {
                    return Err(corrupt(format!("node {id}"), "basement count mismatch"));
                };
                return Ok(Some(finish_point_read(
                    b.get(key).map(<[u8]>::to_vec),
                    b.max_msn,
                    key,
                    msgs,
                )));
            }
        }
    }
}

/// MSN of the newest message in `msgs` (all for one key) that sets or deletes the key outright
/// (a Put, a Delete, or a DeleteRange): the value below it no longer matters.
pub(crate) fn overriding_msn(msgs: &[Msg]) -> Option<Msn> {
    msgs.iter()
        .filter(|m| match m {
            Msg::Point { op, .. } => matches!(op, PointOp::Put(_) | PointOp::Delete),
            Msg::Range(r) => matches!(r.op, RangeOp::Delete),
        })
        .map(Msg::msn)
        .max()
}

/// Applies the ancestor messages above `floor` (the basement's applied MSN) in MSN order.
pub(crate) fn finish_point_read(
    mut v: Option<Vec<u8>>,
    floor: Msn,
    key: &[u8],
    mut msgs: Vec<Msg>,
) -> Option<Vec<u8>> {
    msgs.sort_by_key(Msg::msn);
    for m in msgs.iter().filter(|m| m.msn() > floor) {
        v = apply_msg_to_value(v, key, m);
    }
    v
}

/// Ancestor messages collected for one scan pass, ready to merge with basement entries in key
/// order: point messages sorted by (key, MSN), range messages in MSN order.
pub(crate) struct PendingForRange {
    pub(crate) points: Vec<(Vec<u8>, Msn, PointOp)>,
    pub(crate) ranges: Vec<RangeMsg>,
}

impl PendingForRange {
    pub(crate) fn new(msgs: Vec<Msg>) -> Self {
        let mut points = Vec::new();
        let mut ranges = Vec::new();
        for m in msgs {
            match m {
                Msg::Point { msn, key, op } => points.push((key, msn, op)),
                Msg::Range(r) => ranges.push(r),
            }
        }
        points.sort_unstable_by(|a, b| crate::fractal::msg::key_cmp(&a.0, &b.0).then(a.1.cmp(&b.1)));
        ranges.sort_by_key(|r| r.msn);
        PendingForRange { points, ranges }
    }

    /// Streams the rows of basement `b` in `[lo, hi)` with the pending messages newer than the
    /// basement's applied MSN folded in (in MSN order), appending to `out` until it holds
    /// `limit` rows; true when the limit was reached. Nothing is copied but the rows returned.
    pub(crate) fn merge_basement(
        &self,
        b: &Basement,
        lo: &[u8],
        hi: Option<&[u8]>,
        limit: usize,
        out: &mut Vec<KeyValue>,
    ) -> bool {
        let floor = b.max_msn;
        let below_hi = |k: &[u8]| hi.is_none_or(|h| k < h);
        let s = b.lower_bound(lo);
        let mut entries = b
            .iter_range(s..b.len())
            .take_while(|(k, _)| below_hi(k))
            .peekable();
        let p0 = self.points.partition_point(|(k, _, _)| k.as_slice() < lo);
        let mut points = self
            .points
            .get(p0..)
            .unwrap_or_default()
            .iter()
            .take_while(|(k, _, _)| below_hi(k))
            .peekable();
        let ranges: Vec<&RangeMsg> = self
            .ranges
            .iter()
            .filter(|r| r.msn > floor && r.overlaps(Some(lo), hi))
            .collect();
        loop {
            // The next key in order: from the entries, the messages, or both.
            let key: &[u8] = match (entries.peek(), points.peek()) {
                (None, None) => return false,
                (Some((ek, _)), None) => ek,
                (None, Some((pk, _, _))) => pk,
                (Some((ek, _)), Some((pk, _, _))) => (*ek).min(pk.as_slice()),
            };
            let stored = entries.next_if(|(ek, _)| *ek == key).map(|(_, v)| v);
            let mut mine: Vec<(Msn, &PointOp)> = Vec::new();
            while let Some((_, msn, op)) = points.next_if(|(pk, _, _)| pk.as_slice() == key) {
                if *msn > floor {
                    mine.push((*msn, op));
                }
            }
            let covering = ranges.iter().filter(|r| r.covers(key));
            let value: Option<Vec<u8>> = if mine.is_empty() && ranges.is_empty() {
                stored.map(<[u8]>::to_vec)
            } else {
                // Fold point and range messages in MSN order (both lists are MSN-sorted).
                let mut v = stored.map(<[u8]>::to_vec);
                let mut rs = covering.peekable();
                let mut ps = mine.into_iter().peekable();
                loop {
                    let take_range = match (ps.peek(), rs.peek()) {
                        (None, None) => break,
                        (Some(_), None) => false,
                        (None, Some(_)) => true,
                        (Some((pm, _)), Some(r)) => r.msn < *pm,
                    };
                    if take_range {
                        if let Some(r) = rs.next() {
                            v = v.and_then(|x| apply_range(&x, &r.op));
                        }
                    } else if let Some((_, op)) = ps.next() {
                        v = apply_point(v, op);
                    }
                }
                v
            };
            if let Some(v) = value {
                out.push((key.to_vec(), v));
                if out.len() >= limit {
                    return true;
                }
            }
        }
    }
}

/// Point keys a scan's first pass takes from each buffer on its path (see [`scan_from`]).
pub(crate) const SCAN_FIRST_PASS_KEYS: usize = 16;

/// Range read over `src`; `Ok(None)` when `src` missed a node.
pub(crate) fn scan_from(
    src: &mut impl Fetch,
    root: NodeId,
    start: &[u8],
    end: Option<&[u8]>,
    limit: usize,
) -> Result<Option<Vec<KeyValue>>> {
    let mut out = Vec::new();
    if limit == 0 || end.is_some_and(|e| e <= start) {
        return Ok(Some(out));
    }
    let mut cursor = start.to_vec();
    // Point keys taken from one buffer per pass: a page needs a few keys, not the buffer.
    // The first pass takes few: an upper buffer holds one message per many rows below it, so
    // its first keys already span more rows than a page (taking `limit` keys from each buffer
    // on the path cloned and sorted hundreds of messages per 100-row page, 70% of a scan's
    // time in memory). A pass cut short by a buffer doubles the count for the next one.
    let mut keys_per_pass = SCAN_FIRST_PASS_KEYS.min(limit);
    let max_keys_per_pass = limit.max(64);
    let mut runs: Vec<(u64, Option<Vec<u8>>)> = Vec::new();
    loop {
        let mut msgs = Vec::new();
        let Some((id, hi)) =
            collect_path_for_range(src, root, &cursor, end, keys_per_pass, &mut msgs, &mut runs)?
        else {
            return Ok(None);
        };
        for (r, rhi) in runs.drain(..) {
            src.store()
                .run_msgs_for_range(r, &cursor, rhi.as_deref(), &mut msgs)?;
        }
        let qhi = min_bound(hi.as_deref(), end).map(<[u8]>::to_vec);
        let pending = PendingForRange::new(msgs);
        let Some(node) = src.fetch(id)? else {
            return Ok(None);
        };
        let Node::Leaf(leaf) = node else {
            return Err(corrupt(format!("node {id}"), "expected a leaf"));
        };
        if merge_leaf_for_range(leaf, &cursor, qhi.as_deref(), &pending, limit, &mut out) {
            return Ok(Some(out));
        }
        src.after_leaf(root)?;
        match qhi {
            None => return Ok(Some(out)),
            Some(h) => {
                if end.is_some_and(|e| h.as_slice() >= e) {
                    return Ok(Some(out));
                }
                cursor = h;
                keys_per_pass = keys_per_pass.saturating_mul(2).min(max_keys_per_pass);
            }
        }
    }
}

/// One scan pass's descent from `root` to the leaf holding `cursor`: appends to `msgs` up to
/// `keys_per_pass` point keys from each buffer on the path (and its range messages), and to
/// `runs` the spilled runs that overlap the pass with the bound to read each to. Returns the
/// leaf's id and the pass's upper bound (the nearest pivot above `cursor`, or the first key a
/// buffer left out: rows below it are complete); `None` when `src` missed a node.
fn collect_path_for_range(
    src: &mut impl Fetch,
    root: NodeId,
    cursor: &[u8],
    end: Option<&[u8]>,
    keys_per_pass: usize,
    msgs: &mut Vec<Msg>,
    runs: &mut Vec<(u64, Option<Vec<u8>>)>,
) -> Result<Option<(NodeId, Option<Vec<u8>>)>> {
    let mut hi: Option<Vec<u8>> = None;
    let mut id = root;
    loop {
        let Some(node) = src.fetch(id)? else {
            return Ok(None);
        };
        let Node::Internal(n) = node else { break };
        let i = child_index(&n.pivots, cursor);
        if let Some(p) = n.pivots.get(i) {
            if hi.as_ref().is_none_or(|h| p < h) {
                hi = Some(p.clone());
            }
        }
        let qhi = min_bound(hi.as_deref(), end);
        let (Some(b), Some(&c)) = (n.buffers.get(i), n.children.get(i)) else {
            return Err(corrupt(format!("node {id}"), "pivot/child count mismatch"));
        };
        // A buffer that stopped early bounds this pass at the first key it left out
        // (rows below it are complete); the next pass resumes there.
        if let Some(cut) = b.collect_for_range_limited(Some(cursor), qhi, keys_per_pass, msgs) {
            if hi.as_ref().is_none_or(|h| cut < *h) {
                hi = Some(cut);
            }
        }
        let qhi = min_bound(hi.as_deref(), end).map(<[u8]>::to_vec);
        runs.extend(
            b.spilled()
                .iter()
                .filter(|r| r.overlaps(Some(cursor), qhi.as_deref()))
                .map(|r| (r.id, qhi.clone())),
        );
        id = c;
    }
    Ok(Some((id, hi)))
}

/// Merges the rows of `leaf` in `[cursor, qhi)` with `pending` into `out`, basement by
/// basement; true when `out` reached `limit` rows.
fn merge_leaf_for_range(
    leaf: &Leaf,
    cursor: &[u8],
    qhi: Option<&[u8]>,
    pending: &PendingForRange,
    limit: usize,
    out: &mut Vec<KeyValue>,
) -> bool {
    let first = child_index(&leaf.pivots, cursor);
    for bi in first..leaf.basements.len() {
        let (blo, bhi) = child_bounds(&leaf.pivots, bi, None, None);
        let lo: &[u8] = match blo {
            Some(b) if b > cursor => b,
            _ => cursor,
        };
        let h = min_bound(bhi, qhi);
        if h.is_some_and(|h| lo >= h) {
            break;
        }
        let Some(b) = leaf.basements.get(bi) else { break };
        if pending.merge_basement(b, lo, h, limit, out) {
            return true;
        }
    }
    false
}
