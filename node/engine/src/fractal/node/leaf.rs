//! Leaves: basements under pivots, and applying messages to them.

use super::*;

/// A leaf: basements covering consecutive key ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Leaf {
    /// `basements.len() - 1` pivots; basement `i` covers `[pivots[i-1], pivots[i])`.
    pub(crate) pivots: Vec<Vec<u8>>,
    /// At least one basement.
    pub(crate) basements: Vec<Basement>,
    /// Transient (not stored): the last put landed at the leaf's right edge (sequential inserts).
    pub(crate) appending: bool,
    /// Transient (not stored): the last put landed at the leaf's left edge.
    pub(crate) prepending: bool,
}

impl Default for Leaf {
    fn default() -> Self {
        Leaf {
            pivots: Vec::new(),
            basements: vec![Basement::default()],
            appending: false,
            prepending: false,
        }
    }
}

impl Leaf {
    /// Bytes counted against the node size.
    pub(crate) fn size_bytes(&self) -> usize {
        self.basements.iter().map(Basement::size_bytes).sum::<usize>()
            + self
                .pivots
                .iter()
                .map(|p| p.len() + ENTRY_OVERHEAD_BYTES)
                .sum::<usize>()
    }

    /// Number of entries.
    pub(crate) fn entry_count(&self) -> usize {
        self.basements.iter().map(Basement::len).sum()
    }

    /// Highest MSN applied to any basement.
    pub(crate) fn max_msn(&self) -> Msn {
        self.basements.iter().map(|b| b.max_msn).max().unwrap_or(0)
    }

    /// Applies one message to every basement it touches, skipping basements that already
    /// applied it (MSN at or below their `max_msn`).
    pub(crate) fn apply(&mut self, msg: &Msg) {
        let msn = msg.msn();
        let span = match msg {
            Msg::Point { key, .. } => {
                let i = child_index(&self.pivots, key);
                let last_key = self.basements.last().and_then(Basement::last_key);
                let first_key = self.basements.first().and_then(Basement::first_key);
                self.appending = last_key.is_none_or(|l| key.as_slice() > l);
                self.prepending = first_key.is_none_or(|f| key.as_slice() < f);
                Some((i, i))
            }
            Msg::Range(r) => child_span(&self.pivots, &r.start, r.end.as_deref()),
        };
        let Some((first, last)) = span else { return };
        for i in first..=last {
            let (lo, hi) = child_bounds(&self.pivots, i, None, None);
            let (lo, hi) = (lo.map(<[u8]>::to_vec), hi.map(<[u8]>::to_vec));
            let Some(b) = self.basements.get_mut(i) else {
                continue;
            };
            if msn <= b.max_msn {
                continue;
            }
            match msg {
                Msg::Point { key, op, .. } => {
                    let inside = lo.as_deref().is_none_or(|l| key.as_slice() >= l)
                        && hi.as_deref().is_none_or(|h| key.as_slice() < h);
                    if inside {
                        let v = apply_point(b.get(key).map(<[u8]>::to_vec), op);
                        b.set(key, v.as_deref());
                    }
                    b.max_msn = msn;
                }
                Msg::Range(_) => *b = apply_to_basement(b, msg, lo.as_deref(), hi.as_deref()),
            }
        }
    }

    /// Applies messages sorted by MSN: runs of point messages are merged into each basement in
    /// one pass (sorted by key, each key's messages folded in MSN order; keys and values move
    /// into the entries without copies); range messages are applied between runs, so the outcome
    /// equals applying every message in MSN order.
    pub(crate) fn apply_batch(&mut self, msgs: Vec<Msg>) {
        let mut run: Vec<(Vec<u8>, Msn, PointOp)> = Vec::new();
        for m in msgs {
            match m {
                Msg::Point { msn, key, op } => run.push((key, msn, op)),
                Msg::Range(_) => {
                    if !run.is_empty() {
                        self.apply_points(std::mem::take(&mut run));
                    }
                    self.apply(&m);
                }
            }
        }
        if !run.is_empty() {
            self.apply_points(run);
        }
    }

