//! `ftkvctl endpoint health` against real nodes: the container health check of the image
//! (`ftkvctl --endpoints 127.0.0.1:7379 endpoint health`) and etcdctl's command of that name.
//! Healthy = the node answers, serves and knows a leader; exit 1 when any endpoint is not.
//!
//! Needs the binaries: `cargo build --workspace --bins`, then `cargo test -p ftkv-tests`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::time::{Duration, Instant};

use ftkv_tests::fixture::{run_ftkvctl, serial, Cluster, ClusterOptions, CtlOutput};

async fn health_of(endpoint: &str) -> CtlOutput {
    run_ftkvctl(
        &["--endpoints", endpoint, "--timeout", "3s", "endpoint", "health"],
        None,
        Duration::from_secs(60),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_reports_each_member_and_fails_on_an_unhealthy_one() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();

    // Every member healthy: one line each, exit 0.
    let out = cluster.ctl(&["endpoint", "health", "--cluster"]).await.unwrap();
    assert!(out.success(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{out:?}");
    for id in cluster.ids() {
        let ep = cluster.endpoint(id).unwrap();
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{ep} is healthy: node {id}, "))
                    && l.contains(&format!("leader {leader}"))),
            "no healthy line for node {id} at {ep}: {out:?}"
        );
    }
    let out = cluster
        .ctl(&["-w", "json", "endpoint", "health", "--cluster"])
        .await
        .unwrap();
    assert!(out.success(), "{out:?}");
    let list: serde_json::Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 3, "{list:?}");
    for h in list {
        assert_eq!(h["health"], true, "{h}");
        assert_eq!(h["leader_id"], leader, "{h}");
        assert!(h["took_ms"].as_f64().is_some(), "{h}");
    }

    // A follower killed: it is reported unhealthy and the command fails; the others stay
    // healthy, and a health check of one of them alone (the container's check) passes.
    let victim = cluster.ids().into_iter().find(|id| *id != leader).unwrap();
    let other = cluster
        .ids()
        .into_iter()
        .find(|id| *id != leader && *id != victim)
        .unwrap();
    cluster.kill(victim).unwrap();
    let out = cluster
        .ctl(&["--timeout", "3s", "endpoint", "health", "--cluster"])
        .await
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let victim_ep = cluster.endpoint(victim).unwrap();
    assert!(
        out.stdout.contains(&format!("{victim_ep} is unhealthy: ")),
        "{out:?}"
    );
    assert_eq!(out.stdout.matches(" is healthy: ").count(), 2, "{out:?}");
    assert!(out.stderr.contains("1 of 3 endpoints unhealthy"), "{out:?}");
    let out = health_of(&cluster.endpoint(other).unwrap()).await;
    assert!(out.success(), "{out:?}");

    // The leader killed too: the last node loses its quorum, campaigns, knows no leader and
    // is unhealthy although it answers.
    cluster.kill(leader).unwrap();
    let other_ep = cluster.endpoint(other).unwrap();
    let started = Instant::now();
    let out = loop {
        let out = health_of(&other_ep).await;
        if !out.success() || started.elapsed() > Duration::from_secs(60) {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(out.status.code(), Some(1), "still healthy after 60 s: {out:?}");
    assert!(
        out.stdout
            .contains(&format!("{other_ep} is unhealthy: node {other} knows no leader")),
        "{out:?}"
    );
    cluster.restart(victim).unwrap();
    cluster.restart(leader).unwrap();
    cluster.wait_for_leader().await.unwrap();
    cluster.check_no_panics().unwrap();
}
