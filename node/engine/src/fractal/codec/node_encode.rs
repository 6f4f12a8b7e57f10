//! Node blocks: encoding and the block layout.

use super::*;

/// Encodes `node` (id `id`): uncompressed header with a partition table, then one compressed,
/// crc32c-checked partition for the pivots/children and one per buffer or basement. Leaves are
/// compressed at `level`, internal nodes at [`transient_level`] of it.
pub(crate) fn encode_node(id: NodeId, node: &Node, level: Option<i32>) -> Result<Vec<u8>> {
    match node {
        Node::Internal(n) => encode_internal(id, n, transient_level(level)),
        Node::Leaf(l) => encode_leaf(id, l, level),
    }
}

/// An internal node: partition 0 holds the pivots, the children, per child whether its buffer
/// holds range messages, a key filter over its point messages (so a point read can skip the
/// buffer), its spilled runs, its range messages and the frame table of its point messages;
/// each buffer partition holds those frames, so a point read decompresses one frame of one
/// buffer.
fn encode_internal(id: NodeId, n: &Internal, level: Option<i32>) -> Result<Vec<u8>> {
    let mut info = W::default();
    info.u32(len_u32(n.children.len(), "children")?);
    for p in &n.pivots {
        info.bytes(p);
    }
    for c in &n.children {
        info.u64(*c);
    }
    for b in &n.buffers {
        info.u8(u8::from(!b.range_msgs().is_empty()));
        KeyFilter::build(b.point_hashes().into_iter()).encode(&mut info.0);
        info.u32(len_u32(b.spilled().len(), "spilled runs")?);
        for r in b.spilled() {
            info.u64(r.id);
            info.u32(r.msgs);
            info.u64(r.bytes);
            info.bytes(&r.min_key);
            info.bytes(&r.max_key);
            r.filter.encode(&mut info.0);
        }
    }
    let mut buffers = Vec::with_capacity(n.buffers.len());
    for b in &n.buffers {
        buffers.push(encode_buffer_frames(b, level, &mut info)?);
    }
    let mut stored = Vec::with_capacity(1 + buffers.len());
    stored.push(compress_partition(info.0, level, "partition 0")?);
    stored.extend(buffers);
    assemble_node(FORMAT_VERSION, id, 1, n.height, level, stored)
}

/// A leaf: partition 0 holds the basement pivots and each basement's frame table; each
/// basement is stored as frames of about `BASEMENT_FRAME_RAW_BYTES`, compressed one by one, so
/// a point read decompresses one frame.
fn encode_leaf(id: NodeId, l: &Leaf, level: Option<i32>) -> Result<Vec<u8>> {
    let mut info = W::default();
    info.u32(len_u32(l.basements.len(), "basements")?);
    for p in &l.pivots {
        info.bytes(p);
    }
    let mut framed = Vec::with_capacity(l.basements.len());
    for b in &l.basements {
        framed.push(encode_basement_frames(b, level, &mut info)?);
    }
    let mut stored = Vec::with_capacity(1 + framed.len());
    stored.push(compress_partition(info.0, level, "partition 0")?);
    stored.extend(framed);
    assemble_node(FORMAT_VERSION, id, 0, 0, level, stored)
}

/// A raw partition compressed at `level`, with its raw length (`what` names it in the error).
fn compress_partition(raw: Vec<u8>, level: Option<i32>, what: &str) -> Result<(Vec<u8>, u32)> {
    let raw_len = len_u32(raw.len(), what)?;
    Ok((compress(raw, level)?, raw_len))
}

/// Lays out a node block: the fixed header, the partition table (offset, stored length, raw
/// length, crc32c per partition), the header crc, then the stored partitions.
pub(crate) fn assemble_node(
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
    w.u32(len_u32(stored.len(), "partitions")?);
    w.u32(len_u32(header_len, "node header")?);
    w.u32(0);
    debug_assert_eq!(w.0.len(), NODE_FIXED_HEADER_BYTES);
    let mut offset = len_u32(header_len, "node header")?;
    for (data, raw_len) in &stored {
        w.u32(offset);
        w.u32(len_u32(data.len(), "partition")?);
        w.u32(*raw_len);
        w.u32(crc32c::crc32c(data));
        offset += len_u32(data.len(), "partition")?;
    }
    let hcrc = crc32c::crc32c(&w.0);
    w.u32(hcrc);
    for (data, _) in &stored {
        w.0.extend_from_slice(data);
    }
    Ok(w.0)
}
