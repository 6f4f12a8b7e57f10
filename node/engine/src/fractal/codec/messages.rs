//! Messages: upserts and range messages (point messages are in `runs.rs`).

use super::*;

pub(crate) fn encode_upsert(w: &mut W, op: &UpsertOp) {
    match op {
        UpsertOp::SetIfAbsent(v) => {
            w.u8(1);
            w.bytes(v);
        }
        UpsertOp::Add(d) => {
            w.u8(2);
            w.u64(*d as u64);
        }
        UpsertOp::Append(v) => {
            w.u8(3);
            w.bytes(v);
        }
        UpsertOp::Max(v) => {
            w.u8(4);
            w.bytes(v);
        }
    }
}

pub(crate) fn decode_upsert(r: &mut R<'_>) -> Result<UpsertOp, Detail> {
    Ok(match r.u8()? {
        1 => UpsertOp::SetIfAbsent(r.bytes()?),
        2 => UpsertOp::Add(r.u64()? as i64),
        3 => UpsertOp::Append(r.bytes()?),
        4 => UpsertOp::Max(r.bytes()?),
        t => return Err(format!("unknown upsert op tag {t}")),
    })
}

/// Encodes a range message: u64 MSN, u8 tag (4 DeleteRange, 5 broadcast Upsert), start key,
/// u8 1 and the end key or u8 0 (unbounded), then the op of an upsert.
pub(crate) fn encode_range(w: &mut W, r: &RangeMsg) {
    w.u64(r.msn);
    w.u8(match r.op {
        RangeOp::Delete => 4,
        RangeOp::Upsert(_) => 5,
    });
    w.bytes(&r.start);
    match &r.end {
        Some(e) => {
            w.u8(1);
            w.bytes(e);
        }
        None => w.u8(0),
    }
    if let RangeOp::Upsert(u) = &r.op {
        encode_upsert(w, u);
    }
}

/// Decodes a range message written by [`encode_range`] after its MSN and tag.
pub(crate) fn decode_range_body(r: &mut R<'_>, msn: Msn, tag: u8) -> Result<RangeMsg, Detail> {
    let start = r.bytes()?;
    let end = match r.u8()? {
        0 => None,
        1 => Some(r.bytes()?),
        e => return Err(format!("bad range end tag {e}")),
    };
    let op = if tag == 4 {
        RangeOp::Delete
    } else {
        RangeOp::Upsert(decode_upsert(r)?)
    };
    Ok(RangeMsg { msn, start, end, op })
}
