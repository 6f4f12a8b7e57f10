//! Checkpoints keep the log bounded: each purges the log up to the checkpointed LSN, so its
//! first index advances and old segments are deleted; the automatic checkpointer (bytes
//! trigger from `write`, and the timer) does the same on its own.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::{Duration, Instant};

use common::{assert_same, dump, open, small_opts, Model};
use ftkv_embedded::Db;
use ftkv_engine::model::apply_ops;
use ftkv_engine::WriteOp;
use ftkv_vfs::FaultVfs;

fn put(i: u64) -> Vec<WriteOp> {
    vec![WriteOp::Put {
        key: format!("key{:04}", i % 300).into_bytes(),
        value: format!("{i:0>200}").into_bytes(),
    }]
}

/// Polls `cond` for up to 20 s.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn checkpoints_advance_the_first_index_and_delete_segments() {
    let vfs = FaultVfs::new(5);
    let db = open(&vfs, &small_opts()).unwrap();
    let mut model = Model::new();
    let mut lsn = 0;
    let mut prev_first = 0;
    for round in 0..12 {
        for _ in 0..20 {
            lsn += 1;
            let ops = put(lsn);
            db.write(&ops).unwrap();
            apply_ops(&mut model, &ops);
        }
        let cp = db.checkpoint().unwrap();
        assert_eq!(cp, lsn);
        // One more record after the checkpoint: the log holds exactly it.
        lsn += 1;
        let ops = put(lsn);
        db.write(&ops).unwrap();
        apply_ops(&mut model, &ops);
        let s = db.stats();
        assert_eq!(s.log_purged_up_to, Some(cp), "round {round}");
        assert_eq!(s.log_first_index, Some(cp + 1), "round {round}");
        assert!(cp + 1 > prev_first);
        prev_first = cp + 1;
        // 21 records of ~220 bytes fill more than one 4 KiB segment per round; 12 rounds wrote
        // ~14 segments, and only the live ones remain.
        assert!(s.log.segments <= 3, "round {round}: {} segments", s.log.segments);
    }
    assert!(db.stats().log.bytes_written > 12 * 4096);
    db.close().unwrap();
    let db = open(&vfs, &small_opts()).unwrap();
    assert_same(&dump(&db), &model, "after reopen");
}

fn auto_opts() -> ftkv_embedded::EmbeddedOptions {
    let mut opts = small_opts();
    opts.checkpoint_interval_bytes = Some(8 << 10);
    opts
}

#[test]
fn the_bytes_trigger_checkpoints_and_purges_in_the_background() {
    let vfs = FaultVfs::new(6);
    let db: Db = open(&vfs, &auto_opts()).unwrap();
    let mut model = Model::new();
    let mut max_segments = 0;
    for lsn in 1..=1000u64 {
        let ops = put(lsn);
        db.write(&ops).unwrap();
        apply_ops(&mut model, &ops);
        max_segments = max_segments.max(db.stats().log.segments);
    }
    // ~220 KiB of log (about 55 segments of 4 KiB) with an 8 KiB trigger: checkpoints ran
    // without being asked, and the log stayed bounded however far the background checkpointer
    // lagged: a writer 4 triggers (32 KiB) behind takes a checkpoint itself, so the log holds
    // at most about 64 KiB (16 segments, plus the active ones).
    let s = db.stats();
    assert!(s.checkpoints >= 5, "{s:?}");
    assert!(
        max_segments <= 24,
        "log not bounded: {max_segments} segments at most; {s:?}"
    );
    // Everything written after the last checkpoint began crossed the trigger again: one more
    // checkpoint follows on its own.
    wait_for("the last background checkpoint", || {
        db.stats().log_purged_up_to.is_some_and(|p| p > 900)
    });
    drop(db);
    let db = open(&vfs, &auto_opts()).unwrap();
    assert!(db.stats().replayed_records < 100);
    assert_same(&dump(&db), &model, "after reopen");
}

#[test]
fn the_timer_checkpoints_and_purges() {
    let vfs = FaultVfs::new(8);
    let mut opts = small_opts();
    opts.checkpoint_interval_ms = Some(20);
    let db = open(&vfs, &opts).unwrap();
    for lsn in 1..=5u64 {
        db.write(&put(lsn)).unwrap();
    }
    // The counters are updated just after the purge: wait for all of it.
    wait_for("a timed checkpoint", || {
        let s = db.stats();
        s.log_purged_up_to == Some(5) && s.checkpointed_lsn == 5 && s.checkpoints >= 1
    });
}
