//! Coalesced linearizable reads (Raft thesis section 6.4, ReadIndex).
//!
//! A read barrier needs one leadership confirmation round (`get_read_log_id`: a heartbeat to a
//! quorum) that **started after** the read arrived, then waits until the state machine has applied
//! the read index: the larger of openraft's read log id and the leader's last log index at the
//! start of the round (see `run_rounds`). Concurrent callers share rounds: a caller arriving while a round is
//! in flight waits for the next one, which starts as soon as the current one ends. So at most one
//! round runs at a time whatever the read load.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::errors::read_error_to_cluster;
use super::types::Raft;
use super::ClusterError;

#[derive(Debug, Default)]
struct Rounds {
    /// Rounds started so far (round ids are 1, 2, ...).
    started: u64,
    running: bool,
    /// Someone waits for a round that has not started yet.
    pending: bool,
}

type RoundResult = Result<u64, ClusterError>;

/// Shares ReadIndex rounds among concurrent readers.
pub struct ReadBarrier {
    raft: Raft,
    rounds: Mutex<Rounds>,
    results: watch::Sender<Option<(u64, RoundResult)>>,
    apply_timeout: Duration,
}

impl ReadBarrier {
    /// A barrier over `raft`. Each ReadIndex round, and each wait for the apply index, gives up
    /// after `apply_timeout` (`Unavailable`).
    pub fn new(raft: Raft, apply_timeout: Duration) -> Arc<Self> {
        let (results, _) = watch::channel(None);
        Arc::new(ReadBarrier {
            raft,
            rounds: Mutex::new(Rounds::default()),
            results,
            apply_timeout,
        })
    }

    /// Waits for a leadership round that started after this call, then for applied >= its read
    /// index. Returns the read index.
    pub async fn barrier(self: &Arc<Self>) -> Result<u64, ClusterError> {
        let mut rx = self.results.subscribe();
        let target = {
            let mut rounds = self.rounds.lock();
            if rounds.running {
                rounds.pending = true;
                rounds.started + 1
            } else {
                rounds.running = true;
                rounds.started += 1;
                let round = rounds.started;
                tokio::spawn(self.clone().run_rounds(round));
                round
            }
        };
        let result = loop {
            if let Some((round, result)) = &*rx.borrow_and_update() {
                if *round >= target {
                    break result.clone();
                }
            }
            if rx.changed().await.is_err() {
                return Err(ClusterError::Unavailable("node is shutting down".into()));
            }
        };
        let index = result?;
        self.raft
            .wait(Some(self.apply_timeout))
            .applied_index_at_least(Some(index), "read barrier")
            .await
            .map_err(|e| {
                ClusterError::Unavailable(format!("state machine did not reach read index {index}: {e}"))
            })?;
        Ok(index)
    }

    async fn run_rounds(self: Arc<Self>, first: u64) {
        let mut round = first;
        loop {
            // A round waits for a quorum of heartbeat answers; bound it so a leader cut off from
            // its followers answers `Unavailable` instead of hanging every reader.
            // The read index is the larger of openraft's (max(commit index, this term's noop)) and
            // the leader's last log index when the round starts. openraft's alone is not enough
            // after a restart: a node whose persisted vote makes it leader again without an
            // election has no noop of its own yet and only the commit index it last saved (which
            // rides on later flushes), so it could serve a read older than an acknowledged write
            // (found by the Jepsen scenario 10). Every committed entry is in the leader's log
            // (leader completeness), so waiting for its last index is always safe; under write
            // load it costs at most the in-flight entries' commit.
            let last_log_index = self.raft.metrics().borrow().last_log_index.unwrap_or(0);
            let result = match tokio::time::timeout(self.apply_timeout, self.raft.get_read_log_id()).await {
                Ok(Ok((read_log_id, _applied))) => Ok(read_log_id.map_or(0, |l| l.index).max(last_log_index)),
                Ok(Err(e)) => Err(read_error_to_cluster(&self.raft, e)),
                Err(_) => Err(ClusterError::Unavailable(format!(
                    "leadership not confirmed by a quorum within {} ms",
                    self.apply_timeout.as_millis()
                ))),
            };
            self.results.send_replace(Some((round, result)));
            let mut rounds = self.rounds.lock();
            if rounds.pending {
                rounds.pending = false;
                rounds.started += 1;
                round = rounds.started;
            } else {
                rounds.running = false;
                return;
            }
        }
    }
}
