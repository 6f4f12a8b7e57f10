//! Nemeses: the faults, as ops in the history (`process: "nemesis"`, `f: "start-<fault>"` and
//! `"stop-<fault>"`, each an `invoke` followed by an `info` saying what was done), and the
//! seeded schedule that starts and stops them.
//!
//! Faults (Jepsen names): `kill` (SIGKILL, then restart), `pause` (SIGSTOP/SIGCONT), `partition`
//! (isolate one node, isolate the leader, random halves, a bridge a-b-c; netns only), `disk`
//! (between kill and restart: truncate the newest log segment by 1..4096 bytes, zero its last
//! 4 KiB page, or flip bits in a random 4 KiB block), `membership` (remove a node, wipe it, add it
//! back under a new id as learner, promote it), `clock` and `lose-unsynced`.
//!
//! `clock` skews one node's clock through libfaketime: nodes then run with `LD_PRELOAD` of
//! libfaketime and a per-node offset file (see [`crate::jepsen::db`]); a fault writes an offset
//! (`+5s`, `-3s`, `+30s`, `-10s`) or a rate (`+0 x1.5`, `+0 x0.7`: relative to the process start,
//! so the clock also jumps by (rate - 1) x uptime) into the target's file, the stop writes `+0`.
//! libfaketime shifts both `CLOCK_REALTIME` and `CLOCK_MONOTONIC` (Rust's `Instant`, tokio timers,
//! Raft election and lease timers), so a negative offset makes monotonic time go backwards.
//! Known finding: in debug builds openraft 0.9.25 asserts that monotonic time never goes back
//! (`debug_assert!` in `UTime::touch`, `openraft-0.9.25/src/utime.rs:95`, reached from
//! `VoteHandler::update_vote` on an AppendEntries); the panic ends the node's Raft core task while
//! the process keeps running, which the `convergence` checker then reports.
//! Missing libfaketime is a harness failure (exit 2, "install faketime"); nothing is installed.
//!
//! `lose-unsynced` is "kill with loss": nodes run with `--unsafe-lose-unsynced-on-kill`, which opens
//! the Raft log and the fractal engine's file through `ftkv_vfs::UnsyncedBufferVfs` (writes since
//! the last fdatasync stay in process memory), so the SIGKILL of the fault loses exactly what was
//! not fsynced, like a power cut; the stop restarts the node(s). The layer also gives every
//! fdatasync a simulated latency (10 ms by default, `--unsafe-lose-unsynced-sync-latency-ms`): the
//! test machines' disks sync in about 0.1 ms, which would leave almost no unsynced window to lose.
//! Targets: the whole cluster half of the time (a power cut of every node at once: the case that
//! loses acknowledged writes when a node acknowledges before fsync), else the leader or a random
//! node. Not covered: the sled engine (its own I/O), snapshot files (plain `std::fs`), lost
//! directory entries and torn writes (the `disk` nemesis corrupts tails). Plain `kill` keeps
//! unsynced data (page cache) unless the nodes run in this mode, which they do whenever
//! `lose-unsynced` is among the nemeses.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::jepsen::db::{Db, DbError};
use crate::jepsen::history::{Op, OpType, Process, Recorder};

/// Fault kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum NemesisKind {
    /// Network partitions (netns).
    Partition,
    /// SIGKILL and restart.
    Kill,
    /// SIGSTOP and SIGCONT.
    Pause,
    /// Clock skew of one node (libfaketime offset or rate).
    Clock,
    /// Log-segment corruption between kill and restart.
    Disk,
    /// Kill with loss of every write not yet fsynced (nodes run with
    /// `--unsafe-lose-unsynced-on-kill`).
    LoseUnsynced,
    /// Remove a node and add it back under a new id.
    Membership,
}

