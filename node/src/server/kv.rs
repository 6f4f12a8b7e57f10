//! `ftkv.v1.Kv`: validates requests, proposes writes through the cluster layer, serves reads
//! from the engine after a ReadIndex barrier (linearizable) or directly (serializable).

use std::sync::Arc;

use ftkv_engine::WriteOp;
use ftkv_proto::v1 as pb;
use ftkv_proto::v1::kv_server::Kv;
use tonic::{Request, Response, Status};

use super::auth::{needs, AuthGuard};
use super::convert::{self, BatchSize};
use super::errors;
use crate::cluster::{ClusterNode, Command, CommandResult, TxnOp};
use crate::limits::{
    Limits, DEFAULT_SCAN_LIMIT, MAX_RESPONSE_BYTES, MAX_RESPONSE_MESSAGE_BYTES, MAX_SCAN_LIMIT,
};

/// Protobuf framing of one `KeyValue` in a Scan page at most (two field tags and lengths, the
/// repeated field's tag and length), counted with its bytes so a page of many tiny pairs fits too.
const PAIR_FRAMING_BYTES: usize = 16;

/// Room for wrapping a unary answer as a `Kv.Batch` item (item id, oneof tag and length, the
/// repeated field's tag and length): a unary answer that fits leaves its batch item fitting too.
const BATCH_ITEM_FRAMING_BYTES: usize = 32;

/// Refuses an answer whose encoding would be over [`MAX_RESPONSE_MESSAGE_BYTES`] (so neither
/// the transport nor a stock client's 4 MiB decoding limit ever cuts it); `wrote`: the request
/// applied writes, which the error must not deny.
fn fit<M: prost::Message>(what: &str, answer: M, wrote: bool) -> Result<Response<M>, Status> {
    let bytes = answer.encoded_len();
    if bytes + BATCH_ITEM_FRAMING_BYTES > MAX_RESPONSE_MESSAGE_BYTES {
        return Err(errors::response_too_large(what, bytes, wrote));
    }
    Ok(Response::new(answer))
}

/// The Kv service of one node.
#[derive(Clone)]
pub struct KvService {
    cluster: ClusterNode,
    limits: Arc<Limits>,
    auth: Arc<AuthGuard>,
}

impl KvService {
    /// Serves `cluster` with request `limits`, checking callers with `auth`.
    pub fn new(cluster: ClusterNode, limits: Limits, auth: Arc<AuthGuard>) -> Self {
        Self {
            cluster,
            limits: Arc::new(limits),
            auth,
        }
    }

    fn header(&self, log_index: u64) -> Option<pb::ResponseHeader> {
        let st = self.cluster.status();
        Some(pb::ResponseHeader {
            node_id: st.node_id,
            term: st.term,
            log_index,
        })
    }

    /// Waits for the read barrier when asked for a linearizable read; returns the read index
    /// (or the applied index for a serializable read).
    async fn barrier(&self, consistency: i32) -> Result<u64, Status> {
        match pb::ReadConsistency::try_from(consistency) {
            Ok(pb::ReadConsistency::Linearizable) => {
                self.cluster.read_barrier().await.map_err(errors::cluster)
            }
            Ok(pb::ReadConsistency::Serializable) => Ok(self.cluster.status().applied_index),
            Err(_) => Err(errors::invalid(format!("unknown read consistency {consistency}"))),
        }
    }

    async fn propose(&self, command: Command) -> Result<(CommandResult, u64), Status> {
        let (result, index) = self.cluster.write(command).await.map_err(errors::cluster)?;
        // Refused by the state machine under the limits stamped in the command: not applied.
        if let Some(status) = convert::refusal(&result) {
            return Err(status);
        }
        match result {
            CommandResult::StaleSequence => {
                // The original outcome was applied or refused, then forgotten: unknown here.
                return Err(errors::stale_sequence());
            }
            CommandResult::TooLargeToKeep => {
                return Err(errors::ambiguous(
                    "duplicate of an applied request whose result was too large to keep; it was \
                     not applied again",
                ));
            }
            CommandResult::SequenceReused => {
                return Err(errors::invalid(
                    "session sequence was already used by a different request of this client",
                ));
            }
            _ => {}
        }
        Ok((result, index))
    }