    pub(crate) fn apply_points(&mut self, mut run: Vec<(Vec<u8>, Msn, PointOp)>) {
        if let Some(last) = run.last() {
            let last_key = self.basements.last().and_then(Basement::last_key);
            let first_key = self.basements.first().and_then(Basement::first_key);
            self.appending = last_key.is_none_or(|l| last.0.as_slice() > l);
            self.prepending = first_key.is_none_or(|f| last.0.as_slice() < f);
        }
        // Stable: equal keys keep MSN order.
        run.sort_by(|a, b| a.0.cmp(&b.0));
        let mut msgs = run.into_iter().peekable();
        while let Some(first) = msgs.peek() {
            let bi = child_index(&self.pivots, &first.0);
            let pivot = self.pivots.get(bi).map(Vec::as_slice);
            let group = std::iter::from_fn(|| msgs.next_if(|m| pivot.is_none_or(|p| m.0.as_slice() < p)));
            match self.basements.get_mut(bi) {
                Some(b) => merge_into_basement(b, group),
                None => group.for_each(drop),
            }
        }
    }

    /// Splits basements above `basement_size_bytes` and drops empty basements (keeping one).
    pub(crate) fn normalize(&mut self, basement_size_bytes: usize) {
        let oversized = self
            .basements
            .iter()
            .any(|b| b.size_bytes() > basement_size_bytes);
        let empties = self.basements.len() > 1 && self.basements.iter().any(Basement::is_empty);
        if !oversized && !empties {
            return;
        }
        let max_msn = self.max_msn();
        let old = std::mem::take(&mut self.basements);
        let old_pivots = std::mem::take(&mut self.pivots);
        let n_old = old.len();
        let mut pivots = Vec::new();
        let mut basements: Vec<Basement> = Vec::new();
        for (i, b) in old.into_iter().enumerate() {
            if b.is_empty() {
                continue;
            }
            if b.size_bytes() <= basement_size_bytes {
                if !basements.is_empty() {
                    // Pivot: the old pivot at this basement's left edge keeps ranges exact.
                    pivots.push(
                        old_pivots
                            .get(i.wrapping_sub(1))
                            .cloned()
                            .unwrap_or_else(|| b.key(0).to_vec()),
                    );
                }
                basements.push(b);
                continue;
            }
            let first_pivot = old_pivots.get(i.wrapping_sub(1)).cloned();
            let size = b.size_bytes();
            let sizes: Vec<usize> = (0..b.len()).map(|j| b.entry_size(j)).collect();
            // The right-most basement under sequential inserts is cut full (the rest stays
            // full); any other is cut evenly to about 3/4 of the target, so random inserts do
            // not re-split a just-filled basement on the next message.
            let ranges = if self.appending && i + 1 == n_old {
                chunk_ranges(&sizes, basement_size_bytes)
            } else {
                let pieces = size.div_ceil((basement_size_bytes * 3 / 4).max(1)).max(2);
                // Even pieces can overshoot by one entry: cut those again to the hard limit.
                even_ranges(&sizes, pieces)
                    .into_iter()
                    .flat_map(|r| {
                        // even_ranges cuts `sizes` itself: every range lies within it.
                        let piece = sizes.get(r.clone()).unwrap_or_default();
                        if piece.iter().sum::<usize>() > basement_size_bytes {
                            chunk_ranges(piece, basement_size_bytes)
                                .into_iter()
                                .map(|x| x.start + r.start..x.end + r.start)
                                .collect()
                        } else {
                            vec![r]
                        }
                    })
                    .collect()
            };
            for (j, r) in ranges.into_iter().enumerate() {
                if !basements.is_empty() {
                    let pivot = if j == 0 { first_pivot.clone() } else { None };
                    pivots.push(pivot.unwrap_or_else(|| b.key(r.start).to_vec()));
                }
                basements.push(b.slice(r));
            }
        }
        if basements.is_empty() {
            basements.push(Basement::empty(max_msn));
            pivots.clear();
        }
        self.pivots = pivots;
        self.basements = basements;
    }

    /// All entries, consuming the leaf.
    pub(crate) fn into_entries(self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::with_capacity(self.entry_count());
        for b in &self.basements {
            out.extend(b.iter().map(|(k, v)| (k.to_vec(), v.to_vec())));
        }
        out
    }

