//! Issue 14, items 6 (server half), 7, 8 and 15: what the client server sends always fits a stock
//! gRPC client (4 MiB messages by default), every error carries an `ErrorInfo` wrapped in a
//! `google.rpc.Status`, a broken `Kv.Batch` request stream ends with an error after every item
//! it delivered was answered, and nonsensical limits are refused at start.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests unwrap: a failure is the test failing

use std::collections::BTreeMap;
use std::time::Duration;

use ftkv_proto::v1::error_info::Kind;
use ftkv_proto::v1::kv_client::KvClient;
use ftkv_proto::v1::{
    batch_request_item, batch_response_item, txn_op, BatchRequest, BatchRequestItem, BatchResponse,
    ErrorInfo, GetRequest, PutRequest, ScanRequest, TxnGetOp, TxnOp, TxnRequest,
};
use ftkv_tests::fixture::{serial, Binaries, Cluster, ClusterOptions};
use prost::bytes::{Buf, BufMut};
use prost::Message;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

const MIB: usize = 1024 * 1024;
/// What a stock gRPC client accepts in one message unless told otherwise.
const STOCK_CLIENT_MESSAGE_BYTES: usize = 4 * MIB;

/// A codec that sends pre-encoded bytes as they are (garbage included) and hands back the raw
/// bytes of every answer, so a test can send what no generated client would.
#[derive(Default)]
struct RawCodec;
struct RawEncoder;
struct RawDecoder;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawEncoder;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// The `ErrorInfo` of status details, decoded the way standard gRPC tooling does: a
/// `google.rpc.Status` whose details hold an `Any` of type `ftkv.v1.ErrorInfo`.
fn standard_error_info(details: &[u8], what: &str) -> ErrorInfo {
    let status = tonic_types::Status::decode(details)
        .unwrap_or_else(|e| panic!("{what}: details are not a google.rpc.Status: {e}"));
    let any = status
        .details
        .iter()
        .find(|a| a.type_url == "type.googleapis.com/ftkv.v1.ErrorInfo")
        .unwrap_or_else(|| panic!("{what}: no ftkv.v1.ErrorInfo in {status:?}"));
    ErrorInfo::decode(any.value.as_slice()).unwrap()
}

/// A client with the stock message limits (4 MiB in), 64 MiB out.
async fn stock_client(cluster: &Cluster, id: u64) -> KvClient<Channel> {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.endpoint(id).unwrap()))
            .unwrap()
            .timeout(Duration::from_secs(30))
            .connect()
            .await
            .unwrap();
    KvClient::new(channel).max_encoding_message_size(128 * MIB)
}

/// Runs one raw `Kv.Batch` call sending `messages`; returns the answers by item id, how many
/// response messages came and how the stream ended.
async fn raw_batch(
    cluster: &Cluster,
    id: u64,
    messages: Vec<Vec<u8>>,
) -> (
    BTreeMap<u64, batch_response_item::Response>,
    usize,
    Result<(), tonic::Status>,
) {
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.endpoint(id).unwrap()))
            .unwrap()
            .connect()
            .await
            .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = tonic::codegen::http::uri::PathAndQuery::from_static("/ftkv.v1.Kv/Batch");
    let mut stream = grpc
        .streaming(
            tonic::Request::new(futures::stream::iter(messages)),
            path,
            RawCodec,
        )
        .await
        .unwrap()
        .into_inner();
    let mut answers = BTreeMap::new();
    let mut count = 0;
    let end = loop {
        match stream.message().await {
            Ok(Some(bytes)) => {
                assert!(
                    bytes.len() <= STOCK_CLIENT_MESSAGE_BYTES,
                    "a BatchResponse of {} bytes is over what a stock client accepts",
                    bytes.len()
                );
                count += 1;
                for item in BatchResponse::decode(bytes.as_slice()).unwrap().items {
                    let previous = answers.insert(item.id, item.response.unwrap());
                    assert!(previous.is_none(), "item {} answered twice", item.id);
                }
            }
            Ok(None) => break Ok(()),
            Err(status) => break Err(status),
        }
    };
    (answers, count, end)
}

fn put_item(id: u64, key: &str) -> BatchRequestItem {
    BatchRequestItem {
        id,
        request: Some(batch_request_item::Request::Put(PutRequest {
            key: key.as_bytes().to_vec(),
            value: b"v".to_vec(),
            session: None,
        })),
    }
}

