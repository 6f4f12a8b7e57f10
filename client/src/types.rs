//! The client's own request and response types, converted to and from `ftkv_proto::v1`.
//!
//! Shapes follow etcd's v3 API (`Compare` / `Txn` / paged range reads) and TokuDB's read-free
//! upserts (`INSERT IGNORE`, `ON DUPLICATE KEY UPDATE x = x + n`). Keys and values are raw
//! bytes (`Vec<u8>`).

use ftkv_proto::v1 as pb;

/// How a read is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReadConsistency {
    /// Through the leader's ReadIndex round: sees every write acknowledged before the read
    /// started (Raft thesis section 6.4). The default.
    #[default]
    Linearizable,
    /// The answering node's state machine as it is; any node serves it; may be stale.
    Serializable,
}

impl ReadConsistency {
    pub(crate) fn to_proto(self) -> i32 {
        match self {
            ReadConsistency::Linearizable => pb::ReadConsistency::Linearizable as i32,
            ReadConsistency::Serializable => pb::ReadConsistency::Serializable as i32,
        }
    }
}

/// Where a successful request was served: node, term and log index (of the write's entry,
/// or the read index of a linearizable read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResponseInfo {
    /// Id of the node that answered.
    pub node_id: u64,
    /// Raft term at the answer.
    pub term: u64,
    /// Log index of the write's entry, or the read index.
    pub log_index: u64,
}

impl From<Option<pb::ResponseHeader>> for ResponseInfo {
    fn from(h: Option<pb::ResponseHeader>) -> Self {
        let h = h.unwrap_or_default();
        Self {
            node_id: h.node_id,
            term: h.term,
            log_index: h.log_index,
        }
    }
}

/// A key and its value.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct KeyValue {
    /// Key bytes.
    pub key: Vec<u8>,
    /// Value bytes (empty for a keys-only scan).
    pub value: Vec<u8>,
}

/// One page of a range read.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ScanPage {
    /// Pairs in key order.
    pub kvs: Vec<KeyValue>,
    /// True when more pairs exist in the range; continue from `next_start`.
    pub more: bool,
    /// Start key (inclusive) of the next page when `more`.
    pub next_start: Vec<u8>,
}

/// Options of a paged range read [`crate::Client::scan_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ScanOptions {
    /// Most pairs in the page; 0 = the server's default page (1000). The server caps pages
    /// at 100,000 pairs.
    pub limit: u32,
    /// Linearizable (default) or serializable.
    pub consistency: ReadConsistency,
    /// Return keys with empty values.
    pub keys_only: bool,
}

/// A read-free operation on one key's value (TokuDB upsert messages).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpsertOp {
    /// Store this value only if the key is absent (`INSERT IGNORE`).
    SetIfAbsent(Vec<u8>),
    /// Add to the value read as an 8-byte little-endian `i64` (absent = 0), saturating. A value
    /// of another length is left unchanged.
    Add(i64),
    /// Append bytes to the value (absent = empty).
    Append(Vec<u8>),
    /// Keep the byte-wise maximum of the value and this operand (absent = operand).
    Max(Vec<u8>),
}

impl UpsertOp {
    pub(crate) fn to_proto(&self) -> pb::UpsertOp {
        use pb::upsert_op::Op;
        let op = match self {
            UpsertOp::SetIfAbsent(v) => Op::SetIfAbsent(v.clone()),
            UpsertOp::Add(n) => Op::Add(*n),
            UpsertOp::Append(v) => Op::Append(v.clone()),
            UpsertOp::Max(v) => Op::Max(v.clone()),
        };
        pb::UpsertOp { op: Some(op) }
    }
}

/// Decodes a counter kept by [`UpsertOp::Add`]: 8 bytes little-endian `i64`. `None` for any
/// other length.
pub fn decode_counter(value: &[u8]) -> Option<i64> {
    let bytes: [u8; 8] = value.try_into().ok()?;
    Some(i64::from_le_bytes(bytes))
}

