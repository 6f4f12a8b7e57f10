//! The fractal tree (Bε-tree) engine, after PerconaFT/TokuDB (`ft/` in percona/PerconaFT).
//!
//! - [`msg`]: messages with MSNs and the per-child message buffers.
//! - [`node`]: internal nodes (pivots + buffers) and leaves (basement nodes).
//! - [`tree`]: injection, flushing, splits/merges, reads, bulk load, integrity walk.
//! - [`store`]: copy-on-write blocks, block translation table, headers, cachetable, checkpoints.
//! - `space`: the block allocator and which checkpoints still claim which blocks.
//! - [`codec`]: the on-disk encoding (documented byte by byte in `node/engine/FORMAT.md`).
//!
//! One file `tree.ftkv` in the engine directory holds everything. Writes become messages
//! injected at the root; [`Engine::checkpoint`] writes dirty nodes to fresh blocks and commits
//! the BTT (with the metadata blob) under the alternate header, so a reopen returns exactly the
//! last checkpoint. A checkpoint holds the engine lock only to take references to the dirty
//! nodes and to adopt the written blocks afterwards; encoding, writing and syncing run beside
//! the writers, which copy a node the checkpoint still holds before changing it. All I/O goes through [`ftkv_vfs::Vfs`], so crash tests run on `FaultVfs`.
//!
//! Reads: a point read collects the messages for its key from each ancestor buffer (skipping
//! buffers whose key filter rules the key out) and applies those newer than the basement's
//! applied MSN. A leaf that is not cached is read one basement at a time (header, pivots and the
//! one partition); an internal node that is not cached is read as partition 0 (pivots, children,
//! a Bloom key filter per child buffer) plus, only when the filter lets the key through, the one
//! buffer on the key's path. Scans merge a basement's packed entries with the pending messages in
//! key order, copying only the rows returned.
//!
//! Beyond the cache: a gorged buffer whose child is not cached spills its point messages to an
//! immutable run on disk instead of reading the child; a buffer's runs merge into the child once
//! they add up to a node (16 small runs first merge into one), so a leaf is rewritten once per
//! node's worth of messages instead of once per sixteenth (SplinterDB's size-tiered Bε-tree,
//! Conway et al., USENIX ATC 2020). Under cache pressure (the engine's memory over three
//! quarters of the budget) internal nodes below the root gorge at a quarter node, so they stay
//! cached. Runs merged into an internal node are handed down: the messages for its children
//! that are not cached go straight into new runs for them (with what its buffer holds for them)
//! instead of through its buffers. Runs are cut into frames of ~4 KiB (raw), compressed one by
//! one, behind a fence-key index, so a lookup whose key a run's filter accepts decompresses one
//! frame.
//!
//! Sequential inserts: a point message beyond the last key of the rightmost leaf (or before the
//! first of the leftmost), with nothing pending for that edge on the way down, is applied straight
//! to the cached edge leaf; edge leaves split unevenly, so sequential loads leave full leaves.
//!
//! Background work: two threads beside the writer. [`flusher`] applies a node's worth of
//! spilled runs to their (uncached) leaf: it reads and decompresses the leaf and the runs and
//! merges them while the writer goes on; the writer installs the result (the runs leave the
//! buffer, the leaf splits). [`writeback`] encodes (compresses) and writes spilled runs and
//! dirty nodes: the runs the writer spilled (readable from memory until their block is
//! adopted; a checkpoint writes those still pending; at most an eighth of the budget waits,
//! beyond that the writer encodes a run itself), the leaves a flush produced (then evicted),
//! dirty eviction victims (evicted once written; they stay cached meanwhile, counted in the
//! background share, and the writer encodes a victim itself only when that share is full) and
//! idle dirty nodes when too many are dirty. The writer waits for writeback only when the
//! engine's memory runs over budget (back-pressure).
//! A quarter of the budget stays free for the background threads (a flush in flight reserves
//! its decoded leaf and runs from it, at most one quarter's worth at a time); a buffer whose
//! flush cannot start yet keeps spilling runs, up to two nodes' worth, before the writer
//! flushes it itself.
//!
//! Reads beyond the cache: a point read through a node that is not cached reads pieces, not
//! the node: the header and partition 0 (pivots, key filters, frame tables; kept in a side
//! cache of partial reads), then one ~4 KiB frame of the buffer or basement on the key's path.
//! Partial eviction (PerconaFT evicts a clean leaf's basements but keeps the node): whenever a
//! leaf block is written or read whole, its skeleton (partition table, pivots, frame tables)
//! goes to that side cache, so when the cache evicts the clean leaf its basements leave memory
//! and a later lookup reads one frame. When the leaf's frame table is cached, that frame is
//! read under the shared lock and the key looked up in it in place; a decoded frame is kept in
//! the side cache only when the frame is read a second time while a small doorkeeper still
//! remembers its first read (random reads over more data than memory rarely read a frame twice,
//! and the page cache holds it compressed at half the size). The side cache holds a quarter of
//! the budget, or what the node cache leaves free; it gives decoded frames back first and
//! skeletons last.
//!
//! [`cleaner`]: a third thread flushes internal buffers once writes pause (PerconaFT's
//! cleaner thread): every second, when no write came for a second, it flushes the fullest
//! cached internal node's heaviest buffer, one buffer per hold of the engine lock, until every
//! cached internal node holds less than half its gorge limit (a quarter node below the root
//! under cache pressure), so the next burst of writes finds room instead of running the flush
//! cascade itself. While writes come, flushes stay inside them (measured: a cleaner taking
//! turns with the writer under the one engine lock cost 5-10% of insert speed).
//!
//! Not yet built (see issue 3): hole punching of freed blocks (they are reused and the file
//! tail is cut). Write-ahead logging is outside the engine: a node replays its Raft log, and
//! embedded mode (crate `ftkv-embedded`) replays its own instance of the log.

