//! openraft `RaftStateMachine` (storage-v2) over an [`Engine`].
//!
//! - Each `apply` round (one or more committed entries) becomes **one** atomic `Engine::write`
//!   carrying the data ops and the new metadata blob ([`PersistedMeta`]: last applied log id,
//!   last membership, client sessions). Whatever state the engine reopens at, the metadata
//!   describes exactly that data, so replay after a crash never applies a counter or CAS twice
//!   (etcd issue 13766 class).
//! - Transactions are evaluated at apply time against the engine **plus the ops already gathered
//!   in this round** (an overlay), so a txn sees the writes of earlier commands in its own entry.
//!   Commands run under the limits stamped into them (append sizes, Txn read bytes): see
//!   `apply.rs`, the apply path.
//! - `build_snapshot` forces `Engine::checkpoint` and writes exactly the checkpointed state to
//!   `snapshots/current.snap` while holding the apply lock; openraft purges the log only up to a
//!   snapshot, so the log (the write-ahead log) is never purged past a durable checkpoint.
//! - `install_snapshot` verifies the received file while feeding it to `Engine::replace_all`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ftkv_engine::{Engine, EngineError};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::{EntryPayload, ErrorSubject, OptionalSend};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::apply::{apply_command, ApplyBatch};
use super::log_store::{decode_versioned, encode_versioned};
use super::session::SessionTable;
use super::snapshot::{self, SnapshotFile, SnapshotReader, CURRENT_FILE};
use super::types::{
    read_error, write_error, Entry, EntryResults, LogId, Snapshot, SnapshotMeta, StorageError,
    StoredMembership, TypeConfig,
};

/// State-machine metadata stored atomically with the engine data (engine meta blob, encoded as
/// `[version] ++ postcard`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PersistedMeta {
    /// Last applied log id.
    pub last_applied: Option<LogId>,
    /// Last applied membership.
    pub last_membership: StoredMembership,
    /// Exactly-once client sessions.
    pub sessions: SessionTable,
}

struct Shared {
    engine: Arc<dyn Engine>,
    /// `DATA_DIR/snapshots`.
    dir: PathBuf,
    /// The apply lock: apply, snapshot build and install are serialized on it.
    state: Mutex<PersistedMeta>,
    /// Meta of `current.snap` (separate lock: readers never wait for a snapshot build).
    current: Mutex<Option<SnapshotMeta>>,
    applied_index: AtomicU64,
    snapshot_seq: AtomicU64,
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
    /// Opens the state machine over `engine`, with snapshots in `snapshot_dir` (created; unfinished
    /// files removed). Reads the persisted metadata from the engine.
    pub fn open(engine: Arc<dyn Engine>, snapshot_dir: &Path) -> Result<Self, StorageError> {
        snapshot::clean_dir(snapshot_dir).map_err(snapshot_error)?;
        let persisted: PersistedMeta = match engine.meta().map_err(sm_read_error)? {
            Some(bytes) => decode_versioned(&bytes).map_err(sm_read_error)?,
            None => PersistedMeta::default(),
        };
        let current_path = snapshot_dir.join(CURRENT_FILE);
        let current = if current_path.exists() {
            match snapshot::read_meta(&current_path) {
                Ok(meta) => Some(meta),
                Err(e) => {
                    // The engine is authoritative; a bad snapshot file is only a cache for followers.
                    tracing::warn!(error = %e, "ignoring unreadable snapshot file");
                    std::fs::remove_file(&current_path).map_err(snapshot_error)?;
                    None
                }
            }
        } else {
            None
        };
        let applied = persisted.last_applied.map_or(0, |l| l.index);
        Ok(StateMachine {
            shared: Arc::new(Shared {
                engine,
                dir: snapshot_dir.to_path_buf(),
                state: Mutex::new(persisted),
                current: Mutex::new(current),
                applied_index: AtomicU64::new(applied),
                snapshot_seq: AtomicU64::new(0),
            }),
        })
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
        let _state = self.shared.state.lock();
        self.shared.engine.checkpoint()
    }

