#![allow(clippy::unwrap_used)]
//! Fractal-tree specific tests: shape (height, edge splits), integrity after every batch,
//! space reuse, corruption detection (issue 3, acceptance 3) and instant range messages.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use ftkv_engine::model::apply_ops;
use ftkv_engine::{Engine, EngineError, EngineKind, UpsertOp, WriteOp};
use ftkv_engine::{FractalEngine, FractalOptions, TreeParams, TREE_FILE_NAME};
use ftkv_vfs::{FaultVfs, Vfs};
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, TestRng, TestRunner};

fn key(i: u64) -> Vec<u8> {
    format!("key{i:08}").into_bytes()
}

/// Random batches with a full comparison and `check_integrity` after every batch.
#[test]
fn random_batches_keep_every_invariant() {
    for seed in 0..6u64 {
        let mut runner = TestRunner::new_with_rng(
            Config::default(),
            TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &[seed as u8; 32]),
        );
        let cache = if seed % 2 == 0 { 4 << 10 } else { 1 << 20 };
        let mut s = Subject::new(EngineKind::Fractal, SMALL, cache, (seed % 3 == 0).then_some(1));
        let mut model = BTreeMap::new();
        let strat = proptest::collection::vec(write_op_strategy(), 1..30);
        for step in 0..120 {
            let ops = strat.new_tree(&mut runner).unwrap().current();
            s.e().write(&ops, None).unwrap();
            apply_ops(&mut model, &ops);
            if let Err(e) = s.e().check_integrity() {
                panic!("seed {seed} step {step}: {e}\nops {ops:?}");
            }
            assert_eq!(dump(s.e()), model, "seed {seed} step {step} ops {ops:?}");
            if step % 17 == 0 {
                s.e().checkpoint().unwrap();
            }
            if step % 41 == 40 {
                s.e().checkpoint().unwrap();
                s.open().unwrap();
                assert_eq!(dump(s.e()), model, "seed {seed} step {step} after reopen");
            }
        }
    }
}

/// Enough random inserts with tiny nodes grow the tree to at least three levels; every key reads
/// back, before and after a checkpoint + reopen.
#[test]
fn tree_grows_to_three_levels_and_reads_back() {
    let mut s = Subject::new(EngineKind::Fractal, SMALL, 64 << 10, Some(1));
    let mut model = BTreeMap::new();
    let mut x: u64 = 12345;
    for _ in 0..40 {
        let mut ops = Vec::new();
        for _ in 0..50 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ops.push(WriteOp::Put {
                key: key(x >> 40),
                value: vec![(x >> 8) as u8; 20],
            });
        }
        s.e().write(&ops, Some(b"m")).unwrap();
        apply_ops(&mut model, &ops);
    }
    let report = s.e().check_integrity().unwrap();
    assert!(
        report.height >= 3,
        "height {} with {} keys",
        report.height,
        model.len()
    );
    assert_eq!(report.keys, model.len() as u64);
    for (k, v) in &model {
        assert_eq!(s.e().get(k).unwrap().as_ref(), Some(v));
    }
    s.e().checkpoint().unwrap();
    s.open().unwrap();
    assert_eq!(dump(s.e()), model);
    assert_eq!(s.e().meta().unwrap(), Some(b"m".to_vec()));
    assert!(s.e().check_integrity().unwrap().height >= 3);
}

/// Sequential inserts split the right edge unevenly: leaves stay nearly full, so the tree needs
/// clearly fewer nodes than for the same keys inserted in random order (even splits).
#[test]
fn sequential_inserts_leave_full_leaves() {
    let nodes_after = |order: &dyn Fn(u64) -> u64| {
        let s = Subject::new(EngineKind::Fractal, SMALL, 1 << 20, None);
        for b in 0..40u64 {
            let ops: Vec<WriteOp> = (0..50)
                .map(|i| WriteOp::Put {
                    key: key(order(b * 50 + i)),
                    value: vec![1; 20],
                })
                .collect();
            s.e().write(&ops, None).unwrap();
        }
        let report = s.e().check_integrity().unwrap();
        assert_eq!(report.keys, 2000);
        report.blocks
    };
    let sequential = nodes_after(&|i| i);
    let random = nodes_after(&|i| (i * 7919) % 2000);
    assert!(
        sequential * 4 < random * 3,
        "sequential {sequential} nodes, random {random}"
    );
}

/// A steady overwrite workload with checkpoints reuses freed blocks: the file stops growing.
#[test]
fn overwrites_do_not_grow_the_file() {
    let s = Subject::new(EngineKind::Fractal, SMALL, 1 << 20, None);
    let mut sizes = Vec::new();
    for round in 0..30u64 {
        let ops: Vec<WriteOp> = (0..300)
            .map(|i| WriteOp::Put {
                key: key(i),
                value: vec![round as u8; 30],
            })
            .collect();
        s.e().write(&ops, None).unwrap();
        s.e().checkpoint().unwrap();
        sizes.push(s.e().size_on_disk_bytes().unwrap());
    }
    let early = sizes[5];
    let late = *sizes.last().unwrap();
    assert!(late <= early * 2, "file grew from {early} to {late}: {sizes:?}");
    s.e().check_integrity().unwrap();
}

