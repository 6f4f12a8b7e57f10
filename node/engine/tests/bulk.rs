#![allow(clippy::unwrap_used)]
//! Bulk loads (issue 18, engine half): model equality over random existing data and random
//! loads in every duplicate mode, atomicity on failure, crash safety, and a load bigger than
//! the cache and the sort memory.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use ftkv_engine::model::apply_ops;
use ftkv_engine::{
    BulkLoadOptions, Engine, EngineError, EngineKind, FractalEngine, KeyValue, OnDuplicate, WriteOp,
};
use ftkv_vfs::{FaultVfs, Vfs};
use proptest::prelude::*;

type Map = BTreeMap<Vec<u8>, Vec<u8>>;

/// The model: rows applied one by one with the policy's semantics. `Err((key, first, second))`
/// for the Error policy's first duplicate in key order.
fn model_load(
    before: &Map,
    rows: &[KeyValue],
    policy: OnDuplicate,
) -> Result<Map, (Vec<u8>, Option<u64>, u64)> {
    let mut first: BTreeMap<&[u8], Vec<u64>> = BTreeMap::new();
    for (i, (k, _)) in rows.iter().enumerate() {
        first.entry(k.as_slice()).or_default().push(i as u64);
    }
    if policy == OnDuplicate::Error {
        for (k, idx) in &first {
            if before.contains_key(*k) {
                return Err((k.to_vec(), None, idx[0]));
            }
            if idx.len() > 1 {
                return Err((k.to_vec(), Some(idx[0]), idx[1]));
            }
        }
    }
    let mut m = before.clone();
    for (k, v) in rows {
        match policy {
            OnDuplicate::Replace | OnDuplicate::Error => {
                m.insert(k.clone(), v.clone());
            }
            OnDuplicate::Ignore => {
                m.entry(k.clone()).or_insert_with(|| v.clone());
            }
        }
    }
    Ok(m)
}

fn policy_strategy() -> impl Strategy<Value = OnDuplicate> {
    prop_oneof![
        Just(OnDuplicate::Error),
        Just(OnDuplicate::Replace),
        Just(OnDuplicate::Ignore)
    ]
}