/// One op of an atomic batch ([`crate::Client::write`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Blind write of one key.
    Put {
        /// Key.
        key: Vec<u8>,
        /// Value.
        value: Vec<u8>,
    },
    /// Blind delete of one key.
    Delete {
        /// Key.
        key: Vec<u8>,
    },
    /// Read-free update of one key.
    Upsert {
        /// Key.
        key: Vec<u8>,
        /// What to do with its value.
        op: UpsertOp,
    },
    /// Delete every key in `[start, end)`; an empty `end` means no upper bound.
    DeleteRange {
        /// Inclusive start.
        start: Vec<u8>,
        /// Exclusive end (empty = unbounded).
        end: Vec<u8>,
    },
    /// Apply `op` to every key present in `[start, end)` (TokuDB broadcast message);
    /// `SetIfAbsent` does nothing here. An empty `end` means no upper bound.
    UpsertRange {
        /// Inclusive start.
        start: Vec<u8>,
        /// Exclusive end (empty = unbounded).
        end: Vec<u8>,
        /// What to do with each value.
        op: UpsertOp,
    },
}

impl Op {
    /// `Put` from anything byte-like.
    pub fn put(key: impl AsRef<[u8]>, value: impl AsRef<[u8]>) -> Self {
        Op::Put {
            key: key.as_ref().to_vec(),
            value: value.as_ref().to_vec(),
        }
    }

    /// `Delete` from anything byte-like.
    pub fn delete(key: impl AsRef<[u8]>) -> Self {
        Op::Delete {
            key: key.as_ref().to_vec(),
        }
    }

    /// `Upsert` from anything byte-like.
    pub fn upsert(key: impl AsRef<[u8]>, op: UpsertOp) -> Self {
        Op::Upsert {
            key: key.as_ref().to_vec(),
            op,
        }
    }

    pub(crate) fn to_proto(&self) -> pb::WriteOp {
        use pb::write_op::Op as W;
        let op = match self {
            Op::Put { key, value } => W::Put(pb::PutOp {
                key: key.clone(),
                value: value.clone(),
            }),
            Op::Delete { key } => W::Delete(pb::DeleteOp { key: key.clone() }),
            Op::Upsert { key, op } => W::Upsert(pb::UpsertKeyOp {
                key: key.clone(),
                op: Some(op.to_proto()),
            }),
            Op::DeleteRange { start, end } => W::DeleteRange(pb::DeleteRangeOp {
                start: start.clone(),
                end: end.clone(),
            }),
            Op::UpsertRange { start, end, op } => W::UpsertRange(pb::UpsertRangeOp {
                start: start.clone(),
                end: end.clone(),
                op: Some(op.to_proto()),
            }),
        };
        pb::WriteOp { op: Some(op) }
    }
}

/// What a transaction compare looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareTarget {
    /// The value bytes. An absent key never matches `Equal`/`Greater`/`Less` and always
    /// matches `NotEqual`.
    Value,
    /// Existence: `Equal` means "exists", `NotEqual` "absent"; the operand is ignored.
    Exists,
}

/// Comparison operator (byte-wise for values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompareResult {
    /// `==`
    Equal,
    /// `!=`
    NotEqual,
    /// `>`
    Greater,
    /// `<`
    Less,
}

/// One guard of a transaction (etcd `Compare`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compare {
    /// Key compared.
    pub key: Vec<u8>,
    /// Value or existence.
    pub target: CompareTarget,
    /// Operator.
    pub result: CompareResult,
    /// Operand of a value compare (ignored for existence).
    pub value: Vec<u8>,
}

impl Compare {
    /// `value(key) <result> value`.
    pub fn value(key: impl AsRef<[u8]>, result: CompareResult, value: impl AsRef<[u8]>) -> Self {
        Self {
            key: key.as_ref().to_vec(),
            target: CompareTarget::Value,
            result,
            value: value.as_ref().to_vec(),
        }
    }

    /// The key exists.
    pub fn exists(key: impl AsRef<[u8]>) -> Self {
        Self {
            key: key.as_ref().to_vec(),
            target: CompareTarget::Exists,
            result: CompareResult::Equal,
            value: Vec::new(),
        }
    }

