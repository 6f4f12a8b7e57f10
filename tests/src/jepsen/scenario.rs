//! Scenario files (`tests/scenarios/*.toml`): a named, seeded, timed script of client ops and
//! faults run over a background workload, plus the checks to run. The idea is etcd's robustness
//! suite: every past bug elsewhere kept as a fault script that must pass here.
//!
//! ```toml
//! name = "leader-partition-stale-read"
//! description = "Consul 54: ..."
//! seed = 6
//! substrate = "netns"          # or "local" (default)
//! workload = "register"        # background traffic (default register)
//! concurrency = 3
//! rate = 20.0
//! time_limit = "20s"           # at least this long; the script may run longer
//! node_args = ["--snapshot-every-entries", "100"]
//! checks = ["linearizable", "convergence", "liveness"]
//!
//! [[steps]]
//! do = "put"                   # scripted register op on key "s-k" (any node, or node = ...)
//! key = "k"
//! value = 1
//! [[steps]]
//! do = "partition"
//! shape = "isolate-leader"
//! [[steps]]
//! do = "wait"
//! for = "3s"
//! ```
//!
//! Steps (`do`): `wait {for}`, `kill {target}`, `restart {target}` (nodes not running), `pause
//! {target}`, `resume {target}`, `partition {shape}`, `heal`, `disk {target, mode}` (the node
//! stays down until `restart`), `membership`, `put {key, value, node?}`, `get {key, node?}` (node
//! `"all"`: one get per member), `repeat {times, steps}`, `lose-unsynced {target}` (SIGKILL losing
//! what was not fsynced; the node stays down until `restart`) and `clock {target, offset_ms}`
//! (libfaketime offset; `offset_ms = 0` resets; every clock is reset at the final heal). A script
//! with `lose-unsynced` or `clock` steps starts its nodes in the matching mode (see
//! [`crate::jepsen::db`]). Targets: `"leader"`,
//! `"follower"`, `"random"`, `"all"`, `"isolated"` (cut off by the last isolate partition) or a
//! node id.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::sync::Mutex as AsyncMutex;

use crate::jepsen::checker::{CheckResult, Verdict};
use crate::jepsen::db::{Db, SubstrateKind};
use crate::jepsen::history::{Op, OpType, Recorder};
use crate::jepsen::nemesis::{Active, DiskMode, Fault, Nemesis, NemesisKind, PartitionShape, Target};
use crate::jepsen::runner::TestOptions;
use crate::jepsen::workload::{PlannedOp, WorkloadKind, WorkloadOptions};

/// Errors loading scenario files.
#[derive(Debug, thiserror::Error)]
pub enum ScenarioError {
    /// The file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// File.
        path: PathBuf,
        /// OS error.
        source: std::io::Error,
    },
    /// The file is not a valid scenario.
    #[error("{path}: {message}")]
    Invalid {
        /// File.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

/// A target as written in a file: a name or a node id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum TargetSpec {
    /// A node id.
    Id(u64),
    /// `leader`, `follower`, `random` or `all`.
    Name(String),
}

impl TargetSpec {
    fn to_target(&self) -> Result<Target, String> {
        Ok(match self {
            TargetSpec::Id(n) => Target::Node(*n),
            TargetSpec::Name(s) => match s.as_str() {
                "leader" => Target::Leader,
                "follower" => Target::Follower,
                "random" => Target::Random,
                "all" => Target::All,
                "isolated" => Target::Isolated,
                other => return Err(format!("unknown target {other:?}")),
            },
        })
    }
}

fn default_target() -> TargetSpec {
    TargetSpec::Name("random".into())
}

