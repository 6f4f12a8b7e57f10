//! The cleaner thread: it drains gorged internal buffers with no write to drive it, it takes
//! turns with writers, readers and checkpoints without changing what they see, and an I/O
//! error it meets poisons the engine and is returned, named, by the next write.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ftkv_vfs::FaultVfs;

use super::node::Node;
use super::{test_support, FractalEngine, TreeParams};
use crate::model::{apply_ops, assert_same_as_model};
use crate::{Engine, EngineError, WriteOp};

const SMALL: TreeParams = TreeParams {
    node_size_bytes: 4096,
    basement_size_bytes: 512,
    fanout: 4,
};

fn open(vfs: &Arc<FaultVfs>, cache_size_bytes: u64, cleaner_period_ms: Option<u64>) -> FractalEngine {
    test_support::open_on(vfs, SMALL, cache_size_bytes, cleaner_period_ms)
}

/// Random puts, deletes, upserts and an occasional range delete over 4,000 keys (LCG `x`).
fn batch(x: &mut u64, round: u64) -> Vec<WriteOp> {
    test_support::random_batch(x, round, 30, 4000, "-padding-padding", 41)
}

/// Bytes buffered in the root (0 when it is a leaf or not cached).
fn root_buffered_bytes(e: &FractalEngine) -> usize {
    let inner = e.inner.read();
    match inner.tree.store.peek_quiet(inner.tree.root) {
        Some(Node::Internal(n)) => n.size_bytes(),
        _ => 0,
    }
}

fn contents(e: &FractalEngine) -> BTreeMap<Vec<u8>, Vec<u8>> {
    e.scan(b"", None, usize::MAX).unwrap().into_iter().collect()
}

#[test]
fn cleaner_drains_a_half_gorged_root_with_no_write_to_drive_it() {
    let vfs = FaultVfs::new(11);
    // Rounds every 50 ms: once no write came for a period, the cleaner drains to half.
    let e = open(&vfs, 64 << 20, Some(50));
    let mut model = BTreeMap::new();
    let mut x = 5u64;
    let half = SMALL.node_size_bytes / 2;
    let mut round = 0;
    // Write until a batch leaves the root at least half gorged (the tree has grown past one
    // leaf by then).
    loop {
        let ops = batch(&mut x, round);
        e.write(&ops, None).unwrap();
        apply_ops(&mut model, &ops);
        round += 1;
        let tall = {
            let g = e.inner.read();
            g.tree
                .store
                .peek_quiet(g.tree.root)
                .is_some_and(|n| n.height() >= 2)
        };
        if tall && root_buffered_bytes(&e) >= half {
            break;
        }
        assert!(round < 5_000, "the root never reached half its gorge limit");
    }
    // No more writes: the cleaner alone must bring the root under half.
    let t0 = Instant::now();
    while root_buffered_bytes(&e) >= half {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the root still holds {} bytes (limit {}) 20 s after the last write; cleaner flushes {}",
            root_buffered_bytes(&e),
            SMALL.node_size_bytes,
            e.spill_stats().cleaner_flushes
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(e.spill_stats().cleaner_flushes > 0);
    assert_same_as_model(&contents(&e), &model, "after the cleaner drained the root");
    for (k, v) in model.iter().step_by(13) {
        assert_eq!(
            e.get(k).unwrap().as_ref(),
            Some(v),
            "key {:?}",
            String::from_utf8_lossy(k)
        );
    }
    e.check_integrity().unwrap();
}

#[test]
fn cleaner_beside_writers_readers_and_checkpoints_keeps_the_model() {
    let vfs = FaultVfs::new(12);
    // A small cache: spills, runs and evictions happen, and the cleaner runs every millisecond.
    let e = Arc::new(open(&vfs, 96 << 10, Some(1)));
    let stop = Arc::new(AtomicBool::new(false));
    // A reader beside everything: every key it reads is one the writer wrote ("key" prefix) and
    // no read fails.
    let reader = {
        let e = Arc::clone(&e);
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut reads = 0u64;
            let mut y = 99u64;
            while !stop.load(Ordering::Relaxed) {
                y = y.wrapping_mul(6364136223846793005).wrapping_add(1);
                let k = format!("key{:06}", (y >> 33) % 4000);
                let _ = e.get(k.as_bytes()).unwrap();
                let rows = e.scan(k.as_bytes(), None, 20).unwrap();
                assert!(rows.windows(2).all(|w| w[0].0 < w[1].0), "scan out of order");
                reads += 1;
            }
            reads
        })
    };
    let mut model = BTreeMap::new();
    let mut checkpointed = BTreeMap::new();
    let mut x = 17u64;
    for round in 0..400 {
        let ops = batch(&mut x, round);
        e.write(&ops, Some(format!("round {round}").as_bytes())).unwrap();
        apply_ops(&mut model, &ops);
        if round % 60 == 59 {
            e.checkpoint().unwrap();
            checkpointed = model.clone();
        }
        if round % 25 == 0 {
            // Give the cleaner turns between batches.
            std::thread::sleep(Duration::from_millis(3));
        }
    }
    stop.store(true, Ordering::Relaxed);
    assert!(reader.join().unwrap() > 0);
    // On a loaded machine the cleaner may not have had a turn between batches: it gets one now
    // that writes stopped.
    let t0 = Instant::now();
    while e.spill_stats().cleaner_flushes == 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the cleaner never flushed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_same_as_model(&contents(&e), &model, "live tree after 400 rounds");
    e.check_integrity().unwrap();
    // A crash returns the last checkpoint, whatever the cleaner changed after it.
    drop(Arc::into_inner(e).unwrap());
    vfs.crash(true);
    let e = open(&vfs, 96 << 10, Some(1));
    assert_same_as_model(&contents(&e), &checkpointed, "after a crash");
    e.check_integrity().unwrap();
}