impl NemesisKind {
    /// Command-line name.
    pub fn name(&self) -> &'static str {
        match self {
            NemesisKind::Partition => "partition",
            NemesisKind::Kill => "kill",
            NemesisKind::Pause => "pause",
            NemesisKind::Clock => "clock",
            NemesisKind::Disk => "disk",
            NemesisKind::LoseUnsynced => "lose-unsynced",
            NemesisKind::Membership => "membership",
        }
    }

    /// Parses a comma-separated list (`partition,kill`); `none` or empty gives no fault.
    pub fn parse_list(text: &str) -> Result<Vec<NemesisKind>, String> {
        let mut out = Vec::new();
        for part in text
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty() && *s != "none")
        {
            let kind = match part {
                "partition" => NemesisKind::Partition,
                "kill" => NemesisKind::Kill,
                "pause" => NemesisKind::Pause,
                "clock" => NemesisKind::Clock,
                "disk" => NemesisKind::Disk,
                "lose-unsynced" => NemesisKind::LoseUnsynced,
                "membership" => NemesisKind::Membership,
                other => return Err(format!("unknown nemesis {other:?}")),
            };
            if !out.contains(&kind) {
                out.push(kind);
            }
        }
        Ok(out)
    }

    /// Why this fault cannot run on `db`, if it cannot.
    pub fn unsupported_reason(&self, substrate: crate::jepsen::db::SubstrateKind) -> Option<String> {
        match self {
            NemesisKind::Partition if substrate == crate::jepsen::db::SubstrateKind::Local => {
                Some("partitions need the netns substrate".into())
            }
            _ => None,
        }
    }
}

/// Who a fault hits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Target {
    /// A random member.
    Random,
    /// The current leader (random member when none is known).
    Leader,
    /// A random non-leader member.
    Follower,
    /// Every member.
    All,
    /// The node(s) cut off by the last `isolate-one`/`isolate-leader` partition (none once healed).
    Isolated,
    /// A fixed node id.
    Node(u64),
}

/// Partition shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PartitionShape {
    /// One random node alone.
    IsolateOne,
    /// The leader alone.
    IsolateLeader,
    /// Random majority/minority halves.
    Halves,
    /// a-b-c: b sees both, a and c do not see each other.
    Bridge,
}

/// Disk corruption modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DiskMode {
    /// Cut 1..4096 bytes off the newest segment.
    Truncate,
    /// Zero the last 4 KiB page of the newest segment.
    ZeroPage,
    /// Flip bits in a random 4 KiB block of the newest segment.
    Bitflip,
}

/// One fault with its parameters (resolved at run time: the leader is looked up then).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "kebab-case")]
pub enum Fault {
    /// SIGKILL `target`.
    Kill {
        /// Whom.
        target: Target,
    },
    /// SIGSTOP `target`.
    Pause {
        /// Whom.
        target: Target,
    },
    /// Partition.
    Partition {
        /// Shape.
        shape: PartitionShape,
    },
    /// Kill `target`, corrupt its newest log segment; restarted at stop.
    Disk {
        /// Whom.
        target: Target,
        /// How.
        mode: DiskMode,
    },
    /// Remove a node and add a fresh one under a new id.
    Membership,
    /// Skew `target`'s clock; reset to no skew at stop.
    Clock {
        /// Whom.
        target: Target,
        /// libfaketime offset spec (`+5s`, `-3s`, `+0 x1.5`).
        skew: String,
    },
    /// SIGKILL `target` losing what it had not fsynced; restarted at stop.
    LoseUnsynced {
        /// Whom.
        target: Target,
    },
}

/// Clock skews the random schedule draws from (libfaketime specs: offsets, and rates relative to
/// the process start).
pub const CLOCK_SKEWS: [&str; 7] = ["+5s", "-3s", "+30s", "-10s", "+1s", "+0 x1.5", "+0 x0.7"];

/// A libfaketime spec for an offset of `offset_ms` (`+1.500s`, `-0.250s`, `+0` for zero).
pub fn clock_offset_spec(offset_ms: i64) -> String {
    if offset_ms == 0 {
        return crate::jepsen::db::CLOCK_NO_SKEW.into();
    }
    let sign = if offset_ms < 0 { '-' } else { '+' };
    let abs = offset_ms.unsigned_abs();
    format!("{sign}{}.{:03}s", abs / 1000, abs % 1000)
}

