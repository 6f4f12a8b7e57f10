//! Tiny in-process fake ftkv nodes for the client's tests: tonic servers implementing `Kv`,
//! `Cluster` and `Auth.Authenticate` over a shared map, with NOT_LEADER redirects, a LIMIT
//! error, session de-duplication, injectable lost responses and revoked credentials.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ftkv_client::decode_counter;
use ftkv_proto::v1 as pb;
use ftkv_proto::v1::auth_server::{Auth, AuthServer};
use ftkv_proto::v1::cluster_server::{Cluster, ClusterServer};
use ftkv_proto::v1::kv_server::{Kv, KvServer};
use prost::Message;
use tonic::{Request, Response, Status};

/// State shared by the fake nodes of one test: the data, the applied sessions and a log of
/// every write request that reached the leader.
#[derive(Default)]
pub struct Shared {
    pub kv: BTreeMap<Vec<u8>, Vec<u8>>,
    pub applied: HashSet<(u64, u64)>,
    pub write_sessions: Vec<pb::Session>,
    /// Per client id, the lowest sequence still remembered: lower ones are answered as the
    /// node answers `StaleSequence` (set it to act as if the results were forgotten).
    pub window_low: HashMap<u64, u64>,
}

/// The message of the node's answer to a write whose sequence is below its window
/// (`CommandResult::StaleSequence`, node/src/server/errors.rs): KIND_AMBIGUOUS with the reason
/// `STALE_SEQUENCE`, which is what the client matches on.
pub const STALE_SEQUENCE_MESSAGE: &str =
    "session sequence is below the server's window for this client: its \
     outcome was forgotten (start a new client session to keep writing)";

#[derive(Clone)]
pub struct FakeNode {
    pub id: u64,
    /// `None` = leader; `Some(hint)` = follower answering NOT_LEADER with this hint ("" = none).
    pub follower_hint: Option<String>,
    pub shared: Arc<Mutex<Shared>>,
    /// Requests seen by this node.
    pub requests: Arc<AtomicU32>,
    /// Apply the write, then answer a bare UNAVAILABLE (as a lost connection would) this many times.
    pub fail_after_apply: Arc<AtomicU32>,
    /// Code of those answers, without ErrorInfo (default UNAVAILABLE; OUT_OF_RANGE is what a
    /// codec says of a response over the message limit).
    pub fail_after_apply_code: tonic::Code,
    /// With `fail_after_apply`: also forget the result (raise the client's window past it),
    /// so the retry is answered as stale.
    pub forget_after_apply: bool,
    /// Refuse writes over this many key bytes with a LIMIT error.
    pub max_key_bytes: usize,
    pub members: Arc<Mutex<Vec<pb::Member>>>,
    /// `Kv.Batch` calls seen by this node.
    pub batch_requests: Arc<AtomicU32>,
    /// Answer `Kv.Batch` with UNIMPLEMENTED (an older node): the client must fall back to unary.
    pub batch_unimplemented: bool,
    /// Every request waits this many milliseconds before it is handled; `u64::MAX` = never
    /// answered (a node paused with SIGSTOP). 0 = answer at once.
    pub stall_ms: Arc<AtomicU64>,
    /// A follower answers NOT_LEADER to this many writes, then acts as the leader (an election
    /// it wins); `u32::MAX` = stays a follower.
    pub refusals_before_leading: Arc<AtomicU32>,
    /// Refuse every write with UNAVAILABLE reason DRAINING (a node shutting down).
    pub draining: Arc<std::sync::atomic::AtomicBool>,
    /// The `Auth` side (tokens for any user and password until revoked).
    pub auth: FakeAuth,
    /// With `fail_after_apply`: the user's password changes right then (`auth.revoked`), so
    /// the retry is answered UNAUTHENTICATED and so is authenticating again.
    pub revoke_after_apply: bool,
}

/// `Auth.Authenticate` of a fake node: a token for any user and password, until `revoked`
/// (the password changed): then UNAUTHENTICATED, as every write is. Other `Auth` calls are
/// unimplemented.
#[derive(Clone, Default)]
pub struct FakeAuth {
    /// `Authenticate` calls seen.
    pub authentications: Arc<AtomicU32>,
    /// Credentials and tokens are refused from now on.
    pub revoked: Arc<std::sync::atomic::AtomicBool>,
}

fn unauthenticated(message: &str) -> Status {
    FakeNode::error(
        pb::error_info::Kind::Unauthenticated,
        tonic::Code::Unauthenticated,
        |i| i.message = message.into(),
    )
}

impl FakeNode {
    pub fn leader(shared: &Arc<Mutex<Shared>>) -> Self {
        Self {
            id: 1,
            follower_hint: None,
            shared: Arc::clone(shared),
            requests: Arc::default(),
            fail_after_apply: Arc::default(),
            fail_after_apply_code: tonic::Code::Unavailable,
            forget_after_apply: false,
            max_key_bytes: 24,
            members: Arc::default(),
            batch_requests: Arc::default(),
            batch_unimplemented: false,
            stall_ms: Arc::default(),
            refusals_before_leading: Arc::new(AtomicU32::new(u32::MAX)),
            draining: Arc::default(),
            auth: FakeAuth::default(),
            revoke_after_apply: false,
        }
    }

