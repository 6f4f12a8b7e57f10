//! Issue 2, acceptance 4: a follower stopped while the leader writes past its purge point
//! catches up by snapshot when it restarts.
//!
//! Nodes build a snapshot every 100 applied entries and keep only 10 log entries behind it, so
//! after ~1,000 single-op entries the leader's log no longer holds what the stopped follower
//! lacks: replication can only succeed through `InstallSnapshot`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeMap;
use std::time::Duration;

use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};

fn snapshot_options() -> ClusterOptions {
    ClusterOptions {
        extra_args: [
            "--snapshot-every-entries",
            "100",
            "--max-in-snapshot-log-to-keep",
            "10",
        ]
        .map(str::to_string)
        .to_vec(),
        ..ClusterOptions::default()
    }
}

/// Sequential puts `PREFIX/NNNNN` = `value-NNNNN` for `range`, from `writers` concurrent
/// writers (each write its own Raft entry but for the batcher's packing of concurrent ones).
async fn write_keys(client: &ftkv_client::Client, prefix: &str, range: std::ops::Range<u32>, writers: u32) {
    let mut tasks = Vec::new();
    for writer in 0..writers {
        let client = client.clone();
        let prefix = prefix.to_string();
        let range = range.clone();
        tasks.push(tokio::spawn(async move {
            for i in range.filter(|i| i % writers == writer) {
                client
                    .put(format!("{prefix}/{i:05}"), format!("value-{i:05}"))
                    .await
                    .unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

fn expected(prefix: &str, range: std::ops::Range<u32>) -> BTreeMap<Vec<u8>, Vec<u8>> {
    range
        .map(|i| {
            (
                format!("{prefix}/{i:05}").into_bytes(),
                format!("value-{i:05}").into_bytes(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stopped_follower_catches_up_by_snapshot() {
    let _serial = serial().await;
    let cluster = Cluster::start(snapshot_options()).await.unwrap();
    let client = cluster.client().await.unwrap();
    write_keys(&client, "snap", 0..50, 1).await;
    cluster.wait_all_caught_up().await.unwrap();

    let leader = cluster.wait_for_leader().await.unwrap();
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    let follower_before = cluster.status(follower).await.unwrap();
    let status = cluster.stop(follower).await.unwrap();
    eprintln!(
        "stopped follower {follower} at applied {} ({status})",
        follower_before.applied_index
    );

    // ~1,000 entries past the follower: ten snapshots, log purged to 10 behind the last.
    write_keys(&client, "snap", 50..1050, 2).await;
    let leader_status = cluster
        .status(cluster.wait_for_leader().await.unwrap())
        .await
        .unwrap();
    assert!(
        leader_status.commit_index > follower_before.applied_index + 300,
        "the leader should be far past the follower: {leader_status:?}"
    );

    cluster.restart(follower).unwrap();
    let caught_up = cluster
        .wait_caught_up(follower, leader_status.commit_index)
        .await
        .unwrap();
    eprintln!("follower {follower} caught up: {caught_up:?}");
    let local = cluster
        .scan_node(follower, b"snap/", b"snap0", true)
        .await
        .unwrap();
    let want = expected("snap", 0..1050);
    assert_eq!(
        local.len(),
        want.len(),
        "follower {follower} holds {} of {} keys",
        local.len(),
        want.len()
    );
    assert!(
        local == want,
        "follower {follower}'s data differs from what was written"
    );

    // It keeps replicating normally afterwards.
    write_keys(&client, "after", 0..20, 1).await;
    let index = cluster.wait_all_caught_up().await.unwrap();
    let after = cluster
        .scan_node(follower, b"after/", b"after0", true)
        .await
        .unwrap();
    assert_eq!(after, expected("after", 0..20), "at index {index}");

    // Evidence of the snapshot path in the follower's log: openraft logs, at info, each
    // `InstallSnapshot` it receives (`receive_snapshot`, `begin_receiving_snapshot`).
    let log = cluster.node_log(follower);
    let restart_marker = log.rfind("===== ftkv-tests fixture: start #2").unwrap_or(0);
    let after_restart = &log[restart_marker..];
    let snapshot_lines: Vec<&str> = after_restart
        .lines()
        .filter(|line| !line.starts_with("====="))
        .filter(|line| {
            let line = line.to_ascii_lowercase();
            [
                "installsnapshot",
                "install_snapshot",
                "receive_snapshot",
                "receiving_snapshot",
            ]
            .iter()
            .any(|marker| line.contains(marker))
        })
        .take(3)
        .collect();
    eprintln!("follower {follower} snapshot log lines after restart: {snapshot_lines:#?}");
    assert!(
        !snapshot_lines.is_empty(),
        "the restarted follower's log shows no InstallSnapshot: it caught up by log, so the leader \
         did not purge past it; log tail:\n{}",
        cluster.log_tail(follower, 30)
    );

    tokio::time::sleep(Duration::from_millis(100)).await;
    for id in cluster.ids() {
        assert!(
            cluster.is_running(id),
            "node {id} died: {:?}",
            cluster.exit_status(id)
        );
    }
    cluster.check_no_panics().unwrap();
}
