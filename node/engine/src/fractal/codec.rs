//! On-disk encoding of nodes, the block translation table and the headers (see
//! `node/engine/FORMAT.md`). Every integer is fixed-width little-endian; every record carries a
//! magic, a format version and a crc32c.

use std::cell::RefCell;

use super::filter::KeyFilter;
use super::msg::{
    count_at_or_below, key_prefix, Buffer, Msg, MsgRef, Msn, PointOp, RangeMsg, RangeOp, RunRef,
};
use super::node::{Basement, BasementBuilder, Internal, Leaf, Node, NodeId};
use crate::ops::UpsertOp;
use crate::{EngineError, Result};

/// Format version written and read by this build.
pub const FORMAT_VERSION: u32 = 4;
/// Bytes of each of the two header slots (at offsets 0 and `HEADER_SLOT_BYTES`).
pub const HEADER_SLOT_BYTES: u64 = 4096;
/// First byte of the block area.
pub const DATA_START: u64 = 2 * HEADER_SLOT_BYTES;
/// Blocks are allocated in multiples of this (the sector size).
pub const BLOCK_ALIGN_BYTES: u64 = 512;
/// Encoded header length (the rest of the slot is zero).
pub const HEADER_BYTES: usize = 64;

const HEADER_MAGIC: &[u8; 8] = b"FTKVHDR\0";
const BTT_MAGIC: &[u8; 8] = b"FTKVBTT\0";
/// Magic at the start of every node block.
pub const NODE_MAGIC: &[u8; 8] = b"FTKVNODE";
const RUN_MAGIC: &[u8; 8] = b"FTKVRUN\0";
/// Bytes of a run block's header.
const RUN_HEADER_BYTES: usize = 36;
/// Bytes of the fixed part of a node header (before the partition table).
pub const NODE_FIXED_HEADER_BYTES: usize = 40;
const PARTITION_ENTRY_BYTES: usize = 16;

/// Where a block lives in the file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct BlockLoc {
    /// Byte offset in the file.
    pub offset: u64,
    /// Encoded length in bytes (the allocation is rounded up to `BLOCK_ALIGN_BYTES`).
    pub size: u32,
    /// crc32c of the whole encoded block.
    pub crc: u32,
}

impl BlockLoc {
    /// Allocated bytes (size rounded up to the alignment).
    pub fn alloc_bytes(&self) -> u64 {
        align_up(u64::from(self.size))
    }
}

/// Rounds `n` up to `BLOCK_ALIGN_BYTES`.
pub fn align_up(n: u64) -> u64 {
    n.div_ceil(BLOCK_ALIGN_BYTES) * BLOCK_ALIGN_BYTES
}

/// A checkpoint header (one per slot).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Increases by one per checkpoint; the valid header with the highest counter wins.
    pub counter: u64,
    /// Location of the BTT block of this checkpoint.
    pub btt: BlockLoc,
}

/// The contents of a BTT block: the tree's roots and the node map of one checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BttImage {
    /// Checkpoint counter (must equal the header's).
    pub counter: u64,
    /// Root node id.
    pub root: NodeId,
    /// Next MSN to assign.
    pub next_msn: Msn,
    /// Next node id to assign.
    pub next_node_id: NodeId,
    /// The state machine's metadata blob.
    pub meta: Option<Vec<u8>>,
    /// Node id -> block.
    pub entries: Vec<(NodeId, BlockLoc)>,
}

// ------------------------------------------------------------------------------------------
// Primitive writer / reader
// ------------------------------------------------------------------------------------------

#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u32(b.len() as u32);
        self.0.extend_from_slice(b);
    }
}

struct R<'a> {
    buf: &'a [u8],
    pos: usize,
}

type Detail = String;

impl<'a> R<'a> {
    fn new(buf: &'a [u8]) -> Self {
        R { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Detail> {
        let end = self.pos.checked_add(n).ok_or("length overflow")?;
        let s = self
            .buf
            .get(self.pos..end)
            .ok_or_else(|| format!("truncated at byte {}", self.pos))?;
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, Detail> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, Detail> {
        let mut a = [0u8; 4];
        a.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(a))
    }
    fn u64(&mut self) -> Result<u64, Detail> {
        let mut a = [0u8; 8];
        a.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(a))
    }
    fn bytes(&mut self) -> Result<Vec<u8>, Detail> {
        Ok(self.slice()?.to_vec())
    }
    /// A length-prefixed byte string, borrowed.
    fn slice(&mut self) -> Result<&'a [u8], Detail> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    fn done(&self) -> Result<(), Detail> {
        if self.pos == self.buf.len() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes", self.buf.len() - self.pos))
        }
    }
}

fn corruption(location: &(impl std::fmt::Display + ?Sized), detail: impl Into<String>) -> EngineError {
    EngineError::Corruption {
        location: location.to_string(),
        detail: detail.into(),
    }
}

// ------------------------------------------------------------------------------------------
// Header
// ------------------------------------------------------------------------------------------

/// Encodes a header into `HEADER_BYTES` bytes.
pub fn encode_header(h: &Header) -> Vec<u8> {
    let mut w = W::default();
    w.0.extend_from_slice(HEADER_MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(HEADER_BYTES as u32);
    w.u64(h.counter);
    w.u64(h.btt.offset);
    w.u32(h.btt.size);
    w.u32(h.btt.crc);
    w.0.resize(HEADER_BYTES - 4, 0);
    let crc = crc32c::crc32c(&w.0);
    w.u32(crc);
    w.0
}

/// Decodes a header slot; `Ok(None)` when the slot does not hold a valid header (never written,
/// torn, or zeroed), `Err(UnsupportedVersion)` when it is valid but too new.
pub fn decode_header(buf: &[u8]) -> Result<Option<Header>> {
    let Some(body) = buf.get(..HEADER_BYTES) else {
        return Ok(None);
    };
    let (data, crc_bytes) = body.split_at(HEADER_BYTES - 4);
    let mut crc = [0u8; 4];
    crc.copy_from_slice(crc_bytes);
    if data.get(..8) != Some(HEADER_MAGIC.as_slice()) || crc32c::crc32c(data) != u32::from_le_bytes(crc) {
        return Ok(None);
    }
    let mut r = R::new(data);
    let parsed = (|| -> Result<(u32, Header), Detail> {
        r.take(8)?;
        let version = r.u32()?;
        let _len = r.u32()?;
        let counter = r.u64()?;
        let offset = r.u64()?;
        let size = r.u32()?;
        let bcrc = r.u32()?;
        Ok((
            version,
            Header {
                counter,
                btt: BlockLoc {
                    offset,
                    size,
                    crc: bcrc,
                },
            },
        ))
    })();
    match parsed {
        Ok((version, h)) if version <= FORMAT_VERSION => Ok(Some(h)),
        Ok((version, _)) => Err(EngineError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        }),
        Err(_) => Ok(None),
    }
}

// ------------------------------------------------------------------------------------------
// BTT
// ------------------------------------------------------------------------------------------

/// Encodes a BTT block (magic, version, roots, meta, entries, crc32c).
pub fn encode_btt(b: &BttImage) -> Vec<u8> {
    let mut w = W::default();
    w.0.extend_from_slice(BTT_MAGIC);
    w.u32(FORMAT_VERSION);
    w.u32(0);
    w.u64(b.counter);
    w.u64(b.root);
    w.u64(b.next_msn);
    w.u64(b.next_node_id);
    match &b.meta {
        Some(m) => {
            w.u8(1);
            w.bytes(m);
        }
        None => w.u8(0),
    }
    w.u64(b.entries.len() as u64);
    for (id, loc) in &b.entries {
        w.u64(*id);
        w.u64(loc.offset);
        w.u32(loc.size);
        w.u32(loc.crc);
    }
    let crc = crc32c::crc32c(&w.0);
    w.u32(crc);
    w.0
}

/// Decodes a BTT block read from `location`, verifying its checksum.
pub fn decode_btt(buf: &[u8], location: &(impl std::fmt::Display + ?Sized)) -> Result<BttImage> {
    let body = verify_trailing_crc(buf, location)?;
    let mut r = R::new(body);
    let res = (|| -> Result<Result<BttImage>, Detail> {
        if r.take(8)? != BTT_MAGIC {
            return Err("bad BTT magic".into());
        }
        let version = r.u32()?;
        if version > FORMAT_VERSION {
            return Ok(Err(EngineError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            }));
        }
        let _flags = r.u32()?;
        let counter = r.u64()?;
        let root = r.u64()?;
        let next_msn = r.u64()?;
        let next_node_id = r.u64()?;
        let meta = match r.u8()? {
            0 => None,
            1 => Some(r.bytes()?),
            t => return Err(format!("bad meta tag {t}")),
        };
        let n = r.u64()?;
        let mut entries = Vec::with_capacity(n.min(1 << 20) as usize);
        for _ in 0..n {
            let id = r.u64()?;
            let offset = r.u64()?;
            let size = r.u32()?;
            let crc = r.u32()?;
            entries.push((id, BlockLoc { offset, size, crc }));
        }
        r.done()?;
        Ok(Ok(BttImage {
            counter,
            root,
            next_msn,
            next_node_id,
            meta,
            entries,
        }))
    })();
    res.map_err(|d| corruption(location, d))?
}

fn verify_trailing_crc<'a>(buf: &'a [u8], location: &(impl std::fmt::Display + ?Sized)) -> Result<&'a [u8]> {
    if buf.len() < 4 {
        return Err(corruption(location, "block shorter than its checksum"));
    }
    let (body, tail) = buf.split_at(buf.len() - 4);
    let mut c = [0u8; 4];
    c.copy_from_slice(tail);
    let stored = u32::from_le_bytes(c);
    let actual = crc32c::crc32c(body);
    if stored != actual {
        return Err(corruption(
            location,
            format!("crc32c mismatch (stored {stored:#010x}, computed {actual:#010x})"),
        ));
    }
    Ok(body)
}

// ------------------------------------------------------------------------------------------
// Nodes
// ------------------------------------------------------------------------------------------

