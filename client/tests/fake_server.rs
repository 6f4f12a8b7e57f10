//! The client against tiny in-process fake nodes (tonic servers implementing `Kv`, `Cluster` and
//! `Auth.Authenticate`): redirect following, retries that reuse the write session, ambiguity, and
//! final errors.
//! The real node is exercised end to end by the `tests/` crate.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{bind, serve, serve_black_hole, serve_on, FakeNode, Shared};
use ftkv_client::{decode_counter, Client, Error, RetryPolicy, UpsertOp};
use ftkv_proto::v1 as pb;

fn quick_policy(max_attempts: u32) -> RetryPolicy {
    RetryPolicy {
        max_attempts,
        initial_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        deadline: Duration::from_secs(5),
    }
}

#[tokio::test]
async fn follows_not_leader_to_an_endpoint_outside_the_initial_list() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let leader = FakeNode::leader(&shared);
    let leader_ep = serve(leader.clone()).await;
    let follower = FakeNode::follower(2, &leader_ep, &shared);
    let follower_ep = serve(follower.clone()).await;

    let client = Client::builder()
        .endpoints([&follower_ep])
        .retry(quick_policy(5))
        .build()
        .await
        .unwrap();
    let info = client.put("k", "v").await.unwrap();
    assert_eq!(info.node_id, 1, "answered by the leader");
    assert_eq!(shared.lock().unwrap().kv.get(&b"k"[..]), Some(&b"v".to_vec()));
    assert_eq!(follower.requests.load(Ordering::SeqCst), 1);
    assert_eq!(leader.requests.load(Ordering::SeqCst), 1);
    assert!(
        client.endpoints().contains(&leader_ep),
        "learned the leader: {:?}",
        client.endpoints()
    );
    assert_eq!(client.preferred_endpoint(), Some(leader_ep.clone()));

    // The leader is remembered: the next write goes straight there.
    client.put("k2", "v2").await.unwrap();
    assert_eq!(follower.requests.load(Ordering::SeqCst), 1);
    assert_eq!(leader.requests.load(Ordering::SeqCst), 2);
    assert_eq!(client.get("k2").await.unwrap(), Some(b"v2".to_vec()));

    // Both writes carried this client's session with sequences 1 and 2.
    let sessions = shared.lock().unwrap().write_sessions.clone();
    assert_eq!(sessions.len(), 2);
    assert!(sessions
        .iter()
        .all(|s| s.client_id == client.client_id() && s.client_id != 0));
    assert_eq!(
        sessions.iter().map(|s| s.sequence).collect::<Vec<_>>(),
        vec![1, 2]
    );
    assert_eq!(
        sessions[1].first_incomplete, 2,
        "sequence 1 finished before 2 started"
    );
}

#[tokio::test]
async fn not_leader_without_hint_rotates_to_the_next_endpoint() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let follower = FakeNode::follower(2, "", &shared);
    let follower_ep = serve(follower.clone()).await;
    let leader_ep = serve(FakeNode::leader(&shared)).await;
    let client = Client::builder()
        .endpoints([&follower_ep, &leader_ep])
        .retry(quick_policy(5))
        .build()
        .await
        .unwrap();
    client.upsert("n", UpsertOp::Add(2)).await.unwrap();
    assert_eq!(follower.requests.load(Ordering::SeqCst), 1);
    let v = shared.lock().unwrap().kv.get(&b"n"[..]).cloned().unwrap();
    assert_eq!(decode_counter(&v), Some(2));
}

#[tokio::test]
async fn followers_pointing_at_each_other_back_off_and_give_up() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let (la, a) = bind().await;
    let (lb, b) = bind().await;
    let node_a = FakeNode::follower(2, &b, &shared);
    let node_b = FakeNode::follower(3, &a, &shared);
    serve_on(la, node_a.clone());
    serve_on(lb, node_b.clone());
    let policy = RetryPolicy {
        max_attempts: 6,
        initial_backoff: Duration::from_millis(20),
        max_backoff: Duration::from_millis(40),
        deadline: Duration::from_secs(5),
    };
    let client = Client::builder()
        .endpoints([&a])
        .retry(policy)
        .build()
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    let err = client.put("k", "v").await.unwrap_err();
    assert!(matches!(err, Error::NotLeader { .. }), "{err:?}");
    assert!(
        err.is_retryable() && !err.is_ambiguous(),
        "refused by followers: not applied"
    );
    let asked = node_a.requests.load(Ordering::SeqCst) + node_b.requests.load(Ordering::SeqCst);
    assert_eq!(asked, 6, "one request per attempt");
    // a -> b at once (fresh hint); then each bounce back to a node already seen backs off.
    assert!(
        t0.elapsed() >= Duration::from_millis(40),
        "backed off: {:?}",
        t0.elapsed()
    );
}