/// One step of a script.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "do", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Step {
    /// Sleep.
    Wait {
        /// Human duration (`2s`, `500ms`).
        #[serde(rename = "for")]
        duration: String,
    },
    /// SIGKILL; the node stays down until `restart`.
    Kill {
        /// Whom.
        #[serde(default = "default_target")]
        target: TargetSpec,
    },
    /// Start stopped nodes among the target (`all`: every stopped member).
    Restart {
        /// Whom.
        #[serde(default = "all_target")]
        target: TargetSpec,
    },
    /// SIGSTOP until `resume`.
    Pause {
        /// Whom.
        #[serde(default = "default_target")]
        target: TargetSpec,
    },
    /// SIGCONT paused nodes among the target.
    Resume {
        /// Whom.
        #[serde(default = "all_target")]
        target: TargetSpec,
    },
    /// Network partition (netns).
    Partition {
        /// Shape.
        shape: PartitionShape,
    },
    /// Remove partitions.
    Heal,
    /// Kill and corrupt the newest log segment; the node stays down until `restart`.
    Disk {
        /// Whom.
        #[serde(default = "default_target")]
        target: TargetSpec,
        /// How.
        mode: DiskMode,
    },
    /// Replace a follower by a fresh node under a new id.
    Membership,
    /// SIGKILL losing every write not yet fsynced; the node stays down until `restart`.
    LoseUnsynced {
        /// Whom.
        #[serde(default = "default_target")]
        target: TargetSpec,
    },
    /// Skew a node's clock by `offset_ms` (0 resets it).
    Clock {
        /// Whom.
        #[serde(default = "default_target")]
        target: TargetSpec,
        /// Offset in ms.
        #[serde(default)]
        offset_ms: i64,
    },
    /// A register put on key `s-<key>`.
    Put {
        /// Key name.
        key: String,
        /// Integer value.
        value: i64,
        /// Node to send to (default: any).
        #[serde(default)]
        node: Option<TargetSpec>,
    },
    /// A register get on key `s-<key>`.
    Get {
        /// Key name.
        key: String,
        /// Node to send to (default: any; `all`: each member).
        #[serde(default)]
        node: Option<TargetSpec>,
    },
    /// Repeat `steps` `times` times.
    Repeat {
        /// Count.
        times: u32,
        /// Body.
        steps: Vec<Step>,
    },
}

fn all_target() -> TargetSpec {
    TargetSpec::Name("all".into())
}

/// A scenario file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// Name (report folder).
    pub name: String,
    /// What went wrong elsewhere and what must hold here.
    pub description: String,
    /// Seed.
    pub seed: u64,
    /// Substrate (default local).
    #[serde(default)]
    pub substrate: Option<SubstrateKind>,
    /// Node count (default 3).
    #[serde(default)]
    pub nodes: Option<u64>,
    /// Extra node flags.
    #[serde(default)]
    pub node_args: Vec<String>,
    /// Background workload (default register).
    #[serde(default)]
    pub workload: Option<WorkloadKind>,
    /// Workload parameters.
    #[serde(default)]
    pub workload_options: Option<WorkloadOptions>,
    /// Background workers (0 = scripted ops only).
    #[serde(default)]
    pub concurrency: Option<usize>,
    /// Background rate, ops/s.
    #[serde(default)]
    pub rate: Option<f64>,
    /// Minimum main-phase length (`20s`).
    pub time_limit: String,
    /// Checkers.
    pub checks: Vec<String>,
    /// The script.
    pub steps: Vec<Step>,
}

/// Parses a human duration (`20s`, `500ms`, `1m`).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("bad duration {text:?}: {e}"))
}

/// The fault kinds a script uses (nested `repeat`s included), so that the db starts its nodes in
/// the modes those faults need.
pub fn step_kinds(steps: &[Step]) -> BTreeSet<NemesisKind> {
    let mut kinds = BTreeSet::new();
    for s in steps {
        match s {
            Step::LoseUnsynced { .. } => {
                kinds.insert(NemesisKind::LoseUnsynced);
            }
            Step::Clock { .. } => {
                kinds.insert(NemesisKind::Clock);
            }
            Step::Repeat { steps, .. } => kinds.extend(step_kinds(steps)),
            _ => {}
        }
    }
    kinds
}

fn validate_steps(steps: &[Step]) -> Result<(), String> {
    for s in steps {
        match s {
            Step::Wait { duration } => {
                parse_duration(duration)?;
            }
            Step::Kill { target }
            | Step::Restart { target }
            | Step::Pause { target }
            | Step::Resume { target }
            | Step::Disk { target, .. }
            | Step::LoseUnsynced { target }
            | Step::Clock { target, .. } => {
                target.to_target()?;
            }
            Step::Put { node: Some(n), .. } | Step::Get { node: Some(n), .. } => {
                n.to_target()?;
            }
            Step::Repeat { steps, .. } => validate_steps(steps)?,
            _ => {}
        }
    }
    Ok(())
}