fn encode_upsert(w: &mut W, op: &UpsertOp) {
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

fn decode_upsert(r: &mut R<'_>) -> Result<UpsertOp, Detail> {
    Ok(match r.u8()? {
        1 => UpsertOp::SetIfAbsent(r.bytes()?),
        2 => UpsertOp::Add(r.u64()? as i64),
        3 => UpsertOp::Append(r.bytes()?),
        4 => UpsertOp::Max(r.bytes()?),
        t => return Err(format!("unknown upsert op tag {t}")),
    })
}

fn encode_buffer(buf: &Buffer) -> Vec<u8> {
    let msgs = buf.sorted_refs();
    // Counted sizes exceed the encoding (per-message overhead 112 > 25 bytes of framing).
    let mut w = W(Vec::with_capacity(buf.bytes() + 4));
    w.u32(msgs.len() as u32);
    for m in &msgs {
        match m {
            MsgRef::Point { msn, key, op } => {
                w.u64(*msn);
                match *op {
                    PointOp::Put(v) => {
                        w.u8(1);
                        w.bytes(key);
                        w.bytes(v);
                    }
                    PointOp::Delete => {
                        w.u8(2);
                        w.bytes(key);
                    }
                    PointOp::Upsert(u) => {
                        w.u8(3);
                        w.bytes(key);
                        encode_upsert(&mut w, u);
                    }
                }
            }
            MsgRef::Range(r) => encode_range(&mut w, r),
        }
    }
    w.0
}

/// Encodes a range message: u64 MSN, u8 tag (4 DeleteRange, 5 broadcast Upsert), start key,
/// u8 1 and the end key or u8 0 (unbounded), then the op of an upsert.
fn encode_range(w: &mut W, r: &RangeMsg) {
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
fn decode_range_body(r: &mut R<'_>, msn: Msn, tag: u8) -> Result<RangeMsg, Detail> {
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

fn decode_buffer(raw: &[u8]) -> Result<Buffer, Detail> {
    let mut r = R::new(raw);
    let n = r.u32()?;
    let mut buf = Buffer::new();
    let mut last_msn = 0;
    for _ in 0..n {
        let msn = r.u64()?;
        if msn <= last_msn && last_msn != 0 {
            return Err(format!("buffer MSNs out of order ({msn} after {last_msn})"));
        }
        last_msn = msn;
        let msg = match r.u8()? {
            1 => Msg::Point {
                msn,
                key: r.bytes()?,
                op: PointOp::Put(r.bytes()?),
            },
            2 => Msg::Point {
                msn,
                key: r.bytes()?,
                op: PointOp::Delete,
            },
            3 => {
                let key = r.bytes()?;
                Msg::Point {
                    msn,
                    key,
                    op: PointOp::Upsert(decode_upsert(&mut r)?),
                }
            }
            t @ (4 | 5) => Msg::Range(decode_range_body(&mut r, msn, t)?),
            t => return Err(format!("unknown message tag {t}")),
        };
        buf.push(msg);
    }
    r.done()?;
    Ok(buf)
}

/// Uncompressed bytes per frame of a run (format 3): a point lookup reads and decompresses one
/// frame, not the whole run.
pub const RUN_FRAME_RAW_BYTES: usize = 4 << 10;

/// Fixed header bytes of a format-3 run block.
pub const RUN_FIXED_HEADER_BYTES: usize = 40;

/// Encodes one message of a run payload.
fn encode_run_msg(p: &mut W, m: &Msg) -> Result<()> {
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
fn encode_point(p: &mut W, msn: Msn, key: &[u8], op: &PointOp) {
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

/// Encodes a run as format 2 wrote it (36-byte header, one payload, zstd level 1 when
/// `compressed`), for compatibility tests.
#[cfg(test)]
pub(crate) fn encode_run_v2(id: u64, msgs: &[Msg], compressed: bool) -> Vec<u8> {
    let mut p = W::default();
    for m in msgs {
        encode_run_msg(&mut p, m).expect("point messages");
    }
    let raw_len = p.0.len() as u32;
    let payload = if compressed {
        zstd::bulk::compress(&p.0, 1).expect("zstd")
    } else {
        p.0
    };
    let mut w = W::default();
    w.0.extend_from_slice(RUN_MAGIC);
    w.u32(2);
    w.u64(id);
    w.u8(u8::from(compressed));
    w.0.extend_from_slice(&[0, 0, 0]);
    w.u32(raw_len);
    w.u32(msgs.len() as u32);
    let crc = crc32c::crc32c(&w.0);
    w.u32(crc);
    w.0.extend_from_slice(&payload);
    w.0
}

/// Encodes a spilled run (point messages sorted by (key, MSN)), format 3: a 40-byte fixed
/// header (magic `FTKVRUN\0`, u32 version, u64 run id, u8 compressed, 3 zero bytes, u32 frame
/// count, u32 message count, u32 frame index length, u32 crc32c of the 36 bytes before), the
/// frame index (per frame: first key, u32 messages, u32 stored length, u32 raw length, u32
/// crc32c of the stored bytes; then a u32 crc32c of the index), then the frames, each about
/// [`RUN_FRAME_RAW_BYTES`] of messages (zstd-compressed or raw): per message u64 MSN, u8 tag (1
/// Put, 2 Delete, 3 Upsert), key, value or op. A key's messages never straddle two frames.
///
/// Runs are transient (merged into their child within a node's worth of messages), so they are
/// compressed at [`transient_level`] of `level`.
pub fn encode_run(id: u64, msgs: &[Msg], level: Option<i32>) -> Result<Vec<u8>> {
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
    w.u32(frames.len() as u32);
    w.u32(msgs.len() as u32);
    w.u32(index.0.len() as u32);
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
pub struct RunFrame {
    /// Key of the frame's first message.
    pub first_key: Vec<u8>,
    /// Messages in the frame.
    pub msgs: u32,
    /// Offset of the stored bytes from the block start.
    pub offset: u64,
    /// Stored (possibly compressed) length in bytes.
    pub stored_len: u32,
    /// Uncompressed length in bytes.
    pub raw_len: u32,
    /// crc32c of the stored bytes.
    pub crc: u32,
}

/// A run block's fixed header and frame index: enough to read any one frame alone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunIndex {
    /// Format version of the block (frames carry crcs and first keys from version 3).
    pub version: u32,
    /// Frames are zstd-compressed.
    pub compressed: bool,
    /// Messages in the run.
    pub msgs: u32,
    /// Frames in key order (a version-2 run has one frame without a first key).
    pub frames: Vec<RunFrame>,
}

impl RunIndex {
    /// Bytes this index takes in memory (for cache accounting).
    pub fn size_bytes(&self) -> usize {
        64 + self.frames.iter().map(|f| 48 + f.first_key.len()).sum::<usize>()
    }

    /// The frames that can hold keys in `[lo, hi)` (`hi` None: unbounded), as an index range.
    pub fn frames_for(&self, lo: &[u8], hi: Option<&[u8]>) -> std::ops::Range<usize> {
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

/// Parses a run block's fixed header (the first [`RUN_FIXED_HEADER_BYTES`] bytes): returns the
/// length of the frame index that follows (0 for a version-2 run, whose payload follows a
/// 36-byte header as one frame).
pub fn run_index_len(
    fixed: &[u8],
    expect_id: u64,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<usize> {
    let (version, index_len) = run_fixed_header(fixed, expect_id, location)?;
    Ok(if version >= 3 { index_len } else { 0 })
}

/// Checks the fixed header; returns (version, index length or, before version 3, raw length).
fn run_fixed_header(
    buf: &[u8],
    expect_id: u64,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<(u32, usize)> {
    let res = (|| -> Result<Result<(u32, usize)>, Detail> {
        let mut r = R::new(buf);
        if r.take(8)? != RUN_MAGIC {
            return Err("bad run magic".into());
        }
        let version = r.u32()?;
        if version > FORMAT_VERSION {
            return Ok(Err(EngineError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            }));
        }
        let id = r.u64()?;
        r.take(4)?;
        let a = r.u32()?;
        let _count = r.u32()?;
        let header_bytes = if version >= 3 {
            RUN_FIXED_HEADER_BYTES
        } else {
            RUN_HEADER_BYTES
        };
        let third = if version >= 3 { r.u32()? } else { 0 };
        let crc = r.u32()?;
        if crc32c::crc32c(buf.get(..header_bytes - 4).unwrap_or_default()) != crc {
            return Err("run header crc32c mismatch".into());
        }
        if id != expect_id {
            return Err(format!("block holds run {id}, expected {expect_id}"));
        }
        Ok(Ok((
            version,
            if version >= 3 { third as usize } else { a as usize },
        )))
    })();
    res.map_err(|d| corruption(location, d))?
}

/// Decodes a run block's header and frame index from the block's first bytes (at least the
/// fixed header plus [`run_index_len`]; for a version-2 run, the fixed header and the block's
/// total length `block_len`).
pub fn decode_run_index(
    head: &[u8],
    block_len: u64,
    expect_id: u64,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<RunIndex> {
    let (version, len) = run_fixed_header(head, expect_id, location)?;
    let res = (|| -> Result<RunIndex, Detail> {
        let mut r = R::new(head);
        r.take(20)?;
        let compressed = match r.u8()? {
            0 => false,
            1 => true,
            c => return Err(format!("unknown run compression {c}")),
        };
        r.take(3)?;
        if version < 3 {
            let raw_len = r.u32()?;
            let msgs = r.u32()?;
            let stored = block_len
                .checked_sub(RUN_HEADER_BYTES as u64)
                .ok_or("run block shorter than its header")?;
            return Ok(RunIndex {
                version,
                compressed,
                msgs,
                frames: vec![RunFrame {
                    first_key: Vec::new(),
                    msgs,
                    offset: RUN_HEADER_BYTES as u64,
                    stored_len: u32::try_from(stored).map_err(|_| "run too long")?,
                    raw_len,
                    // Checked against the BTT crc of the whole block instead.
                    crc: 0,
                }],
            });
        }
        let nframes = r.u32()? as usize;
        let msgs = r.u32()?;
        r.take(8)?;
        let body = head
            .get(RUN_FIXED_HEADER_BYTES..RUN_FIXED_HEADER_BYTES + len)
            .ok_or("run frame index truncated")?;
        let body = body
            .get(..len.saturating_sub(4))
            .ok_or("run frame index too short")?;
        let mut c = [0u8; 4];
        c.copy_from_slice(&head[RUN_FIXED_HEADER_BYTES + len - 4..RUN_FIXED_HEADER_BYTES + len]);
        if crc32c::crc32c(body) != u32::from_le_bytes(c) {
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
            version,
            compressed,
            msgs,
            frames,
        })
    })();
    res.map_err(|d| corruption(location, d))
}

/// Frames of a run or format-4 buffer from their table rows, the first stored at `offset`:
/// returns them, the messages they hold and the offset after the last.
fn run_frames_from_rows(rows: Vec<FrameRow>, mut offset: u64) -> (Vec<RunFrame>, u64, u64) {
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
/// past `hi`. Each frame's crc32c (format 3), length, and the (key, MSN) order of every message
/// visited are checked.
pub fn decode_run_frames(
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

/// [`decode_run_frames`] with the problem as a detail (runs and format-4 buffers).
fn decode_msg_frames(
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
    for (i, f) in index.frames[frames.clone()].iter().enumerate() {
        let at = (f.offset - base) as usize;
        // A version-2 run is one frame checked by the BTT crc of the whole block.
        let crc = (index.version >= 3).then_some(f.crc);
        let raw = unpack_frame(
            data,
            at,
            (f.stored_len, f.raw_len),
            crc,
            index.compressed,
            frames.start + i,
        )?;
        let mut p = R::new(&raw);
        for j in 0..f.msgs {
            let msn = p.u64()?;
            let tag = p.u8()?;
            let key = p.slice()?;
            if j == 0 && i > 0 && prev.as_ref().is_some_and(|(pk, _)| pk.as_slice() == key) {
                // A lookup reads the one frame whose first key is at or below its key.
                return Err(format!(
                    "key straddles frames {} and {}",
                    frames.start + i - 1,
                    frames.start + i
                ));
            }
            if j == 0 && index.version >= 3 && key != f.first_key.as_slice() {
                return Err(format!(
                    "frame {} starts at another key than its index",
                    frames.start + i
                ));
            }
            if prev
                .as_ref()
                .is_some_and(|(pk, pm)| (pk.as_slice(), *pm) >= (key, msn))
            {
                return Err("run messages not sorted by (key, MSN)".into());
            }
            if hi.is_some_and(|h| key >= h) {
                return Ok(());
            }
            let wanted = key >= lo;
            let op = match tag {
                1 => {
                    let v = p.slice()?;
                    wanted.then(|| PointOp::Put(v.to_vec()))
                }
                2 => wanted.then_some(PointOp::Delete),
                3 => {
                    let u = decode_upsert(&mut p)?;
                    wanted.then_some(PointOp::Upsert(u))
                }
                t => return Err(format!("unknown run message tag {t}")),
            };
            match &mut prev {
                Some((pk, pm)) if pk.as_slice() == key => *pm = msn,
                _ => prev = Some((key.to_vec(), msn)),
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
    }
    Ok(())
}

/// Decodes a whole run block read from `location` (its crc32c against the BTT is checked by
/// the caller): the messages with keys in `[lo, hi)` (empty `lo` and no `hi`: all). Header,
/// index, every frame visited and the message order are checked.
pub fn decode_run_range(
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

/// A basement partition as written before format 3 (one piece; tests write old leaves with it).
#[cfg(test)]
fn encode_basement(b: &Basement) -> Vec<u8> {
    let mut w = W(Vec::with_capacity(12 + b.data_bytes() + 8 * b.len()));
    w.u64(b.max_msn);
    w.u32(b.len() as u32);
    for (k, v) in b.iter() {
        w.bytes(k);
        w.bytes(v);
    }
    w.0
}

fn decode_basement(raw: &[u8]) -> Result<Basement, Detail> {
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

thread_local! {
    /// This thread's zstd compression contexts by level (creating one per call cost more than
    /// compressing a small partition). Leaves and transient blocks use two levels, so a thread
    /// keeps a few contexts instead of rebuilding one (about a megabyte) at every switch.
    static COMPRESSORS: RefCell<Vec<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(Vec::new()) };
    /// This thread's zstd decompression context (creating one per frame was 16% of a point
    /// read beyond memory).
    static DECOMPRESSOR: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

thread_local! {
    /// Block-sized buffers this thread reuses (encoded node and run blocks, whole blocks read).
    /// Freeing megabyte buffers at the rate the engine rewrites nodes kept about as much freed
    /// memory resident in the allocator (mimalloc purges after a delay) as the cache itself.
    static BLOCK_BUFS: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Buffers [`recycle_block_buf`] keeps per thread.
const BLOCK_BUFS_KEPT: usize = 2;
/// Larger buffers are not kept.
const BLOCK_BUF_MAX_BYTES: usize = 64 << 20;

/// An empty buffer with room for `capacity` bytes, reused from this thread's pool when it
/// holds one.
pub fn take_block_buf(capacity: usize) -> Vec<u8> {
    let mut v = BLOCK_BUFS.with(|c| c.borrow_mut().pop()).unwrap_or_default();
    v.clear();
    v.reserve(capacity);
    v
}

/// Gives a block buffer back to this thread's pool (kept unless the pool is full or the
/// buffer is huge).
pub fn recycle_block_buf(mut v: Vec<u8>) {
    if v.capacity() > BLOCK_BUF_MAX_BYTES {
        return;
    }
    v.clear();
    BLOCK_BUFS.with(|c| {
        let mut pool = c.borrow_mut();
        if pool.len() < BLOCK_BUFS_KEPT {
            pool.push(v);
        }
    });
}

/// zstd-compresses `raw` at `level` with this thread's context.
fn zstd_compress(raw: &[u8], level: i32) -> std::io::Result<Vec<u8>> {
    /// Contexts kept per thread (levels in use: the configured one and the transient one).
    const KEPT: usize = 4;
    COMPRESSORS.with(|cell| {
        let mut ctxs = cell.borrow_mut();
        let i = match ctxs.iter().position(|(l, _)| *l == level) {
            Some(i) => i,
            None => {
                if ctxs.len() >= KEPT {
                    ctxs.remove(0);
                }
                ctxs.push((level, zstd::bulk::Compressor::new(level)?));
                ctxs.len() - 1
            }
        };
        match ctxs.get_mut(i) {
            Some((_, ctx)) => ctx.compress(raw),
            None => Err(std::io::Error::other("zstd context vanished")),
        }
    })
}

/// zstd-decompresses `data` into exactly `raw_len` bytes (an error if it holds more) with this
/// thread's context.
pub(crate) fn zstd_decompress(data: &[u8], raw_len: usize) -> std::io::Result<Vec<u8>> {
    DECOMPRESSOR.with(|cell| {
        let mut slot = cell.borrow_mut();
        let ctx = match &mut *slot {
            Some(ctx) => ctx,
            other => other.insert(zstd::bulk::Decompressor::new()?),
        };
        ctx.decompress(data, raw_len)
    })
}

fn compress(raw: Vec<u8>, level: Option<i32>) -> Result<Vec<u8>> {
    match level {
        None => Ok(raw),
        Some(l) => zstd_compress(&raw, l).map_err(|source| EngineError::Io {
            context: "zstd compress".into(),
            source,
        }),
    }
}

/// zstd's fastest levels skip Huffman coding of literals and match less: about twice the speed
/// of level 1 for a few percent of size. Used for blocks that are rewritten soon.
pub const TRANSIENT_LEVEL_MAX: i32 = -1;

/// The level for transient blocks (spilled runs and internal nodes, whose buffers are rewritten
/// by every flush through them): the configured level, but no slower than
/// [`TRANSIENT_LEVEL_MAX`]. Leaves, where the data rests, keep the configured level (RocksDB's
/// per-level compression, `compression_per_level` and `bottommost_compression`, follows the same
/// idea). `None` (no compression) stays `None`.
pub fn transient_level(level: Option<i32>) -> Option<i32> {
    level.map(|l| l.min(TRANSIENT_LEVEL_MAX))
}

/// Encodes `node` (id `id`): uncompressed header with a partition table, then one compressed,
/// crc32c-checked partition for the pivots/children and one per buffer or basement. Leaves are
/// compressed at `level`, internal nodes at [`transient_level`] of it.
pub fn encode_node(id: NodeId, node: &Node, level: Option<i32>) -> Result<Vec<u8>> {
    encode_node_as(id, node, level, FORMAT_VERSION)
}

/// [`encode_node`] as format `version` wrote it (3 or 4; tests write old blocks with it).
pub(crate) fn encode_node_as(id: NodeId, node: &Node, level: Option<i32>, version: u32) -> Result<Vec<u8>> {
    debug_assert!(
        matches!(version, 3 | 4),
        "encode_node_as writes formats 3 and 4 only"
    );
    let mut info = W::default();
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let (kind, height) = match node {
        Node::Internal(n) => {
            info.u32(n.children.len() as u32);
            for p in &n.pivots {
                info.bytes(p);
            }
            for c in &n.children {
                info.u64(*c);
            }
            // Format 2: per child, whether its buffer holds range messages and a key filter
            // over its point messages, so a point read can skip the buffer partition.
            for b in &n.buffers {
                info.u8(u8::from(!b.range_msgs().is_empty()));
                KeyFilter::build(b.point_hashes().into_iter()).encode(&mut info.0);
                info.u32(b.spilled().len() as u32);
                for r in b.spilled() {
                    info.u64(r.id);
                    info.u32(r.msgs);
                    info.u64(r.bytes);
                    info.bytes(&r.min_key);
                    info.bytes(&r.max_key);
                    r.filter.encode(&mut info.0);
                }
            }
            if version < 4 {
                parts.extend(n.buffers.iter().map(encode_buffer));
            } else {
                // Format 4: per child, its range messages and the frame table of its point
                // messages follow in partition 0; the buffer partition holds the frames, so a
                // point read decompresses one frame of one buffer.
                let level = transient_level(level);
                let mut stored = vec![(Vec::new(), 0u32)];
                for b in &n.buffers {
                    stored.push(encode_buffer_frames(b, level, &mut info)?);
                }
                let info_raw = std::mem::take(&mut info.0);
                let info_len = info_raw.len() as u32;
                stored[0] = (compress(info_raw, level)?, info_len);
                return assemble_node(version, id, 1, n.height, level, stored);
            }
            (1u8, n.height)
        }
        Node::Leaf(l) => {
            info.u32(l.basements.len() as u32);
            for p in &l.pivots {
                info.bytes(p);
            }
            // Format 3: each basement is stored as frames of about BASEMENT_FRAME_RAW_BYTES,
            // compressed one by one, with the frame table in partition 0 so a point read
            // decompresses one frame.
            let mut framed = Vec::with_capacity(l.basements.len());
            for b in &l.basements {
                framed.push(encode_basement_frames(b, level, &mut info)?);
            }
            let info_raw = std::mem::take(&mut info.0);
            let info_len = info_raw.len() as u32;
            let mut stored = vec![(compress(info_raw, level)?, info_len)];
            stored.extend(framed);
            return assemble_node(version, id, 0, 0, level, stored);
        }
    };
    parts.insert(0, info.0);
    let level = transient_level(level);
    let mut stored: Vec<(Vec<u8>, u32)> = Vec::with_capacity(parts.len());
    for p in parts {
        let raw_len = p.len() as u32;
        stored.push((compress(p, level)?, raw_len));
    }
    assemble_node(version, id, kind, height, level, stored)
}

/// Uncompressed bytes per frame of an internal node's buffer (format 4): the unit a point read
/// through an uncached internal node decompresses.
pub const BUFFER_FRAME_RAW_BYTES: usize = 4 << 10;

/// Encodes buffer `b` of a format-4 internal node: appends to `info` its range messages (u32
/// count, then each as [`encode_range`] writes it, in MSN order) and the frame table of its
/// point messages (u32 messages, u32 frames, the frame rows); returns the stored partition (the
/// frames of its point messages in (key, MSN) order, a key's messages never split) and its raw
/// length.
fn encode_buffer_frames(b: &Buffer, level: Option<i32>, info: &mut W) -> Result<(Vec<u8>, u32)> {
    let ranges = b.range_msgs();
    info.u32(ranges.len() as u32);
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
    info.u32(frames.len() as u32);
    write_frame_table(&frames, info);
    Ok(concat_frames(&frames))
}

/// One child's buffer as partition 0 of a format-4 internal node describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BufferTable {
    /// The buffer's range messages in MSN order (kept in partition 0: any key may need them).
    pub ranges: Vec<RangeMsg>,
    /// Frame index of the buffer partition's point messages, sorted by (key, MSN); frame
    /// offsets count from the partition's start.
    pub points: RunIndex,
}

impl BufferTable {
    /// Bytes this table takes in memory (for cache accounting).
    pub fn size_bytes(&self) -> usize {
        self.points.size_bytes()
            + self
                .ranges
                .iter()
                .map(|r| Msg::Range(r.clone()).size_bytes())
                .sum::<usize>()
    }

    /// The frame that can hold `key`'s point messages; `None` when `key` sorts before every
    /// frame (then the buffer holds none).
    pub fn frame_for(&self, key: &[u8]) -> Option<usize> {
        self.points
            .frames
            .partition_point(|f| f.first_key.as_slice() <= key)
            .checked_sub(1)
    }

    /// Checks that the frames add up to the partition's stored and raw lengths.
    fn check_partition(&self, stored_len: usize, raw_len: usize) -> Result<(), Detail> {
        let lens = self.points.frames.iter().map(|f| (f.stored_len, f.raw_len));
        check_frame_lengths(lens, stored_len, raw_len, "buffer frames")
    }
}

/// Reads the `n` buffer tables of a format-4 internal node's partition 0 (after its filters).
fn read_buffer_tables(
    r: &mut R<'_>,
    n: usize,
    version: u32,
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
                version,
                compressed,
                msgs,
                frames,
            },
        });
    }
    Ok(out)
}

/// Rebuilds a format-4 buffer from its table and its partition's stored bytes `data`.
fn decode_framed_buffer(data: &[u8], raw_len: usize, t: &BufferTable) -> Result<Buffer, Detail> {
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

/// Uncompressed bytes per frame of a basement (format 3): the unit a point read decompresses.
pub const BASEMENT_FRAME_RAW_BYTES: usize = 4 << 10;

/// Encodes basement `b` as frames (each `(key, value)` entries, compressed alone); appends its
/// frame table to `info` (u64 max MSN, u32 entries, u32 frames, per frame the first key, u32
/// entries, u32 stored length, u32 raw length, u32 crc32c of the stored bytes). Returns the
/// stored partition and its raw length.
fn encode_basement_frames(b: &Basement, level: Option<i32>, info: &mut W) -> Result<(Vec<u8>, u32)> {
    let mut fw = FrameWriter::new(BASEMENT_FRAME_RAW_BYTES, level);
    for (k, v) in b.iter() {
        fw.begin_item(k, true)?;
        fw.raw.bytes(k);
        fw.raw.bytes(v);
    }
    let frames = fw.finish()?;
    info.u64(b.max_msn);
    info.u32(b.len() as u32);
    info.u32(frames.len() as u32);
    write_frame_table(&frames, info);
    Ok(concat_frames(&frames))
}

/// The stored bytes of `frames` back to back (a partition) and their total raw length.
fn concat_frames(frames: &[EncFrame]) -> (Vec<u8>, u32) {
    let total_raw = frames.iter().map(|f| f.raw_len).sum();
    let mut stored = Vec::with_capacity(frames.iter().map(|f| f.stored.len()).sum());
    for f in frames {
        stored.extend_from_slice(&f.stored);
    }
    (stored, total_raw)
}

/// Checks that frames of `(stored, raw)` lengths add up to a partition's stored and raw
/// lengths; `what` names them in the error.
fn check_frame_lengths(
    lens: impl Iterator<Item = (u32, u32)>,
    stored_len: usize,
    raw_len: usize,
    what: &str,
) -> Result<(), Detail> {
    let (stored, raw) = lens.fold((0u64, 0u64), |(s, r), (fs, fr)| {
        (s + u64::from(fs), r + u64::from(fr))
    });
    if stored != stored_len as u64 || raw != raw_len as u64 {
        return Err(format!(
            "{what} hold {stored} stored / {raw} raw bytes, partition {stored_len} / {raw_len}"
        ));
    }
    Ok(())
}

/// One encoded frame of a run or basement.
struct EncFrame {
    first_key: Vec<u8>,
    /// Messages or entries in it.
    count: u32,
    raw_len: u32,
    stored: Vec<u8>,
}

/// Cuts a stream of encoded items (run messages, basement entries) into frames of about
/// `target_raw_bytes`, each compressed alone. Callers announce each item with
/// [`FrameWriter::begin_item`], then append its bytes to `raw`.
struct FrameWriter {
    target_raw_bytes: usize,
    level: Option<i32>,
    frames: Vec<EncFrame>,
    raw: W,
    first_key: Option<Vec<u8>>,
    count: u32,
}

impl FrameWriter {
    fn new(target_raw_bytes: usize, level: Option<i32>) -> Self {
        FrameWriter {
            target_raw_bytes,
            level,
            frames: Vec::new(),
            raw: W(Vec::with_capacity(target_raw_bytes + 1024)),
            first_key: None,
            count: 0,
        }
    }

    /// Starts an item with key `key`; a full frame is closed first when `may_cut` (callers
    /// forbid cuts inside one key's messages).
    fn begin_item(&mut self, key: &[u8], may_cut: bool) -> Result<()> {
        if may_cut && self.first_key.is_some() && self.raw.0.len() >= self.target_raw_bytes {
            self.cut()?;
        }
        if self.first_key.is_none() {
            self.first_key = Some(key.to_vec());
        }
        self.count += 1;
        Ok(())
    }

    fn cut(&mut self) -> Result<()> {
        let Some(first_key) = self.first_key.take() else {
            return Ok(());
        };
        let raw = std::mem::replace(&mut self.raw.0, Vec::with_capacity(self.target_raw_bytes + 1024));
        let raw_len = raw.len() as u32;
        self.frames.push(EncFrame {
            first_key,
            count: std::mem::take(&mut self.count),
            raw_len,
            stored: compress(raw, self.level)?,
        });
        Ok(())
    }

    fn finish(mut self) -> Result<Vec<EncFrame>> {
        self.cut()?;
        Ok(self.frames)
    }
}

/// One row of a frame table as stored.
struct FrameRow {
    first_key: Vec<u8>,
    count: u32,
    stored_len: u32,
    raw_len: u32,
    crc: u32,
}

/// Reads `n` rows of a frame table ([`write_frame_table`]'s layout), checking that first keys
/// strictly increase and no frame is empty; `what` names the table in errors.
fn read_frame_rows(r: &mut R<'_>, n: usize, what: &str) -> Result<Vec<FrameRow>, Detail> {
    let mut rows: Vec<FrameRow> = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let row = FrameRow {
            first_key: r.bytes()?,
            count: r.u32()?,
            stored_len: r.u32()?,
            raw_len: r.u32()?,
            crc: r.u32()?,
        };
        if rows.last().is_some_and(|p| p.first_key >= row.first_key) {
            return Err(format!("{what}: frames not in key order"));
        }
        if row.count == 0 {
            return Err(format!("{what}: empty frame"));
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Writes a frame table: per frame the first key, u32 count, u32 stored length, u32 raw
/// length and u32 crc32c of the stored bytes.
fn write_frame_table(frames: &[EncFrame], out: &mut W) {
    for f in frames {
        out.bytes(&f.first_key);
        out.u32(f.count);
        out.u32(f.stored.len() as u32);
        out.u32(f.raw_len);
        out.u32(crc32c::crc32c(&f.stored));
    }
}

/// Lays out a node block: the fixed header, the partition table (offset, stored length, raw
/// length, crc32c per partition), the header crc, then the stored partitions.
fn assemble_node(
    version: u32,
    id: NodeId,
    kind: u8,
    height: u32,
    level: Option<i32>,
    stored: Vec<(Vec<u8>, u32)>,
) -> Result<Vec<u8>> {
    let header_len = NODE_FIXED_HEADER_BYTES + PARTITION_ENTRY_BYTES * stored.len() + 4;
    let mut w = W(take_block_buf(
        header_len + stored.iter().map(|(d, _)| d.len()).sum::<usize>(),
    ));
    w.0.extend_from_slice(NODE_MAGIC);
    w.u32(version);
    w.u64(id);
    w.u32(height);
    w.u8(kind);
    w.u8(u8::from(level.is_some()));
    w.0.extend_from_slice(&[0, 0]);
    w.u32(stored.len() as u32);
    w.u32(header_len as u32);
    w.u32(0);
    debug_assert_eq!(w.0.len(), NODE_FIXED_HEADER_BYTES);
    let mut offset = header_len as u32;
    for (data, raw_len) in &stored {
        w.u32(offset);
        w.u32(data.len() as u32);
        w.u32(*raw_len);
        w.u32(crc32c::crc32c(data));
        offset += data.len() as u32;
    }
    let hcrc = crc32c::crc32c(&w.0);
    w.u32(hcrc);
    for (data, _) in &stored {
        w.0.extend_from_slice(data);
    }
    Ok(w.0)
}

/// Decodes a node block read from `location`; `expect_id` must match the stored id.
pub fn decode_node(
    buf: &[u8],
    expect_id: NodeId,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Node> {
    decode_node_inner(buf, expect_id).map_err(|d| match d {
        NodeErr::Corrupt(d) => corruption(location, d),
        NodeErr::Engine(e) => e,
    })
}

enum NodeErr {
    Corrupt(Detail),
    Engine(EngineError),
}

impl From<Detail> for NodeErr {
    fn from(d: Detail) -> Self {
        NodeErr::Corrupt(d)
    }
}

impl From<&str> for NodeErr {
    fn from(d: &str) -> Self {
        NodeErr::Corrupt(d.to_string())
    }
}

fn decode_node_inner(buf: &[u8], expect_id: NodeId) -> Result<Node, NodeErr> {
    let mut r = R::new(buf);
    if r.take(8)? != NODE_MAGIC {
        return Err("bad node magic".to_string().into());
    }
    let version = r.u32()?;
    if version > FORMAT_VERSION {
        return Err(NodeErr::Engine(EngineError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        }));
    }
    let id = r.u64()?;
    let height = r.u32()?;
    let kind = r.u8()?;
    let compressed = r.u8()?;
    r.take(2)?;
    let nparts = r.u32()? as usize;
    let header_len = r.u32()? as usize;
    r.u32()?;
    if header_len != NODE_FIXED_HEADER_BYTES + PARTITION_ENTRY_BYTES * nparts + 4 {
        return Err(format!("header length {header_len} does not match {nparts} partitions").into());
    }
    let header = buf.get(..header_len).ok_or("truncated node header")?;
    let (hbody, htail) = header.split_at(header_len - 4);
    let mut c = [0u8; 4];
    c.copy_from_slice(htail);
    if crc32c::crc32c(hbody) != u32::from_le_bytes(c) {
        return Err("node header crc32c mismatch".to_string().into());
    }
    if id != expect_id {
        return Err(format!("block holds node {id}, expected {expect_id}").into());
    }
    // Every partition's stored bytes, checked against the table's crc32c.
    let mut stored: Vec<(&[u8], usize)> = Vec::with_capacity(nparts);
    for p in 0..nparts {
        let off = r.u32()? as usize;
        let len = r.u32()? as usize;
        let raw_len = r.u32()? as usize;
        let crc = r.u32()?;
        let data = buf
            .get(off..off.saturating_add(len))
            .ok_or_else(|| format!("partition {p} out of bounds"))?;
        if crc32c::crc32c(data) != crc {
            return Err(format!("partition {p} crc32c mismatch").into());
        }
        stored.push((data, raw_len));
    }
    let unpack = |p: usize, (data, raw_len): (&[u8], usize)| -> Result<Vec<u8>, Detail> {
        let raw = if compressed == 1 {
            zstd_decompress(data, raw_len).map_err(|e| format!("partition {p} zstd: {e}"))?
        } else {
            data.to_vec()
        };
        if raw.len() != raw_len {
            return Err(format!("partition {p} length {} != {raw_len}", raw.len()));
        }
        Ok(raw)
    };
    let mut stored = stored.into_iter().enumerate();
    let info = match stored.next() {
        Some((p, s)) => unpack(p, s)?,
        None => return Err("node without info partition".to_string().into()),
    };
    let mut ir = R::new(&info);
    let n = ir.u32()? as usize;
    if n == 0 || n != nparts - 1 {
        return Err(format!("{n} children/basements but {} data partitions", nparts - 1).into());
    }
    let mut pivots = Vec::with_capacity(n - 1);
    for _ in 1..n {
        pivots.push(ir.bytes()?);
    }
    match kind {
        1 => {
            let mut children = Vec::with_capacity(n);
            for _ in 0..n {
                children.push(ir.u64()?);
            }
            // The key filters (format 2) are rebuilt in memory from the buffers; the spilled
            // runs' references go back into their buffers.
            let filters = read_child_filters(&mut ir, n)?;
            let mut buffers = if version >= 4 {
                let tables = read_buffer_tables(&mut ir, n, version, compressed == 1)?;
                ir.done()?;
                stored
                    .zip(&tables)
                    .map(|((p, (data, raw_len)), t)| {
                        decode_framed_buffer(data, raw_len, t).map_err(|d| format!("buffer {}: {d}", p - 1))
                    })
                    .collect::<Result<Vec<_>, Detail>>()?
            } else {
                ir.done()?;
                stored
                    .map(|(p, s)| decode_buffer(&unpack(p, s)?))
                    .collect::<Result<Vec<_>, Detail>>()?
            };
            for (b, f) in buffers.iter_mut().zip(filters) {
                for r in f.runs {
                    b.push_spilled(r);
                }
            }
            Ok(Node::Internal(Internal {
                height,
                pivots,
                children,
                buffers,
            }))
        }
        0 if version >= 3 => {
            let tables = read_frame_tables(&mut ir, n)?;
            ir.done()?;
            let basements = stored
                .zip(&tables)
                .map(|((p, (data, raw_len)), bf)| {
                    bf.check_partition(data.len(), raw_len)
                        .map_err(|d| format!("basement {}: {d}", p - 1))?;
                    decode_frames(data, bf, 0..bf.frames.len(), compressed == 1)
                })
                .collect::<Result<Vec<_>, Detail>>()?;
            Ok(Node::Leaf(Leaf {
                pivots,
                basements,
                appending: false,
                prepending: false,
            }))
        }
        0 => {
            ir.done()?;
            let basements = stored
                .map(|(p, s)| decode_basement(&unpack(p, s)?))
                .collect::<Result<Vec<_>, Detail>>()?;
            Ok(Node::Leaf(Leaf {
                pivots,
                basements,
                appending: false,
                prepending: false,
            }))
        }
        k => Err(format!("unknown node kind {k}").into()),
    }
}

/// Reads the per-child filter section of an internal node's partition 0 (format 2; absent in
/// format 1 nodes, whose children then get [`KeyFilter::everything`]).
fn read_child_filters(r: &mut R<'_>, children: usize) -> Result<Vec<ChildFilter>, Detail> {
    if r.pos == r.buf.len() {
        return Ok(vec![
            ChildFilter {
                has_ranges: true,
                keys: KeyFilter::everything(),
                runs: Vec::new(),
            };
            children
        ]);
    }
    let mut out = Vec::with_capacity(children);
    for _ in 0..children {
        let has_ranges = match r.u8()? {
            0 => false,
            1 => true,
            t => return Err(format!("bad range flag {t}")),
        };
        let rest = r.buf.get(r.pos..).unwrap_or_default();
        let (keys, used) = KeyFilter::decode(rest)?;
        r.take(used)?;
        let nruns = r.u32()? as usize;
        let mut runs = Vec::with_capacity(nruns.min(1024));
        for _ in 0..nruns {
            let id = r.u64()?;
            let msgs = r.u32()?;
            let bytes = r.u64()?;
            let min_key = r.bytes()?;
            let max_key = r.bytes()?;
            let rest = r.buf.get(r.pos..).unwrap_or_default();
            let (filter, used) = KeyFilter::decode(rest)?;
            r.take(used)?;
            runs.push(RunRef {
                id,
                msgs,
                bytes,
                min_key,
                max_key,
                filter,
            });
        }
        out.push(ChildFilter {
            has_ranges,
            keys,
            runs,
        });
    }
    Ok(out)
}

/// What partition 0 of an internal node says about one child's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildFilter {
    /// The buffer holds range messages (it must be read for any key).
    pub has_ranges: bool,
    /// Filter over the keys of its point messages.
    pub keys: KeyFilter,
    /// Runs spilled from the buffer (older messages on disk), oldest first.
    pub runs: Vec<RunRef>,
}

/// Partition 0 of an internal node: pivots, children, per-child filters and (format 4)
/// per-child buffer tables.
#[derive(Debug, Clone)]
pub struct InternalInfo {
    /// `children.len() - 1` pivots.
    pub pivots: Vec<Vec<u8>>,
    /// Child node ids.
    pub children: Vec<NodeId>,
    /// One per child.
    pub filters: Vec<ChildFilter>,
    /// One per child from format 4 (range messages and the frame table of the buffer's point
    /// messages); `None` before: a buffer partition is read whole.
    pub tables: Option<Vec<BufferTable>>,
}

impl InternalInfo {
    /// Bytes this takes in memory beyond the raw partition (frame tables and ranges).
    pub fn tables_size_bytes(&self) -> usize {
        self.tables.iter().flatten().map(BufferTable::size_bytes).sum()
    }
}

/// Decodes partition 0 of an internal node of format `version` (from its index) with
/// `buffers` buffer partitions, whose frames are compressed when `compressed`.
pub fn decode_internal_info(
    raw: &[u8],
    buffers: usize,
    version: u32,
    compressed: bool,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<InternalInfo> {
    let mut r = R::new(raw);
    let res = (|| -> Result<InternalInfo, Detail> {
        let n = r.u32()? as usize;
        if n == 0 || n != buffers {
            return Err(format!("{n} children but {buffers} buffer partitions"));
        }
        let mut pivots = Vec::with_capacity(n - 1);
        for _ in 1..n {
            pivots.push(r.bytes()?);
        }
        let mut children = Vec::with_capacity(n);
        for _ in 0..n {
            children.push(r.u64()?);
        }
        let filters = read_child_filters(&mut r, n)?;
        let tables = if version >= 4 {
            Some(read_buffer_tables(&mut r, n, version, compressed)?)
        } else {
            None
        };
        r.done()?;
        Ok(InternalInfo {
            pivots,
            children,
            filters,
            tables,
        })
    })();
    res.map_err(|d| corruption(location, d))
}

/// The point messages of frame `frame` of a format-4 buffer described by `t`, whose stored
/// bytes are `data` (read from the partition at the frame's offset); its crc32c, length, first
/// key and message order are checked.
pub fn decode_buffer_frame(
    data: &[u8],
    t: &BufferTable,
    frame: usize,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<Msg>> {
    let mut out = Vec::new();
    decode_run_frames(data, &t.points, frame..frame + 1, &[], None, location, &mut out)?;
    Ok(out)
}

/// One buffer partition of an internal node before format 4 (messages in MSN order).
pub fn decode_buffer_partition(raw: &[u8], location: &(impl std::fmt::Display + ?Sized)) -> Result<Buffer> {
    decode_buffer(raw).map_err(|d| corruption(location, d))
}

// ------------------------------------------------------------------------------------------
// Partial reads: one basement without the rest of its leaf
// ------------------------------------------------------------------------------------------

/// One row of a node's partition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartEntry {
    /// Offset from the block start.
    pub offset: u32,
    /// Stored (possibly compressed) length.
    pub len: u32,
    /// Uncompressed length.
    pub raw_len: u32,
    /// crc32c of the stored bytes.
    pub crc: u32,
}

/// A node's header: what a partial read needs to locate one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeIndex {
    /// Format version of the block (leaf basements are framed from version 3).
    pub version: u32,
    /// 0 for leaves.
    pub height: u32,
    /// Partitions are zstd-compressed.
    pub compressed: bool,
    /// Partition table (partition 0 = pivots).
    pub parts: Vec<PartEntry>,
}

/// Total header length announced by the fixed part of a node header.
pub fn node_header_len(fixed: &[u8], location: &(impl std::fmt::Display + ?Sized)) -> Result<usize> {
    let mut r = R::new(fixed);
    let res = (|| -> Result<usize, Detail> {
        if r.take(8)? != NODE_MAGIC {
            return Err("bad node magic".into());
        }
        // version, id, height, kind, compression, padding
        r.take(20)?;
        let nparts = r.u32()? as usize;
        let header_len = r.u32()? as usize;
        if nparts > (1 << 20) || header_len != NODE_FIXED_HEADER_BYTES + PARTITION_ENTRY_BYTES * nparts + 4 {
            return Err(format!(
                "header length {header_len} does not match {nparts} partitions"
            ));
        }
        Ok(header_len)
    })();
    res.map_err(|d| corruption(location, d))
}

/// Decodes and verifies (crc32c) a whole node header.
pub fn decode_node_index(
    header: &[u8],
    expect_id: NodeId,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<NodeIndex> {
    let body = verify_trailing_crc(header, location)?;
    let mut r = R::new(body);
    let res = (|| -> Result<Result<NodeIndex>, Detail> {
        if r.take(8)? != NODE_MAGIC {
            return Err("bad node magic".into());
        }
        let version = r.u32()?;
        if version > FORMAT_VERSION {
            return Ok(Err(EngineError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            }));
        }
        let id = r.u64()?;
        if id != expect_id {
            return Err(format!("block holds node {id}, expected {expect_id}"));
        }
        let height = r.u32()?;
        let _kind = r.u8()?;
        let compressed = r.u8()? == 1;
        r.take(2)?;
        let nparts = r.u32()? as usize;
        r.take(8)?;
        let mut parts = Vec::with_capacity(nparts.min(1 << 16));
        for _ in 0..nparts {
            parts.push(PartEntry {
                offset: r.u32()?,
                len: r.u32()?,
                raw_len: r.u32()?,
                crc: r.u32()?,
            });
        }
        r.done()?;
        Ok(Ok(NodeIndex {
            version,
            height,
            compressed,
            parts,
        }))
    })();
    res.map_err(|d| corruption(location, d))?
}

/// Verifies and decompresses one stored partition.
pub fn decode_partition(
    data: &[u8],
    e: &PartEntry,
    compressed: bool,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<u8>> {
    if data.len() != e.len as usize || crc32c::crc32c(data) != e.crc {
        return Err(corruption(location, "partition crc32c mismatch"));
    }
    let raw = if compressed {
        zstd_decompress(data, e.raw_len as usize)
            .map_err(|err| corruption(location, format!("partition zstd: {err}")))?
    } else {
        data.to_vec()
    };
    if raw.len() != e.raw_len as usize {
        return Err(corruption(location, "partition length mismatch"));
    }
    Ok(raw)
}

/// One frame of a basement (format 3), from its leaf's partition 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafFrame {
    /// Key of the frame's first entry.
    pub first_key: Vec<u8>,
    /// Entries in the frame.
    pub entries: u32,
    /// Offset of the stored bytes from the start of the basement's partition.
    pub offset: u32,
    /// Stored (possibly compressed) length in bytes.
    pub stored_len: u32,
    /// Uncompressed length in bytes.
    pub raw_len: u32,
    /// crc32c of the stored bytes.
    pub crc: u32,
}

/// The frame table of one basement (format 3).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BasementFrames {
    /// The basement's applied MSN.
    pub max_msn: Msn,
    /// Entries in the basement.
    pub entries: u32,
    /// Frames in key order.
    pub frames: Vec<LeafFrame>,
    /// [`key_prefix`] of each frame's first key, for [`BasementFrames::frame_for`].
    pub first_key_prefixes: Vec<u64>,
}

impl BasementFrames {
    /// The frame that can hold `key`: the last one starting at or below it; `None` when `key`
    /// sorts before every entry (then the basement does not hold it).
    pub fn frame_for(&self, key: &[u8]) -> Option<usize> {
        debug_assert_eq!(self.first_key_prefixes.len(), self.frames.len());
        count_at_or_below(&self.first_key_prefixes, key, |i| {
            self.frames.get(i).is_some_and(|f| f.first_key.as_slice() <= key)
        })
        .checked_sub(1)
    }

    /// Bytes this table takes in memory (for cache accounting).
    pub fn size_bytes(&self) -> usize {
        32 + self.frames.iter().map(|f| 56 + f.first_key.len()).sum::<usize>()
    }

    /// Checks that the frames add up to the partition's stored and raw lengths.
    fn check_partition(&self, stored_len: usize, raw_len: usize) -> Result<(), Detail> {
        let lens = self.frames.iter().map(|f| (f.stored_len, f.raw_len));
        check_frame_lengths(lens, stored_len, raw_len, "frames")
    }
}

/// Reads the `n` basements' frame tables from a format-3 leaf's partition 0.
fn read_frame_tables(r: &mut R<'_>, n: usize) -> Result<Vec<BasementFrames>, Detail> {
    let mut out = Vec::with_capacity(n);
    for b in 0..n {
        let max_msn = r.u64()?;
        let entries = r.u32()?;
        let nframes = r.u32()? as usize;
        let mut frames: Vec<LeafFrame> = Vec::with_capacity(nframes.min(1 << 12));
        let mut offset = 0u32;
        let mut total = 0u64;
        for row in read_frame_rows(r, nframes, &format!("basement {b}"))? {
            frames.push(LeafFrame {
                first_key: row.first_key,
                entries: row.count,
                offset,
                stored_len: row.stored_len,
                raw_len: row.raw_len,
                crc: row.crc,
            });
            offset = offset
                .checked_add(row.stored_len)
                .ok_or("frame offsets overflow")?;
            total += u64::from(row.count);
        }
        if total != u64::from(entries) {
            return Err(format!(
                "basement {b}: frames hold {total} entries, table says {entries}"
            ));
        }
        let first_key_prefixes = frames.iter().map(|f| key_prefix(&f.first_key)).collect();
        out.push(BasementFrames {
            max_msn,
            entries,
            frames,
            first_key_prefixes,
        });
    }
    Ok(out)
}

/// The raw bytes of frame number `n` (for messages) stored at `data[at..]`: `(stored, raw)`
/// lengths from its index, checked against `crc` when given, decompressed when `compressed`.
fn unpack_frame(
    data: &[u8],
    at: usize,
    (stored_len, raw_len): (u32, u32),
    crc: Option<u32>,
    compressed: bool,
    n: usize,
) -> Result<Vec<u8>, Detail> {
    let stored = data
        .get(at..at.saturating_add(stored_len as usize))
        .ok_or_else(|| format!("frame {n} truncated"))?;
    if crc.is_some_and(|c| crc32c::crc32c(stored) != c) {
        return Err(format!("frame {n} crc32c mismatch"));
    }
    let raw = if compressed {
        zstd_decompress(stored, raw_len as usize).map_err(|e| format!("frame {n} zstd: {e}"))?
    } else {
        stored.to_vec()
    };
    if raw.len() != raw_len as usize {
        return Err(format!(
            "frame {n} is {} bytes, its index says {raw_len}",
            raw.len()
        ));
    }
    Ok(raw)
}

/// Visits the `f.entries` (key, value) entries of the raw (unpacked) basement frame number `n`
/// in order, checking that the first key is the one its table names, that keys strictly
/// increase and that nothing follows the last entry.
fn for_each_frame_entry(
    raw: &[u8],
    f: &LeafFrame,
    n: usize,
    mut visit: impl FnMut(&[u8], &[u8]),
) -> Result<(), Detail> {
    let mut r = R::new(raw);
    let mut prev: Option<&[u8]> = None;
    for j in 0..f.entries {
        let k = r.slice()?;
        let v = r.slice()?;
        if j == 0 && k != f.first_key.as_slice() {
            return Err(format!("frame {n} starts at another key than its table"));
        }
        if prev.is_some_and(|pk| pk >= k) {
            return Err("basement keys not strictly increasing".into());
        }
        prev = Some(k);
        visit(k, v);
    }
    r.done()
}

/// Decodes frames `range` of a basement whose stored bytes (from the first of them on) are
/// `data`: each frame's crc32c, length, first key and the strict key order are checked.
fn decode_frames(
    data: &[u8],
    bf: &BasementFrames,
    range: std::ops::Range<usize>,
    compressed: bool,
) -> Result<Basement, Detail> {
    let frames = bf.frames.get(range.clone()).ok_or("frame out of range")?;
    let entries: usize = frames.iter().map(|f| f.entries as usize).sum();
    let raw_bytes: usize = frames.iter().map(|f| f.raw_len as usize).sum();
    let mut out = BasementBuilder::with_capacity(entries, raw_bytes.saturating_sub(8 * entries));
    let base = frames.first().map_or(0, |f| f.offset as usize);
    for (i, f) in frames.iter().enumerate() {
        let at = f.offset as usize - base;
        let raw = unpack_frame(
            data,
            at,
            (f.stored_len, f.raw_len),
            Some(f.crc),
            compressed,
            range.start + i,
        )?;
        // Frames follow each other in key order: this one starts after the last one's end.
        if out.last_key().is_some_and(|pk| pk >= f.first_key.as_slice()) {
            return Err("basement keys not strictly increasing".into());
        }
        for_each_frame_entry(&raw, f, range.start + i, |k, v| out.push(k, v))?;
    }
    Ok(out.finish(bf.max_msn))
}

/// A leaf's partition 0: the basement pivots and, from format 3, each basement's frame table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafInfo {
    /// Pivots between the basements.
    pub pivots: Vec<Vec<u8>>,
    /// Frame tables, one per basement (`None` before format 3: a basement is read whole).
    pub frames: Option<Vec<BasementFrames>>,
}

/// The skeleton of a leaf block (its partition table and partition 0: basement pivots and frame
/// tables), parsed from the whole encoded block `block` of node `id`; `Ok(None)` for an internal
/// node or a leaf before format 3 (whose basements are not framed). Checks the header and
/// partition 0 crcs.
pub fn decode_leaf_skeleton(
    block: &[u8],
    id: NodeId,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<(NodeIndex, LeafInfo)>> {
    let fixed = block
        .get(..NODE_FIXED_HEADER_BYTES)
        .ok_or_else(|| corruption(location, "block shorter than a node header"))?;
    let header_len = node_header_len(fixed, location)?;
    let header = block
        .get(..header_len)
        .ok_or_else(|| corruption(location, "truncated node header"))?;
    let index = decode_node_index(header, id, location)?;
    if index.height != 0 || index.version < 3 || index.parts.len() < 2 {
        return Ok(None);
    }
    let p0 = index.parts[0];
    let data = block
        .get(p0.offset as usize..(p0.offset as usize).saturating_add(p0.len as usize))
        .ok_or_else(|| corruption(location, "partition 0 out of bounds"))?;
    let raw = decode_partition(data, &p0, index.compressed, location)?;
    let info = decode_leaf_info(&raw, index.parts.len() - 1, index.version, location)?;
    Ok(Some((index, info)))
}

/// Decodes a leaf's partition 0 (`basements` data partitions, block format `version`).
pub fn decode_leaf_info(
    raw: &[u8],
    basements: usize,
    version: u32,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<LeafInfo> {
    let mut r = R::new(raw);
    let res = (|| -> Result<LeafInfo, Detail> {
        let n = r.u32()? as usize;
        if n == 0 || n != basements {
            return Err(format!("{n} basements but {basements} data partitions"));
        }
        let mut pivots = Vec::with_capacity(n - 1);
        for _ in 1..n {
            pivots.push(r.bytes()?);
        }
        let frames = if version >= 3 {
            Some(read_frame_tables(&mut r, n)?)
        } else {
            None
        };
        r.done()?;
        Ok(LeafInfo { pivots, frames })
    })();
    res.map_err(|d| corruption(location, d))
}

/// Decodes frame `frame` of a basement from its stored bytes `data` (format 3): a basement
/// holding that frame's entries, with the whole basement's applied MSN.
pub fn decode_basement_frame(
    data: &[u8],
    bf: &BasementFrames,
    frame: usize,
    compressed: bool,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Basement> {
    decode_frames(data, bf, frame..frame + 1, compressed).map_err(|d| corruption(location, d))
}

/// Looks `key` up in frame `frame` of a basement (`data`: that frame's stored bytes) without
/// building a [`Basement`]: a point read of a frame the side cache does not keep. The frame
/// gets the same checks as [`decode_basement_frame`] (crc32c, length, first key as in the table,
/// keys strictly increasing, nothing after the last entry), over every entry, and the value of
/// `key` is copied out; `None` when the frame does not hold `key`. Errors: `Corruption` naming
/// `location`.
pub fn lookup_in_frame(
    data: &[u8],
    bf: &BasementFrames,
    frame: usize,
    compressed: bool,
    key: &[u8],
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<Vec<u8>>> {
    let scan = || -> Result<Option<Vec<u8>>, Detail> {
        let f = bf.frames.get(frame).ok_or("frame out of range")?;
        let raw = unpack_frame(data, 0, (f.stored_len, f.raw_len), Some(f.crc), compressed, frame)?;
        let mut found = None;
        for_each_frame_entry(&raw, f, frame, |k, v| {
            if k == key {
                found = Some(v.to_vec());
            }
        })?;
        Ok(found)
    };
    scan().map_err(|d| corruption(location, d))
}

/// One whole basement partition of a leaf written before format 3.
pub fn decode_basement_partition(
    raw: &[u8],
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Basement> {
    decode_basement(raw).map_err(|d| corruption(location, d))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::fractal::msg::key_hash;

    /// Partition `e` of the node block `enc`, verified and decompressed.
    fn stored_partition(enc: &[u8], e: &PartEntry, compressed: bool) -> Vec<u8> {
        decode_partition(
            &enc[e.offset as usize..(e.offset + e.len) as usize],
            e,
            compressed,
            "t",
        )
        .unwrap()
    }

    #[test]
    fn node_roundtrip_and_bitflip() {
        let mut b = Buffer::new();
        b.push(Msg::Point {
            msn: 3,
            key: b"k".to_vec(),
            op: PointOp::Upsert(UpsertOp::Add(-2)),
        });
        b.push(Msg::Range(RangeMsg {
            msn: 4,
            start: b"a".to_vec(),
            end: None,
            op: RangeOp::Delete,
        }));
        let n = Node::Internal(Internal {
            height: 1,
            pivots: vec![b"m".to_vec()],
            children: vec![7, 9],
            buffers: vec![b, Buffer::new()],
        });
        for level in [None, Some(1)] {
            let enc = encode_node(5, &n, level).unwrap();
            assert_eq!(decode_node(&enc, 5, "t").unwrap(), n);
            for i in 0..enc.len() {
                let mut bad = enc.clone();
                bad[i] ^= 0x10;
                assert!(decode_node(&bad, 5, "t").is_err(), "flip at {i} undetected");
            }
        }
        let leaf = Node::Leaf(Leaf::from_entries(vec![(b"a".to_vec(), b"1".to_vec())], 9, 64));
        let enc = encode_node(2, &leaf, Some(3)).unwrap();
        assert_eq!(decode_node(&enc, 2, "t").unwrap(), leaf);
    }

    #[test]
    fn header_and_btt_roundtrip() {
        let h = Header {
            counter: 9,
            btt: BlockLoc {
                offset: 8192,
                size: 100,
                crc: 7,
            },
        };
        let enc = encode_header(&h);
        assert_eq!(decode_header(&enc).unwrap(), Some(h));
        let mut bad = enc.clone();
        bad[20] ^= 1;
        assert_eq!(decode_header(&bad).unwrap(), None);
        let b = BttImage {
            counter: 9,
            root: 1,
            next_msn: 10,
            next_node_id: 4,
            meta: Some(b"m".to_vec()),
            entries: vec![(
                1,
                BlockLoc {
                    offset: 8192,
                    size: 10,
                    crc: 3,
                },
            )],
        };
        let enc = encode_btt(&b);
        assert_eq!(decode_btt(&enc, "t").unwrap(), b);
        let mut bad = enc.clone();
        bad[30] ^= 4;
        assert!(matches!(
            decode_btt(&bad, "t"),
            Err(EngineError::Corruption { .. })
        ));
    }

    /// Point messages over 400 keys, several per key (one key with 300 messages, so it fills
    /// more than a frame by itself), sorted by (key, MSN).
    fn run_msgs() -> Vec<Msg> {
        let mut out = Vec::new();
        let mut msn = 1;
        for k in 0..400u32 {
            let key = format!("key{k:05}").into_bytes();
            let n = if k == 200 { 300 } else { 1 + k % 3 };
            for j in 0..n {
                msn += 1;
                let op = match j % 3 {
                    0 => PointOp::Put(vec![b'v'; 90 + (k as usize % 40)]),
                    1 => PointOp::Delete,
                    _ => PointOp::Upsert(UpsertOp::Add(i64::from(j))),
                };
                out.push(Msg::Point {
                    msn: msn + u64::from(k) * 1000,
                    key: key.clone(),
                    op,
                });
            }
        }
        out
    }

    fn key_of(m: &Msg) -> &[u8] {
        m.key_or_start()
    }

    #[test]
    fn framed_runs_read_one_key_from_its_frame() {
        let msgs = run_msgs();
        for level in [None, Some(1)] {
            let enc = encode_run(42, &msgs, level).unwrap();
            assert_eq!(decode_run_range(&enc, 42, "t", &[], None).unwrap(), msgs);
            let index = decode_run_index(&enc, enc.len() as u64, 42, "t").unwrap();
            assert!(index.frames.len() >= 4, "{} frames", index.frames.len());
            assert_eq!(
                index.frames.iter().map(|f| u64::from(f.msgs)).sum::<u64>(),
                msgs.len() as u64
            );
            // Frames start at distinct keys: a key's messages are all in one frame.
            for w in index.frames.windows(2) {
                assert!(w[0].first_key < w[1].first_key);
            }
            for k in [0u32, 1, 199, 200, 201, 399] {
                let key = format!("key{k:05}").into_bytes();
                let mut hi = key.clone();
                hi.push(0);
                let want: Vec<Msg> = msgs
                    .iter()
                    .filter(|m| key_of(m) == key.as_slice())
                    .cloned()
                    .collect();
                let frames = index.frames_for(&key, Some(&hi));
                assert_eq!(frames.len(), 1, "key {k} needs one frame");
                let f = &index.frames[frames.start];
                let data = &enc[f.offset as usize..(f.offset + u64::from(f.stored_len)) as usize];
                let mut got = Vec::new();
                decode_run_frames(data, &index, frames, &key, Some(&hi), "t", &mut got).unwrap();
                assert_eq!(got, want, "key {k}");
            }
            // A range across frames, and keys outside the run.
            let (lo, hi) = (b"key00150".to_vec(), b"key00250".to_vec());
            let want: Vec<Msg> = msgs
                .iter()
                .filter(|m| key_of(m) >= lo.as_slice() && key_of(m) < hi.as_slice())
                .cloned()
                .collect();
            assert_eq!(decode_run_range(&enc, 42, "t", &lo, Some(&hi)).unwrap(), want);
            assert!(decode_run_range(&enc, 42, "t", b"a", Some(b"b"))
                .unwrap()
                .is_empty());
            assert!(decode_run_range(&enc, 42, "t", b"z", None).unwrap().is_empty());
            // A flipped bit in a frame is caught by that frame's crc when it is read.
            let f = &index.frames[2];
            let mut bad = enc.clone();
            bad[f.offset as usize + 3] ^= 0x20;
            let mut sink = Vec::new();
            let data = &bad[f.offset as usize..];
            assert!(matches!(
                decode_run_frames(data, &index, 2..3, &[], None, "t", &mut sink),
                Err(EngineError::Corruption { .. })
            ));
            // And in the index, by the index crc.
            let mut bad = enc.clone();
            bad[RUN_FIXED_HEADER_BYTES + 2] ^= 1;
            assert!(decode_run_index(&bad, bad.len() as u64, 42, "t").is_err());
            assert!(
                decode_run_index(&enc, enc.len() as u64, 43, "t").is_err(),
                "wrong id"
            );
        }
    }

    /// A version-2 run (one payload after a 36-byte header), as files written before framed
    /// runs hold them, still decodes whole and by key.
    #[test]
    fn version_2_runs_still_decode() {
        let msgs = run_msgs();
        let enc = encode_run_v2(7, &msgs, true);
        assert_eq!(decode_run_range(&enc, 7, "t", &[], None).unwrap(), msgs);
        assert_eq!(run_index_len(&enc[..RUN_FIXED_HEADER_BYTES], 7, "t").unwrap(), 0);
        let index = decode_run_index(&enc[..RUN_FIXED_HEADER_BYTES], enc.len() as u64, 7, "t").unwrap();
        assert_eq!(index.frames.len(), 1);
        let key = b"key00200".to_vec();
        let want: Vec<Msg> = msgs
            .iter()
            .filter(|m| key_of(m) == key.as_slice())
            .cloned()
            .collect();
        assert_eq!(
            decode_run_range(&enc, 7, "t", &key, Some(b"key00200\0")).unwrap(),
            want
        );
    }

    fn big_leaf() -> Leaf {
        let entries: Vec<(Vec<u8>, Vec<u8>)> = (0..3000u32)
            .map(|i| {
                (
                    format!("key{i:06}").into_bytes(),
                    vec![b'a' + (i % 26) as u8; 20 + (i % 90) as usize],
                )
            })
            .collect();
        Leaf::from_entries(entries, 77, 64 << 10)
    }

    #[test]
    fn framed_leaves_read_one_frame_per_key() {
        let leaf = big_leaf();
        assert!(leaf.basements.len() >= 2 && leaf.basements[0].data_bytes() > 8 * BASEMENT_FRAME_RAW_BYTES);
        for level in [None, Some(3)] {
            let node = Node::Leaf(leaf.clone());
            let enc = encode_node(9, &node, level).unwrap();
            assert_eq!(decode_node(&enc, 9, "t").unwrap(), node);
            let hlen = node_header_len(&enc[..NODE_FIXED_HEADER_BYTES], "t").unwrap();
            let index = decode_node_index(&enc[..hlen], 9, "t").unwrap();
            assert_eq!(index.version, FORMAT_VERSION);
            let p0 = index.parts[0];
            let raw = stored_partition(&enc, &p0, index.compressed);
            let info = decode_leaf_info(&raw, index.parts.len() - 1, index.version, "t").unwrap();
            assert_eq!(info.pivots, leaf.pivots);
            let tables = info.frames.unwrap();
            for (bi, b) in leaf.basements.iter().enumerate() {
                let bf = &tables[bi];
                assert_eq!(bf.entries as usize, b.len());
                assert!(
                    bf.frames.len() >= b.data_bytes() / BASEMENT_FRAME_RAW_BYTES,
                    "a basement is cut into frames of about 4 KiB"
                );
                let part = index.parts[bi + 1];
                for (k, v) in b.iter().step_by(37) {
                    let fi = bf.frame_for(k).unwrap();
                    let f = &bf.frames[fi];
                    let at = (part.offset + f.offset) as usize;
                    let data = &enc[at..at + f.stored_len as usize];
                    let piece = decode_basement_frame(data, bf, fi, index.compressed, "t").unwrap();
                    assert_eq!(piece.get(k), Some(v));
                    assert_eq!(piece.max_msn, 77);
                    assert_eq!(piece.len(), f.entries as usize, "only the frame is decoded");
                }
                assert_eq!(bf.frame_for(b"a"), None, "keys below the first frame");
            }
            // Every byte of the block is covered: flips anywhere are caught by a full decode.
            for i in (0..enc.len()).step_by(97) {
                let mut bad = enc.clone();
                bad[i] ^= 0x04;
                assert!(decode_node(&bad, 9, "t").is_err(), "flip at {i} undetected");
            }
            // A flip inside one frame is caught by that frame's crc on a partial read.
            let bf = &tables[0];
            let f = &bf.frames[1];
            let at = (index.parts[1].offset + f.offset) as usize;
            let mut data = enc[at..at + f.stored_len as usize].to_vec();
            data[1] ^= 0x40;
            assert!(matches!(
                decode_basement_frame(&data, bf, 1, index.compressed, "t"),
                Err(EngineError::Corruption { .. })
            ));
        }
    }

    /// An internal node whose buffers hold many point messages (several per key for some keys,
    /// all three kinds) and range messages.
    fn big_internal() -> Internal {
        let mut buffers = vec![Buffer::new(), Buffer::new(), Buffer::new()];
        let mut msn = 0;
        for i in 0..3000u32 {
            let key = format!("k{:06}", i * 7 % 3001).into_bytes();
            let child = usize::from(key.as_slice() >= b"k001000".as_slice())
                + usize::from(key.as_slice() >= b"k002000".as_slice());
            msn += 1;
            let op = match i % 5 {
                0 => PointOp::Delete,
                1 => PointOp::Upsert(UpsertOp::Append(b"x".to_vec())),
                _ => PointOp::Put(vec![b'v'; 40 + (i % 13) as usize]),
            };
            buffers[child].push(Msg::Point {
                msn,
                key: key.clone(),
                op,
            });
            if i % 4 == 1 {
                msn += 1;
                buffers[child].push(Msg::Point {
                    msn,
                    key,
                    op: PointOp::Upsert(UpsertOp::Add(3)),
                });
            }
            if i == 1500 {
                msn += 1;
                buffers[1].push(Msg::Range(RangeMsg {
                    msn,
                    start: b"k001200".to_vec(),
                    end: Some(b"k001300".to_vec()),
                    op: RangeOp::Delete,
                }));
            }
        }
        Internal {
            height: 1,
            pivots: vec![b"k001000".to_vec(), b"k002000".to_vec()],
            children: vec![4, 5, 6],
            buffers,
        }
    }

    /// Format 4: a point read through an uncached internal node decodes one frame of one
    /// buffer, and gets exactly the messages the whole buffer holds for the key (with the
    /// buffer's range messages from partition 0).
    #[test]
    fn framed_buffers_read_one_frame_per_key() {
        let internal = big_internal();
        let node = Node::Internal(internal.clone());
        for level in [None, Some(1)] {
            let enc = encode_node(3, &node, level).unwrap();
            assert_eq!(decode_node(&enc, 3, "t").unwrap(), node);
            let hlen = node_header_len(&enc[..NODE_FIXED_HEADER_BYTES], "t").unwrap();
            let index = decode_node_index(&enc[..hlen], 3, "t").unwrap();
            assert_eq!(index.version, 4);
            let raw = stored_partition(&enc, &index.parts[0], index.compressed);
            let info = decode_internal_info(&raw, 3, index.version, index.compressed, "t").unwrap();
            let tables = info.tables.expect("format 4 has buffer tables");
            assert_eq!(tables[1].ranges.len(), 1);
            for (c, b) in internal.buffers.iter().enumerate() {
                let t = &tables[c];
                assert!(
                    t.points.frames.len() > 8,
                    "buffers are cut into frames of about 4 KiB"
                );
                let part = index.parts[c + 1];
                let mut keys: Vec<Vec<u8>> = b.point_msgs().map(|(_, k, _)| k.to_vec()).collect();
                keys.dedup();
                for key in keys.iter().step_by(7) {
                    let mut want = Vec::new();
                    b.collect_for_key(key, key_hash(key), &mut want);
                    want.retain(|m| matches!(m, Msg::Point { .. }));
                    let fi = t.frame_for(key).unwrap();
                    let f = &t.points.frames[fi];
                    let at = part.offset as usize + f.offset as usize;
                    let data = &enc[at..at + f.stored_len as usize];
                    let got: Vec<Msg> = decode_buffer_frame(data, t, fi, "t")
                        .unwrap()
                        .into_iter()
                        .filter(|m| m.key_or_start() == key.as_slice())
                        .collect();
                    assert_eq!(got, want, "key {key:?}");
                }
                // A flip inside a frame is caught by that frame's crc on a partial read.
                let f = &t.points.frames[2];
                let at = part.offset as usize + f.offset as usize;
                let mut data = enc[at..at + f.stored_len as usize].to_vec();
                data[3] ^= 0x20;
                assert!(matches!(
                    decode_buffer_frame(&data, t, 2, "t"),
                    Err(EngineError::Corruption { .. })
                ));
            }
            for i in (0..enc.len()).step_by(89) {
                let mut bad = enc.clone();
                bad[i] ^= 0x08;
                assert!(decode_node(&bad, 3, "t").is_err(), "flip at {i} undetected");
            }
        }
    }

    /// Internal nodes written by format 3 (buffers in MSN order, one piece each) still decode,
    /// whole and through partition 0.
    #[test]
    fn version_3_internal_nodes_still_decode() {
        let node = Node::Internal(big_internal());
        let enc = encode_node_as(8, &node, Some(1), 3).unwrap();
        assert_eq!(decode_node(&enc, 8, "t").unwrap(), node);
        let hlen = node_header_len(&enc[..NODE_FIXED_HEADER_BYTES], "t").unwrap();
        let index = decode_node_index(&enc[..hlen], 8, "t").unwrap();
        assert_eq!(index.version, 3);
        let raw = stored_partition(&enc, &index.parts[0], index.compressed);
        let info = decode_internal_info(&raw, 3, index.version, index.compressed, "t").unwrap();
        assert!(info.tables.is_none());
        let raw = stored_partition(&enc, &index.parts[2], index.compressed);
        let Node::Internal(n) = &node else { unreachable!() };
        assert_eq!(decode_buffer_partition(&raw, "t").unwrap(), n.buffers[1]);
    }

    /// Leaves written before format 3 (one piece per basement) still decode, whole and by
    /// basement.
    #[test]
    fn version_2_leaves_still_decode() {
        let leaf = big_leaf();
        let mut info = W::default();
        info.u32(leaf.basements.len() as u32);
        for p in &leaf.pivots {
            info.bytes(p);
        }
        let mut stored = Vec::new();
        let info_len = info.0.len() as u32;
        stored.push((compress(info.0, Some(1)).unwrap(), info_len));
        for b in &leaf.basements {
            let raw = encode_basement(b);
            let raw_len = raw.len() as u32;
            stored.push((compress(raw, Some(1)).unwrap(), raw_len));
        }
        let enc = assemble_node(2, 4, 0, 0, Some(1), stored).unwrap();
        assert_eq!(decode_node(&enc, 4, "t").unwrap(), Node::Leaf(leaf.clone()));
        let hlen = node_header_len(&enc[..NODE_FIXED_HEADER_BYTES], "t").unwrap();
        let index = decode_node_index(&enc[..hlen], 4, "t").unwrap();
        assert_eq!(index.version, 2);
        let p0 = index.parts[0];
        let raw = stored_partition(&enc, &p0, true);
        let info = decode_leaf_info(&raw, index.parts.len() - 1, 2, "t").unwrap();
        assert!(info.frames.is_none());
        let p1 = index.parts[1];
        let raw = stored_partition(&enc, &p1, true);
        assert_eq!(decode_basement_partition(&raw, "t").unwrap(), leaf.basements[0]);
    }
}
