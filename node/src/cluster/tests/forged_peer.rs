//! Issue 14, items 1-3: a small client that speaks the peer protocol (`ftkv.raft.v1.Raft` with
//! postcard-encoded openraft requests) sends what a hostile process on the peer network could:
//! a Vote at term `u64::MAX` (shared case 01, byte for byte), Votes and AppendEntries from ids
//! outside the membership, and a damaged snapshot stream. Every node must refuse them, keep its
//! term, vote and leader, stay up, and restart.

use ftkv_proto::raft::v1::raft_client::RaftClient;
use ftkv_proto::raft::v1::RaftMessage;
use openraft::raft::{AppendEntriesRequest, InstallSnapshotRequest, VoteRequest};

use super::*;
use crate::cluster::types::{EntryCommands, LogId, Vote};

/// shared/cases/01-forged-peer-vote.md: `VoteRequest { vote: (term u64::MAX, node 99,
/// uncommitted), last_log_id: Some((u64::MAX, 99), index 2^63) }` as postcard bytes.
const CASE_01_VOTE: [u8; 35] = [
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x63, 0x00, 0x01, 0xff, 0xff, 0xff, 0xff,
    0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x63, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01,
    0x00,
];

async fn peer_client(addr: &str) -> RaftClient<tonic::transport::Channel> {
    RaftClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
        .max_decoding_message_size(64 << 20)
        .max_encoding_message_size(64 << 20)
}

fn message(from: u64, payload: Vec<u8>) -> tonic::Request<RaftMessage> {
    tonic::Request::new(RaftMessage {
        payload,
        from,
        is_error: false,
        cluster_id: 0,
    })
}

struct Three {
    dirs: Vec<tempfile::TempDir>,
    addrs: Vec<String>,
    nodes: Vec<Option<TestNode>>,
}

impl Three {
    async fn start(snapshot_every_entries: u64) -> Three {
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let ls = listeners(3).await;
        let addrs: Vec<String> = ls.iter().map(|(_, a)| a.clone()).collect();
        let mut nodes = Vec::new();
        for (i, (l, addr)) in ls.into_iter().enumerate() {
            let cfg = config(i as u64 + 1, dirs[i].path(), &addr, snapshot_every_entries);
            nodes.push(Some(start_node(cfg, fractal(dirs[i].path()), l).await));
        }
        let peers: BTreeMap<u64, String> = addrs
            .iter()
            .enumerate()
            .map(|(i, a)| (i as u64 + 1, a.clone()))
            .collect();
        nodes[0]
            .as_ref()
            .unwrap()
            .node
            .initialize(peers, 10_000)
            .await
            .unwrap();
        Three { dirs, addrs, nodes }
    }

    fn node(&self, id: u64) -> ClusterNode {
        self.nodes[(id - 1) as usize].as_ref().unwrap().node.clone()
    }

    fn all(&self) -> Vec<ClusterNode> {
        self.nodes.iter().flatten().map(|n| n.node.clone()).collect()
    }

    async fn leader(&self) -> ClusterNode {
        let all = self.all();
        let id = wait_for_leader(&all.iter().collect::<Vec<_>>(), Duration::from_secs(20)).await;
        self.node(id)
    }

    async fn restart(&mut self, id: u64) {
        let i = (id - 1) as usize;
        if let Some(n) = self.nodes[i].take() {
            n.stop().await;
        }
        let l = TcpListener::bind(&self.addrs[i]).await.unwrap();
        let cfg = config(id, self.dirs[i].path(), &self.addrs[i], 50);
        self.nodes[i] = Some(start_node(cfg, fractal(self.dirs[i].path()), l).await);
    }

    async fn stop(self) {
        for n in self.nodes.into_iter().flatten() {
            n.stop().await;
        }
    }
}

