//! `Kv.BulkLoad`: one load streamed to the leader, committed as one Raft entry (all rows
//! visible together, or none).

use ftkv_proto::v1 as pb;
use tokio::sync::mpsc;

use super::{normalize_endpoint, Client};
use crate::error::{classify_status, Error, Result};

/// Row bytes (keys + values + framing) per `BulkLoadRequest` message: well under the node's
/// request message limit.
const MESSAGE_TARGET_BYTES: usize = 1 << 20;

/// Pause between two rounds of status requests while no node reports itself leader.
const LEADER_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Messages buffered between the caller and the gRPC stream.
const MESSAGES_BUFFERED: usize = 8;

/// What a bulk load does with a key that exists already (in the store, or earlier in the load).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDuplicate {
    /// Fail the load ([`Error::DuplicateKey`]); nothing of it is applied.
    #[default]
    Error,
    /// `REPLACE INTO`: the later row wins.
    Replace,
    /// `INSERT IGNORE`: the first row (or the existing value) wins.
    Ignore,
}

/// What a committed load did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BulkLoadReport {
    /// Rows the cluster ingested.
    pub rows_read: u64,
    /// Keys stored (new ones and replaced ones).
    pub rows_written: u64,
    /// Rows that replaced a value or an earlier row.
    pub rows_replaced: u64,
    /// Rows skipped as duplicates.
    pub rows_skipped: u64,
    /// Raft entries (compressed chunks) that carried the rows.
    pub chunks: u64,
    /// Compressed bytes of those chunks.
    pub staged_bytes: u64,
    /// Log index of the entry that committed the load.
    pub log_index: u64,
}

/// A bulk load in progress on the leader ([`Client::bulk_load`]). Dropping it without
/// [`BulkLoader::commit`] cancels the load.
pub struct BulkLoader {
    tx: Option<mpsc::Sender<pb::BulkLoadRequest>>,
    response: tokio::task::JoinHandle<std::result::Result<pb::BulkLoadResponse, tonic::Status>>,
    on_duplicate: OnDuplicate,
    first: bool,
    rows: Vec<pb::KeyValue>,
    bytes: usize,
    endpoint: String,
}

impl Client {
    /// Starts a bulk load on the leader (found by asking every endpoint's status). Rows go in
    /// with [`BulkLoader::push`]; [`BulkLoader::commit`] makes them visible together.
    ///
    /// Errors: [`Error::Unavailable`] when no node reports itself leader within the request
    /// timeout (asked again every [`LEADER_POLL`], as during an election).
    pub async fn bulk_load(&self, on_duplicate: OnDuplicate) -> Result<BulkLoader> {
        let deadline = tokio::time::Instant::now() + self.inner.config.request_timeout;
        let leader = loop {
            let leader = self
                .status_all()
                .await
                .into_iter()
                .filter_map(|(_, s)| s.ok())
                .filter(|s| s.is_leader)
                .max_by_key(|s| s.term);
            if let Some(leader) = leader {
                break leader;
            }
            if tokio::time::Instant::now() + LEADER_POLL > deadline {
                return Err(Error::Unavailable {
                    message: format!(
                        "no node reported itself leader within {:?}: cannot start a bulk load",
                        self.inner.config.request_timeout
                    ),
                });
            }
            tokio::time::sleep(LEADER_POLL).await;
        };
        let endpoint = if leader.client_endpoint.is_empty() {
            leader.endpoint.clone()
        } else {
            leader.client_endpoint.clone()
        };
        let endpoint = normalize_endpoint(&endpoint).or_else(|_| normalize_endpoint(&leader.endpoint))?;
        let channel = self.inner.channel(&endpoint)?;
        let mut kv = self.inner.kv_client(channel);
        let (tx, rx) = mpsc::channel(MESSAGES_BUFFERED);
        let response = tokio::spawn(async move {
            kv.bulk_load(tokio_stream::wrappers::ReceiverStream::new(rx))
                .await
                .map(tonic::Response::into_inner)
        });
        Ok(BulkLoader {
            tx: Some(tx),
            response,
            on_duplicate,
            first: true,
            rows: Vec::new(),
            bytes: 0,
            endpoint,
        })
    }
}

impl BulkLoader {
    /// The leader's endpoint this load streams to.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Adds one row (row numbers count from 0 in the order pushed; errors name them).
    /// Errors: the load failed on the node (its error, e.g. a bad row or a leader change).
    pub async fn push(&mut self, key: Vec<u8>, value: Vec<u8>) -> Result<()> {
        self.bytes += key.len() + value.len() + 8;
        self.rows.push(pb::KeyValue { key, value });
        if self.bytes >= MESSAGE_TARGET_BYTES {
            self.send(false).await?;
        }
        Ok(())
    }

    async fn send(&mut self, commit: bool) -> Result<()> {
        let message = pb::BulkLoadRequest {
            on_duplicate: match self.on_duplicate {
                OnDuplicate::Error => pb::OnDuplicate::Error,
                OnDuplicate::Replace => pb::OnDuplicate::Replace,
                OnDuplicate::Ignore => pb::OnDuplicate::Ignore,
            } as i32,
            rows: std::mem::take(&mut self.rows),
            commit,
        };
        self.bytes = 0;
        self.first = false;
        let sent = match &self.tx {
            Some(tx) => tx.send(message).await.is_ok(),
            None => false,
        };
        if !sent {
            // The node ended the call: its answer says why.
            self.tx = None;
            return Err(self.node_error().await);
        }
        Ok(())
    }

    async fn node_error(&mut self) -> Error {
        match (&mut self.response).await {
            Ok(Err(status)) => classify_status(&status).error,
            Ok(Ok(_)) => Error::Server {
                code: "Internal".into(),
                message: "the node answered the bulk load before it was committed".into(),
            },
            Err(e) => Error::Transport {
                message: format!("bulk load call task failed: {e}"),
            },
        }
    }

    /// Sends the last rows with `commit` and waits for the load to be committed (every row
    /// visible on the cluster) or refused. An [`Error::Ambiguous`] (or a transport error after
    /// the commit was sent) means the load may have committed: read before running it again.
    pub async fn commit(mut self) -> Result<BulkLoadReport> {
        self.send(true).await?;
        self.tx = None;
        match (&mut self.response).await {
            Ok(Ok(r)) => Ok(BulkLoadReport {
                rows_read: r.rows_read,
                rows_written: r.rows_written,
                rows_replaced: r.rows_replaced,
                rows_skipped: r.rows_skipped,
                chunks: r.chunks,
                staged_bytes: r.staged_bytes,
                log_index: r.header.map_or(0, |h| h.log_index),
            }),
            Ok(Err(status)) => {
                let failure = classify_status(&status);
                // After the commit was sent, only the node's explicit refusals mean "not applied".
                if failure.not_applied {
                    Err(failure.error)
                } else {
                    Err(Error::Ambiguous {
                        message: failure.error.to_string(),
                    })
                }
            }
            Err(e) => Err(Error::Ambiguous {
                message: format!("bulk load call task failed after the commit was sent: {e}"),
            }),
        }
    }

    /// Cancels the load: nothing of it becomes visible.
    pub async fn cancel(mut self) {
        self.tx = None;
        let _ = (&mut self.response).await;
    }
}
