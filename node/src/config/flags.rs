//! Command-line flags and `FTKV_*` environment variables for the configuration keys that the
//! `ftkv-node run` flags do not name themselves (sections `[engine]`, `[log]`, `[raft]`,
//! `[batch]`, `[limits]`, `[server]`), so that a container or a systemd unit can set every
//! option without a config file.
//!
//! Naming: key `SECTION.KEY` is flag `--SECTION-KEY` and variable `FTKV_SECTION_KEY`, e.g.
//! `raft.heartbeat_interval_ms` is `--raft-heartbeat-interval-ms` / `FTKV_RAFT_HEARTBEAT_INTERVAL_MS`.
//! Exception: `[logging]` keys are `--log-format`, `--log-level`, `--log-slow-request-threshold-ms`
//! (etcd's names). Sizes take human units (`64MiB`), `engine.compression` takes `none` or `zstd:LEVEL`.
//! Precedence is that of every flag: TOML file < environment < flag.

use bytesize::ByteSize;

use super::{Compression, Config, ConfigError, NoneTag};

/// Parses a size flag (`64MiB`, `4096`).
fn parse_size(s: &str) -> Result<ByteSize, String> {
    s.trim()
        .parse::<ByteSize>()
        .map_err(|e| format!("{s:?} is not a size such as 64MiB: {e}"))
}

/// Parses `--engine-compression`: `none` or `zstd:LEVEL` (`zstd` alone is level 1).
pub fn parse_compression(s: &str) -> Result<Compression, String> {
    let s = s.trim();
    if s == "none" {
        return Ok(Compression::None(NoneTag::None));
    }
    let level = match s.strip_prefix("zstd") {
        Some("") => 1,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|l| l.parse::<i32>().ok())
            .ok_or_else(|| format!("{s:?}: expected none or zstd:LEVEL (1..=22)"))?,
        None => return Err(format!("{s:?}: expected none or zstd:LEVEL (1..=22)")),
    };
    Ok(Compression::Zstd { zstd: level })
}

