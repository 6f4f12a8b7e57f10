//! Messages and the per-child message buffers of internal nodes (PerconaFT `ft/msg.h`,
//! `ft/msg_buffer.cc`).
//!
//! Every write becomes a message stamped with a message sequence number (MSN) when it is injected
//! at the root. A buffer keeps point messages indexed by key (each key's messages in MSN order)
//! and range messages (`DeleteRange`, `UpsertRange`: the broadcast of TokuDB's instant ADD
//! COLUMN) in MSN order, so a point read looks up one key per buffer instead of scanning it.

use std::collections::{BTreeMap, HashSet};
use std::ops::Bound;

use crate::ops::{apply_broadcast, apply_upsert, in_range, UpsertOp};

/// Message sequence number: strictly increasing across all messages of a tree.
pub type Msn = u64;

/// Per-message overhead counted in sizes, in bytes: the in-memory cost (index slot, key and list
/// allocations, filter entry) beyond key and value bytes, so node sizes track memory use.
pub const MSG_OVERHEAD_BYTES: usize = 112;

/// What a point message does to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PointOp {
    /// Set the value.
    Put(Vec<u8>),
    /// Remove the key.
    Delete,
    /// Read-free update of the value.
    Upsert(UpsertOp),
}

/// What a range message does to the keys present in its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RangeOp {
    /// Remove every key in the range.
    Delete,
    /// Apply the op to every present key in the range (a broadcast).
    Upsert(UpsertOp),
}

/// A message over `[start, end)` (`end = None`: unbounded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeMsg {
    /// Sequence number.
    pub msn: Msn,
    /// Inclusive start.
    pub start: Vec<u8>,
    /// Exclusive end, `None` = unbounded.
    pub end: Option<Vec<u8>>,
    /// Operation.
    pub op: RangeOp,
}

impl RangeMsg {
    /// Whether the message covers `key`.
    pub fn covers(&self, key: &[u8]) -> bool {
        in_range(key, &self.start, self.end.as_deref())
    }

    /// Whether `[start, end)` intersects `[lo, hi)` (`None` bounds are infinite).
    pub fn overlaps(&self, lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
        let starts_before_hi = hi.is_none_or(|h| self.start.as_slice() < h);
        let ends_after_lo = match (&self.end, lo) {
            (Some(e), Some(l)) => e.as_slice() > l,
            _ => true,
        };
        starts_before_hi && ends_after_lo
    }

    fn size_bytes(&self) -> usize {
        MSG_OVERHEAD_BYTES + self.start.len() + self.end.as_ref().map_or(0, Vec::len) + op_size(&self.op)
    }
}

fn op_size(op: &RangeOp) -> usize {
    match op {
        RangeOp::Delete => 0,
        RangeOp::Upsert(u) => upsert_size(u),
    }
}

fn upsert_size(op: &UpsertOp) -> usize {
    match op {
        UpsertOp::SetIfAbsent(v) | UpsertOp::Append(v) | UpsertOp::Max(v) => v.len() + 4,
        UpsertOp::Add(_) => 8,
    }
}

/// A message of either shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// One key.
    Point {
        /// Sequence number.
        msn: Msn,
        /// Key.
        key: Vec<u8>,
        /// Operation.
        op: PointOp,
    },
    /// A key range.
    Range(RangeMsg),
}

impl Msg {
    /// The message's MSN.
    pub fn msn(&self) -> Msn {
        match self {
            Msg::Point { msn, .. } => *msn,
            Msg::Range(r) => r.msn,
        }
    }

    /// Bytes counted against node sizes.
    pub fn size_bytes(&self) -> usize {
        match self {
            Msg::Point { key, op, .. } => point_size(key, op),
            Msg::Range(r) => r.size_bytes(),
        }
    }
}

fn point_size(key: &[u8], op: &PointOp) -> usize {
    MSG_OVERHEAD_BYTES
        + key.len()
        + match op {
            PointOp::Put(v) => v.len(),
            PointOp::Delete => 0,
            PointOp::Upsert(u) => upsert_size(u),
        }
}

