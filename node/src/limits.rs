//! Every request limit in one place (TigerBeetle's "put a limit on everything").
//!
//! Requests over a limit are refused with `INVALID_ARGUMENT` naming the limit (e.g.
//! `max_key_bytes`); nothing is truncated. The limits are checked against each other and the
//! message sizes at start ([`Limits::validate`]): a node refuses to start with limits under
//! which a request could be accepted but never replicated or read back. Defaults follow etcd's spirit (etcd caps requests at
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
/// Largest response message the client server sends, encoded: 4 MiB, the default decoding
/// limit of a stock gRPC client. Unary answers and `Kv.Batch` messages are checked against it
/// before they are sent (a batch splits its answers over messages); an answer that cannot fit
/// is refused with `max_response_message_bytes` named, never cut by the transport.
pub const MAX_RESPONSE_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// Largest request message the client server accepts, encoded: a largest batch plus framing.
/// Beyond it tonic's codec refuses the message; the node answers `RESOURCE_EXHAUSTED` with an
/// `ErrorInfo` naming `max_request_message_bytes`.
pub const MAX_REQUEST_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Room kept for protobuf framing on top of payload bytes: a `max_batch_bytes` batch must fit
/// in a request message and a peer message, and one largest pair in a response.
pub const FRAMING_ALLOWANCE_BYTES: u64 = 64 * 1024;

// A batch must hold at least one largest key + value, or single writes would be refused.
const _: () = assert!(DEFAULT_MAX_BATCH_BYTES >= DEFAULT_MAX_KEY_BYTES + DEFAULT_MAX_VALUE_BYTES);
const _: () = assert!(DEFAULT_SCAN_LIMIT <= MAX_SCAN_LIMIT);
// One largest pair must fit in a response (a Get, a Scan page), and a response in a message.
const _: () = assert!(
    MAX_RESPONSE_BYTES as u64 >= DEFAULT_MAX_KEY_BYTES + DEFAULT_MAX_VALUE_BYTES + FRAMING_ALLOWANCE_BYTES
);
const _: () = assert!(MAX_RESPONSE_BYTES < MAX_RESPONSE_MESSAGE_BYTES);
const _: () = assert!(DEFAULT_MAX_BATCH_BYTES + FRAMING_ALLOWANCE_BYTES <= MAX_REQUEST_MESSAGE_BYTES as u64);

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
    /// Checks the limits against each other and against the node's message sizes, so that
    /// every request they let through can be sent, replicated and read back: each is at least
    /// 1; a batch holds one largest key + value; one largest pair fits in a response a stock
    /// client reads ([`MAX_RESPONSE_BYTES`]); a largest batch fits in a request message
    /// ([`MAX_REQUEST_MESSAGE_BYTES`]) and, as one Raft entry of up to `largest_entry_bytes`,
    /// in a peer message of `peer_max_message_bytes`. The error names the option to change.
    pub fn validate(&self, peer_max_message_bytes: u64, largest_entry_bytes: u64) -> Result<(), String> {
        let key = self.max_key_bytes.as_u64();
        let value = self.max_value_bytes.as_u64();
        let batch = self.max_batch_bytes.as_u64();
        let size = crate::config::exact_size;
        for (name, v) in [
            ("limits.max_key_bytes", key),
            ("limits.max_value_bytes", value),
            ("limits.max_batch_bytes", batch),
            ("limits.max_batch_ops", self.max_batch_ops),
        ] {
            if v == 0 {
                return Err(format!("{name} must be >= 1"));
            }
        }
        let largest_pair = key + value;
        if largest_pair + FRAMING_ALLOWANCE_BYTES > MAX_RESPONSE_BYTES as u64 {
            return Err(format!(
                "limits.max_value_bytes ({}) + limits.max_key_bytes ({}) must fit in one response \
                 of {} less {} of framing (what a stock gRPC client reads), or a largest value \
                 could be written and never read",
                size(value),
                size(key),
                size(MAX_RESPONSE_BYTES as u64),
                size(FRAMING_ALLOWANCE_BYTES)
            ));
        }
        if batch < largest_pair {
            return Err(format!(
                "limits.max_batch_bytes ({}) must hold one largest key + value ({})",
                size(batch),
                size(largest_pair)
            ));
        }
        if batch + FRAMING_ALLOWANCE_BYTES > MAX_REQUEST_MESSAGE_BYTES as u64 {
            return Err(format!(
                "limits.max_batch_bytes ({}) must fit in one request message of {} less {} of \
                 framing",
                size(batch),
                size(MAX_REQUEST_MESSAGE_BYTES as u64),
                size(FRAMING_ALLOWANCE_BYTES)
            ));
        }
        let entry = largest_entry_bytes.max(batch);
        if entry + FRAMING_ALLOWANCE_BYTES > peer_max_message_bytes {
            return Err(format!(
                "raft.peer_max_message_size ({}) must hold one largest Raft entry (the larger of \
                 limits.max_batch_bytes and batch.max_bytes, {}) plus {} of framing, or such a \
                 write could never be replicated",
                size(peer_max_message_bytes),
                size(entry),
                size(FRAMING_ALLOWANCE_BYTES)
            ));
        }
        Ok(())
    }

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
