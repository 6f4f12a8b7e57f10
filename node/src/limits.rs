//! Every request limit in one place (TigerBeetle's "put a limit on everything").
//!
//! Requests over a limit are refused with `INVALID_ARGUMENT` naming the limit (e.g.
//! `max_key_bytes`); nothing is truncated. Defaults follow etcd's spirit (etcd caps requests at
//! 1.5 MiB) scaled for batched writes. All are configurable under `[limits]` in the node config.

use serde::{Deserialize, Serialize};

/// Default largest key: 16 KiB.
pub const DEFAULT_MAX_KEY_BYTES: u64 = 16 * 1024;
/// Default largest value: 1 MiB.
pub const DEFAULT_MAX_VALUE_BYTES: u64 = 1024 * 1024;
/// Default largest batch (Write or Txn) in payload bytes: 4 MiB.
pub const DEFAULT_MAX_BATCH_BYTES: u64 = 4 * 1024 * 1024;
/// Default most ops in one Write or Txn: 10,000.
pub const DEFAULT_MAX_BATCH_OPS: u64 = 10_000;
/// Default page size of a Scan without a limit.
pub const DEFAULT_SCAN_LIMIT: u32 = 1_000;
/// Largest page a Scan returns.
pub const MAX_SCAN_LIMIT: u32 = 100_000;
/// Most key + value bytes one response may carry (a Scan page, the reads of one Txn): 3 MiB, so
/// that every response fits in the 4 MiB a stock gRPC client accepts by default, with room for
/// the framing. Reads beyond it are refused or paged, never cut short silently.
pub const MAX_RESPONSE_BYTES: usize = 3 * 1024 * 1024;
/// A Scan page stops after this many key + value bytes (at least one pair is returned), so a
/// page always fits in a gRPC message whatever the value sizes.
pub const MAX_SCAN_PAGE_BYTES: usize = 8 * 1024 * 1024;

// A batch must hold at least one largest key + value, or single writes would be refused.
const _: () = assert!(DEFAULT_MAX_BATCH_BYTES >= DEFAULT_MAX_KEY_BYTES + DEFAULT_MAX_VALUE_BYTES);
const _: () = assert!(DEFAULT_SCAN_LIMIT <= MAX_SCAN_LIMIT);
// One largest pair must fit in a page, and a page in the client server's message limit.
const _: () = assert!(MAX_SCAN_PAGE_BYTES as u64 >= DEFAULT_MAX_KEY_BYTES + DEFAULT_MAX_VALUE_BYTES);

/// Request limits (config section `[limits]`; sizes in human units such as `"16KiB"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limits {
    /// Largest key accepted.
    #[serde(serialize_with = "crate::config::serialize_size")]
    pub max_key_bytes: bytesize::ByteSize,
    /// Largest value accepted.
    #[serde(serialize_with = "crate::config::serialize_size")]
    pub max_value_bytes: bytesize::ByteSize,
    /// Largest total of keys + values in one Write or Txn.
    #[serde(serialize_with = "crate::config::serialize_size")]
    pub max_batch_bytes: bytesize::ByteSize,
    /// Most ops in one Write or Txn (compares included).
    pub max_batch_ops: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_key_bytes: bytesize::ByteSize::b(DEFAULT_MAX_KEY_BYTES),
            max_value_bytes: bytesize::ByteSize::b(DEFAULT_MAX_VALUE_BYTES),
            max_batch_bytes: bytesize::ByteSize::b(DEFAULT_MAX_BATCH_BYTES),
            max_batch_ops: DEFAULT_MAX_BATCH_OPS,
        }
    }
}

/// A request that broke a limit, or is malformed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// Over a named limit.
    #[error("{what} is {actual}, over the limit {limit} = {max}")]
    Over {
        /// Config name of the limit (`max_key_bytes`, ...).
        limit: &'static str,
        /// What was measured.
        what: &'static str,
        /// Measured size.
        actual: u64,
        /// The limit.
        max: u64,
    },
    /// An empty key (never allowed).
    #[error("key must not be empty")]
    EmptyKey,
}

impl LimitError {
    /// Config name of the limit broken (`"empty_key"` for an empty key).
    pub fn limit_name(&self) -> &'static str {
        match self {
            LimitError::Over { limit, .. } => limit,
            LimitError::EmptyKey => "empty_key",
        }
    }
}

impl Limits {
    /// Checks one key.
    pub fn check_key(&self, key: &[u8]) -> Result<(), LimitError> {
        if key.is_empty() {
            return Err(LimitError::EmptyKey);
        }
        over(
            "max_key_bytes",
            "key size in bytes",
            key.len() as u64,
            self.max_key_bytes.as_u64(),
        )
    }

    /// Checks one value.
    pub fn check_value(&self, value: &[u8]) -> Result<(), LimitError> {
        over(
            "max_value_bytes",
            "value size in bytes",
            value.len() as u64,
            self.max_value_bytes.as_u64(),
        )
    }

    /// Checks a range bound (may be empty: unbounded), against the key limit.
    pub fn check_bound(&self, bound: &[u8]) -> Result<(), LimitError> {
        over(
            "max_key_bytes",
            "range bound size in bytes",
            bound.len() as u64,
            self.max_key_bytes.as_u64(),
        )
    }

    /// Checks the size of a whole batch: `ops` operations totalling `bytes`.
    pub fn check_batch(&self, ops: u64, bytes: u64) -> Result<(), LimitError> {
        over(
            "max_batch_ops",
            "number of ops in the batch",
            ops,
            self.max_batch_ops,
        )?;
        over(
            "max_batch_bytes",
            "batch size in bytes",
            bytes,
            self.max_batch_bytes.as_u64(),
        )
    }
}

fn over(limit: &'static str, what: &'static str, actual: u64, max: u64) -> Result<(), LimitError> {
    if actual > max {
        Err(LimitError::Over {
            limit,
            what,
            actual,
            max,
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn limits_name_what_they_refuse() {
        let l = Limits::default();
        assert_eq!(l.check_key(b""), Err(LimitError::EmptyKey));
        assert!(l.check_key(&vec![1; 16 * 1024]).is_ok());
        assert_eq!(
            l.check_key(&vec![1; 16 * 1024 + 1]).unwrap_err().limit_name(),
            "max_key_bytes"
        );
        assert_eq!(
            l.check_value(&vec![0; 1024 * 1024 + 1]).unwrap_err().limit_name(),
            "max_value_bytes"
        );
        assert_eq!(
            l.check_batch(10_001, 10).unwrap_err().limit_name(),
            "max_batch_ops"
        );
        assert_eq!(
            l.check_batch(1, 4 * 1024 * 1024 + 1).unwrap_err().limit_name(),
            "max_batch_bytes"
        );
        assert!(l.check_batch(10_000, 4 * 1024 * 1024).is_ok());
    }
}
