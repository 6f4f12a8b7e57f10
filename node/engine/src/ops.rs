//! Write operations and the deterministic semantics of upserts, shared by every engine.
//!
//! Upserts are TokuDB's read-free `INSERT IGNORE` / `ON DUPLICATE KEY UPDATE` as typed,
//! deterministic operations (PerconaFT `ft/msg.h` uses one opaque callback instead). The same
//! [`apply_upsert`] runs in every engine and on every replica, so replicas never diverge.

use serde::{Deserialize, Serialize};

/// A read-free operation on one value. Serialized inside Raft entries, so variants are only
/// ever added at the end (serde/postcard encode the variant index). Byte fields use
/// `serde_bytes`: the same postcard bytes as a plain `Vec<u8>`, encoded by one copy instead of
/// one call per byte.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UpsertOp {
    /// Store the operand only when the key is absent.
    SetIfAbsent(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Treat the value as an 8-byte little-endian `i64` (absent = 0) and add, saturating.
    /// A present value whose length is not 8 is left unchanged.
    Add(i64),
    /// Append bytes (absent = empty).
    Append(#[serde(with = "serde_bytes")] Vec<u8>),
    /// Keep the byte-wise (lexicographic) maximum of the value and the operand (absent = operand).
    Max(#[serde(with = "serde_bytes")] Vec<u8>),
}

/// One operation of an atomic write batch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WriteOp {
    /// Set `key` to `value`.
    Put {
        /// Key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Value.
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
    },
    /// Remove `key` (absent: no effect).
    Delete {
        /// Key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
    },
    /// Apply `op` to `key` without reading it first.
    Upsert {
        /// Key.
        #[serde(with = "serde_bytes")]
        key: Vec<u8>,
        /// Operation.
        op: UpsertOp,
    },
    /// Remove every key in `[start, end)`; `end = None` means unbounded.
    DeleteRange {
        /// Inclusive start.
        #[serde(with = "serde_bytes")]
        start: Vec<u8>,
        /// Exclusive end.
        #[serde(with = "serde_bytes")]
        end: Option<Vec<u8>>,
    },
    /// Apply `op` to every key **present** in `[start, end)` (a broadcast message: TokuDB's
    /// instant ADD COLUMN). `SetIfAbsent` never creates keys here, so it does nothing.
    UpsertRange {
        /// Inclusive start.
        #[serde(with = "serde_bytes")]
        start: Vec<u8>,
        /// Exclusive end (`None`: unbounded).
        #[serde(with = "serde_bytes")]
        end: Option<Vec<u8>>,
        /// Operation applied to each present value.
        op: UpsertOp,
    },
}

/// The new value after applying `op` to `old` (`None` = absent). Returns `None` when the key
/// stays absent. Pure and deterministic: every engine and replica uses exactly this.
pub fn apply_upsert(old: Option<&[u8]>, op: &UpsertOp) -> Option<Vec<u8>> {
    match op {
        UpsertOp::SetIfAbsent(v) => Some(old.map_or_else(|| v.clone(), <[u8]>::to_vec)),
        UpsertOp::Add(delta) => match old {
            None => Some(delta.to_le_bytes().to_vec()),
            Some(bytes) => match <[u8; 8]>::try_from(bytes) {
                Ok(raw) => Some(
                    i64::from_le_bytes(raw)
                        .saturating_add(*delta)
                        .to_le_bytes()
                        .to_vec(),
                ),
                Err(_) => Some(bytes.to_vec()),
            },
        },
        UpsertOp::Append(suffix) => {
            let mut v = old.map(<[u8]>::to_vec).unwrap_or_default();
            v.extend_from_slice(suffix);
            Some(v)
        }
        UpsertOp::Max(operand) => match old {
            Some(cur) if cur >= operand.as_slice() => Some(cur.to_vec()),
            _ => Some(operand.clone()),
        },
    }
}

/// Value of a present key after a broadcast of `op` (`UpsertRange`): like [`apply_upsert`] on a
/// present value.
pub fn apply_broadcast(old: &[u8], op: &UpsertOp) -> Vec<u8> {
    apply_upsert(Some(old), op).unwrap_or_else(|| old.to_vec())
}

/// True when `key` lies in `[start, end)` (`end = None`: unbounded).
pub fn in_range(key: &[u8], start: &[u8], end: Option<&[u8]>) -> bool {
    key >= start && end.is_none_or(|e| key < e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_counts_and_saturates() {
        let one = apply_upsert(None, &UpsertOp::Add(1));
        assert_eq!(one, Some(1i64.to_le_bytes().to_vec()));
        let three = apply_upsert(one.as_deref(), &UpsertOp::Add(2));
        assert_eq!(three, Some(3i64.to_le_bytes().to_vec()));
        let max = apply_upsert(Some(&i64::MAX.to_le_bytes()), &UpsertOp::Add(5));
        assert_eq!(max, Some(i64::MAX.to_le_bytes().to_vec()));
        // Not an i64: unchanged, never lost.
        assert_eq!(
            apply_upsert(Some(b"abc"), &UpsertOp::Add(1)),
            Some(b"abc".to_vec())
        );
    }

    #[test]
    fn set_if_absent_append_max() {
        assert_eq!(
            apply_upsert(None, &UpsertOp::SetIfAbsent(b"a".to_vec())),
            Some(b"a".to_vec())
        );
        assert_eq!(
            apply_upsert(Some(b"x"), &UpsertOp::SetIfAbsent(b"a".to_vec())),
            Some(b"x".to_vec())
        );
        assert_eq!(
            apply_upsert(Some(b"x"), &UpsertOp::Append(b"yz".to_vec())),
            Some(b"xyz".to_vec())
        );
        assert_eq!(
            apply_upsert(Some(b"b"), &UpsertOp::Max(b"a".to_vec())),
            Some(b"b".to_vec())
        );
        assert_eq!(
            apply_upsert(Some(b"a"), &UpsertOp::Max(b"b".to_vec())),
            Some(b"b".to_vec())
        );
        assert_eq!(
            apply_broadcast(b"v", &UpsertOp::SetIfAbsent(b"q".to_vec())),
            b"v".to_vec()
        );
    }

    #[test]
    fn range_bounds() {
        assert!(in_range(b"b", b"a", Some(b"c")));
        assert!(!in_range(b"c", b"a", Some(b"c")));
        assert!(in_range(b"zzz", b"a", None));
        assert!(!in_range(b"0", b"a", None));
    }
}
