//! The rebuild path of a bulk load: when the tree holds no more live data than the load brings
//! (an empty tree is the common case; in a replicated node the tree always holds a little
//! bookkeeping), the live pairs are copied, under the engine lock, into one more sorted run, merged
//! with the load's runs, and the whole tree is built anew bottom-up and swapped in.
//!
//! Why rebuild rather than graft beside the existing nodes? A graft must first push every
//! buffered message that covers the load's range down to the leaves (an older delete buffered
//! above must not shadow a newer grafted row), then split the nodes along the range's edges,
//! and every node on the path keeps its MSN order; a rebuild has none of those hazards and
//! costs at most twice the load (the copy is bounded by the load's size), so the amortized
//! cost per loaded row stays that of the bottom-up build. Beyond that bound the load goes in as
//! messages (the module above).
//!
//! Ranges the load's `extra_ops` delete (`DeleteRange`, applied right after the rows) are not
//! copied: in the replicated node that is the load's own staging area, as large as the load
//! compressed. The deletion is still applied as a message afterwards, so the result is exact.

use super::sort::{Merge, Sorted};
use super::spill::{Run, RunReader, TmpFiles};
use super::*;
use crate::bulk::{BulkLoadOptions, BulkLoadReport, Resolve, Row};

/// Rows read per page while copying the live pairs.
const COPY_PAGE_ROWS: usize = 4096;

/// The outcome of [`FractalEngine::load_by_rebuild`].
pub(super) enum Rebuild {
    /// The load is in the tree.
    Done(BulkLoadReport),
    /// The tree holds more live data than the load: nothing changed, the sorted input is back.
    TooMuchData(Sorted),
}

/// `[start, end)` ranges a write deletes (`end` `None`: to the end of the key space).
type Ranges = Vec<(Vec<u8>, Option<Vec<u8>>)>;

fn deleted_ranges(ops: &[WriteOp]) -> Ranges {
    ops.iter()
        .filter_map(|op| match op {
            WriteOp::DeleteRange { start, end } => Some((start.clone(), end.clone())),
            _ => None,
        })
        .collect()
}

/// `Some(end)` when `key` lies in one of `ranges`: where the copy resumes (`None`: nothing
/// after it is copied).
fn skip_to<'a>(ranges: &'a Ranges, key: &[u8]) -> Option<Option<&'a [u8]>> {
    ranges
        .iter()
        .filter(|(s, e)| key >= s.as_slice() && e.as_ref().is_none_or(|e| key < e.as_slice()))
        .map(|(_, e)| e.as_deref())
        .max_by(|a, b| match (a, b) {
            (None, None) => std::cmp::Ordering::Equal,
            (None, _) => std::cmp::Ordering::Greater,
            (_, None) => std::cmp::Ordering::Less,
            (Some(a), Some(b)) => a.cmp(b),
        })
}

/// Copies the live pairs of `tree` outside `skip` into a run, in key order; `None` as soon as
/// their key and value bytes pass `limit_bytes`.
fn copy_live(tree: &mut Tree, skip: &Ranges, limit_bytes: u64, tmp: &mut TmpFiles) -> Result<Option<Run>> {
    let mut w = tmp.create()?;
    let mut from: Vec<u8> = Vec::new();
    let mut bytes = 0u64;
    let mut index = 0u64;
    'pages: loop {
        let page = tree.scan(&from, None, COPY_PAGE_ROWS)?;
        let full = page.len() >= COPY_PAGE_ROWS;
        for (k, v) in page {
            match skip_to(skip, &k) {
                Some(Some(end)) => {
                    from = end.to_vec();
                    continue 'pages;
                }
                Some(None) => break 'pages,
                None => {}
            }
            bytes += (k.len() + v.len()) as u64;
            if bytes > limit_bytes {
                return Ok(None);
            }
            w.push(&k, &v, index)?;
            index += 1;
            from = k;
        }
        if !full {
            break;
        }
        from.push(0);
    }
    Ok(Some(w.finish()?))
}

/// Answers "did this key hold a value before the load?" for keys asked in ascending order, by
/// walking a second reader of the copied run.
struct Probe {
    reader: RunReader,
    head: Option<Vec<u8>>,
    done: bool,
}

impl Probe {
    fn contains(&mut self, key: &[u8]) -> Result<bool> {
        loop {
            match &self.head {
                Some(h) if h.as_slice() >= key => return Ok(h.as_slice() == key),
                None if self.done => return Ok(false),
                _ => {}
            }
            match self.reader.next() {
                Some(row) => self.head = Some(row?.0),
                None => {
                    self.done = true;
                    self.head = None;
                }
            }
        }
    }
}

