//! `ftkv-bench bulk`: the bulk load (`ftkvctl load`, one `Kv.BulkLoad` operation) against the
//! same rows inserted row by row with `Put`, through a three-node cluster.
//!
//! The input is the seed's `user_summary(user_id, weight, level, beat_rate, level_num)` table as
//! TSV sorted by `user_id`, generated here once ([`write_user_summary`], the rows of
//! `tests/bench/gen-user-summary.py`) into `--out` (or, with `--temp-tsv`, a temporary directory)
//! and reused by every run. Each run of each target then:
//!
//! 1. **bulk**: starts a fresh playground (`ftkv-node playground`, fsync on, in a temporary
//!    directory), waits for a leader and times the real `ftkvctl` (the one beside the
//!    `ftkv-node`, see [`crate::ftkv::node_binary`]) loading the whole file end to end as a child
//!    process: `ftkvctl load FILE --format tsv --columns user_id:int,weight,level,beat_rate,
//!    level_num:int --key-columns user_id --prefix user_summary/`. Afterwards every node must hold
//!    exactly `--rows` keys under the prefix (a keys-only serializable `Scan` of that node alone,
//!    page by page), and the on-disk size of each node's engine (`node-i/engine`) and Raft log
//!    (`node-i/log`) is measured, both as file lengths and as allocated blocks, once while the
//!    cluster runs and once at rest, after a clean stop (SIGTERM: every node checkpoints its
//!    engine at shutdown; until its first checkpoint a small load lives in the Raft log only);
//! 2. **row by row**: starts another fresh playground and inserts the first `--put-rows` rows of
//!    the same file with one `Put` each from `--clients` concurrent tasks (one request in flight
//!    each), keys and values encoded as the loader encodes them ([`ftkv_client::rows`]), so the
//!    data is the same; timed from the first request to the last acknowledgement; then the same
//!    per-node check (`--put-rows` keys on every node) and sizes.
//!
//! Each round first runs the **embedded** phase (unless `--skip-embedded`): the same file into
//! `ftkv_embedded::Db::bulk_load` in this process, the engine's bulk path with no network and
//! no replica ([`embedded`]).
//!
//! The figure is bulk rows/s ÷ row-by-row rows/s (the seed: 3.9x). Medians over the runs are
//! printed as a table and written with every run, the ratio and the sizes (against the size of
//! the text) to `DIR/results.json`; `DIR/bulk.svg` is a bar chart of the rows/s medians with
//! their min/max. Targets (`--targets ftkv,ftkv@/tmp/before`) alternate within a round, as in
//! `ftkv-bench cluster`; `ftkv@DIR` runs the `ftkv-node` and `ftkvctl` in DIR.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ftkv_client::rows::{self, ColumnType};
use serde::Serialize;

use crate::ftkv::{node_binary, FtkvCluster};

mod embedded;
mod summary;
use summary::summary_of;
#[cfg(test)]
mod tests;

pub use embedded::EmbeddedPhase;

/// The key prefix of the loaded table.
pub const PREFIX: &str = "user_summary/";
/// `--columns` of the load.
pub const COLUMNS: &str = "user_id:int,weight,level,beat_rate,level_num:int";
/// Types of the columns, in file order (as `COLUMNS` declares them; untyped columns are `str`).
const TYPES: [ColumnType; 5] = [
    ColumnType::Int,
    ColumnType::Str,
    ColumnType::Str,
    ColumnType::Str,
    ColumnType::Int,
];
const LEVELS: [&str; 6] = [
    "Bronze I",
    "Silver II",
    "Gold III",
    "Platinum IV",
    "Diamond V",
    "Master",
];
/// The first `user_id`; ids step by 3.
const FIRST_USER_ID: u64 = 13_000_000_000;

