//! The node's metrics and log lines ([`logging`]): the Prometheus recorder (histogram buckets, descriptions,
//! `ftkv_build_info`), the gauges sampled at each scrape of `/metrics`, and the meters that
//! measure the log and the engine from outside ([`vfs`], [`engine`]).
//!
//! Names follow etcd's where one exists, in base units (seconds, bytes): `ftkv_server_*`
//! (leader, proposals), `ftkv_disk_*` (WAL fsync, backend commit), `ftkv_mvcc_db_*` (sizes),
//! `ftkv_network_peer_round_trip_time_seconds`, gRPC `grpc_server_*` (go-grpc-prometheus, from
//! `server::grpc_metrics`). The engine's own are `ftkv_engine_*`. README.md lists them.

pub mod engine;
pub mod logging;
pub mod vfs;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::cluster::ClusterNode;

/// Buckets of every `*_seconds` histogram: 100 us to 10 s (etcd's WAL fsync buckets start at
/// 1 ms; a fast disk syncs below that).
pub const SECONDS_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024,
    2.048, 4.096, 10.0,
];

/// Metric: WAL fdatasync duration (etcd `etcd_disk_wal_fsync_duration_seconds`).
pub const WAL_FSYNC_DURATION_SECONDS: &str = "ftkv_disk_wal_fsync_duration_seconds";
/// Metric: bytes written to the WAL (etcd `etcd_disk_wal_write_bytes_total`).
pub const WAL_WRITE_BYTES_TOTAL: &str = "ftkv_disk_wal_write_bytes_total";
/// Metric: engine fdatasync duration.
pub const ENGINE_FSYNC_DURATION_SECONDS: &str = "ftkv_engine_fsync_duration_seconds";
/// Metric: bytes the engine wrote to its files.
pub const ENGINE_DISK_BYTES_WRITTEN_TOTAL: &str = "ftkv_engine_disk_bytes_written_total";
/// Metric: leader changes this node has seen (etcd `etcd_server_leader_changes_seen_total`).
pub const LEADER_CHANGES_SEEN_TOTAL: &str = "ftkv_server_leader_changes_seen_total";
/// Metric: proposals in flight (etcd `etcd_server_proposals_pending`).
pub const PROPOSALS_PENDING: &str = "ftkv_server_proposals_pending";
/// Metric: proposals that failed (etcd `etcd_server_proposals_failed_total`).
pub const PROPOSALS_FAILED_TOTAL: &str = "ftkv_server_proposals_failed_total";
/// Metric: heartbeat round trip to each peer, label `To` (etcd
/// `etcd_network_peer_round_trip_time_seconds`).
pub const PEER_ROUND_TRIP_TIME_SECONDS: &str = "ftkv_network_peer_round_trip_time_seconds";

/// Errors installing the metrics recorder.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    /// The Prometheus recorder could not be built or installed.
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(#[from] metrics_exporter_prometheus::BuildError),
}

