//! `ftkvctl load FILE` (`-` = stdin): MySQL's `LOAD DATA INFILE ... INTO TABLE ... (col, ...)`
//! for ftkv, through `Kv.BulkLoad` (one load = one operation on the cluster; all rows visible
//! together, or none).
//!
//! Each input line (CSV or TSV record) is one row: its key is the `--prefix` then the
//! `--key-columns`, its value the other columns, encoded as [`crate::rows`] documents.
//! A malformed line stops the load with its line number, column and reason, and nothing of the
//! load becomes visible. Progress (rows/s, bytes/s, ETA) goes to stderr when it is a terminal;
//! at the end a summary in the spirit of MySQL's "Records / Deleted / Skipped / Warnings".

use std::collections::BTreeMap;
use std::io::Read;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context};

use crate::rows::{self, ColumnType};
use crate::{Client, Error, OnDuplicate};

/// Input format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Comma-separated, `"` quoting (RFC 4180).
    Csv,
    /// Tab-separated, `"` quoting.
    Tsv,
}

/// Duplicate policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Duplicates {
    /// Fail the load on the first duplicate key (naming both lines).
    Error,
    /// REPLACE INTO: the later row wins.
    Replace,
    /// INSERT IGNORE: the first row (or the stored value) wins.
    Ignore,
}

/// `load FILE ...`.
#[derive(Debug, clap::Args)]
pub struct LoadArgs {
    /// File to load; `-` reads stdin.
    pub file: PathBuf,
    /// Input format.
    #[arg(long, value_enum, default_value = "csv")]
    pub format: Format,
    /// Column names and types, `name[:int|str|bytes]` separated by commas (default type str),
    /// in file order. Without it the first line is a header of column names (all str).
    #[arg(long, value_delimiter = ',')]
    pub columns: Vec<String>,
    /// Columns forming the key, in key order (default: the first column).
    #[arg(long, value_delimiter = ',')]
    pub key_columns: Vec<String>,
    /// What a key that exists already does.
    #[arg(long, value_enum, default_value = "error")]
    pub on_duplicate: Duplicates,
    /// Bytes put before every key (a "table" namespace), e.g. `user_summary/`.
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// The first line is a header to skip (implied when --columns is absent).
    #[arg(long)]
    pub header: bool,
}

struct Schema {
    types: Vec<ColumnType>,
    names: Vec<String>,
    /// Indexes of the key columns, in key order.
    key: Vec<usize>,
    /// Indexes of the value columns, in file order.
    value: Vec<usize>,
}

fn schema(args: &LoadArgs, header: Option<&csv::ByteRecord>) -> anyhow::Result<Schema> {
    let mut names = Vec::new();
    let mut types = Vec::new();
    if args.columns.is_empty() {
        let Some(header) = header else {
            bail!("no --columns given and no header line to take them from");
        };
        for field in header {
            names.push(String::from_utf8_lossy(field).trim().to_string());
            types.push(ColumnType::Str);
        }
    } else {
        for spec in &args.columns {
            let (name, ty) = match spec.split_once(':') {
                Some((n, t)) => (
                    n,
                    ColumnType::parse(t)
                        .with_context(|| format!("column {n}: unknown type {t:?} (int, str, bytes)"))?,
                ),
                None => (spec.as_str(), ColumnType::Str),
            };
            names.push(name.trim().to_string());
            types.push(ty);
        }
    }
    let index_of = |name: &str| {
        names
            .iter()
            .position(|n| n == name)
            .with_context(|| format!("key column {name:?} is not among the columns {names:?}"))
    };
    let key = if args.key_columns.is_empty() {
        vec![0]
    } else {
        args.key_columns
            .iter()
            .map(|n| index_of(n))
            .collect::<anyhow::Result<Vec<_>>>()?
    };
    if names.is_empty() {
        bail!("the load has no columns");
    }
    let value = (0..names.len()).filter(|i| !key.contains(i)).collect();
    Ok(Schema {
        types,
        names,
        key,
        value,
    })
}

/// Line numbers of rows: `row + first_line + extra`, where `extra` changes only after a record
/// that spans lines (quoted newlines), kept as (first row, extra) change points.
#[derive(Default)]
struct LineMap {
    first_line: u64,
    changes: BTreeMap<u64, u64>,
}

impl LineMap {
    fn note(&mut self, row: u64, line: u64) {
        let extra = line.saturating_sub(self.first_line + row);
        let current = self.changes.range(..=row).next_back().map_or(0, |(_, e)| *e);
        if extra != current {
            self.changes.insert(row, extra);
        }
    }

    fn line_of(&self, row: u64) -> u64 {
        row + self.first_line + self.changes.range(..=row).next_back().map_or(0, |(_, e)| *e)
    }
}

