//! An [`Engine`] wrapper that measures the engine from the outside, through its public trait
//! only: the logical bytes written (keys and values of every op, the denominator of the write
//! amplification) and the duration of every checkpoint (etcd's backend commit,
//! `ftkv_disk_backend_commit_duration_seconds`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use ftkv_engine::{
    BulkLoadOptions, BulkLoadReport, Engine, EngineKind, IntegrityReport, KeyValue, Result, UpsertOp, WriteOp,
};

/// Metric: engine checkpoint duration (etcd `etcd_disk_backend_commit_duration_seconds`).
pub const BACKEND_COMMIT_DURATION_SECONDS: &str = "ftkv_disk_backend_commit_duration_seconds";
/// Metric: key and value bytes handed to the engine.
pub const ENGINE_LOGICAL_BYTES_WRITTEN_TOTAL: &str = "ftkv_engine_logical_bytes_written_total";

/// `inner` with its writes counted and its checkpoints timed.
pub struct MeteredEngine {
    inner: Arc<dyn Engine>,
    logical_bytes: Arc<AtomicU64>,
    logical_total: metrics::Counter,
    commit_duration: metrics::Histogram,
}

impl MeteredEngine {
    /// Wraps `inner`; `logical_bytes` accumulates the key and value bytes of every op written.
    pub fn wrap(inner: Arc<dyn Engine>, logical_bytes: Arc<AtomicU64>) -> Arc<dyn Engine> {
        Arc::new(MeteredEngine {
            inner,
            logical_bytes,
            logical_total: metrics::counter!(ENGINE_LOGICAL_BYTES_WRITTEN_TOTAL),
            commit_duration: metrics::histogram!(BACKEND_COMMIT_DURATION_SECONDS),
        })
    }

    fn count(&self, ops: &[WriteOp]) {
        let bytes: u64 = ops.iter().map(op_bytes).sum();
        self.logical_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.logical_total.increment(bytes);
    }
}

fn upsert_bytes(op: &UpsertOp) -> u64 {
    match op {
        UpsertOp::SetIfAbsent(v) | UpsertOp::Append(v) | UpsertOp::Max(v) => v.len() as u64,
        UpsertOp::Add(_) => 8,
    }
}

/// Bytes the user asked to store with `op` (what the write amplification divides by).
fn op_bytes(op: &WriteOp) -> u64 {
    match op {
        WriteOp::Put { key, value } => (key.len() + value.len()) as u64,
        WriteOp::Delete { key } => key.len() as u64,
        WriteOp::Upsert { key, op } => key.len() as u64 + upsert_bytes(op),
        WriteOp::DeleteRange { start, end } => (start.len() + end.as_ref().map_or(0, Vec::len)) as u64,
        WriteOp::UpsertRange { start, end, op } => {
            (start.len() + end.as_ref().map_or(0, Vec::len)) as u64 + upsert_bytes(op)
        }
    }
}

impl Engine for MeteredEngine {
    fn kind(&self) -> EngineKind {
        self.inner.kind()
    }

    fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.inner.get(key)
    }

    fn scan(&self, start: &[u8], end: Option<&[u8]>, limit: usize) -> Result<Vec<KeyValue>> {
        self.inner.scan(start, end, limit)
    }

    fn write(&self, ops: &[WriteOp], meta: Option<&[u8]>) -> Result<()> {
        self.count(ops);
        self.inner.write(ops, meta)
    }

    fn write_owned(&self, ops: Vec<WriteOp>, meta: Option<&[u8]>) -> Result<()> {
        self.count(&ops);
        self.inner.write_owned(ops, meta)
    }

    fn meta(&self) -> Result<Option<Vec<u8>>> {
        self.inner.meta()
    }

    fn checkpoint(&self) -> Result<()> {
        let started = std::time::Instant::now();
        let result = self.inner.checkpoint();
        self.commit_duration.record(started.elapsed());
        result
    }

    fn replace_all(&self, pairs: &mut dyn Iterator<Item = Result<KeyValue>>, meta: &[u8]) -> Result<()> {
        self.inner.replace_all(pairs, meta)
    }

    fn bulk_load(
        &self,
        rows: &mut dyn Iterator<Item = Result<KeyValue>>,
        opts: &BulkLoadOptions,
        extra_ops: &[WriteOp],
        meta: Option<&[u8]>,
    ) -> Result<BulkLoadReport> {
        // Rows are counted as they pass (the bytes handed to the engine, as for `write`).
        let mut bytes = 0u64;
        let mut counted = rows.inspect(|r| {
            if let Ok((k, v)) = r {
                bytes += (k.len() + v.len()) as u64;
            }
        });
        let result = self.inner.bulk_load(&mut counted, opts, extra_ops, meta);
        self.count(extra_ops);
        self.logical_bytes.fetch_add(bytes, Ordering::Relaxed);
        self.logical_total.increment(bytes);
        result
    }

    fn check_integrity(&self) -> Result<IntegrityReport> {
        self.inner.check_integrity()
    }

    fn size_on_disk_bytes(&self) -> Result<u64> {
        self.inner.size_on_disk_bytes()
    }

    fn space_error(&self) -> Option<String> {
        self.inner.space_error()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_load_is_forwarded_to_the_fractal_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = ftkv_engine::EngineOptions {
            dir: dir.path().join("engine"),
            cache_size_bytes: 1 << 20,
            compression_level: None,
        };
        let fractal = ftkv_engine::open_engine(EngineKind::Fractal, &opts).expect("fractal engine");
        let bytes = Arc::new(AtomicU64::new(0));
        let engine = MeteredEngine::wrap(fractal, bytes.clone());
        let mut rows = (0..100u64).map(|i| Ok((i.to_be_bytes().to_vec(), b"v".to_vec())));
        let report = engine
            .bulk_load(&mut rows, &BulkLoadOptions::default(), &[], Some(b"m"))
            .expect("bulk load");
        // The default implementation (puts through `write`) builds no leaves: the tree's does.
        assert!(report.leaves_built > 0, "{report:?}");
        assert_eq!(report.rows_written, 100);
        assert_eq!(bytes.load(Ordering::Relaxed), 100 * 9);
        assert_eq!(engine.get(&7u64.to_be_bytes()).expect("get"), Some(b"v".to_vec()));
    }

    #[test]
    fn counts_logical_bytes_and_forwards() {
        let opts = ftkv_engine::EngineOptions {
            dir: std::path::PathBuf::from("unused"),
            cache_size_bytes: 1 << 20,
            compression_level: None,
        };
        let model = ftkv_engine::open_engine(EngineKind::Model, &opts).expect("model engine");
        let bytes = Arc::new(AtomicU64::new(0));
        let engine = MeteredEngine::wrap(model, bytes.clone());
        engine
            .write(
                &[WriteOp::Put {
                    key: b"k1".to_vec(),
                    value: b"value".to_vec(),
                }],
                None,
            )
            .expect("write");
        engine
            .write_owned(
                vec![WriteOp::Upsert {
                    key: b"n".to_vec(),
                    op: UpsertOp::Add(1),
                }],
                Some(b"meta"),
            )
            .expect("write_owned");
        assert_eq!(bytes.load(Ordering::Relaxed), 7 + 9);
        assert_eq!(engine.get(b"k1").expect("get"), Some(b"value".to_vec()));
        assert_eq!(engine.meta().expect("meta"), Some(b"meta".to_vec()));
        engine.checkpoint().expect("checkpoint");
    }
}
