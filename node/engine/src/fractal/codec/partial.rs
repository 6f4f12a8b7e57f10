//! Partial reads: one partition or one frame of a node without the rest of its block.

use super::*;

/// One row of a node's partition table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PartEntry {
    /// Offset from the block start.
    pub(crate) offset: u32,
    /// Stored (possibly compressed) length.
    pub(crate) len: u32,
    /// Uncompressed length.
    pub(crate) raw_len: u32,
    /// crc32c of the stored bytes.
    pub(crate) crc: u32,
}

/// A node's header: what a partial read needs to locate one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NodeIndex {
    /// 0 for leaves.
    pub(crate) height: u32,
    /// Partitions are zstd-compressed.
    pub(crate) compressed: bool,
    /// Partition table (partition 0 = pivots).
    pub(crate) parts: Vec<PartEntry>,
}

/// Total header length announced by the fixed part of a node header.
pub(crate) fn node_header_len(fixed: &[u8], location: &(impl std::fmt::Display + ?Sized)) -> Result<usize> {
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

/// Uncompressed and stored bytes of an encoded node block (header included in both), read from
/// its partition table; `None` for a block that is not a well-formed node (a spilled run).
/// For the compression ratio; never used to read data.
pub(crate) fn node_block_sizes(enc: &[u8]) -> Option<(u64, u64)> {
    let mut r = R::new(enc);
    let sizes = (|| -> Result<(u64, u64), Detail> {
        if r.take(8)? != NODE_MAGIC {
            return Err("not a node".into());
        }
        r.take(20)?;
        let nparts = r.u32()?;
        let header_len = u64::from(r.u32()?);
        r.take(4)?;
        let (mut raw, mut stored) = (header_len, header_len);
        for _ in 0..nparts {
            let _offset = r.u32()?;
            stored += u64::from(r.u32()?);
            raw += u64::from(r.u32()?);
            let _crc = r.u32()?;
        }
        Ok((raw, stored))
    })();
    sizes.ok()
}

/// Decodes and verifies (crc32c) a whole node header.
pub(crate) fn decode_node_index(
    header: &[u8],
    expect_id: NodeId,
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<NodeIndex> {
    let body = verify_trailing_crc(header, location)?;
    let mut r = R::new(body);
    let res = (|| -> Result<Result<NodeIndex>, Detail> {
        if let Err(e) = read_prelude(&mut r, NODE_MAGIC, "node")? {
            return Ok(Err(e));
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
            height,
            compressed,
            parts,
        }))
    })();
    res.map_err(|d| corruption(location, d))?
}

/// Verifies and decompresses one stored partition.
pub(crate) fn decode_partition(
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

/// One frame of a basement, from its leaf's partition 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeafFrame {
    /// Key of the frame's first entry.
    pub(crate) first_key: Vec<u8>,
    /// Entries in the frame.
    pub(crate) entries: u32,
    /// Offset of the stored bytes from the start of the basement's partition.
    pub(crate) offset: u32,
    /// Stored (possibly compressed) length in bytes.
    pub(crate) stored_len: u32,
    /// Uncompressed length in bytes.
    pub(crate) raw_len: u32,
    /// crc32c of the stored bytes.
    pub(crate) crc: u32,
}

/// The frame table of one basement.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct BasementFrames {
    /// The basement's applied MSN.
    pub(crate) max_msn: Msn,
    /// Entries in the basement.
    pub(crate) entries: u32,
    /// Frames in key order.
    pub(crate) frames: Vec<LeafFrame>,
    /// [`key_prefix`] of each frame's first key, for [`BasementFrames::frame_for`].
    pub(crate) first_key_prefixes: Vec<u64>,
}

