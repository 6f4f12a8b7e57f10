//! The reserved key space: engine keys the state machine keeps for itself (the client-session
//! table, `session_store.rs`; staged bulk loads, `bulk.rs`; the auth state, `auth_store.rs`),
//! which no client request can read, write, scan or delete.
//!
//! Reserved are the keys that start with [`RESERVED_KEY_PREFIX`] (`0xFF 0xFF`, as FoundationDB
//! keeps `0xFF` for its system keys). The prefix is all `0xFF` bytes, so the reserved keys are
//! exactly the keys that sort at or after it, the tail of the key order: a range is kept out of
//! it by cutting its end at the prefix ([`clamp_range_end`]), and an unbounded range (`end =
//! None`) means "every client key".
//!
//! Where it is enforced:
//! - the server (`server/convert.rs`, `server/kv.rs`) refuses with `INVALID_ARGUMENT` every key
//!   (Get, Put, Delete, Upsert, Txn compares and gets) and every range start (Scan, DeleteRange,
//!   UpsertRange) in the reserved space, and cuts every range end at the prefix (a Scan, also a
//!   prefix scan, never returns a reserved key; a DeleteRange or UpsertRange never reaches one);
//! - the state machine (`apply.rs`) checks every command again before it runs, whoever built it:
//!   a command that names a reserved key is refused whole ([`CommandResult::ReservedKey`]), and
//!   range ends are cut at the prefix, so the log cannot reach the session table either.
//!
//! [`CommandResult::ReservedKey`]: super::command::CommandResult::ReservedKey

use ftkv_engine::WriteOp;

/// First bytes of every reserved key (see the module docs).
pub const RESERVED_KEY_PREFIX: &[u8] = &[0xFF, 0xFF];

// The prefix must be all 0xFF bytes for "reserved = sorts at or after the prefix" to hold.
const _: () = assert!(
    RESERVED_KEY_PREFIX.len() == 2 && RESERVED_KEY_PREFIX[0] == 0xFF && RESERVED_KEY_PREFIX[1] == 0xFF
);

/// Whether `key` is in the reserved space.
pub fn is_reserved(key: &[u8]) -> bool {
    key.starts_with(RESERVED_KEY_PREFIX)
}

/// `end` cut at the reserved space: `None` (unbounded) and any end past the prefix become the
/// prefix itself.
pub fn clamp_range_end(end: Option<Vec<u8>>) -> Option<Vec<u8>> {
    match end {
        Some(e) if e.as_slice() <= RESERVED_KEY_PREFIX => Some(e),
        _ => Some(RESERVED_KEY_PREFIX.to_vec()),
    }
}

/// The key a write op names in the reserved space (its key, or its range start), if any.
pub fn reserved_key_of(op: &WriteOp) -> Option<&[u8]> {
    let key = match op {
        WriteOp::Put { key, .. } | WriteOp::Delete { key } | WriteOp::Upsert { key, .. } => key,
        WriteOp::DeleteRange { start, .. } | WriteOp::UpsertRange { start, .. } => start,
    };
    is_reserved(key).then_some(key.as_slice())
}

/// `op` with its range end (if it has one) cut at the reserved space.
pub fn clamp_op(op: WriteOp) -> WriteOp {
    match op {
        WriteOp::DeleteRange { start, end } => WriteOp::DeleteRange {
            start,
            end: clamp_range_end(end),
        },
        WriteOp::UpsertRange { start, end, op } => WriteOp::UpsertRange {
            start,
            end: clamp_range_end(end),
            op,
        },
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserved_space_is_the_tail_of_the_key_order() {
        for key in [
            &b"\xff\xff"[..],
            b"\xff\xff\x00",
            b"\xff\xffs\x01",
            b"\xff\xff\xff\xff",
        ] {
            assert!(is_reserved(key) && key >= RESERVED_KEY_PREFIX);
        }
        for key in [&b""[..], b"a", b"\xff", b"\xff\xfe\xff\xff", b"\xfe\xff\xff"] {
            assert!(!is_reserved(key) && key < RESERVED_KEY_PREFIX);
        }
        assert_eq!(clamp_range_end(None), Some(RESERVED_KEY_PREFIX.to_vec()));
        assert_eq!(
            clamp_range_end(Some(b"\xff\xff\x00".to_vec())),
            Some(RESERVED_KEY_PREFIX.to_vec())
        );
        assert_eq!(clamp_range_end(Some(b"\xff".to_vec())), Some(b"\xff".to_vec()));
        assert_eq!(
            clamp_range_end(Some(b"\xff\xff".to_vec())),
            Some(b"\xff\xff".to_vec())
        );
    }
}
