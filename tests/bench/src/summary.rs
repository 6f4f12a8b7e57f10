//! The one-line-per-figure summary every workload writes beside its full results
//! (`DIR/summary.json`), from which `BENCHMARKS.md`'s opening table is generated.
//!
//! A [`Summary`] names the workload, the command that produced it, the date and the machine; each
//! [`SummaryRow`] is one figure (for example "puts/s, 128 clients") with a value per target. The
//! ratio of ftkv over each peer is computed by the reader, so every workload reports raw medians
//! only.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One workload's figures, written as `summary.json` in its output directory.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    /// The workload (`cluster`, `sysbench-insert`, `scaling`, ...).
    pub workload: String,
    /// The command line that produced these figures (as typed, without the binary's path).
    pub command: String,
    /// RFC 3339 UTC time the run finished.
    pub date: String,
    /// [`machine_line`].
    pub machine: String,
    /// The figures.
    pub rows: Vec<SummaryRow>,
}

/// One figure: a value per target, medians of the rounds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SummaryRow {
    /// What is measured, e.g. `puts/s, 128 clients, 100 B values`.
    pub metric: String,
    /// Unit of the values, e.g. `ops/s`, `ms`, `bytes`, `rows/s`.
    pub unit: String,
    /// True when a larger value is better (throughput); false for latency, size, CPU.
    pub higher_is_better: bool,
    /// `(target, value)` in the order the targets were given; the ftkv target comes first.
    pub values: Vec<(String, f64)>,
}

impl Summary {
    /// A summary dated now on this machine.
    pub fn new(workload: &str, command: String, rows: Vec<SummaryRow>) -> Self {
        Self {
            workload: workload.to_string(),
            command,
            date: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            machine: machine_line(),
            rows,
        }
    }

    /// Writes `dir/summary.json`.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("summary.json"), serde_json::to_vec_pretty(self)?)?;
        Ok(())
    }

    /// Reads `dir/summary.json`.
    pub fn read(dir: &Path) -> anyhow::Result<Self> {
        let bytes = std::fs::read(dir.join("summary.json"))?;
        Ok(serde_json::from_slice(&bytes)?)
    }
}

/// The command line of this process, without the binary's directory (`ftkv-bench scaling ...`).
pub fn command_line() -> String {
    let mut args = std::env::args();
    let bin = args
        .next()
        .map(|a| {
            Path::new(&a)
                .file_name()
                .map_or(a.clone(), |n| n.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    std::iter::once(bin).chain(args).collect::<Vec<_>>().join(" ")
}

/// `N cores, M GiB, Linux <release>`.
pub fn machine_line() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores, {mem_gib:.0} GiB, Linux {}", kernel.trim())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_round_trips_through_its_file() {
        let dir = tempfile::tempdir().unwrap();
        let row = SummaryRow {
            metric: "puts/s, 128 clients".into(),
            unit: "ops/s".into(),
            higher_is_better: true,
            values: vec![("ftkv".into(), 20_000.0), ("etcd".into(), 5_000.0)],
        };
        Summary::new("cluster", "ftkv-bench cluster".into(), vec![row])
            .write(dir.path())
            .unwrap();
        let back = Summary::read(dir.path()).unwrap();
        assert_eq!(back.workload, "cluster");
        assert_eq!(back.rows[0].values[1], ("etcd".to_string(), 5_000.0));
        assert!(back.machine.contains("cores"));
    }
}