    fn next_seq(&self) -> u64 {
        self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed)
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

fn apply_entries(shared: &Shared, entries: Vec<Entry>) -> Result<Vec<EntryResults>, StorageError> {
    let started = std::time::Instant::now();
    metrics::histogram!("ftkv_sm_apply_entries").record(entries.len() as f64);
    let mut state = shared.state.lock();
    let mut batch = ApplyBatch::new(shared.engine.as_ref());
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let log_id = entry.log_id;
        state.last_applied = Some(log_id);
        match entry.payload {
            EntryPayload::Blank => out.push(EntryResults::default()),
            EntryPayload::Normal(payload) => {
                let mut results = Vec::with_capacity(payload.commands.len());
                for command in payload.commands {
                    results.push(
                        apply_command(&mut batch, &mut state.sessions, command, log_id.index)
                            .map_err(|e| write_error(ErrorSubject::Apply(log_id), e))?,
                    );
                }
                out.push(EntryResults { results });
            }
            EntryPayload::Membership(m) => {
                state.last_membership = StoredMembership::new(Some(log_id), m);
                out.push(EntryResults::default());
            }
        }
    }
    let meta = encode_versioned(&*state).map_err(sm_write_error)?;
    shared
        .engine
        .write_owned(std::mem::take(&mut batch.ops), Some(&meta))
        .map_err(sm_write_error)?;
    if let Some(l) = state.last_applied {
        shared.applied_index.store(l.index, Ordering::Release);
    }
    metrics::histogram!("ftkv_sm_apply_seconds").record(started.elapsed());
    Ok(out)
}

fn build_snapshot_blocking(shared: &Shared, seq: u64) -> Result<(SnapshotMeta, PathBuf), StorageError> {
    let state = shared.state.lock();
    shared.engine.checkpoint().map_err(snapshot_error)?;
    let last = state.last_applied;
    let snapshot_id = match last {
        Some(l) => format!("{}-{}-{}-{seq}", l.leader_id.term, l.leader_id.node_id, l.index),
        None => format!("none-{seq}"),
    };
    let meta = SnapshotMeta {
        last_log_id: last,
        last_membership: state.last_membership.clone(),
        snapshot_id,
    };
    let sm_meta = encode_versioned(&*state).map_err(snapshot_error)?;
    let tmp_name = format!("building-{seq}.tmp");
    let tmp = snapshot::write_snapshot(&shared.dir, &tmp_name, &meta, &sm_meta, shared.engine.as_ref())
        .map_err(snapshot_error)?;
    let path = snapshot::make_current(&shared.dir, &tmp).map_err(snapshot_error)?;
    *shared.current.lock() = Some(meta.clone());
    Ok((meta, path))
}

