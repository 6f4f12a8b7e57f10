//! ftkv's **embedded mode**: the storage engine as a single-node library, with its own instance of
//! ftkv's group-committed log ([`ftkv_log::Log`]) as its write-ahead log and replay of that log
//! on open. It is what a TokuDB (PerconaFT `ft/logger/` recovery log + checkpoints) or RocksDB
//! (WAL + memtable flushes) user expects of an embedded database, and what the benchmarks compare
//! against sled.
//!
//! This crate never depends on tokio, Raft (openraft) or gRPC: it is the engine, the log and the
//! file-system seam ([`ftkv_vfs`]) only (ARCHITECTURE.md, layering rules).
//!
//! # Layout
//! `dir/engine/` holds the engine ([`EngineKind::Fractal`] by default), `dir/log/` the log
//! segments. Every [`Db::write`] batch is one log record whose log index is the batch's **LSN**
//! (1, 2, 3, ...); the payload encoding is in [`codec`]. The engine's metadata blob records the
//! last applied LSN ([`codec::EngineMeta`]), written in the same atomic [`Engine::write`] as the
//! batch it describes, so whatever state the engine reopens at, it knows which LSN that is.
//!
//! # Write path, durability and visibility
//! [`Db::write`] (callable from many threads at once):
//! 1. checks the batch against the size limits and encodes it (outside any lock);
//! 2. under one short writer lock: takes the next LSN, queues the record on the log
//!    ([`ftkv_log::Log::append`], no I/O), and applies the batch to the engine with the new
//!    meta (engines take one writer at a time, so applies happen in LSN order);
//! 3. releases the lock and waits until the log reports the record durable, then returns the LSN.
//!
//! While one thread waits for its fsync, others take the lock, queue and apply their batches; the
//! log's flusher writes everything queued with **one** fdatasync and then acknowledges every
//! batch it covered: concurrent writers share fsyncs (group commit; [`ftkv_log::LogStats`]
//! `append_calls / fsyncs` is the factor).
//!
//! * **Durability** ([`SyncMode::Always`], default): `write` returns `Ok` only after its record
//!   is fdatasynced. With [`SyncMode::Periodic`] it returns once the record reached the OS and a
//!   power loss (not a process crash) can lose up to `period_ms` of acknowledged writes
//!   (`tokudb_fsync_log_period`, RocksDB `WriteOptions::sync = false`); [`Db::sync`] forces one.
//! * **Visibility: apply before fsync, acknowledge after** (TokuDB's choice: PerconaFT applies a
//!   transaction to the tree and then waits for the log fsync before the commit returns). A
//!   concurrent reader may see a batch before its `write` returned, i.e. before it is durable.
//!   If power is lost before that fsync, the batch is lost together with every later one: the
//!   state after recovery is always the state after some **prefix** of the LSN order that
//!   contains every acknowledged write. Readers never see a batch partially.
//! * **Errors poison** (fjall's poisoned state): a failed fsync, a poisoned log, or an engine
//!   error stops the database: that call returns the error and every later call (writes, reads
//!   and checkpoints) returns [`EmbeddedError::Poisoned`], because memory may then hold batches
//!   the disk does not. Reopen to recover. A `write` that returns an error has an **unknown
//!   outcome** (it may be durable, as an ambiguous commit in any WAL database).
//!
//! # Recovery ([`Db::open`])
//! The engine reopens at its last checkpoint with LSN `A` from its meta; every log record with
//! index in `A+1 ..= last` is decoded and applied in order (PerconaFT `recover.cc` redo from the
//! checkpoint LSN; RocksDB replays WAL records above the MANIFEST's flushed sequence). Records
//! that should exist but do not (the log starts above `A+1`, or was purged above `A`) are an
//! error ([`EmbeddedError::LogGap`]), never skipped. If the log ends **before** `A` (the engine
//! checkpointed batches whose log records were not yet fsynced when power was lost; none of
//! them was acknowledged), the log is purged up to `A` so that new records continue at `A+1`.
//! After a replay the database takes a checkpoint, so a crash loop does not replay the same
//! records again and again. An engine and a log of different databases are refused
//! ([`EmbeddedError::IdentityMismatch`]).
//!
//! # Checkpoints and log purge
//! [`Db::checkpoint`] runs the engine checkpoint (which persists the data and the meta with the
//! applied LSN, beside concurrent writers) and then purges the log up to the LSN applied when
//! it began, so the log stays bounded. A background thread checkpoints automatically after
//! [`EmbeddedOptions::checkpoint_interval_bytes`] of log payload (signalled by `write`) and
//! every [`EmbeddedOptions::checkpoint_interval_ms`] (TokuDB `tokudb_checkpointing_period`,
//! default 60 s); if it falls [`CHECKPOINT_STALL_FACTOR`] intervals behind, writers wait for a
//! checkpoint (back-pressure). With [`EngineKind::Model`] (in memory, nothing survives a restart) the log is
//! never purged: a reopen replays all of it.
//!
//! # Example
//! ```
//! use ftkv_embedded::{Db, EmbeddedOptions, UpsertOp, WriteOp};
//!
//! let dir = tempfile::tempdir()?;
//! let db = Db::open_real(dir.path(), EmbeddedOptions::default())?;
//! let lsn = db.write(&[
//!     WriteOp::Put { key: b"greeting".to_vec(), value: b"hello".to_vec() },
//!     WriteOp::Upsert { key: b"visits".to_vec(), op: UpsertOp::Add(1) },
//! ])?; // durable (fdatasynced) when it returns
//! assert_eq!(lsn, 1);
//! assert_eq!(db.get(b"greeting")?, Some(b"hello".to_vec()));
//! db.close()?; // final checkpoint; dropping without close is also safe (replay on open)
//!
//! let db = Db::open_real(dir.path(), EmbeddedOptions::default())?;
//! assert_eq!(db.scan(b"", None, 10)?.len(), 2);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![deny(missing_docs)]
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::host_endian_bytes,
    clippy::big_endian_bytes
)]
#![cfg_attr(
    test,
    allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing)
)]