impl Fault {
    /// The fault's kind.
    pub fn kind(&self) -> NemesisKind {
        match self {
            Fault::Kill { .. } => NemesisKind::Kill,
            Fault::Pause { .. } => NemesisKind::Pause,
            Fault::Partition { .. } => NemesisKind::Partition,
            Fault::Disk { .. } => NemesisKind::Disk,
            Fault::Membership => NemesisKind::Membership,
            Fault::Clock { .. } => NemesisKind::Clock,
            Fault::LoseUnsynced { .. } => NemesisKind::LoseUnsynced,
        }
    }

    /// A random fault of `kind`.
    pub fn random(kind: NemesisKind, rng: &mut StdRng) -> Option<Fault> {
        let t = match rng.gen_range(0..3) {
            0 => Target::Leader,
            _ => Target::Random,
        };
        Some(match kind {
            NemesisKind::Kill => Fault::Kill { target: t },
            NemesisKind::Pause => Fault::Pause { target: t },
            NemesisKind::Partition => Fault::Partition {
                shape: *[
                    PartitionShape::IsolateOne,
                    PartitionShape::IsolateLeader,
                    PartitionShape::Halves,
                    PartitionShape::Bridge,
                ]
                .choose(rng)?,
            },
            NemesisKind::Disk => Fault::Disk {
                target: Target::Random,
                mode: *[DiskMode::Truncate, DiskMode::ZeroPage, DiskMode::Bitflip].choose(rng)?,
            },
            NemesisKind::Membership => Fault::Membership,
            NemesisKind::Clock => Fault::Clock {
                target: t,
                skew: (*CLOCK_SKEWS.choose(rng)?).to_string(),
            },
            NemesisKind::LoseUnsynced => Fault::LoseUnsynced {
                target: if rng.gen_bool(0.5) { Target::All } else { t },
            },
        })
    }
}

/// One planned fault window: start `at_ms` after the run starts, stop `hold_ms` later.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Planned {
    /// Start, ms from the start of the run.
    pub at_ms: u64,
    /// Duration before the stop, ms.
    pub hold_ms: u64,
    /// The fault.
    pub fault: Fault,
}

/// Plans fault windows over `time_limit_ms`: a quiet gap of 2-6 s, a fault held 2-8 s (pauses
/// 1-15 s), repeated; faults drawn from `kinds`. Deterministic for a seed.
pub fn schedule(kinds: &[NemesisKind], time_limit_ms: u64, rng: &mut StdRng) -> Vec<Planned> {
    let usable: Vec<NemesisKind> = kinds.to_vec();
    let mut plan = Vec::new();
    if usable.is_empty() {
        return plan;
    }
    let mut t = 0u64;
    loop {
        t += rng.gen_range(2_000..6_000);
        let Some(&kind) = usable.choose(rng) else { break };
        let hold = match kind {
            NemesisKind::Pause => rng.gen_range(1_000..15_000),
            NemesisKind::Membership => 1_000,
            _ => rng.gen_range(2_000..8_000),
        };
        // Shorten the last window to fit; stop when not even a 1 s window fits.
        let hold = hold.min(time_limit_ms.saturating_sub(t + 1_000));
        if hold < 1_000 {
            break;
        }
        if let Some(fault) = Fault::random(kind, rng) {
            plan.push(Planned {
                at_ms: t,
                hold_ms: hold,
                fault,
            });
        }
        t += hold;
    }
    plan
}

/// What a started fault left behind, so that it can be stopped.
#[derive(Debug, Clone, PartialEq)]
pub enum Active {
    /// Killed nodes to restart.
    Killed(Vec<u64>),
    /// Paused nodes to resume.
    Paused(Vec<u64>),
    /// A partition to heal.
    Partitioned,
    /// Nodes whose clock to reset.
    ClockSkewed(Vec<u64>),
    /// Nothing to undo.
    Nothing,
}

/// Applies faults to the db and records them.
pub struct Nemesis {
    db: Arc<Db>,
    recorder: Recorder,
    rng: StdRng,
    isolated: Vec<u64>,
    /// Members this nemesis stopped (killed, or removed).
    stopped: std::collections::BTreeSet<u64>,
    /// Members found not running although nobody stopped them.
    crashed: std::collections::BTreeSet<u64>,
    crashes: Vec<Value>,
    /// Members whose log a disk fault corrupted since their last successful start.
    corrupted: std::collections::BTreeSet<u64>,
}