/// A borrowed message (see [`Buffer::sorted_refs`]).
#[derive(Debug, Clone, Copy)]
pub enum MsgRef<'a> {
    /// One key.
    Point {
        /// Sequence number.
        msn: Msn,
        /// Key.
        key: &'a [u8],
        /// Operation.
        op: &'a PointOp,
    },
    /// A key range.
    Range(&'a RangeMsg),
}

impl MsgRef<'_> {
    /// The message's MSN.
    pub fn msn(&self) -> Msn {
        match self {
            MsgRef::Point { msn, .. } => *msn,
            MsgRef::Range(r) => r.msn,
        }
    }
}

/// Applies a point op to one value (`None` = absent).
pub fn apply_point(value: Option<Vec<u8>>, op: &PointOp) -> Option<Vec<u8>> {
    match op {
        PointOp::Put(v) => Some(v.clone()),
        PointOp::Delete => None,
        PointOp::Upsert(u) => apply_upsert(value.as_deref(), u),
    }
}

/// Applies a range op to one present value; `None` = deleted.
pub fn apply_range(value: &[u8], op: &RangeOp) -> Option<Vec<u8>> {
    match op {
        RangeOp::Delete => None,
        RangeOp::Upsert(u) => Some(apply_broadcast(value, u)),
    }
}

/// The message buffer of one child of an internal node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Buffer {
    /// Point messages by key, each key's list in increasing MSN order.
    points: BTreeMap<Vec<u8>, Vec<(Msn, PointOp)>>,
    /// Range messages in increasing MSN order.
    ranges: Vec<RangeMsg>,
    /// Sum of message sizes.
    bytes: usize,
    /// Bytes of delete and range-delete messages (flushed first: they shrink the tree).
    delete_bytes: usize,
    /// Number of messages.
    count: usize,
    /// xxh3 of every point key held: a point read skips the buffer without touching the index
    /// when its key's hash is absent (the per-buffer filter ENGINE.md asks for).
    key_hashes: HashSet<u64>,
}

/// Hash of a key for the per-buffer filters.
pub fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}

impl Buffer {
    /// An empty buffer.
    pub fn new() -> Self {
        Self::default()
    }

    /// Bytes of messages held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Flush priority: bytes, with deletes counted twice.
    pub fn flush_weight(&self) -> usize {
        self.bytes + self.delete_bytes
    }

    /// Number of messages held.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when no message is held.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Adds a message. Messages must arrive in increasing MSN order per key; a `Put` or `Delete`
    /// supersedes the older point messages of its key (they can no longer change the outcome).
    /// A range message whose MSN is already present is skipped (idempotent re-delivery).
    pub fn push(&mut self, msg: Msg) {
        let size = msg.size_bytes();
        match msg {
            Msg::Point { msn, key, op } => {
                let key_len = key.len();
                self.key_hashes.insert(key_hash(&key));
                let is_delete = matches!(op, PointOp::Delete);
                let supersedes = matches!(op, PointOp::Put(_) | PointOp::Delete);
                let list = self.points.entry(key).or_default();
                if supersedes {
                    // Only older messages are superseded (out-of-order delivery never drops newer ones).
                    let keep_from = list.partition_point(|(m, _)| *m < msn);
                    for (_, old) in list.drain(..keep_from) {
                        self.bytes -= point_size(&[], &old) + key_len;
                        if matches!(old, PointOp::Delete) {
                            self.delete_bytes -= MSG_OVERHEAD_BYTES;
                        }
                        self.count -= 1;
                    }
                }
                // Keep MSN order even if a caller delivers out of order.
                let pos = list.partition_point(|(m, _)| *m < msn);
                if list.get(pos).is_some_and(|(m, _)| *m == msn) {
                    return;
                }
                list.insert(pos, (msn, op));
                self.bytes += size;
                if is_delete {
                    self.delete_bytes += MSG_OVERHEAD_BYTES;
                }
                self.count += 1;
            }
            Msg::Range(r) => {
                let pos = self.ranges.partition_point(|x| x.msn < r.msn);
                if self.ranges.get(pos).is_some_and(|x| x.msn == r.msn) {
                    return;
                }
                if matches!(r.op, RangeOp::Delete) {
                    self.delete_bytes += size;
                }
                self.bytes += size;
                self.count += 1;
                self.ranges.insert(pos, r);
            }
        }
    }