pub mod codec;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use ftkv_engine::model::ModelEngine;
use ftkv_engine::sled_engine::SledEngine;
use ftkv_engine::{Engine, EngineError, EngineOptions, IntegrityReport, KeyValue};
use ftkv_engine::{FractalEngine, FractalOptions, TreeParams};
use ftkv_log::limits::MAX_RECORD_PAYLOAD_BYTES;
use ftkv_log::{Log, LogError, LogOptions, LogStats};
use ftkv_vfs::{RealVfs, Vfs};
use parking_lot::{Condvar, Mutex};

pub use ftkv_engine::{BulkLoadOptions, BulkLoadReport, EngineKind, OnDuplicate, UpsertOp, WriteOp};
pub use ftkv_log::SyncMode;

use crate::codec::{CodecError, EngineMeta, LOG_IDENTITY_KEY};

/// A log sequence number: the log index of one write batch. The first batch of a database is
/// LSN 1; 0 means "none".
pub type Lsn = u64;

/// Name of the engine's subdirectory inside the database directory.
pub const ENGINE_DIR_NAME: &str = "engine";
/// Name of the log's subdirectory inside the database directory.
pub const LOG_DIR_NAME: &str = "log";

/// A writer that finds this many times `checkpoint_interval_bytes` of log written since the
/// last checkpoint began waits for (or takes) a checkpoint itself: the log stays bounded even
/// when the background checkpointer falls behind (RocksDB's `max_total_wal_size` forcing a
/// flush).
pub const CHECKPOINT_STALL_FACTOR: u64 = 4;

/// Payload bytes read from the log per step of the replay (bounds replay memory).
const REPLAY_READ_BYTES: usize = 8 << 20;

