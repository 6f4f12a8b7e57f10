//! The integrity walk: every invariant of every node, buffer and run.

use super::*;

impl Tree {
    /// Walks every node: pivots sorted and inside their parent's bounds, keys inside pivot
    /// bounds and sorted, buffer messages in MSN order and inside their child's range, stored
    /// sizes equal recomputed ones, all leaves at one depth, reachable nodes == nodes with a
    /// block or a cache entry, no overlapping blocks. Then counts live keys with a full scan.
    pub(crate) fn check_integrity(&mut self) -> Result<IntegrityReport> {
        let mut reachable = HashSet::new();
        let root = self.root;
        let root_height = self.check_node(root, None, None, None, &mut reachable)?;
        let known: HashSet<NodeId> = self
            .store
            .btt_ids()
            .chain(self.store.cached_ids())
            .chain(self.store.pending_run_ids())
            .collect();
        if reachable != known {
            let mut leaked: Vec<_> = known.difference(&reachable).copied().collect();
            let mut missing: Vec<_> = reachable.difference(&known).copied().collect();
            leaked.sort_unstable();
            missing.sort_unstable();
            return Err(corrupt(
                format!("{} BTT", self.store.path().display()),
                format!("unreachable nodes {leaked:?}, nodes without block {missing:?}"),
            ));
        }
        self.store
            .check_space()
            .map_err(|d| corrupt(format!("{} block map", self.store.path().display()), d))?;
        let mut keys = 0u64;
        let mut cursor: Vec<u8> = Vec::new();
        loop {
            let chunk = self.scan(&cursor, None, 4096)?;
            keys += chunk.len() as u64;
            match chunk.last() {
                Some((k, _)) if chunk.len() == 4096 => {
                    cursor = k.clone();
                    cursor.push(0);
                }
                _ => break,
            }
        }
        Ok(IntegrityReport {
            keys,
            blocks: reachable.len() as u64,
            height: root_height + 1,
        })
    }

    pub(crate) fn check_node(
        &mut self,
        id: NodeId,
        lo: Option<Vec<u8>>,
        hi: Option<Vec<u8>>,
        expect_height: Option<u32>,
        reachable: &mut HashSet<NodeId>,
    ) -> Result<u32> {
        let loc = format!("{} node {id}", self.store.path().display());
        if !reachable.insert(id) {
            return Err(corrupt(loc, "node reachable twice"));
        }
        let node = self.store.get(id)?.clone();
        self.store.evict_to_budget(self.root)?;
        let next_msn = self.next_msn;
        let height = node.height();
        if expect_height.is_some_and(|h| h != height) {
            return Err(corrupt(
                loc,
                format!("height {height}, expected {expect_height:?}"),
            ));
        }
        let bad = |d: String| corrupt(loc.clone(), d);
        let (lo_key, hi_key) = (lo.as_deref(), hi.as_deref());
        match node {
            Node::Leaf(l) => {
                check_leaf(&l, lo_key, hi_key, next_msn).map_err(bad)?;
                Ok(0)
            }
            Node::Internal(n) => {
                check_pivots(&n.pivots, n.children.len(), lo_key, hi_key).map_err(&bad)?;
                if n.buffers.len() != n.children.len() || height == 0 {
                    return Err(bad(format!(
                        "{} buffers, {} children, height {height}",
                        n.buffers.len(),
                        n.children.len()
                    )));
                }
                for (i, b) in n.buffers.iter().enumerate() {
                    let (clo, chi) = child_bounds(&n.pivots, i, lo_key, hi_key);
                    check_buffer(b, clo, chi, next_msn).map_err(|d| bad(format!("buffer {i}: {d}")))?;
                    let mut spilled_bytes = 0usize;
                    for r in b.spilled() {
                        if !reachable.insert(r.id) {
                            return Err(bad(format!("buffer {i}: run {} referenced twice", r.id)));
                        }
                        let msgs = self.store.read_run(r.id)?;
                        check_run(r, &msgs, clo, chi, next_msn)
                            .map_err(|d| bad(format!("buffer {i}: run {}: {d}", r.id)))?;
                        spilled_bytes += r.bytes as usize;
                    }
                    if spilled_bytes != b.spilled_bytes() {
                        return Err(bad(format!(
                            "buffer {i}: spilled bytes {} != recomputed {spilled_bytes}",
                            b.spilled_bytes()
                        )));
                    }
                }
                for (i, &c) in n.children.iter().enumerate() {
                    let (clo, chi) = child_bounds(&n.pivots, i, lo.as_deref(), hi.as_deref());
                    let (clo, chi) = (clo.map(<[u8]>::to_vec), chi.map(<[u8]>::to_vec));
                    self.check_node(c, clo, chi, Some(height - 1), reachable)?;
                }
                Ok(height)
            }
        }
    }
}

