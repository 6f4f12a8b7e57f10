//! The apply path of the state machine: commands executed into one apply round's batch of
//! engine ops ([`ApplyBatch`], an overlay that transactions read through), under the limits
//! stamped into each command ([`ApplyLimits`], see `command.rs`):
//!
//! - an `Append` (single key or `UpsertRange`) that would leave a value over
//!   `max_value_bytes` refuses its whole command ([`CommandResult::ValueTooLarge`]). Appends stay
//!   blind in the engine, but the check reads the key (a range append reads its whole range) at
//!   apply time, on every replica;
//! - a Txn whose branch gets would return more than `max_response_bytes` value bytes refuses
//!   the whole Txn ([`CommandResult::ResponseTooLarge`]) before anything commits.
//!
//! A command that names a key in the reserved key space (`reserved_keys.rs`: the session table)
//! is refused whole ([`CommandResult::ReservedKey`]) and range ends are cut where that space
//! begins, whoever built the command.
//!
//! A refused command's ops are dropped from the batch again, so it applies none of its writes;
//! its result is kept in the session like any other (a retry gets the same refusal). Everything
//! here depends only on the command and the replicated state, so every replica decides alike.

use std::collections::HashMap;

use ftkv_engine::ops::{apply_broadcast, in_range};
use ftkv_engine::{apply_upsert, Engine, EngineError, UpsertOp, WriteOp};

use super::command::{ApplyLimits, Command, CommandBody, CommandResult, TxnOp};
use super::reserved_keys::{clamp_op, is_reserved, reserved_key_of};
use super::session::{SessionCheck, SessionTable};

/// Pairs read per engine scan while a range append measures its range.
const RANGE_READ_CHUNK_KEYS: usize = 64;

/// Data ops gathered in one apply round, with an index so transactions can read through them.
pub(super) struct ApplyBatch<'a> {
    engine: &'a dyn Engine,
    pub(super) ops: Vec<WriteOp>,
    /// `ops[..indexed]` are in `point` / `ranges` (built lazily: write-only rounds never index).
    indexed: usize,
    point: HashMap<Vec<u8>, Vec<usize>>,
    ranges: Vec<usize>,
}

impl<'a> ApplyBatch<'a> {
    pub(super) fn new(engine: &'a dyn Engine) -> Self {
        ApplyBatch {
            engine,
            ops: Vec::new(),
            indexed: 0,
            point: HashMap::new(),
            ranges: Vec::new(),
        }
    }

    fn push(&mut self, op: WriteOp) {
        self.ops.push(op);
    }

    fn catch_up_index(&mut self) {
        for (i, op) in self.ops.iter().enumerate().skip(self.indexed) {
            match op {
                WriteOp::Put { key, .. } | WriteOp::Delete { key } | WriteOp::Upsert { key, .. } => {
                    self.point.entry(key.clone()).or_default().push(i)
                }
                WriteOp::DeleteRange { .. } | WriteOp::UpsertRange { .. } => self.ranges.push(i),
            }
        }
        self.indexed = self.ops.len();
    }

    /// Drops `ops[len..]` (the ops of a refused command) and their index entries.
    fn truncate(&mut self, len: usize) {
        let ApplyBatch {
            ops,
            indexed,
            point,
            ranges,
            ..
        } = self;
        for op in ops.iter().take(*indexed).skip(len) {
            if let WriteOp::Put { key, .. } | WriteOp::Delete { key } | WriteOp::Upsert { key, .. } = op {
                if let Some(at) = point.get_mut(key) {
                    // Indexes are pushed in order: the dropped ones are at the tail.
                    while at.last().is_some_and(|&i| i >= len) {
                        at.pop();
                    }
                    if at.is_empty() {
                        point.remove(key);
                    }
                }
            }
        }
        while ranges.last().is_some_and(|&i| i >= len) {
            ranges.pop();
        }
        *indexed = (*indexed).min(len);
        ops.truncate(len);
    }

    /// Value of `key` after every op gathered so far.
    fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, EngineError> {
        self.catch_up_index();
        let value = self.engine.get(key)?;
        Ok(self.value_after(key, value))
    }

