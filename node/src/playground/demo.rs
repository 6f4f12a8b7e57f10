//! The demo workload of `ftkv-node playground --demo`: writes rows shaped like the seed table
//! `user_summary(user_id bigint, weight varchar(5), level varchar(20), beat_rate varchar(12),
//! level_num int)`, reads them back, kills the leader, shows the failover while it keeps
//! writing, restarts the killed node, waits for it to catch up, and verifies every row.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;

use super::Playground;

const CONCURRENCY: u64 = 64;
const PREFIX: &str = "user_summary/";

/// Key of one row: `user_summary/<user_id, 12 digits>`.
pub fn row_key(user_id: u64) -> Vec<u8> {
    format!("{PREFIX}{user_id:012}").into_bytes()
}

/// Value of one row: tab-separated columns, about 40 bytes, deterministic per user id.
pub fn row_value(user_id: u64) -> Vec<u8> {
    const LEVELS: [&str; 6] = [
        "Bronze I",
        "Silver II",
        "Gold III",
        "Platinum IV",
        "Diamond V",
        "Master",
    ];
    let h = user_id.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let weight = format!("{}.{}", 40 + h % 80, h % 10);
    let level = LEVELS[(h >> 8) as usize % LEVELS.len()];
    let beat_rate = format!("{}.{:02}%", (h >> 16) % 100, (h >> 24) % 100);
    let level_num = (h >> 32) % 1000;
    format!("{weight}\t{level}\t{beat_rate}\t{level_num}").into_bytes()
}

struct Phase {
    histogram: Histogram<u64>,
    ops: u64,
    errors: u64,
    elapsed: Duration,
}

impl Phase {
    fn print(&self, name: &str) {
        let h = &self.histogram;
        let ms = |v: u64| v as f64 / 1000.0;
        println!(
            "{name}: {} ops in {:.2}s = {:.0} ops/s, {} errors; latency ms min {:.2} avg {:.2} p50 {:.2} p95 {:.2} p99 {:.2} max {:.2}",
            self.ops,
            self.elapsed.as_secs_f64(),
            self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.errors,
            ms(h.min()),
            h.mean() / 1000.0,
            ms(h.value_at_quantile(0.5)),
            ms(h.value_at_quantile(0.95)),
            ms(h.value_at_quantile(0.99)),
            ms(h.max()),
        );
    }
}

/// Writes rows `[from, to)` with `CONCURRENCY` tasks; returns latencies and counts. Every row
/// whose put was acknowledged is recorded in `acked`.
async fn write_rows(client: &ftkv_client::Client, from: u64, to: u64, label: &str) -> anyhow::Result<Phase> {
    let next = Arc::new(AtomicU64::new(from));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CONCURRENCY {
        let (client, next, done, errors) = (client.clone(), next.clone(), done.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("valid histogram bounds");
            loop {
                let id = next.fetch_add(1, Ordering::Relaxed);
                if id >= to {
                    break;
                }
                let t = Instant::now();
                // The client retries safely (same session sequence) across the failover.
                match client.put(row_key(id), row_value(id)).await {
                    Ok(_) => {
                        let _ = h.record(t.elapsed().as_micros().max(1) as u64);
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => {
                        errors.fetch_add(1, Ordering::Relaxed);
                        tracing::warn!(error = %e, id, "demo write failed");
                    }
                }
            }
            h
        }));
    }
    let progress = {
        let done = done.clone();
        let label = label.to_string();
        let total = to - from;
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            tick.tick().await;
            loop {
                tick.tick().await;
                let d = done.load(Ordering::Relaxed);
                eprintln!(
                    "  {label}: {d}/{total} rows ({:.0}/s)",
                    d as f64 / start.elapsed().as_secs_f64()
                );
            }
        })
    };
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    for t in tasks {
        histogram.add(t.await?)?;
    }
    progress.abort();
    Ok(Phase {
        histogram,
        ops: done.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        elapsed: start.elapsed(),
    })
}

/// Counts rows under the prefix and checks each value; returns the number found.
async fn verify_rows(client: &ftkv_client::Client, expected: u64) -> anyhow::Result<u64> {
    let prefix = PREFIX.as_bytes().to_vec();
    let end = ftkv_client::prefix_end(&prefix);
    let mut start = prefix;
    let mut found = 0u64;
    loop {
        let page = client.scan(start.clone(), end.clone(), 10_000).await?;
        for kv in &page.kvs {
            let id: u64 = std::str::from_utf8(&kv.key[PREFIX.len()..])?.parse()?;
            anyhow::ensure!(kv.value == row_value(id), "row {id} has a wrong value");
            found += 1;
        }
        if !page.more {
            break;
        }
        start = page.next_start;
    }
    anyhow::ensure!(found == expected, "expected {expected} rows, found {found}");
    Ok(found)
}

