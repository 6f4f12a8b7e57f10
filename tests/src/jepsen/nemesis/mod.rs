//! Nemeses: the faults, as ops in the history (`process: "nemesis"`, `f: "start-<fault>"` and
//! `"stop-<fault>"`, each an `invoke` followed by an `info` saying what was done), and the
//! seeded schedule that starts and stops them.
//!
//! Faults (Jepsen names): `kill` (SIGKILL, then restart), `pause` (SIGSTOP/SIGCONT), `partition`
//! (isolate one node, isolate the leader, random halves, a bridge a-b-c; netns only), `disk`
//! (between kill and restart: truncate by 1..4096 bytes, zero the last 4 KiB page, or flip bits
//! in a random 4 KiB block of the newest log segment, or of the header or the body of the
//! snapshot file `snapshots/current.snap`; see [`disk`]), `membership` (remove a follower, wipe
//! it, add a fresh node under a new id as learner, promote it; then count the members the cluster
//! actually has, see [`membership`]), `clock` and `lose-unsynced`. Scenario-only faults: `remove`
//! and `add` of a chosen member, `isolate-follower` partitions.
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

mod disk;
mod fault;
mod membership;

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde_json::{json, Value};

use crate::jepsen::db::{Db, DbError};
use crate::jepsen::history::{Op, OpType, Process, Recorder};

pub use disk::{
    corrupt, corrupt_newest_segment, newest_segment, snapshot_file, snapshot_header_len, DiskFile, DiskMode,
};
pub use fault::{
    clock_offset_spec, schedule, Fault, NemesisKind, PartitionShape, Planned, Target, CLOCK_SKEWS,
};

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
    /// A membership change was attempted (the final heal reads the membership back).
    membership_changed: bool,
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
            membership_changed: false,
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
                            PartitionShape::IsolateOne
                            | PartitionShape::IsolateLeader
                            | PartitionShape::IsolateFollower => groups.first().cloned().unwrap_or_default(),
                            _ => Vec::new(),
                        };
                        (Active::Partitioned, json!({"groups": groups}))
                    }
                    Err(e) => (Active::Nothing, err_value(&e)),
                }
            }
            Fault::Disk { target, mode, file } => {
                let nodes = self.resolve(target).await;
                let mut value = json!({});
                let mut killed = Vec::new();
                if let Some(&n) = nodes.first() {
                    match self.kill_node(n) {
                        Ok(()) => {
                            killed.push(n);
                            self.corrupted.insert(n);
                            let (file, corrupted) = match self.db.data_dir(n) {
                                Ok(d) => {
                                    // No snapshot yet (none was taken): damage the log instead.
                                    let file = if *file != DiskFile::Log && !snapshot_file(&d).is_file() {
                                        DiskFile::Log
                                    } else {
                                        *file
                                    };
                                    (file, corrupt(&d, file, *mode, &mut self.rng))
                                }
                                Err(e) => (*file, Err(e.to_string())),
                            };
                            value = json!({"node": n, "mode": mode, "file": file.name(), "result": match corrupted {
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
            Fault::Remove { target } => {
                let value = match self.resolve(target).await.first() {
                    Some(&n) => self.remove_member(n).await,
                    None => json!({"error": format!("no member for target {target:?}")}),
                };
                (Active::Nothing, value)
            }
            Fault::Add { promote } => (Active::Nothing, self.add_member(*promote).await),
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
                if self
                    .db
                    .status(&ep, false, Duration::from_millis(500))
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
        // After membership changes, count the members the cluster actually has (a change whose
        // outcome was unknown may have finished since).
        if self.membership_changed {
            let synced = self.sync_membership().await;
            self.record(OpType::Info, "membership-read-back", synced);
        }
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
            PartitionShape::IsolateFollower => {
                let leader = self.db.leader().await;
                let Some(one) = members.iter().copied().find(|&m| Some(m) != leader) else {
                    return vec![members];
                };
                let rest: Vec<u64> = members.into_iter().filter(|&m| m != one).collect();
                vec![vec![one], rest]
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
}
