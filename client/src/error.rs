//! The client's one error type, and the mapping from gRPC statuses to it.
//!
//! Every error status an ftkv node sends carries an encoded [`ftkv_proto::v1::ErrorInfo`] in
//! `Status::details()`; [`classify_status`] decodes it, so a redirect (`NOT_LEADER`), a refused
//! request and a write of unknown outcome (`AMBIGUOUS`) stay apart. Statuses without an
//! `ErrorInfo` come from the transport or a codec (connection refused or lost, HTTP/2 reset, a
//! message over the size limit) and are classified by code. Only the server's own refusal
//! (`ErrorInfo` kind `LIMIT`, `INVALID`, `NOT_LEADER`, `UNAVAILABLE`, `NO_SPACE`) or a request the client
//! knows it never sent (connection never made, [`not_sent`]) means "not applied": a bare
//! `OUT_OF_RANGE` or `RESOURCE_EXHAUSTED` may come after the write committed (its response was
//! too large), so a write ending with one is [`Error::Ambiguous`].
//!
//! Design source: openraft's split of API errors (`ForwardToLeader` with the leader's address),
//! and Jepsen's ok / fail / info outcomes: an unknown write is reported as
//! [`Error::Ambiguous`], never as failed.

use ftkv_proto::v1::{error_info::Kind, ErrorInfo};

