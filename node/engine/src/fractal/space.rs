//! Block space of the tree file: a first-fit free-extent allocator and the rule for when a
//! block that left the live tree may be reused.
//!
//! A block may be overwritten only when no checkpoint that can still be opened refers to it:
//! not the newest durable checkpoint, not the one before it (the fallback when the newest header
//! is torn), and not the checkpoint being written right now (PerconaFT keeps the same three
//! translation tables: current, checkpointed and in-progress, `ft/serialize/block_table.cc`).
//! Such blocks wait in `deferred` until a commit drops the last checkpoint referring to them.
//! Blocks written and superseded between two checkpoints are reused at once.
//!
//! Shared (behind a mutex) by the cachetable, which writes nodes under the engine lock, and a
//! checkpoint writing its snapshot without that lock.

use std::collections::{BTreeMap, HashSet};

use super::codec::{align_up, DATA_START};
use super::limits::{PUNCH_ALIGN_BYTES, PUNCH_MIN_BYTES};

/// The free list and the checkpoints' claims on blocks. Offsets and lengths in bytes; lengths
/// are allocation sizes (multiples of the block alignment).
#[derive(Debug, Default)]
pub(crate) struct Space {
    /// Free extents: offset -> length.
    pub(crate) free: BTreeMap<u64, u64>,
    /// End of the allocated space (the file may be longer until the next commit cuts it).
    pub(crate) end: u64,
    /// Offsets of the blocks the newest durable checkpoint refers to (its BTT block included).
    pub(crate) durable: HashSet<u64>,
    /// Offsets of the blocks the previous durable checkpoint refers to.
    pub(crate) fallback: HashSet<u64>,
    /// Offsets of the blocks the checkpoint being written refers to.
    pub(crate) in_progress: HashSet<u64>,
    /// Blocks out of the live tree that a checkpoint above still refers to: offset -> length.
    pub(crate) deferred: BTreeMap<u64, u64>,
    /// Ranges inside free extents that were given back to the file system
    /// ([`Space::take_new_holes`]): offset -> length.
    pub(crate) punched: BTreeMap<u64, u64>,
}

impl Space {
    /// Space for a file whose live tree uses `live` blocks, whose newest checkpoint refers to
    /// `durable` and the one before it to `fallback` (each `(offset, length)`). A fallback that
    /// overlaps the others (a damaged older image) is forgotten rather than trusted.
    pub(crate) fn new(live: &[(u64, u64)], durable: &[(u64, u64)], fallback: &[(u64, u64)]) -> Space {
        let live_offsets: HashSet<u64> = live.iter().map(|(o, _)| *o).collect();
        let mut claimed: BTreeMap<u64, u64> = live.iter().chain(durable).copied().collect();
        let mut with_fallback = claimed.clone();
        with_fallback.extend(fallback.iter().copied());
        let fallback_ok = !overlaps(&with_fallback);
        if fallback_ok {
            claimed = with_fallback;
        }
        let mut s = Space {
            durable: durable.iter().map(|(o, _)| *o).collect(),
            fallback: if fallback_ok {
                fallback.iter().map(|(o, _)| *o).collect()
            } else {
                HashSet::new()
            },
            ..Space::default()
        };
        let mut cursor = DATA_START;
        for (&off, &len) in &claimed {
            if !live_offsets.contains(&off) {
                s.deferred.insert(off, len);
            }
            if off > cursor {
                s.free.insert(cursor, off - cursor);
            }
            cursor = cursor.max(off + len);
        }
        s.end = cursor;
        s
    }

    /// End of the allocated space, in bytes.
    pub(crate) fn end(&self) -> u64 {
        self.end
    }

    /// Allocates `len` bytes (rounded up to the alignment): the lowest free extent that fits,
    /// else the end of the file. Returns the offset.
    pub(crate) fn alloc(&mut self, len: u64) -> u64 {
        let len = align_up(len.max(1));
        let found = self.free.iter().find(|(_, l)| **l >= len).map(|(o, l)| (*o, *l));
        if let Some((off, flen)) = found {
            self.free.remove(&off);
            if flen > len {
                self.free.insert(off + len, flen - len);
            }
            return off;
        }
        let off = self.end;
        self.end += len;
        off
    }

    /// Allocates a block for the checkpoint being written (claimed by it from the start).
    pub(crate) fn alloc_for_checkpoint(&mut self, len: u64) -> u64 {
        let off = self.alloc(len);
        self.in_progress.insert(off);
        off
    }