fn big_txn_of_gets(keys: &[String]) -> TxnRequest {
    TxnRequest {
        success: keys
            .iter()
            .map(|k| TxnOp {
                op: Some(txn_op::Op::Get(TxnGetOp {
                    key: k.as_bytes().to_vec(),
                })),
            })
            .collect(),
        ..Default::default()
    }
}

/// Item 7: garbage or an oversized message after valid ones ends the stream with
/// INVALID_ARGUMENT / RESOURCE_EXHAUSTED (with an ErrorInfo), and every item of the valid
/// messages is answered first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_batch_request_stream_ends_with_an_error_after_answering_every_taken_item() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let valid = BatchRequest {
        items: (1..=20).map(|i| put_item(i, &format!("broken/{i}"))).collect(),
    }
    .encode_to_vec();

    // garbage: field 1 with the invalid wire type 7
    let (answers, _, end) = raw_batch(&cluster, leader, vec![valid.clone(), vec![0x0f; 32]]).await;
    assert_eq!(answers.len(), 20, "every taken item is answered: {answers:?}");
    assert!(
        answers
            .values()
            .all(|r| matches!(r, batch_response_item::Response::Put(_))),
        "{answers:?}"
    );
    let status = end.expect_err("a stream that broke on garbage must not end OK");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    let info = standard_error_info(status.details(), "garbage in the batch stream");
    assert_eq!(info.kind, Kind::Invalid as i32, "{info:?}");

    // a message over the server's 64 MiB decoding limit
    let oversized = BatchRequest {
        items: vec![BatchRequestItem {
            id: 99,
            request: Some(batch_request_item::Request::Put(PutRequest {
                key: b"huge".to_vec(),
                value: vec![b'x'; 65 * MIB],
                session: None,
            })),
        }],
    }
    .encode_to_vec();
    let (answers, _, end) = raw_batch(&cluster, leader, vec![valid.clone(), oversized]).await;
    assert_eq!(answers.len(), 20, "every taken item is answered: {answers:?}");
    let status = end.expect_err("a stream that broke on an oversized message must not end OK");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let info = standard_error_info(status.details(), "oversized batch message");
    assert_eq!(info.kind, Kind::Limit as i32, "{info:?}");
    assert!(!info.limit.is_empty(), "names the limit: {info:?}");

    // a message over the item limit after a valid one
    let too_many = BatchRequest {
        items: (100..10_101).map(|i| put_item(i, &format!("many/{i}"))).collect(),
    }
    .encode_to_vec();
    let (answers, _, end) = raw_batch(&cluster, leader, vec![valid, too_many]).await;
    assert_eq!(
        answers.len(),
        20,
        "only the valid message's items ran: {answers:?}"
    );
    let status = end.expect_err("over the item limit");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

    assert!(cluster.is_running(leader));
    cluster.check_no_panics().unwrap();
}