//! Concurrency: a read-write lock guards the tree. Reads whose nodes are all cached run
//! concurrently under the shared lock (CLOCK counts are atomics), and so do point reads that
//! need one frame of a leaf whose skeleton is cached; a read that misses otherwise retries
//! under the exclusive lock, loading nodes and evicting. Writes take the exclusive lock.

#[cfg(test)]
mod checkpoint_tests;
pub mod cleaner;
#[cfg(test)]
mod cleaner_tests;
pub mod codec;
pub mod filter;
pub mod flusher;
pub mod msg;
pub mod node;
mod space;
pub mod store;
#[cfg(test)]
mod test_support;
pub mod tree;
mod worker;
pub mod writeback;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use ftkv_vfs::{Vfs, VfsFile};
use parking_lot::{Mutex, RwLock, RwLockWriteGuard};

use self::cleaner::{Cleaner, Step, DEFAULT_CLEANER_PERIOD_MS};
use self::codec::{decode_btt, decode_header, BlockLoc, BttImage, Header, HEADER_BYTES, HEADER_SLOT_BYTES};
use self::flusher::{FlushTotals, Flusher};
use self::msg::{Msg, Msn, PointOp, RangeMsg, RangeOp};
use self::node::{Leaf, Node};
use self::store::{CheckpointStats, Store};
use self::tree::Tree;
pub use self::tree::TreeParams;
use self::writeback::{Writeback, WritebackTotals};
use crate::{Engine, EngineError, EngineKind, EngineOptions, IntegrityReport, KeyValue, Result, WriteOp};

/// File name of the tree inside the engine directory.
pub const TREE_FILE_NAME: &str = "tree.ftkv";
const TREE_TMP_NAME: &str = "tree.ftkv.tmp";

