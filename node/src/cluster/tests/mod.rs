//! Tests of the cluster layer: openraft's storage conformance suite against the real log store
//! and state machine (acceptance 5), and in-process three-node clusters over loopback gRPC
//! (batched writes, linearizable reads, failover, exactly-once, snapshot catch-up).
#![allow(clippy::unwrap_used)]

mod bulk_replay;
mod drain;
mod forged_peer;
mod no_space;
mod session_model;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ftkv_engine::model::ModelEngine;
use ftkv_engine::sled_engine::SledEngine;
use ftkv_engine::{Engine, EngineOptions, UpsertOp, WriteOp};
use openraft::testing::{StoreBuilder, Suite};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use super::command::upsert;
use super::log_store::LogStore;
use super::state_machine::StateMachine;
use super::types::{StorageError, TypeConfig};
use super::*;

// ---------------------------------------------------------------- storage conformance suite

#[derive(Clone, Copy)]
enum SuiteEngine {
    Model,
    Sled,
    Fractal,
}

struct SuiteBuilder {
    engine: SuiteEngine,
}

impl StoreBuilder<TypeConfig, LogStore, StateMachine, tempfile::TempDir> for SuiteBuilder {
    async fn build(&self) -> Result<(tempfile::TempDir, LogStore, StateMachine), StorageError> {
        let dir = tempfile::tempdir().map_err(|e| types::write_error(openraft::ErrorSubject::Store, e))?;
        let opts = ftkv_log::LogOptions {
            segment_size_bytes: 1 << 20,
            sync: ftkv_log::SyncMode::Always,
        };
        let log = ftkv_log::Log::open(Arc::new(ftkv_vfs::RealVfs), &dir.path().join("log"), opts)
            .map_err(|e| types::write_error(openraft::ErrorSubject::Store, e))?;
        // openraft's suite purges logs the state machine never saw: the log store is tested on
        // its own contract here, with every index durable.
        let (_, durable) = tokio::sync::watch::channel(state_machine::Durable {
            index: u64::MAX,
            failed: None,
        });
        let log_store = LogStore::new(log, 1 << 20, false, durable)?;
        let to_err = |e: ftkv_engine::EngineError| types::write_error(openraft::ErrorSubject::Store, e);
        let opts = EngineOptions {
            dir: dir.path().join("engine"),
            cache_size_bytes: 16 << 20,
            compression_level: None,
        };
        let engine: Arc<dyn Engine> = match self.engine {
            SuiteEngine::Model => Arc::new(ModelEngine::new()),
            SuiteEngine::Sled => Arc::new(SledEngine::open(&opts).map_err(to_err)?),
            SuiteEngine::Fractal => Arc::new(
                ftkv_engine::FractalEngine::open(Arc::new(ftkv_vfs::RealVfs), &opts).map_err(to_err)?,
            ),
        };
        let sm = StateMachine::open(engine, &dir.path().join("snapshots"))?;
        Ok((dir, log_store, sm))
    }
}

#[test]
fn openraft_storage_suite_model_engine() {
    Suite::test_all(SuiteBuilder {
        engine: SuiteEngine::Model,
    })
    .unwrap();
}

#[test]
fn openraft_storage_suite_sled_engine() {
    Suite::test_all(SuiteBuilder {
        engine: SuiteEngine::Sled,
    })
    .unwrap();
}

#[test]
fn openraft_storage_suite_fractal_engine() {
    Suite::test_all(SuiteBuilder {
        engine: SuiteEngine::Fractal,
    })
    .unwrap();
}

// ---------------------------------------------------------------- in-process clusters

struct TestNode {
    node: ClusterNode,
    stop_server: Option<oneshot::Sender<()>>,
    server: tokio::task::JoinHandle<()>,
}

impl TestNode {
    async fn stop(mut self) {
        self.node.shutdown().await.unwrap();
        if let Some(tx) = self.stop_server.take() {
            let _ = tx.send(());
        }
        let _ = self.server.await;
    }
}

