//! Issue 14 item 12 (harness half): after a membership change whose outcome it does not know, the
//! `membership` nemesis must count the members the cluster actually has, not the ones it meant to
//! have; the final convergence and liveness checks run on that list.
//!
//! A remove whose answer was lost looks, to the nemesis, like an error although the cluster did
//! remove the node. The test makes that happen deterministically: both followers are removed out
//! of band (as the lost-answer remove would have done), then the nemesis replaces a follower; its
//! own remove is refused ("not a member"). On the `local` substrate; needs the binaries
//! (`cargo build -p ftkv-node -p ftkv-client --bins`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use rand::SeedableRng;

use ftkv_tests::fixture::serial;
use ftkv_tests::jepsen::db::{Db, DbOptions, SubstrateKind};
use ftkv_tests::jepsen::history::Recorder;
use ftkv_tests::jepsen::nemesis::{Fault, Nemesis};

async fn cluster_members(db: &Db) -> BTreeSet<u64> {
    let client = ftkv_client::Client::builder()
        .endpoints(db.endpoints())
        .build()
        .await
        .unwrap();
    client
        .members()
        .await
        .unwrap()
        .members
        .iter()
        .map(|m| m.id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn membership_nemesis_counts_the_members_the_cluster_has_after_a_refused_remove() {
    let _serial = serial().await;
    let dir = tempfile::tempdir().unwrap();
    let options = DbOptions {
        substrate: SubstrateKind::Local,
        nodes: 3,
        node_args: Vec::new(),
        dir: dir.path().to_path_buf(),
        lose_unsynced_on_kill: false,
        fake_clock: false,
        docker_image: ftkv_tests::jepsen::db::DEFAULT_DOCKER_IMAGE.into(),
        security: Default::default(),
    };
    let db = Arc::new(Db::start(&options, Duration::from_secs(30)).await.unwrap());
    let leader = db.wait_for_leader(Duration::from_secs(30)).await.unwrap();
    let client = ftkv_client::Client::builder()
        .endpoints(db.endpoints())
        .build()
        .await
        .unwrap();
    for id in db.members().into_iter().filter(|&id| id != leader) {
        client.remove(id).await.unwrap();
    }
    assert_eq!(cluster_members(&db).await, BTreeSet::from([leader]));

    let recorder = Recorder::new();
    let mut nemesis = Nemesis::new(db.clone(), recorder.clone(), rand::rngs::StdRng::seed_from_u64(1));
    nemesis.start(&Fault::Membership).await;

    let actual = cluster_members(&db).await;
    let counted: BTreeSet<u64> = db.members().into_iter().collect();
    let events: Vec<String> = recorder
        .snapshot()
        .ops
        .iter()
        .map(|o| format!("{} {}", o.f, o.value))
        .collect();
    db.teardown();
    assert_eq!(
        counted, actual,
        "the harness counts members {counted:?}, the cluster has {actual:?}; nemesis: {events:?}"
    );
}
