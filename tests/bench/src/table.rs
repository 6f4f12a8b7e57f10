//! `ftkv-bench table`: the table of current figures that opens `BENCHMARKS.md`, generated from
//! the `summary.json` every workload writes ([`crate::summary`]).
//!
//! `ftkv-bench table --results tests/bench/results` prints it (Markdown);
//! `--update BENCHMARKS.md` rewrites the part of the file between [`BEGIN`] and [`END`];
//! `--check BENCHMARKS.md` fails when that part differs from what the results give, so the
//! table cannot drift from the JSON it is made of (a test runs it).
//!
//! The results folder holds one folder per workload run (`tests/bench/results/sysbench-insert/
//! summary.json`, ...), copied there from a run's `--out` when its figures become the current
//! ones. Each row of the table is one figure against one peer: the first target (ftkv) and
//! the peer's value, and how many times better ftkv is (a ratio above 1 is ftkv ahead: the
//! value ratio for throughput, its inverse for latency, size and CPU).

use std::path::{Path, PathBuf};

use crate::summary::Summary;

/// First line of the generated part of `BENCHMARKS.md`.
pub const BEGIN: &str = "<!-- ftkv-bench table: begin (generated; edit tests/bench/results) -->";
/// Last line of the generated part.
pub const END: &str = "<!-- ftkv-bench table: end -->";

/// `ftkv-bench table` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct TableArgs {
    /// Folder of result folders, each with a `summary.json`.
    #[arg(long, default_value = "tests/bench/results")]
    pub results: PathBuf,
    /// Rewrite the generated part of this file.
    #[arg(long, conflicts_with = "check")]
    pub update: Option<PathBuf>,
    /// Fail when the generated part of this file differs from the results.
    #[arg(long)]
    pub check: Option<PathBuf>,
}

/// Every `DIR/*/summary.json`, in folder-name order.
pub fn read_all(dir: &Path) -> anyhow::Result<Vec<Summary>> {
    let mut folders: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| anyhow::anyhow!("{}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("summary.json").is_file())
        .collect();
    folders.sort();
    folders
        .iter()
        .map(|f| Summary::read(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display())))
        .collect()
}

fn number(v: f64, unit: &str) -> String {
    if unit == "bytes" && v.abs() >= 1e6 {
        return number(v / 1e6, "MB");
    }
    let digits = if v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else {
        2
    };
    let s = format!("{v:.digits$}");
    // Thousands separators on the integer part.
    let (int, frac) = s
        .split_once('.')
        .map_or((s.as_str(), None), |(i, f)| (i, Some(f)));
    let (sign, int) = int.strip_prefix('-').map_or(("", int), |i| ("-", i));
    let mut grouped = String::new();
    for (i, c) in int.chars().enumerate() {
        if i > 0 && (int.len() - i) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(c);
    }
    let frac = frac.map(|f| format!(".{f}")).unwrap_or_default();
    format!("{sign}{grouped}{frac} {unit}")
}

/// How many times better the first value is than the second (`None` when either is 0).
pub fn advantage(ftkv: f64, peer: f64, higher_is_better: bool) -> Option<f64> {
    if ftkv <= 0.0 || peer <= 0.0 {
        return None;
    }
    Some(if higher_is_better {
        ftkv / peer
    } else {
        peer / ftkv
    })
}

/// The Markdown table (with its legend of commands), between [`BEGIN`] and [`END`].
pub fn markdown(summaries: &[Summary]) -> String {
    let mut t = String::new();
    t.push_str(BEGIN);
    t.push_str("\n\n| workload | figure | ftkv | peer | peer's figure | ftkv ahead by | date |\n");
    t.push_str("|---|---|---|---|---|---|---|\n");
    for s in summaries {
        let date = s.date.get(..10).unwrap_or(&s.date);
        for row in &s.rows {
            let Some(((first, ftkv), peers)) = row.values.split_first() else {
                continue;
            };
            let first_cell = format!("{} ({first})", number(*ftkv, &row.unit));
            if peers.is_empty() {
                t.push_str(&format!(
                    "| {} | {} | {first_cell} | - | - | - | {date} |\n",
                    s.workload, row.metric
                ));
            }
            for (peer, value) in peers {
                let ahead = advantage(*ftkv, *value, row.higher_is_better)
                    .map_or("-".to_string(), |a| format!("**{a:.2}x**"));
                t.push_str(&format!(
                    "| {} | {} | {first_cell} | {peer} | {} | {ahead} | {date} |\n",
                    s.workload,
                    row.metric,
                    number(*value, &row.unit)
                ));
            }
        }
    }
    t.push_str("\nCommands (each row's figures are medians of the rounds of one run of it; machine:");
    let machines: std::collections::BTreeSet<&str> = summaries.iter().map(|s| s.machine.as_str()).collect();
    t.push_str(&format!(
        " {}):\n\n",
        machines.into_iter().collect::<Vec<_>>().join("; ")
    ));
    for s in summaries {
        t.push_str(&format!("- {}: `{}`\n", s.workload, s.command));
    }
    t.push('\n');
    t.push_str(END);
    t
}

