//! In-memory tree nodes: internal nodes (pivots + one message buffer per child) and leaves
//! (basement nodes of sorted entries), after PerconaFT `ft/node.h`.

use super::msg::{apply_point, apply_point_owned, apply_range, key_cmp, Buffer, Msg, Msn, PointOp};

/// Logical node id, mapped to a disk location by the block translation table.
pub(crate) type NodeId = u64;

/// Bytes counted per basement entry besides key and value: the in-memory cost (its 12-byte slot
/// plus arena slack), so node sizes and the cache budget track memory use.
pub(crate) const ENTRY_OVERHEAD_BYTES: usize = 16;

/// Index of the child (or basement) whose range holds `key`: the number of pivots `<= key`.
/// Child `i` covers `[pivots[i-1], pivots[i])`.
pub(crate) fn child_index(pivots: &[Vec<u8>], key: &[u8]) -> usize {
    pivots.partition_point(|p| key_cmp(p, key).is_le())
}

/// Children `first..=last` overlapping `[start, end)` (`end = None`: unbounded); `None` when the
/// range is empty.
pub(crate) fn child_span(pivots: &[Vec<u8>], start: &[u8], end: Option<&[u8]>) -> Option<(usize, usize)> {
    if end.is_some_and(|e| e <= start) {
        return None;
    }
    let first = child_index(pivots, start);
    let last = match end {
        Some(e) => pivots.partition_point(|p| key_cmp(p, e).is_lt()),
        None => pivots.len(),
    };
    Some((first, last.max(first)))
}

/// `[lo, hi)` bounds of child `i` inside a node whose own bounds are `[lo, hi)`.
pub(crate) fn child_bounds<'a>(
    pivots: &'a [Vec<u8>],
    i: usize,
    lo: Option<&'a [u8]>,
    hi: Option<&'a [u8]>,
) -> (Option<&'a [u8]>, Option<&'a [u8]>) {
    let clo = if i == 0 {
        lo
    } else {
        pivots.get(i - 1).map(Vec::as_slice)
    };
    let chi = if i < pivots.len() {
        pivots.get(i).map(Vec::as_slice)
    } else {
        hi
    };
    (clo, chi)
}

/// An internal node: `children.len() - 1` pivots, one buffer per child.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Internal {
    /// Distance to the leaves (leaves' parents have height 1).
    pub(crate) height: u32,
    /// Child `i` covers `[pivots[i-1], pivots[i])`.
    pub(crate) pivots: Vec<Vec<u8>>,
    /// Child node ids.
    pub(crate) children: Vec<NodeId>,
    /// One message buffer per child.
    pub(crate) buffers: Vec<Buffer>,
}

impl Internal {
    /// Bytes counted against the node size.
    pub(crate) fn size_bytes(&self) -> usize {
        self.buffers.iter().map(Buffer::memory_bytes).sum::<usize>()
            + self
                .pivots
                .iter()
                .map(|p| p.len() + ENTRY_OVERHEAD_BYTES)
                .sum::<usize>()
            + self.children.len() * 8
    }

    /// Routes `msg` to the buffer(s) of the child(ren) it concerns. Range messages go to every
    /// overlapping child (the same MSN in each; application is idempotent by MSN).
    pub(crate) fn push_msg(&mut self, msg: Msg) {
        match &msg {
            Msg::Point { key, .. } => {
                let i = child_index(&self.pivots, key);
                if let Some(b) = self.buffers.get_mut(i) {
                    b.push(msg);
                }
            }
            Msg::Range(r) => {
                let Some((first, last)) = child_span(&self.pivots, &r.start, r.end.as_deref()) else {
                    return;
                };
                for i in first..=last {
                    if let Some(b) = self.buffers.get_mut(i) {
                        b.push(msg.clone());
                    }
                }
            }
        }
    }

    /// Index of the buffer to flush first (highest [`Buffer::flush_weight`]).
    pub(crate) fn heaviest_buffer(&self) -> Option<usize> {
        self.buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| !b.is_empty())
            .max_by_key(|(_, b)| b.flush_weight())
            .map(|(i, _)| i)
    }
}

/// A tree node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Node {
    /// Internal node.
    Internal(Internal),
    /// Leaf node.
    Leaf(Leaf),
}

impl Node {
    /// Bytes counted against the node size (and the cache budget).
    pub(crate) fn size_bytes(&self) -> usize {
        match self {
            Node::Internal(n) => n.size_bytes(),
            Node::Leaf(l) => l.size_bytes(),
        }
    }

    /// Height (0 for leaves).
    pub(crate) fn height(&self) -> u32 {
        match self {
            Node::Internal(n) => n.height,
            Node::Leaf(_) => 0,
        }
    }
}

mod basement;
mod chunks;
mod leaf;
#[cfg(test)]
mod tests;

pub(crate) use self::basement::*;
pub(crate) use self::chunks::*;
pub(crate) use self::leaf::*;