/// The fractal-tree engine (`engine.kind = "fractal"`).
pub struct FractalEngine {
    /// Background flushing of internal buffers (`None`: off, or the thread could not start).
    /// Declared first: dropping it joins the thread before the tree goes.
    _cleaner: Option<Cleaner>,
    inner: Arc<RwLock<Inner>>,
    path: PathBuf,
    /// Serializes checkpoints (and bulk loads, which end with one); taken before `inner`.
    checkpoint_lock: Mutex<()>,
    /// Figures of the last checkpoint.
    last_checkpoint: Mutex<Option<CheckpointStats>>,
}

struct Inner {
    tree: Tree,
    poisoned: bool,
    /// Background writer of idle dirty nodes (`None`: written inline).
    writeback: Option<Writeback>,
    /// The error that poisoned the engine on the cleaner thread, returned by the next write
    /// (then writes get `Poisoned`).
    background_error: Option<EngineError>,
    /// When the last write batch ended (the cleaner drains further once writes stop).
    last_write: std::time::Instant,
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EngineError {
    let context = context.into();
    move |source| EngineError::Io { context, source }
}

impl FractalEngine {
    /// Opens (or creates) the tree in `opts.dir` with the default [`TreeParams`].
    ///
    /// Errors: `Io` from the file system, `Corruption` when no valid header or a damaged BTT is
    /// found, `UnsupportedVersion` for a newer format.
    pub fn open(vfs: Arc<dyn Vfs>, opts: &EngineOptions) -> Result<Self> {
        Self::open_with_params(vfs, opts, TreeParams::default())
    }

    /// Like [`FractalEngine::open`] with explicit tree shape (small nodes in tests).
    pub fn open_with_params(vfs: Arc<dyn Vfs>, opts: &EngineOptions, params: TreeParams) -> Result<Self> {
        Self::open_with_cleaner(vfs, opts, params, Some(DEFAULT_CLEANER_PERIOD_MS))
    }

    /// Like [`FractalEngine::open_with_params`], with the cleaner thread's period in
    /// milliseconds ([`cleaner`]), or `None` for no cleaner (every flush then runs inside
    /// write batches; tests that count flushes use it). Errors: as [`FractalEngine::open`].
    pub fn open_with_cleaner(
        vfs: Arc<dyn Vfs>,
        opts: &EngineOptions,
        params: TreeParams,
        cleaner_period_ms: Option<u64>,
    ) -> Result<Self> {
        params.validate()?;
        vfs.create_dir_all(&opts.dir)
            .map_err(io(format!("create {}", opts.dir.display())))?;
        let path = opts.dir.join(TREE_FILE_NAME);
        if !vfs.exists(&path) {
            create_tree_file(vfs.as_ref(), &opts.dir, opts, params)?;
        }
        let file = vfs
            .open(&path, false)
            .map_err(io(format!("open {}", path.display())))?;
        // Reads are of single nodes, partitions and frames: readahead only evicts useful pages.
        file.advise_random()
            .map_err(io(format!("posix_fadvise {}", path.display())))?;
        let mut tree = load_tree(file, &path, opts, params)?;
        let writeback = Writeback::start();
        tree.store.set_background_writes(writeback.is_some());
        tree.flusher = Flusher::start();
        if writeback.is_some() || tree.flusher.is_some() {
            // A flush in flight (up to a quarter of the budget) and a writeback job's copies
            // live outside the cache: the cache leaves them room.
            let share = tree.store.budget_bytes() / 4;
            tree.store.set_background_share(share);
        }
        let inner = Arc::new(RwLock::new(Inner {
            tree,
            poisoned: false,
            writeback,
            background_error: None,
            last_write: std::time::Instant::now(),
        }));
        let cleaner = cleaner_period_ms.and_then(|period_ms| {
            let weak = Arc::downgrade(&inner);
            let period = std::time::Duration::from_millis(period_ms);
            Cleaner::start(period_ms, move || match weak.upgrade() {
                Some(inner) => clean_step(&inner, period),
                None => Step::Stop,
            })
        });
        Ok(FractalEngine {
            _cleaner: cleaner,
            inner,
            path,
            checkpoint_lock: Mutex::new(()),
            last_checkpoint: Mutex::new(None),
        })
    }

