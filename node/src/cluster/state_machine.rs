//! openraft `RaftStateMachine` (storage-v2) over an [`Engine`].
//!
//! - Each `apply` round (one or more committed entries) becomes **one** atomic `Engine::write`
//!   carrying the data ops, the client sessions the round changed (their own keys in the
//!   reserved key space, `session_store.rs`) and the new metadata blob ([`PersistedMeta`]: last
//!   applied log id, last membership, the session table's sweep index). Whatever state the
//!   engine reopens at, the metadata and the session keys describe exactly that data, so replay
//!   after a crash never applies a counter or CAS twice (etcd issue 13766 class). The session
//!   table is read back from its keys at open and after a snapshot install (the snapshot
//!   carries them with the data).
//! - Transactions are evaluated at apply time against the engine **plus the ops already gathered
//!   in this round** (an overlay), so a txn sees the writes of earlier commands in its own entry.
//!   Commands run under the limits stamped into them (append sizes, Txn read bytes): see
//!   `apply.rs`, the apply path.
//! - `build_snapshot` forces `Engine::checkpoint` and writes exactly the checkpointed state to
//!   `snapshots/current.snap` while holding the apply lock; openraft purges the log only up to a
//!   snapshot, so the log (the write-ahead log) is never purged past a durable checkpoint.
//! - A full disk (`ENOSPC`, `EDQUOT`) during a build, in the engine's checkpoint or writing the
//!   file, is not returned to openraft (which stops the Raft core on any `build_snapshot`
//!   error, `core/raft_core.rs`, `command_result.result?`): the build removes its unfinished
//!   file, reports the error ([`StateMachine::space_error`], which raises the NOSPACE alarm)
//!   and tries again every [`SNAPSHOT_RETRY_MS`] until it succeeds. Meanwhile openraft starts no
//!   other build and purges nothing, so the log keeps everything the engine has not made
//!   durable; apply and reads go on (the engine keeps what it cannot write in memory).
//! - `install_snapshot` verifies the received file while feeding it to `Engine::replace_all`
//!   (the peer server has verified it whole before already). A full disk during an install is
//!   waited out the same way (`state_machine/install.rs`): retried every [`SNAPSHOT_RETRY_MS`],
//!   reported to the alarm, never returned to openraft.
//! - The snapshot file is checked end to end at open and every time it is about to be sent: a
//!   damaged or missing one is rebuilt from the engine (which is authoritative), never sent.
//! - [`Durable`]: the highest log index the engine holds durably (at open, after every
//!   checkpoint, after an install). The log store purges only up to it, so a crash at any step
//!   of a snapshot install leaves the log and the engine consistent: openraft queues the purge of
//!   what a received snapshot covers before the state machine has installed it.

#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ftkv_engine::{Engine, EngineError, WriteOp};

use crate::auth::AuthState;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, ErrorSubject, OptionalSend};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::apply::{apply_command, ApplyBatch};
use super::auth_store;
use super::bulk::{self, StagedLoads};
use super::command::{Command, CommandResult};
use super::crash_point;
use super::session::SessionTable;
use super::session_store::check_record;
use super::snapshot::{SnapshotDir, SnapshotFile, CURRENT_FILE};
use super::types::{
    read_error, write_error, Entry, EntryResults, LogId, Snapshot, SnapshotMeta, StorageError,
    StoredMembership, TypeConfig,
};

/// State-machine metadata stored atomically with the engine data (engine meta blob, encoded as
/// `[META_VERSION] ++ postcard`, see [`encode_meta`]). The client sessions are not in it: they
/// are engine keys of their own (`session_store.rs`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedMeta {
    /// Last applied log id.
    pub last_applied: Option<LogId>,
    /// Last applied membership.
    pub last_membership: StoredMembership,
    /// Log index at or after which the session table's next idle sweep runs.
    pub next_session_sweep_index: u64,
}

/// Version byte of the metadata blob. Version 1 (builds before the incremental session table)
/// carried the whole session table in the blob; it is refused, not converted (the project has
/// no deployed data).
pub const META_VERSION: u8 = 2;

