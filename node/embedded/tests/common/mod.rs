//! Helpers shared by the embedded-mode tests: options for small in-memory databases on
//! `FaultVfs`, a deterministic batch generator, and the `BTreeMap` oracle.
#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use ftkv_embedded::{Db, EmbeddedOptions, EngineKind, SyncMode};
use ftkv_engine::TreeParams;
use ftkv_engine::{UpsertOp, WriteOp};
use ftkv_log::LogOptions;
use ftkv_vfs::{FaultVfs, Vfs};

/// Keys to values: the oracle.
pub type Model = BTreeMap<Vec<u8>, Vec<u8>>;

/// Where every test database lives inside its `FaultVfs`.
pub const DIR: &str = "/db";

/// Small nodes, so a few hundred keys split leaves and grow the tree.
pub const SMALL_TREE: TreeParams = TreeParams {
    node_size_bytes: 2048,
    basement_size_bytes: 512,
    fanout: 4,
};

/// A fractal database with small nodes, a 1 MiB cache, 4 KiB log segments (they roll and get
/// purged), fsync per group commit, no automatic checkpoints.
pub fn small_opts() -> EmbeddedOptions {
    EmbeddedOptions {
        engine: EngineKind::Fractal,
        cache_size_bytes: 1 << 20,
        compression_level: Some(1),
        tree_params: Some(SMALL_TREE),
        log: LogOptions {
            segment_size_bytes: 4096,
            sync: SyncMode::Always,
        },
        checkpoint_interval_bytes: None,
        checkpoint_interval_ms: None,
        checkpoint_on_close: true,
        ..EmbeddedOptions::default()
    }
}

/// Opens the database at [`DIR`] on `vfs`.
pub fn open(vfs: &Arc<FaultVfs>, opts: &EmbeddedOptions) -> ftkv_embedded::Result<Db> {
    Db::open(vfs.clone() as Arc<dyn Vfs>, Path::new(DIR), opts.clone())
}

/// Every pair, through a full scan, cross-checked against point reads.
pub fn dump(db: &Db) -> Model {
    let all: Model = db.scan(b"", None, usize::MAX).unwrap().into_iter().collect();
    for (k, v) in all.iter().take(16) {
        assert_eq!(db.get(k).unwrap().as_ref(), Some(v), "get disagrees with scan");
    }
    all
}

/// A small deterministic generator (SplitMix64), so a failing seed replays exactly.
#[derive(Debug, Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub fn key(i: u64) -> Vec<u8> {
    format!("k{i:03}").into_bytes()
}

/// One random op over `keys` keys: mostly puts, some deletes, every upsert kind, and the
/// occasional range delete or range upsert.
pub fn random_op(rng: &mut Rng, keys: u64, tag: u64) -> WriteOp {
    let k = key(rng.below(keys));
    match rng.below(20) {
        0..=9 => WriteOp::Put {
            key: k,
            value: format!("v{tag}-{}", rng.below(1000))
                .repeat(1 + rng.below(3) as usize)
                .into_bytes(),
        },
        10 | 11 => WriteOp::Delete { key: k },
        12 => WriteOp::Upsert {
            key: k,
            op: UpsertOp::Add(rng.below(100) as i64 - 50),
        },
        13 => WriteOp::Upsert {
            key: k,
            op: UpsertOp::Append(format!("+{tag}").into_bytes()),
        },
        14 => WriteOp::Upsert {
            key: k,
            op: UpsertOp::SetIfAbsent(b"fresh".to_vec()),
        },
        15 => WriteOp::Upsert {
            key: k,
            op: UpsertOp::Max(format!("m{}", rng.below(100)).into_bytes()),
        },
        16 | 17 => {
            let a = rng.below(keys);
            let b = a + 1 + rng.below(keys / 8 + 1);
            WriteOp::DeleteRange {
                start: key(a),
                end: (!rng.chance(10)).then(|| key(b)),
            }
        }
        _ => {
            let a = rng.below(keys);
            let b = a + 1 + rng.below(keys / 4 + 1);
            WriteOp::UpsertRange {
                start: key(a),
                end: Some(key(b)),
                op: UpsertOp::Append(b"*".to_vec()),
            }
        }
    }
}

/// A batch of 1..=max_ops random ops.
pub fn random_batch(rng: &mut Rng, keys: u64, max_ops: u64, tag: u64) -> Vec<WriteOp> {
    let n = 1 + rng.below(max_ops);
    (0..n).map(|_| random_op(rng, keys, tag)).collect()
}

/// Asserts `got == want`, naming the first differing keys.
#[allow(unused_imports)] // not every test file compares maps
pub use ftkv_engine::model::assert_same_as_model as assert_same;

/// The database's engine opened by itself (as `Db::open` opens it with [`small_opts`]).
pub fn engine_alone(vfs: &Arc<FaultVfs>) -> ftkv_engine::FractalEngine {
    let opts = small_opts();
    ftkv_engine::FractalEngine::open_with(
        vfs.clone() as Arc<dyn Vfs>,
        &ftkv_engine::EngineOptions {
            dir: Path::new(DIR).join(ftkv_embedded::ENGINE_DIR_NAME),
            cache_size_bytes: opts.cache_size_bytes,
            compression_level: opts.compression_level,
        },
        ftkv_engine::FractalOptions::with_tree(SMALL_TREE),
    )
    .unwrap()
}

/// The database's log opened by itself.
pub fn log_alone(vfs: &Arc<FaultVfs>) -> ftkv_log::Log {
    ftkv_log::Log::open(
        vfs.clone() as Arc<dyn Vfs>,
        &Path::new(DIR).join(ftkv_embedded::LOG_DIR_NAME),
        small_opts().log,
    )
    .unwrap()
}