    /// The key is absent.
    pub fn absent(key: impl AsRef<[u8]>) -> Self {
        Self {
            result: CompareResult::NotEqual,
            ..Self::exists(key)
        }
    }

    pub(crate) fn to_proto(&self) -> pb::Compare {
        use pb::compare::{Result as R, Target as T};
        let target = match self.target {
            CompareTarget::Value => T::Value,
            CompareTarget::Exists => T::Exists,
        };
        let result = match self.result {
            CompareResult::Equal => R::Equal,
            CompareResult::NotEqual => R::NotEqual,
            CompareResult::Greater => R::Greater,
            CompareResult::Less => R::Less,
        };
        pb::Compare {
            key: self.key.clone(),
            target: target as i32,
            result: result as i32,
            value: self.value.clone(),
        }
    }
}

/// One op of a transaction branch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// Write a key.
    Put {
        /// Key.
        key: Vec<u8>,
        /// Value.
        value: Vec<u8>,
    },
    /// Delete a key.
    Delete {
        /// Key.
        key: Vec<u8>,
    },
    /// Read-free update of a key.
    Upsert {
        /// Key.
        key: Vec<u8>,
        /// What to do with its value.
        op: UpsertOp,
    },
    /// Delete `[start, end)` (empty `end` = unbounded).
    DeleteRange {
        /// Inclusive start.
        start: Vec<u8>,
        /// Exclusive end.
        end: Vec<u8>,
    },
    /// Read a key as of this point of the transaction.
    Get {
        /// Key.
        key: Vec<u8>,
    },
}

impl TxnOp {
    pub(crate) fn to_proto(&self) -> pb::TxnOp {
        use pb::txn_op::Op as T;
        let op = match self {
            TxnOp::Put { key, value } => T::Put(pb::PutOp {
                key: key.clone(),
                value: value.clone(),
            }),
            TxnOp::Delete { key } => T::Delete(pb::DeleteOp { key: key.clone() }),
            TxnOp::Upsert { key, op } => T::Upsert(pb::UpsertKeyOp {
                key: key.clone(),
                op: Some(op.to_proto()),
            }),
            TxnOp::DeleteRange { start, end } => T::DeleteRange(pb::DeleteRangeOp {
                start: start.clone(),
                end: end.clone(),
            }),
            TxnOp::Get { key } => T::Get(pb::TxnGetOp { key: key.clone() }),
        };
        pb::TxnOp { op: Some(op) }
    }
}

/// An etcd-style transaction: if every compare holds, run `success`, else `failure`, atomically.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Txn {
    /// Guards, all of which must hold (an empty list always holds).
    pub compares: Vec<Compare>,
    /// Ops run when every compare holds.
    pub success: Vec<TxnOp>,
    /// Ops run otherwise.
    pub failure: Vec<TxnOp>,
}

/// Result of one op of the branch that ran. Only `Get` ops carry data.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnOpResult {
    /// For a get: whether the key exists.
    pub found: bool,
    /// For a get: its value.
    pub value: Vec<u8>,
}

/// Outcome of a transaction.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TxnResult {
    /// True when the compares held and `success` ran.
    pub succeeded: bool,
    /// One result per op of the branch that ran, in order.
    pub results: Vec<TxnOpResult>,
    /// Where it was served.
    pub info: ResponseInfo,
}

/// One node's view of the cluster (`Cluster.Status`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeStatus {
    /// Endpoint that was asked.
    pub endpoint: String,
    /// This node's id.
    pub node_id: u64,
    /// Leader id as this node sees it (0 = none known).
    pub leader_id: u64,
    /// Leader's client endpoint (empty = unknown).
    pub leader_endpoint: String,
    /// Current term.
    pub term: u64,
    /// Last log index.
    pub last_log_index: u64,
    /// Last applied index.
    pub applied_index: u64,
    /// Commit index.
    pub commit_index: u64,
    /// Storage engine: `"fractal"` or `"sled"`.
    pub engine: String,
    /// Data size on disk, bytes.
    pub data_size_bytes: u64,
    /// Whether this node is the leader.
    pub is_leader: bool,
    /// `"leader"`, `"follower"`, `"candidate"`, `"learner"` or `"shutdown"`.
    pub role: String,
    /// xxh3-64 of the whole state machine at `applied_index` (0 unless asked for).
    pub digest: u64,
    /// The node's advertised client endpoint.
    pub client_endpoint: String,
    /// Mean client ops per Raft entry (proposal batching) since the node started.
    pub ops_per_entry: f64,
    /// Node software version.
    pub version: String,
    /// The cluster the node belongs to (0: none yet).
    pub cluster_id: u64,
}

