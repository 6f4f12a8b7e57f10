//! Graceful drain before a node stops (SIGTERM): refuse new client requests, let the ones in
//! flight finish, and, on the leader, hand leadership to an up-to-date follower, so that a
//! rolling restart costs clients no failed request and a pause of one election round instead
//! of a failover's lease expiry.
//!
//! **Refusing.** Once [`ClusterNode::begin_drain`] ran, every new `write` and `read_barrier`
//! fails with [`ClusterError::Draining`] (gRPC `UNAVAILABLE`, `ErrorInfo` kind
//! `KIND_UNAVAILABLE`, reason `DRAINING`: certainly not applied; the client tries another
//! node). Requests that entered before are counted ([`InFlight`]) and awaited.
//!
//! **Hand-off.** openraft 0.9.25 has no leadership transfer. What it allows: a follower's
//! `Trigger::elect` starts an election at once, bypassing its election timer; the other
//! followers refuse that candidate while their leader lease (`election_timeout_max` since they
//! last heard the leader) runs, but the leader itself only checks the lease against the time
//! its own vote last changed (when it was elected). So a leader that has led for longer than
//! the lease grants the vote of a candidate whose log is at least as long as its own, and the
//! candidate wins with the votes of itself and the old leader. The drain therefore: stops
//! this node campaigning (`RuntimeConfigHandle::elect(false)`), waits until its own lease has
//! passed, picks a voter whose replication matched the leader's last log index (no new entry
//! is proposed meanwhile: new writes are refused), asks it to campaign (peer RPC
//! `TimeoutNow`, accepted only from the node the receiver follows as leader), and waits until
//! another node leads. If that fails in time (the vote refused, or no voter caught up for two
//! election timeouts, e.g. when every node is stopped at once), the node stops anyway and the
//! cluster fails over as after a crash.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;
use tonic::Status;

use super::types::{NodeId, Raft};
use super::{ClusterError, ClusterNode};

/// How long one hand-off attempt waits for another node to lead, in election timeouts (max).
const HANDOFF_ATTEMPT_ELECTION_TIMEOUTS: u32 = 2;
/// Poll period of the drain's waits.
const POLL: Duration = Duration::from_millis(10);

/// The drain state of one node.
#[derive(Debug, Default)]
pub(crate) struct DrainState {
    draining: AtomicBool,
    in_flight: AtomicU64,
    idle: tokio::sync::Notify,
}

/// A client request counted while it runs (see [`DrainState::enter`]).
pub(crate) struct InFlight<'a>(&'a DrainState);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

impl DrainState {
    /// Counts a new client request, or refuses it once draining began.
    pub(crate) fn enter(&self, node_id: NodeId) -> Result<InFlight<'_>, ClusterError> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(ClusterError::Draining { node_id });
        }
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight(self);
        // A drain that began meanwhile waits for this request, which is fine; re-checking
        // keeps the refusal prompt.
        if self.draining.load(Ordering::SeqCst) {
            drop(guard);
            return Err(ClusterError::Draining { node_id });
        }
        Ok(guard)
    }

    fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Waits until no counted request runs, or `deadline`. Returns how many still run.
    async fn wait_idle(&self, deadline: Instant) -> u64 {
        loop {
            let notified = self.idle.notified();
            let n = self.in_flight.load(Ordering::SeqCst);
            if n == 0 || Instant::now() >= deadline {
                return n;
            }
            let _ = tokio::time::timeout_at(deadline.min(Instant::now() + POLL * 10), notified).await;
        }
    }
}

/// What a drain achieved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainOutcome {
    /// This node was not the leader: nothing to hand over.
    NotLeader,
    /// The only voter: nobody to hand over to.
    SingleVoter,
    /// No voter had caught up for two election timeouts (they are stopping too, or cut off):
    /// the node stops without a hand-off.
    NoSuccessor,
    /// Node `to` leads now.
    HandedOff {
        /// The new leader.
        to: u64,
    },
    /// The drain time ran out first (the cluster fails over after this node stops).
    TimedOut {
        /// Requests still running when it ran out.
        in_flight: u64,
        /// Whether this node still led.
        still_leader: bool,
    },
}

impl ClusterNode {
    /// Refuses every new client request from now on ([`ClusterError::Draining`]).
    pub fn begin_drain(&self) {
        self.inner.drain.draining.store(true, Ordering::SeqCst);
    }

    /// Whether [`ClusterNode::begin_drain`] ran.
    pub fn is_draining(&self) -> bool {
        self.inner.drain.is_draining()
    }

    /// Drains this node within `timeout` (see the module docs): refuse new requests, wait for
    /// those in flight, hand leadership over. The caller stops the node afterwards.
    pub async fn drain(&self, timeout: Duration) -> DrainOutcome {
        let deadline = Instant::now() + timeout;
        self.begin_drain();
        let in_flight = self.inner.drain.wait_idle(deadline).await;
        if in_flight > 0 {
            tracing::warn!(in_flight, "drain time ran out with client requests in flight");
            return DrainOutcome::TimedOut {
                in_flight,
                still_leader: self.leads(),
            };
        }
        self.hand_off(deadline).await
    }