    /// Path of the tree file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Tree shape in use.
    pub fn params(&self) -> TreeParams {
        self.inner.read().tree.params
    }

    /// Partial (one-partition) reads by point lookups since open.
    pub fn partial_read_stats(&self) -> store::PartialReadStats {
        self.inner.read().tree.store.partial_stats()
    }

    /// Cachetable evictions since open (clean drops, dirty nodes written inline or handed to
    /// the writeback thread).
    pub fn eviction_stats(&self) -> store::EvictionStats {
        self.inner.read().tree.store.eviction_stats()
    }

    /// Spilled-run counters since open.
    pub fn spill_stats(&self) -> tree::SpillStats {
        self.inner.read().tree.spill_stats
    }

    /// Figures of the last checkpoint taken through [`Engine::checkpoint`] (`None` before the
    /// first): nodes and bytes written, and how long the engine lock was held at its begin and
    /// finish (the only pauses writers see) against the time spent writing beside them.
    pub fn last_checkpoint_stats(&self) -> Option<CheckpointStats> {
        *self.last_checkpoint.lock()
    }

    /// Totals of the background writeback since open (zero when it runs inline).
    pub fn writeback_totals(&self) -> WritebackTotals {
        self.inner
            .read()
            .writeback
            .as_ref()
            .map(|w| w.totals)
            .unwrap_or_default()
    }

    /// Totals of the background leaf flushes since open (zero when they run on the writer).
    pub fn flush_totals(&self) -> FlushTotals {
        self.inner
            .read()
            .tree
            .flusher
            .as_ref()
            .map(|f| f.totals)
            .unwrap_or_default()
    }

    /// Bytes of nodes currently cached.
    pub fn cached_bytes(&self) -> usize {
        self.inner.read().tree.store.cached_bytes()
    }

    /// The body of [`Engine::write`] and [`Engine::write_owned`]: injects the messages of ops
    /// `0..n` (`msg_at(i, msn)`, `None` for an op that changes nothing, which still takes its
    /// MSN), then sets `meta`, atomically for readers.
    fn write_msgs(
        &self,
        n: usize,
        mut msg_at: impl FnMut(usize, Msn) -> Option<Msg>,
        meta: Option<&[u8]>,
    ) -> Result<()> {
        let mut inner = self.inner.write();
        // A fault the cleaner thread met is returned, named, by the next write (then
        // `Poisoned`, like any other fault).
        if let Some(e) = inner.background_error.take() {
            return Err(e);
        }
        // The batch is atomic for readers: the exclusive lock is held throughout.
        let mut at = 0;
        while at < n {
            at = inner.mutate(|t| {
                let mut i = at;
                while i < n {
                    let msn = t.next_msn();
                    if let Some(msg) = msg_at(i, msn) {
                        t.inject(msg)?;
                    }
                    t.store.evict_to_budget(t.root)?;
                    i += 1;
                    // Checked every few messages: while a job runs the hand-over waits, and
                    // asking the thread after every message cost 3% of the writer's time.
                    if (i - at) % HAND_OVER_EVERY_MSGS == 0 && t.store.runs_to_hand_over() {
                        break;
                    }
                }
                Ok(i)
            })?;
            if at < n {
                inner.hand_over_runs()?;
            }
        }
        inner.mutate(|t| {
            if let Some(m) = meta {
                t.meta = Some(m.to_vec());
            }
            t.install_finished_flushes()?;
            t.store.evict_to_budget(t.root)
        })?;
        // Dirty nodes are written continuously, so a checkpoint stays short and eviction finds
        // clean nodes.
        inner.writeback_step()?;
        inner.last_write = std::time::Instant::now();
        Ok(())
    }

