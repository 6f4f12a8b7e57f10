//! Runs a scenario's steps ([`Step`]) against the db: faults through the run's [`Nemesis`],
//! scripted register ops through their own clients, each recorded in the history.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::sync::Mutex as AsyncMutex;

use super::{parse_duration, Step, TargetSpec};
use crate::jepsen::checker::{CheckResult, Verdict};
use crate::jepsen::db::Db;
use crate::jepsen::history::{Op, OpType, Process, Recorder};
use crate::jepsen::nemesis::{Active, Fault, Nemesis, NemesisKind, Target};
use crate::jepsen::workload::{PlannedOp, WorkloadKind};

/// Executes a script against the db, recording faults and scripted ops.
pub struct ScriptContext {
    db: Arc<Db>,
    recorder: Recorder,
    nemesis: Arc<AsyncMutex<Nemesis>>,
    op_timeout: Duration,
    interrupted: Arc<AtomicBool>,
    down: BTreeSet<u64>,
    paused: BTreeSet<u64>,
    unsupported: Vec<CheckResult>,
}

impl ScriptContext {
    /// A context over the run's db, recorder and nemesis.
    pub fn new(
        db: Arc<Db>,
        recorder: Recorder,
        nemesis: Arc<AsyncMutex<Nemesis>>,
        op_timeout: Duration,
        interrupted: Arc<AtomicBool>,
    ) -> Self {
        ScriptContext {
            db,
            recorder,
            nemesis,
            op_timeout,
            interrupted,
            down: BTreeSet::new(),
            paused: BTreeSet::new(),
            unsupported: Vec::new(),
        }
    }

    /// `unsupported` results for steps that could not be carried out (one per kind).
    pub fn unsupported(&self) -> Vec<CheckResult> {
        self.unsupported.clone()
    }

    fn note_unsupported(&mut self, kind: NemesisKind) {
        let name = format!("nemesis-{}", kind.name());
        if self.unsupported.iter().any(|r| r.checker == name) {
            return;
        }
        let reason = kind.unsupported_reason(self.db.substrate()).unwrap_or_default();
        self.recorder.record(Op::new(
            Process::Nemesis,
            OpType::Info,
            &format!("unsupported-{}", kind.name()),
            None,
            json!(reason),
        ));
        self.unsupported
            .push(CheckResult::new(&name, Verdict::Unsupported, reason, Value::Null));
    }

