//! Permissions on key ranges, and whether a set of them covers the range a request touches.
//!
//! A permission names a key (`range_end` empty), a range `[key, range_end)`, or every key from
//! `key` on (`range_end` = `"\0"`, etcd's convention). A request is allowed when the **union**
//! of the caller's permissions of the needed type covers every key it touches (etcd merges a
//! role's ranges the same way before checking), so `[a, b)` plus `[b, c)` allow a scan of
//! `[a, c)`.

use serde::{Deserialize, Serialize};

/// What a permission allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum PermType {
    /// Get, Scan, Txn compares and gets.
    Read,
    /// Put, Delete, Upsert, ranges of them, bulk loads.
    Write,
    /// Both.
    ReadWrite,
}

impl PermType {
    /// Whether a permission of this type allows `needed` (`Read` or `Write`).
    pub fn allows(self, needed: PermType) -> bool {
        self == needed || self == PermType::ReadWrite
    }

    /// etcd's name: `READ`, `WRITE`, `READWRITE`.
    pub fn name(self) -> &'static str {
        match self {
            PermType::Read => "READ",
            PermType::Write => "WRITE",
            PermType::ReadWrite => "READWRITE",
        }
    }
}

/// One permission of a role, as etcd stores it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Permission {
    /// What it allows.
    pub perm_type: PermType,
    /// The key, or the start of the range.
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    /// Empty: the key alone; `"\0"`: every key from `key` on; else the exclusive end.
    #[serde(with = "serde_bytes")]
    pub range_end: Vec<u8>,
}

impl Permission {
    /// The keys it covers.
    pub fn range(&self) -> KeyRange {
        KeyRange::from_etcd(&self.key, &self.range_end)
    }
}

/// A half-open key range `[start, end)`; `end = None` is unbounded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyRange {
    /// First key.
    pub start: Vec<u8>,
    /// Exclusive end, `None` = every key from `start` on.
    pub end: Option<Vec<u8>>,
}

impl KeyRange {
    /// The single key `key`.
    pub fn key(key: &[u8]) -> KeyRange {
        let mut end = key.to_vec();
        end.push(0);
        KeyRange {
            start: key.to_vec(),
            end: Some(end),
        }
    }

    /// `[start, end)`, `end = None` unbounded.
    pub fn new(start: &[u8], end: Option<&[u8]>) -> KeyRange {
        KeyRange {
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
        }
    }

    /// etcd's `(key, range_end)`: empty end = the key alone, `"\0"` = unbounded.
    pub fn from_etcd(key: &[u8], range_end: &[u8]) -> KeyRange {
        match range_end {
            [] => KeyRange::key(key),
            [0] => KeyRange::new(key, None),
            end => KeyRange::new(key, Some(end)),
        }
    }

    /// Whether it holds no key.
    pub fn is_empty(&self) -> bool {
        self.end.as_deref().is_some_and(|e| e <= self.start.as_slice())
    }

    /// Whether `key` is inside.
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && self.end.as_deref().is_none_or(|e| key < e)
    }
}

impl std::fmt::Display for KeyRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let start = super::show_key(&self.start);
        match &self.end {
            Some(end) if *end == KeyRange::key(&self.start).end.unwrap_or_default() => {
                write!(f, "key \"{start}\"")
            }
            Some(end) => write!(f, "range [\"{start}\", \"{}\")", super::show_key(end)),
            None => write!(f, "range [\"{start}\", end of keys)"),
        }
    }
}

