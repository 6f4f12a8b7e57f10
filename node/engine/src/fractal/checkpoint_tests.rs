//! Checkpoints that run beside writers: the snapshot taken at the begin is what a crash after
//! the commit returns, whatever the writers did while it was written, and the live tree keeps
//! its newer state (deterministic interleavings: begin, writes, run, finish).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::Arc;

use ftkv_vfs::FaultVfs;

use super::{test_support, FractalEngine, TreeParams};
use crate::model::apply_ops;
use crate::{Engine, WriteOp};

const SMALL: TreeParams = TreeParams {
    node_size_bytes: 2048,
    basement_size_bytes: 512,
    fanout: 4,
};

/// Opens without the cleaner thread: these tests step writeback and checkpoints by hand in a
/// fixed order.
fn open(vfs: &Arc<FaultVfs>, cache_size_bytes: u64) -> FractalEngine {
    test_support::open_on(vfs, SMALL, cache_size_bytes, None)
}

/// Random puts, deletes and upserts over 3,000 keys (LCG `x`), tagged with `round`.
fn batch(x: &mut u64, round: u64) -> Vec<WriteOp> {
    test_support::random_batch(x, round, 40, 3000, "", 0)
}

/// Writes five more rounds (never checkpointed), crashes (unsynced data dropped) and reopens.
fn crash_after_unsynced_writes(
    e: FractalEngine,
    vfs: &Arc<FaultVfs>,
    cache_size_bytes: u64,
    x: &mut u64,
    round: &mut u64,
) -> FractalEngine {
    for _ in 0..5 {
        *round += 1;
        e.write(&batch(x, *round), Some(&round.to_le_bytes())).unwrap();
    }
    drop(e);
    vfs.crash(false);
    open(vfs, cache_size_bytes)
}

/// Keys to values.
type Model = BTreeMap<Vec<u8>, Vec<u8>>;

use crate::model::assert_same_as_model as assert_same;

fn dump(e: &FractalEngine) -> BTreeMap<Vec<u8>, Vec<u8>> {
    e.scan(b"", None, usize::MAX).unwrap().into_iter().collect()
}

/// Begins a checkpoint, applies `during` rounds of writes while it is "being written", then
/// runs and finishes it. Returns the model as of the begin.
fn overlapped_checkpoint(
    e: &FractalEngine,
    x: &mut u64,
    round: &mut u64,
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    during: u64,
) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let at_begin = model.clone();
    let job = e.inner.write().tree.begin_checkpoint();
    for _ in 0..during {
        *round += 1;
        let ops = batch(x, *round);
        e.write(&ops, Some(&round.to_le_bytes())).unwrap();
        apply_ops(model, &ops);
    }
    let done = job.run().unwrap();
    let stats = e.inner.write().tree.store.finish_checkpoint(done).unwrap();
    assert!(stats.nodes_written > 0);
    if during > 0 {
        // The root took every write since the begin: its snapshot is not adopted.
        assert!(stats.adopted < stats.nodes_written, "{stats:?}");
    }
    at_begin
}

#[test]
fn a_crash_after_an_overlapped_checkpoint_returns_its_snapshot() {
    for (seed, cache_size_bytes) in [(1u64, 16u64 << 10), (2, 64 << 10), (3, 1 << 20)] {
        let vfs = FaultVfs::new(seed);
        let e = open(&vfs, cache_size_bytes);
        let mut x = seed;
        let mut round = 0u64;
        let mut model = BTreeMap::new();
        let mut durable = (0u64, BTreeMap::new());
        for cycle in 0..12u64 {
            for _ in 0..10 {
                round += 1;
                let ops = batch(&mut x, round);
                e.write(&ops, Some(&round.to_le_bytes())).unwrap();
                apply_ops(&mut model, &ops);
            }
            let begin_round = round;
            let during = cycle % 4 * 5;
            let snapshot = overlapped_checkpoint(&e, &mut x, &mut round, &mut model, during);
            durable = (begin_round, snapshot);
            // The live tree kept everything written during the checkpoint.
            assert_same(
                &dump(&e),
                &model,
                &format!("live tree after checkpoint {cycle} (seed {seed})"),
            );
            e.check_integrity().unwrap();
        }
        // Writes after the last checkpoint are lost in the crash; the checkpoint's are not.
        let e = crash_after_unsynced_writes(e, &vfs, cache_size_bytes, &mut x, &mut round);
        assert_eq!(e.meta().unwrap(), Some(durable.0.to_le_bytes().to_vec()));
        assert_same(&dump(&e), &durable.1, &format!("after the crash (seed {seed})"));
        e.check_integrity().unwrap();
        // The reopened tree writes and checkpoints on: the space it rebuilt is sound.
        let mut model = durable.1;
        for _ in 0..20 {
            round += 1;
            let ops = batch(&mut x, round);
            e.write(&ops, None).unwrap();
            apply_ops(&mut model, &ops);
        }
        e.checkpoint().unwrap();
        drop(e);
        vfs.crash(true);
        let e = open(&vfs, cache_size_bytes);
        assert_same(
            &dump(&e),
            &model,
            &format!("after the second crash (seed {seed})"),
        );
        e.check_integrity().unwrap();
    }
}

