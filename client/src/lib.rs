//! Async Rust client of an ftkv cluster, and the `ftkvctl` command-line tool built on it.
//!
//! The CLI (module `cli` and the `ftkvctl` binary) sits behind the default feature `cli`; a
//! library user who depends on `ftkv-client` with `default-features = false` compiles none of
//! its dependencies (clap, anyhow, hdrhistogram, humantime, serde_json, tracing-subscriber,
//! mimalloc).
//!
//! ```no_run
//! # async fn demo() -> Result<(), ftkv_client::Error> {
//! use ftkv_client::{Client, UpsertOp};
//! let client = Client::builder().endpoints(["127.0.0.1:7379", "127.0.0.1:7479"]).build().await?;
//! client.put("user/1", "alice").await?;
//! assert_eq!(client.get("user/1").await?, Some(b"alice".to_vec()));
//! client.upsert("visits", UpsertOp::Add(1)).await?; // read-free, applied exactly once
//! # Ok(()) }
//! ```
//!
//! What the client does for you (see [`Client`]): finds the leader and follows `NOT_LEADER`
//! redirects, retries unavailable nodes with exponential backoff and jitter under one overall
//! deadline ([`RetryPolicy`]), and tags every write with a session (random client id,
//! sequence number, lowest outstanding sequence; Raft thesis section 6.3) so a retried write
//! is applied at most once. A write whose outcome stays unknown is [`Error::Ambiguous`],
//! never reported as failed; a status is read as "not applied" only when the node said so
//! (its `ErrorInfo`) or the request never left the client. After a `StaleSequence` answer
//! new writes move to a fresh client id ([`Client::client_id`]).
//!
//! With auth enabled on the cluster, [`ClientBuilder::user`] authenticates and sends the token on
//! every call, renewing it before it expires and once after an `UNAUTHENTICATED` answer;
//! refusals are [`Error::Unauthenticated`] and [`Error::PermissionDenied`]. The administration
//! of users and roles is [`Client::user_add`], [`Client::role_grant_permission`],
//! [`Client::auth_enable`] and their neighbours.
//!
//! Depends on `ftkv-proto` only: no openraft or node types, and no tonic types in the public
//! API (statuses are converted to [`Error`]).

#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

mod batch;
mod client;
mod error;
mod retry;
pub mod rows;
mod session;
mod tls;
mod types;

#[cfg(feature = "cli")]
pub mod cli;

pub use client::{
    Alarm, AuthStatus, BulkLoadReport, BulkLoader, Client, ClientBuilder, NodeAlarms, OnDuplicate, PermType,
    Permission, DEFAULT_ENDPOINT, DEFAULT_MAX_MESSAGE_BYTES,
};
pub use error::{Error, Result};
pub use retry::RetryPolicy;
pub use session::{WriteSession, DEFAULT_SESSION_WINDOW};
pub use tls::TlsOptions;
pub use types::{
    decode_counter, prefix_end, Compare, CompareResult, CompareTarget, KeyValue, Member, Membership,
    NodeStatus, Op, ReadConsistency, ResponseInfo, ScanOptions, ScanPage, Txn, TxnOp, TxnOpResult, TxnResult,
    UpsertOp,
};
