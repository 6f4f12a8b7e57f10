//! Issue 14 item 13: the incrementally persisted session table is the table.
//!
//! A property test drives a state machine (sessions persisted as their own engine keys, only the
//! changed ones written per round) and a model (the same apply path over an in-memory table that
//! is never persisted) with random sequences of apply rounds (new writes, retries, acknowledged
//! windows, Txn results of every size, floods of new clients that force LRU evictions and
//! tombstone drops, log-index jumps that expire idle clients), restarts and snapshot installs.
//! After every step the table read back from the engine's keys, encoded whole, equals the
//! model's whole-table encoding, and so does the state machine's own table; every result and the
//! client data agree too.

use std::collections::BTreeMap;

use ftkv_engine::model::ModelEngine;
use ftkv_engine::{Engine, UpsertOp, WriteOp};
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine};
use openraft::EntryPayload;
use proptest::prelude::*;

use super::super::apply::{apply_command, ApplyBatch};
use super::super::command::{upsert, Command, CommandResult, Session, TxnOp};
use super::super::reserved_keys::is_reserved;
use super::super::session::{SessionTable, SESSION_IDLE_ENTRIES};
use super::super::state_machine::{decode_meta, StateMachine};
use super::super::types::{Entry, EntryCommands};

/// One command of a round, as drawn.
#[derive(Debug, Clone)]
struct Drawn {
    client: usize,
    /// Retry an earlier sequence of the client instead of writing a new one.
    retry: bool,
    /// How far behind the client's acknowledged window lags (0 = everything below acked).
    ack_lag: u64,
    /// 0: counter add; 1: put a value of `size` bytes; 2: Txn reading it back.
    kind: u8,
    size: usize,
}

#[derive(Debug, Clone)]
enum Step {
    Round(Vec<Drawn>),
    /// One entry of this many commands from clients never seen before.
    Flood(usize),
    /// The next entry is far ahead in the log: idle clients expire.
    Jump,
    Restart,
    Snapshot,
}

const POOL: usize = 6;

fn drawn() -> impl Strategy<Value = Drawn> {
    (
        0..POOL,
        any::<bool>(),
        0u64..4,
        0u8..3,
        prop_oneof![0usize..64, 3000usize..6000],
    )
        .prop_map(|(client, retry, ack_lag, kind, size)| Drawn {
            client,
            retry,
            ack_lag,
            kind,
            size,
        })
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        6 => prop::collection::vec(drawn(), 1..12).prop_map(Step::Round),
        1 => (100usize..5_000).prop_map(Step::Flood),
        1 => Just(Step::Jump),
        2 => Just(Step::Restart),
        2 => Just(Step::Snapshot),
    ]
}

/// The same apply path over an in-memory table that is never persisted.
struct Model {
    engine: ModelEngine,
    sessions: SessionTable,
}

impl Model {
    fn apply(&mut self, index: u64, commands: Vec<Command>) -> Vec<CommandResult> {
        let mut batch = ApplyBatch::new(&self.engine);
        let results = commands
            .into_iter()
            .map(|c| apply_command(&mut batch, &mut self.sessions, c, index).unwrap())
            .collect();
        let ops = std::mem::take(&mut batch.ops);
        self.engine.write(&ops, None).unwrap();
        // The model keeps no persisted form: drop its change notes.
        self.sessions.take_changes(&mut Vec::new()).unwrap();
        results
    }
}

fn entry(index: u64, commands: Vec<Command>) -> Entry {
    Entry {
        log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
        payload: EntryPayload::Normal(EntryCommands { commands }),
    }
}

/// Client data only (the reserved keys hold the sessions).
fn client_data(engine: &ModelEngine) -> BTreeMap<Vec<u8>, Vec<u8>> {
    engine
        .snapshot()
        .into_iter()
        .filter(|(k, _)| !is_reserved(k))
        .collect()
}

/// The table as the engine's keys and metadata hold it.
fn persisted_table(engine: &ModelEngine) -> SessionTable {
    let meta = engine
        .meta()
        .unwrap()
        .map(|bytes| decode_meta(&bytes).unwrap())
        .unwrap_or_default();
    SessionTable::load(engine, meta.next_session_sweep_index).unwrap()
}

struct Driver {
    sm: StateMachine,
    engine: std::sync::Arc<ModelEngine>,
    dirs: Vec<tempfile::TempDir>,
    model: Model,
    index: u64,
    /// Per pool client: its id and the next sequence it will use.
    clients: Vec<(u64, u64)>,
    next_fresh_id: u64,
}

