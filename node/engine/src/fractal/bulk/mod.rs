//! The fractal tree's bulk load ([`crate::Engine::bulk_load`]), PerconaFT's loader in spirit:
//!
//! 1. **Sort** (no engine lock): the input is read to its end into sorted runs of at most
//!    `sort_memory_bytes`, spilled through the engine's Vfs to `bulk-tmp/` ([`spill`]); input
//!    already in key order is never sorted ([`sort`]). An input error or a full disk stops the
//!    load here, before anything changed.
//! 2. **Rebuild** when the tree holds no more live data than the load (an empty tree above all;
//!    [`rebuild`]): under the engine lock the live pairs are copied into one more sorted run,
//!    the k-way merge of the load's runs, with duplicates resolved ([`crate::bulk`]), is merged
//!    with them and built bottom-up into full leaves and internal levels
//!    ([`Tree::graft_whole`]), and the root is swapped. A duplicate (Error policy), a read error
//!    of a run or a full disk releases the new blocks and keeps the old tree.
//! 3. **Otherwise** (more existing data than the load): the merge is resolved against the existing
//!    keys (point reads, without the engine lock) into a stream of puts kept in memory up to
//!    the sort budget and spilled beyond; a duplicate stops the load there, before anything
//!    changed. Then, under the engine lock, the puts go in as messages, like one `write`.
//!
//! In both cases `extra_ops` and `meta` follow in the same exclusive section, so readers see
//! the whole load or none of it. The spill files are removed when the load ends, and at open
//! after a crash. Bulk loads and checkpoints are serialized (`checkpoint_lock`).

mod rebuild;
mod sort;
mod spill;

pub(crate) use self::spill::remove_leftovers;

use self::rebuild::Rebuild;
use self::sort::{sort_input, Merge};
use self::spill::{RunWriter, TmpFiles};
use super::*;
use crate::bulk::{BulkLoadOptions, BulkLoadReport, Resolve, Row};

/// Where the resolved puts of the overlap path wait: in memory up to the sort budget, then in
/// a spill file.
struct Puts {
    mem: Vec<Row>,
    bytes: usize,
    limit: usize,
    spilled: Option<RunWriter>,
}

impl Puts {
    fn push(&mut self, tmp: &mut TmpFiles, key: Vec<u8>, value: Vec<u8>, index: u64) -> Result<()> {
        if let Some(w) = self.spilled.as_mut() {
            return w.push(&key, &value, index);
        }
        self.bytes += key.len() + value.len() + spill::ROW_HEADER_BYTES;
        self.mem.push((key, value, index));
        if self.bytes >= self.limit {
            let mut w = tmp.create()?;
            for (k, v, i) in self.mem.drain(..) {
                w.push(&k, &v, i)?;
            }
            self.spilled = Some(w);
        }
        Ok(())
    }
}

/// Whether an error of a bulk load leaves the engine usable (nothing changed): bad input and a
/// full disk. Anything else (a failed read or write of the tree or a spill file) poisons it.
fn keeps_engine(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::DuplicateKey { .. } | EngineError::InvalidArgument(_) | EngineError::NoSpace { .. }
    )
}

impl FractalEngine {
    /// [`crate::Engine::bulk_load`] of the fractal tree (module docs).
    pub(crate) fn bulk_load_fractal(
        &self,
        rows: &mut dyn Iterator<Item = Result<KeyValue>>,
        opts: &BulkLoadOptions,
        extra_ops: &[WriteOp],
        meta: Option<&[u8]>,
    ) -> Result<BulkLoadReport> {
        if self.inner.read().poisoned {
            return Err(EngineError::Poisoned);
        }
        let mut tmp = TmpFiles::new(self.vfs.clone(), &self.dir);
        let sorted = sort_input(rows, opts.sort_memory_bytes, &mut tmp)?;
        let (was_sorted, runs_spilled) = (sorted.was_sorted, sorted.runs.len() as u64);
        let _serial = self.checkpoint_lock.lock();
        let mut report = match self.load_by_rebuild(sorted, opts, extra_ops, meta, &mut tmp)? {
            Rebuild::Done(report) => report,
            Rebuild::TooMuchData(sorted) => self.load_as_messages(sorted, opts, extra_ops, meta, &mut tmp)?,
        };
        tmp.remove_all();
        report.input_was_sorted = was_sorted;
        report.runs_spilled += runs_spilled;
        Ok(report)
    }

    /// Step 3 of the module docs.
    fn load_as_messages(
        &self,
        sorted: sort::Sorted,
        opts: &BulkLoadOptions,
        extra_ops: &[WriteOp],
        meta: Option<&[u8]>,
        tmp: &mut TmpFiles,
    ) -> Result<BulkLoadReport> {
        let merge = Merge::new(&sorted.runs, sorted.mem)?;
        let mut resolve = Resolve::new(merge, opts.on_duplicate, |k: &[u8]| {
            self.get(k).map(|v| v.is_some())
        });
        let mut puts = Puts {
            mem: Vec::new(),
            bytes: 0,
            limit: usize::try_from(opts.sort_memory_bytes)
                .unwrap_or(usize::MAX)
                .max(1),
            spilled: None,
        };
        let mut n = 0u64;
        for kv in resolve.by_ref() {
            let (k, v) = kv?;
            puts.push(tmp, k, v, n)?;
            n += 1;
        }
        let report = std::mem::take(&mut resolve.report);
        drop(resolve);
        let (runs, mem) = match puts.spilled.as_mut() {
            Some(w) => (vec![w.finish()?], Vec::new()),
            None => (Vec::new(), std::mem::take(&mut puts.mem)),
        };
        let spilled = runs.len() as u64;
        let mut source = Merge::new(&runs, mem)?;
        let rows = usize::try_from(n).unwrap_or(usize::MAX);
        let mut failed: Option<EngineError> = None;
        let mut inner = self.inner.write();
        let written = Self::write_msgs_locked(
            &mut inner,
            rows + extra_ops.len(),
            |i, msn| {
                if i < rows {
                    match source.next() {
                        Some(Ok((key, value, _))) => Some(Msg::Point {
                            msn,
                            key,
                            op: PointOp::Put(value),
                        }),
                        Some(Err(e)) => {
                            failed.get_or_insert(e);
                            None
                        }
                        None => None,
                    }
                } else if failed.is_some() {
                    None
                } else {
                    extra_ops.get(i - rows).and_then(|op| to_msg(op, msn))
                }
            },
            meta,
        );
        if let Some(e) = failed {
            // Part of the load is in the tree: the engine stops (the file still holds the
            // last checkpoint, without any of it).
            inner.poisoned = true;
            return Err(e);
        }
        written?;
        let mut report = report;
        report.runs_spilled = spilled;
        Ok(report)
    }
}
