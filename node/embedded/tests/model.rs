//! Model test: random sequences of write batches (every `WriteOp` kind, range deletes and range
//! upserts included), checkpoints, clean closes and plain drops (replay on open) against a
//! `BTreeMap` oracle, for the fractal engine and the in-memory model engine (which replays
//! its whole log on every open).
#![allow(clippy::unwrap_used)]

mod common;

use common::{assert_same, dump, open, small_opts, Model};
use ftkv_embedded::EngineKind;
use ftkv_engine::model::apply_ops;
use ftkv_engine::{UpsertOp, WriteOp};
use ftkv_vfs::FaultVfs;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Action {
    Write(Vec<WriteOp>),
    Checkpoint,
    /// `close()` (final checkpoint) and reopen.
    Close,
    /// Drop without a checkpoint and reopen: the log replays.
    DropReopen,
}

fn key() -> impl Strategy<Value = Vec<u8>> {
    (0u8..40).prop_map(|i| format!("k{i:02}").into_bytes())
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(any::<u8>(), 0..24)
}

fn upsert() -> impl Strategy<Value = UpsertOp> {
    prop_oneof![
        bytes().prop_map(UpsertOp::SetIfAbsent),
        (-1000i64..1000).prop_map(UpsertOp::Add),
        bytes().prop_map(UpsertOp::Append),
        bytes().prop_map(UpsertOp::Max),
    ]
}

fn op() -> impl Strategy<Value = WriteOp> {
    prop_oneof![
        6 => (key(), bytes()).prop_map(|(key, value)| WriteOp::Put { key, value }),
        2 => key().prop_map(|key| WriteOp::Delete { key }),
        3 => (key(), upsert()).prop_map(|(key, op)| WriteOp::Upsert { key, op }),
        1 => (key(), proptest::option::of(key())).prop_map(|(start, end)| WriteOp::DeleteRange { start, end }),
        1 => (key(), proptest::option::of(key()), upsert())
            .prop_map(|(start, end, op)| WriteOp::UpsertRange { start, end, op }),
    ]
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        12 => proptest::collection::vec(op(), 0..6).prop_map(Action::Write),
        2 => Just(Action::Checkpoint),
        1 => Just(Action::Close),
        1 => Just(Action::DropReopen),
    ]
}

fn engine() -> impl Strategy<Value = EngineKind> {
    prop_oneof![3 => Just(EngineKind::Fractal), 1 => Just(EngineKind::Model)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn reads_equal_the_model_across_checkpoints_and_reopens(
        kind in engine(),
        actions in proptest::collection::vec(action(), 1..40),
    ) {
        let vfs = FaultVfs::new(7);
        let opts = ftkv_embedded::EmbeddedOptions { engine: kind, ..small_opts() };
        let mut db = open(&vfs, &opts).unwrap();
        let mut model = Model::new();
        let mut lsn = 0;
        for (step, a) in actions.iter().enumerate() {
            match a {
                Action::Write(ops) => {
                    let got = db.write(ops).unwrap();
                    lsn += 1;
                    prop_assert_eq!(got, lsn, "LSNs are dense and continue across reopens");
                    apply_ops(&mut model, ops);
                }
                Action::Checkpoint => {
                    prop_assert_eq!(db.checkpoint().unwrap(), lsn);
                }
                Action::Close => {
                    db.close().unwrap();
                    db = open(&vfs, &opts).unwrap();
                    let replayed = db.stats().replayed_records;
                    match kind {
                        // The final checkpoint of close covered everything.
                        EngineKind::Fractal => prop_assert_eq!(replayed, 0),
                        // Nothing persists in memory: the whole log replays.
                        _ => prop_assert_eq!(replayed, lsn),
                    }
                }
                Action::DropReopen => {
                    drop(db);
                    db = open(&vfs, &opts).unwrap();
                }
            }
            prop_assert_eq!(db.last_lsn(), lsn);
            if !matches!(a, Action::Write(_)) || step + 1 == actions.len() {
                assert_same(&dump(&db), &model, &format!("step {step} ({a:?})"));
            }
        }
        // A last reopen through replay only.
        drop(db);
        let db = open(&vfs, &opts).unwrap();
        assert_same(&dump(&db), &model, "final reopen");
        if kind == EngineKind::Model {
            // Nothing persists in the model engine: everything came back through the log.
            prop_assert_eq!(db.stats().replayed_records, lsn);
        }
        db.check_integrity().unwrap();
    }
}

#[test]
fn model_engine_never_purges_its_log() {
    let vfs = FaultVfs::new(1);
    let opts = ftkv_embedded::EmbeddedOptions {
        engine: EngineKind::Model,
        ..small_opts()
    };
    let db = open(&vfs, &opts).unwrap();
    for i in 0..20u64 {
        db.write(&[WriteOp::Put {
            key: format!("k{i}").into_bytes(),
            value: vec![b'x'; 300],
        }])
        .unwrap();
        db.checkpoint().unwrap();
    }
    assert_eq!(db.stats().log_first_index, Some(1));
    db.close().unwrap();
    let db = open(&vfs, &opts).unwrap();
    assert_eq!(db.stats().replayed_records, 20);
    assert_eq!(db.scan(b"", None, 100).unwrap().len(), 20);
}

#[test]
fn sled_engine_replays_and_checkpoints_on_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let opts = ftkv_embedded::EmbeddedOptions {
        engine: EngineKind::Sled,
        cache_size_bytes: 8 << 20,
        checkpoint_interval_bytes: None,
        checkpoint_interval_ms: None,
        ..ftkv_embedded::EmbeddedOptions::default()
    };
    let mut rng = common::Rng(11);
    let mut model = Model::new();
    let db = ftkv_embedded::Db::open_real(dir.path(), opts.clone()).unwrap();
    assert_eq!(db.engine_kind(), EngineKind::Sled);
    for i in 1..=40u64 {
        let ops = common::random_batch(&mut rng, 32, 4, i);
        assert_eq!(db.write(&ops).unwrap(), i);
        apply_ops(&mut model, &ops);
        if i == 20 {
            assert_eq!(db.checkpoint().unwrap(), 20);
        }
    }
    drop(db); // no final checkpoint
    let db = ftkv_embedded::Db::open_real(dir.path(), opts.clone()).unwrap();
    assert_eq!(db.last_lsn(), 40);
    assert_same(&dump(&db), &model, "sled after reopen");
    db.close().unwrap();
    let db = ftkv_embedded::Db::open_real(dir.path(), opts).unwrap();
    assert_eq!(db.stats().replayed_records, 0);
    assert_same(&dump(&db), &model, "sled after close");
}
