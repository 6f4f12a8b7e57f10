//! RocksDB as an engine of `ftkv-bench engine`, behind the bench's cargo feature `rocksdb` so
//! the default build and CI neither compile nor link it.
//!
//! The build links Debian's RocksDB 7.8.3 (`apt-get install librocksdb-dev`; the workspace's
//! `.cargo/config.toml` points `ROCKSDB_LIB_DIR` at it) through the `rocksdb` crate 0.20.1, the
//! newest whose C API calls that library has: the crate's latest (0.25, RocksDB 11.8) builds
//! RocksDB from source, about 360 C++ files (62 had compiled after 35 minutes on the shared
//! 2-core machine of the first measurement), and calls 59 C functions 7.8.3 lacks. Debian's
//! library is built with assertions on: BENCHMARKS.md's RocksDB figures say what that means.
//!
//! Setup, RocksDB's defaults except where the comparison needs the same terms as the others:
//! - one column family (`default`), the same 16-byte keys and 100-byte values as every engine;
//! - a block cache (LRU) of the workload's cache budget, the size the fractal tree gets as its
//!   cache, with index and filter blocks charged to it (so the budget is the engine's whole
//!   read cache, as the fractal tree's is), L0's pinned; bloom filters of 10 bits per key;
//! - zstd for every level at the fractal tree's `--zstd-level` (1 by default);
//! - the write-ahead log off (`WriteOptions::disable_wal`), as no engine here syncs per batch;
//!   [`BenchKv::checkpoint`] flushes the memtables to SST files and waits (the one final flush
//!   inside the timed part of a load), which makes every write durable;
//! - memtables, levels, compaction and background jobs (2) at RocksDB's defaults.
//!
//! `delete_range` is RocksDB's native `DeleteRange` (a range tombstone, one write). RocksDB has
//! no broadcast message, so [`BenchKv::upsert_all`] does what an application on RocksDB must do:
//! read every key and write its new value (read-modify-write per key, batches of 10,000), and
//! the bench reports that cost as it is (as fjall's in [`super::kv`]).
//!
//! Built without the feature, [`open`] and [`ensure_available`] fail with [`NOT_BUILT`].

use std::path::Path;

use super::kv::BenchKv;

/// The error of `--engines rocksdb` in a build without the `rocksdb` feature.
pub const NOT_BUILT: &str = "ftkv-bench was built without the `rocksdb` feature: cargo build --release -p ftkv-bench --features rocksdb";

/// Ok when this build has the RocksDB engine, else the [`NOT_BUILT`] error.
pub fn ensure_available() -> anyhow::Result<()> {
    anyhow::ensure!(cfg!(feature = "rocksdb"), NOT_BUILT);
    Ok(())
}

/// Opens (creating) a RocksDB database in `dir` (see the module docs for the setup).
#[cfg(feature = "rocksdb")]
pub fn open(dir: &Path, cache_size_bytes: u64, zstd_level: i32) -> anyhow::Result<Box<dyn BenchKv>> {
    Ok(Box::new(RocksKv::open(dir, cache_size_bytes, zstd_level)?))
}

/// Fails with [`NOT_BUILT`]: this build has no RocksDB.
#[cfg(not(feature = "rocksdb"))]
pub fn open(_dir: &Path, _cache_size_bytes: u64, _zstd_level: i32) -> anyhow::Result<Box<dyn BenchKv>> {
    anyhow::bail!(NOT_BUILT)
}

#[cfg(feature = "rocksdb")]
pub use imp::RocksKv;

#[cfg(feature = "rocksdb")]
mod imp {
    use std::path::{Path, PathBuf};
    use std::time::{Duration, Instant};

    use anyhow::Context;
    use ftkv_engine::UpsertOp;
    use rocksdb::{
        BlockBasedOptions, Cache, DBCompressionType, FlushOptions, Options, WriteBatch, WriteOptions, DB,
    };

    use super::super::kv::{dir_allocated_bytes, BenchKv};

    /// Keys rewritten per batch by the read-modify-write broadcast.
    const RANGE_BATCH: usize = 10_000;

    /// Longest [`BenchKv::settle`] waits for compactions to end.
    const SETTLE_TIMEOUT: Duration = Duration::from_secs(600);

    /// Bloom filter bits per key (RocksDB's usual setting).
    const BLOOM_BITS_PER_KEY: f64 = 10.0;

    /// RocksDB with the WAL off; see the module docs.
    pub struct RocksKv {
        db: DB,
        dir: PathBuf,
        write_options: WriteOptions,
        // Kept alive as long as the database (the table factory refers to it).
        _cache: Cache,
    }

