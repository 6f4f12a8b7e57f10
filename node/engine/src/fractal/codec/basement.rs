//! Basements (a leaf's sorted entries): the framed partition.

use super::*;
pub(crate) use crate::fractal::limits::BASEMENT_FRAME_RAW_BYTES;

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
    concat_frames(&frames)
}