    /// What the engine counts against its memory budget, part by part (diagnostics: compare
    /// with the process's RSS).
    pub fn memory_use(&self) -> store::MemoryUse {
        self.inner.read().tree.store.memory_use()
    }
}

/// Within a write batch, how often (in messages) the writer looks for spilled runs or eviction
/// victims to hand to an idle writeback thread.
const HAND_OVER_EVERY_MSGS: usize = 16;

/// Writes an empty tree (one empty leaf) with a first checkpoint to a temporary file, then
/// renames it into place and syncs the directory: a crash leaves either no tree or a valid one.
fn create_tree_file(vfs: &dyn Vfs, dir: &Path, opts: &EngineOptions, params: TreeParams) -> Result<()> {
    let tmp = dir.join(TREE_TMP_NAME);
    if vfs.exists(&tmp) {
        vfs.remove_file(&tmp)
            .map_err(io(format!("remove {}", tmp.display())))?;
    }
    let file = vfs
        .open(&tmp, true)
        .map_err(io(format!("create {}", tmp.display())))?;
    let store = Store::new(
        file,
        tmp.clone(),
        opts.compression_level,
        opts.cache_size_bytes as usize,
        None,
        None,
    );
    let mut tree = Tree {
        params,
        store,
        root: 1,
        next_msn: 1,
        next_node_id: 2,
        meta: None,
        spill_stats: Default::default(),
        flusher: None,
    };
    tree.store.put(1, Node::Leaf(Leaf::default()));
    tree.checkpoint()?;
    let path = dir.join(TREE_FILE_NAME);
    vfs.rename(&tmp, &path)
        .map_err(io(format!("rename {} into place", tmp.display())))?;
    vfs.sync_dir(dir)
        .map_err(io(format!("sync dir {}", dir.display())))?;
    Ok(())
}

fn load_tree(file: Arc<dyn VfsFile>, path: &Path, opts: &EngineOptions, params: TreeParams) -> Result<Tree> {
    let mut headers: Vec<Header> = Vec::new();
    for slot in 0..2u64 {
        let mut buf = vec![0u8; HEADER_BYTES];
        let n = file
            .read_at(&mut buf, slot * HEADER_SLOT_BYTES)
            .map_err(io(format!("read header of {}", path.display())))?;
        if n < HEADER_BYTES {
            continue;
        }
        if let Some(h) = decode_header(&buf)? {
            headers.push(h);
        }
    }
    headers.sort_by_key(|h| std::cmp::Reverse(h.counter));
    let header = *headers.first().ok_or_else(|| EngineError::Corruption {
        location: format!("{} headers", path.display()),
        detail: "no valid header in either slot".into(),
    })?;
    let img = read_btt(file.as_ref(), path, &header)?;
    // The previous checkpoint's blocks stay reserved (fallback if the newest header is damaged).
    let previous = headers
        .get(1)
        .and_then(|h| read_btt(file.as_ref(), path, h).ok().map(|i| (i, h.btt)));
    let store = Store::new(
        file,
        path.to_path_buf(),
        opts.compression_level,
        opts.cache_size_bytes as usize,
        Some((&img, header.btt)),
        previous.as_ref().map(|(i, l)| (i, *l)),
    );
    let mut tree = Tree {
        params,
        store,
        root: img.root,
        next_msn: img.next_msn,
        next_node_id: img.next_node_id,
        meta: img.meta,
        spill_stats: Default::default(),
        flusher: None,
    };
    tree.store.get(tree.root)?;
    Ok(tree)
}

/// Reads and verifies the BTT block a header points at.
fn read_btt(file: &dyn VfsFile, path: &Path, header: &Header) -> Result<BttImage> {
    let btt_loc: BlockLoc = header.btt;
    let location = format!("{} BTT block @ offset {}", path.display(), btt_loc.offset);
    let mut buf = vec![0u8; btt_loc.size as usize];
    file.read_exact_at(&mut buf, btt_loc.offset)
        .map_err(|source| EngineError::Corruption {
            location: location.clone(),
            detail: format!("unreadable: {source}"),
        })?;
    if crc32c::crc32c(&buf) != btt_loc.crc {
        return Err(EngineError::Corruption {
            location,
            detail: "crc32c mismatch with the header".into(),
        });
    }
    let img = decode_btt(&buf, &location)?;
    if img.counter != header.counter {
        return Err(EngineError::Corruption {
            location,
            detail: format!("BTT counter {} != header counter {}", img.counter, header.counter),
        });
    }
    Ok(img)
}

/// Converts a write op into a message stamped with `msn`; `None` for an empty range.
fn to_msg(op: &WriteOp, msn: u64) -> Option<Msg> {
    (!is_empty_range(op))
        .then(|| to_msg_owned(op.clone(), msn))
        .flatten()
}

/// Whether `op` is a range op over an empty range (`end <= start`): it changes nothing.
fn is_empty_range(op: &WriteOp) -> bool {
    match op {
        WriteOp::DeleteRange { start, end } | WriteOp::UpsertRange { start, end, .. } => {
            end.as_ref().is_some_and(|e| e <= start)
        }
        _ => false,
    }
}

/// The message of `op` at `msn`, keeping the op's buffers; `None` for an empty range.
fn to_msg_owned(op: WriteOp, msn: u64) -> Option<Msg> {
    if is_empty_range(&op) {
        return None;
    }
    Some(match op {
        WriteOp::Put { key, value } => Msg::Point {
            msn,
            key,
            op: PointOp::Put(value),
        },
        WriteOp::Delete { key } => Msg::Point {
            msn,
            key,
            op: PointOp::Delete,
        },
        WriteOp::Upsert { key, op } => Msg::Point {
            msn,
            key,
            op: PointOp::Upsert(op),
        },
        WriteOp::DeleteRange { start, end } => Msg::Range(RangeMsg {
            msn,
            start,
            end,
            op: RangeOp::Delete,
        }),
        WriteOp::UpsertRange { start, end, op } => Msg::Range(RangeMsg {
            msn,
            start,
            end,
            op: RangeOp::Upsert(op),
        }),
    })
}

/// One cleaner step, once no write came for `idle_after` (checked under the shared lock, so
/// a busy engine never sees the cleaner take the exclusive one): under the exclusive lock,
/// flush one buffer ([`Tree::clean_step`], nodes down to half their gorge limit; it installs
/// finished leaf flushes first), keep the cache in budget, and adopt or start writeback; the
/// lock then goes straight to a waiting writer or reader. A panic inside is caught. An error
/// (or panic) poisons the engine and is kept for the next write.
fn clean_step(inner: &RwLock<Inner>, idle_after: std::time::Duration) -> Step {
    {
        let g = inner.read();
        if g.poisoned {
            return Step::Stop;
        }
        if g.last_write.elapsed() < idle_after {
            return Step::Idle;
        }
    }
    let step = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        clean_step_locked(inner, idle_after)
    }));
    step.unwrap_or_else(|panic| {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| (*s).to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        let mut g = inner.write();
        g.poisoned = true;
        g.background_error = Some(EngineError::Corruption {
            location: format!("{} (cleaner thread)", g.tree.store.path().display()),
            detail: format!("the cleaner panicked mid-flush: {what}"),
        });
        Step::Stop
    })
}