/// Runs the demo against a started playground.
pub async fn run(pg: &mut Playground, rows: u64) -> anyhow::Result<()> {
    let endpoints: Vec<String> = pg.nodes.iter().map(|n| n.client.clone()).collect();
    let client = ftkv_client::Client::builder()
        .endpoints(endpoints.clone())
        .build()
        .await
        .context("cannot connect the demo client")?;

    println!("\n== 1. writing {rows} user_summary rows with {CONCURRENCY} concurrent clients (each write replicated and fsynced on a quorum)");
    let phase = write_rows(&client, 0, rows, "write").await?;
    phase.print("write");
    anyhow::ensure!(phase.errors == 0, "{} writes failed", phase.errors);

    println!("\n== 2. reading every row back (linearizable scan) and 1,000 random point reads");
    let t = Instant::now();
    let found = verify_rows(&client, rows).await?;
    println!("scan: {found} rows verified in {:.2}s", t.elapsed().as_secs_f64());
    let t = Instant::now();
    for i in 0..1_000u64 {
        let id = i.wrapping_mul(7919) % rows.max(1);
        let v = client.get(row_key(id)).await?;
        anyhow::ensure!(
            v.as_deref() == Some(row_value(id).as_slice()),
            "row {id} read back wrong"
        );
    }
    println!("get: 1000 rows verified in {:.2}s", t.elapsed().as_secs_f64());

    let leader = pg.wait_for_leader(Duration::from_secs(10)).await?;
    println!(
        "\n== 3. killing the leader (node {leader}, SIGKILL) while writing {} more rows",
        rows / 10
    );
    let writer = {
        let client = client.clone();
        tokio::spawn(
            async move { write_rows(&client, rows, rows + rows / 10, "write during failover").await },
        )
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed_at = Instant::now();
    pg.kill(leader)?;
    let new_leader = loop {
        let mut found = None;
        for n in pg.nodes.iter().filter(|n| n.id != leader) {
            if let Ok(st) = super::status(&n.client).await {
                if st.is_leader {
                    found = Some(st.node_id);
                }
            }
        }
        if let Some(l) = found {
            break l;
        }
        anyhow::ensure!(
            killed_at.elapsed() < Duration::from_secs(30),
            "no new leader 30 s after the kill"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    println!(
        "new leader: node {new_leader}, elected {:.2}s after the kill",
        killed_at.elapsed().as_secs_f64()
    );
    let probe = Instant::now();
    client
        .put(b"demo/failover-probe".to_vec(), b"ok".to_vec())
        .await?;
    println!(
        "first write acknowledged by the new leader {:.2}s after the kill ({:.1} ms for the write itself)",
        killed_at.elapsed().as_secs_f64(),
        probe.elapsed().as_secs_f64() * 1000.0
    );
    let phase = writer.await??;
    phase.print("write during failover");
    anyhow::ensure!(
        phase.errors == 0,
        "{} writes failed during the failover",
        phase.errors
    );

    println!("\n== 4. restarting node {leader}; it catches up from the log or a snapshot");
    pg.restart(leader)?;
    let killed_client = pg
        .nodes
        .iter()
        .find(|n| n.id == leader)
        .map(|n| n.client.clone())
        .unwrap_or_default();
    let t = Instant::now();
    loop {
        let leader_st = super::status(
            &pg.nodes
                .iter()
                .find(|n| n.id == new_leader)
                .map(|n| n.client.clone())
                .unwrap_or_default(),
        )
        .await?;
        if let Ok(st) = super::status(&killed_client).await {
            if st.applied_index >= leader_st.commit_index {
                println!(
                    "node {leader} caught up to applied index {} in {:.2}s (leader commit index {})",
                    st.applied_index,
                    t.elapsed().as_secs_f64(),
                    leader_st.commit_index
                );
                break;
            }
        }
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(120),
            "node {leader} did not catch up in 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let total = rows + rows / 10;
    let found = verify_rows(&client, total).await?;
    println!("all {found} rows present and correct after the failover");
    let status = client.status_all().await;
    println!("\nnode status:");
    for s in status.into_iter().filter_map(|(_, s)| s.ok()) {
        println!(
            "  node {} leader={} term={} applied={} commit={} engine={} ops/entry={:.1}",
            s.node_id, s.is_leader, s.term, s.applied_index, s.commit_index, s.engine, s.ops_per_entry
        );
    }
    println!("\ndemo finished: ok");
    Ok(())
}
