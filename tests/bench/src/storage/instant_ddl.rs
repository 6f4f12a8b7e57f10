//! `ftkv-bench instant-ddl --keys N --runs R --out DIR [--targets ftkv,etcd]`: the seed's
//! online-DDL table (TokuDB "add column" 0.01 s vs InnoDB 28.64 s on a 425 MB table) through a
//! three-node cluster: one range operation over N keys against touching them one by one.
//!
//! Each run of each target starts a fresh cluster and loads two ranges of N keys each, `ddl/a/`
//! and `ddl/b/` + a 12-digit index, whose values are 8-byte counters at 0 (batched writes, not
//! timed; etcd gets range A only), waits until every node holds them, then times:
//!
//! 1. ftkv **broadcast upsert**: one `Kv.Write` of `UpsertRange(ddl/a/, Add(1))` (TokuDB's
//!    broadcast message, the instant "add column"): until acknowledged, and until every node's
//!    own (serializable) reads of 10 sample keys across the range show 1; afterwards every node
//!    must hold N keys of value 1 in the range (a full scan, not timed);
//! 2. ftkv **DeleteRange** of `ddl/a/`: until acknowledged, and until every node's own reads see
//!    no key in the range;
//! 3. ftkv **one by one**: `Delete` of each of the N keys of `ddl/b/` from `--delete-clients`
//!    concurrent clients: until the last acknowledgement, and until every node sees none;
//! 4. etcd **DeleteRange** of `ddl/a/` (its response must report N deleted): until acknowledged,
//!    and until every member's serializable reads see none.
//!
//! Figures: medians over the runs of each time per target; ratios one-by-one ÷ DeleteRange
//! (ftkv) and etcd ÷ ftkv (DeleteRange). `DIR/instant_ddl.svg` is a bar chart of the medians.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use ftkv_proto::v1::kv_client::KvClient;
use ftkv_proto::v1::{GetRequest, ReadConsistency};
use serde::Serialize;

use super::targets::{self, Kind, LoadShape, Running};
use super::{bar, target_port};
use crate::etcd::pb;
use crate::summary::{command_line, Summary, SummaryRow};

const RANGE_A: &[u8] = b"ddl/a/";
const RANGE_B: &[u8] = b"ddl/b/";
/// How long after the acknowledgement reads may take to reflect an operation before the run
/// fails.
const VISIBLE_TIMEOUT: Duration = Duration::from_secs(600);

/// `ftkv-bench instant-ddl` flags.
#[derive(clap::Args, Debug, Clone)]
pub struct InstantDdlArgs {
    /// Comma-separated targets: ftkv, ftkv-sled, etcd.
    #[arg(long, default_value = "ftkv,etcd")]
    pub targets: String,
    /// Keys in each range.
    #[arg(long, default_value_t = 10_000_000)]
    pub keys: u64,
    /// Rounds; each runs every target once.
    #[arg(long, default_value_t = 3)]
    pub runs: u64,
    /// Rows per batch of the (untimed) load; at most 128 (etcd's `--max-txn-ops`).
    #[arg(long, default_value_t = 100)]
    pub batch_rows: u64,
    /// Concurrent writers of the load.
    #[arg(long, default_value_t = 8)]
    pub clients: u64,
    /// Concurrent clients of the one-by-one deletes (one `Delete` in flight each).
    #[arg(long, default_value_t = 64)]
    pub delete_clients: u64,
    /// Output directory.
    #[arg(long, default_value = "store/bench-instant-ddl")]
    pub out: PathBuf,
    /// First port (each target takes 20 from here).
    #[arg(long, default_value_t = 31400)]
    pub base_port: u16,
}

/// One timed operation.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timed {
    /// From the request to its (last) acknowledgement, milliseconds.
    pub ack_ms: f64,
    /// From the request until every node's reads reflect it, milliseconds.
    pub visible_ms: f64,
    /// The slowest of the reads that first saw the operation on each node, milliseconds: when
    /// close to `visible_ms - ack_ms`, the wait is the read itself (skipping deleted keys),
    /// not replication.
    pub slowest_read_ms: f64,
}

