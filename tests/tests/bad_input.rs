//! Issue 2, acceptance 8: bad input gives a clear error and a non-zero CLI exit, and no node
//! panics.
//!
//! Limits (defaults): empty key, key over 16 KiB, value over 1 MiB, batch over 10,000 ops are
//! refused with `INVALID_ARGUMENT` naming the limit, both through the client library and by the
//! node itself (raw gRPC, no client-side check in between); requests exactly at a limit pass.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::process::Stdio;
use std::time::{Duration, Instant};

use ftkv_client::{Error, Op};
use ftkv_proto::v1::{write_op, PutOp, PutRequest, WriteOp, WriteRequest};
use ftkv_tests::fixture::{free_ports, run_ftkvctl, serial, Binaries, Cluster, ClusterOptions};

const KEY_LIMIT_BYTES: usize = 16 * 1024;
const VALUE_LIMIT_BYTES: usize = 1024 * 1024;
const BATCH_LIMIT_OPS: usize = 10_000;

/// Asserts `result` is `InvalidArgument` whose limit or message names `limit`.
fn assert_invalid<T: std::fmt::Debug>(result: Result<T, Error>, limit: &str, what: &str) {
    match result {
        Err(Error::InvalidArgument {
            message,
            limit: named,
        }) => {
            let text = format!("{message} {}", named.clone().unwrap_or_default());
            assert!(
                text.contains(limit),
                "{what}: the error should name {limit:?}: {message:?} / {named:?}"
            );
        }
        other => panic!("{what}: expected InvalidArgument naming {limit}, got {other:?}"),
    }
}

/// Asserts a raw gRPC answer is `INVALID_ARGUMENT` mentioning `limit`.
fn assert_raw_invalid<T: std::fmt::Debug>(result: Result<T, tonic::Status>, limit: &str, what: &str) {
    match result {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what}: {status:?}");
            assert!(
                status.message().contains(limit),
                "{what}: message should name {limit}: {status:?}"
            );
        }
        Ok(answer) => panic!("{what}: the node accepted it: {answer:?}"),
    }
}