fn err_value(e: &DbError) -> Value {
    json!({"error": e.to_string()})
}

impl Nemesis {
    /// A nemesis over `db` recording into `recorder`, with its own seeded RNG.
    pub fn new(db: Arc<Db>, recorder: Recorder, rng: StdRng) -> Self {
        Nemesis {
            db,
            recorder,
            rng,
            isolated: Vec::new(),
            stopped: Default::default(),
            crashed: Default::default(),
            crashes: Vec::new(),
            corrupted: Default::default(),
        }
    }

    fn record(&self, op_type: OpType, f: &str, value: Value) {
        self.recorder
            .record(Op::new(Process::Nemesis, op_type, f, None, value));
    }

    async fn resolve(&mut self, target: &Target) -> Vec<u64> {
        let members = self.db.members();
        match target {
            Target::All => members,
            Target::Node(id) => vec![*id],
            Target::Isolated => self.isolated.clone(),
            Target::Leader => match self.db.leader().await {
                Some(l) => vec![l],
                None => members.choose(&mut self.rng).copied().into_iter().collect(),
            },
            Target::Follower => {
                let leader = self.db.leader().await;
                let f: Vec<u64> = members.iter().copied().filter(|m| Some(*m) != leader).collect();
                f.choose(&mut self.rng).copied().into_iter().collect()
            }
            Target::Random => members.choose(&mut self.rng).copied().into_iter().collect(),
        }
    }

    /// Unexpected node exits seen so far (a node not running that no fault stopped).
    pub fn crashes(&self) -> Vec<Value> {
        self.crashes.clone()
    }

    /// Records every member that is not running although nobody stopped it. A node whose log a
    /// disk fault corrupted may instead refuse to start (allowed: "recover every acknowledged
    /// write or refuse to start with a clear error"); it is then replaced by a fresh node under
    /// a new id, as an operator would.
    async fn detect_crashes(&mut self) {
        for id in self.db.members() {
            if self.db.is_running(id) {
                // Survived its restart after a disk fault: from now on an exit is a crash.
                if !self.stopped.contains(&id) {
                    self.corrupted.remove(&id);
                }
                continue;
            }
            if self.stopped.contains(&id) || self.crashed.contains(&id) {
                continue;
            }
            let log_tail = self
                .db
                .log_path(id)
                .ok()
                .and_then(|p| std::fs::read_to_string(p).ok())
                .map(|t| {
                    t.lines()
                        .rev()
                        .take(5)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n")
                })
                .unwrap_or_default();
            // The node's own error line (`ftkv-node: error: ...`), e.g. why it refused its log.
            let error_line = log_tail
                .lines()
                .rev()
                .find(|l| l.contains("ftkv-node: error"))
                .unwrap_or("")
                .to_string();
            let v = json!({
                "node": id,
                "at_ns": self.recorder.now_ns(),
                "error": error_line,
                "log_tail": log_tail,
            });
            if self.corrupted.remove(&id) {
                self.record(OpType::Info, "refused-to-start", v);
                self.stopped.insert(id);
                let replaced = self.replace_member(id).await;
                self.record(OpType::Info, "replace-refused-node", replaced);
                continue;
            }
            self.crashed.insert(id);
            self.record(OpType::Info, "crash-detected", v.clone());
            self.crashes.push(v);
        }
    }

    fn kill_node(&mut self, id: u64) -> Result<(), DbError> {
        self.stopped.insert(id);
        self.db.kill(id)
    }

    fn restart_node(&mut self, id: u64) -> Result<(), DbError> {
        let r = self.db.restart(id);
        if r.is_ok() {
            self.stopped.remove(&id);
            self.crashed.remove(&id);
        }
        r
    }