/// DeleteRange and a broadcast over many keys are single messages: O(1) to inject.
#[test]
fn range_messages_are_instant_and_correct() {
    let s = Subject::new(
        EngineKind::Fractal,
        TreeParams {
            node_size_bytes: 64 << 10,
            basement_size_bytes: 4 << 10,
            fanout: 16,
        },
        64 << 20,
        None,
    );
    let ops: Vec<WriteOp> = (0..20_000)
        .map(|i| WriteOp::Put {
            key: key(i),
            value: 1i64.to_le_bytes().to_vec(),
        })
        .collect();
    s.e().write(&ops, None).unwrap();
    let t = std::time::Instant::now();
    s.e()
        .write(
            &[WriteOp::UpsertRange {
                start: vec![],
                end: None,
                op: UpsertOp::Add(41),
            }],
            None,
        )
        .unwrap();
    s.e()
        .write(
            &[WriteOp::DeleteRange {
                start: key(5_000),
                end: Some(key(15_000)),
            }],
            None,
        )
        .unwrap();
    let took = t.elapsed();
    assert!(took.as_millis() < 200, "range messages took {took:?}");
    assert_eq!(s.e().get(&key(1)).unwrap(), Some(42i64.to_le_bytes().to_vec()));
    assert_eq!(s.e().get(&key(7_000)).unwrap(), None);
    assert_eq!(
        s.e().get(&key(15_000)).unwrap(),
        Some(42i64.to_le_bytes().to_vec())
    );
    assert_eq!(s.e().check_integrity().unwrap().keys, 10_000);
}

/// Without the cleaner thread (as every helper here): these tests count reads and spills, or
/// expect a fault on a read they make, not on a background flush.
fn fault_engine(vfs: &Arc<FaultVfs>, params: TreeParams) -> ftkv_engine::Result<FractalEngine> {
    FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &opts("/engine".into(), 1 << 20, Some(1)),
        FractalOptions {
            tree: params,
            cleaner_period_ms: None,
        },
    )
}

/// Acceptance 3: flip one bit in every byte position of every node block (sampled) of a
/// checkpointed tree; every read that touches the block reports `Corruption`, never data.
#[test]
fn flipped_bits_are_reported_as_corruption() {
    let vfs = FaultVfs::new(1);
    let mut model = BTreeMap::new();
    {
        let e = fault_engine(&vfs, SMALL).unwrap();
        let ops: Vec<WriteOp> = (0..400)
            .map(|i| WriteOp::Put {
                key: key(i * 7),
                value: vec![i as u8; 25],
            })
            .collect();
        e.write(&ops, Some(b"meta")).unwrap();
        apply_ops(&mut model, &ops);
        e.checkpoint().unwrap();
    }
    let path = std::path::PathBuf::from("/engine").join(TREE_FILE_NAME);
    let len = vfs.durable_len(&path).unwrap();
    let file = vfs.open(&path, false).unwrap();
    let mut image = vec![0u8; len as usize];
    file.read_exact_at(&mut image, 0).unwrap();
    drop(file);
    let mut detected = 0;
    let mut silent_ok = 0;
    // Every 97th byte from the block area on (headers have their own test).
    for pos in (8192..len).step_by(97) {
        let orig = image[pos as usize];
        vfs.inject_bytes(&path, pos, &[orig ^ 0x04]).unwrap();
        match fault_engine(&vfs, SMALL) {
            Err(EngineError::Corruption { .. }) => detected += 1,
            Err(other) => panic!("byte {pos}: unexpected error {other}"),
            Ok(e) => {
                // Point reads first: uncached leaves are read one basement at a time.
                let mut read_error = false;
                for (k, v) in &model {
                    match e.get(k) {
                        Ok(got) => assert_eq!(got.as_ref(), Some(v), "byte {pos}: wrong value for {k:?}"),
                        Err(EngineError::Corruption { .. }) => {
                            read_error = true;
                            break;
                        }
                        Err(other) => panic!("byte {pos}: unexpected error {other}"),
                    }
                }
                if read_error {
                    detected += 1;
                } else {
                    let e = fault_engine(&vfs, SMALL).unwrap();
                    match e.check_integrity() {
                        Err(EngineError::Corruption { location, .. }) => {
                            assert!(
                                location.contains("block") || location.contains("BTT"),
                                "{location}"
                            );
                            detected += 1;
                        }
                        Err(other) => panic!("byte {pos}: unexpected error {other}"),
                        // The flip hit free space: every byte of data must still be right.
                        Ok(_) => {
                            assert_eq!(dump(&e), model, "byte {pos}: wrong data returned");
                            silent_ok += 1;
                        }
                    }
                }
            }
        }
        vfs.inject_bytes(&path, pos, &[orig]).unwrap();
    }
    assert!(detected > 10, "detected {detected}, unaffected {silent_ok}");
    let e = fault_engine(&vfs, SMALL).unwrap();
    assert_eq!(dump(&e), model);
}

