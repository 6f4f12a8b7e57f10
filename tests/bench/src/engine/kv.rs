//! The engines under test behind one small bench-only interface, [`BenchKv`]: ftkv's
//! [`ftkv_engine::Engine`]s (fractal, sled) directly, fjall 2.11 (an LSM tree in pure Rust,
//! after LevelDB/RocksDB) through a thin adapter that lives only here, and RocksDB (with the
//! `rocksdb` feature) through [`super::rocks`].
//!
//! fjall has no range tombstones or broadcast messages, so [`BenchKv::delete_range`] and
//! [`BenchKv::upsert_range`] on fjall do what an application on an LSM tree must do: read the
//! range and write one tombstone / new value per key (batches of 10,000). The bench reports
//! that cost as it is.

use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use ftkv_engine::FractalEngine;
use ftkv_engine::{Engine, EngineKind, EngineOptions, UpsertOp, WriteOp};

/// Which engine a child process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineName {
    /// ftkv's fractal tree (`ftkv_engine::fractal`).
    Fractal,
    /// sled 0.34 through `ftkv_engine::sled_engine`.
    Sled,
    /// fjall 2.11 (LSM tree), bench-only adapter.
    Fjall,
    /// RocksDB through the `rocksdb` crate (`super::rocks`; needs the `rocksdb` feature).
    Rocksdb,
}

impl EngineName {
    /// Lower-case name as used on the command line and in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineName::Fractal => "fractal",
            EngineName::Sled => "sled",
            EngineName::Fjall => "fjall",
            EngineName::Rocksdb => "rocksdb",
        }
    }

    /// Parses `fractal`, `sled`, `fjall` or `rocksdb` (the last fails in a build without the
    /// `rocksdb` feature, with [`super::rocks::NOT_BUILT`]).
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        Ok(match s.trim() {
            "fractal" => EngineName::Fractal,
            "sled" => EngineName::Sled,
            "fjall" => EngineName::Fjall,
            "rocksdb" => {
                super::rocks::ensure_available()?;
                EngineName::Rocksdb
            }
            other => anyhow::bail!("unknown engine {other:?} (fractal, sled, fjall, rocksdb)"),
        })
    }
}

/// What every workload needs from an engine.
pub trait BenchKv {
    /// Inserts `pairs` as one atomic batch (no fsync).
    /// Takes the rows by value: each engine takes them the way its API takes data best (the
    /// fractal tree keeps the buffers, fjall and sled copy what they need).
    fn put_batch(&self, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> anyhow::Result<()>;
    /// Point read.
    fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>>;
    /// Up to `limit` pairs from `start` (inclusive) in key order; returns how many were read.
    fn scan_count(&self, start: &[u8], limit: usize) -> anyhow::Result<usize>;
    /// Removes every key in `[start, end)`.
    fn delete_range(&self, start: &[u8], end: &[u8]) -> anyhow::Result<()>;
    /// Applies `op` to every present key (TokuDB's instant ADD COLUMN).
    fn upsert_all(&self, op: &UpsertOp) -> anyhow::Result<()>;
    /// Makes every write durable (the engine's checkpoint / journal sync).
    fn checkpoint(&self) -> anyhow::Result<()>;
    /// Settles background work that affects the on-disk size (fjall: flush memtables so the
    /// data sits in compressed tables, not only in the journal). No-op for the others.
    fn settle(&self) -> anyhow::Result<()>;
    /// Bytes on disk as the engine reports them.
    fn engine_size_bytes(&self) -> anyhow::Result<u64>;
    /// Bytes of a write-ahead journal inside the engine's directory (fjall's journal; 0 for
    /// engines without one), so the size of the tables alone can be told apart.
    fn journal_bytes(&self) -> u64 {
        0
    }
    /// Engine internals worth printing after a phase (the fractal tree's partial-read, spill
    /// and checkpoint counters); `None` for engines without such counters.
    fn engine_notes(&self) -> Option<String> {
        None
    }
}

/// An ftkv engine (fractal or sled); the fractal tree also as itself, for its counters.
pub struct FtkvKv(pub Arc<dyn Engine>, pub Option<Arc<FractalEngine>>);

impl BenchKv for FtkvKv {
    fn put_batch(&self, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> anyhow::Result<()> {
        let ops: Vec<WriteOp> = pairs
            .into_iter()
            .map(|(key, value)| WriteOp::Put { key, value })
            .collect();
        Ok(self.0.write_owned(ops, None)?)
    }

    fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self.0.get(key)?)
    }

    fn scan_count(&self, start: &[u8], limit: usize) -> anyhow::Result<usize> {
        Ok(self.0.scan(start, None, limit)?.len())
    }

    fn delete_range(&self, start: &[u8], end: &[u8]) -> anyhow::Result<()> {
        let op = WriteOp::DeleteRange {
            start: start.to_vec(),
            end: Some(end.to_vec()),
        };
        Ok(self.0.write(&[op], None)?)
    }

    fn upsert_all(&self, op: &UpsertOp) -> anyhow::Result<()> {
        let op = WriteOp::UpsertRange {
            start: Vec::new(),
            end: None,
            op: op.clone(),
        };
        Ok(self.0.write(&[op], None)?)
    }

    fn checkpoint(&self) -> anyhow::Result<()> {
        Ok(self.0.checkpoint()?)
    }

    fn settle(&self) -> anyhow::Result<()> {
        Ok(())
    }