/// Errors of embedded mode.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmbeddedError {
    /// The engine failed (`Io`, `Corruption`, `Poisoned`, ...); from a write, a read, a
    /// checkpoint or the replay.
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    /// The log failed (`Io` including a failed fsync, `Poisoned`, `Corruption`,
    /// `SyncedRecordsLost`, ...).
    #[error("log: {0}")]
    Log(#[from] LogError),
    /// The caller passed something embedded mode refuses (a key, value or batch above the
    /// limits of [`EmbeddedOptions`], bad options). Nothing was logged or applied; the database
    /// stays usable.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Stored bytes (the engine meta, the log identity or a log record) did not decode:
    /// unknown format version, bad magic, checksum, truncation, unknown op tag.
    #[error("cannot decode {location}: {source}")]
    Codec {
        /// What was decoded (e.g. `"log record 17"`, `"engine meta"`).
        location: String,
        /// Why it did not decode.
        #[source]
        source: CodecError,
    },
    /// Log records that recovery needs are missing: the engine's applied LSN is `applied_lsn`
    /// but the log does not hold every record after it.
    #[error("log gap after applied LSN {applied_lsn}: {detail}; refusing to open (acknowledged writes would be lost)")]
    LogGap {
        /// The engine's applied LSN (from its meta; 0 for a fresh engine).
        applied_lsn: Lsn,
        /// What the log holds instead.
        detail: String,
    },
    /// The engine directory and the log directory belong to different databases, or one of
    /// them was lost (e.g. the log directory was deleted while the engine kept data).
    #[error("engine and log do not belong together: {0}")]
    IdentityMismatch(String),
    /// An earlier fault stopped the database (see the crate docs, "Errors poison").
    #[error("database is poisoned by an earlier fault ({cause}); reopen it after fixing the disk")]
    Poisoned {
        /// The first error, as text.
        cause: String,
    },
    /// The directory is open in another [`Db`] (this process or another): its `LOCK` is held.
    #[error("database directory locked: {0}")]
    Locked(String),
    /// A file operation outside the engine and log failed (the lock file).
    #[error("I/O error during {context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// Creates `dir` and takes the exclusive lock on `dir/LOCK` (writing this process's id into
/// it). Errors: `Locked` when it is held, `Io` otherwise.
fn lock_dir(dir: &Path) -> Result<std::fs::File> {
    let io = |context: String| move |source| EmbeddedError::Io { context, source };
    std::fs::create_dir_all(dir).map_err(io(format!("create {}", dir.display())))?;
    let path = dir.join(LOCK_FILE_NAME);
    match ftkv_vfs::try_lock_file(&path).map_err(io(format!("lock {}", path.display())))? {
        ftkv_vfs::FileLock::Locked(file) => Ok(file),
        ftkv_vfs::FileLock::HeldBy(holder) => Err(EmbeddedError::Locked(format!(
            "{} is open in another Db (pid {holder})",
            dir.display()
        ))),
    }
}

/// Name of the lock file [`Db::open_real`] holds inside the directory.
pub const LOCK_FILE_NAME: &str = "LOCK";

/// Result alias of this crate.
pub type Result<T, E = EmbeddedError> = std::result::Result<T, E>;

/// Options of [`Db::open`]. `Default` gives a fractal engine with a 256 MiB cache, zstd level 1,
/// a log with 64 MiB segments and fsync per group commit, and checkpoints every 64 MiB of log
/// or 60 s.
#[derive(Debug, Clone)]
pub struct EmbeddedOptions {
    /// Which engine (`Fractal` default; `Sled` only through [`Db::open_real`], since sled does
    /// its own file I/O; `Model` keeps data in memory and replays the whole log on open).
    pub engine: EngineKind,
    /// Engine memory budget, in bytes (TokuDB `tokudb_cache_size`; sled's `cache_capacity`).
    pub cache_size_bytes: u64,
    /// zstd level for the fractal tree's leaves; `None` stores them uncompressed.
    pub compression_level: Option<i32>,
    /// Fractal tree shape (`None`: [`TreeParams::default`]); ignored by other engines. Tests use
    /// small nodes to exercise splits.
    pub tree_params: Option<TreeParams>,
    /// Log options: segment size and [`SyncMode`] (passed through to [`Log::open`]).
    pub log: LogOptions,
    /// Checkpoint once this many bytes of log payload were written since the last checkpoint
    /// began (signalled by [`Db::write`], run by the background thread). If the log reaches
    /// [`CHECKPOINT_STALL_FACTOR`] times this, the writer that crosses it waits for (or runs) a
    /// checkpoint before its `write` returns (back-pressure), so the log holds at most about
    /// twice that much. `None` disables both (the log then grows until [`Db::checkpoint`]);
    /// `Some(0)` is invalid.
    pub checkpoint_interval_bytes: Option<u64>,
    /// Checkpoint this often, in milliseconds, when anything was written since the last one.
    /// `None` disables the timer; `Some(0)` is invalid.
    pub checkpoint_interval_ms: Option<u64>,
    /// Whether [`Db::close`] takes a final checkpoint (then the next open replays nothing).
    /// Dropping a [`Db`] never checkpoints.
    pub checkpoint_on_close: bool,
    /// Largest key (and range bound) accepted, in bytes.
    pub max_key_bytes: usize,
    /// Largest value (and upsert operand) accepted, in bytes.
    pub max_value_bytes: usize,
    /// Largest encoded batch accepted, in bytes (at most the log's record limit,
    /// [`ftkv_log::limits::MAX_RECORD_PAYLOAD_BYTES`]).
    pub max_batch_bytes: usize,
}

impl Default for EmbeddedOptions {
    fn default() -> Self {
        EmbeddedOptions {
            engine: EngineKind::Fractal,
            cache_size_bytes: 256 << 20,
            compression_level: Some(1),
            tree_params: None,
            log: LogOptions::default(),
            checkpoint_interval_bytes: Some(64 << 20),
            checkpoint_interval_ms: Some(60_000),
            checkpoint_on_close: true,
            max_key_bytes: 16 << 10,
            max_value_bytes: 1 << 20,
            max_batch_bytes: 4 << 20,
        }
    }
}

impl EmbeddedOptions {
    /// Checks the options. Errors: `InvalidArgument` naming the option.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(EmbeddedError::InvalidArgument(m));
        if self.checkpoint_interval_bytes == Some(0) {
            return bad("checkpoint_interval_bytes must be None or above 0".into());
        }
        if self.checkpoint_interval_ms == Some(0) {
            return bad("checkpoint_interval_ms must be None or above 0".into());
        }
        if self.max_key_bytes == 0 || self.max_value_bytes == 0 {
            return bad("max_key_bytes and max_value_bytes must be above 0".into());
        }
        if self.max_batch_bytes == 0 || self.max_batch_bytes > MAX_RECORD_PAYLOAD_BYTES {
            return bad(format!(
                "max_batch_bytes {} not in 1..={MAX_RECORD_PAYLOAD_BYTES} (the log's record limit)",
                self.max_batch_bytes
            ));
        }
        if let Some(p) = self.tree_params {
            p.validate()?;
        }
        Ok(())
    }
}

