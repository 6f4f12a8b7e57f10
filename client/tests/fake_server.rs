//! The client against tiny in-process fake nodes (tonic servers implementing `Kv` and `Cluster`):
//! redirect following, retries that reuse the write session, ambiguity, and final errors.
//! The real node is exercised end to end by the `tests/` crate.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ftkv_client::{decode_counter, Client, Error, RetryPolicy, UpsertOp};
use ftkv_proto::v1 as pb;
use ftkv_proto::v1::cluster_server::{Cluster, ClusterServer};
use ftkv_proto::v1::kv_server::{Kv, KvServer};
use prost::Message;
use tonic::{Request, Response, Status};

/// State shared by the fake nodes of one test: the data, the applied sessions and a log of
/// every write request that reached the leader.
#[derive(Default)]
struct Shared {
    kv: BTreeMap<Vec<u8>, Vec<u8>>,
    applied: HashSet<(u64, u64)>,
    write_sessions: Vec<pb::Session>,
}

#[derive(Clone)]
struct FakeNode {
    id: u64,
    /// `None` = leader; `Some(hint)` = follower answering NOT_LEADER with this hint ("" = none).
    follower_hint: Option<String>,
    shared: Arc<Mutex<Shared>>,
    /// Requests seen by this node.
    requests: Arc<AtomicU32>,
    /// Apply the write, then answer a bare UNAVAILABLE (as a lost connection would) this many times.
    fail_after_apply: Arc<AtomicU32>,
    /// Refuse writes over this many key bytes with a LIMIT error.
    max_key_bytes: usize,
    members: Arc<Mutex<Vec<pb::Member>>>,
}

impl FakeNode {
    fn leader(shared: &Arc<Mutex<Shared>>) -> Self {
        Self {
            id: 1,
            follower_hint: None,
            shared: Arc::clone(shared),
            requests: Arc::default(),
            fail_after_apply: Arc::default(),
            max_key_bytes: 16,
            members: Arc::default(),
        }
    }

    fn follower(id: u64, hint: &str, shared: &Arc<Mutex<Shared>>) -> Self {
        Self {
            id,
            follower_hint: Some(hint.to_string()),
            ..Self::leader(shared)
        }
    }

    fn error(kind: pb::error_info::Kind, code: tonic::Code, fill: impl FnOnce(&mut pb::ErrorInfo)) -> Status {
        let mut info = pb::ErrorInfo {
            kind: kind as i32,
            ..Default::default()
        };
        fill(&mut info);
        Status::with_details(code, info.message.clone(), info.encode_to_vec().into())
    }

    /// Common front of every write: redirect, limits, dedup by session, fault injection.
    fn write(
        &self,
        key: &[u8],
        session: Option<pb::Session>,
        apply: impl FnOnce(&mut Shared),
    ) -> Result<(), Status> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        if let Some(hint) = &self.follower_hint {
            let hint = hint.clone();
            return Err(Self::error(
                pb::error_info::Kind::NotLeader,
                tonic::Code::FailedPrecondition,
                |i| {
                    i.leader_endpoint = hint;
                    i.message = "not the leader".into();
                },
            ));
        }
        if key.is_empty() || key.len() > self.max_key_bytes {
            return Err(Self::error(
                pb::error_info::Kind::Limit,
                tonic::Code::InvalidArgument,
                |i| {
                    i.limit = "max_key_bytes".into();
                    i.message = format!("key is {} bytes", key.len());
                },
            ));
        }
        let session = session.unwrap_or_default();
        {
            let mut shared = self.shared.lock().unwrap();
            shared.write_sessions.push(session);
            if session.client_id == 0 || shared.applied.insert((session.client_id, session.sequence)) {
                apply(&mut shared);
            }
        }
        let inject = self
            .fail_after_apply
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if inject.is_ok() {
            return Err(Status::unavailable("connection reset by peer"));
        }
        Ok(())
    }

    fn header(&self) -> Option<pb::ResponseHeader> {
        Some(pb::ResponseHeader {
            node_id: self.id,
            term: 3,
            log_index: 10,
        })
    }
}