async fn put(node: &ClusterNode, key: &str) {
    let cmd = Command::Write {
        session: None,
        ops: vec![WriteOp::Put {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
        }],
    };
    node.write(cmd).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forged_votes_and_entries_are_refused_and_every_node_stays_up() {
    let mut three = Three::start(100_000).await;
    let leader = three.leader().await;
    put(&leader, "before").await;
    let before = leader.status();
    let vote: VoteRequest<u64> = postcard::from_bytes(&CASE_01_VOTE).unwrap();
    assert_eq!(
        vote.vote.leader_id.term,
        u64::MAX,
        "the case's bytes decode as described"
    );

    for addr in three.addrs.clone() {
        let mut c = peer_client(&addr).await;
        // Case 01 byte for byte: refused as out of range.
        let err = c.vote(message(99, CASE_01_VOTE.to_vec())).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        // A huge but representable term from an unknown id: refused as not a member.
        let huge = VoteRequest::new(Vote::new(1_000_000_000_000, 99), None);
        let err = c
            .vote(message(99, postcard::to_stdvec(&huge).unwrap()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
        // A member's id speaking for an unknown candidate.
        let err = c
            .vote(message(1, postcard::to_stdvec(&huge).unwrap()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err}");
        // A forged leader 99 with a forged committed entry right after the real log.
        let last = three.node(1).inner.raft.metrics().borrow().last_applied;
        let forged_id: LogId = openraft::LogId::new(
            openraft::CommittedLeaderId::new(1_000_000_000_000, 99),
            last.map_or(0, |l| l.index + 1),
        );
        let forged = AppendEntriesRequest::<TypeConfig> {
            vote: Vote::new_committed(1_000_000_000_000, 99),
            prev_log_id: last,
            entries: vec![openraft::Entry {
                log_id: forged_id,
                payload: openraft::EntryPayload::Normal(EntryCommands {
                    commands: vec![Command::Write {
                        session: None,
                        ops: vec![WriteOp::Put {
                            key: b"forged".to_vec(),
                            value: b"evil".to_vec(),
                        }],
                    }],
                }),
            }],
            leader_commit: Some(forged_id),
        };
        let err = c
            .append_entries(message(99, postcard::to_stdvec(&forged).unwrap()))
            .await
            .unwrap_err();
        assert_eq!(err.code(), tonic::Code::PermissionDenied, "{err}");
    }

    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = leader.status();
    assert_eq!(after.role, "leader");
    assert_eq!(after.term, before.term, "no forged term reached the leader");
    for n in three.all() {
        let s = n.status();
        assert_ne!(s.role, "shutdown", "node {} stopped", s.node_id);
        assert_eq!(s.term, before.term, "node {} changed term", s.node_id);
        assert_eq!(s.leader_id, Some(before.node_id));
    }
    put(&leader, "after").await;
    leader.read_barrier().await.unwrap();
    for n in three.all() {
        assert_eq!(n.engine().get(b"forged").unwrap(), None);
    }
    // Nothing poisoned was saved: every node restarts and the cluster serves.
    for id in 1..=3 {
        three.restart(id).await;
    }
    let leader = three.leader().await;
    put(&leader, "restarted").await;
    three.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_damaged_snapshot_stream_is_discarded_and_the_follower_keeps_running() {
    let three = Three::start(50).await;
    let leader = three.leader().await;
    for i in 0..120 {
        put(&leader, &format!("k{i:04}")).await;
    }
    // The leader's own snapshot file, damaged in transit: one bit of its body flipped.
    let leader_id = leader.status().node_id;
    let snap_path = three.dirs[(leader_id - 1) as usize]
        .path()
        .join("snapshots")
        .join(snapshot::CURRENT_FILE);
    let meta = leader
        .inner
        .state_machine
        .snapshots()
        .verify_file(&snap_path)
        .unwrap();
    let mut bytes = std::fs::read(&snap_path).unwrap();
    let n = bytes.len();
    bytes[n - 12] ^= 0x10;
    let follower = (1..=3).find(|&id| id != leader_id).unwrap();
    let follower_node = three.node(follower);
    let before = follower_node.status();
    let vote = leader.inner.raft.metrics().borrow().vote;
    let mut c = peer_client(&three.addrs[(follower - 1) as usize]).await;
    let half = n / 2;
    for (offset, chunk, done) in [(0, &bytes[..half], false), (half, &bytes[half..], true)] {
        let req = InstallSnapshotRequest::<TypeConfig> {
            vote,
            meta: meta.clone(),
            offset: offset as u64,
            data: chunk.to_vec(),
            done,
        };
        let resp = c
            .install_snapshot(message(leader_id, postcard::to_stdvec(&req).unwrap()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            resp.is_error, done,
            "only the finished, damaged stream is refused"
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = follower_node.status();
    assert_ne!(
        after.role, "shutdown",
        "the follower's Raft core must keep running"
    );
    assert!(after.applied_index >= before.applied_index);
    let dir = three.dirs[(follower - 1) as usize].path().join("snapshots");
    let leftovers: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("receiving-"))
        .collect();
    assert!(leftovers.is_empty(), "damaged stream discarded: {leftovers:?}");
    put(&leader, "still-replicating").await;
    tokio::time::timeout(Duration::from_secs(10), async {
        while follower_node
            .engine()
            .get(b"still-replicating")
            .unwrap()
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the follower still replicates");
    three.stop().await;
}
