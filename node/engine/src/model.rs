//! The `BTreeMap` model engine: the oracle every conformance and crash test compares against.
//! In memory only; `checkpoint` is a no-op and nothing survives a restart.

use std::collections::BTreeMap;
use std::ops::Bound;

use parking_lot::RwLock;

use crate::ops::{apply_broadcast, apply_upsert, WriteOp};
use crate::{Engine, EngineKind, IntegrityReport, KeyValue, Result};

/// An ordered map applying [`WriteOp`]s with the reference semantics.
#[derive(Debug, Default)]
pub struct ModelEngine {
    state: RwLock<ModelState>,
}

#[derive(Debug, Default, Clone)]
struct ModelState {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    meta: Option<Vec<u8>>,
}

/// Panics unless `got == want`, naming `ctx`, both sizes and the first (up to 8) keys whose
/// values differ (as lossy UTF-8): the comparison helper of model-based tests, whose maps are
/// too large to print whole.
pub fn assert_same_as_model(got: &BTreeMap<Vec<u8>, Vec<u8>>, want: &BTreeMap<Vec<u8>, Vec<u8>>, ctx: &str) {
    if got == want {
        return;
    }
    let keys: std::collections::BTreeSet<&Vec<u8>> = got.keys().chain(want.keys()).collect();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| got.get(*k) != want.get(*k))
        .take(8)
        .map(|k| {
            format!(
                "{}: got {:?}, want {:?}",
                String::from_utf8_lossy(k),
                got.get(k).map(|v| String::from_utf8_lossy(v).into_owned()),
                want.get(k).map(|v| String::from_utf8_lossy(v).into_owned())
            )
        })
        .collect();
    panic!(
        "{ctx}: {} vs {} keys; first differences: {diffs:#?}",
        got.len(),
        want.len()
    );
}

/// Applies `ops` in order to `map` with the reference semantics of [`WriteOp`].
pub fn apply_ops(map: &mut BTreeMap<Vec<u8>, Vec<u8>>, ops: &[WriteOp]) {
    for op in ops {
        match op {
            WriteOp::Put { key, value } => {
                map.insert(key.clone(), value.clone());
            }
            WriteOp::Delete { key } => {
                map.remove(key);
            }
            WriteOp::Upsert { key, op } => {
                if let Some(v) = apply_upsert(map.get(key).map(Vec::as_slice), op) {
                    map.insert(key.clone(), v);
                }
            }
            WriteOp::DeleteRange { start, end } => {
                let doomed: Vec<Vec<u8>> = range(map, start, end.as_deref())
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in doomed {
                    map.remove(&k);
                }
            }
            WriteOp::UpsertRange { start, end, op } => {
                let upper = end
                    .as_deref()
                    .map_or(Bound::Unbounded, |e| Bound::Excluded(e.to_vec()));
                if end.as_deref().is_some_and(|e| e <= start.as_slice()) {
                    continue;
                }
                for (_, v) in map.range_mut((Bound::Included(start.clone()), upper)) {
                    *v = apply_broadcast(v, op);
                }
            }
        }
    }
}

fn range<'a>(
    map: &'a BTreeMap<Vec<u8>, Vec<u8>>,
    start: &[u8],
    end: Option<&[u8]>,
) -> Box<dyn Iterator<Item = (&'a Vec<u8>, &'a Vec<u8>)> + 'a> {
    if end.is_some_and(|e| e <= start) {
        return Box::new(std::iter::empty());
    }
    let upper = end.map_or(Bound::Unbounded, |e| Bound::Excluded(e.to_vec()));
    Box::new(map.range((Bound::Included(start.to_vec()), upper)))
}

impl ModelEngine {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of all data, for comparisons in tests.
    pub fn snapshot(&self) -> BTreeMap<Vec<u8>, Vec<u8>> {
        self.state.read().data.clone()
    }
}

impl Engine for ModelEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Model
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.state.read().data.get(key).cloned())
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>> {
        let state = self.state.read();
        Ok(range(&state.data, start, end)
            .take(limit)
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn write(&self, ops: &[WriteOp], meta: Option<&[u8]>) -> Result<()> {
        let mut state = self.state.write();
        apply_ops(&mut state.data, ops);
        if let Some(m) = meta {
            state.meta = Some(m.to_vec());
        }
        Ok(())
    }

    fn meta(&self) -> Result<Option<Vec<u8>>> {
        Ok(self.state.read().meta.clone())
    }

    fn checkpoint(&self) -> Result<()> {
        Ok(())
    }

    fn replace_all(&self, pairs: &mut dyn Iterator<Item = Result<KeyValue>>, meta: &[u8]) -> Result<()> {
        let mut data = BTreeMap::new();
        for pair in pairs {
            let (k, v) = pair?;
            data.insert(k, v);
        }
        *self.state.write() = ModelState {
            data,
            meta: Some(meta.to_vec()),
        };
        Ok(())
    }

    fn check_integrity(&self) -> Result<IntegrityReport> {
        Ok(IntegrityReport {
            keys: self.state.read().data.len() as u64,
            blocks: 0,
            height: 0,
        })
    }

    fn size_on_disk_bytes(&self) -> Result<u64> {
        Ok(0)
    }
}
