//! [`Client`]: leader discovery, redirects, retries with one overall deadline, and write
//! sessions, over one lazily connected gRPC channel per endpoint.
//!
//! Design source: etcd's clientv3 (endpoint list, balancer that sticks to a working endpoint,
//! retry of safe calls) and the Raft thesis section 6.2/6.3 (clients find the leader through
//! redirects and retry writes with the same session so they apply at most once).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ftkv_proto::v1 as pb;
use ftkv_proto::v1::cluster_client::ClusterClient;
use ftkv_proto::v1::kv_client::KvClient;
use parking_lot::Mutex;
use tonic::transport::Channel;

mod alarm;
mod auth;
mod builder;
mod bulk;
mod call;
mod maintenance;

pub use bulk::{BulkLoadReport, BulkLoader, OnDuplicate};

pub use alarm::{Alarm, NodeAlarms};
pub(crate) use auth::AuthChannel;
pub(crate) use auth::TokenCache;
pub use auth::{AuthStatus, PermType, Permission};
pub(crate) use builder::normalize_endpoint;
use builder::Config;
#[cfg(test)]
use builder::MIN_ATTEMPT_TIMEOUT;
pub use builder::{ClientBuilder, DEFAULT_ENDPOINT, DEFAULT_MAX_MESSAGE_BYTES};
use call::{CallKind, Target};

use crate::batch::BatchConn;
use crate::error::{not_sent, over_client_limit, Error, Result};
#[cfg(test)]
use crate::retry::RetryPolicy;
use crate::session::{SessionTracker, WriteSession};
use crate::types::{
    prefix_end, KeyValue, Membership, NodeStatus, Op, ReadConsistency, ResponseInfo, ScanOptions, ScanPage,
    Txn, TxnOpResult, TxnResult, UpsertOp,
};

#[derive(Debug)]
struct Pool {
    /// Every endpoint known: the initial list, then those learned from redirects.
    endpoints: Vec<String>,
    /// Lazily connected channels per endpoint (`connections_per_endpoint` each).
    channels: HashMap<String, Vec<Channel>>,
    /// `Kv.Batch` stream per endpoint (when `batch_requests`), reopened after it breaks.
    batches: HashMap<String, BatchConn>,
}

#[derive(Debug)]
struct Inner {
    config: Config,
    pool: Mutex<Pool>,
    /// The endpoint that answered last (the leader after any write); tried first.
    preferred: Mutex<Option<String>>,
    /// Round-robin position used while no endpoint is preferred.
    rotation: AtomicUsize,
    /// Round-robin position over an endpoint's connections.
    next_connection: AtomicUsize,
    /// Where new writes get their session. Replaced by one with a fresh client id after a
    /// `StaleSequence` answer ([`Inner::retire_client_id`]); writes already begun keep theirs.
    sessions: Mutex<Arc<SessionTracker>>,
    drop_write_responses: AtomicU32,
    /// The token every call carries (with a user, [`ClientBuilder::user`]).
    tokens: TokenCache,
    /// Set once `Authenticate` answered (a token, or "auth not enabled").
    authenticated: std::sync::atomic::AtomicBool,
}

/// What one attempt of a call talks to: the endpoint and its channel. `Kv` calls also look up
/// the endpoint's `Kv.Batch` stream ([`Inner::kv`]); cluster calls never need it.
#[derive(Debug, Clone)]
struct Conn {
    endpoint: String,
    channel: Channel,
}

/// The `Kv` calls of one attempt: through the endpoint's `Kv.Batch` stream when there is one,
/// else unary. Same shapes as the generated `KvClient` methods.
struct KvConn {
    unary: KvClient<AuthChannel>,
    batch: Option<BatchConn>,
    /// The client's `max_message_bytes`: a larger request is refused before it is sent.
    max_message_bytes: usize,
}

