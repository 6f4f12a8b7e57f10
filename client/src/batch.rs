//! Request multiplexing over the `Kv.Batch` stream (TiKV's `BatchCommands`).
//!
//! A busy client issues many small requests at once (the bench's 128 writers, a service with
//! many tasks). As unary gRPC calls each pays HTTP/2 stream setup, headers, trailers and a
//! wake-up of the connection task on both ends, which on a small machine costs more CPU than
//! the replicated write itself. A [`BatchConn`] keeps one long-lived `Kv.Batch` stream per
//! endpoint: a driver task packs every request queued while it was busy into one
//! `BatchRequest` and routes each `BatchResponseItem` back to its caller by id. Each item is
//! handled by the node exactly as the unary RPC of the same kind, so sessions, retries and
//! errors are unchanged: an item's error comes back as the same `tonic::Status` (code, message,
//! `ErrorInfo` details) the unary call would have returned.
//!
//! Failure: when the stream breaks or ends (with any status, OK included), every item handed
//! to it and not yet answered gets `UNAVAILABLE` without details (the request may have been
//! applied: writes are retried with their session, and end ambiguous if the retries run out);
//! every item still queued gets an `UNAVAILABLE` marked never sent (not applied, retried). No
//! caller is left without an answer, and the next call opens a new stream. A node without `Kv.Batch` (`UNIMPLEMENTED`) marks the connection
//! unsupported and callers fall back to unary RPCs.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::client::AuthChannel;
use ftkv_proto::v1 as pb;
use ftkv_proto::v1::kv_client::KvClient;
use pb::batch_request_item::Request as ItemRequest;
use pb::batch_response_item::Response as ItemResponse;
use tokio::sync::{mpsc, oneshot};
use tonic::{Code, Status};

use crate::error::{not_sent, over_client_limit};

/// Most items the client packs into one `BatchRequest` (the node accepts up to 10,000).
pub const MAX_ITEMS_PER_BATCH: usize = 1_024;
/// Most encoded bytes the client packs into one `BatchRequest` (a single larger item still
/// goes alone, up to the client's `max_message_bytes`): a batch of concurrent large writes must
/// neither exceed the gRPC message limit, which would fail the whole stream, nor delay the
/// small items packed with it.
pub const MAX_BYTES_PER_BATCH: usize = 4 * 1024 * 1024;
/// Upper bound of what wrapping a request into a `BatchRequestItem` inside a `BatchRequest`
/// adds to its encoded size (field tags, length prefixes and the item id).
const ITEM_OVERHEAD_BYTES: usize = 32;

type Reply = oneshot::Sender<Result<ItemResponse, Status>>;

struct Queued {
    request: ItemRequest,
    /// Encoded bytes of the item within a `BatchRequest` (an upper bound).
    bytes: usize,
    reply: Reply,
}

/// One `Kv.Batch` stream to one endpoint, shared by every caller (cheap to clone).
#[derive(Clone, Debug)]
pub(crate) struct BatchConn {
    tx: mpsc::UnboundedSender<Queued>,
    state: Arc<ConnState>,
    /// The client's `max_message_bytes`: larger items are refused unsent.
    max_message_bytes: usize,
}

#[derive(Debug, Default)]
struct ConnState {
    /// The stream ended or failed: open a new connection for the next call.
    closed: AtomicBool,
    /// The node answered `UNIMPLEMENTED` to `Kv.Batch`: use unary calls.
    unsupported: AtomicBool,
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued").finish_non_exhaustive()
    }
}