/// A damaged newest header falls back to the previous checkpoint.
#[test]
fn torn_newest_header_falls_back_to_previous_checkpoint() {
    let vfs = FaultVfs::new(2);
    let e = fault_engine(&vfs, SMALL).unwrap();
    e.write(
        &[WriteOp::Put {
            key: b"a".to_vec(),
            value: b"1".to_vec(),
        }],
        Some(b"one"),
    )
    .unwrap();
    e.checkpoint().unwrap(); // counter 2 -> slot 0
    e.write(
        &[WriteOp::Put {
            key: b"a".to_vec(),
            value: b"2".to_vec(),
        }],
        Some(b"two"),
    )
    .unwrap();
    e.checkpoint().unwrap(); // counter 3 -> slot 1
    drop(e);
    let path = std::path::PathBuf::from("/engine").join(TREE_FILE_NAME);
    vfs.inject_bytes(&path, 4096 + 20, &[0xff, 0xee]).unwrap();
    let e = fault_engine(&vfs, SMALL).unwrap();
    assert_eq!(e.get(b"a").unwrap(), Some(b"1".to_vec()));
    assert_eq!(e.meta().unwrap(), Some(b"one".to_vec()));
    e.check_integrity().unwrap();
}

/// The format is frozen: a tree file whose headers are of an older format version (3, as
/// earlier builds wrote them; valid magic and checksum) is refused at open with
/// `UnsupportedVersion`, not read and not reported as corruption.
#[test]
fn older_format_versions_are_refused_at_open() {
    let vfs = FaultVfs::new(4);
    let e = fault_engine(&vfs, SMALL).unwrap();
    e.write(
        &[WriteOp::Put {
            key: b"a".to_vec(),
            value: b"1".to_vec(),
        }],
        None,
    )
    .unwrap();
    e.checkpoint().unwrap();
    drop(e);
    let path = std::path::PathBuf::from("/engine").join(TREE_FILE_NAME);
    let file = vfs.open(&path, false).unwrap();
    for slot in [0u64, 4096] {
        let mut header = [0u8; 64];
        file.read_exact_at(&mut header, slot).unwrap();
        assert_eq!(&header[8..12], &4u32.to_le_bytes(), "the current format is 4");
        header[8..12].copy_from_slice(&3u32.to_le_bytes());
        let crc = crc32c::crc32c(&header[..60]);
        header[60..].copy_from_slice(&crc.to_le_bytes());
        vfs.inject_bytes(&path, slot, &header).unwrap();
    }
    match fault_engine(&vfs, SMALL) {
        Err(EngineError::UnsupportedVersion {
            found: 3,
            supported: 4,
        }) => {}
        Err(e) => panic!("expected UnsupportedVersion, got {e}"),
        Ok(_) => panic!("a version-3 tree was opened"),
    }
}

