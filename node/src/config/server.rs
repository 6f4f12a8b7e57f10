//! `[server]`: how every listening port (client, peer, status) treats connections.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[server]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Most connections open at once on each port; one more is accepted and closed at once. At
    /// start the node lowers it so that every port at its cap still leaves
    /// `file_descriptor_reserve` descriptors free (see [`ServerConfig::connections_per_port`]).
    pub max_connections_per_port: u64,
    /// File descriptors kept free for the engine, the log, snapshots and outgoing peer
    /// connections, whatever the clients do. The node raises its soft `RLIMIT_NOFILE` to the
    /// hard limit at start and refuses to start if the limit is not above this reserve.
    pub file_descriptor_reserve: u64,
    /// A connection from which nothing was read this long is closed. Live gRPC clients answer
    /// the keepalive pings, so this closes only silent connections; must be longer than
    /// `keepalive_interval_ms`.
    pub idle_timeout_ms: u64,
    /// A connection that has not sent the 24-byte HTTP/2 client preface (on the status port:
    /// the start of a request) this long after it was accepted is closed.
    pub handshake_timeout_ms: u64,
    /// Interval of the HTTP/2 keepalive pings the gRPC servers send.
    pub keepalive_interval_ms: u64,
    /// A gRPC connection whose keepalive ping is not answered within this is closed (half-open
    /// connections of peers that vanished).
    pub keepalive_timeout_ms: u64,
    /// Most time a SIGTERM'd node spends draining (refusing new requests, finishing those in
    /// flight, handing its leadership over) before it stops anyway; the log sync and engine
    /// checkpoint come after it. Keep systemd's `TimeoutStopSec` above it plus a checkpoint.
    pub drain_timeout_ms: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            max_connections_per_port: 4_096,
            file_descriptor_reserve: 512,
            idle_timeout_ms: 300_000,
            handshake_timeout_ms: 10_000,
            keepalive_interval_ms: 30_000,
            keepalive_timeout_ms: 10_000,
            drain_timeout_ms: 10_000,
        }
    }
}

impl ServerConfig {
    /// Checks ranges and consistency.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, value) in [
            ("server.max_connections_per_port", self.max_connections_per_port),
            ("server.idle_timeout_ms", self.idle_timeout_ms),
            ("server.handshake_timeout_ms", self.handshake_timeout_ms),
            ("server.keepalive_interval_ms", self.keepalive_interval_ms),
            ("server.keepalive_timeout_ms", self.keepalive_timeout_ms),
            ("server.drain_timeout_ms", self.drain_timeout_ms),
        ] {
            if value == 0 {
                return Err(ConfigError::Invalid(format!("{name} must be >= 1")));
            }
        }
        if self.keepalive_interval_ms >= self.idle_timeout_ms {
            return Err(ConfigError::Invalid(format!(
                "server.keepalive_interval_ms ({}) must be below server.idle_timeout_ms ({}), or \
                 idle but live clients would be closed",
                self.keepalive_interval_ms, self.idle_timeout_ms
            )));
        }
        Ok(())
    }

    /// The connection cap of each of `ports` listening ports under a descriptor limit of
    /// `nofile`: `max_connections_per_port`, lowered so that all ports at their cap leave
    /// `file_descriptor_reserve` descriptors free. An error when the limit leaves no room.
    pub fn connections_per_port(&self, nofile: u64, ports: u64) -> Result<u64, ConfigError> {
        let budget = nofile.saturating_sub(self.file_descriptor_reserve) / ports.max(1);
        if budget == 0 {
            return Err(ConfigError::Invalid(format!(
                "the file descriptor limit (RLIMIT_NOFILE {nofile}) leaves no room for connections \
                 on {ports} ports beyond server.file_descriptor_reserve ({}): raise the limit \
                 (ulimit -n, LimitNOFILE=) or lower the reserve",
                self.file_descriptor_reserve
            )));
        }
        Ok(self.max_connections_per_port.min(budget))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_keeps_the_reserve_free() {
        let s = ServerConfig {
            max_connections_per_port: 1000,
            file_descriptor_reserve: 128,
            ..Default::default()
        };
        assert_eq!(s.connections_per_port(1 << 20, 3).unwrap(), 1000);
        assert_eq!(s.connections_per_port(256, 3).unwrap(), 42);
        let err = s.connections_per_port(128, 3).unwrap_err().to_string();
        assert!(err.contains("server.file_descriptor_reserve"), "{err}");
    }

    #[test]
    fn nonsensical_server_options_are_refused() {
        ServerConfig::default().validate().unwrap();
        let s = ServerConfig {
            idle_timeout_ms: 0,
            ..Default::default()
        };
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("server.idle_timeout_ms"));
        let s = ServerConfig {
            keepalive_interval_ms: 600_000,
            ..Default::default()
        };
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("keepalive_interval_ms"));
    }
}
