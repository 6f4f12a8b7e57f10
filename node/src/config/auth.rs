//! `[auth]`: users, roles and tokens (`crate::auth`). Users and roles themselves are
//! replicated state, managed with `ftkvctl user` / `role` / `auth`; only the token lifetime is
//! a node setting.

use serde::{Deserialize, Serialize};

use super::ConfigError;

/// `[auth]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// How long a token this node issues stays valid, ms (etcd's `--auth-token-ttl`).
    pub token_ttl_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self {
            token_ttl_ms: crate::auth::DEFAULT_TOKEN_TTL_MS,
        }
    }
}

impl AuthConfig {
    /// Checks ranges: 100 ms ..= 30 days.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(100..=30 * 24 * 3_600_000).contains(&self.token_ttl_ms) {
            return Err(ConfigError::Invalid(format!(
                "auth.token_ttl_ms {} not in 100..=2592000000 (30 days)",
                self.token_ttl_ms
            )));
        }
        Ok(())
    }
}
