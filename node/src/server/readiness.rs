//! Readiness, as etcd's `/readyz` judges it: a list of named checks, each passing or failing
//! with a reason. `/readyz` answers 200 when all pass and 503 otherwise, one line per check
//! (`[+]leader ok`, `[-]linearizable_read failed: ...`); the client port's gRPC health
//! (`""` and `ftkv.v1.Kv`) follows the same verdict, re-evaluated every second.
//!
//! Checks: `raft` (the core runs and peers do not refuse this node as removed), `leader` (one is
//! known), `applied` (applied within [`MAX_APPLY_GAP_ENTRIES`] of committed), `linearizable_read`
//! (see [`ClusterNode::check_linearizable_read`]), `non_learner`, `alarm` (no alarm raised:
//! [`Readiness::alarm_check`] is the hook alarms plug into), `draining` (not shutting down).
//! `/livez` never looks at the cluster.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::cluster::{ClusterNode, NodeStatus};

/// Most entries applied may trail committed while ready (etcd's
/// `maxGapBetweenApplyAndCommitIndex`).
pub const MAX_APPLY_GAP_ENTRIES: u64 = 5000;

/// How long the leader's ReadIndex round of `linearizable_read` may take.
pub const READ_CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// How often the gRPC health status is re-evaluated.
pub const HEALTH_PERIOD: Duration = Duration::from_secs(1);

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckResult {
    /// Check name (`leader`, `linearizable_read`, ...).
    pub name: &'static str,
    /// `Err(reason)` when it fails.
    pub outcome: Result<(), String>,
}

/// An extra readiness check (e.g. an alarm): `Err(reason)` makes the node not ready.
pub type ExtraCheck = Box<dyn Fn(&NodeStatus) -> Result<(), String> + Send + Sync>;

/// The readiness of one node (shared by `/readyz` and the gRPC health updater).
pub struct Readiness {
    cluster: ClusterNode,
    draining: AtomicBool,
    drain_started: tokio::sync::Notify,
    alarm: parking_lot::RwLock<Option<ExtraCheck>>,
}

impl Readiness {
    /// Readiness of `cluster`.
    pub fn new(cluster: ClusterNode) -> Arc<Self> {
        Arc::new(Readiness {
            cluster,
            draining: AtomicBool::new(false),
            drain_started: tokio::sync::Notify::new(),
            alarm: parking_lot::RwLock::new(None),
        })
    }

    /// The node begins to shut down: every later evaluation fails `draining`, and gRPC health
    /// turns `NOT_SERVING` at once.
    pub fn begin_drain(&self) {
        self.draining.store(true, Ordering::Release);
        self.drain_started.notify_waiters();
    }

    /// Whether [`Readiness::begin_drain`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Installs an extra `alarm` check, run after the node's own NOSPACE alarm.
    pub fn set_alarm_check(&self, check: ExtraCheck) {
        *self.alarm.write() = Some(check);
    }

    fn alarm_check(&self, status: &NodeStatus) -> Result<(), String> {
        if let Some(alarm) = self.cluster.alarm() {
            return Err(format!("alarm NOSPACE: {}", alarm.message));
        }
        match &*self.alarm.read() {
            Some(check) => check(status),
            None => Ok(()),
        }
    }

    /// Runs every check (the read path one only when the cheap ones leave it meaningful).
    pub async fn evaluate(&self) -> Vec<CheckResult> {
        let st = self.cluster.status();
        let mut out = Vec::with_capacity(7);
        let mut push = |name, outcome| out.push(CheckResult { name, outcome });
        push(
            "raft",
            match st.role.as_str() {
                "shutdown" => Err("raft stopped".to_string()),
                "removed" => {
                    Err("removed from the cluster (peers refuse this node as not a member)".to_string())
                }
                _ => Ok(()),
            },
        );
        let leader = match st.leader_id {
            Some(_) => Ok(()),
            None => Err("no leader".to_string()),
        };
        let leader_known = leader.is_ok();
        push("leader", leader);
        let gap = st.commit_index.saturating_sub(st.applied_index);
        push(
            "applied",
            if gap <= MAX_APPLY_GAP_ENTRIES {
                Ok(())
            } else {
                Err(format!(
                    "catching up: applied {} of {} committed ({gap} behind, limit {MAX_APPLY_GAP_ENTRIES})",
                    st.applied_index, st.commit_index
                ))
            },
        );
        let read = if !leader_known || matches!(st.role.as_str(), "shutdown" | "removed") {
            Err("no leader to serve it".to_string())
        } else {
            self.cluster
                .check_linearizable_read(&st, READ_CHECK_TIMEOUT)
                .await
        };
        push("linearizable_read", read);
        push(
            "non_learner",
            if st.role == "learner" {
                Err("this node is a learner".to_string())
            } else {
                Ok(())
            },
        );
        push("alarm", self.alarm_check(&st));
        push(
            "draining",
            if self.is_draining() {
                Err("shutting down".to_string())
            } else {
                Ok(())
            },
        );
        out
    }

    /// Keeps the gRPC health of `""` and `ftkv.v1.Kv` equal to the readiness verdict (re-checked
    /// every [`HEALTH_PERIOD`], at once when draining starts) until `shutdown` resolves.
    pub async fn track_health(
        self: Arc<Self>,
        reporter: tonic_health::server::HealthReporter,
        shutdown: impl std::future::Future<Output = ()>,
    ) {
        use tonic_health::ServingStatus;
        tokio::pin!(shutdown);
        let mut last = None;
        loop {
            let ready = self.evaluate().await.iter().all(|c| c.outcome.is_ok());
            if last != Some(ready) {
                let status = if ready {
                    ServingStatus::Serving
                } else {
                    ServingStatus::NotServing
                };
                reporter.set_service_status("", status).await;
                reporter.set_service_status(KV_SERVICE, status).await;
                last = Some(ready);
            }
            tokio::select! {
                _ = &mut shutdown => return,
                _ = self.drain_started.notified() => {}
                _ = tokio::time::sleep(HEALTH_PERIOD) => {}
            }
        }
    }
}

/// The gRPC name of the key-value service.
pub const KV_SERVICE: &str = "ftkv.v1.Kv";

/// The `/readyz` body: one line per check, then `ok` or `readyz check failed`.
pub fn render(checks: &[CheckResult]) -> (bool, String) {
    let mut body = String::new();
    let mut ready = true;
    for c in checks {
        match &c.outcome {
            Ok(()) => body.push_str(&format!("[+]{} ok\n", c.name)),
            Err(reason) => {
                ready = false;
                body.push_str(&format!("[-]{} failed: {reason}\n", c.name));
            }
        }
    }
    body.push_str(if ready { "ok\n" } else { "readyz check failed\n" });
    (ready, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_lists_every_check_and_the_verdict() {
        let checks = vec![
            CheckResult {
                name: "leader",
                outcome: Ok(()),
            },
            CheckResult {
                name: "linearizable_read",
                outcome: Err("no quorum".into()),
            },
        ];
        let (ready, body) = render(&checks);
        assert!(!ready);
        assert_eq!(
            body,
            "[+]leader ok\n[-]linearizable_read failed: no quorum\nreadyz check failed\n"
        );
        let (ready, body) = render(&checks[..1]);
        assert!(ready);
        assert!(body.ends_with("ok\n"));
    }
}
