//! Messages and the per-child message buffers of internal nodes (PerconaFT `ft/msg.h`,
//! `ft/msg_buffer.cc`).
//!
//! Every write becomes a message stamped with a message sequence number (MSN) when it is injected
//! at the root. A buffer keeps point messages in an append log with a hash index by key (see
//! [`Buffer`]) and range messages (`DeleteRange`, `UpsertRange`: the broadcast of TokuDB's instant ADD
//! COLUMN) in MSN order, so a point read looks up one key per buffer instead of scanning it.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::OnceLock;

use super::filter::KeyFilter;
use crate::ops::{apply_broadcast, apply_upsert, in_range, UpsertOp};

/// Message sequence number: strictly increasing across all messages of a tree.
pub(crate) type Msn = u64;

/// Per-message overhead counted in sizes, in bytes: the in-memory cost (log slot, hash-index
/// entry, key and value allocations) beyond key and value bytes, so node sizes track memory use.
pub(crate) const MSG_OVERHEAD_BYTES: usize = 112;

/// What a point message does to its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PointOp {
    /// Set the value.
    Put(Vec<u8>),
    /// Remove the key.
    Delete,
    /// Read-free update of the value.
    Upsert(UpsertOp),
}

/// What a range message does to the keys present in its range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RangeOp {
    /// Remove every key in the range.
    Delete,
    /// Apply the op to every present key in the range (a broadcast).
    Upsert(UpsertOp),
}

/// A message over `[start, end)` (`end = None`: unbounded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RangeMsg {
    /// Sequence number.
    pub(crate) msn: Msn,
    /// Inclusive start.
    pub(crate) start: Vec<u8>,
    /// Exclusive end, `None` = unbounded.
    pub(crate) end: Option<Vec<u8>>,
    /// Operation.
    pub(crate) op: RangeOp,
}

impl RangeMsg {
    /// Whether the message covers `key`.
    pub(crate) fn covers(&self, key: &[u8]) -> bool {
        in_range(key, &self.start, self.end.as_deref())
    }

    /// Whether `[start, end)` intersects `[lo, hi)` (`None` bounds are infinite).
    pub(crate) fn overlaps(&self, lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
        let starts_before_hi = hi.is_none_or(|h| self.start.as_slice() < h);
        let ends_after_lo = match (&self.end, lo) {
            (Some(e), Some(l)) => e.as_slice() > l,
            _ => true,
        };
        starts_before_hi && ends_after_lo
    }

    pub(crate) fn size_bytes(&self) -> usize {
        MSG_OVERHEAD_BYTES + self.start.len() + self.end.as_ref().map_or(0, Vec::len) + op_size(&self.op)
    }
}

pub(crate) fn op_size(op: &RangeOp) -> usize {
    match op {
        RangeOp::Delete => 0,
        RangeOp::Upsert(u) => upsert_size(u),
    }
}

pub(crate) fn upsert_size(op: &UpsertOp) -> usize {
    match op {
        UpsertOp::SetIfAbsent(v) | UpsertOp::Append(v) | UpsertOp::Max(v) => v.len() + 4,
        UpsertOp::Add(_) => 8,
    }
}

/// A message of either shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Msg {
    /// One key.
    Point {
        /// Sequence number.
        msn: Msn,
        /// Key.
        key: Vec<u8>,
        /// Operation.
        op: PointOp,
    },
    /// A key range.
    Range(RangeMsg),
}

impl Msg {
    /// The message's MSN.
    pub(crate) fn msn(&self) -> Msn {
        match self {
            Msg::Point { msn, .. } => *msn,
            Msg::Range(r) => r.msn,
        }
    }

    /// The key of a point message, the start key of a range message.
    pub(crate) fn key_or_start(&self) -> &[u8] {
        match self {
            Msg::Point { key, .. } => key,
            Msg::Range(r) => &r.start,
        }
    }

    /// Bytes counted against node sizes.
    pub(crate) fn size_bytes(&self) -> usize {
        match self {
            Msg::Point { key, op, .. } => point_size(key, op),
            Msg::Range(r) => r.size_bytes(),
        }
    }
}

pub(crate) fn point_size(key: &[u8], op: &PointOp) -> usize {
    MSG_OVERHEAD_BYTES
        + key.len()
        + match op {
            PointOp::Put(v) => v.len(),
            PointOp::Delete => 0,
            PointOp::Upsert(u) => upsert_size(u),
        }
}

/// Applies a point op to one value (`None` = absent).
pub(crate) fn apply_point(value: Option<Vec<u8>>, op: &PointOp) -> Option<Vec<u8>> {
    match op {
        PointOp::Put(v) => Some(v.clone()),
        PointOp::Delete => None,
        PointOp::Upsert(u) => apply_upsert(value.as_deref(), u),
    }
}

/// Like [`apply_point`], consuming the op (a `Put` moves its value instead of copying it).
pub(crate) fn apply_point_owned(value: Option<Vec<u8>>, op: PointOp) -> Option<Vec<u8>> {
    match op {
        PointOp::Put(v) => Some(v),
        PointOp::Delete => None,
        PointOp::Upsert(u) => apply_upsert(value.as_deref(), &u),
    }
}

/// Applies a range op to one present value; `None` = deleted.
pub(crate) fn apply_range(value: &[u8], op: &RangeOp) -> Option<Vec<u8>> {
    match op {
        RangeOp::Delete => None,
        RangeOp::Upsert(u) => Some(apply_broadcast(value, u)),
    }
}

/// A run of one child's older point messages spilled to disk as an immutable block (registered
/// in the BTT under `id`, sorted by (key, MSN)): the buffer of a child that is not cached spills
/// instead of reading the child, and the runs are merged into the child only once they add up to
/// about a node (SplinterDB's size-tiered Bε-tree, Conway et al., USENIX ATC 2020, keeps such
/// "branches" in its trunk nodes for the same reason). Every message in a run is older than every
/// message still in memory in the same buffer for the same key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunRef {
    /// Block id in the BTT.
    pub(crate) id: u64,
    /// Messages in the run.
    pub(crate) msgs: u32,
    /// Sum of the messages' counted sizes ([`Msg::size_bytes`]).
    pub(crate) bytes: u64,
    /// Smallest key in the run.
    pub(crate) min_key: Vec<u8>,
    /// Largest key in the run.
    pub(crate) max_key: Vec<u8>,
    /// Bloom filter over the run's keys.
    pub(crate) filter: KeyFilter,
}

impl RunRef {
    /// Memory the reference takes in its parent node.
    pub(crate) fn memory_bytes(&self) -> usize {
        64 + self.min_key.len() + self.max_key.len() + self.filter.size_bytes()
    }

    /// False only when the run holds no message for `key` (hash `hash`).
    pub(crate) fn may_hold(&self, key: &[u8], hash: u64) -> bool {
        // The filter first: it rules out most runs with one probe, where the bounds would cost
        // two key loads (both spans cover most of a child's range under random inserts).
        self.filter.may_contain(hash) && key >= self.min_key.as_slice() && key <= self.max_key.as_slice()
    }

    /// Whether the run's key span meets `[lo, hi)` (`None` bounds infinite).
    pub(crate) fn overlaps(&self, lo: Option<&[u8]>, hi: Option<&[u8]>) -> bool {
        lo.is_none_or(|l| self.max_key.as_slice() >= l) && hi.is_none_or(|h| self.min_key.as_slice() < h)
    }
}

mod buffer;
mod keys;
#[cfg(test)]
mod tests;

pub(crate) use self::buffer::*;
pub(crate) use self::keys::*;
