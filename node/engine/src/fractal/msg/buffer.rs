//! The per-child message buffer: an append log of point messages with a hash index by key,
//! and range messages in MSN order.

use super::*;

/// Hasher for keys that already are xxh3 hashes ([`key_hash`]): passes the value through.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used by the index; fold anything else so hashing stays total.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// Key hash -> index of the newest slot with that hash (the head of its chain).
pub(crate) type HashHeads = HashMap<u64, u32, BuildHasherDefault<PrehashedHasher>>;

/// End of a hash chain.
pub(crate) const NO_SLOT: u32 = u32::MAX;

/// One point message in a buffer's append log.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    /// Sequence number.
    pub(crate) msn: Msn,
    /// Key (emptied once superseded).
    pub(crate) key: Vec<u8>,
    /// Operation (`Delete` once superseded, dropping any payload).
    pub(crate) op: PointOp,
    /// [`key_hash`] of `key`.
    pub(crate) hash: u64,
    /// Previous (older) slot with the same hash, [`NO_SLOT`] at the end of the chain.
    pub(crate) prev: u32,
    /// False once a newer `Put`/`Delete` of the key superseded it.
    pub(crate) live: bool,
}

/// The message buffer of one child of an internal node.
///
/// Point messages live in an append-only log (arrival order, normally increasing MSN) with a
/// hash index (key hash -> newest slot, slots chained per hash), so a push costs one hash probe
/// and no per-key allocation, a flush hands the log over in MSN order without sorting, and the
/// hash index doubles as the exact per-buffer filter of point reads. Superseded messages are
/// marked dead (their payload dropped) and compacted away when they make up half the log. The
/// (key, MSN) order needed by range reads is built on demand and cached until the next push.
#[derive(Debug, Clone)]
pub(crate) struct Buffer {
    /// Point messages in arrival order (live and superseded).
    pub(crate) slots: Vec<Slot>,
    /// Newest slot per key hash.
    pub(crate) heads: HashHeads,
    /// Superseded slots still in `slots`.
    pub(crate) dead: usize,
    /// Whether `slots` is in strictly increasing MSN order.
    pub(crate) msn_sorted: bool,
    /// Range messages in increasing MSN order.
    pub(crate) ranges: Vec<RangeMsg>,
    /// Sum of message sizes.
    pub(crate) bytes: usize,
    /// Bytes of delete and range-delete messages (flushed first: they shrink the tree).
    pub(crate) delete_bytes: usize,
    /// Number of messages.
    pub(crate) count: usize,
    /// Indices of live slots sorted by (key, MSN); built by range reads, reset by pushes.
    pub(crate) key_order: OnceLock<Vec<u32>>,
    /// Older point messages spilled to disk, oldest first (see [`RunRef`]).
    pub(crate) spilled: Vec<RunRef>,
    /// Sum of `spilled[..].bytes`.
    pub(crate) spilled_bytes: usize,
}

impl Default for Buffer {
    fn default() -> Self {
        Buffer {
            slots: Vec::new(),
            heads: HashHeads::default(),
            dead: 0,
            msn_sorted: true,
            ranges: Vec::new(),
            bytes: 0,
            delete_bytes: 0,
            count: 0,
            key_order: OnceLock::new(),
            spilled: Vec::new(),
            spilled_bytes: 0,
        }
    }
}

impl PartialEq for Buffer {
    /// Equal when they hold the same messages (the log layout is not compared).
    fn eq(&self, other: &Self) -> bool {
        self.counters() == other.counters()
            && self.messages() == other.messages()
            && self.spilled == other.spilled
    }
}

impl Eq for Buffer {}

/// Slots older than this many dead ones are never compacted (small buffers keep their garbage).
pub(crate) const COMPACT_MIN_DEAD: usize = 64;

impl Buffer {
    /// An empty buffer.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Bytes of messages held.
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Flush priority: bytes, with deletes counted twice.
    pub(crate) fn flush_weight(&self) -> usize {
        self.bytes + self.delete_bytes
    }

