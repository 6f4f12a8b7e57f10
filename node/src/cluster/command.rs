//! What the replicated state machine executes: commands carried in Raft entries, and their
//! results. These types are the contract between `server/` (which builds them from proto
//! requests) and `cluster/` (which replicates and applies them). Serialized with serde inside
//! Raft entries and snapshots, so enum variants are only ever appended.
//!
//! **Limits travel with the command.** What the state machine checks at apply time (the size an
//! `Append` may grow a value to, the bytes a Txn's reads may return) must be the same on every
//! replica, whatever each replica's own config file says. So the node that proposes a command
//! stamps its limits into it ([`ApplyLimits`], in [`Command::LimitedWrite`] and
//! [`Command::LimitedTxn`], what the server proposes); every replica applies the command under
//! exactly the limits in the log entry. The original `Write` and `Txn` variants (entries written
//! before the limits were stamped) apply unchecked, as they were applied when first committed,
//! so replaying an old log gives the state it gave then.

use ftkv_engine::{OnDuplicate, UpsertOp, WriteOp};
use serde::{Deserialize, Serialize};

/// Exactly-once identity of a client write (Raft thesis section 6.3; RIFL).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Session {
    /// Random per client instance; never 0.
    pub client_id: u64,
    /// Increases by one per write of this client, starting at 1.
    pub sequence: u64,
    /// Lowest sequence the client still waits for; results below it may be forgotten.
    pub first_incomplete: u64,
}

/// What a transaction compare looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareTarget {
    /// The value bytes. An absent key matches only `NotEqual`.
    Value,
    /// Existence: `Equal` = exists, `NotEqual` = absent; the operand is ignored.
    Exists,
}

/// Comparison operator of a transaction compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CompareOp {
    /// `value == operand`
    Equal,
    /// `value != operand`
    NotEqual,
    /// `value > operand` (byte-wise)
    Greater,
    /// `value < operand` (byte-wise)
    Less,
}

/// One guard of a transaction (etcd `Compare`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Compare {
    /// Key compared.
    pub key: Vec<u8>,
    /// Value or existence.
    pub target: CompareTarget,
    /// Operator.
    pub op: CompareOp,
    /// Operand for `Value` compares.
    pub operand: Vec<u8>,
}

impl Compare {
    /// Whether the compare holds for the current value of its key (`None` = absent).
    pub fn holds(&self, current: Option<&[u8]>) -> bool {
        match (self.target, current) {
            (CompareTarget::Exists, cur) => match self.op {
                CompareOp::Equal => cur.is_some(),
                CompareOp::NotEqual => cur.is_none(),
                CompareOp::Greater | CompareOp::Less => false,
            },
            (CompareTarget::Value, None) => self.op == CompareOp::NotEqual,
            (CompareTarget::Value, Some(v)) => match self.op {
                CompareOp::Equal => v == self.operand.as_slice(),
                CompareOp::NotEqual => v != self.operand.as_slice(),
                CompareOp::Greater => v > self.operand.as_slice(),
                CompareOp::Less => v < self.operand.as_slice(),
            },
        }
    }
}

/// One op of a transaction branch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum TxnOp {
    /// A write (put, delete, upsert, range delete, range upsert).
    Write(WriteOp),
    /// Read one key as of this point in the transaction.
    Get {
        /// Key read.
        key: Vec<u8>,
    },
}

/// Limits the proposing node stamps into a command (see the module docs); every replica checks
/// these, never its own config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApplyLimits {
    /// Largest value an `Append` (single key or range) may leave: `limits.max_value_bytes` of
    /// the proposer.
    pub max_value_bytes: u64,
    /// Most value bytes the gets of the Txn branch that runs may return
    /// (`crate::limits::MAX_RESPONSE_BYTES` of the proposer).
    pub max_response_bytes: u64,
}