    async fn write_ops(&self, session: Option<pb::Session>, ops: Vec<WriteOp>) -> Result<u64, Status> {
        let session = convert::session(session)?;
        let limits = convert::apply_limits(&self.limits);
        let (_, index) = self.propose(Command::write(session, ops, limits)).await?;
        Ok(index)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&dyn ftkv_engine::Engine) -> ftkv_engine::Result<T> + Send + 'static,
    ) -> Result<T, Status> {
        let engine = self.cluster.engine();
        tokio::task::spawn_blocking(move || f(engine.as_ref()))
            .await
            .map_err(|e| Status::internal(format!("read task failed: {e}")))?
            .map_err(|e| errors::engine(&e))
    }
}

#[tonic::async_trait]
impl Kv for KvService {
    type BatchStream = super::batch::BatchStream;

    async fn bulk_load(
        &self,
        request: Request<tonic::Streaming<pb::BulkLoadRequest>>,
    ) -> Result<Response<pb::BulkLoadResponse>, Status> {
        let caller = self.auth.caller(&request).await?;
        super::bulk_load::serve(
            &self.cluster,
            &self.limits,
            (&self.auth, &caller),
            request.into_inner(),
        )
        .await
        .map(Response::new)
    }

    async fn batch(
        &self,
        request: Request<tonic::Streaming<pb::BatchRequest>>,
    ) -> Result<Response<Self::BatchStream>, Status> {
        let token = request.metadata().get(super::auth::AUTHORIZATION).cloned();
        let cert = super::auth::cert_user(request.extensions());
        Ok(Response::new(super::batch::serve(
            Arc::new(self.clone()),
            super::batch::Credentials { token, cert },
            request.into_inner(),
        )))
    }

    async fn get(&self, request: Request<pb::GetRequest>) -> Result<Response<pb::GetResponse>, Status> {
        let caller = self.auth.caller(&request).await?;
        let req = request.into_inner();
        convert::client_key(&self.limits, &req.key)?;
        self.auth.allow(&caller, &needs::read_key(&req.key))?;
        let index = self.barrier(req.consistency).await?;
        let key = req.key;
        let value = self.blocking(move |e| e.get(&key)).await?;
        let answer = pb::GetResponse {
            header: self.header(index),
            found: value.is_some(),
            value: value.unwrap_or_default(),
        };
        fit("the Get answer", answer, false)
    }

    async fn put(&self, request: Request<pb::PutRequest>) -> Result<Response<pb::PutResponse>, Status> {
        let caller = self.auth.caller(&request).await?;
        let req = request.into_inner();
        let op = convert::put(
            &self.limits,
            pb::PutOp {
                key: req.key,
                value: req.value,
            },
            &mut BatchSize::default(),
        )?;
        self.auth.allow(&caller, &[needs::write_op(&op)])?;
        let index = self.write_ops(req.session, vec![op]).await?;
        Ok(Response::new(pb::PutResponse {
            header: self.header(index),
        }))
    }

    async fn delete(
        &self,
        request: Request<pb::DeleteRequest>,
    ) -> Result<Response<pb::DeleteResponse>, Status> {
        let caller = self.auth.caller(&request).await?;
        let req = request.into_inner();
        convert::client_key(&self.limits, &req.key)?;
        self.auth.allow(
            &caller,
            &[needs::write_op(&WriteOp::Delete { key: req.key.clone() })],
        )?;
        let index = self
            .write_ops(req.session, vec![WriteOp::Delete { key: req.key }])
            .await?;
        Ok(Response::new(pb::DeleteResponse {
            header: self.header(index),
        }))
    }