#[tokio::test]
async fn retry_after_a_lost_response_reuses_the_session_and_applies_once() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let leader = FakeNode::leader(&shared);
    leader.fail_after_apply.store(1, Ordering::SeqCst);
    let ep = serve(leader.clone()).await;
    let client = Client::builder()
        .endpoints([&ep])
        .retry(quick_policy(5))
        .build()
        .await
        .unwrap();

    client.upsert("counter", UpsertOp::Add(5)).await.unwrap();
    let s = shared.lock().unwrap();
    assert_eq!(s.write_sessions.len(), 2, "one failed attempt, one retry");
    assert_eq!(s.write_sessions[0].client_id, s.write_sessions[1].client_id);
    assert_eq!(
        s.write_sessions[0].sequence, s.write_sessions[1].sequence,
        "same sequence on retry"
    );
    assert_eq!(
        decode_counter(s.kv.get(&b"counter"[..]).unwrap()),
        Some(5),
        "applied exactly once"
    );
}

#[tokio::test]
async fn a_write_whose_outcome_stays_unknown_is_ambiguous() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let leader = FakeNode::leader(&shared);
    leader.fail_after_apply.store(100, Ordering::SeqCst);
    let ep = serve(leader.clone()).await;
    let client = Client::builder()
        .endpoints([&ep])
        .retry(quick_policy(3))
        .build()
        .await
        .unwrap();

    let err = client.upsert("c", UpsertOp::Add(1)).await.unwrap_err();
    assert!(err.is_ambiguous(), "{err:?}");
    assert!(!err.is_retryable());
    assert_eq!(
        leader.requests.load(Ordering::SeqCst),
        3,
        "max_attempts bounds the retries"
    );
    let s = shared.lock().unwrap();
    assert_eq!(decode_counter(s.kv.get(&b"c"[..]).unwrap()), Some(1));
}

/// A write whose first attempt may have applied (connection lost after sending), whose retry is
/// answered UNAUTHENTICATED (the user's password changed meanwhile), and whose renewed
/// authentication is refused: the node's refusal of the retry says nothing of the first
/// attempt, so the write is ambiguous, not "not applied".
#[tokio::test]
async fn a_maybe_applied_write_stays_ambiguous_when_authenticating_again_is_refused() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut leader = FakeNode::leader(&shared);
    leader.fail_after_apply.store(1, Ordering::SeqCst);
    leader.revoke_after_apply = true;
    let auth = leader.auth.clone();
    let ep = serve(leader).await;
    let client = Client::builder()
        .endpoints([&ep])
        .user("alice", "secret")
        .retry(quick_policy(5))
        .build()
        .await
        .unwrap();
    assert_eq!(
        auth.authentications.load(Ordering::SeqCst),
        1,
        "build authenticates"
    );

    let err = client.put("k", "v").await.unwrap_err();
    assert!(err.is_ambiguous(), "the first attempt applied it: {err:?}");
    assert_eq!(
        auth.authentications.load(Ordering::SeqCst),
        2,
        "the UNAUTHENTICATED retry authenticated again once"
    );
    assert_eq!(
        shared.lock().unwrap().kv.get(&b"k"[..]).map(Vec::as_slice),
        Some(&b"v"[..])
    );

    // Nothing sent yet: a refusal before the first attempt stays definite.
    let err = client.put("k2", "v").await.unwrap_err();
    assert!(matches!(err, Error::Unauthenticated { .. }), "{err:?}");
    assert!(!shared.lock().unwrap().kv.contains_key(&b"k2"[..]));
}

