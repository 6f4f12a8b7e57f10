//! Spilled runs: encoding, the frame index, and decoding of frames.

use super::*;
pub(crate) use crate::fractal::limits::RUN_FRAME_RAW_BYTES;

/// Fixed header bytes of a run block.
pub(crate) const RUN_FIXED_HEADER_BYTES: usize = 40;

/// Encodes one message of a run payload.
pub(crate) fn encode_run_msg(p: &mut W, m: &Msg) -> Result<()> {
    let Msg::Point { msn, key, op } = m else {
        return Err(EngineError::InvalidArgument(
            "range message in a spilled run".into(),
        ));
    };
    encode_point(p, *msn, key, op);
    Ok(())
}

/// Encodes one point message as runs and framed buffers store it: u64 MSN, u8 tag (1 Put,
/// 2 Delete, 3 Upsert), key, then the value or the op.
pub(crate) fn encode_point(p: &mut W, msn: Msn, key: &[u8], op: &PointOp) {
    p.u64(msn);
    match op {
        PointOp::Put(v) => {
            p.u8(1);
            p.bytes(key);
            p.bytes(v);
        }
        PointOp::Delete => {
            p.u8(2);
            p.bytes(key);
        }
        PointOp::Upsert(u) => {
            p.u8(3);
            p.bytes(key);
            encode_upsert(p, u);
        }
    }
}

/// Encodes a spilled run (point messages sorted by (key, MSN)): a 40-byte fixed
/// header (magic `FTKVRUN\0`, u32 version, u64 run id, u8 compressed, 3 zero bytes, u32 frame
/// count, u32 message count, u32 frame index length, u32 crc32c of the 36 bytes before), the
/// frame index (per frame: first key, u32 messages, u32 stored length, u32 raw length, u32
/// crc32c of the stored bytes; then a u32 crc32c of the index), then the frames, each about
/// [`RUN_FRAME_RAW_BYTES`] of messages (zstd-compressed or raw): per message u64 MSN, u8 tag (1
/// Put, 2 Delete, 3 Upsert), key, value or op. A key's messages never straddle two frames.
///
/// Runs are transient (merged into their child within a node's worth of messages), so they are
/// compressed at [`transient_level`] of `level`.
pub(crate) fn encode_run(id: u64, msgs: &[Msg], level: Option<i32>) -> Result<Vec<u8>> {
    let level = transient_level(level);
    let mut fw = FrameWriter::new(RUN_FRAME_RAW_BYTES, level);
    for (i, m) in msgs.iter().enumerate() {
        let key = m.key_or_start();
        // Cut only between two keys.
        let new_key = i == 0 || msgs.get(i - 1).map(Msg::key_or_start) != Some(key);
        fw.begin_item(key, new_key)?;
        encode_run_msg(&mut fw.raw, m)?;
    }
    let frames = fw.finish()?;
    let mut index = W::default();
    write_frame_table(&frames, &mut index);
    let icrc = crc32c::crc32c(&index.0);
    index.u32(icrc);
    let mut w = W(take_block_buf(
        RUN_FIXED_HEADER_BYTES + index.0.len() + frames.iter().map(|f| f.stored.len()).sum::<usize>(),
    ));
    w.0.extend_from_slice(RUN_MAGIC);
    w.u32(FORMAT_VERSION);
    w.u64(id);
    w.u8(u8::from(level.is_some()));
    w.0.extend_from_slice(&[0, 0, 0]);
    w.u32(len_u32(frames.len(), "frame count")?);
    w.u32(len_u32(msgs.len(), "run messages")?);
    w.u32(len_u32(index.0.len(), "run frame index")?);
    let crc = crc32c::crc32c(&w.0);
    w.u32(crc);
    debug_assert_eq!(w.0.len(), RUN_FIXED_HEADER_BYTES);
    w.0.extend_from_slice(&index.0);
    for f in &frames {
        w.0.extend_from_slice(&f.stored);
    }
    Ok(w.0)
}

/// One frame of a run, from its index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunFrame {
    /// Key of the frame's first message.
    pub(crate) first_key: Vec<u8>,
    /// Messages in the frame.
    pub(crate) msgs: u32,
    /// Offset of the stored bytes from the block start.
    pub(crate) offset: u64,
    /// Stored (possibly compressed) length in bytes.
    pub(crate) stored_len: u32,
    /// Uncompressed length in bytes.
    pub(crate) raw_len: u32,
    /// crc32c of the stored bytes.
    pub(crate) crc: u32,
}

/// A run block's fixed header and frame index: enough to read any one frame alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunIndex {
    /// Frames are zstd-compressed.
    pub(crate) compressed: bool,
    /// Messages in the run.
    pub(crate) msgs: u32,
    /// Frames in key order.
    pub(crate) frames: Vec<RunFrame>,
}

