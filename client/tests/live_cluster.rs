//! Smoke test against a running cluster (ignored by default), e.g.
//! `ftkv-node playground --dir /tmp/pg &` then
//! `FTKV_LIVE_ENDPOINTS=$(cat /tmp/pg/endpoints) cargo test -p ftkv-client --test live_cluster -- --ignored`.
//! The cluster tests proper live in the `tests/` crate.
#![allow(clippy::unwrap_used)]

use ftkv_client::{decode_counter, Client, Compare, CompareResult, Op, ScanOptions, Txn, TxnOp, UpsertOp};

fn endpoints() -> Vec<String> {
    let raw =
        std::env::var("FTKV_LIVE_ENDPOINTS").expect("set FTKV_LIVE_ENDPOINTS=host:port,... to run this test");
    raw.split(',').map(str::to_string).collect()
}

#[tokio::test]
#[ignore = "needs a running cluster: FTKV_LIVE_ENDPOINTS"]
async fn live_round_trips_and_exactly_once_retries() {
    let eps = endpoints();
    let prefix = format!("live/{:x}/", rand::random::<u32>());
    let k = |s: &str| format!("{prefix}{s}");

    // Start from the last endpoint: usually a follower, so the redirect path runs too.
    let client = Client::builder()
        .endpoints(eps.iter().rev())
        .build()
        .await
        .unwrap();
    client.put(k("a"), "1").await.unwrap();
    assert_eq!(client.get(k("a")).await.unwrap(), Some(b"1".to_vec()));
    client
        .write(vec![
            Op::put(k("b"), "2"),
            Op::put(k("c"), "3"),
            Op::delete(k("a")),
        ])
        .await
        .unwrap();
    let all = client
        .scan_prefix(
            &prefix,
            0,
            ScanOptions {
                limit: 1,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|kv| kv.value.clone()).collect::<Vec<_>>(),
        vec![b"2".to_vec(), b"3".to_vec()]
    );

    let txn = Txn {
        compares: vec![Compare::value(k("b"), CompareResult::Equal, "2")],
        success: vec![
            TxnOp::Put {
                key: k("b").into_bytes(),
                value: b"20".to_vec(),
            },
            TxnOp::Get {
                key: k("b").into_bytes(),
            },
        ],
        failure: vec![],
    };
    let r = client.txn(txn).await.unwrap();
    assert!(r.succeeded);
    assert_eq!(r.results[1].value, b"20".to_vec());

    // The same session sent twice is applied once.
    let session = client.new_write_session().await;
    client
        .upsert_with_session(&session, k("n"), UpsertOp::Add(5))
        .await
        .unwrap();
    client
        .upsert_with_session(&session, k("n"), UpsertOp::Add(5))
        .await
        .unwrap();
    drop(session);
    assert_eq!(
        decode_counter(&client.get(k("n")).await.unwrap().unwrap()),
        Some(5)
    );

    // A dropped response is retried with the same session and applied once.
    let dropping = Client::builder()
        .endpoints(&eps)
        .debug_drop_write_responses(1)
        .build()
        .await
        .unwrap();
    dropping.upsert(k("n"), UpsertOp::Add(1)).await.unwrap();
    assert_eq!(
        decode_counter(&client.get(k("n")).await.unwrap().unwrap()),
        Some(6)
    );

    // Limits come back as InvalidArgument naming the limit.
    let err = client.put(vec![b'k'; 20_000], "v").await.unwrap_err();
    assert!(
        matches!(err, ftkv_client::Error::InvalidArgument { limit: Some(ref l), .. } if l == "max_key_bytes"),
        "{err:?}"
    );

    let statuses = client.status_all().await;
    assert!(statuses
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .any(|s| s.is_leader));
    client.delete_prefix(&prefix).await.unwrap();
    assert!(client
        .scan_prefix(&prefix, 0, ScanOptions::default())
        .await
        .unwrap()
        .is_empty());
}
