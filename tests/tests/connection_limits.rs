//! Issue 14, item 9: idle connections can no longer exhaust a node's file descriptors.
//!
//! A real node runs under `ulimit -n 256` with a connection cap derived from it; the test opens
//! far more silent TCP connections than the cap on every port, then writes enough to roll many
//! log segments (new files) while they are held open: the node keeps serving, stays up, refuses
//! what is over the cap at once, and closes the silent connections after the handshake timeout
//! (one that sent the HTTP/2 preface and then nothing: after the idle timeout).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::process::Stdio;
use std::time::{Duration, Instant};

use ftkv_tests::fixture::{free_ports, serial, Binaries};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const NOFILE: u64 = 256;
const RESERVE: u64 = 128;
const HANDSHAKE_TIMEOUT_MS: u64 = 6_000;
const IDLE_TIMEOUT_MS: u64 = 8_000;
/// Silent connections opened to each port: far over the derived cap of (256 - 128) / 3 = 42.
const SILENT_PER_PORT: usize = 150;

/// Whether the server closed `socket` (EOF or reset) within `within`.
async fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
    let mut buf = [0u8; 256];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue, // e.g. the server's HTTP/2 SETTINGS after a preface
            Err(_) => return false,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_cannot_exhaust_descriptors_and_are_closed() {
    let _serial = serial().await;
    let binaries = Binaries::locate();
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports("127.0.0.1", 3).unwrap();
    let [client, peer, status] = [0, 1, 2].map(|i| format!("127.0.0.1:{}", ports[i]));
    let config = dir.path().join("node.toml");
    std::fs::write(
        &config,
        format!(
            "[log]\nsegment_size = \"64KiB\"\n\
             [server]\nfile_descriptor_reserve = {RESERVE}\nhandshake_timeout_ms = {HANDSHAKE_TIMEOUT_MS}\n\
             idle_timeout_ms = {IDLE_TIMEOUT_MS}\nkeepalive_interval_ms = 1000\n"
        ),
    )
    .unwrap();
    let log_path = dir.path().join("node.log");
    let log = std::fs::File::create(&log_path).unwrap();
    // `ulimit -n` sets the soft and the hard limit: the node cannot raise it.
    let mut node = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -n {NOFILE} && exec \"$0\" \"$@\""))
        .arg(&binaries.node)
        .args(["run", "--config", config.to_str().unwrap(), "--id", "1"])
        .args(["--data-dir", dir.path().join("data").to_str().unwrap()])
        .args(["--listen-client", &client, "--advertise-client", &client])
        .args(["--listen-peer", &peer, "--advertise-peer", &peer])
        .args(["--listen-status", &status])
        .args([
            "--initial-cluster",
            &format!("1={peer}"),
            "--initial-cluster-state",
            "new",
        ])
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let node_log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    let kv = ftkv_client::Client::builder()
        .endpoints([client.clone()])
        .build()
        .await
        .unwrap();
    let started = Instant::now();
    while let Err(e) = kv.put("before", "flood").await {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the node never served: {e}\n{}",
            node_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Flood every port with silent connections, and one that sends only the HTTP/2 preface.
    let flood_started = Instant::now();
    let mut silent = Vec::new();
    for addr in [&client, &peer, &status] {
        for _ in 0..SILENT_PER_PORT {
            if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(addr)).await {
                silent.push(s);
            }
        }
    }
    assert!(
        silent.len() > NOFILE as usize,
        "the flood opened {} connections",
        silent.len()
    );

    // While they are held open the node writes many new log segments (and engine files) and
    // keeps serving reads on the connection it already had.
    for i in 0..40 {
        kv.put(format!("during/{i:02}"), vec![b'x'; 16 * 1024])
            .await
            .unwrap_or_else(|e| panic!("write {i} during the flood: {e}\n{}", node_log()));
    }
    for i in [0, 17, 39] {
        let value = kv.get(format!("during/{i:02}")).await.unwrap();
        assert_eq!(
            value.map(|v| v.len()),
            Some(16 * 1024),
            "read {i} during the flood"
        );
    }
    assert!(
        node.try_wait().unwrap().is_none(),
        "the node exited:\n{}",
        node_log()
    );

    // What was over the cap was refused at once: most of the flood is already closed.
    let mut closed = 0;
    let mut open = Vec::new();
    for mut s in silent {
        if closed_within(&mut s, Duration::from_millis(20)).await {
            closed += 1;
        } else {
            open.push(s);
        }
    }
    // (On a machine so slow that the handshake timeout passed already, all may be closed.)
    if flood_started.elapsed() < Duration::from_millis(HANDSHAKE_TIMEOUT_MS) {
        assert!(
            open.len() <= 3 * 43,
            "{} connections stayed open over a cap of 42 per port ({closed} closed)",
            open.len()
        );
    }

    // The silent ones are closed after the handshake timeout.
    let slack = Duration::from_secs(10);
    for (i, s) in open.iter_mut().enumerate() {
        let left = (flood_started + Duration::from_millis(HANDSHAKE_TIMEOUT_MS) + slack)
            .saturating_duration_since(Instant::now());
        assert!(
            closed_within(s, left.max(Duration::from_millis(50))).await,
            "silent connection {i} still open {:?} after the flood",
            flood_started.elapsed()
        );
    }

    // Slots are free again: a connection that sends the HTTP/2 preface and then nothing is
    // accepted and closed after the idle timeout (the handshake timeout no longer applies).
    let mut preface_only = TcpStream::connect(&client).await.unwrap();
    preface_only
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .unwrap();
    let preface_sent = Instant::now();
    assert!(
        closed_within(&mut preface_only, Duration::from_millis(IDLE_TIMEOUT_MS) + slack).await,
        "a connection that went silent after the preface stayed open"
    );
    let after = preface_sent.elapsed();
    assert!(
        after >= Duration::from_millis(IDLE_TIMEOUT_MS - 1_500),
        "closed after {after:?}, before the idle timeout of {IDLE_TIMEOUT_MS} ms"
    );

    // The node is up and serves new clients.
    let fresh = ftkv_client::Client::builder()
        .endpoints([client.clone()])
        .build()
        .await
        .unwrap();
    fresh.put("after", "flood").await.unwrap();
    assert_eq!(
        fresh.get("during/39").await.unwrap().map(|v| v.len()),
        Some(16 * 1024)
    );
    assert_eq!(fresh.get("before").await.unwrap().as_deref(), Some(&b"flood"[..]));
    assert!(
        node.try_wait().unwrap().is_none(),
        "the node exited:\n{}",
        node_log()
    );
    let text = node_log();
    assert!(!text.contains("panicked"), "{text}");
    node.kill().await.unwrap();
}
