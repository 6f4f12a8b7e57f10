//! `[space]`: the data dir's quota and the disk's free-space reserve (the NOSPACE alarm, see
//! `crate::space`).

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use super::{serialize_size, ConfigError};

/// `[space]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SpaceConfig {
    /// Most bytes the data dir may hold (engine, log, snapshots; etcd's
    /// `--quota-backend-bytes`); at or over it the NOSPACE alarm is raised. `0B`: no quota.
    #[serde(serialize_with = "serialize_size")]
    pub quota_bytes: ByteSize,
    /// Least free space the data dir's file system must keep; under it the NOSPACE alarm is
    /// raised, so that the log and the engine never meet a real ENOSPC in the common case.
    /// `0B`: no reserve.
    #[serde(serialize_with = "serialize_size")]
    pub disk_reserve_bytes: ByteSize,
    /// How often the data dir is measured, ms.
    pub check_interval_ms: u64,
}

impl Default for SpaceConfig {
    fn default() -> Self {
        Self {
            quota_bytes: ByteSize::b(0),
            disk_reserve_bytes: ByteSize::mib(256),
            check_interval_ms: 1_000,
        }
    }
}

impl SpaceConfig {
    /// Checks ranges.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !(10..=60_000).contains(&self.check_interval_ms) {
            return Err(ConfigError::Invalid(format!(
                "space.check_interval_ms {} not in 10..=60000",
                self.check_interval_ms
            )));
        }
        Ok(())
    }

    /// The monitor's view.
    pub fn options(&self) -> crate::space::SpaceOptions {
        crate::space::SpaceOptions {
            quota_bytes: self.quota_bytes.as_u64(),
            disk_reserve_bytes: self.disk_reserve_bytes.as_u64(),
            check_interval_ms: self.check_interval_ms,
        }
    }
}