fn clean_step_locked(inner: &RwLock<Inner>, idle_after: std::time::Duration) -> Step {
    let mut g = inner.write();
    if g.poisoned {
        return Step::Stop;
    }
    if g.last_write.elapsed() < idle_after {
        return Step::Idle;
    }
    let r = g
        .mutate(|t| {
            let flushed = t.clean_step(tree::CLEAN_IDLE_FULLNESS_1024)?;
            t.store.evict_to_budget(t.root)?;
            Ok(flushed)
        })
        .and_then(|flushed| {
            // Also when nothing was flushed: installed leaf flushes and finished writeback jobs
            // are adopted now, not at the next write.
            g.writeback_step()?;
            Ok(flushed)
        });
    match r {
        Ok(true) => {
            RwLockWriteGuard::unlock_fair(g);
            Step::Again
        }
        Ok(false) => Step::Idle,
        Err(e) => {
            g.poisoned = true;
            g.background_error = Some(e);
            Step::Stop
        }
    }
}

impl Inner {
    /// Runs a mutation; any error poisons the engine (the in-memory tree may be half-updated;
    /// the file still holds the last checkpoint).
    fn mutate<T>(&mut self, f: impl FnOnce(&mut Tree) -> Result<T>) -> Result<T> {
        if self.poisoned {
            return Err(EngineError::Poisoned);
        }
        let r = f(&mut self.tree);
        if r.is_err() {
            self.poisoned = true;
        }
        r
    }