    async fn scan(&self, request: Request<pb::ScanRequest>) -> Result<Response<pb::ScanResponse>, Status> {
        let caller = self.auth.caller(&request).await?;
        let req = request.into_inner();
        convert::range_start(&self.limits, &req.start)?;
        self.limits.check_bound(&req.end).map_err(|e| errors::limit(&e))?;
        convert::check_range(&req.start, &req.end)?;
        self.auth.allow(&caller, &needs::scan(&req.start, &req.end))?;
        // Never into the reserved key space (an unbounded end stops where it begins).
        let end = convert::client_range_end(req.end);
        let limit = match req.limit {
            0 => DEFAULT_SCAN_LIMIT,
            n => n.min(MAX_SCAN_LIMIT),
        } as usize;
        let index = self.barrier(req.consistency).await?;
        let (start, keys_only) = (req.start, req.keys_only);
        let mut pairs = self
            .blocking(move |e| e.scan(&start, if end.is_empty() { None } else { Some(&end) }, limit + 1))
            .await?;
        let mut more = pairs.len() > limit;
        pairs.truncate(limit);
        // Cut the page by bytes too (at least one pair), framing included, so it always fits
        // in what a stock gRPC client accepts (`more` and `next_start` carry on from there).
        let mut page_bytes = 0usize;
        if let Some(cut) = pairs.iter().position(|(k, v)| {
            page_bytes += k.len() + if keys_only { 0 } else { v.len() } + PAIR_FRAMING_BYTES;
            page_bytes > MAX_RESPONSE_BYTES
        }) {
            let keep = cut.max(1);
            if keep < pairs.len() {
                pairs.truncate(keep);
                more = true;
            }
        }
        let next_start = match (more, pairs.last()) {
            (true, Some((k, _))) => {
                let mut next = k.clone();
                next.push(0);
                next
            }
            _ => Vec::new(),
        };
        let kvs = pairs
            .into_iter()
            .map(|(key, value)| pb::KeyValue {
                key,
                value: if keys_only { Vec::new() } else { value },
            })
            .collect();
        let answer = pb::ScanResponse {
            header: self.header(index),
            kvs,
            more,
            next_start,
        };
        fit("the Scan page", answer, false)
    }

    async fn write(&self, request: Request<pb::WriteRequest>) -> Result<Response<pb::WriteResponse>, Status> {
        let caller = self.auth.caller(&request).await?;
        let req = request.into_inner();
        if req.ops.is_empty() {
            return Err(errors::invalid("write needs at least one op"));
        }
        let mut size = BatchSize::default();
        let ops = req
            .ops
            .into_iter()
            .map(|op| convert::write_op(&self.limits, op, &mut size))
            .collect::<Result<Vec<_>, _>>()?;
        size.check(&self.limits)?;
        self.auth.allow(&caller, &needs::write_ops(&ops))?;
        let index = self.write_ops(req.session, ops).await?;
        Ok(Response::new(pb::WriteResponse {
            header: self.header(index),
        }))
    }

    async fn txn(&self, request: Request<pb::TxnRequest>) -> Result<Response<pb::TxnResponse>, Status> {
        let caller = self.auth.caller(&request).await?;
        let req = request.into_inner();
        let mut size = BatchSize::default();
        let compares = req
            .compare
            .into_iter()
            .map(|c| convert::compare(&self.limits, c, &mut size))
            .collect::<Result<Vec<_>, _>>()?;
        let success = req
            .success
            .into_iter()
            .map(|o| convert::txn_op(&self.limits, o, &mut size))
            .collect::<Result<Vec<_>, _>>()?;
        let failure = req
            .failure
            .into_iter()
            .map(|o| convert::txn_op(&self.limits, o, &mut size))
            .collect::<Result<Vec<_>, _>>()?;
        size.check(&self.limits)?;
        self.auth
            .allow(&caller, &needs::txn(&compares, &success, &failure))?;
        let wrote = success
            .iter()
            .chain(failure.iter())
            .any(|op| matches!(op, TxnOp::Write(_)));
        let session = convert::session(req.session)?;
        let (result, index) = self
            .propose(Command::txn(
                session,
                compares,
                success,
                failure,
                convert::apply_limits(&self.limits),
            ))
            .await?;
        let CommandResult::Txn { succeeded, results } = result else {
            return Err(Status::internal(format!(
                "txn produced an unexpected result {result:?}"
            )));
        };
        let results = results
            .into_iter()
            .map(|r| pb::TxnOpResult {
                found: r.is_some(),
                value: r.unwrap_or_default(),
            })
            .collect();
        let answer = pb::TxnResponse {
            header: self.header(index),
            succeeded,
            results,
        };
        fit(&format!("the Txn answer (log index {index})"), answer, wrote)
    }

    async fn upsert(
        &self,
        request: Request<pb::UpsertRequest>,
    ) -> Result<Response<pb::UpsertResponse>, Status> {
        let caller = self.auth.caller(&request).await?;
        let req = request.into_inner();
        let op = convert::upsert_key(&self.limits, req.key, req.op, &mut BatchSize::default())?;
        self.auth.allow(&caller, &[needs::write_op(&op)])?;
        let index = self.write_ops(req.session, vec![op]).await?;
        Ok(Response::new(pb::UpsertResponse {
            header: self.header(index),
        }))
    }
}
