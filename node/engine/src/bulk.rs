//! Bulk loads ([`crate::Engine::bulk_load`]): the options and report, the duplicate policy, and
//! the deterministic resolution every engine shares (the default in-memory implementation used
//! by the model and sled, and the fractal tree's streaming one).
//!
//! Semantics (the same on every replica, whatever the input order): rows are ordered by key,
//! rows of equal key by their input position (a stable sort). For each key, in key order:
//! - [`OnDuplicate::Error`]: a key that already exists in the engine fails the load with
//!   `DuplicateKey { first_index: None, second_index: <its first row> }`; a key met twice in the
//!   load fails it with the positions of its first two rows. The error names the first such key
//!   in key order.
//! - [`OnDuplicate::Replace`] (`REPLACE INTO`): the last row of the key wins.
//! - [`OnDuplicate::Ignore`] (`INSERT IGNORE`): an existing value wins, else the first row.
//!
//! Counts of the report: `rows_read` every input row; `rows_written` the keys stored; with
//! Replace `rows_replaced` the values overwritten (earlier rows of the same key and the value
//! the key had before the load); with Ignore `rows_skipped` the rows not stored.

use crate::{EngineError, KeyValue, Result};

/// What a bulk load does with a key that already exists (in the engine, or earlier in the same load).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum OnDuplicate {
    /// Fail the load ([`EngineError::DuplicateKey`]); nothing changes.
    Error,
    /// `REPLACE INTO`: the last row wins over earlier rows and over existing data.
    Replace,
    /// `INSERT IGNORE`: existing data wins, then the first row of the load.
    Ignore,
}

/// Options of [`crate::Engine::bulk_load`].
#[derive(Debug, Clone)]
pub struct BulkLoadOptions {
    /// The duplicate policy.
    pub on_duplicate: OnDuplicate,
    /// Memory for sorting unsorted input: sorted runs of at most this many bytes (keys, values
    /// and a small per-row overhead) are spilled to temporary files and merged. Engines that
    /// sort in memory (model, sled) ignore it.
    pub sort_memory_bytes: u64,
}

impl Default for BulkLoadOptions {
    fn default() -> Self {
        BulkLoadOptions {
            on_duplicate: OnDuplicate::Error,
            sort_memory_bytes: 64 << 20,
        }
    }
}

/// What a bulk load did (module docs for the meaning of each count).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BulkLoadReport {
    /// Input rows.
    pub rows_read: u64,
    /// Keys stored by the load.
    pub rows_written: u64,
    /// Values overwritten (Replace only).
    pub rows_replaced: u64,
    /// Rows not stored (Ignore only).
    pub rows_skipped: u64,
    /// Whether the input came in key order (non-decreasing): then no sort ran.
    pub input_was_sorted: bool,
    /// Sorted runs spilled to temporary files (0 when the input fit in sort memory).
    pub runs_spilled: u64,
    /// Leaves built bottom-up and grafted into the tree (0 when every row went in as a message).
    pub leaves_built: u64,
}

/// A row of a load: key, value, 0-based position in the input.
pub(crate) type Row = (Vec<u8>, Vec<u8>, u64);

/// Resolves duplicates over rows sorted by (key, input position): yields one `(key, value)` per
/// key to store, in key order, and counts into its report. `exists` says whether a key had a
/// value before the load; it is asked once per distinct key.
pub(crate) struct Resolve<I, F> {
    rows: I,
    exists: F,
    policy: OnDuplicate,
    /// The key being resolved: value to store (`None`: skipped), its first row's position.
    pending: Option<Pending>,
    done: bool,
    pub(crate) report: BulkLoadReport,
}

struct Pending {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    first_index: u64,
}

impl<I, F> Resolve<I, F>
where
    I: Iterator<Item = Result<Row>>,
    F: FnMut(&[u8]) -> Result<bool>,
{
    pub(crate) fn new(rows: I, policy: OnDuplicate, exists: F) -> Self {
        Resolve {
            rows,
            exists,
            policy,
            pending: None,
            done: false,
            report: BulkLoadReport::default(),
        }
    }

    /// Starts the group of a new key with its first row.
    fn start(&mut self, key: Vec<u8>, value: Vec<u8>, index: u64) -> Result<Pending> {
        let existed = (self.exists)(&key)?;
        let value = match (self.policy, existed) {
            (OnDuplicate::Error, true) => {
                return Err(EngineError::DuplicateKey {
                    key,
                    first_index: None,
                    second_index: index,
                })
            }
            (OnDuplicate::Replace, true) => {
                self.report.rows_replaced += 1;
                Some(value)
            }
            (OnDuplicate::Ignore, true) => {
                self.report.rows_skipped += 1;
                None
            }
            (_, false) => Some(value),
        };
        Ok(Pending {
            key,
            value,
            first_index: index,
        })
    }

    /// Folds a later row of the same key into the group.
    fn fold(&mut self, p: &mut Pending, value: Vec<u8>, index: u64) -> Result<()> {
        match self.policy {
            OnDuplicate::Error => {
                return Err(EngineError::DuplicateKey {
                    key: std::mem::take(&mut p.key),
                    first_index: Some(p.first_index),
                    second_index: index,
                })
            }
            OnDuplicate::Replace => {
                self.report.rows_replaced += 1;
                p.value = Some(value);
            }
            OnDuplicate::Ignore => self.report.rows_skipped += 1,
        }
        Ok(())
    }

    fn step(&mut self) -> Result<Option<KeyValue>> {
        loop {
            let next = match self.rows.next() {
                None => {
                    self.done = true;
                    match self.pending.take() {
                        Some(Pending {
                            key, value: Some(v), ..
                        }) => {
                            self.report.rows_written += 1;
                            return Ok(Some((key, v)));
                        }
                        _ => return Ok(None),
                    }
                }
                Some(r) => r?,
            };
            let (key, value, index) = next;
            self.report.rows_read += 1;
            match self.pending.take() {
                Some(mut p) if p.key == key => {
                    self.fold(&mut p, value, index)?;
                    self.pending = Some(p);
                }
                prev => {
                    debug_assert!(
                        prev.as_ref().is_none_or(|p| p.key < key),
                        "bulk rows out of key order"
                    );
                    self.pending = Some(self.start(key, value, index)?);
                    if let Some(Pending {
                        key, value: Some(v), ..
                    }) = prev
                    {
                        self.report.rows_written += 1;
                        return Ok(Some((key, v)));
                    }
                }
            }
        }
    }
}