#[tokio::test]
async fn injected_response_drop_is_retried_once_with_the_same_session() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let ep = serve(FakeNode::leader(&shared)).await;
    let client = Client::builder()
        .endpoints([&ep])
        .retry(quick_policy(5))
        .debug_drop_write_responses(1)
        .build()
        .await
        .unwrap();
    client.upsert("c", UpsertOp::Add(7)).await.unwrap();
    client.upsert("c", UpsertOp::Add(1)).await.unwrap();
    let s = shared.lock().unwrap();
    let seqs: Vec<u64> = s.write_sessions.iter().map(|x| x.sequence).collect();
    assert_eq!(
        seqs,
        vec![1, 1, 2],
        "the dropped response's write was resent with sequence 1"
    );
    assert_eq!(decode_counter(s.kv.get(&b"c"[..]).unwrap()), Some(8));
}

#[tokio::test]
async fn upsert_with_session_sent_twice_applies_once() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let ep = serve(FakeNode::leader(&shared)).await;
    let client = Client::builder().endpoints([&ep]).build().await.unwrap();
    let session = client.new_write_session().await;
    client
        .upsert_with_session(&session, "c", UpsertOp::Add(3))
        .await
        .unwrap();
    client
        .upsert_with_session(&session, "c", UpsertOp::Add(3))
        .await
        .unwrap();
    assert_eq!(decode_counter(&client.get("c").await.unwrap().unwrap()), Some(3));
}

#[tokio::test]
async fn limit_errors_are_final_and_name_the_limit() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let leader = FakeNode::leader(&shared);
    let ep = serve(leader.clone()).await;
    let client = Client::builder()
        .endpoints([&ep])
        .retry(quick_policy(5))
        .build()
        .await
        .unwrap();
    let err = client.put("a-key-that-is-way-too-long", "v").await.unwrap_err();
    assert_eq!(
        err,
        Error::InvalidArgument {
            message: "key is 26 bytes".into(),
            limit: Some("max_key_bytes".into())
        }
    );
    assert_eq!(leader.requests.load(Ordering::SeqCst), 1, "never retried");
}

#[tokio::test]
async fn scan_all_follows_continuations() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let ep = serve(FakeNode::leader(&shared)).await;
    let client = Client::builder().endpoints([&ep]).build().await.unwrap();
    let ops: Vec<_> = (0..25)
        .map(|i| ftkv_client::Op::put(format!("p/{i:02}"), format!("{i}")))
        .collect();
    client.write(ops).await.unwrap();
    client.put("q", "other").await.unwrap();
    let opts = ftkv_client::ScanOptions {
        limit: 4,
        ..Default::default()
    };
    let all = client.scan_prefix("p/", 0, opts).await.unwrap();
    assert_eq!(all.len(), 25);
    assert_eq!(all[24].key, b"p/24".to_vec());
    let capped = client.scan_prefix("p/", 10, opts).await.unwrap();
    assert_eq!(capped.len(), 10);
    let page = client.scan("p/", "", 3).await.unwrap();
    assert!(page.more);
    assert_eq!(page.next_start, b"p/03".to_vec());
}

#[tokio::test]
async fn status_all_asks_every_member() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let leader = FakeNode::leader(&shared);
    let leader_ep = serve(leader.clone()).await;
    let follower_ep = serve(FakeNode::follower(2, &leader_ep, &shared)).await;
    *leader.members.lock().unwrap() = vec![
        pb::Member {
            id: 1,
            client_endpoint: leader_ep.clone(),
            peer_endpoint: "x:1".into(),
            is_voter: true,
        },
        pb::Member {
            id: 2,
            client_endpoint: follower_ep.clone(),
            peer_endpoint: "x:2".into(),
            is_voter: true,
        },
        pb::Member {
            id: 3,
            client_endpoint: "127.0.0.1:1".into(),
            peer_endpoint: "x:3".into(),
            is_voter: true,
        },
    ];
    let client = Client::builder().endpoints([&leader_ep]).build().await.unwrap();
    let all = client.status_all().await;
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].0, leader_ep);
    let s0 = all[0].1.as_ref().unwrap();
    assert!(s0.is_leader && s0.node_id == 1 && s0.engine == "sled");
    assert_eq!(all[1].1.as_ref().unwrap().node_id, 2);
    assert!(all[2].1.is_err(), "node 3 is down");
}

