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
