//! Proto requests → validated cluster commands, and command results → statuses. All
//! validation against [`Limits`] that needs no data happens here, before anything is proposed;
//! what depends on the data (the size an append leaves, the bytes a Txn reads) is checked by the
//! state machine under the limits stamped into the command ([`apply_limits`]) and comes back as
//! a refusal ([`refusal`]).
//!
//! Keys in the reserved key space (`cluster::reserved_keys`: the state machine's session
//! table) are refused here for every key and range start ([`client_key`], [`range_start`]), and
//! every range end is cut where that space begins ([`client_range_end`]).

use ftkv_engine::{UpsertOp, WriteOp};
use ftkv_proto::v1 as pb;
use tonic::Status;

use super::errors;
use crate::cluster::command::ApplyLimits;
use crate::cluster::reserved_keys::{self, RESERVED_KEY_PREFIX};
use crate::cluster::{CommandResult, Compare, CompareOp, CompareTarget, Session, TxnOp};
use crate::limits::{LimitError, Limits, MAX_RESPONSE_BYTES};

/// Config name of the Txn read limit ([`MAX_RESPONSE_BYTES`], not configurable) in errors.
pub const MAX_RESPONSE_BYTES_NAME: &str = "max_response_bytes";

/// The limits this node stamps into the commands it proposes: its `max_value_bytes` and
/// [`MAX_RESPONSE_BYTES`]. Every replica applies a command under these, not its own config.
pub fn apply_limits(limits: &Limits) -> ApplyLimits {
    ApplyLimits {
        max_value_bytes: limits.max_value_bytes.as_u64(),
        max_response_bytes: MAX_RESPONSE_BYTES as u64,
    }
}

/// The status of a command the state machine refused under its limits (`INVALID_ARGUMENT`
/// with an ErrorInfo naming the limit: nothing was applied, retrying it unchanged fails
/// again), or `None` for any other result.
pub fn refusal(result: &CommandResult) -> Option<Status> {
    let (err, detail) = match *result {
        CommandResult::ValueTooLarge {
            op_index,
            value_bytes,
            max_value_bytes,
        } => (
            LimitError::Over {
                limit: "max_value_bytes",
                what: "value size in bytes after the append",
                actual: value_bytes,
                max: max_value_bytes,
            },
            format!("op {op_index} of the request"),
        ),
        CommandResult::ResponseTooLarge {
            response_bytes,
            max_response_bytes,
        } => (
            LimitError::Over {
                limit: MAX_RESPONSE_BYTES_NAME,
                what: "value bytes the txn's gets would return",
                actual: response_bytes,
                max: max_response_bytes,
            },
            "read fewer keys per txn".to_string(),
        ),
        CommandResult::ReservedKey => return Some(reserved_key_status("a key")),
        _ => return None,
    };
    let info = pb::ErrorInfo {
        kind: pb::error_info::Kind::Limit as i32,
        message: format!("{err} ({detail}); nothing was applied"),
        limit: err.limit_name().to_string(),
        ..Default::default()
    };
    Some(errors::status(tonic::Code::InvalidArgument, info))
}

/// Running size of a batch being validated.
#[derive(Default)]
pub struct BatchSize {
    ops: u64,
    bytes: u64,
}

impl BatchSize {
    fn add(&mut self, bytes: usize) {
        self.ops += 1;
        self.bytes += bytes as u64;
    }

    /// Checks the whole batch against the limits.
    pub fn check(&self, limits: &Limits) -> Result<(), Status> {
        limits
            .check_batch(self.ops, self.bytes)
            .map_err(|e| errors::limit(&e))
    }
}

/// The session of a request (`None` when absent or client_id 0).
pub fn session(s: Option<pb::Session>) -> Result<Option<Session>, Status> {
    match s {
        None => Ok(None),
        Some(s) if s.client_id == 0 => Ok(None),
        Some(s) => {
            if s.sequence == 0 {
                return Err(errors::invalid("session.sequence must be >= 1"));
            }
            if s.first_incomplete > s.sequence {
                return Err(errors::invalid(
                    "session.first_incomplete must be <= session.sequence",
                ));
            }
            Ok(Some(Session {
                client_id: s.client_id,
                sequence: s.sequence,
                first_incomplete: s.first_incomplete,
            }))
        }
    }
}

