//! `ftkv-bench restart`: the write pause of a rolling restart (SIGTERM: drain and leadership
//! hand-off) against that of a crash failover (SIGKILL of the leader), side by side.
//!
//! Each round starts a fresh three-node cluster (the ftkv-tests fixture, the `ftkv-node` beside
//! this executable or in `FTKV_BIN_DIR`) under a write load of `clients` workers (one put in
//! flight each), then either restarts every node once, followers first and the leader last,
//! each by SIGTERM, restart and wait until all nodes caught up (`rolling`), or kills the leader
//! with SIGKILL and restarts it at once, as systemd's `Restart=on-failure` would (`crash`).
//! Modes alternate within a round. The pause of an event is the longest gap between two
//! consecutive acknowledgements (of any worker) that overlaps the event; a steady-state gap
//! before the first event is reported beside it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use ftkv_tests::fixture::{Cluster, ClusterOptions, WriteLoad};
use serde::Serialize;

/// `ftkv-bench restart` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct RestartArgs {
    /// Concurrent writers.
    #[arg(long, default_value_t = 32)]
    pub clients: usize,
    /// Rounds; each runs both modes once.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Load before the first event and after each one.
    #[arg(long, default_value = "3s", value_parser = humantime::parse_duration)]
    pub settle: Duration,
    /// Output directory (results.json, pauses.svg).
    #[arg(long, default_value = "store/bench-restart")]
    pub out: PathBuf,
}

/// One restart or kill.
#[derive(Debug, Clone, Serialize)]
pub struct Event {
    /// `rolling` or `crash`.
    pub mode: String,
    /// The node restarted or killed.
    pub node: u64,
    /// Whether it led when the event began.
    pub was_leader: bool,
    /// From the signal until every node caught up again, ms.
    pub duration_ms: f64,
    /// Longest gap between acknowledgements overlapping the event, ms.
    pub pause_ms: f64,
}

/// One round of one mode.
#[derive(Debug, Clone, Serialize)]
pub struct ModeRun {
    /// `rolling` or `crash`.
    pub mode: String,
    /// Round (1-based).
    pub run: u64,
    /// Longest gap between acknowledgements in the steady state before the first event, ms.
    pub steady_pause_ms: f64,
    /// The events, in order.
    pub events: Vec<Event>,
    /// Writes acknowledged.
    pub acked: u64,
    /// Writes that failed (certainly not applied) during the run.
    pub failed: u64,
    /// Writes whose outcome is unknown.
    pub ambiguous: u64,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    clients: usize,
    runs: Vec<ModeRun>,
    /// Median over the rounds of the leader event's pause, per mode.
    median_leader_pause_ms: Vec<(String, f64)>,
    /// Median over the rounds of the worst follower restart's pause (rolling).
    median_follower_pause_ms: f64,
    /// crash leader pause / rolling leader pause.
    ratio_crash_over_rolling: f64,
}