/// `ftkv-bench bulk` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct BulkArgs {
    /// Rows of the generated table (all of them bulk loaded).
    #[arg(long, default_value_t = 2_000_000)]
    pub rows: u64,
    /// Rounds; each runs every target once (bulk, then row by row).
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Rows inserted row by row with `Put` (the first ones of the file).
    #[arg(long, default_value_t = 200_000)]
    pub put_rows: u64,
    /// Concurrent `Put` clients of the row-by-row phase (one request in flight each).
    #[arg(long, default_value_t = 128)]
    pub clients: usize,
    /// Output directory (results.json, bulk.svg, and the TSV unless --temp-tsv).
    #[arg(long, default_value = "store/bench-bulk")]
    pub out: PathBuf,
    /// Write the TSV into a temporary directory, removed at the end, instead of --out.
    #[arg(long)]
    pub temp_tsv: bool,
    /// First port used by the clusters (each target and phase takes 20 from here).
    #[arg(long, default_value_t = 25000)]
    pub base_port: u16,
    /// Comma-separated targets: `ftkv` (the `ftkv-node` and `ftkvctl` in `FTKV_BIN_DIR` or
    /// beside this executable) or `ftkv@DIR` (the ones in DIR: two builds side by side).
    #[arg(long, default_value = "ftkv")]
    pub targets: String,
    /// Skip the embedded phase (the same file into `ftkv_embedded::Db::bulk_load` in this
    /// process, once per round before the targets).
    #[arg(long)]
    pub skip_embedded: bool,
}

/// Bytes of one node's data dir.
#[derive(Debug, Clone, Default, Serialize)]
pub struct NodeSize {
    /// Node (1-based).
    pub node: u64,
    /// Sum of the file lengths under `engine`.
    pub engine_bytes: u64,
    /// Blocks allocated under `engine`, bytes.
    pub engine_allocated_bytes: u64,
    /// Sum of the file lengths under `log` (segments are preallocated).
    pub log_bytes: u64,
    /// Blocks allocated under `log`, bytes.
    pub log_allocated_bytes: u64,
    /// Sum of the file lengths of the whole data dir.
    pub total_bytes: u64,
}

/// One phase (bulk or row by row) of one run.
#[derive(Debug, Clone, Serialize)]
pub struct Phase {
    /// Rows written.
    pub rows: u64,
    /// End to end, seconds.
    pub secs: f64,
    /// `rows / secs`.
    pub rows_per_sec: f64,
    /// Keys under the prefix on each node afterwards (all equal to `rows`).
    pub keys_per_node: Vec<u64>,
    /// Data dir sizes right after the check, the cluster still running (the engine may not
    /// have checkpointed the rows yet: until then they live in the Raft log).
    pub sizes_running: Vec<NodeSize>,
    /// Data dir sizes at rest, after a clean stop (every node checkpoints at shutdown).
    pub sizes: Vec<NodeSize>,
    /// Whether the playground stopped within 15 s of its SIGTERM (else it was killed, and
    /// `sizes` are those of a crash).
    pub stopped_cleanly: bool,
}

/// One run of one target.
#[derive(Debug, Clone, Serialize)]
pub struct BulkRun {
    /// Target (`ftkv` or `ftkv@DIR`).
    pub target: String,
    /// Round (1-based).
    pub run: u64,
    /// `ftkvctl load` of the whole file.
    pub bulk: Phase,
    /// `ftkvctl load`'s own summary (stdout).
    pub ftkvctl_output: String,
    /// The first `put_rows` rows by `Put`.
    pub put: Phase,
    /// `bulk.rows_per_sec / put.rows_per_sec`.
    pub ratio: f64,
}

/// Median, min and max of a figure over the runs.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Median.
    pub median: f64,
    /// Lowest run.
    pub min: f64,
    /// Highest run.
    pub max: f64,
}

impl Spread {
    pub fn of(values: &[f64]) -> Self {
        Spread {
            median: crate::median(values),
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        }
    }
}

/// The medians of one target.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// Target.
    pub target: String,
    /// Bulk load rows/s.
    pub bulk_rows_per_sec: Spread,
    /// Row-by-row rows/s.
    pub put_rows_per_sec: Spread,
    /// Median bulk rows/s ÷ median row-by-row rows/s: the figure.
    pub ratio_of_medians: f64,
    /// The per-run ratios.
    pub ratio: Spread,
    /// Median over runs of the largest node's engine after the bulk load, bytes (file lengths).
    pub bulk_engine_bytes: f64,
    /// The same, over the text size.
    pub bulk_engine_over_text: f64,
    /// Median over runs of the largest node's Raft log after the bulk load, bytes.
    pub bulk_log_bytes: f64,
    /// The same, over the text size.
    pub bulk_log_over_text: f64,
}

