//! What the node's health and metrics need from Raft beyond [`super::NodeStatus`]: leader
//! changes seen (`ftkv_server_leader_changes_seen_total`), when a leader last reached this node
//! (AppendEntries accepted), and the linearizable read path check of `/readyz`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::types::Raft;
use super::{ClusterNode, NodeStatus};

/// When this node last accepted an AppendEntries (entries or heartbeat) from a leader.
#[derive(Debug)]
pub(crate) struct LeaderContact {
    origin: Instant,
    /// Milliseconds since `origin`, `u64::MAX` before the first.
    last_ms: AtomicU64,
}

impl Default for LeaderContact {
    fn default() -> Self {
        LeaderContact {
            origin: Instant::now(),
            last_ms: AtomicU64::new(u64::MAX),
        }
    }
}

impl LeaderContact {
    /// A leader reached this node now.
    pub(crate) fn record(&self) {
        let ms = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX - 1);
        self.last_ms.store(ms, Ordering::Release);
    }

    /// Time since the last contact (`None`: never since start).
    pub(crate) fn since(&self) -> Option<Duration> {
        let last = self.last_ms.load(Ordering::Acquire);
        if last == u64::MAX {
            return None;
        }
        Some(self.origin.elapsed().saturating_sub(Duration::from_millis(last)))
    }
}

/// Counts leader changes as etcd does: each time a leader is known that differs from the one
/// known just before (no leader in between counts as a change).
pub(crate) fn spawn_leader_change_counter(raft: &Raft) {
    let mut metrics = raft.metrics();
    let counter = metrics::counter!(crate::telemetry::LEADER_CHANGES_SEEN_TOTAL);
    tokio::spawn(async move {
        let mut previous = None;
        loop {
            let leader = metrics.borrow_and_update().current_leader;
            if leader.is_some() && leader != previous {
                counter.increment(1);
            }
            previous = leader;
            if metrics.changed().await.is_err() {
                return;
            }
        }
    });
}

impl ClusterNode {
    /// Time since a leader last reached this node with AppendEntries (`None`: never since
    /// start).
    pub fn since_leader_contact(&self) -> Option<Duration> {
        self.inner.contact.since()
    }

    /// Whether a linearizable read could be served through this node now. On the leader: one
    /// ReadIndex round (a quorum confirms the leadership) within `timeout`. On a follower or
    /// learner, whose linearizable reads are served by the leader: the leader reached this node
    /// within two election timeouts. `Err` names the reason.
    pub async fn check_linearizable_read(
        &self,
        status: &NodeStatus,
        timeout: Duration,
    ) -> Result<(), String> {
        if status.leader_id == Some(status.node_id) {
            return match tokio::time::timeout(timeout, self.read_barrier()).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!(
                    "leadership not confirmed by a quorum within {} ms",
                    timeout.as_millis()
                )),
            };
        }
        let limit = Duration::from_millis(2 * self.inner.config.election_timeout_max_ms);
        match self.since_leader_contact() {
            Some(since) if since <= limit => Ok(()),
            Some(since) => Err(format!(
                "no AppendEntries from a leader for {} ms (limit {} ms)",
                since.as_millis(),
                limit.as_millis()
            )),
            None => Err("no AppendEntries from a leader since start".to_string()),
        }
    }
}
