//! `Kv.BulkLoad`: takes a stream of rows on the leader, stages them as compressed chunks
//! through Raft and commits the load as one entry (`cluster/bulk.rs` has the design).
//!
//! Every row is validated as a `Put` would be (key and value limits, no reserved key); a bad
//! row, a broken stream or a stream that ends without `commit` cancels the load (a
//! `BulkAbort`, and a leader change cancels it anyway): nothing of it becomes visible.

use std::collections::VecDeque;
use std::time::Duration;

use ftkv_proto::v1 as pb;
use tonic::{Code, Status};

use super::{convert, errors};
use crate::cluster::bulk::ChunkBuilder;
use crate::cluster::command::LoadId;
use crate::cluster::{ClusterNode, Command, CommandResult};
use crate::limits::Limits;
use ftkv_engine::OnDuplicate;

/// Chunk proposals in flight at once (the log's group commit takes them together).
const CHUNKS_IN_FLIGHT: usize = 4;

/// How long a chunk proposal may wait for its outcome.
const CHUNK_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the commit may wait: it ingests the whole load in one apply on every replica.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(1800);

type Pending = tokio::task::JoinHandle<Result<(CommandResult, u64), crate::cluster::ClusterError>>;

/// Serves one `Kv.BulkLoad` stream.
pub(super) async fn serve(
    cluster: &ClusterNode,
    limits: &Limits,
    (auth, caller): (&super::auth::AuthGuard, &super::auth::Caller),
    mut stream: tonic::Streaming<pb::BulkLoadRequest>,
) -> Result<pb::BulkLoadResponse, Status> {
    let status = cluster.status();
    if status.role != "leader" {
        return Err(errors::cluster(crate::cluster::ClusterError::NotLeader {
            leader_id: status.leader_id,
            leader_client_addr: status.leader_client_addr,
        }));
    }
    let load = LoadId {
        term: status.term,
        nonce: rand::random::<u64>(),
    };
    let mut run = Run {
        cluster: cluster.clone(),
        load,
        builder: ChunkBuilder::default(),
        in_flight: VecDeque::new(),
        chunks: 0,
        rows: 0,
        staged_bytes: 0,
    };
    let outcome = run.take_rows(limits, (auth, caller), &mut stream).await;
    match outcome {
        Ok(on_duplicate) => run.commit(on_duplicate).await,
        Err(e) => {
            run.abort().await;
            Err(e)
        }
    }
}

struct Run {
    cluster: ClusterNode,
    load: LoadId,
    builder: ChunkBuilder,
    in_flight: VecDeque<Pending>,
    chunks: u32,
    rows: u64,
    staged_bytes: u64,
}

fn on_duplicate(value: i32) -> Result<OnDuplicate, Status> {
    match pb::OnDuplicate::try_from(value) {
        Ok(pb::OnDuplicate::Error) => Ok(OnDuplicate::Error),
        Ok(pb::OnDuplicate::Replace) => Ok(OnDuplicate::Replace),
        Ok(pb::OnDuplicate::Ignore) => Ok(OnDuplicate::Ignore),
        Err(_) => Err(errors::invalid(format!("unknown on_duplicate {value}"))),
    }
}

fn cancelled(message: String) -> Status {
    errors::status(
        Code::Unavailable,
        pb::ErrorInfo {
            kind: pb::error_info::Kind::Unavailable as i32,
            message,
            reason: ftkv_proto::status_details::REASON_LOAD_CANCELLED.to_string(),
            ..Default::default()
        },
    )
}