#[derive(Serialize)]
struct Report {
    machine: String,
    rows: u64,
    put_rows: u64,
    clients: usize,
    columns: &'static str,
    prefix: &'static str,
    /// Size of the TSV, bytes.
    text_bytes: u64,
    /// Size of the first `put_rows` lines of the TSV, bytes.
    put_text_bytes: u64,
    runs: Vec<BulkRun>,
    /// The embedded phase of each round (empty with `--skip-embedded`).
    embedded_runs: Vec<EmbeddedPhase>,
    /// Median, min and max rows/s of the embedded phase.
    embedded_rows_per_sec: Option<Spread>,
    summary: Vec<Summary>,
}

/// Line `i` (0-based) of the table: `user_id  weight  level  beat_rate  level_num`, as
/// `gen-user-summary.py` writes it.
pub fn user_summary_line(out: &mut Vec<u8>, i: u64) {
    let uid = FIRST_USER_ID + 3 * i;
    let h = uid.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let _ = writeln!(
        out,
        "{uid}\t{}.{}\t{}\t{}.{:02}%\t{}",
        40 + h % 80,
        h % 10,
        LEVELS[((h >> 8) % 6) as usize],
        (h >> 16) % 100,
        (h >> 24) % 100,
        (h >> 32) % 1000
    );
}

/// Writes `rows` rows of the table to `path`, sorted by `user_id`; returns its size in bytes.
pub fn write_user_summary(path: &Path, rows: u64) -> anyhow::Result<u64> {
    let file = std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = std::io::BufWriter::with_capacity(1 << 20, file);
    let mut line = Vec::with_capacity(64);
    for i in 0..rows {
        line.clear();
        user_summary_line(&mut line, i);
        w.write_all(&line)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    w.flush()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(std::fs::metadata(path)?.len())
}

/// The key and value of one TSV line, as `ftkvctl load --columns COLUMNS --key-columns user_id
/// --prefix PREFIX` encodes them.
pub fn encode_line(line: &[u8]) -> anyhow::Result<(Vec<u8>, Vec<u8>)> {
    let fields: Vec<&[u8]> = line.split(|&b| b == b'\t').collect();
    anyhow::ensure!(
        fields.len() == TYPES.len(),
        "{} columns, expected {}: {:?}",
        fields.len(),
        TYPES.len(),
        String::from_utf8_lossy(line)
    );
    let mut key = PREFIX.as_bytes().to_vec();
    rows::encode_key_field(&mut key, TYPES[0], fields[0]).map_err(|e| anyhow::anyhow!("user_id: {e}"))?;
    let mut value = Vec::with_capacity(48);
    rows::begin_value(&mut value);
    for (ty, field) in TYPES.iter().zip(&fields).skip(1) {
        rows::encode_value_field(&mut value, *ty, field).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    Ok((key, value))
}

/// Encoded rows: (key, value).
type Pairs = Vec<(Vec<u8>, Vec<u8>)>;

/// The first `n` rows of the TSV at `path`, encoded; and the bytes of text they came from.
fn read_pairs(path: &Path, n: u64) -> anyhow::Result<(Pairs, u64)> {
    use std::io::BufRead;
    let file = std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut reader = std::io::BufReader::with_capacity(1 << 20, file);
    let mut pairs = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    let mut line = Vec::new();
    let mut bytes = 0;
    while (pairs.len() as u64) < n {
        line.clear();
        let read = reader
            .read_until(b'\n', &mut line)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if read == 0 {
            break;
        }
        bytes += read as u64;
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        pairs.push(encode_line(text).with_context(|| format!("line {}", pairs.len() + 1))?);
    }
    anyhow::ensure!(
        pairs.len() as u64 == n,
        "{} has {} rows, fewer than --put-rows {n}",
        path.display(),
        pairs.len()
    );
    Ok((pairs, bytes))
}

/// The end of the prefix's key range.
fn prefix_end() -> Vec<u8> {
    let mut end = PREFIX.as_bytes().to_vec();
    if let Some(last) = end.last_mut() {
        *last += 1;
    }
    end
}

/// Keys under [`PREFIX`] on the node at `endpoint` alone: a keys-only serializable (local) scan,
/// page by page along the continuation key.
async fn keys_on(endpoint: &str) -> anyhow::Result<u64> {
    use ftkv_proto::v1::kv_client::KvClient;
    use ftkv_proto::v1::{ReadConsistency, ScanRequest};
    let mut kv = KvClient::connect(format!("http://{endpoint}"))
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?
        .max_decoding_message_size(64 << 20);
    let end = prefix_end();
    let mut cursor = PREFIX.as_bytes().to_vec();
    let mut count = 0;
    loop {
        let page = kv
            .scan(ScanRequest {
                start: cursor.clone(),
                end: end.clone(),
                limit: 10_000,
                consistency: ReadConsistency::Serializable as i32,
                keys_only: true,
            })
            .await
            .with_context(|| format!("scan of {endpoint}"))?
            .into_inner();
        count += page.kvs.len() as u64;
        if !page.more {
            return Ok(count);
        }
        anyhow::ensure!(
            page.next_start > cursor,
            "scan of {endpoint}: the continuation key did not advance"
        );
        cursor = page.next_start;
    }
}

/// Keys under the prefix on every node once each holds `expected` (followers apply a moment
/// after the leader acknowledged); fails after 120 s with the counts seen last.
async fn check_every_node(cluster: &FtkvCluster, expected: u64) -> anyhow::Result<Vec<u64>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut counts = Vec::new();
        for e in &cluster.endpoints {
            counts.push(keys_on(e).await?);
        }
        if counts.iter().all(|c| *c == expected) {
            return Ok(counts);
        }
        anyhow::ensure!(
            counts.iter().all(|c| *c <= expected) && Instant::now() < deadline,
            "expected {expected} keys under {PREFIX} on every node, found {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Sum of file lengths and of allocated bytes under `dir` (0 when absent).
pub fn dir_bytes(dir: &Path) -> anyhow::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let mut len = 0;
    let mut allocated = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", d.display())),
        };
        for entry in entries {
            let entry = entry.with_context(|| format!("cannot read {}", d.display()))?;
            let meta = match entry.metadata() {
                Ok(meta) => meta,
                // A file removed meanwhile (a purged log segment).
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(e).with_context(|| format!("cannot stat {}", entry.path().display())),
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                len += meta.len();
                allocated += meta.blocks() * 512;
            }
        }
    }
    Ok((len, allocated))
}

