//! Unit tests of the state machine: apply, sessions, snapshots and installs.

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_state_is_applied_persisted_and_carried_by_snapshots() {
    use crate::auth::{AuthOp, AuthRefusalKind, PermType, Permission};
    let dir = tempfile::tempdir().unwrap();
    let engine = Arc::new(ModelEngine::new());
    let mut sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
    let r = sm
        .apply(vec![
            entry(
                1,
                vec![
                    Command::Auth(AuthOp::Enable {
                        signing_key: vec![1; 32],
                    }),
                    Command::Auth(AuthOp::UserAdd {
                        name: "root".into(),
                        password_hash: "h".into(),
                    }),
                    Command::Auth(AuthOp::RoleAdd { name: "root".into() }),
                    Command::Auth(AuthOp::UserGrantRole {
                        user: "root".into(),
                        role: "root".into(),
                    }),
                ],
            ),
            entry(
                2,
                vec![
                    Command::Auth(AuthOp::Enable {
                        signing_key: vec![2; 32],
                    }),
                    Command::Auth(AuthOp::RoleAdd { name: "app".into() }),
                    Command::Auth(AuthOp::RoleGrantPermission {
                        role: "app".into(),
                        perm: Permission {
                            perm_type: PermType::Read,
                            key: b"a".to_vec(),
                            range_end: Vec::new(),
                        },
                    }),
                ],
            ),
        ])
        .await
        .unwrap();
    // The first enable came before root existed: refused, nothing changed; the second took.
    match &r[0].results[0] {
        CommandResult::AuthRefused(refusal) => assert_eq!(refusal.kind, AuthRefusalKind::FailedPrecondition),
        other => panic!("enable without root: {other:?}"),
    }
    assert!(matches!(r[1].results[0], CommandResult::AuthApplied { .. }));
    let state = sm.auth();
    assert!(state.enabled && state.is_root("root"));
    assert_eq!(state.signing_key, vec![2; 32]);
    assert_eq!(state.roles["app"].permissions.len(), 1);

    // Reopened over the same engine: the same state (it is an engine key, written with the
    // entry that changed it).
    let mut reopened = StateMachine::open(engine.clone(), dir.path()).unwrap();
    assert_eq!(reopened.auth(), state);

    // Installed from a snapshot on a fresh state machine: the same state.
    let snap = reopened
        .get_snapshot_builder()
        .await
        .build_snapshot()
        .await
        .unwrap();
    let dir2 = tempfile::tempdir().unwrap();
    let mut follower = StateMachine::open(Arc::new(ModelEngine::new()), dir2.path()).unwrap();
    assert!(!follower.auth().enabled);
    follower
        .install_snapshot(&snap.meta, snap.snapshot)
        .await
        .unwrap();
    assert_eq!(follower.auth(), state);
}