fn put_ops(count: usize) -> Vec<Op> {
    (0..count)
        .map(|i| Op::put(format!("batch/{i:05}"), "v"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_and_no_node_panics() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();

    // --- through the client library ---
    let long_key = "k".repeat(KEY_LIMIT_BYTES + 1);
    let big_value = vec![b'v'; VALUE_LIMIT_BYTES + 1];
    match client.put("", "v").await {
        Err(Error::InvalidArgument { message, limit }) => {
            let text = format!("{message} {}", limit.unwrap_or_default()).to_lowercase();
            assert!(
                text.contains("empty") || text.contains("key"),
                "empty key error says why: {text}"
            );
        }
        other => panic!("empty key: expected InvalidArgument, got {other:?}"),
    }
    assert_invalid(
        client.put(&long_key, "v").await,
        "max_key_bytes",
        "key over 16 KiB",
    );
    assert_invalid(
        client.put("big", &big_value).await,
        "max_value_bytes",
        "value over 1 MiB",
    );
    assert_invalid(
        client.write(put_ops(BATCH_LIMIT_OPS + 1)).await,
        "max_batch_ops",
        "batch over 10,000 ops",
    );
    assert_invalid(
        client.get(&long_key).await,
        "max_key_bytes",
        "get with a key over 16 KiB",
    );

    // --- by the node itself (raw gRPC to the leader) ---
    let mut raw = cluster.kv_raw(leader).await.unwrap();
    let raw_put = |key: Vec<u8>, value: Vec<u8>| PutRequest {
        key,
        value,
        session: None,
    };
    assert_raw_invalid(
        raw.put(raw_put(Vec::new(), b"v".to_vec())).await,
        "",
        "raw empty key",
    );
    assert_raw_invalid(
        raw.put(raw_put(long_key.clone().into_bytes(), b"v".to_vec()))
            .await,
        "max_key_bytes",
        "raw key over 16 KiB",
    );
    assert_raw_invalid(
        raw.put(raw_put(b"big".to_vec(), big_value.clone())).await,
        "max_value_bytes",
        "raw value over 1 MiB",
    );
    let ops: Vec<WriteOp> = (0..=BATCH_LIMIT_OPS)
        .map(|i| WriteOp {
            op: Some(write_op::Op::Put(PutOp {
                key: format!("raw/{i}").into_bytes(),
                value: b"v".to_vec(),
            })),
        })
        .collect();
    assert_raw_invalid(
        raw.write(WriteRequest { ops, session: None }).await,
        "max_batch_ops",
        "raw batch over 10,000 ops",
    );
    // a follower refuses bad input too (it must not forward or crash on it)
    let follower = cluster.ids().into_iter().find(|&id| id != leader).unwrap();
    let mut raw_follower = cluster.kv_raw(follower).await.unwrap();
    let answer = raw_follower
        .put(raw_put(long_key.clone().into_bytes(), b"v".to_vec()))
        .await;
    assert!(answer.is_err(), "follower accepted an oversized key: {answer:?}");

    // --- through ftkvctl ---
    let out = cluster.ctl(&["put", "", "v"]).await.unwrap();
    assert!(!out.success(), "ftkvctl put with an empty key exited 0: {out:?}");
    assert!(!out.stderr.trim().is_empty(), "ftkvctl says why: {out:?}");
    let out = cluster.ctl(&["put", &long_key, "v"]).await.unwrap();
    assert!(!out.success(), "ftkvctl put with a 16 KiB + 1 key exited 0");
    assert!(
        out.stderr.contains("max_key_bytes"),
        "ftkvctl names the limit: {}",
        out.stderr
    );
    // a value over 1 MiB through stdin (too big for argv)
    let big_text = "v".repeat(VALUE_LIMIT_BYTES + 1);
    let out = cluster
        .ctl_with_stdin(&["put", "cli/big"], &big_text)
        .await
        .unwrap();
    assert!(!out.success(), "ftkvctl put of a 1 MiB + 1 value exited 0");
    assert!(
        out.stderr.contains("max_value_bytes"),
        "ftkvctl names the limit: {}",
        out.stderr
    );
    // a txn of 10,001 ops through the CLI (stdin script)
    let mut script = String::from("\n");
    for i in 0..=BATCH_LIMIT_OPS {
        script.push_str(&format!("put cli-batch/{i} v\n"));
    }
    let out = cluster.ctl_with_stdin(&["txn"], &script).await.unwrap();
    assert!(
        !out.success(),
        "ftkvctl txn of 10,001 ops exited 0: {}",
        out.stdout
    );
    assert!(
        out.stderr.contains("max_"),
        "ftkvctl names the limit: {}",
        out.stderr
    );
    // malformed txn scripts
    for bad in [
        "value(\"k\") ~~ \"v\"\n\nput k v\n",
        "bogus(\"k\")\n",
        "\nfrobnicate k v\n",
        "\nput k\n",
    ] {
        let out = cluster.ctl_with_stdin(&["txn"], bad).await.unwrap();
        assert!(!out.success(), "malformed txn script {bad:?} exited 0: {out:?}");
        assert!(
            out.stderr.contains("line"),
            "the error names the line: {:?}",
            out.stderr
        );
    }
    assert_eq!(
        client.get("k").await.unwrap(),
        None,
        "no malformed script wrote anything"
    );

    // --- unreachable endpoints: non-zero exit, quickly ---
    let dead = free_ports("127.0.0.1", 2).unwrap();
    let endpoints = format!("127.0.0.1:{},127.0.0.1:{}", dead[0], dead[1]);
    let started = Instant::now();
    let out = run_ftkvctl(
        &["--endpoints", &endpoints, "get", "k"],
        None,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let elapsed = started.elapsed();
    assert!(!out.success(), "ftkvctl against dead endpoints exited 0: {out:?}");
    assert!(!out.stderr.trim().is_empty(), "ftkvctl says why: {out:?}");
    eprintln!(
        "ftkvctl against unreachable endpoints failed in {elapsed:?}: {}",
        out.stderr.trim()
    );
    // Refused connections are retried until the documented `--timeout` (default 5 s), no longer.
    assert!(
        elapsed < Duration::from_secs(13),
        "ftkvctl took {elapsed:?} to give up (default --timeout 10s)"
    );
    let started = Instant::now();
    let out = run_ftkvctl(
        &["--endpoints", &endpoints, "--timeout", "1s", "get", "k"],
        None,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let elapsed = started.elapsed();
    assert!(
        !out.success(),
        "ftkvctl --timeout 1s against dead endpoints exited 0: {out:?}"
    );
    assert!(
        elapsed < Duration::from_secs(4),
        "ftkvctl --timeout 1s took {elapsed:?} against dead endpoints"
    );
    let out = run_ftkvctl(
        &["--endpoints", &endpoints, "put", "k", "v"],
        None,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(
        !out.success(),
        "ftkvctl put against dead endpoints exited 0: {out:?}"
    );
    let out = run_ftkvctl(
        &["--endpoints", "not an endpoint", "get", "k"],
        None,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    assert!(
        !out.success(),
        "ftkvctl with a malformed endpoint exited 0: {out:?}"
    );

    // --- the node's own command line ---
    let binaries = Binaries::locate();
    let scratch = tempfile::tempdir().unwrap();
    let config = scratch.path().join("bad.toml");
    std::fs::write(&config, "no_such_key_ftkv = 1\n").unwrap();
    let ports = free_ports("127.0.0.1", 3).unwrap();
    let args = node_args(9, scratch.path().join("data").to_str().unwrap(), &ports);
    let mut with_config = vec!["run".to_string(), "--config".into(), config.display().to_string()];
    with_config.extend(args[1..].iter().cloned());
    let (code, output) = run_node(&binaries, &with_config, Duration::from_secs(20)).await;
    assert_ne!(
        code,
        Some(0),
        "ftkv-node accepted an unknown config key:\n{output}"
    );
    assert!(
        code.is_some(),
        "ftkv-node with an unknown config key did not exit within 20 s:\n{output}"
    );
    assert!(
        output.contains("no_such_key_ftkv"),
        "the error names the unknown key:\n{output}"
    );

    // LOCK: a second node on a running node's data dir fails at once.
    let data_dir = cluster.data_dir(leader).unwrap();
    let lock = std::fs::read_to_string(data_dir.join("LOCK")).unwrap_or_default();
    let pid = cluster.pid(leader).unwrap();
    assert!(
        lock.contains(&pid.to_string()),
        "DATA_DIR/LOCK holds the pid {pid}: {lock:?}"
    );
    let ports = free_ports("127.0.0.1", 3).unwrap();
    let args = node_args(leader, data_dir.to_str().unwrap(), &ports);
    let started = Instant::now();
    let (code, output) = run_node(&binaries, &args, Duration::from_secs(20)).await;
    assert!(
        code.is_some(),
        "a second ftkv-node on a locked data dir kept running for 20 s:\n{output}"
    );
    assert_ne!(
        code,
        Some(0),
        "a second ftkv-node on a locked data dir exited 0:\n{output}"
    );
    let lowered = output.to_lowercase();
    assert!(
        (lowered.contains("lock") || lowered.contains("in use")) && output.contains(&pid.to_string()),
        "the error says the data dir is locked and by which pid ({pid}):\n{output}"
    );
    eprintln!(
        "second node on a locked data dir exited in {:?}: {}",
        started.elapsed(),
        output.trim()
    );

    // --- afterwards every node is alive, serves, and never panicked ---
    for id in cluster.ids() {
        assert!(
            cluster.is_running(id),
            "node {id} died: {:?}\n{}",
            cluster.exit_status(id),
            cluster.log_tail(id, 30)
        );
    }
    client.put("still/alive", "yes").await.unwrap();
    cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        let status = cluster.status(id).await.unwrap();
        assert_eq!(status.node_id, id);
    }
    cluster.check_no_panics().unwrap();
}

/// Requests exactly at each limit are accepted (16 KiB key, 1 MiB value, 10,000-op batch),
/// each within the client's default 15 s budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_at_the_limits_are_accepted() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster.client().await.unwrap();
    let key = "k".repeat(KEY_LIMIT_BYTES);
    client.put(&key, "at-limit").await.unwrap();
    assert_eq!(client.get(&key).await.unwrap().as_deref(), Some(&b"at-limit"[..]));
    let started = Instant::now();
    let put = client.put("value-at-limit", vec![b'v'; VALUE_LIMIT_BYTES]).await;
    eprintln!("1 MiB put: {:?} in {:?}", put, started.elapsed());
    put.unwrap();
    assert_eq!(
        client.get("value-at-limit").await.unwrap().map(|v| v.len()),
        Some(VALUE_LIMIT_BYTES)
    );
    let started = Instant::now();
    let write = client.write(put_ops(BATCH_LIMIT_OPS)).await;
    eprintln!("10,000-op batch: {:?} in {:?}", write, started.elapsed());
    write.unwrap();
    assert_eq!(
        client.get("batch/09999").await.unwrap().as_deref(),
        Some(&b"v"[..])
    );
    let index = cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        let local = cluster.scan_node(id, b"batch/", b"batch0", true).await.unwrap();
        assert_eq!(local.len(), BATCH_LIMIT_OPS, "node {id} at index {index}");
    }
    cluster.check_no_panics().unwrap();
}

/// `Kv.Batch`: a bad item gets its own INVALID_ARGUMENT answer without hurting its neighbours,
/// and a stream message over the item limit ends the stream with INVALID_ARGUMENT; no panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_stream_refuses_bad_items_and_oversized_batches() {
    use ftkv_proto::v1::{batch_request_item, batch_response_item, BatchRequest, BatchRequestItem};
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let mut raw = cluster.kv_raw(leader).await.unwrap();
    let put = |key: &[u8]| {
        Some(batch_request_item::Request::Put(PutRequest {
            key: key.to_vec(),
            value: b"v".to_vec(),
            session: None,
        }))
    };
    let items = vec![
        BatchRequestItem {
            id: 1,
            request: put(b""),
        },
        BatchRequestItem { id: 2, request: None },
        BatchRequestItem {
            id: 3,
            request: put(b"batch-ok"),
        },
    ];
    let mut answers = raw
        .batch(futures::stream::iter(vec![BatchRequest { items }]))
        .await
        .unwrap()
        .into_inner();
    let mut by_id = std::collections::BTreeMap::new();
    while let Some(message) = answers.message().await.unwrap() {
        for item in message.items {
            by_id.insert(item.id, item.response);
        }
    }
    assert_eq!(by_id.len(), 3, "every item answered once: {by_id:?}");
    for id in [1, 2] {
        match &by_id[&id] {
            Some(batch_response_item::Response::Error(e)) => {
                assert_eq!(e.code, tonic::Code::InvalidArgument as i32, "item {id}: {e:?}")
            }
            other => panic!("item {id} should be refused, got {other:?}"),
        }
    }
    assert!(
        matches!(by_id[&3], Some(batch_response_item::Response::Put(_))),
        "the valid item still succeeds: {:?}",
        by_id[&3]
    );

    let too_many: Vec<BatchRequestItem> = (0..10_001u64)
        .map(|id| BatchRequestItem {
            id,
            request: put(format!("k{id}").as_bytes()),
        })
        .collect();
    let mut answers = raw
        .batch(futures::stream::iter(vec![BatchRequest { items: too_many }]))
        .await
        .unwrap()
        .into_inner();
    let status = match answers.message().await {
        Ok(Some(m)) => panic!(
            "no item of an oversized batch may run: {} answered",
            m.items.len()
        ),
        Ok(None) => panic!("the stream ended without an error"),
        Err(status) => status,
    };
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("10000"), "names the limit: {status:?}");
    cluster.check_no_panics().unwrap();
}

/// `run --id ID --data-dir DIR` plus every address flag on `ports` (client, peer, status).
fn node_args(id: u64, data_dir: &str, ports: &[u16]) -> Vec<String> {
    let client = format!("127.0.0.1:{}", ports[0]);
    let peer = format!("127.0.0.1:{}", ports[1]);
    let status = format!("127.0.0.1:{}", ports[2]);
    [
        "run",
        "--id",
        &id.to_string(),
        "--data-dir",
        data_dir,
        "--listen-client",
        &client,
        "--advertise-client",
        &client,
        "--listen-peer",
        &peer,
        "--advertise-peer",
        &peer,
        "--listen-status",
        &status,
        "--initial-cluster",
        &format!("{id}={peer}"),
        "--initial-cluster-state",
        "new",
    ]
    .map(str::to_string)
    .to_vec()
}

/// Runs `ftkv-node ARGS`; returns its exit code (`None` if it was still running after
/// `timeout`, then it is killed) and its stdout + stderr.
async fn run_node(binaries: &Binaries, args: &[String], timeout: Duration) -> (Option<i32>, String) {
    let mut child = tokio::process::Command::new(&binaries.node)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let status = tokio::time::timeout(timeout, child.wait()).await;
    let code = match status {
        Ok(status) => Some(status.unwrap().code().unwrap_or(-1)),
        Err(_) => {
            child.kill().await.unwrap();
            None
        }
    };
    let output = child.wait_with_output().await.unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (code, text)
}