impl KvConn {
    /// Refuses, unsent, a request over the client's message limit (tonic would fail it in
    /// the encoder after the request started, which leaves a write's outcome unknown).
    fn check_size(&self, req: &impl prost::Message) -> std::result::Result<(), tonic::Status> {
        let bytes = req.encoded_len();
        if bytes > self.max_message_bytes {
            return Err(over_client_limit(
                "max_message_bytes",
                format!(
                    "request is {bytes} bytes, over the client's max_message_bytes ({}); it was not sent",
                    self.max_message_bytes
                ),
            ));
        }
        Ok(())
    }
}

macro_rules! kv_call {
    ($name:ident, $req:ty, $resp:ty, $variant:ident) => {
        async fn $name(&mut self, req: $req) -> std::result::Result<tonic::Response<$resp>, tonic::Status> {
            use pb::batch_request_item::Request as Rq;
            use pb::batch_response_item::Response as Rs;
            self.check_size(&req)?;
            let Some(batch) = &self.batch else {
                return self.unary.$name(req).await;
            };
            match batch.call(Rq::$variant(req)).await {
                Ok(Rs::$variant(r)) => Ok(tonic::Response::new(r)),
                Ok(_) => Err(tonic::Status::internal(concat!(
                    "batch answer of another kind than ",
                    stringify!($variant)
                ))),
                // The node has no Kv.Batch (the request never ran): the retry loop's next
                // attempt goes unary, since the connection is now marked unsupported.
                Err(status) if status.code() == tonic::Code::Unimplemented && batch.is_unsupported() => Err(
                    not_sent("node does not serve Kv.Batch; retrying with unary calls"),
                ),
                Err(status) => Err(status),
            }
        }
    };
}

impl KvConn {
    kv_call!(get, pb::GetRequest, pb::GetResponse, Get);
    kv_call!(put, pb::PutRequest, pb::PutResponse, Put);
    kv_call!(delete, pb::DeleteRequest, pb::DeleteResponse, Delete);
    kv_call!(write, pb::WriteRequest, pb::WriteResponse, Write);
    kv_call!(txn, pb::TxnRequest, pb::TxnResponse, Txn);
    kv_call!(upsert, pb::UpsertRequest, pb::UpsertResponse, Upsert);

    /// Scans stay unary (pages are large; nothing to gain from batching).
    async fn scan(
        &mut self,
        req: pb::ScanRequest,
    ) -> std::result::Result<tonic::Response<pb::ScanResponse>, tonic::Status> {
        self.check_size(&req)?;
        self.unary.scan(req).await
    }
}

