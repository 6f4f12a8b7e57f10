//! In-memory tree nodes: internal nodes (pivots + one message buffer per child) and leaves
//! (basement nodes of sorted entries), after PerconaFT `ft/node.h`.

use super::msg::{apply_point, apply_point_owned, apply_range, key_cmp, Buffer, Msg, Msn, PointOp};

/// Logical node id, mapped to a disk location by the block translation table.
pub type NodeId = u64;

/// Bytes counted per basement entry besides key and value: the in-memory cost (its 12-byte slot
/// plus arena slack), so node sizes and the cache budget track memory use.
pub const ENTRY_OVERHEAD_BYTES: usize = 16;

/// Index of the child (or basement) whose range holds `key`: the number of pivots `<= key`.
/// Child `i` covers `[pivots[i-1], pivots[i])`.
pub fn child_index(pivots: &[Vec<u8>], key: &[u8]) -> usize {
    pivots.partition_point(|p| key_cmp(p, key).is_le())
}

/// Children `first..=last` overlapping `[start, end)` (`end = None`: unbounded); `None` when the
/// range is empty.
pub fn child_span(pivots: &[Vec<u8>], start: &[u8], end: Option<&[u8]>) -> Option<(usize, usize)> {
    if end.is_some_and(|e| e <= start) {
        return None;
    }
    let first = child_index(pivots, start);
    let last = match end {
        Some(e) => pivots.partition_point(|p| key_cmp(p, e).is_lt()),
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

/// Position of one entry inside a [`Basement`]'s byte arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    /// Offset of the key in `data`; the value follows the key.
    off: u32,
    /// Key length in bytes.
    klen: u32,
    /// Value length in bytes.
    vlen: u32,
}

/// A basement node: the unit of partial reads inside a leaf (sorted, duplicate-free entries).
///
/// Entries are packed: keys and values back to back in one byte arena, with a fixed-width slot
/// per entry, so a basement costs two allocations whatever its entry count, scans and binary
/// searches touch contiguous memory, and (de)serialization is a copy (PerconaFT's basement
/// nodes likewise keep a packed key/value area plus an offset array, `ft/bndata.h`).
#[derive(Debug, Clone, Default)]
pub struct Basement {
    /// Keys and values of every entry (in key order when freshly built; single-message updates
    /// append and leave garbage, compacted when it reaches half the arena).
    data: Vec<u8>,
    /// Arena bytes no slot points at.
    garbage_bytes: usize,
    /// One slot per entry, in key order.
    slots: Vec<Slot>,
    /// Highest MSN applied (messages at or below it are skipped: idempotent application).
    pub max_msn: Msn,
    /// Sum of key and value lengths.
    data_bytes: usize,
}

/// Builds a [`Basement`] from entries pushed in strictly increasing key order.
#[derive(Debug, Default)]
pub struct BasementBuilder {
    b: Basement,
}

impl BasementBuilder {
    /// A builder with room for about `entries` entries of `bytes` key and value bytes.
    pub fn with_capacity(entries: usize, bytes: usize) -> Self {
        BasementBuilder {
            b: Basement {
                data: Vec::with_capacity(bytes),
                garbage_bytes: 0,
                slots: Vec::with_capacity(entries),
                max_msn: 0,
                data_bytes: 0,
            },
        }
    }

    /// Appends an entry; keys must arrive in strictly increasing order (checked in debug
    /// builds; decoders check it themselves).
    pub fn push(&mut self, key: &[u8], value: &[u8]) {
        debug_assert!(
            self.b.last_key().is_none_or(|l| l < key),
            "basement keys out of order"
        );
        let off = self.b.data.len();
        assert!(
            off + key.len() + value.len() <= u32::MAX as usize,
            "basement arena over 4 GiB"
        );
        self.b.data.extend_from_slice(key);
        self.b.data.extend_from_slice(value);
        self.b.slots.push(Slot {
            off: off as u32,
            klen: key.len() as u32,
            vlen: value.len() as u32,
        });
        self.b.data_bytes += key.len() + value.len();
    }

    /// Last key pushed.
    pub fn last_key(&self) -> Option<&[u8]> {
        self.b.last_key()
    }

    /// Entries pushed so far.
    pub fn len(&self) -> usize {
        self.b.len()
    }

    /// True when nothing was pushed.
    pub fn is_empty(&self) -> bool {
        self.b.is_empty()
    }

    /// The basement, with applied MSN `max_msn`.
    pub fn finish(self, max_msn: Msn) -> Basement {
        let mut b = self.b;
        b.max_msn = max_msn;
        b
    }
}

impl PartialEq for Basement {
    /// Equal when they hold the same entries and applied MSN (arena layout not compared).
    fn eq(&self, other: &Self) -> bool {
        self.max_msn == other.max_msn && self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl Eq for Basement {}

impl Basement {
    /// Sets (`Some`) or removes (`None`) the value of `key` in place: the slot array shifts,
    /// new bytes are appended to the arena, and the arena is compacted once half of it is
    /// garbage. Cheap for single messages applied to a root leaf.
    pub fn set(&mut self, key: &[u8], value: Option<&[u8]>) {
        let i = self.lower_bound(key);
        let found = i < self.len() && self.key(i) == key;
        match (found, value) {
            (true, Some(v)) => {
                let s = self.slots[i];
                self.data_bytes = self.data_bytes - s.vlen as usize + v.len();
                if s.vlen as usize == v.len() {
                    let at = (s.off + s.klen) as usize;
                    self.data[at..at + v.len()].copy_from_slice(v);
                } else {
                    self.garbage_bytes += (s.klen + s.vlen) as usize;
                    self.slots[i] = self.append(key, v);
                }
            }
            (true, None) => {
                let s = self.slots.remove(i);
                self.garbage_bytes += (s.klen + s.vlen) as usize;
                self.data_bytes -= (s.klen + s.vlen) as usize;
            }
            (false, Some(v)) => {
                let slot = self.append(key, v);
                self.slots.insert(i, slot);
                self.data_bytes += key.len() + v.len();
            }
            (false, None) => {}
        }
        if self.garbage_bytes > 4096 && self.garbage_bytes * 2 > self.data.len() {
            let mut w = BasementBuilder::with_capacity(self.len(), self.data_bytes);
            for (k, v) in self.iter() {
                w.push(k, v);
            }
            *self = w.finish(self.max_msn);
        }
    }

    fn append(&mut self, key: &[u8], value: &[u8]) -> Slot {
        let off = self.data.len();
        assert!(
            off + key.len() + value.len() <= u32::MAX as usize,
            "basement arena over 4 GiB"
        );
        self.data.extend_from_slice(key);
        self.data.extend_from_slice(value);
        Slot {
            off: off as u32,
            klen: key.len() as u32,
            vlen: value.len() as u32,
        }
    }

    /// A basement holding `entries` (sorted) with `max_msn`.
    pub fn from_entries(entries: Vec<(Vec<u8>, Vec<u8>)>, max_msn: Msn) -> Self {
        let bytes = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
        let mut w = BasementBuilder::with_capacity(entries.len(), bytes);
        for (k, v) in &entries {
            w.push(k, v);
        }
        w.finish(max_msn)
    }

    /// An empty basement with applied MSN `max_msn`.
    pub fn empty(max_msn: Msn) -> Self {
        Basement {
            max_msn,
            ..Basement::default()
        }
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when the basement holds no entry.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Sum of key and value lengths.
    pub fn data_bytes(&self) -> usize {
        self.data_bytes
    }

    /// Bytes counted against node sizes (garbage in the arena included: it is memory).
    pub fn size_bytes(&self) -> usize {
        self.data_bytes + self.garbage_bytes + self.slots.len() * ENTRY_OVERHEAD_BYTES
    }

    /// Key of entry `i` (panics when out of range, like slice indexing).
    pub fn key(&self, i: usize) -> &[u8] {
        let s = self.slots[i];
        &self.data[s.off as usize..(s.off + s.klen) as usize]
    }

    /// Value of entry `i` (panics when out of range).
    pub fn value(&self, i: usize) -> &[u8] {
        let s = self.slots[i];
        let v = (s.off + s.klen) as usize;
        &self.data[v..v + s.vlen as usize]
    }

    /// Entry `i` as (key, value) (panics when out of range).
    pub fn entry(&self, i: usize) -> (&[u8], &[u8]) {
        (self.key(i), self.value(i))
    }

    /// Entries in key order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&[u8], &[u8])> + ExactSizeIterator + '_ {
        (0..self.slots.len()).map(|i| self.entry(i))
    }

    /// Entries `range` in key order.
    pub fn iter_range(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        range.map(|i| self.entry(i))
    }

    /// Index of the first entry whose key is `>= key`.
    pub fn lower_bound(&self, key: &[u8]) -> usize {
        let (mut lo, mut hi) = (0usize, self.slots.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if key_cmp(self.key(mid), key).is_lt() {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }

    /// Value of `key`.
    pub fn get(&self, key: &[u8]) -> Option<&[u8]> {
        let i = self.lower_bound(key);
        (i < self.len() && self.key(i) == key).then(|| self.value(i))
    }

    /// Smallest key.
    pub fn first_key(&self) -> Option<&[u8]> {
        (!self.is_empty()).then(|| self.key(0))
    }

    /// Largest key.
    pub fn last_key(&self) -> Option<&[u8]> {
        self.len().checked_sub(1).map(|i| self.key(i))
    }

    /// Counted size of entry `i` (key, value and per-entry overhead).
    pub fn entry_size(&self, i: usize) -> usize {
        let s = self.slots[i];
        (s.klen + s.vlen) as usize + ENTRY_OVERHEAD_BYTES
    }

    /// A copy of entries `range` as a basement with the same applied MSN.
    pub fn slice(&self, range: std::ops::Range<usize>) -> Basement {
        let bytes = range.clone().map(|i| self.entry_size(i)).sum::<usize>();
        let mut w = BasementBuilder::with_capacity(range.len(), bytes);
        for (k, v) in self.iter_range(range) {
            w.push(k, v);
        }
        w.finish(self.max_msn)
    }

    /// The entries as owned pairs (tests, leaf splits).
    pub fn to_entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
    }

    /// Recomputes the key and value bytes from the slots (integrity checks).
    pub fn recompute_data_bytes(&self) -> usize {
        self.slots.iter().map(|s| (s.klen + s.vlen) as usize).sum()
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
        self.basements.iter().map(Basement::len).sum()
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
    pub fn normalize(&mut self, basement_size_bytes: usize) {
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
                        if sizes[r.clone()].iter().sum::<usize>() > basement_size_bytes {
                            chunk_ranges(&sizes[r.clone()], basement_size_bytes)
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
    pub fn into_entries(self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::with_capacity(self.entry_count());
        for b in &self.basements {
            out.extend(b.iter().map(|(k, v)| (k.to_vec(), v.to_vec())));
        }
        out
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
fn merge_into_basement(b: &mut Basement, msgs: impl Iterator<Item = (Vec<u8>, Msn, PointOp)>) {
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
fn apply_to_basement(b: &Basement, msg: &Msg, lo: Option<&[u8]>, hi: Option<&[u8]>) -> Basement {
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

fn entry_size(e: &(Vec<u8>, Vec<u8>)) -> usize {
    e.0.len() + e.1.len() + ENTRY_OVERHEAD_BYTES
}

/// Cuts entries with counted sizes `sizes` into consecutive index ranges of at most
/// `target_bytes` each (a single larger entry gets a range of its own).
pub fn chunk_ranges(sizes: &[usize], target_bytes: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut cur_bytes = 0;
    for (i, &s) in sizes.iter().enumerate() {
        if i > start && cur_bytes + s > target_bytes {
            out.push(start..i);
            start = i;
            cur_bytes = 0;
        }
        cur_bytes += s;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// Cuts entries with counted sizes `sizes` into at most `pieces` consecutive, non-empty index
/// ranges of about equal bytes.
pub fn even_ranges(sizes: &[usize], pieces: usize) -> Vec<std::ops::Range<usize>> {
    let total: usize = sizes.iter().sum();
    let target = total.div_ceil(pieces.max(1)).max(1);
    let n = sizes.len();
    let mut out = Vec::new();
    let mut start = 0;
    let mut cur_bytes = 0;
    for (i, &s) in sizes.iter().enumerate() {
        cur_bytes += s;
        let remaining = n - i - 1;
        if cur_bytes >= target && remaining > 0 && out.len() + 1 < pieces {
            out.push(start..i + 1);
            start = i + 1;
            cur_bytes = 0;
        }
    }
    if start < n {
        out.push(start..n);
    }
    out
}

/// Moves `entries` into consecutive chunks along `ranges` (from [`chunk_ranges`] or
/// [`even_ranges`]).
fn cut_entries(
    entries: Vec<(Vec<u8>, Vec<u8>)>,
    ranges: Vec<std::ops::Range<usize>>,
) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut it = entries.into_iter();
    ranges
        .into_iter()
        .map(|r| it.by_ref().take(r.len()).collect())
        .collect()
}

/// Cuts sorted entries into chunks of at most `target_bytes` (counted sizes).
pub fn chunk_entries(entries: Vec<(Vec<u8>, Vec<u8>)>, target_bytes: usize) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let sizes: Vec<usize> = entries.iter().map(entry_size).collect();
    let ranges = chunk_ranges(&sizes, target_bytes);
    cut_entries(entries, ranges)
}

/// Cuts sorted entries into at most `pieces` chunks of about equal bytes.
pub fn split_entries_even(entries: Vec<(Vec<u8>, Vec<u8>)>, pieces: usize) -> Vec<Vec<(Vec<u8>, Vec<u8>)>> {
    let sizes: Vec<usize> = entries.iter().map(entry_size).collect();
    let ranges = even_ranges(&sizes, pieces);
    cut_entries(entries, ranges)
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
        self.buffers.iter().map(Buffer::memory_bytes).sum::<usize>()
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
        #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

        /// In-place `set` (appends, shifts slots, compacts the arena) equals a BTreeMap, and the
        /// counted sizes match the entries.
        #[test]
        fn basement_set_matches_a_btreemap(
            ops in prop::collection::vec((0u16..300, prop::option::of(prop::collection::vec(any::<u8>(), 0..200))), 0..600),
        ) {
            let mut b = Basement::empty(0);
            let mut model = std::collections::BTreeMap::new();
            for (k, v) in ops {
                let key = k.to_be_bytes().to_vec();
                b.set(&key, v.as_deref());
                match v {
                    Some(v) => { model.insert(key, v); }
                    None => { model.remove(&key); }
                }
            }
            prop_assert_eq!(b.to_entries(), model.clone().into_iter().collect::<Vec<_>>());
            prop_assert_eq!(b.data_bytes(), b.recompute_data_bytes());
            prop_assert!(b.garbage_bytes <= 4096 || b.garbage_bytes * 2 <= b.data.len());
            for (k, v) in &model {
                prop_assert_eq!(b.get(k), Some(v.as_slice()));
            }
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
            // The model: a BTreeMap with every message above the floor applied in MSN order.
            let mut model = initial.clone();
            let entries: Vec<(Vec<u8>, Vec<u8>)> = initial.into_iter().collect();
            let leaf = Leaf::from_entries(entries, floor, basement_size_bytes);
            let msgs: Vec<Msg> = msgs.into_iter().enumerate().map(|(i, m)| make(i as Msn + 1, m)).collect();
            let mut one = leaf.clone();
            for m in &msgs {
                one.apply(m);
            }
            let msgs_for_model = msgs.clone();
            let mut batch = leaf;
            batch.apply_batch(msgs);
            prop_assert_eq!(batch.basements.len(), one.basements.len());
            for (a, b) in batch.basements.iter().zip(&one.basements) {
                prop_assert_eq!(a.to_entries(), b.to_entries());
                prop_assert_eq!(a.max_msn, b.max_msn);
                prop_assert_eq!(a.data_bytes, b.data_bytes);
            }
            let want = one.clone().into_entries();
            for m in msgs_for_model.iter().filter(|m| m.msn() > floor) {
                match m {
                    Msg::Point { key, op, .. } => match apply_point(model.get(key).cloned(), op) {
                        Some(v) => { model.insert(key.clone(), v); }
                        None => { model.remove(key); }
                    },
                    Msg::Range(r) => {
                        let keys: Vec<Vec<u8>> = model.keys().filter(|k| r.covers(k)).cloned().collect();
                        for k in keys {
                            match model.get(&k).and_then(|v| apply_range(v, &r.op)) {
                                Some(v) => { model.insert(k, v); }
                                None => { model.remove(&k); }
                            }
                        }
                    }
                }
            }
            prop_assert_eq!(&want, &model.into_iter().collect::<Vec<_>>());
            batch.normalize(basement_size_bytes);
            for b in &batch.basements {
                prop_assert!(b.size_bytes() <= basement_size_bytes || b.len() == 1);
            }
            prop_assert_eq!(batch.basements.len(), batch.pivots.len() + 1);
            for (i, b) in batch.basements.iter().enumerate() {
                let (lo, hi) = child_bounds(&batch.pivots, i, None, None);
                prop_assert!(b.iter().all(|(k, _)| lo.is_none_or(|l| k >= l) && hi.is_none_or(|h| k < h)));
            }
            prop_assert_eq!(batch.into_entries(), want);
        }
    }
}