impl BatchConn {
    /// Starts the driver task for a stream over `kv` (the stream itself opens with the first
    /// request). Must be called inside a tokio runtime.
    /// `max_message_bytes` is the client's message limit (the one `kv` encodes with).
    pub(crate) fn open(kv: KvClient<AuthChannel>, max_message_bytes: usize) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(ConnState::default());
        let max_batch_bytes = MAX_BYTES_PER_BATCH.min(max_message_bytes);
        tokio::spawn(drive(kv, rx, state.clone(), max_batch_bytes));
        BatchConn {
            tx,
            state,
            max_message_bytes,
        }
    }

    /// True once the stream ended: callers should open a new one.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.closed.load(Ordering::Acquire)
    }

    /// True when the node does not serve `Kv.Batch`.
    pub(crate) fn is_unsupported(&self) -> bool {
        self.state.unsupported.load(Ordering::Acquire)
    }

    /// Sends one request on the stream and waits for its answer.
    ///
    /// Errors: the item's own error status (as the unary RPC would return it),
    /// `UNAVAILABLE` when the stream broke before the answer arrived (marked never sent when
    /// it had not left the queue), or an unsent `INVALID_ARGUMENT` for an item over
    /// `max_message_bytes`.
    pub(crate) async fn call(&self, request: ItemRequest) -> Result<ItemResponse, Status> {
        let bytes = request.encoded_len() + ITEM_OVERHEAD_BYTES;
        if bytes > self.max_message_bytes {
            return Err(over_client_limit(
                "max_message_bytes",
                format!(
                    "request is {bytes} bytes in a batch message, over the client's \
                     max_message_bytes ({}); it was not sent",
                    self.max_message_bytes
                ),
            ));
        }
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Queued {
                request,
                bytes,
                reply,
            })
            .map_err(|_| not_sent("batch stream closed before the request was sent"))?;
        rx.await
            .map_err(|_| Status::unavailable("batch stream closed before the answer arrived"))?
    }
}

/// Turns one response item into the result the unary call would have given.
fn item_result(response: Option<ItemResponse>) -> Result<ItemResponse, Status> {
    match response {
        Some(ItemResponse::Error(e)) => Err(Status::with_details(
            Code::from(e.code),
            e.message,
            bytes::Bytes::from(e.details),
        )),
        Some(r) => Ok(r),
        None => Err(Status::internal("batch response item without a response")),
    }
}

/// Moves `first` and whatever else is queued into one batch of at most
/// [`MAX_ITEMS_PER_BATCH`] items and `max_bytes` encoded bytes (the first item is always
/// taken), registering each caller under a fresh id. Returns the batch and the item that did
/// not fit, which starts the next batch.
fn collect(
    first: Queued,
    rx: &mut mpsc::UnboundedReceiver<Queued>,
    pending: &mut HashMap<u64, Reply>,
    next_id: &mut u64,
    max_bytes: usize,
) -> (pb::BatchRequest, Option<Queued>) {
    let mut items = Vec::with_capacity(8);
    let mut bytes = 0usize;
    let mut next = Some(first);
    while let Some(q) = next.take() {
        if !q.reply.is_closed() {
            if !items.is_empty() && bytes.saturating_add(q.bytes) > max_bytes {
                return (pb::BatchRequest { items }, Some(q));
            }
            bytes = bytes.saturating_add(q.bytes);
            let id = *next_id;
            *next_id += 1;
            pending.insert(id, q.reply);
            items.push(pb::BatchRequestItem {
                id,
                request: Some(q.request),
            });
        }
        if items.len() < MAX_ITEMS_PER_BATCH {
            next = rx.try_recv().ok();
        }
    }
    (pb::BatchRequest { items }, None)
}

/// Fails every caller of a stream that ended and marks the connection closed: each pending
/// item (handed to the stream, so maybe applied) with `status`, each item still queued (never
/// sent) with a [`not_sent`] status, so that the retry loop knows it was not applied.
fn fail_all(
    state: &ConnState,
    pending: &mut HashMap<u64, Reply>,
    carry: Option<Queued>,
    rx: &mut mpsc::UnboundedReceiver<Queued>,
    status: &Status,
) {
    state.closed.store(true, Ordering::Release);
    rx.close();
    for (_, reply) in pending.drain() {
        let _ = reply.send(Err(status.clone()));
    }
    let unsent = std::iter::from_fn(|| rx.try_recv().ok());
    for q in carry.into_iter().chain(unsent) {
        let _ = q.reply.send(Err(not_sent(format!(
            "{} (the request was still queued: never sent)",
            status.message()
        ))));
    }
}

