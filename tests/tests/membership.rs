//! Issue 2, node section: "a node with a wiped data dir rejoins under a new id". The replaced
//! disk is modelled by killing node 3, wiping its data dir, removing it from the membership,
//! then starting node 4 with `--initial-cluster-state existing` and adding it as a learner
//! that is promoted to voter once caught up.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeMap;

use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wiped_node_rejoins_under_a_new_id() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    for i in 0..100 {
        client.put(format!("m/{i:03}"), format!("v{i}")).await.unwrap();
    }
    let leader = cluster.wait_for_leader().await.unwrap();
    let replaced = cluster.ids().into_iter().rev().find(|&id| id != leader).unwrap();

    cluster.kill(replaced).unwrap();
    cluster.wipe(replaced).unwrap();
    let membership = client.remove(replaced).await.unwrap();
    assert!(
        membership.members.iter().all(|m| m.id != replaced),
        "{membership:?}"
    );
    client.put("m/after-remove", "x").await.unwrap();

    let new_id = 4;
    let info = cluster.add_node(new_id).unwrap();
    let membership = client
        .add_learner(new_id, &info.client_addr, &info.peer_addr)
        .await
        .unwrap();
    let learner = membership
        .members
        .iter()
        .find(|m| m.id == new_id)
        .expect("learner listed");
    assert!(!learner.is_voter, "added as a learner: {membership:?}");
    let commit = cluster
        .status(cluster.wait_for_leader().await.unwrap())
        .await
        .unwrap()
        .commit_index;
    cluster.wait_caught_up(new_id, commit).await.unwrap();
    let membership = client.promote(new_id).await.unwrap();
    let voters: Vec<u64> = membership
        .members
        .iter()
        .filter(|m| m.is_voter)
        .map(|m| m.id)
        .collect();
    assert_eq!(
        voters.len(),
        3,
        "three voters after the promotion: {membership:?}"
    );
    assert!(voters.contains(&new_id), "{membership:?}");

    // The new voter holds everything, and the cluster keeps a quorum without the old one.
    client.put("m/after-promote", "y").await.unwrap();
    let index = cluster.wait_all_caught_up().await.unwrap();
    let local: BTreeMap<Vec<u8>, Vec<u8>> = cluster.scan_node(new_id, b"m/", b"m0", true).await.unwrap();
    assert_eq!(
        local.len(),
        102,
        "node {new_id} at index {index} holds {} keys",
        local.len()
    );
    assert_eq!(
        local.get(b"m/099".as_slice()).map(Vec::as_slice),
        Some(&b"v99"[..])
    );
    let status = cluster.status(new_id).await.unwrap();
    assert_eq!(status.node_id, new_id);
    assert!(
        status.role == "follower" || status.role == "leader",
        "role {}",
        status.role
    );
    cluster.check_no_panics().unwrap();
}