/// Counters and positions of an open database.
#[derive(Debug, Clone, Copy)]
pub struct EmbeddedStats {
    /// LSN of the last batch applied (and queued on the log); 0 if none.
    pub last_lsn: Lsn,
    /// LSN covered by the last completed checkpoint (the log is purged up to it); 0 if none.
    pub checkpointed_lsn: Lsn,
    /// Checkpoints completed since open (explicit, automatic, and the one after a replay).
    pub checkpoints: u64,
    /// Log records replayed by [`Db::open`].
    pub replayed_records: u64,
    /// Lowest LSN the log still holds (`None`: empty).
    pub log_first_index: Option<Lsn>,
    /// The log's purge point (records up to it are gone), `None` if never purged.
    pub log_purged_up_to: Option<Lsn>,
    /// The log's counters (fsyncs, append calls, segments, ...).
    pub log: LogStats,
}

struct Writer {
    /// LSN of the last batch appended and applied.
    last_lsn: Lsn,
}

#[derive(Default)]
struct CheckpointControl {
    requested: bool,
    stop: bool,
}

struct Shared {
    engine: Arc<dyn Engine>,
    log: Log,
    db_id: u64,
    opts: EmbeddedOptions,
    /// False for the in-memory model: its checkpoint persists nothing, so the log is never purged.
    durable_engine: bool,
    writer: Mutex<Writer>,
    poison: Mutex<Option<String>>,
    /// Serializes checkpoints.
    checkpoint_lock: Mutex<()>,
    checkpointed_lsn: AtomicU64,
    checkpoints: AtomicU64,
    replayed_records: AtomicU64,
    /// Log payload bytes written since the last checkpoint began.
    bytes_since_checkpoint: AtomicU64,
    control: Mutex<CheckpointControl>,
    control_cv: Condvar,
}

/// An embedded database: an engine plus its write-ahead log. Thread safe (`Send + Sync`): share
/// it by reference or in an `Arc`. [`Db::open_real`] holds an exclusive lock on `DIR/LOCK`
/// (`flock`, released when the `Db` is dropped), so a second open of the same directory, from
/// this process or another, fails with [`EmbeddedError::Locked`] instead of corrupting it;
/// [`Db::open`] on a caller's [`Vfs`] takes no lock (the caller owns that file system).
///
/// Dropping it stops the background checkpointer and lets the log flush and fsync what is
/// queued; it takes no checkpoint (the next open replays the log). [`Db::close`] checkpoints
/// first and reports errors.
pub struct Db {
    shared: Arc<Shared>,
    checkpointer: Option<JoinHandle<()>>,
    /// `DIR/LOCK`, locked while the `Db` lives (declared last: released after the engine and
    /// log are closed).
    _dir_lock: Option<std::fs::File>,
}

impl std::fmt::Debug for Db {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Db")
            .field("engine", &self.shared.engine.kind())
            .field("log", &self.shared.log)
            .finish_non_exhaustive()
    }
}

fn new_db_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded randomly per process; mixed with the time and the pid.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    h.write_u32(std::process::id());
    h.finish().max(1)
}

impl Shared {
    fn check_poison(&self) -> Result<()> {
        match &*self.poison.lock() {
            Some(cause) => Err(EmbeddedError::Poisoned { cause: cause.clone() }),
            None => Ok(()),
        }
    }

    /// Records `e` as the poison cause (the first one wins) and returns it.
    fn fail(&self, e: EmbeddedError) -> EmbeddedError {
        let mut p = self.poison.lock();
        if p.is_none() {
            *p = Some(e.to_string());
        }
        e
    }

    fn meta_for(&self, lsn: Lsn) -> [u8; codec::ENGINE_META_LEN] {
        EngineMeta {
            db_id: self.db_id,
            applied_lsn: lsn,
        }
        .encode()
    }

    /// Engine checkpoint, then log purge up to the LSN applied when it began (every batch up to
    /// it is in the checkpoint, since the engine snapshots its state at the begin or later).
    fn checkpoint(&self) -> Result<Lsn> {
        let _serial = self.checkpoint_lock.lock();
        self.checkpoint_locked()
    }

    /// Back-pressure: when `hard_bytes` of log were written since the last checkpoint began,
    /// waits for a running checkpoint, and takes one if the log is still that far behind.
    fn stall_for_checkpoint(&self, hard_bytes: u64) -> Result<()> {
        let _serial = self.checkpoint_lock.lock();
        if self.bytes_since_checkpoint.load(Ordering::Relaxed) < hard_bytes {
            return Ok(()); // the checkpoint just waited for covered it
        }
        self.checkpoint_locked().map(|_| ())
    }

    /// [`Shared::checkpoint`] with `checkpoint_lock` held.
    fn checkpoint_locked(&self) -> Result<Lsn> {
        let upto = {
            let w = self.writer.lock();
            self.check_poison()?;
            w.last_lsn
        };
        self.bytes_since_checkpoint.store(0, Ordering::Relaxed);
        self.engine.checkpoint().map_err(|e| self.fail(e.into()))?;
        if self.durable_engine && upto > 0 && self.log.purged_up_to().is_none_or(|p| p < upto) {
            self.log.purge(upto).map_err(|e| self.fail(e.into()))?;
        }
        self.checkpointed_lsn.fetch_max(upto, Ordering::Relaxed);
        self.checkpoints.fetch_add(1, Ordering::Relaxed);
        Ok(upto)
    }

    fn request_checkpoint(&self) {
        self.control.lock().requested = true;
        self.control_cv.notify_one();
    }