/// Whether the union of `ranges` covers every key of `wanted`.
pub fn covers<'a>(ranges: impl IntoIterator<Item = &'a KeyRange>, wanted: &KeyRange) -> bool {
    if wanted.is_empty() {
        return true;
    }
    let mut sorted: Vec<&KeyRange> = ranges.into_iter().filter(|r| !r.is_empty()).collect();
    sorted.sort_by(|a, b| a.start.cmp(&b.start));
    // `reached`: every key in [wanted.start, reached) is covered so far (None: all of them).
    let mut reached: Option<Vec<u8>> = Some(wanted.start.clone());
    for r in sorted {
        let Some(cur) = reached.as_ref() else { break };
        if r.start.as_slice() > cur.as_slice() {
            break;
        }
        match (&r.end, cur) {
            (None, _) => reached = None,
            (Some(end), cur) if end.as_slice() > cur.as_slice() => reached = Some(end.clone()),
            _ => {}
        }
    }
    match (reached, &wanted.end) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(reached), Some(end)) => reached.as_slice() >= end.as_slice(),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn r(start: &[u8], end: Option<&[u8]>) -> KeyRange {
        KeyRange::new(start, end)
    }

    #[test]
    fn single_keys_ranges_and_unbounded_ends() {
        let a_prefix = r(b"a/", Some(b"a0"));
        assert!(covers([&a_prefix], &KeyRange::key(b"a/x")));
        assert!(covers([&a_prefix], &r(b"a/", Some(b"a/zzz"))));
        assert!(!covers([&a_prefix], &KeyRange::key(b"b")));
        assert!(!covers([&a_prefix], &r(b"a/", None)));
        assert!(!covers([&a_prefix], &r(b"a", Some(b"a/x"))));
        // Two adjacent ranges cover their union.
        let (ab, bc) = (r(b"a", Some(b"b")), r(b"b", Some(b"c")));
        assert!(covers([&ab, &bc], &r(b"a", Some(b"c"))));
        assert!(!covers([&ab], &r(b"a", Some(b"c"))));
        // A gap is not covered.
        let cd = r(b"c", Some(b"d"));
        assert!(!covers([&ab, &cd], &r(b"a", Some(b"d"))));
        // Unbounded.
        let all = KeyRange::from_etcd(b"", b"\0");
        assert!(covers([&all], &r(b"", None)));
        assert!(covers([&all], &KeyRange::key(b"\xff\xfe")));
        // Empty wanted range: nothing to cover.
        assert!(covers([], &r(b"b", Some(b"a"))));
        assert!(!covers([], &KeyRange::key(b"")));
    }

    #[test]
    fn etcd_encoding_of_a_key_and_display() {
        assert_eq!(KeyRange::from_etcd(b"k", b""), KeyRange::key(b"k"));
        assert_eq!(KeyRange::from_etcd(b"k", b"\0").end, None);
        assert_eq!(KeyRange::key(b"k").to_string(), "key \"k\"");
        assert_eq!(r(b"a/", Some(b"a0")).to_string(), "range [\"a/\", \"a0\")");
        assert_eq!(r(b"\xff", None).to_string(), "range [\"\\xff\", end of keys)");
    }

    fn small_key() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(0u8..4, 0..3)
    }

    fn range() -> impl Strategy<Value = KeyRange> {
        (small_key(), prop::option::weighted(0.8, small_key()))
            .prop_map(|(s, e)| KeyRange { start: s, end: e })
    }

    /// Every key of up to 3 bytes over {0..4}: the model's universe (ranges over these keys
    /// hold keys outside it too, but a gap always shows at a key of the universe or at a
    /// longer key whose 3-byte prefix is in it, so the model also checks one byte longer).
    fn universe() -> Vec<Vec<u8>> {
        let mut keys = vec![Vec::new()];
        for len in 1..=4usize {
            let mut k = vec![0u8; len];
            loop {
                keys.push(k.clone());
                let mut i = len;
                loop {
                    if i == 0 {
                        break;
                    }
                    i -= 1;
                    if k[i] < 4 {
                        k[i] += 1;
                        break;
                    }
                    k[i] = 0;
                    if i == 0 {
                        break;
                    }
                }
                if k.iter().all(|b| *b == 0) {
                    break;
                }
            }
        }
        keys
    }

    proptest! {
        #[test]
        fn covers_agrees_with_a_key_by_key_model(
            ranges in prop::collection::vec(range(), 0..5),
            wanted in range(),
        ) {
            let model = universe()
                .iter()
                .filter(|k| wanted.contains(k))
                .all(|k| ranges.iter().any(|r| r.contains(k)));
            let fast = covers(&ranges, &wanted);
            // The fast check can only be stricter than the model (the model sees a finite
            // universe); where it says covered, the model must agree.
            if fast {
                prop_assert!(model, "covers() said yes, the model found an uncovered key");
            }
            // Bounded wanted ranges inside the universe are decided the same way by both.
            if wanted.end.as_ref().is_some_and(|e| e.len() <= 3) && wanted.start.len() <= 3
                && ranges.iter().all(|r| r.end.as_ref().is_some_and(|e| e.len() <= 3)) {
                prop_assert_eq!(fast, model);
            }
        }
    }
}
