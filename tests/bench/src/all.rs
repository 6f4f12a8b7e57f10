//! `ftkv-bench all --out DIR`: every workload at its full size, one after another, each into
//! `DIR/<workload>/` (its `results.json`, `summary.json` and charts), then the table of
//! `DIR/*/summary.json` ([`crate::table`]) printed. Each workload runs as a child process of
//! this same executable with the arguments listed in [`WORKLOADS`], so `all` runs exactly what
//! the per-workload commands in BENCHMARKS.md run. `--only a,b` picks some; `--dry-run` prints
//! the commands.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

/// `ftkv-bench all` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct AllArgs {
    /// Output folder; each workload writes into `DIR/<workload>/`.
    #[arg(long, default_value = "store/bench-all")]
    pub out: PathBuf,
    /// Comma-separated workloads to run (default: all of them).
    #[arg(long)]
    pub only: Option<String>,
    /// Print the commands instead of running them.
    #[arg(long)]
    pub dry_run: bool,
}

/// The workloads of `all`: name (the output folder) and the arguments of the run, without
/// `--out`. Every peer the workload compares against is in its targets.
pub const WORKLOADS: &[(&str, &[&str])] = &[
    (
        "cluster",
        &[
            "cluster",
            "--targets",
            "ftkv,ftkv-sled,etcd",
            "--clients",
            "128",
            "--duration",
            "30s",
            "--runs",
            "3",
        ],
    ),
    (
        "sysbench-insert",
        &[
            "sysbench-insert",
            "--targets",
            "ftkv,ftkv-sled,etcd,mariadb-semisync,mariadb-semisync-durable",
            "--clients",
            "128",
            "--duration",
            "60s",
            "--runs",
            "3",
        ],
    ),
    (
        "bulk",
        &[
            "bulk",
            "--rows",
            "20000000",
            "--put-rows",
            "2000000",
            "--runs",
            "3",
        ],
    ),
    ("restart", &["restart", "--runs", "3"]),
    (
        "scaling",
        &[
            "scaling",
            "--targets",
            "ftkv,ftkv-sled,etcd",
            "--clients",
            "1,8,32,128,512",
            "--value-sizes",
            "100,1024,16384",
            "--duration",
            "10s",
            "--runs",
            "3",
        ],
    ),
    (
        "reads",
        &[
            "reads",
            "--targets",
            "ftkv,etcd",
            "--clients",
            "128",
            "--duration",
            "10s",
            "--runs",
            "3",
            "--keys",
            "100000",
        ],
    ),
    (
        "failover",
        &[
            "failover",
            "--targets",
            "ftkv,etcd",
            "--clients",
            "32",
            "--runs",
            "3",
        ],
    ),
    (
        "compression",
        &[
            "compression",
            "--targets",
            "ftkv,ftkv-sled,etcd",
            "--rows",
            "1000000",
            "--runs",
            "3",
        ],
    ),
    (
        "beyond-memory",
        &[
            "beyond-memory",
            "--targets",
            "ftkv,ftkv-sled",
            "--cache-size",
            "64MiB",
            "--data-multiple",
            "16",
            "--runs",
            "3",
        ],
    ),
    (
        "instant-ddl",
        &[
            "instant-ddl",
            "--targets",
            "ftkv,etcd",
            "--keys",
            "10000000",
            "--runs",
            "3",
        ],
    ),
];

/// The workloads `--only` names, in [`WORKLOADS`] order.
pub fn selected(only: Option<&str>) -> anyhow::Result<Vec<(&'static str, &'static [&'static str])>> {
    let Some(only) = only else {
        return Ok(WORKLOADS.to_vec());
    };
    let names: Vec<&str> = only.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
    for n in &names {
        anyhow::ensure!(
            WORKLOADS.iter().any(|(w, _)| w == n),
            "unknown workload {n:?} (one of: {})",
            WORKLOADS.iter().map(|(w, _)| *w).collect::<Vec<_>>().join(", ")
        );
    }
    Ok(WORKLOADS
        .iter()
        .copied()
        .filter(|(w, _)| names.contains(w))
        .collect())
}

/// Runs `ftkv-bench all`.
pub fn run(args: &AllArgs) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let workloads = selected(args.only.as_deref())?;
    let started = Instant::now();
    for (i, (name, wargs)) in workloads.iter().enumerate() {
        let out = args.out.join(name);
        let shown = format!("ftkv-bench {} --out {}", wargs.join(" "), out.display());
        if args.dry_run {
            println!("{shown}");
            continue;
        }
        eprintln!(
            "== all: workload {}/{} ({name}), {:.0} min so far: {shown}",
            i + 1,
            workloads.len(),
            started.elapsed().as_secs_f64() / 60.0
        );
        let status = Command::new(&exe).args(*wargs).arg("--out").arg(&out).status()?;
        anyhow::ensure!(status.success(), "{shown}: {status}");
    }
    if !args.dry_run {
        let summaries = crate::table::read_all(&args.out)?;
        println!("{}", crate::table::markdown(&summaries));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_picks_known_workloads_in_order() {
        let picked = selected(Some("restart, cluster")).map(|v| v.iter().map(|w| w.0).collect::<Vec<_>>());
        assert_eq!(picked.ok(), Some(vec!["cluster", "restart"]));
        assert!(selected(Some("nope")).is_err());
        assert_eq!(selected(None).map(|v| v.len()).ok(), Some(WORKLOADS.len()));
    }
}