    /// The background checkpointer: waits for a bytes trigger from `write` or the timer.
    fn run_checkpointer(self: Arc<Self>) {
        let period = self.opts.checkpoint_interval_ms.map(Duration::from_millis);
        let mut last = Instant::now();
        loop {
            {
                let mut c = self.control.lock();
                loop {
                    if c.stop {
                        return;
                    }
                    if c.requested {
                        break;
                    }
                    match period {
                        Some(p) => {
                            let due = last + p;
                            if Instant::now() >= due {
                                break;
                            }
                            self.control_cv.wait_until(&mut c, due);
                        }
                        None => self.control_cv.wait(&mut c),
                    }
                }
                c.requested = false;
            }
            last = Instant::now();
            if self.poison.lock().is_some() {
                continue;
            }
            let applied = self.writer.lock().last_lsn;
            if applied > self.checkpointed_lsn.load(Ordering::Relaxed) {
                // An error is recorded as the poison cause: the next write reports it.
                let _ = self.checkpoint();
            }
        }
    }
}

impl Db {
    /// Opens (or creates) the database in `dir` on `vfs`: the engine in `dir/engine`, the log in
    /// `dir/log`, then replays the log records above the engine's applied LSN (crate docs,
    /// "Recovery"). Returns once the database is ready for reads and writes.
    ///
    /// Errors: `InvalidArgument` for bad options or [`EngineKind::Sled`] (use
    /// [`Db::open_real`]); `Engine` / `Log` for failures opening either or applying the replay;
    /// `Codec` for an engine meta, log identity or log record that does not decode (e.g. an
    /// unknown meta version: written by a newer build, or the engine of a cluster node);
    /// `LogGap` when records after the applied LSN are missing; `IdentityMismatch` when the
    /// engine and the log belong to different databases.
    pub fn open(vfs: Arc<dyn Vfs>, dir: &Path, opts: EmbeddedOptions) -> Result<Db> {
        if opts.engine == EngineKind::Sled {
            return Err(EmbeddedError::InvalidArgument(
                "the sled engine does its own file I/O on the real file system: open it with Db::open_real"
                    .into(),
            ));
        }
        Self::open_inner(vfs, dir, opts)
    }

    /// [`Db::open`] on the real file system ([`RealVfs`]); the only way to open
    /// [`EngineKind::Sled`]. Same errors.
    ///
    /// Takes an exclusive lock on `DIR/LOCK` first. Errors also: `Locked` when another `Db`
    /// (in this process or another) has the directory open; `Io` when the directory or the
    /// lock file cannot be created.
    pub fn open_real(dir: &Path, opts: EmbeddedOptions) -> Result<Db> {
        let lock = lock_dir(dir)?;
        let mut db = Self::open_inner(RealVfs::new(), dir, opts)?;
        db._dir_lock = Some(lock);
        Ok(db)
    }

    fn open_inner(vfs: Arc<dyn Vfs>, dir: &Path, opts: EmbeddedOptions) -> Result<Db> {
        opts.validate()?;
        let engine_opts = EngineOptions {
            dir: dir.join(ENGINE_DIR_NAME),
            cache_size_bytes: opts.cache_size_bytes,
            compression_level: opts.compression_level,
        };
        let engine: Arc<dyn Engine> = match opts.engine {
            EngineKind::Fractal => Arc::new(FractalEngine::open_with(
                Arc::clone(&vfs),
                &engine_opts,
                FractalOptions::with_tree(opts.tree_params.unwrap_or_default()),
            )?),
            EngineKind::Sled => Arc::new(SledEngine::open(&engine_opts)?),
            EngineKind::Model => Arc::new(ModelEngine::new()),
        };
        let log = Log::open(vfs, &dir.join(LOG_DIR_NAME), opts.log.clone())?;
        let meta = match engine.meta()? {
            Some(bytes) => Some(EngineMeta::decode(&bytes).map_err(|source| EmbeddedError::Codec {
                location: format!("engine meta in {}", engine_opts.dir.display()),
                source,
            })?),
            None => None,
        };
        let db_id = identify(&log, meta)?;
        let applied = meta.map_or(0, |m| m.applied_lsn);
        let shared = Arc::new(Shared {
            durable_engine: opts.engine != EngineKind::Model,
            engine,
            log,
            db_id,
            opts,
            writer: Mutex::new(Writer { last_lsn: applied }),
            poison: Mutex::new(None),
            checkpoint_lock: Mutex::new(()),
            checkpointed_lsn: AtomicU64::new(applied),
            checkpoints: AtomicU64::new(0),
            replayed_records: AtomicU64::new(0),
            bytes_since_checkpoint: AtomicU64::new(0),
            control: Mutex::new(CheckpointControl::default()),
            control_cv: Condvar::new(),
        });
        let replayed = replay(&shared, applied)?;
        if replayed > 0 && shared.durable_engine {
            shared.checkpoint()?;
        }
        let checkpointer = if shared.opts.checkpoint_interval_bytes.is_some()
            || shared.opts.checkpoint_interval_ms.is_some()
        {
            let for_thread = Arc::clone(&shared);
            Some(
                std::thread::Builder::new()
                    .name("ftkv-embedded-ckpt".into())
                    .spawn(move || for_thread.run_checkpointer())
                    .map_err(|source| {
                        EmbeddedError::Engine(EngineError::Io {
                            context: "spawn the embedded checkpointer thread".into(),
                            source,
                        })
                    })?,
            )
        } else {
            None
        };
        Ok(Db {
            shared,
            checkpointer,
            _dir_lock: None,
        })
    }