    /// Recomputes `(bytes, delete_bytes, count)` from scratch (integrity checks).
    pub fn recompute(&self) -> (usize, usize, usize) {
        let mut bytes = 0;
        let mut deletes = 0;
        let mut count = 0;
        for (key, list) in &self.points {
            for (_, op) in list {
                bytes += point_size(key, op);
                if matches!(op, PointOp::Delete) {
                    deletes += MSG_OVERHEAD_BYTES;
                }
                count += 1;
            }
        }
        for r in &self.ranges {
            bytes += r.size_bytes();
            if matches!(r.op, RangeOp::Delete) {
                deletes += r.size_bytes();
            }
            count += 1;
        }
        (bytes, deletes, count)
    }

    /// Stored counters `(bytes, delete_bytes, count)`.
    pub fn counters(&self) -> (usize, usize, usize) {
        (self.bytes, self.delete_bytes, self.count)
    }

    /// Removes and returns every message in increasing MSN order.
    pub fn take_all(&mut self) -> Vec<Msg> {
        let taken = std::mem::take(self);
        let mut out: Vec<Msg> = Vec::with_capacity(taken.count);
        for (key, list) in taken.points {
            let n = list.len();
            let mut key = Some(key);
            for (i, (msn, op)) in list.into_iter().enumerate() {
                // The last message of a key takes the key itself; earlier ones get copies.
                let k = if i + 1 == n {
                    key.take().unwrap_or_default()
                } else {
                    key.clone().unwrap_or_default()
                };
                out.push(Msg::Point { msn, key: k, op });
            }
        }
        out.extend(taken.ranges.into_iter().map(Msg::Range));
        out.sort_by_key(Msg::msn);
        out
    }

    /// Every message in increasing MSN order (cloned; for serialization and checks).
    pub fn messages(&self) -> Vec<Msg> {
        self.clone().take_all()
    }

    /// Borrowed views of every message in increasing MSN order (serialization without copies).
    pub fn sorted_refs(&self) -> Vec<MsgRef<'_>> {
        let mut out: Vec<MsgRef<'_>> = Vec::with_capacity(self.count);
        for (key, list) in &self.points {
            for (msn, op) in list {
                out.push(MsgRef::Point { msn: *msn, key, op });
            }
        }
        out.extend(self.ranges.iter().map(MsgRef::Range));
        out.sort_by_key(MsgRef::msn);
        out
    }

    /// Messages that may affect `key`, appended to `out` (point messages of the key and range
    /// messages covering it).
    /// `hash` is [`key_hash`] of `key`.
    pub fn collect_for_key(&self, key: &[u8], hash: u64, out: &mut Vec<Msg>) {
        if !self.key_hashes.contains(&hash) {
            // No point message for this key.
        } else if let Some(list) = self.points.get(key) {
            for (msn, op) in list {
                out.push(Msg::Point {
                    msn: *msn,
                    key: key.to_vec(),
                    op: op.clone(),
                });
            }
        }
        for r in &self.ranges {
            if r.covers(key) {
                out.push(Msg::Range(r.clone()));
            }
        }
    }

    /// Messages that may affect keys in `[lo, hi)` (`None` bounds infinite), appended to `out`.
    pub fn collect_for_range(&self, lo: Option<&[u8]>, hi: Option<&[u8]>, out: &mut Vec<Msg>) {
        let lower = lo.map_or(Bound::Unbounded, Bound::Included);
        let upper = hi.map_or(Bound::Unbounded, Bound::Excluded);
        if let (Some(l), Some(h)) = (lo, hi) {
            if l >= h {
                return;
            }
        }
        for (key, list) in self.points.range::<[u8], _>((lower, upper)) {
            for (msn, op) in list {
                out.push(Msg::Point {
                    msn: *msn,
                    key: key.clone(),
                    op: op.clone(),
                });
            }
        }
        for r in &self.ranges {
            if r.overlaps(lo, hi) {
                out.push(Msg::Range(r.clone()));
            }
        }
    }

    /// Moves every message of `other` in (used when two children merge; their key ranges are
    /// disjoint, range messages delivered to both are kept once).
    pub fn absorb(&mut self, other: Buffer) {
        let mut other = other;
        for m in other.take_all() {
            self.push(m);
        }
    }

    /// Smallest and largest MSN held (`None` when empty).
    pub fn msn_bounds(&self) -> Option<(Msn, Msn)> {
        let mut lo = Msn::MAX;
        let mut hi = 0;
        for list in self.points.values() {
            for (m, _) in list {
                lo = lo.min(*m);
                hi = hi.max(*m);
            }
        }
        for r in &self.ranges {
            lo = lo.min(r.msn);
            hi = hi.max(r.msn);
        }
        (self.count > 0).then_some((lo, hi))
    }

    /// Point keys held, in order, with their per-key lists (integrity checks).
    pub fn point_lists(&self) -> impl Iterator<Item = (&Vec<u8>, &Vec<(Msn, PointOp)>)> {
        self.points.iter()
    }

    /// Whether the key filter holds the hash of every point key (a filter miss must be exact).
    pub fn filter_covers_keys(&self) -> bool {
        self.points.keys().all(|k| self.key_hashes.contains(&key_hash(k)))
    }

    /// Range messages held, in MSN order.
    pub fn range_msgs(&self) -> &[RangeMsg] {
        &self.ranges
    }
}