/// Result alias of the client library.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a client call.
///
/// Whether an error leaves a write *definitely not applied* or *maybe applied* matters to the
/// caller: [`Error::Ambiguous`] is the only variant a write can end with whose effect is unknown.
/// Every other variant returned by a write means it was not applied (or, for
/// [`Error::NotOnAllReplicas`], that it was committed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The node asked is not the leader. Only surfaces when the retry budget ran out while
    /// following redirects. `leader_endpoint` is the leader's client address (`host:port`)
    /// when the node knew it.
    #[error("not the leader{}", leader_hint(.leader_id, .leader_endpoint))]
    NotLeader {
        /// Id of the leader the node knew of (0 if none).
        leader_id: u64,
        /// Client endpoint (`host:port`) of the leader, if known.
        leader_endpoint: Option<String>,
    },
    /// No node could serve the request: no quorum, shutting down, or no endpoint reachable.
    #[error("unavailable: {message}")]
    Unavailable {
        /// What the node or the transport said.
        message: String,
    },
    /// A request or the overall deadline ran out before an answer came.
    #[error("timed out after {elapsed_ms} ms")]
    Timeout {
        /// Time spent, in milliseconds.
        elapsed_ms: u64,
    },
    /// The request is malformed or over a limit (`limit` names it, e.g. `max_key_bytes`).
    /// Never retried: the same request would fail again.
    #[error("invalid argument: {message}{}", limit_suffix(.limit))]
    InvalidArgument {
        /// What is wrong.
        message: String,
        /// Config name of the limit that was exceeded, if a limit.
        limit: Option<String>,
    },
    /// The write may or may not have been applied (leadership lost after proposal, timeout or
    /// connection lost after sending, and the retries with the same session ran out). Check
    /// the state before writing again: a new write carries a new sequence number.
    #[error("outcome unknown (write may or may not have been applied): {message}")]
    Ambiguous {
        /// The last failure seen.
        message: String,
    },
    /// The write committed on a quorum but not yet on every voter within the node's
    /// `ack_all_timeout_ms` (`ack = "all"`). The write is durable; do not retry it.
    #[error("committed but not yet on all replicas{}: {message}", index_suffix(.log_index))]
    NotOnAllReplicas {
        /// Log index of the entry, when the node reported it (`ErrorInfo.log_index`, or
        /// `log_index=N` in the message of older nodes).
        log_index: Option<u64>,
        /// What the node said.
        message: String,
    },
    /// The node stopped taking writes after a storage fault (failed fsync, checksum mismatch).
    #[error("storage fault on the node: {message}")]
    StorageFault {
        /// What the node said.
        message: String,
    },
    /// The node refused the write before proposing it: its NOSPACE alarm is raised (data dir
    /// over `space.quota_bytes`, disk under `space.disk_reserve_bytes`, or full). Not applied;
    /// not retried (the same write fails until the operator frees space and runs
    /// `ftkvctl alarm disarm`). Deletes are still accepted, reads go on.
    #[error("no space on the node: {message}{}", limit_suffix(.limit))]
    NoSpace {
        /// What the node said (names the node, its data dir and the figures).
        message: String,
        /// The quota crossed: `space.quota_bytes`, `space.disk_reserve_bytes` or `disk`.
        limit: Option<String>,
        /// The node's `ErrorInfo.metadata` (node_id, data_dir, data_dir_bytes, ...).
        metadata: std::collections::BTreeMap<String, String>,
    },
    /// The connection failed or broke (no answer from the node's gRPC service).
    #[error("transport error: {message}")]
    Transport {
        /// What the transport said.
        message: String,
    },
    /// An endpoint string could not be turned into a URI.
    #[error("invalid endpoint {endpoint:?}: {message}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// Why it is not valid.
        message: String,
    },
    /// TLS does not fit: a plaintext client at a TLS port or the reverse, a server certificate
    /// the CA does not vouch for, a client certificate missing or refused, an unreadable
    /// certificate file. The message names the mismatch. Not retried; not applied.
    #[error("TLS: {message}")]
    Tls {
        /// What does not fit.
        message: String,
    },
    /// A bulk load with `OnDuplicate::Error` met a key twice (rows count from 0 in the order
    /// sent; `first_row` is `None` when the key existed before the load). Nothing of the load
    /// was applied.
    #[error("{message}")]
    DuplicateKey {
        /// The key.
        key: Vec<u8>,
        /// Row of its first occurrence, `None` when it existed before the load.
        first_row: Option<u64>,
        /// Row of the duplicate.
        second_row: u64,
        /// What the node said.
        message: String,
    },
    /// No valid credentials (`UNAUTHENTICATED`): no token while auth is on, a bad, expired or
    /// revoked token, an unknown user or a wrong password. A client built with
    /// [`ClientBuilder::user`](crate::ClientBuilder::user) authenticates again once and retries
    /// before returning it. Not applied.
    #[error("unauthenticated: {message}")]
    Unauthenticated {
        /// What the node said.
        message: String,
    },
    /// The user's roles do not allow the call (`PERMISSION_DENIED`); the message names the
    /// user, the key range and the permission missing. Not applied; not retried.
    #[error("permission denied: {message}")]
    PermissionDenied {
        /// What the node said.
        message: String,
    },
    /// The client was built without endpoints.
    #[error("no endpoints configured")]
    NoEndpoints,
    /// Any other status from a node (code name and message as sent).
    #[error("server error {code}: {message}")]
    Server {
        /// gRPC code name, e.g. `Internal`.
        code: String,
        /// Status message.
        message: String,
    },
}

fn leader_hint(leader_id: &u64, endpoint: &Option<String>) -> String {
    match (leader_id, endpoint) {
        (_, Some(ep)) => format!(" (leader at {ep})"),
        (0, None) => " (no leader known)".to_string(),
        (id, None) => format!(" (leader is node {id}, address unknown)"),
    }
}

fn limit_suffix(limit: &Option<String>) -> String {
    match limit {
        Some(l) => format!(" (limit {l})"),
        None => String::new(),
    }
}

fn index_suffix(index: &Option<u64>) -> String {
    match index {
        Some(i) => format!(" at log index {i}"),
        None => String::new(),
    }
}

