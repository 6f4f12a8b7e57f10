//! Issue 14 item 10 and issue 16 "Space": the data dir quota and the NOSPACE alarm through a
//! real three-node cluster, and a node whose data dir is a tmpfs that fills up.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ftkv_proto::v1::error_info::Kind;
use ftkv_proto::v1::PutRequest;
use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};

const VALUE_BYTES: usize = 64 * 1024;

/// 64 KiB that do not compress (xorshift from `i`), so the engine grows as the log does.
fn value(i: u64) -> Vec<u8> {
    let mut x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(VALUE_BYTES);
    while v.len() < VALUE_BYTES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v
}

fn key(i: u64) -> String {
    format!("space/{i:06}")
}

/// A cluster whose every node reads `config` (TOML) from a file in a fresh folder.
async fn cluster_with(config: &str, folder: &Path) -> Cluster {
    cluster_of(3, config, folder).await
}

/// [`cluster_with`] of `nodes` nodes.
async fn cluster_of(nodes: usize, config: &str, folder: &Path) -> Cluster {
    let path = folder.join("ftkv.toml");
    std::fs::write(&path, config).unwrap();
    Cluster::start(ClusterOptions {
        nodes,
        extra_args: vec!["--config".into(), path.display().to_string()],
        ..Default::default()
    })
    .await
    .unwrap()
}

