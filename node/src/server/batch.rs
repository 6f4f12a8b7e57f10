//! `Kv.Batch`: many independent requests multiplexed on one stream (TiKV's `BatchCommands`).
//!
//! One driver task per stream reads `BatchRequest`s, runs every item as the unary handler of
//! the same kind would (same validation, limits, sessions and errors: it calls that handler),
//! and sends the answers that are ready together, in `BatchResponse`s of at most
//! [`MAX_RESPONSE_MESSAGE_BYTES`] each (an answer that cannot fit even alone becomes that item's
//! `RESOURCE_EXHAUSTED` error, its neighbours unharmed). Items run
//! concurrently (a `FuturesUnordered` inside the driver, no task per item), so a slow read
//! never holds back a write queued behind it. Closing the request stream ends the response
//! stream once every pending item is answered. A request stream that breaks (garbage, a message
//! over the decoding limit, one over [`MAX_BATCH_ITEMS`]) is read no further: every item already
//! taken is answered, then the stream ends with `INVALID_ARGUMENT` or `RESOURCE_EXHAUSTED` and an
//! `ErrorInfo`. The client going away cancels pending items (writes already proposed still
//! commit, as with a dropped unary call).

use std::pin::Pin;
use std::sync::Arc;

use ftkv_proto::v1 as pb;
use ftkv_proto::v1::kv_server::Kv;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, Stream, StreamExt};
use pb::batch_request_item::Request as ItemRequest;
use pb::batch_response_item::Response as ItemResponse;
use prost::Message;
use tokio::sync::mpsc;
use tonic::{Request, Status, Streaming};

use super::errors;
use super::kv::KvService;
use crate::limits::MAX_RESPONSE_MESSAGE_BYTES;

/// Most items in one `BatchRequest` (`INVALID_ARGUMENT` beyond, and the stream ends).
pub const MAX_BATCH_ITEMS: usize = 10_000;

/// Most `BatchResponse`s buffered for a client that reads slowly; the driver waits beyond it.
const RESPONSE_BUFFER: usize = 64;

/// The response stream of one `Kv.Batch` call.
pub type BatchStream = Pin<Box<dyn Stream<Item = Result<pb::BatchResponse, Status>> + Send + 'static>>;

/// Starts the driver for one `Kv.Batch` call and returns its response stream.
/// The stream's credentials, which every item carries to its handler (each item is checked on
/// its own, so a token that expires ends the stream's items).
#[derive(Debug, Clone, Default)]
pub struct Credentials {
    /// The `authorization` metadata.
    pub token: Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>,
    /// The user of the connection's client certificate.
    pub cert: Option<super::auth::CertUser>,
}

/// `creds`: see [`Credentials`].
pub fn serve(
    service: Arc<KvService>,
    creds: Credentials,
    inbound: Streaming<pb::BatchRequest>,
) -> BatchStream {
    let (tx, rx) = mpsc::channel(RESPONSE_BUFFER);
    tokio::spawn(drive(service, Arc::new(creds), inbound, tx));
    Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
}

/// Runs one item through the unary handler of its kind.
async fn handle(
    service: Arc<KvService>,
    creds: Arc<Credentials>,
    item: pb::BatchRequestItem,
) -> pb::BatchResponseItem {
    let id = item.id;
    let svc = service.as_ref();
    let token = creds.as_ref();
    let result = match item.request {
        Some(ItemRequest::Get(r)) => svc
            .get(with_token(r, token))
            .await
            .map(|r| ItemResponse::Get(r.into_inner())),
        Some(ItemRequest::Put(r)) => svc
            .put(with_token(r, token))
            .await
            .map(|r| ItemResponse::Put(r.into_inner())),
        Some(ItemRequest::Delete(r)) => svc
            .delete(with_token(r, token))
            .await
            .map(|r| ItemResponse::Delete(r.into_inner())),
        Some(ItemRequest::Write(r)) => svc
            .write(with_token(r, token))
            .await
            .map(|r| ItemResponse::Write(r.into_inner())),
        Some(ItemRequest::Txn(r)) => svc
            .txn(with_token(r, token))
            .await
            .map(|r| ItemResponse::Txn(r.into_inner())),
        Some(ItemRequest::Upsert(r)) => svc
            .upsert(with_token(r, token))
            .await
            .map(|r| ItemResponse::Upsert(r.into_inner())),
        None => Err(errors::invalid(format!("batch item {id} carries no request"))),
    };
    let response = result.unwrap_or_else(|status| item_error(&status));
    pb::BatchResponseItem {
        id,
        response: Some(response),
    }
}

/// A batch item as a unary request carrying the stream's credentials.
fn with_token<T>(item: T, creds: &Credentials) -> Request<T> {
    let mut request = Request::new(item);
    if let Some(t) = &creds.token {
        request
            .metadata_mut()
            .insert(super::auth::AUTHORIZATION, t.clone());
    }
    if let Some(user) = &creds.cert {
        request.extensions_mut().insert(user.clone());
    }
    request
}

