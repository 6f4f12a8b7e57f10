//! Issue 14 item 13: client sessions live under the reserved key prefix `0xFF 0xFF`, which no
//! client request can read, write, scan or delete, through any API of the node (raw gRPC, so
//! nothing on the client side filters): Get, Put, Delete, Upsert, Write (point ops, DeleteRange,
//! UpsertRange), Txn (compares, gets, writes), Scan and prefix scans. Unbounded ranges stop
//! where the reserved space begins: after an unbounded DeleteRange and UpsertRange, a retried
//! write is still recognized as applied, also after every node restarted (the table is read back
//! from its keys).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use ftkv_proto::v1::kv_client::KvClient;
use ftkv_proto::v1::{
    compare, txn_op, upsert_op, write_op, Compare, DeleteOp, DeleteRangeOp, DeleteRequest, GetRequest, PutOp,
    PutRequest, ScanRequest, Session, TxnGetOp, TxnOp, TxnRequest, UpsertKeyOp, UpsertOp, UpsertRangeOp,
    UpsertRequest, WriteOp, WriteRequest,
};
use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};
use tonic::transport::Channel;

/// A key in the reserved space shaped like a session key (prefix, tag, client id).
fn reserved(tag: u8) -> Vec<u8> {
    let mut k = vec![0xFF, 0xFF, tag];
    k.extend_from_slice(&0x5eed_u64.to_le_bytes());
    k
}

fn add(amount: i64) -> Option<UpsertOp> {
    Some(UpsertOp {
        op: Some(upsert_op::Op::Add(amount)),
    })
}

fn append(bytes: &[u8]) -> Option<UpsertOp> {
    Some(UpsertOp {
        op: Some(upsert_op::Op::Append(bytes.to_vec())),
    })
}

fn assert_refused<T: std::fmt::Debug>(result: Result<tonic::Response<T>, tonic::Status>, what: &str) {
    match result {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::InvalidArgument, "{what}: {status:?}");
            assert!(
                status.message().contains("reserved key space"),
                "{what}: the error should say why: {status:?}"
            );
        }
        Ok(answer) => panic!("{what}: the node accepted a reserved key: {answer:?}"),
    }
}

fn write(op: write_op::Op) -> WriteRequest {
    WriteRequest {
        ops: vec![WriteOp { op: Some(op) }],
        session: None,
    }
}

fn txn(compare: Vec<Compare>, success: Vec<txn_op::Op>) -> TxnRequest {
    TxnRequest {
        compare,
        success: success.into_iter().map(|op| TxnOp { op: Some(op) }).collect(),
        failure: vec![],
        session: None,
    }
}