fn config(id: u64, dir: &Path, peer: &str, snapshot_every_entries: u64) -> ClusterConfig {
    ClusterConfig {
        node_id: id,
        addr: NodeAddr {
            client: format!("client-of-{id}:7379"),
            peer: peer.to_string(),
        },
        data_dir: dir.to_path_buf(),
        log_sync: ftkv_log::SyncMode::Always,
        log_segment_size_bytes: 4 << 20,
        ack: AckPolicy::Quorum,
        ack_all_timeout_ms: 2_000,
        heartbeat_interval_ms: 150,
        election_timeout_min_ms: 1_000,
        election_timeout_max_ms: 2_000,
        snapshot_every_entries,
        max_in_snapshot_log_to_keep: 0,
        batch_max_ops: 1_000,
        batch_max_bytes: 4 << 20,
        batch_max_in_flight: 2,
        peer_max_message_bytes: 64 << 20,
        unsafe_local_reads: false,
        unsafe_ack_before_fsync: false,
        lose_unsynced_on_kill: false,
        lose_unsynced_sync_latency_ms: 0,
        space: crate::space::SpaceOptions {
            check_interval_ms: 1_000,
            ..Default::default()
        },
        peer_tls: None,
        loader_memory_bytes: crate::cluster::bulk::DEFAULT_LOADER_MEMORY_BYTES,
    }
}

async fn start_node(cfg: ClusterConfig, engine: Arc<dyn Engine>, listener: TcpListener) -> TestNode {
    let node = ClusterNode::start(cfg, engine).await.unwrap();
    let service = node.peer_service();
    let (tx, rx) = oneshot::channel::<()>();
    let incoming = futures::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(s, _)| s), l))
    });
    let server = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = rx.await;
            })
            .await;
    });
    TestNode {
        node,
        stop_server: Some(tx),
        server,
    }
}

async fn listeners(n: usize) -> Vec<(TcpListener, String)> {
    let mut out = Vec::new();
    for _ in 0..n {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap().to_string();
        out.push((l, addr));
    }
    out
}