/// Identity of one bulk load (`bulk.rs`): the term of the leader that took it and a nonce that
/// leader picked. Chunks of a load are only staged in entries of that term: a leader change
/// cancels the load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct LoadId {
    /// Term of the leader that took the load.
    pub term: u64,
    /// Picked by that leader, unique among its loads.
    pub nonce: u64,
}

/// A replicated command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Atomic batch of writes, applied without apply-time limits (entries from before
    /// [`Command::LimitedWrite`]; tests).
    Write {
        /// Exactly-once identity, `None` when the client sent none.
        session: Option<Session>,
        /// Ops applied atomically in order.
        ops: Vec<WriteOp>,
    },
    /// etcd-style transaction, evaluated atomically at apply time, without apply-time limits
    /// (entries from before [`Command::LimitedTxn`]; tests).
    Txn {
        /// Exactly-once identity.
        session: Option<Session>,
        /// All must hold for `success` to run, else `failure` runs.
        compares: Vec<Compare>,
        /// Branch run when every compare holds.
        success: Vec<TxnOp>,
        /// Branch run otherwise.
        failure: Vec<TxnOp>,
    },
    /// Atomic batch of writes (Put, Delete, Upsert, Write RPCs) under the proposer's limits: an
    /// append that would grow a value past `limits.max_value_bytes` refuses the whole batch
    /// ([`CommandResult::ValueTooLarge`]).
    LimitedWrite {
        /// Exactly-once identity, `None` when the client sent none.
        session: Option<Session>,
        /// Ops applied atomically in order.
        ops: Vec<WriteOp>,
        /// The proposer's limits.
        limits: ApplyLimits,
    },
    /// etcd-style transaction under the proposer's limits: an append over
    /// `limits.max_value_bytes` ([`CommandResult::ValueTooLarge`]) or gets returning more than
    /// `limits.max_response_bytes` ([`CommandResult::ResponseTooLarge`]) refuse the whole Txn,
    /// none of its writes applied.
    LimitedTxn {
        /// Exactly-once identity.
        session: Option<Session>,
        /// All must hold for `success` to run, else `failure` runs.
        compares: Vec<Compare>,
        /// Branch run when every compare holds.
        success: Vec<TxnOp>,
        /// Branch run otherwise.
        failure: Vec<TxnOp>,
        /// The proposer's limits.
        limits: ApplyLimits,
    },
    /// One chunk of a bulk load's rows (`bulk.rs` chunk format), staged under the reserved key
    /// space where no reader sees it, until the load's [`Command::BulkCommit`].
    BulkStage {
        /// The load.
        load: LoadId,
        /// Chunk number, from 0.
        seq: u32,
        /// The encoded chunk.
        #[serde(with = "serde_bytes")]
        chunk: Vec<u8>,
    },
    /// Makes a bulk load's staged rows visible, all at once, and deletes its staging. Must be
    /// the only command of its entry.
    BulkCommit {
        /// The load.
        load: LoadId,
        /// Chunks staged (`0..chunks` must all be there).
        chunks: u32,
        /// Rows in those chunks.
        rows: u64,
        /// Duplicate policy.
        on_duplicate: OnDuplicate,
    },
    /// Cancels a bulk load: its staged chunks are deleted.
    BulkAbort {
        /// The load.
        load: LoadId,
    },
    /// A change of the users, roles or the auth flag (`crate::auth`), applied to the auth state
    /// the state machine keeps under the reserved key `0xFF 0xFF 'a'`. Passwords in it are
    /// argon2id hashes made by the proposer.
    Auth(crate::auth::AuthOp),
}

/// What a command does, apart from its session and limits (see [`Command::into_parts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CommandBody {
    /// A batch of writes.
    Write(Vec<WriteOp>),
    /// A transaction.
    Txn {
        /// Guards.
        compares: Vec<Compare>,
        /// Branch run when every compare holds.
        success: Vec<TxnOp>,
        /// Branch run otherwise.
        failure: Vec<TxnOp>,
    },
}