/// Sizes of every node's data dir (`DIR/node-i`).
pub fn node_sizes(cluster: &FtkvCluster) -> anyhow::Result<Vec<NodeSize>> {
    (1..=cluster.endpoints.len() as u64)
        .map(|node| {
            let data = cluster.dir().join(format!("node-{node}"));
            let (engine_bytes, engine_allocated_bytes) = dir_bytes(&data.join("engine"))?;
            let (log_bytes, log_allocated_bytes) = dir_bytes(&data.join("log"))?;
            let (total_bytes, _) = dir_bytes(&data)?;
            Ok(NodeSize {
                node,
                engine_bytes,
                engine_allocated_bytes,
                log_bytes,
                log_allocated_bytes,
                total_bytes,
            })
        })
        .collect()
}

/// A fresh playground of `target` with a leader.
async fn start_cluster(port: u16, bin_dir: Option<&Path>) -> anyhow::Result<FtkvCluster> {
    let cluster = FtkvCluster::start(port, "fractal", &[], bin_dir)
        .await
        .with_context(|| format!("cannot start a playground on port {port}"))?;
    let client = cluster.client().await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let statuses = client.status_all().await;
        if statuses
            .iter()
            .any(|(_, s)| s.as_ref().is_ok_and(|s| s.is_leader))
        {
            return Ok(cluster);
        }
        anyhow::ensure!(Instant::now() < deadline, "no leader after 60 s (port {port})");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The bulk phase: `ftkvctl load` of the whole file on a fresh cluster.
async fn bulk_phase(
    port: u16,
    bin_dir: Option<&Path>,
    tsv: &Path,
    rows: u64,
) -> anyhow::Result<(Phase, String)> {
    let ctl = node_binary(bin_dir)?.with_file_name("ftkvctl");
    anyhow::ensure!(
        ctl.is_file(),
        "{} not found: build it with `cargo build --release -p ftkv-client --bins`",
        ctl.display()
    );
    let cluster = start_cluster(port, bin_dir).await?;
    let mut cmd = tokio::process::Command::new(&ctl);
    cmd.arg(format!("--endpoints={}", cluster.endpoints.join(",")))
        .args(["--timeout=1h", "--request-timeout=10m", "load"])
        .arg(tsv)
        .args(["--format=tsv", &format!("--columns={COLUMNS}")])
        .args(["--key-columns=user_id", &format!("--prefix={PREFIX}")])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true);
    let started = Instant::now();
    let output = cmd
        .output()
        .await
        .with_context(|| format!("cannot run {}", ctl.display()))?;
    let secs = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&output.stdout).trim().to_string();
    anyhow::ensure!(
        output.status.success(),
        "ftkvctl load failed ({}): {}{}",
        output.status,
        stdout,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok((finish_phase(cluster, rows, secs).await?, stdout))
}