impl NodeStatus {
    pub(crate) fn from_proto(endpoint: &str, s: pb::StatusResponse) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            node_id: s.node_id,
            leader_id: s.leader_id,
            leader_endpoint: s.leader_endpoint,
            term: s.term,
            last_log_index: s.last_log_index,
            applied_index: s.applied_index,
            commit_index: s.commit_index,
            engine: s.engine,
            data_size_bytes: s.data_size_bytes,
            is_leader: s.is_leader,
            role: s.role,
            digest: s.digest,
            client_endpoint: s.client_endpoint,
            ops_per_entry: s.ops_per_entry,
            version: s.version,
            cluster_id: s.cluster_id,
        }
    }
}

/// A member of the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Member {
    /// Node id.
    pub id: u64,
    /// Client API address (`host:port`).
    pub client_endpoint: String,
    /// Peer (Raft) address (`host:port`).
    pub peer_endpoint: String,
    /// Voter (true) or learner (false).
    pub is_voter: bool,
}

/// The membership as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Membership {
    /// Voters and learners.
    pub members: Vec<Member>,
    /// Current leader (0 = none known).
    pub leader_id: u64,
}

impl From<pb::MembersResponse> for Membership {
    fn from(r: pb::MembersResponse) -> Self {
        Self {
            members: r
                .members
                .into_iter()
                .map(|m| Member {
                    id: m.id,
                    client_endpoint: m.client_endpoint,
                    peer_endpoint: m.peer_endpoint,
                    is_voter: m.is_voter,
                })
                .collect(),
            leader_id: r.leader_id,
        }
    }
}

/// The smallest key greater than every key starting with `prefix`: the exclusive end of a
/// prefix range (etcd's `GetPrefixRangeEnd`). Trailing `0xff` bytes are dropped and the last
/// other byte incremented; a prefix of only `0xff` bytes (or empty) gives an empty end, which
/// the API reads as "no upper bound".
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"abc"), b"abd".to_vec());
        assert_eq!(prefix_end(&[0x61, 0xff, 0xff]), vec![0x62]);
        assert_eq!(prefix_end(&[0xff, 0xff]), Vec::<u8>::new());
        assert_eq!(prefix_end(b""), Vec::<u8>::new());
    }

    #[test]
    fn counter_decoding() {
        assert_eq!(decode_counter(&5i64.to_le_bytes()), Some(5));
        assert_eq!(decode_counter(&(-3i64).to_le_bytes()), Some(-3));
        assert_eq!(decode_counter(b"short"), None);
    }

    #[test]
    fn ops_convert_to_proto() {
        use pb::write_op::Op as W;
        let w = Op::upsert("k", UpsertOp::Add(7)).to_proto();
        match w.op {
            Some(W::Upsert(u)) => {
                assert_eq!(u.key, b"k");
                assert_eq!(u.op.and_then(|o| o.op), Some(pb::upsert_op::Op::Add(7)));
            }
            other => panic!("unexpected {other:?}"),
        }
        let c = Compare::absent("x").to_proto();
        assert_eq!(c.target, pb::compare::Target::Exists as i32);
        assert_eq!(c.result, pb::compare::Result::NotEqual as i32);
        let c = Compare::value("x", CompareResult::Greater, "5").to_proto();
        assert_eq!((c.target, c.result, c.value.as_slice()), (0, 2, &b"5"[..]));
        assert_eq!(ReadConsistency::Serializable.to_proto(), 1);
    }
}