fn wide_key() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => key_strategy(),
        2 => (0u32..3000).prop_map(|i| format!("k{i:05}").into_bytes()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Random existing data (possibly none, possibly deleted again), a random load (sorted or
    /// not, with duplicates), every mode: the fractal tree with tiny nodes and a tiny sort
    /// memory (spills, grafts) equals the row-by-row model; integrity holds after.
    #[test]
    fn bulk_load_equals_the_row_by_row_model(
        existing in prop::collection::vec((wide_key(), value_strategy()), 0..200),
        delete_all in any::<bool>(),
        rows in prop::collection::vec((wide_key(), value_strategy()), 0..600),
        sort_rows in any::<bool>(),
        policy in policy_strategy(),
        sort_memory in prop_oneof![Just(200u64), Just(4096u64), Just(1u64 << 20)],
    ) {
        let s = Subject::new(EngineKind::Fractal, SMALL, 16 << 10, Some(1));
        let mut before = Map::new();
        let ops: Vec<WriteOp> = existing
            .iter()
            .map(|(k, v)| WriteOp::Put { key: k.clone(), value: v.clone() })
            .collect();
        s.e().write(&ops, None).unwrap();
        apply_ops(&mut before, &ops);
        if delete_all {
            let del = [WriteOp::DeleteRange { start: Vec::new(), end: None }];
            s.e().write(&del, None).unwrap();
            apply_ops(&mut before, &del);
        }
        let mut rows = rows;
        if sort_rows {
            rows.sort_by(|a, b| a.0.cmp(&b.0));
        }
        let opts = BulkLoadOptions { on_duplicate: policy, sort_memory_bytes: sort_memory };
        // As in the replicated node, the extra ops delete a range (there: the load's staging),
        // which the rebuild path does not copy.
        let extra = [
            WriteOp::Delete { key: b"a".to_vec() },
            WriteOp::DeleteRange { start: b"k01000".to_vec(), end: Some(b"k02000".to_vec()) },
        ];
        let mut it = rows.clone().into_iter().map(Ok);
        let got = s.e().bulk_load(&mut it, &opts, &extra, Some(b"m1"));
        match model_load(&before, &rows, policy) {
            Ok(mut want) => {
                let report = got.unwrap();
                apply_ops(&mut want, &extra);
                prop_assert_eq!(report.rows_read, rows.len() as u64);
                prop_assert_eq!(dump(s.e()), want.clone());
                prop_assert_eq!(s.e().meta().unwrap(), Some(b"m1".to_vec()));
                // The rebuild path (bottom-up build) runs exactly when the live data outside
                // the deleted range is no larger than the load.
                let live: u64 = before
                    .iter()
                    .filter(|(k, _)| !(k.as_slice() >= b"k01000".as_slice() && k.as_slice() < b"k02000".as_slice()))
                    .map(|(k, v)| (k.len() + v.len()) as u64)
                    .sum();
                let load: u64 = rows.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
                prop_assert_eq!(report.leaves_built > 0, live <= load, "live {} load {}", live, load);
                if sort_rows {
                    prop_assert!(report.input_was_sorted);
                }
                let r = s.e().check_integrity().unwrap();
                prop_assert_eq!(r.keys, want.len() as u64);
            }
            Err((key, first, second)) => {
                match got {
                    Err(EngineError::DuplicateKey { key: k, first_index, second_index }) => {
                        prop_assert_eq!((k, first_index, second_index), (key, first, second));
                    }
                    other => prop_assert!(false, "expected a duplicate, got {:?}", other),
                }
                prop_assert_eq!(dump(s.e()), before.clone());
                prop_assert_eq!(s.e().meta().unwrap(), None);
                s.e().check_integrity().unwrap();
            }
        }
        // The spill directory is empty after the load, whatever its outcome.
        let tmp = std::path::Path::new("/engine/bulk-tmp");
        if s.vfs.exists(tmp) {
            prop_assert!(s.vfs.list_dir(tmp).unwrap().is_empty());
        }
    }
}

fn key(i: u64) -> Vec<u8> {
    i.to_be_bytes().to_vec()
}

fn row(i: u64) -> KeyValue {
    (key(i), format!("value-{i:034}").into_bytes())
}

/// A load that fails (a duplicate, an input error at row N) changes nothing, in the empty-tree
/// path and the overlap path, and a rerun of a good load succeeds.
#[test]
fn a_failed_load_changes_nothing() {
    for existing in [0u64, 50] {
        let s = Subject::new(EngineKind::Fractal, SMALL, 16 << 10, Some(1));
        let ops: Vec<WriteOp> = (0..existing)
            .map(|i| WriteOp::Put {
                key: key(10_000_000 + i),
                value: b"old".to_vec(),
            })
            .collect();
        s.e().write(&ops, Some(b"before")).unwrap();
        let before = dump(s.e());
        let opts = BulkLoadOptions {
            on_duplicate: OnDuplicate::Error,
            sort_memory_bytes: 1024,
        };
        // Duplicate (rows 10 and 4000 carry the same key).
        let mut dup = (0..5000u64).map(|i| Ok(row(if i == 4000 { 10 } else { i })));
        let e = s.e().bulk_load(&mut dup, &opts, &[], Some(b"after")).unwrap_err();
        assert!(
            matches!(
                e,
                EngineError::DuplicateKey {
                    first_index: Some(10),
                    second_index: 4000,
                    ..
                }
            ),
            "{e}"
        );
        // Input error at row 3000.
        let mut bad = (0..5000u64).map(|i| {
            if i == 3000 {
                Err(EngineError::InvalidArgument("bad line 3001".into()))
            } else {
                Ok(row(5000 - i))
            }
        });
        let e = s.e().bulk_load(&mut bad, &opts, &[], Some(b"after")).unwrap_err();
        assert!(matches!(e, EngineError::InvalidArgument(_)), "{e}");
        assert_eq!(dump(s.e()), before);
        assert_eq!(s.e().meta().unwrap(), Some(b"before".to_vec()));
        s.e().check_integrity().unwrap();
        // A good rerun.
        let mut good = (0..5000u64).map(|i| Ok(row(i * 1000 + 8)));
        let r = s.e().bulk_load(&mut good, &opts, &[], Some(b"after")).unwrap();
        assert_eq!(r.rows_written, 5000);
        assert_eq!(dump(s.e()).len() as u64, 5000 + existing);
        s.e().check_integrity().unwrap();
    }
}

fn open(vfs: &Arc<FaultVfs>) -> ftkv_engine::Result<FractalEngine> {
    FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &opts("/engine".into(), 64 << 10, Some(1)),
        ftkv_engine::FractalOptions::with_tree(SMALL),
    )
}