fn install_snapshot_blocking(
    shared: &Shared,
    meta: SnapshotMeta,
    received: PathBuf,
) -> Result<(), StorageError> {
    let mut state = shared.state.lock();
    let (mut reader, _header, sm_meta) = SnapshotReader::open(&received).map_err(snapshot_error)?;
    let mut persisted: PersistedMeta = decode_versioned(&sm_meta).map_err(snapshot_error)?;
    persisted.last_applied = meta.last_log_id;
    persisted.last_membership = meta.last_membership.clone();
    let encoded = encode_versioned(&persisted).map_err(snapshot_error)?;
    shared
        .engine
        .replace_all(&mut reader, &encoded)
        .map_err(snapshot_error)?;
    snapshot::make_current(&shared.dir, &received).map_err(snapshot_error)?;
    if received.parent() == Some(shared.dir.as_path()) && received.exists() {
        let _ = std::fs::remove_file(&received);
    }
    shared
        .applied_index
        .store(persisted.last_applied.map_or(0, |l| l.index), Ordering::Release);
    *state = persisted;
    *shared.current.lock() = Some(meta);
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let seq = self.next_seq();
        let (meta, path) = self
            .blocking(move |shared| build_snapshot_blocking(shared, seq))
            .await?;
        let file = SnapshotFile::open(path).await.map_err(snapshot_error)?;
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
        Ok((state.last_applied, state.last_membership.clone()))
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
        let dir = self.shared.dir.clone();
        tokio::task::spawn_blocking(move || snapshot::remove_tmp_files(&dir, "receiving-"))
            .await
            .map_err(snapshot_error)?
            .map_err(snapshot_error)?;
        let path = self.shared.dir.join(format!("receiving-{}.tmp", self.next_seq()));
        let file = SnapshotFile::create(path).await.map_err(snapshot_error)?;
        Ok(Box::new(file))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        mut snapshot: Box<SnapshotFile>,
    ) -> Result<(), StorageError> {
        snapshot.sync().await.map_err(snapshot_error)?;
        let received = snapshot.path.clone();
        drop(snapshot);
        let meta = meta.clone();
        self.blocking(move |shared| install_snapshot_blocking(shared, meta, received))
            .await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let Some(meta) = self.shared.current.lock().clone() else {
            return Ok(None);
        };
        let file = SnapshotFile::open(self.shared.dir.join(CURRENT_FILE))
            .await
            .map_err(snapshot_error)?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(file),
        }))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cluster::command::Command;
    use crate::cluster::command::{upsert, CommandResult, Compare, CompareOp, CompareTarget, Session, TxnOp};
    use crate::cluster::types::EntryCommands;
    use ftkv_engine::model::ModelEngine;
    use ftkv_engine::UpsertOp;
    use ftkv_engine::WriteOp;

    fn entry(index: u64, commands: Vec<Command>) -> Entry {
        Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(EntryCommands { commands }),
        }
    }

    fn add(client: u64, seq: u64) -> Command {
        Command::Write {
            session: Some(Session {
                client_id: client,
                sequence: seq,
                first_incomplete: seq,
            }),
            ops: vec![upsert(b"n".to_vec(), UpsertOp::Add(1))],
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn txn_sees_range_ops_of_earlier_commands_in_the_same_round() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(ModelEngine::new());
        let mut sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
        engine
            .write(
                &[WriteOp::Put {
                    key: b"c".to_vec(),
                    value: b"x".to_vec(),
                }],
                None,
            )
            .unwrap();
        let writes = Command::Write {
            session: None,
            ops: vec![
                WriteOp::Put {
                    key: b"a".to_vec(),
                    value: b"1".to_vec(),
                },
                WriteOp::Put {
                    key: b"b".to_vec(),
                    value: b"2".to_vec(),
                },
                WriteOp::DeleteRange {
                    start: b"a".to_vec(),
                    end: Some(b"b".to_vec()),
                },
                WriteOp::UpsertRange {
                    start: b"b".to_vec(),
                    end: None,
                    op: UpsertOp::Append(b"!".to_vec()),
                },
            ],
        };
        let cmp = |key: &[u8], target, op, operand: &[u8]| Compare {
            key: key.to_vec(),
            target,
            op,
            operand: operand.to_vec(),
        };
        let txn = Command::Txn {
            session: None,
            compares: vec![
                cmp(b"a", CompareTarget::Exists, CompareOp::NotEqual, b""),
                cmp(b"b", CompareTarget::Value, CompareOp::Equal, b"2!"),
                cmp(b"c", CompareTarget::Value, CompareOp::Equal, b"x!"),
            ],
            success: vec![TxnOp::Get { key: b"c".to_vec() }],
            failure: vec![],
        };
        let r = sm.apply(vec![entry(1, vec![writes, txn])]).await.unwrap();
        assert_eq!(
            r[0].results[1],
            CommandResult::Txn {
                succeeded: true,
                results: vec![Some(b"x!".to_vec())]
            }
        );
        assert_eq!(engine.get(b"a").unwrap(), None);
        assert_eq!(engine.get(b"b").unwrap(), Some(b"2!".to_vec()));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn exactly_once_and_txn_reads_own_batch() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(ModelEngine::new());
        let mut sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
        // Same (client, sequence) twice in one entry and again in the next entry: applied once.
        let txn = Command::Txn {
            session: None,
            compares: vec![Compare {
                key: b"n".to_vec(),
                target: CompareTarget::Value,
                op: CompareOp::Equal,
                operand: 1i64.to_le_bytes().to_vec(),
            }],
            success: vec![
                TxnOp::Write(WriteOp::Put {
                    key: b"t".to_vec(),
                    value: b"yes".to_vec(),
                }),
                TxnOp::Get { key: b"t".to_vec() },
            ],
            failure: vec![TxnOp::Get { key: b"n".to_vec() }],
        };
        let r = sm
            .apply(vec![
                entry(1, vec![add(9, 1), add(9, 1), txn]),
                entry(2, vec![add(9, 1)]),
            ])
            .await
            .unwrap();
        assert_eq!(r[0].results[0], CommandResult::Written);
        assert_eq!(r[0].results[1], CommandResult::Written);
        assert_eq!(
            r[0].results[2],
            CommandResult::Txn {
                succeeded: true,
                results: vec![None, Some(b"yes".to_vec())]
            }
        );
        assert_eq!(engine.get(b"n").unwrap(), Some(1i64.to_le_bytes().to_vec()));
        // Acknowledged window moved past 1: a retry of 1 is stale.
        let r = sm
            .apply(vec![entry(
                3,
                vec![Command::Write {
                    session: Some(Session {
                        client_id: 9,
                        sequence: 1,
                        first_incomplete: 2,
                    }),
                    ops: vec![upsert(b"n".to_vec(), UpsertOp::Add(1))],
                }],
            )])
            .await
            .unwrap();
        assert_eq!(r[0].results[0], CommandResult::StaleSequence);
        assert_eq!(engine.get(b"n").unwrap(), Some(1i64.to_le_bytes().to_vec()));

        // Sessions survive a reopen (persisted in the engine metadata with the data).
        let mut sm2 = StateMachine::open(engine.clone(), dir.path()).unwrap();
        assert_eq!(sm2.applied_state().await.unwrap().0.map(|l| l.index), Some(3));
        let r = sm2
            .apply(vec![entry(4, vec![add(9, 2)]), entry(5, vec![add(9, 2)])])
            .await
            .unwrap();
        assert_eq!(r[1].results[0], CommandResult::Written);
        assert_eq!(engine.get(b"n").unwrap(), Some(2i64.to_le_bytes().to_vec()));

        // Snapshot to a second state machine: same data, sessions and applied id.
        let snap = sm2.get_snapshot_builder().await.build_snapshot().await.unwrap();
        let dir2 = tempfile::tempdir().unwrap();
        let engine2 = Arc::new(ModelEngine::new());
        let mut follower = StateMachine::open(engine2.clone(), dir2.path()).unwrap();
        follower
            .install_snapshot(&snap.meta, snap.snapshot)
            .await
            .unwrap();
        assert_eq!(engine2.snapshot(), engine.snapshot());
        let r = follower.apply(vec![entry(6, vec![add(9, 2)])]).await.unwrap();
        assert_eq!(r[0].results[0], CommandResult::Written);
        assert_eq!(engine2.get(b"n").unwrap(), Some(2i64.to_le_bytes().to_vec()));
        assert_eq!(
            follower.get_current_snapshot().await.unwrap().map(|s| s.meta),
            Some(snap.meta)
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn session_hardening_through_apply() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(ModelEngine::new());
        let mut sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
        let n = |e: &ModelEngine| e.get(b"n").unwrap();

        // 1. Evicted client's retry is not re-applied.
        sm.apply(vec![entry(1, vec![add(1_000_000, 1)])]).await.unwrap();
        let others: Vec<Command> = (1..=4_700u64)
            .map(|id| Command::Write {
                session: Some(Session {
                    client_id: id,
                    sequence: 1,
                    first_incomplete: 1,
                }),
                ops: vec![],
            })
            .collect();
        sm.apply(vec![entry(2, others)]).await.unwrap();
        let r = sm.apply(vec![entry(3, vec![add(1_000_000, 1)])]).await.unwrap();
        assert_eq!(r[0].results[0], CommandResult::StaleSequence);
        assert_eq!(n(&engine), Some(1i64.to_le_bytes().to_vec()));

        // 2. A txn reading 20 x 1 MiB answers in full once; its retry gets TooLargeToKeep and
        // the persisted metadata stays small.
        sm.apply(vec![entry(
            4,
            vec![Command::Write {
                session: None,
                ops: vec![WriteOp::Put {
                    key: b"big".to_vec(),
                    value: vec![3u8; 1024 * 1024],
                }],
            }],
        )])
        .await
        .unwrap();
        let big_txn = Command::Txn {
            session: Some(Session {
                client_id: 5_000_000,
                sequence: 1,
                first_incomplete: 1,
            }),
            compares: vec![],
            success: vec![TxnOp::Get { key: b"big".to_vec() }; 20],
            failure: vec![],
        };
        let r = sm
            .apply(vec![entry(5, vec![big_txn.clone()]), entry(6, vec![big_txn])])
            .await
            .unwrap();
        match &r[0].results[0] {
            CommandResult::Txn { results, .. } => assert_eq!(results.len(), 20),
            other => panic!("expected a txn result, got {other:?}"),
        }
        assert_eq!(r[1].results[0], CommandResult::TooLargeToKeep);
        let meta_len = engine.meta().unwrap().unwrap().len();
        assert!(meta_len < 512 * 1024, "meta {meta_len} bytes");

        // 3. Sequence reused for a different command: refused, not applied.
        let put = Command::Write {
            session: Some(Session {
                client_id: 6_000_000,
                sequence: 1,
                first_incomplete: 1,
            }),
            ops: vec![upsert(b"n".to_vec(), UpsertOp::Add(1))],
        };
        let txn = Command::Txn {
            session: put.session(),
            compares: vec![],
            success: vec![TxnOp::Write(upsert(b"n".to_vec(), UpsertOp::Add(100)))],
            failure: vec![],
        };
        let r = sm
            .apply(vec![entry(7, vec![put.clone(), txn, put])])
            .await
            .unwrap();
        assert_eq!(
            r[0].results,
            vec![
                CommandResult::Written,
                CommandResult::SequenceReused,
                CommandResult::Written
            ]
        );
        assert_eq!(n(&engine), Some(2i64.to_le_bytes().to_vec()));
    }
}