/// Encodes the metadata blob: `[META_VERSION] ++ postcard(meta)`.
pub fn encode_meta(meta: &PersistedMeta) -> Result<Vec<u8>, postcard::Error> {
    let mut out = vec![META_VERSION];
    out.extend_from_slice(&postcard::to_stdvec(meta)?);
    Ok(out)
}

/// Decodes what [`encode_meta`] wrote; errors name a bad version.
pub fn decode_meta(bytes: &[u8]) -> Result<PersistedMeta, String> {
    match bytes.split_first() {
        Some((&META_VERSION, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        Some((1, _)) => Err(format!(
            "state machine metadata version 1 is from a build that kept client sessions in it; \
             this build reads version {META_VERSION} and does not convert it: wipe the data \
             directory and rejoin the node under a new id"
        )),
        Some((v, _)) => Err(format!(
            "unsupported state machine metadata version {v} (this build reads {META_VERSION})"
        )),
        None => Err("empty state machine metadata".to_string()),
    }
}

/// What the apply lock guards: the metadata and the session table, staged bulk loads and auth
/// state it goes with.
struct SmState {
    meta: PersistedMeta,
    sessions: SessionTable,
    bulk: StagedLoads,
    /// Users, roles, the auth flag (`auth_store.rs`); `auth_dirty` until written.
    auth: AuthState,
    auth_dirty: bool,
}

impl SmState {
    /// Reads the metadata blob and the session table from `engine`.
    fn load(engine: &dyn Engine) -> Result<Self, String> {
        let meta = match engine.meta().map_err(|e| e.to_string())? {
            Some(bytes) => decode_meta(&bytes)?,
            None => PersistedMeta::default(),
        };
        let sessions =
            SessionTable::load(engine, meta.next_session_sweep_index).map_err(|e| e.to_string())?;
        let bulk = StagedLoads::load(engine).map_err(|e| e.to_string())?;
        let auth = auth_store::load(engine).map_err(|e| e.to_string())?;
        Ok(SmState {
            meta,
            sessions,
            bulk,
            auth,
            auth_dirty: false,
        })
    }

    /// The metadata blob as of now (the sweep index copied from the session table).
    fn encoded_meta(&mut self) -> Result<Vec<u8>, postcard::Error> {
        self.meta.next_session_sweep_index = self.sessions.next_sweep_index;
        encode_meta(&self.meta)
    }
}

struct Shared {
    engine: Arc<dyn Engine>,
    /// `DATA_DIR/snapshots`.
    snapshots: SnapshotDir,
    /// The apply lock: apply, snapshot build and install are serialized on it.
    state: Mutex<SmState>,
    /// Meta of `current.snap` (separate lock: readers never wait for a snapshot build).
    current: Mutex<Option<SnapshotMeta>>,
    applied_index: AtomicU64,
    snapshot_seq: AtomicU64,
    /// What the engine holds durably (see [`Durable`]).
    durable: tokio::sync::watch::Sender<Durable>,
    /// The full-disk error the last snapshot build met, until a build succeeds.
    space_error: Mutex<Option<String>>,
    /// Sort memory of a committed bulk load (`engine.loader_memory_size`).
    loader_memory_bytes: AtomicU64,
    /// The auth state as last applied, for the server's checks (readers never take the apply
    /// lock).
    auth: parking_lot::RwLock<Arc<AuthState>>,
}

/// How long a snapshot build that met a full disk waits before it tries again.
pub const SNAPSHOT_RETRY_MS: u64 = 1_000;

/// Why a snapshot build ([`build_snapshot_blocking`]) or install failed.
enum BuildError {
    /// A full disk (engine checkpoint or snapshot file): retry once space is freed.
    NoSpace(String),
    /// Anything else: a storage fault.
    Storage(StorageError),
}

impl From<BuildError> for StorageError {
    fn from(e: BuildError) -> Self {
        match e {
            BuildError::NoSpace(msg) => snapshot_error(msg),
            BuildError::Storage(e) => e,
        }
    }
}

impl From<StorageError> for BuildError {
    fn from(e: StorageError) -> Self {
        BuildError::Storage(e)
    }
}

/// A failed step of a build: a full disk is [`BuildError::NoSpace`].
fn build_error(e: super::snapshot::SnapshotError) -> BuildError {
    if e.is_no_space() {
        BuildError::NoSpace(e.to_string())
    } else {
        BuildError::Storage(snapshot_error(e))
    }
}

/// How far the engine's durable state reaches, watched by the log store's purge.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Durable {
    /// Highest log index covered by the engine's last durable state (checkpoint or install).
    pub index: u64,
    /// Set when an install failed: nothing will become durable any more (the node stops).
    pub failed: Option<String>,
}

/// The state machine handle. Cheap to clone; a clone is also the snapshot builder.
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

fn sm_read_error(err: impl std::fmt::Display) -> StorageError {
    read_error(ErrorSubject::StateMachine, err)
}

fn sm_write_error(err: impl std::fmt::Display) -> StorageError {
    write_error(ErrorSubject::StateMachine, err)
}

fn snapshot_error(err: impl std::fmt::Display) -> StorageError {
    write_error(ErrorSubject::Snapshot(None), err)
}

impl StateMachine {
    /// [`StateMachine::open_in`] on the real file system.
    #[cfg(test)]
    pub fn open(engine: Arc<dyn Engine>, snapshot_dir: &Path) -> Result<Self, StorageError> {
        Self::open_in(
            engine,
            SnapshotDir::new(Arc::new(ftkv_vfs::RealVfs), snapshot_dir),
        )
    }

    /// Opens the state machine over `engine`, with snapshots in `snapshots` (created; unfinished
    /// files removed; the current snapshot verified end to end and rebuilt when damaged). Reads
    /// the persisted metadata from the engine.
    pub fn open_in(engine: Arc<dyn Engine>, snapshots: SnapshotDir) -> Result<Self, StorageError> {
        snapshots.clean().map_err(snapshot_error)?;
        let persisted = SmState::load(engine.as_ref()).map_err(sm_read_error)?;
        let current_path = snapshots.join(CURRENT_FILE);
        let mut rebuild = false;
        let current = if snapshots.exists(&current_path) {
            match snapshots.verify_file(&current_path) {
                Ok(meta) => Some(meta),
                Err(e) => {
                    // The engine is authoritative; a snapshot file is only a copy of it for
                    // followers. A damaged one is replaced by a fresh build below.
                    tracing::error!(error = %e, "snapshot file is damaged; rebuilding it from the engine");
                    snapshots.remove(&current_path).map_err(snapshot_error)?;
                    rebuild = true;
                    None
                }
            }
        } else {
            None
        };
        let applied = persisted.meta.last_applied.map_or(0, |l| l.index);
        let auth = parking_lot::RwLock::new(Arc::new(persisted.auth.clone()));
        let (durable, _) = tokio::sync::watch::channel(Durable {
            index: applied,
            failed: None,
        });
        let sm = StateMachine {
            shared: Arc::new(Shared {
                engine,
                snapshots,
                state: Mutex::new(persisted),
                current: Mutex::new(current),
                applied_index: AtomicU64::new(applied),
                snapshot_seq: AtomicU64::new(0),
                durable,
                space_error: Mutex::new(None),
                loader_memory_bytes: AtomicU64::new(bulk::DEFAULT_LOADER_MEMORY_BYTES),
                auth,
            }),
        };
        if rebuild {
            // A follower that needs a snapshot must find a sound one: build it now.
            build_snapshot_blocking(&sm.shared, sm.next_seq()).map_err(StorageError::from)?;
        }
        Ok(sm)
    }

    /// Makes sure the current snapshot covers log index `index` (building one from the engine
    /// when it does not). At start, the engine may hold more than the log and the snapshot file
    /// both: a crash after an install replaced the engine but before the received file became
    /// `current.snap`. openraft then purges the log up to what the engine holds and requires a
    /// snapshot at least that far.
    pub fn ensure_snapshot_covers(&self, index: u64) -> Result<(), StorageError> {
        let covered = self
            .shared
            .current
            .lock()
            .as_ref()
            .and_then(|m| m.last_log_id)
            .map_or(0, |l| l.index);
        if covered >= index {
            return Ok(());
        }
        tracing::warn!(
            covered,
            index,
            "the engine holds more than the log and the snapshot file: rebuilding the snapshot"
        );
        build_snapshot_blocking(&self.shared, self.next_seq())
            .map(|_| ())
            .map_err(StorageError::from)
    }

    /// The full-disk error that keeps the engine from writing (its dirty nodes held in memory)
    /// or a snapshot from being built (retried every [`SNAPSHOT_RETRY_MS`]), if any: the node
    /// raises its NOSPACE alarm on it. `None` once writes and the build succeed again.
    pub fn space_error(&self) -> Option<String> {
        self.shared
            .space_error
            .lock()
            .clone()
            .or_else(|| self.shared.engine.space_error())
    }

    /// A copy of the session table as the state machine holds it (tests).
    #[cfg(test)]
    pub(crate) fn session_table(&self) -> SessionTable {
        self.shared.state.lock().sessions.clone()
    }

    /// Sets the sort memory of committed bulk loads (`engine.loader_memory_size`).
    pub fn set_loader_memory_bytes(&self, bytes: u64) {
        self.shared.loader_memory_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The auth state as last applied (a cheap shared copy).
    pub fn auth(&self) -> Arc<AuthState> {
        self.shared.auth.read().clone()
    }

    /// The snapshot directory.
    pub fn snapshots(&self) -> &SnapshotDir {
        &self.shared.snapshots
    }

    /// Watches how far the engine's durable state reaches (for the log store's purge).
    pub fn durable(&self) -> tokio::sync::watch::Receiver<Durable> {
        self.shared.durable.subscribe()
    }

    /// The engine (for reads).
    pub fn engine(&self) -> Arc<dyn Engine> {
        self.shared.engine.clone()
    }

    /// Last applied index (0 when none).
    pub fn applied_index(&self) -> u64 {
        self.shared.applied_index.load(Ordering::Acquire)
    }

    /// Makes everything applied durable (engine checkpoint, with metadata).
    pub fn checkpoint(&self) -> Result<(), EngineError> {
        let state = self.shared.state.lock();
        self.shared.engine.checkpoint()?;
        self.shared.mark_durable(&state.meta);
        Ok(())
    }

    fn next_seq(&self) -> u64 {
        self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Writes a snapshot of the state as applied now to `name` in the snapshot directory (not
    /// made current: a backup's copy; the caller removes it). Under the apply lock, so it is
    /// one point in time.
    pub fn write_copy(&self, name: &str) -> Result<(SnapshotMeta, PathBuf), StorageError> {
        let mut state = self.shared.state.lock();
        let last = state.meta.last_applied;
        let meta = SnapshotMeta {
            last_log_id: last,
            last_membership: state.meta.last_membership.clone(),
            snapshot_id: format!("backup-{}", last.map_or(0, |l| l.index)),
        };
        let sm_meta = state.encoded_meta().map_err(snapshot_error)?;
        let path = self
            .shared
            .snapshots
            .write_snapshot(name, &meta, &sm_meta, self.shared.engine.as_ref())
            .map_err(snapshot_error)?;
        Ok((meta, path))
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, StorageError>
    where
        T: Send + 'static,
        F: FnOnce(&Shared) -> Result<T, StorageError> + Send + 'static,
    {
        let shared = self.shared.clone();
        tokio::task::spawn_blocking(move || f(&shared))
            .await
            .map_err(|e| sm_write_error(format!("blocking task failed: {e}")))?
    }
}

impl Shared {
    /// Records that everything `state` describes is durable in the engine.
    fn mark_durable(&self, state: &PersistedMeta) {
        let index = state.last_applied.map_or(0, |l| l.index);
        self.durable.send_modify(|d| d.index = d.index.max(index));
    }
}

fn apply_entries(shared: &Shared, entries: Vec<Entry>) -> Result<Vec<EntryResults>, StorageError> {
    let started = std::time::Instant::now();
    metrics::histogram!("ftkv_sm_apply_entries").record(entries.len() as f64);
    let mut state = shared.state.lock();
    let mut batch = ApplyBatch::new(shared.engine.as_ref());
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let log_id = entry.log_id;
        // Any entry of a later term cancels the bulk loads of earlier terms (`bulk.rs`).
        state.bulk.cancel_before(log_id.leader_id.term, &mut batch.ops);
        match entry.payload {
            EntryPayload::Blank => {
                state.meta.last_applied = Some(log_id);
                out.push(EntryResults::default());
            }
            EntryPayload::Normal(payload) => {
                if let [Command::BulkCommit { .. }] = payload.commands.as_slice() {
                    // Everything before this entry first (its metadata at the entry before),
                    // then the load alone, atomically with this entry's metadata.
                    flush(shared, &mut state, std::mem::take(&mut batch.ops))?;
                    batch = ApplyBatch::new(shared.engine.as_ref());
                    state.meta.last_applied = Some(log_id);
                    let result = commit_load(shared, &mut state, payload.commands, log_id)?;
                    out.push(EntryResults {
                        results: vec![result],
                    });
                    continue;
                }
                state.meta.last_applied = Some(log_id);
                let mut results = Vec::with_capacity(payload.commands.len());
                for command in payload.commands {
                    let result = if let Command::Auth(op) = command {
                        let SmState { auth, auth_dirty, .. } = &mut *state;
                        auth_store::apply(auth, op, auth_dirty)
                    } else if command.is_bulk() {
                        apply_bulk(&mut state.bulk, command, log_id.leader_id.term, &mut batch.ops)
                    } else {
                        apply_command(&mut batch, &mut state.sessions, command, log_id.index)
                            .map_err(|e| write_error(ErrorSubject::Apply(log_id), e))?
                    };
                    results.push(result);
                }
                out.push(EntryResults { results });
            }
            EntryPayload::Membership(m) => {
                state.meta.last_applied = Some(log_id);
                state.meta.last_membership = StoredMembership::new(Some(log_id), m);
                out.push(EntryResults::default());
            }
        }
    }
    flush(shared, &mut state, std::mem::take(&mut batch.ops))?;
    metrics::histogram!("ftkv_sm_apply_seconds").record(started.elapsed());
    Ok(out)
}

/// Writes `ops` with the sessions changed since the last write and the metadata as `state` has
/// it now, in one atomic engine write.
fn flush(shared: &Shared, state: &mut SmState, mut ops: Vec<WriteOp>) -> Result<(), StorageError> {
    state.sessions.take_changes(&mut ops).map_err(sm_write_error)?;
    let auth_changed = std::mem::take(&mut state.auth_dirty);
    if auth_changed {
        ops.push(auth_store::put(&state.auth).map_err(sm_write_error)?);
    }
    let meta = state.encoded_meta().map_err(sm_write_error)?;
    shared
        .engine
        .write_owned(ops, Some(&meta))
        .map_err(sm_write_error)?;
    if auth_changed {
        *shared.auth.write() = Arc::new(state.auth.clone());
    }
    if let Some(l) = state.meta.last_applied {
        shared.applied_index.store(l.index, Ordering::Release);
    }
    Ok(())
}

/// A bulk-load command that is not a commit alone in its entry (`bulk.rs`).
fn apply_bulk(
    staged: &mut StagedLoads,
    command: Command,
    term: u64,
    ops: &mut Vec<WriteOp>,
) -> CommandResult {
    match command {
        Command::BulkStage { load, seq, chunk } => staged.stage(load, seq, chunk, term, ops),
        Command::BulkAbort { load } => staged.abort(load, ops),
        Command::BulkCommit { load, .. } => {
            staged.abort(load, ops);
            CommandResult::BulkCancelled {
                reason: "a bulk commit must be the only command of its entry".into(),
            }
        }
        _ => CommandResult::BulkCancelled {
            reason: "not a bulk-load command".into(),
        },
    }
}

/// Applies an entry that holds one `BulkCommit` (`state.meta.last_applied` is the entry): the
/// load's rows, its staging deletion and the metadata in one `Engine::bulk_load`; a refused
/// load deletes its staging in an ordinary write.
fn commit_load(
    shared: &Shared,
    state: &mut SmState,
    commands: Vec<Command>,
    log_id: LogId,
) -> Result<CommandResult, StorageError> {
    let Some(Command::BulkCommit {
        load,
        chunks,
        rows,
        on_duplicate,
    }) = commands.into_iter().next()
    else {
        return Err(sm_write_error("commit_load called without a BulkCommit"));
    };
    let mut ops = Vec::new();
    if let Err(refused) = state
        .bulk
        .take_for_commit(load, chunks, log_id.leader_id.term, &mut ops)
    {
        flush(shared, state, ops)?;
        return Ok(refused);
    }
    let meta = state.encoded_meta().map_err(sm_write_error)?;
    let started = std::time::Instant::now();
    let result = bulk::ingest(
        shared.engine.as_ref(),
        load,
        chunks,
        on_duplicate,
        shared.loader_memory_bytes.load(Ordering::Relaxed),
        Vec::new(),
        &meta,
    )
    .map_err(|e| write_error(ErrorSubject::Apply(log_id), e))?;
    match &result {
        CommandResult::BulkLoaded { rows_read, .. } if *rows_read == rows => {
            shared.applied_index.store(log_id.index, Ordering::Release);
            tracing::info!(
                rows,
                chunks,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "bulk load committed"
            );
        }
        CommandResult::BulkLoaded { rows_read, .. } => {
            // The leader counted the rows it staged; a replica that ingested another number
            // holds different data: stop, never diverge silently.
            return Err(write_error(
                ErrorSubject::Apply(log_id),
                format!("bulk load ingested {rows_read} rows, its commit says {rows}"),
            ));
        }
        _ => {
            // Refused whole (a duplicate): delete the staging, keep nothing of the load.
            flush(shared, state, vec![bulk::delete_load(load)])?;
        }
    }
    Ok(result)
}

fn build_snapshot_blocking(shared: &Shared, seq: u64) -> Result<(SnapshotMeta, PathBuf), BuildError> {
    let mut state = shared.state.lock();
    match shared.engine.checkpoint() {
        Ok(()) => {}
        Err(e) if e.is_no_space() => return Err(BuildError::NoSpace(e.to_string())),
        Err(e) => return Err(BuildError::Storage(snapshot_error(e))),
    }
    shared.mark_durable(&state.meta);
    let last = state.meta.last_applied;
    let snapshot_id = match last {
        Some(l) => format!("{}-{}-{}-{seq}", l.leader_id.term, l.leader_id.node_id, l.index),
        None => format!("none-{seq}"),
    };
    let meta = SnapshotMeta {
        last_log_id: last,
        last_membership: state.meta.last_membership.clone(),
        snapshot_id,
    };
    // Every change is in the engine already (apply takes them each round); the session keys
    // travel among the snapshot's pairs.
    let sm_meta = state.encoded_meta().map_err(snapshot_error)?;
    let tmp_name = format!("building-{seq}.tmp");
    let tmp = match shared
        .snapshots
        .write_snapshot(&tmp_name, &meta, &sm_meta, shared.engine.as_ref())
    {
        Ok(tmp) => tmp,
        Err(e) => {
            // The unfinished file goes at once: on a full disk it holds the space a retry needs.
            let unfinished = shared.snapshots.join(&tmp_name);
            if shared.snapshots.exists(&unfinished) {
                if let Err(removing) = shared.snapshots.remove(&unfinished) {
                    tracing::warn!(error = %removing, "cannot remove an unfinished snapshot file");
                }
            }
            return Err(build_error(e));
        }
    };
    let path = shared.snapshots.make_current(&tmp).map_err(build_error)?;
    *shared.current.lock() = Some(meta.clone());
    Ok((meta, path))
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    /// Builds the snapshot; a full disk is retried every [`SNAPSHOT_RETRY_MS`] (module docs),
    /// so this returns only once the build succeeded or met a storage fault.
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let mut failures = 0u64;
        let (meta, path) = loop {
            let seq = self.next_seq();
            let built = self
                .blocking(move |shared| Ok(build_snapshot_blocking(shared, seq)))
                .await?;
            match built {
                Ok(built) => {
                    if self.shared.space_error.lock().take().is_some() {
                        tracing::warn!(failures, "snapshot built after the disk had room again");
                    }
                    break built;
                }
                Err(BuildError::NoSpace(error)) => {
                    if failures == 0 {
                        tracing::error!(
                            %error,
                            retry_ms = SNAPSHOT_RETRY_MS,
                            "cannot build a snapshot: the disk is full; the log is kept (not purged) and the build is retried until space is freed"
                        );
                    }
                    failures += 1;
                    *self.shared.space_error.lock() = Some(error);
                    tokio::time::sleep(std::time::Duration::from_millis(SNAPSHOT_RETRY_MS)).await;
                }
                Err(BuildError::Storage(e)) => return Err(e),
            }
        };
        let file = self.shared.snapshots.open_file(&path).map_err(snapshot_error)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(file),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let state = self.shared.state.lock();
        Ok((state.meta.last_applied, state.meta.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<EntryResults>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        if entries.is_empty() {
            return Ok(Vec::new());
        }
        self.blocking(move |shared| apply_entries(shared, entries)).await
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<SnapshotFile>, StorageError> {
        // openraft receives one snapshot at a time: a new transfer abandons any earlier one.
        let name = format!("receiving-{}.tmp", self.next_seq());
        let file = self
            .blocking(move |shared| {
                shared
                    .snapshots
                    .remove_tmp_files("receiving-")
                    .map_err(snapshot_error)?;
                shared.snapshots.create_file(&name).map_err(snapshot_error)
            })
            .await?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<SnapshotFile>,
    ) -> Result<(), StorageError> {
        snapshot.sync().map_err(snapshot_error)?;
        let received = snapshot.path.clone();
        drop(snapshot);
        let installed = self.install_waiting_for_space(meta, received).await;
        if let Err(e) = &installed {
            // Nothing will become durable any more: release a purge waiting for this install.
            self.shared
                .durable
                .send_modify(|d| d.failed = Some(e.to_string()));
        }
        installed
    }

    /// The current snapshot, checked end to end first (openraft asks for it to send it to a
    /// follower): a damaged file is rebuilt from the engine, never sent.
    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let seq = self.next_seq();
        let checked = self
            .blocking(move |shared| {
                let Some(meta) = shared.current.lock().clone() else {
                    return Ok(None);
                };
                let path = shared.snapshots.join(CURRENT_FILE);
                match shared.snapshots.verify_file(&path) {
                    Ok(on_disk) if on_disk == meta => Ok(Some((meta, path))),
                    Ok(on_disk) => {
                        tracing::error!(
                            expected = %meta.snapshot_id,
                            found = %on_disk.snapshot_id,
                            "snapshot file is not the current snapshot; rebuilding it"
                        );
                        build_snapshot_blocking(shared, seq)
                            .map(Some)
                            .map_err(StorageError::from)
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "snapshot file is damaged; rebuilding it before sending");
                        build_snapshot_blocking(shared, seq)
                            .map(Some)
                            .map_err(StorageError::from)
                    }
                }
            })
            .await?;
        let Some((meta, path)) = checked else {
            return Ok(None);
        };
        let file = self.shared.snapshots.open_file(&path).map_err(snapshot_error)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}

mod install;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