/// Longest gap between consecutive `acks` (sorted) that overlaps `[from, to]`.
pub fn longest_gap(acks: &[Instant], from: Instant, to: Instant) -> Duration {
    acks.windows(2)
        .filter(|w| w[1] >= from && w[0] <= to)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_else(|| to.saturating_duration_since(from))
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn run_mode(mode: &str, run: u64, args: &RestartArgs) -> anyhow::Result<ModeRun> {
    let cluster = Cluster::start(ClusterOptions::default()).await?;
    let leader = cluster.wait_for_leader().await?;
    let client = cluster.client().await?;
    let load = WriteLoad::start(
        &client,
        &format!("restart-{mode}-{run}"),
        args.clients,
        Duration::from_millis(5),
    );
    let steady_from = Instant::now();
    tokio::time::sleep(args.settle).await;
    let steady_to = Instant::now();
    let order: Vec<u64> = match mode {
        "rolling" => cluster
            .ids()
            .into_iter()
            .filter(|id| *id != leader)
            .chain([leader])
            .collect(),
        _ => vec![leader],
    };
    let mut windows = Vec::new();
    for node in order {
        let was_leader = cluster.leader_id().await == Some(node);
        eprintln!(
            "   {mode} round {run}: node {node}{}",
            if was_leader { " (leader)" } else { "" }
        );
        let began = Instant::now();
        if mode == "rolling" {
            let status = cluster.stop(node).await?;
            anyhow::ensure!(status.success(), "node {node} exited {status:?} after SIGTERM");
        } else {
            cluster.kill(node)?;
        }
        cluster.restart(node)?;
        cluster.wait_all_caught_up().await?;
        let ended = Instant::now();
        windows.push((node, was_leader, began, ended));
        tokio::time::sleep(args.settle).await;
    }
    let outcome = load.stop().await;
    let mut acks: Vec<Instant> = outcome.acked.iter().map(|a| a.acked_at).collect();
    acks.sort();
    let events = windows
        .into_iter()
        .map(|(node, was_leader, began, ended)| Event {
            mode: mode.to_string(),
            node,
            was_leader,
            duration_ms: ms(ended - began),
            pause_ms: ms(longest_gap(&acks, began, ended)),
        })
        .collect();
    cluster.check_no_panics()?;
    Ok(ModeRun {
        mode: mode.to_string(),
        run,
        steady_pause_ms: ms(longest_gap(&acks, steady_from, steady_to)),
        events,
        acked: outcome.acked.len() as u64,
        failed: outcome.failed.len() as u64,
        ambiguous: outcome.ambiguous.len() as u64,
    })
}

/// Runs `ftkv-bench restart`.
pub async fn run(args: &RestartArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)?;
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for mode in ["rolling", "crash"] {
            eprintln!("== round {run}/{}: {mode} ({} writers)", args.runs, args.clients);
            let r = run_mode(mode, run, args).await?;
            for e in &r.events {
                eprintln!(
                    "   node {}{}: pause {:.0} ms, back in {:.0} ms",
                    e.node,
                    if e.was_leader { " (leader)" } else { "" },
                    e.pause_ms,
                    e.duration_ms
                );
            }
            eprintln!(
                "   steady-state longest gap {:.0} ms; {} acked, {} failed, {} ambiguous",
                r.steady_pause_ms, r.acked, r.failed, r.ambiguous
            );
            runs.push(r);
        }
    }
    let leader_pause = |mode: &str| {
        crate::median(
            &runs
                .iter()
                .filter(|r| r.mode == mode)
                .filter_map(|r| r.events.iter().find(|e| e.was_leader).map(|e| e.pause_ms))
                .collect::<Vec<_>>(),
        )
    };
    let follower_pause = crate::median(
        &runs
            .iter()
            .filter(|r| r.mode == "rolling")
            .map(|r| {
                r.events
                    .iter()
                    .filter(|e| !e.was_leader)
                    .map(|e| e.pause_ms)
                    .fold(0.0, f64::max)
            })
            .collect::<Vec<_>>(),
    );
    let (rolling, crash) = (leader_pause("rolling"), leader_pause("crash"));
    let report = Report {
        machine: format!(
            "{} cores",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        ),
        clients: args.clients,
        median_leader_pause_ms: vec![("rolling".into(), rolling), ("crash".into(), crash)],
        median_follower_pause_ms: follower_pause,
        ratio_crash_over_rolling: crash / rolling.max(1e-9),
        runs,
    };
    std::fs::write(
        args.out.join("results.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    crate::summary::Summary::new(
        "restart",
        crate::summary::command_line(),
        vec![crate::summary::SummaryRow {
            metric: format!("write pause at the leader, {} clients", args.clients),
            unit: "ms".to_string(),
            higher_is_better: false,
            values: vec![
                ("ftkv rolling restart".to_string(), rolling),
                ("ftkv crash failover".to_string(), crash),
            ],
        }],
    )
    .write(&args.out)?;
    let bars: Vec<crate::plot::Series> = ["rolling", "crash"]
        .iter()
        .map(|mode| crate::plot::Series {
            label: format!("{mode}: leader event pause"),
            points: report
                .runs
                .iter()
                .filter(|r| r.mode == *mode)
                .filter_map(|r| {
                    r.events
                        .iter()
                        .find(|e| e.was_leader)
                        .map(|e| (r.run as f64, e.pause_ms))
                })
                .collect(),
        })
        .collect();
    std::fs::write(
        args.out.join("pauses.svg"),
        crate::plot::line_chart("write pause of the leader's restart", "round", "ms", &bars),
    )?;
    println!("mode      leader pause ms (median)");
    println!("rolling   {rolling:>10.0}");
    println!("crash     {crash:>10.0}");
    println!("rolling restart, worst follower pause ms (median): {follower_pause:.0}");
    println!("ratio crash / rolling: {:.1}x", report.ratio_crash_over_rolling);
    let failed: u64 = report
        .runs
        .iter()
        .filter(|r| r.mode == "rolling")
        .map(|r| r.failed)
        .sum();
    println!("failed requests during rolling restarts: {failed}");
    println!("report: {}", args.out.join("results.json").display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_gap_is_the_one_overlapping_the_event() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let acks = [at(0), at(10), at(500), at(510), at(520), at(2000), at(2010)];
        // An event from 600 to 700 overlaps the gap 520..2000.
        assert_eq!(longest_gap(&acks, at(600), at(700)), Duration::from_millis(1480));
        // A window 0..5 overlaps the first gap only.
        assert_eq!(longest_gap(&acks, at(0), at(5)), Duration::from_millis(10));
        // No acknowledgement after the event: the whole window.
        assert_eq!(longest_gap(&[], at(0), at(100)), Duration::from_millis(100));
    }
}
