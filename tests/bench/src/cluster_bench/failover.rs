//! `ftkv-bench failover`: kill -9 of the leader under put load, the time until writes succeed
//! again and the killed node's catch-up once restarted (issue 19, workload 7).
//!
//! `ftkv-bench failover --targets ftkv,etcd --clients 32 --runs 3 --out DIR`
//!
//! Each round starts every target once, in the order given, as a three-node cluster and puts
//! from `clients` tasks (one put in flight each, every acknowledgement timed). After `settle`
//! it finds the leader (ftkv: `Cluster.Status` of every node, the node's process by its `--id`
//! among the playground's children; etcd: `Maintenance.Status` of every member, the member's
//! process), SIGKILLs it, waits for a new leader and `clients` more acknowledged puts, leaves
//! it down for `down`, then starts it again with its own command line ([`super::procs`]) and waits until
//! its applied index reaches the leader's commit index read just before the restart
//! (ftkv: `applied_index` and `commit_index`; etcd: `raftAppliedIndex` and `raftIndex`). After
//! another `settle` the load stops.
//!
//! Figures per run: the write pause (the longest gap between two consecutive acknowledgements
//! from the kill until the restart, [`crate::restart::longest_gap`], as `ftkv-bench restart`
//! measures pauses; not only the gap spanning the kill instant, since followers may still
//! acknowledge a few puts the dead leader had committed), the steady-state longest gap before
//! the kill, the catch-up time (restart until caught up) and the longest gap while the node
//! caught up. Results: `DIR/results.json` (every run with a
//! 100 ms series of acknowledged puts/s and p99, medians per target, the first target's median
//! over each other one's), `DIR/summary.json`, and per target and run
//! `DIR/over_time_<target>_run<r>.svg` and `DIR/latency_<target>_run<r>.svg` with the kill and
//! the restart drawn as vertical lines.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::etcd_ops::EtcdOps;
use super::procs::{self, ProcSpec, Restarted};
use super::{key_of, ratios_over_first, Cluster, Started};
use crate::restart::longest_gap;
use crate::summary::{command_line, machine_line, Summary, SummaryRow};
use crate::{plot, Target};

/// `ftkv-bench failover` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct FailoverArgs {
    /// Comma-separated targets: ftkv, ftkv-sled, etcd, ftkv@DIR, ftkv-sled@DIR.
    #[arg(long, default_value = "ftkv,etcd")]
    pub targets: String,
    /// Concurrent writers (one put in flight each).
    #[arg(long, default_value_t = 32)]
    pub clients: u64,
    /// Rounds; each round runs every target once.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Load before the kill and after the catch-up.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub settle: Duration,
    /// How long the killed node stays down once writes resumed.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub down: Duration,
    /// Value size, bytes.
    #[arg(long, default_value_t = 100)]
    pub value_size: usize,
    /// Distinct keys.
    #[arg(long, default_value_t = 1_000_000)]
    pub key_space: u64,
    /// Bound of each wait (writes resuming, catch-up).
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Output directory.
    #[arg(long, default_value = "store/bench-failover")]
    pub out: PathBuf,
    /// First port; target i of a round uses 20 ports from base + 20 i.
    #[arg(long, default_value_t = 24300)]
    pub base_port: u16,
    /// RNG seed of the writers.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
}

/// 100 ms of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Bin {
    /// Start of the bin since the load started, s.
    pub t_s: f64,
    /// Puts acknowledged in it, per second.
    pub puts_per_sec: f64,
    /// 99th percentile latency of those puts, ms (0 when none).
    pub p99_ms: f64,
}

/// One kill and restart.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverRun {
    /// Target name as given.
    pub target: String,
    /// Round (1-based).
    pub run: u64,
    /// The killed leader (ftkv: node id; etcd: member index).
    pub killed: String,
    /// The leader after the kill.
    pub new_leader: String,
    /// Longest acknowledgement gap from the kill until the restart, ms.
    pub write_pause_ms: f64,
    /// Longest acknowledgement gap before the kill, ms.
    pub steady_gap_ms: f64,
    /// From the restart until the node applied the leader's commit index, ms.
    pub catch_up_ms: f64,
    /// The index it had to reach.
    pub catch_up_index: u64,
    /// Longest acknowledgement gap while it caught up, ms.
    pub catch_up_gap_ms: f64,
    /// Puts acknowledged over the run.
    pub acked: u64,
    /// Failed put attempts.
    pub errors: u64,
    /// Kill, restart and caught-up times since the load started, s.
    pub kill_at_s: f64,
    /// Restart time, s.
    pub restart_at_s: f64,
    /// Caught-up time, s.
    pub caught_up_at_s: f64,
    /// Acknowledged puts/s and p99 per 100 ms.
    pub bins: Vec<Bin>,
}

