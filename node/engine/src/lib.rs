//! ftkv's storage engines behind one [`Engine`] trait.
//!
//! - [`fractal`]: the fractal tree (a Bε-tree after PerconaFT/TokuDB), ftkv's default engine.
//! - [`sled_engine`]: sled 0.34, the comparison engine (as the seed benchmarks ran InnoDB beside TokuDB).
//! - [`model`]: an in-memory `BTreeMap` model, the oracle of the conformance suite.
//!
//! Every engine stores byte keys and values, applies atomic batches of [`WriteOp`]s, and keeps an
//! opaque metadata blob (the state machine's applied log id, membership and client sessions)
//! **atomically with the data**: whatever state an engine reopens at after a crash, the metadata
//! it reports describes exactly that data.
//!
//! Durability: writes become durable at the next [`Engine::checkpoint`]. In a cluster the Raft log
//! is the write-ahead log, so nothing is lost between checkpoints; the engine reopens at its last
//! checkpoint and the node replays the log from the applied index in the metadata.
//!
//! This crate never depends on the log, Raft, tokio or gRPC (ARCHITECTURE.md, layering rules).

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

pub mod bulk;
pub mod fractal;
pub mod model;
pub mod ops;
pub mod sled_engine;

use std::path::PathBuf;
use std::sync::Arc;

pub use bulk::{BulkLoadOptions, BulkLoadReport, OnDuplicate};
pub use fractal::{FractalEngine, FractalOptions, TreeParams, DEFAULT_CLEANER_PERIOD_MS, TREE_FILE_NAME};
pub use ops::{apply_upsert, UpsertOp, WriteOp};

/// Errors of every engine. Storage faults (`Corruption`, `Io`) stop writes on the node: the
/// engine reports them and never repairs or skips data on its own.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// An I/O call failed (including fsync). The engine refuses further writes.
    #[error("engine I/O error during {context}: {source}")]
    Io {
        /// What the engine was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Writing a block met a full disk or quota (`ENOSPC`, `EDQUOT`). Not a storage fault: the
    /// file still holds the last durable checkpoint and the engine keeps the nodes it could not
    /// write in memory (dirty). A [`Engine::checkpoint`] that returns it changed nothing and
    /// may be retried once space is freed; reads and writes go on meanwhile (writes in memory,
    /// beyond the cache budget if need be). A failed fsync is `Io`, whatever its errno.
    #[error("engine out of disk space during {context}: {source}")]
    NoSpace {
        /// What the engine was writing, naming the file.
        context: String,
        /// The underlying error (`StorageFull` or `QuotaExceeded`).
        #[source]
        source: std::io::Error,
    },
    /// A block failed its checksum, or a structure failed an invariant. Names the block.
    #[error("corruption in {location}: {detail}")]
    Corruption {
        /// File and block (e.g. `"engine/tree.ftkv block 17 @ offset 4096"`).
        location: String,
        /// What did not match.
        detail: String,
    },
    /// The engine stopped writes after an earlier fault (fjall's "poisoned" state).
    #[error("engine is poisoned by an earlier storage fault; restart the node after fixing the disk")]
    Poisoned,
    /// The caller passed something the engine cannot store (e.g. an unknown upsert op version).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The on-disk format is not the one this build reads: newer, or older (the fractal
    /// engine's format is frozen at its current version and earlier ones are not read).
    #[error("unsupported on-disk format version {found} (this build reads {supported})")]
    UnsupportedVersion {
        /// Version found on disk.
        found: u32,
        /// The version this build reads (the fractal engine reads only that one; a bulk-load
        /// spill file likewise).
        supported: u32,
    },
    /// Error from the sled comparison engine.
    #[error("sled: {0}")]
    Sled(String),
    /// A bulk load met a key twice with OnDuplicate::Error. Indexes are 0-based positions in the load's input;
    /// `first_index` is None when the key already existed in the engine before the load.
    #[error("duplicate key {key:?} at input rows {first_index:?} and {second_index}")]
    DuplicateKey {
        /// The key.
        key: Vec<u8>,
        /// Position of its first row in the input (`None`: the key existed before the load).
        first_index: Option<u64>,
        /// Position of its (next) row in the input.
        second_index: u64,
    },
}

impl EngineError {
    /// Whether this is [`EngineError::NoSpace`]: retryable once space is freed, not a fault.
    pub fn is_no_space(&self) -> bool {
        matches!(self, EngineError::NoSpace { .. })
    }
}

/// Whether an I/O error says the disk or the quota is full (`ENOSPC`, `EDQUOT`).
pub fn is_no_space_io(err: &std::io::Error) -> bool {
    matches!(
        err.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

/// Result alias for engine calls.
pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Which engine a node runs (`engine.kind` in the node config).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// The fractal tree (default).
    Fractal,
    /// sled 0.34, for comparison.
    Sled,
    /// In-memory `BTreeMap` (tests only; not durable).
    Model,
}

impl EngineKind {
    /// Lower-case name as used in configs and status (`"fractal"`, `"sled"`, `"model"`).
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Fractal => "fractal",
            EngineKind::Sled => "sled",
            EngineKind::Model => "model",
        }
    }
}

/// A key-value pair as returned by scans.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// What [`Engine::check_integrity`] found when every invariant held.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IntegrityReport {
    /// Live keys counted.
    pub keys: u64,
    /// Blocks / nodes visited (0 for engines without blocks).
    pub blocks: u64,
    /// Tree height (0 for engines without a tree).
    pub height: u32,
}