#[tokio::test]
async fn connection_lost_after_sending_is_ambiguous() {
    let ep = serve_black_hole(Duration::from_millis(200)).await;
    let client = Client::builder()
        .endpoints([&ep])
        .retry(quick_policy(2))
        .build()
        .await
        .unwrap();
    let err = client.put("k", "v").await.unwrap_err();
    eprintln!("{err:?}");
    assert!(err.is_ambiguous(), "{err:?}");
}

#[tokio::test]
async fn calls_go_through_the_batch_stream_and_fall_back_to_unary_on_old_nodes() {
    // A node serving Kv.Batch: concurrent writes share one stream, answers match callers.
    let shared = Arc::new(Mutex::new(Shared::default()));
    let node = FakeNode::leader(&shared);
    let batch_calls = node.batch_requests.clone();
    let ep = serve(node).await;
    let client = Client::builder().endpoints([&ep]).build().await.unwrap();
    let mut writes = Vec::new();
    for i in 0..50u32 {
        let c = client.clone();
        writes.push(tokio::spawn(async move {
            c.put(format!("k{i}"), format!("v{i}")).await
        }));
    }
    for w in writes {
        w.await.unwrap().unwrap();
    }
    for i in 0..50u32 {
        assert_eq!(
            client.get(format!("k{i}")).await.unwrap(),
            Some(format!("v{i}").into_bytes())
        );
    }
    // Item errors keep their kind: an oversized key is InvalidArgument naming the limit.
    let err = client.put("k".repeat(100), "v").await.unwrap_err();
    assert!(
        matches!(err, ftkv_client::Error::InvalidArgument { .. }),
        "{err:?}"
    );
    assert_eq!(batch_calls.load(Ordering::SeqCst), 1, "one stream for every call");

    // An older node without Kv.Batch: the same calls succeed through unary RPCs.
    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut old = FakeNode::leader(&shared);
    old.batch_unimplemented = true;
    let old_calls = old.batch_requests.clone();
    let ep = serve(old).await;
    let client = Client::builder().endpoints([&ep]).build().await.unwrap();
    client.put("a", "1").await.unwrap();
    client.put("b", "2").await.unwrap();
    assert_eq!(client.get("a").await.unwrap(), Some(b"1".to_vec()));
    assert_eq!(shared.lock().unwrap().kv.len(), 2);
    assert_eq!(
        old_calls.load(Ordering::SeqCst),
        1,
        "unsupported is remembered, not retried per call"
    );
}

#[tokio::test]
async fn a_committed_write_answered_out_of_range_without_error_info_is_ambiguous() {
    // What a response over the message limit looks like: the write committed, then the codec
    // answered OUT_OF_RANGE with no ErrorInfo. Unary and through the batch stream.
    for batch_requests in [false, true] {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let mut leader = FakeNode::leader(&shared);
        leader.fail_after_apply_code = tonic::Code::OutOfRange;
        leader.fail_after_apply.store(1, Ordering::SeqCst);
        let ep = serve(leader.clone()).await;
        let client = Client::builder()
            .endpoints([&ep])
            .retry(quick_policy(5))
            .batch_requests(batch_requests)
            .build()
            .await
            .unwrap();
        let err = client.put("k", "v").await.unwrap_err();
        assert!(err.is_ambiguous(), "batch {batch_requests}: {err:?}");
        assert_eq!(
            shared.lock().unwrap().kv.get(&b"k"[..]),
            Some(&b"v".to_vec()),
            "the write did commit"
        );
    }
}

