//! Cluster workloads of issue 19 that drive three-node clusters through this process's own load
//! generator: `scaling` ([`scaling`]: puts over a grid of client counts and value sizes),
//! `reads` ([`reads`]: linearizable and serializable point reads and 100-row range scans) and
//! `failover` ([`failover`]: kill -9 of the leader under put load, the write pause and the killed
//! node's catch-up).
//!
//! This module holds what they share: the targets (`ftkv`, `ftkv-sled`, `ftkv@DIR`,
//! `ftkv-sled@DIR`, `etcd`, parsed as `sysbench-insert` parses them, see
//! [`crate::sysbench::TargetKind`]), a started cluster with its server processes
//! ([`Started`]), the CPU meter around a measured window ([`measure_cpu`]) and the small
//! report helpers.

pub mod etcd_ops;
pub mod failover;
pub mod procs;
pub mod reads;
pub mod scaling;

use std::future::Future;
use std::path::Path;

use crate::cpu::{self, CpuMeter};
use crate::sysbench::{CpuUse, TargetKind};
use crate::Target;

/// Ports between the clusters of two targets of one round (ftkv takes 9, etcd 6).
pub const PORTS_PER_TARGET: u16 = 20;

/// A running cluster of one target.
pub enum Cluster {
    /// The ftkv playground.
    Ftkv(crate::ftkv::FtkvCluster),
    /// Three etcd members.
    Etcd(crate::etcd::EtcdCluster),
}

/// A started target: its cluster, a put target over it and its server processes.
pub struct Started {
    /// The target's name as given.
    pub name: String,
    /// Puts through the cluster's client.
    pub target: Target,
    /// The server processes (ftkv: the playground and its nodes; etcd: the members).
    pub server_pids: Vec<u32>,
    /// Client endpoints, in node order (ftkv: node 1, 2, 3; etcd: member 0, 1, 2).
    pub endpoints: Vec<String>,
    /// The cluster (stopped when dropped).
    pub cluster: Cluster,
}

/// Parses `--targets` into names and kinds, refusing targets these workloads do not drive
/// (MariaDB: `sysbench-insert` only).
pub fn parse_targets(targets: &str) -> anyhow::Result<Vec<(String, TargetKind)>> {
    let names = crate::sysbench::target_names(targets);
    anyhow::ensure!(!names.is_empty(), "--targets is empty");
    names
        .into_iter()
        .map(|n| {
            let kind = TargetKind::parse(&n)?;
            anyhow::ensure!(
                !matches!(kind, TargetKind::MariaDb(_)),
                "target {n:?}: MariaDB runs in `sysbench-insert` only (ftkv, ftkv-sled, etcd here)"
            );
            Ok((n, kind))
        })
        .collect()
}

/// Parses a comma-separated list of numbers (`1,8,32`).
pub fn parse_list<T: std::str::FromStr>(list: &str, what: &str) -> anyhow::Result<Vec<T>> {
    let values = list
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<T>()
                .map_err(|_| anyhow::anyhow!("{what}: {s:?} is not a number"))
        })
        .collect::<anyhow::Result<Vec<T>>>()?;
    anyhow::ensure!(!values.is_empty(), "{what} is empty");
    Ok(values)
}

/// Starts `kind` as a three-node cluster on `base_port` (ftkv: 9 ports from it, etcd: 6).
pub async fn start(name: &str, kind: &TargetKind, base_port: u16) -> anyhow::Result<Started> {
    match kind {
        TargetKind::Ftkv { engine, bin_dir } => {
            let cluster = crate::ftkv::FtkvCluster::start(base_port, engine, &[], bin_dir.as_deref()).await?;
            let client = cluster.client().await?;
            Ok(Started {
                name: name.to_string(),
                target: Target::Ftkv(client),
                server_pids: cpu::process_tree(cluster.pid()),
                endpoints: cluster.endpoints.clone(),
                cluster: Cluster::Ftkv(cluster),
            })
        }
        TargetKind::Etcd => {
            let cluster = crate::etcd::EtcdCluster::start(base_port).await?;
            let client = crate::etcd::EtcdClient::connect(&cluster.endpoints)?;
            Ok(Started {
                name: name.to_string(),
                target: Target::Etcd(client),
                server_pids: cluster.pids(),
                endpoints: cluster.endpoints.clone(),
                cluster: Cluster::Etcd(cluster),
            })
        }
        TargetKind::MariaDb(_) => anyhow::bail!("target {name:?}: not a key-value cluster"),
    }
}

/// Runs `work`, measuring the CPU of `server_pids` and of this process (the load generator)
/// over it; `ops` gives the acknowledged operations the CPU is divided by.
pub async fn measure_cpu<R, F>(server_pids: &[u32], work: F, ops: impl Fn(&R) -> u64) -> (R, CpuUse)
where
    F: Future<Output = R>,
{
    let servers = CpuMeter::start(server_pids);
    let own = cpu::self_cpu_seconds();
    let r = work.await;
    let load_generator_s = cpu::self_cpu_seconds() - own;
    let servers_s = servers.elapsed_seconds();
    let n = ops(&r);
    (r, CpuUse::new(servers_s, load_generator_s, n))
}

/// One put through `target` (the clients of [`Target`], without the load loop around them).
pub async fn put(target: &Target, key: Vec<u8>, value: Vec<u8>) -> anyhow::Result<()> {
    match target {
        Target::Ftkv(c) => {
            c.put(key, value).await?;
        }
        Target::Etcd(c) => c.put(key, value).await?,
    }
    Ok(())
}

/// `a / b` of every later target over the first one's figure, as `("first / other", ratio)`;
/// `values` are `(target, median)` in target order.
pub fn ratios_over_first(values: &[(String, f64)]) -> Vec<(String, f64)> {
    let Some((first, v0)) = values.first() else {
        return Vec::new();
    };
    values
        .iter()
        .skip(1)
        .map(|(t, v)| (format!("{first} / {t}"), v0 / v.max(1e-9)))
        .collect()
}

/// Writes `value` as pretty JSON to `dir/name`.
pub fn write_json<T: serde::Serialize>(dir: &Path, name: &str, value: &T) -> anyhow::Result<()> {
    std::fs::write(dir.join(name), serde_json::to_string_pretty(value)?)?;
    Ok(())
}

/// The key of preloaded row `i` (`bench/<12 digits>`, as every bench put load names keys).
pub fn key_of(i: u64) -> Vec<u8> {
    format!("bench/{i:012}").into_bytes()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn targets_lists_and_ratios_parse() {
        let t = parse_targets("ftkv, ftkv-sled,etcd").unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[1].0, "ftkv-sled");
        assert!(parse_targets("mariadb-semisync").is_err());
        assert!(parse_targets("").is_err());
        assert_eq!(parse_list::<u64>("1, 8,32", "--clients").unwrap(), vec![1, 8, 32]);
        assert!(parse_list::<u64>("1,x", "--clients").is_err());
        assert!(parse_list::<u64>("", "--clients").is_err());
        let r = ratios_over_first(&[("ftkv".into(), 30.0), ("etcd".into(), 10.0)]);
        assert_eq!(r, vec![("ftkv / etcd".to_string(), 3.0)]);
        assert_eq!(key_of(7), b"bench/000000000007".to_vec());
    }
}