impl Inner {
    /// A channel to `endpoint` (round-robin over its connections), created on first use.
    fn channel(&self, endpoint: &str) -> Result<Channel> {
        let mut pool = self.pool.lock();
        if let Some(channels) = pool.channels.get(endpoint) {
            let i = self.next_connection.fetch_add(1, Ordering::Relaxed) % channels.len().max(1);
            if let Some(ch) = channels.get(i) {
                return Ok(ch.clone());
            }
        }
        let scheme = if self.config.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let uri = format!("{scheme}://{endpoint}");
        let invalid = |e: &dyn std::fmt::Display| Error::InvalidEndpoint {
            endpoint: endpoint.to_string(),
            message: e.to_string(),
        };
        let ep = tonic::transport::Endpoint::from_shared(uri)
            .map_err(|e| invalid(&e))?
            .connect_timeout(self.config.connect_timeout)
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5))
            .keep_alive_while_idle(true);
        let ep = match &self.config.tls {
            Some(tls) => ep.tls_config(tls.to_tonic()).map_err(|e| Error::Tls {
                message: format!("TLS settings for {endpoint}: {e}"),
            })?,
            None => ep,
        };
        // Each lazy channel opens its own HTTP/2 connection: several spread the frame work of
        // many concurrent calls over the runtime's threads (client and node side).
        let channels: Vec<Channel> = (0..self.config.connections_per_endpoint.max(1))
            .map(|_| ep.connect_lazy())
            .collect();
        let ch = channels
            .first()
            .cloned()
            .ok_or_else(|| invalid(&"no connection"))?;
        pool.channels.insert(endpoint.to_string(), channels);
        if !pool.endpoints.iter().any(|e| e == endpoint) {
            pool.endpoints.push(endpoint.to_string());
        }
        Ok(ch)
    }

    /// Begins a write on the current session tracker (waits while its window is full).
    async fn begin_write(&self) -> WriteSession {
        let tracker = Arc::clone(&self.sessions.lock());
        tracker.begin().await
    }

    /// After a `StaleSequence` answer to a write of `client_id`: the node's window for that id
    /// is above a sequence this client still used, so the node and this client disagree on the
    /// id's history (its results were dropped, or another instance uses the same id). New writes
    /// move to a fresh random id, which the node has never seen, so nothing of theirs can be
    /// stale or taken for a duplicate. Safe for exactly-once: writes already begun keep their
    /// old id and sequence (their [`WriteSession`] holds the old tracker), so a retry of one is
    /// still recognized; the stale write itself is re-sent under the new id only when it was
    /// certainly not applied (see [`Client::client_id`]).
    /// Returns false when the id was already retired (concurrent stale answers rotate once).
    fn retire_client_id(&self, client_id: u64) -> bool {
        let mut current = self.sessions.lock();
        if current.client_id() != client_id {
            return false;
        }
        let mut fresh = SessionTracker::new(self.config.session_window);
        while fresh.client_id() == client_id {
            fresh = SessionTracker::new(self.config.session_window);
        }
        tracing::warn!(
            old_client_id = client_id,
            new_client_id = fresh.client_id(),
            "stale session sequence: new writes use a fresh client id"
        );
        *current = fresh;
        true
    }

    fn kv_client(&self, ch: Channel) -> KvClient<AuthChannel> {
        KvClient::with_interceptor(ch, self.tokens.interceptor())
            .max_decoding_message_size(self.config.max_message_bytes)
            .max_encoding_message_size(self.config.max_message_bytes)
    }

    fn kv(&self, conn: Conn) -> KvConn {
        KvConn {
            max_message_bytes: self.config.max_message_bytes,
            batch: self.batch_conn(&conn.endpoint, &conn.channel),
            unary: self.kv_client(conn.channel),
        }
    }

    /// The `Kv.Batch` stream to `endpoint` (opened on first use, reopened once closed), or
    /// `None` when batching is off or the node does not serve it.
    fn batch_conn(&self, endpoint: &str, channel: &Channel) -> Option<BatchConn> {
        if !self.config.batch_requests {
            return None;
        }
        let mut pool = self.pool.lock();
        if let Some(conn) = pool.batches.get(endpoint) {
            if conn.is_unsupported() {
                return None;
            }
            if !conn.is_closed() {
                return Some(conn.clone());
            }
        }
        let conn = BatchConn::open(self.kv_client(channel.clone()), self.config.max_message_bytes);
        pool.batches.insert(endpoint.to_string(), conn.clone());
        Some(conn)
    }

    fn cluster(&self, conn: Conn) -> ClusterClient<AuthChannel> {
        ClusterClient::with_interceptor(conn.channel, self.tokens.interceptor())
            .max_decoding_message_size(self.config.max_message_bytes)
            .max_encoding_message_size(self.config.max_message_bytes)
    }

    fn endpoints(&self) -> Vec<String> {
        self.pool.lock().endpoints.clone()
    }
}

/// Async client of an ftkv cluster. Cheap to clone: clones share channels, the known leader
/// and the write session.
///
/// Every call finds the leader (following `NOT_LEADER` redirects, also to endpoints not in the
/// initial list), retries unavailable nodes with exponential backoff and jitter under one
/// overall deadline ([`RetryPolicy`](crate::RetryPolicy)), and sends writes with a session (random client id,
/// increasing sequence) so that a retried write is applied at most once. A write whose outcome
/// stays unknown ends with [`Error::Ambiguous`].
#[derive(Debug, Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

