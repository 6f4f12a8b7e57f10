//! Issue 14, items 5 and 6: limits the state machine checks where a command is applied, with
//! the proposer's limits stamped into the command so every replica decides alike.
//!
//! - An `Append` that would grow a value past `max_value_bytes` is refused with
//!   `INVALID_ARGUMENT` naming the limit; the stored value stays as it was and readable on every
//!   replica.
//! - A Txn whose reads would return more than `MAX_RESPONSE_BYTES` (3 MiB) is refused before it
//!   commits (`INVALID_ARGUMENT` naming `max_response_bytes`): none of its writes applied.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use ftkv_client::{Error, Txn, TxnOp, UpsertOp};
use ftkv_proto::v1::{GetRequest, ReadConsistency};
use ftkv_tests::fixture::{serial, Cluster, ClusterOptions};

const MIB: usize = 1024 * 1024;

/// Asserts `result` is `InvalidArgument` whose ErrorInfo names `limit`.
fn assert_limit<T: std::fmt::Debug>(result: Result<T, Error>, limit: &str, what: &str) {
    match result {
        Err(Error::InvalidArgument {
            message,
            limit: named,
        }) => {
            assert_eq!(
                named.as_deref(),
                Some(limit),
                "{what}: ErrorInfo should name {limit}: {message:?}"
            );
            assert!(
                message.contains(limit),
                "{what}: message names {limit}: {message:?}"
            );
        }
        other => panic!("{what}: expected InvalidArgument naming {limit}, got {other:?}"),
    }
}

/// `key` as every node serves it from its own state (serializable), once all caught up.
async fn on_every_node(cluster: &Cluster, key: &[u8]) -> Vec<Option<Vec<u8>>> {
    cluster.wait_all_caught_up().await.unwrap();
    let mut values = Vec::new();
    for id in cluster.ids() {
        let mut kv = cluster.kv_raw(id).await.unwrap();
        let answer = kv
            .get(GetRequest {
                key: key.to_vec(),
                consistency: ReadConsistency::Serializable as i32,
            })
            .await
            .unwrap_or_else(|status| panic!("node {id} cannot read {key:?}: {status:?}"))
            .into_inner();
        values.push(answer.found.then_some(answer.value));
    }
    values
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn append_past_max_value_bytes_is_refused_on_every_replica() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster.client().await.unwrap();

    // 512 KiB, then appends of 256 KiB: 768 KiB, 1 MiB (exactly the limit: passes), then refused.
    let mut expected = vec![b'A'; MIB / 2];
    client.put("app/x", &expected).await.unwrap();
    for round in 1..=4 {
        let append = client
            .upsert("app/x", UpsertOp::Append(vec![b'B'; MIB / 4]))
            .await;
        if round <= 2 {
            append.unwrap_or_else(|e| panic!("append {round} within the limit: {e:?}"));
            expected.extend_from_slice(&[b'B'; MIB / 4]);
        } else {
            assert_limit(append, "max_value_bytes", &format!("append {round} past 1 MiB"));
        }
    }
    assert_eq!(client.get("app/x").await.unwrap(), Some(expected.clone()));
    for value in on_every_node(&cluster, b"app/x").await {
        assert_eq!(
            value.map(|v| v.len()),
            Some(MIB),
            "every replica holds the 1 MiB value"
        );
    }

    // Through ftkvctl: a clear message naming the limit and a non-zero exit. (A 1 MiB value
    // cannot be a command-line argument, so the put reads it from stdin.)
    let almost = "C".repeat(MIB - 10);
    let out = cluster.ctl_with_stdin(&["put", "app/y"], &almost).await.unwrap();
    assert!(out.success(), "ftkvctl put from stdin: {out:?}");
    let suffix = "D".repeat(64 * 1024);
    let out = cluster
        .ctl(&["upsert", "app/y", "--append", &suffix])
        .await
        .unwrap();
    assert!(
        !out.success(),
        "ftkvctl upsert --append past the limit exited 0: {out:?}"
    );
    assert!(
        out.stderr.contains("max_value_bytes"),
        "ftkvctl names the limit: {:?}",
        out.stderr
    );
    for value in on_every_node(&cluster, b"app/y").await {
        assert_eq!(value.map(|v| v.len()), Some(MIB - 10));
    }

    // A Txn appending past the limit is refused whole: its put is not applied either.
    let txn = Txn {
        compares: vec![],
        success: vec![
            TxnOp::Put {
                key: b"app/txn-marker".to_vec(),
                value: b"1".to_vec(),
            },
            TxnOp::Upsert {
                key: b"app/x".to_vec(),
                op: UpsertOp::Append(b"!".to_vec()),
            },
        ],
        failure: vec![],
    };
    assert_limit(client.txn(txn).await, "max_value_bytes", "txn append past 1 MiB");
    assert_eq!(client.get("app/txn-marker").await.unwrap(), None);
    cluster.check_no_panics().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn txn_reads_past_the_response_limit_are_refused_before_commit() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions::default()).await.unwrap();
    let client = cluster.client().await.unwrap();

    // 70 keys of 1 MiB, written a few at a time.
    let value = vec![b'x'; MIB];
    for chunk in (0..70).collect::<Vec<_>>().chunks(8) {
        let puts = chunk.iter().map(|i| client.put(format!("big/{i}"), &value));
        for result in futures::future::join_all(puts).await {
            result.unwrap();
        }
    }
    let gets = |n: usize| {
        (0..n).map(|i| TxnOp::Get {
            key: format!("big/{i}").into_bytes(),
        })
    };
    let txn = |n: usize| {
        let mut success = vec![TxnOp::Put {
            key: b"oor/marker".to_vec(),
            value: b"1".to_vec(),
        }];
        success.extend(gets(n));
        Txn {
            compares: vec![],
            success,
            failure: vec![],
        }
    };
    assert_limit(
        client.txn(txn(70)).await,
        "max_response_bytes",
        "txn reading 70 MiB",
    );
    assert_eq!(client.get("oor/marker").await.unwrap(), None);
    for marker in on_every_node(&cluster, b"oor/marker").await {
        assert_eq!(marker, None, "no replica applied the refused txn's put");
    }
    // Reads within the limit still commit and answer in full.
    let answer = client.txn(txn(2)).await.unwrap();
    assert!(answer.succeeded);
    assert_eq!(answer.results.len(), 3);
    assert!(answer.results[1..].iter().all(|r| r.found && r.value == value));
    assert_eq!(client.get("oor/marker").await.unwrap(), Some(b"1".to_vec()));
    cluster.check_no_panics().unwrap();
}