    pub fn follower(id: u64, hint: &str, shared: &Arc<Mutex<Shared>>) -> Self {
        Self {
            id,
            follower_hint: Some(hint.to_string()),
            ..Self::leader(shared)
        }
    }

    /// Waits as `stall_ms` says (forever for `u64::MAX`).
    async fn stall(&self) {
        match self.stall_ms.load(Ordering::SeqCst) {
            0 => {}
            u64::MAX => std::future::pending::<()>().await,
            ms => tokio::time::sleep(Duration::from_millis(ms)).await,
        }
    }

    /// Whether this node answers as the leader now (a follower may win an election).
    fn leads(&self) -> bool {
        if self.follower_hint.is_none() {
            return true;
        }
        let count_down = |n: u32| (n != 0 && n != u32::MAX).then(|| n - 1);
        match self
            .refusals_before_leading
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, count_down)
        {
            Ok(_) => false,  // one more refusal
            Err(0) => true,  // won the election
            Err(_) => false, // stays a follower
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
        if self.draining.load(Ordering::SeqCst) {
            return Err(Self::error(
                pb::error_info::Kind::Unavailable,
                tonic::Code::Unavailable,
                |i| {
                    i.reason = ftkv_proto::status_details::REASON_DRAINING.into();
                    i.message = "node 1 is draining".into();
                },
            ));
        }
        if self.auth.revoked.load(Ordering::SeqCst) {
            return Err(unauthenticated("the token was revoked: authenticate again"));
        }
        if !self.leads() {
            let hint = self.follower_hint.clone().unwrap_or_default();
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
            if session.client_id != 0
                && session.sequence < shared.window_low.get(&session.client_id).copied().unwrap_or(0)
            {
                return Err(Self::error(
                    pb::error_info::Kind::Ambiguous,
                    tonic::Code::Unknown,
                    |i| {
                        i.message = STALE_SEQUENCE_MESSAGE.into();
                        i.reason = ftkv_proto::status_details::REASON_STALE_SEQUENCE.into();
                    },
                ));
            }
            if session.client_id == 0 || shared.applied.insert((session.client_id, session.sequence)) {
                apply(&mut shared);
            }
        }
        let inject = self
            .fail_after_apply
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
        if inject.is_ok() {
            if self.revoke_after_apply {
                self.auth.revoked.store(true, Ordering::SeqCst);
            }
            if self.forget_after_apply {
                let mut shared = self.shared.lock().unwrap();
                let low = shared.window_low.entry(session.client_id).or_insert(0);
                *low = (*low).max(session.sequence + 1);
            }
            let message = match self.fail_after_apply_code {
                tonic::Code::Unavailable => "connection reset by peer",
                _ => "Error, encoded message length too large",
            };
            return Err(Status::new(self.fail_after_apply_code, message));
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

type BatchStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::BatchResponse, Status>> + Send + 'static>>;

impl FakeNode {
    /// One batch item through the unary handler of its kind (as the real node does).
    async fn batch_item(&self, item: pb::BatchRequestItem) -> pb::BatchResponseItem {
        use pb::batch_request_item::Request as Rq;
        use pb::batch_response_item::Response as Rs;
        let result = match item.request {
            Some(Rq::Get(r)) => Kv::get(self, Request::new(r))
                .await
                .map(|r| Rs::Get(r.into_inner())),
            Some(Rq::Put(r)) => Kv::put(self, Request::new(r))
                .await
                .map(|r| Rs::Put(r.into_inner())),
            Some(Rq::Delete(r)) => Kv::delete(self, Request::new(r))
                .await
                .map(|r| Rs::Delete(r.into_inner())),
            Some(Rq::Write(r)) => Kv::write(self, Request::new(r))
                .await
                .map(|r| Rs::Write(r.into_inner())),
            Some(Rq::Txn(r)) => Kv::txn(self, Request::new(r))
                .await
                .map(|r| Rs::Txn(r.into_inner())),
            Some(Rq::Upsert(r)) => Kv::upsert(self, Request::new(r))
                .await
                .map(|r| Rs::Upsert(r.into_inner())),
            None => Err(Status::invalid_argument("empty item")),
        };
        let response = result.unwrap_or_else(|status| {
            Rs::Error(pb::ItemError {
                code: status.code() as i32,
                message: status.message().to_string(),
                details: status.details().to_vec(),
            })
        });
        pb::BatchResponseItem {
            id: item.id,
            response: Some(response),
        }
    }
}

#[tonic::async_trait]
impl Kv for FakeNode {
    type BatchStream = BatchStream;

    async fn bulk_load(
        &self,
        _request: Request<tonic::Streaming<pb::BulkLoadRequest>>,
    ) -> Result<Response<pb::BulkLoadResponse>, Status> {
        Err(Status::unimplemented(
            "Kv.BulkLoad is not served by this fake node",
        ))
    }

    async fn batch(
        &self,
        request: Request<tonic::Streaming<pb::BatchRequest>>,
    ) -> Result<Response<BatchStream>, Status> {
        self.batch_requests.fetch_add(1, Ordering::SeqCst);
        if self.batch_unimplemented {
            return Err(Status::unimplemented("Kv.Batch is not served by this fake node"));
        }
        let mut inbound = request.into_inner();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        let node = self.clone();
        tokio::spawn(async move {
            while let Ok(Some(batch)) = inbound.message().await {
                let mut items = Vec::new();
                for item in batch.items {
                    items.push(node.batch_item(item).await);
                }
                if tx.send(Ok(pb::BatchResponse { items })).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        self.stall().await;
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
        self.stall().await;
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
        self.stall().await;
        let req = request.into_inner();
        self.write(&req.key, req.session, |s| {
            s.kv.remove(&req.key);
        })?;
        Ok(Response::new(pb::DeleteResponse {
            header: self.header(),
        }))
    }

    async fn scan(&self, request: Request<pb::ScanRequest>) -> Result<Response<pb::ScanResponse>, Status> {
        self.stall().await;
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
        self.stall().await;
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
        self.stall().await;
        Err(Status::unimplemented("fake"))
    }

    async fn upsert(
        &self,
        request: Request<pb::UpsertRequest>,
    ) -> Result<Response<pb::UpsertResponse>, Status> {
        self.stall().await;
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
            // A follower that is to win an election counts status requests down too.
            is_leader: self.leads(),
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

    async fn alarm_list(
        &self,
        _request: Request<pb::AlarmListRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
        Err(Status::unimplemented("fake"))
    }

    async fn alarm_disarm(
        &self,
        _request: Request<pb::AlarmDisarmRequest>,
    ) -> Result<Response<pb::AlarmResponse>, Status> {
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
pub async fn serve(node: FakeNode) -> String {
    let (listener, addr) = bind().await;
    serve_on(listener, node);
    addr
}

/// A loopback listener on a fresh port and its `host:port` (to know an address before the
/// node that will serve it exists).
pub async fn bind() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (listener, addr)
}

/// Serves `node` on `listener`.
pub fn serve_on(listener: tokio::net::TcpListener, node: FakeNode) {
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(KvServer::new(node.clone()))
            .add_service(AuthServer::new(node.auth.clone()))
            .add_service(ClusterServer::new(node))
            .serve_with_incoming(incoming),
    );
}

/// `impl Auth for FakeAuth`: `authenticate` as given, every other method unimplemented (the
/// whole impl comes from the macro so that `async_trait` sees every method).
macro_rules! fake_auth_impl {
    ($($method:ident($req:ident) -> $resp:ident;)*) => {
        #[tonic::async_trait]
        impl Auth for FakeAuth {
            async fn authenticate(
                &self,
                _request: Request<pb::AuthenticateRequest>,
            ) -> Result<Response<pb::AuthenticateResponse>, Status> {
                self.authentications.fetch_add(1, Ordering::SeqCst);
                if self.revoked.load(Ordering::SeqCst) {
                    return Err(unauthenticated("wrong user name or password"));
                }
                Ok(Response::new(pb::AuthenticateResponse {
                    token: "fake-token".into(),
                    ttl_ms: 60_000,
                }))
            }

            $(
                async fn $method(&self, _request: Request<pb::$req>) -> Result<Response<pb::$resp>, Status> {
                    Err(Status::unimplemented("fake"))
                }
            )*
        }
    };
}

fake_auth_impl! {
    auth_enable(AuthEnableRequest) -> AuthEnableResponse;
    auth_disable(AuthDisableRequest) -> AuthDisableResponse;
    auth_status(AuthStatusRequest) -> AuthStatusResponse;
    user_add(UserAddRequest) -> UserAddResponse;
    user_get(UserGetRequest) -> UserGetResponse;
    user_list(UserListRequest) -> UserListResponse;
    user_delete(UserDeleteRequest) -> UserDeleteResponse;
    user_change_password(UserChangePasswordRequest) -> UserChangePasswordResponse;
    user_grant_role(UserGrantRoleRequest) -> UserGrantRoleResponse;
    user_revoke_role(UserRevokeRoleRequest) -> UserRevokeRoleResponse;
    role_add(RoleAddRequest) -> RoleAddResponse;
    role_get(RoleGetRequest) -> RoleGetResponse;
    role_list(RoleListRequest) -> RoleListResponse;
    role_delete(RoleDeleteRequest) -> RoleDeleteResponse;
    role_grant_permission(RoleGrantPermissionRequest) -> RoleGrantPermissionResponse;
    role_revoke_permission(RoleRevokePermissionRequest) -> RoleRevokePermissionResponse;
}

/// A "node" that accepts connections, reads whatever arrives for a while, then closes the
/// socket without answering: the request was sent, so its outcome is unknown.
pub async fn serve_black_hole(hold: Duration) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                let mut buf = vec![0u8; 64 * 1024];
                let _ = tokio::time::timeout(hold, async {
                    loop {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        }
                    }
                })
                .await;
            });
        }
    });
    addr.to_string()
}
