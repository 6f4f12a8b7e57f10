#![allow(clippy::unwrap_used)]

use std::path::Path;

use ftkv_vfs::{FaultVfs, Vfs};

use super::*;
use crate::fractal::codec::encode_run;
use crate::fractal::msg::PointOp;

fn msgs() -> Vec<Msg> {
    (0..3000u32)
        .map(|i| Msg::Point {
            msn: u64::from(i) + 1,
            key: format!("key{i:06}").into_bytes(),
            op: PointOp::Put(vec![b'a' + (i % 26) as u8; 60]),
        })
        .collect()
}

/// A run read by key range from the store returns exactly its messages in the range, reading
/// only frames; a flipped bit in its payload is `Corruption` (through the frame crc), never
/// data.
#[test]
fn runs_read_by_range_and_catch_flips() {
    let vfs = FaultVfs::new(5);
    vfs.create_dir_all(Path::new("/s")).unwrap();
    let file = vfs.open(Path::new("/s/tree"), true).unwrap();
    let mut store = Store::new(file, "/s/tree".into(), Some(1), 1 << 20, None, None);
    let all = msgs();
    store.write_run(10, encode_run(10, &all, None).unwrap()).unwrap();
    store
        .write_run(11, encode_run(11, &all, Some(1)).unwrap())
        .unwrap();
    let (lo, hi) = (b"key001000".to_vec(), b"key001100".to_vec());
    let want: Vec<Msg> = all[1000..1100].to_vec();
    for id in [10, 11] {
        assert_eq!(
            store.read_run_range(id, &lo, Some(&hi)).unwrap(),
            want,
            "run {id}"
        );
        let mut one = Vec::new();
        store.run_msgs_for_key(id, b"key002345", &mut one).unwrap();
        assert_eq!(one, vec![all[2345].clone()], "run {id}");
    }
    let st = store.partial_stats();
    assert_eq!((st.run_whole_reads, st.run_frame_reads), (0, 4), "{st:?}");
    // Flip one bit in the middle of each run's payload (past headers and index).
    for id in [10, 11] {
        let loc = store.btt[&id];
        let at = loc.offset + u64::from(loc.size) / 2;
        vfs.inject_bytes(Path::new("/s/tree"), at, &[0x5a]).unwrap();
        // The frame holding the middle byte of the block is read: it reports corruption.
        let mut hits = 0;
        for i in (0..3000usize).step_by(25) {
            let k = format!("key{i:06}").into_bytes();
            let mut out = Vec::new();
            match store.run_msgs_for_key(id, &k, &mut out) {
                Err(EngineError::Corruption { .. }) => hits += 1,
                Ok(()) => assert_eq!(out, vec![all[i].clone()], "run {id}: wrong data returned"),
                Err(e) => panic!("run {id}: {e}"),
            }
        }
        assert!(hits > 0, "run {id}: a damaged payload byte went unnoticed");
    }
}
