//! `sysbench-insert` against MariaDB semi-sync: Debian's `sysbench` with its own `oltp_insert`
//! script (`prepare`, `run`, `cleanup`) over the master's socket, then the validity check.

use std::process::{Command, Stdio};

use anyhow::Context;

use super::{output, CpuUse, InsertRun, SysbenchArgs, WriteSecond};
use crate::cpu::{self, CpuMeter};
use crate::mariadb::{self, Binaries, Durability, InnoDbSizes, MariaDbCluster};

/// `sysbench oltp_insert` arguments common to `prepare`, `run` and `cleanup`.
pub fn sysbench_args(cluster_socket: &std::path::Path, args: &SysbenchArgs) -> Vec<String> {
    vec![
        "oltp_insert".to_string(),
        "--db-driver=mysql".to_string(),
        format!("--mysql-socket={}", cluster_socket.display()),
        format!("--mysql-user={}", mariadb::USER),
        format!("--mysql-password={}", mariadb::PASSWORD),
        format!("--mysql-db={}", mariadb::DATABASE),
        format!("--tables={}", args.tables),
        format!("--table-size={}", args.table_size),
    ]
}

/// The `run` phase's extra arguments: random ids over the whole 32-bit range
/// (`--auto-inc=off`), one report line per second, the latency histogram (for p50/p99), and
/// duplicate ids (error 1062, rare) skipped and counted as errors rather than ending the run.
pub fn run_phase_args(args: &SysbenchArgs, run: u64) -> Vec<String> {
    vec![
        format!("--threads={}", args.clients),
        format!("--time={}", args.duration.as_secs().max(1)),
        "--auto-inc=off".to_string(),
        "--report-interval=1".to_string(),
        "--histogram=on".to_string(),
        "--percentile=95".to_string(),
        "--mysql-ignore-errors=1062".to_string(),
        format!("--rand-seed={}", args.seed.wrapping_add(run)),
        "run".to_string(),
    ]
}

fn sysbench(binaries: &Binaries, common: &[String], extra: &[String], what: &str) -> anyhow::Result<String> {
    let out = Command::new(&binaries.sysbench)
        .args(common)
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot start {}", binaries.sysbench.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "sysbench {what} failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim(),
        String::from_utf8_lossy(&out.stdout).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// One run against a fresh master and two slaves with `durability`.
pub fn run(
    binaries: &Binaries,
    durability: Durability,
    args: &SysbenchArgs,
    run: u64,
) -> anyhow::Result<InsertRun> {
    let sizes = InnoDbSizes {
        buffer_pool_size: args.mariadb_buffer_pool_size.clone(),
        log_file_size: args.mariadb_log_file_size.clone(),
    };
    let cluster = MariaDbCluster::start(binaries, durability, &sizes)?;
    let common = sysbench_args(&cluster.master_socket(), args);
    sysbench(binaries, &common, &["prepare".to_string()], "prepare")?;
    let servers = CpuMeter::start(&cluster.pids());
    // sysbench is the only child reaped during the run: its CPU is the growth of this
    // process's waited-for children's time.
    let children_before = cpu::waited_children_cpu_seconds();
    let text = sysbench(binaries, &common, &run_phase_args(args, run), "run")?;
    let load_generator_s = cpu::waited_children_cpu_seconds() - children_before;
    let servers_s = servers.elapsed_seconds();
    let report = output::parse(&text).context("parsing sysbench run output")?;
    let checks = cluster.check(args.tables)?;
    sysbench(binaries, &common, &["cleanup".to_string()], "cleanup")?;
    let version = Command::new(&binaries.sysbench)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let writes = report.transactions;
    Ok(InsertRun {
        target: String::new(),
        run,
        load_generator: format!("{version} oltp_insert, {} threads", args.clients),
        writes,
        writes_per_sec: writes as f64 / report.total_time_s.max(1e-9),
        seconds: report.total_time_s,
        errors: report.ignored_errors,
        latency_ms: report.latency_ms,
        per_second: report
            .intervals
            .iter()
            .map(|i| WriteSecond {
                t: i.t,
                writes: i.tps.round() as u64,
                p95_ms: i.latency_pct_ms,
            })
            .collect(),
        cpu: CpuUse::new(servers_s, load_generator_s, writes),
        valid: checks.valid(),
        problems: checks.problems.clone(),
        mariadb: Some(checks),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_phase_is_the_seeds_random_insert() {
        let args = SysbenchArgs {
            targets: String::new(),
            clients: 128,
            duration: std::time::Duration::from_secs(30),
            runs: 1,
            tables: 8,
            table_size: 10_000,
            out: "x".into(),
            seed: 42,
            mariadb_buffer_pool_size: "256M".into(),
            mariadb_log_file_size: "512M".into(),
        };
        let common = sysbench_args(std::path::Path::new("/s"), &args);
        assert_eq!(common.first().map(String::as_str), Some("oltp_insert"));
        assert!(common.contains(&"--tables=8".to_string()));
        assert!(common.contains(&"--mysql-socket=/s".to_string()));
        let run = run_phase_args(&args, 2);
        for a in [
            "--threads=128",
            "--time=30",
            "--auto-inc=off",
            "--histogram=on",
            "--rand-seed=44",
        ] {
            assert!(run.contains(&a.to_string()), "{a} missing from {run:?}");
        }
        assert_eq!(run.last().map(String::as_str), Some("run"));
    }
}
