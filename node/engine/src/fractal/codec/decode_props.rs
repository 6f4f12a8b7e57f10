//! Property tests of every block kind's decoder: arbitrary bytes behind a valid magic, version
//! and checksum decode to an error or a value, never a panic, and never an allocation sized by
//! an untrusted count (a count of 2^32 or 2^64 would abort the test process).
#![allow(clippy::unwrap_used, clippy::indexing_slicing)]

use proptest::prelude::*;

use super::*;

/// `magic`, the current version, `body`, then a crc32c of everything before.
fn with_prelude_and_crc(magic: &[u8; 8], version: u32, body: &[u8]) -> Vec<u8> {
    let mut w = W::default();
    w.0.extend_from_slice(magic);
    w.u32(version);
    w.0.extend_from_slice(body);
    let crc = crc32c::crc32c(&w.0);
    w.u32(crc);
    w.0
}

/// A run block: a valid fixed header (crc included), `index` behind a valid crc, then `frames`.
fn run_block(id: u64, nframes: u32, msgs: u32, index: &[u8], frames: &[u8]) -> Vec<u8> {
    let mut idx = W(index.to_vec());
    let icrc = crc32c::crc32c(&idx.0);
    idx.u32(icrc);
    let mut w = W::default();
    w.0.extend_from_slice(RUN_MAGIC);
    w.u32(FORMAT_VERSION);
    w.u64(id);
    w.u8(0);
    w.0.extend_from_slice(&[0, 0, 0]);
    w.u32(nframes);
    w.u32(msgs);
    w.u32(idx.0.len() as u32);
    let crc = crc32c::crc32c(&w.0);
    w.u32(crc);
    w.0.extend_from_slice(&idx.0);
    w.0.extend_from_slice(frames);
    w.0
}