/// `INVALID_ARGUMENT` for `what` (a key, a range start) in the reserved key space.
fn reserved_key_status(what: &str) -> Status {
    errors::invalid(format!(
        "{what} of the request is in the reserved key space (keys starting with {}), which \
         only the server writes; nothing was applied",
        hex_prefix()
    ))
}

fn hex_prefix() -> String {
    RESERVED_KEY_PREFIX
        .iter()
        .map(|b| format!("0x{b:02X} "))
        .collect::<String>()
        .trim_end()
        .to_string()
}

/// Validates a key a client names (Get, Put, Delete, Upsert, Txn compares and gets): within
/// `max_key_bytes`, not empty, not reserved.
pub fn client_key(limits: &Limits, k: &[u8]) -> Result<(), Status> {
    limits.check_key(k).map_err(|e| errors::limit(&e))?;
    if reserved_keys::is_reserved(k) {
        return Err(reserved_key_status("a key"));
    }
    Ok(())
}

/// Validates the start of a range a client names (Scan, DeleteRange, UpsertRange): within the
/// key limit and not in the reserved key space (a range starting there holds no client key).
pub fn range_start(limits: &Limits, start: &[u8]) -> Result<(), Status> {
    bound(limits, start)?;
    if reserved_keys::is_reserved(start) {
        return Err(reserved_key_status("the range start"));
    }
    Ok(())
}

/// The end of a client range (empty = unbounded) cut where the reserved key space begins: a
/// range never reaches a reserved key.
pub fn client_range_end(end: Vec<u8>) -> Vec<u8> {
    reserved_keys::clamp_range_end(range_end(end)).unwrap_or_default()
}

fn key(limits: &Limits, k: &[u8]) -> Result<(), Status> {
    client_key(limits, k)
}

fn value(limits: &Limits, v: &[u8]) -> Result<(), Status> {
    limits.check_value(v).map_err(|e| errors::limit(&e))
}

fn bound(limits: &Limits, b: &[u8]) -> Result<(), Status> {
    limits.check_bound(b).map_err(|e| errors::limit(&e))
}

/// Converts and validates an upsert op.
pub fn upsert_op(
    limits: &Limits,
    op: Option<pb::UpsertOp>,
    size: &mut BatchSize,
) -> Result<UpsertOp, Status> {
    let op = op
        .and_then(|o| o.op)
        .ok_or_else(|| errors::invalid("upsert op is missing"))?;
    Ok(match op {
        pb::upsert_op::Op::SetIfAbsent(v) => {
            value(limits, &v)?;
            size.bytes += v.len() as u64;
            UpsertOp::SetIfAbsent(v)
        }
        pb::upsert_op::Op::Add(n) => UpsertOp::Add(n),
        pb::upsert_op::Op::Append(v) => {
            value(limits, &v)?;
            size.bytes += v.len() as u64;
            UpsertOp::Append(v)
        }
        pb::upsert_op::Op::Max(v) => {
            value(limits, &v)?;
            size.bytes += v.len() as u64;
            UpsertOp::Max(v)
        }
    })
}

/// Refuses a range whose non-empty end sorts before its start (an empty end is unbounded).
pub fn check_range(start: &[u8], end: &[u8]) -> Result<(), Status> {
    if !end.is_empty() && end < start {
        return Err(errors::invalid(
            "range end sorts before range start (an empty end means unbounded)",
        ));
    }
    Ok(())
}

fn range_end(end: Vec<u8>) -> Option<Vec<u8>> {
    if end.is_empty() {
        None
    } else {
        Some(end)
    }
}

