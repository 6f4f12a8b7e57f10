//! Scenario files (`tests/scenarios/*.toml`): a named, seeded, timed script of client ops and
//! faults run over a background workload, plus the checks to run. The idea is etcd's robustness
//! suite: every past bug elsewhere kept as a fault script that must pass here.
//!
//! ```toml
//! name = "leader-partition-stale-read"
//! description = "Consul 54: ..."
//! seed = 6
//! substrate = "netns"          # or "local" (default), "docker"
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
//! {target}`, `resume {target}`, `partition {shape}` (`isolate-one`, `isolate-leader`,
//! `isolate-follower`: a follower alone, never the leader; `halves`, `bridge`), `heal`, `disk
//! {target, mode, file?}` (`file`: `log`, `snapshot-header`, `snapshot-body`; the node stays down
//! until `restart`), `membership` (replace a follower), `remove {target}` (remove one member, no
//! replacement), `add {promote?}` (a fresh node under a new id, promoted by default),
//! `kill-after-election {delay, target?, timeout?}` (SIGKILL `delay` after a leader is elected
//! in a higher term than when the step began), `put {key, value, node?}`, `get {key, node?}`
//! (node `"all"`: one get per member), `repeat {times, steps}`, `lose-unsynced {target}` (SIGKILL
//! losing what was not fsynced; the node stays down until `restart`) and `clock {target,
//! offset_ms}` (libfaketime offset; `offset_ms = 0` resets; every clock is reset at the final
//! heal). A script with `lose-unsynced` or `clock` steps starts its nodes in the matching mode
//! (see [`crate::jepsen::db`]). Targets: `"leader"`, `"follower"`, `"random"`, `"all"`,
//! `"isolated"` (cut off by the last isolate partition) or a node id. After every membership
//! step the harness counts the members the cluster reports (see [`crate::jepsen::nemesis`]).

mod script;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::jepsen::db::SubstrateKind;
use crate::jepsen::nemesis::{DiskFile, DiskMode, NemesisKind, PartitionShape, Target};
use crate::jepsen::runner::TestOptions;
use crate::jepsen::workload::{WorkloadKind, WorkloadOptions};

pub use script::ScriptContext;

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
    pub(crate) fn to_target(&self) -> Result<Target, String> {
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
    /// Kill and damage the newest log segment or the snapshot file; the node stays down until
    /// `restart`.
    Disk {
        /// Whom.
        #[serde(default = "default_target")]
        target: TargetSpec,
        /// How.
        mode: DiskMode,
        /// Which file: `log` (default), `snapshot-header` or `snapshot-body` (no snapshot file
        /// yet: the log instead, as the report line says).
        #[serde(default = "default_disk_file")]
        file: DiskFile,
    },
    /// Replace a follower by a fresh node under a new id.
    Membership,
    /// Remove member `target` (no replacement); it is stopped and wiped, and the harness counts
    /// the members the cluster then has.
    Remove {
        /// Whom (`leader`, `follower`, `random`, `isolated` or an id).
        #[serde(default = "follower_target")]
        target: TargetSpec,
    },
    /// Start a fresh node under a new id and add it as learner, then (by default) promote it.
    Add {
        /// Promote it to voter once it has caught up.
        #[serde(default = "yes")]
        promote: bool,
    },
    /// Wait until a leader is elected in a term above the highest term any member reports when
    /// the step begins, wait `delay` more, then SIGKILL `target` (default: that new leader); the
    /// node stays down until `restart`. Put it right after the fault that forces the election.
    KillAfterElection {
        /// Time between seeing the new leader and the kill (`0ms`, `150ms`, `1s`).
        delay: String,
        /// Whom (`leader` = the newly elected leader).
        #[serde(default = "leader_target")]
        target: TargetSpec,
        /// Give up (no kill, recorded) when no new leader is seen within this time.
        #[serde(default = "election_timeout")]
        timeout: String,
    },
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

fn follower_target() -> TargetSpec {
    TargetSpec::Name("follower".into())
}

fn leader_target() -> TargetSpec {
    TargetSpec::Name("leader".into())
}

fn default_disk_file() -> DiskFile {
    DiskFile::Log
}

fn yes() -> bool {
    true
}

fn election_timeout() -> String {
    "15s".into()
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
            Step::Remove { target } if target.to_target()? == Target::All => {
                return Err("remove takes one member, not \"all\"".into());
            }
            Step::Remove { target } => {
                target.to_target()?;
            }
            Step::KillAfterElection {
                delay,
                target,
                timeout,
            } => {
                parse_duration(delay)?;
                parse_duration(timeout)?;
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
    fn parses_the_membership_election_isolation_and_snapshot_steps() {
        let s = Scenario::parse(
            r#"
name = "x"
description = "d"
seed = 3
time_limit = "5s"
checks = ["counter"]
[[steps]]
do = "partition"
shape = "isolate-follower"
[[steps]]
do = "kill-after-election"
delay = "150ms"
[[steps]]
do = "remove"
target = 2
[[steps]]
do = "add"
[[steps]]
do = "add"
promote = false
[[steps]]
do = "disk"
target = "follower"
mode = "bitflip"
file = "snapshot-header"
[[steps]]
do = "disk"
mode = "truncate"
"#,
        )
        .unwrap();
        assert_eq!(
            s.steps[0],
            Step::Partition {
                shape: PartitionShape::IsolateFollower
            }
        );
        assert_eq!(
            s.steps[1],
            Step::KillAfterElection {
                delay: "150ms".into(),
                target: TargetSpec::Name("leader".into()),
                timeout: "15s".into(),
            }
        );
        assert_eq!(
            s.steps[2],
            Step::Remove {
                target: TargetSpec::Id(2)
            }
        );
        assert_eq!(s.steps[3], Step::Add { promote: true });
        assert_eq!(s.steps[4], Step::Add { promote: false });
        assert!(matches!(
            s.steps[5],
            Step::Disk {
                file: DiskFile::SnapshotHeader,
                mode: DiskMode::Bitflip,
                ..
            }
        ));
        assert!(matches!(
            s.steps[6],
            Step::Disk {
                file: DiskFile::Log,
                ..
            }
        ));
        let base = "name='x'\ndescription='d'\nseed=1\ntime_limit='5s'\nchecks=[]\n[[steps]]\n";
        assert!(Scenario::parse(&format!("{base}do='remove'\ntarget='all'\n")).is_err());
        assert!(Scenario::parse(&format!("{base}do='kill-after-election'\ndelay='soon'\n")).is_err());
        assert!(
            Scenario::parse(&format!("{base}do='kill-after-election'\n")).is_err(),
            "delay is required"
        );
        assert!(Scenario::parse(&format!("{base}do='disk'\nmode='bitflip'\nfile='superblock'\n")).is_err());
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
        assert_eq!(files.len(), 14, "{files:?}");
        let mut names = BTreeSet::new();
        for f in files {
            let s = Scenario::load(&f).unwrap_or_else(|e| panic!("{e}"));
            assert!(names.insert(s.name.clone()), "duplicate name {}", s.name);
        }
    }
}
