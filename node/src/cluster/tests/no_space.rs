//! Issue 14, item 10: a snapshot build that meets a full disk (the fractal engine and the
//! snapshot directory on one `FaultVfs` with a capacity) never reaches openraft as a
//! `StorageError` (which stops the Raft core): it waits for space, reports the full disk for
//! the NOSPACE alarm, and finishes by itself once space is freed, while apply and reads go on.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use ftkv_engine::{EngineOptions, FractalEngine, FractalOptions, WriteOp};
use ftkv_vfs::{FaultVfs, Vfs};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;

use crate::cluster::command::Command;
use crate::cluster::snapshot::{SnapshotDir, CURRENT_FILE};
use crate::cluster::state_machine::{StateMachine, SNAPSHOT_RETRY_MS};
use crate::cluster::types::{Entry, EntryCommands};

fn entry(index: u64, from: u64, to: u64) -> Entry {
    let ops = (from..to)
        .map(|i| WriteOp::Put {
            key: format!("k{i:06}").into_bytes(),
            value: vec![b'v'; 200],
        })
        .collect();
    Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(EntryCommands {
            commands: vec![Command::Write { session: None, ops }],
        }),
    }
}

fn open(vfs: &Arc<FaultVfs>) -> StateMachine {
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
    .unwrap();
    StateMachine::open_in(
        Arc::new(engine),
        SnapshotDir::new(vfs.clone() as Arc<dyn Vfs>, Path::new("/data/snapshots")),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_build_on_a_full_disk_waits_for_space_and_then_finishes() {
    let vfs = FaultVfs::new(21);
    let mut sm = open(&vfs);
    sm.apply(vec![entry(1, 0, 500)]).await.unwrap();
    sm.get_snapshot_builder().await.build_snapshot().await.unwrap();
    sm.apply(vec![entry(2, 500, 1_500)]).await.unwrap();
    assert_eq!(sm.space_error(), None);

    // The disk is full: the build cannot write the engine's checkpoint or the snapshot file.
    vfs.set_capacity(Some(vfs.used_bytes()));
    let mut builder = sm.get_snapshot_builder().await;
    let build = tokio::spawn(async move { builder.build_snapshot().await });
    tokio::time::sleep(Duration::from_millis(SNAPSHOT_RETRY_MS * 5 / 2)).await;
    assert!(
        !build.is_finished(),
        "the build returned on a full disk: {:?}",
        build.await
    );
    let reported = sm.space_error().expect("the full disk is reported");
    assert!(reported.contains("No space left on device"), "{reported}");
    // Apply and reads go on meanwhile (in the engine's memory).
    sm.apply(vec![entry(3, 1_500, 2_000)]).await.unwrap();
    let engine = sm.engine();
    for i in (0..2_000).step_by(97) {
        let key = format!("k{i:06}");
        assert_eq!(
            engine.get(key.as_bytes()).unwrap(),
            Some(vec![b'v'; 200]),
            "{key}"
        );
    }
    // No unfinished file is left taking space.
    let left: Vec<_> = vfs
        .list_dir(Path::new("/data/snapshots"))
        .unwrap()
        .into_iter()
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "unfinished snapshot files left: {left:?}");

    // Space is freed: the same build finishes by itself, covering everything applied.
    vfs.set_capacity(None);
    let snapshot = tokio::time::timeout(Duration::from_millis(SNAPSHOT_RETRY_MS * 10), build)
        .await
        .expect("the build finishes once space is freed")
        .unwrap()
        .unwrap();
    assert_eq!(snapshot.meta.last_log_id.map(|l| l.index), Some(3));
    assert_eq!(sm.space_error(), None);
    let on_disk = sm
        .snapshots()
        .verify_file(&sm.snapshots().join(CURRENT_FILE))
        .unwrap();
    assert_eq!(on_disk, snapshot.meta);

    // Reopened after a crash, the engine holds everything.
    drop(snapshot);
    drop(engine);
    drop(sm);
    vfs.crash(true);
    let sm = open(&vfs);
    assert_eq!(sm.applied_index(), 3);
    let engine = sm.engine();
    assert_eq!(engine.scan(b"k", None, usize::MAX).unwrap().len(), 2_000);
}