impl Scenario {
    /// Reads and validates a scenario file.
    pub fn load(path: &Path) -> Result<Scenario, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|source| ScenarioError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Scenario::parse(&text).map_err(|message| ScenarioError::Invalid {
            path: path.to_path_buf(),
            message,
        })
    }

    /// Parses and validates scenario text.
    pub fn parse(text: &str) -> Result<Scenario, String> {
        let s: Scenario = toml::from_str(text).map_err(|e| e.to_string())?;
        parse_duration(&s.time_limit)?;
        validate_steps(&s.steps)?;
        for c in &s.checks {
            if ![
                "linearizable",
                "set",
                "counter",
                "bank",
                "append",
                "convergence",
                "liveness",
            ]
            .contains(&c.as_str())
            {
                return Err(format!("unknown check {c:?}"));
            }
        }
        Ok(s)
    }

    /// Test options for this scenario; `substrate` overrides the file's.
    pub fn test_options(&self, store: &Path, substrate: Option<SubstrateKind>) -> TestOptions {
        let workload = self.workload.unwrap_or(WorkloadKind::Register);
        let mut o = TestOptions::new(workload);
        o.name = format!("scenario-{}", self.name);
        o.workload_options = self.workload_options.clone().unwrap_or_default();
        o.time_limit_ms = parse_duration(&self.time_limit)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(10_000);
        o.substrate = substrate.or(self.substrate).unwrap_or(SubstrateKind::Local);
        o.concurrency = self.concurrency.unwrap_or(3);
        o.rate = self.rate.unwrap_or(20.0);
        o.seed = self.seed;
        o.store = store.to_path_buf();
        o.nodes = self.nodes.unwrap_or(3);
        o.node_args = self.node_args.clone();
        o.script = Some(self.steps.clone());
        o.checks = Some(self.checks.clone());
        o
    }
}

/// Scenario files named by `path`: the file itself, or every `*.toml` in the folder, sorted.
pub fn scenario_files(path: &Path) -> Result<Vec<PathBuf>, ScenarioError> {
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|source| ScenarioError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.sort();
        Ok(files)
    } else {
        Ok(vec![path.to_path_buf()])
    }
}

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
            crate::jepsen::history::Process::Nemesis,
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
                    Step::Disk { mode, .. } => Fault::Disk {
                        target: t,
                        mode: *mode,
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
        let client = ftkv_client::Client::builder()
            .endpoints(endpoints)
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_scenario_with_nested_repeat() {
        let s = Scenario::parse(
            r#"
name = "x"
description = "d"
seed = 3
time_limit = "5s"
checks = ["linearizable", "liveness"]
[[steps]]
do = "put"
key = "k"
value = 1
[[steps]]
do = "repeat"
times = 2
steps = [{ do = "kill", target = "leader" }, { do = "wait", for = "1s" }, { do = "restart" }]
[[steps]]
do = "get"
key = "k"
node = "all"
"#,
        )
        .unwrap();
        assert_eq!(s.steps.len(), 3);
        assert!(matches!(&s.steps[1], Step::Repeat { times: 2, steps } if steps.len() == 3));
        let o = s.test_options(Path::new("store"), None);
        assert_eq!(o.substrate, SubstrateKind::Local);
        assert_eq!(o.time_limit_ms, 5000);
    }

    #[test]
    fn rejects_unknown_steps_targets_checks_and_durations() {
        let base = "name='x'\ndescription='d'\nseed=1\ntime_limit='5s'\n";
        assert!(Scenario::parse(&format!("{base}checks=[]\n[[steps]]\ndo='explode'\n")).is_err());
        assert!(Scenario::parse(&format!("{base}checks=[]\n[[steps]]\ndo='kill'\ntarget='moon'\n")).is_err());
        assert!(Scenario::parse(&format!("{base}checks=['vibes']\nsteps=[]\n")).is_err());
        assert!(Scenario::parse(&format!("{base}checks=[]\n[[steps]]\ndo='wait'\nfor='soon'\n")).is_err());
        assert!(Scenario::parse(&format!("{base}checks=['set']\nsteps=[]\n")).is_ok());
    }

    #[test]
    fn step_kinds_finds_node_modes_in_nested_steps() {
        let s = Scenario::parse(
            r#"
name = "x"
description = "d"
seed = 3
time_limit = "5s"
checks = ["set"]
[[steps]]
do = "kill"
[[steps]]
do = "repeat"
times = 2
steps = [{ do = "clock", target = 1, offset_ms = -2500 }, { do = "lose-unsynced", target = "all" }]
"#,
        )
        .unwrap();
        let kinds: Vec<NemesisKind> = step_kinds(&s.steps).into_iter().collect();
        assert_eq!(kinds, vec![NemesisKind::Clock, NemesisKind::LoseUnsynced]);
        assert!(step_kinds(&s.steps[..1]).is_empty());
    }

    #[test]
    fn every_shipped_scenario_parses() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("scenarios");
        let files = scenario_files(&dir).unwrap();
        assert_eq!(files.len(), 12, "{files:?}");
        let mut names = BTreeSet::new();
        for f in files {
            let s = Scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
            assert!(names.insert(s.name.clone()), "duplicate name {}", s.name);
        }
    }
}