/// Every configuration key without a flag of its own in `ftkv-node run` (see the module docs).
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Configuration keys (TOML key SECTION.KEY)")]
pub struct ConfigFlags {
    /// engine.compression: none | zstd:LEVEL (1..=22).
    #[arg(long, env = "FTKV_ENGINE_COMPRESSION", value_parser = parse_compression)]
    pub engine_compression: Option<Compression>,
    /// engine.cleaner_period_ms (0 = off).
    #[arg(long, env = "FTKV_ENGINE_CLEANER_PERIOD_MS")]
    pub engine_cleaner_period_ms: Option<u64>,
    /// engine.loader_memory_size: sort memory of a bulk load (e.g. 64MiB).
    #[arg(long, env = "FTKV_ENGINE_LOADER_MEMORY_SIZE", value_parser = parse_size)]
    pub engine_loader_memory_size: Option<ByteSize>,
    /// log.segment_size (e.g. 64MiB).
    #[arg(long, env = "FTKV_LOG_SEGMENT_SIZE", value_parser = parse_size)]
    pub log_segment_size: Option<ByteSize>,
    /// raft.ack_all_timeout_ms.
    #[arg(long, env = "FTKV_RAFT_ACK_ALL_TIMEOUT_MS")]
    pub raft_ack_all_timeout_ms: Option<u64>,
    /// raft.heartbeat_interval_ms.
    #[arg(long, env = "FTKV_RAFT_HEARTBEAT_INTERVAL_MS")]
    pub raft_heartbeat_interval_ms: Option<u64>,
    /// raft.election_timeout_min_ms.
    #[arg(long, env = "FTKV_RAFT_ELECTION_TIMEOUT_MIN_MS")]
    pub raft_election_timeout_min_ms: Option<u64>,
    /// raft.election_timeout_max_ms.
    #[arg(long, env = "FTKV_RAFT_ELECTION_TIMEOUT_MAX_MS")]
    pub raft_election_timeout_max_ms: Option<u64>,
    /// raft.peer_max_message_size (e.g. 64MiB).
    #[arg(long, env = "FTKV_RAFT_PEER_MAX_MESSAGE_SIZE", value_parser = parse_size)]
    pub raft_peer_max_message_size: Option<ByteSize>,
    /// batch.max_ops.
    #[arg(long, env = "FTKV_BATCH_MAX_OPS")]
    pub batch_max_ops: Option<usize>,
    /// batch.max_bytes (e.g. 4MiB).
    #[arg(long, env = "FTKV_BATCH_MAX_BYTES", value_parser = parse_size)]
    pub batch_max_bytes: Option<ByteSize>,
    /// batch.max_in_flight.
    #[arg(long, env = "FTKV_BATCH_MAX_IN_FLIGHT")]
    pub batch_max_in_flight: Option<usize>,
    /// limits.max_key_bytes (e.g. 16KiB).
    #[arg(long, env = "FTKV_LIMITS_MAX_KEY_BYTES", value_parser = parse_size)]
    pub limits_max_key_bytes: Option<ByteSize>,
    /// limits.max_value_bytes (e.g. 1MiB).
    #[arg(long, env = "FTKV_LIMITS_MAX_VALUE_BYTES", value_parser = parse_size)]
    pub limits_max_value_bytes: Option<ByteSize>,
    /// limits.max_batch_bytes (e.g. 4MiB).
    #[arg(long, env = "FTKV_LIMITS_MAX_BATCH_BYTES", value_parser = parse_size)]
    pub limits_max_batch_bytes: Option<ByteSize>,
    /// limits.max_batch_ops.
    #[arg(long, env = "FTKV_LIMITS_MAX_BATCH_OPS")]
    pub limits_max_batch_ops: Option<u64>,
    /// server.max_connections_per_port.
    #[arg(long, env = "FTKV_SERVER_MAX_CONNECTIONS_PER_PORT")]
    pub server_max_connections_per_port: Option<u64>,
    /// server.file_descriptor_reserve.
    #[arg(long, env = "FTKV_SERVER_FILE_DESCRIPTOR_RESERVE")]
    pub server_file_descriptor_reserve: Option<u64>,
    /// server.idle_timeout_ms.
    #[arg(long, env = "FTKV_SERVER_IDLE_TIMEOUT_MS")]
    pub server_idle_timeout_ms: Option<u64>,
    /// server.handshake_timeout_ms.
    #[arg(long, env = "FTKV_SERVER_HANDSHAKE_TIMEOUT_MS")]
    pub server_handshake_timeout_ms: Option<u64>,
    /// server.keepalive_interval_ms.
    #[arg(long, env = "FTKV_SERVER_KEEPALIVE_INTERVAL_MS")]
    pub server_keepalive_interval_ms: Option<u64>,
    /// server.keepalive_timeout_ms.
    #[arg(long, env = "FTKV_SERVER_KEEPALIVE_TIMEOUT_MS")]
    pub server_keepalive_timeout_ms: Option<u64>,
    /// server.drain_timeout_ms.
    #[arg(long, env = "FTKV_SERVER_DRAIN_TIMEOUT_MS")]
    pub server_drain_timeout_ms: Option<u64>,
    /// space.disk_reserve_bytes: least free space kept on the data dir's disk (`0B`: none).
    #[arg(long, env = "FTKV_SPACE_DISK_RESERVE_BYTES", value_parser = parse_size)]
    pub space_disk_reserve_bytes: Option<ByteSize>,
    /// space.check_interval_ms: how often the data dir and its disk are measured.
    #[arg(long, env = "FTKV_SPACE_CHECK_INTERVAL_MS")]
    pub space_check_interval_ms: Option<u64>,
    /// auth.token_ttl_ms: lifetime of the tokens this node issues.
    #[arg(long, env = "FTKV_AUTH_TOKEN_TTL_MS")]
    pub auth_token_ttl_ms: Option<u64>,
    /// logging.format: text | json.
    #[arg(long, env = "FTKV_LOG_FORMAT", value_enum)]
    pub log_format: Option<super::LogFormat>,
    /// logging.level: error | warn | info | debug | trace, or a tracing filter (RUST_LOG wins).
    #[arg(long, env = "FTKV_LOG_LEVEL")]
    pub log_level: Option<String>,
    /// logging.slow_request_threshold_ms (0 = off).
    #[arg(long, env = "FTKV_LOG_SLOW_REQUEST_THRESHOLD_MS")]
    pub log_slow_request_threshold_ms: Option<u64>,
}

/// Sets `$target` to the flag's value when the flag (or its variable) was given.
macro_rules! set {
    ($flag:expr => $target:expr) => {
        if let Some(v) = $flag {
            $target = v;
        }
    };
}

impl ConfigFlags {
    /// Overrides the keys given on the command line or in the environment. Ranges are checked
    /// later, by [`Config::validate`].
    pub fn apply(&self, c: &mut Config) -> Result<(), ConfigError> {
        set!(self.engine_compression => c.engine.compression);
        set!(self.engine_cleaner_period_ms => c.engine.cleaner_period_ms);
        set!(self.engine_loader_memory_size => c.engine.loader_memory_size);
        set!(self.log_segment_size => c.log.segment_size);
        set!(self.raft_ack_all_timeout_ms => c.raft.ack_all_timeout_ms);
        set!(self.raft_heartbeat_interval_ms => c.raft.heartbeat_interval_ms);
        set!(self.raft_election_timeout_min_ms => c.raft.election_timeout_min_ms);
        set!(self.raft_election_timeout_max_ms => c.raft.election_timeout_max_ms);
        set!(self.raft_peer_max_message_size => c.raft.peer_max_message_size);
        set!(self.batch_max_ops => c.batch.max_ops);
        set!(self.batch_max_bytes => c.batch.max_bytes);
        set!(self.batch_max_in_flight => c.batch.max_in_flight);
        set!(self.limits_max_key_bytes => c.limits.max_key_bytes);
        set!(self.limits_max_value_bytes => c.limits.max_value_bytes);
        set!(self.limits_max_batch_bytes => c.limits.max_batch_bytes);
        set!(self.limits_max_batch_ops => c.limits.max_batch_ops);
        set!(self.server_max_connections_per_port => c.server.max_connections_per_port);
        set!(self.server_file_descriptor_reserve => c.server.file_descriptor_reserve);
        set!(self.server_idle_timeout_ms => c.server.idle_timeout_ms);
        set!(self.server_handshake_timeout_ms => c.server.handshake_timeout_ms);
        set!(self.server_keepalive_interval_ms => c.server.keepalive_interval_ms);
        set!(self.server_keepalive_timeout_ms => c.server.keepalive_timeout_ms);
        set!(self.server_drain_timeout_ms => c.server.drain_timeout_ms);
        set!(self.space_disk_reserve_bytes => c.space.disk_reserve_bytes);
        set!(self.space_check_interval_ms => c.space.check_interval_ms);
        set!(self.auth_token_ttl_ms => c.auth.token_ttl_ms);
        set!(self.log_format => c.logging.format);
        set!(self.log_level.clone() => c.logging.level);
        set!(self.log_slow_request_threshold_ms => c.logging.slow_request_threshold_ms);
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ConfigFlags,
    }

