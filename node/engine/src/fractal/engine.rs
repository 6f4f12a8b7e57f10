//! [`FractalEngine`]: opening, the write path, the shared and exclusive read paths, and the
//! [`Engine`] trait.

use super::*;

/// The fractal-tree engine (`engine.kind = "fractal"`).
pub struct FractalEngine {
    /// Background flushing of internal buffers (`None`: off, or the thread could not start).
    /// Declared first: dropping it joins the thread before the tree goes.
    pub(crate) _cleaner: Option<Cleaner>,
    pub(crate) inner: Arc<RwLock<Inner>>,
    pub(crate) path: PathBuf,
    /// The file system the engine opened with (bulk loads spill their sorted runs through it).
    pub(crate) vfs: Arc<dyn Vfs>,
    /// The engine directory.
    pub(crate) dir: PathBuf,
    /// Serializes checkpoints (and bulk loads, which end with one); taken before `inner`.
    pub(crate) checkpoint_lock: Mutex<()>,
    /// Figures of the last checkpoint.
    pub(crate) last_checkpoint: Mutex<Option<CheckpointStats>>,
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> EngineError {
    let context = context.into();
    move |source| EngineError::Io { context, source }
}

impl FractalEngine {
    /// Opens (or creates) the tree in `opts.dir` with the default [`FractalOptions`].
    ///
    /// Errors: `Io` from the file system, `Corruption` when no valid header or a damaged BTT is
    /// found, `UnsupportedVersion` for a file of another format version (older ones included).
    pub fn open(vfs: Arc<dyn Vfs>, opts: &EngineOptions) -> Result<Self> {
        Self::open_with(vfs, opts, FractalOptions::default())
    }

    /// Like [`FractalEngine::open`] with the tree shape and cleaner period of `fractal`.
    /// Errors: as [`FractalEngine::open`], and `InvalidArgument` for a tree shape the
    /// algorithms cannot work with.
    pub fn open_with(vfs: Arc<dyn Vfs>, opts: &EngineOptions, fractal: FractalOptions) -> Result<Self> {
        let FractalOptions {
            tree: params,
            cleaner_period_ms,
        } = fractal;
        params.validate()?;
        vfs.create_dir_all(&opts.dir)
            .map_err(io(format!("create {}", opts.dir.display())))?;
        // Temporary files of a bulk load that a crash interrupted (their rows never became
        // visible: the load applies nothing before its sort ends).
        bulk::remove_leftovers(vfs.as_ref(), &opts.dir)?;
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
            vfs,
            dir: opts.dir.clone(),
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
        msg_at: impl FnMut(usize, Msn) -> Option<Msg>,
        meta: Option<&[u8]>,
    ) -> Result<()> {
        let mut inner = self.inner.write();
        Self::write_msgs_locked(&mut inner, n, msg_at, meta)
    }

    /// [`FractalEngine::write_msgs`] with the engine lock held (a bulk load injects its
    /// messages inside its own exclusive section).
    pub(crate) fn write_msgs_locked(
        inner: &mut Inner,
        n: usize,
        mut msg_at: impl FnMut(usize, Msn) -> Option<Msg>,
        meta: Option<&[u8]>,
    ) -> Result<()> {
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

    /// Node blocks written since open, before and after compression (the compression ratio).
    pub fn compression_stats(&self) -> store::CompressionStats {
        self.inner.read().tree.store.block_bytes.stats()
    }
}

/// Within a write batch, how often (in messages) the writer looks for spilled runs or eviction
/// victims to hand to an idle writeback thread.
const HAND_OVER_EVERY_MSGS: usize = 16;

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
                        inner.tree.store.space_regained();
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
                if e.is_no_space() {
                    // Nothing durable changed and the dirty nodes are still dirty: the caller
                    // retries once space is freed; reads and writes go on meanwhile.
                    inner.tree.store.hold_dirty(&e);
                } else {
                    inner.poisoned = true;
                }
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
            // A bad input leaves the old tree in place.
            Err(e @ EngineError::InvalidArgument(_)) => Err(e),
            // A full disk changes nothing durable: met while building, the old tree is kept and
            // the new blocks are released; met by the checkpoint after the switch, the new tree
            // stays in memory (its blocks unreferenced by any durable checkpoint) like dirty
            // nodes. Either way the caller retries once space is freed; anything else poisons.
            Err(e) if e.is_no_space() => {
                inner.tree.store.hold_dirty(&e);
                Err(e)
            }
            Err(e) => {
                inner.poisoned = true;
                Err(e)
            }
        }
    }

    fn bulk_load(
        &self,
        rows: &mut dyn Iterator<Item = Result<KeyValue>>,
        opts: &crate::BulkLoadOptions,
        extra_ops: &[WriteOp],
        meta: Option<&[u8]>,
    ) -> Result<crate::BulkLoadReport> {
        self.bulk_load_fractal(rows, opts, extra_ops, meta)
    }

    fn check_integrity(&self) -> Result<IntegrityReport> {
        self.inner.write().mutate(Tree::check_integrity)
    }

    fn size_on_disk_bytes(&self) -> Result<u64> {
        self.inner.read().tree.store.file_len()
    }

    fn space_error(&self) -> Option<String> {
        self.inner.read().tree.store.space_error()
    }
}