    fn leads(&self) -> bool {
        let m = self.inner.raft.metrics();
        let m = m.borrow();
        m.state == openraft::ServerState::Leader && m.current_leader == Some(self.inner.config.node_id)
    }

    async fn hand_off(&self, deadline: Instant) -> DrainOutcome {
        let me = self.inner.config.node_id;
        if !self.leads() {
            return DrainOutcome::NotLeader;
        }
        let raft = &self.inner.raft;
        let others: Vec<(NodeId, String)> = {
            let m = raft.metrics();
            let m = m.borrow();
            let membership = m.membership_config.membership();
            membership
                .voter_ids()
                .filter(|id| *id != me)
                .filter_map(|id| membership.get_node(&id).map(|n| (id, n.peer.clone())))
                .collect()
        };
        if others.is_empty() {
            return DrainOutcome::SingleVoter;
        }
        raft.runtime_config().elect(false);
        // The leader grants a candidate's vote only once its own lease has passed.
        let lease = Duration::from_millis(self.inner.config.election_timeout_max_ms);
        if let Ok(Some(voted_at)) = raft.with_raft_state(|s| s.vote_last_modified()).await {
            let granting = voted_at + lease + POLL;
            if granting > Instant::now() {
                tokio::time::sleep_until(granting.min(deadline)).await;
            }
        }
        let attempt_wait = lease * HANDOFF_ATTEMPT_ELECTION_TIMEOUTS;
        let mut attempt = 0usize;
        let mut none_caught_up_since: Option<Instant> = None;
        while Instant::now() < deadline {
            let (last_log, matched) = {
                let m = raft.metrics();
                let m = m.borrow();
                (
                    m.last_log_index.unwrap_or(0),
                    m.replication.clone().unwrap_or_default(),
                )
            };
            let caught_up: Vec<&(NodeId, String)> = others
                .iter()
                .filter(|(id, _)| {
                    matched
                        .get(id)
                        .and_then(|l| l.as_ref())
                        .is_some_and(|l| l.index >= last_log)
                })
                .collect();
            let Some((target, peer)) = caught_up.get(attempt % caught_up.len().max(1)).copied() else {
                let since = *none_caught_up_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= attempt_wait {
                    tracing::warn!(
                        "no voter caught up to hand the leadership to; stopping without a hand-off"
                    );
                    return DrainOutcome::NoSuccessor;
                }
                tokio::time::sleep(POLL).await;
                continue;
            };
            attempt += 1;
            let cluster_id = self.inner.cluster.get();
            let rpc_timeout = attempt_wait.min(deadline.saturating_duration_since(Instant::now()));
            if let Err(e) =
                super::network::timeout_now(&self.inner.channels, peer, me, cluster_id, rpc_timeout).await
            {
                // Unreachable or refusing (stopping too?): give up after two election timeouts
                // without any voter taking the request.
                let since = *none_caught_up_since.get_or_insert_with(Instant::now);
                tracing::warn!(to = target, error = %e, "leadership hand-off refused");
                if since.elapsed() >= attempt_wait {
                    tracing::warn!("no voter took the leadership; stopping without a hand-off");
                    return DrainOutcome::NoSuccessor;
                }
                tokio::time::sleep(POLL * 10).await;
                continue;
            }
            none_caught_up_since = None;
            let until = (Instant::now() + attempt_wait).min(deadline);
            let mut metrics = raft.metrics();
            loop {
                let leader = metrics.borrow_and_update().current_leader;
                if let Some(to) = leader.filter(|l| *l != me) {
                    tracing::info!(to, "handed leadership to node {to}");
                    return DrainOutcome::HandedOff { to };
                }
                if Instant::now() >= until {
                    break;
                }
                let _ = tokio::time::timeout_at(until, metrics.changed()).await;
            }
            tracing::warn!(
                to = target,
                "node {target} did not take the leadership in time; retrying"
            );
        }
        DrainOutcome::TimedOut {
            in_flight: 0,
            still_leader: self.leads(),
        }
    }
}

/// The receiving side of `TimeoutNow`: campaign at once, if `from` is the leader this node
/// follows, this node is a voter and it is not draining itself (a node stopping must not take
/// a leadership it is about to drop: two nodes of a rolling restart stopping at once would
/// otherwise pass it back and forth).
pub(crate) async fn accept_timeout_now(
    raft: &Raft,
    me: NodeId,
    from: NodeId,
    draining: bool,
) -> Result<(), Status> {
    if draining {
        return Err(Status::failed_precondition(format!(
            "node {me} is draining (stopping): it cannot take the leadership from node {from}"
        )));
    }
    let (leader, voter) = {
        let m = raft.metrics();
        let m = m.borrow();
        (
            m.current_leader,
            m.membership_config.membership().voter_ids().any(|id| id == me),
        )
    };
    if leader != Some(from) {
        return Err(Status::failed_precondition(format!(
            "TimeoutNow from node {from}, which is not the leader node {me} follows ({leader:?})"
        )));
    }
    if !voter {
        return Err(Status::failed_precondition(format!(
            "node {me} is not a voter: it cannot take the leadership"
        )));
    }
    tracing::info!(from, "leader {from} hands its leadership over: campaigning now");
    raft.trigger()
        .elect()
        .await
        .map_err(|e| Status::unavailable(format!("raft stopped: {e}")))
}