/// Readers on several threads run beside the writer (shared lock on cached paths, exclusive
/// on misses); every read sees a whole batch: all keys of a read carry one round's value.
#[test]
fn concurrent_readers_see_whole_batches() {
    let s = Subject::new(EngineKind::Fractal, SMALL, 16 << 10, None);
    let engine: Arc<dyn Engine> = Arc::from(s.engine.unwrap());
    let keys: Vec<Vec<u8>> = (0..60).map(key).collect();
    let put_round = |round: u64| -> Vec<WriteOp> {
        keys.iter()
            .map(|k| WriteOp::Put {
                key: k.clone(),
                value: round.to_le_bytes().to_vec(),
            })
            .collect()
    };
    engine.write(&put_round(0), None).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let e = engine.clone();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let all = e.scan(b"", None, usize::MAX).unwrap();
                    assert_eq!(all.len(), 60);
                    let first = &all[0].1;
                    assert!(all.iter().all(|(_, v)| v == first), "a scan saw two rounds");
                    let v = e.get(&key(reads % 60)).unwrap().unwrap();
                    assert_eq!(v.len(), 8);
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for round in 1..300u64 {
        engine.write(&put_round(round), None).unwrap();
        if round % 50 == 0 {
            engine.checkpoint().unwrap();
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let total: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(total > 0);
    engine.check_integrity().unwrap();
}

/// `open_engine` (the node's entry point) opens each kind; the fractal tree on the real file
/// system keeps data and meta across a reopen.
#[test]
fn open_engine_opens_every_kind() {
    let tmp = tempfile::tempdir().unwrap();
    for kind in [EngineKind::Fractal, EngineKind::Sled, EngineKind::Model] {
        let o = opts(tmp.path().join(kind.as_str()), 1 << 20, Some(3));
        let e = ftkv_engine::open_engine(kind, &o).unwrap();
        assert_eq!(e.kind(), kind);
        e.write(
            &[WriteOp::Put {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
            }],
            Some(b"m"),
        )
        .unwrap();
        e.checkpoint().unwrap();
        drop(e);
        if kind == EngineKind::Fractal {
            let e = ftkv_engine::open_engine(kind, &o).unwrap();
            assert_eq!(e.get(b"k").unwrap(), Some(b"v".to_vec()));
            assert_eq!(e.meta().unwrap(), Some(b"m".to_vec()));
            assert!(e.size_on_disk_bytes().unwrap() > 0);
        }
    }
}

/// Scans with small limits over buffers holding many more keys than one page (a scan pass takes
/// a bounded number of keys per buffer and resumes after them): every page equals the model's.
#[test]
fn paged_scans_over_full_buffers_match_the_model() {
    let params = TreeParams {
        node_size_bytes: 128 << 10,
        basement_size_bytes: 4 << 10,
        fanout: 4,
    };
    let s = Subject::new(EngineKind::Fractal, params, 64 << 20, None);
    let mut model = BTreeMap::new();
    let mut x: u64 = 99;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    for round in 0..6u64 {
        let mut ops = Vec::new();
        for _ in 0..5000 {
            let k = key(next() % 20000);
            ops.push(match next() % 8 {
                0 | 1 => WriteOp::Delete { key: k },
                2 => WriteOp::Upsert {
                    key: k,
                    op: UpsertOp::Append(b"+".to_vec()),
                },
                _ => WriteOp::Put {
                    key: k,
                    value: format!("v{round}-{}", next()).into_bytes(),
                },
            });
        }
        if round == 3 {
            ops.push(WriteOp::DeleteRange {
                start: key(1000),
                end: Some(key(1100)),
            });
        }
        s.e().write(&ops, None).unwrap();
        apply_ops(&mut model, &ops);
    }
    // A run of buffered point deletes longer than a scan pass takes from one buffer.
    let deletes: Vec<WriteOp> = (5000..5600).map(|i| WriteOp::Delete { key: key(i) }).collect();
    s.e().write(&deletes, None).unwrap();
    apply_ops(&mut model, &deletes);
    let report = s.e().check_integrity().unwrap();
    // The deletes must sit in a buffer above the leaves for the scan passes to be exercised.
    assert!(report.height >= 2, "{report:?}");
    let all: Vec<(Vec<u8>, Vec<u8>)> = model.into_iter().collect();
    for limit in [1usize, 7, 64, 65, 200, 5000] {
        for start in [0u64, 1, 999, 1050, 2500, 4990, 5000, 5300, 7777, 15000, 19999] {
            let sk = key(start);
            let want: Vec<_> = all
                .iter()
                .filter(|(k, _)| *k >= sk)
                .take(limit)
                .cloned()
                .collect();
            assert_eq!(
                s.e().scan(&sk, None, limit).unwrap(),
                want,
                "limit {limit} start {start}"
            );
            let ek = key(start + 300);
            let want: Vec<_> = all
                .iter()
                .filter(|(k, _)| *k >= sk && *k < ek)
                .take(limit)
                .cloned()
                .collect();
            assert_eq!(
                s.e().scan(&sk, Some(&ek), limit).unwrap(),
                want,
                "limit {limit} start {start} bounded"
            );
        }
    }
    // Walk everything in pages of 10.
    let mut cursor = Vec::new();
    let mut got = Vec::new();
    loop {
        let page = s.e().scan(&cursor, None, 10).unwrap();
        got.extend(page.iter().cloned());
        match page.last() {
            Some((k, _)) if page.len() == 10 => {
                cursor = k.clone();
                cursor.push(0);
            }
            _ => break,
        }
    }
    assert_eq!(got, all);
}

/// Opens a fractal engine in `/engine` on `vfs` with `params`, a cache of `cache_bytes` and
/// zstd level 1.
fn open_on(vfs: &Arc<FaultVfs>, params: TreeParams, cache_bytes: u64) -> FractalEngine {
    FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &opts("/engine".into(), cache_bytes, Some(1)),
        FractalOptions {
            tree: params,
            cleaner_period_ms: None,
        },
    )
    .unwrap()
}

/// `count` random writes over keys `0..keys` from the LCG state `x`: one in `delete_one_in`
/// deletes, one in `delete_one_in` an upsert `upsert`, the rest puts of `round`-tagged values.
fn random_writes(
    x: &mut u64,
    count: usize,
    keys: u64,
    delete_one_in: u64,
    upsert: &UpsertOp,
    round: u64,
) -> Vec<WriteOp> {
    (0..count)
        .map(|_| {
            *x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let k = key((*x >> 33) % keys);
            match *x % delete_one_in {
                0 => WriteOp::Delete { key: k },
                1 => WriteOp::Upsert {
                    key: k,
                    op: upsert.clone(),
                },
                _ => WriteOp::Put {
                    key: k,
                    value: format!("v{round}-{}", *x % 1000).into_bytes(),
                },
            }
        })
        .collect()
}

/// Point reads through internal nodes and leaves that are not cached read partition 0 and one
/// buffer (when its stored key filter lets the key through) or one basement frame, never the
/// whole node, and return exactly the model's values (including keys only pending in buffers).
#[test]
fn point_reads_beyond_the_cache_read_single_partitions() {
    let params = TreeParams {
        node_size_bytes: 64 << 10,
        basement_size_bytes: 4 << 10,
        fanout: 4,
    };
    let vfs = FaultVfs::new(3);
    let open = |cache: u64| open_on(&vfs, params, cache);
    let e = open(1 << 20);
    let mut model = BTreeMap::new();
    let mut x: u64 = 5;
    for round in 0..8u64 {
        let ops = random_writes(&mut x, 3000, 30_000, 10, &UpsertOp::Add(3), round);
        e.write(&ops, None).unwrap();
        apply_ops(&mut model, &ops);
    }
    e.checkpoint().unwrap();
    assert!(e.check_integrity().unwrap().height >= 3);
    drop(e);
    // Reopen with a cache far smaller than one node: only the root is cached.
    let e = open(16 << 10);
    for i in 0..30_000u64 {
        let k = key(i);
        assert_eq!(e.get(&k).unwrap(), model.get(&k).cloned(), "key {i}");
    }
    let st = e.partial_read_stats();
    // Format 3 leaves are read one basement frame at a time, never a whole basement.
    assert!(
        st.internal_infos > 0 && st.frames > 0 && st.basements == 0,
        "{st:?}"
    );
    // Buffers with the key pending are read; the filters spare most lookups a buffer read.
    assert!(st.internal_buffers > 0, "{st:?}");
    assert!(st.internal_buffers < 30_000, "{st:?}");
}

/// A tree of about 10 MiB of rows (80,000 keys, 20 rounds of 4,000 puts of ~110-byte values
/// from the LCG state `x`) in 2 MiB of cache, checkpointed: most leaves were written and evicted
/// on the way. Returns the engine and the model.
fn evictable_tree(vfs: &Arc<FaultVfs>, mut x: u64) -> (FractalEngine, BTreeMap<Vec<u8>, Vec<u8>>) {
    let params = TreeParams {
        node_size_bytes: 64 << 10,
        basement_size_bytes: 4 << 10,
        fanout: 8,
    };
    let e = open_on(vfs, params, 2 << 20);
    let mut model = BTreeMap::new();
    for round in 0..20u64 {
        let ops: Vec<WriteOp> = (0..4000u64)
            .map(|i| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                WriteOp::Put {
                    key: key((x >> 33) % 80_000),
                    value: format!("{round}-{i}-{}", "v".repeat(100)).into_bytes(),
                }
            })
            .collect();
        e.write(&ops, None).unwrap();
        apply_ops(&mut model, &ops);
    }
    e.checkpoint().unwrap();
    (e, model)
}

