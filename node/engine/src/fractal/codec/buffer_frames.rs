//! Framed buffers of internal nodes: encoding, the buffer tables, decoding.

use super::*;
pub(crate) use crate::fractal::limits::BUFFER_FRAME_RAW_BYTES;

/// Encodes buffer `b` of an internal node: appends to `info` its range messages (u32
/// count, then each as [`encode_range`] writes it, in MSN order) and the frame table of its
/// point messages (u32 messages, u32 frames, the frame rows); returns the stored partition (the
/// frames of its point messages in (key, MSN) order, a key's messages never split) and its raw
/// length.
pub(crate) fn encode_buffer_frames(b: &Buffer, level: Option<i32>, info: &mut W) -> Result<(Vec<u8>, u32)> {
    let ranges = b.range_msgs();
    info.u32(len_u32(ranges.len(), "range messages")?);
    for r in ranges {
        encode_range(info, r);
    }
    let mut fw = FrameWriter::new(BUFFER_FRAME_RAW_BYTES, level);
    let mut prev: Option<&[u8]> = None;
    let mut count = 0u32;
    for (msn, key, op) in b.point_msgs() {
        fw.begin_item(key, prev != Some(key))?;
        encode_point(&mut fw.raw, msn, key, op);
        prev = Some(key);
        count += 1;
    }
    let frames = fw.finish()?;
    info.u32(count);
    info.u32(len_u32(frames.len(), "frame count")?);
    write_frame_table(&frames, info);
    concat_frames(&frames)
}

/// One child's buffer as partition 0 of an internal node describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BufferTable {
    /// The buffer's range messages in MSN order (kept in partition 0: any key may need them).
    pub(crate) ranges: Vec<RangeMsg>,
    /// Frame index of the buffer partition's point messages, sorted by (key, MSN); frame
    /// offsets count from the partition's start.
    pub(crate) points: RunIndex,
}

impl BufferTable {
    /// Bytes this table takes in memory (for cache accounting).
    pub(crate) fn size_bytes(&self) -> usize {
        self.points.size_bytes()
            + self
                .ranges
                .iter()
                .map(|r| Msg::Range(r.clone()).size_bytes())
                .sum::<usize>()
    }

    /// The frame that can hold `key`'s point messages; `None` when `key` sorts before every
    /// frame (then the buffer holds none).
    pub(crate) fn frame_for(&self, key: &[u8]) -> Option<usize> {
        self.points
            .frames
            .partition_point(|f| f.first_key.as_slice() <= key)
            .checked_sub(1)
    }

    /// Checks that the frames add up to the partition's stored and raw lengths.
    pub(crate) fn check_partition(&self, stored_len: usize, raw_len: usize) -> Result<(), Detail> {
        let lens = self.points.frames.iter().map(|f| (f.stored_len, f.raw_len));
        check_frame_lengths(lens, stored_len, raw_len, "buffer frames")
    }
}

/// Reads the `n` buffer tables of an internal node's partition 0 (after its filters).
pub(crate) fn read_buffer_tables(
    r: &mut R<'_>,
    n: usize,
    compressed: bool,
) -> Result<Vec<BufferTable>, Detail> {
    let mut out = Vec::with_capacity(n);
    for c in 0..n {
        let nranges = r.u32()? as usize;
        let mut ranges: Vec<RangeMsg> = Vec::with_capacity(nranges.min(1 << 12));
        for _ in 0..nranges {
            let msn = r.u64()?;
            let tag = r.u8()?;
            if !matches!(tag, 4 | 5) {
                return Err(format!("buffer {c}: unknown range message tag {tag}"));
            }
            let m = decode_range_body(r, msn, tag)?;
            if ranges.last().is_some_and(|p| p.msn >= msn) {
                return Err(format!("buffer {c}: range messages out of MSN order"));
            }
            ranges.push(m);
        }
        let msgs = r.u32()?;
        let nframes = r.u32()? as usize;
        let (frames, total, _) =
            run_frames_from_rows(read_frame_rows(r, nframes, &format!("buffer {c}"))?, 0);
        if total != u64::from(msgs) {
            return Err(format!(
                "buffer {c}: frames hold {total} messages, table says {msgs}"
            ));
        }
        out.push(BufferTable {
            ranges,
            points: RunIndex {
                compressed,
                msgs,
                frames,
            },
        });
    }
    Ok(out)
}

/// Rebuilds a buffer from its table and its partition's stored bytes `data`.
pub(crate) fn decode_framed_buffer(data: &[u8], raw_len: usize, t: &BufferTable) -> Result<Buffer, Detail> {
    t.check_partition(data.len(), raw_len)?;
    let mut msgs = Vec::with_capacity((t.points.msgs as usize).min(1 << 16) + t.ranges.len());
    decode_msg_frames(data, &t.points, 0..t.points.frames.len(), &[], None, &mut msgs)?;
    if msgs.len() != t.points.msgs as usize {
        return Err(format!(
            "buffer frames decoded to {} messages, table says {}",
            msgs.len(),
            t.points.msgs
        ));
    }
    msgs.extend(t.ranges.iter().cloned().map(Msg::Range));
    msgs.sort_unstable_by_key(Msg::msn);
    let mut buf = Buffer::new();
    let mut last = 0;
    for m in msgs {
        if m.msn() <= last && last != 0 {
            return Err(format!("buffer holds MSN {} twice", m.msn()));
        }
        last = m.msn();
        buf.push(m);
    }
    Ok(buf)
}