async fn http_get(addr: &str, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quota_alarm_refuses_writes_keeps_reads_and_is_disarmed_after_deletes() {
    let _serial = serial().await;
    let folder = tempfile::tempdir().unwrap();
    let cluster = cluster_with(
        r#"
[log]
segment_size = "256KiB"
[raft]
snapshot_every_entries = 20
max_in_snapshot_log_to_keep = 0
[space]
quota_bytes = "8MiB"
disk_reserve_bytes = "0B"
check_interval_ms = 100
"#,
        folder.path(),
    )
    .await;
    let client = cluster.client().await.unwrap();

    // Write until refused.
    let mut acked = Vec::new();
    let refusal = loop {
        let i = acked.len() as u64;
        assert!(
            i < 2_000,
            "no write refused after {i} writes of 64 KiB under an 8 MiB quota"
        );
        match client.put(key(i), value(i)).await {
            Ok(_) => acked.push(i),
            Err(e) => break e,
        }
    };
    let leader = cluster.wait_for_leader().await.unwrap();
    match &refusal {
        ftkv_client::Error::NoSpace {
            limit,
            metadata,
            message,
        } => {
            assert_eq!(limit.as_deref(), Some("space.quota_bytes"), "{message}");
            assert!(message.contains("space.quota_bytes"), "{message}");
            assert_eq!(metadata["quota_bytes"], (8u64 << 20).to_string());
            assert!(metadata.contains_key("data_dir"), "{metadata:?}");
            assert_eq!(metadata["node_id"], leader.to_string(), "{metadata:?}");
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert!(!refusal.is_ambiguous());
    assert!(acked.len() > 10, "only {} writes before the alarm", acked.len());

    // The exact status on the wire: RESOURCE_EXHAUSTED + ErrorInfo NO_SPACE.
    let mut raw = cluster.kv_raw(leader).await.unwrap();
    let status = raw
        .put(PutRequest {
            key: b"space/raw".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let info = ftkv_proto::status_details::decode(status.details()).unwrap();
    assert_eq!(info.kind(), Kind::NoSpace);
    assert_eq!(info.reason, "NO_SPACE");
    assert_eq!(info.limit, "space.quota_bytes");
    assert_eq!(info.metadata["node_id"], leader.to_string());

    // Reads go on: linearizable through the client, serializable on every node.
    for &i in &acked {
        assert_eq!(client.get(key(i)).await.unwrap(), Some(value(i)), "key {i}");
    }
    cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        let local = cluster.scan_node(id, b"space/", b"space0", true).await.unwrap();
        assert_eq!(local.len(), acked.len(), "node {id}");
    }

    // The alarm shows in /readyz, /metrics, status and `ftkvctl alarm list`.
    let status_addr = cluster.node(leader).unwrap().status_addr;
    let ready = http_get(&status_addr, "/readyz").await;
    assert!(ready.starts_with("HTTP/1.1 503"), "{ready}");
    assert!(
        ready.contains("NOSPACE") && ready.contains("space.quota_bytes"),
        "{ready}"
    );
    let metrics = http_get(&status_addr, "/metrics").await;
    assert!(
        metrics.contains("ftkv_server_alarm{alarm=\"nospace\"} 1"),
        "{metrics}"
    );
    assert!(metrics.contains("ftkv_space_data_dir_bytes"), "{metrics}");
    assert_eq!(cluster.status(leader).await.unwrap().alarms.len(), 1);
    let list = cluster.ctl(&["alarm", "list"]).await.unwrap();
    assert!(list.success(), "{list:?}");
    assert!(
        list.stdout.contains(&format!("memberID:{leader} alarm:NOSPACE")),
        "{list:?}"
    );
    let ctl_put = cluster.ctl(&["put", "space/ctl", "v"]).await.unwrap();
    assert!(!ctl_put.success());
    assert!(ctl_put.stderr.contains("space.quota_bytes"), "{ctl_put:?}");

    // Still over the quota: disarm refuses, naming it. The data dir's size moves on its own
    // (checkpoints compact the tree, snapshots purge the log), so a ballast file of one quota
    // (counted like every file under the data dir) keeps the leader over it whatever they do.
    let ballast = cluster.data_dir(leader).unwrap().join("ballast.test");
    std::fs::write(&ballast, vec![1u8; 8 << 20]).unwrap();
    let early = cluster.ctl(&["alarm", "disarm"]).await.unwrap();
    assert!(!early.success(), "{early:?}");
    assert!(early.stderr.contains("space.quota_bytes"), "{early:?}");
    std::fs::remove_file(&ballast).unwrap();

    // Deletes are accepted while alarmed; once the data dirs shrink, disarm clears the alarm.
    for &i in &acked {
        client.delete(key(i)).await.unwrap();
    }
    // Space comes back as checkpoints (one per 20 entries) drop the deleted values and purge
    // the log: more deletes (accepted while alarmed) keep entries coming.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut filler = 0u64;
    loop {
        for _ in 0..20 {
            filler += 1;
            client.delete(format!("space/gone/{filler}")).await.unwrap();
        }
        let out = cluster.ctl(&["alarm", "disarm"]).await.unwrap();
        if out.success() {
            break;
        }
        assert!(Instant::now() < deadline, "alarm disarm still refused: {out:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let list = cluster.ctl(&["alarm", "list"]).await.unwrap();
    assert!(list.success() && list.stdout.trim().is_empty(), "{list:?}");
    client.put("space/after", "v").await.unwrap();
    assert_eq!(client.get("space/after").await.unwrap(), Some(b"v".to_vec()));
    let leader = cluster.wait_for_leader().await.unwrap();
    let status_addr = cluster.node(leader).unwrap().status_addr;
    wait_for("/readyz 200", Duration::from_secs(60), || {
        let addr = status_addr.clone();
        async move { http_get(&addr, "/readyz").await.starts_with("HTTP/1.1 200") }
    })
    .await;
    cluster.check_no_panics().unwrap();
}

/// Unmounts a tmpfs when dropped (also when the test fails).
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs on {}", dir.display());
        Tmpfs(dir.to_path_buf())
    }

    fn resize(&self, size: &str) {
        let ok = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .status()
            .unwrap()
            .success();
        assert!(ok, "remount {}", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.0)
            .status();
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_on_a_tmpfs_that_fills_up_loses_nothing_acknowledged_and_recovers() {
    // Mounting needs root.
    if !is_root() {
        eprintln!("SKIPPED: mounting a tmpfs needs root (run the tests as root, as CI does)");
        return;
    }
    let _serial = serial().await;
    let folder = tempfile::tempdir().unwrap();
    // No reserve and no quota: the tmpfs node meets the real ENOSPC.
    let cluster = cluster_with(
        r#"
[log]
segment_size = "1MiB"
[raft]
snapshot_every_entries = 40
[space]
disk_reserve_bytes = "0B"
check_interval_ms = 100
"#,
        folder.path(),
    )
    .await;
    let client = cluster.client().await.unwrap();
    client.put("space/seed", "v").await.unwrap();
    cluster.wait_all_caught_up().await.unwrap();

    // Node 3's data dir moves onto a 16 MiB tmpfs.
    let small = 3;
    cluster.stop(small).await.unwrap();
    let data_dir = cluster.data_dir(small).unwrap();
    let aside = folder.path().join("aside");
    copy_dir(&data_dir, &aside);
    std::fs::remove_dir_all(&data_dir).unwrap();
    std::fs::create_dir_all(&data_dir).unwrap();
    let tmpfs = Tmpfs::mount(&data_dir, "16m");
    copy_dir(&aside, &data_dir);
    cluster.restart(small).unwrap();
    cluster.wait_all_caught_up().await.unwrap();

    // Write until the tmpfs node is full (alarm "disk") or writes fail.
    let mut acked: Vec<u64> = Vec::new();
    let mut full_since: Option<usize> = None;
    let mut failures = 0;
    while acked.len() < 3_000 {
        let i = acked.len() as u64 + failures;
        match client.put(key(i), value(i)).await {
            Ok(_) => acked.push(i),
            Err(e) => {
                eprintln!("write {i} failed: {e}");
                failures += 1;
                if failures > 20 {
                    break;
                }
            }
        }
        if full_since.is_none() && acked.len().is_multiple_of(10) {
            let exited = !cluster.is_running(small);
            let alarmed = match client.alarm_list(&cluster.endpoint(small).unwrap()).await {
                Ok(a) => !a.alarms.is_empty(),
                Err(_) => false,
            };
            if exited || alarmed {
                full_since = Some(acked.len());
            }
        }
        if full_since.is_some_and(|n| acked.len() >= n + 20) {
            break;
        }
    }
    assert!(full_since.is_some(), "node {small} never filled its 16 MiB tmpfs");
    // A full disk is not a storage fault: the node waits for space, it does not exit.
    assert!(
        cluster.is_running(small),
        "node {small} exited on a full disk:\n{}",
        cluster.log_tail(small, 40)
    );
    let log = cluster.node_log(small);
    assert!(
        log.contains("No space left on device") || log.contains("NOSPACE"),
        "node {small} did not say its disk is full:\n{}",
        cluster.log_tail(small, 40)
    );

    // Every acknowledged write is readable while the node is full.
    for &i in &acked {
        assert_eq!(client.get(key(i)).await.unwrap(), Some(value(i)), "key {i}");
    }

    // Free space (a larger tmpfs), restart the node, check again on the node itself.
    tmpfs.resize("512m");
    if cluster.is_running(small) {
        cluster.stop(small).await.ok();
    }
    cluster.kill(small).unwrap();
    cluster.restart(small).unwrap();
    cluster.wait_all_caught_up().await.unwrap();
    let local: BTreeMap<Vec<u8>, Vec<u8>> = cluster
        .scan_node(small, b"space/", b"space0", true)
        .await
        .unwrap();
    for &i in &acked {
        assert_eq!(
            local.get(key(i).as_bytes()),
            Some(&value(i)),
            "key {i} on node {small}"
        );
    }

    // The alarm (if the node raised one) is disarmed; writes resume on every node.
    wait_for("alarm disarm to succeed", Duration::from_secs(60), || {
        let attempt = cluster.ctl(&["alarm", "disarm"]);
        async move { attempt.await.unwrap().success() }
    })
    .await;
    client.put("space/after", "v").await.unwrap();
    cluster.wait_all_caught_up().await.unwrap();
    let local = cluster
        .scan_node(small, b"space/after", b"space/after\0", true)
        .await
        .unwrap();
    assert_eq!(local.len(), 1, "the write after recovery is on node {small}");
    for id in cluster.ids() {
        cluster.stop(id).await.ok();
    }
    drop(tmpfs);
}

/// Moves node `id`'s data dir onto a fresh tmpfs of `size` (stopped, copied, restarted).
async fn move_onto_tmpfs(cluster: &Cluster, id: u64, size: &str, folder: &Path) -> Tmpfs {
    cluster.stop(id).await.unwrap();
    let data_dir = cluster.data_dir(id).unwrap();
    let aside = folder.join(format!("aside-{id}"));
    copy_dir(&data_dir, &aside);
    std::fs::remove_dir_all(&data_dir).unwrap();
    std::fs::create_dir_all(&data_dir).unwrap();
    let tmpfs = Tmpfs::mount(&data_dir, size);
    copy_dir(&aside, &data_dir);
    cluster.restart(id).unwrap();
    tmpfs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_disk_fills_serves_reads_refuses_writes_with_no_space_and_resumes_once_space_is_freed() {
    if !is_root() {
        eprintln!("SKIPPED: mounting a tmpfs needs root (run the tests as root, as CI does)");
        return;
    }
    let _serial = serial().await;
    let folder = tempfile::tempdir().unwrap();
    // One node (it is the leader, so it is the one refusing writes), no reserve, no quota: its
    // log, engine and snapshot builds meet the real ENOSPC.
    let cluster = cluster_of(
        1,
        r#"
[log]
segment_size = "1MiB"
[raft]
snapshot_every_entries = 40
[space]
disk_reserve_bytes = "0B"
check_interval_ms = 100
"#,
        folder.path(),
    )
    .await;
    let tmpfs = move_onto_tmpfs(&cluster, 1, "16m", folder.path()).await;
    cluster.wait_for_leader().await.unwrap();
    let client = cluster.client().await.unwrap();

    // Write until a write is refused with NO_SPACE. Writes that time out while the log waits
    // for space are ambiguous: they may still be applied later.
    let mut acked: Vec<u64> = Vec::new();
    let mut ambiguous: Vec<u64> = Vec::new();
    let refusal = loop {
        let i = (acked.len() + ambiguous.len()) as u64;
        assert!(
            i < 2_000,
            "no write refused after {i} writes of 64 KiB on a 16 MiB disk"
        );
        match client.put(key(i), value(i)).await {
            Ok(_) => acked.push(i),
            Err(e) if e.is_ambiguous() => ambiguous.push(i),
            Err(e) => break e,
        }
    };
    match &refusal {
        ftkv_client::Error::NoSpace {
            limit,
            metadata,
            message,
        } => {
            assert_eq!(limit.as_deref(), Some("disk"), "{message}");
            assert!(message.contains("No space left on device"), "{message}");
            assert_eq!(
                metadata["data_dir"],
                cluster.data_dir(1).unwrap().display().to_string(),
                "{metadata:?}"
            );
        }
        other => panic!("expected NoSpace, got {other:?}"),
    }
    assert!(
        acked.len() > 10,
        "only {} writes before the disk was full",
        acked.len()
    );
    assert!(
        cluster.is_running(1),
        "the node exited on a full disk:\n{}",
        cluster.log_tail(1, 40)
    );
    // The exact status: RESOURCE_EXHAUSTED + ErrorInfo NO_SPACE naming the disk.
    let mut raw = cluster.kv_raw(1).await.unwrap();
    let status = raw
        .put(PutRequest {
            key: b"space/raw".to_vec(),
            value: b"v".to_vec(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let info = ftkv_proto::status_details::decode(status.details()).unwrap();
    assert_eq!(info.kind(), Kind::NoSpace);
    assert_eq!(info.reason, "NO_SPACE");
    assert_eq!(info.limit, "disk");
    assert!(info.metadata.contains_key("data_dir"), "{:?}", info.metadata);

    // Reads are served while the disk is full (serializable, from the node itself: on a lone
    // node whose log waits for disk space, linearizable reads wait for space too).
    let local = cluster.scan_node(1, b"space/", b"space0", true).await.unwrap();
    for &i in &acked {
        assert_eq!(local.get(key(i).as_bytes()), Some(&value(i)), "key {i}");
    }

    // Space is freed: writes resume by themselves, without a restart or `alarm disarm`.
    tmpfs.resize("512m");
    let starts = cluster.starts(1);
    wait_for(
        "a write to succeed after space is freed",
        Duration::from_secs(60),
        || {
            let c = client.clone();
            async move { c.put("space/after", "v").await.is_ok() }
        },
    )
    .await;
    assert_eq!(cluster.starts(1), starts, "the node was restarted");
    assert!(cluster.is_running(1));
    assert_eq!(client.get("space/after").await.unwrap(), Some(b"v".to_vec()));
    for &i in &acked {
        assert_eq!(client.get(key(i)).await.unwrap(), Some(value(i)), "key {i} after");
    }
    for &i in &ambiguous {
        let got = client.get(key(i)).await.unwrap();
        assert!(got.is_none() || got == Some(value(i)), "ambiguous key {i}");
    }
    // And everything acknowledged survives a restart.
    cluster.stop(1).await.unwrap();
    cluster.restart(1).unwrap();
    cluster.wait_for_leader().await.unwrap();
    for &i in &acked {
        assert_eq!(
            client.get(key(i)).await.unwrap(),
            Some(value(i)),
            "key {i} after restart"
        );
    }
    cluster.check_no_panics().unwrap();
    cluster.stop(1).await.ok();
    drop(tmpfs);
}

fn is_root() -> bool {
    // `id -u` avoids unsafe code in this crate.
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
        .unwrap_or(false)
}