/// The row-by-row phase: `pairs` by `Put` from `clients` tasks on a fresh cluster.
async fn put_phase(
    port: u16,
    bin_dir: Option<&Path>,
    pairs: &Arc<Pairs>,
    clients: usize,
) -> anyhow::Result<Phase> {
    let cluster = start_cluster(port, bin_dir).await?;
    let client = cluster.client().await?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients.max(1) {
        let (client, pairs, next) = (client.clone(), Arc::clone(pairs), Arc::clone(&next));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((key, value)) = pairs.get(i) else {
                    return anyhow::Ok(());
                };
                client
                    .put(key, value)
                    .await
                    .with_context(|| format!("put of row {}", i + 1))?;
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.context("a put task panicked")??;
    }
    let secs = started.elapsed().as_secs_f64();
    let rows = pairs.len() as u64;
    finish_phase(cluster, rows, secs).await
}

/// The end of a phase: every node checked for `rows` keys, sizes taken running and after a
/// clean stop, the cluster dropped.
async fn finish_phase(mut cluster: FtkvCluster, rows: u64, secs: f64) -> anyhow::Result<Phase> {
    let keys_per_node = check_every_node(&cluster, rows).await?;
    let sizes_running = node_sizes(&cluster)?;
    let stopped_cleanly = cluster.stop();
    let sizes = node_sizes(&cluster)?;
    drop(cluster);
    Ok(Phase {
        rows,
        secs,
        rows_per_sec: rows as f64 / secs.max(1e-9),
        keys_per_node,
        sizes_running,
        sizes,
        stopped_cleanly,
    })
}

fn mb(bytes: f64) -> f64 {
    bytes / 1e6
}

fn largest(sizes: &[NodeSize], f: impl Fn(&NodeSize) -> u64) -> f64 {
    sizes.iter().map(f).max().unwrap_or(0) as f64
}

