//! In-memory tree nodes: internal nodes (pivots + one message buffer per child) and leaves
//! (basement nodes of sorted entries), after PerconaFT `ft/node.h`.

use super::msg::{apply_point_owned, apply_to_entries, Buffer, Msg, Msn, PointOp};

/// Logical node id, mapped to a disk location by the block translation table.
pub type NodeId = u64;

/// Bytes counted per entry besides key and value: the in-memory cost (vector slot, two
/// allocations), so node sizes and the cache budget track memory use.
pub const ENTRY_OVERHEAD_BYTES: usize = 64;

/// Index of the child (or basement) whose range holds `key`: the number of pivots `<= key`.
/// Child `i` covers `[pivots[i-1], pivots[i])`.
pub fn child_index(pivots: &[Vec<u8>], key: &[u8]) -> usize {
    pivots.partition_point(|p| p.as_slice() <= key)
}

/// Children `first..=last` overlapping `[start, end)` (`end = None`: unbounded); `None` when the
/// range is empty.
pub fn child_span(pivots: &[Vec<u8>], start: &[u8], end: Option<&[u8]>) -> Option<(usize, usize)> {
    if end.is_some_and(|e| e <= start) {
        return None;
    }
    let first = child_index(pivots, start);
    let last = match end {
        Some(e) => pivots.partition_point(|p| p.as_slice() < e),
        None => pivots.len(),
    };
    Some((first, last.max(first)))
}

/// `[lo, hi)` bounds of child `i` inside a node whose own bounds are `[lo, hi)`.
pub fn child_bounds<'a>(
    pivots: &'a [Vec<u8>],
    i: usize,
    lo: Option<&'a [u8]>,
    hi: Option<&'a [u8]>,
) -> (Option<&'a [u8]>, Option<&'a [u8]>) {
    let clo = if i == 0 {
        lo
    } else {
        pivots.get(i - 1).map(Vec::as_slice)
    };
    let chi = if i < pivots.len() {
        pivots.get(i).map(Vec::as_slice)
    } else {
        hi
    };
    (clo, chi)
}

/// A basement node: the unit of partial reads inside a leaf (sorted, duplicate-free entries).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Basement {
    /// Entries sorted by key.
    pub entries: Vec<(Vec<u8>, Vec<u8>)>,
    /// Highest MSN applied (messages at or below it are skipped: idempotent application).
    pub max_msn: Msn,
    /// Sum of key and value lengths.
    pub data_bytes: usize,
}

impl Basement {
    /// A basement holding `entries` (sorted) with `max_msn`.
    pub fn from_entries(entries: Vec<(Vec<u8>, Vec<u8>)>, max_msn: Msn) -> Self {
        let data_bytes = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
        Basement {
            entries,
            max_msn,
            data_bytes,
        }
    }

    /// Bytes counted against node sizes.
    pub fn size_bytes(&self) -> usize {
        self.data_bytes + self.entries.len() * ENTRY_OVERHEAD_BYTES
    }

    /// Value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&Vec<u8>> {
        self.entries
            .binary_search_by(|(k, _)| k.as_slice().cmp(key))
            .ok()
            .and_then(|i| self.entries.get(i))
            .map(|(_, v)| v)
    }
}

