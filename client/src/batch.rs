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

use ftkv_proto::v1 as pb;
use ftkv_proto::v1::kv_client::KvClient;
use pb::batch_request_item::Request as ItemRequest;
use pb::batch_response_item::Response as ItemResponse;
use tokio::sync::{mpsc, oneshot};
use tonic::transport::Channel;
use tonic::{Code, Status};

use crate::error::not_sent;

/// Most items the client packs into one `BatchRequest` (the node accepts up to 10,000).
pub const MAX_ITEMS_PER_BATCH: usize = 1_024;

type Reply = oneshot::Sender<Result<ItemResponse, Status>>;

struct Queued {
    request: ItemRequest,
    reply: Reply,
}

/// One `Kv.Batch` stream to one endpoint, shared by every caller (cheap to clone).
#[derive(Clone, Debug)]
pub(crate) struct BatchConn {
    tx: mpsc::UnboundedSender<Queued>,
    state: Arc<ConnState>,
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
    pub(crate) fn open(kv: KvClient<Channel>) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let state = Arc::new(ConnState::default());
        tokio::spawn(drive(kv, rx, state.clone()));
        BatchConn { tx, state }
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
    /// Errors: the item's own error status (as the unary RPC would return it), or
    /// `UNAVAILABLE` when the stream broke before the answer arrived.
    pub(crate) async fn call(&self, request: ItemRequest) -> Result<ItemResponse, Status> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Queued { request, reply })
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

/// Moves `first` and whatever else is queued (up to [`MAX_ITEMS_PER_BATCH`]) into one batch,
/// registering each caller under a fresh id.
fn collect(
    first: Queued,
    rx: &mut mpsc::UnboundedReceiver<Queued>,
    pending: &mut HashMap<u64, Reply>,
    next_id: &mut u64,
) -> pb::BatchRequest {
    let mut items = Vec::with_capacity(8);
    let mut next = Some(first);
    while let Some(q) = next.take() {
        if !q.reply.is_closed() {
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
    pb::BatchRequest { items }
}

/// Fails every caller of a stream that ended and marks the connection closed: each pending
/// item (handed to the stream, so maybe applied) with `status`, each item still queued (never
/// sent) with a [`not_sent`] status, so that the retry loop knows it was not applied.
fn fail_all(
    state: &ConnState,
    pending: &mut HashMap<u64, Reply>,
    rx: &mut mpsc::UnboundedReceiver<Queued>,
    status: &Status,
) {
    state.closed.store(true, Ordering::Release);
    rx.close();
    for (_, reply) in pending.drain() {
        let _ = reply.send(Err(status.clone()));
    }
    while let Ok(q) = rx.try_recv() {
        let _ = q.reply.send(Err(not_sent(format!(
            "{} (the request was still queued: never sent)",
            status.message()
        ))));
    }
}

async fn drive(mut kv: KvClient<Channel>, mut rx: mpsc::UnboundedReceiver<Queued>, state: Arc<ConnState>) {
    let mut pending: HashMap<u64, Reply> = HashMap::new();
    let mut next_id = 0u64;
    // No stream until there is something to send (an idle client holds no server task).
    let Some(first) = rx.recv().await else {
        state.closed.store(true, Ordering::Release);
        return;
    };
    let (out_tx, out_rx) = mpsc::channel::<pb::BatchRequest>(64);
    let first = collect(first, &mut rx, &mut pending, &mut next_id);
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
            fail_all(&state, &mut pending, &mut rx, &status);
            return;
        }
    };
    let mut out_tx = Some(out_tx);
    let end = loop {
        tokio::select! {
            queued = rx.recv(), if out_tx.is_some() => match queued {
                Some(q) => {
                    let batch = collect(q, &mut rx, &mut pending, &mut next_id);
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
    fail_all(&state, &mut pending, &mut rx, &end);
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
            reply: queued_reply,
        })
        .unwrap();
        fail_all(
            &state,
            &mut pending,
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
                reply,
            })
            .unwrap();
        }
        let first = rx.try_recv().unwrap();
        let mut pending = HashMap::new();
        let mut next_id = 7;
        let batch = collect(first, &mut rx, &mut pending, &mut next_id);
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
}