/// Takes the engine's writeback thread away, so the test drives writeback by hand and inline
/// writes stay deterministic.
fn without_writeback_thread(e: &FractalEngine) {
    let mut g = e.inner.write();
    g.writeback = None;
    g.tree.store.set_background_writes(false);
}

/// Background writeback beside writers and checkpoints (deterministic interleavings: begin a
/// job, write, maybe begin a checkpoint, run and finish the job, finish the checkpoint): a node
/// changed while the job wrote it keeps its newer state and stays dirty, an unchanged one is
/// adopted clean, and a crash returns the last checkpoint's snapshot.
#[test]
fn writeback_adopts_only_unchanged_nodes_beside_writers_and_checkpoints() {
    for (seed, cache_size_bytes) in [(11u64, 1u64 << 20), (12, 64 << 10)] {
        let vfs = FaultVfs::new(seed);
        let e = open(&vfs, cache_size_bytes);
        without_writeback_thread(&e);
        let mut x = seed;
        let mut round = 0u64;
        let mut model = BTreeMap::new();
        let mut durable: Option<(u64, Model)> = None;
        let (mut written, mut adopted) = (0u64, 0u64);
        for cycle in 0..12u64 {
            for _ in 0..10 {
                round += 1;
                let ops = batch(&mut x, round);
                e.write(&ops, Some(&round.to_le_bytes())).unwrap();
                apply_ops(&mut model, &ops);
            }
            let job = {
                let mut g = e.inner.write();
                let t = &mut g.tree;
                t.store.next_write_epoch();
                t.store.begin_writeback(0, t.root)
            };
            let Some(job) = job else { continue };
            assert!(!job.is_empty());
            // Writers change some of the nodes the job holds.
            for _ in 0..cycle % 3 * 2 {
                round += 1;
                let ops = batch(&mut x, round);
                e.write(&ops, Some(&round.to_le_bytes())).unwrap();
                apply_ops(&mut model, &ops);
            }
            let checkpoint =
                (cycle % 2 == 0).then(|| (round, model.clone(), e.inner.write().tree.begin_checkpoint()));
            let done = job.run().unwrap();
            let stats = {
                let mut g = e.inner.write();
                let root = g.tree.root;
                g.tree.store.finish_writeback(done, root)
            };
            written += stats.nodes_written;
            adopted += stats.adopted;
            if let Some((r, snapshot, ckpt)) = checkpoint {
                let done = ckpt.run().unwrap();
                e.inner.write().tree.store.finish_checkpoint(done).unwrap();
                durable = Some((r, snapshot));
            }
            assert_same(
                &dump(&e),
                &model,
                &format!("live tree after cycle {cycle} (seed {seed})"),
            );
            e.check_integrity().unwrap();
            assert_eq!(e.inner.write().tree.store.check_space(), Ok(()));
        }
        assert!(adopted > 0, "no writeback adopted (seed {seed})");
        assert!(
            adopted < written,
            "every writeback adopted: writers never raced it (seed {seed})"
        );
        // Writes after the last checkpoint are lost in the crash.
        let e = crash_after_unsynced_writes(e, &vfs, cache_size_bytes, &mut x, &mut round);
        let (r, snapshot) = durable.unwrap();
        assert_eq!(e.meta().unwrap(), Some(r.to_le_bytes().to_vec()));
        assert_same(&dump(&e), &snapshot, &format!("after the crash (seed {seed})"));
        e.check_integrity().unwrap();
    }
}