/// Partial eviction: a clean leaf the cache evicts keeps its skeleton (partition table, basement
/// pivots and frame tables) in memory, so a later point read of it reads one basement frame and
/// never its header and partition 0 again. Reads equal the model.
#[test]
fn evicted_leaves_keep_their_skeleton_for_point_reads() {
    let vfs = FaultVfs::new(21);
    let (e, model) = evictable_tree(&vfs, 99);
    let report = e.check_integrity().unwrap();
    assert!(report.blocks > 100, "{report:?}");
    let before = e.partial_read_stats();
    for (k, v) in model.iter().step_by(3) {
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
    }
    assert_eq!(e.get(&key(80_001)).unwrap(), None);
    let st = e.partial_read_stats();
    let frames = st.frames - before.frames;
    let leaf_infos = st.leaf_infos - before.leaf_infos;
    // Thousands of lookups read single frames of uncached leaves...
    assert!(frames > 1000, "{st:?}");
    // ...without reading those leaves' partition 0: their skeletons stayed when they left
    // the cache (without partial eviction this is one per uncached leaf, over 100 here).
    assert!(leaf_infos < 10, "{leaf_infos} partition-0 reads; {st:?}");
}

/// A frame of an uncached leaf is read from the file and not kept on its first read (readers
/// do this under the shared lock, side by side), kept in the side cache on its second, and
/// served from memory on its third; every read returns the model's value, from reader threads
/// as well.
#[test]
fn uncached_frames_are_kept_only_when_read_again() {
    let vfs = FaultVfs::new(22);
    let (e, model) = evictable_tree(&vfs, 7);
    let stats = || e.partial_read_stats();
    let side_now = || e.memory_use().side_cache_bytes;
    // Leaves' partition 0 first, so that their frame tables are in the side cache.
    for (k, v) in model.iter().step_by(50) {
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
    }
    // Keys whose read reads a frame (of a leaf the 2 MiB cache does not hold whole, for a key no
    // buffer overrides), each read three times in a row (so no other read can take its
    // doorkeeper slot or trim its frame in between).
    let mut tried = 0;
    for (k, v) in model.iter().skip(25).step_by(50) {
        let st0 = stats();
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
        let (st1, side1) = (stats(), side_now());
        // A first read under the shared lock, not kept (a frame the skeleton pass already read
        // is admitted to the side cache on this read instead: skipped).
        if st1.frames != st0.frames + 1 || st1.frames_shared != st0.frames_shared + 1 {
            continue;
        }
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
        let (st2, side2) = (stats(), side_now());
        // Second read: read again, on the exclusive path, and kept.
        assert_eq!(st2.frames, st1.frames + 1, "{st2:?}");
        assert_eq!(st2.frames_shared, st1.frames_shared, "{st2:?}");
        assert!(side2 > side1, "the frame is kept: {side1} -> {side2}");
        assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
        // Third read: from the side cache.
        assert_eq!(stats().frames, st2.frames);
        tried += 1;
        if tried == 10 {
            break;
        }
    }
    assert_eq!(
        tried,
        10,
        "too few first reads under the shared lock: {:?}",
        stats()
    );
    // Fresh keys from four reader threads at once (shared-lock reads), then checked again.
    let keys: Vec<(Vec<u8>, Vec<u8>)> = model
        .iter()
        .skip(1)
        .step_by(7)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    std::thread::scope(|s| {
        for t in 0..4 {
            let (e, keys) = (&e, &keys);
            s.spawn(move || {
                for (k, v) in keys.iter().skip(t).step_by(4) {
                    assert_eq!(e.get(k).unwrap().as_ref(), Some(v));
                }
            });
        }
    });
    assert_eq!(dump(&e), model);
}