#[tokio::test]
async fn after_a_stale_sequence_later_writes_move_to_a_fresh_client_id() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let leader = FakeNode::leader(&shared);
    let ep = serve(leader.clone()).await;
    let client = Client::builder()
        .endpoints([&ep])
        .retry(quick_policy(5))
        .build()
        .await
        .unwrap();
    client.put("k1", "v1").await.unwrap();
    let old_id = client.client_id();
    // A write held in flight across the change of id (a caller-held session).
    let in_flight = client.new_write_session().await;
    assert_eq!(in_flight.client_id(), old_id);
    // The node's window for this id moved past every sequence this client will use (e.g.
    // another instance with the same id ran far ahead): each write of the old id is stale.
    shared.lock().unwrap().window_low.insert(old_id, 1_000_000);

    // Stale on its first delivery: certainly not applied, so it is sent again, once, under a
    // fresh session (new id), and succeeds.
    let before = leader.requests.load(Ordering::SeqCst);
    client.put("k2", "v2").await.unwrap();
    assert_eq!(
        leader.requests.load(Ordering::SeqCst) - before,
        2,
        "stale once, then sent anew"
    );
    let new_id = client.client_id();
    assert_ne!(new_id, old_id, "later writes use a fresh client id");
    assert_ne!(new_id, 0);
    client.put("k3", "v3").await.unwrap();

    // The write in flight keeps its old id (re-sending it under a new id could apply it twice).
    shared.lock().unwrap().window_low.clear();
    client
        .upsert_with_session(&in_flight, "c", UpsertOp::Add(1))
        .await
        .unwrap();

    let s = shared.lock().unwrap();
    let by_id = |id: u64| -> Vec<u64> {
        s.write_sessions
            .iter()
            .filter(|x| x.client_id == id)
            .map(|x| x.sequence)
            .collect()
    };
    // Old id: k1 (1), k2's stale first delivery (3), the held session (2) at the end.
    assert_eq!(by_id(old_id), vec![1, 3, 2]);
    assert_eq!(by_id(new_id), vec![1, 2], "k2 and k3, numbered afresh");
    assert_eq!(s.kv.get(&b"k2"[..]), Some(&b"v2".to_vec()));
}

#[tokio::test]
async fn a_stale_answer_to_a_write_that_may_have_applied_is_ambiguous_and_not_resent() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let mut leader = FakeNode::leader(&shared);
    // The first delivery applies, its answer is lost, and the node forgets the result: the
    // retry (same session) is answered stale.
    leader.fail_after_apply.store(1, Ordering::SeqCst);
    leader.forget_after_apply = true;
    let ep = serve(leader.clone()).await;
    let client = Client::builder()
        .endpoints([&ep])
        .retry(quick_policy(5))
        .build()
        .await
        .unwrap();
    let old_id = client.client_id();
    let err = client.upsert("c", UpsertOp::Add(1)).await.unwrap_err();
    assert!(err.is_ambiguous(), "{err:?}");
    assert_eq!(
        leader.requests.load(Ordering::SeqCst),
        2,
        "one delivery, one retry answered stale, then no more"
    );
    assert_ne!(client.client_id(), old_id, "later writes use a fresh client id");
    client.upsert("c", UpsertOp::Add(10)).await.unwrap();
    let s = shared.lock().unwrap();
    assert_eq!(
        decode_counter(s.kv.get(&b"c"[..]).unwrap()),
        Some(11),
        "the first applied once"
    );
    let ids: Vec<u64> = s.write_sessions.iter().map(|x| x.client_id).collect();
    assert_eq!(
        ids[..2],
        [old_id, old_id],
        "the unknown write never went out under the new id"
    );
    assert!(ids[2..].iter().all(|&id| id != old_id));
}

/// A client whose leader stops answering (SIGSTOP) while another node leads: the call's
/// deadline equals its request timeout, so a client that gives its first attempt the whole
/// request timeout never gets to the new leader.
fn paused_leader_client_policy() -> (Duration, RetryPolicy) {
    let timeout = Duration::from_secs(4);
    (
        timeout,
        RetryPolicy {
            max_attempts: 20,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            deadline: timeout,
        },
    )
}

