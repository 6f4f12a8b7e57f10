//! `Kv.Batch`: many independent requests multiplexed on one stream (TiKV's `BatchCommands`).
//!
//! One driver task per stream reads `BatchRequest`s, runs every item as the unary handler of
//! the same kind would (same validation, limits, sessions and errors: it calls that handler),
//! and sends the answers that are ready together as one `BatchResponse`. Items run
//! concurrently (a `FuturesUnordered` inside the driver, no task per item), so a slow read
//! never holds back a write queued behind it. Closing the request stream ends the response
//! stream once every pending item is answered; the client going away cancels pending items
//! (writes already proposed still commit, as with a dropped unary call).

use std::pin::Pin;
use std::sync::Arc;

use ftkv_proto::v1 as pb;
use ftkv_proto::v1::kv_server::Kv;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use pb::batch_request_item::Request as ItemRequest;
use pb::batch_response_item::Response as ItemResponse;
use tokio::sync::mpsc;
use tonic::{Request, Status, Streaming};

use super::errors;
use super::kv::KvService;

/// Most items in one `BatchRequest` (`INVALID_ARGUMENT` beyond, and the stream ends).
pub const MAX_BATCH_ITEMS: usize = 10_000;

/// Most `BatchResponse`s buffered for a client that reads slowly; the driver waits beyond it.
const RESPONSE_BUFFER: usize = 64;

/// The response stream of one `Kv.Batch` call.
pub type BatchStream = Pin<Box<dyn Stream<Item = Result<pb::BatchResponse, Status>> + Send + 'static>>;

/// Starts the driver for one `Kv.Batch` call and returns its response stream.
pub fn serve(service: Arc<KvService>, inbound: Streaming<pb::BatchRequest>) -> BatchStream {
    let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
    tokio::spawn(drive(service, inbound, tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Runs one item through the unary handler of its kind.
async fn handle(service: Arc<KvService>, item: pb::BatchRequestItem) -> pb::BatchResponseItem {
    let id = item.id;
    let svc = service.as_ref();
    let result = match item.request {
        Some(ItemRequest::Get(r)) => svc
            .get(Request::new(r))
            .await
            .map(|r| ItemResponse::Get(r.into_inner())),
        Some(ItemRequest::Put(r)) => svc
            .put(Request::new(r))
            .await
            .map(|r| ItemResponse::Put(r.into_inner())),
        Some(ItemRequest::Delete(r)) => svc
            .delete(Request::new(r))
            .await
            .map(|r| ItemResponse::Delete(r.into_inner())),
        Some(ItemRequest::Write(r)) => svc
            .write(Request::new(r))
            .await
            .map(|r| ItemResponse::Write(r.into_inner())),
        Some(ItemRequest::Txn(r)) => svc
            .txn(Request::new(r))
            .await
            .map(|r| ItemResponse::Txn(r.into_inner())),
        Some(ItemRequest::Upsert(r)) => svc
            .upsert(Request::new(r))
            .await
            .map(|r| ItemResponse::Upsert(r.into_inner())),
        None => Err(errors::invalid(format!("batch item {id} carries no request"))),
    };
    let response = result.unwrap_or_else(|status| {
        ItemResponse::Error(pb::ItemError {
            code: status.code() as i32,
            message: status.message().to_string(),
            details: status.details().to_vec(),
        })
    });
    pb::BatchResponseItem {
        id,
        response: Some(response),
    }
}

async fn drive(
    service: Arc<KvService>,
    mut inbound: Streaming<pb::BatchRequest>,
    tx: mpsc::Sender<Result<pb::BatchResponse, Status>>,
) {
    let mut pending = FuturesUnordered::new();
    let mut inbound_open = true;
    loop {
        tokio::select! {
            message = inbound.message(), if inbound_open => match message {
                Ok(Some(batch)) => {
                    if batch.items.len() > MAX_BATCH_ITEMS {
                        let status = errors::invalid(format!(
                            "batch of {} items is over the limit of {MAX_BATCH_ITEMS}",
                            batch.items.len()
                        ));
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                    metrics::histogram!("ftkv_kv_batch_items").record(batch.items.len() as f64);
                    for item in batch.items {
                        pending.push(handle(service.clone(), item));
                    }
                }
                Ok(None) => inbound_open = false,
                // The client went away or sent garbage: nobody is left to answer.
                Err(status) => {
                    tracing::debug!(error = %status, "batch stream ended by the client");
                    return;
                }
            },
            Some(first) = pending.next(), if !pending.is_empty() => {
                let mut items = vec![first];
                // Everything else already answered goes in the same message.
                while let Some(Some(more)) = pending.next().now_or_never() {
                    items.push(more);
                }
                if tx.send(Ok(pb::BatchResponse { items })).await.is_err() {
                    return; // client stopped reading
                }
            },
            else => return, // request stream closed and every item answered
        }
    }
}