async fn drive(
    service: Arc<KvService>,
    creds: Arc<Credentials>,
    mut inbound: Streaming<pb::BatchRequest>,
    tx: mpsc::Sender<Result<pb::BatchResponse, Status>>,
) {
    let mut pending = FuturesUnordered::new();
    let mut inbound_open = true;
    // Why the request stream broke, sent once every item already taken is answered.
    let mut broken: Option<Status> = None;
    loop {
        tokio::select! {
            message = inbound.message(), if inbound_open => match message {
                Ok(Some(batch)) => {
                    if batch.items.len() > MAX_BATCH_ITEMS {
                        inbound_open = false;
                        broken = Some(errors::invalid(format!(
                            "batch of {} items is over the limit of {MAX_BATCH_ITEMS}; items of \
                             earlier messages were answered, none of this one ran",
                            batch.items.len()
                        )));
                        continue;
                    }
                    metrics::histogram!("ftkv_kv_batch_items").record(batch.items.len() as f64);
                    for item in batch.items {
                        pending.push(handle(service.clone(), creds.clone(), item));
                    }
                }
                Ok(None) => inbound_open = false,
                // Garbage, an oversized message or the client going away: read no more, answer
                // what was taken (a client that left reads nothing, and the sends fail), then end
                // with why.
                Err(status) => {
                    tracing::debug!(error = %status, "batch request stream broke");
                    if tx.is_closed() {
                        return; // the client went away: nobody is left to answer
                    }
                    inbound_open = false;
                    broken = Some(errors::broken_request_stream(&status));
                }
            },
            Some(first) = pending.next(), if !pending.is_empty() => {
                let mut items = vec![first];
                // Everything else already answered goes out now too.
                while let Some(Some(more)) = pending.next().now_or_never() {
                    items.push(more);
                }
                for message in pack(items) {
                    if tx.send(Ok(message)).await.is_err() {
                        return; // client stopped reading
                    }
                }
            },
            else => break, // request stream closed and every item answered
        }
    }
    if let Some(status) = broken {
        let _ = tx.send(Err(status)).await;
    }
}

/// Encoded size of `item` inside a `BatchResponse` (field tag and length prefix included).
fn framed_len(item: &pb::BatchResponseItem) -> usize {
    let len = item.encoded_len();
    1 + prost::length_delimiter_len(len) + len
}

/// Packs answered items into as few `BatchResponse`s as fit in
/// [`MAX_RESPONSE_MESSAGE_BYTES`] each; an item that cannot fit even alone is replaced by its
/// error ([`errors::response_too_large`]), so no message ever trips a client's size limit.
fn pack(items: Vec<pb::BatchResponseItem>) -> Vec<pb::BatchResponse> {
    let mut messages = Vec::new();
    let mut current = Vec::new();
    let mut current_bytes = 0usize;
    for item in items {
        let mut len = framed_len(&item);
        let item = if len > MAX_RESPONSE_MESSAGE_BYTES {
            let status = errors::response_too_large(
                &format!("the answer to batch item {}", item.id),
                len,
                matches!(&item.response, Some(ItemResponse::Txn(_))),
            );
            let item = pb::BatchResponseItem {
                id: item.id,
                response: Some(item_error(&status)),
            };
            len = framed_len(&item);
            item
        } else {
            item
        };
        if current_bytes + len > MAX_RESPONSE_MESSAGE_BYTES && !current.is_empty() {
            messages.push(pb::BatchResponse {
                items: std::mem::take(&mut current),
            });
            current_bytes = 0;
        }
        current_bytes += len;
        current.push(item);
    }
    if !current.is_empty() {
        messages.push(pb::BatchResponse { items: current });
    }
    messages
}

fn item_error(status: &Status) -> ItemResponse {
    ItemResponse::Error(pb::ItemError {
        code: status.code() as i32,
        message: status.message().to_string(),
        details: status.details().to_vec(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn get_answer(id: u64, value_bytes: usize) -> pb::BatchResponseItem {
        pb::BatchResponseItem {
            id,
            response: Some(ItemResponse::Get(pb::GetResponse {
                header: None,
                found: true,
                value: vec![7; value_bytes],
            })),
        }
    }

    #[test]
    fn answers_are_split_so_no_message_is_over_the_limit() {
        let items = (0..9).map(|id| get_answer(id, 1024 * 1024)).collect();
        let messages = pack(items);
        assert!(messages.len() >= 3, "{} messages", messages.len());
        let ids: Vec<u64> = messages
            .iter()
            .flat_map(|m| m.items.iter().map(|i| i.id))
            .collect();
        assert_eq!(ids, (0..9).collect::<Vec<_>>());
        for m in &messages {
            assert!(
                m.encoded_len() <= MAX_RESPONSE_MESSAGE_BYTES,
                "{}",
                m.encoded_len()
            );
        }
    }

    #[test]
    fn an_answer_too_large_for_any_message_becomes_its_item_error() {
        let messages = pack(vec![
            get_answer(1, 10),
            get_answer(2, MAX_RESPONSE_MESSAGE_BYTES),
            get_answer(3, 10),
        ]);
        let items: Vec<_> = messages.into_iter().flat_map(|m| m.items).collect();
        assert_eq!(items.len(), 3);
        assert!(matches!(items[0].response, Some(ItemResponse::Get(_))));
        assert!(matches!(items[2].response, Some(ItemResponse::Get(_))));
        let Some(ItemResponse::Error(e)) = &items[1].response else {
            panic!("{:?}", items[1].response.as_ref().map(|_| ()));
        };
        assert_eq!(e.code, tonic::Code::ResourceExhausted as i32);
        let info = ftkv_proto::status_details::decode(&e.details).unwrap();
        assert_eq!(info.limit, "max_response_message_bytes");
    }
}