/// One run of one target.
#[derive(Debug, Clone, Serialize)]
pub struct InstantDdlRun {
    /// Target.
    pub target: String,
    /// Round (1-based).
    pub run: u64,
    /// Keys per range.
    pub keys: u64,
    /// Keys of each loaded range on each node before the operations.
    pub keys_per_node: Vec<u64>,
    /// ftkv: the broadcast upsert over range A.
    pub upsert_range: Option<Timed>,
    /// ftkv: keys of value 1 in range A on each node after the broadcast upsert.
    pub upserted_per_node: Vec<u64>,
    /// `DeleteRange` of range A.
    pub delete_range: Timed,
    /// etcd: keys its `DeleteRange` response reports deleted.
    pub etcd_deleted: Option<u64>,
    /// ftkv: range B deleted key by key.
    pub one_by_one: Option<Timed>,
    /// ftkv: failed single deletes (each retried).
    pub one_by_one_errors: u64,
    /// Keys left in the ranges on each node at the end (all 0).
    pub keys_left_per_node: Vec<u64>,
}

/// Medians of one target, milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct InstantDdlSummary {
    /// Target.
    pub target: String,
    /// Broadcast upsert (ftkv).
    pub upsert_range: Option<Timed>,
    /// DeleteRange.
    pub delete_range: Timed,
    /// One by one (ftkv).
    pub one_by_one: Option<Timed>,
    /// One-by-one acknowledgement ÷ DeleteRange acknowledgement (ftkv).
    pub one_by_one_over_delete_range: Option<f64>,
}

#[derive(Serialize)]
struct Report {
    workload: &'static str,
    machine: String,
    keys: u64,
    delete_clients: u64,
    runs: Vec<InstantDdlRun>,
    summary: Vec<InstantDdlSummary>,
    /// `a / b` of the median DeleteRange acknowledgement, every pair.
    ratios: Vec<(String, f64)>,
}

/// Key `i` of the range `prefix`.
fn key(prefix: &[u8], i: u64) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(format!("{i:012}").as_bytes());
    k
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1000.0
}

/// Runs `ftkv-bench instant-ddl`.
pub async fn run(args: &InstantDdlArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.keys > 0, "--keys must be > 0");
    anyhow::ensure!(args.runs > 0, "--runs must be > 0");
    anyhow::ensure!(
        (1..=targets::ETCD_MAX_TXN_OPS as u64).contains(&args.batch_rows),
        "--batch-rows must be 1..=128"
    );
    let targets = targets::parse_targets(&args.targets, &["ftkv", "ftkv-sled", "etcd"])?;
    std::fs::create_dir_all(&args.out).with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut runs = Vec::new();
    for run in 1..=args.runs {
        for (i, (name, kind)) in targets.iter().enumerate() {
            eprintln!(
                "== round {run}/{}: {name}: {} keys per range",
                args.runs, args.keys
            );
            let r = one_run(args, name, *kind, target_port(args.base_port, i)?, run).await?;
            let fmt = |t: Option<Timed>| {
                t.map_or("-".to_string(), |t| {
                    format!(
                        "ack {:.1} ms, visible {:.1} ms (slowest read {:.1} ms)",
                        t.ack_ms, t.visible_ms, t.slowest_read_ms
                    )
                })
            };
            eprintln!(
                "   {name}: DeleteRange {}; broadcast upsert {}; one by one {}",
                fmt(Some(r.delete_range)),
                fmt(r.upsert_range),
                fmt(r.one_by_one)
            );
            runs.push(r);
        }
    }
    let summary = targets.iter().map(|(t, _)| summarize(t, &runs)).collect();
    write_report(args, runs, summary)
}