/// Installs the process-wide Prometheus recorder (histograms with [`SECONDS_BUCKETS`] for every
/// `*_seconds` metric, summaries for the others), describes the metrics and sets
/// `ftkv_build_info`. Call once, before anything records.
pub fn install_recorder(engine_kind: &str) -> Result<PrometheusHandle, TelemetryError> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)?
        .install_recorder()?;
    describe();
    metrics::gauge!(
        "ftkv_build_info",
        "version" => env!("CARGO_PKG_VERSION"),
        "engine" => engine_kind.to_string(),
        "os" => std::env::consts::OS,
        "arch" => std::env::consts::ARCH,
    )
    .set(1.0);
    // Exported from the start (at 0), so that rules and dashboards see them before the first
    // failure or proposal.
    metrics::counter!(PROPOSALS_FAILED_TOTAL).absolute(0);
    metrics::counter!(LEADER_CHANGES_SEEN_TOTAL).absolute(0);
    metrics::gauge!(PROPOSALS_PENDING).set(0.0);
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "ftkv_build_info",
        "1, labelled with the version and build of this node"
    );
    describe_gauge!(
        "ftkv_server_has_leader",
        "1 when a leader is known to this node, else 0"
    );
    describe_gauge!("ftkv_server_is_leader", "1 when this node is the leader, else 0");
    describe_gauge!("ftkv_server_is_learner", "1 when this node is a learner, else 0");
    describe_counter!(LEADER_CHANGES_SEEN_TOTAL, "leader changes this node has seen");
    describe_gauge!(
        "ftkv_server_proposals_committed_total",
        "Raft log index known to be committed (etcd's gauge of committed proposals)"
    );
    describe_gauge!(
        "ftkv_server_proposals_applied_total",
        "Raft log index applied to the engine"
    );
    describe_gauge!(
        PROPOSALS_PENDING,
        "Raft entries proposed by this node and not yet decided"
    );
    describe_counter!(
        PROPOSALS_FAILED_TOTAL,
        "Raft entries proposed by this node that failed"
    );
    describe_histogram!(
        WAL_FSYNC_DURATION_SECONDS,
        Unit::Seconds,
        "fdatasync of the Raft log"
    );
    describe_counter!(
        WAL_WRITE_BYTES_TOTAL,
        Unit::Bytes,
        "bytes written to the Raft log"
    );
    describe_histogram!(
        engine::BACKEND_COMMIT_DURATION_SECONDS,
        Unit::Seconds,
        "engine checkpoint (etcd's backend commit)"
    );
    describe_gauge!(
        "ftkv_mvcc_db_total_size_in_bytes",
        Unit::Bytes,
        "engine files on disk"
    );
    describe_gauge!(
        "ftkv_disk_wal_total_size_in_bytes",
        Unit::Bytes,
        "Raft log segments on disk"
    );
    describe_gauge!(
        "ftkv_disk_snapshot_total_size_in_bytes",
        Unit::Bytes,
        "snapshot files on disk"
    );
    describe_gauge!(
        "ftkv_disk_data_dir_available_bytes",
        Unit::Bytes,
        "space left for an unprivileged user on the data dir's file system"
    );
    describe_gauge!(
        "ftkv_disk_data_dir_capacity_bytes",
        Unit::Bytes,
        "size of the data dir's file system"
    );
    describe_histogram!(
        PEER_ROUND_TRIP_TIME_SECONDS,
        Unit::Seconds,
        "heartbeat round trip to a peer (label To)"
    );
    describe_counter!("grpc_server_started_total", "client gRPC calls started");
    describe_counter!(
        "grpc_server_handled_total",
        "client gRPC calls finished, by status code"
    );
    describe_histogram!(
        "grpc_server_handling_seconds",
        Unit::Seconds,
        "client gRPC call duration"
    );
    describe_gauge!(
        "ftkv_engine_cache_size_bytes",
        Unit::Bytes,
        "engine nodes held in the cache"
    );
    describe_gauge!(
        "ftkv_engine_cache_capacity_bytes",
        Unit::Bytes,
        "engine cache budget (engine.cache_size)"
    );
    describe_counter!(
        engine::ENGINE_LOGICAL_BYTES_WRITTEN_TOTAL,
        Unit::Bytes,
        "key and value bytes handed to the engine"
    );
    describe_counter!(
        ENGINE_DISK_BYTES_WRITTEN_TOTAL,
        Unit::Bytes,
        "bytes the engine wrote to its files"
    );
    describe_gauge!(
        "ftkv_engine_compression_ratio",
        "uncompressed over stored bytes of the engine's node blocks written since start"
    );
    describe_gauge!(
        "ftkv_engine_write_amplification",
        "engine bytes written to disk per key and value byte written, since start"
    );
    describe_histogram!(
        ENGINE_FSYNC_DURATION_SECONDS,
        Unit::Seconds,
        "fdatasync of engine files"
    );
}

/// Reads a figure of the engine that the `Engine` trait does not carry (e.g. the fractal
/// tree's cached bytes).
pub type EngineProbe = Arc<dyn Fn() -> u64 + Send + Sync>;

/// What the node measures besides the recorder: sampled into gauges at each scrape.
#[derive(Clone)]
pub struct Telemetry {
    inner: Arc<TelemetryInner>,
}

struct TelemetryInner {
    data_dir: PathBuf,
    cache_capacity_bytes: u64,
    engine: EngineMeters,
}

