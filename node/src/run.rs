//! Running one node: lock the data dir, open the engine, start Raft and the servers, initialize
//! a new cluster when this node is the lowest id of `initial_cluster`, and shut down cleanly on
//! SIGTERM/SIGINT.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::watch;

use crate::cluster::{ClusterConfig, ClusterNode, NodeAddr};
use crate::config::{ClusterState, Config};

/// The exclusive lock a node holds on `DATA_DIR/LOCK` while it runs (with its pid inside).
#[derive(Debug)]
pub struct DataDirLock {
    _file: File,
    path: PathBuf,
}

impl DataDirLock {
    /// Takes the lock, or fails at once naming the process that holds it.
    pub fn acquire(data_dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(data_dir)
            .with_context(|| format!("cannot create data dir {}", data_dir.display()))?;
        let path = data_dir.join("LOCK");
        match ftkv_vfs::try_lock_file(&path).with_context(|| format!("cannot lock {}", path.display()))? {
            ftkv_vfs::FileLock::Locked(file) => Ok(Self { _file: file, path }),
            ftkv_vfs::FileLock::HeldBy(holder) => anyhow::bail!(
                "data dir {} is in use by another ftkv-node (pid {holder}); refusing to start",
                data_dir.display()
            ),
        }
    }

    /// Path of the lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The engine options of `config`: `DATA_DIR/engine`, the cache size and the compression.
fn engine_options(config: &Config) -> ftkv_engine::EngineOptions {
    ftkv_engine::EngineOptions {
        dir: config.data_dir.join("engine"),
        cache_size_bytes: config.engine.cache_size.as_u64(),
        compression_level: config.engine.compression.zstd_level(),
    }
}

/// Opens the fractal engine of `config` on `vfs` with default tree parameters and the given
/// cleaner period (`None`: no cleaner thread).
fn open_fractal(
    config: &Config,
    vfs: Arc<dyn ftkv_vfs::Vfs>,
    cleaner_period_ms: Option<u64>,
) -> ftkv_engine::Result<ftkv_engine::FractalEngine> {
    ftkv_engine::FractalEngine::open_with(
        vfs,
        &engine_options(config),
        ftkv_engine::FractalOptions {
            cleaner_period_ms,
            ..ftkv_engine::FractalOptions::default()
        },
    )
}

/// Opens the configured engine under `DATA_DIR/engine`; the fractal engine with the configured
/// cleaner period. With `testing.lose_unsynced_on_kill` the fractal engine runs over
/// `ftkv_vfs::UnsyncedBufferVfs` (the sled engine does its own I/O and is not covered).
pub fn open_engine(config: &Config) -> anyhow::Result<Arc<dyn ftkv_engine::Engine>> {
    open_engine_metered(config).map(|(engine, _)| engine)
}

/// [`open_engine`], measured: the engine wrapped in [`crate::telemetry::engine::MeteredEngine`],
/// the fractal engine's files written through a [`crate::telemetry::vfs::MeteredVfs`], and its
/// cache size probed.
pub fn open_engine_metered(
    config: &Config,
) -> anyhow::Result<(Arc<dyn ftkv_engine::Engine>, crate::telemetry::EngineMeters)> {
    use crate::telemetry::{engine::MeteredEngine, vfs, EngineMeters};
    let opts = engine_options(config);
    let mut meters = EngineMeters::default();
    let opened = if config.engine.kind == ftkv_engine::EngineKind::Fractal {
        let vfs: Arc<dyn ftkv_vfs::Vfs> = if config.testing.lose_unsynced_on_kill {
            let latency = std::time::Duration::from_millis(config.testing.lose_unsynced_sync_latency_ms);
            ftkv_vfs::UnsyncedBufferVfs::over_real(latency)
        } else {
            ftkv_vfs::RealVfs::new()
        };
        let disk = vfs::DiskMeter::new(
            crate::telemetry::ENGINE_DISK_BYTES_WRITTEN_TOTAL,
            crate::telemetry::ENGINE_FSYNC_DURATION_SECONDS,
        );
        meters.disk = Some(disk.clone());
        open_fractal(
            config,
            vfs::MeteredVfs::wrap(vfs, disk),
            config.engine.cleaner_period(),
        )
        .map(|e| {
            let engine = Arc::new(e);
            let probe = engine.clone();
            meters.cache_bytes = Some(Arc::new(move || probe.cached_bytes() as u64));
            let probe = engine.clone();
            meters.compression = Some(Arc::new(move || probe.compression_stats().ratio()));
            engine as Arc<dyn ftkv_engine::Engine>
        })
    } else {
        ftkv_engine::open_engine(config.engine.kind, &opts)
    };
    let opened = opened.map(|engine| MeteredEngine::wrap(engine, meters.logical_bytes.clone()));
    opened
        .with_context(|| {
            format!(
                "cannot open the {} engine in {}",
                config.engine.kind.as_str(),
                opts.dir.display()
            )
        })
        .map(|engine| (engine, meters))
}

/// The cluster layer's view of the config.
pub fn cluster_config(config: &Config) -> ClusterConfig {
    ClusterConfig {
        node_id: config.id,
        addr: NodeAddr {
            client: config.client_addr(),
            peer: config.peer_addr(),
        },
        data_dir: config.data_dir.clone(),
        log_sync: config.log.sync.to_mode(),
        log_segment_size_bytes: config.log.segment_size.as_u64(),
        ack: config.raft.ack,
        ack_all_timeout_ms: config.raft.ack_all_timeout_ms,
        heartbeat_interval_ms: config.raft.heartbeat_interval_ms,
        election_timeout_min_ms: config.raft.election_timeout_min_ms,
        election_timeout_max_ms: config.raft.election_timeout_max_ms,
        snapshot_every_entries: config.raft.snapshot_every_entries,
        max_in_snapshot_log_to_keep: config.raft.max_in_snapshot_log_to_keep,
        batch_max_ops: config.batch.max_ops,
        batch_max_bytes: config.batch.max_bytes.as_u64() as usize,
        batch_max_in_flight: config.batch.max_in_flight,
        peer_max_message_bytes: config.raft.peer_max_message_size.as_u64() as usize,
        unsafe_local_reads: config.testing.unsafe_local_reads,
        unsafe_ack_before_fsync: config.testing.unsafe_ack_before_fsync,
        lose_unsynced_on_kill: config.testing.lose_unsynced_on_kill,
        lose_unsynced_sync_latency_ms: config.testing.lose_unsynced_sync_latency_ms,
        space: config.space.options(),
        peer_tls: None,
        loader_memory_bytes: config.engine.loader_memory_size.as_u64(),
    }
}

/// Raises the descriptor limit and derives each port's connection cap from it and `[server]`
/// (so that every port at its cap leaves `server.file_descriptor_reserve` descriptors free).
fn connection_options(config: &Config) -> anyhow::Result<crate::server::ConnectionOptions> {
    let server = &config.server;
    let ports = if config.listen_status.is_empty() { 2 } else { 3 };
    let max_connections = match crate::server::conn::raise_nofile_limit() {
        Ok(nofile) => {
            let cap = server.connections_per_port(nofile, ports)?;
            tracing::info!(
                nofile,
                reserve = server.file_descriptor_reserve,
                max_connections_per_port = cap,
                "connection limits"
            );
            cap
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read RLIMIT_NOFILE; using server.max_connections_per_port as it is");
            server.max_connections_per_port
        }
    };
    Ok(crate::server::ConnectionOptions {
        limits: crate::server::conn::ConnectionLimits {
            max_connections: usize::try_from(max_connections).unwrap_or(usize::MAX),
            idle_timeout: Duration::from_millis(server.idle_timeout_ms),
            handshake_timeout: Duration::from_millis(server.handshake_timeout_ms),
        },
        keepalive_interval: Duration::from_millis(server.keepalive_interval_ms),
        keepalive_timeout: Duration::from_millis(server.keepalive_timeout_ms),
        slow_request_threshold_ms: config.logging.slow_request_threshold_ms,
    })
}

/// Runs a node until SIGTERM/SIGINT.
pub async fn run(config: Config) -> anyhow::Result<()> {
    config.validate()?;
    let lock = DataDirLock::acquire(&config.data_dir)?;
    tracing::info!(id = config.id, data_dir = %config.data_dir.display(), lock = %lock.path().display(), "starting ftkv-node");
    let metrics = crate::telemetry::install_recorder(config.engine.kind.as_str())?;
    let connections = connection_options(&config)?;
    // Certificates are loaded before any port binds; SIGHUP is handled (never fatal) from here on.
    let tls = crate::tls::NodeTls::load(&config.tls).context("cannot load the TLS files")?;
    tls.watch();

    // Bind every port before starting Raft, so a taken port fails fast.
    let client_listener = crate::server::bind(&config.listen_client, "clients").await?;
    let peer_listener = crate::server::bind(&config.listen_peer, "peers").await?;
    let status_listener = if config.listen_status.is_empty() {
        None
    } else {
        Some(crate::server::bind(&config.listen_status, "status HTTP").await?)
    };

    let (engine, engine_meters) = {
        let cfg = config.clone();
        tokio::task::spawn_blocking(move || open_engine_metered(&cfg)).await??
    };
    let telemetry =
        crate::telemetry::Telemetry::new(&config.data_dir, config.engine.cache_size.as_u64(), engine_meters);
    let mut cluster_cfg = cluster_config(&config);
    cluster_cfg.peer_tls = tls.peer_client.clone();
    let cluster = ClusterNode::start(cluster_cfg, engine)
        .await
        .context("cannot start Raft")?;
    let readiness = crate::server::readiness::Readiness::new(cluster.clone());

    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    tracing::info!(
        client = %crate::server::local(&client_listener),
        peer = %crate::server::local(&peer_listener),
        "listening"
    );
    let handshake_timeout = connections.limits.handshake_timeout;
    let accept_options = |server: &Option<Arc<crate::tls::reload::ServerTls>>, answer| {
        server
            .as_ref()
            .map(|s| tls.accept_options(s, handshake_timeout, answer))
    };
    let peer_task = tokio::spawn(crate::server::serve_peer(
        peer_listener,
        cluster.clone(),
        connections,
        accept_options(&tls.peer, crate::tls::accept::PlaintextAnswer::Grpc),
        stopped(stop_rx.clone()),
    ));
    let client_task = tokio::spawn(crate::server::serve_client(
        client_listener,
        cluster.clone(),
        crate::server::ClientApiSettings {
            limits: config.limits,
            token_ttl_ms: config.auth.token_ttl_ms,
        },
        connections,
        readiness.clone(),
        accept_options(&tls.client, crate::tls::accept::PlaintextAnswer::Grpc),
        stopped(stop_rx.clone()),
    ));
    let status_task = match (
        status_listener,
        accept_options(&tls.status, crate::tls::accept::PlaintextAnswer::Http1),
    ) {
        (None, _) => None,
        (Some(l), None) => {
            let l = crate::server::conn::GuardedListener::new(l, connections.limits, "status")
                .context("cannot serve status HTTP")?;
            Some(tokio::spawn(crate::server::status_http::serve(
                l,
                cluster.clone(),
                metrics,
                telemetry.clone(),
                readiness.clone(),
                stopped(stop_rx.clone()),
            )))
        }
        (Some(l), Some(options)) => {
            let l = crate::tls::accept::TlsListener::new(l, connections.limits, options)
                .context("cannot serve status HTTPS")?;
            Some(tokio::spawn(crate::server::status_http::serve(
                l,
                cluster.clone(),
                metrics,
                telemetry.clone(),
                readiness.clone(),
                stopped(stop_rx.clone()),
            )))
        }
    };

    if config.initial_cluster_state == ClusterState::New {
        let peers = config.initial_peers()?;
        if peers.is_empty() && !cluster.is_initialized().await? {
            anyhow::bail!(
                "initial_cluster is empty: a new cluster needs its voters, e.g. --initial-cluster \
                 1=host1:7380,2=host2:7380,3=host3:7380 (one entry for a single node), or \
                 --initial-cluster-state existing to join a running cluster"
            );
        }
        if peers.keys().next() == Some(&config.id) {
            let c = cluster.clone();
            tokio::spawn(async move {
                loop {
                    match c.initialize(peers.clone(), 60_000).await {
                        Ok(()) => {
                            tracing::info!("cluster initialized");
                            break;
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "initializing the cluster failed; retrying");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                    }
                }
            });
        }
    }

    // Every port serves: tell systemd (Type=notify; nothing without NOTIFY_SOCKET).
    crate::notify::ready(config.id);

    let mut tasks_done = false;
    let raft_stopped = {
        let c = cluster.clone();
        async move {
            // A fatal storage error (failed fsync, corrupt snapshot, checksum mismatch) stops the
            // Raft core. Exit loudly then, instead of lingering as a process that answers health
            // checks but cannot serve: a supervisor restarts it and clients fail over.
            // A panic inside the core (e.g. an openraft assertion) ends its task without a
            // Shutdown state: `core_stopped` also sees the metrics channel close.
            c.core_stopped().await
        }
    };
    tokio::select! {
        _ = shutdown_signal() => tracing::info!("shutdown signal received"),
        _ = raft_stopped => {
            tasks_done = true;
            tracing::error!("the Raft core stopped after a fatal error (see the errors above); exiting");
        }
        r = async {
            // A server that stops on its own is fatal.
            let (r, _, _) = futures::future::select_all([peer_task, client_task]).await;
            r
        } => {
            tasks_done = true;
            match r {
                Ok(Ok(())) => tracing::error!("a server stopped unexpectedly"),
                Ok(Err(e)) => tracing::error!(error = %e, "a server failed"),
                Err(e) => tracing::error!(error = %e, "a server task panicked"),
            }
        }
    }
    readiness.begin_drain();
    crate::notify::stopping();
    if !tasks_done {
        let drain_timeout = Duration::from_millis(config.server.drain_timeout_ms);
        let outcome = cluster.drain(drain_timeout).await;
        tracing::info!(?outcome, "drained");
    }
    let _ = stop_tx.send(true);
    if let Err(e) = cluster.shutdown().await {
        tracing::error!(error = %e, "shutdown of the Raft node failed");
    }
    if let Some(t) = status_task {
        let _ = tokio::time::timeout(Duration::from_secs(2), t).await;
    }
    drop(lock);
    if tasks_done {
        anyhow::bail!("node stopped because its Raft core or a server failed (see the log above)");
    }
    tracing::info!("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

/// `ftkv-node check --data-dir D`: opens the engine read-only-ish and checks every invariant.
/// The fractal tree opens without its cleaner thread, so nothing flushes (and no block is
/// written) while the tree is checked.
pub fn check(config: &Config) -> anyhow::Result<CheckReport> {
    let _lock = DataDirLock::acquire(&config.data_dir)?;
    let engine: Arc<dyn ftkv_engine::Engine> = if config.engine.kind == ftkv_engine::EngineKind::Fractal {
        Arc::new(open_fractal(config, ftkv_vfs::RealVfs::new(), None)?)
    } else {
        open_engine(config)?
    };
    let integrity = engine.check_integrity()?;
    let staged_chunks = crate::cluster::bulk::staged_chunks(engine.as_ref())?;
    Ok(CheckReport {
        integrity,
        staged_chunks,
    })
}

/// What `ftkv-node check` found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// The engine's own check (keys, blocks, height; no unreachable node).
    pub integrity: ftkv_engine::IntegrityReport,
    /// Chunks of bulk loads staged and not yet committed or cancelled (0 unless a load was in
    /// flight when the node stopped: the next leader's first entry cancels it).
    pub staged_chunks: u64,
}
