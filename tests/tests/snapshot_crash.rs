//! Issue 14, item 4: a follower killed at any step of a snapshot install starts again.
//!
//! The follower is stopped while the leader writes far past its purge point (snapshot every 100
//! entries, 10 kept behind), so it can only catch up by `InstallSnapshot`. It is restarted with
//! a crash point armed (`FTKV_TEST_CRASH_POINT_FILE`, see `node/src/cluster/crash_point.rs`):
//! it aborts, like SIGKILL, at that exact step: before the engine is replaced, after the engine
//! holds the snapshot, after the file became `current.snap`, after the log's purge point was
//! saved and after the purge. Then it is restarted once more and must come up, catch up and hold
//! every write. The second test does the same with nodes that lose everything not fsynced when
//! they die (`--unsafe-lose-unsynced-on-kill`).
//!
//! Before the fix, openraft's queued purge reached the log ~60 ms before the engine had the
//! snapshot; a crash in between left a log purged past its own end and an engine that did not
//! cover it, and every restart failed ("try to get log at index N but got None").

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::time::{Duration, Instant};

use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};

const CRASH_POINTS: [&str; 5] = [
    "install-snapshot:before-engine",
    "install-snapshot:engine-replaced",
    "install-snapshot:file-current",
    "purge:meta-saved",
    "purge:done",
];

fn options(crash_dir: &std::path::Path, lose_unsynced: bool) -> ClusterOptions {
    let mut extra_args: Vec<String> = [
        "--snapshot-every-entries",
        "100",
        "--max-in-snapshot-log-to-keep",
        "10",
    ]
    .map(str::to_string)
    .to_vec();
    if lose_unsynced {
        extra_args.push("--unsafe-lose-unsynced-on-kill".into());
    }
    ClusterOptions {
        extra_args,
        env: vec![(
            "FTKV_TEST_CRASH_POINT_FILE".into(),
            crash_dir.join("crash-{id}").display().to_string(),
        )],
        ..ClusterOptions::default()
    }
}

async fn write_range(client: &ftkv_client::Client, round: usize, range: std::ops::Range<u32>) {
    let mut tasks = Vec::new();
    for writer in 0..4u32 {
        let client = client.clone();
        let range = range.clone();
        tasks.push(tokio::spawn(async move {
            for i in range.filter(|i| i % 4 == writer) {
                client
                    .put(format!("r{round}/{i:05}"), format!("v{i}"))
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn wait_exit(cluster: &Cluster, id: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if !cluster.is_running(id) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

async fn crash_at_every_install_step(lose_unsynced: bool) {
    let _serial = serial().await;
    let crash_dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(options(crash_dir.path(), lose_unsynced))
        .await
        .unwrap();
    let client = cluster.client().await.unwrap();
    write_range(&client, 0, 0..50).await;
    cluster.wait_all_caught_up().await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    let mut rounds = Vec::new();
    for (round, point) in CRASH_POINTS.iter().enumerate() {
        let round = round + 1;
        cluster.stop(follower).await.unwrap();
        write_range(&client, round, 0..600).await;
        let crash_file = crash_dir.path().join(format!("crash-{follower}"));
        std::fs::write(&crash_file, point).unwrap();
        cluster.restart(follower).unwrap();
        assert!(
            wait_exit(&cluster, follower, Duration::from_secs(60)).await,
            "follower {follower} did not reach crash point {point}: {}",
            cluster.log_tail(follower, 30)
        );
        assert!(
            cluster
                .node_log(follower)
                .contains(&format!("ftkv TEST crash point {point}")),
            "follower {follower} exited, but not at {point}: {}",
            cluster.log_tail(follower, 30)
        );
        assert!(!crash_file.exists(), "the crash point disarms itself");
        cluster.restart(follower).unwrap();
        let commit = cluster.status(leader).await.unwrap().commit_index;
        let caught_up = cluster
            .wait_caught_up(follower, commit)
            .await
            .unwrap_or_else(|e| {
                let log = cluster.node_log(follower);
                let since = log.rfind("===== ftkv-tests fixture: start").unwrap_or(0);
                let notable: Vec<&str> = log[since..]
                    .lines()
                    .filter(|l| l.contains("panicked") || l.contains("ERROR") || l.contains("rror:"))
                    .take(20)
                    .collect();
                panic!(
                    "follower {follower} did not come back after a crash at {point}: {e}\n{}",
                    notable.join("\n")
                )
            });
        rounds.push(format!("{point}: caught up at {}", caught_up.applied_index));
    }
    // Every write of every round is on the follower.
    for round in 0..=CRASH_POINTS.len() {
        let n = if round == 0 { 50 } else { 600 };
        let prefix = format!("r{round}/");
        let end = format!("r{round}0");
        let local = cluster
            .scan_node(follower, prefix.as_bytes(), end.as_bytes(), true)
            .await
            .unwrap();
        assert_eq!(
            local.len(),
            n,
            "round {round}: follower {follower} holds {} of {n}",
            local.len()
        );
    }
    cluster.check_no_panics().unwrap();
    eprintln!("lose_unsynced={lose_unsynced}: {rounds:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_killed_at_any_step_of_a_snapshot_install_starts_again() {
    crash_at_every_install_step(false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_follower_losing_unsynced_data_at_any_step_of_a_snapshot_install_starts_again() {
    crash_at_every_install_step(true).await;
}