/// Medians over the rounds of one target.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverMedian {
    /// Target name as given.
    pub target: String,
    /// Rounds the median is over.
    pub runs: usize,
    /// Write pause, ms.
    pub write_pause_ms: f64,
    /// Catch-up, ms.
    pub catch_up_ms: f64,
    /// Steady-state longest gap, ms.
    pub steady_gap_ms: f64,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    command: String,
    clients: u64,
    settle_s: f64,
    down_s: f64,
    targets: Vec<String>,
    runs: Vec<FailoverRun>,
    medians: Vec<FailoverMedian>,
    /// The first target's median over each other one's (below 1: the first is faster).
    ratios_write_pause: Vec<(String, f64)>,
    ratios_catch_up: Vec<(String, f64)>,
}

/// The put load: every acknowledgement's time and latency.
struct AckLoad {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicU64>,
    errors: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<Vec<(Instant, u32)>>>,
}

impl AckLoad {
    fn start(target: &Target, args: &FailoverArgs, run: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (acked, errors) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let tasks = (0..args.clients)
            .map(|task| {
                let (target, stop, acked, errors) =
                    (target.clone(), stop.clone(), acked.clone(), errors.clone());
                let (key_space, size) = (args.key_space, args.value_size);
                let seed = args.seed.wrapping_add(run) ^ (task + 1).wrapping_mul(0x9E37_79B9);
                tokio::spawn(async move {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                    let mut acks = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let mut value = vec![0u8; size];
                        rng.fill(&mut value[..size / 2]);
                        let t = Instant::now();
                        match super::put(&target, key_of(rng.gen_range(0..key_space)), value).await {
                            Ok(()) => {
                                let now = Instant::now();
                                acks.push((now, u32::try_from((now - t).as_micros()).unwrap_or(u32::MAX)));
                                acked.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                tokio::time::sleep(Duration::from_millis(10)).await;
                            }
                        }
                    }
                    acks
                })
            })
            .collect();
        Self {
            stop,
            acked,
            errors,
            tasks,
        }
    }

    fn acked(&self) -> u64 {
        self.acked.load(Ordering::Relaxed)
    }

    /// Stops the writers; every acknowledgement `(time, latency µs)`, by time, and the errors.
    async fn stop(self) -> (Vec<(Instant, u32)>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        for t in self.tasks {
            if let Ok(acks) = t.await {
                all.extend(acks);
            }
        }
        all.sort_by_key(|a| a.0);
        (all, self.errors.load(Ordering::Relaxed))
    }
}

/// Which node leads, how far each has applied, and its process: over the target's own status API.
enum Probe {
    Ftkv(ftkv_client::Client, Vec<String>, Vec<u32>),
    Etcd(EtcdOps, Vec<u32>),
}

impl Probe {
    fn new(started: &Started) -> anyhow::Result<Self> {
        Ok(match (&started.target, &started.cluster) {
            (Target::Ftkv(c), _) => {
                Probe::Ftkv(c.clone(), started.endpoints.clone(), started.server_pids.clone())
            }
            (Target::Etcd(_), Cluster::Etcd(cluster)) => {
                Probe::Etcd(EtcdOps::connect(&started.endpoints)?, cluster.pids())
            }
            _ => anyhow::bail!("{}: target and cluster disagree", started.name),
        })
    }

    /// The leader's node index (ftkv: node id - 1; etcd: member index) and commit index.
    async fn leader(&self) -> Option<(usize, u64)> {
        match self {
            Probe::Ftkv(client, endpoints, _) => {
                let mut best: Option<(u64, usize, u64)> = None;
                for (_, s) in client.status_all().await {
                    let Ok(s) = s else { continue };
                    let Some(index) = usize::try_from(s.node_id).ok().and_then(|i| i.checked_sub(1)) else {
                        continue;
                    };
                    if s.is_leader && index < endpoints.len() && best.is_none_or(|b| s.term > b.0) {
                        best = Some((s.term, index, s.commit_index));
                    }
                }
                best.map(|(_, i, c)| (i, c))
            }
            Probe::Etcd(ops, _) => {
                for i in 0..ops.members() {
                    if let Ok(s) = ops.status(i).await {
                        if s.is_leader() {
                            return Some((i, s.commit_index));
                        }
                    }
                }
                None
            }
        }
    }

