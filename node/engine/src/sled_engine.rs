//! sled 0.34 behind the [`Engine`] trait: the comparison engine (`engine.kind = "sled"`), as
//! the seed benchmarks ran InnoDB beside TokuDB.
//!
//! Layout: the data of one generation lives in the sled tree `gen-<N>`, user keys prefixed by
//! `0x01`, the metadata blob under the single key `0x00`, so one `sled::Batch` updates data and
//! metadata atomically. The tree `current` names the live generation; [`Engine::replace_all`]
//! fills generation `N+1`, flushes, then flips `current` (a snapshot install is atomic).
//! Upserts and range operations read before they write (sled has no message buffers): that is
//! the B-tree behaviour the fractal tree is compared against.

use std::collections::BTreeMap;

use parking_lot::RwLock;

use crate::ops::{apply_broadcast, apply_upsert, WriteOp};
use crate::{Engine, EngineError, EngineKind, EngineOptions, IntegrityReport, KeyValue, Result};

const META_KEY: &[u8] = &[0x00];
const DATA_PREFIX: u8 = 0x01;
const CURRENT_KEY: &[u8] = b"generation";

/// A sled database used as an ftkv engine.
pub struct SledEngine {
    db: sled::Db,
    current: sled::Tree,
    live: RwLock<Live>,
}

struct Live {
    generation: u64,
    tree: sled::Tree,
}

fn sled_err(e: sled::Error) -> EngineError {
    match e {
        sled::Error::Io(source) => EngineError::Io {
            context: "sled".into(),
            source,
        },
        sled::Error::Corruption { at, .. } => EngineError::Corruption {
            location: format!("sled file at {at:?}"),
            detail: "sled checksum".into(),
        },
        other => EngineError::Sled(other.to_string()),
    }
}

/// The user's key of a sled data key (without [`DATA_PREFIX`]).
fn user_key(k: &[u8]) -> Vec<u8> {
    k.get(1..).unwrap_or_default().to_vec()
}

fn data_key(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(key.len() + 1);
    k.push(DATA_PREFIX);
    k.extend_from_slice(key);
    k
}

fn tree_name(generation: u64) -> String {
    format!("gen-{generation}")
}

impl SledEngine {
    /// Opens (or creates) a sled engine in `opts.dir`. `cache_size_bytes` becomes sled's
    /// `cache_capacity`; `compression_level` is ignored (sled 0.34's compression needs a feature
    /// we do not build).
    pub fn open(opts: &EngineOptions) -> Result<Self> {
        std::fs::create_dir_all(&opts.dir).map_err(|source| EngineError::Io {
            context: format!("create {}", opts.dir.display()),
            source,
        })?;
        let db = sled::Config::new()
            .path(&opts.dir)
            .cache_capacity(opts.cache_size_bytes)
            .flush_every_ms(None)
            .open()
            .map_err(sled_err)?;
        let current = db.open_tree("current").map_err(sled_err)?;
        let generation = match current.get(CURRENT_KEY).map_err(sled_err)? {
            Some(raw) => u64::from_le_bytes(<[u8; 8]>::try_from(raw.as_ref()).map_err(|_| {
                EngineError::Corruption {
                    location: "sled tree current".into(),
                    detail: "generation not 8 bytes".into(),
                }
            })?),
            None => 0,
        };
        // Drop generations left behind by an interrupted replace_all.
        for name in db.tree_names() {
            let name_str = String::from_utf8_lossy(&name).to_string();
            if name_str.starts_with("gen-") && name_str != tree_name(generation) {
                db.drop_tree(&name).map_err(sled_err)?;
            }
        }
        let tree = db.open_tree(tree_name(generation)).map_err(sled_err)?;
        Ok(Self {
            db,
            current,
            live: RwLock::new(Live { generation, tree }),
        })
    }
}

