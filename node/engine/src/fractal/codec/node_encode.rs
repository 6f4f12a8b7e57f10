//! Node blocks: encoding and the block layout.

use super::*;

/// Encodes `node` (id `id`): uncompressed header with a partition table, then one compressed,
/// crc32c-checked partition for the pivots/children and one per buffer or basement. Leaves are
/// compressed at `level`, internal nodes at [`transient_level`] of it.
pub(crate) fn encode_node(id: NodeId, node: &Node, level: Option<i32>) -> Result<Vec<u8>> {
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
            info.u32(len_u32(n.children.len(), "children")?);
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
            if version < 4 {
                parts.extend(n.buffers.iter().map(encode_buffer));
            } else {
                // Format 4: per child, its range messages and the frame table of its point
                // messages follow in partition 0; the buffer partition holds the frames, so a
                // point read decompresses one frame of one buffer.
                let level = transient_level(level);
                let mut buffers = Vec::with_capacity(n.buffers.len());
                for b in &n.buffers {
                    buffers.push(encode_buffer_frames(b, level, &mut info)?);
                }
                let info_raw = std::mem::take(&mut info.0);
                let info_len = len_u32(info_raw.len(), "partition 0")?;
                let mut stored = Vec::with_capacity(1 + buffers.len());
                stored.push((compress(info_raw, level)?, info_len));
                stored.extend(buffers);
                return assemble_node(version, id, 1, n.height, level, stored);
            }
            (1u8, n.height)
        }
        Node::Leaf(l) => {
            info.u32(len_u32(l.basements.len(), "basements")?);
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
            let info_len = len_u32(info_raw.len(), "partition 0")?;
            let mut stored = vec![(compress(info_raw, level)?, info_len)];
            stored.extend(framed);
            return assemble_node(version, id, 0, 0, level, stored);
        }
    };
    parts.insert(0, info.0);
    let level = transient_level(level);
    let mut stored: Vec<(Vec<u8>, u32)> = Vec::with_capacity(parts.len());
    for p in parts {
        let raw_len = len_u32(p.len(), "partition")?;
        stored.push((compress(p, level)?, raw_len));
    }
    assemble_node(version, id, kind, height, level, stored)
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