    fn engine_size_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.0.size_on_disk_bytes()?)
    }

    fn engine_notes(&self) -> Option<String> {
        let f = self.1.as_ref()?;
        Some(format!(
            "cached {} MiB; memory {:?}; process RssAnon {} KiB; partial reads {:?}; evictions {:?}; spills {:?}; background flushes {:?}; writeback {:?}; last checkpoint {:?}",
            f.cached_bytes() >> 20,
            f.memory_use(),
            super::child::proc_status_kib("self", "RssAnon").unwrap_or(0),
            f.partial_read_stats(),
            f.eviction_stats(),
            f.spill_stats(),
            f.flush_totals(),
            f.writeback_totals(),
            f.last_checkpoint_stats()
        ))
    }
}

/// fjall 2.11: one keyspace with one partition (`bench`), lz4 block compression (its default).
pub struct FjallKv {
    keyspace: fjall::Keyspace,
    partition: fjall::PartitionHandle,
}

/// Keys rewritten per batch when fjall emulates a range delete or a broadcast.
const FJALL_RANGE_BATCH: usize = 10_000;

impl FjallKv {
    /// Opens (creating) a keyspace in `dir` with a block cache of `cache_size_bytes`.
    pub fn open(dir: &Path, cache_size_bytes: u64) -> anyhow::Result<Self> {
        let keyspace = fjall::Config::new(dir)
            .cache_size(cache_size_bytes)
            .open()
            .context("open fjall keyspace")?;
        let partition = keyspace
            .open_partition("bench", fjall::PartitionCreateOptions::default())
            .context("open fjall partition")?;
        Ok(FjallKv { keyspace, partition })
    }

    fn rewrite_range(
        &self,
        start: &[u8],
        end: Option<&[u8]>,
        new_value: &dyn Fn(&[u8]) -> Option<Vec<u8>>,
    ) -> anyhow::Result<()> {
        let mut batch = self.keyspace.batch();
        let iter: Box<dyn Iterator<Item = fjall::Result<fjall::KvPair>>> = match end {
            Some(end) => Box::new(self.partition.range(start.to_vec()..end.to_vec())),
            None => Box::new(self.partition.range(start.to_vec()..)),
        };
        for kv in iter {
            let (k, v) = kv?;
            match new_value(&v) {
                Some(nv) => batch.insert(&self.partition, k, nv),
                None => batch.remove(&self.partition, k),
            }
            if batch.len() >= FJALL_RANGE_BATCH {
                std::mem::replace(&mut batch, self.keyspace.batch()).commit()?;
            }
        }
        batch.commit()?;
        Ok(())
    }
}

impl BenchKv for FjallKv {
    fn put_batch(&self, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> anyhow::Result<()> {
        let mut batch = self.keyspace.batch();
        for (k, v) in pairs {
            batch.insert(&self.partition, k, v);
        }
        Ok(batch.commit()?)
    }

    fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
        Ok(self.partition.get(key)?.map(|v| v.to_vec()))
    }

    fn scan_count(&self, start: &[u8], limit: usize) -> anyhow::Result<usize> {
        let mut n = 0;
        for kv in self.partition.range(start.to_vec()..).take(limit) {
            let (_k, v) = kv?;
            std::hint::black_box(v);
            n += 1;
        }
        Ok(n)
    }

    fn delete_range(&self, start: &[u8], end: &[u8]) -> anyhow::Result<()> {
        self.rewrite_range(start, Some(end), &|_| None)
    }

    fn upsert_all(&self, op: &UpsertOp) -> anyhow::Result<()> {
        self.rewrite_range(&[], None, &|v| Some(ftkv_engine::ops::apply_broadcast(v, op)))
    }

    fn checkpoint(&self) -> anyhow::Result<()> {
        Ok(self.keyspace.persist(fjall::PersistMode::SyncAll)?)
    }

    fn settle(&self) -> anyhow::Result<()> {
        self.partition.rotate_memtable_and_wait()?;
        Ok(())
    }

    fn engine_size_bytes(&self) -> anyhow::Result<u64> {
        Ok(self.keyspace.disk_space())
    }

    fn journal_bytes(&self) -> u64 {
        self.keyspace.journal_disk_space()
    }
}

/// Opens engine `name` in `dir` with a cache budget of `cache_size_bytes` (fractal: leaves at
/// zstd `zstd_level`, 1 being the node's default; rocksdb: every level at that zstd level).
pub fn open(
    name: EngineName,
    dir: &Path,
    cache_size_bytes: u64,
    zstd_level: i32,
) -> anyhow::Result<Box<dyn BenchKv>> {
    let opts = EngineOptions {
        dir: dir.to_path_buf(),
        cache_size_bytes,
        compression_level: Some(zstd_level),
    };
    Ok(match name {
        EngineName::Fractal => {
            let f = Arc::new(FractalEngine::open(ftkv_vfs::RealVfs::new(), &opts)?);
            Box::new(FtkvKv(f.clone(), Some(f)))
        }
        EngineName::Sled => Box::new(FtkvKv(ftkv_engine::open_engine(EngineKind::Sled, &opts)?, None)),
        EngineName::Fjall => Box::new(FjallKv::open(dir, cache_size_bytes)?),
        EngineName::Rocksdb => super::rocks::open(dir, cache_size_bytes, zstd_level)?,
    })
}

/// Bytes allocated on disk under `dir` (like `du`: allocated 512-byte blocks, so punched holes
/// and sparse files count as what they really use).
pub fn dir_allocated_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    for e in entries.flatten() {
        let Ok(md) = e.metadata() else { continue };
        if md.is_dir() {
            total += dir_allocated_bytes(&e.path());
        } else {
            total += md.blocks() * 512;
        }
    }
    total
}
