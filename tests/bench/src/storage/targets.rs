//! The three-node clusters the storage workloads run against, and the batched load they share.
//!
//! Targets: `ftkv` (playground, fractal engine), `ftkv-sled` (the same cluster on the sled
//! engine), both through [`crate::ftkv::FtkvCluster`] with extra node flags, and `etcd` (three
//! members, [`crate::etcd::EtcdCluster`]). Writes go in batches: ftkv `Kv.Write` of `Put` ops,
//! etcd a `Txn` of puts without compares (etcd's default `--max-txn-ops` is 128, so batches
//! of at most 128 rows for etcd).

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::etcd::{pb, EtcdCluster};
use crate::ftkv::FtkvCluster;

/// etcd's default `--max-txn-ops`.
pub const ETCD_MAX_TXN_OPS: usize = 128;

/// What a target name means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A three-node ftkv playground with this engine (`fractal` or `sled`).
    Ftkv(&'static str),
    /// Three etcd members.
    Etcd,
}

/// The kinds of comma-separated `targets`, each one of `allowed`; errors on an unknown or
/// disallowed name or an empty list.
pub fn parse_targets(targets: &str, allowed: &[&str]) -> anyhow::Result<Vec<(String, Kind)>> {
    let mut out = Vec::new();
    for t in targets.split(',').map(str::trim).filter(|t| !t.is_empty()) {
        let kind = match t {
            "ftkv" => Kind::Ftkv("fractal"),
            "ftkv-sled" => Kind::Ftkv("sled"),
            "etcd" => Kind::Etcd,
            _ => anyhow::bail!("unknown target {t:?} (expected one of {})", allowed.join(", ")),
        };
        anyhow::ensure!(
            allowed.contains(&t),
            "target {t:?} does not apply here ({})",
            allowed.join(", ")
        );
        out.push((t.to_string(), kind));
    }
    anyhow::ensure!(!out.is_empty(), "--targets is empty");
    Ok(out)
}

/// A running cluster with a client.
pub enum Running {
    /// ftkv and a client over every endpoint.
    Ftkv(FtkvCluster, ftkv_client::Client),
    /// etcd and a KV client per member.
    Etcd(
        EtcdCluster,
        Vec<pb::kv_client::KvClient<tonic::transport::Channel>>,
    ),
}

impl Running {
    /// Starts `kind` on `base_port` (ftkv with `node_args` for every node) and waits until it
    /// takes writes.
    pub async fn start(kind: Kind, base_port: u16, node_args: &[String]) -> anyhow::Result<Self> {
        match kind {
            Kind::Ftkv(engine) => {
                let cluster = FtkvCluster::start(base_port, engine, node_args, None)
                    .await
                    .with_context(|| format!("cannot start ftkv ({engine}) on port {base_port}"))?;
                let client = cluster.client().await?;
                let deadline = Instant::now() + Duration::from_secs(60);
                while client.put(b"bench/ready", b"1").await.is_err() {
                    anyhow::ensure!(Instant::now() < deadline, "ftkv took no write within 60 s");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Ok(Running::Ftkv(cluster, client))
            }
            Kind::Etcd => {
                let cluster = EtcdCluster::start(base_port).await?;
                let mut clients = Vec::new();
                for e in &cluster.endpoints {
                    clients.push(pb::kv_client::KvClient::new(channel(e)?));
                }
                Ok(Running::Etcd(cluster, clients))
            }
        }
    }

    /// Client endpoints (`host:port`), one per node.
    pub fn endpoints(&self) -> &[String] {
        match self {
            Running::Ftkv(c, _) => &c.endpoints,
            Running::Etcd(c, _) => &c.endpoints,
        }
    }

    /// Writes `pairs` as one batch (`i` picks the etcd member).
    pub async fn write_batch(&self, i: usize, pairs: &[(Vec<u8>, Vec<u8>)]) -> anyhow::Result<()> {
        match self {
            Running::Ftkv(_, client) => {
                let ops = pairs.iter().map(|(k, v)| ftkv_client::Op::put(k, v)).collect();
                client.write(ops).await?;
            }
            Running::Etcd(_, clients) => {
                let success = pairs
                    .iter()
                    .map(|(key, value)| pb::RequestOp {
                        request: Some(pb::request_op::Request::RequestPut(pb::PutRequest {
                            key: key.clone(),
                            value: value.clone(),
                            lease: 0,
                            prev_kv: false,
                        })),
                    })
                    .collect();
                let mut c = clients[i % clients.len()].clone();
                c.txn(pb::TxnRequest {
                    success,
                    failure: Vec::new(),
                })
                .await?;
            }
        }
        Ok(())
    }
}

/// A lazily connected channel to `endpoint` with a 10-minute request timeout (a compaction or
/// a range delete of millions of keys takes a while).
pub fn channel(endpoint: &str) -> anyhow::Result<tonic::transport::Channel> {
    Ok(
        tonic::transport::Endpoint::from_shared(format!("http://{endpoint}"))?
            .timeout(Duration::from_secs(600))
            .connect_lazy(),
    )
}

/// How to load rows.
#[derive(Debug, Clone, Copy)]
pub struct LoadShape {
    /// Rows to write.
    pub rows: u64,
    /// Rows per batch.
    pub batch_rows: u64,
    /// Concurrent writers (one batch in flight each).
    pub clients: u64,
    /// Give up after this long without an acknowledged batch (a node killed by the OOM killer).
    pub stall_secs: u64,
}

/// What a load did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoadOutcome {
    /// Rows acknowledged.
    pub rows_acknowledged: u64,
    /// Key bytes acknowledged.
    pub raw_key_bytes: u64,
    /// Value bytes acknowledged.
    pub raw_value_bytes: u64,
    /// First request to last acknowledgement, seconds.
    pub secs: f64,
    /// `rows_acknowledged / secs`.
    pub rows_per_sec: f64,
    /// Rows acknowledged in each second of the load.
    pub rows_per_second: Vec<u64>,
    /// Failed batch requests (each retried).
    pub errors: u64,
    /// True when the load stopped because nothing was acknowledged for `stall_secs`.
    pub stalled: bool,
}

