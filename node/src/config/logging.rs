//! `[logging]`: the node's own diagnostic log (not the Raft log, which is `[log]`).
//!
//! Flags as etcd names them: `--log-format text|json` (etcd `--logger`/`--log-format`),
//! `--log-level` (etcd `--log-level`), `--log-slow-request-threshold-ms` (etcd's
//! `--warning-apply-duration`, which logs "apply request took too long").

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// One human-readable line per event: time, level, `node=ID`, target, message, fields.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `node_id`, `target`, `message`, the
    /// event's other fields and the enclosing spans (for log shippers).
    Json,
}

/// `[logging]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// The lowest level logged (`error`, `warn`, `info`, `debug`, `trace`), or a full
    /// `tracing` filter such as `info,ftkv_node::cluster=debug`. A set `RUST_LOG` takes
    /// precedence (for debugging). Noisy dependencies (openraft, h2, tower, hyper) are kept at
    /// warn/error unless the filter names them.
    pub level: String,
    /// A client call that takes longer than this is logged at warn with its method, status and
    /// duration (the slow-request log); 0 turns it off.
    pub slow_request_threshold_ms: u64,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".into(),
            slow_request_threshold_ms: 1_000,
        }
    }
}

/// Dependencies kept quiet unless the filter names them: openraft logs every election step
/// and replication error at info/warn, h2/tower/hyper every connection.
const QUIET_DEPENDENCIES: [(&str, &str); 4] = [
    ("openraft", "error"),
    ("h2", "warn"),
    ("tower", "warn"),
    ("hyper", "warn"),
];

impl LoggingConfig {
    /// Checks that `level` parses as a filter.
    pub fn validate(&self) -> Result<(), ConfigError> {
        tracing_subscriber::EnvFilter::try_new(self.filter_directives()).map_err(|e| {
            ConfigError::Invalid(format!(
                "logging.level {:?} is not a level (error, warn, info, debug, trace) or a \
                 tracing filter: {e}",
                self.level
            ))
        })?;
        Ok(())
    }

    /// `level` with the quieting directives for dependencies it does not name.
    pub fn filter_directives(&self) -> String {
        let mut directives = self.level.trim().to_string();
        for (target, level) in QUIET_DEPENDENCIES {
            if !directives.contains(target) {
                directives.push_str(&format!(",{target}={level}"));
            }
        }
        directives
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_level_keeps_dependencies_quiet_unless_named() {
        let c = LoggingConfig::default();
        assert_eq!(
            c.filter_directives(),
            "info,openraft=error,h2=warn,tower=warn,hyper=warn"
        );
        let c = LoggingConfig {
            level: "debug,openraft=info".into(),
            ..Default::default()
        };
        assert_eq!(
            c.filter_directives(),
            "debug,openraft=info,h2=warn,tower=warn,hyper=warn"
        );
        c.validate().unwrap();
    }

    #[test]
    fn a_level_that_is_not_a_filter_is_refused() {
        let c = LoggingConfig {
            level: "ftkv_node=loud".into(),
            ..Default::default()
        };
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("logging.level"), "{err}");
    }
}