    #[cfg(test)]
    /// Number of messages held.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// True when no message is held, in memory or spilled.
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0 && self.spilled.is_empty()
    }

    /// Memory the buffer takes: its in-memory messages plus the references to spilled runs.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.bytes + self.spilled.iter().map(RunRef::memory_bytes).sum::<usize>()
    }

    /// Runs spilled to disk, oldest first.
    pub(crate) fn spilled(&self) -> &[RunRef] {
        &self.spilled
    }

    /// Counted bytes of the spilled runs' messages.
    pub(crate) fn spilled_bytes(&self) -> usize {
        self.spilled_bytes
    }

    /// Records a run just spilled (its messages are older than those still in memory).
    pub(crate) fn push_spilled(&mut self, run: RunRef) {
        self.spilled_bytes += run.bytes as usize;
        self.spilled.push(run);
    }

    /// Removes and returns the spilled runs, oldest first.
    pub(crate) fn take_spilled(&mut self) -> Vec<RunRef> {
        self.spilled_bytes = 0;
        std::mem::take(&mut self.spilled)
    }

    /// Removes the in-memory point messages and returns them sorted by (key, MSN), for a spill;
    /// range messages and spilled runs stay.
    pub(crate) fn take_points(&mut self) -> Vec<Msg> {
        let slots = std::mem::take(&mut self.slots);
        self.heads.clear();
        self.dead = 0;
        self.msn_sorted = true;
        self.key_order = OnceLock::new();
        let mut out: Vec<Msg> = slots
            .into_iter()
            .filter(|s| s.live)
            .map(|s| Msg::Point {
                msn: s.msn,
                key: s.key,
                op: s.op,
            })
            .collect();
        self.count = self.ranges.len();
        self.bytes = self.ranges.iter().map(RangeMsg::size_bytes).sum();
        self.delete_bytes = self
            .ranges
            .iter()
            .filter(|r| matches!(r.op, RangeOp::Delete))
            .map(RangeMsg::size_bytes)
            .sum();
        sort_points_by_key(&mut out);
        out
    }

    /// Adds a message. Messages must arrive in increasing MSN order per key; a `Put` or `Delete`
    /// supersedes the older point messages of its key (they can no longer change the outcome).
    /// A message whose MSN is already present (for its key, or among range messages) is skipped
    /// (idempotent re-delivery).
    pub(crate) fn push(&mut self, msg: Msg) {
        let size = msg.size_bytes();
        match msg {
            Msg::Point { msn, key, op } => self.push_point(msn, key, op, size),
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

    pub(crate) fn push_point(&mut self, msn: Msn, key: Vec<u8>, op: PointOp, size: usize) {
        if self.key_order.get().is_some() {
            self.key_order = OnceLock::new();
        }
        let hash = key_hash(&key);
        let head = self.heads.get(&hash).copied().unwrap_or(NO_SLOT);
        let supersedes = matches!(op, PointOp::Put(_) | PointOp::Delete);
        let mut duplicate = false;
        let mut at = head;
        while let Some(s) = self.slots.get_mut(at as usize) {
            at = s.prev;
            if !s.live || s.key != key {
                continue;
            }
            if s.msn == msn {
                duplicate = true;
            } else if supersedes && s.msn < msn {
                // Only older messages are superseded (out-of-order delivery never drops newer ones).
                self.bytes -= point_size(&s.key, &s.op);
                if matches!(s.op, PointOp::Delete) {
                    self.delete_bytes -= MSG_OVERHEAD_BYTES;
                }
                self.count -= 1;
                self.dead += 1;
                s.live = false;
                s.key = Vec::new();
                s.op = PointOp::Delete;
            }
        }
        if !duplicate {
            let index = self.slots.len();
            assert!(index < NO_SLOT as usize, "buffer slot index overflow");
            if self.slots.last().is_some_and(|last| last.msn >= msn) {
                self.msn_sorted = false;
            }
            if matches!(op, PointOp::Delete) {
                self.delete_bytes += MSG_OVERHEAD_BYTES;
            }
            self.bytes += size;
            self.count += 1;
            self.slots.push(Slot {
                msn,
                key,
                op,
                hash,
                prev: head,
                live: true,
            });
            self.heads.insert(hash, index as u32);
        }
        if self.dead >= COMPACT_MIN_DEAD && self.dead * 2 > self.slots.len() {
            self.compact();
        }
    }

    /// Drops superseded slots and rebuilds the hash chains.
    pub(crate) fn compact(&mut self) {
        self.slots.retain(|s| s.live);
        self.dead = 0;
        self.heads.clear();
        for (i, s) in self.slots.iter_mut().enumerate() {
            s.prev = self.heads.insert(s.hash, i as u32).unwrap_or(NO_SLOT);
        }
        self.msn_sorted = self.slots.is_sorted_by(|a, b| a.msn < b.msn);
        self.key_order = OnceLock::new();
    }

    pub(crate) fn live_slots(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter().filter(|s| s.live)
    }

    /// Recomputes `(bytes, delete_bytes, count)` from scratch (integrity checks).
    pub(crate) fn recompute(&self) -> (usize, usize, usize) {
        let mut bytes = 0;
        let mut deletes = 0;
        let mut count = 0;
        for s in self.live_slots() {
            bytes += point_size(&s.key, &s.op);
            if matches!(s.op, PointOp::Delete) {
                deletes += MSG_OVERHEAD_BYTES;
            }
            count += 1;
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
    pub(crate) fn counters(&self) -> (usize, usize, usize) {
        (self.bytes, self.delete_bytes, self.count)
    }

    /// Removes and returns every in-memory message in increasing MSN order (spilled runs stay:
    /// take them with [`Buffer::take_spilled`]).
    pub(crate) fn take_all(&mut self) -> Vec<Msg> {
        let spilled = std::mem::take(&mut self.spilled);
        let spilled_bytes = self.spilled_bytes;
        let taken = std::mem::take(self);
        self.spilled = spilled;
        self.spilled_bytes = spilled_bytes;
        let mut out: Vec<Msg> = Vec::with_capacity(taken.count);
        out.extend(taken.slots.into_iter().filter(|s| s.live).map(|s| Msg::Point {
            msn: s.msn,
            key: s.key,
            op: s.op,
        }));
        let points = out.len();
        out.extend(taken.ranges.into_iter().map(Msg::Range));
        if !(taken.msn_sorted
            && out.get(points).is_none_or(|r| {
                points
                    .checked_sub(1)
                    .and_then(|last| out.get(last))
                    .is_none_or(|p| p.msn() < r.msn())
            }))
        {
            // Stable: a sorted point run and the sorted range run merge in one pass.
            out.sort_by_key(Msg::msn);
        }
        out
    }

    /// Every message in increasing MSN order (cloned; for serialization and checks).
    pub(crate) fn messages(&self) -> Vec<Msg> {
        self.clone().take_all()
    }

    /// Messages that may affect `key`, appended to `out` (point messages of the key in MSN
    /// order, then range messages covering it in MSN order).
    /// `hash` is [`key_hash`] of `key`.
    pub(crate) fn collect_for_key(&self, key: &[u8], hash: u64, out: &mut Vec<Msg>) {
        let first = out.len();
        let mut at = self.heads.get(&hash).copied().unwrap_or(NO_SLOT);
        while let Some(s) = self.slots.get(at as usize) {
            at = s.prev;
            if s.live && s.key == key {
                out.push(Msg::Point {
                    msn: s.msn,
                    key: key.to_vec(),
                    op: s.op.clone(),
                });
            }
        }
        if let Some(found) = out.get_mut(first..) {
            found.sort_by_key(Msg::msn);
        }
        for r in &self.ranges {
            if r.covers(key) {
                out.push(Msg::Range(r.clone()));
            }
        }
    }

    /// Indices of live slots sorted by (key, MSN), built on first use after a change.
    pub(crate) fn key_order(&self) -> &[u32] {
        self.key_order.get_or_init(|| {
            let mut order: Vec<u32> = (0..self.slots.len() as u32)
                .filter(|&i| self.slots.get(i as usize).is_some_and(|s| s.live))
                .collect();
            order.sort_by(|&a, &b| {
                #[allow(clippy::indexing_slicing)] // `order` holds only indices below slots.len()
                let (sa, sb) = (&self.slots[a as usize], &self.slots[b as usize]);
                key_cmp(&sa.key, &sb.key).then(sa.msn.cmp(&sb.msn))
            });
            order
        })
    }

    /// Live slots in (key, MSN) order.
    pub(crate) fn slots_by_key(&self) -> impl Iterator<Item = &Slot> {
        self.key_order()
            .iter()
            .filter_map(|&i| self.slots.get(i as usize))
    }

    #[cfg(test)]
    /// Messages that may affect keys in `[lo, hi)` (`None` bounds infinite), appended to `out`
    /// (point messages in (key, MSN) order, then overlapping range messages in MSN order).
    pub(crate) fn collect_for_range(&self, lo: Option<&[u8]>, hi: Option<&[u8]>, out: &mut Vec<Msg>) {
        self.collect_for_range_limited(lo, hi, usize::MAX, out);
    }

    /// Like [`Buffer::collect_for_range`], but stops after the point messages of `max_keys`
    /// distinct keys (at least one). Returns the first key left out when it stopped early: the
    /// messages appended are then complete for `[lo, that key)` only (a scan's page needs a
    /// few keys, not the whole buffer). Range messages are always all appended.
    pub(crate) fn collect_for_range_limited(
        &self,
        lo: Option<&[u8]>,
        hi: Option<&[u8]>,
        max_keys: usize,
        out: &mut Vec<Msg>,
    ) -> Option<Vec<u8>> {
        if let (Some(l), Some(h)) = (lo, hi) {
            if l >= h {
                return None;
            }
        }
        let max_keys = max_keys.max(1);
        let mut cut = None;
        if !self.slots.is_empty() {
            let order = self.key_order();
            let first = match lo {
                #[allow(clippy::indexing_slicing)] // key_order() holds only indices below slots.len()
                Some(l) => order.partition_point(|&i| self.slots[i as usize].key.as_slice() < l),
                None => 0,
            };
            let mut keys = 0usize;
            let mut last_key: Option<&[u8]> = None;
            for &i in order.get(first..).unwrap_or_default() {
                let Some(s) = self.slots.get(i as usize) else {
                    break;
                };
                if hi.is_some_and(|h| s.key.as_slice() >= h) {
                    break;
                }
                if last_key != Some(s.key.as_slice()) {
                    if keys == max_keys {
                        cut = Some(s.key.clone());
                        break;
                    }
                    keys += 1;
                    last_key = Some(&s.key);
                }
                out.push(Msg::Point {
                    msn: s.msn,
                    key: s.key.clone(),
                    op: s.op.clone(),
                });
            }
        }
        for r in &self.ranges {
            if r.overlaps(lo, hi) {
                out.push(Msg::Range(r.clone()));
            }
        }
        cut
    }

    /// Moves every message of `other` in (used when two children merge; their key ranges are
    /// disjoint, range messages delivered to both are kept once).
    pub(crate) fn absorb(&mut self, other: Buffer) {
        let mut other = other;
        for m in other.take_all() {
            self.push(m);
        }
        for r in other.take_spilled() {
            self.push_spilled(r);
        }
    }

    #[cfg(test)]
    /// Smallest and largest MSN held (`None` when empty).
    pub(crate) fn msn_bounds(&self) -> Option<(Msn, Msn)> {
        let mut lo = Msn::MAX;
        let mut hi = 0;
        for m in self
            .live_slots()
            .map(|s| s.msn)
            .chain(self.ranges.iter().map(|r| r.msn))
        {
            lo = lo.min(m);
            hi = hi.max(m);
        }
        (self.count > 0).then_some((lo, hi))
    }

    /// Point messages held as `(msn, key, op)` in (key, MSN) order (integrity checks).
    pub(crate) fn point_msgs(&self) -> impl Iterator<Item = (Msn, &[u8], &PointOp)> {
        self.slots_by_key().map(|s| (s.msn, s.key.as_slice(), &s.op))
    }

    /// Whether the hash index (the key filter) is consistent: every live message is reachable
    /// from its key's chain (a filter miss must be exact), hashes match keys, and the
    /// superseded count matches. Returns the first problem found.
    pub(crate) fn check_index(&self) -> std::result::Result<(), String> {
        let live = self.live_slots().count();
        if live + self.dead != self.slots.len() {
            return Err(format!(
                "{} live + {} superseded slots != {} slots",
                live,
                self.dead,
                self.slots.len()
            ));
        }
        for (i, s) in self.slots.iter().enumerate() {
            if !s.live {
                continue;
            }
            if s.hash != key_hash(&s.key) {
                return Err(format!("slot {i}: stored hash does not match key {:?}", s.key));
            }
            let mut at = self.heads.get(&s.hash).copied().unwrap_or(NO_SLOT);
            let mut steps = 0usize;
            while at != NO_SLOT && at as usize != i && steps <= self.slots.len() {
                at = self.slots.get(at as usize).map_or(NO_SLOT, |x| x.prev);
                steps += 1;
            }
            if at as usize != i {
                return Err(format!("key filter misses buffered key {:?}", s.key));
            }
        }
        Ok(())
    }

    /// Key hashes of the live point messages (for the stored key filter).
    pub(crate) fn point_hashes(&self) -> Vec<u64> {
        self.live_slots().map(|s| s.hash).collect()
    }

    /// Range messages held, in MSN order.
    pub(crate) fn range_msgs(&self) -> &[RangeMsg] {
        &self.ranges
    }
}