#[tonic::async_trait]
impl Kv for FakeNode {
    async fn get(&self, request: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let req = request.into_inner();
        let value = self.shared.lock().unwrap().kv.get(&req.key).cloned();
        Ok(Response::new(pb::GetResponse {
            header: self.header(),
            found: value.is_some(),
            value: value.unwrap_or_default(),
        }))
    }

    async fn put(&self, request: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let req = request.into_inner();
        self.write(&req.key, req.session, |s| {
            s.kv.insert(req.key.clone(), req.value.clone());
        })?;
        Ok(Response::new(pb::PutResponse {
            header: self.header(),
        }))
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let req = request.into_inner();
        self.write(&req.key, req.session, |s| {
            s.kv.remove(&req.key);
        })?;
        Ok(Response::new(pb::DeleteResponse {
            header: self.header(),
        }))
    }

    async fn scan(&self, request: Request<pb::ScanRequest>) -> Result<Response<pb::ScanResponse>, Status> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let req = request.into_inner();
        let limit = if req.limit == 0 { 1000 } else { req.limit as usize };
        let shared = self.shared.lock().unwrap();
        let in_range: Vec<_> = shared
            .kv
            .range(req.start.clone()..)
            .filter(|(k, _)| req.end.is_empty() || **k < req.end)
            .collect();
        let kvs: Vec<pb::KeyValue> = in_range
            .iter()
            .take(limit)
            .map(|(k, v)| pb::KeyValue {
                key: (*k).clone(),
                value: (*v).clone(),
            })
            .collect();
        let more = in_range.len() > limit;
        let next_start = if more {
            in_range[limit].0.clone()
        } else {
            Vec::new()
        };
        Ok(Response::new(pb::ScanResponse {
            header: self.header(),
            kvs,
            more,
            next_start,
        }))
    }

    async fn write(&self, request: Request<pb::WriteRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let req = request.into_inner();
        self.write(b"batch", req.session, |s| {
            for op in &req.ops {
                if let Some(pb::write_op::Op::Put(p)) = &op.op {
                    s.kv.insert(p.key.clone(), p.value.clone());
                }
            }
        })?;
        Ok(Response::new(pb::WriteResponse {
            header: self.header(),
        }))
    }

    async fn txn(&self, _request: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn upsert(
        &self,
        request: Request<pb::UpsertRequest>,
    ) -> Result<Response<pb::UpsertResponse>, Status> {
        let req = request.into_inner();
        self.write(&req.key, req.session, |s| {
            if let Some(pb::upsert_op::Op::Add(n)) = req.op.and_then(|o| o.op) {
                let cur = s.kv.get(&req.key).and_then(|v| decode_counter(v)).unwrap_or(0);
                s.kv.insert(req.key.clone(), (cur + n).to_le_bytes().to_vec());
            }
        })?;
        Ok(Response::new(pb::UpsertResponse {
            header: self.header(),
        }))
    }
}

#[tonic::async_trait]
impl Cluster for FakeNode {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        Ok(Response::new(pb::StatusResponse {
            node_id: self.id,
            leader_id: 1,
            is_leader: self.follower_hint.is_none(),
            term: 3,
            engine: "sled".into(),
            ops_per_entry: 2.5,
            ..Default::default()
        }))
    }

    async fn members(
        &self,
        _request: Request<pb::MembersRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        Ok(Response::new(pb::MembersResponse {
            members: self.members.lock().unwrap().clone(),
            leader_id: 1,
        }))
    }

    async fn add_learner(
        &self,
        _request: Request<pb::AddLearnerRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn promote(
        &self,
        _request: Request<pb::PromoteRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn remove(
        &self,
        _request: Request<pb::RemoveRequest>,
    ) -> Result<Response<pb::MembersResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }
}

/// Serves `node` on a fresh loopback port; returns `host:port`.
async fn serve(node: FakeNode) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(KvServer::new(node.clone()))
            .add_service(ClusterServer::new(node))
            .serve_with_incoming(incoming),
    );
    addr.to_string()
}

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
    let session = client.new_write_session();
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
