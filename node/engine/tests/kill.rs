#![allow(clippy::unwrap_used)]
//! Kills a real child process (SIGKILL) at random moments while it writes and checkpoints a
//! fractal tree on the real file system (issue 3, acceptance 2). After each kill the tree must
//! reopen at a checkpoint no older than the last one the child reported durable, hold exactly
//! the data of that checkpoint (recomputed from the deterministic workload), and pass
//! `check_integrity`.
//!
//! The child is this test binary re-run with `FTKV_KILL_CHILD_DIR` set.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use ftkv_engine::model::apply_ops;
use ftkv_engine::{Engine, EngineOptions, UpsertOp, WriteOp};
use ftkv_engine::{FractalEngine, TreeParams};

const PARAMS: TreeParams = TreeParams {
    node_size_bytes: 16 << 10,
    basement_size_bytes: 2 << 10,
    fanout: 6,
};

fn opts(dir: &std::path::Path) -> EngineOptions {
    EngineOptions {
        dir: dir.to_path_buf(),
        cache_size_bytes: 64 << 10,
        compression_level: Some(1),
    }
}

/// Batch `i` of the deterministic workload.
fn batch(i: u64) -> Vec<WriteOp> {
    let mut ops: Vec<WriteOp> = (0..40u64)
        .map(|j| {
            let k = (i * 7919 + j * 104_729) % 5000;
            WriteOp::Put {
                key: format!("k{k:05}").into_bytes(),
                value: format!("v{i}-{j}").into_bytes(),
            }
        })
        .collect();
    ops.push(WriteOp::Upsert {
        key: b"counter".to_vec(),
        op: UpsertOp::Add(1),
    });
    if i.is_multiple_of(13) {
        let s = (i * 31) % 5000;
        ops.push(WriteOp::DeleteRange {
            start: format!("k{s:05}").into_bytes(),
            end: Some(format!("k{:05}", s + 50).into_bytes()),
        });
    }
    ops
}

fn model_after(batches: u64) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    for i in 1..=batches {
        apply_ops(&mut m, &batch(i));
    }
    m
}

fn meta_index(meta: Option<Vec<u8>>) -> u64 {
    meta.map(|m| String::from_utf8(m).unwrap().parse().unwrap())
        .unwrap_or(0)
}

/// Child: continue the workload from the tree's checkpoint, checkpointing every few batches.
fn child(dir: &std::path::Path) {
    let e = FractalEngine::open_with(
        ftkv_vfs::RealVfs::new(),
        &opts(dir),
        ftkv_engine::FractalOptions::with_tree(PARAMS),
    )
    .unwrap();
    let mut i = meta_index(e.meta().unwrap());
    loop {
        i += 1;
        e.write(&batch(i), Some(i.to_string().as_bytes())).unwrap();
        if i.is_multiple_of(3) {
            e.checkpoint().unwrap();
            println!("durable {i}");
        }
    }
}

#[test]
fn sigkill_at_random_moments_recovers_a_checkpoint() {
    if let Ok(dir) = std::env::var("FTKV_KILL_CHILD_DIR") {
        child(std::path::Path::new(&dir));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("engine");
    let exe = std::env::current_exe().unwrap();
    let mut last_reported = 0u64;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for round in 0..12 {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "sigkill_at_random_moments_recovers_a_checkpoint",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FTKV_KILL_CHILD_DIR", &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut last = 0u64;
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("durable ") {
                    last = n.parse().unwrap_or(last);
                }
            }
            last
        });
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        std::thread::sleep(Duration::from_millis(50 + x % 400));
        child.kill().unwrap();
        child.wait().unwrap();
        last_reported = last_reported.max(reader.join().unwrap());
        let e = FractalEngine::open_with(
            ftkv_vfs::RealVfs::new(),
            &opts(&dir),
            ftkv_engine::FractalOptions::with_tree(PARAMS),
        )
        .unwrap();
        let at = meta_index(e.meta().unwrap());
        assert!(
            at >= last_reported,
            "round {round}: reopened at batch {at}, child reported {last_reported} durable"
        );
        assert_eq!(at % 3, 0, "round {round}: meta {at} is not a checkpoint");
        let got: BTreeMap<_, _> = e.scan(b"", None, usize::MAX).unwrap().into_iter().collect();
        assert_eq!(
            got,
            model_after(at),
            "round {round}: data differs from checkpoint {at}"
        );
        e.check_integrity().unwrap();
        last_reported = at;
    }
    assert!(last_reported > 0, "the child never reached a checkpoint");
}
