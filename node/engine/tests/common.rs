#![allow(clippy::unwrap_used)]
//! Shared helpers of the engine tests: engine factories (fractal on `FaultVfs` or real files,
//! sled, model), op strategies, and the model oracle.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use ftkv_engine::model::{apply_ops, ModelEngine};
use ftkv_engine::sled_engine::SledEngine;
use ftkv_engine::{Engine, EngineKind, EngineOptions, UpsertOp, WriteOp};
use ftkv_engine::{FractalEngine, TreeParams};
use ftkv_vfs::{FaultVfs, Vfs};
use proptest::prelude::*;

/// Small shapes so splits, flushes, merges and several levels happen with few keys.
pub const SMALL: TreeParams = TreeParams {
    node_size_bytes: 2048,
    basement_size_bytes: 512,
    fanout: 4,
};

pub fn opts(dir: PathBuf, cache_size_bytes: u64, compression_level: Option<i32>) -> EngineOptions {
    EngineOptions {
        dir,
        cache_size_bytes,
        compression_level,
    }
}

/// An engine under test that can be closed and reopened.
pub struct Subject {
    pub kind: EngineKind,
    pub engine: Option<Box<dyn Engine>>,
    pub vfs: Arc<FaultVfs>,
    pub tmp: tempfile::TempDir,
    pub opts: EngineOptions,
    pub params: TreeParams,
}

impl Subject {
    pub fn new(kind: EngineKind, params: TreeParams, cache_size_bytes: u64, level: Option<i32>) -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let dir = match kind {
            EngineKind::Sled => tmp.path().join("sled"),
            _ => PathBuf::from("/engine"),
        };
        let mut s = Subject {
            kind,
            engine: None,
            vfs: FaultVfs::new(7),
            tmp,
            opts: opts(dir, cache_size_bytes, level),
            params,
        };
        s.open().unwrap();
        s
    }

    pub fn open(&mut self) -> ftkv_engine::Result<()> {
        self.engine = None;
        let e: Box<dyn Engine> = match self.kind {
            EngineKind::Fractal => Box::new(FractalEngine::open_with(
                self.vfs.clone() as Arc<dyn Vfs>,
                &self.opts,
                ftkv_engine::FractalOptions::with_tree(self.params),
            )?),
            EngineKind::Sled => {
                // sled's background flusher may hold the directory lock a moment after drop.
                let mut tries = 0;
                loop {
                    match SledEngine::open(&self.opts) {
                        Ok(e) => break Box::new(e),
                        Err(_) if tries < 200 => {
                            tries += 1;
                            std::thread::sleep(std::time::Duration::from_millis(10));
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            EngineKind::Model => Box::new(ModelEngine::new()),
        };
        self.engine = Some(e);
        Ok(())
    }

    pub fn e(&self) -> &dyn Engine {
        self.engine.as_deref().unwrap()
    }
}

/// Every pair of an engine, by a full scan.
pub fn dump(e: &dyn Engine) -> BTreeMap<Vec<u8>, Vec<u8>> {
    e.scan(b"", None, usize::MAX).unwrap().into_iter().collect()
}

pub fn key_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => prop::collection::vec(prop::sample::select(b"abcdef".to_vec()), 1..4),
        1 => prop::collection::vec(prop::sample::select(b"ab".to_vec()), 0..3),
    ]
}

pub fn value_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 0..24),
        1 => any::<i64>().prop_map(|v| v.to_le_bytes().to_vec()),
        1 => prop::collection::vec(any::<u8>(), 60..120),
    ]
}

pub fn upsert_strategy() -> impl Strategy<Value = UpsertOp> {
    prop_oneof![
        value_strategy().prop_map(UpsertOp::SetIfAbsent),
        (-1000i64..1000).prop_map(UpsertOp::Add),
        prop::collection::vec(any::<u8>(), 0..6).prop_map(UpsertOp::Append),
        value_strategy().prop_map(UpsertOp::Max),
    ]
}

pub fn end_strategy() -> impl Strategy<Value = Option<Vec<u8>>> {
    prop_oneof![4 => key_strategy().prop_map(Some), 1 => Just(None)]
}

pub fn write_op_strategy() -> impl Strategy<Value = WriteOp> {
    prop_oneof![
        8 => (key_strategy(), value_strategy()).prop_map(|(key, value)| WriteOp::Put { key, value }),
        3 => key_strategy().prop_map(|key| WriteOp::Delete { key }),
        4 => (key_strategy(), upsert_strategy()).prop_map(|(key, op)| WriteOp::Upsert { key, op }),
        1 => (key_strategy(), end_strategy()).prop_map(|(start, end)| WriteOp::DeleteRange { start, end }),
        1 => (key_strategy(), end_strategy(), upsert_strategy())
            .prop_map(|(start, end, op)| WriteOp::UpsertRange { start, end, op }),
    ]
}