/// The writeback thread under a small cache: it writes and the tree adopts, reads stay equal
/// to the model throughout, and a checkpoint then a crash return everything.
#[test]
fn writeback_thread_keeps_a_small_cache_consistent() {
    let vfs = FaultVfs::new(21);
    let cache_size_bytes = 32u64 << 10;
    let e = open(&vfs, cache_size_bytes);
    let mut x = 21u64;
    let mut model = BTreeMap::new();
    for round in 1..=300u64 {
        let ops = batch(&mut x, round);
        e.write(&ops, None).unwrap();
        apply_ops(&mut model, &ops);
        if round % 50 == 0 {
            assert_same(&dump(&e), &model, &format!("round {round}"));
            e.check_integrity().unwrap();
        }
    }
    let totals = e.writeback_totals();
    assert!(totals.nodes_written > 0 && totals.adopted > 0, "{totals:?}");
    e.checkpoint().unwrap();
    drop(e);
    vfs.crash(false);
    let e = open(&vfs, cache_size_bytes);
    assert_same(&dump(&e), &model, "after the crash");
    e.check_integrity().unwrap();
}

/// Spilled runs handed to writeback (pending, readable from memory) beside checkpoints, in both
/// orders: a writeback job and a checkpoint may both write the same pending run; whichever is
/// adopted second releases its copy, the durable checkpoint keeps the copy it refers to, and a
/// crash returns the last checkpoint's snapshot. Reads equal the model throughout.
#[test]
fn pending_runs_written_by_writeback_and_checkpoints_survive_a_crash() {
    // Caches small enough that internal nodes' children are often not cached (runs spill).
    for (seed, cache_size_bytes) in [(21u64, 32u64 << 10), (22, 24 << 10)] {
        let vfs = FaultVfs::new(seed);
        let e = open(&vfs, cache_size_bytes);
        without_writeback_thread(&e);
        // Runs are deferred as if a writeback thread took them; this test runs its jobs.
        e.inner.write().tree.store.set_background_writes(true);
        let mut x = seed;
        let mut round = 0u64;
        let mut model = BTreeMap::new();
        let mut durable: Option<(u64, Model)> = None;
        let (mut pending_seen, mut runs_written) = (0usize, 0u64);
        for cycle in 0..16u64 {
            for _ in 0..6 {
                round += 1;
                let ops = batch(&mut x, round);
                e.write(&ops, Some(&round.to_le_bytes())).unwrap();
                apply_ops(&mut model, &ops);
                pending_seen = pending_seen.max(e.inner.read().tree.store.pending_run_ids().count());
            }
            // Reads see pending runs from memory.
            assert_same(
                &dump(&e),
                &model,
                &format!("with pending runs, cycle {cycle} (seed {seed})"),
            );
            let (job, ckpt) = {
                let mut g = e.inner.write();
                let t = &mut g.tree;
                t.store.next_write_epoch();
                let job = t.store.begin_writeback(0, t.root);
                let ckpt = (cycle % 2 == 0).then(|| (round, model.clone(), g.tree.begin_checkpoint()));
                (job, ckpt)
            };
            let finish_job = |job: Option<crate::fractal::store::WritebackJob>| {
                if let Some(job) = job {
                    let done = job.run().unwrap();
                    let mut g = e.inner.write();
                    let root = g.tree.root;
                    g.tree.store.finish_writeback(done, root).runs_written
                } else {
                    0
                }
            };
            let finish_ckpt = |ckpt: Option<(u64, Model, crate::fractal::store::CheckpointJob)>| {
                ckpt.map(|(r, snapshot, job)| {
                    let done = job.run().unwrap();
                    e.inner.write().tree.store.finish_checkpoint(done).unwrap();
                    (r, snapshot)
                })
            };
            // Alternate which of the two is adopted first.
            let d = if cycle % 4 == 0 {
                runs_written += finish_job(job);
                finish_ckpt(ckpt)
            } else {
                let d = finish_ckpt(ckpt);
                runs_written += finish_job(job);
                d
            };
            if d.is_some() {
                durable = d;
            }
            assert_same(
                &dump(&e),
                &model,
                &format!("live tree after cycle {cycle} (seed {seed})"),
            );
            e.check_integrity().unwrap();
            assert_eq!(e.inner.write().tree.store.check_space(), Ok(()));
        }
        assert!(pending_seen > 0, "no run was deferred (seed {seed})");
        assert!(runs_written > 0, "no writeback job wrote a run (seed {seed})");
        let e = crash_after_unsynced_writes(e, &vfs, cache_size_bytes, &mut x, &mut round);
        let (r, snapshot) = durable.unwrap();
        assert_eq!(e.meta().unwrap(), Some(r.to_le_bytes().to_vec()));
        assert_same(&dump(&e), &snapshot, &format!("after the crash (seed {seed})"));
        e.check_integrity().unwrap();
    }
}
