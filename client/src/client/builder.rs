//! [`ClientBuilder`]: the settings of a [`Client`] and their defaults, and endpoint parsing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicUsize};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use super::{Client, Inner, Pool};
use crate::error::{Error, Result};
use crate::retry::RetryPolicy;
use crate::session::{SessionTracker, DEFAULT_SESSION_WINDOW};

/// Default client port of an ftkv node.
pub const DEFAULT_ENDPOINT: &str = "127.0.0.1:7379";
/// Default largest gRPC message sent or received: 64 MiB (a 4 MiB batch and big scan pages fit).
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Settings of a [`Client`]; see [`ClientBuilder`].
#[derive(Debug, Clone)]
pub(super) struct Config {
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
    /// First attempt timeout at an endpoint (`None`: derived from `request_timeout`).
    pub(super) attempt_timeout: Option<Duration>,
    pub(super) retry: RetryPolicy,
    pub(super) max_message_bytes: usize,
    pub(super) session_window: u64,
    pub(super) connections_per_endpoint: usize,
    pub(super) batch_requests: bool,
    /// TLS for every endpoint (`https://`), if set.
    pub(super) tls: Option<crate::tls::TlsOptions>,
    /// User and password to authenticate with, if set.
    pub(super) credentials: Option<super::auth::Credentials>,
}

/// Floor of the derived attempt timeout (a quarter of the request timeout).
pub(super) const MIN_ATTEMPT_TIMEOUT: Duration = Duration::from_millis(250);

impl Config {
    /// Time allowed to a first attempt at an endpoint: as set, else a quarter of
    /// `request_timeout` and at least [`MIN_ATTEMPT_TIMEOUT`]; never above `request_timeout`.
    pub(super) fn attempt_timeout(&self) -> Duration {
        self.attempt_timeout
            .unwrap_or_else(|| (self.request_timeout / 4).max(MIN_ATTEMPT_TIMEOUT))
            .min(self.request_timeout)
    }
}

/// Builds a [`Client`]: `Client::builder().endpoints(["127.0.0.1:7379"]).build().await?`.
#[derive(Debug, Clone)]
pub struct ClientBuilder {
    endpoints: Vec<String>,
    pub(super) config: Config,
    debug_drop_write_responses: u32,
}

impl Default for ClientBuilder {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            config: Config {
                connect_timeout: Duration::from_secs(2),
                request_timeout: Duration::from_secs(5),
                attempt_timeout: None,
                retry: RetryPolicy::default(),
                max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
                session_window: DEFAULT_SESSION_WINDOW,
                connections_per_endpoint: 1,
                batch_requests: true,
                tls: None,
                credentials: None,
            },
            debug_drop_write_responses: 0,
        }
    }
}

impl ClientBuilder {
    /// Client endpoints of the cluster's nodes, `host:port` (an `http://` prefix is accepted).
    /// Any one reachable node is enough: the others are learned from `NOT_LEADER` redirects.
    pub fn endpoints<I, S>(mut self, endpoints: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        self.endpoints = endpoints.into_iter().map(|e| e.as_ref().to_string()).collect();
        self
    }