impl Command {
    /// A write under `limits` (what the server proposes).
    pub fn write(session: Option<Session>, ops: Vec<WriteOp>, limits: ApplyLimits) -> Command {
        Command::LimitedWrite { session, ops, limits }
    }

    /// A transaction under `limits` (what the server proposes).
    pub fn txn(
        session: Option<Session>,
        compares: Vec<Compare>,
        success: Vec<TxnOp>,
        failure: Vec<TxnOp>,
        limits: ApplyLimits,
    ) -> Command {
        Command::LimitedTxn {
            session,
            compares,
            success,
            failure,
            limits,
        }
    }

    /// The session of this command, if any.
    pub fn session(&self) -> Option<Session> {
        match self {
            Command::Write { session, .. }
            | Command::Txn { session, .. }
            | Command::LimitedWrite { session, .. }
            | Command::LimitedTxn { session, .. } => *session,
            Command::BulkStage { .. }
            | Command::BulkCommit { .. }
            | Command::BulkAbort { .. }
            | Command::Auth(_) => None,
        }
    }

    /// Whether this is one of the bulk-load commands, which the state machine applies itself
    /// (`bulk.rs`), never through [`Command::into_parts`].
    pub fn is_bulk(&self) -> bool {
        matches!(
            self,
            Command::BulkStage { .. } | Command::BulkCommit { .. } | Command::BulkAbort { .. }
        )
    }

    /// The limits stamped in the command (`None`: an unlimited `Write` or `Txn`) and its body.
    /// A bulk-load command (see [`Command::is_bulk`]) has an empty body.
    pub(crate) fn into_parts(self) -> (Option<ApplyLimits>, CommandBody) {
        match self {
            Command::BulkStage { .. }
            | Command::BulkCommit { .. }
            | Command::BulkAbort { .. }
            | Command::Auth(_) => (None, CommandBody::Write(Vec::new())),
            Command::Write { ops, .. } => (None, CommandBody::Write(ops)),
            Command::LimitedWrite { ops, limits, .. } => (Some(limits), CommandBody::Write(ops)),
            Command::Txn {
                compares,
                success,
                failure,
                ..
            } => (
                None,
                CommandBody::Txn {
                    compares,
                    success,
                    failure,
                },
            ),
            Command::LimitedTxn {
                compares,
                success,
                failure,
                limits,
                ..
            } => (
                Some(limits),
                CommandBody::Txn {
                    compares,
                    success,
                    failure,
                },
            ),
        }
    }
}