    /// After a write batch: adopts a finished writeback job, starts the next one when dirty
    /// nodes exceed half the cache budget (or leaves wait to be written and evicted), and makes
    /// the writer wait for the running job (smooth back-pressure) when dirty nodes pass seven
    /// eighths of the budget or the engine's memory (cache, side cache, flushes in flight) is
    /// over budget. Without the thread, writes inline (above a quarter of the
    /// budget).
    fn writeback_step(&mut self) -> Result<()> {
        self.writeback_round(false)
    }

    /// Within a write batch, when spilled runs were handed over since the last job began: adopts
    /// a finished job and, when the thread is idle, starts the next one at once, pending runs
    /// first (a batch's flush cascade can spill many runs; waiting for the batch's end would make
    /// the writer encode them itself once an eighth of the budget is pending).
    fn hand_over_runs(&mut self) -> Result<()> {
        self.writeback_round(true)
    }

    /// [`Inner::writeback_step`] (`runs_only` false) or [`Inner::hand_over_runs`] (true).
    fn writeback_round(&mut self, runs_only: bool) -> Result<()> {
        if self.poisoned {
            return Err(EngineError::Poisoned);
        }
        let budget = self.tree.store.budget_bytes();
        let Some(wb) = self.writeback.as_mut() else {
            if runs_only {
                return Ok(());
            }
            return self.mutate(|t| t.store.write_some_dirty(budget / 4, t.root));
        };
        let limit = budget / 2;
        if !runs_only {
            self.tree.store.next_write_epoch();
        }
        let mut finished = wb.poll(false);
        if finished.is_none() && wb.running() && !runs_only {
            let store = &self.tree.store;
            if store.dirty_bytes() > budget / 8 * 7 || store.memory_bytes() > budget {
                finished = wb.poll(true);
            }
        }
        if let Some(r) = finished {
            match r {
                Ok(done) => {
                    let root = self.tree.root;
                    let stats = self.tree.store.finish_writeback(done, root);
                    wb.count(stats);
                }
                Err(e) => {
                    self.poisoned = true;
                    return Err(e);
                }
            }
        }
        if !wb.running() {
            let root = self.tree.root;
            // Pending runs go first in any job.
            if let Some(job) = self.tree.store.begin_writeback(limit, root) {
                if let Err(e) = wb.submit(job) {
                    self.poisoned = true;
                    return Err(e);
                }
            }
        }
        Ok(())
    }
}

impl FractalEngine {
    /// Runs a read under the shared lock: `Ok(None)` when it needs the exclusive path. A read
    /// error (a bad block, a failed read) stops the engine, as it does on the exclusive path.
    fn read_shared<T>(&self, read: impl FnOnce(&Tree) -> Option<Result<T>>) -> Result<Option<T>> {
        let inner = self.inner.read();
        if inner.poisoned {
            return Err(EngineError::Poisoned);
        }
        match read(&inner.tree) {
            Some(Err(e)) => {
                drop(inner);
                self.inner.write().poisoned = true;
                Err(e)
            }
            Some(Ok(v)) => Ok(Some(v)),
            None => Ok(None),
        }
    }
}