    /// Runs `steps` in order (boxed for recursion through `repeat`).
    pub fn run<'a>(
        &'a mut self,
        steps: &'a [Step],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>> {
        Box::pin(async move {
            for step in steps {
                if self.interrupted.load(Ordering::Relaxed) {
                    return;
                }
                self.step(step).await;
            }
        })
    }

    async fn resolve(&self, spec: &TargetSpec) -> Vec<u64> {
        match spec.to_target() {
            Ok(Target::All) => self.db.members(),
            Ok(Target::Node(n)) => vec![n],
            Ok(Target::Leader) => self.db.leader().await.into_iter().collect(),
            Ok(Target::Isolated) => self.nemesis.lock().await.isolated(),
            _ => Vec::new(),
        }
    }

    async fn step(&mut self, step: &Step) {
        match step {
            Step::Wait { duration } => {
                let d = parse_duration(duration).unwrap_or_default();
                let until = std::time::Instant::now() + d;
                while std::time::Instant::now() < until && !self.interrupted.load(Ordering::Relaxed) {
                    tokio::time::sleep(
                        until
                            .saturating_duration_since(std::time::Instant::now())
                            .min(Duration::from_millis(200)),
                    )
                    .await;
                }
            }
            Step::Kill { target } | Step::Disk { target, .. } | Step::LoseUnsynced { target } => {
                let Ok(t) = target.to_target() else { return };
                let fault = match step {
                    Step::Disk { mode, file, .. } => Fault::Disk {
                        target: t,
                        mode: *mode,
                        file: *file,
                    },
                    Step::LoseUnsynced { .. } => Fault::LoseUnsynced { target: t },
                    _ => Fault::Kill { target: t },
                };
                if let Active::Killed(nodes) = self.nemesis.lock().await.start(&fault).await {
                    self.down.extend(nodes);
                }
            }
            Step::Restart { target } => {
                let wanted = self.resolve(target).await;
                let nodes: Vec<u64> = self
                    .db
                    .members()
                    .into_iter()
                    .filter(|n| (wanted.contains(n) || wanted.is_empty()) && !self.db.is_running(*n))
                    .collect();
                for n in &nodes {
                    self.down.remove(n);
                }
                self.nemesis
                    .lock()
                    .await
                    .stop(NemesisKind::Kill, Active::Killed(nodes))
                    .await;
            }
            Step::Pause { target } => {
                let Ok(t) = target.to_target() else { return };
                if let Active::Paused(nodes) =
                    self.nemesis.lock().await.start(&Fault::Pause { target: t }).await
                {
                    self.paused.extend(nodes);
                }
            }
            Step::Resume { target } => {
                let wanted = self.resolve(target).await;
                let nodes: Vec<u64> = self
                    .paused
                    .iter()
                    .copied()
                    .filter(|n| wanted.contains(n) || wanted.is_empty())
                    .collect();
                for n in &nodes {
                    self.paused.remove(n);
                }
                self.nemesis
                    .lock()
                    .await
                    .stop(NemesisKind::Pause, Active::Paused(nodes))
                    .await;
            }
            Step::Partition { shape } => {
                if let Some(_reason) = NemesisKind::Partition.unsupported_reason(self.db.substrate()) {
                    self.note_unsupported(NemesisKind::Partition);
                    return;
                }
                self.nemesis
                    .lock()
                    .await
                    .start(&Fault::Partition { shape: *shape })
                    .await;
            }
            Step::Heal => {
                if NemesisKind::Partition
                    .unsupported_reason(self.db.substrate())
                    .is_none()
                {
                    self.nemesis
                        .lock()
                        .await
                        .stop(NemesisKind::Partition, Active::Partitioned)
                        .await;
                }
            }
            Step::Membership => {
                self.nemesis.lock().await.start(&Fault::Membership).await;
            }
            Step::Remove { target } => {
                let Ok(t) = target.to_target() else { return };
                self.nemesis
                    .lock()
                    .await
                    .start(&Fault::Remove { target: t })
                    .await;
            }
            Step::Add { promote } => {
                self.nemesis
                    .lock()
                    .await
                    .start(&Fault::Add { promote: *promote })
                    .await;
            }
            Step::KillAfterElection {
                delay,
                target,
                timeout,
            } => {
                let (Ok(t), Ok(delay), Ok(timeout)) =
                    (target.to_target(), parse_duration(delay), parse_duration(timeout))
                else {
                    return;
                };
                self.kill_after_election(t, delay, timeout).await;
            }
            Step::Clock { target, offset_ms } => {
                let Ok(t) = target.to_target() else { return };
                let fault = Fault::Clock {
                    target: t,
                    skew: crate::jepsen::nemesis::clock_offset_spec(*offset_ms),
                };
                // The skew stays until a later `clock` step or the final heal resets it.
                self.nemesis.lock().await.start(&fault).await;
            }
            Step::Put { key, value, node } => {
                let op = PlannedOp {
                    f: "put".into(),
                    key: Some(json!(format!("s-{key}"))),
                    value: json!(value),
                };
                let targets = self.op_targets(node).await;
                for ep in targets.into_iter().take(1) {
                    self.scripted_op(&op, ep).await;
                }
            }
            Step::Get { key, node } => {
                let op = PlannedOp {
                    f: "get".into(),
                    key: Some(json!(format!("s-{key}"))),
                    value: Value::Null,
                };
                let all = matches!(node, Some(TargetSpec::Name(n)) if n == "all");
                let targets = self.op_targets(node).await;
                let n = if all { targets.len() } else { 1 };
                for ep in targets.into_iter().take(n) {
                    self.scripted_op(&op, ep).await;
                }
            }
            Step::Repeat { times, steps } => {
                for _ in 0..*times {
                    if self.interrupted.load(Ordering::Relaxed) {
                        return;
                    }
                    self.run(steps).await;
                }
            }
        }
    }

    /// Status of every member at once (each bounded by `timeout`): `(id, term, is_leader)` of
    /// those that answered.
    async fn statuses(&self, timeout: Duration) -> Vec<(u64, u64, bool)> {
        let db = &self.db;
        let asks = db.members().into_iter().filter_map(|id| {
            let ep = db.endpoint(id).ok()?;
            Some(async move {
                db.status(&ep, false, timeout)
                    .await
                    .ok()
                    .map(|st| (id, st.term, st.is_leader))
            })
        });
        futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect()
    }

    /// The `kill-after-election` step: the highest term now is the baseline; polls every member
    /// (every 20 ms) until one is leader in a higher term, records `new-leader-elected`, sleeps
    /// `delay` and kills `target` (`leader`: exactly that new leader).
    async fn kill_after_election(&mut self, target: Target, delay: Duration, timeout: Duration) {
        let started = std::time::Instant::now();
        let baseline = self
            .statuses(Duration::from_millis(500))
            .await
            .iter()
            .map(|(_, term, _)| *term)
            .max()
            .unwrap_or(0);
        let mut elected = None;
        while started.elapsed() < timeout && !self.interrupted.load(Ordering::Relaxed) {
            let found = self
                .statuses(Duration::from_millis(300))
                .await
                .into_iter()
                .filter(|(_, term, leader)| *leader && *term > baseline)
                .max_by_key(|(_, term, _)| *term);
            if let Some((id, term, _)) = found {
                elected = Some((id, term));
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let Some((leader, term)) = elected else {
            self.recorder.record(Op::new(
                Process::Nemesis,
                OpType::Info,
                "no-new-leader",
                None,
                json!({"previous_term": baseline, "waited_ms": started.elapsed().as_millis() as u64,
                       "note": "no kill: no leader elected in a higher term within the timeout"}),
            ));
            return;
        };
        self.recorder.record(Op::new(
            Process::Nemesis,
            OpType::Info,
            "new-leader-elected",
            None,
            json!({"leader": leader, "term": term, "previous_term": baseline,
                   "waited_ms": started.elapsed().as_millis() as u64, "kill_delay_ms": delay.as_millis() as u64}),
        ));
        tokio::time::sleep(delay).await;
        let target = match target {
            Target::Leader => Target::Node(leader),
            other => other,
        };
        if let Active::Killed(nodes) = self.nemesis.lock().await.start(&Fault::Kill { target }).await {
            self.down.extend(nodes);
        }
    }

    /// Endpoint lists for a scripted op: `None` = all endpoints (any node); a target = only it.
    async fn op_targets(&self, node: &Option<TargetSpec>) -> Vec<Vec<String>> {
        match node {
            None => vec![self.db.endpoints()],
            Some(spec) => {
                let ids = match spec.to_target() {
                    Ok(Target::Random) | Ok(Target::Follower) => {
                        let leader = self.db.leader().await;
                        let f: Vec<u64> = self
                            .db
                            .members()
                            .into_iter()
                            .filter(|m| Some(*m) != leader)
                            .collect();
                        f.into_iter().take(1).collect()
                    }
                    _ => self.resolve(spec).await,
                };
                ids.into_iter()
                    .filter_map(|id| self.db.endpoint(id).ok())
                    .map(|e| vec![e])
                    .collect()
            }
        }
    }

    async fn scripted_op(&self, op: &PlannedOp, endpoints: Vec<String>) {
        let client = self
            .db
            .client_builder(endpoints)
            .connect_timeout(Duration::from_secs(2))
            .request_timeout(Duration::from_secs(3))
            .retry(ftkv_client::RetryPolicy {
                deadline: self.op_timeout,
                ..Default::default()
            })
            .build()
            .await;
        let process = self.recorder.new_process();
        match client {
            Ok(c) => {
                crate::jepsen::runner::run_op(
                    &self.recorder,
                    WorkloadKind::Register,
                    &c,
                    process,
                    op,
                    self.op_timeout,
                )
                .await;
            }
            Err(e) => {
                self.recorder.record(Op::new(
                    process,
                    OpType::Invoke,
                    &op.f,
                    op.key.clone(),
                    op.value.clone(),
                ));
                // The client was never built: nothing was sent, so the op certainly did not happen.
                self.recorder.record(
                    Op::new(process, OpType::Fail, &op.f, op.key.clone(), op.value.clone())
                        .with_error(e.to_string()),
                );
            }
        }
    }
}