    /// A leaf of `entries` (sorted) cut into basements of about `basement_size_bytes`.
    pub(crate) fn from_entries(
        entries: Vec<(Vec<u8>, Vec<u8>)>,
        max_msn: Msn,
        basement_size_bytes: usize,
    ) -> Self {
        let chunks = chunk_entries(entries, basement_size_bytes);
        let mut pivots = Vec::new();
        let mut basements = Vec::new();
        for (j, chunk) in chunks.into_iter().enumerate() {
            if j > 0 {
                #[allow(clippy::indexing_slicing)] // chunk_ranges makes non-empty ranges only
                pivots.push(chunk[0].0.clone());
            }
            basements.push(Basement::from_entries(chunk, max_msn));
        }
        if basements.is_empty() {
            basements.push(Basement::empty(max_msn));
        }
        Leaf {
            pivots,
            basements,
            appending: false,
            prepending: false,
        }
    }
}

/// Merges point messages sorted by key (each key's in MSN order) into a basement in one pass.
/// Messages at or below the basement's `max_msn` are skipped (already applied).
pub(crate) fn merge_into_basement(b: &mut Basement, msgs: impl Iterator<Item = (Vec<u8>, Msn, PointOp)>) {
    let floor = b.max_msn;
    let mut msgs = msgs.peekable();
    let (lower, _) = msgs.size_hint();
    let mut out = BasementBuilder::with_capacity(b.len() + lower, b.data_bytes() + b.data_bytes() / 8);
    let mut next = 0usize;
    let mut top = floor;
    while let Some((key, msn, op)) = msgs.next() {
        // Binary search for the key among the remaining entries (messages are usually sparse
        // against the basement), then copy the entries before it over in one go.
        let pos = {
            let (mut lo, mut hi) = (next, b.len());
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if b.key(mid) < key.as_slice() {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        for (k, v) in b.iter_range(next..pos) {
            out.push(k, v);
        }
        next = pos;
        let mut val: Option<Vec<u8>> = None;
        let mut present = false;
        if next < b.len() && b.key(next) == key.as_slice() {
            present = true;
            next += 1;
        }
        let mut fold = |val: Option<Vec<u8>>, present: &mut bool, msn: Msn, op: PointOp| {
            if msn > floor {
                top = top.max(msn);
                // Materialize the stored value only when a message needs it.
                let cur = if *present {
                    Some(b.value(next - 1).to_vec())
                } else {
                    val
                };
                *present = false;
                apply_point_owned(cur, op)
            } else {
                val
            }
        };
        val = fold(val, &mut present, msn, op);
        while let Some((_, msn, op)) = msgs.next_if(|m| m.0 == key) {
            val = fold(val, &mut present, msn, op);
        }
        if present {
            // Every message was at or below the floor: the stored entry stays as it is.
            out.push(&key, b.value(next - 1));
        } else if let Some(v) = val {
            out.push(&key, &v);
        }
    }
    for (k, v) in b.iter_range(next..b.len()) {
        out.push(k, v);
    }
    *b = out.finish(top);
}

/// Applies one message to the entries of `b` within `[lo, hi)`, returning the new basement with
/// the message's MSN as its applied MSN.
pub(crate) fn apply_to_basement(b: &Basement, msg: &Msg, lo: Option<&[u8]>, hi: Option<&[u8]>) -> Basement {
    let inside = |k: &[u8]| lo.is_none_or(|l| k >= l) && hi.is_none_or(|h| k < h);
    let mut out = BasementBuilder::with_capacity(b.len() + 1, b.data_bytes() + 64);
    match msg {
        Msg::Point { key, op, .. } => {
            let pos = b.lower_bound(key);
            for (k, v) in b.iter_range(0..pos) {
                out.push(k, v);
            }
            let found = pos < b.len() && b.key(pos) == key.as_slice();
            if inside(key) {
                let old = found.then(|| b.value(pos).to_vec());
                if let Some(v) = apply_point(old, op) {
                    out.push(key, &v);
                }
            } else if found {
                out.push(key, b.value(pos));
            }
            let rest = if found { pos + 1 } else { pos };
            for (k, v) in b.iter_range(rest..b.len()) {
                out.push(k, v);
            }
        }
        Msg::Range(r) => {
            for (k, v) in b.iter() {
                if !(inside(k) && r.covers(k)) {
                    out.push(k, v);
                } else if let Some(nv) = apply_range(v, &r.op) {
                    out.push(k, &nv);
                }
            }
        }
    }
    out.finish(msg.msn().max(b.max_msn))
}

pub(crate) fn entry_size(e: &(Vec<u8>, Vec<u8>)) -> usize {
    e.0.len() + e.1.len() + ENTRY_OVERHEAD_BYTES
}