impl<I, F> Iterator for Resolve<I, F>
where
    I: Iterator<Item = Result<Row>>,
    F: FnMut(&[u8]) -> Result<bool>,
{
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.step() {
            Ok(Some(kv)) => Some(Ok(kv)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// The default [`crate::Engine::bulk_load`]: collects the rows, sorts them stably by key,
/// resolves duplicates (existing keys through `get`), then one `write` of the puts followed by
/// `extra_ops`, with `meta`.
pub(crate) fn default_bulk_load<E: crate::Engine + ?Sized>(
    engine: &E,
    rows: &mut dyn Iterator<Item = Result<KeyValue>>,
    opts: &BulkLoadOptions,
    extra_ops: &[crate::WriteOp],
    meta: Option<&[u8]>,
) -> Result<BulkLoadReport> {
    let mut all: Vec<Row> = Vec::new();
    let mut sorted = true;
    for (i, row) in rows.enumerate() {
        let (k, v) = row?;
        if all.last().is_some_and(|l| l.0 > k) {
            sorted = false;
        }
        all.push((k, v, i as u64));
    }
    if !sorted {
        all.sort_by(|a, b| a.0.cmp(&b.0));
    }
    let mut resolve = Resolve::new(all.into_iter().map(Ok), opts.on_duplicate, |k: &[u8]| {
        engine.get(k).map(|v| v.is_some())
    });
    let mut ops: Vec<crate::WriteOp> = Vec::new();
    for kv in resolve.by_ref() {
        let (key, value) = kv?;
        ops.push(crate::WriteOp::Put { key, value });
    }
    let mut report = resolve.report;
    report.input_was_sorted = sorted;
    ops.extend_from_slice(extra_ops);
    engine.write_owned(ops, meta)?;
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(v: &[(&str, &str)]) -> Vec<Result<Row>> {
        v.iter()
            .enumerate()
            .map(|(i, (k, v))| Ok((k.as_bytes().to_vec(), v.as_bytes().to_vec(), i as u64)))
            .collect()
    }

    fn run(
        input: &[(&str, &str)],
        policy: OnDuplicate,
        existing: &[&str],
    ) -> Result<(Vec<KeyValue>, BulkLoadReport)> {
        let mut sorted: Vec<(usize, (&str, &str))> = input.iter().copied().enumerate().collect();
        sorted.sort_by(|a, b| a.1 .0.cmp(b.1 .0));
        let input: Vec<(&str, &str)> = sorted.iter().map(|x| x.1).collect();
        let mut r = rows(&input);
        for (slot, (i, _)) in r.iter_mut().zip(sorted.iter()) {
            if let Ok(row) = slot {
                row.2 = *i as u64;
            }
        }
        let mut res = Resolve::new(r.into_iter(), policy, |k: &[u8]| {
            Ok(existing.iter().any(|e| e.as_bytes() == k))
        });
        let out: Result<Vec<KeyValue>> = res.by_ref().collect();
        Ok((out?, res.report))
    }

    fn kv(k: &str, v: &str) -> KeyValue {
        (k.as_bytes().to_vec(), v.as_bytes().to_vec())
    }

    #[test]
    fn replace_keeps_the_last_row_and_counts() {
        let (out, rep) = run(
            &[("b", "1"), ("a", "2"), ("b", "3")],
            OnDuplicate::Replace,
            &["a"],
        )
        .unwrap();
        assert_eq!(out, vec![kv("a", "2"), kv("b", "3")]);
        assert_eq!((rep.rows_read, rep.rows_written, rep.rows_replaced), (3, 2, 2));
    }

    #[test]
    fn ignore_keeps_existing_then_first() {
        let (out, rep) = run(&[("b", "1"), ("a", "2"), ("b", "3")], OnDuplicate::Ignore, &["a"]).unwrap();
        assert_eq!(out, vec![kv("b", "1")]);
        assert_eq!((rep.rows_written, rep.rows_skipped), (1, 2));
    }

    #[test]
    fn error_names_the_first_duplicate_in_key_order() {
        let e = run(
            &[("c", "1"), ("b", "2"), ("c", "3"), ("b", "4")],
            OnDuplicate::Error,
            &[],
        )
        .unwrap_err();
        match e {
            EngineError::DuplicateKey {
                key,
                first_index,
                second_index,
            } => assert_eq!((key, first_index, second_index), (b"b".to_vec(), Some(1), 3)),
            other => panic!("{other}"),
        }
        let e = run(&[("c", "1"), ("b", "2")], OnDuplicate::Error, &["c"]).unwrap_err();
        assert!(matches!(
            e,
            EngineError::DuplicateKey {
                first_index: None,
                second_index: 0,
                ..
            }
        ));
    }
}