    /// Gives back a block that was allocated but never became part of anything (a failed
    /// write): free at once.
    pub(crate) fn unalloc(&mut self, off: u64, len: u64) {
        self.in_progress.remove(&off);
        self.free_extent(off, align_up(len.max(1)));
    }

    /// A block left the live tree (its node was rewritten or deleted, or it belongs only to a
    /// checkpoint): reused at once unless a checkpoint still refers to it.
    pub(crate) fn release(&mut self, off: u64, len: u64) {
        let len = align_up(len.max(1));
        if self.durable.contains(&off) || self.fallback.contains(&off) || self.in_progress.contains(&off) {
            let prev = self.deferred.insert(off, len);
            debug_assert!(prev.is_none(), "block {off} released twice");
        } else {
            self.free_extent(off, len);
        }
    }

    /// A checkpoint starts: it refers to the live blocks at `offsets` (and later to the blocks
    /// it allocates with [`Space::alloc_for_checkpoint`]).
    pub(crate) fn begin(&mut self, offsets: impl IntoIterator<Item = u64>) {
        assert!(self.in_progress.is_empty(), "a checkpoint is already in progress");
        self.in_progress.extend(offsets);
    }

    /// The checkpoint in progress is durable: it becomes the newest, the newest becomes the
    /// fallback, and blocks only the old fallback referred to are freed.
    pub(crate) fn commit(&mut self) {
        self.fallback = std::mem::replace(&mut self.durable, std::mem::take(&mut self.in_progress));
        let released: Vec<(u64, u64)> = self
            .deferred
            .iter()
            .filter(|(o, _)| !self.durable.contains(o) && !self.fallback.contains(o))
            .map(|(o, l)| (*o, *l))
            .collect();
        for (o, l) in released {
            self.deferred.remove(&o);
            self.free_extent(o, l);
        }
    }

    /// The checkpoint in progress failed: it claims nothing any more (after a full disk the
    /// blocks it wrote were given back with [`Space::unalloc`]; after a fault they stay
    /// allocated: the engine is poisoned and the next open rebuilds the space).
    pub(crate) fn abort(&mut self) {
        self.in_progress.clear();
    }

    /// The `PUNCH_ALIGN_BYTES`-aligned interiors of free extents, at least `PUNCH_MIN_BYTES`
    /// long, that were not punched yet; remembers every current one as punched (a range that
    /// was reallocated since is forgotten, and punched again once it is free again). The caller
    /// punches them while it holds the space, so none is allocated meanwhile.
    pub(crate) fn take_new_holes(&mut self) -> Vec<(u64, u64)> {
        let mut holes = BTreeMap::new();
        let mut new = Vec::new();
        for (&off, &len) in &self.free {
            let start = off.div_ceil(PUNCH_ALIGN_BYTES) * PUNCH_ALIGN_BYTES;
            let end = (off + len) / PUNCH_ALIGN_BYTES * PUNCH_ALIGN_BYTES;
            if end <= start || end - start < PUNCH_MIN_BYTES {
                continue;
            }
            let hole = end - start;
            if self.punched.get(&start) != Some(&hole) {
                new.push((start, hole));
            }
            holes.insert(start, hole);
        }
        self.punched = holes;
        new
    }