/// `text` with its part between [`BEGIN`] and [`END`] replaced by `table`.
pub fn splice(text: &str, table: &str) -> anyhow::Result<String> {
    let start = text
        .find(BEGIN)
        .ok_or_else(|| anyhow::anyhow!("no line {BEGIN:?} in the file"))?;
    let end = text[start..]
        .find(END)
        .map(|e| start + e + END.len())
        .ok_or_else(|| anyhow::anyhow!("no line {END:?} after the begin line"))?;
    Ok(format!("{}{table}{}", &text[..start], &text[end..]))
}

/// Runs `ftkv-bench table`.
pub fn run(args: &TableArgs) -> anyhow::Result<()> {
    let table = markdown(&read_all(&args.results)?);
    if let Some(file) = &args.update {
        let text = std::fs::read_to_string(file)?;
        std::fs::write(file, splice(&text, &table)?)?;
        eprintln!(
            "{}: table rewritten from {}",
            file.display(),
            args.results.display()
        );
    } else if let Some(file) = &args.check {
        let text = std::fs::read_to_string(file)?;
        anyhow::ensure!(
            splice(&text, &table)? == text,
            "{}: the table differs from {}; run `ftkv-bench table --results {} --update {}`",
            file.display(),
            args.results.display(),
            args.results.display(),
            file.display()
        );
        eprintln!("{}: the table matches {}", file.display(), args.results.display());
    } else {
        println!("{table}");
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::summary::SummaryRow;

    fn summary() -> Summary {
        Summary::new(
            "sysbench-insert",
            "ftkv-bench sysbench-insert --runs 3".into(),
            vec![
                SummaryRow {
                    metric: "writes/s".into(),
                    unit: "writes/s".into(),
                    higher_is_better: true,
                    values: vec![("ftkv".into(), 20_000.0), ("etcd".into(), 5_000.0)],
                },
                SummaryRow {
                    metric: "p99".into(),
                    unit: "ms".into(),
                    higher_is_better: false,
                    values: vec![("ftkv".into(), 10.0), ("etcd".into(), 40.0)],
                },
            ],
        )
    }

    #[test]
    fn rows_give_ftkvs_advantage_both_ways() {
        let t = markdown(&[summary()]);
        assert!(
            t.contains(
                "| sysbench-insert | writes/s | 20,000 writes/s (ftkv) | etcd | 5,000 writes/s | **4.00x** |"
            ),
            "{t}"
        );
        assert!(
            t.contains("| p99 | 10.0 ms (ftkv) | etcd | 40.0 ms | **4.00x** |"),
            "{t}"
        );
        assert!(t.contains("- sysbench-insert: `ftkv-bench sysbench-insert --runs 3`"));
        assert!(t.starts_with(BEGIN) && t.ends_with(END));
    }

    #[test]
    fn splice_replaces_only_the_generated_part() {
        let text = format!("# B\n\n{BEGIN}\nold\n{END}\n\nhistory\n");
        let out = splice(&text, &format!("{BEGIN}\nnew\n{END}")).unwrap();
        assert_eq!(out, format!("# B\n\n{BEGIN}\nnew\n{END}\n\nhistory\n"));
        assert!(splice("no markers", "x").is_err());
    }

    #[test]
    fn numbers_are_grouped() {
        assert_eq!(number(1_234_567.4, "rows/s"), "1,234,567 rows/s");
        assert_eq!(number(-1234.0, "x"), "-1,234 x");
        assert_eq!(number(2.345_67, "ms"), "2.35 ms");
        assert_eq!(number(358_712_345.0, "bytes"), "359 MB");
        assert_eq!(advantage(0.0, 1.0, true), None);
    }
}