    impl RocksKv {
        /// Opens (creating) a database in `dir` with a block cache of `cache_size_bytes` and
        /// zstd at `zstd_level` on every level.
        pub fn open(dir: &Path, cache_size_bytes: u64, zstd_level: i32) -> anyhow::Result<Self> {
            let cache_bytes = usize::try_from(cache_size_bytes).context("cache size")?;
            let cache = Cache::new_lru_cache(cache_bytes).context("rocksdb block cache")?;
            let mut table = BlockBasedOptions::default();
            table.set_block_cache(&cache);
            table.set_cache_index_and_filter_blocks(true);
            table.set_pin_l0_filter_and_index_blocks_in_cache(true);
            table.set_bloom_filter(BLOOM_BITS_PER_KEY, false);
            let mut opts = Options::default();
            opts.create_if_missing(true);
            opts.set_block_based_table_factory(&table);
            opts.set_compression_type(DBCompressionType::Zstd);
            // window_bits -14 and strategy 0 are RocksDB's defaults; no dictionary.
            opts.set_compression_options(-14, zstd_level, 0, 0);
            opts.set_max_background_jobs(2);
            let db = DB::open(&opts, dir).with_context(|| format!("open rocksdb in {}", dir.display()))?;
            let mut write_options = WriteOptions::default();
            write_options.disable_wal(true);
            Ok(RocksKv {
                db,
                dir: dir.to_path_buf(),
                write_options,
                _cache: cache,
            })
        }

        fn write(&self, batch: WriteBatch) -> anyhow::Result<()> {
            Ok(self.db.write_opt(batch, &self.write_options)?)
        }

        fn flush(&self) -> anyhow::Result<()> {
            let mut fo = FlushOptions::default();
            fo.set_wait(true);
            Ok(self.db.flush_opt(&fo)?)
        }

        fn int_property(&self, name: &str) -> u64 {
            self.db.property_int_value(name).ok().flatten().unwrap_or(0)
        }

        fn property(&self, name: &str) -> String {
            match self.db.property_value(name) {
                Ok(Some(v)) => v,
                _ => "?".into(),
            }
        }

        /// The lines of `rocksdb.stats` that say where the work went: the level table's sum
        /// row (write amplification), cumulative compaction and write stalls.
        fn stats_summary(&self) -> String {
            let stats = self.property("rocksdb.stats");
            let mut out: Vec<String> = Vec::new();
            if let Some(header) = stats.lines().find(|l| l.trim_start().starts_with("Level ")) {
                out.push(squeeze(header));
            }
            for line in stats.lines() {
                let t = line.trim_start();
                if t.starts_with("Sum ")
                    || t.starts_with("Cumulative compaction")
                    || t.starts_with("Cumulative stall")
                    || t.starts_with("Stalls(count)")
                {
                    out.push(squeeze(line));
                }
            }
            out.dedup();
            out.join(" | ")
        }
    }

    /// Collapses runs of spaces so a table row fits one log line.
    fn squeeze(s: &str) -> String {
        s.split_whitespace().collect::<Vec<_>>().join(" ")
    }

    impl BenchKv for RocksKv {
        fn put_batch(&self, pairs: Vec<(Vec<u8>, Vec<u8>)>) -> anyhow::Result<()> {
            let mut batch = WriteBatch::default();
            for (k, v) in &pairs {
                batch.put(k, v);
            }
            self.write(batch)
        }

        fn get(&self, key: &[u8]) -> anyhow::Result<Option<Vec<u8>>> {
            Ok(self.db.get_pinned(key)?.map(|v| v.to_vec()))
        }

        fn scan_count(&self, start: &[u8], limit: usize) -> anyhow::Result<usize> {
            let mut it = self.db.raw_iterator();
            it.seek(start);
            let mut n = 0;
            while n < limit {
                let Some(v) = it.value() else { break };
                std::hint::black_box(v);
                n += 1;
                it.next();
            }
            it.status()?;
            Ok(n)
        }

        fn delete_range(&self, start: &[u8], end: &[u8]) -> anyhow::Result<()> {
            let mut batch = WriteBatch::default();
            batch.delete_range(start, end);
            self.write(batch)
        }

        fn upsert_all(&self, op: &UpsertOp) -> anyhow::Result<()> {
            // The iterator reads a consistent snapshot, so the rewritten keys are not seen again.
            let mut it = self.db.raw_iterator();
            it.seek_to_first();
            let mut batch = WriteBatch::default();
            while let Some((k, v)) = it.item() {
                batch.put(k, ftkv_engine::ops::apply_broadcast(v, op));
                if batch.len() >= RANGE_BATCH {
                    self.write(std::mem::take(&mut batch))?;
                }
                it.next();
            }
            it.status()?;
            self.write(batch)
        }

        fn checkpoint(&self) -> anyhow::Result<()> {
            // No WAL: the flush of the memtables to SST files is what makes the writes durable.
            self.flush()
        }