/// Converts and validates one write op.
pub fn write_op(limits: &Limits, op: pb::WriteOp, size: &mut BatchSize) -> Result<WriteOp, Status> {
    let op = op.op.ok_or_else(|| errors::invalid("write op is empty"))?;
    Ok(match op {
        pb::write_op::Op::Put(p) => put(limits, p, size)?,
        pb::write_op::Op::Delete(d) => {
            key(limits, &d.key)?;
            size.add(d.key.len());
            WriteOp::Delete { key: d.key }
        }
        pb::write_op::Op::Upsert(u) => upsert_key(limits, u.key, u.op, size)?,
        pb::write_op::Op::DeleteRange(r) => {
            range_start(limits, &r.start)?;
            bound(limits, &r.end)?;
            check_range(&r.start, &r.end)?;
            size.add(r.start.len() + r.end.len());
            WriteOp::DeleteRange {
                start: r.start,
                end: range_end(client_range_end(r.end)),
            }
        }
        pb::write_op::Op::UpsertRange(r) => {
            range_start(limits, &r.start)?;
            bound(limits, &r.end)?;
            check_range(&r.start, &r.end)?;
            size.add(r.start.len() + r.end.len());
            let op = upsert_op(limits, r.op, size)?;
            WriteOp::UpsertRange {
                start: r.start,
                end: range_end(client_range_end(r.end)),
                op,
            }
        }
    })
}

/// Validates a put.
pub fn put(limits: &Limits, p: pb::PutOp, size: &mut BatchSize) -> Result<WriteOp, Status> {
    key(limits, &p.key)?;
    value(limits, &p.value)?;
    size.add(p.key.len() + p.value.len());
    Ok(WriteOp::Put {
        key: p.key,
        value: p.value,
    })
}

/// Validates a single-key upsert.
pub fn upsert_key(
    limits: &Limits,
    k: Vec<u8>,
    op: Option<pb::UpsertOp>,
    size: &mut BatchSize,
) -> Result<WriteOp, Status> {
    key(limits, &k)?;
    size.add(k.len());
    let op = upsert_op(limits, op, size)?;
    Ok(WriteOp::Upsert { key: k, op })
}

/// Converts and validates a txn compare.
pub fn compare(limits: &Limits, c: pb::Compare, size: &mut BatchSize) -> Result<Compare, Status> {
    key(limits, &c.key)?;
    value(limits, &c.value)?;
    size.add(c.key.len() + c.value.len());
    let target = match pb::compare::Target::try_from(c.target) {
        Ok(pb::compare::Target::Value) => CompareTarget::Value,
        Ok(pb::compare::Target::Exists) => CompareTarget::Exists,
        Err(_) => return Err(errors::invalid(format!("unknown compare target {}", c.target))),
    };
    let op = match pb::compare::Result::try_from(c.result) {
        Ok(pb::compare::Result::Equal) => CompareOp::Equal,
        Ok(pb::compare::Result::NotEqual) => CompareOp::NotEqual,
        Ok(pb::compare::Result::Greater) => CompareOp::Greater,
        Ok(pb::compare::Result::Less) => CompareOp::Less,
        Err(_) => return Err(errors::invalid(format!("unknown compare result {}", c.result))),
    };
    Ok(Compare {
        key: c.key,
        target,
        op,
        operand: c.value,
    })
}

/// Converts and validates a txn op.
pub fn txn_op(limits: &Limits, op: pb::TxnOp, size: &mut BatchSize) -> Result<TxnOp, Status> {
    let op = op.op.ok_or_else(|| errors::invalid("txn op is empty"))?;
    let write =
        |o: pb::write_op::Op, size: &mut BatchSize| write_op(limits, pb::WriteOp { op: Some(o) }, size);
    Ok(match op {
        pb::txn_op::Op::Put(p) => TxnOp::Write(write(pb::write_op::Op::Put(p), size)?),
        pb::txn_op::Op::Delete(d) => TxnOp::Write(write(pb::write_op::Op::Delete(d), size)?),
        pb::txn_op::Op::Upsert(u) => TxnOp::Write(write(pb::write_op::Op::Upsert(u), size)?),
        pb::txn_op::Op::DeleteRange(r) => TxnOp::Write(write(pb::write_op::Op::DeleteRange(r), size)?),
        pb::txn_op::Op::Get(g) => {
            key(limits, &g.key)?;
            size.add(g.key.len());
            TxnOp::Get { key: g.key }
        }
    })
}
