//! The proposal batcher in front of `client_write` (MySQL binlog group commit in Raft form;
//! ARCHITECTURE.md, write path step 2).
//!
//! openraft 0.9 appends and flushes each leader entry separately, so one command per entry caps
//! a cluster near one write per fsync (~3,600/s on the reference machine). Here every
//! [`ClusterNode::write`](super::ClusterNode::write) enqueues its command; one task packs the
//! commands that arrive while earlier entries are in flight into **one** entry (bounded by
//! `batch_max_ops` and `batch_max_bytes`), with at most `batch_max_in_flight` entries in flight.
//! Each caller gets its own result and the entry's log index back.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ftkv_engine::{UpsertOp, WriteOp};
use openraft::error::ClientWriteError;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::command::{Command, CommandResult, TxnOp};
use super::errors::{fatal_to_error, not_leader};
use super::types::{EntryCommands, NodeId, Raft};
use super::{AckPolicy, ClusterError, NodeAddr};

/// Most commands waiting in the batcher queue; `write` waits (backpressure) beyond it.
pub const QUEUE_CAPACITY: usize = 64 * 1024;

/// Reply to one caller: its result and the entry's log index.
pub type WriteReply = Result<(CommandResult, u64), ClusterError>;

struct Proposal {
    command: Command,
    size_bytes: usize,
    /// How long to wait for the outcome (`None`: `BatcherConfig::write_timeout`).
    timeout: Option<Duration>,
    reply: oneshot::Sender<WriteReply>,
}

/// Counters of the batcher.
#[derive(Debug, Default)]
pub struct BatchStats {
    /// Entries this node proposed and saw committed.
    pub entries: AtomicU64,
    /// Commands in those entries.
    pub commands: AtomicU64,
}

impl BatchStats {
    /// Mean commands per proposed entry (0 when none).
    pub fn ops_per_entry(&self) -> f64 {
        let entries = self.entries.load(Ordering::Relaxed);
        if entries == 0 {
            return 0.0;
        }
        self.commands.load(Ordering::Relaxed) as f64 / entries as f64
    }
}

/// Settings of the batcher.
#[derive(Debug, Clone)]
pub struct BatcherConfig {
    /// Most commands per entry.
    pub max_ops: usize,
    /// Most approximate payload bytes per entry.
    pub max_bytes: usize,
    /// Most entries in flight.
    pub max_in_flight: usize,
    /// Ack policy.
    pub ack: AckPolicy,
    /// `AckPolicy::All` wait bound.
    pub ack_all_timeout: Duration,
    /// After this long without an outcome a write is reported ambiguous.
    pub write_timeout: Duration,
}

/// Handle to the batcher task.
#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::Sender<Proposal>,
    stats: Arc<BatchStats>,
}

/// Approximate encoded size of a command, in bytes (keys + values + a little per op).
pub fn approx_size_bytes(command: &Command) -> usize {
    fn upsert_size(op: &UpsertOp) -> usize {
        match op {
            UpsertOp::SetIfAbsent(v) | UpsertOp::Append(v) | UpsertOp::Max(v) => v.len() + 4,
            UpsertOp::Add(_) => 9,
        }
    }
    fn write_size(op: &WriteOp) -> usize {
        8 + match op {
            WriteOp::Put { key, value } => key.len() + value.len(),
            WriteOp::Delete { key } => key.len(),
            WriteOp::Upsert { key, op } => key.len() + upsert_size(op),
            WriteOp::DeleteRange { start, end } => start.len() + end.as_ref().map_or(0, Vec::len),
            WriteOp::UpsertRange { start, end, op } => {
                start.len() + end.as_ref().map_or(0, Vec::len) + upsert_size(op)
            }
        }
    }
    fn txn_op_size(op: &TxnOp) -> usize {
        match op {
            TxnOp::Write(w) => write_size(w),
            TxnOp::Get { key } => key.len() + 4,
        }
    }
    32 + match command {
        Command::BulkStage { chunk, .. } => chunk.len(),
        // A commit goes alone in its entry (`bulk.rs`): it never fits beside anything.
        Command::BulkCommit { .. } => usize::MAX / 4,
        Command::BulkAbort { .. } => 32,
        Command::Auth(op) => postcard::to_stdvec(op).map_or(1024, |b| b.len()),
        Command::Write { ops, .. } | Command::LimitedWrite { ops, .. } => {
            ops.iter().map(write_size).sum::<usize>()
        }
        Command::Txn {
            compares,
            success,
            failure,
            ..
        }
        | Command::LimitedTxn {
            compares,
            success,
            failure,
            ..
        } => {
            compares
                .iter()
                .map(|c| c.key.len() + c.operand.len() + 8)
                .sum::<usize>()
                + success.iter().map(txn_op_size).sum::<usize>()
                + failure.iter().map(txn_op_size).sum::<usize>()
        }
    }
}

impl Batcher {
    /// Starts the batcher task proposing to `raft`.
    pub fn start(raft: Raft, config: BatcherConfig) -> Batcher {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let stats = Arc::new(BatchStats::default());
        tokio::spawn(run(raft, config, rx, stats.clone()));
        Batcher { tx, stats }
    }

    /// Counters.
    pub fn stats(&self) -> &BatchStats {
        &self.stats
    }

    /// Enqueues `command` and waits for its outcome.
    pub async fn write(&self, command: Command) -> WriteReply {
        self.write_within(command, None).await
    }