/// Result of one applied command, remembered per session for retries.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandResult {
    /// A `Write` was applied.
    Written,
    /// A `Txn` ran: which branch, and one entry per op of that branch (`Some(value)` for a
    /// get that found its key; `None` for a missing key or a write op).
    Txn {
        /// True when every compare held.
        succeeded: bool,
        /// Per-op results of the branch that ran.
        results: Vec<Option<Vec<u8>>>,
    },
    /// The session's sequence is below the client's acknowledged window: the original result
    /// was already delivered and forgotten. Not applied again.
    StaleSequence,
    /// A retry of an applied command whose result was not kept because it was too large (a txn
    /// whose get values exceed `session::MAX_KEPT_RESULT_BYTES`). Not applied again; the original
    /// outcome is unknown to the caller (ambiguous).
    TooLargeToKeep,
    /// The session's sequence was already used by a different command (fingerprints differ): a
    /// client bug. Not applied.
    SequenceReused,
    /// An append would have grown a value past the command's `max_value_bytes`: the whole
    /// command was refused, none of its writes applied.
    ValueTooLarge {
        /// Index of the refused op in the write batch or the Txn branch that ran.
        op_index: u64,
        /// Size the value would have had.
        value_bytes: u64,
        /// The limit (`ApplyLimits::max_value_bytes`).
        max_value_bytes: u64,
    },
    /// The gets of the Txn branch that ran would return more than the command's
    /// `max_response_bytes`: the Txn was refused, none of its writes applied.
    ResponseTooLarge {
        /// Value bytes of the gets up to and including the one that went over.
        response_bytes: u64,
        /// The limit (`ApplyLimits::max_response_bytes`).
        max_response_bytes: u64,
    },
    /// The command names a key (or a range start) in the reserved key space
    /// (`reserved_keys.rs`), which only the state machine writes: refused whole, nothing
    /// applied. The server refuses such requests before they are proposed; this is the state
    /// machine's own guard.
    ReservedKey,
    /// A bulk-load chunk was staged.
    BulkStaged,
    /// A bulk load committed: its rows are visible.
    BulkLoaded {
        /// Rows ingested from the staged chunks.
        rows_read: u64,
        /// Keys stored (new and replaced).
        rows_written: u64,
        /// Rows that replaced a value or an earlier row.
        rows_replaced: u64,
        /// Rows skipped as duplicates.
        rows_skipped: u64,
    },
    /// A bulk load under `OnDuplicate::Error` met a key twice: nothing of it applied.
    BulkDuplicate {
        /// The key.
        key: Vec<u8>,
        /// Row of its first occurrence (`None`: it existed before the load).
        first_row: Option<u64>,
        /// Row of the duplicate.
        second_row: u64,
    },
    /// A bulk load was cancelled (by a leader change, a `BulkAbort`, missing chunks, or a
    /// commit not alone in its entry): nothing of it applied, its staging deleted.
    BulkCancelled {
        /// Why.
        reason: String,
    },
    /// A [`Command::Auth`] was applied; the auth state is at this revision now.
    AuthApplied {
        /// The auth revision after the change.
        revision: u64,
    },
    /// A [`Command::Auth`] was refused under the auth state it met: nothing changed.
    AuthRefused(crate::auth::AuthRefusal),
}

impl CommandResult {
    /// True for the results of a command refused under its limits
    /// ([`CommandResult::ValueTooLarge`], [`CommandResult::ResponseTooLarge`]) or for naming a
    /// reserved key ([`CommandResult::ReservedKey`]): none of its writes was applied.
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            CommandResult::ValueTooLarge { .. }
                | CommandResult::ResponseTooLarge { .. }
                | CommandResult::ReservedKey
        )
    }
}

impl Command {
    /// 64-bit fingerprint of what the command does, excluding its session (a retry may carry a
    /// higher `first_incomplete`) and its limits (a retry may reach a leader configured
    /// otherwise): xxh3-64 of `postcard((tag, body))`, tag 0 = `Write(ops)` / `LimitedWrite`,
    /// 1 = `Txn(compares, success, failure)` / `LimitedTxn`. Deterministic across replicas and
    /// builds with the same serde shapes. Used to detect a sequence reused for a different
    /// command.
    pub fn fingerprint(&self) -> u64 {
        let encoded = match self {
            Command::Write { ops, .. } | Command::LimitedWrite { ops, .. } => {
                postcard::to_stdvec(&(0u8, ops))
            }
            Command::Txn {
                compares,
                success,
                failure,
                ..
            }
            | Command::LimitedTxn {
                compares,
                success,
                failure,
                ..
            } => postcard::to_stdvec(&(1u8, compares, success, failure)),
            bulk @ (Command::BulkStage { .. } | Command::BulkCommit { .. } | Command::BulkAbort { .. }) => {
                postcard::to_stdvec(&(2u8, bulk))
            }
            Command::Auth(op) => postcard::to_stdvec(&(3u8, op)),
        };
        // Encoding into a Vec cannot fail for these types; if it ever did, every replica would
        // fail the same way and fingerprint 0 keeps the outcome deterministic.
        encoded.map_or(0, |bytes| xxhash_rust::xxh3::xxh3_64(&bytes))
    }
}

/// Convenience for building upserts in tests and the server.
pub fn upsert(key: impl Into<Vec<u8>>, op: UpsertOp) -> WriteOp {
    WriteOp::Upsert { key: key.into(), op }
}