async fn one_run(
    args: &InstantDdlArgs,
    name: &str,
    kind: Kind,
    port: u16,
    run: u64,
) -> anyhow::Result<InstantDdlRun> {
    let target = Arc::new(Running::start(kind, port, &[]).await?);
    let ftkv = matches!(kind, Kind::Ftkv(_));
    let ranges: &[&[u8]] = if ftkv { &[RANGE_A, RANGE_B] } else { &[RANGE_A] };
    let mut keys_per_node = Vec::new();
    for prefix in ranges {
        let shape = LoadShape {
            rows: args.keys,
            batch_rows: args.batch_rows,
            clients: args.clients,
            stall_secs: 120,
        };
        let p = prefix.to_vec();
        let label = format!("{name} run {run} load {}", String::from_utf8_lossy(prefix));
        let load = targets::load(&target, shape, &label, move |i| {
            Some((key(&p, i), 0i64.to_le_bytes().to_vec()))
        })
        .await;
        anyhow::ensure!(
            load.rows_acknowledged == args.keys,
            "{name}: {} of {} keys acknowledged",
            load.rows_acknowledged,
            args.keys
        );
        let end = super::prefix_end(prefix);
        keys_per_node =
            super::wait_for_keys(&target, prefix, &end, args.keys, Duration::from_secs(300)).await?;
    }
    let readers = Readers::connect(&target)?;
    let mut r = InstantDdlRun {
        target: name.to_string(),
        run,
        keys: args.keys,
        keys_per_node,
        upsert_range: None,
        upserted_per_node: Vec::new(),
        delete_range: Timed {
            ack_ms: 0.0,
            visible_ms: 0.0,
            slowest_read_ms: 0.0,
        },
        etcd_deleted: None,
        one_by_one: None,
        one_by_one_errors: 0,
        keys_left_per_node: Vec::new(),
    };
    match &*target {
        Running::Ftkv(_, client) => {
            r.upsert_range = Some(upsert_range(client, &readers, args.keys).await?);
            r.upserted_per_node = upserted_per_node(&target, args.keys).await?;
            r.delete_range = ftkv_delete_range(client, &readers).await?;
            let (timed, errors) = one_by_one(client, &readers, args.keys, args.delete_clients).await?;
            r.one_by_one = Some(timed);
            r.one_by_one_errors = errors;
        }
        Running::Etcd(cluster, _) => {
            let (timed, deleted) = etcd_delete_range(&cluster.endpoints, &readers).await?;
            r.delete_range = timed;
            r.etcd_deleted = Some(deleted);
        }
    }
    r.keys_left_per_node = super::keys_on_each(&target, b"ddl/", &super::prefix_end(b"ddl/")).await?;
    Ok(r)
}

/// Per-node readers with open connections, for polling right after an acknowledgement.
enum Readers {
    Ftkv(Vec<KvClient<tonic::transport::Channel>>),
    Etcd(Vec<pb::kv_client::KvClient<tonic::transport::Channel>>),
}

impl Readers {
    fn connect(target: &Running) -> anyhow::Result<Self> {
        let channels = target
            .endpoints()
            .iter()
            .map(|e| targets::channel(e))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(match target {
            Running::Ftkv(..) => Readers::Ftkv(channels.into_iter().map(KvClient::new).collect()),
            Running::Etcd(..) => {
                Readers::Etcd(channels.into_iter().map(pb::kv_client::KvClient::new).collect())
            }
        })
    }

    fn nodes(&self) -> usize {
        match self {
            Readers::Ftkv(c) => c.len(),
            Readers::Etcd(c) => c.len(),
        }
    }