    /// Starts `fault`; records `start-<kind>` invoke and info. Returns what to undo.
    pub async fn start(&mut self, fault: &Fault) -> Active {
        self.detect_crashes().await;
        let f = format!("start-{}", fault.kind().name());
        self.record(
            OpType::Invoke,
            &f,
            serde_json::to_value(fault).unwrap_or(Value::Null),
        );
        let (active, value) = match fault {
            Fault::Kill { target } => {
                let nodes = self.resolve(target).await;
                let mut done = Vec::new();
                let mut errors = Vec::new();
                for &n in &nodes {
                    match self.kill_node(n) {
                        Ok(()) => done.push(n),
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                (
                    Active::Killed(done.clone()),
                    json!({"killed": done, "errors": errors}),
                )
            }
            Fault::Pause { target } => {
                let nodes = self.resolve(target).await;
                let mut done = Vec::new();
                for &n in &nodes {
                    if self.db.pause(n).is_ok() {
                        done.push(n);
                    }
                }
                (Active::Paused(done.clone()), json!({"paused": done}))
            }
            Fault::Partition { shape } => {
                let groups = self.partition_groups(*shape).await;
                match self.db.partition(&groups) {
                    Ok(()) => {
                        self.isolated = match shape {
                            PartitionShape::IsolateOne | PartitionShape::IsolateLeader => {
                                groups.first().cloned().unwrap_or_default()
                            }
                            _ => Vec::new(),
                        };
                        (Active::Partitioned, json!({"groups": groups}))
                    }
                    Err(e) => (Active::Nothing, err_value(&e)),
                }
            }
            Fault::Disk { target, mode } => {
                let nodes = self.resolve(target).await;
                let mut value = json!({});
                let mut killed = Vec::new();
                if let Some(&n) = nodes.first() {
                    match self.kill_node(n) {
                        Ok(()) => {
                            killed.push(n);
                            self.corrupted.insert(n);
                            let corrupted = self
                                .db
                                .data_dir(n)
                                .map_err(|e| e.to_string())
                                .and_then(|d| corrupt_newest_segment(&d, *mode, &mut self.rng));
                            value = json!({"node": n, "mode": mode, "result": match corrupted {
                                Ok(s) => s,
                                Err(e) => format!("not corrupted: {e}"),
                            }});
                        }
                        Err(e) => value = err_value(&e),
                    }
                }
                (Active::Killed(killed), value)
            }
            Fault::Membership => (Active::Nothing, self.replace_a_member().await),
            Fault::Clock { target, skew } => {
                let nodes = self.resolve(target).await;
                let mut done = Vec::new();
                let mut errors = Vec::new();
                for &n in &nodes {
                    match self.db.set_clock(n, skew) {
                        Ok(()) => done.push(n),
                        Err(e) => errors.push(format!("node {n}: {e}")),
                    }
                }
                (
                    Active::ClockSkewed(done.clone()),
                    json!({"skewed": done, "skew": skew, "errors": errors}),
                )
            }
            Fault::LoseUnsynced { target } => {
                let nodes = self.resolve(target).await;
                let mut done = Vec::new();
                let mut errors = Vec::new();
                if !self.db.loses_unsynced_on_kill() {
                    errors.push(format!(
                        "nodes do not run with {}: this kill keeps unsynced writes",
                        crate::jepsen::db::LOSE_UNSYNCED_FLAG
                    ));
                }
                for &n in &nodes {
                    match self.kill_node(n) {
                        Ok(()) => done.push(n),
                        Err(e) => errors.push(e.to_string()),
                    }
                }
                (
                    Active::Killed(done.clone()),
                    json!({"killed": done, "lost": "writes not yet fsynced", "errors": errors}),
                )
            }
        };
        self.record(OpType::Info, &f, value);
        active
    }

    /// Undoes `active`; records `stop-<kind>` invoke and info.
    pub async fn stop(&mut self, kind: NemesisKind, active: Active) {
        self.detect_crashes().await;
        let f = format!("stop-{}", kind.name());
        self.record(OpType::Invoke, &f, Value::Null);
        // Restarted nodes to watch for a refusal to start (disk faults).
        let mut settle: Vec<u64> = Vec::new();
        let value = match active {
            Active::Killed(nodes) => {
                let mut restarted = Vec::new();
                let mut errors = Vec::new();
                for n in nodes {
                    match self.restart_node(n) {
                        Ok(()) => restarted.push(n),
                        Err(e) => errors.push(format!("node {n}: {e}")),
                    }
                }
                settle.clone_from(&restarted);
                json!({"restarted": restarted, "errors": errors})
            }
            Active::Paused(nodes) => {
                for &n in &nodes {
                    let _ = self.db.resume(n);
                }
                json!({"resumed": nodes})
            }
            Active::Partitioned => match self.db.heal() {
                Ok(()) => {
                    self.isolated.clear();
                    json!("healed")
                }
                Err(e) => err_value(&e),
            },
            Active::ClockSkewed(nodes) => {
                let mut reset = Vec::new();
                let mut errors = Vec::new();
                for n in nodes {
                    match self.db.set_clock(n, crate::jepsen::db::CLOCK_NO_SKEW) {
                        Ok(()) => reset.push(n),
                        Err(e) => errors.push(format!("node {n}: {e}")),
                    }
                }
                json!({"reset": reset, "errors": errors})
            }
            Active::Nothing => Value::Null,
        };
        self.record(OpType::Info, &f, value);
        self.settle_after_disk_fault(&settle).await;
    }

    /// After restarting nodes whose log a disk fault corrupted: waits (up to 20 s in all) until
    /// each serves `Status` or exits, so that a refusal to start is recorded with the node's error
    /// line and the node replaced at once, not at the next fault.
    async fn settle_after_disk_fault(&mut self, nodes: &[u64]) {
        let watch: Vec<u64> = nodes
            .iter()
            .copied()
            .filter(|n| self.corrupted.contains(n))
            .collect();
        if watch.is_empty() {
            return;
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        for id in watch {
            let Ok(ep) = self.db.endpoint(id) else { continue };
            while std::time::Instant::now() < deadline && self.db.is_running(id) {
                if crate::jepsen::db::status(&ep, false, Duration::from_millis(500))
                    .await
                    .is_ok()
                {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        self.detect_crashes().await;
    }

    /// Node(s) isolated by the current `isolate-*` partition.
    pub fn isolated(&self) -> Vec<u64> {
        self.isolated.clone()
    }

    /// Final heal: heal partitions, resume every member, start every member not running.
    pub async fn heal_all(&mut self) {
        self.detect_crashes().await;
        self.record(OpType::Invoke, "heal-all", Value::Null);
        let _ = self.db.heal();
        self.isolated.clear();
        if self.db.fakes_clock() {
            for id in self.db.members() {
                let _ = self.db.set_clock(id, crate::jepsen::db::CLOCK_NO_SKEW);
            }
        }
        let mut started = Vec::new();
        for id in self.db.members() {
            let _ = self.db.resume(id);
            if !self.db.is_running(id) && self.restart_node(id).is_ok() {
                started.push(id);
            }
        }
        self.record(OpType::Info, "heal-all", json!({"started": started}));
        self.settle_after_disk_fault(&started).await;
    }

    async fn partition_groups(&mut self, shape: PartitionShape) -> Vec<Vec<u64>> {
        let mut members = self.db.members();
        members.shuffle(&mut self.rng);
        match shape {
            PartitionShape::IsolateOne => {
                let one = members.pop().unwrap_or_default();
                vec![vec![one], members]
            }
            PartitionShape::IsolateLeader => {
                let leader = self
                    .db
                    .leader()
                    .await
                    .unwrap_or_else(|| members.first().copied().unwrap_or_default());
                let rest: Vec<u64> = members.into_iter().filter(|&m| m != leader).collect();
                vec![vec![leader], rest]
            }
            PartitionShape::Halves => {
                let cut = members.len() / 2;
                let minority = members.split_off(members.len() - cut);
                vec![members, minority]
            }
            PartitionShape::Bridge => {
                // a-b-c as overlapping groups: a and c both see b, not each other.
                if members.len() < 3 {
                    return vec![members];
                }
                let (a, b, c) = (members[0], members[1], members[2]);
                vec![vec![a, b], vec![b, c]]
            }
        }
    }

    /// Removes a random non-leader member, wipes it, starts a fresh node under a new id, adds it
    /// as learner and promotes it.
    async fn replace_a_member(&mut self) -> Value {
        let victims = self.resolve(&Target::Follower).await;
        let Some(&old) = victims.first() else {
            return json!({"error": "no follower to replace"});
        };
        self.replace_member(old).await
    }

    /// Removes member `old` from the cluster, stops and wipes it, starts a fresh node under a new
    /// id, adds it as learner and promotes it. Returns what happened.
    async fn replace_member(&mut self, old: u64) -> Value {
        let client = match ftkv_client::Client::builder()
            .endpoints(self.db.endpoints())
            .build()
            .await
        {
            Ok(c) => c,
            Err(e) => return json!({"error": format!("client: {e}")}),
        };
        if let Err(e) = client.remove(old).await {
            return json!({"error": format!("remove {old}: {e}")});
        }
        let _ = self.kill_node(old);
        let _ = self.db.wipe(old);
        let (new, client_ep, peer_ep) = match self.db.add_node() {
            Ok(x) => x,
            Err(e) => return json!({"removed": old, "error": format!("add node: {e}")}),
        };
        self.db.replace_member(old, new);
        if let Err(e) = client.add_learner(new, &client_ep, &peer_ep).await {
            return json!({"removed": old, "added": new, "error": format!("add learner: {e}")});
        }
        // Give the learner time to catch up, then promote (retry: promotion may wait for catch-up).
        let mut last_error = String::new();
        for _ in 0..30 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            match client.promote(new).await {
                Ok(_) => return json!({"removed": old, "added": new, "endpoint": client_ep}),
                Err(e) => last_error = e.to_string(),
            }
        }
        json!({"removed": old, "added": new, "error": format!("promote: {last_error}")})
    }
}

/// The newest `*.seg` file under `data_dir/log`.
pub fn newest_segment(data_dir: &Path) -> Result<PathBuf, String> {
    let dir = data_dir.join("log");
    let mut segs: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    segs.pop()
        .ok_or_else(|| format!("no segment in {}", dir.display()))
}

/// Corrupts the newest log segment of a stopped node; returns what was done.
pub fn corrupt_newest_segment(data_dir: &Path, mode: DiskMode, rng: &mut StdRng) -> Result<String, String> {
    let path = newest_segment(data_dir)?;
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len == 0 {
        return Err(format!("{} is empty", path.display()));
    }
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    match mode {
        DiskMode::Truncate => {
            let cut = rng.gen_range(1..=4096u64).min(len);
            file.set_len(len - cut).map_err(|e| e.to_string())?;
            Ok(format!(
                "truncated {name} by {cut} bytes ({len} -> {})",
                len - cut
            ))
        }
        DiskMode::ZeroPage => {
            let start = len.saturating_sub(4096);
            file.seek(SeekFrom::Start(start)).map_err(|e| e.to_string())?;
            file.write_all(&vec![0u8; (len - start) as usize])
                .map_err(|e| e.to_string())?;
            file.sync_all().map_err(|e| e.to_string())?;
            Ok(format!("zeroed {name} bytes {start}..{len}"))
        }
        DiskMode::Bitflip => {
            let blocks = len.div_ceil(4096);
            let block = rng.gen_range(0..blocks);
            let start = block * 4096;
            let size = (len - start).min(4096) as usize;
            let mut buf = vec![0u8; size];
            file.seek(SeekFrom::Start(start)).map_err(|e| e.to_string())?;
            file.read_exact(&mut buf).map_err(|e| e.to_string())?;
            let flips = rng.gen_range(1..=8);
            for _ in 0..flips {
                let i = rng.gen_range(0..size);
                buf[i] ^= 1 << rng.gen_range(0..8);
            }
            file.seek(SeekFrom::Start(start)).map_err(|e| e.to_string())?;
            file.write_all(&buf).map_err(|e| e.to_string())?;
            file.sync_all().map_err(|e| e.to_string())?;
            Ok(format!(
                "flipped {flips} bit(s) in {name} block {block} (bytes {start}..{})",
                start + size as u64
            ))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn parse_list_accepts_names_and_rejects_unknown() {
        assert_eq!(
            NemesisKind::parse_list("partition, kill,pause,kill").unwrap(),
            vec![NemesisKind::Partition, NemesisKind::Kill, NemesisKind::Pause]
        );
        assert_eq!(NemesisKind::parse_list("none").unwrap(), vec![]);
        assert!(NemesisKind::parse_list("meteor").is_err());
    }

    #[test]
    fn schedule_is_seeded_bounded_and_draws_every_kind() {
        let kinds = [NemesisKind::Kill, NemesisKind::Pause, NemesisKind::Clock];
        let a = schedule(&kinds, 60_000, &mut StdRng::seed_from_u64(1));
        let b = schedule(&kinds, 60_000, &mut StdRng::seed_from_u64(1));
        assert_eq!(a, b);
        assert!(!a.is_empty());
        let mut end = 0;
        for p in &a {
            assert!(p.at_ms >= end, "windows overlap");
            end = p.at_ms + p.hold_ms;
            assert!(end < 60_000);
            assert!(kinds.contains(&p.fault.kind()), "{:?}", p.fault);
        }
        assert!(schedule(&[], 60_000, &mut StdRng::seed_from_u64(1)).is_empty());
    }

    #[test]
    fn clock_and_lose_unsynced_faults_are_drawn_with_valid_parameters() {
        let plan = schedule(&[NemesisKind::Clock], 300_000, &mut StdRng::seed_from_u64(2));
        assert!(plan.len() > 10);
        let mut skews = std::collections::BTreeSet::new();
        for p in &plan {
            let Fault::Clock { skew, .. } = &p.fault else {
                panic!("not a clock fault: {:?}", p.fault)
            };
            assert!(CLOCK_SKEWS.contains(&skew.as_str()), "{skew}");
            skews.insert(skew.clone());
        }
        assert!(
            skews.iter().any(|s| s.starts_with('-')),
            "no backwards skew in {skews:?}"
        );
        let plan = schedule(
            &[NemesisKind::LoseUnsynced],
            300_000,
            &mut StdRng::seed_from_u64(2),
        );
        let all = plan
            .iter()
            .filter(|p| matches!(p.fault, Fault::LoseUnsynced { target: Target::All }))
            .count();
        assert!(plan.iter().all(|p| p.fault.kind() == NemesisKind::LoseUnsynced));
        assert!(
            all > 0 && all < plan.len(),
            "{all} of {} whole-cluster kills",
            plan.len()
        );
        assert_eq!(
            NemesisKind::Clock.unsupported_reason(crate::jepsen::db::SubstrateKind::Local),
            None
        );
        assert_eq!(
            NemesisKind::LoseUnsynced.unsupported_reason(crate::jepsen::db::SubstrateKind::Local),
            None
        );
    }

    #[test]
    fn clock_offset_specs_are_libfaketime_offsets() {
        assert_eq!(clock_offset_spec(0), "+0");
        assert_eq!(clock_offset_spec(1500), "+1.500s");
        assert_eq!(clock_offset_spec(-250), "-0.250s");
        assert_eq!(clock_offset_spec(-3000), "-3.000s");
    }

    #[test]
    fn disk_corruption_modes_change_the_newest_segment_only() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("log");
        std::fs::create_dir_all(&log).unwrap();
        let old = log.join("00000000000000000001.seg");
        let new = log.join("00000000000000000002.seg");
        std::fs::write(&old, vec![7u8; 10_000]).unwrap();
        let mut rng = StdRng::seed_from_u64(3);
        std::fs::write(&new, vec![7u8; 10_000]).unwrap();
        corrupt_newest_segment(dir.path(), DiskMode::Truncate, &mut rng).unwrap();
        let len = std::fs::metadata(&new).unwrap().len();
        assert!((10_000 - 4096..10_000).contains(&len));
        std::fs::write(&new, vec![7u8; 10_000]).unwrap();
        corrupt_newest_segment(dir.path(), DiskMode::ZeroPage, &mut rng).unwrap();
        let bytes = std::fs::read(&new).unwrap();
        assert!(
            bytes[10_000 - 4096..].iter().all(|&b| b == 0) && bytes[..10_000 - 4096].iter().all(|&b| b == 7)
        );
        std::fs::write(&new, vec![7u8; 10_000]).unwrap();
        corrupt_newest_segment(dir.path(), DiskMode::Bitflip, &mut rng).unwrap();
        let bytes = std::fs::read(&new).unwrap();
        assert!(bytes.iter().any(|&b| b != 7));
        assert_eq!(std::fs::read(&old).unwrap(), vec![7u8; 10_000]);
    }
}