    /// Node `index`'s applied index, when it answers.
    async fn applied(&self, index: usize) -> Option<u64> {
        match self {
            Probe::Ftkv(client, endpoints, _) => client
                .status(endpoints.get(index)?)
                .await
                .ok()
                .map(|s| s.applied_index),
            Probe::Etcd(ops, _) => ops.status(index).await.ok().map(|s| s.applied_index),
        }
    }

    /// Node `index`'s process.
    fn pid(&self, index: usize) -> anyhow::Result<u32> {
        match self {
            Probe::Ftkv(_, _, pids) => procs::find_with_arg(pids, &format!("--id={}", index + 1))
                .ok_or_else(|| anyhow::anyhow!("no ftkv-node process with --id={}", index + 1)),
            Probe::Etcd(_, pids) => pids
                .get(index)
                .copied()
                .ok_or_else(|| anyhow::anyhow!("no etcd member {index}")),
        }
    }

    fn label(&self, index: usize) -> String {
        match self {
            Probe::Ftkv(..) => format!("node {}", index + 1),
            Probe::Etcd(..) => format!("member {index}"),
        }
    }

    /// Waits up to `timeout` for a leader other than `not`.
    async fn new_leader(&self, not: usize, timeout: Duration) -> anyhow::Result<(usize, u64)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some((i, c)) = self.leader().await {
                if i != not {
                    return Ok((i, c));
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "no new leader within {timeout:?}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Waits up to `timeout` until `load` acknowledged `count` more puts than `from`.
async fn wait_acked(load: &AckLoad, from: u64, count: u64, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while load.acked() < from + count {
        anyhow::ensure!(
            Instant::now() < deadline,
            "writes did not resume within {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(())
}

/// Waits up to `timeout` until node `index` applied `target`; returns when it did.
async fn wait_caught_up(
    probe: &Probe,
    node: &mut Restarted,
    index: usize,
    target: u64,
    timeout: Duration,
) -> anyhow::Result<Instant> {
    let deadline = Instant::now() + timeout;
    loop {
        if probe.applied(index).await.is_some_and(|a| a >= target) {
            return Ok(Instant::now());
        }
        anyhow::ensure!(node.is_running(), "the restarted {} exited", probe.label(index));
        anyhow::ensure!(
            Instant::now() < deadline,
            "{} did not reach index {target} within {timeout:?}",
            probe.label(index)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The moments of one kill and restart.
struct Timeline {
    start: Instant,
    kill: Instant,
    restart: Instant,
    caught_up: Instant,
}

/// One kill and restart against a started target.
async fn run_target(started: &Started, args: &FailoverArgs, run: u64) -> anyhow::Result<FailoverRun> {
    let probe = Probe::new(started)?;
    let load = AckLoad::start(&started.target, args, run);
    let start = Instant::now();
    tokio::time::sleep(args.settle).await;
    let (leader, _) = probe.new_leader(usize::MAX, args.timeout).await?;
    let pid = probe.pid(leader)?;
    let spec = ProcSpec::of(pid)?;
    eprintln!(
        "   {} run {run}: kill -9 {} (pid {pid}, leader)",
        started.name,
        probe.label(leader)
    );
    let kill = Instant::now();
    procs::kill9(pid).await?;
    let (new_leader, _) = probe.new_leader(leader, args.timeout).await?;
    wait_acked(&load, load.acked(), args.clients, args.timeout).await?;
    eprintln!(
        "   {} run {run}: writes resumed after {:.0} ms, leader {}",
        started.name,
        kill.elapsed().as_secs_f64() * 1000.0,
        probe.label(new_leader)
    );
    tokio::time::sleep(args.down).await;
    let (_, target_index) = probe.new_leader(leader, args.timeout).await?;
    let log = args
        .out
        .join(format!("restarted_{}_run{run}.log", file_safe(&started.name)));
    let restart = Instant::now();
    let mut node = Restarted::start(&spec, &log)?;
    let caught_up = wait_caught_up(&probe, &mut node, leader, target_index, args.timeout).await?;
    eprintln!(
        "   {} run {run}: {} restarted, applied index {target_index} after {:.0} ms",
        started.name,
        probe.label(leader),
        (caught_up - restart).as_secs_f64() * 1000.0
    );
    tokio::time::sleep(args.settle).await;
    let (acks, errors) = load.stop().await;
    drop(node);
    let t = Timeline {
        start,
        kill,
        restart,
        caught_up,
    };
    Ok(figures(
        started,
        run,
        &probe,
        (leader, new_leader, target_index),
        &t,
        &acks,
        errors,
    ))
}

fn figures(
    started: &Started,
    run: u64,
    probe: &Probe,
    (leader, new_leader, index): (usize, usize, u64),
    t: &Timeline,
    acks: &[(Instant, u32)],
    errors: u64,
) -> FailoverRun {
    let times: Vec<Instant> = acks.iter().map(|a| a.0).collect();
    let before_kill: Vec<Instant> = times.iter().copied().filter(|&a| a < t.kill).collect();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let since = |i: Instant| (i - t.start).as_secs_f64();
    FailoverRun {
        target: started.name.clone(),
        run,
        killed: probe.label(leader),
        new_leader: probe.label(new_leader),
        write_pause_ms: ms(longest_gap(&times, t.kill, t.restart)),
        steady_gap_ms: ms(longest_gap(
            &before_kill,
            t.start + Duration::from_secs(1).min(t.kill - t.start),
            t.kill,
        )),
        catch_up_ms: ms(t.caught_up - t.restart),
        catch_up_index: index,
        catch_up_gap_ms: ms(longest_gap(&times, t.restart, t.caught_up)),
        acked: acks.len() as u64,
        errors,
        kill_at_s: since(t.kill),
        restart_at_s: since(t.restart),
        caught_up_at_s: since(t.caught_up),
        bins: bins(acks, t.start),
    }
}

/// Acknowledged puts/s and p99 latency per 100 ms from `start`.
fn bins(acks: &[(Instant, u32)], start: Instant) -> Vec<Bin> {
    let Some(last) = acks.last() else {
        return Vec::new();
    };
    let n = usize::try_from((last.0 - start).as_millis() / 100).unwrap_or(0) + 1;
    let mut lat: Vec<Vec<u32>> = vec![Vec::new(); n];
    for (at, us) in acks {
        let b = usize::try_from((*at - start).as_millis() / 100).unwrap_or(0);
        if let Some(v) = lat.get_mut(b) {
            v.push(*us);
        }
    }
    lat.into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            v.sort_unstable();
            let p99 = v
                .get((v.len() * 99).div_ceil(100).saturating_sub(1))
                .copied()
                .unwrap_or(0);
            Bin {
                t_s: i as f64 / 10.0,
                puts_per_sec: v.len() as f64 * 10.0,
                p99_ms: f64::from(p99) / 1000.0,
            }
        })
        .collect()
}

fn file_safe(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Runs `ftkv-bench failover` (see the module docs).
pub async fn run(args: &FailoverArgs) -> anyhow::Result<()> {
    let targets = super::parse_targets(&args.targets)?;
    anyhow::ensure!(args.clients > 0, "--clients must be at least 1");
    anyhow::ensure!(args.runs > 0, "--runs must be at least 1");
    std::fs::create_dir_all(&args.out)?;
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for (i, (name, kind)) in targets.iter().enumerate() {
            eprintln!("== round {run}/{}: {name} ({} writers)", args.runs, args.clients);
            let port = args.base_port + super::PORTS_PER_TARGET * i as u16;
            let started = super::start(name, kind, port).await?;
            let r = run_target(&started, args, run).await?;
            eprintln!(
                "   {name}: write pause {:.0} ms (steady {:.0} ms), catch-up {:.0} ms, {} acked, {} errors",
                r.write_pause_ms, r.steady_gap_ms, r.catch_up_ms, r.acked, r.errors
            );
            runs.push(r);
        }
    }
    let names: Vec<String> = targets.iter().map(|(n, _)| n.clone()).collect();
    let report = report(args, names, runs);
    super::write_json(&args.out, "results.json", &report)?;
    summary(&report).write(&args.out)?;
    charts(&report, &args.out)?;
    print(&report);
    println!("report: {}", args.out.join("results.json").display());
    Ok(())
}

fn report(args: &FailoverArgs, targets: Vec<String>, runs: Vec<FailoverRun>) -> Report {
    let medians: Vec<FailoverMedian> = targets
        .iter()
        .map(|t| {
            let rs: Vec<&FailoverRun> = runs.iter().filter(|r| &r.target == t).collect();
            let med =
                |f: &dyn Fn(&FailoverRun) -> f64| crate::median(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
            FailoverMedian {
                target: t.clone(),
                runs: rs.len(),
                write_pause_ms: med(&|r| r.write_pause_ms),
                catch_up_ms: med(&|r| r.catch_up_ms),
                steady_gap_ms: med(&|r| r.steady_gap_ms),
            }
        })
        .collect();
    let of = |f: &dyn Fn(&FailoverMedian) -> f64| {
        ratios_over_first(
            &medians
                .iter()
                .map(|m| (m.target.clone(), f(m)))
                .collect::<Vec<_>>(),
        )
    };
    Report {
        machine: machine_line(),
        command: command_line(),
        clients: args.clients,
        settle_s: args.settle.as_secs_f64(),
        down_s: args.down.as_secs_f64(),
        targets,
        ratios_write_pause: of(&|m| m.write_pause_ms),
        ratios_catch_up: of(&|m| m.catch_up_ms),
        medians,
        runs,
    }
}

fn summary(report: &Report) -> Summary {
    let row = |metric: &str, f: &dyn Fn(&FailoverMedian) -> f64| SummaryRow {
        metric: format!("{metric}, {} writers", report.clients),
        unit: "ms".to_string(),
        higher_is_better: false,
        values: report.medians.iter().map(|m| (m.target.clone(), f(m))).collect(),
    };
    Summary::new(
        "failover",
        report.command.clone(),
        vec![
            row("write pause after kill -9 of the leader", &|m| m.write_pause_ms),
            row("killed node's catch-up after restart", &|m| m.catch_up_ms),
        ],
    )
}

/// A vertical line at `x` from 0 to `top`, as a chart series.
fn marker(label: String, x: f64, top: f64) -> plot::Series {
    plot::Series {
        label,
        points: vec![(x, 0.0), (x, top)],
    }
}

fn charts(report: &Report, out: &Path) -> anyhow::Result<()> {
    for r in &report.runs {
        let chart = |what: &str, unit: &str, f: &dyn Fn(&Bin) -> f64| {
            let line = plot::Series {
                label: format!("{} run {}", r.target, r.run),
                points: r.bins.iter().map(|b| (b.t_s, f(b))).collect(),
            };
            let top = line.points.iter().map(|p| p.1).fold(1e-9, f64::max);
            plot::line_chart(
                &format!(
                    "{}: {what} per 100 ms, kill -9 of {} ({} writers)",
                    r.target, r.killed, report.clients
                ),
                "seconds",
                unit,
                &[
                    line,
                    marker(format!("kill -9 {}", r.killed), r.kill_at_s, top),
                    marker("restart".into(), r.restart_at_s, top),
                    marker("caught up".into(), r.caught_up_at_s, top),
                ],
            )
        };
        let name = format!("{}_run{}", file_safe(&r.target), r.run);
        std::fs::write(
            out.join(format!("over_time_{name}.svg")),
            chart("acknowledged puts/s", "puts/s", &|b| b.puts_per_sec),
        )?;
        std::fs::write(
            out.join(format!("latency_{name}.svg")),
            chart("put latency p99", "ms", &|b| b.p99_ms),
        )?;
    }
    Ok(())
}

fn print(report: &Report) {
    let w = report.targets.iter().map(String::len).max().unwrap_or(0).max(8);
    println!(
        "{:<w$} {:>15} {:>13} {:>15}",
        "target", "write pause ms", "catch-up ms", "steady gap ms"
    );
    for m in &report.medians {
        println!(
            "{:<w$} {:>15.0} {:>13.0} {:>15.0}",
            m.target, m.write_pause_ms, m.catch_up_ms, m.steady_gap_ms
        );
    }
    for (name, ratio) in &report.ratios_write_pause {
        println!("ratio write pause {name}: {ratio:.2}x");
    }
    for (name, ratio) in &report.ratios_catch_up {
        println!("ratio catch-up {name}: {ratio:.2}x");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bins_count_acks_per_100_ms() {
        let t0 = Instant::now();
        let at = |ms: u64, us: u32| (t0 + Duration::from_millis(ms), us);
        let acks = [at(10, 1000), at(20, 3000), at(250, 2000)];
        let b = bins(&acks, t0);
        assert_eq!(b.len(), 3);
        assert_eq!(b[0].puts_per_sec, 20.0);
        assert_eq!(b[0].p99_ms, 3.0);
        assert_eq!(b[1].puts_per_sec, 0.0);
        assert_eq!(b[2].p99_ms, 2.0);
        assert_eq!(file_safe("ftkv@/tmp/x"), "ftkv__tmp_x");
    }
}