/// Runs `ftkv-bench bulk`.
pub async fn run(args: &BulkArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.rows > 0, "--rows must be > 0");
    anyhow::ensure!(
        args.put_rows <= args.rows,
        "--put-rows {} is more than --rows {}",
        args.put_rows,
        args.rows
    );
    let targets: Vec<String> = args
        .targets
        .split(',')
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect();
    anyhow::ensure!(!targets.is_empty(), "--targets is empty");
    let mut bin_dirs = Vec::new();
    for t in &targets {
        bin_dirs.push(match t.split_once('@') {
            None if t == "ftkv" => None,
            Some(("ftkv", dir)) if !dir.is_empty() => Some(PathBuf::from(dir)),
            _ => anyhow::bail!("unknown target {t:?} (ftkv, ftkv@DIR)"),
        });
    }
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let temp = if args.temp_tsv {
        Some(tempfile::Builder::new().prefix("ftkv-bench-bulk-").tempdir()?)
    } else {
        None
    };
    let tsv = temp
        .as_ref()
        .map_or(args.out.as_path(), |t| t.path())
        .join(format!("user_summary-{}.tsv", args.rows));
    eprintln!("== generating {} rows into {}", args.rows, tsv.display());
    let generated = Instant::now();
    let text_bytes = write_user_summary(&tsv, args.rows)?;
    eprintln!(
        "   {text_bytes} bytes ({:.1} MB) in {:.1} s",
        mb(text_bytes as f64),
        generated.elapsed().as_secs_f64()
    );
    let (pairs, put_text_bytes) = read_pairs(&tsv, args.put_rows)?;
    let pairs = Arc::new(pairs);

    let mut runs = Vec::new();
    let mut embedded_runs = Vec::new();
    for run in 1..=args.runs {
        if !args.skip_embedded {
            eprintln!(
                "== round {run}/{}: embedded: Db::bulk_load of {} rows in this process",
                args.runs, args.rows
            );
            let db_dir = tempfile::Builder::new()
                .prefix("ftkv-bench-embedded-")
                .tempdir()?;
            let phase = embedded::embedded_phase(&tsv, args.rows, &db_dir.path().join("db"))?;
            eprintln!(
                "   {:.2} s, {:.0} rows/s; {} keys after a reopen; {} leaves built, {} runs spilled; {:.1} MB on disk",
                phase.secs,
                phase.rows_per_sec,
                phase.keys,
                phase.leaves_built,
                phase.runs_spilled,
                mb(phase.disk_bytes as f64)
            );
            embedded_runs.push(phase);
        }
        for (i, (target, bin_dir)) in targets.iter().zip(&bin_dirs).enumerate() {
            let port = |phase: u16| {
                u16::try_from(i)
                    .ok()
                    .and_then(|i| i.checked_mul(40))
                    .and_then(|o| o.checked_add(20 * phase))
                    .and_then(|o| args.base_port.checked_add(o))
                    .context("--base-port too high for this many targets")
            };
            eprintln!(
                "== round {run}/{}: {target}: bulk load of {} rows (ftkvctl load)",
                args.runs, args.rows
            );
            let (bulk, ftkvctl_output) = bulk_phase(port(0)?, bin_dir.as_deref(), &tsv, args.rows).await?;
            eprintln!(
                "   {:.2} s, {:.0} rows/s; {} keys on every node; engine {:.1} MB, log {:.1} MB (largest node)",
                bulk.secs,
                bulk.rows_per_sec,
                args.rows,
                mb(largest(&bulk.sizes, |s| s.engine_bytes)),
                mb(largest(&bulk.sizes, |s| s.log_bytes)),
            );
            if !bulk.stopped_cleanly {
                eprintln!("   warning: the playground did not stop within 15 s of SIGTERM (killed)");
            }
            eprintln!(
                "== round {run}/{}: {target}: {} rows by Put ({} clients)",
                args.runs, args.put_rows, args.clients
            );
            let put = put_phase(port(1)?, bin_dir.as_deref(), &pairs, args.clients).await?;
            eprintln!(
                "   {:.2} s, {:.0} rows/s; {} keys on every node; ratio bulk / put {:.2}x",
                put.secs,
                put.rows_per_sec,
                args.put_rows,
                bulk.rows_per_sec / put.rows_per_sec.max(1e-9)
            );
            runs.push(BulkRun {
                target: target.clone(),
                run,
                ratio: bulk.rows_per_sec / put.rows_per_sec.max(1e-9),
                bulk,
                ftkvctl_output,
                put,
            });
        }
    }
    drop(temp);

    let summary: Vec<Summary> = targets
        .iter()
        .map(|t| {
            let rs: Vec<&BulkRun> = runs.iter().filter(|r| &r.target == t).collect();
            let of = |f: &dyn Fn(&BulkRun) -> f64| Spread::of(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
            let bulk_rows_per_sec = of(&|r| r.bulk.rows_per_sec);
            let put_rows_per_sec = of(&|r| r.put.rows_per_sec);
            let engine = of(&|r| largest(&r.bulk.sizes, |s| s.engine_bytes)).median;
            let log = of(&|r| largest(&r.bulk.sizes, |s| s.log_bytes)).median;
            let text = (text_bytes as f64).max(1.0);
            Summary {
                target: t.clone(),
                ratio_of_medians: bulk_rows_per_sec.median / put_rows_per_sec.median.max(1e-9),
                ratio: of(&|r| r.ratio),
                bulk_rows_per_sec,
                put_rows_per_sec,
                bulk_engine_bytes: engine,
                bulk_engine_over_text: engine / text,
                bulk_log_bytes: log,
                bulk_log_over_text: log / text,
            }
        })
        .collect();
    let report = Report {
        machine: format!(
            "{} cores",
            std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0)
        ),
        rows: args.rows,
        put_rows: args.put_rows,
        clients: args.clients,
        columns: COLUMNS,
        prefix: PREFIX,
        text_bytes,
        put_text_bytes,
        runs,
        embedded_rows_per_sec: (!embedded_runs.is_empty())
            .then(|| Spread::of(&embedded_runs.iter().map(|p| p.rows_per_sec).collect::<Vec<_>>())),
        embedded_runs,
        summary,
    };
    let results = args.out.join("results.json");
    std::fs::write(&results, serde_json::to_string_pretty(&report)?)
        .with_context(|| format!("cannot write {}", results.display()))?;
    summary_of(&report).write(&args.out)?;
    let bars: Vec<crate::plot::Bar> = report
        .embedded_rows_per_sec
        .map(|spread| ("embedded engine: bulk".to_string(), spread))
        .into_iter()
        .chain(report.summary.iter().flat_map(|s| {
            [
                (format!("{}: bulk", s.target), s.bulk_rows_per_sec),
                (format!("{}: row by row", s.target), s.put_rows_per_sec),
            ]
        }))
        .map(|(label, spread)| crate::plot::Bar {
            label,
            median: spread.median,
            min: spread.min,
            max: spread.max,
        })
        .collect();
    let chart = args.out.join("bulk.svg");
    std::fs::write(
        &chart,
        crate::plot::bar_chart(
            "user_summary: embedded bulk load, and into a three-node cluster: bulk load vs row-by-row Put",
            &format!(
                "ftkvctl load of {} rows vs {} rows by Put from {} clients; median, whiskers min-max of {} runs",
                args.rows, args.put_rows, args.clients, args.runs
            ),
            "rows/s",
            &bars,
        ),
    )
    .with_context(|| format!("cannot write {}", chart.display()))?;

    let w = report
        .summary
        .iter()
        .map(|s| s.target.len())
        .max()
        .unwrap_or(0)
        .max(6);
    println!(
        "text: {} rows, {:.1} MB ({} rows by Put: {:.1} MB)",
        report.rows,
        mb(text_bytes as f64),
        report.put_rows,
        mb(put_text_bytes as f64)
    );
    println!(
        "{:<w$} {:>14} {:>14} {:>7} {:>11} {:>8} {:>11} {:>8}",
        "target", "bulk rows/s", "put rows/s", "ratio", "engine MB", "/text", "log MB", "/text"
    );
    for s in &report.summary {
        println!(
            "{:<w$} {:>14.0} {:>14.0} {:>6.2}x {:>11.1} {:>8.2} {:>11.1} {:>8.2}",
            s.target,
            s.bulk_rows_per_sec.median,
            s.put_rows_per_sec.median,
            s.ratio_of_medians,
            mb(s.bulk_engine_bytes),
            s.bulk_engine_over_text,
            mb(s.bulk_log_bytes),
            s.bulk_log_over_text
        );
    }
    if let (Some(spread), Some(first)) = (report.embedded_rows_per_sec, report.embedded_runs.first()) {
        println!(
            "{:<w$} {:>14.0} {:>14} {:>7} {:>11.1} {:>8.2}",
            "embedded",
            spread.median,
            "-",
            "-",
            mb(first.disk_bytes as f64),
            first.disk_bytes as f64 / (text_bytes as f64).max(1.0)
        );
    }
    println!(
        "(medians of {} runs; sizes: the largest node after the bulk load, at rest after a clean stop, file lengths)",
        args.runs
    );
    println!("report: {}", results.display());
    Ok(())
}