/// Applies `msg` to sorted, duplicate-free `entries`, restricted to keys in `[lo, hi)`.
/// Returns the change in entry bytes (keys plus values).
pub fn apply_to_entries(
    entries: &mut Vec<(Vec<u8>, Vec<u8>)>,
    msg: &Msg,
    lo: Option<&[u8]>,
    hi: Option<&[u8]>,
) -> isize {
    match msg {
        Msg::Point { key, op, .. } => {
            if lo.is_some_and(|l| key.as_slice() < l) || hi.is_some_and(|h| key.as_slice() >= h) {
                return 0;
            }
            match entries.binary_search_by(|(k, _)| k.as_slice().cmp(key)) {
                Ok(i) => {
                    let (_, old) = entries.remove(i);
                    let old_size = (key.len() + old.len()) as isize;
                    match apply_point(Some(old), op) {
                        Some(v) => {
                            let new_size = (key.len() + v.len()) as isize;
                            entries.insert(i, (key.clone(), v));
                            new_size - old_size
                        }
                        None => -old_size,
                    }
                }
                Err(i) => match apply_point(None, op) {
                    Some(v) => {
                        let new_size = (key.len() + v.len()) as isize;
                        entries.insert(i, (key.clone(), v));
                        new_size
                    }
                    None => 0,
                },
            }
        }
        Msg::Range(r) => {
            let start: &[u8] = match lo {
                Some(l) if l > r.start.as_slice() => l,
                _ => &r.start,
            };
            let end: Option<&[u8]> = match (r.end.as_deref(), hi) {
                (Some(e), Some(h)) => Some(e.min(h)),
                (Some(e), None) => Some(e),
                (None, h) => h,
            };
            let first = entries.partition_point(|(k, _)| k.as_slice() < start);
            let last = match end {
                Some(e) => entries.partition_point(|(k, _)| k.as_slice() < e),
                None => entries.len(),
            };
            if first >= last {
                return 0;
            }
            match &r.op {
                RangeOp::Delete => {
                    let removed: isize = entries
                        .drain(first..last)
                        .map(|(k, v)| (k.len() + v.len()) as isize)
                        .sum();
                    -removed
                }
                RangeOp::Upsert(_) => {
                    let mut delta = 0isize;
                    for (_, v) in &mut entries[first..last] {
                        let old = v.len() as isize;
                        if let Some(nv) = apply_range(v, &r.op) {
                            delta += nv.len() as isize - old;
                            *v = nv;
                        }
                    }
                    delta
                }
            }
        }
    }
}