/// One step of a conformance sequence.
#[derive(Debug, Clone)]
pub enum Step {
    Write(Vec<WriteOp>, Option<Vec<u8>>),
    Get(Vec<u8>),
    Scan(Vec<u8>, Option<Vec<u8>>, usize),
    Checkpoint,
    /// Checkpoint, close, reopen (a clean restart).
    Reopen,
    ReplaceAll(Vec<(Vec<u8>, Vec<u8>)>),
}

pub fn step_strategy() -> impl Strategy<Value = Step> {
    prop_oneof![
        12 => (prop::collection::vec(write_op_strategy(), 1..24), prop::option::of(prop::collection::vec(any::<u8>(), 0..8)))
            .prop_map(|(ops, meta)| Step::Write(ops, meta)),
        4 => key_strategy().prop_map(Step::Get),
        3 => (key_strategy(), end_strategy(), 0usize..40).prop_map(|(s, e, l)| Step::Scan(s, e, l)),
        1 => Just(Step::Checkpoint),
        1 => Just(Step::Reopen),
        1 => prop::collection::btree_map(key_strategy(), value_strategy(), 0..60)
            .prop_map(|m| Step::ReplaceAll(m.into_iter().collect())),
    ]
}

/// What the conformance suite needs of an engine (openraft's `StoreBuilder` in spirit): a way to
/// open it, and open it again on the same storage.
pub trait EngineFactory {
    /// Opens the engine: once at the start, and after every `Reopen` step (the previous engine
    /// is dropped first).
    fn open_engine(&mut self) -> ftkv_engine::Result<Box<dyn Engine>>;
    /// Whether a reopened engine keeps its data (false for in-memory engines, whose `Reopen`
    /// step only checkpoints).
    fn durable(&self) -> bool;
}

impl EngineFactory for Subject {
    fn open_engine(&mut self) -> ftkv_engine::Result<Box<dyn Engine>> {
        self.open()?;
        Ok(self.engine.take().unwrap())
    }

    fn durable(&self) -> bool {
        self.kind != EngineKind::Model
    }
}

/// The conformance suite every engine runs through (openraft's `Suite::test_all` in spirit):
/// runs `steps` against an engine from `factory` and the `BTreeMap` model, comparing every read,
/// the metadata after every step, the state after every reopen and at the end, and the
/// integrity walk's key count.
pub fn run_conformance(factory: &mut dyn EngineFactory, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut engine = factory.open_engine().unwrap();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    let mut meta: Option<Vec<u8>> = None;
    for (i, step) in steps.iter().enumerate() {
        match step {
            Step::Write(ops, m) => {
                // Both entry points: borrowed ops (copied by the engine) and owned ops (whose
                // buffers the fractal tree keeps), alternating by step.
                if i % 2 == 0 {
                    engine.as_ref().write(ops, m.as_deref()).unwrap();
                } else {
                    engine.as_ref().write_owned(ops.clone(), m.as_deref()).unwrap();
                }
                apply_ops(&mut model, ops);
                if m.is_some() {
                    meta.clone_from(m);
                }
            }
            Step::Get(k) => {
                prop_assert_eq!(
                    engine.as_ref().get(k).unwrap(),
                    model.get(k).cloned(),
                    "step {} get {:?}",
                    i,
                    k
                );
            }
            Step::Scan(s, e, limit) => {
                let got = engine.as_ref().scan(s, e.as_deref(), *limit).unwrap();
                let want: Vec<_> = model
                    .iter()
                    .filter(|(k, _)| ftkv_engine::ops::in_range(k, s, e.as_deref()))
                    .take(*limit)
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                prop_assert_eq!(got, want, "step {} scan", i);
            }
            Step::Checkpoint => engine.as_ref().checkpoint().unwrap(),
            Step::Reopen => {
                engine.as_ref().checkpoint().unwrap();
                if factory.durable() {
                    drop(engine);
                    engine = factory.open_engine().unwrap();
                    prop_assert_eq!(dump(engine.as_ref()), model.clone(), "step {} after reopen", i);
                }
            }
            Step::ReplaceAll(pairs) => {
                let m = format!("snap{i}").into_bytes();
                let mut it = pairs.iter().cloned().map(Ok);
                engine.as_ref().replace_all(&mut it, &m).unwrap();
                model = pairs.iter().cloned().collect();
                meta = Some(m);
            }
        }
        prop_assert_eq!(engine.as_ref().meta().unwrap(), meta.clone(), "step {} meta", i);
    }
    prop_assert_eq!(dump(engine.as_ref()), model.clone(), "final state");
    let report = engine.as_ref().check_integrity().unwrap();
    prop_assert_eq!(report.keys, model.len() as u64);
    Ok(())
}