struct Counters {
    next_batch: AtomicU64,
    rows: AtomicU64,
    key_bytes: AtomicU64,
    value_bytes: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
    started: Instant,
    /// Microseconds from `started` to the latest acknowledgement.
    last_ack_us: AtomicU64,
}

/// Writes rows `0..shape.rows` (`row(i)`) to `target` in batches from `shape.clients` tasks,
/// printing a progress line per second labelled `label`; a failed batch is retried after
/// 100 ms until the load stalls (`shape.stall_secs` without an acknowledgement).
pub async fn load<F>(target: &Arc<Running>, shape: LoadShape, label: &str, row: F) -> LoadOutcome
where
    F: Fn(u64) -> Option<(Vec<u8>, Vec<u8>)> + Send + Sync + 'static,
{
    let row = Arc::new(row);
    let counters = Arc::new(Counters {
        next_batch: AtomicU64::new(0),
        rows: AtomicU64::new(0),
        key_bytes: AtomicU64::new(0),
        value_bytes: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        started: Instant::now(),
        last_ack_us: AtomicU64::new(0),
    });
    let batch_rows = shape.batch_rows.max(1);
    let batches = shape.rows.div_ceil(batch_rows);
    let started = counters.started;
    let mut tasks = tokio::task::JoinSet::new();
    for client in 0..shape.clients.max(1) {
        let (target, counters, row) = (Arc::clone(target), Arc::clone(&counters), Arc::clone(&row));
        tasks.spawn(async move {
            loop {
                let b = counters.next_batch.fetch_add(1, Ordering::Relaxed);
                if b >= batches {
                    return;
                }
                let end = ((b + 1) * batch_rows).min(shape.rows);
                let pairs: Vec<_> = (b * batch_rows..end).filter_map(|i| row(i)).collect();
                write_until_acknowledged(&target, client as usize, &pairs, &counters).await;
                if counters.stop.load(Ordering::Relaxed) {
                    return;
                }
            }
        });
    }
    let (rows_per_second, stalled) = watch(&counters, &mut tasks, shape, started, label).await;
    let secs = counters.last_ack_us.load(Ordering::Relaxed) as f64 / 1e6;
    let rows_acknowledged = counters.rows.load(Ordering::Relaxed);
    LoadOutcome {
        rows_acknowledged,
        raw_key_bytes: counters.key_bytes.load(Ordering::Relaxed),
        raw_value_bytes: counters.value_bytes.load(Ordering::Relaxed),
        secs,
        rows_per_sec: rows_acknowledged as f64 / secs.max(1e-9),
        rows_per_second,
        errors: counters.errors.load(Ordering::Relaxed),
        stalled,
    }
}

