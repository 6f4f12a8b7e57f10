//! In-memory index of live entries: log index -> (segment, offset, length, cached payload).

use std::collections::VecDeque;

use bytes::Bytes;

/// Where one live entry's record sits, and its payload while cached.
#[derive(Debug, Clone)]
pub(crate) struct EntryLoc {
    /// Segment sequence number.
    pub(crate) seq: u64,
    /// Byte offset of the record (its `len` field) in the segment file.
    pub(crate) offset: u64,
    /// Payload length in bytes.
    pub(crate) payload_len: u32,
    /// The payload, while cached (always while not yet written by the flusher).
    pub(crate) payload: Option<Bytes>,
}

impl EntryLoc {
    /// Byte offset just past the record.
    pub(crate) fn end_offset(&self) -> u64 {
        self.offset + crate::format::RECORD_OVERHEAD_BYTES as u64 + u64::from(self.payload_len)
    }
}

/// Contiguous live entries `[first, first + len)`, plus a payload cache bounded in bytes.
#[derive(Debug, Default)]
pub(crate) struct EntryIndex {
    first: u64,
    entries: VecDeque<EntryLoc>,
    /// Payload bytes currently cached.
    cached_bytes: u64,
    /// Lowest index that may still hold a cached, written payload (eviction cursor).
    evict_from: u64,
}

impl EntryIndex {
    pub(crate) fn first_index(&self) -> Option<u64> {
        (!self.entries.is_empty()).then_some(self.first)
    }

    pub(crate) fn last_index(&self) -> Option<u64> {
        (!self.entries.is_empty()).then(|| self.first + self.entries.len() as u64 - 1)
    }

    /// The index the next entry must carry, None when empty (any index is accepted).
    pub(crate) fn next_index(&self) -> Option<u64> {
        self.last_index().map(|l| l + 1)
    }

    pub(crate) fn cached_bytes(&self) -> u64 {
        self.cached_bytes
    }

    /// Adds the entry `index`; the caller has checked `index == next_index()` (or empty).
    pub(crate) fn push(&mut self, index: u64, loc: EntryLoc) {
        debug_assert!(
            self.next_index().is_none_or(|n| n == index),
            "non-contiguous push"
        );
        if self.entries.is_empty() {
            self.first = index;
            self.evict_from = index;
        }
        if let Some(p) = &loc.payload {
            self.cached_bytes += p.len() as u64;
        }
        self.entries.push_back(loc);
    }

    pub(crate) fn get(&self, index: u64) -> Option<&EntryLoc> {
        let pos = index.checked_sub(self.first)?;
        self.entries.get(usize::try_from(pos).ok()?)
    }

    /// Removes every entry with index >= `from`.
    pub(crate) fn truncate_from(&mut self, from: u64) {
        let keep = from.saturating_sub(self.first).min(self.entries.len() as u64) as usize;
        for loc in self.entries.drain(keep..) {
            if let Some(p) = loc.payload {
                self.cached_bytes -= p.len() as u64;
            }
        }
        self.evict_from = self.evict_from.min(from);
    }

    /// Removes every entry with index <= `up_to`.
    pub(crate) fn purge_up_to(&mut self, up_to: u64) {
        if self.entries.is_empty() || up_to < self.first {
            return;
        }
        let drop_count = (up_to - self.first + 1).min(self.entries.len() as u64) as usize;
        for loc in self.entries.drain(..drop_count) {
            if let Some(p) = loc.payload {
                self.cached_bytes -= p.len() as u64;
            }
        }
        self.first = up_to + 1;
        self.evict_from = self.evict_from.max(self.first);
    }

    /// Drops cached payloads of written entries, oldest first, until at most `limit_bytes` remain
    /// or the next candidate is not written yet (`(seq, end)` beyond `written`).
    pub(crate) fn evict(&mut self, limit_bytes: u64, written: (u64, u64)) {
        let mut index = self.evict_from.max(self.first);
        while self.cached_bytes > limit_bytes {
            let Some(pos) = index
                .checked_sub(self.first)
                .and_then(|p| usize::try_from(p).ok())
            else {
                break;
            };
            let Some(loc) = self.entries.get_mut(pos) else {
                break;
            };
            if (loc.seq, loc.end_offset()) > written {
                break;
            }
            if let Some(p) = loc.payload.take() {
                self.cached_bytes -= p.len() as u64;
            }
            index += 1;
        }
        self.evict_from = index;
    }

    /// The segment holding the lowest live entry.
    pub(crate) fn first_segment(&self) -> Option<u64> {
        self.entries.front().map(|l| l.seq)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn loc(seq: u64, offset: u64, payload: &'static [u8]) -> EntryLoc {
        EntryLoc {
            seq,
            offset,
            payload_len: payload.len() as u32,
            payload: Some(Bytes::from_static(payload)),
        }
    }

    #[test]
    fn push_truncate_purge_evict() {
        let mut ix = EntryIndex::default();
        assert_eq!(ix.first_index(), None);
        for i in 5..15u64 {
            ix.push(i, loc(1, i * 100, b"0123456789"));
        }
        assert_eq!((ix.first_index(), ix.last_index()), (Some(5), Some(14)));
        assert_eq!(ix.cached_bytes(), 100);
        ix.truncate_from(12);
        assert_eq!(ix.last_index(), Some(11));
        assert_eq!(ix.cached_bytes(), 70);
        ix.purge_up_to(6);
        assert_eq!(ix.first_index(), Some(7));
        assert_eq!(ix.cached_bytes(), 50);
        // Written up to the end of entry 8's record only.
        ix.evict(0, (1, ix.get(8).unwrap().end_offset()));
        assert!(ix.get(7).unwrap().payload.is_none());
        assert!(ix.get(8).unwrap().payload.is_none());
        assert!(
            ix.get(9).unwrap().payload.is_some(),
            "unwritten entries stay cached"
        );
        assert_eq!(ix.cached_bytes(), 30);
        ix.purge_up_to(100);
        assert_eq!(ix.first_index(), None);
        assert_eq!(ix.cached_bytes(), 0);
        ix.push(200, loc(2, 0, b"x"));
        assert_eq!((ix.first_index(), ix.last_index()), (Some(200), Some(200)));
    }
}