#[tokio::test]
async fn a_paused_leader_is_left_for_the_new_one_within_the_call() {
    for batch_requests in [true, false] {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let (la, a) = bind().await;
        let old_leader = FakeNode::leader(&shared);
        serve_on(la, old_leader.clone());
        let new_leader = FakeNode::follower(2, &a, &shared);
        let new_ep = serve(new_leader.clone()).await;
        let (timeout, policy) = paused_leader_client_policy();
        let client = Client::builder()
            .endpoints([&a, &new_ep])
            .request_timeout(timeout)
            .retry(policy)
            .batch_requests(batch_requests)
            .build()
            .await
            .unwrap();
        assert_eq!(client.put("k1", "v1").await.unwrap().node_id, 1);
        assert_eq!(client.preferred_endpoint(), Some(a.clone()));

        // Node 1 is paused (connection up, nothing answered); node 2 won the election.
        old_leader.stall_ms.store(u64::MAX, Ordering::SeqCst);
        new_leader.refusals_before_leading.store(0, Ordering::SeqCst);
        let asked_before = old_leader.requests.load(Ordering::SeqCst);
        let info = client.put("k2", "v2").await.unwrap();
        assert_eq!(
            info.node_id, 2,
            "batch {batch_requests}: answered by the new leader"
        );
        assert_eq!(client.preferred_endpoint(), Some(new_ep.clone()));
        assert_eq!(shared.lock().unwrap().kv.get(&b"k2"[..]), Some(&b"v2".to_vec()));
        // The paused node got the first attempt only (its handler never ran: requests counts
        // handled requests, so 0 more).
        assert_eq!(old_leader.requests.load(Ordering::SeqCst), asked_before);
        // Reads go to the new leader too.
        assert_eq!(client.get("k2").await.unwrap(), Some(b"v2".to_vec()));
    }
}

#[tokio::test]
async fn while_followers_still_name_the_paused_leader_the_client_asks_them_again() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let (la, a) = bind().await;
    let old_leader = FakeNode::leader(&shared);
    serve_on(la, old_leader.clone());
    let follower = FakeNode::follower(2, &a, &shared);
    let follower_ep = serve(follower.clone()).await;
    let (timeout, policy) = paused_leader_client_policy();
    let client = Client::builder()
        .endpoints([&a, &follower_ep])
        .request_timeout(timeout)
        .retry(policy)
        .build()
        .await
        .unwrap();
    client.put("k1", "v1").await.unwrap();
    // Node 1 paused; node 2 still names it as leader for three more answers (its election
    // timeout has not run out), then wins the election.
    old_leader.stall_ms.store(u64::MAX, Ordering::SeqCst);
    follower.refusals_before_leading.store(3, Ordering::SeqCst);
    let follower_before = follower.requests.load(Ordering::SeqCst);
    let info = client.put("k2", "v2").await.unwrap();
    assert_eq!(info.node_id, 2);
    assert_eq!(
        follower.requests.load(Ordering::SeqCst) - follower_before,
        4,
        "three NOT_LEADER answers naming the paused node, then the write"
    );
}

#[tokio::test]
async fn a_slow_leader_that_others_keep_naming_gets_longer_attempts() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let (la, a) = bind().await;
    let slow_leader = FakeNode::leader(&shared);
    slow_leader.stall_ms.store(500, Ordering::SeqCst);
    serve_on(la, slow_leader.clone());
    let follower_ep = serve(FakeNode::follower(2, &a, &shared)).await;
    let client = Client::builder()
        .endpoints([&a, &follower_ep])
        .request_timeout(Duration::from_secs(5))
        .attempt_timeout(Duration::from_millis(200))
        .retry(RetryPolicy {
            max_attempts: 40,
            initial_backoff: Duration::from_millis(10),
            max_backoff: Duration::from_millis(100),
            deadline: Duration::from_secs(10),
        })
        .build()
        .await
        .unwrap();
    // Every write takes 500 ms at the leader: attempts of 200 ms, then 400 ms, time out; the
    // follower keeps naming it, so it is asked again with 800 ms, which is enough.
    let info = client.upsert("c", UpsertOp::Add(1)).await.unwrap();
    assert_eq!(info.node_id, 1);
    assert_eq!(client.preferred_endpoint(), Some(a.clone()));
    let s = shared.lock().unwrap();
    assert_eq!(
        decode_counter(s.kv.get(&b"c"[..]).unwrap()),
        Some(1),
        "applied once"
    );
    let seqs: Vec<u64> = s.write_sessions.iter().map(|x| x.sequence).collect();
    assert!(
        seqs.iter().all(|&q| q == 1),
        "every attempt under one sequence: {seqs:?}"
    );
}

