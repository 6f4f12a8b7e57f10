//! The Jepsen harness's security mode (`ftkv-jepsen test --tls --auth`, issue 17): the db it sets
//! up really runs with TLS, client-cert auth and auth enabled, and its clients are the ones that
//! get through: a plaintext client is refused, a TLS client without a user is unauthenticated,
//! the workload user writes under `jepsen/` and nowhere else, digests are read as root, and the
//! workload user's short-lived token is renewed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::time::Duration;

use ftkv_client::Error;
use ftkv_tests::fixture::serial;
use ftkv_tests::jepsen::db::{Db, DbOptions, SubstrateKind};
use ftkv_tests::jepsen::security::SecurityOptions;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secured_db_refuses_plaintext_and_anonymous_clients_and_serves_the_workload_user() {
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
        security: SecurityOptions {
            tls: true,
            auth: true,
            token_ttl_ms: Some(3_000),
        },
    };
    let db = Db::start(&options, Duration::from_secs(60)).await.unwrap();
    assert!(dir.path().join("tls/ca.pem").is_file());
    let endpoints = db.endpoints();
    let quick = |b: ftkv_client::ClientBuilder| {
        b.request_timeout(Duration::from_secs(5))
            .retry(ftkv_client::RetryPolicy {
                deadline: Duration::from_secs(10),
                ..Default::default()
            })
    };

    let plaintext = quick(ftkv_client::Client::builder().endpoints(endpoints.clone()))
        .build()
        .await
        .unwrap();
    let refused = plaintext.put("jepsen/register/1", "1").await;
    assert!(
        matches!(refused, Err(Error::Tls { .. })),
        "plaintext: {refused:?}"
    );

    let anonymous = quick(db.security().anonymous_builder(endpoints.clone()))
        .build()
        .await
        .unwrap();
    let refused = anonymous.put("jepsen/register/1", "1").await;
    assert!(
        matches!(refused, Err(Error::Unauthenticated { .. })),
        "TLS without a user: {refused:?}"
    );

    let workload = quick(db.client_builder(endpoints.clone())).build().await.unwrap();
    workload.put("jepsen/register/1", "1").await.unwrap();
    assert_eq!(
        workload.get("jepsen/register/1").await.unwrap().as_deref(),
        Some(&b"1"[..])
    );
    let denied = workload.put("elsewhere/1", "1").await;
    assert!(
        matches!(&denied, Err(Error::PermissionDenied { message }) if message.contains("jepsen")),
        "outside jepsen/: {denied:?}"
    );

    // Past the token's lifetime the client renews it on its own.
    tokio::time::sleep(Duration::from_millis(3_500)).await;
    workload.put("jepsen/register/1", "2").await.unwrap();

    // Digests need root: the db reads them as root, the workload user is refused.
    let leader = db.wait_for_leader(Duration::from_secs(30)).await.unwrap();
    let ep = db.endpoint(leader).unwrap();
    let status = db.status(&ep, true, Duration::from_secs(10)).await.unwrap();
    assert_ne!(status.digest, 0, "{status:?}");
    let denied = workload.status_with(&ep, true).await;
    assert!(
        matches!(denied, Err(Error::PermissionDenied { .. })),
        "digest as the workload user: {denied:?}"
    );
    db.teardown();
}
