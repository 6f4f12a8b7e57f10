//! Bulk loads through the state machine across crashes: stage entries, the commit and later
//! writes are applied over a fractal engine on a `FaultVfs`, a checkpoint lands somewhere in
//! between, power is lost at a random point, and the reopened state machine replays the log
//! from its applied index, as every replica does after `kill -9`: the loaded rows must be there,
//! all of them, with nothing of the staging left, whichever path (rebuild or messages) ingests.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ftkv_engine::{Engine, EngineOptions, FractalEngine, FractalOptions, OnDuplicate, WriteOp};
use ftkv_vfs::{FaultVfs, Vfs};
use openraft::storage::RaftStateMachine;
use openraft::EntryPayload;

use crate::cluster::bulk::{staged_chunks, staging_area, ChunkBuilder};
use crate::cluster::command::{Command, CommandResult, LoadId};
use crate::cluster::snapshot::SnapshotDir;
use crate::cluster::state_machine::StateMachine;
use crate::cluster::types::{Entry, EntryCommands};

const CHUNKS: u32 = 4;
const ROWS_PER_CHUNK: u64 = 1_500;
/// The whole run (applies and both checkpoints) takes about 23 counted file operations: crash
/// points are spread over them.
const CRASH_SPAN_OPS: u64 = 26;

fn open(vfs: &Arc<FaultVfs>) -> Result<StateMachine, String> {
    let engine = FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &EngineOptions {
            dir: "/data/engine".into(),
            cache_size_bytes: 256 * 1024,
            compression_level: None,
        },
        FractalOptions {
            cleaner_period_ms: None,
            ..FractalOptions::default()
        },
    )
    .map_err(|e| e.to_string())?;
    StateMachine::open_in(
        Arc::new(engine),
        SnapshotDir::new(vfs.clone() as Arc<dyn Vfs>, Path::new("/data/snapshots")),
    )
    .map_err(|e| e.to_string())
}

fn entry(index: u64, commands: Vec<Command>) -> Entry {
    Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(EntryCommands { commands }),
    }
}

fn row_key(i: u64) -> Vec<u8> {
    format!("t/{i:08}").into_bytes()
}

fn row_value(i: u64) -> Vec<u8> {
    format!("{i:08}-{}", "v".repeat(90)).into_bytes()
}

fn put(key: &str, value: &str) -> Command {
    Command::Write {
        session: None,
        ops: vec![WriteOp::Put {
            key: key.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
        }],
    }
}

/// The log: a little bookkeeping, the load's stages, its commit, writes after it.
fn log() -> Vec<Entry> {
    let load = LoadId { term: 1, nonce: 7 };
    let mut commands = vec![vec![put("a/before-1", "x")], vec![put("a/before-2", "y")]];
    for seq in 0..CHUNKS {
        let mut b = ChunkBuilder::default();
        // Unsorted across chunks (the last chunk holds the lowest keys): the sort runs.
        let base = u64::from((seq + 1) % CHUNKS) * ROWS_PER_CHUNK;
        for i in base..base + ROWS_PER_CHUNK {
            b.push(&row_key(i), &row_value(i));
        }
        commands.push(vec![Command::BulkStage {
            load,
            seq,
            chunk: b.finish().unwrap(),
        }]);
    }
    commands.push(vec![Command::BulkCommit {
        load,
        chunks: CHUNKS,
        rows: u64::from(CHUNKS) * ROWS_PER_CHUNK,
        on_duplicate: OnDuplicate::Error,
    }]);
    for i in 0..6 {
        commands.push(vec![put(&format!("a/after-{i}"), "z")]);
    }
    commands
        .into_iter()
        .enumerate()
        .map(|(i, c)| entry(i as u64 + 1, c))
        .collect()
}

fn expected() -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m: BTreeMap<Vec<u8>, Vec<u8>> = (0..u64::from(CHUNKS) * ROWS_PER_CHUNK)
        .map(|i| (row_key(i), row_value(i)))
        .collect();
    m.insert(b"a/before-1".to_vec(), b"x".to_vec());
    m.insert(b"a/before-2".to_vec(), b"y".to_vec());
    for i in 0..6 {
        m.insert(format!("a/after-{i}").into_bytes(), b"z".to_vec());
    }
    m
}

fn client_pairs(engine: &dyn Engine) -> BTreeMap<Vec<u8>, Vec<u8>> {
    engine
        .scan(b"a/", Some(b"u"), usize::MAX)
        .unwrap()
        .into_iter()
        .collect()
}