/// Crash points during a load and before or during the checkpoint after it: the reopened tree
/// is the old state or the whole load, integrity holds, no spill file is left, and the file
/// does not grow from load to load (no leaked blocks).
#[test]
fn a_crash_mid_load_recovers_old_or_whole_state() {
    let mut outcomes = (0, 0);
    let mut sizes = Vec::new();
    for seed in 0..60u64 {
        let vfs = FaultVfs::new(seed);
        let e = open(&vfs).unwrap();
        let base: Vec<WriteOp> = (0..100u64)
            .map(|i| WriteOp::Put {
                key: key(i * 3),
                value: b"base".to_vec(),
            })
            .collect();
        if seed % 2 == 1 {
            e.write(&base, Some(b"base")).unwrap();
            e.checkpoint().unwrap();
        }
        let old = dump(&e);
        // Every fourth seed never crashes; the others at a point spread over the load and the
        // checkpoint after it.
        let ahead = (seed % 4 != 0).then(|| vfs.op_count() + 1 + (seed * 7919) % 600);
        vfs.set_crash_point(ahead);
        let opts = BulkLoadOptions {
            on_duplicate: OnDuplicate::Replace,
            sort_memory_bytes: 2048,
        };
        let mut rows = (0..3000u64).map(|i| Ok(row((i * 7919) % 3000)));
        let loaded = e
            .bulk_load(&mut rows, &opts, &[], Some(b"loaded"))
            .and_then(|_| e.checkpoint());
        let mut whole = old.clone();
        whole.extend((0..3000u64).map(row));
        drop(e);
        vfs.crash(seed % 3 == 0);
        let e = open(&vfs).unwrap();
        let got = dump(&e);
        if loaded.is_ok() {
            assert_eq!(got, whole, "seed {seed}: a load that returned Ok is durable");
        }
        if got == old {
            outcomes.0 += 1;
        } else {
            assert_eq!(
                got, whole,
                "seed {seed}: neither the old state nor the whole load"
            );
            outcomes.1 += 1;
        }
        e.check_integrity().unwrap();
        let tmp = std::path::Path::new("/engine/bulk-tmp");
        assert!(!vfs.exists(tmp) || vfs.list_dir(tmp).unwrap().is_empty());
        // Loading again after the crash works and reuses the space.
        let mut rows = (0..3000u64).map(|i| Ok(row(i)));
        e.bulk_load(&mut rows, &opts, &[], Some(b"again")).unwrap();
        e.checkpoint().unwrap();
        e.check_integrity().unwrap();
        sizes.push(e.size_on_disk_bytes().unwrap());
    }
    let max = *sizes.iter().max().unwrap();
    let min = *sizes.iter().min().unwrap();
    assert!(
        max <= min * 3,
        "file sizes after a rerun vary too much: {sizes:?}"
    );
    assert!(outcomes.0 > 0 && outcomes.1 > 0, "outcomes {outcomes:?}");
}

/// 200k rows, unsorted, into a 1 MiB cache with 256 KiB of sort memory (many spilled runs),
/// then a second overlapping load (messages).
#[test]
fn a_load_bigger_than_cache_and_sort_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let e = FractalEngine::open(
        ftkv_vfs::RealVfs::new(),
        &opts(tmp.path().join("e"), 1 << 20, Some(1)),
    )
    .unwrap();
    let n = 200_000u64;
    let opts = BulkLoadOptions {
        on_duplicate: OnDuplicate::Error,
        sort_memory_bytes: 256 << 10,
    };
    let mut rows = (0..n).map(|i| Ok(row((i * 7919) % n)));
    let r = e.bulk_load(&mut rows, &opts, &[], None).unwrap();
    assert!(!r.input_was_sorted);
    assert!(r.runs_spilled >= 10, "{r:?}");
    assert_eq!(r.rows_written, n);
    assert!(r.leaves_built > 1, "{r:?}");
    assert!(e.cached_bytes() <= 1 << 20);
    e.checkpoint().unwrap();
    assert_eq!(e.check_integrity().unwrap().keys, n);
    for i in [0, 1, n / 2, n - 1] {
        assert_eq!(e.get(&key(i)).unwrap(), Some(row(i).1));
    }
    // Overlap: every tenth row again with Ignore (kept) plus new rows past the end.
    let opts = BulkLoadOptions {
        on_duplicate: OnDuplicate::Ignore,
        sort_memory_bytes: 256 << 10,
    };
    let mut rows = (0..n / 10).map(|i| Ok((key(i * 10 + n / 2), b"new".to_vec())));
    let r = e.bulk_load(&mut rows, &opts, &[], None).unwrap();
    assert_eq!(r.rows_skipped, n / 20);
    assert_eq!(r.rows_written, n / 20);
    assert_eq!(e.get(&key(n / 2)).unwrap(), Some(row(n / 2).1));
    assert_eq!(e.get(&key(n + 10)).unwrap(), Some(b"new".to_vec()));
    assert_eq!(e.check_integrity().unwrap().keys, n + n / 20);
}