/// With a cache far smaller than the tree, gorged buffers whose child is not cached spill to
/// runs on disk instead of reading the child; runs merge into the child later. Point reads,
/// scans, integrity checks and a reopen see exactly the model, including upserts and deletes
/// that sit only in runs.
#[test]
fn spilled_runs_keep_reads_exact_and_survive_reopen() {
    let params = TreeParams {
        node_size_bytes: 32 << 10,
        basement_size_bytes: 4 << 10,
        fanout: 4,
    };
    let vfs = FaultVfs::new(11);
    let open = || open_on(&vfs, params, 48 << 10);
    let e = open();
    let mut model = BTreeMap::new();
    let mut x: u64 = 17;
    for round in 0..24u64 {
        let ops = random_writes(&mut x, 1500, 12_000, 9, &UpsertOp::Add(1), round);
        apply_ops(&mut model, &ops);
        // Both entry points, across batches that hand spilled runs over mid-batch.
        if round % 2 == 0 {
            e.write(&ops, None).unwrap();
        } else {
            e.write_owned(ops, None).unwrap();
        }
        if round % 6 == 5 {
            e.check_integrity().unwrap();
            e.checkpoint().unwrap();
        }
    }
    let check = |e: &FractalEngine| {
        for i in (0..12_000u64).step_by(7) {
            assert_eq!(e.get(&key(i)).unwrap(), model.get(&key(i)).cloned(), "key {i}");
        }
        assert_eq!(dump(e), model);
        let from = key(4321);
        let want: Vec<_> = model
            .range(from.clone()..)
            .take(50)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        assert_eq!(e.scan(&from, None, 50).unwrap(), want);
    };
    check(&e);
    let report = e.check_integrity().unwrap();
    assert!(report.height >= 3, "{report:?}");
    let st = e.spill_stats();
    assert!(st.runs_spilled > 0 && st.runs_merged > 0, "{st:?}");
    // Runs flushed into internal nodes went on to their uncached children as runs.
    assert!(st.runs_handed_down > 0, "{st:?}");
    // Lookups read runs one frame at a time (each read here is one key or a short scan).
    let pr = e.partial_read_stats();
    assert!(pr.run_frame_reads > 0, "{pr:?}");
    assert!(pr.run_frames < 2 * pr.run_frame_reads, "{pr:?}");
    // Keys whose Put or Delete is pending in a run above an older leaf skip the leaf read.
    assert!(pr.leaf_reads_avoided > 0 && pr.frames > 0, "{pr:?}");
    e.checkpoint().unwrap();
    drop(e);
    let e = open();
    check(&e);
    e.check_integrity().unwrap();
}

/// Wide nodes under cache pressure spill many small runs per buffer; once a buffer holds 16 of
/// them they are merged into one run without touching the child (size-tiered). Reads stay
/// exact throughout and after a reopen.
#[test]
fn small_runs_are_compacted_and_reads_stay_exact() {
    let params = TreeParams {
        node_size_bytes: 128 << 10,
        basement_size_bytes: 4 << 10,
        fanout: 32,
    };
    let vfs = FaultVfs::new(13);
    let open = || open_on(&vfs, params, 256 << 10);
    let e = open();
    let mut model = BTreeMap::new();
    let mut x: u64 = 23;
    for round in 0..100u64 {
        let ops = random_writes(&mut x, 2000, 150_000, 7, &UpsertOp::Append(b"*".to_vec()), round);
        e.write(&ops, None).unwrap();
        apply_ops(&mut model, &ops);
    }
    let st = e.spill_stats();
    assert!(st.runs_compacted > 0, "{st:?}");
    e.check_integrity().unwrap();
    for i in (0..150_000u64).step_by(37) {
        assert_eq!(e.get(&key(i)).unwrap(), model.get(&key(i)).cloned(), "key {i}");
    }
    assert_eq!(dump(&e), model);
    e.checkpoint().unwrap();
    drop(e);
    let e = open();
    assert_eq!(dump(&e), model);
    e.check_integrity().unwrap();
}

