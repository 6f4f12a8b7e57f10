//! Issue 16's operations: graceful drain on SIGTERM, backup (`ftkvctl snapshot save`), restore
//! (`ftkv-node snapshot restore`) into a new cluster with a new cluster id, damaged backups
//! refused, and a node of another cluster refused by the peer guard.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use ftkv_client::RetryPolicy;
use ftkv_tests::fixture::{serial, Cluster, ClusterOptions, WriteLoad};

/// `ftkv-node ARGS` to completion: (success, stdout + stderr).
fn node_cmd(cluster: &Cluster, args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(&cluster.binaries().node)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The value of `--initial-cluster` node `id` runs with.
fn initial_cluster(cluster: &Cluster, id: u64) -> String {
    let args = cluster.node_args(id).unwrap();
    let at = args.iter().position(|a| a == "--initial-cluster").unwrap();
    args[at + 1].clone()
}

async fn put_keys(cluster: &Cluster, prefix: &str, n: usize) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let client = cluster.client().await.unwrap();
    let mut written = BTreeMap::new();
    for i in 0..n {
        let key = format!("{prefix}/{i:05}").into_bytes();
        let value = format!("value-{i}-{}", "x".repeat(i % 50)).into_bytes();
        client.put(key.clone(), value.clone()).await.unwrap();
        written.insert(key, value);
    }
    written
}

async fn save_backup(cluster: &Cluster, id: u64, file: &Path) {
    let endpoint = cluster.endpoint(id).unwrap();
    let out = cluster
        .ctl(&[
            "--endpoints",
            &endpoint,
            "snapshot",
            "save",
            file.to_str().unwrap(),
        ])
        .await
        .unwrap();
    assert!(
        out.success(),
        "snapshot save failed: {}{}",
        out.stdout,
        out.stderr
    );
    assert!(out.stdout.contains("Snapshot saved at"), "{}", out.stdout);
    assert!(file.exists() && !Path::new(&format!("{}.part", file.display())).exists());
}

/// A SIGTERM of the leader under a write load from many clients: no request fails (the drain
/// refuses new ones with DRAINING, which the clients send elsewhere, finishes those in flight,
/// and hands leadership over in one election round), the node exits 0, and every acknowledged
/// write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigterm_of_the_leader_drains_with_no_failed_request() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster
        .client_builder()
        .request_timeout(Duration::from_secs(3))
        .retry(RetryPolicy {
            deadline: Duration::from_secs(20),
            ..RetryPolicy::default()
        })
        .build()
        .await
        .unwrap();
    let load = WriteLoad::start(&client, "drain", 16, Duration::from_millis(20));
    assert!(load.wait_acked(300, Duration::from_secs(60)).await >= 300);
    let old = cluster.wait_for_leader().await.unwrap();
    let term_before = cluster.status(old).await.unwrap().term;

    let exit = cluster.stop(old).await.unwrap();
    assert!(
        exit.success(),
        "the drained node exited with {exit:?}: {}",
        cluster.log_tail(old, 30)
    );
    let acked_at_stop = load.acked_count();
    let deadline = Instant::now() + Duration::from_secs(60);
    while load.acked_count() < acked_at_stop + 300 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let outcome = load.stop().await;
    assert!(
        outcome.failed.is_empty() && outcome.ambiguous.is_empty(),
        "requests failed across the drain: {} failed ({:?}), {} ambiguous",
        outcome.failed.len(),
        outcome.failed.iter().take(3).collect::<Vec<_>>(),
        outcome.ambiguous.len()
    );
    assert!(
        outcome.acked.len() as u64 >= acked_at_stop + 300,
        "the load stalled after the drain"
    );

    let new = cluster.wait_for_leader().await.unwrap();
    assert_ne!(new, old);
    let log = cluster.node_log(old);
    assert!(
        log.contains(&format!("handed leadership to node {new}")),
        "no hand-off in the log of node {old}: {}",
        cluster.log_tail(old, 30)
    );
    // One election round: the chosen follower won the first campaign.
    assert_eq!(cluster.status(new).await.unwrap().term, term_before + 1);

    let pairs = cluster.scan_node(new, b"drain/", b"drain0", false).await.unwrap();
    let lost: Vec<_> = outcome
        .acked
        .iter()
        .filter(|w| pairs.get(&w.key) != Some(&w.value))
        .map(|w| String::from_utf8_lossy(&w.key).into_owned())
        .collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    cluster.check_no_panics().unwrap();
}