        fn settle(&self) -> anyhow::Result<()> {
            // Flush, then let running and queued compactions end, so the size measured next is
            // the settled one and not input plus output of a compaction in flight (7.8 has no
            // `WaitForCompact`: poll its properties).
            self.flush()?;
            let deadline = Instant::now() + SETTLE_TIMEOUT;
            while self.int_property("rocksdb.compaction-pending") > 0
                || self.int_property("rocksdb.num-running-compactions") > 0
            {
                anyhow::ensure!(
                    Instant::now() < deadline,
                    "rocksdb compactions still running after {SETTLE_TIMEOUT:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            Ok(())
        }

        fn engine_size_bytes(&self) -> anyhow::Result<u64> {
            Ok(dir_allocated_bytes(&self.dir))
        }

        fn engine_notes(&self) -> Option<String> {
            Some(format!(
                "block cache {} MiB (pinned {} MiB), memtables {} MiB, table readers {} MiB, SST {} MiB, pending compaction {} MiB, running compactions {}, files per level {}; {}",
                self.int_property("rocksdb.block-cache-usage") >> 20,
                self.int_property("rocksdb.block-cache-pinned-usage") >> 20,
                self.int_property("rocksdb.cur-size-all-mem-tables") >> 20,
                self.int_property("rocksdb.estimate-table-readers-mem") >> 20,
                self.int_property("rocksdb.total-sst-files-size") >> 20,
                self.int_property("rocksdb.estimate-pending-compaction-bytes") >> 20,
                self.int_property("rocksdb.num-running-compactions"),
                (0..7)
                    .map(|l| self.property(&format!("rocksdb.num-files-at-level{l}")))
                    .collect::<Vec<_>>()
                    .join("/"),
                self.stats_summary()
            ))
        }
    }
}

#[cfg(all(test, feature = "rocksdb"))]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;

    use ftkv_engine::UpsertOp;
    use rand::{Rng, SeedableRng};

    use super::*;

    fn model_scan(m: &BTreeMap<Vec<u8>, Vec<u8>>, start: &[u8], limit: usize) -> usize {
        m.range(start.to_vec()..).take(limit).count()
    }

    /// Random puts (overwrites included), gets, scans and range deletes against a BTreeMap,
    /// with flushes in between (so reads cross memtables, SST files and range tombstones), a
    /// broadcast, and a reopen at the end: every read equals the model's.
    #[test]
    fn rocksdb_adapter_matches_a_btreemap() {
        let tmp = tempfile::tempdir().unwrap();
        let kv = open(tmp.path(), 8 << 20, 1).unwrap();
        let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(19);
        // Two-byte keys over a small space, so overwrites and deletes hit existing keys.
        let key = |rng: &mut rand::rngs::StdRng| vec![rng.gen_range(0u8..64), rng.gen::<u8>()];
        let (mut deletes, mut hits) = (0u64, 0u64);
        for step in 0..400 {
            match rng.gen_range(0..10) {
                0..=4 => {
                    let mut batch = Vec::new();
                    for _ in 0..rng.gen_range(1..50) {
                        let k = key(&mut rng);
                        let v: Vec<u8> = (0..rng.gen_range(0..40)).map(|_| rng.gen()).collect();
                        model.insert(k.clone(), v.clone());
                        batch.push((k, v));
                    }
                    kv.put_batch(batch).unwrap();
                }
                5..=6 => {
                    for _ in 0..20 {
                        let k = key(&mut rng);
                        let got = kv.get(&k).unwrap();
                        hits += u64::from(got.is_some());
                        assert_eq!(got.as_ref(), model.get(&k), "get {k:?} at step {step}");
                    }
                }
                7 => {
                    let (start, limit) = (key(&mut rng), rng.gen_range(0..100));
                    assert_eq!(
                        kv.scan_count(&start, limit).unwrap(),
                        model_scan(&model, &start, limit),
                        "scan {start:?} {limit} at step {step}"
                    );
                }
                8 => {
                    let (a, b) = (key(&mut rng), key(&mut rng));
                    let (start, end) = if a <= b { (a, b) } else { (b, a) };
                    kv.delete_range(&start, &end).unwrap();
                    let before = model.len();
                    model.retain(|k, _| k < &start || k >= &end);
                    deletes += (before - model.len()) as u64;
                }
                _ => kv.checkpoint().unwrap(),
            }
        }
        assert!(deletes > 0 && hits > 0, "deletes {deletes}, hits {hits}");
        kv.upsert_all(&UpsertOp::Append(b"+c".to_vec())).unwrap();
        for v in model.values_mut() {
            v.extend_from_slice(b"+c");
        }
        assert_eq!(kv.scan_count(&[], usize::MAX).unwrap(), model.len());
        kv.checkpoint().unwrap();
        kv.settle().unwrap();
        assert!(kv.engine_size_bytes().unwrap() > 0);
        assert!(kv.engine_notes().unwrap().contains("block cache"));
        drop(kv);
        // Everything (range tombstones and rewritten values included) survives a reopen.
        let kv = open(tmp.path(), 8 << 20, 1).unwrap();
        for (k, v) in &model {
            assert_eq!(kv.get(k).unwrap().as_ref(), Some(v), "after reopen {k:?}");
        }
        assert_eq!(kv.scan_count(&[], usize::MAX).unwrap(), model.len());
        assert_eq!(kv.get(&[0xff, 0xff, 0xff]).unwrap(), None);
    }
}