impl Error {
    /// Whether sending the *same* request again may succeed: `NotLeader`, `Unavailable`,
    /// `Timeout`, `Transport`. The client already retries these within its [`RetryPolicy`](crate::RetryPolicy);
    /// a caller seeing one has exhausted that budget.
    ///
    /// `Ambiguous` is **not** retryable: a new call is a new write with a new sequence number
    /// and may be applied a second time.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::NotLeader { .. }
                | Error::Unavailable { .. }
                | Error::Timeout { .. }
                | Error::Transport { .. }
        )
    }

    /// Whether a write that returned this error may have been applied.
    pub fn is_ambiguous(&self) -> bool {
        matches!(self, Error::Ambiguous { .. })
    }
}

/// What one failed attempt tells the retry loop (crate-internal).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    /// The error as the caller would see it.
    pub error: Error,
    /// True when the node certainly did not apply the request (it answered with a refusal,
    /// or the connection was never made).
    pub not_applied: bool,
    /// Try the same request again (possibly elsewhere) while the budget lasts.
    pub retry: bool,
    /// The node answered `StaleSequence`: the write's sequence is below the node's window for
    /// this client id, so its outcome was forgotten (ambiguous, and so would every retry be).
    pub stale_session: bool,
}

/// Whether a node's `ErrorInfo` says the write's sequence is below its window for the client
/// (`CommandResult::StaleSequence`, sent as `KIND_AMBIGUOUS` with the reason
/// [`ftkv_proto::status_details::REASON_STALE_SEQUENCE`]; node/src/server/errors.rs). Any other
/// ambiguous answer stays a plain ambiguous one (retried with the same session).
fn is_stale_sequence(info: &ErrorInfo) -> bool {
    info.reason == ftkv_proto::status_details::REASON_STALE_SEQUENCE
}

/// Decodes the `ErrorInfo` of a status, if it carries one: the `ftkv.v1.ErrorInfo` detail of
/// the `google.rpc.Status` in its details (or a bare `ErrorInfo`, as older nodes sent). Batch
/// item errors carry the same bytes in `ItemError.details`.
pub(crate) fn error_info(status: &tonic::Status) -> Option<ErrorInfo> {
    ftkv_proto::status_details::decode(status.details())
}

/// The cause the client attaches to a status of a request it never handed to the transport
/// (see [`not_sent`]).
#[derive(Debug, thiserror::Error)]
#[error("the request was never sent")]
pub(crate) struct NotSent;

/// An `UNAVAILABLE` status for a request this client never sent (e.g. still queued for a
/// `Kv.Batch` stream that broke): classified as not applied, and retried.
pub(crate) fn not_sent(message: impl Into<String>) -> tonic::Status {
    let mut status = tonic::Status::unavailable(message);
    status.set_source(std::sync::Arc::new(NotSent));
    status
}

/// The cause the client attaches to a status of a request it refused to send because it is
/// over one of the client's own limits (see [`over_client_limit`]).
#[derive(Debug, thiserror::Error)]
#[error("over the client's {limit}")]
pub(crate) struct OverClientLimit {
    /// Name of the client setting, e.g. `max_message_bytes`.
    limit: &'static str,
}

/// An `INVALID_ARGUMENT` status for a request the client did not send because it is over its
/// own `limit`: final, and certainly not applied.
pub(crate) fn over_client_limit(limit: &'static str, message: impl Into<String>) -> tonic::Status {
    let mut status = tonic::Status::invalid_argument(message);
    status.set_source(std::sync::Arc::new(OverClientLimit { limit }));
    status
}

fn client_limit(status: &tonic::Status) -> Option<&'static str> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if let Some(over) = err.downcast_ref::<OverClientLimit>() {
            return Some(over.limit);
        }
        source = err.source();
    }
    None
}

/// Whether the request of this status certainly never left the client: the transport never
/// connected, or the client marked it [`not_sent`].
fn is_never_sent(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        if err.downcast_ref::<tonic::ConnectError>().is_some() || err.downcast_ref::<NotSent>().is_some() {
            return true;
        }
        source = err.source();
    }
    false
}