/// The meters around the engine (see [`engine::MeteredEngine`] and [`vfs::MeteredVfs`]).
#[derive(Clone, Default)]
pub struct EngineMeters {
    /// Key and value bytes written, added to by [`engine::MeteredEngine`].
    pub logical_bytes: Arc<AtomicU64>,
    /// The engine's file layer meter (the fractal engine; sled does its own I/O).
    pub disk: Option<Arc<vfs::DiskMeter>>,
    /// Bytes of engine nodes cached (the fractal engine).
    pub cache_bytes: Option<EngineProbe>,
    /// The compression ratio of the node blocks written since start (the fractal engine;
    /// `None` before the first block).
    pub compression: Option<Arc<dyn Fn() -> Option<f64> + Send + Sync>>,
}

impl Telemetry {
    /// Gauges for a node whose data dir is `data_dir`, whose engine cache budget is
    /// `cache_capacity_bytes` and whose engine is measured by `engine`.
    pub fn new(data_dir: &Path, cache_capacity_bytes: u64, engine: EngineMeters) -> Self {
        Telemetry {
            inner: Arc::new(TelemetryInner {
                data_dir: data_dir.to_path_buf(),
                cache_capacity_bytes,
                engine,
            }),
        }
    }

    /// Sets every sampled gauge from `cluster` and the data dir. Cheap: a status snapshot, a
    /// few directory listings and one `statvfs`.
    pub fn refresh(&self, cluster: &ClusterNode) {
        let st = cluster.status();
        let flag = |b: bool| if b { 1.0 } else { 0.0 };
        metrics::gauge!("ftkv_server_has_leader").set(flag(st.leader_id.is_some()));
        metrics::gauge!("ftkv_server_is_leader").set(flag(st.leader_id == Some(st.node_id)));
        metrics::gauge!("ftkv_server_is_learner").set(flag(st.role == "learner"));
        metrics::gauge!("ftkv_server_proposals_committed_total").set(st.commit_index as f64);
        metrics::gauge!("ftkv_server_proposals_applied_total").set(st.applied_index as f64);
        metrics::gauge!("ftkv_raft_term").set(st.term as f64);
        metrics::gauge!("ftkv_raft_last_log_index").set(st.last_log_index as f64);
        metrics::gauge!("ftkv_batch_ops_per_entry").set(st.ops_per_entry);

        let inner = &self.inner;
        if let Ok(bytes) = cluster.engine().size_on_disk_bytes() {
            metrics::gauge!("ftkv_mvcc_db_total_size_in_bytes").set(bytes as f64);
        }
        metrics::gauge!("ftkv_disk_wal_total_size_in_bytes")
            .set(dir_bytes(&inner.data_dir.join("log")) as f64);
        metrics::gauge!("ftkv_disk_snapshot_total_size_in_bytes")
            .set(dir_bytes(&inner.data_dir.join("snapshots")) as f64);
        if let Ok(fs) = rustix::fs::statvfs(&inner.data_dir) {
            let frsize = fs.f_frsize;
            metrics::gauge!("ftkv_disk_data_dir_available_bytes")
                .set((fs.f_bavail.saturating_mul(frsize)) as f64);
            metrics::gauge!("ftkv_disk_data_dir_capacity_bytes")
                .set((fs.f_blocks.saturating_mul(frsize)) as f64);
        }

        metrics::gauge!("ftkv_engine_cache_capacity_bytes").set(inner.cache_capacity_bytes as f64);
        if let Some(probe) = &inner.engine.cache_bytes {
            metrics::gauge!("ftkv_engine_cache_size_bytes").set(probe() as f64);
        }
        if let Some(ratio) = inner.engine.compression.as_ref().and_then(|probe| probe()) {
            metrics::gauge!("ftkv_engine_compression_ratio").set(ratio);
        }
        if let Some(disk) = &inner.engine.disk {
            let logical = inner.engine.logical_bytes.load(Ordering::Relaxed);
            if logical > 0 {
                metrics::gauge!("ftkv_engine_write_amplification")
                    .set(disk.bytes_written() as f64 / logical as f64);
            }
        }
    }
}

/// Bytes of the regular files in `dir` and its subdirectories (0 when it cannot be read).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