/// Items 6 and 8: Scan pages, Batch messages and unary answers never exceed what a stock client
/// accepts; an answer that cannot fit is an error with an ErrorInfo (for a batch item: that
/// item's error, its neighbours are answered); requests over the server's decoding limit are
/// refused with an ErrorInfo too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_fit_a_stock_grpc_client_and_every_refusal_carries_an_error_info() {
    let _serial = serial().await;
    let cluster = Cluster::start(ClusterOptions {
        nodes: 1,
        ..Default::default()
    })
    .await
    .unwrap();
    let leader = cluster.wait_for_leader().await.unwrap();
    let client = cluster.client().await.unwrap();
    let keys: Vec<String> = (0..6).map(|i| format!("big/{i}")).collect();
    for k in &keys {
        client.put(k, vec![b'v'; MIB]).await.unwrap();
    }
    let mut stock = stock_client(&cluster, leader).await;

    // Scan: 6 MiB of pairs come in pages a stock client can read.
    let mut start = b"big/".to_vec();
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let page = stock
            .scan(ScanRequest {
                start: start.clone(),
                end: b"big0".to_vec(),
                ..Default::default()
            })
            .await
            .unwrap_or_else(|s| panic!("scan page {pages}: {s:?}"))
            .into_inner();
        pages += 1;
        seen.extend(page.kvs.into_iter().map(|kv| kv.key));
        if !page.more {
            break;
        }
        start = page.next_start;
    }
    assert_eq!(seen.len(), keys.len(), "every pair read once");
    assert!(pages >= 2, "6 MiB came in one page");

    // Unary Txn whose reads are over the message limit: refused with an ErrorInfo.
    let status = stock
        .txn(big_txn_of_gets(&keys))
        .await
        .expect_err("a 6 MiB txn answer cannot reach a stock client");
    let info = standard_error_info(status.details(), "txn answer over the limit");
    assert_ne!(info.kind, Kind::Unspecified as i32, "{info:?}");

    // Batch: many 1 MiB answers are split over messages; an item whose answer cannot fit gets
    // its own error, the others their answers.
    let mut items: Vec<BatchRequestItem> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| BatchRequestItem {
            id: i as u64,
            request: Some(batch_request_item::Request::Get(GetRequest {
                key: k.as_bytes().to_vec(),
                consistency: 0,
            })),
        })
        .collect();
    items.push(BatchRequestItem {
        id: 100,
        request: Some(batch_request_item::Request::Txn(big_txn_of_gets(&keys))),
    });
    items.push(put_item(101, "after-the-big-one"));
    let message = BatchRequest { items }.encode_to_vec();
    let (answers, _messages, end) = raw_batch(&cluster, leader, vec![message]).await;
    end.unwrap();
    assert_eq!(answers.len(), keys.len() + 2, "every item answered");
    for i in 0..keys.len() as u64 {
        match &answers[&i] {
            batch_response_item::Response::Get(g) => assert_eq!(g.value.len(), MIB),
            other => panic!("get item {i}: {other:?}"),
        }
    }
    match &answers[&100] {
        batch_response_item::Response::Error(e) => {
            assert_ne!(e.code, 0);
            let info = standard_error_info(&e.details, "batch txn answer over the limit");
            assert_ne!(info.kind, Kind::Unspecified as i32, "{info:?}");
        }
        other => panic!("the oversized txn item: {other:?}"),
    }
    assert!(matches!(answers[&101], batch_response_item::Response::Put(_)));

    // A request over the server's decoding limit: refused with an ErrorInfo naming the limit.
    let status = stock
        .put(PutRequest {
            key: b"huge".to_vec(),
            value: vec![b'x'; 65 * MIB],
            session: None,
        })
        .await
        .expect_err("a 65 MiB request");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    let info = standard_error_info(status.details(), "request over the decoding limit");
    assert_eq!(info.kind, Kind::Limit as i32, "{info:?}");
    assert!(!info.limit.is_empty(), "names the limit: {info:?}");

    // A plain refusal decodes with standard tooling too.
    let status = stock
        .put(PutRequest {
            key: Vec::new(),
            value: b"v".to_vec(),
            session: None,
        })
        .await
        .expect_err("empty key");
    assert_eq!(
        standard_error_info(status.details(), "empty key").limit,
        "empty_key"
    );

    assert!(cluster.is_running(leader));
    cluster.check_no_panics().unwrap();
}

/// Item 15: limits that make no sense alone or together are refused at start, naming the
/// option, with a non-zero exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonsensical_limits_are_refused_at_start() {
    let binaries = Binaries::locate();
    let scratch = tempfile::tempdir().unwrap();
    for (toml, option) in [
        ("[limits]\nmax_value_bytes = \"0B\"\n", "limits.max_value_bytes"),
        (
            "[limits]\nmax_value_bytes = \"8MiB\"\nmax_batch_bytes = \"16MiB\"\n",
            "limits.max_value_bytes",
        ),
        (
            "[limits]\nmax_batch_bytes = \"128MiB\"\n",
            "limits.max_batch_bytes",
        ),
        (
            "[raft]\npeer_max_message_size = \"1MiB\"\n",
            "raft.peer_max_message_size",
        ),
    ] {
        let path = scratch.path().join("limits.toml");
        std::fs::write(&path, toml).unwrap();
        let out = tokio::process::Command::new(&binaries.node)
            .args(["--print-config", "--config", path.to_str().unwrap()])
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "ftkv-node accepted {toml:?}:\n{}",
            String::from_utf8_lossy(&out.stdout)
        );
        assert!(stderr.contains(option), "the error names {option}: {stderr}");
    }
}