    /// Time allowed to open a TCP + HTTP/2 connection to one endpoint (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.config.connect_timeout = timeout;
        self
    }

    /// Longest time allowed to one attempt of one call (default 5 s). A write whose attempt
    /// times out has an unknown outcome and is retried with the same session.
    ///
    /// Reads and writes to the leader start shorter: see [`ClientBuilder::attempt_timeout`].
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.config.request_timeout = timeout;
        self
    }

    /// Time allowed to the first attempt of a read or write at an endpoint (default: a quarter
    /// of the request timeout, at least 250 ms; never above it). When it runs out the client
    /// moves on to the other endpoints and the leader they name, so a paused or cut-off leader
    /// costs one short attempt, not the whole request timeout. While the others still name the
    /// node that timed out (their election has not finished), they are asked again after a
    /// backoff; once they have named it for as long as its attempt waited, it is asked again
    /// with twice the time, up to the request timeout (a slow leader is still waited for). A
    /// write whose attempt timed out is maybe applied: it is retried under the same session
    /// (applied once) and ends [`Error::Ambiguous`] if no answer comes. Membership changes
    /// always get the full request timeout.
    pub fn attempt_timeout(mut self, timeout: Duration) -> Self {
        self.config.attempt_timeout = Some(timeout);
        self
    }

    /// Retry budget of each call (default [`RetryPolicy::default`]).
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.config.retry = policy;
        self
    }

    /// Largest gRPC message sent or received, bytes (default 64 MiB).
    pub fn max_message_bytes(mut self, bytes: usize) -> Self {
        self.config.max_message_bytes = bytes;
        self
    }

    /// Most sequences a write may run ahead of the oldest outstanding write of this client
    /// (default [`DEFAULT_SESSION_WINDOW`] = 1000). When full, new writes wait for the oldest
    /// to finish. Must not exceed the node's results kept per client (1,024), or a write
    /// retried after a long stall may find its result forgotten.
    pub fn session_window(mut self, window: u64) -> Self {
        self.config.session_window = window.max(1);
        self
    }

    /// HTTP/2 connections opened to each endpoint (default 1; at least 1). Calls are spread
    /// round-robin over them; a few help when hundreds of calls run concurrently (benchmarks).
    pub fn connections_per_endpoint(mut self, n: usize) -> Self {
        self.config.connections_per_endpoint = n.max(1);
        self
    }

    /// Multiplex concurrent get/put/delete/write/txn/upsert calls over one `Kv.Batch` stream
    /// per endpoint (default true; TiKV's batch commands). Each request is still answered
    /// on its own, with the same errors and retry behaviour as a unary call; a busy client
    /// pays the gRPC framing once per batch of concurrent calls. Nodes without `Kv.Batch` are
    /// detected and served by unary calls. False: one unary RPC per call.
    pub fn batch_requests(mut self, enabled: bool) -> Self {
        self.config.batch_requests = enabled;
        self
    }

    /// Connects to every endpoint over TLS with these settings (see [`crate::TlsOptions`]).
    /// Without it an `https://` endpoint is refused at [`ClientBuilder::build`].
    pub fn tls(mut self, options: crate::tls::TlsOptions) -> Self {
        self.config.tls = Some(options);
        self
    }

    /// Authenticates as `user` with `password` (etcd's `--user`): [`ClientBuilder::build`]
    /// gets a token (`Auth.Authenticate`), every call carries it as
    /// `authorization: Bearer <token>`, it is renewed shortly before it expires, and a call
    /// answered `UNAUTHENTICATED` authenticates again once and is retried. A cluster with auth
    /// disabled answers without a token and requests go without one.
    pub fn user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.config.credentials = Some(super::auth::Credentials {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// **Test only.** Discards the first `n` successful write responses (put, delete, write,
    /// txn, upsert) as if the request had timed out after the node applied it, so the client
    /// retries them with the same session. Used to show that a retried `Upsert{Add}` after a
    /// timeout is applied exactly once. Never set this in production code.
    pub fn debug_drop_write_responses(mut self, n: u32) -> Self {
        self.debug_drop_write_responses = n;
        self
    }

    /// Validates the endpoints and creates the client. Connections are opened lazily on first
    /// use, so this succeeds even when no node is up yet. With [`ClientBuilder::user`] it
    /// authenticates first: a wrong user or password is [`Error::Unauthenticated`].
    ///
    /// Errors: [`Error::NoEndpoints`] for an empty list, [`Error::InvalidEndpoint`] for an
    /// endpoint that is not `host:port`.
    pub async fn build(self) -> Result<Client> {
        let mut endpoints: Vec<String> = Vec::new();
        for raw in &self.endpoints {
            if raw.trim().starts_with("https://") && self.config.tls.is_none() {
                return Err(Error::InvalidEndpoint {
                    endpoint: raw.clone(),
                    message: "an https:// endpoint needs TLS settings (ClientBuilder::tls; ftkvctl --cacert)"
                        .into(),
                });
            }
            let ep = normalize_endpoint(raw)?;
            if !endpoints.contains(&ep) {
                endpoints.push(ep);
            }
        }
        if endpoints.is_empty() {
            return Err(Error::NoEndpoints);
        }
        let session_window = self.config.session_window;
        let inner = Inner {
            config: self.config,
            pool: Mutex::new(Pool {
                endpoints,
                channels: HashMap::new(),
                batches: HashMap::new(),
            }),
            preferred: Mutex::new(None),
            rotation: AtomicUsize::new(0),
            next_connection: AtomicUsize::new(0),
            sessions: Mutex::new(SessionTracker::new(session_window)),
            drop_write_responses: AtomicU32::new(self.debug_drop_write_responses),
            tokens: super::TokenCache::default(),
            authenticated: std::sync::atomic::AtomicBool::new(false),
        };
        // Create every channel now so that a bad endpoint fails here, not on first use.
        let snapshot = inner.pool.lock().endpoints.clone();
        for ep in &snapshot {
            inner.channel(ep)?;
        }
        // A wrong password fails here; no node reachable yet is retried at the first call.
        if let Err(e @ (Error::Unauthenticated { .. } | Error::InvalidArgument { .. } | Error::Tls { .. })) =
            inner.authenticate().await
        {
            return Err(e);
        }
        Ok(Client {
            inner: Arc::new(inner),
        })
    }
}

/// Turns `http://host:port`, `https://host:port`, ` host:port ` or `host:port/` into
/// `host:port` (whether TLS is used is the client's setting, [`ClientBuilder::tls`]).
pub(crate) fn normalize_endpoint(raw: &str) -> Result<String> {
    let trimmed = raw.trim();
    let invalid = |message: &str| Error::InvalidEndpoint {
        endpoint: raw.to_string(),
        message: message.to_string(),
    };
    let bare = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .unwrap_or(trimmed)
        .trim_end_matches('/');
    if bare.is_empty() {
        return Err(invalid("empty endpoint"));
    }
    let Some((host, port)) = bare.rsplit_once(':') else {
        return Err(invalid("expected host:port"));
    };
    if host.is_empty() || bare.contains('/') {
        return Err(invalid("expected host:port"));
    }
    if port.parse::<u16>().is_err() {
        return Err(invalid("port is not a number in 0..=65535"));
    }
    Ok(bare.to_string())
}