    #[test]
    fn every_flag_lands_in_its_key() {
        let cli = Cli::try_parse_from([
            "x",
            "--engine-compression=none",
            "--engine-cleaner-period-ms=0",
            "--log-segment-size=1MiB",
            "--raft-ack-all-timeout-ms=3000",
            "--raft-heartbeat-interval-ms=100",
            "--raft-election-timeout-min-ms=400",
            "--raft-election-timeout-max-ms=800",
            "--raft-peer-max-message-size=32MiB",
            "--batch-max-ops=100",
            "--batch-max-bytes=2MiB",
            "--batch-max-in-flight=4",
            "--limits-max-key-bytes=1KiB",
            "--limits-max-value-bytes=512KiB",
            "--limits-max-batch-bytes=2MiB",
            "--limits-max-batch-ops=50",
            "--server-max-connections-per-port=100",
            "--server-file-descriptor-reserve=64",
            "--server-idle-timeout-ms=60000",
            "--server-handshake-timeout-ms=5000",
            "--server-keepalive-interval-ms=20000",
            "--server-keepalive-timeout-ms=4000",
            "--space-disk-reserve-bytes=0B",
            "--space-check-interval-ms=100",
            "--auth-token-ttl-ms=60000",
        ])
        .unwrap();
        let mut c = Config::default();
        cli.flags.apply(&mut c).unwrap();
        assert_eq!(c.engine.compression.zstd_level(), None);
        assert_eq!(c.engine.cleaner_period_ms, 0);
        assert_eq!(c.log.segment_size, ByteSize::mib(1));
        assert_eq!(c.raft.ack_all_timeout_ms, 3000);
        assert_eq!(c.raft.heartbeat_interval_ms, 100);
        assert_eq!(c.raft.election_timeout_min_ms, 400);
        assert_eq!(c.raft.election_timeout_max_ms, 800);
        assert_eq!(c.raft.peer_max_message_size, ByteSize::mib(32));
        assert_eq!(c.batch.max_ops, 100);
        assert_eq!(c.batch.max_bytes, ByteSize::mib(2));
        assert_eq!(c.batch.max_in_flight, 4);
        assert_eq!(c.limits.max_key_bytes, ByteSize::kib(1));
        assert_eq!(c.limits.max_value_bytes, ByteSize::kib(512));
        assert_eq!(c.limits.max_batch_bytes, ByteSize::mib(2));
        assert_eq!(c.limits.max_batch_ops, 50);
        assert_eq!(c.server.max_connections_per_port, 100);
        assert_eq!(c.server.file_descriptor_reserve, 64);
        assert_eq!(c.server.idle_timeout_ms, 60000);
        assert_eq!(c.server.handshake_timeout_ms, 5000);
        assert_eq!(c.space.disk_reserve_bytes, ByteSize::b(0));
        assert_eq!(c.space.check_interval_ms, 100);
        assert_eq!(c.server.keepalive_interval_ms, 20000);
        assert_eq!(c.server.keepalive_timeout_ms, 4000);
        assert_eq!(c.auth.token_ttl_ms, 60000);
        c.validate().unwrap();

        // No flag: nothing changes.
        let mut d = Config::default();
        Cli::try_parse_from(["x"]).unwrap().flags.apply(&mut d).unwrap();
        assert_eq!(d, Config::default());
    }

    #[test]
    fn compression_and_sizes_parse_or_fail_clearly() {
        assert_eq!(parse_compression("zstd:3").unwrap().zstd_level(), Some(3));
        assert_eq!(parse_compression("zstd").unwrap().zstd_level(), Some(1));
        assert_eq!(parse_compression("none").unwrap().zstd_level(), None);
        for bad in ["gzip", "zstd:", "zstd:x", "zstd3"] {
            let err = parse_compression(bad).unwrap_err();
            assert!(err.contains("zstd:LEVEL"), "{bad}: {err}");
        }
        let err = Cli::try_parse_from(["x", "--log-segment-size", "lots"])
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("--log-segment-size"), "{err}");
    }
}