#[test]
fn an_io_error_on_the_cleaner_thread_poisons_and_is_returned_by_the_next_write() {
    let vfs = FaultVfs::new(13);
    // Rounds every 50 ms; the cleaner acts once no write came for 50 ms.
    let e = open(&vfs, 64 << 10, Some(50));
    let mut x = 23u64;
    for round in 0..200 {
        e.write(&batch(&mut x, round), None).unwrap();
    }
    e.checkpoint().unwrap();
    // Every I/O fails from now on. Work for the cleaner without a write: messages pushed into
    // the root's buffers up to half its gorge limit (no flush, so no I/O on this thread), then
    // a wake; again until the cleaner's flushes reach a node or run that needs the disk.
    vfs.fail_after(Some(0));
    let before = e.spill_stats().cleaner_flushes;
    let t0 = Instant::now();
    let mut i = 0u64;
    while !e.inner.read().poisoned {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the cleaner did not meet the fault (cleaner flushes {before} -> {})",
            e.spill_stats().cleaner_flushes
        );
        {
            let mut inner = e.inner.write();
            if inner.poisoned {
                break;
            }
            let t = &mut inner.tree;
            while (root_size(t) as u64) * 1024
                < SMALL.node_size_bytes as u64 * super::tree::CLEAN_IDLE_FULLNESS_1024
            {
                let msn = t.next_msn();
                t.inject(super::msg::Msg::Point {
                    msn,
                    key: format!("key{:06}-injected-{i}", (i * 37) % 4000).into_bytes(),
                    op: super::msg::PointOp::Put(b"injected".to_vec()),
                })
                .unwrap();
                i += 1;
            }
        }
        e._cleaner.as_ref().unwrap().wake();
        std::thread::sleep(Duration::from_millis(20));
    }
    let first = e.write(&batch(&mut x, 999), None).unwrap_err();
    assert!(
        matches!(first, EngineError::Io { .. }),
        "the first write after a background fault must name it, got {first}"
    );
    let second = e.write(&batch(&mut x, 1000), None).unwrap_err();
    assert!(matches!(second, EngineError::Poisoned), "got {second}");
}

fn root_size(t: &super::tree::Tree) -> usize {
    match t.store.peek_quiet(t.root) {
        Some(Node::Internal(n)) => n.size_bytes(),
        _ => usize::MAX / 4,
    }
}