/// Acceptance 3 for spilled runs: a tree holding runs at its checkpoint gets one flipped bit at
/// a time across its block area; `check_integrity` (which reads every node and run) reports
/// `Corruption` or the data is exactly right, and flips inside run blocks are among the detected.
#[test]
fn flipped_bits_in_runs_are_reported_as_corruption() {
    let params = TreeParams {
        node_size_bytes: 32 << 10,
        basement_size_bytes: 4 << 10,
        fanout: 4,
    };
    let vfs = FaultVfs::new(29);
    let open = || {
        FractalEngine::open_with(
            vfs.clone() as Arc<dyn Vfs>,
            &opts("/engine".into(), 48 << 10, None),
            FractalOptions {
                tree: params,
                cleaner_period_ms: None,
            },
        )
    };
    let mut model = BTreeMap::new();
    {
        let e = open().unwrap();
        let mut x: u64 = 31;
        for _ in 0..4 {
            let ops: Vec<WriteOp> = (0..1500)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    WriteOp::Put {
                        key: key((x >> 33) % 6000),
                        value: vec![(x >> 20) as u8; 20],
                    }
                })
                .collect();
            e.write(&ops, None).unwrap();
            apply_ops(&mut model, &ops);
        }
        let st = e.spill_stats();
        assert!(
            st.runs_spilled > st.runs_merged,
            "runs must be pending at the checkpoint: {st:?}"
        );
        e.checkpoint().unwrap();
    }
    let path = std::path::PathBuf::from("/engine").join(TREE_FILE_NAME);
    let len = vfs.durable_len(&path).unwrap();
    let file = vfs.open(&path, false).unwrap();
    let mut image = vec![0u8; len as usize];
    file.read_exact_at(&mut image, 0).unwrap();
    drop(file);
    let (mut detected, mut in_runs) = (0, 0);
    for pos in (8192..len).step_by(211) {
        let orig = image[pos as usize];
        vfs.inject_bytes(&path, pos, &[orig ^ 0x10]).unwrap();
        let outcome = open().and_then(|e| e.check_integrity().map(|_| e));
        match outcome {
            Err(EngineError::Corruption { location, .. }) => {
                detected += 1;
                if location.contains(" run ") {
                    in_runs += 1;
                }
            }
            Err(other) => panic!("byte {pos}: unexpected error {other}"),
            Ok(e) => assert_eq!(dump(&e), model, "byte {pos}: wrong data returned"),
        }
        vfs.inject_bytes(&path, pos, &[orig]).unwrap();
    }
    assert!(
        detected > 10 && in_runs > 0,
        "detected {detected}, in runs {in_runs}"
    );
    assert_eq!(dump(&open().unwrap()), model);
}

/// Checkpoints on their own thread beside a writer (and a reader): after a crash the tree is
/// exactly the model at the round the last checkpoint recorded in the metadata, and the
/// checkpoint counters advance one by one.
#[test]
fn checkpoints_beside_a_writer_survive_a_crash() {
    let vfs = FaultVfs::new(7);
    let engine = Arc::new(open_on(&vfs, SMALL, 24 << 10));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let checkpointer = {
        let (e, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut stats = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                e.checkpoint().unwrap();
                stats.push(e.last_checkpoint_stats().unwrap());
            }
            stats
        })
    };
    let reader = {
        let (e, stop) = (engine.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut x = 99u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                e.get(&key((x >> 33) % 2000)).unwrap();
            }
        })
    };
    let mut x = 5u64;
    let mut models = vec![BTreeMap::new()];
    let upsert = UpsertOp::Add(3);
    for round in 1..=400u64 {
        let ops = random_writes(&mut x, 30, 2000, 9, &upsert, round);
        engine.write(&ops, Some(&round.to_le_bytes())).unwrap();
        let mut next = models.last().unwrap().clone();
        apply_ops(&mut next, &ops);
        models.push(next);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let stats = checkpointer.join().unwrap();
    reader.join().unwrap();
    assert!(!stats.is_empty());
    assert!(stats.windows(2).all(|w| w[1].counter == w[0].counter + 1));
    engine.check_integrity().unwrap();
    drop(engine);
    vfs.crash(true);
    let e = open_on(&vfs, SMALL, 24 << 10);
    let round = e
        .meta()
        .unwrap()
        .map_or(0, |m| u64::from_le_bytes(m.try_into().unwrap()));
    let got: BTreeMap<Vec<u8>, Vec<u8>> = e.scan(b"", None, usize::MAX).unwrap().into_iter().collect();
    assert_eq!(
        got, models[round as usize],
        "tree after the crash vs the model at round {round}"
    );
    e.check_integrity().unwrap();
}

/// Consecutive edge inserts go straight to the edge leaf (no buffering), and stay exact when
/// mixed with upserts and deletes of older keys, range deletes over the tail and descending
/// inserts at the left edge; checkpoints and a reopen keep everything.
#[test]
fn edge_inserts_go_straight_to_the_leaf_and_stay_exact() {
    let vfs = FaultVfs::new(21);
    let e = open_on(&vfs, SMALL, 1 << 20);
    let mut model = BTreeMap::new();
    let mut next = 1_000_000u64;
    let mut low = 999_999u64;
    let mut total = 0u64;
    for round in 0..200u64 {
        let mut ops: Vec<WriteOp> = (0..20)
            .map(|_| {
                next += 1;
                WriteOp::Put {
                    key: key(next),
                    value: format!("v{next}").into_bytes(),
                }
            })
            .collect();
        total += 20;
        match round % 10 {
            3 => ops.push(WriteOp::Upsert {
                key: key(next - 30),
                op: UpsertOp::Append(b"+".to_vec()),
            }),
            5 => ops.push(WriteOp::DeleteRange {
                start: key(next - 5),
                end: None,
            }),
            7 => ops.push(WriteOp::Delete { key: key(next - 100) }),
            8 => {
                for _ in 0..10 {
                    ops.push(WriteOp::Put {
                        key: key(low),
                        value: b"low".to_vec(),
                    });
                    low -= 1;
                }
            }
            _ => {}
        }
        e.write(&ops, None).unwrap();
        apply_ops(&mut model, &ops);
        if round % 50 == 49 {
            e.checkpoint().unwrap();
            e.check_integrity().unwrap();
        }
    }
    assert_eq!(dump(&e), model);
    let st = e.spill_stats();
    assert!(st.edge_inserts > total / 2, "{st:?} of {total} appends");
    e.checkpoint().unwrap();
    drop(e);
    let e = open_on(&vfs, SMALL, 1 << 20);
    assert_eq!(dump(&e), model);
    e.check_integrity().unwrap();
}