/// Parses `log_index=N` out of a status message (how a node may report the index of a
/// `NOT_ON_ALL_REPLICAS` write; `ErrorInfo` has no field for it).
fn parse_log_index(message: &str) -> Option<u64> {
    let rest = message.split("log_index=").nth(1)?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

fn non_empty(s: &str) -> Option<String> {
    if s.is_empty() {
        None
    } else {
        Some(s.to_string())
    }
}

/// Maps a gRPC status to the client's error, with what the retry loop needs to know.
pub(crate) fn classify_status(status: &tonic::Status) -> Failure {
    let message = status.message().to_string();
    if let Some(limit) = client_limit(status) {
        return Failure {
            error: Error::InvalidArgument {
                message,
                limit: Some(limit.to_string()),
            },
            not_applied: true,
            retry: false,
            stale_session: false,
        };
    }
    if let Some(info) = error_info(status) {
        if info.reason == ftkv_proto::status_details::REASON_TLS_REQUIRED {
            return Failure {
                error: Error::Tls {
                    message: format!("{} (the client spoke plaintext to a TLS port)", info.message),
                },
                not_applied: true,
                retry: false,
                stale_session: false,
            };
        }
        if info.reason == ftkv_proto::status_details::REASON_AUTH_REFUSED && info.kind() != Kind::Invalid {
            // A user, role or permission that does not exist (or already does), root while
            // auth is on: refused, nothing changed.
            return Failure {
                error: Error::Server {
                    code: format!("{:?}", status.code()),
                    message: info.message.clone(),
                },
                not_applied: true,
                retry: false,
                stale_session: false,
            };
        }
        if info.reason == ftkv_proto::status_details::REASON_DUPLICATE_KEY {
            let row = |name: &str| info.metadata.get(name).and_then(|v| v.parse::<u64>().ok());
            let key = info
                .metadata
                .get("key")
                .map(|hex| {
                    (0..hex.len() / 2)
                        .filter_map(|i| hex.get(2 * i..2 * i + 2))
                        .filter_map(|b| u8::from_str_radix(b, 16).ok())
                        .collect()
                })
                .unwrap_or_default();
            return Failure {
                error: Error::DuplicateKey {
                    key,
                    first_row: row("first_row"),
                    second_row: row("second_row").unwrap_or(0),
                    message: info.message.clone(),
                },
                not_applied: true,
                retry: false,
                stale_session: false,
            };
        }
        let text = if info.message.is_empty() {
            message.clone()
        } else {
            info.message.clone()
        };
        match info.kind() {
            Kind::NotLeader => {
                return Failure {
                    error: Error::NotLeader {
                        leader_id: info.leader_id,
                        leader_endpoint: non_empty(&info.leader_endpoint),
                    },
                    not_applied: true,
                    retry: true,
                    stale_session: false,
                }
            }
            Kind::Limit => {
                return Failure {
                    error: Error::InvalidArgument {
                        message: text,
                        limit: non_empty(&info.limit),
                    },
                    not_applied: true,
                    retry: false,
                    stale_session: false,
                }
            }
            Kind::Invalid => {
                return Failure {
                    error: Error::InvalidArgument {
                        message: text,
                        limit: non_empty(&info.limit),
                    },
                    not_applied: true,
                    retry: false,
                    stale_session: false,
                }
            }
            Kind::Ambiguous => {
                // Retrying with the same session is safe: the node answers a duplicate with
                // the remembered result instead of applying it again. A stale sequence stays
                // stale (the window only moves up): final.
                let stale = is_stale_sequence(&info);
                return Failure {
                    error: Error::Ambiguous { message: text },
                    not_applied: false,
                    retry: !stale,
                    stale_session: stale,
                };
            }
            Kind::NotOnAllReplicas => {
                return Failure {
                    error: Error::NotOnAllReplicas {
                        log_index: if info.log_index != 0 {
                            Some(info.log_index)
                        } else {
                            parse_log_index(&text)
                        },
                        message: text,
                    },
                    not_applied: false,
                    retry: false,
                    stale_session: false,
                }
            }
            Kind::Unavailable => {
                return Failure {
                    error: Error::Unavailable { message: text },
                    not_applied: true,
                    retry: true,
                    stale_session: false,
                }
            }
            Kind::StorageFault => {
                // The node may have sent the entry to its followers before its own write
                // failed: a write in flight can still commit through them.
                return Failure {
                    error: Error::StorageFault { message: text },
                    not_applied: false,
                    retry: false,
                    stale_session: false,
                };
            }
            Kind::NoSpace => {
                // Refused before it was proposed: definite, like a limit.
                return Failure {
                    error: Error::NoSpace {
                        message: text,
                        limit: non_empty(&info.limit),
                        metadata: info.metadata.clone().into_iter().collect(),
                    },
                    not_applied: true,
                    retry: false,
                    stale_session: false,
                };
            }
            Kind::Unauthenticated => {
                return Failure {
                    error: Error::Unauthenticated { message: text },
                    not_applied: true,
                    retry: false,
                    stale_session: false,
                };
            }
            Kind::PermissionDenied => {
                return Failure {
                    error: Error::PermissionDenied { message: text },
                    not_applied: true,
                    retry: false,
                    stale_session: false,
                };
            }
            Kind::Unspecified => {}
        }
    }
    match status.code() {
        // A refusal without the node's ErrorInfo (a proxy's): typed, but nothing says it came
        // before the request applied.
        tonic::Code::Unauthenticated => {
            return Failure {
                error: Error::Unauthenticated { message },
                not_applied: false,
                retry: false,
                stale_session: false,
            }
        }
        tonic::Code::PermissionDenied => {
            return Failure {
                error: Error::PermissionDenied { message },
                not_applied: false,
                retry: false,
                stale_session: false,
            }
        }
        _ => {}
    }
    classify_by_code(status, message)
}

/// The status message followed by the messages of its transport causes (e.g. `tcp connect
/// error: Connection refused (os error 111)`), each once.
fn transport_message(status: &tonic::Status) -> String {
    let mut parts: Vec<String> = vec![status.message().to_string()];
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(err) = source {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = err.source();
    }
    parts.retain(|p| !p.is_empty());
    parts.join(": ")
}

/// A status without the server's `ErrorInfo`: nothing says the server refused it before
/// applying, so it is "maybe applied" unless the request never left this client.
fn classify_by_code(status: &tonic::Status, message: String) -> Failure {
    use tonic::Code;
    let message = if status.details().is_empty() {
        transport_message(status)
    } else {
        message
    };
    if let Some(explained) = crate::tls::mismatch(&message) {
        // A handshake that failed or was refused: the server never took the request.
        return Failure {
            error: Error::Tls { message: explained },
            not_applied: true,
            retry: false,
            stale_session: false,
        };
    }
    match status.code() {
        Code::Unavailable if is_never_sent(status) => Failure {
            error: Error::Unavailable { message },
            not_applied: true,
            retry: true,
            stale_session: false,
        },
        // The transport broke somewhere after the request may have left.
        Code::Unavailable | Code::Unknown | Code::Cancelled => Failure {
            error: Error::Transport { message },
            not_applied: false,
            retry: true,
            stale_session: false,
        },
        Code::DeadlineExceeded => Failure {
            error: Error::Timeout { elapsed_ms: 0 },
            not_applied: false,
            retry: true,
            stale_session: false,
        },
        // E.g. a codec's "message length too large", which may be the answer of a committed
        // write: final (the same request fails again), but not "not applied".
        Code::InvalidArgument | Code::OutOfRange => Failure {
            error: Error::InvalidArgument { message, limit: None },
            not_applied: false,
            retry: false,
            stale_session: false,
        },
        code => Failure {
            error: Error::Server {
                code: format!("{code:?}"),
                message,
            },
            not_applied: false,
            retry: false,
            stale_session: false,
        },
    }
}

#[cfg(test)]
mod tests;
