//! Issue 14, item 10: a snapshot build that meets a full disk (the fractal engine and the
//! snapshot directory on one `FaultVfs` with a capacity) never reaches openraft as a
//! `StorageError` (which stops the Raft core): it waits for space, reports the full disk for
//! the NOSPACE alarm, and finishes by itself once space is freed, while apply and reads go on.
//! An install that meets a full disk is waited out the same way, serving the old tree meanwhile.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_install_on_a_full_disk_waits_for_space_and_then_finishes() {
    // The leader's snapshot: keys 0..2,000 at index 2.
    let leader_vfs = FaultVfs::new(22);
    let mut leader = open(&leader_vfs);
    leader.apply(vec![entry(1, 0, 1_000)]).await.unwrap();
    leader.apply(vec![entry(2, 1_000, 2_000)]).await.unwrap();
    let snapshot = leader
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();

    // The follower holds other keys, and receives the file while it still has room.
    let vfs = FaultVfs::new(23);
    let mut follower = open(&vfs);
    follower.apply(vec![entry(1, 5_000, 5_300)]).await.unwrap();
    let mut received = follower.begin_receiving_snapshot().await.unwrap();
    let mut sent = snapshot.snapshot;
    tokio::io::copy(&mut *sent, &mut *received).await.unwrap();
    tokio::io::AsyncWriteExt::flush(&mut *received).await.unwrap();

    // The disk is full: the engine cannot write the new tree.
    vfs.set_capacity(Some(vfs.used_bytes()));
    let meta = snapshot.meta.clone();
    let mut installing = follower.clone();
    let install = tokio::spawn(async move { installing.install_snapshot(&meta, received).await });
    tokio::time::sleep(Duration::from_millis(SNAPSHOT_RETRY_MS * 5 / 2)).await;
    assert!(
        !install.is_finished(),
        "the install returned on a full disk: {:?}",
        install.await
    );
    let reported = follower.space_error().expect("the full disk is reported");
    assert!(reported.contains("No space left on device"), "{reported}");
    // Reads go on, from the old tree.
    let engine = follower.engine();
    assert_eq!(engine.get(b"k005100").unwrap(), Some(vec![b'v'; 200]));
    assert_eq!(follower.applied_index(), 1);

    // Space is freed: the same install finishes by itself with the leader's contents.
    vfs.set_capacity(None);
    tokio::time::timeout(Duration::from_millis(SNAPSHOT_RETRY_MS * 10), install)
        .await
        .expect("the install finishes once space is freed")
        .unwrap()
        .unwrap();
    assert_eq!(follower.space_error(), None);
    assert_eq!(follower.applied_index(), 2);
    assert_eq!(engine.get(b"k005100").unwrap(), None);
    assert_eq!(engine.scan(b"k", None, usize::MAX).unwrap().len(), 2_000);

    // And it is durable: reopened after a crash, the follower holds the leader's state.
    drop(engine);
    drop(follower);
    vfs.crash(true);
    let follower = open(&vfs);
    assert_eq!(follower.applied_index(), 2);
    assert_eq!(
        follower.engine().scan(b"k", None, usize::MAX).unwrap().len(),
        2_000
    );
}
