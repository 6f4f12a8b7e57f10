//! The sort of a bulk load in bounded memory: rows gather in memory up to the sort budget; a full
//! buffer is sorted (stably, by key) and spilled as a run. Input that stays in key order is never
//! sorted: its buffers are appended to one run, which is then already the whole sorted input.
//! The merge reads every run and the last buffer (kept in memory) in (key, input position)
//! order.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::spill::{Run, RunReader, RunWriter, TmpFiles, ROW_HEADER_BYTES};
use crate::bulk::Row;
use crate::{KeyValue, Result};

/// The sorted input of a load: spilled runs plus the rows still in memory (sorted).
pub(crate) struct Sorted {
    pub(crate) runs: Vec<Run>,
    pub(crate) mem: Vec<Row>,
    /// Whether the input was in key order (non-decreasing).
    pub(crate) was_sorted: bool,
    /// Key and value bytes of every input row.
    pub(crate) bytes: u64,
}

/// Reads `rows` to the end, spilling sorted runs of at most `memory_bytes` through `tmp`.
/// Errors: the first error of `rows`; `Io` / `NoSpace` writing a run.
pub(crate) fn sort_input(
    rows: &mut dyn Iterator<Item = Result<KeyValue>>,
    memory_bytes: u64,
    tmp: &mut TmpFiles,
) -> Result<Sorted> {
    let limit = usize::try_from(memory_bytes).unwrap_or(usize::MAX).max(1);
    let mut buf: Vec<Row> = Vec::new();
    let mut buf_bytes = 0usize;
    let mut was_sorted = true;
    // The run sorted input is appended to (only while the input is still in order).
    let mut in_order: Option<RunWriter> = None;
    let mut runs: Vec<Run> = Vec::new();
    let mut last_key: Option<Vec<u8>> = None;
    let mut bytes = 0u64;
    for (index, row) in (0u64..).zip(rows) {
        let (k, v) = row?;
        bytes += (k.len() + v.len()) as u64;
        if was_sorted {
            let behind = match buf.last() {
                Some(l) => l.0 > k,
                None => last_key.as_ref().is_some_and(|l| *l > k),
            };
            if behind {
                was_sorted = false;
                if let Some(mut w) = in_order.take() {
                    runs.push(w.finish()?);
                }
            }
        }
        buf_bytes += k.len() + v.len() + ROW_HEADER_BYTES;
        buf.push((k, v, index));
        if buf_bytes >= limit {
            if was_sorted {
                let w = match in_order.as_mut() {
                    Some(w) => w,
                    None => in_order.insert(tmp.create()?),
                };
                for (k, v, i) in &buf {
                    w.push(k, v, *i)?;
                }
                last_key = buf.pop().map(|r| r.0);
            } else {
                buf.sort_by(|a, b| a.0.cmp(&b.0));
                let mut w = tmp.create()?;
                for (k, v, i) in &buf {
                    w.push(k, v, *i)?;
                }
                runs.push(w.finish()?);
            }
            buf.clear();
            buf_bytes = 0;
        }
    }
    if let Some(mut w) = in_order.take() {
        if was_sorted {
            // The whole input is one run: the rows still in memory are its tail.
            for (k, v, i) in &buf {
                w.push(k, v, *i)?;
            }
            buf.clear();
        }
        runs.push(w.finish()?);
    }
    if !was_sorted {
        buf.sort_by(|a, b| a.0.cmp(&b.0));
    }
    Ok(Sorted {
        runs,
        mem: buf,
        was_sorted,
        bytes,
    })
}

/// One source of the merge and its current row.
struct Head {
    row: Row,
    source: usize,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Head {
    /// Reversed (key, input position): the max-heap pops the smallest first.
    fn cmp(&self, other: &Self) -> Ordering {
        (&other.row.0, other.row.2).cmp(&(&self.row.0, self.row.2))
    }
}

type Source = Box<dyn Iterator<Item = Result<Row>>>;

/// The k-way merge of a load's runs and in-memory rows, in (key, input position) order.
pub(crate) struct Merge {
    sources: Vec<Source>,
    heap: BinaryHeap<Head>,
    started: bool,
    failed: bool,
}

impl Merge {
    /// Opens every run of `sorted` (the rows in memory are taken as given: `mem`).
    pub(crate) fn new(runs: &[Run], mem: Vec<Row>) -> Result<Self> {
        let mut sources: Vec<Source> = Vec::with_capacity(runs.len() + 1);
        for r in runs {
            sources.push(Box::new(RunReader::open(r)?));
        }
        if !mem.is_empty() {
            sources.push(Box::new(mem.into_iter().map(Ok)));
        }
        Ok(Merge {
            sources,
            heap: BinaryHeap::new(),
            started: false,
            failed: false,
        })
    }

    fn pull(&mut self, source: usize) -> Result<()> {
        if let Some(s) = self.sources.get_mut(source) {
            if let Some(row) = s.next() {
                self.heap.push(Head { row: row?, source });
            }
        }
        Ok(())
    }

    fn step(&mut self) -> Result<Option<Row>> {
        if let [only] = self.sources.as_mut_slice() {
            // One source (sorted input): no heap.
            return only.next().transpose();
        }
        if !self.started {
            self.started = true;
            for s in 0..self.sources.len() {
                self.pull(s)?;
            }
        }
        let Some(Head { row, source }) = self.heap.pop() else {
            return Ok(None);
        };
        self.pull(source)?;
        Ok(Some(row))
    }
}

impl Iterator for Merge {
    type Item = Result<Row>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        match self.step() {
            Ok(r) => r.map(Ok),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}
