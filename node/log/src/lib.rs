//! ftkv's group-committed, append-only log of opaque records (PerconaFT `ft/logger/`,
//! MySQL binlog group commit). API CONTRACT: signatures fixed, bodies being written.
//!
//! Never depends on Raft or the engine: records are `(index, bytes)`.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use ftkv_vfs::Vfs;

/// When appended records become durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SyncMode {
    /// fdatasync before any append callback fires (default; group-committed).
    #[default]
    Always,
    /// Callbacks fire after the write; fdatasync every `period_ms` (weaker durability,
    /// like `tokudb_fsync_log_period` / `sync_binlog=0`).
    Periodic {
        /// Sync period in milliseconds.
        period_ms: u64,
    },
}

/// Log options.
#[derive(Debug, Clone)]
pub struct LogOptions {
    /// Roll to a new segment file past this size.
    pub segment_size_bytes: u64,
    /// Sync mode.
    pub sync: SyncMode,
}

/// Errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// I/O failure; after a failed write/fsync the log is poisoned.
    #[error("log I/O error during {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Poisoned by an earlier failure.
    #[error("log is poisoned by an earlier I/O failure")]
    Poisoned,
    /// A record in the middle (not the tail) failed its checksum.
    #[error("log corruption in {location}: {detail}")]
    Corruption {
        /// Segment and offset.
        location: String,
        /// What did not match.
        detail: String,
    },
    /// API misuse (non-contiguous append, ...).
    #[error("invalid log operation: {0}")]
    Invalid(String),
}

/// Callback fired once the appended records are durable (or failed).
pub type AppendCallback = Box<dyn FnOnce(Result<(), LogError>) + Send + 'static>;

/// The log. Cheap to clone; thread safe.
#[derive(Clone)]
pub struct Log {
    _p: Arc<()>,
}

impl Log {
    /// Opens or creates the log in `dir`, cutting a torn/corrupt tail back to the last valid record.
    pub fn open(_vfs: Arc<dyn Vfs>, _dir: &Path, _opts: LogOptions) -> Result<Log, LogError> {
        todo!()
    }
    /// Appends records with contiguous indexes (first = last_index + 1, or any index when the
    /// log is empty). Readable when this returns; `done` fires after they are durable.
    pub fn append(&self, _records: Vec<(u64, Bytes)>, _done: AppendCallback) -> Result<(), LogError> {
        todo!()
    }
    /// Records with index in `[start, end)`, stopping early after `max_bytes` (at least one).
    pub fn read_range(&self, _start: u64, _end: u64, _max_bytes: usize) -> Result<Vec<(u64, Bytes)>, LogError> {
        todo!()
    }
    /// Lowest index still held (None when empty).
    pub fn first_index(&self) -> Option<u64> {
        todo!()
    }
    /// Highest index held (None when empty).
    pub fn last_index(&self) -> Option<u64> {
        todo!()
    }
    /// Removes every record with index >= `from`. Durable before it returns.
    pub fn truncate(&self, _from: u64) -> Result<(), LogError> {
        todo!()
    }
    /// Forgets every record with index <= `up_to`. The purge point is durable before it returns.
    pub fn purge(&self, _up_to: u64) -> Result<(), LogError> {
        todo!()
    }
    /// Stores a small named value. `durable = true`: fsynced before return; false: durable
    /// with the next group flush.
    pub fn put_meta(&self, _key: &str, _value: Bytes, _durable: bool) -> Result<(), LogError> {
        todo!()
    }
    /// Latest value stored under `key`.
    pub fn get_meta(&self, _key: &str) -> Option<Bytes> {
        todo!()
    }
    /// Makes everything appended so far durable.
    pub fn sync(&self) -> Result<(), LogError> {
        todo!()
    }
    /// Counters: (records appended, fsyncs done, bytes written).
    pub fn stats(&self) -> LogStats {
        todo!()
    }
}

/// Log counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct LogStats {
    /// Records appended.
    pub records_appended: u64,
    /// fdatasync calls.
    pub fsyncs: u64,
    /// Bytes written.
    pub bytes_written: u64,
}