async fn drive(
    mut kv: KvClient<AuthChannel>,
    mut rx: mpsc::UnboundedReceiver<Queued>,
    state: Arc<ConnState>,
    max_batch_bytes: usize,
) {
    let mut pending: HashMap<u64, Reply> = HashMap::new();
    let mut next_id = 0u64;
    // No stream until there is something to send (an idle client holds no server task).
    let Some(first) = rx.recv().await else {
        state.closed.store(true, Ordering::Release);
        return;
    };
    let (out_tx, out_rx) = mpsc::channel::<pb::BatchRequest>(64);
    let (first, mut carry) = collect(first, &mut rx, &mut pending, &mut next_id, max_batch_bytes);
    // Queue the first batch before the call so it leaves with the request headers.
    let _ = out_tx.try_send(first);
    let mut inbound = match kv
        .batch(tokio_stream::wrappers::ReceiverStream::new(out_rx))
        .await
    {
        Ok(r) => r.into_inner(),
        Err(status) => {
            if status.code() == Code::Unimplemented {
                state.unsupported.store(true, Ordering::Release);
            }
            fail_all(&state, &mut pending, carry, &mut rx, &status);
            return;
        }
    };
    let mut out_tx = Some(out_tx);
    let end = loop {
        // An item that did not fit the last batch starts the next one.
        if carry.is_some() && out_tx.is_some() {
            let (Some(q), Some(tx)) = (carry.take(), &out_tx) else {
                continue;
            };
            let (batch, rest) = collect(q, &mut rx, &mut pending, &mut next_id, max_batch_bytes);
            carry = rest;
            if !batch.items.is_empty() && tx.send(batch).await.is_err() {
                break Status::unavailable("batch stream closed by the transport");
            }
            continue;
        }
        tokio::select! {
            queued = rx.recv(), if out_tx.is_some() => match queued {
                Some(q) => {
                    let (batch, rest) = collect(q, &mut rx, &mut pending, &mut next_id, max_batch_bytes);
                    carry = rest;
                    if batch.items.is_empty() {
                        continue;
                    }
                    let sent = match &out_tx {
                        Some(tx) => tx.send(batch).await.is_ok(),
                        None => false,
                    };
                    if !sent {
                        break Status::unavailable("batch stream closed by the transport");
                    }
                }
                // Every handle dropped: close our side, finish the pending answers.
                None => {
                    out_tx = None;
                    if pending.is_empty() {
                        return;
                    }
                }
            },
            message = inbound.message() => match message {
                Ok(Some(response)) => {
                    for item in response.items {
                        if let Some(reply) = pending.remove(&item.id) {
                            let _ = reply.send(item_result(item.response));
                        }
                    }
                    if out_tx.is_none() && pending.is_empty() {
                        return;
                    }
                }
                Ok(None) => break Status::unavailable("batch stream ended by the node"),
                Err(status) => break Status::unavailable(format!("batch stream failed: {}", status.message())),
            },
        }
    };
    fail_all(&state, &mut pending, carry, &mut rx, &end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_items_become_the_unary_status() {
        let status = item_result(Some(ItemResponse::Error(pb::ItemError {
            code: Code::FailedPrecondition as i32,
            message: "not the leader".into(),
            details: vec![1, 2, 3],
        })))
        .unwrap_err();
        assert_eq!(status.code(), Code::FailedPrecondition);
        assert_eq!(status.message(), "not the leader");
        assert_eq!(status.details(), &[1, 2, 3]);
        assert_eq!(item_result(None).unwrap_err().code(), Code::Internal);
        assert!(matches!(
            item_result(Some(ItemResponse::Put(pb::PutResponse { header: None }))),
            Ok(ItemResponse::Put(_))
        ));
    }

    #[tokio::test]
    async fn a_failed_stream_answers_every_item_sent_as_maybe_applied_and_unsent_as_not_sent() {
        let state = ConnState::default();
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut pending = HashMap::new();
        let (sent_reply, sent) = oneshot::channel();
        pending.insert(0, sent_reply);
        let (queued_reply, queued) = oneshot::channel();
        tx.send(Queued {
            request: ItemRequest::Get(pb::GetRequest {
                key: vec![1],
                consistency: 0,
            }),
            bytes: 8,
            reply: queued_reply,
        })
        .unwrap();
        let (carried_reply, carried) = oneshot::channel();
        let carry = Queued {
            request: ItemRequest::Get(pb::GetRequest {
                key: vec![2],
                consistency: 0,
            }),
            bytes: 8,
            reply: carried_reply,
        };
        fail_all(
            &state,
            &mut pending,
            Some(carry),
            &mut rx,
            &Status::unavailable("batch stream failed: reset"),
        );
        assert!(state.closed.load(Ordering::Acquire));
        let sent = crate::error::classify_status(&sent.await.unwrap().unwrap_err());
        assert!(!sent.not_applied && sent.retry, "an item on the wire: {sent:?}");
        let queued = crate::error::classify_status(&queued.await.unwrap().unwrap_err());
        assert!(
            queued.not_applied && queued.retry,
            "an item never sent is not applied: {queued:?}"
        );
        let carried = crate::error::classify_status(&carried.await.unwrap().unwrap_err());
        assert!(
            carried.not_applied,
            "the item that did not fit was never sent: {carried:?}"
        );
        assert!(tx.is_closed(), "later callers are refused, not queued forever");
    }

    #[tokio::test]
    async fn collect_packs_queued_items_and_skips_abandoned_callers() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut keep = Vec::new();
        for i in 0..5u8 {
            let (reply, r) = oneshot::channel();
            if i != 2 {
                keep.push(r); // caller 2 gave up before the driver ran
            }
            tx.send(Queued {
                request: ItemRequest::Get(pb::GetRequest {
                    key: vec![i],
                    consistency: 0,
                }),
                bytes: 10,
                reply,
            })
            .unwrap();
        }
        let first = rx.try_recv().unwrap();
        let mut pending = HashMap::new();
        let mut next_id = 7;
        let (batch, carry) = collect(first, &mut rx, &mut pending, &mut next_id, usize::MAX);
        assert!(carry.is_none());
        let keys: Vec<Vec<u8>> = batch
            .items
            .iter()
            .map(|i| match &i.request {
                Some(ItemRequest::Get(g)) => g.key.clone(),
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(keys, vec![vec![0], vec![1], vec![3], vec![4]]);
        let ids: Vec<u64> = batch.items.iter().map(|i| i.id).collect();
        assert_eq!(ids, vec![7, 8, 9, 10]);
        assert_eq!(next_id, 11);
        assert_eq!(pending.len(), 4);
        drop(keep);
    }

    #[tokio::test]
    async fn collect_stops_at_the_byte_cap_and_carries_the_item_that_did_not_fit() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut answers = Vec::new();
        for i in 0..5u8 {
            let (reply, r) = oneshot::channel();
            answers.push(r);
            tx.send(Queued {
                request: ItemRequest::Get(pb::GetRequest {
                    key: vec![i],
                    consistency: 0,
                }),
                bytes: 100,
                reply,
            })
            .unwrap();
        }
        let mut pending = HashMap::new();
        let mut next_id = 0;
        let first = rx.try_recv().unwrap();
        let (batch, carry) = collect(first, &mut rx, &mut pending, &mut next_id, 250);
        assert_eq!(batch.items.len(), 2, "two items of 100 bytes fit in 250");
        let carry = carry.expect("the third item is carried, not dropped");
        assert!(matches!(&carry.request, ItemRequest::Get(g) if g.key == vec![2]));
        let (batch, carry) = collect(carry, &mut rx, &mut pending, &mut next_id, 250);
        assert_eq!(batch.items.len(), 2);
        let (batch, carry) = collect(carry.unwrap(), &mut rx, &mut pending, &mut next_id, 250);
        assert_eq!(batch.items.len(), 1);
        assert!(carry.is_none());
        assert_eq!(pending.len(), 5, "every caller registered once");
        // An item larger than the cap still goes, alone.
        let (reply, _r) = oneshot::channel();
        let big = Queued {
            request: ItemRequest::Get(pb::GetRequest {
                key: vec![9],
                consistency: 0,
            }),
            bytes: 1000,
            reply,
        };
        let (batch, carry) = collect(big, &mut rx, &mut pending, &mut next_id, 250);
        assert_eq!((batch.items.len(), carry.is_none()), (1, true));
        drop(answers);
    }
}
