#![allow(clippy::unwrap_used)]

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
        let p0 = index.parts[0];
        let raw = stored_partition(&enc, &p0, index.compressed);
        let info = decode_leaf_info(&raw, index.parts.len() - 1, "t").unwrap();
        assert_eq!(info.pivots, leaf.pivots);
        let tables = info.frames;
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
        let raw = stored_partition(&enc, &index.parts[0], index.compressed);
        let info = decode_internal_info(&raw, 3, index.compressed, "t").unwrap();
        let tables = info.tables;
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

/// `enc` with its u32 format version (bytes 8..12 of every record) set to `version` and the
/// checksum over the bytes `crc_over` (stored right after them) recomputed: a well-formed
/// record of another version.
fn with_version(mut enc: Vec<u8>, version: u32, crc_over: std::ops::Range<usize>) -> Vec<u8> {
    enc[8..12].copy_from_slice(&version.to_le_bytes());
    let crc = crc32c::crc32c(&enc[crc_over.clone()]);
    enc[crc_over.end..crc_over.end + 4].copy_from_slice(&crc.to_le_bytes());
    enc
}

fn is_unsupported<T: std::fmt::Debug>(r: Result<T>, found: u32) -> bool {
    matches!(r, Err(EngineError::UnsupportedVersion { found: f, supported: FORMAT_VERSION }) if f == found)
}

/// The format is frozen: headers, BTT blocks, node blocks and runs of any version but the
/// current one (older formats 1 to 3 included, which earlier builds wrote) are refused with
/// `UnsupportedVersion`, with valid checksums, never read as data or reported as damage.
#[test]
fn other_format_versions_are_refused() {
    for version in [1, 2, 3, FORMAT_VERSION + 1] {
        let h = Header {
            counter: 3,
            btt: BlockLoc {
                offset: 8192,
                size: 100,
                crc: 7,
            },
        };
        let header = with_version(encode_header(&h), version, 0..HEADER_BYTES - 4);
        assert!(
            is_unsupported(decode_header(&header), version),
            "header v{version}"
        );

        let btt = encode_btt(&BttImage {
            counter: 3,
            root: 1,
            next_msn: 10,
            next_node_id: 4,
            meta: None,
            entries: Vec::new(),
        });
        let n = btt.len();
        let btt = with_version(btt, version, 0..n - 4);
        assert!(is_unsupported(decode_btt(&btt, "t"), version), "BTT v{version}");

        for (id, node) in [(4, Node::Leaf(big_leaf())), (8, Node::Internal(big_internal()))] {
            let enc = encode_node(id, &node, Some(1)).unwrap();
            let hlen = node_header_len(&enc[..NODE_FIXED_HEADER_BYTES], "t").unwrap();
            let enc = with_version(enc, version, 0..hlen - 4);
            assert!(
                is_unsupported(decode_node(&enc, id, "t"), version),
                "node v{version}"
            );
            assert!(
                is_unsupported(decode_node_index(&enc[..hlen], id, "t"), version),
                "node index v{version}"
            );
            assert!(
                is_unsupported(decode_leaf_skeleton(&enc, id, "t"), version),
                "skeleton v{version}"
            );
        }

        let run = with_version(
            encode_run(7, &run_msgs(), Some(1)).unwrap(),
            version,
            0..RUN_FIXED_HEADER_BYTES - 4,
        );
        assert!(
            is_unsupported(run_index_len(&run[..RUN_FIXED_HEADER_BYTES], 7, "t"), version),
            "run header v{version}"
        );
        assert!(
            is_unsupported(decode_run_range(&run, 7, "t", &[], None), version),
            "run v{version}"
        );
    }
    // The current version with the same helper still decodes (the helper changes nothing else).
    let run = encode_run(7, &run_msgs(), Some(1)).unwrap();
    let same = with_version(run.clone(), FORMAT_VERSION, 0..RUN_FIXED_HEADER_BYTES - 4);
    assert_eq!(same, run);
}