/// Applies `entries` one at a time, checkpointing after entry `checkpoint_after`; stops at the
/// first storage error (the crash point tripped).
async fn apply_until_error(sm: &mut StateMachine, entries: &[Entry], checkpoint_after: u64) {
    for e in entries {
        let index = e.log_id.index;
        if sm.apply(vec![e.clone()]).await.is_err() {
            return;
        }
        if index == checkpoint_after && sm.checkpoint().is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_around_a_bulk_commit_replays_to_the_whole_load() {
    let entries = log();
    let last = entries.len() as u64;
    let commit = last - 6;
    let want = expected();
    let mut crashed_before_commit_durable = 0;
    for seed in 0..64u64 {
        let vfs = FaultVfs::new(seed);
        let mut sm = open(&vfs).unwrap();
        // A checkpoint before, at or after the commit; power lost at any file operation, or
        // none (a final checkpoint instead).
        let checkpoint_after = 1 + seed % last;
        let ahead = (seed % 4 != 3).then(|| vfs.op_count() + 1 + (seed * 7_919) % CRASH_SPAN_OPS);
        vfs.set_crash_point(ahead);
        apply_until_error(&mut sm, &entries, checkpoint_after).await;
        if ahead.is_none() {
            sm.checkpoint().unwrap();
        }
        drop(sm);
        vfs.crash(seed % 3 == 0);

        let mut sm = open(&vfs).unwrap();
        let applied = sm.applied_index();
        if applied < commit {
            crashed_before_commit_durable += 1;
        }
        let rest: Vec<Entry> = entries
            .iter()
            .filter(|e| e.log_id.index > applied)
            .cloned()
            .collect();
        let results = sm.apply(rest.clone()).await.unwrap();
        for (e, r) in rest.iter().zip(&results) {
            if e.log_id.index == commit {
                assert!(
                    matches!(r.results.first(), Some(CommandResult::BulkLoaded { .. })),
                    "seed {seed}: the replayed commit (applied {applied}) was {r:?}"
                );
            }
        }
        let engine = sm.engine();
        let got = client_pairs(engine.as_ref());
        assert_eq!(
            got.len(),
            want.len(),
            "seed {seed}: applied index {applied} at reopen, checkpoint after {checkpoint_after}, crash at {ahead:?}"
        );
        assert!(got == want, "seed {seed}: values differ");
        let (start, end) = staging_area();
        assert!(
            engine.scan(&start, Some(&end), 1).unwrap().is_empty(),
            "seed {seed}: staging left behind"
        );
        engine.check_integrity().unwrap();
    }
    assert!(crashed_before_commit_durable > 0, "no crash ever lost the commit");
}

/// The restart shape of `a_leader_killed_mid_load...` (tests/tests/bulk_load.rs): a fresh engine
/// re-applies every stage entry in one batch, the cleaner runs while the node waits for an
/// election, and the commit is applied later together with the new leader's blank entry.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_applied_after_a_pause_keeps_every_row() {
    let vfs = FaultVfs::new(5);
    let engine = FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &EngineOptions {
            dir: "/data/engine".into(),
            cache_size_bytes: 256 << 20,
            compression_level: Some(1),
        },
        FractalOptions::default(),
    )
    .unwrap();
    let mut sm = StateMachine::open_in(
        Arc::new(engine),
        SnapshotDir::new(vfs.clone() as Arc<dyn Vfs>, Path::new("/data/snapshots")),
    )
    .unwrap();
    let entries = log();
    let last = entries.len() as u64;
    let commit = last - 6;
    let (before, after): (Vec<Entry>, Vec<Entry>) =
        entries.into_iter().partition(|e| e.log_id.index < commit);
    sm.apply(before).await.unwrap();
    assert_eq!(staged_chunks(sm.engine().as_ref()).unwrap(), u64::from(CHUNKS));
    tokio::time::sleep(std::time::Duration::from_millis(1_500)).await;
    let mut after: Vec<Entry> = after.into_iter().take(1).collect();
    after.push(Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(2, 1), commit + 1),
        payload: EntryPayload::Blank,
    });
    let r = sm.apply(after).await.unwrap();
    assert!(
        matches!(r[0].results.first(), Some(CommandResult::BulkLoaded { .. })),
        "{r:?}"
    );
    let engine = sm.engine();
    let got = engine.scan(b"t/", Some(b"u"), usize::MAX).unwrap();
    assert_eq!(got.len() as u64, u64::from(CHUNKS) * ROWS_PER_CHUNK);
    assert_eq!(staged_chunks(engine.as_ref()).unwrap(), 0);
}