/// A leaf: basements covering consecutive key ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leaf {
    /// `basements.len() - 1` pivots; basement `i` covers `[pivots[i-1], pivots[i])`.
    pub pivots: Vec<Vec<u8>>,
    /// At least one basement.
    pub basements: Vec<Basement>,
    /// Transient (not stored): the last put landed at the leaf's right edge (sequential inserts).
    pub appending: bool,
    /// Transient (not stored): the last put landed at the leaf's left edge.
    pub prepending: bool,
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
    pub fn size_bytes(&self) -> usize {
        self.basements.iter().map(Basement::size_bytes).sum::<usize>()
            + self
                .pivots
                .iter()
                .map(|p| p.len() + ENTRY_OVERHEAD_BYTES)
                .sum::<usize>()
    }

    /// Number of entries.
    pub fn entry_count(&self) -> usize {
        self.basements.iter().map(|b| b.entries.len()).sum()
    }

    /// Highest MSN applied to any basement.
    pub fn max_msn(&self) -> Msn {
        self.basements.iter().map(|b| b.max_msn).max().unwrap_or(0)
    }

    /// Applies one message to every basement it touches, skipping basements that already
    /// applied it (MSN at or below their `max_msn`).
    pub fn apply(&mut self, msg: &Msg) {
        let msn = msg.msn();
        let span = match msg {
            Msg::Point { key, .. } => {
                let i = child_index(&self.pivots, key);
                let last_key = self
                    .basements
                    .last()
                    .and_then(|b| b.entries.last())
                    .map(|(k, _)| k.as_slice());
                let first_key = self
                    .basements
                    .first()
                    .and_then(|b| b.entries.first())
                    .map(|(k, _)| k.as_slice());
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
            let delta = apply_to_entries(&mut b.entries, msg, lo.as_deref(), hi.as_deref());
            b.data_bytes = (b.data_bytes as isize + delta).max(0) as usize;
            b.max_msn = msn;
        }
    }

    /// Applies messages sorted by MSN: runs of point messages are merged into each basement in
    /// one pass (sorted by key, each key's messages folded in MSN order; keys and values move
    /// into the entries without copies); range messages are applied between runs, so the outcome
    /// equals applying every message in MSN order.
    pub fn apply_batch(&mut self, msgs: Vec<Msg>) {
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

    fn apply_points(&mut self, mut run: Vec<(Vec<u8>, Msn, PointOp)>) {
        if let Some(last) = run.last() {
            let last_key = self
                .basements
                .last()
                .and_then(|b| b.entries.last())
                .map(|(k, _)| k.as_slice());
            let first_key = self
                .basements
                .first()
                .and_then(|b| b.entries.first())
                .map(|(k, _)| k.as_slice());
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
    pub fn normalize(&mut self, basement_size_bytes: usize) {
        let oversized = self
            .basements
            .iter()
            .any(|b| b.size_bytes() > basement_size_bytes);
        let empties = self.basements.len() > 1 && self.basements.iter().any(|b| b.entries.is_empty());
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
            if b.entries.is_empty() {
                continue;
            }
            if b.size_bytes() <= basement_size_bytes {
                if !basements.is_empty() {
                    // Pivot: the old pivot at this basement's left edge keeps ranges exact.
                    pivots.push(
                        old_pivots
                            .get(i.wrapping_sub(1))
                            .cloned()
                            .unwrap_or_else(|| b.entries[0].0.clone()),
                    );
                }
                basements.push(b);
                continue;
            }
            let first_pivot = old_pivots.get(i.wrapping_sub(1)).cloned();
            let b_max = b.max_msn;
            let size = b.size_bytes();
            // The right-most basement under sequential inserts is cut full (the rest stays
            // full); any other is cut evenly to about 3/4 of the target, so random inserts do
            // not re-split a just-filled basement on the next message.
            let chunks = if self.appending && i + 1 == n_old {
                chunk_entries(b.entries, basement_size_bytes)
            } else {
                let pieces = size.div_ceil((basement_size_bytes * 3 / 4).max(1)).max(2);
                // Even pieces can overshoot by one entry: cut those again to the hard limit.
                split_entries_even(b.entries, pieces)
                    .into_iter()
                    .flat_map(|c| {
                        if c.iter().map(entry_size).sum::<usize>() > basement_size_bytes {
                            chunk_entries(c, basement_size_bytes)
                        } else {
                            vec![c]
                        }
                    })
                    .collect()
            };
            for (j, chunk) in chunks.into_iter().enumerate() {
                if !basements.is_empty() {
                    let pivot = if j == 0 { first_pivot.clone() } else { None };
                    pivots.push(pivot.unwrap_or_else(|| chunk[0].0.clone()));
                }
                basements.push(Basement::from_entries(chunk, b_max));
            }
        }
        if basements.is_empty() {
            basements.push(Basement {
                entries: Vec::new(),
                max_msn,
                data_bytes: 0,
            });
            pivots.clear();
        }
        self.pivots = pivots;
        self.basements = basements;
    }

    /// All entries, consuming the leaf.
    pub fn into_entries(self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.basements.into_iter().flat_map(|b| b.entries).collect()
    }

    /// A leaf of `entries` (sorted) cut into basements of about `basement_size_bytes`.
    pub fn from_entries(entries: Vec<(Vec<u8>, Vec<u8>)>, max_msn: Msn, basement_size_bytes: usize) -> Self {
        let chunks = chunk_entries(entries, basement_size_bytes);
        let mut pivots = Vec::new();
        let mut basements = Vec::new();
        for (j, chunk) in chunks.into_iter().enumerate() {
            if j > 0 {
                pivots.push(chunk[0].0.clone());
            }
            basements.push(Basement::from_entries(chunk, max_msn));
        }
        if basements.is_empty() {
            basements.push(Basement {
                entries: Vec::new(),
                max_msn,
                data_bytes: 0,
            });
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
fn merge_into_basement(b: &mut Basement, msgs: impl Iterator<Item = (Vec<u8>, Msn, PointOp)>) {
    let floor = b.max_msn;
    let old = std::mem::take(&mut b.entries);
    let mut msgs = msgs.peekable();
    let mut out: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(old.len() + msgs.size_hint().0);
    let mut it = old.into_iter();
    let mut top = floor;
    let mut data_bytes = b.data_bytes;
    while let Some((key, msn, op)) = msgs.next() {
        // Binary search for the key among the remaining entries (messages are usually sparse
        // against the basement), then move the entries before it over in one go.
        let before = it
            .as_slice()
            .partition_point(|(ok, _)| ok.as_slice() < key.as_slice());
        out.extend(it.by_ref().take(before));
        let mut val = match it.as_slice().first() {
            Some((ok, _)) if *ok == key => it.next().map(|(_, ov)| ov),
            _ => None,
        };
        let old_size = val.as_ref().map_or(0, |v| key.len() + v.len());
        let mut fold = |val: Option<Vec<u8>>, msn: Msn, op: PointOp| {
            if msn > floor {
                top = top.max(msn);
                apply_point_owned(val, op)
            } else {
                val
            }
        };
        val = fold(val, msn, op);
        while let Some((_, msn, op)) = msgs.next_if(|m| m.0 == key) {
            val = fold(val, msn, op);
        }
        let new_size = val.as_ref().map_or(0, |v| key.len() + v.len());
        data_bytes = (data_bytes + new_size).saturating_sub(old_size);
        if let Some(v) = val {
            out.push((key, v));
        }
    }
    out.extend(it);
    debug_assert_eq!(
        data_bytes,
        out.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>()
    );
    b.data_bytes = data_bytes;
    b.entries = out;
    b.max_msn = top;
}

fn entry_size(e: &(Vec<u8>, Vec<u8>)) -> usize {
    e.0.len() + e.1.len() + ENTRY_OVERHEAD_BYTES
}

/// Cuts sorted entries into non-empty chunks of at most about `target_bytes` each.
pub fn chunk_entries(entries: Vec<(Vec<u8>, Vec<u8>)>, target_bytes: usize) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut cur_bytes = 0;
    for e in entries {
        let s = entry_size(&e);
        if !cur.is_empty() && cur_bytes + s > target_bytes {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
        cur_bytes += s;
        cur.push(e);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Cuts sorted entries into `pieces` chunks of about equal bytes (each non-empty when possible).
pub fn split_entries_even(entries: Vec<(Vec<u8>, Vec<u8>)>, pieces: usize) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let total: usize = entries.iter().map(entry_size).sum();
    let target = total.div_ceil(pieces.max(1)).max(1);
    let n = entries.len();
    let mut out: Vec<Vec<(Vec<u8>, Vec<u8>)>> = Vec::new();
    let mut cur = Vec::new();
    let mut cur_bytes = 0;
    for (i, e) in entries.into_iter().enumerate() {
        cur_bytes += entry_size(&e);
        cur.push(e);
        let remaining = n - i - 1;
        if cur_bytes >= target && remaining > 0 && out.len() + 1 < pieces {
            out.push(std::mem::take(&mut cur));
            cur_bytes = 0;
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// An internal node: `children.len() - 1` pivots, one buffer per child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Internal {
    /// Distance to the leaves (leaves' parents have height 1).
    pub height: u32,
    /// Child `i` covers `[pivots[i-1], pivots[i])`.
    pub pivots: Vec<Vec<u8>>,
    /// Child node ids.
    pub children: Vec<NodeId>,
    /// One message buffer per child.
    pub buffers: Vec<Buffer>,
}

impl Internal {
    /// Bytes counted against the node size.
    pub fn size_bytes(&self) -> usize {
        self.buffers.iter().map(Buffer::bytes).sum::<usize>()
            + self
                .pivots
                .iter()
                .map(|p| p.len() + ENTRY_OVERHEAD_BYTES)
                .sum::<usize>()
            + self.children.len() * 8
    }

    /// Routes `msg` to the buffer(s) of the child(ren) it concerns. Range messages go to every
    /// overlapping child (the same MSN in each; application is idempotent by MSN).
    pub fn push_msg(&mut self, msg: Msg) {
        match &msg {
            Msg::Point { key, .. } => {
                let i = child_index(&self.pivots, key);
                if let Some(b) = self.buffers.get_mut(i) {
                    b.push(msg);
                }
            }
            Msg::Range(r) => {
                let Some((first, last)) = child_span(&self.pivots, &r.start, r.end.as_deref()) else {
                    return;
                };
                for i in first..=last {
                    if let Some(b) = self.buffers.get_mut(i) {
                        b.push(msg.clone());
                    }
                }
            }
        }
    }

    /// Index of the buffer to flush first (highest [`Buffer::flush_weight`]).
    pub fn heaviest_buffer(&self) -> Option<usize> {
        self.buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| !b.is_empty())
            .max_by_key(|(_, b)| b.flush_weight())
            .map(|(i, _)| i)
    }
}

/// A tree node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Node {
    /// Internal node.
    Internal(Internal),
    /// Leaf node.
    Leaf(Leaf),
}

impl Node {
    /// Bytes counted against the node size (and the cache budget).
    pub fn size_bytes(&self) -> usize {
        match self {
            Node::Internal(n) => n.size_bytes(),
            Node::Leaf(l) => l.size_bytes(),
        }
    }

    /// Height (0 for leaves).
    pub fn height(&self) -> u32 {
        match self {
            Node::Internal(n) => n.height,
            Node::Leaf(_) => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fractal::msg::RangeMsg;
    use crate::fractal::msg::RangeOp;
    use crate::ops::UpsertOp;

    fn msg_strategy() -> impl Strategy<Value = (u8, Vec<u8>, Vec<u8>, Option<Vec<u8>>, i64)> {
        (
            0u8..20,
            prop::collection::vec(b'a'..b'h', 1..3),
            prop::collection::vec(any::<u8>(), 0..40),
            prop::option::of(prop::collection::vec(b'a'..b'h', 1..3)),
            -3i64..3,
        )
    }

    fn make(msn: Msn, (kind, key, value, end, n): (u8, Vec<u8>, Vec<u8>, Option<Vec<u8>>, i64)) -> Msg {
        match kind {
            0..=9 => Msg::Point {
                msn,
                key,
                op: PointOp::Put(value),
            },
            10..=13 => Msg::Point {
                msn,
                key,
                op: PointOp::Delete,
            },
            14..=17 => Msg::Point {
                msn,
                key,
                op: PointOp::Upsert(UpsertOp::Append(value)),
            },
            18 => Msg::Range(RangeMsg {
                msn,
                start: key,
                end,
                op: RangeOp::Delete,
            }),
            _ => Msg::Range(RangeMsg {
                msn,
                start: key,
                end,
                op: RangeOp::Upsert(UpsertOp::Add(n)),
            }),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

        /// Batch application (sorted merge per basement, owned keys and values) equals applying
        /// each message on its own in MSN order, including messages at or below the basements'
        /// applied MSN (skipped), and normalizing afterwards keeps the entries.
        #[test]
        fn apply_batch_equals_one_by_one(
            initial in prop::collection::btree_map(prop::collection::vec(b'a'..b'h', 1..3), prop::collection::vec(any::<u8>(), 0..40), 0..40),
            floor in 0u64..20,
            msgs in prop::collection::vec(msg_strategy(), 0..60),
            basement_size_bytes in 64usize..400,
        ) {
            let entries: Vec<(Vec<u8>, Vec<u8>)> = initial.into_iter().collect();
            let leaf = Leaf::from_entries(entries, floor, basement_size_bytes);
            let msgs: Vec<Msg> = msgs.into_iter().enumerate().map(|(i, m)| make(i as Msn + 1, m)).collect();
            let mut one = leaf.clone();
            for m in &msgs {
                one.apply(m);
            }
            let mut batch = leaf;
            batch.apply_batch(msgs);
            prop_assert_eq!(batch.basements.len(), one.basements.len());
            for (a, b) in batch.basements.iter().zip(&one.basements) {
                prop_assert_eq!(&a.entries, &b.entries);
                prop_assert_eq!(a.max_msn, b.max_msn);
                prop_assert_eq!(a.data_bytes, b.data_bytes);
            }
            let want = one.clone().into_entries();
            batch.normalize(basement_size_bytes);
            for b in &batch.basements {
                prop_assert!(b.size_bytes() <= basement_size_bytes || b.entries.len() == 1);
            }
            prop_assert_eq!(batch.basements.len(), batch.pivots.len() + 1);
            for (i, b) in batch.basements.iter().enumerate() {
                let (lo, hi) = child_bounds(&batch.pivots, i, None, None);
                prop_assert!(b.entries.iter().all(|(k, _)| lo.is_none_or(|l| k.as_slice() >= l) && hi.is_none_or(|h| k.as_slice() < h)));
            }
            prop_assert_eq!(batch.into_entries(), want);
        }
    }
}