/// Runs the load; returns the summary to print.
pub async fn run(client: &Client, args: &LoadArgs) -> anyhow::Result<String> {
    let (input, total_bytes): (Box<dyn Read + Send>, Option<u64>) = if args.file.as_os_str() == "-" {
        (Box::new(std::io::stdin()), None)
    } else {
        let f = std::fs::File::open(&args.file)
            .with_context(|| format!("cannot open {}", args.file.display()))?;
        let len = f.metadata().map(|m| m.len()).ok();
        (Box::new(f), len)
    };
    let bar = progress_bar(total_bytes);
    let counted = CountingReader {
        inner: input,
        bar: bar.clone(),
    };
    let mut reader = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .delimiter(if args.format == Format::Tsv { b'\t' } else { b',' })
        .buffer_capacity(1 << 20)
        .from_reader(counted);
    let mut record = csv::ByteRecord::new();
    let read =
        |reader: &mut csv::Reader<CountingReader>, record: &mut csv::ByteRecord| -> anyhow::Result<bool> {
            reader.read_byte_record(record).map_err(|e| {
                let line = e.position().map_or(0, |p| p.line());
                anyhow::anyhow!("line {line}: {e}")
            })
        };
    let with_header = args.header || args.columns.is_empty();
    let header = if with_header {
        if !read(&mut reader, &mut record)? {
            bail!("{}: empty input", args.file.display());
        }
        Some(record.clone())
    } else {
        None
    };
    let schema = schema(args, header.as_ref())?;
    let on_duplicate = match args.on_duplicate {
        Duplicates::Error => OnDuplicate::Error,
        Duplicates::Replace => OnDuplicate::Replace,
        Duplicates::Ignore => OnDuplicate::Ignore,
    };
    let started = Instant::now();
    let mut loader = client
        .bulk_load(on_duplicate)
        .await
        .context("cannot start the bulk load")?;
    let mut lines = LineMap {
        first_line: if with_header { 2 } else { 1 },
        ..LineMap::default()
    };
    let mut row: u64 = 0;
    let prefix = args.prefix.as_bytes();
    loop {
        let more = match read(&mut reader, &mut record) {
            Ok(more) => more,
            Err(e) => {
                loader.cancel().await;
                bar.abandon();
                return Err(e.context("the load was cancelled: nothing of it was applied"));
            }
        };
        if !more {
            break;
        }
        let line = record.position().map_or(0, |p| p.line());
        lines.note(row, line);
        match encode_row(&schema, prefix, &record) {
            Ok((key, value)) => {
                if let Err(e) = loader.push(key, value).await {
                    bar.abandon();
                    return Err(load_error(e, &lines));
                }
            }
            Err(reason) => {
                loader.cancel().await;
                bar.abandon();
                bail!("line {line}: {reason}; the load was cancelled: nothing of it was applied");
            }
        }
        row += 1;
        if row.is_multiple_of(65_536) {
            bar.set_message(format!(
                "{row} rows, {:.0} rows/s",
                row as f64 / started.elapsed().as_secs_f64().max(1e-3)
            ));
        }
    }
    bar.set_message(format!("{row} rows read, committing"));
    let report = loader.commit().await.map_err(|e| load_error(e, &lines))?;
    bar.finish_and_clear();
    let secs = started.elapsed().as_secs_f64();
    Ok(format!(
        "Records: {}  Written: {}  Replaced: {}  Skipped: {}  Warnings: 0\n\
         {:.2} s, {:.0} rows/s; {} chunks, {} compressed bytes replicated; committed at log index {}\n",
        report.rows_read,
        report.rows_written,
        report.rows_replaced,
        report.rows_skipped,
        secs,
        report.rows_read as f64 / secs.max(1e-9),
        report.chunks,
        report.staged_bytes,
        report.log_index,
    ))
}

/// The key and value of one record.
fn encode_row(
    schema: &Schema,
    prefix: &[u8],
    record: &csv::ByteRecord,
) -> Result<(Vec<u8>, Vec<u8>), String> {
    if record.len() != schema.types.len() {
        return Err(format!(
            "{} columns, expected {}",
            record.len(),
            schema.types.len()
        ));
    }
    let field = |i: usize| record.get(i).unwrap_or_default();
    let ty = |i: usize| schema.types.get(i).copied().unwrap_or(ColumnType::Str);
    let name = |i: usize| schema.names.get(i).map_or("?", String::as_str);
    let mut key = prefix.to_vec();
    for &i in &schema.key {
        rows::encode_key_field(&mut key, ty(i), field(i))
            .map_err(|e| format!("column {} ({}): {e}", i + 1, name(i)))?;
    }
    let mut value = Vec::new();
    rows::begin_value(&mut value);
    for &i in &schema.value {
        rows::encode_value_field(&mut value, ty(i), field(i))
            .map_err(|e| format!("column {} ({}): {e}", i + 1, name(i)))?;
    }
    Ok((key, value))
}

/// A load error, with row numbers turned into line numbers.
fn load_error(e: Error, lines: &LineMap) -> anyhow::Error {
    match e {
        Error::DuplicateKey {
            first_row: Some(first),
            second_row,
            ..
        } => anyhow::anyhow!(
            "duplicate key on lines {} and {} (--on-duplicate error): nothing of the load was applied",
            lines.line_of(first),
            lines.line_of(second_row)
        ),
        Error::DuplicateKey {
            first_row: None,
            second_row,
            ..
        } => anyhow::anyhow!(
            "the key of line {} exists already (--on-duplicate error): nothing of the load was applied",
            lines.line_of(second_row)
        ),
        Error::Ambiguous { message } => {
            anyhow::anyhow!("the load's outcome is unknown (it may or may not have committed): {message}")
        }
        other => anyhow::anyhow!("the load failed, nothing of it was applied: {other}"),
    }
}

fn progress_bar(total_bytes: Option<u64>) -> indicatif::ProgressBar {
    use std::io::IsTerminal;
    let bar = match total_bytes {
        Some(len) => indicatif::ProgressBar::new(len).with_style(
            indicatif::ProgressStyle::with_template(
                "{bytes}/{total_bytes} {wide_bar} {bytes_per_sec} eta {eta} {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        ),
        None => indicatif::ProgressBar::new_spinner().with_style(
            indicatif::ProgressStyle::with_template("{spinner} {bytes} {bytes_per_sec} {msg}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_spinner()),
        ),
    };
    if !std::io::stderr().is_terminal() {
        bar.set_draw_target(indicatif::ProgressDrawTarget::hidden());
    }
    bar
}

struct CountingReader {
    inner: Box<dyn Read + Send>,
    bar: indicatif::ProgressBar,
}

impl Read for CountingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.bar.inc(n as u64);
        Ok(n)
    }
}
