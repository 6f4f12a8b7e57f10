//! Checkpoints that run beside writers: the snapshot taken at the begin is what a crash after
//! the commit returns, whatever the writers did while it was written, and the live tree keeps
//! its newer state (deterministic interleavings: begin, writes, run, finish).
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ftkv_vfs::{FaultVfs, Vfs};

use super::{FractalEngine, TreeParams};
use crate::model::apply_ops;
use crate::{Engine, EngineOptions, UpsertOp, WriteOp};

const SMALL: TreeParams = TreeParams {
    node_size_bytes: 2048,
    basement_size_bytes: 512,
    fanout: 4,
};

fn open(vfs: &Arc<FaultVfs>, cache_size_bytes: u64) -> FractalEngine {
    FractalEngine::open_with_params(
        vfs.clone() as Arc<dyn Vfs>,
        &EngineOptions {
            dir: Path::new("/engine").to_path_buf(),
            cache_size_bytes,
            compression_level: Some(1),
        },
        SMALL,
    )
    .unwrap()
}

/// Random puts, deletes and upserts over 3,000 keys (LCG `x`), tagged with `round`.
fn batch(x: &mut u64, round: u64) -> Vec<WriteOp> {
    (0..40)
        .map(|_| {
            *x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let key = format!("key{:06}", (*x >> 33) % 3000).into_bytes();
            match *x % 11 {
                0 => WriteOp::Delete { key },
                1 => WriteOp::Upsert {
                    key,
                    op: UpsertOp::Append(b"+".to_vec()),
                },
                _ => WriteOp::Put {
                    key,
                    value: format!("r{round}-{}", *x % 997).into_bytes(),
                },
            }
        })
        .collect()
}

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
            assert_eq!(
                dump(&e),
                model,
                "live tree after checkpoint {cycle} (seed {seed})"
            );
            e.check_integrity().unwrap();
        }
        // Writes after the last checkpoint are lost in the crash; the checkpoint's are not.
        for _ in 0..5 {
            round += 1;
            e.write(&batch(&mut x, round), Some(&round.to_le_bytes()))
                .unwrap();
        }
        drop(e);
        vfs.crash(false);
        let e = open(&vfs, cache_size_bytes);
        assert_eq!(e.meta().unwrap(), Some(durable.0.to_le_bytes().to_vec()));
        assert_eq!(dump(&e), durable.1, "after the crash (seed {seed})");
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
        assert_eq!(dump(&e), model, "after the second crash (seed {seed})");
        e.check_integrity().unwrap();
    }
}
