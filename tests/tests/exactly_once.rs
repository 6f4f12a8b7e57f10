//! Issue 2, acceptance 7: a retried `Upsert{Add}` after an injected timeout is applied once.
//!
//! Three ways to resend one write with the same session (client id, sequence):
//! the client's test hook that drops a successful response (the client then retries as after
//! a timeout), an explicit resend of a caller-held session, and a resend to a new leader after
//! the old one was killed (the session table is replicated state, not leader memory).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::time::Duration;

use ftkv_client::{decode_counter, Client, UpsertOp};
use ftkv_proto::v1::{upsert_op, Session, UpsertOp as ProtoUpsertOp, UpsertRequest};
use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};

async fn counter(client: &Client, key: &str) -> Option<i64> {
    client.get(key).await.unwrap().as_deref().and_then(decode_counter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retried_upsert_add_is_applied_once() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let reader = cluster.client().await.unwrap();

    // 1. Injected timeout: the first successful response is discarded, the client resends.
    let lossy = cluster
        .client_builder()
        .debug_drop_write_responses(1)
        .build()
        .await
        .unwrap();
    lossy.upsert("once/add", UpsertOp::Add(5)).await.unwrap();
    assert_eq!(
        counter(&reader, "once/add").await,
        Some(5),
        "Add(5) retried after a lost response"
    );
    lossy.upsert("once/add", UpsertOp::Add(1)).await.unwrap();
    assert_eq!(
        counter(&reader, "once/add").await,
        Some(6),
        "the hook drops only the first response"
    );

    // The same for a non-idempotent append, and for several lost responses in a row.
    let lossy = cluster
        .client_builder()
        .debug_drop_write_responses(3)
        .build()
        .await
        .unwrap();
    lossy
        .upsert("once/append", UpsertOp::Append(b"ab".to_vec()))
        .await
        .unwrap();
    assert_eq!(
        reader.get("once/append").await.unwrap().as_deref(),
        Some(&b"ab"[..])
    );

    // 2. Explicit resend of the same session.
    let client = cluster.client().await.unwrap();
    let session = client.new_write_session().await;
    client
        .upsert_with_session(&session, "once/explicit", UpsertOp::Add(10))
        .await
        .unwrap();
    client
        .upsert_with_session(&session, "once/explicit", UpsertOp::Add(10))
        .await
        .unwrap();
    client
        .upsert_with_session(&session, "once/explicit", UpsertOp::Add(10))
        .await
        .unwrap();
    assert_eq!(
        counter(&reader, "once/explicit").await,
        Some(10),
        "one session, three sends, one add"
    );
    drop(session);
    client.upsert("once/explicit", UpsertOp::Add(1)).await.unwrap();
    assert_eq!(
        counter(&reader, "once/explicit").await,
        Some(11),
        "a new session is a new write"
    );

    // 2b. The same on the wire: the node itself deduplicates by (client id, sequence), and a
    // write without a session is applied every time (so the session is what makes it once).
    let leader = cluster.wait_for_leader().await.unwrap();
    let mut raw = cluster.kv_raw(leader).await.unwrap();
    let add = |amount: i64, session: Option<Session>| UpsertRequest {
        key: b"once/raw".to_vec(),
        op: Some(ProtoUpsertOp {
            op: Some(upsert_op::Op::Add(amount)),
        }),
        session,
    };
    let session = Session {
        client_id: 0x5eed_0001_u64,
        sequence: 1,
        first_incomplete: 1,
    };
    raw.upsert(add(100, Some(session))).await.unwrap();
    raw.upsert(add(100, Some(session))).await.unwrap();
    assert_eq!(
        counter(&reader, "once/raw").await,
        Some(100),
        "a duplicate (client id, sequence) applied twice"
    );
    raw.upsert(add(
        100,
        Some(Session {
            sequence: 2,
            ..session
        }),
    ))
    .await
    .unwrap();
    assert_eq!(
        counter(&reader, "once/raw").await,
        Some(200),
        "the next sequence is a new write"
    );
    raw.upsert(add(1, None)).await.unwrap();
    raw.upsert(add(1, None)).await.unwrap();
    assert_eq!(
        counter(&reader, "once/raw").await,
        Some(202),
        "writes without a session apply each time"
    );

    // 3. Resend to a new leader after the old leader was killed.
    let session = client.new_write_session().await;
    client
        .upsert_with_session(&session, "once/failover", UpsertOp::Add(7))
        .await
        .unwrap();
    let old_leader = cluster.wait_for_leader().await.unwrap();
    cluster.wait_all_caught_up().await.unwrap();
    cluster.kill(old_leader).unwrap();
    let new_leader = cluster.wait_for_leader().await.unwrap();
    assert_ne!(new_leader, old_leader);
    let resend = client
        .upsert_with_session(&session, "once/failover", UpsertOp::Add(7))
        .await
        .unwrap();
    assert_ne!(resend.node_id, old_leader);
    assert_eq!(
        counter(&reader, "once/failover").await,
        Some(7),
        "resend on the new leader applied again"
    );
    drop(session);

    // The old leader comes back with the same state.
    cluster.restart(old_leader).unwrap();
    let index = cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        let local = cluster.scan_node(id, b"once/", b"once0", true).await.unwrap();
        let add = local
            .get(b"once/failover".as_slice())
            .and_then(|v| decode_counter(v));
        assert_eq!(add, Some(7), "node {id} at index {index}");
        assert_eq!(
            local.get(b"once/add".as_slice()).and_then(|v| decode_counter(v)),
            Some(6),
            "node {id}"
        );
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    cluster.check_no_panics().unwrap();
}