#[tokio::test]
async fn a_request_over_the_clients_message_limit_is_refused_unsent_and_batches_stay_under_it() {
    for batch_requests in [false, true] {
        let shared = Arc::new(Mutex::new(Shared::default()));
        let leader = FakeNode::leader(&shared);
        let ep = serve(leader.clone()).await;
        let client = Client::builder()
            .endpoints([&ep])
            .retry(quick_policy(3))
            .max_message_bytes(64 * 1024)
            .batch_requests(batch_requests)
            .build()
            .await
            .unwrap();
        // One request over the limit: never sent, so certainly not applied.
        let err = client.put("big", vec![7u8; 100 * 1024]).await.unwrap_err();
        assert!(
            matches!(err, Error::InvalidArgument { ref limit, .. } if limit.as_deref() == Some("max_message_bytes")),
            "batch {batch_requests}: {err:?}"
        );
        assert_eq!(
            leader.requests.load(Ordering::SeqCst),
            0,
            "nothing reached the node"
        );
        // Many concurrent requests that fit one by one but not together: each succeeds (the
        // batch stream packs them into messages under the limit).
        let writes: Vec<_> = (0..32u32)
            .map(|i| {
                let c = client.clone();
                tokio::spawn(async move { c.put(format!("k{i}"), vec![i as u8; 12 * 1024]).await })
            })
            .collect();
        for (i, w) in writes.into_iter().enumerate() {
            let r = w.await.unwrap();
            assert!(r.is_ok(), "batch {batch_requests}: put {i}: {r:?}");
        }
        assert_eq!(shared.lock().unwrap().kv.len(), 32);
    }
}

/// A leader that drains answers DRAINING: the client goes to another node and, while that one
/// still names the draining node as its leader, does not send the write back there.
#[tokio::test]
async fn a_draining_node_is_not_asked_again_during_the_call() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let (la, a) = bind().await;
    let old_leader = FakeNode::leader(&shared);
    old_leader.draining.store(true, Ordering::SeqCst);
    serve_on(la, old_leader.clone());
    let follower = FakeNode::follower(2, &a, &shared);
    follower.refusals_before_leading.store(2, Ordering::SeqCst);
    let follower_ep = serve(follower.clone()).await;
    let client = Client::builder()
        .endpoints([&a, &follower_ep])
        .retry(quick_policy(20))
        .batch_requests(false)
        .build()
        .await
        .unwrap();
    let info = client.put("k", "v").await.unwrap();
    assert_eq!(info.node_id, 2);
    assert_eq!(
        old_leader.requests.load(Ordering::SeqCst),
        1,
        "the draining node was asked again"
    );
    assert_eq!(shared.lock().unwrap().kv.get(&b"k"[..]), Some(&b"v".to_vec()));
}

#[tokio::test]
async fn a_bulk_load_started_during_an_election_waits_for_the_leader() {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let node = FakeNode::follower(1, "", &shared);
    node.refusals_before_leading.store(3, Ordering::SeqCst);
    let ep = serve(node.clone()).await;
    let client = Client::builder()
        .endpoints([&ep])
        .request_timeout(Duration::from_secs(5))
        .build()
        .await
        .unwrap();
    // Three status rounds find no leader (an election); the fourth finds it.
    let loader = client
        .bulk_load(ftkv_client::OnDuplicate::Error)
        .await
        .expect("the load waits for the election instead of failing at once");
    assert!(
        ep.ends_with(loader.endpoint().trim_start_matches("http://")),
        "{}",
        loader.endpoint()
    );

    // No leader within the request timeout: Unavailable, naming the wait.
    let never = serve(FakeNode::follower(2, "", &shared)).await;
    let client = Client::builder()
        .endpoints([&never])
        .request_timeout(Duration::from_millis(700))
        .build()
        .await
        .unwrap();
    match client.bulk_load(ftkv_client::OnDuplicate::Error).await {
        Err(Error::Unavailable { message }) => assert!(message.contains("within"), "{message}"),
        Err(other) => panic!("expected Unavailable, got {other:?}"),
        Ok(_) => panic!("a cluster without leader started a load"),
    }
}