/// The copied pairs merged with the resolved load. On an equal key the load's resolution wins:
/// it already saw the existing key (Replace stores the load's value, Ignore yields nothing for
/// it so the existing pair passes, Error failed the load).
struct Overlay<L> {
    existing: RunReader,
    existing_head: Option<Row>,
    existing_done: bool,
    load: L,
    load_head: Option<KeyValue>,
    load_done: bool,
}

impl<L: Iterator<Item = Result<KeyValue>>> Overlay<L> {
    fn fill(&mut self) -> Result<()> {
        if self.existing_head.is_none() && !self.existing_done {
            match self.existing.next() {
                Some(row) => self.existing_head = Some(row?),
                None => self.existing_done = true,
            }
        }
        if self.load_head.is_none() && !self.load_done {
            match self.load.next() {
                Some(kv) => self.load_head = Some(kv?),
                None => self.load_done = true,
            }
        }
        Ok(())
    }

    fn step(&mut self) -> Result<Option<KeyValue>> {
        self.fill()?;
        let order = match (&self.existing_head, &self.load_head) {
            (None, None) => return Ok(None),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (Some(e), Some(l)) => e.0.cmp(&l.0),
        };
        Ok(match order {
            std::cmp::Ordering::Less => self.existing_head.take().map(|(k, v, _)| (k, v)),
            std::cmp::Ordering::Greater => self.load_head.take(),
            std::cmp::Ordering::Equal => {
                self.existing_head = None;
                self.load_head.take()
            }
        })
    }
}

impl<L: Iterator<Item = Result<KeyValue>>> Iterator for Overlay<L> {
    type Item = Result<KeyValue>;

    fn next(&mut self) -> Option<Self::Item> {
        self.step().transpose()
    }
}

impl FractalEngine {
    /// The rebuild path (module docs). Holds the engine lock from the copy to the swap, so no
    /// write lands in between; readers wait for the build.
    pub(super) fn load_by_rebuild(
        &self,
        sorted: Sorted,
        opts: &BulkLoadOptions,
        extra_ops: &[WriteOp],
        meta: Option<&[u8]>,
        tmp: &mut TmpFiles,
    ) -> Result<Rebuild> {
        let mut inner = self.inner.write();
        if inner.poisoned {
            return Err(EngineError::Poisoned);
        }
        if let Some(e) = inner.background_error.take() {
            return Err(e);
        }
        let skip = deleted_ranges(extra_ops);
        let copied = match copy_live(&mut inner.tree, &skip, sorted.bytes, tmp) {
            Ok(Some(run)) => run,
            Ok(None) => return Ok(Rebuild::TooMuchData(sorted)),
            Err(e) => {
                if !super::keeps_engine(&e) {
                    inner.poisoned = true;
                }
                return Err(e);
            }
        };
        let mut probe = Probe {
            reader: RunReader::open(&copied)?,
            head: None,
            done: false,
        };
        let merge = Merge::new(&sorted.runs, sorted.mem)?;
        let resolve = Resolve::new(merge, opts.on_duplicate, |k: &[u8]| probe.contains(k));
        let mut overlay = Overlay {
            existing: RunReader::open(&copied)?,
            existing_head: None,
            existing_done: false,
            load: resolve,
            load_head: None,
            load_done: false,
        };
        let leaves = match inner.tree.graft_whole(&mut overlay) {
            Ok(leaves) => leaves,
            Err(e) => {
                if !super::keeps_engine(&e) {
                    inner.poisoned = true;
                }
                return Err(e);
            }
        };
        let mut report = std::mem::take(&mut overlay.load.report);
        report.leaves_built = leaves;
        Self::write_msgs_locked(
            &mut inner,
            extra_ops.len(),
            |i, msn| extra_ops.get(i).and_then(|op| to_msg(op, msn)),
            meta,
        )?;
        Ok(Rebuild::Done(report))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn skip_to_takes_the_farthest_end_of_the_ranges_holding_the_key() {
        let ranges: Ranges = vec![
            (b"b".to_vec(), Some(b"d".to_vec())),
            (b"c".to_vec(), Some(b"f".to_vec())),
            (b"x".to_vec(), None),
        ];
        assert_eq!(skip_to(&ranges, b"a"), None);
        assert_eq!(skip_to(&ranges, b"b"), Some(Some(&b"d"[..])));
        assert_eq!(skip_to(&ranges, b"c"), Some(Some(&b"f"[..])));
        assert_eq!(skip_to(&ranges, b"f"), None);
        assert_eq!(skip_to(&ranges, b"y"), Some(None));
    }
}
