//! Basements: a leaf's sorted entries in one arena, with the builder that fills them.

use super::*;

/// Position of one entry inside a [`Basement`]'s byte arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    /// Offset of the key in `data`; the value follows the key.
    pub(crate) off: u32,
    /// Key length in bytes.
    pub(crate) klen: u32,
    /// Value length in bytes.
    pub(crate) vlen: u32,
}

/// A basement node: the unit of partial reads inside a leaf (sorted, duplicate-free entries).
///
/// Entries are packed: keys and values back to back in one byte arena, with a fixed-width slot
/// per entry, so a basement costs two allocations whatever its entry count, scans and binary
/// searches touch contiguous memory, and (de)serialization is a copy (PerconaFT's basement
/// nodes likewise keep a packed key/value area plus an offset array, `ft/bndata.h`).
#[derive(Debug, Clone, Default)]
pub(crate) struct Basement {
    /// Keys and values of every entry (in key order when freshly built; single-message updates
    /// append and leave garbage, compacted when it reaches half the arena).
    pub(crate) data: Vec<u8>,
    /// Arena bytes no slot points at.
    pub(crate) garbage_bytes: usize,
    /// One slot per entry, in key order.
    pub(crate) slots: Vec<Slot>,
    /// Highest MSN applied (messages at or below it are skipped: idempotent application).
    pub(crate) max_msn: Msn,
    /// Sum of key and value lengths.
    pub(crate) data_bytes: usize,
}

/// Builds a [`Basement`] from entries pushed in strictly increasing key order.
#[derive(Debug, Default)]
pub(crate) struct BasementBuilder {
    pub(crate) b: Basement,
}

impl BasementBuilder {
    /// A builder with room for about `entries` entries of `bytes` key and value bytes.
    pub(crate) fn with_capacity(entries: usize, bytes: usize) -> Self {
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
    pub(crate) fn push(&mut self, key: &[u8], value: &[u8]) {
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
    pub(crate) fn last_key(&self) -> Option<&[u8]> {
        self.b.last_key()
    }

    /// The basement, with applied MSN `max_msn`.
    pub(crate) fn finish(self, max_msn: Msn) -> Basement {
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
    // `found` implies i < len(); every slot's span lies in the arena (`append` writes it).
    #[allow(clippy::indexing_slicing)]
    pub(crate) fn set(&mut self, key: &[u8], value: Option<&[u8]>) {
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

    pub(crate) fn append(&mut self, key: &[u8], value: &[u8]) -> Slot {
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
    pub(crate) fn from_entries(entries: Vec<(Vec<u8>, Vec<u8>)>, max_msn: Msn) -> Self {
        let bytes = entries.iter().map(|(k, v)| k.len() + v.len()).sum();
        let mut w = BasementBuilder::with_capacity(entries.len(), bytes);
        for (k, v) in &entries {
            w.push(k, v);
        }
        w.finish(max_msn)
    }

    /// An empty basement with applied MSN `max_msn`.
    pub(crate) fn empty(max_msn: Msn) -> Self {
        Basement {
            max_msn,
            ..Basement::default()
        }
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    /// True when the basement holds no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Sum of key and value lengths.
    pub(crate) fn data_bytes(&self) -> usize {
        self.data_bytes
    }

    /// Bytes counted against node sizes (garbage in the arena included: it is memory).
    pub(crate) fn size_bytes(&self) -> usize {
        self.data_bytes + self.garbage_bytes + self.slots.len() * ENTRY_OVERHEAD_BYTES
    }

    /// Key of entry `i` (panics when out of range, like slice indexing).
    #[allow(clippy::indexing_slicing)] // slice-like accessor: i < len() is the caller's; spans lie in the arena
    pub(crate) fn key(&self, i: usize) -> &[u8] {
        let s = self.slots[i];
        &self.data[s.off as usize..(s.off + s.klen) as usize]
    }

    /// Value of entry `i` (panics when out of range).
    #[allow(clippy::indexing_slicing)] // slice-like accessor: i < len() is the caller's; spans lie in the arena
    pub(crate) fn value(&self, i: usize) -> &[u8] {
        let s = self.slots[i];
        let v = (s.off + s.klen) as usize;
        &self.data[v..v + s.vlen as usize]
    }

    /// Entry `i` as (key, value) (panics when out of range).
    pub(crate) fn entry(&self, i: usize) -> (&[u8], &[u8]) {
        (self.key(i), self.value(i))
    }

    /// Entries in key order.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = (&[u8], &[u8])> + ExactSizeIterator + '_ {
        (0..self.slots.len()).map(|i| self.entry(i))
    }

    /// Entries `range` in key order.
    pub(crate) fn iter_range(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        range.map(|i| self.entry(i))
    }

    /// Index of the first entry whose key is `>= key`.
    pub(crate) fn lower_bound(&self, key: &[u8]) -> usize {
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
    pub(crate) fn get(&self, key: &[u8]) -> Option<&[u8]> {
        let i = self.lower_bound(key);
        (i < self.len() && self.key(i) == key).then(|| self.value(i))
    }

    /// Smallest key.
    pub(crate) fn first_key(&self) -> Option<&[u8]> {
        (!self.is_empty()).then(|| self.key(0))
    }

    /// Largest key.
    pub(crate) fn last_key(&self) -> Option<&[u8]> {
        self.len().checked_sub(1).map(|i| self.key(i))
    }

    /// Counted size of entry `i` (key, value and per-entry overhead; panics when out of range).
    #[allow(clippy::indexing_slicing)] // slice-like accessor: i < len() is the caller's
    pub(crate) fn entry_size(&self, i: usize) -> usize {
        let s = self.slots[i];
        (s.klen + s.vlen) as usize + ENTRY_OVERHEAD_BYTES
    }

    /// A copy of entries `range` as a basement with the same applied MSN.
    pub(crate) fn slice(&self, range: std::ops::Range<usize>) -> Basement {
        let bytes = range.clone().map(|i| self.entry_size(i)).sum::<usize>();
        let mut w = BasementBuilder::with_capacity(range.len(), bytes);
        for (k, v) in self.iter_range(range) {
            w.push(k, v);
        }
        w.finish(self.max_msn)
    }

    #[cfg(test)]
    /// The entries as owned pairs (tests, leaf splits).
    pub(crate) fn to_entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.iter().map(|(k, v)| (k.to_vec(), v.to_vec())).collect()
    }

    /// Recomputes the key and value bytes from the slots (integrity checks).
    pub(crate) fn recompute_data_bytes(&self) -> usize {
        self.slots.iter().map(|s| (s.klen + s.vlen) as usize).sum()
    }
}
