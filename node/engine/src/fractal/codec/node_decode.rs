//! Node blocks: decoding whole nodes and partition 0 of internal nodes.

use super::*;

/// Decodes a node block read from `location`; `expect_id` must match the stored id.
pub(crate) fn decode_node(
    buf: &[u8],
    expect_id: NodeId,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Node> {
    decode_node_inner(buf, expect_id).map_err(|d| match d {
        NodeErr::Corrupt(d) => corruption(location, d),
        NodeErr::Engine(e) => e,
    })
}

pub(crate) enum NodeErr {
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

pub(crate) fn decode_node_inner(buf: &[u8], expect_id: NodeId) -> Result<Node, NodeErr> {
    let head = read_node_header(buf, expect_id)?;
    let compressed = head.compressed == 1;
    let mut parts = head.parts.into_iter();
    let Some((data, raw_len)) = parts.next() else {
        return Err("node without info partition".into());
    };
    let info = unpack_partition(0, data, raw_len, compressed)?;
    let mut ir = R::new(&info);
    let n = ir.u32()? as usize;
    if n == 0 || n != parts.len() {
        return Err(format!("{n} children/basements but {} data partitions", parts.len()).into());
    }
    let mut pivots = Vec::with_capacity(n - 1);
    for _ in 1..n {
        pivots.push(ir.bytes()?);
    }
    let data_parts: Vec<(&[u8], usize)> = parts.collect();
    match head.kind {
        1 => Ok(Node::Internal(decode_internal_rest(
            &mut ir,
            head.height,
            pivots,
            &data_parts,
            compressed,
        )?)),
        0 => Ok(Node::Leaf(decode_leaf_rest(
            &mut ir,
            pivots,
            &data_parts,
            compressed,
        )?)),
        k => Err(format!("unknown node kind {k}").into()),
    }
}

/// The fixed header and partition table of a node block, checked (id, header length and
/// crc32c, every partition within the block and matching its crc32c).
struct NodeHeader<'a> {
    height: u32,
    kind: u8,
    compressed: u8,
    /// Each partition's stored bytes and raw length, partition 0 first.
    parts: Vec<(&'a [u8], usize)>,
}

fn read_node_header(buf: &[u8], expect_id: NodeId) -> Result<NodeHeader<'_>, NodeErr> {
    let mut r = R::new(buf);
    read_prelude(&mut r, NODE_MAGIC, "node")?.map_err(NodeErr::Engine)?;
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
    let (hbody, hcrc) = buf
        .get(..header_len)
        .and_then(<[u8]>::split_last_chunk::<4>)
        .ok_or("truncated node header")?;
    if crc32c::crc32c(hbody) != u32::from_le_bytes(*hcrc) {
        return Err("node header crc32c mismatch".into());
    }
    if id != expect_id {
        return Err(format!("block holds node {id}, expected {expect_id}").into());
    }
    let mut parts: Vec<(&[u8], usize)> = Vec::with_capacity(nparts);
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
        parts.push((data, raw_len));
    }
    Ok(NodeHeader {
        height,
        kind,
        compressed,
        parts,
    })
}

/// Partition `p`'s raw bytes from its stored bytes `data` (decompressed when `compressed`),
/// checked to be `raw_len` long.
fn unpack_partition(p: usize, data: &[u8], raw_len: usize, compressed: bool) -> Result<Vec<u8>, Detail> {
    let raw = if compressed {
        zstd_decompress(data, raw_len).map_err(|e| format!("partition {p} zstd: {e}"))?
    } else {
        data.to_vec()
    };
    if raw.len() != raw_len {
        return Err(format!("partition {p} length {} != {raw_len}", raw.len()));
    }
    Ok(raw)
}

