//! Write ops as tree messages.

use super::*;

/// Converts a write op into a message stamped with `msn`; `None` for an empty range.
pub(crate) fn to_msg(op: &WriteOp, msn: u64) -> Option<Msg> {
    (!is_empty_range(op))
        .then(|| to_msg_owned(op.clone(), msn))
        .flatten()
}

/// Whether `op` is a range op over an empty range (`end <= start`): it changes nothing.
pub(crate) fn is_empty_range(op: &WriteOp) -> bool {
    match op {
        WriteOp::DeleteRange { start, end } | WriteOp::UpsertRange { start, end, .. } => {
            end.as_ref().is_some_and(|e| e <= start)
        }
        _ => false,
    }
}

/// The message of `op` at `msn`, keeping the op's buffers; `None` for an empty range.
pub(crate) fn to_msg_owned(op: WriteOp, msn: u64) -> Option<Msg> {
    if is_empty_range(&op) {
        return None;
    }
    Some(match op {
        WriteOp::Put { key, value } => Msg::Point {
            msn,
            key,
            op: PointOp::Put(value),
        },
        WriteOp::Delete { key } => Msg::Point {
            msn,
            key,
            op: PointOp::Delete,
        },
        WriteOp::Upsert { key, op } => Msg::Point {
            msn,
            key,
            op: PointOp::Upsert(op),
        },
        WriteOp::DeleteRange { start, end } => Msg::Range(RangeMsg {
            msn,
            start,
            end,
            op: RangeOp::Delete,
        }),
        WriteOp::UpsertRange { start, end, op } => Msg::Range(RangeMsg {
            msn,
            start,
            end,
            op: RangeOp::Upsert(op),
        }),
    })
}
