//! Key order, key prefixes and key hashes.

use super::*;

/// Byte-wise (lexicographic) order of two keys, the order of every key in the tree, with a fast
/// path: when both keys have at least 8 bytes, their first 8 bytes are compared as big-endian
/// `u64`s (the same order), and `memcmp` runs only when those are equal. With random keys that
/// settles nearly every comparison of a flush's pivot search or a spill's sort in registers
/// (they were about 13% of the writer's samples beyond memory, mostly `memcmp` calls).
#[inline]
// Big-endian on purpose: it is the integer order that equals byte-wise key order (in memory
// only, never stored).
#[allow(clippy::big_endian_bytes)]
pub(crate) fn key_cmp(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
    if let (Some(pa), Some(pb)) = (a.first_chunk::<8>(), b.first_chunk::<8>()) {
        let (pa, pb) = (u64::from_be_bytes(*pa), u64::from_be_bytes(*pb));
        if pa != pb {
            return pa.cmp(&pb);
        }
    }
    a.cmp(b)
}

/// The first 8 bytes of `key` as a big-endian `u64`, zero-padded: `key_prefix(a) <
/// key_prefix(b)` implies `a < b`, so a search over a contiguous array of prefixes settles most
/// comparisons without touching the keys (each its own allocation, a cache miss apiece).
#[inline]
// Big-endian on purpose: the integer order equals byte-wise key order (never stored).
#[allow(clippy::big_endian_bytes)]
pub(crate) fn key_prefix(key: &[u8]) -> u64 {
    let mut b = [0u8; 8];
    let n = key.len().min(8);
    #[allow(clippy::indexing_slicing)] // n <= 8 = b.len() and n <= key.len()
    b[..n].copy_from_slice(&key[..n]);
    u64::from_be_bytes(b)
}

/// The number of sorted keys at or below `key`, i.e. `keys.partition_point(|k| k <= key)`,
/// where `prefixes[i]` is [`key_prefix`] of key `i` and `key_le(i)` compares key `i` in full
/// (asked only when its prefix equals `key`'s).
#[inline]
pub(crate) fn count_at_or_below(prefixes: &[u64], key: &[u8], key_le: impl Fn(usize) -> bool) -> usize {
    let kp = key_prefix(key);
    let (mut lo, mut hi) = (0usize, prefixes.len());
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        #[allow(clippy::indexing_slicing)] // lo <= mid < hi <= prefixes.len()
        let p = prefixes[mid];
        if p < kp || (p == kp && key_le(mid)) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

/// Sorts point messages by (key, MSN); range messages (none are expected: spills and runs hold
/// point messages only) go after them in MSN order, so the order is total. A (key, MSN) pair is
/// unique among the messages of one buffer or run (every op has its own MSN and a buffer drops
/// a re-delivered one), so an unstable sort gives the one order.
pub(crate) fn sort_points_by_key(msgs: &mut [Msg]) {
    msgs.sort_unstable_by(|a, b| match (a, b) {
        (Msg::Point { key: ka, msn: ma, .. }, Msg::Point { key: kb, msn: mb, .. }) => {
            key_cmp(ka, kb).then(ma.cmp(mb))
        }
        (Msg::Point { .. }, Msg::Range(_)) => std::cmp::Ordering::Less,
        (Msg::Range(_), Msg::Point { .. }) => std::cmp::Ordering::Greater,
        (Msg::Range(ra), Msg::Range(rb)) => ra.msn.cmp(&rb.msn),
    });
}

/// Hash of a key for the per-buffer filters.
pub(crate) fn key_hash(key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(key)
}
