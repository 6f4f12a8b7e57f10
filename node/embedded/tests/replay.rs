//! Replay really happens: writes after the last checkpoint exist only in the log after a power
//! loss (the engine itself reverts to its checkpoint, checked by opening it directly), and
//! `Db::open` brings them back by replaying the log above the engine's applied LSN.
#![allow(clippy::unwrap_used)]

mod common;

use common::{assert_same, dump, engine_alone, log_alone, open, random_batch, small_opts, Model, Rng};
use ftkv_embedded::codec::{decode_log_identity, EngineMeta, LOG_IDENTITY_KEY};
use ftkv_engine::model::apply_ops;
use ftkv_engine::FractalEngine;
use ftkv_engine::{Engine, WriteOp};
use ftkv_vfs::FaultVfs;

fn engine_state(e: &FractalEngine) -> (Model, u64) {
    let data = e.scan(b"", None, usize::MAX).unwrap().into_iter().collect();
    let applied = e
        .meta()
        .unwrap()
        .map_or(0, |m| EngineMeta::decode(&m).unwrap().applied_lsn);
    (data, applied)
}

#[test]
fn replay_restores_acknowledged_writes_the_engine_lost() {
    let vfs = FaultVfs::new(3);
    let db = open(&vfs, &small_opts()).unwrap();
    let mut rng = Rng(3);
    let mut model = Model::new();
    let mut at_checkpoint = Model::new();
    for i in 1..=30u64 {
        let ops = random_batch(&mut rng, 64, 5, i);
        assert_eq!(db.write(&ops).unwrap(), i);
        apply_ops(&mut model, &ops);
        if i == 10 {
            assert_eq!(db.checkpoint().unwrap(), 10);
            at_checkpoint = model.clone();
        }
    }
    // Power loss with the database open: every file reverts to what was synced.
    vfs.set_crash_point(Some(vfs.op_count()));
    drop(db);
    vfs.crash(false);

    // The engine by itself is back at its checkpoint: batches 11..=30 are gone from it.
    let engine = engine_alone(&vfs);
    let (data, applied) = engine_state(&engine);
    assert_eq!(applied, 10);
    assert_same(&data, &at_checkpoint, "engine alone after the crash");
    assert_ne!(data, model, "the test needs writes the engine lost");
    drop(engine);

    // The database replays them from the log.
    let db = open(&vfs, &small_opts()).unwrap();
    let stats = db.stats();
    assert_eq!(stats.replayed_records, 20);
    assert_eq!(db.last_lsn(), 30);
    assert_same(&dump(&db), &model, "after replay");
    // The replay ended with a checkpoint: the engine alone now holds everything.
    assert_eq!(stats.checkpointed_lsn, 30);
    assert_eq!(db.write(&random_batch(&mut rng, 64, 5, 31)).unwrap(), 31);
    drop(db);
    vfs.crash(false);
    let (data, applied) = engine_state(&engine_alone(&vfs));
    assert_eq!(applied, 30);
    assert_same(&data, &model, "engine after the post-replay checkpoint");
}

#[test]
fn replay_without_any_checkpoint_starts_at_lsn_one() {
    let vfs = FaultVfs::new(4);
    let mut opts = small_opts();
    opts.checkpoint_on_close = false;
    let db = open(&vfs, &opts).unwrap();
    let mut rng = Rng(4);
    let mut model = Model::new();
    for i in 1..=12u64 {
        let ops = random_batch(&mut rng, 32, 4, i);
        db.write(&ops).unwrap();
        apply_ops(&mut model, &ops);
    }
    db.close().unwrap(); // no final checkpoint: only the log has the data
    vfs.crash(true);
    let (data, applied) = engine_state(&engine_alone(&vfs));
    assert_eq!((data.len(), applied), (0, 0), "the engine never checkpointed");
    let db = open(&vfs, &opts).unwrap();
    assert_eq!(db.stats().replayed_records, 12);
    assert_same(&dump(&db), &model, "replayed from LSN 1");
}

#[test]
fn an_engine_ahead_of_its_log_continues_the_log_above_the_engine() {
    // The state a power loss leaves with periodic sync: the engine checkpointed batches 1..=10
    // (a checkpoint runs beside writers) but only records 1..=5 reached the log's disk. None of
    // 6..=10 was lost (the engine has them); the log must go on at 11, not at 6.
    let vfs = FaultVfs::new(9);
    let mut opts = small_opts();
    opts.checkpoint_on_close = false;
    let mut rng = Rng(9);
    let batches: Vec<Vec<WriteOp>> = (1..=10).map(|i| random_batch(&mut rng, 32, 4, i)).collect();
    let mut model = Model::new();
    let db = open(&vfs, &opts).unwrap();
    for b in &batches {
        db.write(b).unwrap();
        apply_ops(&mut model, b);
    }
    db.close().unwrap();
    vfs.crash(false);

    let log = log_alone(&vfs);
    let db_id = decode_log_identity(&log.get_meta(LOG_IDENTITY_KEY).unwrap()).unwrap();
    log.truncate(6).unwrap();
    drop(log);
    let engine = engine_alone(&vfs);
    for (i, b) in batches.iter().enumerate() {
        let meta = EngineMeta {
            db_id,
            applied_lsn: i as u64 + 1,
        };
        engine.write(b, Some(&meta.encode())).unwrap();
    }
    engine.checkpoint().unwrap();
    drop(engine);

    let db = open(&vfs, &opts).unwrap();
    assert_eq!((db.last_lsn(), db.stats().replayed_records), (10, 0));
    assert_same(&dump(&db), &model, "engine ahead of the log");
    let more = random_batch(&mut rng, 32, 4, 11);
    assert_eq!(db.write(&more).unwrap(), 11);
    apply_ops(&mut model, &more);
    drop(db);
    vfs.crash(false);
    let db = open(&vfs, &opts).unwrap();
    assert_eq!(db.stats().replayed_records, 1);
    assert_same(&dump(&db), &model, "after the write past the realignment");
}