    /// Applies `ops` atomically and in order (later ops see earlier ones) and returns the batch's
    /// LSN once its log record is durable (crate docs, "Write path"). Callable concurrently from
    /// many threads; concurrent batches share fsyncs. An empty batch is logged too (a durable
    /// barrier).
    ///
    /// Errors: `InvalidArgument` for a key, value or batch above the limits (nothing logged, the
    /// database stays usable); `Log` / `Engine` for a fault, which poisons the database (the
    /// batch's outcome is then unknown); `Poisoned` after an earlier fault.
    pub fn write(&self, ops: &[WriteOp]) -> Result<Lsn> {
        let sh = &*self.shared;
        sh.check_poison()?;
        let payload = Bytes::from(self.encode_checked(ops)?);
        let payload_len = payload.len() as u64;
        let (tx, rx) = mpsc::sync_channel::<Result<(), LogError>>(1);
        let lsn = {
            let mut w = sh.writer.lock();
            sh.check_poison()?;
            let lsn = w.last_lsn + 1;
            let done = Box::new(move |r: Result<(), LogError>| {
                // The receiver waits below; if it is gone there is no one to tell.
                let _ = tx.send(r);
            });
            sh.log
                .append(vec![(lsn, payload)], done)
                .map_err(|e| sh.fail(e.into()))?;
            // Applied under the writer lock, hence in LSN order, with the meta in the same step.
            sh.engine
                .write(ops, Some(&sh.meta_for(lsn)))
                .map_err(|e| sh.fail(e.into()))?;
            w.last_lsn = lsn;
            lsn
        };
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(sh.fail(e.into())),
            Err(_) => {
                return Err(sh.fail(EmbeddedError::Log(LogError::Io {
                    context: format!("waiting for log record {lsn} to become durable"),
                    source: std::io::Error::other("the log dropped the completion callback"),
                })))
            }
        }
        if let Some(limit) = sh.opts.checkpoint_interval_bytes {
            let total = sh
                .bytes_since_checkpoint
                .fetch_add(payload_len, Ordering::Relaxed)
                + payload_len;
            if total >= limit && total - payload_len < limit {
                sh.request_checkpoint();
            }
            let hard = limit.saturating_mul(CHECKPOINT_STALL_FACTOR);
            if total >= hard && sh.durable_engine {
                // This batch is durable whatever happens here: a failed checkpoint poisons the
                // database and the next call reports it.
                let _ = sh.stall_for_checkpoint(hard);
            }
        }
        Ok(lsn)
    }

    /// Loads `rows` (any order) with the engine's bulk path ([`ftkv_engine::Engine::bulk_load`]:
    /// sorted in bounded memory, built bottom-up into an empty tree, messages otherwise), then
    /// takes a checkpoint, so the load is durable when this returns **without writing its rows
    /// to the log**. The rows become visible together (atomically for readers); on error none of
    /// them is. Duplicates follow `opts.on_duplicate`.
    ///
    /// Durability and concurrency: the load runs under the writer lock (concurrent `write`s wait
    /// for its apply, not for its checkpoint). A crash before the checkpoint finished loses the
    /// load (it never returned `Ok`: rerun it), and batches written after it but before the
    /// checkpoint are replayed on the state without it. Rows above the key and value limits are
    /// refused (`InvalidArgument`, nothing loaded).
    ///
    /// Errors: `Engine(DuplicateKey)` for a duplicate with `OnDuplicate::Error`, the first error
    /// of `rows`, `InvalidArgument` for an oversized row (these leave the database usable);
    /// `Engine` for a storage fault (poisons the database); `Poisoned` after a fault.
    pub fn bulk_load(
        &self,
        rows: &mut dyn Iterator<Item = ftkv_engine::Result<KeyValue>>,
        opts: &BulkLoadOptions,
    ) -> Result<BulkLoadReport> {
        let sh = &*self.shared;
        sh.check_poison()?;
        let (max_key, max_value) = (sh.opts.max_key_bytes, sh.opts.max_value_bytes);
        let mut checked = rows.enumerate().map(|(i, r)| {
            let (k, v) = r?;
            if k.len() > max_key || v.len() > max_value {
                return Err(EngineError::InvalidArgument(format!(
                    "bulk row {i}: key of {} bytes or value of {} bytes above max_key_bytes {max_key} / max_value_bytes {max_value}",
                    k.len(),
                    v.len()
                )));
            }
            Ok((k, v))
        });
        let _serial = sh.checkpoint_lock.lock();
        let report = {
            let w = sh.writer.lock();
            sh.check_poison()?;
            // The meta keeps the applied LSN: the load is not a log record.
            match sh
                .engine
                .bulk_load(&mut checked, opts, &[], Some(&sh.meta_for(w.last_lsn)))
            {
                Ok(r) => r,
                Err(e) => {
                    let keeps = matches!(
                        e,
                        EngineError::DuplicateKey { .. }
                            | EngineError::InvalidArgument(_)
                            | EngineError::NoSpace { .. }
                    );
                    let e = EmbeddedError::from(e);
                    return Err(if keeps { e } else { sh.fail(e) });
                }
            }
        };
        sh.checkpoint_locked()?;
        Ok(report)
    }

    /// Checks `ops` against the size limits and encodes them.
    fn encode_checked(&self, ops: &[WriteOp]) -> Result<Vec<u8>> {
        let o = &self.shared.opts;
        // `what` of `b.len()` bytes against the limit `name` = `max`.
        let within = |what: &str, b: &[u8], name: &str, max: usize| {
            if b.len() > max {
                return Err(EmbeddedError::InvalidArgument(format!(
                    "{what} of {} bytes above {name} {max}",
                    b.len()
                )));
            }
            Ok(())
        };
        let key = |what: &str, k: &[u8]| within(what, k, "max_key_bytes", o.max_key_bytes);
        let value = |what: &str, v: &[u8]| within(what, v, "max_value_bytes", o.max_value_bytes);
        let operand = |op: &UpsertOp| match op {
            UpsertOp::Add(_) => Ok(()),
            UpsertOp::SetIfAbsent(v) | UpsertOp::Append(v) | UpsertOp::Max(v) => value("upsert operand", v),
        };
        for op in ops {
            match op {
                WriteOp::Put { key: k, value: v } => {
                    key("key", k)?;
                    value("value", v)?;
                }
                WriteOp::Delete { key: k } => key("key", k)?,
                WriteOp::Upsert { key: k, op } => {
                    key("key", k)?;
                    operand(op)?;
                }
                WriteOp::DeleteRange { start, end } => {
                    key("range start", start)?;
                    end.as_deref().map_or(Ok(()), |e| key("range end", e))?;
                }
                WriteOp::UpsertRange { start, end, op } => {
                    key("range start", start)?;
                    end.as_deref().map_or(Ok(()), |e| key("range end", e))?;
                    operand(op)?;
                }
            }
        }
        let len = codec::encoded_batch_len(ops);
        if len > o.max_batch_bytes {
            return Err(EmbeddedError::InvalidArgument(format!(
                "batch encodes to {len} bytes, above max_batch_bytes {}",
                o.max_batch_bytes
            )));
        }
        Ok(codec::encode_batch(ops))
    }

    /// Value of `key`, or `None` when absent. Sees every batch applied so far, including
    /// batches whose `write` has not returned yet (crate docs, "Visibility").
    ///
    /// Errors: `Engine` for a read failure; `Poisoned` after a fault.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.shared.check_poison()?;
        Ok(self.shared.engine.get(key)?)
    }

    /// Up to `limit` pairs with `start <= key < end` (`end = None`: unbounded), in key order,
    /// from one consistent engine state (no batch seen partially). Same visibility and errors as
    /// [`Db::get`].
    pub fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>> {
        self.shared.check_poison()?;
        Ok(self.shared.engine.scan(start, end, limit)?)
    }

    /// Checkpoints the engine (data and meta durable at the LSN applied when it began, or
    /// later), then purges the log up to that LSN. Runs beside writers; returns the LSN the log
    /// was purged to. With [`EngineKind::Model`] nothing is persisted or purged.
    ///
    /// Errors: `Engine` / `Log` (they poison the database); `Poisoned` after a fault.
    pub fn checkpoint(&self) -> Result<Lsn> {
        self.shared.checkpoint()
    }

    /// Makes every batch applied so far durable in the log (needed only with
    /// [`SyncMode::Periodic`]; with `Always` every acknowledged batch already is).
    ///
    /// Errors: `Log` (poisons the database); `Poisoned` after a fault.
    pub fn sync(&self) -> Result<()> {
        self.shared.check_poison()?;
        self.shared.log.sync().map_err(|e| self.shared.fail(e.into()))
    }

    /// LSN of the last batch applied; 0 if none.
    pub fn last_lsn(&self) -> Lsn {
        self.shared.writer.lock().last_lsn
    }

    /// Which engine this database runs.
    pub fn engine_kind(&self) -> EngineKind {
        self.shared.engine.kind()
    }

    /// The directory of the log (for tools and tests).
    pub fn log_dir(&self) -> PathBuf {
        self.shared.log.dir().to_path_buf()
    }

    /// Walks the engine's structures and checks every invariant ([`Engine::check_integrity`]).
    ///
    /// Errors: `Engine(Corruption)` for a violation; `Poisoned` after a fault.
    pub fn check_integrity(&self) -> Result<IntegrityReport> {
        self.shared.check_poison()?;
        Ok(self.shared.engine.check_integrity()?)
    }

    /// Counters and log positions.
    pub fn stats(&self) -> EmbeddedStats {
        let sh = &*self.shared;
        EmbeddedStats {
            last_lsn: self.last_lsn(),
            checkpointed_lsn: sh.checkpointed_lsn.load(Ordering::Relaxed),
            checkpoints: sh.checkpoints.load(Ordering::Relaxed),
            replayed_records: sh.replayed_records.load(Ordering::Relaxed),
            log_first_index: sh.log.first_index(),
            log_purged_up_to: sh.log.purged_up_to(),
            log: sh.log.stats(),
        }
    }

    /// Clean shutdown: stops the background checkpointer, takes a final checkpoint when
    /// [`EmbeddedOptions::checkpoint_on_close`] is set, and syncs the log (so with
    /// [`SyncMode::Periodic`] nothing acknowledged is lost either). Then the log's and engine's
    /// threads stop as the handles drop.
    ///
    /// Errors: those of [`Db::checkpoint`] and [`Db::sync`]; `Poisoned` if a fault stopped the
    /// database earlier (nothing more is persisted then; reopen to recover).
    pub fn close(mut self) -> Result<()> {
        self.stop_checkpointer();
        if self.shared.opts.checkpoint_on_close {
            self.shared.checkpoint()?;
        }
        self.sync()
    }

    fn stop_checkpointer(&mut self) {
        self.shared.control.lock().stop = true;
        self.shared.control_cv.notify_all();
        if let Some(j) = self.checkpointer.take() {
            // A panic there has nothing to report to; the checkpointer holds no state to repair.
            let _ = j.join();
        }
    }
}