    /// [`Batcher::write`] waiting up to `timeout` for the outcome (`None`: the configured
    /// write timeout) before it reports the write ambiguous.
    pub async fn write_within(&self, command: Command, timeout: Option<Duration>) -> WriteReply {
        let (reply, rx) = oneshot::channel();
        let size_bytes = approx_size_bytes(&command);
        self.tx
            .send(Proposal {
                command,
                size_bytes,
                timeout,
                reply,
            })
            .await
            .map_err(|_| ClusterError::Unavailable("node is shutting down".into()))?;
        match rx.await {
            Ok(r) => r,
            // The batcher dropped the proposal: it was never handed to Raft.
            Err(_) => Err(ClusterError::Unavailable("node is shutting down".into())),
        }
    }
}

async fn run(raft: Raft, config: BatcherConfig, mut rx: mpsc::Receiver<Proposal>, stats: Arc<BatchStats>) {
    let slots = Arc::new(Semaphore::new(config.max_in_flight.max(1)));
    let mut carry: Option<Proposal> = None;
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let first = match carry.take() {
            Some(p) => p,
            None => match rx.recv().await {
                Some(p) => p,
                None => return,
            },
        };
        let mut bytes = first.size_bytes;
        let mut batch = vec![first];
        while batch.len() < config.max_ops.max(1) {
            match rx.try_recv() {
                Ok(p) => {
                    if bytes + p.size_bytes > config.max_bytes {
                        carry = Some(p);
                        break;
                    }
                    bytes += p.size_bytes;
                    batch.push(p);
                }
                Err(_) => break,
            }
        }
        tokio::spawn(propose(
            raft.clone(),
            config.clone(),
            batch,
            permit,
            stats.clone(),
        ));
    }
}

async fn propose(
    raft: Raft,
    config: BatcherConfig,
    batch: Vec<Proposal>,
    permit: OwnedSemaphorePermit,
    stats: Arc<BatchStats>,
) {
    let mut commands = Vec::with_capacity(batch.len());
    let mut replies = Vec::with_capacity(batch.len());
    let timeout = batch
        .iter()
        .filter_map(|p| p.timeout)
        .max()
        .unwrap_or(config.write_timeout);
    for p in batch {
        commands.push(p.command);
        replies.push(p.reply);
    }
    let started = std::time::Instant::now();
    let pending = metrics::gauge!(crate::telemetry::PROPOSALS_PENDING);
    pending.increment(1.0);
    let outcome = propose_entry(&raft, timeout, commands).await;
    pending.decrement(1.0);
    if outcome.is_err() {
        metrics::counter!(crate::telemetry::PROPOSALS_FAILED_TOTAL).increment(1);
    }
    drop(permit);
    metrics::histogram!("ftkv_batch_entry_commit_seconds").record(started.elapsed());
    let (results, index) = match outcome {
        Ok(v) => {
            // Only entries this node committed as leader count (not proposals refused as a follower).
            stats.entries.fetch_add(1, Ordering::Relaxed);
            stats.commands.fetch_add(replies.len() as u64, Ordering::Relaxed);
            v
        }
        Err(e) => {
            for reply in replies {
                let _ = reply.send(Err(e.clone()));
            }
            return;
        }
    };
    if results.len() != replies.len() {
        let e = ClusterError::Storage(format!(
            "entry {index}: {} results for {} commands",
            results.len(),
            replies.len()
        ));
        for reply in replies {
            let _ = reply.send(Err(e.clone()));
        }
        return;
    }
    let all_ok = config.ack != AckPolicy::All || wait_all_voters(&raft, index, config.ack_all_timeout).await;
    for (reply, result) in replies.into_iter().zip(results) {
        let answer = if all_ok {
            Ok((result, index))
        } else {
            Err(ClusterError::NotOnAllReplicas { log_index: index })
        };
        let _ = reply.send(answer);
    }
}

/// Proposes one entry; returns the per-command results and the entry's index.
async fn propose_entry(
    raft: &Raft,
    write_timeout: Duration,
    commands: Vec<Command>,
) -> Result<(Vec<CommandResult>, u64), ClusterError> {
    let rx = raft
        .client_write_ff(EntryCommands { commands })
        .await
        .map_err(fatal_to_error)?;
    match tokio::time::timeout(write_timeout, rx).await {
        Err(_) => Err(ClusterError::Ambiguous(format!(
            "no outcome within {} ms (leader change or lost quorum)",
            write_timeout.as_millis()
        ))),
        Ok(Err(_)) => Err(ClusterError::Ambiguous(
            "raft stopped before the outcome was known".into(),
        )),
        Ok(Ok(Err(ClientWriteError::ForwardToLeader(f)))) => {
            Err(not_leader(raft, f.leader_id, f.leader_node))
        }
        Ok(Ok(Err(ClientWriteError::ChangeMembershipError(e)))) => Err(ClusterError::Invalid(e.to_string())),
        Ok(Ok(Ok(resp))) => Ok((resp.data.results, resp.log_id.index)),
    }
}

/// Waits until every voter's matched log index is at least `index` (leader metrics), at most
/// `timeout`. False on timeout or when this node stops leading.
pub async fn wait_all_voters(raft: &Raft, index: u64, timeout: Duration) -> bool {
    let mut rx = raft.metrics();
    let check = |m: &openraft::RaftMetrics<NodeId, NodeAddr>| -> Option<bool> {
        let replication = m.replication.as_ref()?;
        let all = m.membership_config.membership().voter_ids().all(|v| {
            replication
                .get(&v)
                .and_then(|l| l.as_ref())
                .is_some_and(|l| l.index >= index)
        });
        Some(all)
    };
    let wait = async {
        loop {
            match check(&rx.borrow_and_update()) {
                Some(true) => return true,
                None => return false,
                Some(false) => {}
            }
            if rx.changed().await.is_err() {
                return false;
            }
        }
    };
    tokio::time::timeout(timeout, wait).await.unwrap_or(false)
}
