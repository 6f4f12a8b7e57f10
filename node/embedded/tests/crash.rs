//! Crash test: engine and log on one `FaultVfs`; power is lost at a random mutating operation
//! (or at a random moment with nothing failing), sometimes with a torn last write, sometimes
//! again during the recovery itself. After reopen + replay the database must hold exactly the
//! state after a prefix of the write sequence that includes **every acknowledged write**:
//! recovered LSN `k` with `acked <= k <= attempted` and contents equal to the model after `k`
//! batches. Then it must keep working: LSNs continue at `k + 1` and survive a clean reopen.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;

use common::{assert_same, dump, open, random_batch, small_opts, Model, Rng};
use ftkv_embedded::{EmbeddedOptions, SyncMode};
use ftkv_engine::model::apply_ops;
use ftkv_engine::WriteOp;
use ftkv_vfs::FaultVfs;

const BATCHES: usize = 40;
const SEEDS: u64 = 300;

/// Crash points are drawn in this many mutating operations after the warm-up: a whole run of
/// `BATCHES` writes with occasional checkpoints takes about 150 on `FaultVfs` (the test prints
/// the figures), so most seeds crash while writing.
const SPAN: u64 = 160;

/// Power cut now: every later operation fails, then the reboot drops what was not synced.
fn power_cut(vfs: &Arc<FaultVfs>, torn: bool) {
    vfs.set_crash_point(Some(vfs.op_count()));
    vfs.crash(torn);
}

/// What one seed exercised.
#[derive(Debug, Default, Clone, Copy)]
struct Coverage {
    /// The crash point tripped while writing (a write or checkpoint failed).
    tripped: u64,
    /// Recovery replayed log records.
    replayed: u64,
    /// Recovered a batch whose write was not acknowledged (its record became durable, or the
    /// engine checkpointed it, before the failure).
    beyond_acked: u64,
    /// Periodic sync mode.
    periodic: u64,
    /// Power was lost again during recovery.
    crashed_in_recovery: u64,
    /// Mutating operations of the run (for choosing `SPAN`).
    ops: u64,
}

