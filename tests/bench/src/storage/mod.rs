//! Issue 19's storage workloads through three-node clusters, one command each:
//!
//! - `ftkv-bench compression` ([`compression`]): `timeline_1009` rows ([`timeline`]) written
//!   through each cluster, then the raw bytes against the bytes on disk per node, the store and
//!   the log apart;
//! - `ftkv-bench beyond-memory` ([`beyond_memory`]): random inserts into clusters whose nodes
//!   run with a small cache inside memory cgroups, until the data is a multiple of the cache;
//!   rows/s over time;
//! - `ftkv-bench instant-ddl` ([`instant_ddl`]): one `DeleteRange` (and a broadcast upsert) over
//!   N keys against deleting them one by one: time to acknowledge and until every node's reads
//!   reflect it; etcd's `DeleteRange` beside it.
//!
//! The seed facts they rely on (the design notes the issue points to): the table shape
//! `timeline_1009(uid bigint unsigned PK, vflag tinyint, status_id bigint unsigned, source int,
//! fflag int, mflag tinyint)` of a production table set TokuDB stored at 14.8x with LZMA; online
//! DDL on a 425 MB table (TokuDB add column 0.01 s vs InnoDB 28.64 s); "data larger than memory"
//! means a memory cgroup (v1 `memory.limit_in_bytes`, page cache included) around the engine.
//!
//! Every workload follows the bench's rules: each target is started and stopped by the tool,
//! rounds alternate the targets (A B A B), figures are medians of the rounds with ratios, and
//! each run writes `DIR/results.json` (every run, medians, ratios), `DIR/summary.json`
//! ([`crate::summary`]) and an SVG chart ([`crate::plot`]).

pub mod beyond_memory;
pub mod compression;
pub mod instant_ddl;
pub mod targets;
pub mod timeline;

use std::time::{Duration, Instant};

use anyhow::Context;

use crate::etcd::pb;
use targets::Running;

/// The end of the key range of `prefix` (every key starting with it is below).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    ftkv_client::prefix_end(prefix)
}

/// The first port of target number `index` (each target takes 20 ports from `base_port`).
pub fn target_port(base_port: u16, index: usize) -> anyhow::Result<u16> {
    u16::try_from(index)
        .ok()
        .and_then(|i| i.checked_mul(20))
        .and_then(|o| base_port.checked_add(o))
        .context("--base-port too high for this many targets")
}

/// Keys in `[start, end)` on each node of `target` alone (ftkv: a serializable keys-only scan
/// of that node, page by page; etcd: a serializable `count_only` range on that member).
pub async fn keys_on_each(target: &Running, start: &[u8], end: &[u8]) -> anyhow::Result<Vec<u64>> {
    let mut counts = Vec::new();
    for e in target.endpoints() {
        counts.push(match target {
            Running::Ftkv(..) => ftkv_keys_on(e, start, end, u32::MAX).await?,
            Running::Etcd(..) => etcd_keys_on(e, start, end).await?,
        });
    }
    Ok(counts)
}

/// True when no node of `target` holds a key in `[start, end)` (a one-key read per node).
pub async fn empty_on_every_node(target: &Running, start: &[u8], end: &[u8]) -> anyhow::Result<bool> {
    for e in target.endpoints() {
        let n = match target {
            Running::Ftkv(..) => ftkv_keys_on(e, start, end, 1).await?,
            Running::Etcd(..) => etcd_keys_on(e, start, end).await?,
        };
        if n > 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Waits until each node of `target` holds exactly `expected` keys in `[start, end)` (followers
/// apply a moment after the leader acknowledged); fails after `timeout` with the counts seen.
pub async fn wait_for_keys(
    target: &Running,
    start: &[u8],
    end: &[u8],
    expected: u64,
    timeout: Duration,
) -> anyhow::Result<Vec<u64>> {
    let deadline = Instant::now() + timeout;
    loop {
        let counts = keys_on_each(target, start, end).await?;
        if counts.iter().all(|c| *c == expected) {
            return Ok(counts);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "expected {expected} keys on every node, found {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Keys in `[start, end)` on the ftkv node at `endpoint` alone, counting at most `limit`.
async fn ftkv_keys_on(endpoint: &str, start: &[u8], end: &[u8], limit: u32) -> anyhow::Result<u64> {
    use ftkv_proto::v1::kv_client::KvClient;
    use ftkv_proto::v1::{ReadConsistency, ScanRequest};
    let mut kv = KvClient::connect(format!("http://{endpoint}"))
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?
        .max_decoding_message_size(64 << 20);
    let mut cursor = start.to_vec();
    let mut count = 0u64;
    loop {
        let page = kv
            .scan(ScanRequest {
                start: cursor.clone(),
                end: end.to_vec(),
                limit: limit.min(10_000),
                consistency: ReadConsistency::Serializable as i32,
                keys_only: true,
            })
            .await
            .with_context(|| format!("scan of {endpoint}"))?
            .into_inner();
        count += page.kvs.len() as u64;
        if !page.more || count >= u64::from(limit) {
            return Ok(count);
        }
        anyhow::ensure!(page.next_start > cursor, "scan of {endpoint}: no progress");
        cursor = page.next_start;
    }
}

/// Keys in `[start, end)` on the etcd member at `endpoint` alone.
async fn etcd_keys_on(endpoint: &str, start: &[u8], end: &[u8]) -> anyhow::Result<u64> {
    let mut kv = pb::kv_client::KvClient::new(targets::channel(endpoint)?);
    let r = kv
        .range(pb::RangeRequest {
            key: start.to_vec(),
            range_end: end.to_vec(),
            serializable: true,
            count_only: true,
            ..Default::default()
        })
        .await
        .with_context(|| format!("etcd range of {endpoint}"))?
        .into_inner();
    Ok(u64::try_from(r.count).unwrap_or(0))
}

/// Median, min and max of `values` (see [`crate::bulk::Spread`]).
pub fn spread(values: &[f64]) -> crate::bulk::Spread {
    crate::bulk::Spread::of(values)
}

/// A bar of `label` over `values` (median, whiskers min to max).
pub fn bar(label: String, values: &[f64]) -> crate::plot::Bar {
    let s = spread(values);
    crate::plot::Bar {
        label,
        median: s.median,
        min: s.min,
        max: s.max,
    }
}

/// Writes `value` as pretty JSON to `dir/results.json`.
pub fn write_results<T: serde::Serialize>(dir: &std::path::Path, value: &T) -> anyhow::Result<()> {
    let path = dir.join("results.json");
    std::fs::write(&path, serde_json::to_string_pretty(value)?)
        .with_context(|| format!("cannot write {}", path.display()))
}

/// The machine line of the reports (cores, memory, kernel).
pub fn machine() -> String {
    crate::summary::machine_line()
}

/// Megabytes, for progress lines.
pub fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}