    /// Value of `key` after the indexed ops, from its engine value `value`.
    fn value_after(&self, key: &[u8], mut value: Option<Vec<u8>>) -> Option<Vec<u8>> {
        let mut touching: Vec<usize> = self.point.get(key).map(|v| v.to_vec()).unwrap_or_default();
        touching.extend(self.ranges.iter().copied());
        touching.sort_unstable();
        for i in touching {
            if let Some(op) = self.ops.get(i) {
                value = apply_op(value, op, key);
            }
        }
        value
    }

    /// Length of the longest value in `[start, end)` after every op gathered so far (`None`
    /// when no key there is present). Reads the whole range, [`RANGE_READ_CHUNK_KEYS`] pairs
    /// at a time.
    fn longest_value_in_range(
        &mut self,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> Result<Option<u64>, EngineError> {
        self.catch_up_index();
        let mut longest: Option<u64> = None;
        let mut note = |value: Option<Vec<u8>>| {
            if let Some(v) = value {
                longest = Some(longest.map_or(v.len() as u64, |l| l.max(v.len() as u64)));
            }
        };
        let mut from = start.to_vec();
        loop {
            let pairs = self.engine.scan(&from, end, RANGE_READ_CHUNK_KEYS)?;
            let full = pairs.len() >= RANGE_READ_CHUNK_KEYS;
            for (key, value) in pairs {
                note(self.value_after(&key, Some(value)));
                from = key;
            }
            if !full {
                break;
            }
            from.push(0);
        }
        // Keys written in this round may be absent from the engine still.
        let pending: Vec<Vec<u8>> = self
            .point
            .keys()
            .filter(|k| in_range(k, start, end))
            .cloned()
            .collect();
        for key in pending {
            let value = self.engine.get(&key)?;
            note(self.value_after(&key, value));
        }
        Ok(longest)
    }
}

/// The value of `key` after `op` (which is known to name `key` or a range).
fn apply_op(value: Option<Vec<u8>>, op: &WriteOp, key: &[u8]) -> Option<Vec<u8>> {
    match op {
        WriteOp::Put { value: v, .. } => Some(v.clone()),
        WriteOp::Delete { .. } => None,
        WriteOp::Upsert { op, .. } => apply_upsert(value.as_deref(), op),
        WriteOp::DeleteRange { start, end } => {
            if in_range(key, start, end.as_deref()) {
                None
            } else {
                value
            }
        }
        WriteOp::UpsertRange { start, end, op } => match value {
            Some(v) if in_range(key, start, end.as_deref()) => Some(apply_broadcast(&v, op)),
            other => other,
        },
    }
}

/// The size an append in `op` would leave a value at, when that is over `max_value_bytes`.
/// Single-key appends read their key; range appends read their range (through `batch`).
fn append_overflow(
    batch: &mut ApplyBatch<'_>,
    op: &WriteOp,
    max_value_bytes: u64,
) -> Result<Option<u64>, EngineError> {
    let grown = match op {
        WriteOp::Upsert {
            key,
            op: UpsertOp::Append(suffix),
        } => {
            let current = batch.get(key)?.map_or(0, |v| v.len() as u64);
            current.saturating_add(suffix.len() as u64)
        }
        WriteOp::UpsertRange {
            start,
            end,
            op: UpsertOp::Append(suffix),
        } if !suffix.is_empty() => match batch.longest_value_in_range(start, end.as_deref())? {
            Some(longest) => longest.saturating_add(suffix.len() as u64),
            None => 0,
        },
        _ => 0,
    };
    Ok((grown > max_value_bytes).then_some(grown))
}

/// Gathers write `op` (number `op_index` of its command) into `batch`, or returns the refusal
/// of its command when `limits` forbid it.
fn push_write(
    batch: &mut ApplyBatch<'_>,
    op: WriteOp,
    op_index: usize,
    limits: Option<&ApplyLimits>,
) -> Result<Option<CommandResult>, EngineError> {
    // Ranges stop where the reserved key space begins (`names_reserved_key` refused starts in it).
    let op = clamp_op(op);
    if let Some(limits) = limits {
        if let Some(value_bytes) = append_overflow(batch, &op, limits.max_value_bytes)? {
            return Ok(Some(CommandResult::ValueTooLarge {
                op_index: op_index as u64,
                value_bytes,
                max_value_bytes: limits.max_value_bytes,
            }));
        }
    }
    batch.push(op);
    Ok(None)
}

/// Whether `body` names a key or a range start in the reserved key space (compares and both
/// Txn branches included, so the answer does not depend on the data).
fn names_reserved_key(body: &CommandBody) -> bool {
    match body {
        CommandBody::Write(ops) => ops.iter().any(|op| reserved_key_of(op).is_some()),
        CommandBody::Txn {
            compares,
            success,
            failure,
        } => {
            compares.iter().any(|c| is_reserved(&c.key))
                || success.iter().chain(failure).any(|op| match op {
                    TxnOp::Write(w) => reserved_key_of(w).is_some(),
                    TxnOp::Get { key } => is_reserved(key),
                })
        }
    }
}

/// Runs `body` into `batch` under `limits` (`None`: unchecked). A refusal is returned as its
/// result with the command's ops still in `batch` (the caller drops them).
fn execute(
    batch: &mut ApplyBatch<'_>,
    body: CommandBody,
    limits: Option<&ApplyLimits>,
) -> Result<CommandResult, EngineError> {
    match body {
        CommandBody::Write(ops) => {
            for (op_index, op) in ops.into_iter().enumerate() {
                if let Some(refused) = push_write(batch, op, op_index, limits)? {
                    return Ok(refused);
                }
            }
            Ok(CommandResult::Written)
        }
        CommandBody::Txn {
            compares,
            success,
            failure,
        } => {
            let mut succeeded = true;
            for compare in &compares {
                let current = batch.get(&compare.key)?;
                if !compare.holds(current.as_deref()) {
                    succeeded = false;
                    break;
                }
            }
            let branch = if succeeded { success } else { failure };
            let mut results = Vec::with_capacity(branch.len());
            let mut response_bytes = 0u64;
            for (op_index, op) in branch.into_iter().enumerate() {
                match op {
                    TxnOp::Write(w) => {
                        if let Some(refused) = push_write(batch, w, op_index, limits)? {
                            return Ok(refused);
                        }
                        results.push(None);
                    }
                    TxnOp::Get { key } => {
                        let value = batch.get(&key)?;
                        response_bytes += value.as_ref().map_or(0, |v| v.len() as u64);
                        if let Some(limits) = limits {
                            if response_bytes > limits.max_response_bytes {
                                return Ok(CommandResult::ResponseTooLarge {
                                    response_bytes,
                                    max_response_bytes: limits.max_response_bytes,
                                });
                            }
                        }
                        results.push(value);
                    }
                }
            }
            Ok(CommandResult::Txn { succeeded, results })
        }
    }
}

/// Applies one command: session check, execution into `batch` (a refused command's ops are
/// dropped again: it applies none), session record (refusals included, so a retry gets the
/// same answer).
pub(super) fn apply_command(
    batch: &mut ApplyBatch<'_>,
    sessions: &mut SessionTable,
    command: Command,
    log_index: u64,
) -> Result<CommandResult, EngineError> {
    let session = command.session();
    // Fingerprint only commands with a session (it costs one re-encoding of the command).
    let fingerprint = session.map_or(0, |_| command.fingerprint());
    if let Some(s) = &session {
        match sessions.check(s, fingerprint, log_index) {
            SessionCheck::Fresh => {}
            SessionCheck::Duplicate(result) => return Ok(result),
            SessionCheck::Stale => return Ok(CommandResult::StaleSequence),
        }
    }
    let (limits, body) = command.into_parts();
    let mark = batch.ops.len();
    let result = if names_reserved_key(&body) {
        CommandResult::ReservedKey
    } else {
        execute(batch, body, limits.as_ref())?
    };
    if result.is_refusal() {
        batch.truncate(mark);
    }
    if let Some(s) = &session {
        sessions.record(s, fingerprint, &result, log_index);
    }
    Ok(result)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::cluster::command::{upsert, Session};
    use crate::cluster::state_machine::StateMachine;
    use crate::cluster::types::{Entry, EntryCommands};
    use ftkv_engine::model::ModelEngine;
    use openraft::storage::RaftStateMachine;
    use openraft::EntryPayload;

    fn entry(index: u64, commands: Vec<Command>) -> Entry {
        Entry {
            log_id: openraft::LogId::new(openraft::CommittedLeaderId::new(1, 1), index),
            payload: EntryPayload::Normal(EntryCommands { commands }),
        }
    }

    fn put(key: &[u8], len: usize) -> WriteOp {
        WriteOp::Put {
            key: key.to_vec(),
            value: vec![b'v'; len],
        }
    }

    fn append(key: &[u8], len: usize) -> WriteOp {
        upsert(key.to_vec(), UpsertOp::Append(vec![b'+'; len]))
    }

    fn append_range(start: &[u8], end: Option<&[u8]>, len: usize) -> WriteOp {
        WriteOp::UpsertRange {
            start: start.to_vec(),
            end: end.map(<[u8]>::to_vec),
            op: UpsertOp::Append(vec![b'+'; len]),
        }
    }

    const LIMITS: ApplyLimits = ApplyLimits {
        max_value_bytes: 1000,
        max_response_bytes: 1000,
    };

    fn limited(ops: Vec<WriteOp>) -> Command {
        Command::write(None, ops, LIMITS)
    }

    fn len_of(engine: &ModelEngine, key: &[u8]) -> Option<usize> {
        engine.get(key).unwrap().map(|v| v.len())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_past_the_stamped_max_value_bytes_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(ModelEngine::new());
        let mut sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
        let too_large = |op_index, value_bytes| CommandResult::ValueTooLarge {
            op_index,
            value_bytes,
            max_value_bytes: 1000,
        };
        sm.apply(vec![entry(1, vec![limited(vec![put(b"k", 600), put(b"j", 10)])])])
            .await
            .unwrap();
        // Single-key appends: up to the limit passes; past it the whole command is refused,
        // also when an earlier op of the same command or round made the value grow.
        let r = sm
            .apply(vec![entry(
                2,
                vec![
                    limited(vec![append(b"k", 300)]),
                    limited(vec![append(b"k", 101)]),
                    limited(vec![put(b"other", 1), append(b"k", 50), append(b"k", 51)]),
                    limited(vec![append(b"k", 50)]),
                ],
            )])
            .await
            .unwrap();
        assert_eq!(
            r[0].results,
            vec![
                CommandResult::Written,
                too_large(0, 1001),
                too_large(2, 1001),
                CommandResult::Written
            ]
        );
        assert_eq!(len_of(&engine, b"k"), Some(950));
        assert_eq!(
            len_of(&engine, b"other"),
            None,
            "a refused command applies none of its ops"
        );
        // A suffix over the limit on an absent key.
        let r = sm
            .apply(vec![entry(3, vec![limited(vec![append(b"new", 1001)])])])
            .await
            .unwrap();
        assert_eq!(r[0].results, vec![too_large(0, 1001)]);
        assert_eq!(len_of(&engine, b"new"), None);

        // Range appends: refused when any present key in the range would pass the limit,
        // keys written earlier in the same round included.
        let r = sm
            .apply(vec![entry(
                4,
                vec![
                    limited(vec![append_range(b"a", None, 51)]),
                    limited(vec![append_range(b"a", Some(b"k"), 40)]),
                    limited(vec![put(b"m", 990)]),
                    limited(vec![append_range(b"l", Some(b"z"), 11)]),
                    limited(vec![append_range(b"l", Some(b"z"), 10)]),
                ],
            )])
            .await
            .unwrap();
        assert_eq!(
            r[0].results,
            vec![
                too_large(0, 1001),
                CommandResult::Written,
                CommandResult::Written,
                too_large(0, 1001),
                CommandResult::Written
            ]
        );
        assert_eq!(len_of(&engine, b"k"), Some(950));
        assert_eq!(len_of(&engine, b"j"), Some(50));
        assert_eq!(len_of(&engine, b"m"), Some(1000));

        // Inside a Txn: the whole Txn is refused, its earlier writes included.
        let txn = Command::txn(
            None,
            vec![],
            vec![TxnOp::Write(put(b"marker", 1)), TxnOp::Write(append(b"m", 1))],
            vec![],
            LIMITS,
        );
        let r = sm.apply(vec![entry(5, vec![txn])]).await.unwrap();
        assert_eq!(r[0].results, vec![too_large(1, 1001)]);
        assert_eq!(len_of(&engine, b"marker"), None);

        // An unlimited (legacy) command applies as it always did.
        let r = sm
            .apply(vec![entry(
                6,
                vec![Command::Write {
                    session: None,
                    ops: vec![append(b"m", 1)],
                }],
            )])
            .await
            .unwrap();
        assert_eq!(r[0].results, vec![CommandResult::Written]);
        assert_eq!(len_of(&engine, b"m"), Some(1001));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn txn_reads_past_the_stamped_max_response_bytes_refuse_the_txn() {
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(ModelEngine::new());
        let mut sm = StateMachine::open(engine.clone(), dir.path()).unwrap();
        let keys: Vec<Vec<u8>> = (0..3).map(|i| format!("big/{i}").into_bytes()).collect();
        sm.apply(vec![entry(
            1,
            vec![limited(keys.iter().map(|k| put(k, 400)).collect())],
        )])
        .await
        .unwrap();
        let session = Session {
            client_id: 7,
            sequence: 1,
            first_incomplete: 1,
        };
        let gets = |n: usize| keys.iter().take(n).map(|k| TxnOp::Get { key: k.clone() });
        let txn = |session, n| {
            let mut success = vec![TxnOp::Write(put(b"marker", 1))];
            success.extend(gets(n));
            Command::txn(session, vec![], success, vec![], LIMITS)
        };
        let refused = CommandResult::ResponseTooLarge {
            response_bytes: 1200,
            max_response_bytes: 1000,
        };
        // An earlier command in the same round keeps its writes; the refused Txn applies none.
        let r = sm
            .apply(vec![entry(
                2,
                vec![limited(vec![put(b"before", 1)]), txn(Some(session), 3)],
            )])
            .await
            .unwrap();
        assert_eq!(r[0].results, vec![CommandResult::Written, refused.clone()]);
        assert_eq!(len_of(&engine, b"marker"), None);
        assert_eq!(len_of(&engine, b"before"), Some(1));
        // Its retry gets the same answer, still without applying.
        let r = sm
            .apply(vec![entry(3, vec![txn(Some(session), 3)])])
            .await
            .unwrap();
        assert_eq!(r[0].results, vec![refused]);
        assert_eq!(len_of(&engine, b"marker"), None);
        // Reads of values the Txn wrote itself count too.
        let own = Command::txn(
            None,
            vec![],
            vec![
                TxnOp::Write(put(b"own", 700)),
                TxnOp::Get { key: b"own".to_vec() },
                TxnOp::Get { key: b"own".to_vec() },
            ],
            vec![],
            LIMITS,
        );
        let r = sm.apply(vec![entry(4, vec![own])]).await.unwrap();
        assert_eq!(
            r[0].results,
            vec![CommandResult::ResponseTooLarge {
                response_bytes: 1400,
                max_response_bytes: 1000
            }]
        );
        assert_eq!(len_of(&engine, b"own"), None);
        // Within the limit the Txn commits and answers in full.
        let r = sm.apply(vec![entry(5, vec![txn(None, 2)])]).await.unwrap();
        assert_eq!(
            r[0].results,
            vec![CommandResult::Txn {
                succeeded: true,
                results: vec![None, Some(vec![b'v'; 400]), Some(vec![b'v'; 400])]
            }]
        );
        assert_eq!(len_of(&engine, b"marker"), Some(1));
    }
}