/// Checks that `pivots` cut `[lo, hi)` into `parts` pieces: strictly increasing, inside it.
fn check_pivots(
    pivots: &[Vec<u8>],
    parts: usize,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
) -> std::result::Result<(), String> {
    if parts != pivots.len() + 1 || parts == 0 {
        return Err(format!("{} pivots for {parts} parts", pivots.len()));
    }
    if !pivots.is_sorted_by(|a, b| a < b) {
        return Err("pivots not strictly increasing".into());
    }
    for p in pivots {
        if lo.is_some_and(|l| p.as_slice() <= l) || hi.is_some_and(|h| p.as_slice() >= h) {
            return Err(format!("pivot {p:?} outside node bounds [{lo:?}, {hi:?})"));
        }
    }
    Ok(())
}

/// Checks a leaf covering `[lo, hi)`: its pivots, and per basement strictly increasing keys
/// within the basement's bounds, its byte count and an applied MSN below `next_msn`.
fn check_leaf(
    l: &Leaf,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    next_msn: Msn,
) -> std::result::Result<(), String> {
    check_pivots(&l.pivots, l.basements.len(), lo, hi)?;
    for (bi, b) in l.basements.iter().enumerate() {
        let (blo, bhi) = child_bounds(&l.pivots, bi, lo, hi);
        for j in 1..b.len() {
            if b.key(j - 1) >= b.key(j) {
                return Err(format!("basement {bi}: keys not strictly increasing"));
            }
        }
        for (k, _) in b.iter() {
            if blo.is_some_and(|x| k < x) || bhi.is_some_and(|x| k >= x) {
                return Err(format!("basement {bi}: key {k:?} outside [{blo:?}, {bhi:?})"));
            }
        }
        let data = b.recompute_data_bytes();
        if data != b.data_bytes() {
            return Err(format!(
                "basement {bi}: size {} != recomputed {data}",
                b.data_bytes()
            ));
        }
        if b.max_msn >= next_msn {
            return Err(format!("basement {bi}: MSN {} from the future", b.max_msn));
        }
    }
    Ok(())
}

pub(crate) fn check_buffer(
    b: &Buffer,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    next_msn: Msn,
) -> std::result::Result<(), String> {
    let (bytes, deletes, count) = b.recompute();
    if (bytes, deletes, count) != b.counters() {
        return Err(format!(
            "counters {:?} != recomputed {:?}",
            b.counters(),
            (bytes, deletes, count)
        ));
    }
    b.check_index()?;
    let mut prev: Option<(&[u8], Msn)> = None;
    for (msn, k, _) in b.point_msgs() {
        if lo.is_some_and(|x| k < x) || hi.is_some_and(|x| k >= x) {
            return Err(format!("message key {k:?} outside child range"));
        }
        if prev.is_some_and(|(pk, pm)| pk == k && pm >= msn) {
            return Err(format!("messages of {k:?} not in MSN order"));
        }
        if msn >= next_msn || msn == 0 {
            return Err(format!("message of {k:?} with MSN out of range"));
        }
        prev = Some((k, msn));
    }
    if !b.range_msgs().is_sorted_by(|a, b| a.msn < b.msn) {
        return Err("range messages not in MSN order".into());
    }
    for r in b.range_msgs() {
        if !r.overlaps(lo, hi) {
            return Err(format!("range message {} does not overlap its child", r.msn));
        }
        if r.msn >= next_msn || r.msn == 0 {
            return Err(format!("range message MSN {} out of range", r.msn));
        }
    }
    Ok(())
}

/// Checks a spilled run against its reference: message count and bytes, key span and filter
/// (no false negatives), keys inside the child's range, MSNs in range.
pub(crate) fn check_run(
    r: &RunRef,
    msgs: &[Msg],
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
    next_msn: Msn,
) -> std::result::Result<(), String> {
    if msgs.len() != r.msgs as usize {
        return Err(format!("{} messages, reference says {}", msgs.len(), r.msgs));
    }
    let bytes: u64 = msgs.iter().map(|m| m.size_bytes() as u64).sum();
    if bytes != r.bytes {
        return Err(format!("{bytes} bytes, reference says {}", r.bytes));
    }
    for m in msgs {
        let Msg::Point { msn, key, .. } = m else {
            return Err("range message in a run".into());
        };
        if lo.is_some_and(|x| key.as_slice() < x) || hi.is_some_and(|x| key.as_slice() >= x) {
            return Err(format!("message key {key:?} outside child range"));
        }
        if !r.may_hold(key, key_hash(key)) {
            return Err(format!("key span or filter misses key {key:?}"));
        }
        if *msn >= next_msn || *msn == 0 {
            return Err(format!("message of {key:?} with MSN out of range"));
        }
    }
    Ok(())
}

pub(crate) fn min_bound<'a>(a: Option<&'a [u8]>, b: Option<&'a [u8]>) -> Option<&'a [u8]> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.min(y)),
        (Some(x), None) => Some(x),
        (None, y) => y,
    }
}