impl BasementFrames {
    /// The frame that can hold `key`: the last one starting at or below it; `None` when `key`
    /// sorts before every entry (then the basement does not hold it).
    pub(crate) fn frame_for(&self, key: &[u8]) -> Option<usize> {
        debug_assert_eq!(self.first_key_prefixes.len(), self.frames.len());
        count_at_or_below(&self.first_key_prefixes, key, |i| {
            self.frames.get(i).is_some_and(|f| f.first_key.as_slice() <= key)
        })
        .checked_sub(1)
    }

    /// Bytes this table takes in memory (for cache accounting).
    pub(crate) fn size_bytes(&self) -> usize {
        32 + self.frames.iter().map(|f| 56 + f.first_key.len()).sum::<usize>()
    }

    /// Checks that the frames add up to the partition's stored and raw lengths.
    pub(crate) fn check_partition(&self, stored_len: usize, raw_len: usize) -> Result<(), Detail> {
        let lens = self.frames.iter().map(|f| (f.stored_len, f.raw_len));
        check_frame_lengths(lens, stored_len, raw_len, "frames")
    }
}

/// Reads the `n` basements' frame tables from a leaf's partition 0.
pub(crate) fn read_frame_tables(r: &mut R<'_>, n: usize) -> Result<Vec<BasementFrames>, Detail> {
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
/// lengths from its index, checked against `crc`, decompressed when `compressed`.
pub(crate) fn unpack_frame(
    data: &[u8],
    at: usize,
    (stored_len, raw_len): (u32, u32),
    crc: u32,
    compressed: bool,
    n: usize,
) -> Result<Vec<u8>, Detail> {
    let stored = data
        .get(at..at.saturating_add(stored_len as usize))
        .ok_or_else(|| format!("frame {n} truncated"))?;
    if crc32c::crc32c(stored) != crc {
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
pub(crate) fn for_each_frame_entry(
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
pub(crate) fn decode_frames(
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
            f.crc,
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

/// A leaf's partition 0: the basement pivots and each basement's frame table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LeafInfo {
    /// Pivots between the basements.
    pub(crate) pivots: Vec<Vec<u8>>,
    /// Frame tables, one per basement.
    pub(crate) frames: Vec<BasementFrames>,
}

/// The skeleton of a leaf block (its partition table and partition 0: basement pivots and frame
/// tables), parsed from the whole encoded block `block` of node `id`; `Ok(None)` for an internal
/// node. Checks the header and partition 0 crcs.
pub(crate) fn decode_leaf_skeleton(
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
    let (Some(&p0), true) = (index.parts.first(), index.height == 0 && index.parts.len() >= 2) else {
        return Ok(None);
    };
    let data = block
        .get(p0.offset as usize..(p0.offset as usize).saturating_add(p0.len as usize))
        .ok_or_else(|| corruption(location, "partition 0 out of bounds"))?;
    let raw = decode_partition(data, &p0, index.compressed, location)?;
    let info = decode_leaf_info(&raw, index.parts.len() - 1, location)?;
    Ok(Some((index, info)))
}

/// Decodes a leaf's partition 0 (`basements` data partitions).
pub(crate) fn decode_leaf_info(
    raw: &[u8],
    basements: usize,
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
        let frames = read_frame_tables(&mut r, n)?;
        r.done()?;
        Ok(LeafInfo { pivots, frames })
    })();
    res.map_err(|d| corruption(location, d))
}

/// Decodes frame `frame` of a basement from its stored bytes `data`: a basement
/// holding that frame's entries, with the whole basement's applied MSN.
pub(crate) fn decode_basement_frame(
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
pub(crate) fn lookup_in_frame(
    data: &[u8],
    bf: &BasementFrames,
    frame: usize,
    compressed: bool,
    key: &[u8],
    location: &(impl std::fmt::Display + ?Sized),
) -> Result<Option<Vec<u8>>> {
    let scan = || -> Result<Option<Vec<u8>>, Detail> {
        let f = bf.frames.get(frame).ok_or("frame out of range")?;
        let raw = unpack_frame(data, 0, (f.stored_len, f.raw_len), f.crc, compressed, frame)?;
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