impl Run {
    /// Takes every message until `commit`; returns the load's duplicate policy.
    async fn take_rows(
        &mut self,
        limits: &Limits,
        (auth, caller): (&super::auth::AuthGuard, &super::auth::Caller),
        stream: &mut tonic::Streaming<pb::BulkLoadRequest>,
    ) -> Result<OnDuplicate, Status> {
        let mut policy = None;
        loop {
            let message = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => {
                    return Err(cancelled(format!(
                        "the request stream ended without commit after {} rows: the load was cancelled",
                        self.rows
                    )))
                }
                Err(e) => return Err(errors::broken_request_stream(&e)),
            };
            let policy = match policy {
                Some(p) => p,
                None => *policy.insert(on_duplicate(message.on_duplicate)?),
            };
            for row in message.rows {
                let at = self.rows;
                convert::client_key(limits, &row.key).map_err(|s| row_error(at, &s))?;
                auth.allow(
                    caller,
                    &[(crate::auth::PermType::Write, crate::auth::KeyRange::key(&row.key))],
                )?;
                limits
                    .check_value(&row.value)
                    .map_err(|e| row_error(at, &errors::limit(&e)))?;
                self.builder.push(&row.key, &row.value);
                self.rows += 1;
                if self.builder.is_full() {
                    self.stage_chunk().await?;
                }
            }
            if message.commit {
                return Ok(policy);
            }
        }
    }

    /// Proposes the rows gathered so far as the next chunk (waiting for the oldest proposal
    /// when [`CHUNKS_IN_FLIGHT`] are out).
    async fn stage_chunk(&mut self) -> Result<(), Status> {
        if self.builder.rows() == 0 {
            return Ok(());
        }
        let chunk = self
            .builder
            .finish()
            .map_err(|e| Status::internal(e.to_string()))?;
        self.staged_bytes += chunk.len() as u64;
        let command = Command::BulkStage {
            load: self.load,
            seq: self.chunks,
            chunk,
        };
        self.chunks += 1;
        let cluster = self.cluster.clone();
        let term = self.load.term;
        self.in_flight.push_back(tokio::spawn(async move {
            cluster.write_bulk(command, term, CHUNK_TIMEOUT).await
        }));
        while self.in_flight.len() >= CHUNKS_IN_FLIGHT {
            self.wait_oldest().await?;
        }
        Ok(())
    }

    async fn wait_oldest(&mut self) -> Result<(), Status> {
        let Some(pending) = self.in_flight.pop_front() else {
            return Ok(());
        };
        match pending.await {
            Ok(Ok((CommandResult::BulkStaged, _))) => Ok(()),
            Ok(Ok((CommandResult::BulkCancelled { reason }, _))) => {
                Err(cancelled(format!("the load was cancelled: {reason}")))
            }
            Ok(Ok((other, _))) => Err(Status::internal(format!("unexpected chunk result {other:?}"))),
            // A chunk that was not staged (or may not have been) cancels the load: not applied.
            Ok(Err(e)) => Err(cancelled(format!(
                "a chunk was not staged ({e}): the load was cancelled"
            ))),
            Err(e) => Err(Status::internal(format!("chunk proposal task failed: {e}"))),
        }
    }

    async fn commit(mut self, on_duplicate: OnDuplicate) -> Result<pb::BulkLoadResponse, Status> {
        let staged = async {
            self.stage_chunk().await?;
            while !self.in_flight.is_empty() {
                self.wait_oldest().await?;
            }
            Ok::<(), Status>(())
        }
        .await;
        if let Err(e) = staged {
            self.abort().await;
            return Err(e);
        }
        let command = Command::BulkCommit {
            load: self.load,
            chunks: self.chunks,
            rows: self.rows,
            on_duplicate,
        };
        let (result, index) = self
            .cluster
            .write_bulk(command, self.load.term, COMMIT_TIMEOUT)
            .await
            .map_err(errors::cluster)?;
        let st = self.cluster.status();
        match result {
            CommandResult::BulkLoaded {
                rows_read,
                rows_written,
                rows_replaced,
                rows_skipped,
            } => Ok(pb::BulkLoadResponse {
                header: Some(pb::ResponseHeader {
                    node_id: st.node_id,
                    term: st.term,
                    log_index: index,
                }),
                rows_read,
                rows_written,
                rows_replaced,
                rows_skipped,
                chunks: u64::from(self.chunks),
                staged_bytes: self.staged_bytes,
            }),
            CommandResult::BulkDuplicate {
                key,
                first_row,
                second_row,
            } => Err(duplicate(&key, first_row, second_row)),
            CommandResult::BulkCancelled { reason } => {
                Err(cancelled(format!("the load was cancelled: {reason}")))
            }
            other => Err(Status::internal(format!("unexpected commit result {other:?}"))),
        }
    }

    /// Cancels the load (best effort: a leader change cancels it anyway).
    async fn abort(&mut self) {
        for pending in std::mem::take(&mut self.in_flight) {
            let _ = pending.await;
        }
        if self.chunks == 0 {
            return;
        }
        let command = Command::BulkAbort { load: self.load };
        if let Err(e) = self
            .cluster
            .write_bulk(command, self.load.term, CHUNK_TIMEOUT)
            .await
        {
            tracing::warn!(error = %e, "could not propose the abort of a bulk load (a leader change cancels it)");
        }
    }
}

/// A bad row: its status with the row number in the message and the metadata.
fn row_error(row: u64, cause: &Status) -> Status {
    let mut info = ftkv_proto::status_details::decode(cause.details()).unwrap_or_default();
    info.message = format!("row {row}: {}", cause.message());
    info.metadata.insert("row".into(), row.to_string());
    errors::status(cause.code(), info)
}

fn duplicate(key: &[u8], first_row: Option<u64>, second_row: u64) -> Status {
    let hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let message = match first_row {
        Some(first) => format!("duplicate key {hex} at rows {first} and {second_row}: nothing of the load was applied"),
        None => format!(
            "key {hex} of row {second_row} exists already (on_duplicate = error): nothing of the load was applied"
        ),
    };
    let mut info = pb::ErrorInfo {
        kind: pb::error_info::Kind::Invalid as i32,
        message,
        reason: ftkv_proto::status_details::REASON_DUPLICATE_KEY.to_string(),
        ..Default::default()
    };
    info.metadata.insert("key".into(), hex);
    if let Some(first) = first_row {
        info.metadata.insert("first_row".into(), first.to_string());
    }
    info.metadata.insert("second_row".into(), second_row.to_string());
    errors::status(Code::AlreadyExists, info)
}