impl Drop for Db {
    fn drop(&mut self) {
        self.stop_checkpointer();
    }
}

/// The database identity: the engine meta's and the log's must agree; a new database gets a
/// fresh one, stored durably in the log before any record.
fn identify(log: &Log, meta: Option<EngineMeta>) -> Result<u64> {
    let log_id = match log.get_meta(LOG_IDENTITY_KEY) {
        Some(bytes) => Some(
            codec::decode_log_identity(&bytes).map_err(|source| EmbeddedError::Codec {
                location: format!("log identity in {}", log.dir().display()),
                source,
            })?,
        ),
        None => None,
    };
    match (meta, log_id) {
        (Some(m), Some(l)) if m.db_id != l => Err(EmbeddedError::IdentityMismatch(format!(
            "the engine belongs to database {:#018x}, the log in {} to {l:#018x}",
            m.db_id,
            log.dir().display()
        ))),
        (Some(m), Some(_)) => Ok(m.db_id),
        (Some(m), None) => Err(EmbeddedError::IdentityMismatch(format!(
            "the engine belongs to database {:#018x} (applied LSN {}) but the log in {} has no identity: \
             the log directory was lost or replaced",
            m.db_id,
            m.applied_lsn,
            log.dir().display()
        ))),
        (None, Some(l)) => Ok(l),
        (None, None) => {
            if log.last_index().is_some() || log.purged_up_to().is_some() {
                return Err(EmbeddedError::IdentityMismatch(format!(
                    "the log in {} holds records but was not written by ftkv-embedded",
                    log.dir().display()
                )));
            }
            let id = new_db_id();
            log.put_meta(
                LOG_IDENTITY_KEY,
                Bytes::copy_from_slice(&codec::encode_log_identity(id)),
                true,
            )?;
            Ok(id)
        }
    }
}