    /// Whether node `i` alone sees no key under `prefix`.
    async fn empty_on(&self, i: usize, prefix: &[u8]) -> anyhow::Result<bool> {
        let end = super::prefix_end(prefix);
        match self {
            Readers::Ftkv(c) => {
                let page = c[i]
                    .clone()
                    .scan(ftkv_proto::v1::ScanRequest {
                        start: prefix.to_vec(),
                        end,
                        limit: 1,
                        consistency: ReadConsistency::Serializable as i32,
                        keys_only: true,
                    })
                    .await?
                    .into_inner();
                Ok(page.kvs.is_empty())
            }
            Readers::Etcd(c) => {
                let r = c[i]
                    .clone()
                    .range(pb::RangeRequest {
                        key: prefix.to_vec(),
                        range_end: end,
                        limit: 1,
                        serializable: true,
                        keys_only: true,
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                Ok(r.kvs.is_empty())
            }
        }
    }

    /// Whether node `i` alone reads the counter `want` at every key of `keys` (ftkv).
    async fn counters_on(&self, i: usize, keys: &[Vec<u8>], want: i64) -> anyhow::Result<bool> {
        let Readers::Ftkv(c) = self else {
            anyhow::bail!("counters are read on ftkv only");
        };
        for k in keys {
            let r = c[i]
                .clone()
                .get(GetRequest {
                    key: k.clone(),
                    consistency: ReadConsistency::Serializable as i32,
                })
                .await?
                .into_inner();
            if !r.found || ftkv_client::decode_counter(&r.value) != Some(want) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Milliseconds from `started` until `check(node)` holds on every node (each node polled
    /// until it holds once; nothing writes meanwhile, so it keeps holding), and the slowest
    /// read that first saw it; fails [`VISIBLE_TIMEOUT`] after the call (the acknowledgement).
    async fn until_every_node<F, Fut>(&self, started: Instant, check: F) -> anyhow::Result<(f64, f64)>
    where
        F: Fn(usize) -> Fut,
        Fut: std::future::Future<Output = anyhow::Result<bool>>,
    {
        let mut pending: Vec<usize> = (0..self.nodes()).collect();
        let mut slowest_read_ms = 0.0f64;
        let deadline = Instant::now() + VISIBLE_TIMEOUT;
        while !pending.is_empty() {
            anyhow::ensure!(
                Instant::now() < deadline,
                "nodes {pending:?} did not reflect the operation within {VISIBLE_TIMEOUT:?}"
            );
            let mut still = Vec::new();
            for i in pending {
                let read = Instant::now();
                if check(i).await? {
                    slowest_read_ms = slowest_read_ms.max(ms(read));
                } else {
                    still.push(i);
                }
            }
            pending = still;
            if !pending.is_empty() {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        }
        Ok((ms(started), slowest_read_ms))
    }
}

/// 10 keys spread over range A: the first, the last and 8 between.
fn sample_keys(keys: u64) -> Vec<Vec<u8>> {
    let mut idx: Vec<u64> = (0..10).map(|j| j * (keys - 1) / 9).collect();
    idx.dedup();
    idx.into_iter().map(|i| key(RANGE_A, i)).collect()
}

async fn upsert_range(client: &ftkv_client::Client, readers: &Readers, keys: u64) -> anyhow::Result<Timed> {
    let samples = sample_keys(keys);
    let started = Instant::now();
    client
        .write(vec![ftkv_client::Op::UpsertRange {
            start: RANGE_A.to_vec(),
            end: super::prefix_end(RANGE_A),
            op: ftkv_client::UpsertOp::Add(1),
        }])
        .await
        .context("broadcast upsert")?;
    let ack_ms = ms(started);
    let (visible_ms, slowest_read_ms) = readers
        .until_every_node(started, |i| readers.counters_on(i, &samples, 1))
        .await?;
    Ok(Timed {
        ack_ms,
        visible_ms,
        slowest_read_ms,
    })
}

/// Keys of counter value 1 in range A on each node (a full serializable scan of each).
async fn upserted_per_node(target: &Running, keys: u64) -> anyhow::Result<Vec<u64>> {
    let end = super::prefix_end(RANGE_A);
    let mut counts = Vec::new();
    for e in target.endpoints() {
        let mut kv = KvClient::new(targets::channel(e)?).max_decoding_message_size(64 << 20);
        let (mut cursor, mut ones) = (RANGE_A.to_vec(), 0u64);
        loop {
            let page = kv
                .scan(ftkv_proto::v1::ScanRequest {
                    start: cursor.clone(),
                    end: end.clone(),
                    limit: 10_000,
                    consistency: ReadConsistency::Serializable as i32,
                    keys_only: false,
                })
                .await?
                .into_inner();
            ones += page
                .kvs
                .iter()
                .filter(|kv| ftkv_client::decode_counter(&kv.value) == Some(1))
                .count() as u64;
            if !page.more {
                break;
            }
            anyhow::ensure!(page.next_start > cursor, "scan of {e}: no progress");
            cursor = page.next_start;
        }
        anyhow::ensure!(ones == keys, "node {e}: {ones} of {keys} keys upserted");
        counts.push(ones);
    }
    Ok(counts)
}

async fn ftkv_delete_range(client: &ftkv_client::Client, readers: &Readers) -> anyhow::Result<Timed> {
    let started = Instant::now();
    client.delete_prefix(RANGE_A).await.context("DeleteRange")?;
    let ack_ms = ms(started);
    let (visible_ms, slowest_read_ms) = readers
        .until_every_node(started, |i| readers.empty_on(i, RANGE_A))
        .await?;
    Ok(Timed {
        ack_ms,
        visible_ms,
        slowest_read_ms,
    })
}

/// Deletes range B key by key from `clients` tasks; returns the times and the failed requests.
async fn one_by_one(
    client: &ftkv_client::Client,
    readers: &Readers,
    keys: u64,
    clients: u64,
) -> anyhow::Result<(Timed, u64)> {
    let next = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients.max(1) {
        let (client, next, errors) = (client.clone(), Arc::clone(&next), Arc::clone(&errors));
        tasks.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= keys {
                    return;
                }
                let k = key(RANGE_B, i);
                while client.delete(&k).await.is_err() {
                    errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        });
    }
    let progress = tokio::spawn({
        let next = Arc::clone(&next);
        async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let sent = next.load(Ordering::Relaxed).min(keys);
                eprintln!(
                    "  [one by one] {:>4.0}s {sent}/{keys} deletes sent",
                    started.elapsed().as_secs_f64()
                );
            }
        }
    });
    while let Some(done) = tasks.join_next().await {
        done.context("a delete task panicked")?;
    }
    progress.abort();
    let ack_ms = ms(started);
    let (visible_ms, slowest_read_ms) = readers
        .until_every_node(started, |i| readers.empty_on(i, RANGE_B))
        .await?;
    Ok((
        Timed {
            ack_ms,
            visible_ms,
            slowest_read_ms,
        },
        errors.load(Ordering::Relaxed),
    ))
}

async fn etcd_delete_range(endpoints: &[String], readers: &Readers) -> anyhow::Result<(Timed, u64)> {
    let first = endpoints.first().context("etcd has no member")?;
    let mut kv = pb::kv_client::KvClient::new(targets::channel(first)?);
    let started = Instant::now();
    let r = kv
        .delete_range(pb::DeleteRangeRequest {
            key: RANGE_A.to_vec(),
            range_end: super::prefix_end(RANGE_A),
            prev_kv: false,
        })
        .await
        .context("etcd DeleteRange")?
        .into_inner();
    let ack_ms = ms(started);
    let (visible_ms, slowest_read_ms) = readers
        .until_every_node(started, |i| readers.empty_on(i, RANGE_A))
        .await?;
    Ok((
        Timed {
            ack_ms,
            visible_ms,
            slowest_read_ms,
        },
        u64::try_from(r.deleted).unwrap_or(0),
    ))
}

fn summarize(target: &str, runs: &[InstantDdlRun]) -> InstantDdlSummary {
    let rs: Vec<&InstantDdlRun> = runs.iter().filter(|r| r.target == target).collect();
    let med = |f: &dyn Fn(&InstantDdlRun) -> Option<Timed>| {
        let ts: Vec<Timed> = rs.iter().filter_map(|r| f(r)).collect();
        (!ts.is_empty()).then(|| Timed {
            ack_ms: crate::median(&ts.iter().map(|t| t.ack_ms).collect::<Vec<_>>()),
            visible_ms: crate::median(&ts.iter().map(|t| t.visible_ms).collect::<Vec<_>>()),
            slowest_read_ms: crate::median(&ts.iter().map(|t| t.slowest_read_ms).collect::<Vec<_>>()),
        })
    };
    let delete_range = med(&|r| Some(r.delete_range)).unwrap_or(Timed {
        ack_ms: 0.0,
        visible_ms: 0.0,
        slowest_read_ms: 0.0,
    });
    let one_by_one = med(&|r| r.one_by_one);
    InstantDdlSummary {
        target: target.to_string(),
        upsert_range: med(&|r| r.upsert_range),
        one_by_one_over_delete_range: one_by_one.map(|o| o.ack_ms / delete_range.ack_ms.max(1e-9)),
        delete_range,
        one_by_one,
    }
}

fn write_report(
    args: &InstantDdlArgs,
    runs: Vec<InstantDdlRun>,
    summary: Vec<InstantDdlSummary>,
) -> anyhow::Result<()> {
    let ratios = summary
        .iter()
        .flat_map(|a| {
            summary.iter().filter(|b| b.target != a.target).map(move |b| {
                (
                    format!("{} / {}", a.target, b.target),
                    a.delete_range.ack_ms / b.delete_range.ack_ms.max(1e-9),
                )
            })
        })
        .collect();
    let report = Report {
        workload: "instant-ddl",
        machine: super::machine(),
        keys: args.keys,
        delete_clients: args.delete_clients,
        runs,
        summary,
        ratios,
    };
    super::write_results(&args.out, &report)?;
    Summary::new("instant-ddl", command_line(), summary_rows(&report)).write(&args.out)?;
    write_chart(args, &report)?;
    print_table(&report);
    Ok(())
}

fn summary_rows(report: &Report) -> Vec<SummaryRow> {
    let n = report.keys;
    let row = |metric: String, f: &dyn Fn(&InstantDdlSummary) -> Option<f64>| SummaryRow {
        metric,
        unit: "ms".into(),
        higher_is_better: false,
        values: report
            .summary
            .iter()
            .filter_map(|s| Some((s.target.clone(), f(s)?)))
            .collect(),
    };
    vec![
        row(format!("DeleteRange over {n} keys: acknowledged"), &|s| {
            Some(s.delete_range.ack_ms)
        }),
        row(
            format!("DeleteRange over {n} keys: every node's reads reflect it"),
            &|s| Some(s.delete_range.visible_ms),
        ),
        row(format!("broadcast upsert over {n} keys: acknowledged"), &|s| {
            s.upsert_range.map(|t| t.ack_ms)
        }),
        row(
            format!("broadcast upsert over {n} keys: every node's reads reflect it"),
            &|s| s.upsert_range.map(|t| t.visible_ms),
        ),
        row(format!("{n} keys deleted one by one: acknowledged"), &|s| {
            s.one_by_one.map(|t| t.ack_ms)
        }),
        row(
            format!("{n} keys deleted one by one: every node's reads reflect it"),
            &|s| s.one_by_one.map(|t| t.visible_ms),
        ),
    ]
    .into_iter()
    .filter(|r| !r.values.is_empty())
    .collect()
}

/// Picks one timed operation out of a run.
type Pick = dyn Fn(&InstantDdlRun) -> Option<Timed>;

fn write_chart(args: &InstantDdlArgs, report: &Report) -> anyhow::Result<()> {
    let mut bars = Vec::new();
    for s in &report.summary {
        let rs: Vec<&InstantDdlRun> = report.runs.iter().filter(|r| r.target == s.target).collect();
        let ops: [(&str, &Pick); 3] = [
            ("DeleteRange", &|r| Some(r.delete_range)),
            ("upsert range", &|r| r.upsert_range),
            ("one by one", &|r| r.one_by_one),
        ];
        for (op, f) in ops {
            let visible: Vec<f64> = rs.iter().filter_map(|r| f(r)).map(|t| t.visible_ms).collect();
            if !visible.is_empty() {
                bars.push(bar(format!("{}: {op}", s.target), &visible));
            }
        }
    }
    let chart = args.out.join("instant_ddl.svg");
    std::fs::write(
        &chart,
        crate::plot::bar_chart(
            &format!(
                "{} keys through a three-node cluster: until every node's reads reflect it",
                report.keys
            ),
            &format!("milliseconds; median, whiskers min-max of {} runs", args.runs),
            "ms",
            &bars,
        ),
    )
    .with_context(|| format!("cannot write {}", chart.display()))
}

fn print_table(report: &Report) {
    let w = report
        .summary
        .iter()
        .map(|s| s.target.len())
        .max()
        .unwrap_or(0)
        .max(6);
    let cell = |t: Option<Timed>| {
        t.map_or(format!("{:>21}", "-"), |t| {
            format!("{:>10.1} {:>10.1}", t.ack_ms, t.visible_ms)
        })
    };
    println!(
        "{:<w$} {:>21} {:>21} {:>21}",
        "target", "DeleteRange ack/vis", "upsert range ack/vis", "one by one ack/vis"
    );
    for s in &report.summary {
        println!(
            "{:<w$} {} {} {}",
            s.target,
            cell(Some(s.delete_range)),
            cell(s.upsert_range),
            cell(s.one_by_one)
        );
    }
    for s in &report.summary {
        if let Some(x) = s.one_by_one_over_delete_range {
            println!("ratio {}: one by one / DeleteRange (ack): {x:.1}x", s.target);
        }
    }
    for (name, ratio) in &report.ratios {
        println!("ratio DeleteRange ack {name}: {ratio:.2}x");
    }
    println!("(milliseconds, medians of the runs)");
}