/// Options shared by the on-disk engines.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// Directory the engine owns (created if missing).
    pub dir: PathBuf,
    /// Memory budget for cached nodes/pages, in bytes.
    pub cache_size_bytes: u64,
    /// zstd level for leaves (internal nodes and spilled runs, rewritten soon, use at most
    /// level -1); `None` stores everything uncompressed.
    pub compression_level: Option<i32>,
}

/// A storage engine: an ordered map of byte keys to byte values, plus a metadata blob stored
/// atomically with the data.
///
/// Concurrency: readers (`get`, `scan`) may run on any thread at any time; `write`,
/// `write_owned` and `replace_all` are called from one thread at a time (the state machine's); `checkpoint` may
/// run on another thread beside them (the fractal tree then writes its snapshot while writes go
/// on; sled's flush and the in-memory model are thread safe as they are).
pub trait Engine: Send + Sync + 'static {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;

    /// Value of `key`, or `None` when absent.
    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// Up to `limit` pairs with `start <= key < end` (`end = None`: unbounded) in key order.
    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>>;

    /// Applies `ops` atomically and in order (later ops see earlier ones), and when `meta` is
    /// `Some`, replaces the metadata blob in the same atomic step.
    fn write(&self, ops: &[WriteOp], meta: Option<&[u8]>) -> Result<()>;

    /// [`Engine::write`] with the ops given by value, so an engine whose structures own their
    /// bytes keeps the ops' key and value buffers instead of copying them (the fractal tree's
    /// messages do: two allocations and copies per op saved on the thread that applies writes).
    /// The buffers are kept as they are, spare capacity included, which node sizes do not
    /// count (they count lengths): callers pass buffers sized to their contents (decoded
    /// requests and log records are). Same semantics and errors as `write`; the default calls
    /// it.
    fn write_owned(&self, ops: Vec<WriteOp>, meta: Option<&[u8]>) -> Result<()> {
        self.write(&ops, meta)
    }

    /// The metadata blob as of the latest `write` or `write_owned` (`None` if never set).
    fn meta(&self) -> Result<Option<Vec<u8>>>;

    /// Makes every write so far durable (with its metadata) before returning.
    fn checkpoint(&self) -> Result<()>;

    /// Atomically replaces all data and the metadata with `pairs` (sorted ascending by key,
    /// no duplicates) and `meta`, durably. Used to install a Raft snapshot. On error the old
    /// durable state is kept. After [`EngineError::NoSpace`] the engine stays usable and the
    /// call is meant to be retried once space is freed (the fractal tree may meanwhile serve
    /// the new contents from memory, when only the final checkpoint failed).
    fn replace_all(&self, pairs: &mut dyn Iterator<Item = Result<KeyValue>>, meta: &[u8]) -> Result<()>;

    /// Loads `rows` (any order) atomically: every row, then `extra_ops` (applied after the rows, e.g. the caller's
    /// cleanup of staging keys), and `meta` (when Some) become visible in one step, or on error nothing changes
    /// (and for the fractal tree no block or temporary file is leaked). Durable at the next checkpoint, as `write`.
    /// Called from the writer thread, like `write`.
    ///
    /// Duplicates are resolved by `opts.on_duplicate`, deterministically (module [`bulk`]).
    /// Errors: `DuplicateKey` (Error policy), the first error `rows` returns, and the engine's
    /// own (`Io`, `NoSpace`, ...). The default collects the rows in memory, sorts them and
    /// applies them with one [`Engine::write_owned`].
    fn bulk_load(
        &self,
        rows: &mut dyn Iterator<Item = Result<KeyValue>>,
        opts: &BulkLoadOptions,
        extra_ops: &[WriteOp],
        meta: Option<&[u8]>,
    ) -> Result<BulkLoadReport> {
        bulk::default_bulk_load(self, rows, opts, extra_ops, meta)
    }

    /// Walks every structure and checks every invariant; a violation is `Corruption`.
    fn check_integrity(&self) -> Result<IntegrityReport>;

    /// Bytes the engine occupies on disk (0 for in-memory engines).
    fn size_on_disk_bytes(&self) -> Result<u64>;

    /// The full-disk error (`ENOSPC`, `EDQUOT`) the engine's last block write met, while it
    /// keeps unwritten nodes in memory and retries (`None` once a write succeeds again, and
    /// for engines that never hold writes back). A node raises its NOSPACE alarm on it.
    fn space_error(&self) -> Option<String> {
        None
    }
}

/// Opens the engine `kind` in `opts.dir` on the real file system (the node's `engine.kind`):
/// `Fractal` -> [`fractal::FractalEngine`] with default tree parameters, `Sled` ->
/// [`sled_engine::SledEngine`], `Model` -> [`model::ModelEngine`] (in memory, not durable).
///
/// Errors: whatever the chosen engine's `open` returns (`Io`, `Corruption`, `UnsupportedVersion`).
pub fn open_engine(kind: EngineKind, opts: &EngineOptions) -> Result<Arc<dyn Engine>> {
    Ok(match kind {
        EngineKind::Fractal => Arc::new(fractal::FractalEngine::open(ftkv_vfs::RealVfs::new(), opts)?),
        EngineKind::Sled => Arc::new(sled_engine::SledEngine::open(opts)?),
        EngineKind::Model => Arc::new(model::ModelEngine::new()),
    })
}