impl Driver {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let engine = std::sync::Arc::new(ModelEngine::new());
        let sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
        Driver {
            sm,
            engine,
            dirs: vec![dir],
            model: Model {
                engine: ModelEngine::new(),
                sessions: SessionTable::default(),
            },
            index: 0,
            clients: (0..POOL).map(|i| (1 + i as u64 * 7_919, 1)).collect(),
            next_fresh_id: 1_000_000,
        }
    }

    fn command(&mut self, d: &Drawn) -> Command {
        let (id, next) = self.clients[d.client];
        let sequence = if d.retry && next > 1 {
            1 + (d.size as u64 % (next - 1))
        } else {
            self.clients[d.client].1 += 1;
            next
        };
        let first_incomplete = sequence.saturating_sub(d.ack_lag).max(1);
        let session = Some(Session {
            client_id: id,
            sequence,
            first_incomplete,
        });
        let key = format!("k/{}", d.client).into_bytes();
        match d.kind {
            0 => Command::Write {
                session,
                ops: vec![upsert(b"counter".to_vec(), UpsertOp::Add(1))],
            },
            1 => Command::Write {
                session,
                ops: vec![WriteOp::Put {
                    key,
                    value: vec![d.size as u8; d.size],
                }],
            },
            _ => Command::Txn {
                session,
                compares: vec![],
                success: vec![TxnOp::Get { key }],
                failure: vec![],
            },
        }
    }

    async fn apply(&mut self, commands: Vec<Command>) {
        self.index += 1;
        let want = self.model.apply(self.index, commands.clone());
        let got = self.sm.apply(vec![entry(self.index, commands)]).await.unwrap();
        assert_eq!(got[0].results, want, "results at index {}", self.index);
    }

    async fn run(&mut self, step: &Step) {
        match step {
            Step::Round(drawn) => {
                let commands = drawn.iter().map(|d| self.command(d)).collect();
                self.apply(commands).await;
            }
            Step::Flood(n) => {
                let commands = (0..*n)
                    .map(|_| {
                        self.next_fresh_id += 1;
                        Command::Write {
                            session: Some(Session {
                                client_id: self.next_fresh_id,
                                sequence: 1,
                                first_incomplete: 1,
                            }),
                            ops: vec![],
                        }
                    })
                    .collect();
                self.apply(commands).await;
            }
            Step::Jump => self.index += SESSION_IDLE_ENTRIES + 5_000,
            Step::Restart => {
                let dir = self.dirs.last().unwrap().path().to_path_buf();
                self.sm = StateMachine::open(self.engine.clone(), &dir).unwrap();
            }
            Step::Snapshot => {
                let snap = self
                    .sm
                    .get_snapshot_builder()
                    .await
                    .build_snapshot()
                    .await
                    .unwrap();
                let dir = tempfile::tempdir().unwrap();
                let engine = std::sync::Arc::new(ModelEngine::new());
                let mut follower = StateMachine::open(engine.clone(), dir.path()).unwrap();
                follower
                    .install_snapshot(&snap.meta, snap.snapshot)
                    .await
                    .unwrap();
                assert_eq!(engine.snapshot(), self.engine.snapshot(), "installed copy");
                self.sm = follower;
                self.engine = engine;
                self.dirs.push(dir);
            }
        }
    }

    fn check(&self, what: &str) {
        let whole = postcard::to_stdvec(&self.model.sessions).unwrap();
        let persisted = persisted_table(&self.engine);
        assert!(
            postcard::to_stdvec(&persisted).unwrap() == whole,
            "persisted table after {what}"
        );
        assert!(persisted == self.model.sessions, "persisted table after {what}");
        let live = self.sm.session_table();
        assert!(
            postcard::to_stdvec(&live).unwrap() == whole,
            "live table after {what}"
        );
        assert_eq!(
            client_data(&self.engine),
            client_data(&self.model.engine),
            "data after {what}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn incremental_session_table_equals_the_whole_table(steps in prop::collection::vec(step(), 1..14)) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut d = Driver::new();
            for (i, s) in steps.iter().enumerate() {
                d.run(s).await;
                d.check(&format!("step {i} {}", match s {
                    Step::Round(r) => format!("round of {}", r.len()),
                    other => format!("{other:?}"),
                }));
            }
        });
    }
}