/// Background leaf flushes (a node's worth of spilled runs applied to an uncached leaf on the
/// flusher thread while the writer goes on, then installed) and spilled runs the writeback
/// thread encodes and writes, and dirty eviction victims it writes before they leave the cache,
/// beside checkpoints, range deletes, reads and a crash: reads equal the model after every
/// batch, every invariant holds, and a crash returns the last checkpoint.
#[test]
fn background_leaf_flushes_keep_reads_exact_and_survive_a_crash() {
    let params = TreeParams {
        node_size_bytes: 16 << 10,
        basement_size_bytes: 2 << 10,
        fanout: 4,
    };
    for seed in [31u64, 32, 33] {
        let vfs = FaultVfs::new(seed);
        let open = || open_on(&vfs, params, 512 << 10);
        let e = open();
        let mut model = BTreeMap::new();
        let mut durable = BTreeMap::new();
        let mut x: u64 = seed;
        for round in 0..40u64 {
            let mut ops = random_writes(&mut x, 1000, 30_000, 9, &UpsertOp::Append(b"+".to_vec()), round);
            if round % 5 == 4 {
                let start = (x >> 20) % 29_000;
                ops.push(WriteOp::DeleteRange {
                    start: key(start),
                    end: Some(key(start + 150)),
                });
            }
            e.write(&ops, None).unwrap();
            apply_ops(&mut model, &ops);
            for i in (round * 13 % 97..30_000u64).step_by(97) {
                assert_eq!(
                    e.get(&key(i)).unwrap(),
                    model.get(&key(i)).cloned(),
                    "key {i} round {round} seed {seed}"
                );
            }
            if round % 8 == 7 {
                assert_eq!(dump(&e), model, "round {round} seed {seed}");
                e.check_integrity().unwrap();
                e.checkpoint().unwrap();
                durable = model.clone();
            }
        }
        let totals = e.flush_totals();
        assert!(
            totals.started > 0 && totals.installed > 0,
            "{totals:?} (seed {seed})"
        );
        // Spilled runs went to the writeback thread (readable from memory until written; a
        // checkpoint writes those still pending).
        let wb = e.writeback_totals();
        assert!(wb.runs_written > 0, "{wb:?} (seed {seed})");
        // Dirty eviction victims went to the writeback thread too (evicted once written).
        let ev = e.eviction_stats();
        assert!(ev.handed_to_writeback > 0, "{ev:?} (seed {seed})");
        let st = e.spill_stats();
        assert!(st.runs_handed_down > 0, "{st:?} (seed {seed})");
        drop(e);
        vfs.crash(false);
        let e = open();
        assert_eq!(dump(&e), durable, "after the crash (seed {seed})");
        e.check_integrity().unwrap();
    }
}

/// Loads beyond a small cache, then deletes most keys in random order beside new puts, so
/// spilled runs are handed down to leaves that then shrink and merge with neighbours whose
/// buffers received messages in the same flush: every read equals the model after every
/// batch (a merge must never take a message pushed after it as already applied).
#[test]
fn hand_down_then_merges_keep_every_write() {
    let params = TreeParams {
        node_size_bytes: 16 << 10,
        basement_size_bytes: 2 << 10,
        fanout: 4,
    };
    for seed in 41u64..47 {
        let vfs = FaultVfs::new(seed);
        let e = open_on(
            &vfs,
            params,
            [64u64 << 10, 128 << 10, 256 << 10][(seed % 3) as usize],
        );
        let mut model = BTreeMap::new();
        let mut x: u64 = seed;
        let keys = 20_000u64;
        for round in 0..60u64 {
            let delete_one_in = if round < 20 { 50 } else { 2 };
            let ops: Vec<WriteOp> = (0..1000)
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let k = key((x >> 33) % keys);
                    if (x >> 20).is_multiple_of(delete_one_in) {
                        WriteOp::Delete { key: k }
                    } else {
                        WriteOp::Put {
                            key: k,
                            value: format!("v{round}-{}", x % 997).into_bytes(),
                        }
                    }
                })
                .collect();
            e.write(&ops, None).unwrap();
            apply_ops(&mut model, &ops);
            assert_eq!(dump(&e), model, "round {round} seed {seed}");
            if round % 10 == 9 {
                e.check_integrity().unwrap();
            }
        }
        let st = e.spill_stats();
        assert!(st.runs_handed_down > 0, "{st:?} (seed {seed})");
    }
}