impl Client {
    /// A builder with the defaults: no endpoints, 2 s connect timeout, 5 s request timeout,
    /// [`RetryPolicy::default`](crate::RetryPolicy::default).
    pub fn builder() -> ClientBuilder {
        ClientBuilder::default()
    }

    /// A client with default settings for the given endpoints.
    pub async fn connect<I, S>(endpoints: I) -> Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::builder().endpoints(endpoints).build().await
    }

    /// Every endpoint this client knows: the initial ones, then those learned from redirects.
    pub fn endpoints(&self) -> Vec<String> {
        self.inner.endpoints()
    }

    /// The endpoint that answered last (the leader after a successful write), if any.
    pub fn preferred_endpoint(&self) -> Option<String> {
        self.inner.preferred.lock().clone()
    }

    /// The random, non-zero client id new writes carry. It changes when a node answers a
    /// write `StaleSequence` (the node forgot results this id still needed, or another
    /// instance uses the id): later writes use a fresh id and writes already begun keep the
    /// old one. The stale write itself is sent once more under the fresh id when the stale
    /// answer came to its first delivery (the node refused it: not applied); when an earlier
    /// delivery may have applied it, it ends [`Error::Ambiguous`] and is not sent again.
    pub fn client_id(&self) -> u64 {
        self.inner.sessions.lock().client_id()
    }

    // ----- reads -----

    /// Linearizable read of one key: `Ok(None)` when absent.
    pub async fn get(&self, key: impl AsRef<[u8]>) -> Result<Option<Vec<u8>>> {
        self.get_with(key, ReadConsistency::Linearizable).await
    }

    /// Read of one key with the given consistency: `Ok(None)` when absent.
    pub async fn get_with(
        &self,
        key: impl AsRef<[u8]>,
        consistency: ReadConsistency,
    ) -> Result<Option<Vec<u8>>> {
        let req = pb::GetRequest {
            key: key.as_ref().to_vec(),
            consistency: consistency.to_proto(),
        };
        let inner = &self.inner;
        let resp = inner
            .call(CallKind::Read, Target::Leader, |ch| {
                let mut kv = inner.kv(ch);
                let req = req.clone();
                async move { kv.get(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.found.then_some(resp.value))
    }

    /// One page of `[start, end)` (empty `end` = unbounded), at most `limit` pairs
    /// (0 = server default, 1000). Linearizable.
    pub async fn scan(&self, start: impl AsRef<[u8]>, end: impl AsRef<[u8]>, limit: u32) -> Result<ScanPage> {
        self.scan_with(
            start,
            end,
            ScanOptions {
                limit,
                ..ScanOptions::default()
            },
        )
        .await
    }

    /// One page of `[start, end)` with explicit options.
    pub async fn scan_with(
        &self,
        start: impl AsRef<[u8]>,
        end: impl AsRef<[u8]>,
        options: ScanOptions,
    ) -> Result<ScanPage> {
        let req = pb::ScanRequest {
            start: start.as_ref().to_vec(),
            end: end.as_ref().to_vec(),
            limit: options.limit,
            consistency: options.consistency.to_proto(),
            keys_only: options.keys_only,
        };
        let inner = &self.inner;
        let resp = inner
            .call(CallKind::Read, Target::Leader, |ch| {
                let mut kv = inner.kv(ch);
                let req = req.clone();
                async move { kv.scan(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(ScanPage {
            kvs: resp
                .kvs
                .into_iter()
                .map(|kv| KeyValue {
                    key: kv.key,
                    value: kv.value,
                })
                .collect(),
            more: resp.more,
            next_start: resp.next_start,
        })
    }

    /// Every pair of `[start, end)` (empty `end` = unbounded), following continuations, up to
    /// `max_pairs` pairs (0 = no cap). `options.limit` is the page size. Each page is its own
    /// read: the result is not one snapshot when the range spans pages.
    pub async fn scan_all(
        &self,
        start: impl AsRef<[u8]>,
        end: impl AsRef<[u8]>,
        max_pairs: usize,
        options: ScanOptions,
    ) -> Result<Vec<KeyValue>> {
        let end = end.as_ref().to_vec();
        let mut cursor = start.as_ref().to_vec();
        let mut out: Vec<KeyValue> = Vec::new();
        loop {
            let mut page_opts = options;
            if max_pairs > 0 {
                let remaining = max_pairs.saturating_sub(out.len());
                let cap = u32::try_from(remaining).unwrap_or(u32::MAX);
                page_opts.limit = if options.limit == 0 {
                    cap.min(1000)
                } else {
                    options.limit.min(cap)
                };
            }
            let page = self.scan_with(&cursor, &end, page_opts).await?;
            out.extend(page.kvs);
            if max_pairs > 0 && out.len() >= max_pairs {
                out.truncate(max_pairs);
                return Ok(out);
            }
            if !page.more {
                return Ok(out);
            }
            if page.next_start <= cursor {
                return Err(Error::Server {
                    code: "Internal".into(),
                    message: "scan continuation did not advance".into(),
                });
            }
            cursor = page.next_start;
        }
    }

    /// Every pair whose key starts with `prefix` (see [`Client::scan_all`]).
    pub async fn scan_prefix(
        &self,
        prefix: impl AsRef<[u8]>,
        max_pairs: usize,
        options: ScanOptions,
    ) -> Result<Vec<KeyValue>> {
        let prefix = prefix.as_ref();
        self.scan_all(prefix, prefix_end(prefix), max_pairs, options)
            .await
    }

    // ----- writes -----

    /// Sends one session-carrying write under the retry policy, with the caller's `session`
    /// or else a new one. A new session's write whose first delivery is answered
    /// `StaleSequence` was not applied: it is sent once more under a fresh session (the client
    /// id was just retired). A caller-held session is never replaced.
    async fn write_call<T, F, Fut>(&self, session: Option<&WriteSession>, mut attempt: F) -> Result<T>
    where
        F: FnMut(KvConn, pb::Session) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        if let Some(session) = session {
            return self.write_once(session, &mut attempt).await.map_err(|e| e.error);
        }
        let session = self.inner.begin_write().await;
        match self.write_once(&session, &mut attempt).await {
            Err(e) if e.stale_not_applied => {
                drop(session);
                let fresh = self.inner.begin_write().await;
                self.write_once(&fresh, &mut attempt).await.map_err(|e| e.error)
            }
            other => other.map_err(|e| e.error),
        }
    }

    async fn write_once<T, F, Fut>(
        &self,
        session: &WriteSession,
        attempt: &mut F,
    ) -> std::result::Result<T, call::CallError>
    where
        F: FnMut(KvConn, pb::Session) -> Fut,
        Fut: Future<Output = std::result::Result<T, tonic::Status>>,
    {
        let inner = &self.inner;
        inner
            .call_detailed(
                CallKind::Write {
                    client_id: session.client_id(),
                },
                Target::Leader,
                |ch| attempt(inner.kv(ch), session.to_proto()),
            )
            .await
    }

    /// Blind write of one key. Errors: [`Error::InvalidArgument`] (empty key, over
    /// `max_key_bytes` / `max_value_bytes`), [`Error::Ambiguous`], retry exhaustion.
    pub async fn put(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Result<ResponseInfo> {
        let (key, value) = (key.as_ref().to_vec(), value.as_ref().to_vec());
        let resp = self
            .write_call(None, |mut kv, s| {
                let req = pb::PutRequest {
                    key: key.clone(),
                    value: value.clone(),
                    session: Some(s),
                };
                async move { kv.put(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.header.into())
    }

    /// Blind delete of one key (no error when absent).
    pub async fn delete(&self, key: impl AsRef<[u8]>) -> Result<ResponseInfo> {
        let key = key.as_ref().to_vec();
        let resp = self
            .write_call(None, |mut kv, s| {
                let req = pb::DeleteRequest {
                    key: key.clone(),
                    session: Some(s),
                };
                async move { kv.delete(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.header.into())
    }

    /// Atomic batch (at most `max_batch_ops` ops and `max_batch_bytes` on the node).
    pub async fn write(&self, ops: Vec<Op>) -> Result<ResponseInfo> {
        let ops: Vec<pb::WriteOp> = ops.iter().map(Op::to_proto).collect();
        let resp = self
            .write_call(None, |mut kv, s| {
                let req = pb::WriteRequest {
                    ops: ops.clone(),
                    session: Some(s),
                };
                async move { kv.write(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.header.into())
    }

    /// Deletes every key in `[start, end)` (empty `end` = unbounded), atomically.
    pub async fn delete_range(&self, start: impl AsRef<[u8]>, end: impl AsRef<[u8]>) -> Result<ResponseInfo> {
        self.write(vec![Op::DeleteRange {
            start: start.as_ref().to_vec(),
            end: end.as_ref().to_vec(),
        }])
        .await
    }

    /// Deletes every key starting with `prefix` (an empty prefix deletes everything).
    pub async fn delete_prefix(&self, prefix: impl AsRef<[u8]>) -> Result<ResponseInfo> {
        let prefix = prefix.as_ref();
        self.delete_range(prefix, prefix_end(prefix)).await
    }

    /// Read-free update of one key (TokuDB upsert). Applied exactly once even when retried.
    pub async fn upsert(&self, key: impl AsRef<[u8]>, op: UpsertOp) -> Result<ResponseInfo> {
        self.upsert_in(None, key, op).await
    }

    /// **Test and tooling use.** A fresh write session (next sequence of this client), kept
    /// outstanding until dropped. With [`Client::upsert_with_session`] a test can send the
    /// same write twice, as a retry after a lost response would.
    pub async fn new_write_session(&self) -> WriteSession {
        self.inner.begin_write().await
    }

    /// [`Client::upsert`] with a caller-held session: sending it twice with the same session
    /// must apply it once (the node answers the duplicate from its session table).
    pub async fn upsert_with_session(
        &self,
        session: &WriteSession,
        key: impl AsRef<[u8]>,
        op: UpsertOp,
    ) -> Result<ResponseInfo> {
        self.upsert_in(Some(session), key, op).await
    }

    async fn upsert_in(
        &self,
        session: Option<&WriteSession>,
        key: impl AsRef<[u8]>,
        op: UpsertOp,
    ) -> Result<ResponseInfo> {
        let key = key.as_ref().to_vec();
        let op = op.to_proto();
        let resp = self
            .write_call(session, |mut kv, s| {
                let req = pb::UpsertRequest {
                    key: key.clone(),
                    op: Some(op.clone()),
                    session: Some(s),
                };
                async move { kv.upsert(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.header.into())
    }

    /// etcd-style transaction: if every compare holds run `success`, else `failure`, atomically.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        let compare: Vec<pb::Compare> = txn.compares.iter().map(|c| c.to_proto()).collect();
        let success: Vec<pb::TxnOp> = txn.success.iter().map(|o| o.to_proto()).collect();
        let failure: Vec<pb::TxnOp> = txn.failure.iter().map(|o| o.to_proto()).collect();
        let resp = self
            .write_call(None, |mut kv, s| {
                let req = pb::TxnRequest {
                    compare: compare.clone(),
                    success: success.clone(),
                    failure: failure.clone(),
                    session: Some(s),
                };
                async move { kv.txn(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(TxnResult {
            succeeded: resp.succeeded,
            results: resp
                .results
                .into_iter()
                .map(|r| TxnOpResult {
                    found: r.found,
                    value: r.value,
                })
                .collect(),
            info: resp.header.into(),
        })
    }

    // ----- cluster -----

    /// `Cluster.Status` of exactly this endpoint (no redirect, one attempt within the request
    /// timeout). `with_digest` also asks for the state digest (a full scan on the node).
    pub async fn status_with(&self, endpoint: &str, with_digest: bool) -> Result<NodeStatus> {
        let endpoint = normalize_endpoint(endpoint)?;
        let inner = &self.inner;
        let resp = inner
            .call(CallKind::Read, Target::Fixed(endpoint.clone()), |ch| {
                let mut c = inner.cluster(ch);
                async move {
                    c.status(pb::StatusRequest { with_digest })
                        .await
                        .map(|r| r.into_inner())
                }
            })
            .await?;
        Ok(NodeStatus::from_proto(&endpoint, resp))
    }

    /// `Cluster.Status` of exactly this endpoint, without digest.
    pub async fn status(&self, endpoint: &str) -> Result<NodeStatus> {
        self.status_with(endpoint, false).await
    }

    /// Status of every node: the membership's client endpoints (when `Members` answers) plus
    /// every endpoint this client knows, asked concurrently. One entry per endpoint, in
    /// membership order then the rest; unreachable nodes give an `Err`.
    pub async fn status_all(&self) -> Vec<(String, Result<NodeStatus>)> {
        self.status_all_with(false).await
    }

    /// [`Client::status_all`], optionally with each node's state digest.
    pub async fn status_all_with(&self, with_digest: bool) -> Vec<(String, Result<NodeStatus>)> {
        let endpoints = self.all_endpoints().await;
        let futures = endpoints.iter().map(|ep| self.status_with(ep, with_digest));
        let results = futures::future::join_all(futures).await;
        endpoints.into_iter().zip(results).collect()
    }

    /// Current membership (voters and learners), as the leader or any node reports it.
    pub async fn members(&self) -> Result<Membership> {
        let inner = &self.inner;
        let resp = inner
            .call(CallKind::Read, Target::Leader, |ch| {
                let mut c = inner.cluster(ch);
                async move { c.members(pb::MembersRequest {}).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.into())
    }

    /// Adds a non-voting learner with the given id and addresses; it starts replicating at once.
    /// An id that is already a member with other addresses is refused (see
    /// [`Client::update_member`]).
    pub async fn add_learner(
        &self,
        id: u64,
        client_endpoint: &str,
        peer_endpoint: &str,
    ) -> Result<Membership> {
        self.add_or_update(id, client_endpoint, peer_endpoint, false)
            .await
    }

    /// Changes the addresses of an existing member.
    pub async fn update_member(
        &self,
        id: u64,
        client_endpoint: &str,
        peer_endpoint: &str,
    ) -> Result<Membership> {
        self.add_or_update(id, client_endpoint, peer_endpoint, true).await
    }

    async fn add_or_update(
        &self,
        id: u64,
        client_endpoint: &str,
        peer_endpoint: &str,
        update: bool,
    ) -> Result<Membership> {
        let req = pb::AddLearnerRequest {
            id,
            client_endpoint: client_endpoint.to_string(),
            peer_endpoint: peer_endpoint.to_string(),
            update,
        };
        let inner = &self.inner;
        let resp = inner
            .call(CallKind::Admin, Target::Leader, |ch| {
                let mut c = inner.cluster(ch);
                let req = req.clone();
                async move { c.add_learner(req).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.into())
    }

    /// Turns learner `id` into a voter.
    pub async fn promote(&self, id: u64) -> Result<Membership> {
        let inner = &self.inner;
        let resp = inner
            .call(CallKind::Admin, Target::Leader, |ch| {
                let mut c = inner.cluster(ch);
                async move { c.promote(pb::PromoteRequest { id }).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.into())
    }

    /// Removes voter or learner `id`.
    pub async fn remove(&self, id: u64) -> Result<Membership> {
        let inner = &self.inner;
        let resp = inner
            .call(CallKind::Admin, Target::Leader, |ch| {
                let mut c = inner.cluster(ch);
                async move { c.remove(pb::RemoveRequest { id }).await.map(|r| r.into_inner()) }
            })
            .await?;
        Ok(resp.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalized() {
        assert_eq!(normalize_endpoint("127.0.0.1:7379").unwrap(), "127.0.0.1:7379");
        assert_eq!(
            normalize_endpoint(" http://localhost:1/ ").unwrap(),
            "localhost:1"
        );
        assert!(matches!(
            normalize_endpoint("localhost"),
            Err(Error::InvalidEndpoint { .. })
        ));
        assert!(matches!(
            normalize_endpoint("h:99999"),
            Err(Error::InvalidEndpoint { .. })
        ));
        assert_eq!(normalize_endpoint("https://h:1").unwrap(), "h:1");
        assert!(matches!(
            normalize_endpoint(""),
            Err(Error::InvalidEndpoint { .. })
        ));
        assert!(matches!(
            normalize_endpoint("h:1/x"),
            Err(Error::InvalidEndpoint { .. })
        ));
    }

    #[tokio::test]
    async fn a_client_id_is_retired_once_and_sessions_begun_keep_theirs() {
        let c = Client::builder().endpoints(["a:1"]).build().await.unwrap();
        let old_id = c.client_id();
        let held = c.new_write_session().await;
        assert!(c.inner.retire_client_id(old_id));
        let new_id = c.client_id();
        assert_ne!(new_id, old_id);
        // A second stale answer for the old id (a concurrent write) does not rotate again.
        assert!(!c.inner.retire_client_id(old_id));
        assert_eq!(c.client_id(), new_id);
        assert_eq!(held.client_id(), old_id, "a write begun keeps its id");
        assert_eq!(held.to_proto().client_id, old_id);
        let next = c.new_write_session().await;
        assert_eq!((next.client_id(), next.sequence()), (new_id, 1));
    }

    #[test]
    fn attempt_timeout_is_a_quarter_of_the_request_timeout_with_a_floor_and_a_cap() {
        let config = |request_ms: u64, attempt_ms: Option<u64>| Config {
            request_timeout: Duration::from_millis(request_ms),
            attempt_timeout: attempt_ms.map(Duration::from_millis),
            ..ClientBuilder::default().config
        };
        assert_eq!(config(5000, None).attempt_timeout(), Duration::from_millis(1250));
        assert_eq!(config(400, None).attempt_timeout(), MIN_ATTEMPT_TIMEOUT);
        assert_eq!(config(100, None).attempt_timeout(), Duration::from_millis(100));
        assert_eq!(
            config(5000, Some(300)).attempt_timeout(),
            Duration::from_millis(300)
        );
        assert_eq!(
            config(1000, Some(9000)).attempt_timeout(),
            Duration::from_millis(1000)
        );
    }

    #[tokio::test]
    async fn build_rejects_empty_and_bad_endpoints() {
        assert_eq!(Client::builder().build().await.unwrap_err(), Error::NoEndpoints);
        let e = Client::builder().endpoints(["nope"]).build().await.unwrap_err();
        assert!(matches!(e, Error::InvalidEndpoint { .. }));
        let c = Client::builder()
            .endpoints(["a:1", "http://a:1", "b:2"])
            .build()
            .await
            .unwrap();
        assert_eq!(c.endpoints(), vec!["a:1".to_string(), "b:2".to_string()]);
    }

    #[tokio::test]
    async fn unreachable_endpoints_fail_within_the_deadline() {
        // Port 1 on loopback refuses connections: the request is never sent.
        let policy = RetryPolicy {
            max_attempts: 50,
            initial_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            deadline: Duration::from_millis(400),
        };
        let c = Client::builder()
            .endpoints(["127.0.0.1:1"])
            .retry(policy)
            .build()
            .await
            .unwrap();
        let t0 = std::time::Instant::now();
        let e = c.put("k", "v").await.unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(3), "took {:?}", t0.elapsed());
        assert!(
            matches!(e, Error::Unavailable { .. } | Error::Timeout { .. }),
            "a refused connection means not applied, not ambiguous: {e:?}"
        );
        let e = c.get("k").await.unwrap_err();
        assert!(e.is_retryable(), "{e:?}");
    }
}