async fn wait_for_leader(nodes: &[&ClusterNode], timeout: Duration) -> u64 {
    let deadline = Instant::now() + timeout;
    loop {
        for n in nodes {
            let s = n.status();
            if s.role == "leader" {
                return s.node_id;
            }
        }
        assert!(Instant::now() < deadline, "no leader within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts nodes 1..=3 on model engines in `dirs` (not yet initialized); returns them and the
/// peer map to initialize with.
async fn start_three_model_nodes(dirs: &[tempfile::TempDir]) -> (Vec<TestNode>, BTreeMap<u64, String>) {
    let ls = listeners(3).await;
    let peers: BTreeMap<u64, String> = ls
        .iter()
        .enumerate()
        .map(|(i, (_, a))| (i as u64 + 1, a.clone()))
        .collect();
    let mut nodes = Vec::new();
    for (i, (l, addr)) in ls.into_iter().enumerate() {
        let id = i as u64 + 1;
        let cfg = config(id, dirs[i].path(), &addr, 100_000);
        nodes.push(start_node(cfg, Arc::new(ModelEngine::new()), l).await);
    }
    (nodes, peers)
}

fn counter(engine: &dyn Engine, key: &[u8]) -> i64 {
    let v = engine.get(key).unwrap().expect("counter present");
    i64::from_le_bytes(v.try_into().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_nodes_batched_writes_reads_failover_exactly_once() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let (started, peers) = start_three_model_nodes(&dirs).await;
    let mut nodes: Vec<Option<TestNode>> = started.into_iter().map(Some).collect();
    let node = |i: usize, nodes: &Vec<Option<TestNode>>| nodes[i].as_ref().unwrap().node.clone();
    node(0, &nodes).initialize(peers.clone(), 10_000).await.unwrap();
    // Idempotent.
    node(0, &nodes).initialize(peers.clone(), 10_000).await.unwrap();
    let all: Vec<ClusterNode> = (0..3).map(|i| node(i, &nodes)).collect();
    let leader_id = wait_for_leader(&all.iter().collect::<Vec<_>>(), Duration::from_secs(15)).await;
    let leader = all[(leader_id - 1) as usize].clone();
    assert_eq!(leader.members().len(), 3);
    assert!(leader.members().iter().all(|m| m.is_voter));

    // Many concurrent writers through the batcher.
    let tasks = 128u64;
    let per_task = 100u64;
    let started = Instant::now();
    let mut handles = Vec::new();
    for t in 0..tasks {
        let leader = leader.clone();
        handles.push(tokio::spawn(async move {
            for i in 0..per_task {
                let key = format!("k-{t:03}-{i:04}").into_bytes();
                let cmd = Command::Write {
                    session: Some(Session {
                        client_id: t + 1,
                        sequence: i + 1,
                        first_incomplete: i + 1,
                    }),
                    ops: vec![
                        WriteOp::Put {
                            key,
                            value: vec![b'v'; 32],
                        },
                        upsert(b"total".to_vec(), UpsertOp::Add(1)),
                    ],
                };
                let (r, index) = leader.write(cmd).await.unwrap();
                assert_eq!(r, CommandResult::Written);
                assert!(index > 0);
            }
        }));
    }
    for h in handles {
        h.await.unwrap();
    }
    let elapsed = started.elapsed();
    let writes = tasks * per_task;
    let status = leader.status();
    eprintln!(
        "in-process 3-node: {writes} writes in {elapsed:?} = {:.0} writes/s, {:.1} ops/entry",
        writes as f64 / elapsed.as_secs_f64(),
        status.ops_per_entry
    );
    assert!(status.ops_per_entry >= 1.0);
    eprintln!("leader log counters: {:?}", leader.inner.log_store.log().stats());

    // Linearizable read on the leader sees every acknowledged write.
    let read_index = leader.read_barrier().await.unwrap();
    assert!(read_index >= status.applied_index.min(read_index));
    assert_eq!(
        counter(leader.engine().as_ref(), b"total"),
        (tasks * per_task) as i64
    );
    let reads_started = Instant::now();
    for _ in 0..100 {
        leader.read_barrier().await.unwrap();
    }
    eprintln!(
        "sequential read barriers: {:?} each",
        reads_started.elapsed() / 100
    );
    // Concurrent readers share rounds and all succeed.
    let mut readers = Vec::new();
    for _ in 0..32 {
        let leader = leader.clone();
        readers.push(tokio::spawn(async move { leader.read_barrier().await.unwrap() }));
    }
    for r in readers {
        assert!(r.await.unwrap() >= read_index);
    }

    // Followers refuse writes and linearizable reads with the leader's client address.
    let follower = all
        .iter()
        .find(|n| n.status().node_id != leader_id)
        .unwrap()
        .clone();
    let err = follower
        .write(Command::Write {
            session: None,
            ops: vec![],
        })
        .await
        .unwrap_err();
    match err {
        ClusterError::NotLeader {
            leader_id: Some(id),
            leader_client_addr: Some(addr),
        } => {
            assert_eq!(id, leader_id);
            assert_eq!(addr, format!("client-of-{leader_id}:7379"));
        }
        other => panic!("expected NotLeader, got {other:?}"),
    }
    assert!(matches!(
        follower.read_barrier().await,
        Err(ClusterError::NotLeader { .. })
    ));

    // Exactly-once: the same (client, sequence) Add submitted twice is applied once; a sequence
    // below the acknowledged window is stale.
    let add = |seq: u64, first: u64| Command::Write {
        session: Some(Session {
            client_id: 999,
            sequence: seq,
            first_incomplete: first,
        }),
        ops: vec![upsert(b"once".to_vec(), UpsertOp::Add(5))],
    };
    let (r1, i1) = leader.write(add(1, 1)).await.unwrap();
    let (r2, i2) = leader.write(add(1, 1)).await.unwrap();
    assert_eq!((r1, r2), (CommandResult::Written, CommandResult::Written));
    assert!(i2 > i1);
    leader.read_barrier().await.unwrap();
    assert_eq!(counter(leader.engine().as_ref(), b"once"), 5);
    leader.write(add(2, 2)).await.unwrap();
    assert_eq!(
        leader.write(add(1, 1)).await.unwrap().0,
        CommandResult::StaleSequence
    );
    leader.read_barrier().await.unwrap();
    assert_eq!(counter(leader.engine().as_ref(), b"once"), 10);

    // Every follower applies the same state.
    for n in &all {
        tokio::time::timeout(Duration::from_secs(10), async {
            while counter_opt(n.engine().as_ref(), b"once") != Some(10) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("follower caught up");
        assert_eq!(counter(n.engine().as_ref(), b"total"), (tasks * per_task) as i64);
    }

    // Stop the leader: a new leader serves writes and still holds every acknowledged write.
    nodes[(leader_id - 1) as usize].take().unwrap().stop().await;
    let stopped_at = Instant::now();
    assert!(matches!(
        leader.write(add(3, 3)).await,
        Err(ClusterError::Unavailable(_))
    ));
    let rest: Vec<ClusterNode> = all
        .iter()
        .filter(|n| n.status().node_id != leader_id)
        .cloned()
        .collect();
    let new_leader_id = wait_for_leader(&rest.iter().collect::<Vec<_>>(), Duration::from_secs(20)).await;
    eprintln!(
        "new leader {new_leader_id} elected {:?} after the old leader stopped",
        stopped_at.elapsed()
    );
    assert_ne!(new_leader_id, leader_id);
    let new_leader = rest
        .iter()
        .find(|n| n.status().node_id == new_leader_id)
        .unwrap()
        .clone();
    let (r, _) = new_leader.write(add(3, 3)).await.unwrap();
    assert_eq!(r, CommandResult::Written);
    // The retried sequence 2 is still recognized on the new leader (sessions are replicated).
    let retry = new_leader.write(add(3, 3)).await.unwrap().0;
    assert_eq!(retry, CommandResult::Written);
    new_leader.read_barrier().await.unwrap();
    assert_eq!(counter(new_leader.engine().as_ref(), b"once"), 15);
    assert_eq!(
        counter(new_leader.engine().as_ref(), b"total"),
        (tasks * per_task) as i64
    );

    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

fn counter_opt(engine: &dyn Engine, key: &[u8]) -> Option<i64> {
    engine
        .get(key)
        .unwrap()
        .and_then(|v| v.try_into().ok())
        .map(i64::from_le_bytes)
}

fn sled(dir: &Path) -> Arc<dyn Engine> {
    Arc::new(
        SledEngine::open(&EngineOptions {
            dir: dir.join("engine"),
            cache_size_bytes: 16 << 20,
            compression_level: None,
        })
        .unwrap(),
    )
}

fn fractal(dir: &Path) -> Arc<dyn Engine> {
    let opts = EngineOptions {
        dir: dir.join("engine"),
        cache_size_bytes: 16 << 20,
        compression_level: Some(1),
    };
    Arc::new(ftkv_engine::FractalEngine::open(Arc::new(ftkv_vfs::RealVfs), &opts).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_behind_purge_point_catches_up_by_snapshot_sled() {
    follower_catches_up_by_snapshot(sled).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn follower_behind_purge_point_catches_up_by_snapshot_fractal() {
    follower_catches_up_by_snapshot(fractal).await;
}

async fn follower_catches_up_by_snapshot(engine: fn(&Path) -> Arc<dyn Engine>) {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ls = listeners(3).await;
    let addrs: Vec<String> = ls.iter().map(|(_, a)| a.clone()).collect();
    let peers: BTreeMap<u64, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, a.clone()))
        .collect();
    let mut nodes: Vec<Option<TestNode>> = Vec::new();
    for (i, (l, addr)) in ls.into_iter().enumerate() {
        let cfg = config(i as u64 + 1, dirs[i].path(), &addr, 50);
        nodes.push(Some(start_node(cfg, engine(dirs[i].path()), l).await));
    }
    nodes[0]
        .as_ref()
        .unwrap()
        .node
        .initialize(peers, 10_000)
        .await
        .unwrap();
    let all: Vec<ClusterNode> = nodes.iter().map(|n| n.as_ref().unwrap().node.clone()).collect();
    let leader_id = wait_for_leader(&all.iter().collect::<Vec<_>>(), Duration::from_secs(15)).await;
    let leader = all[(leader_id - 1) as usize].clone();
    // Only `nodes` may hold the follower's handle: its sled engine must close when it stops.
    drop(all);

    // Stop one follower, then write far past the purge point (snapshot every 50 entries, no
    // log kept behind a snapshot).
    let lagging = (0..3).find(|&i| i as u64 + 1 != leader_id).unwrap();
    nodes[lagging].take().unwrap().stop().await;
    for i in 0..400u64 {
        let cmd = Command::Write {
            session: None,
            ops: vec![WriteOp::Put {
                key: format!("s{i:05}").into_bytes(),
                value: i.to_le_bytes().to_vec(),
            }],
        };
        leader.write(cmd).await.unwrap();
    }
    // Wait until the leader has purged its log past the entries the follower lacks.
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let purged = leader.inner.raft.metrics().borrow().purged.map_or(0, |l| l.index);
            if purged > 100 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("leader purged its log");

    // Restart the follower on its old data dir: it must get a snapshot.
    let l = TcpListener::bind(&addrs[lagging]).await.unwrap();
    let cfg = config(lagging as u64 + 1, dirs[lagging].path(), &addrs[lagging], 50);
    let restarted = start_node(cfg, engine(dirs[lagging].path()), l).await;
    let target = leader.status().applied_index;
    tokio::time::timeout(Duration::from_secs(30), async {
        while restarted.node.status().applied_index < target {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("restarted follower caught up");
    let engine = restarted.node.engine();
    for i in [0u64, 199, 399] {
        assert_eq!(
            engine.get(format!("s{i:05}").as_bytes()).unwrap(),
            Some(i.to_le_bytes().to_vec())
        );
    }
    assert!(restarted.node.inner.raft.metrics().borrow().snapshot.is_some());
    restarted.stop().await;
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn restart_without_checkpoint_replays_committed_entries_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (l, addr) = listeners(1).await.pop().unwrap();
    let peers: BTreeMap<u64, String> = [(1u64, addr.clone())].into_iter().collect();
    let engine = Arc::new(ModelEngine::new());
    let node = start_node(config(1, dir.path(), &addr, 1_000_000), engine.clone(), l).await;
    node.node.initialize(peers.clone(), 5_000).await.unwrap();
    wait_for_leader(&[&node.node], Duration::from_secs(10)).await;
    // Concurrent writes of one client: the lowest outstanding sequence is the phase start.
    let add = |seq: u64, first: u64| Command::Write {
        session: Some(Session {
            client_id: 42,
            sequence: seq,
            first_incomplete: first,
        }),
        ops: vec![upsert(b"c".to_vec(), UpsertOp::Add(1))],
    };
    let run_phase = |seqs: std::ops::RangeInclusive<u64>| {
        let n = node.node.clone();
        async move {
            let first = *seqs.start();
            let mut handles = Vec::new();
            for seq in seqs {
                let n = n.clone();
                handles.push(tokio::spawn(
                    async move { n.write(add(seq, first)).await.unwrap() },
                ));
            }
            let mut last_index = 0;
            for h in handles {
                let (result, index) = h.await.unwrap();
                assert_eq!(result, CommandResult::Written);
                last_index = last_index.max(index);
            }
            last_index
        }
    };
    run_phase(1..=150).await;
    // The engine's durable image as of a checkpoint in the middle (data and metadata together).
    let checkpoint_data = engine.snapshot();
    let checkpoint_meta = engine.meta().unwrap().unwrap();
    let last_index = run_phase(151..=300).await;
    assert_eq!(counter(engine.as_ref(), b"c"), 300);
    // "Crash": stop Raft without the shutdown checkpoint and reopen the engine at the older
    // checkpoint; the log (the write-ahead log) must bring it forward exactly once.
    node.node.inner.raft.shutdown().await.unwrap();
    let _ = node.stop_server.unwrap().send(());
    let _ = node.server.await;
    drop(node.node);

    let restored = Arc::new(ModelEngine::new());
    let mut pairs = checkpoint_data.into_iter().map(Ok);
    restored.replace_all(&mut pairs, &checkpoint_meta).unwrap();
    assert_eq!(counter(restored.as_ref(), b"c"), 150);
    let meta = super::state_machine::decode_meta(&checkpoint_meta).unwrap();
    assert!(
        meta.last_applied.unwrap().index < last_index,
        "the restart must replay entries"
    );
    let l = TcpListener::bind(&addr).await.unwrap();
    let node = start_node(config(1, dir.path(), &addr, 1_000_000), restored.clone(), l).await;
    node.node.initialize(peers, 5_000).await.unwrap();
    wait_for_leader(&[&node.node], Duration::from_secs(10)).await;
    node.node.read_barrier().await.unwrap();
    assert!(node.node.status().applied_index >= last_index);
    assert_eq!(counter(restored.as_ref(), b"c"), 300);
    // A retry of an already applied sequence is recognized after the restart.
    assert_eq!(
        node.node.write(add(300, 151)).await.unwrap().0,
        CommandResult::Written
    );
    node.node.read_barrier().await.unwrap();
    assert_eq!(counter(restored.as_ref(), b"c"), 300);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ack_all_waits_for_every_voter_and_reports_not_on_all_replicas() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ls = listeners(3).await;
    let peers: BTreeMap<u64, String> = ls
        .iter()
        .enumerate()
        .map(|(i, (_, a))| (i as u64 + 1, a.clone()))
        .collect();
    let mut nodes: Vec<Option<TestNode>> = Vec::new();
    for (i, (l, addr)) in ls.into_iter().enumerate() {
        let mut cfg = config(i as u64 + 1, dirs[i].path(), &addr, 100_000);
        cfg.ack = AckPolicy::All;
        cfg.ack_all_timeout_ms = 500;
        nodes.push(Some(start_node(cfg, Arc::new(ModelEngine::new()), l).await));
    }
    let leader_id = {
        let all: Vec<ClusterNode> = nodes.iter().map(|n| n.as_ref().unwrap().node.clone()).collect();
        all[0].initialize(peers, 10_000).await.unwrap();
        wait_for_leader(&all.iter().collect::<Vec<_>>(), Duration::from_secs(15)).await
    };
    let leader = nodes[(leader_id - 1) as usize].as_ref().unwrap().node.clone();
    let put = |k: &str| Command::Write {
        session: None,
        ops: vec![WriteOp::Put {
            key: k.as_bytes().to_vec(),
            value: b"v".to_vec(),
        }],
    };
    let (r, index) = leader.write(put("a")).await.unwrap();
    assert_eq!(r, CommandResult::Written);
    // Every node already holds the entry when the write is acknowledged.
    let matched = leader.inner.raft.metrics().borrow().replication.clone().unwrap();
    assert!(
        matched.values().all(|m| m.is_some_and(|l| l.index >= index)),
        "{matched:?}"
    );

    let follower = (0..3).find(|&i| i as u64 + 1 != leader_id).unwrap();
    nodes[follower].take().unwrap().stop().await;
    match leader.write(put("b")).await {
        Err(ClusterError::NotOnAllReplicas { log_index }) => assert!(log_index > index),
        other => panic!("expected NotOnAllReplicas, got {other:?}"),
    }
    // Committed nonetheless (never silently weaker, never lost).
    leader.read_barrier().await.unwrap();
    assert_eq!(leader.engine().get(b"b").unwrap(), Some(b"v".to_vec()));
    for n in nodes.into_iter().flatten() {
        n.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn isolated_leader_serves_no_linearizable_read_and_its_write_is_ambiguous() {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let ls = listeners(3).await;
    let addrs: Vec<String> = ls.iter().map(|(_, a)| a.clone()).collect();
    let peers: BTreeMap<u64, String> = addrs
        .iter()
        .enumerate()
        .map(|(i, a)| (i as u64 + 1, a.clone()))
        .collect();
    let mut nodes: Vec<TestNode> = Vec::new();
    for (i, (l, addr)) in ls.into_iter().enumerate() {
        let cfg = config(i as u64 + 1, dirs[i].path(), &addr, 100_000);
        nodes.push(start_node(cfg, Arc::new(ModelEngine::new()), l).await);
    }
    let all: Vec<ClusterNode> = nodes.iter().map(|n| n.node.clone()).collect();
    all[0].initialize(peers, 10_000).await.unwrap();
    let old_id = wait_for_leader(&all.iter().collect::<Vec<_>>(), Duration::from_secs(15)).await;
    let old = all[(old_id - 1) as usize].clone();
    let put = |k: &str| Command::Write {
        session: None,
        ops: vec![WriteOp::Put {
            key: k.as_bytes().to_vec(),
            value: b"v".to_vec(),
        }],
    };
    old.write(put("before")).await.unwrap();

    // Partition the leader from both followers, in both directions.
    let old_addr = addrs[(old_id - 1) as usize].clone();
    for (i, n) in all.iter().enumerate() {
        if i as u64 + 1 == old_id {
            for a in addrs.iter().filter(|a| **a != old_addr) {
                n.inner.channels.block(a);
            }
        } else {
            n.inner.channels.block(&old_addr);
        }
    }
    let old_write = {
        let old = old.clone();
        tokio::spawn(async move { old.write(put("during")).await })
    };
    // The majority side elects a new leader that serves writes.
    let rest: Vec<ClusterNode> = all
        .iter()
        .filter(|n| n.status().node_id != old_id)
        .cloned()
        .collect();
    let new_id = wait_for_leader(&rest.iter().collect::<Vec<_>>(), Duration::from_secs(20)).await;
    let new = all[(new_id - 1) as usize].clone();
    new.write(put("after")).await.unwrap();
    // The deposed leader must not confirm a linearizable read (it would miss "after").
    assert!(old.read_barrier().await.is_err());
    // Its pending write has no known outcome.
    match old_write.await.unwrap() {
        Err(ClusterError::Ambiguous(_)) | Err(ClusterError::NotLeader { .. }) => {}
        other => panic!("expected an ambiguous (or refused) write, got {other:?}"),
    }

    // Heal: the old leader rejoins as a follower; its unreplicated entry was never committed.
    for n in &all {
        n.inner.channels.unblock_all();
    }
    tokio::time::timeout(Duration::from_secs(20), async {
        while old.status().leader_id != Some(new_id)
            || old.status().applied_index < new.status().applied_index
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("old leader rejoined");
    new.read_barrier().await.unwrap();
    assert_eq!(new.engine().get(b"during").unwrap(), None);
    assert_eq!(old.engine().get(b"during").unwrap(), None);
    assert_eq!(old.engine().get(b"after").unwrap(), Some(b"v".to_vec()));
    drop(all);
    drop(rest);
    for n in nodes {
        n.stop().await;
    }
}