impl RunIndex {
    /// Bytes this index takes in memory (for cache accounting).
    pub(crate) fn size_bytes(&self) -> usize {
        64 + self.frames.iter().map(|f| 48 + f.first_key.len()).sum::<usize>()
    }

    /// The frames that can hold keys in `[lo, hi)` (`hi` None: unbounded), as an index range.
    pub(crate) fn frames_for(&self, lo: &[u8], hi: Option<&[u8]>) -> std::ops::Range<usize> {
        // The last frame starting at or before `lo` (a key's messages never straddle frames).
        let start = self
            .frames
            .partition_point(|f| f.first_key.as_slice() <= lo)
            .saturating_sub(1);
        let end = match hi {
            Some(h) => self.frames.partition_point(|f| f.first_key.as_slice() < h),
            None => self.frames.len(),
        };
        start..end.max(start)
    }
}

/// Parses a run block's fixed header (the first [`RUN_FIXED_HEADER_BYTES`] bytes): checks its
/// magic, version, crc32c and id; returns the length of the frame index that follows.
pub(crate) fn run_index_len(
    fixed: &[u8],
    expect_id: u64,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<usize> {
    let res = (|| -> Result<Result<usize>, Detail> {
        let mut r = R::new(fixed);
        if let Err(e) = read_prelude(&mut r, RUN_MAGIC, "run")? {
            return Ok(Err(e));
        }
        let id = r.u64()?;
        // compression, padding, frame count, message count
        r.take(12)?;
        let index_len = r.u32()?;
        let crc = r.u32()?;
        if crc32c::crc32c(fixed.get(..RUN_FIXED_HEADER_BYTES - 4).unwrap_or_default()) != crc {
            return Err("run header crc32c mismatch".into());
        }
        if id != expect_id {
            return Err(format!("block holds run {id}, expected {expect_id}"));
        }
        Ok(Ok(index_len as usize))
    })();
    res.map_err(|d| corruption(location, d))?
}

/// Decodes a run block's header and frame index from the block's first bytes (at least the
/// fixed header plus [`run_index_len`]); `block_len` is the whole block's length.
pub(crate) fn decode_run_index(
    head: &[u8],
    block_len: u64,
    expect_id: u64,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<RunIndex> {
    let len = run_index_len(head, expect_id, location)?;
    let res = (|| -> Result<RunIndex, Detail> {
        let mut r = R::new(head);
        r.take(20)?;
        let compressed = match r.u8()? {
            0 => false,
            1 => true,
            c => return Err(format!("unknown run compression {c}")),
        };
        r.take(3)?;
        let nframes = r.u32()? as usize;
        let msgs = r.u32()?;
        r.take(8)?;
        let (body, crc) = head
            .get(RUN_FIXED_HEADER_BYTES..RUN_FIXED_HEADER_BYTES + len)
            .ok_or("run frame index truncated")?
            .split_last_chunk::<4>()
            .ok_or("run frame index too short")?;
        if crc32c::crc32c(body) != u32::from_le_bytes(*crc) {
            return Err("run frame index crc32c mismatch".into());
        }
        let mut ir = R::new(body);
        let (frames, total, offset) = run_frames_from_rows(
            read_frame_rows(&mut ir, nframes, "run")?,
            (RUN_FIXED_HEADER_BYTES + len) as u64,
        );
        ir.done()?;
        if total != u64::from(msgs) {
            return Err(format!("run frames hold {total} messages, header says {msgs}"));
        }
        if offset != block_len {
            return Err(format!("run frames end at {offset}, block is {block_len} bytes"));
        }
        Ok(RunIndex {
            compressed,
            msgs,
            frames,
        })
    })();
    res.map_err(|d| corruption(location, d))
}

/// Frames of a run or buffer from their table rows, the first stored at `offset`:
/// returns them, the messages they hold and the offset after the last.
pub(crate) fn run_frames_from_rows(rows: Vec<FrameRow>, mut offset: u64) -> (Vec<RunFrame>, u64, u64) {
    let mut total = 0u64;
    let frames = rows
        .into_iter()
        .map(|row| {
            let f = RunFrame {
                first_key: row.first_key,
                msgs: row.count,
                offset,
                stored_len: row.stored_len,
                raw_len: row.raw_len,
                crc: row.crc,
            };
            offset += u64::from(row.stored_len);
            total += u64::from(row.count);
            f
        })
        .collect();
    (frames, total, offset)
}

/// Decodes frames `frames` of a run whose stored bytes are `data` (starting at the first of
/// them, contiguous): the messages with keys in `[lo, hi)`, stopping at the first key at or
/// past `hi`. Each frame's crc32c, length, and the (key, MSN) order of every message
/// visited are checked.
pub(crate) fn decode_run_frames(
    data: &[u8],
    index: &RunIndex,
    frames: std::ops::Range<usize>,
    lo: &[u8],
    hi: Option<&[u8]>,
    location: &(impl std::fmt::Display + ?Sized),
    out: &mut Vec<Msg>,
) -> Result<()> {
    decode_msg_frames(data, index, frames, lo, hi, out).map_err(|d| corruption(location, d))
}

/// [`decode_run_frames`] with the problem as a detail (runs and buffers).
pub(crate) fn decode_msg_frames(
    data: &[u8],
    index: &RunIndex,
    frames: std::ops::Range<usize>,
    lo: &[u8],
    hi: Option<&[u8]>,
    out: &mut Vec<Msg>,
) -> Result<(), Detail> {
    let Some(first) = index.frames.get(frames.start) else {
        return Ok(());
    };
    let base = first.offset;
    let mut prev: Option<(Vec<u8>, Msn)> = None;
    let visited = index
        .frames
        .get(frames.clone())
        .ok_or("frame range out of the run's index")?;
    for (i, f) in visited.iter().enumerate() {
        let at = (f.offset - base) as usize;
        let n = frames.start + i;
        let raw = unpack_frame(data, at, (f.stored_len, f.raw_len), f.crc, index.compressed, n)?;
        if decode_frame_msgs(&raw, f, n, lo, hi, &mut prev, out)? {
            return Ok(());
        }
    }
    Ok(())
}

/// Decodes the messages of frame `n` (`raw`, unpacked; `f` its index entry), appending those
/// with keys in `[lo, hi)` to `out`; `prev` is the last (key, MSN) decoded, from this frame or
/// the ones before. Checks that messages are sorted by (key, MSN), that the frame starts at its
/// index's first key and that no key straddles two frames. Returns true when a key at or past
/// `hi` ended the read.
fn decode_frame_msgs(
    raw: &[u8],
    f: &RunFrame,
    n: usize,
    lo: &[u8],
    hi: Option<&[u8]>,
    prev: &mut Option<(Vec<u8>, Msn)>,
    out: &mut Vec<Msg>,
) -> Result<bool, Detail> {
    let mut p = R::new(raw);
    for j in 0..f.msgs {
        let msn = p.u64()?;
        let tag = p.u8()?;
        let key = p.slice()?;
        if j == 0 && n > 0 && prev.as_ref().is_some_and(|(pk, _)| pk.as_slice() == key) {
            // A lookup reads the one frame whose first key is at or below its key.
            return Err(format!("key straddles frames {} and {n}", n - 1));
        }
        if j == 0 && key != f.first_key.as_slice() {
            return Err(format!("frame {n} starts at another key than its index"));
        }
        if prev
            .as_ref()
            .is_some_and(|(pk, pm)| (pk.as_slice(), *pm) >= (key, msn))
        {
            return Err("run messages not sorted by (key, MSN)".into());
        }
        if hi.is_some_and(|h| key >= h) {
            return Ok(true);
        }
        let op = decode_point_op(&mut p, tag, key >= lo)?;
        match prev {
            Some((pk, pm)) if pk.as_slice() == key => *pm = msn,
            _ => *prev = Some((key.to_vec(), msn)),
        }
        if let Some(op) = op {
            out.push(Msg::Point {
                msn,
                key: key.to_vec(),
                op,
            });
        }
    }
    p.done()?;
    Ok(false)
}

/// The operation of a run message with `tag`, read from `p` (skipped over, `None`, when not
/// `wanted`).
fn decode_point_op(p: &mut R<'_>, tag: u8, wanted: bool) -> Result<Option<PointOp>, Detail> {
    Ok(match tag {
        1 => {
            let v = p.slice()?;
            wanted.then(|| PointOp::Put(v.to_vec()))
        }
        2 => wanted.then_some(PointOp::Delete),
        3 => {
            let u = decode_upsert(p)?;
            wanted.then_some(PointOp::Upsert(u))
        }
        t => return Err(format!("unknown run message tag {t}")),
    })
}

/// Decodes a whole run block read from `location` (its crc32c against the BTT is checked by
/// the caller): the messages with keys in `[lo, hi)` (empty `lo` and no `hi`: all). Header,
/// index, every frame visited and the message order are checked.
pub(crate) fn decode_run_range(
    buf: &[u8],
    expect_id: u64,
    location: &(impl std::fmt::Display + ?Sized),
    lo: &[u8],
    hi: Option<&[u8]>,
) -> Result<Vec<Msg>> {
    let index = decode_run_index(buf, buf.len() as u64, expect_id, location)?;
    let frames = index.frames_for(lo, hi);
    let mut out = Vec::new();
    if let Some(first) = index.frames.get(frames.start) {
        let data = buf.get(first.offset as usize..).unwrap_or_default();
        decode_run_frames(data, &index, frames, lo, hi, location, &mut out)?;
    }
    Ok(out)
}