/// `snapshot save` from one node, `snapshot status`, then `snapshot restore` of every member
/// of a fresh three-node cluster: every key there, a new cluster id shared by the three. Then
/// a node started on a data dir of the restored cluster at the address of a member of the old
/// one is refused by the old cluster (cluster ID mismatch), which keeps serving unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restore_makes_a_new_cluster_and_a_foreign_node_is_refused() {
    let _serial = serial().await;
    let old = Cluster::start(ClusterOptions::default()).await.unwrap();
    let written = put_keys(&old, "backup", 400).await;
    let old_id = old.status(1).await.unwrap().cluster_id;
    assert_ne!(old_id, 0, "a bootstrapped cluster has an id");
    for id in old.ids() {
        old.wait_caught_up(
            id,
            old.status(old.wait_for_leader().await.unwrap())
                .await
                .unwrap()
                .applied_index,
        )
        .await
        .unwrap();
        assert_eq!(old.status(id).await.unwrap().cluster_id, old_id, "node {id}");
    }
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("backup.db");
    // From a follower: any node will do.
    let follower = {
        let l = old.leader_id().await;
        old.ids().into_iter().find(|id| Some(*id) != l).unwrap()
    };
    save_backup(&old, follower, &file).await;

    let (ok, status) = node_cmd(&old, &["snapshot", "status", file.to_str().unwrap()]);
    assert!(ok, "{status}");
    assert!(status.contains("keys: 400"), "{status}");
    assert!(status.contains(&format!("cluster id: {old_id:016x}")), "{status}");

    // A fresh cluster, its data dirs replaced by restores of the backup.
    let new = Cluster::start(ClusterOptions::default()).await.unwrap();
    for id in new.ids() {
        new.stop(id).await.unwrap();
        new.wipe(id).unwrap();
    }
    for id in new.ids() {
        let dir = new.data_dir(id).unwrap();
        let members = initial_cluster(&new, id);
        let (ok, out) = node_cmd(
            &new,
            &[
                "snapshot",
                "restore",
                file.to_str().unwrap(),
                "--data-dir",
                dir.to_str().unwrap(),
                "--id",
                &id.to_string(),
                "--initial-cluster",
                &members,
            ],
        );
        assert!(ok, "restore of node {id}: {out}");
        assert!(out.contains("restored 400 keys"), "{out}");
        // A second restore into the now non-empty dir is refused.
        let (ok, again) = node_cmd(
            &new,
            &[
                "snapshot",
                "restore",
                file.to_str().unwrap(),
                "--data-dir",
                dir.to_str().unwrap(),
                "--id",
                &id.to_string(),
                "--initial-cluster",
                &members,
            ],
        );
        assert!(!ok && again.contains("is not empty"), "{again}");
    }
    for id in new.ids() {
        new.restart(id).unwrap();
    }
    let leader = new.wait_for_leader().await.unwrap();
    let new_id = new.status(leader).await.unwrap().cluster_id;
    assert!(
        new_id != 0 && new_id != old_id,
        "restored cluster id {new_id:x}, old {old_id:x}"
    );
    let pairs = new
        .scan_node(leader, b"backup/", b"backup0", false)
        .await
        .unwrap();
    assert_eq!(
        pairs, written,
        "the restored cluster holds exactly the backed-up keys"
    );
    // It takes writes, on every member.
    new.client()
        .await
        .unwrap()
        .put("after-restore", "1")
        .await
        .unwrap();
    let applied = new.status(leader).await.unwrap().applied_index;
    for id in new.ids() {
        new.wait_caught_up(id, applied).await.unwrap();
        assert_eq!(new.status(id).await.unwrap().cluster_id, new_id, "node {id}");
    }

    // Node 3 of the old cluster comes back on the restored cluster's node-3 data dir.
    let old_leader = old.wait_for_leader().await.unwrap();
    let victim = if old_leader == 3 { 2 } else { 3 };
    old.stop(victim).await.unwrap();
    new.stop(victim).await.unwrap();
    let old_dir = old.data_dir(victim).unwrap();
    std::fs::remove_dir_all(&old_dir).unwrap();
    copy_dir(&new.data_dir(victim).unwrap(), &old_dir);
    let members_before = old.client().await.unwrap().members().await.unwrap();
    old.restart(victim).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let refused = old.node_log(victim).contains("cluster ID mismatch")
            && old.node_log(old_leader).contains("cluster ID mismatch");
        if refused {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no cluster ID mismatch logged: leader {}\n impostor {}",
            old.log_tail(old_leader, 20),
            old.log_tail(victim, 20)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The old cluster is unchanged and serves: same leader, members and keys, takes writes.
    let client = old.client().await.unwrap();
    client.put("after-impostor", "1").await.unwrap();
    assert_eq!(old.leader_id().await, Some(old_leader));
    assert_eq!(client.members().await.unwrap(), members_before);
    let impostor = old.status(victim).await.unwrap();
    assert_eq!(impostor.cluster_id, new_id);
    assert_ne!(
        impostor.leader_id, old_leader,
        "the impostor must not follow the old leader"
    );
    let pairs = old
        .scan_node(old_leader, b"backup/", b"backup0", false)
        .await
        .unwrap();
    assert_eq!(pairs, written);
    old.check_no_panics().unwrap();
    new.check_no_panics().unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else if entry.file_name() != "LOCK" {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// A damaged or truncated backup is refused by `status` and `restore` with a clear error, and
/// the refused restore leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_backup_is_refused() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        ..ClusterOptions::default()
    })
    .await
    .unwrap();
    put_keys(&cluster, "k", 200).await;
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("good.db");
    save_backup(&cluster, 1, &file).await;
    let good = std::fs::read(&file).unwrap();
    let (ok, out) = node_cmd(&cluster, &["snapshot", "status", file.to_str().unwrap()]);
    assert!(ok && out.contains("keys: 200"), "{out}");

    let flipped = {
        let mut b = good.clone();
        let at = b.len() / 2;
        b[at] ^= 0x01;
        b
    };
    let truncated = good[..good.len() - 100].to_vec();
    for (name, bytes, expected) in [
        ("flipped.db", flipped, "checksum mismatch"),
        ("truncated.db", truncated, "not a sound ftkv backup"),
    ] {
        let bad = work.path().join(name);
        std::fs::write(&bad, bytes).unwrap();
        let (ok, out) = node_cmd(&cluster, &["snapshot", "status", bad.to_str().unwrap()]);
        assert!(!ok && out.contains(expected), "status of {name}: {out}");
        let dir = work.path().join(format!("restore-{name}"));
        let (ok, out) = node_cmd(
            &cluster,
            &[
                "snapshot",
                "restore",
                bad.to_str().unwrap(),
                "--data-dir",
                dir.to_str().unwrap(),
                "--id",
                "1",
                "--initial-cluster",
                "1=127.0.0.1:1",
            ],
        );
        assert!(!ok && out.contains(expected), "restore of {name}: {out}");
        assert!(!dir.exists(), "a refused restore left {}", dir.display());
    }
}
