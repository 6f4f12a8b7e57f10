//! Basements (a leaf's sorted entries): the one-piece and the framed partition.

use super::*;
pub(crate) use crate::fractal::limits::BASEMENT_FRAME_RAW_BYTES;

/// A basement partition as written before format 3 (one piece; tests write old leaves with it).
#[cfg(test)]
pub(crate) fn encode_basement(b: &Basement) -> Vec<u8> {
    let mut w = W(Vec::with_capacity(12 + b.data_bytes() + 8 * b.len()));
    w.u64(b.max_msn);
    w.u32(b.len() as u32);
    for (k, v) in b.iter() {
        w.bytes(k);
        w.bytes(v);
    }
    w.0
}

pub(crate) fn decode_basement(raw: &[u8]) -> Result<Basement, Detail> {
    let mut r = R::new(raw);
    let max_msn = r.u64()?;
    let n = r.u32()?;
    // Key and value bytes are at most the partition minus its length prefixes.
    let mut out = BasementBuilder::with_capacity(
        (n as usize).min(raw.len() / 8),
        raw.len().saturating_sub(12 + 8 * n as usize),
    );
    for _ in 0..n {
        let k = r.slice()?;
        let v = r.slice()?;
        if out.last_key().is_some_and(|pk| pk >= k) {
            return Err("basement keys not strictly increasing".into());
        }
        out.push(k, v);
    }
    r.done()?;
    Ok(out.finish(max_msn))
}

/// Encodes basement `b` as frames (each `(key, value)` entries, compressed alone); appends its
/// frame table to `info` (u64 max MSN, u32 entries, u32 frames, per frame the first key, u32
/// entries, u32 stored length, u32 raw length, u32 crc32c of the stored bytes). Returns the
/// stored partition and its raw length.
pub(crate) fn encode_basement_frames(
    b: &Basement,
    level: Option<i32>,
    info: &mut W,
) -> Result<(Vec<u8>, u32)> {
    let mut fw = FrameWriter::new(BASEMENT_FRAME_RAW_BYTES, level);
    for (k, v) in b.iter() {
        fw.begin_item(k, true)?;
        fw.raw.bytes(k);
        fw.raw.bytes(v);
    }
    let frames = fw.finish()?;
    info.u64(b.max_msn);
    info.u32(len_u32(b.len(), "basement entries")?);
    info.u32(len_u32(frames.len(), "frame count")?);
    write_frame_table(&frames, info);
    Ok(concat_frames(&frames))
}
