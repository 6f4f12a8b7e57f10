//! The permissions a Kv request needs: READ on every key or range it reads, WRITE on every key
//! or range it writes, computed from the converted requests (engine ops, txn ops).

use ftkv_engine::WriteOp;

use crate::auth::{KeyRange, PermType};
use crate::cluster::{Compare, TxnOp};

/// What one write op needs.
pub fn write_op(op: &WriteOp) -> (PermType, KeyRange) {
    let range = match op {
        WriteOp::Put { key, .. } | WriteOp::Delete { key } | WriteOp::Upsert { key, .. } => {
            KeyRange::key(key)
        }
        WriteOp::DeleteRange { start, end } | WriteOp::UpsertRange { start, end, .. } => {
            KeyRange::new(start, end.as_deref())
        }
    };
    (PermType::Write, range)
}

/// What a batch of write ops needs.
pub fn write_ops(ops: &[WriteOp]) -> Vec<(PermType, KeyRange)> {
    ops.iter().map(write_op).collect()
}

/// What a Txn needs: READ on every compare and get, WRITE on every write, both branches.
pub fn txn(compares: &[Compare], success: &[TxnOp], failure: &[TxnOp]) -> Vec<(PermType, KeyRange)> {
    let mut out: Vec<(PermType, KeyRange)> = compares
        .iter()
        .map(|c| (PermType::Read, KeyRange::key(&c.key)))
        .collect();
    for op in success.iter().chain(failure) {
        out.push(match op {
            TxnOp::Get { key } => (PermType::Read, KeyRange::key(key)),
            TxnOp::Write(w) => write_op(w),
        });
    }
    out
}

/// What a read of one key needs.
pub fn read_key(key: &[u8]) -> [(PermType, KeyRange); 1] {
    [(PermType::Read, KeyRange::key(key))]
}

/// What a scan of `[start, end)` needs (`end` empty: unbounded).
pub fn scan(start: &[u8], end: &[u8]) -> [(PermType, KeyRange); 1] {
    let end = if end.is_empty() { None } else { Some(end) };
    [(PermType::Read, KeyRange::new(start, end))]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::cluster::{CompareOp, CompareTarget};

    #[test]
    fn txn_needs_read_for_compares_and_gets_and_write_for_writes() {
        let compares = vec![Compare {
            key: b"c".to_vec(),
            target: CompareTarget::Exists,
            op: CompareOp::Equal,
            operand: vec![],
        }];
        let success = vec![
            TxnOp::Get { key: b"g".to_vec() },
            TxnOp::Write(WriteOp::Put {
                key: b"p".to_vec(),
                value: vec![],
            }),
        ];
        let failure = vec![TxnOp::Write(WriteOp::DeleteRange {
            start: b"d".to_vec(),
            end: None,
        })];
        let needs = txn(&compares, &success, &failure);
        assert_eq!(
            needs,
            vec![
                (PermType::Read, KeyRange::key(b"c")),
                (PermType::Read, KeyRange::key(b"g")),
                (PermType::Write, KeyRange::key(b"p")),
                (PermType::Write, KeyRange::new(b"d", None)),
            ]
        );
        assert_eq!(scan(b"a", b"")[0].1, KeyRange::new(b"a", None));
    }
}
