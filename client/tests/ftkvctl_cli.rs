//! The `ftkvctl` binary against in-process fake nodes: outputs, the JSON contracts that scripts
//! rely on (`endpoint status --cluster`, `bench put`), and exit codes with one-line errors.
#![allow(clippy::unwrap_used)]

mod common;

use std::process::Output;
use std::sync::{Arc, Mutex};

use common::{serve, FakeNode, Shared};
use ftkv_proto::v1 as pb;

/// Runs ftkvctl with `args` (and `stdin`) off the async runtime, so the fake servers keep running.
async fn ctl(args: &[&str], stdin: &str) -> Output {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let stdin = stdin.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::Write;
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ftkvctl"))
            .args(&args)
            .env_remove("FTKV_ENDPOINTS")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        child.wait_with_output().unwrap()
    })
    .await
    .unwrap()
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Leader + follower (redirecting to the leader) + a dead member; returns (leader, follower).
async fn cluster() -> (String, String, Arc<Mutex<Shared>>) {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let leader = FakeNode::leader(&shared);
    let leader_ep = serve(leader.clone()).await;
    let follower_ep = serve(FakeNode::follower(2, &leader_ep, &shared)).await;
    *leader.members.lock().unwrap() = vec![
        pb::Member {
            id: 1,
            client_endpoint: leader_ep.clone(),
            peer_endpoint: "x:1".into(),
            is_voter: true,
        },
        pb::Member {
            id: 2,
            client_endpoint: follower_ep.clone(),
            peer_endpoint: "x:2".into(),
            is_voter: true,
        },
        pb::Member {
            id: 3,
            client_endpoint: "127.0.0.1:1".into(),
            peer_endpoint: "x:3".into(),
            is_voter: true,
        },
    ];
    (leader_ep, follower_ep, shared)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_get_del_and_missing_keys() {
    let (_, follower, _) = cluster().await;
    let ep = ["--endpoints", follower.as_str()];
    let o = ctl(&[&ep[..], &["put", "k", "v"]].concat(), "").await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "OK\n");
    let o = ctl(&[&ep[..], &["get", "k"]].concat(), "").await;
    assert_eq!(stdout(&o), "k\nv\n");
    let o = ctl(&[&ep[..], &["-w", "json", "get", "k"]].concat(), "").await;
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(
        (v["found"].as_bool(), v["value"].as_str()),
        (Some(true), Some("v"))
    );
    // A missing key: nothing and exit 0 in simple mode, {"found":false} in JSON.
    let o = ctl(&[&ep[..], &["get", "nope"]].concat(), "").await;
    assert!(o.status.success());
    assert_eq!(stdout(&o), "");
    let o = ctl(&[&ep[..], &["-w", "json", "get", "nope"]].concat(), "").await;
    assert_eq!(stdout(&o), "{\"found\":false}\n");
    // Value from stdin, hex in and out.
    let o = ctl(&[&ep[..], &["put", "bin"]].concat(), "raw bytes").await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ctl(&[&ep[..], &["--hex", "get", "62696e"]].concat(), "").await;
    assert_eq!(stdout(&o), "62696e\n726177206279746573\n", "\"raw bytes\" as hex");
    let o = ctl(&[&ep[..], &["upsert", "c", "--add", "7"]].concat(), "").await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ctl(
        &[&ep[..], &["--hex", "get", "63", "--print-value-only"]].concat(),
        "",
    )
    .await;
    assert_eq!(stdout(&o), "0700000000000000\n");
    let o = ctl(&[&ep[..], &["del", "k"]].concat(), "").await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ctl(&[&ep[..], &["get", "k"]].concat(), "").await;
    assert_eq!(stdout(&o), "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_status_cluster_json_contract() {
    let (leader, _, _) = cluster().await;
    let o = ctl(
        &[
            "--endpoints",
            &leader,
            "-w",
            "json",
            "endpoint",
            "status",
            "--cluster",
        ],
        "",
    )
    .await;
    assert!(
        o.status.success(),
        "one member down is a warning, not a failure: {}",
        stderr(&o)
    );
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    let nodes = v.as_array().unwrap();
    assert_eq!(nodes.len(), 2, "the dead member is left out: {v}");
    for n in nodes {
        for f in [
            "id",
            "endpoint",
            "is_leader",
            "leader_id",
            "term",
            "commit_index",
            "applied_index",
            "engine",
        ] {
            assert!(n.get(f).is_some(), "missing {f} in {n}");
        }
    }
    assert_eq!(nodes.iter().filter(|n| n["is_leader"] == true).count(), 1);
    assert!(
        stderr(&o).contains("127.0.0.1:1"),
        "the dead member is named on stderr: {}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bench_put_prints_one_json_object() {
    let (leader, follower, shared) = cluster().await;
    let eps = format!("{follower},{leader}");
    let args = [
        "--endpoints",
        &eps,
        "-w",
        "json",
        "bench",
        "put",
        "--clients",
        "4",
        "--duration",
        "2500ms",
    ];
    let o = ctl(&args, "").await;
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).unwrap();
    for f in ["ops", "ops_per_sec", "errors"] {
        assert!(v.get(f).is_some(), "missing {f} in {v}");
    }
    for f in ["min", "avg", "p50", "p95", "p99", "max"] {
        assert!(
            v["latency_ms"].get(f).and_then(|x| x.as_f64()).is_some(),
            "latency_ms.{f} in {v}"
        );
    }
    let ops = v["ops"].as_u64().unwrap();
    assert!(ops > 0);
    assert_eq!(v["errors"], 0);
    assert_eq!(v["ops_per_entry"], 2.5, "read from the leader's status");
    assert!(shared.lock().unwrap().write_sessions.len() as u64 >= ops);
    assert!(
        stderr(&o).contains("writes/s"),
        "progress lines on stderr: {}",
        stderr(&o)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failures_exit_1_with_one_line() {
    let (leader, _, _) = cluster().await;
    let check = |o: &Output, needle: &str| {
        assert_eq!(o.status.code(), Some(1), "stderr: {}", stderr(o));
        assert_eq!(stdout(o), "", "nothing on stdout");
        let err = stderr(o);
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(
            err.starts_with("Error: ") && err.contains(needle),
            "{needle:?} not in {err}"
        );
    };
    let o = ctl(
        &["--endpoints", &leader, "put", "a-key-that-is-way-too-long", "v"],
        "",
    )
    .await;
    check(&o, "max_key_bytes");
    let o = ctl(
        &["--endpoints", "127.0.0.1:1", "--timeout", "500ms", "get", "k"],
        "",
    )
    .await;
    check(&o, "127.0.0.1:1");
    let o = ctl(&["--endpoints", &leader, "txn"], "exists(a)\nput a 1\n\nfrob\n").await;
    check(&o, "line 2");
    let o = ctl(&["--endpoints", &leader, "--hex", "put", "zz", "00"], "").await;
    check(&o, "invalid hex key");
    let o = ctl(&["--endpoints", "localhost", "get", "k"], "").await;
    check(&o, "expected host:port");
    let o = ctl(
        &[
            "--endpoints",
            "127.0.0.1:1",
            "--timeout",
            "500ms",
            "endpoint",
            "status",
        ],
        "",
    )
    .await;
    assert_eq!(o.status.code(), Some(1));
    assert_eq!(stdout(&o), "");
    // Usage errors come from clap with exit code 2.
    let o = ctl(&["upsert", "k"], "").await;
    assert_eq!(o.status.code(), Some(2));
}

/// 1 MiB of pseudo-random bytes (not valid UTF-8), NUL, 0xff and newlines included.
fn binary_value() -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut v: Vec<u8> = (0..1 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 32) as u8
        })
        .collect();
    v[..4].copy_from_slice(&[0x00, 0xff, 0x0a, 0xc3]);
    v
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_values_are_written_byte_for_byte() {
    let (leader, _, _) = cluster().await;
    let ep = ["--endpoints", leader.as_str()];
    let value = binary_value();
    assert!(std::str::from_utf8(&value).is_err());
    // Store it under "bin" and under a non-UTF-8 key (0xfe 0x01); value hex on stdin.
    for key in ["62696e", "fe01"] {
        let o = ctl(&[&ep[..], &["--hex", "put", key]].concat(), &hex(&value)).await;
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let o = ctl(&[&ep[..], &["--hex", "put", "6b", "00ff"]].concat(), "").await;
    assert!(o.status.success(), "{}", stderr(&o));
    // Simple mode: the value's bytes, then a newline.
    let o = ctl(&[&ep[..], &["get", "bin", "--print-value-only"]].concat(), "").await;
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(o.stdout.len() == value.len() + 1 && o.stdout[..value.len()] == value[..]);
    let o = ctl(&[&ep[..], &["get", "bin"]].concat(), "").await;
    assert!(o.stdout.starts_with(b"bin\n") && o.stdout[4..4 + value.len()] == value[..]);
    // Keys too: the scan from 0x7f finds only the 0xfe 0x01 key.
    let o = ctl(&[&ep[..], &["scan", "\u{7f}"]].concat(), "").await;
    let mut expected = vec![0xfe, 0x01, b'\n'];
    expected.extend_from_slice(&value);
    expected.push(b'\n');
    assert!(o.stdout == expected, "scan output is raw bytes");
    let o = ctl(&[&ep[..], &["get", "k", "--print-value-only"]].concat(), "").await;
    assert_eq!(o.stdout, vec![0x00, 0xff, b'\n']);
    // JSON: lossless, hex with an encoding marker for non-UTF-8 fields.
    let o = ctl(&[&ep[..], &["-w", "json", "get", "k"]].concat(), "").await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["key"], "k");
    assert!(v.get("key_encoding").is_none(), "{v}");
    assert_eq!(
        (v["value"].as_str(), v["value_encoding"].as_str()),
        (Some("00ff"), Some("hex"))
    );
    let o = ctl(&[&ep[..], &["-w", "json", "scan", "\u{7f}"]].concat(), "").await;
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kvs"][0]["key"], "fe01");
    assert_eq!(v["kvs"][0]["key_encoding"], "hex");
    assert_eq!(v["kvs"][0]["value_encoding"], "hex");
    assert!(v["kvs"][0]["value"].as_str() == Some(hex(&value).as_str()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_quietly() {
    let (leader, _, _) = cluster().await;
    // More output than a pipe buffer holds (64 KiB), so the writer meets the closed pipe.
    let o = ctl(&["--endpoints", &leader, "put", "a", "1"], "").await;
    assert!(o.status.success(), "{}", stderr(&o));
    let o = ctl(&["--endpoints", &leader, "put", "big"], &"x".repeat(512 * 1024)).await;
    assert!(o.status.success(), "{}", stderr(&o));
    let out = tokio::task::spawn_blocking(move || {
        use std::io::{BufRead, BufReader};
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_ftkvctl"))
            .args(["--endpoints", &leader, "scan", "", "--limit", "5000"])
            .env_remove("FTKV_ENDPOINTS")
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // Like `| head -1`: read one line, then close the pipe.
        let mut first = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut first)
            .unwrap();
        let o = child.wait_with_output().unwrap();
        (first, o)
    })
    .await
    .unwrap();
    let (first, o) = out;
    assert_eq!(first, "a\n");
    assert_eq!(o.status.code(), Some(0), "stderr: {}", stderr(&o));
    assert_eq!(stderr(&o), "", "no panic, no message");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_counts_and_budgets_are_usage_errors() {
    let cases: [(&[&str], &str); 7] = [
        (&["bench", "put", "--clients", "0"], "--clients"),
        (&["bench", "put", "--duration", "0s"], "--duration"),
        (&["bench", "put", "--connections", "0"], "--connections"),
        (&["bench", "put", "--key-space", "0"], "--key-space"),
        (
            &["--request-timeout", "0ms", "put", "k", "v"],
            "--request-timeout",
        ),
        (&["--timeout", "0s", "get", "k"], "--timeout"),
        (&["--connect-timeout", "0s", "get", "k"], "--connect-timeout"),
    ];
    for (args, flag) in cases {
        // Nothing listens there: a usage error must come before any connection attempt.
        let o = ctl(&[&["--endpoints", "127.0.0.1:1"][..], args].concat(), "").await;
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reversed_ranges_get_a_clear_error() {
    let (leader, _, shared) = cluster().await;
    let ep = ["--endpoints", leader.as_str()];
    let o = ctl(&[&ep[..], &["scan", "b", "a"]].concat(), "").await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("scan: start key \"b\" sorts after end key \"a\""),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "");
    // An empty END is unbounded, not "before START".
    let o = ctl(&[&ep[..], &["scan", "b", ""]].concat(), "").await;
    assert!(o.status.success(), "{}", stderr(&o));
    let before = shared.lock().unwrap().write_sessions.len();
    let o = ctl(&[&ep[..], &["txn"]].concat(), "\ndel-range z a\n").await;
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("txn del-range: start key \"z\""),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        shared.lock().unwrap().write_sessions.len(),
        before,
        "nothing was sent"
    );
}

/// `--user` takes its password from a file, FTKV_PASSWORD or a terminal prompt, never a flag.
#[tokio::test]
async fn a_user_password_never_comes_from_a_flag() {
    let run = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_ftkvctl"))
            .args(args)
            .env_remove("FTKV_PASSWORD")
            .env_remove("FTKV_PASSWORD_FILE")
            .env_remove("FTKV_USER")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let o = run(&["--endpoints", "127.0.0.1:1", "--user", "alice", "get", "k"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        stderr(&o).contains("--user alice needs a password: --password-file FILE, FTKV_PASSWORD"),
        "{}",
        stderr(&o)
    );
    let o = run(&[
        "--endpoints",
        "127.0.0.1:1",
        "--user",
        "alice",
        "--password",
        "x",
        "get",
        "k",
    ]);
    assert_eq!(o.status.code(), Some(2), "no --password flag: {o:?}");
    let empty = std::env::temp_dir().join(format!("ftkvctl-empty-pw-{}", std::process::id()));
    std::fs::write(&empty, "").unwrap();
    let o = run(&[
        "--endpoints",
        "127.0.0.1:1",
        "--user",
        "alice",
        "--password-file",
        empty.to_str().unwrap(),
        "get",
        "k",
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).contains("is empty"), "{}", stderr(&o));
    std::fs::remove_file(&empty).unwrap();
    // A new user's password: never a flag either.
    let o = run(&["--endpoints", "127.0.0.1:1", "user", "add", "bob"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(stderr(&o).contains("FTKV_NEW_PASSWORD"), "{}", stderr(&o));
}