/// The rest of an internal node after its pivots: children, filters and buffer tables from
/// partition 0 (`ir`), then each buffer from its partition in `data_parts`.
fn decode_internal_rest(
    ir: &mut R<'_>,
    height: u32,
    pivots: Vec<Vec<u8>>,
    data_parts: &[(&[u8], usize)],
    compressed: bool,
) -> Result<Internal, Detail> {
    let n = data_parts.len();
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        children.push(ir.u64()?);
    }
    // The key filters are rebuilt in memory from the buffers; the spilled runs' references go
    // back into their buffers.
    let filters = read_child_filters(ir, n)?;
    let tables = read_buffer_tables(ir, n, compressed)?;
    ir.done()?;
    let mut buffers = data_parts
        .iter()
        .zip(&tables)
        .enumerate()
        .map(|(c, (&(data, raw_len), t))| {
            decode_framed_buffer(data, raw_len, t).map_err(|d| format!("buffer {c}: {d}"))
        })
        .collect::<Result<Vec<_>, Detail>>()?;
    for (b, f) in buffers.iter_mut().zip(filters) {
        for r in f.runs {
            b.push_spilled(r);
        }
    }
    Ok(Internal {
        height,
        pivots,
        children,
        buffers,
    })
}

/// The rest of a leaf after its pivots: the frame tables from partition 0 (`ir`), then each
/// basement from its partition in `data_parts`.
fn decode_leaf_rest(
    ir: &mut R<'_>,
    pivots: Vec<Vec<u8>>,
    data_parts: &[(&[u8], usize)],
    compressed: bool,
) -> Result<Leaf, Detail> {
    let tables = read_frame_tables(ir, data_parts.len())?;
    ir.done()?;
    let basements = data_parts
        .iter()
        .zip(&tables)
        .enumerate()
        .map(|(b, (&(data, raw_len), bf))| {
            bf.check_partition(data.len(), raw_len)
                .map_err(|d| format!("basement {b}: {d}"))?;
            decode_frames(data, bf, 0..bf.frames.len(), compressed)
        })
        .collect::<Result<Vec<_>, Detail>>()?;
    Ok(Leaf {
        pivots,
        basements,
        appending: false,
        prepending: false,
    })
}

/// Reads the per-child filter section of an internal node's partition 0 (range flag, key
/// filter and spilled runs of each child's buffer).
pub(crate) fn read_child_filters(r: &mut R<'_>, children: usize) -> Result<Vec<ChildFilter>, Detail> {
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
pub(crate) struct ChildFilter {
    /// The buffer holds range messages (it must be read for any key).
    pub(crate) has_ranges: bool,
    /// Filter over the keys of its point messages.
    pub(crate) keys: KeyFilter,
    /// Runs spilled from the buffer (older messages on disk), oldest first.
    pub(crate) runs: Vec<RunRef>,
}

/// Partition 0 of an internal node: pivots, children, per-child filters and per-child buffer
/// tables.
#[derive(Debug, Clone)]
pub(crate) struct InternalInfo {
    /// `children.len() - 1` pivots.
    pub(crate) pivots: Vec<Vec<u8>>,
    /// Child node ids.
    pub(crate) children: Vec<NodeId>,
    /// One per child.
    pub(crate) filters: Vec<ChildFilter>,
    /// One per child: range messages and the frame table of the buffer's point messages.
    pub(crate) tables: Vec<BufferTable>,
}

impl InternalInfo {
    /// Bytes this takes in memory beyond the raw partition (frame tables and ranges).
    pub(crate) fn tables_size_bytes(&self) -> usize {
        self.tables.iter().map(BufferTable::size_bytes).sum()
    }
}

/// Decodes partition 0 of an internal node with `buffers` buffer partitions, whose frames are
/// compressed when `compressed`.
pub(crate) fn decode_internal_info(
    raw: &[u8],
    buffers: usize,
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
        let tables = read_buffer_tables(&mut r, n, compressed)?;
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

/// The point messages of frame `frame` of a buffer described by `t`, whose stored
/// bytes are `data` (read from the partition at the frame's offset); its crc32c, length, first
/// key and message order are checked.
pub(crate) fn decode_buffer_frame(
    data: &[u8],
    t: &BufferTable,
    frame: usize,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Vec<Msg>> {
    let mut out = Vec::new();
    decode_run_frames(data, &t.points, frame..frame + 1, &[], None, location, &mut out)?;
    Ok(out)
}