    /// Free extents and deferred blocks, each `(offset, length, what)`, for the integrity check.
    pub(crate) fn spans(&self) -> impl Iterator<Item = (u64, u64, &'static str)> + '_ {
        self.free
            .iter()
            .map(|(o, l)| (*o, *l, "free"))
            .chain(self.deferred.iter().map(|(o, l)| (*o, *l, "kept-for-checkpoint")))
    }

    pub(crate) fn free_extent(&mut self, mut off: u64, mut len: u64) {
        if len == 0 {
            return;
        }
        if let Some((&po, &pl)) = self.free.range(..off).next_back() {
            if po + pl == off {
                self.free.remove(&po);
                off = po;
                len += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(off + len)) {
            self.free.remove(&(off + len));
            len += nl;
        }
        if off + len >= self.end {
            self.end = off;
            // The extent before may now end at the new end.
            if let Some((&po, &pl)) = self.free.range(..off).next_back() {
                if po + pl == off {
                    self.free.remove(&po);
                    self.end = po;
                }
            }
        } else {
            self.free.insert(off, len);
        }
    }
}

/// Whether any two extents of `spans` (offset -> length, sorted by offset) overlap.
pub(crate) fn overlaps(spans: &BTreeMap<u64, u64>) -> bool {
    let mut prev_end = 0u64;
    for (&o, &l) in spans {
        if o < prev_end {
            return true;
        }
        prev_end = o + l;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const B: u64 = 4096;

    #[test]
    fn blocks_wait_for_the_checkpoints_that_refer_to_them() {
        let a = DATA_START;
        // Live tree: one block, also in the durable checkpoint.
        let mut s = Space::new(&[(a, B)], &[(a, B)], &[]);
        assert_eq!(s.end(), a + B);
        let b = s.alloc(B);
        assert_eq!(b, a + B);
        // Node rewritten: the durable block waits, the fresh one is reused at once.
        s.release(a, B);
        let c = s.alloc(B);
        assert_eq!(c, a + 2 * B, "a durable block must not be reused");
        s.release(c, B);
        assert_eq!(s.alloc(B), c, "a block no checkpoint refers to is reused");
        // Checkpoint 2 refers to b and c; a stays referred by the fallback after the commit.
        s.begin([b, c]);
        s.commit();
        assert_eq!(s.alloc(B), a + 3 * B);
        // Checkpoint 3: a is no longer referred to by any checkpoint and is freed.
        s.begin([b, c]);
        s.commit();
        assert_eq!(s.alloc(B), a);
    }

    #[test]
    fn the_checkpoint_in_progress_holds_its_blocks() {
        let a = DATA_START;
        let mut s = Space::new(&[(a, B)], &[(a, B)], &[]);
        s.begin([a]);
        let ck = s.alloc_for_checkpoint(B);
        // The live tree drops a (a node rewritten while the checkpoint is written).
        s.release(a, B);
        s.release(ck, B);
        assert_eq!(
            s.alloc(B),
            a + 2 * B,
            "blocks of the checkpoint in progress are kept"
        );
        s.commit();
        s.begin([]);
        s.commit();
        s.begin([]);
        s.commit();
        // Nothing refers to a or ck any more: both reused, lowest first.
        assert_eq!(s.alloc(B), a);
        assert_eq!(s.alloc(B), ck);
    }

    #[test]
    fn large_free_extents_are_punched_once_and_again_after_reuse() {
        let a = DATA_START;
        let mut s = Space::new(&[], &[], &[]);
        let big = 2 * PUNCH_MIN_BYTES;
        let x = s.alloc(big);
        let small = s.alloc(B);
        let _tail = s.alloc(B);
        assert!(s.take_new_holes().is_empty(), "nothing is free");
        s.release(x, big);
        s.release(small, B);
        // x and small merged into one free extent; only its aligned interior is punched.
        let holes = s.take_new_holes();
        let [(off, len)] = holes.as_slice() else {
            panic!("one hole expected: {holes:?}");
        };
        let (off, len) = (*off, *len);
        assert!(off >= a && off % PUNCH_ALIGN_BYTES == 0 && len % PUNCH_ALIGN_BYTES == 0);
        assert!(
            off + len <= x + big + B && len >= big - PUNCH_ALIGN_BYTES,
            "{holes:?}"
        );
        assert!(s.take_new_holes().is_empty(), "an extent is punched once");
        // Reused, then freed again: punched again.
        let y = s.alloc(big);
        assert_eq!(y, x);
        assert!(s.take_new_holes().is_empty(), "too small a remainder to punch");
        s.release(y, big);
        assert_eq!(s.take_new_holes().len(), 1);
        // Small extents are never punched.
        let mut t = Space::new(&[], &[], &[]);
        let p = t.alloc(PUNCH_MIN_BYTES / 2);
        let _q = t.alloc(B);
        t.release(p, PUNCH_MIN_BYTES / 2);
        assert!(t.take_new_holes().is_empty());
    }

    #[test]
    fn freeing_the_tail_shrinks_the_end() {
        let a = DATA_START;
        let mut s = Space::new(&[], &[], &[]);
        let x = s.alloc(B);
        let y = s.alloc(B);
        let z = s.alloc(B);
        assert_eq!((x, y, z), (a, a + B, a + 2 * B));
        s.release(y, B);
        s.release(z, B);
        assert_eq!(s.end(), a + B);
        s.release(x, B);
        assert_eq!(s.end(), a);
        assert!(s.spans().next().is_none());
    }

    #[test]
    fn an_overlapping_fallback_is_forgotten() {
        let a = DATA_START;
        let s = Space::new(&[(a, 2 * B)], &[(a, 2 * B)], &[(a + B, B)]);
        assert!(s.fallback.is_empty());
        assert_eq!(s.spans().count(), 0);
    }
}
