//! `ftkv-node` takes every configuration key from an `FTKV_*` environment variable (containers
//! and Compose files configure nodes that way), below flags and above the TOML file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::{Command, Output};

fn node(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ftkv-node"));
    cmd.args(args);
    // Only the variables of this test: none inherited from the machine running it.
    for (k, _) in std::env::vars() {
        if k.starts_with("FTKV_") {
            cmd.env_remove(k);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn printed_config(env: &[(&str, &str)], args: &[&str]) -> toml::Table {
    let o = node(&[&["--print-config"], args].concat(), env);
    assert!(
        o.status.success(),
        "ftkv-node --print-config failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap().parse().unwrap()
}

fn key<'a>(t: &'a toml::Table, path: &str) -> &'a toml::Value {
    let mut parts = path.split('.');
    let first = parts.next().unwrap();
    let mut v = t.get(first).unwrap_or_else(|| panic!("{path} missing"));
    for p in parts {
        v = v.get(p).unwrap_or_else(|| panic!("{path} missing"));
    }
    v
}

#[test]
fn every_section_key_is_set_by_its_variable() {
    let env = [
        ("FTKV_ID", "2"),
        ("FTKV_DATA_DIR", "/data"),
        ("FTKV_ADVERTISE_PEER", "ftkv-2:7380"),
        (
            "FTKV_INITIAL_CLUSTER",
            "1=ftkv-1:7380,2=ftkv-2:7380,3=ftkv-3:7380",
        ),
        ("FTKV_ENGINE_COMPRESSION", "zstd:3"),
        ("FTKV_ENGINE_CLEANER_PERIOD_MS", "0"),
        ("FTKV_ENGINE_LOADER_MEMORY_SIZE", "8MiB"),
        ("FTKV_LOG_SEGMENT_SIZE", "8MiB"),
        ("FTKV_RAFT_ACK_ALL_TIMEOUT_MS", "5000"),
        ("FTKV_RAFT_HEARTBEAT_INTERVAL_MS", "100"),
        ("FTKV_RAFT_ELECTION_TIMEOUT_MIN_MS", "500"),
        ("FTKV_RAFT_ELECTION_TIMEOUT_MAX_MS", "900"),
        ("FTKV_RAFT_PEER_MAX_MESSAGE_SIZE", "32MiB"),
        ("FTKV_BATCH_MAX_OPS", "1000"),
        ("FTKV_BATCH_MAX_BYTES", "2MiB"),
        ("FTKV_BATCH_MAX_IN_FLIGHT", "3"),
        ("FTKV_LIMITS_MAX_KEY_BYTES", "4KiB"),
        ("FTKV_LIMITS_MAX_VALUE_BYTES", "512KiB"),
        ("FTKV_LIMITS_MAX_BATCH_BYTES", "2MiB"),
        ("FTKV_LIMITS_MAX_BATCH_OPS", "500"),
        ("FTKV_SERVER_MAX_CONNECTIONS_PER_PORT", "1000"),
        ("FTKV_SERVER_FILE_DESCRIPTOR_RESERVE", "256"),
        ("FTKV_SERVER_IDLE_TIMEOUT_MS", "120000"),
        ("FTKV_SERVER_HANDSHAKE_TIMEOUT_MS", "5000"),
        ("FTKV_SERVER_KEEPALIVE_INTERVAL_MS", "15000"),
        ("FTKV_SERVER_KEEPALIVE_TIMEOUT_MS", "5000"),
    ];
    let c = printed_config(&env, &[]);
    let expect = |path: &str, want: toml::Value| {
        assert_eq!(key(&c, path), &want, "{path}");
    };
    expect("id", 2.into());
    expect("data_dir", "/data".into());
    expect("advertise_peer", "ftkv-2:7380".into());
    expect(
        "initial_cluster",
        "1=ftkv-1:7380,2=ftkv-2:7380,3=ftkv-3:7380".into(),
    );
    expect("engine.compression.zstd", 3.into());
    expect("engine.cleaner_period_ms", 0.into());
    expect("engine.loader_memory_size", "8MiB".into());
    expect("log.segment_size", "8MiB".into());
    expect("raft.ack_all_timeout_ms", 5000.into());
    expect("raft.heartbeat_interval_ms", 100.into());
    expect("raft.election_timeout_min_ms", 500.into());
    expect("raft.election_timeout_max_ms", 900.into());
    expect("raft.peer_max_message_size", "32MiB".into());
    expect("batch.max_ops", 1000.into());
    expect("batch.max_bytes", "2MiB".into());
    expect("batch.max_in_flight", 3.into());
    expect("limits.max_key_bytes", "4KiB".into());
    expect("limits.max_value_bytes", "512KiB".into());
    expect("limits.max_batch_bytes", "2MiB".into());
    expect("limits.max_batch_ops", 500.into());
    expect("server.max_connections_per_port", 1000.into());
    expect("server.file_descriptor_reserve", 256.into());
    expect("server.idle_timeout_ms", 120000.into());
    expect("server.handshake_timeout_ms", 5000.into());
    expect("server.keepalive_interval_ms", 15000.into());
    expect("server.keepalive_timeout_ms", 5000.into());
}

#[test]
fn flags_beat_variables_which_beat_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ftkv.toml");
    std::fs::write(
        &file,
        "[raft]\nheartbeat_interval_ms = 200\nack_all_timeout_ms = 7000\n",
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let c = printed_config(&[("FTKV_RAFT_HEARTBEAT_INTERVAL_MS", "150")], &["--config", file]);
    assert_eq!(key(&c, "raft.heartbeat_interval_ms"), &150.into());
    assert_eq!(key(&c, "raft.ack_all_timeout_ms"), &7000.into());
    let c = printed_config(
        &[("FTKV_RAFT_HEARTBEAT_INTERVAL_MS", "150")],
        &["--config", file, "--raft-heartbeat-interval-ms", "120"],
    );
    assert_eq!(key(&c, "raft.heartbeat_interval_ms"), &120.into());
}

#[test]
fn bad_values_are_refused_naming_the_variable_or_key() {
    let o = node(&["--print-config"], &[("FTKV_LOG_SEGMENT_SIZE", "lots")]);
    assert_eq!(o.status.code(), Some(2), "a usage error");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("--log-segment-size") && err.contains("lots"),
        "{err}"
    );
    // In range for the parser, out of range for the node: the validation names the key.
    let o = node(&["--print-config"], &[("FTKV_RAFT_HEARTBEAT_INTERVAL_MS", "900")]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("raft.heartbeat_interval_ms"), "{err}");
}

#[test]
fn help_lists_the_variables() {
    let o = node(&["--help"], &[]);
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    for var in [
        "FTKV_ID",
        "FTKV_INITIAL_CLUSTER",
        "FTKV_ENGINE_COMPRESSION",
        "FTKV_RAFT_HEARTBEAT_INTERVAL_MS",
        "FTKV_LIMITS_MAX_VALUE_BYTES",
        "FTKV_SERVER_KEEPALIVE_TIMEOUT_MS",
    ] {
        assert!(help.contains(var), "--help does not name {var}");
    }
}
