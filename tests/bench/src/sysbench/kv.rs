//! `sysbench-insert` against the key-value targets (ftkv, etcd): the bench's own load generator
//! with sysbench's `oltp_insert` row shape, in this process.
//!
//! A row of `sbtest<t>` (`id int PK, k int, c char(120), pad char(60)`) becomes one put:
//! - key: `sbtest<t>/` then `id` as an order-preserving int key column (the encoding of
//!   `ftkvctl load`, [`ftkv_client::rows`]), `t` uniform over the tables and `id` uniform over
//!   the whole 32-bit range, as `oltp_insert --auto-inc=off` draws it
//!   (`sysbench.rand.unique() - 2147483648`);
//! - value: the row's other columns `k`, `c`, `pad` in the same row encoding: `k` uniform in
//!   `1..=table_size`, `c` and `pad` random digits in sysbench's patterns (ten and five groups
//!   of eleven digits joined by `-`: 119 and 59 characters).

use std::path::Path;

use ftkv_client::rows::{self, ColumnType};
use rand::rngs::StdRng;
use rand::Rng;

use super::{CpuUse, InsertRun, SysbenchArgs, WriteSecond};
use crate::cpu::{self, CpuMeter};
use crate::{RunResult, Target};

/// `n` groups of eleven random digits joined by `-` (sysbench's `c` and `pad` patterns).
pub fn digit_groups(rng: &mut StdRng, n: usize) -> String {
    let mut s = String::with_capacity(n * 12);
    for g in 0..n {
        if g > 0 {
            s.push('-');
        }
        for _ in 0..11 {
            s.push(char::from(b'0' + rng.gen_range(0..10u8)));
        }
    }
    s
}

/// One random `sbtest` row as a key and value (see the module docs).
pub fn sbtest_row(rng: &mut StdRng, tables: u32, table_size: u64) -> (Vec<u8>, Vec<u8>) {
    let table = rng.gen_range(1..=tables.max(1));
    let id = i64::from(rng.gen::<u32>()) - 2_147_483_648;
    let k = rng.gen_range(1..=table_size.max(1));
    let mut key = format!("sbtest{table}/").into_bytes();
    let mut value = Vec::with_capacity(200);
    rows::begin_value(&mut value);
    // Decimal text of an i64/u64 and ASCII digits always fit their column types.
    let _ = rows::encode_key_field(&mut key, ColumnType::Int, id.to_string().as_bytes());
    let _ = rows::encode_value_field(&mut value, ColumnType::Int, k.to_string().as_bytes());
    let _ = rows::encode_value_field(&mut value, ColumnType::Str, digit_groups(rng, 10).as_bytes());
    let _ = rows::encode_value_field(&mut value, ColumnType::Str, digit_groups(rng, 5).as_bytes());
    (key, value)
}

/// Runs the rows against `target` with the server processes `server_pids`, measuring CPU.
async fn drive(target: &Target, server_pids: &[u32], args: &SysbenchArgs, run: u64) -> InsertRun {
    let (tables, table_size) = (args.tables, args.table_size);
    let servers = CpuMeter::start(server_pids);
    let own = cpu::self_cpu_seconds();
    let r: RunResult = crate::run_puts(
        target,
        args.clients,
        args.duration,
        args.seed.wrapping_add(run),
        run,
        move |rng: &mut StdRng| sbtest_row(rng, tables, table_size),
    )
    .await;
    let load_generator_s = cpu::self_cpu_seconds() - own;
    let servers_s = servers.elapsed_seconds();
    InsertRun {
        target: r.target.clone(),
        run,
        load_generator: format!(
            "ftkv-bench (in process, {} tasks, one put in flight each)",
            args.clients
        ),
        writes: r.ops,
        writes_per_sec: r.ops_per_sec,
        seconds: args.duration.as_secs_f64(),
        errors: r.errors,
        latency_ms: r.latency_ms.clone(),
        per_second: r
            .seconds
            .iter()
            .map(|s| WriteSecond {
                t: s.t + 1,
                writes: s.ops,
                p95_ms: s.p95_ms,
            })
            .collect(),
        cpu: CpuUse::new(servers_s, load_generator_s, r.ops),
        valid: true,
        problems: Vec::new(),
        mariadb: None,
    }
}

/// One run against a fresh ftkv playground (`engine`, from `bin_dir` if given).
pub async fn run_ftkv(
    engine: &str,
    bin_dir: Option<&Path>,
    args: &SysbenchArgs,
    run: u64,
) -> anyhow::Result<InsertRun> {
    let base_port = crate::ports::free_port_block(9)?;
    let cluster = crate::ftkv::FtkvCluster::start(base_port, engine, &[], bin_dir).await?;
    let client = cluster.client().await?;
    // The playground process and its three node processes.
    let pids = cpu::process_tree(cluster.pid());
    Ok(drive(&Target::Ftkv(client), &pids, args, run).await)
}

/// One run against a fresh three-member etcd cluster.
pub async fn run_etcd(args: &SysbenchArgs, run: u64) -> anyhow::Result<InsertRun> {
    let base_port = crate::ports::free_port_block(6)?;
    let cluster = crate::etcd::EtcdCluster::start(base_port).await?;
    let target = Target::Etcd(crate::etcd::EtcdClient::connect(&cluster.endpoints)?);
    Ok(drive(&target, &cluster.pids(), args, run).await)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn rows_have_the_sbtest_shape() {
        let mut rng = StdRng::seed_from_u64(7);
        let mut tables = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let (key, value) = sbtest_row(&mut rng, 8, 10_000);
            let text = String::from_utf8_lossy(&key).to_string();
            let (prefix, _) = text.split_once('/').unwrap();
            tables.insert(prefix.to_string());
            // Prefix, then the int tag and 8 bytes.
            assert_eq!(key.len(), prefix.len() + 1 + 9);
            let fields = rows::decode_value(&value).unwrap();
            assert_eq!(fields.len(), 3);
            let rows::Field::Int(k) = fields[0] else {
                panic!("k is not an int: {:?}", fields[0])
            };
            assert!((1..=10_000).contains(&k));
            for (f, len) in fields[1..].iter().zip([119usize, 59]) {
                let rows::Field::Bytes(b) = f else {
                    panic!("not text: {f:?}")
                };
                assert_eq!(b.len(), len);
                assert!(b
                    .split(|&c| c == b'-')
                    .all(|g| g.len() == 11 && g.iter().all(u8::is_ascii_digit)));
            }
        }
        assert_eq!(tables.len(), 8, "{tables:?}");
        assert!(tables.iter().all(|t| t.starts_with("sbtest")));
    }
}