async fn scan(kv: &mut KvClient<Channel>, start: &[u8], end: &[u8]) -> Vec<Vec<u8>> {
    let page = kv
        .scan(ScanRequest {
            start: start.to_vec(),
            end: end.to_vec(),
            limit: 100_000,
            consistency: 0,
            keys_only: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!page.more);
    page.kvs.into_iter().map(|p| p.key).collect()
}

async fn counter(cluster: &Cluster, key: &[u8]) -> Option<i64> {
    let client = cluster.client().await.unwrap();
    let value = client.get(key).await.unwrap()?;
    Some(i64::from_le_bytes(value.as_slice().try_into().unwrap()))
}

/// Sends `request` to the current leader until one answers (a session makes resending safe):
/// right after a restart leadership may still move.
async fn upsert_at_leader(cluster: &Cluster, request: UpsertRequest) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let leader = cluster.wait_for_leader().await.unwrap();
        let mut kv = cluster.kv_raw(leader).await.unwrap();
        match kv.upsert(request.clone()).await {
            Ok(_) => return,
            Err(status) => {
                assert!(
                    matches!(
                        status.code(),
                        tonic::Code::FailedPrecondition | tonic::Code::Unavailable
                    ),
                    "{status:?}"
                );
                assert!(
                    std::time::Instant::now() < deadline,
                    "no leader took the write: {status:?}"
                );
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_requests_never_reach_the_reserved_keys() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let mut kv = cluster.kv_raw(leader).await.unwrap();

    // A write with a session: its session is now a reserved key on every node.
    let session = Session {
        client_id: 0x5eed,
        sequence: 1,
        first_incomplete: 1,
    };
    let once = UpsertRequest {
        key: b"rk/once".to_vec(),
        op: add(100),
        session: Some(session),
    };
    kv.upsert(once.clone()).await.unwrap();
    // Client keys right below the reserved space are ordinary keys.
    for key in [&b"\xff"[..], b"\xff\xfe", b"\xff\xfe\xff\xff"] {
        kv.put(PutRequest {
            key: key.to_vec(),
            value: b"edge".to_vec(),
            session: None,
        })
        .await
        .unwrap();
    }

    for key in [
        vec![0xFF, 0xFF],
        reserved(b's'),
        reserved(b't'),
        vec![0xFF, 0xFF, 0xFF],
    ] {
        let what = |api: &str| format!("{api} of {key:02x?}");
        assert_refused(
            kv.get(GetRequest {
                key: key.clone(),
                consistency: 0,
            })
            .await,
            &what("Get"),
        );
        assert_refused(
            kv.put(PutRequest {
                key: key.clone(),
                value: b"x".to_vec(),
                session: None,
            })
            .await,
            &what("Put"),
        );
        assert_refused(
            kv.delete(DeleteRequest {
                key: key.clone(),
                session: None,
            })
            .await,
            &what("Delete"),
        );
        assert_refused(
            kv.upsert(UpsertRequest {
                key: key.clone(),
                op: append(b"x"),
                session: None,
            })
            .await,
            &what("Upsert"),
        );
        let point_ops = [
            write_op::Op::Put(PutOp {
                key: key.clone(),
                value: b"x".to_vec(),
            }),
            write_op::Op::Delete(DeleteOp { key: key.clone() }),
            write_op::Op::Upsert(UpsertKeyOp {
                key: key.clone(),
                op: add(1),
            }),
            write_op::Op::DeleteRange(DeleteRangeOp {
                start: key.clone(),
                end: vec![],
            }),
            write_op::Op::UpsertRange(UpsertRangeOp {
                start: key.clone(),
                end: vec![],
                op: append(b"x"),
            }),
        ];
        for op in point_ops {
            assert_refused(kv.write(write(op.clone())).await, &what(&format!("Write {op:?}")));
        }
        let compare = |target: compare::Target| Compare {
            key: key.clone(),
            target: target as i32,
            result: compare::Result::Equal as i32,
            value: vec![],
        };
        assert_refused(
            kv.txn(txn(vec![compare(compare::Target::Exists)], vec![])).await,
            &what("Txn compare"),
        );
        assert_refused(
            kv.txn(txn(vec![compare(compare::Target::Value)], vec![])).await,
            &what("Txn value compare"),
        );
        assert_refused(
            kv.txn(txn(vec![], vec![txn_op::Op::Get(TxnGetOp { key: key.clone() })]))
                .await,
            &what("Txn get"),
        );
        assert_refused(
            kv.txn(txn(
                vec![],
                vec![txn_op::Op::Put(PutOp {
                    key: key.clone(),
                    value: b"x".to_vec(),
                })],
            ))
            .await,
            &what("Txn put"),
        );
        assert_refused(
            kv.txn(txn(
                vec![],
                vec![txn_op::Op::DeleteRange(DeleteRangeOp {
                    start: key.clone(),
                    end: vec![],
                })],
            ))
            .await,
            &what("Txn delete range"),
        );
        assert_refused(
            kv.scan(ScanRequest {
                start: key.clone(),
                end: vec![],
                limit: 10,
                consistency: 0,
                keys_only: false,
            })
            .await,
            &what("Scan"),
        );
    }

    // Scans of everything, and prefix scans of 0xFF, stop where the reserved space begins.
    let edge: Vec<Vec<u8>> = vec![
        b"\xff".to_vec(),
        b"\xff\xfe".to_vec(),
        b"\xff\xfe\xff\xff".to_vec(),
    ];
    let all = scan(&mut kv, b"", b"").await;
    assert!(all.iter().all(|k| !k.starts_with(&[0xFF, 0xFF])), "{all:02x?}");
    assert!(all.contains(&b"rk/once".to_vec()));
    assert_eq!(scan(&mut kv, b"\xff", b"").await, edge, "prefix scan of 0xFF");
    assert_eq!(
        scan(&mut kv, b"\xff", b"\xff\xff\xff").await,
        edge,
        "end past the prefix"
    );

    // Unbounded range writes touch every client key and no session.
    kv.write(write(write_op::Op::UpsertRange(UpsertRangeOp {
        start: vec![],
        end: vec![],
        op: append(b"!"),
    })))
    .await
    .unwrap();
    assert_eq!(
        kv.get(GetRequest {
            key: b"\xff\xfe".to_vec(),
            consistency: 0
        })
        .await
        .unwrap()
        .into_inner()
        .value,
        b"edge!"
    );
    let delete_all = txn(
        vec![],
        vec![txn_op::Op::DeleteRange(DeleteRangeOp {
            start: vec![],
            end: vec![],
        })],
    );
    kv.txn(delete_all).await.unwrap();
    assert!(
        scan(&mut kv, b"", b"").await.is_empty(),
        "every client key deleted"
    );
    // The session survived: the retry is recognized as applied, not applied again.
    kv.upsert(once.clone()).await.unwrap();
    assert_eq!(
        counter(&cluster, b"rk/once").await,
        None,
        "the retry was applied again"
    );

    // Every node restarts; the table is read back from its keys (and the log above them).
    cluster.wait_all_caught_up().await.unwrap();
    for id in cluster.ids() {
        cluster.stop(id).await.unwrap();
    }
    for id in cluster.ids() {
        cluster.restart(id).unwrap();
    }
    upsert_at_leader(&cluster, once).await;
    assert_eq!(
        counter(&cluster, b"rk/once").await,
        None,
        "after the restart the retry was applied again"
    );
    let next = UpsertRequest {
        key: b"rk/once".to_vec(),
        op: add(1),
        session: Some(Session {
            sequence: 2,
            ..session
        }),
    };
    upsert_at_leader(&cluster, next).await;
    assert_eq!(
        counter(&cluster, b"rk/once").await,
        Some(1),
        "the next sequence is new"
    );
    cluster.check_no_panics().unwrap();
}