impl Engine for SledEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Sled
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let live = self.live.read();
        Ok(live
            .tree
            .get(data_key(key))
            .map_err(sled_err)?
            .map(|v| v.to_vec()))
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>> {
        if end.is_some_and(|e| e <= start) || limit == 0 {
            return Ok(Vec::new());
        }
        let live = self.live.read();
        let lower = data_key(start);
        let iter = match end {
            Some(e) => live.tree.range(lower..data_key(e)),
            None => live.tree.range(lower..vec![DATA_PREFIX + 1]),
        };
        let mut out = Vec::new();
        for item in iter.take(limit) {
            let (k, v) = item.map_err(sled_err)?;
            out.push((user_key(&k), v.to_vec()));
        }
        Ok(out)
    }

    fn write(&self, ops: &[WriteOp], meta: Option<&[u8]>) -> Result<()> {
        let live = self.live.read();
        // Overlay of this batch's effects so later ops see earlier ones; None = deleted.
        let mut overlay: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let read = |overlay: &BTreeMap<Vec<u8>, Option<Vec<u8>>>, key: &[u8]| -> Result<Option<Vec<u8>>> {
            match overlay.get(key) {
                Some(v) => Ok(v.clone()),
                None => Ok(live
                    .tree
                    .get(data_key(key))
                    .map_err(sled_err)?
                    .map(|v| v.to_vec())),
            }
        };
        for op in ops {
            match op {
                WriteOp::Put { key, value } => {
                    overlay.insert(key.clone(), Some(value.clone()));
                }
                WriteOp::Delete { key } => {
                    overlay.insert(key.clone(), None);
                }
                WriteOp::Upsert { key, op } => {
                    let old = read(&overlay, key)?;
                    let new = apply_upsert(old.as_deref(), op);
                    overlay.insert(key.clone(), new);
                }
                WriteOp::DeleteRange { start, end } | WriteOp::UpsertRange { start, end, .. } => {
                    let mut present = self.present_in_range(&live, &overlay, start, end.as_deref())?;
                    for (key, value) in present.iter_mut() {
                        let new = match op {
                            WriteOp::UpsertRange { op, .. } => Some(apply_broadcast(value, op)),
                            _ => None,
                        };
                        overlay.insert(std::mem::take(key), new);
                    }
                }
            }
        }
        let mut batch = sled::Batch::default();
        for (key, value) in overlay {
            match value {
                Some(v) => batch.insert(data_key(&key), v),
                None => batch.remove(data_key(&key)),
            }
        }
        if let Some(m) = meta {
            batch.insert(META_KEY, m);
        }
        live.tree.apply_batch(batch).map_err(sled_err)
    }

    fn meta(&self) -> Result<Option<Vec<u8>>> {
        Ok(self
            .live
            .read()
            .tree
            .get(META_KEY)
            .map_err(sled_err)?
            .map(|v| v.to_vec()))
    }

    fn checkpoint(&self) -> Result<()> {
        self.db.flush().map_err(sled_err)?;
        Ok(())
    }

    fn replace_all(&self, pairs: &mut dyn Iterator<Item = Result<KeyValue>>, meta: &[u8]) -> Result<()> {
        let next = self.live.read().generation + 1;
        let name = tree_name(next);
        self.db.drop_tree(name.as_bytes()).map_err(sled_err)?;
        let tree = self.db.open_tree(&name).map_err(sled_err)?;
        let mut batch = sled::Batch::default();
        let mut in_batch = 0usize;
        let mut previous: Option<Vec<u8>> = None;
        for pair in pairs {
            let (k, v) = pair?;
            if previous.as_ref().is_some_and(|p| p >= &k) {
                return Err(EngineError::InvalidArgument(
                    "replace_all: keys not strictly ascending".into(),
                ));
            }
            batch.insert(data_key(&k), v);
            previous = Some(k);
            in_batch += 1;
            if in_batch == 10_000 {
                tree.apply_batch(std::mem::take(&mut batch)).map_err(sled_err)?;
                in_batch = 0;
            }
        }
        batch.insert(META_KEY, meta);
        tree.apply_batch(batch).map_err(sled_err)?;
        self.db.flush().map_err(sled_err)?;
        self.current
            .insert(CURRENT_KEY, &next.to_le_bytes())
            .map_err(sled_err)?;
        self.db.flush().map_err(sled_err)?;
        let old = std::mem::replace(
            &mut *self.live.write(),
            Live {
                generation: next,
                tree,
            },
        );
        self.db
            .drop_tree(tree_name(old.generation).as_bytes())
            .map_err(sled_err)?;
        Ok(())
    }

    fn check_integrity(&self) -> Result<IntegrityReport> {
        let live = self.live.read();
        let mut keys = 0u64;
        let mut previous: Option<sled::IVec> = None;
        for item in live.tree.iter() {
            let (k, _) = item.map_err(sled_err)?;
            if k.as_ref() != META_KEY && k.first() != Some(&DATA_PREFIX) {
                return Err(EngineError::Corruption {
                    location: "sled data tree".into(),
                    detail: "unknown key prefix".into(),
                });
            }
            if previous.as_ref().is_some_and(|p| p >= &k) {
                return Err(EngineError::Corruption {
                    location: "sled data tree".into(),
                    detail: "keys out of order".into(),
                });
            }
            if k.as_ref() != META_KEY {
                keys += 1;
            }
            previous = Some(k);
        }
        Ok(IntegrityReport {
            keys,
            blocks: 0,
            height: 0,
        })
    }

    fn size_on_disk_bytes(&self) -> Result<u64> {
        self.db.size_on_disk().map_err(sled_err)
    }
}

impl SledEngine {
    /// Present pairs in `[start, end)` as seen through the batch overlay.
    fn present_in_range(
        &self,
        live: &Live,
        overlay: &BTreeMap<Vec<u8>, Option<Vec<u8>>>,
        start: &[u8],
        end: Option<&[u8]>,
    ) -> Result<Vec<KeyValue>> {
        if end.is_some_and(|e| e <= start) {
            return Ok(Vec::new());
        }
        let mut merged: BTreeMap<Vec<u8>, Option<Vec<u8>>> = BTreeMap::new();
        let iter = match end {
            Some(e) => live.tree.range(data_key(start)..data_key(e)),
            None => live.tree.range(data_key(start)..vec![DATA_PREFIX + 1]),
        };
        for item in iter {
            let (k, v) = item.map_err(sled_err)?;
            merged.insert(user_key(&k), Some(v.to_vec()));
        }
        for (k, v) in overlay {
            if crate::ops::in_range(k, start, end) {
                merged.insert(k.clone(), v.clone());
            }
        }
        Ok(merged
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
            .collect())
    }
}