fn run_seed(seed: u64) -> Coverage {
    let mut cov = Coverage::default();
    let mut rng = Rng(seed);
    let vfs = FaultVfs::new(seed);
    let mut opts: EmbeddedOptions = small_opts();
    if rng.chance(40) {
        // Background checkpoints race the writer (and the crash).
        opts.checkpoint_interval_bytes = Some(512 + rng.below(4096));
    }
    // Periodic sync: acknowledged writes may be lost (documented), only those covered by a
    // completed checkpoint or sync are guaranteed; the engine can checkpoint batches whose log
    // records are not yet synced, so recovery must continue the log above the engine.
    let periodic = rng.chance(25);
    if periodic {
        opts.log.sync = SyncMode::Periodic { period_ms: 60_000 };
    }
    let batches: Vec<Vec<WriteOp>> = (0..BATCHES as u64)
        .map(|i| random_batch(&mut rng, 48, 4, i + 1))
        .collect();
    // states[k] = the model after the first k batches.
    let mut states = vec![Model::new()];
    for b in &batches {
        let mut next = states.last().unwrap().clone();
        apply_ops(&mut next, b);
        states.push(next);
    }

    let db = open(&vfs, &opts).unwrap();
    let warm = rng.below(BATCHES as u64 / 2) as usize;
    let crash_at = rng.chance(80).then(|| vfs.op_count() + 1 + rng.below(SPAN));
    let mut acked = 0usize;
    let mut attempted = 0usize;
    // LSN every recovery must reach: acknowledged (Always) or checkpointed/synced (Periodic).
    let mut floor = 0usize;
    for (i, b) in batches.iter().enumerate() {
        if i == warm {
            vfs.set_crash_point(crash_at);
        }
        attempted = i + 1;
        match db.write(b) {
            Ok(lsn) => {
                assert_eq!(lsn as usize, i + 1, "seed {seed}");
                acked = i + 1;
                if !periodic {
                    floor = acked;
                }
            }
            Err(_) => break,
        }
        if rng.chance(12) {
            match db.checkpoint() {
                Ok(_) => floor = acked,
                Err(_) => break,
            }
        }
        if periodic && rng.chance(5) {
            match db.sync() {
                Ok(()) => floor = acked,
                Err(_) => break,
            }
        }
        if crash_at.is_none() && rng.chance(3) {
            break; // power cut at a random moment, nothing failing before it
        }
    }
    cov.ops = vfs.op_count();
    if vfs.is_tripped() {
        cov.tripped = 1;
        // Everything after the failure is poisoned, loudly.
        assert!(
            db.write(&batches[0]).is_err(),
            "seed {seed}: write after a fault succeeded"
        );
    }
    vfs.set_crash_point(Some(vfs.op_count()));
    drop(db);
    vfs.crash(rng.chance(50));

    if rng.chance(25) {
        cov.crashed_in_recovery = 1;
        // Lose power again in the middle of recovery (replay, its checkpoint, the log's repair).
        vfs.set_crash_point(Some(vfs.op_count() + 1 + rng.below(60)));
        drop(open(&vfs, &opts));
        power_cut(&vfs, rng.chance(50));
    }

    let db = open(&vfs, &opts).unwrap_or_else(|e| panic!("seed {seed}: recovery failed: {e}"));
    let k = db.last_lsn() as usize;
    cov.replayed = u64::from(db.stats().replayed_records > 0);
    cov.beyond_acked = u64::from(k > acked);
    assert!(
        floor <= k && k <= attempted,
        "seed {seed}: recovered LSN {k}, acknowledged {acked}, guaranteed {floor}, attempted {attempted}"
    );
    assert_same(
        &dump(&db),
        &states[k],
        &format!("seed {seed}: recovered LSN {k} (acknowledged {acked}, attempted {attempted})"),
    );
    if periodic {
        cov.periodic = 1;
    }

    // It keeps working: new batches continue the LSN sequence and survive a reopen.
    let mut model = states[k].clone();
    for j in 0..3u64 {
        let b = random_batch(&mut rng, 48, 4, 1000 + j);
        assert_eq!(db.write(&b).unwrap(), k as u64 + 1 + j, "seed {seed}");
        apply_ops(&mut model, &b);
    }
    drop(db);
    power_cut(&vfs, false);
    let db = open(&vfs, &opts).unwrap_or_else(|e| panic!("seed {seed}: second recovery failed: {e}"));
    assert_same(
        &dump(&db),
        &model,
        &format!("seed {seed}: after writes past the recovery"),
    );
    db.check_integrity().unwrap();
    cov
}

#[test]
fn recovery_keeps_every_acknowledged_write_and_a_prefix() {
    let only: Option<u64> = std::env::var("FTKV_CRASH_SEED").ok().and_then(|s| s.parse().ok());
    if let Some(seed) = only {
        eprintln!("{:?}", run_seed(seed));
        return;
    }
    let mut total = Coverage::default();
    let mut max_ops = 0;
    for seed in 0..SEEDS {
        let c = run_seed(seed);
        total.tripped += c.tripped;
        total.replayed += c.replayed;
        total.beyond_acked += c.beyond_acked;
        total.crashed_in_recovery += c.crashed_in_recovery;
        total.periodic += c.periodic;
        total.ops += c.ops;
        max_ops = max_ops.max(c.ops);
    }
    eprintln!(
        "{SEEDS} seeds: {total:?}, mean ops {}, max ops {max_ops}",
        total.ops / SEEDS
    );
    // The run really crashes mid-write and replays.
    assert!(total.tripped >= SEEDS / 2, "{total:?}");
    assert!(total.replayed >= SEEDS / 2, "{total:?}");
    assert!(total.crashed_in_recovery >= SEEDS / 8, "{total:?}");
}
