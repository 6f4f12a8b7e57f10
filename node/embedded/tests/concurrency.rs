//! Concurrent writers: many threads' batches share fsyncs (group commit, counted by the log's
//! `LogStats` on real files, where an fsync takes real time), every acknowledged batch survives
//! a power loss (`FaultVfs`), batches stay atomic, and each thread's batches recover as a prefix
//! of what it wrote (they are applied in LSN order).
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{open, small_opts, Rng};
use ftkv_embedded::{Db, EmbeddedOptions};
use ftkv_engine::{UpsertOp, WriteOp};
use ftkv_vfs::FaultVfs;

const THREADS: u64 = 8;
const PER_THREAD: u64 = 40;
const SEEDS: u64 = 24;

/// Batch `i` of thread `t`: its own key plus one to a shared counter, atomically.
fn batch(t: u64, i: u64) -> Vec<WriteOp> {
    vec![
        WriteOp::Put {
            key: format!("t{t}/{i:04}").into_bytes(),
            value: format!("value {t} {i}").into_bytes(),
        },
        WriteOp::Upsert {
            key: b"counter".to_vec(),
            op: UpsertOp::Add(1),
        },
    ]
}

/// Runs the writers; returns per thread how many batches were acknowledged (each stops at its
/// first error).
fn write_concurrently(db: &Db) -> Vec<u64> {
    let acked: Vec<AtomicU64> = (0..THREADS).map(|_| AtomicU64::new(0)).collect();
    std::thread::scope(|s| {
        for (t, acked) in acked.iter().enumerate() {
            s.spawn(move || {
                for i in 0..PER_THREAD {
                    if db.write(&batch(t as u64, i)).is_err() {
                        return;
                    }
                    acked.store(i + 1, Ordering::Relaxed);
                }
            });
        }
    });
    acked.iter().map(|a| a.load(Ordering::Relaxed)).collect()
}

/// Checks the recovered database: per thread a prefix of its batches, at least what was
/// acknowledged, and the counter equal to the number of batches present (atomicity).
/// Returns how many batches were recovered.
fn check_recovered(db: &Db, acked: &[u64], ctx: &str) -> u64 {
    let all: BTreeMap<Vec<u8>, Vec<u8>> = db.scan(b"", None, usize::MAX).unwrap().into_iter().collect();
    let mut present_total = 0u64;
    for (t, &acked_t) in acked.iter().enumerate() {
        let present: Vec<u64> = (0..PER_THREAD)
            .filter(|i| all.contains_key(format!("t{t}/{i:04}").as_bytes()))
            .collect();
        let n = present.len() as u64;
        assert_eq!(
            present,
            (0..n).collect::<Vec<_>>(),
            "{ctx}: thread {t} not a prefix"
        );
        assert!(
            n >= acked_t,
            "{ctx}: thread {t}: {n} present, {acked_t} acknowledged"
        );
        present_total += n;
    }
    let counter = all
        .get(b"counter".as_slice())
        .map_or(0, |v| i64::from_le_bytes(v.as_slice().try_into().unwrap()));
    assert_eq!(
        counter as u64, present_total,
        "{ctx}: a batch was applied partially"
    );
    assert_eq!(db.last_lsn(), present_total, "{ctx}: LSNs are dense");
    present_total
}

#[test]
fn concurrent_writers_share_fsyncs_on_real_files() {
    let dir = tempfile::tempdir().unwrap();
    let opts = EmbeddedOptions {
        cache_size_bytes: 8 << 20,
        checkpoint_interval_ms: None,
        checkpoint_interval_bytes: None,
        ..EmbeddedOptions::default()
    };
    let db = Db::open_real(dir.path(), opts.clone()).unwrap();
    let before = db.stats().log;
    let acked = write_concurrently(&db);
    let after = db.stats().log;
    let writes = THREADS * PER_THREAD;
    assert_eq!(acked, vec![PER_THREAD; THREADS as usize]);
    assert_eq!(after.append_calls - before.append_calls, writes);
    let fsyncs = after.fsyncs - before.fsyncs;
    eprintln!("{writes} writes, {fsyncs} fsyncs");
    assert!(
        fsyncs < writes,
        "no group commit: {fsyncs} fsyncs for {writes} writes"
    );
    drop(db); // no checkpoint: the reopen replays
    let db = Db::open_real(dir.path(), opts).unwrap();
    assert_eq!(db.stats().replayed_records, writes);
    check_recovered(&db, &acked, "real files");
}

#[test]
fn concurrent_writers_survive_power_loss() {
    let (mut crashed_mid_run, mut beyond_acked) = (0, 0);
    for seed in 0..SEEDS {
        let mut rng = Rng(seed);
        let vfs = FaultVfs::new(seed);
        let mut opts = small_opts();
        if seed % 2 == 1 {
            opts.checkpoint_interval_bytes = Some(2048);
        }
        let db = open(&vfs, &opts).unwrap();
        // Power is lost somewhere in the middle of the run (a whole run takes 300 to 800
        // mutating operations on FaultVfs, depending on scheduling). (Group commit is measured on real
        // files above: FaultVfs's in-memory fsync is instantaneous, so how many writes share
        // one here depends only on thread scheduling.)
        vfs.set_crash_point(Some(vfs.op_count() + 10 + rng.below(300)));
        let acked = write_concurrently(&db);
        vfs.set_crash_point(Some(vfs.op_count()));
        drop(db);
        vfs.crash(seed % 3 == 0);
        let db = open(&vfs, &opts).unwrap_or_else(|e| panic!("seed {seed}: recovery failed: {e}"));
        let recovered = check_recovered(&db, &acked, &format!("seed {seed}"));
        let total_acked: u64 = acked.iter().sum();
        crashed_mid_run += u64::from(total_acked < THREADS * PER_THREAD);
        beyond_acked += u64::from(recovered > total_acked);
    }
    eprintln!(
        "{SEEDS} seeds: {crashed_mid_run} crashed mid-run, {beyond_acked} recovered unacknowledged batches"
    );
    assert!(crashed_mid_run >= SEEDS / 2, "the crash points missed the runs");
}