/// Runs every decoder a node block meets (whole, skeleton, index, partitions) over `block`.
fn decode_node_every_way(block: &[u8], id: NodeId, buffers: usize) {
    let _ = decode_node(block, id, "prop");
    let _ = decode_leaf_skeleton(block, id, "prop");
    let Some(fixed) = block.get(..NODE_FIXED_HEADER_BYTES) else {
        return;
    };
    let Ok(len) = node_header_len(fixed, "prop") else {
        return;
    };
    let Some(header) = block.get(..len) else {
        return;
    };
    let Ok(index) = decode_node_index(header, id, "prop") else {
        return;
    };
    for (i, e) in index.parts.iter().enumerate() {
        let Some(data) = block.get(e.offset as usize..(e.offset as usize).saturating_add(e.len as usize))
        else {
            continue;
        };
        let Ok(raw) = decode_partition(data, e, index.compressed, "prop") else {
            continue;
        };
        // Data partitions are frames: decode_node above decodes them through partition 0's tables.
        if i == 0 {
            let _ = decode_internal_info(&raw, buffers, index.compressed, "prop");
            let _ = decode_leaf_info(&raw, buffers, "prop");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn header_slot_never_panics(version in 0u32..8, body in proptest::collection::vec(any::<u8>(), 0..80)) {
        let mut slot = with_prelude_and_crc(HEADER_MAGIC, version, &body);
        slot.resize(HEADER_SLOT_BYTES as usize, 0);
        let _ = decode_header(&slot);
        // The crc where a header of this length keeps it.
        let mut fixed = body.clone();
        fixed.resize(HEADER_BYTES - 16, 0);
        let _ = decode_header(&with_prelude_and_crc(HEADER_MAGIC, version, &fixed));
    }

    #[test]
    fn btt_never_panics(body in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_btt(&with_prelude_and_crc(BTT_MAGIC, FORMAT_VERSION, &body), "prop");
    }

    #[test]
    fn btt_with_hostile_counts_is_an_error(
        meta_tag in 0u8..3,
        meta_len in any::<u32>(),
        entries in any::<u64>(),
        tail in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        let mut w = W::default();
        w.u32(0);
        for v in [1u64, 2, 3, 4] {
            w.u64(v);
        }
        w.u8(meta_tag);
        if meta_tag == 1 {
            w.u32(meta_len);
        }
        w.u64(entries);
        w.0.extend_from_slice(&tail);
        let block = with_prelude_and_crc(BTT_MAGIC, FORMAT_VERSION, &w.0);
        let r = decode_btt(&block, "prop");
        // Only a count that matches the bytes present decodes.
        if let Ok(img) = r {
            prop_assert_eq!(img.entries.len() as u64, entries);
        }
    }

    #[test]
    fn node_with_arbitrary_partitions_never_panics(
        kind in 0u8..3,
        height in 0u32..4,
        parts in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), 1..5),
    ) {
        let stored: Vec<(Vec<u8>, u32)> = parts.iter().map(|p| (p.clone(), p.len() as u32)).collect();
        let block = assemble_node(FORMAT_VERSION, 7, kind, height, None, stored).unwrap();
        decode_node_every_way(&block, 7, parts.len() - 1);
    }

    #[test]
    fn compressed_node_with_arbitrary_partitions_never_panics(
        kind in 0u8..2,
        parts in proptest::collection::vec(
            (proptest::collection::vec(any::<u8>(), 0..120), 0u32..(1 << 20)), 1..4),
    ) {
        let block = assemble_node(FORMAT_VERSION, 9, kind, u32::from(kind), Some(1), parts.clone()).unwrap();
        decode_node_every_way(&block, 9, parts.len() - 1);
    }

    #[test]
    fn node_bytes_behind_a_valid_header_crc_never_panic(body in proptest::collection::vec(any::<u8>(), 0..400)) {
        // Arbitrary bytes after the magic and version, the header crc fixed up where the
        // announced header length puts it.
        let mut block = with_prelude_and_crc(NODE_MAGIC, FORMAT_VERSION, &body);
        if let Ok(len) = node_header_len(block.get(..NODE_FIXED_HEADER_BYTES).unwrap_or_default(), "prop") {
            if len >= 4 && len <= block.len() {
                let crc = crc32c::crc32c(&block[..len - 4]);
                block[len - 4..len].copy_from_slice(&crc.to_le_bytes());
            }
        }
        decode_node_every_way(&block, 1, 3);
    }

    #[test]
    fn run_with_arbitrary_index_never_panics(
        nframes in any::<u32>(),
        msgs in any::<u32>(),
        index in proptest::collection::vec(any::<u8>(), 0..200),
        frames in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let block = run_block(5, nframes, msgs, &index, &frames);
        let _ = decode_run_range(&block, 5, "prop", &[], None);
        let _ = decode_run_range(&block, 5, "prop", b"m", Some(b"q"));
    }

    #[test]
    fn run_frame_with_arbitrary_messages_never_panics(
        first_key in proptest::collection::vec(any::<u8>(), 0..8),
        count in any::<u32>(),
        frame in proptest::collection::vec(any::<u8>(), 0..300),
    ) {
        // One frame whose row and crc are right; its messages are arbitrary bytes.
        let mut row = W::default();
        row.bytes(&first_key);
        row.u32(count);
        row.u32(frame.len() as u32);
        row.u32(frame.len() as u32);
        row.u32(crc32c::crc32c(&frame));
        let block = run_block(5, 1, count, &row.0, &frame);
        let _ = decode_run_range(&block, 5, "prop", &[], None);
    }

    #[test]
    fn partitions_of_arbitrary_raw_bytes_never_panic(raw in proptest::collection::vec(any::<u8>(), 0..300), n in 0usize..20) {
        let _ = decode_leaf_info(&raw, n, "prop");
        let _ = decode_internal_info(&raw, n, false, "prop");
        let _ = decode_internal_info(&raw, n, true, "prop");
    }
}