impl Engine for FractalEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Fractal
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        // Fast path: every node on the path cached, under the shared lock.
        if let Some(r) = self.read_shared(|t| t.get_cached(key))? {
            return Ok(r);
        }
        // A poisoned tree may be half-updated in memory: no reads from it.
        self.inner.write().mutate(|t| {
            let v = t.get(key)?;
            t.store.evict_to_budget(t.root)?;
            Ok(v)
        })
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>> {
        if let Some(r) = self.read_shared(|t| t.scan_cached(start, end, limit))? {
            return Ok(r);
        }
        self.inner.write().mutate(|t| t.scan(start, end, limit))
    }

    fn write(&self, ops: &[WriteOp], meta: Option<&[u8]>) -> Result<()> {
        self.write_msgs(
            ops.len(),
            |i, msn| ops.get(i).and_then(|op| to_msg(op, msn)),
            meta,
        )
    }

    fn write_owned(&self, mut ops: Vec<WriteOp>, meta: Option<&[u8]>) -> Result<()> {
        let n = ops.len();
        self.write_msgs(
            n,
            |i, msn| {
                debug_assert!(i < ops.len(), "op index {i} past the batch of {}", ops.len());
                let op = ops.get_mut(i)?;
                // Each op is taken once (index `i` is visited once); what stays behind is empty.
                let taken = std::mem::replace(op, WriteOp::Delete { key: Vec::new() });
                to_msg_owned(taken, msn)
            },
            meta,
        )
    }

    fn meta(&self) -> Result<Option<Vec<u8>>> {
        Ok(self.inner.read().tree.meta.clone())
    }

    fn checkpoint(&self) -> Result<()> {
        let _serial = self.checkpoint_lock.lock();
        let job = {
            let mut inner = self.inner.write();
            if inner.poisoned {
                return Err(EngineError::Poisoned);
            }
            inner.tree.begin_checkpoint()
        };
        // Encoding, writing and syncing: readers and writers go on meanwhile.
        match job.run() {
            Ok(done) => {
                // The checkpoint is durable: finish it even if a writer poisoned the engine
                // meanwhile (memory bookkeeping and a `set_len`), and report what is true.
                let mut inner = self.inner.write();
                match inner.tree.store.finish_checkpoint(done) {
                    Ok(stats) => {
                        *self.last_checkpoint.lock() = Some(stats);
                        Ok(())
                    }
                    Err(e) => {
                        inner.poisoned = true;
                        Err(e)
                    }
                }
            }
            Err(e) => {
                let mut inner = self.inner.write();
                inner.tree.store.abort_checkpoint();
                inner.poisoned = true;
                Err(e)
            }
        }
    }

    fn replace_all(&self, pairs: &mut dyn Iterator<Item = Result<KeyValue>>, meta: &[u8]) -> Result<()> {
        let _serial = self.checkpoint_lock.lock();
        let mut inner = self.inner.write();
        if inner.poisoned {
            return Err(EngineError::Poisoned);
        }
        match inner.tree.replace_all(pairs, meta) {
            Ok(()) => Ok(()),
            // A bad input leaves the old tree in place; anything else poisons.
            Err(e @ EngineError::InvalidArgument(_)) => Err(e),
            Err(e) => {
                inner.poisoned = true;
                Err(e)
            }
        }
    }

    fn check_integrity(&self) -> Result<IntegrityReport> {
        self.inner.write().mutate(Tree::check_integrity)
    }

    fn size_on_disk_bytes(&self) -> Result<u64> {
        self.inner.read().tree.store.file_len()
    }
}
