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
            // The key filters are rebuilt in memory from the buffers; the spilled runs'
            // references go back into their buffers.
            let filters = read_child_filters(&mut ir, n)?;
            let tables = read_buffer_tables(&mut ir, n, compressed == 1)?;
            ir.done()?;
            let mut buffers = stored
                .zip(&tables)
                .map(|((p, (data, raw_len)), t)| {
                    decode_framed_buffer(data, raw_len, t).map_err(|d| format!("buffer {}: {d}", p - 1))
                })
                .collect::<Result<Vec<_>, Detail>>()?;
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
        0 => {
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
        k => Err(format!("unknown node kind {k}").into()),
    }
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