/// A fixed sequence through every kind of change (evictions, tombstones and their drop,
/// expiry, restarts, snapshots), so each is exercised whatever proptest draws.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_session_change_persists() {
    let mut d = Driver::new();
    let round = |client, kind, size| Drawn {
        client,
        retry: false,
        ack_lag: 2,
        kind,
        size,
    };
    let steps = [
        Step::Round((0..POOL).map(|c| round(c, 1, 5000)).collect()),
        Step::Round((0..POOL).map(|c| round(c, 2, 0)).collect()),
        Step::Flood(4_500),
        Step::Restart,
        Step::Flood(4_500),
        Step::Snapshot,
        Step::Round(vec![round(0, 0, 0)]),
        Step::Jump,
        Step::Round(vec![round(1, 0, 0)]),
        Step::Restart,
        Step::Round((0..POOL).map(|c| round(c, 0, 0)).collect()),
    ];
    for (i, s) in steps.iter().enumerate() {
        d.run(s).await;
        d.check(&format!("step {i}"));
    }
    let t = d.sm.session_table();
    assert!(!t.evicted.is_empty());
    assert!(t.client_count() <= super::super::session::MAX_CLIENTS);
}

/// The state machine's own guard, for commands the server did not build: a command naming a
/// reserved key is refused whole, and unbounded ranges stop before the sessions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_cannot_reach_the_reserved_keys() {
    use super::super::reserved_keys::RESERVED_KEY_PREFIX;
    use super::super::session_store::session_key;
    let dir = tempfile::tempdir().unwrap();
    let engine = std::sync::Arc::new(ModelEngine::new());
    let mut sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
    let session = Session {
        client_id: 42,
        sequence: 1,
        first_incomplete: 1,
    };
    let add = Command::Write {
        session: Some(session),
        ops: vec![upsert(b"n".to_vec(), UpsertOp::Add(1))],
    };
    sm.apply(vec![entry(1, vec![add.clone()])]).await.unwrap();
    let stored = engine.get(&session_key(42)).unwrap();
    assert!(stored.is_some());
    let reserved = session_key(42);
    let refused = [
        vec![WriteOp::Put {
            key: reserved.clone(),
            value: b"x".to_vec(),
        }],
        vec![WriteOp::Delete {
            key: reserved.clone(),
        }],
        vec![upsert(reserved.clone(), UpsertOp::Append(b"x".to_vec()))],
        vec![WriteOp::DeleteRange {
            start: RESERVED_KEY_PREFIX.to_vec(),
            end: None,
        }],
        vec![
            WriteOp::Put {
                key: b"marker".to_vec(),
                value: b"x".to_vec(),
            },
            WriteOp::Delete {
                key: reserved.clone(),
            },
        ],
    ];
    let mut commands: Vec<Command> = refused
        .into_iter()
        .map(|ops| Command::Write { session: None, ops })
        .collect();
    commands.push(Command::Txn {
        session: None,
        compares: vec![],
        success: vec![TxnOp::Get { key: b"n".to_vec() }],
        failure: vec![TxnOp::Get {
            key: reserved.clone(),
        }],
    });
    let n = commands.len();
    let r = sm.apply(vec![entry(2, commands)]).await.unwrap();
    assert_eq!(r[0].results, vec![CommandResult::ReservedKey; n]);
    assert_eq!(
        engine.get(b"marker").unwrap(),
        None,
        "a refused command applies nothing"
    );
    // Unbounded ranges cover every client key and stop before the sessions.
    let everything = Command::Write {
        session: None,
        ops: vec![
            WriteOp::UpsertRange {
                start: vec![],
                end: None,
                op: UpsertOp::Append(b"!".to_vec()),
            },
            WriteOp::DeleteRange {
                start: vec![],
                end: Some(vec![0xFF, 0xFF, 0xFF]),
            },
        ],
    };
    let r = sm.apply(vec![entry(3, vec![everything])]).await.unwrap();
    assert_eq!(r[0].results, vec![CommandResult::Written]);
    assert_eq!(client_data(&engine), BTreeMap::new());
    assert_eq!(engine.get(&session_key(42)).unwrap(), stored);
    // The session still answers the retry, also after a restart.
    let mut sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
    let r = sm.apply(vec![entry(4, vec![add])]).await.unwrap();
    assert_eq!(r[0].results, vec![CommandResult::Written]);
    assert_eq!(engine.get(b"n").unwrap(), None, "the retry was applied again");
}

/// Metadata of the format that kept the whole table in the blob (version 1) is refused with a
/// message saying what to do, not misread.
#[test]
fn metadata_of_the_old_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let engine = std::sync::Arc::new(ModelEngine::new());
    engine.write(&[], Some(&[1, 0, 0, 0, 0])).unwrap();
    let err = match StateMachine::open(engine, dir.path()) {
        Ok(_) => panic!("old metadata accepted"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("version 1") && err.contains("wipe the data directory"),
        "{err}"
    );
}