async fn write_until_acknowledged(
    target: &Running,
    client: usize,
    pairs: &[(Vec<u8>, Vec<u8>)],
    counters: &Counters,
) {
    while !counters.stop.load(Ordering::Relaxed) {
        match target.write_batch(client, pairs).await {
            Ok(()) => {
                counters.rows.fetch_add(pairs.len() as u64, Ordering::Relaxed);
                let (k, v) = pairs
                    .iter()
                    .fold((0, 0), |(k, v), (a, b)| (k + a.len() as u64, v + b.len() as u64));
                counters.key_bytes.fetch_add(k, Ordering::Relaxed);
                counters.value_bytes.fetch_add(v, Ordering::Relaxed);
                let us = u64::try_from(counters.started.elapsed().as_micros()).unwrap_or(u64::MAX);
                counters.last_ack_us.fetch_max(us, Ordering::Relaxed);
                return;
            }
            Err(_) => {
                counters.errors.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Samples the counters every second until every task is done or the load stalls; returns the
/// rows acknowledged per second and whether it stalled.
async fn watch(
    counters: &Counters,
    tasks: &mut tokio::task::JoinSet<()>,
    shape: LoadShape,
    started: Instant,
    label: &str,
) -> (Vec<u64>, bool) {
    let mut per_second = Vec::new();
    let (mut last, mut last_progress) = (0, Instant::now());
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::from_std(started + Duration::from_secs(1)),
        Duration::from_secs(1),
    );
    loop {
        tokio::select! {
            done = tasks.join_next() => {
                if done.is_none() {
                    let rows = counters.rows.load(Ordering::Relaxed);
                    if rows > last {
                        per_second.push(rows - last);
                    }
                    return (per_second, false);
                }
            }
            _ = tick.tick() => {
                let rows = counters.rows.load(Ordering::Relaxed);
                per_second.push(rows - last);
                if rows > last {
                    last_progress = Instant::now();
                }
                last = rows;
                eprintln!(
                    "  [{label}] {:>4}s {:>9} rows/s  total {rows}/{}  errors {}",
                    per_second.len(),
                    per_second.last().copied().unwrap_or(0),
                    shape.rows,
                    counters.errors.load(Ordering::Relaxed)
                );
                if last_progress.elapsed() >= Duration::from_secs(shape.stall_secs.max(1)) {
                    counters.stop.store(true, Ordering::Relaxed);
                    tasks.abort_all();
                    while tasks.join_next().await.is_some() {}
                    return (per_second, true);
                }
            }
        }
    }
}

/// Bytes of one member's or node's data dir: the store and the log apart.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DiskSize {
    /// Node (1-based).
    pub node: u64,
    /// The store (ftkv `engine`, etcd `member/snap`: the bbolt file), allocated blocks, bytes.
    pub engine_allocated_bytes: u64,
    /// The same as file lengths.
    pub engine_bytes: u64,
    /// The log (ftkv `log`, etcd `member/wal`, whose segments are preallocated 64 MB files),
    /// allocated blocks, bytes.
    pub log_allocated_bytes: u64,
    /// The same as file lengths.
    pub log_bytes: u64,
    /// The whole data dir, allocated blocks, bytes.
    pub total_allocated_bytes: u64,
}

/// Sizes of every node of `target` (`st_blocks * 512` and file lengths, walking the dirs).
pub fn disk_sizes(target: &Running) -> anyhow::Result<Vec<DiskSize>> {
    match target {
        Running::Ftkv(cluster, _) => Ok(crate::bulk::node_sizes(cluster)?
            .into_iter()
            .map(|s| {
                let data = cluster.dir().join(format!("node-{}", s.node));
                let total = crate::bulk::dir_bytes(&data).map_or(0, |(_, a)| a);
                DiskSize {
                    node: s.node,
                    engine_allocated_bytes: s.engine_allocated_bytes,
                    engine_bytes: s.engine_bytes,
                    log_allocated_bytes: s.log_allocated_bytes,
                    log_bytes: s.log_bytes,
                    total_allocated_bytes: total,
                }
            })
            .collect()),
        Running::Etcd(cluster, _) => (0..cluster.endpoints.len())
            .map(|i| etcd_member_size(&cluster.dir().join(format!("e{i}")), i as u64 + 1))
            .collect(),
    }
}

fn etcd_member_size(data: &Path, node: u64) -> anyhow::Result<DiskSize> {
    let (engine_bytes, engine_allocated_bytes) = crate::bulk::dir_bytes(&data.join("member/snap"))?;
    let (log_bytes, log_allocated_bytes) = crate::bulk::dir_bytes(&data.join("member/wal"))?;
    let (_, total_allocated_bytes) = crate::bulk::dir_bytes(data)?;
    Ok(DiskSize {
        node,
        engine_allocated_bytes,
        engine_bytes,
        log_allocated_bytes,
        log_bytes,
        total_allocated_bytes,
    })
}

/// Compacts etcd's history up to the current revision (physically) and defragments every
/// member, so its data dir holds the live keys only (etcd's own advice for reclaiming space).
pub async fn etcd_compact_and_defragment(cluster: &EtcdCluster) -> anyhow::Result<()> {
    let first = cluster.endpoints.first().context("etcd has no member")?;
    let mut kv = pb::kv_client::KvClient::new(channel(first)?);
    let header = kv
        .range(pb::RangeRequest {
            key: b"bench/ready".to_vec(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .header
        .context("etcd range without a header")?;
    kv.compact(pb::CompactionRequest {
        revision: header.revision,
        physical: true,
    })
    .await
    .context("etcd compact")?;
    for e in &cluster.endpoints {
        defragment(e)
            .await
            .with_context(|| format!("etcd defragment of {e}"))?;
    }
    Ok(())
}

/// etcd's `Maintenance.Defragment` on the member at `endpoint`, called by its method path (the
/// proto subset declares its messages only, beside the subset's `Maintenance` service).
async fn defragment(endpoint: &str) -> anyhow::Result<()> {
    let mut grpc = tonic::client::Grpc::new(channel(endpoint)?);
    grpc.ready()
        .await
        .map_err(|e| anyhow::anyhow!("not ready: {e}"))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/etcdserverpb.Maintenance/Defragment");
    let codec = tonic_prost::ProstCodec::<pb::DefragmentRequest, pb::DefragmentResponse>::default();
    grpc.unary(tonic::Request::new(pb::DefragmentRequest {}), path, codec)
        .await?;
    Ok(())
}