/// Applies every log record above `applied` in order; returns how many. Realigns the log when
/// it ends below `applied` (crate docs, "Recovery").
fn replay(sh: &Shared, applied: Lsn) -> Result<u64> {
    let log = &sh.log;
    let gap = |detail: String| EmbeddedError::LogGap {
        applied_lsn: applied,
        detail,
    };
    if let Some(p) = log.purged_up_to().filter(|p| *p > applied) {
        return Err(gap(format!("the log was purged up to {p}")));
    }
    let last = match log.last_index() {
        Some(last) if last > applied => last,
        last => {
            // Nothing to replay. If the log ends below `applied`, the engine checkpointed
            // batches whose records were lost unsynced: continue the log at `applied + 1`.
            if applied > last.unwrap_or(0) && log.purged_up_to().is_none_or(|p| p < applied) {
                log.purge(applied)?;
            }
            return Ok(0);
        }
    };
    let first = log.first_index().unwrap_or(last);
    if first > applied + 1 {
        return Err(gap(format!(
            "the log holds records {first}..={last}, so {}..={} are missing",
            applied + 1,
            first - 1
        )));
    }
    let mut next = applied + 1;
    while next <= last {
        let chunk = log.read_range(next, last + 1, REPLAY_READ_BYTES)?;
        if chunk.is_empty() {
            return Err(gap(format!("record {next} is missing (log last index {last})")));
        }
        for (index, payload) in chunk {
            if index != next {
                return Err(gap(format!("expected record {next}, the log returned {index}")));
            }
            let ops = codec::decode_batch(&payload).map_err(|source| EmbeddedError::Codec {
                location: format!("log record {index} in {}", log.dir().display()),
                source,
            })?;
            sh.engine.write_owned(ops, Some(&sh.meta_for(index)))?;
            next += 1;
        }
    }
    sh.writer.lock().last_lsn = last;
    sh.replayed_records.store(last - applied, Ordering::Relaxed);
    Ok(last - applied)
}
