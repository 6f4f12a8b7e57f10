//! `ftkv-node`: run a node, a local playground cluster, or an offline integrity check.
//!
//! Configuration precedence: TOML file (`--config`) < environment (`FTKV_*`) < flags.

use std::path::PathBuf;

// The node allocates many small buffers per request (HTTP/2 frames, protobuf messages, tree
// messages); mimalloc spends markedly less CPU on them than glibc malloc and fragments less
// (TokuDB needed jemalloc for the same reason).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use ftkv_node::config::{ClusterState, Config, LogSync};

#[derive(Parser, Debug)]
#[command(
    name = "ftkv-node",
    version,
    about = "ftkv node: a replicated, write-optimized key-value store"
)]
#[command(args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a node (the default when no subcommand is given).
    Run(RunArgs),
    /// Start a local cluster of node processes on loopback and keep it up until Ctrl-C.
    Playground(ftkv_node::playground::PlaygroundArgs),
    /// Check the engine's on-disk invariants offline (the node must be stopped).
    Check(RunArgs),
    /// Check the merged configuration (file < environment < flags) without starting the node.
    CheckConfig(RunArgs),
    /// Backup files (`ftkvctl snapshot save` writes them): status, restore.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// Generate a CA and certificates for N nodes and one client into DIR (ca.pem, ca-key.pem,
    /// node-<i>.pem, node-<i>-key.pem, client.pem, client-key.pem), as `playground --tls` does;
    /// for test and small deployments (`deploy/docker-compose.tls.yml`).
    Certs(CertsArgs),
}

#[derive(Args, Debug)]
struct CertsArgs {
    /// Directory for the files (created; existing complete files are kept).
    #[arg(long)]
    dir: PathBuf,
    /// Node certificates to issue (ids 1..=N).
    #[arg(long, default_value_t = 3)]
    nodes: u64,
    /// Extra DNS names of node certificates, `{id}` replaced by the node id and `{ordinal}` by
    /// id - 1, a StatefulSet pod's ordinal (repeatable), e.g. `--host 'ftkv-{id}'`,
    /// `--host 'ftkv-{ordinal}.ftkv-peer'`.
    #[arg(long = "host")]
    hosts: Vec<String>,
}

#[derive(Subcommand, Debug)]
enum SnapshotCommand {
    /// Verify a backup file end to end and print its hash, applied index, keys and size.
    Status {
        /// The backup file.
        file: PathBuf,
    },
    /// Build the data dir of one member of a new cluster from a backup (run it for every
    /// member, with the same --initial-cluster; then start each node with it). Refuses a
    /// non-empty data dir and a damaged file; the restored cluster gets a new cluster id.
    Restore {
        /// The backup file.
        file: PathBuf,
        /// Distinguishes clusters restored from the same file into the same --initial-cluster.
        #[arg(long, default_value = "")]
        initial_cluster_token: String,
        /// The node the data dir is for (--data-dir, --id, --initial-cluster, engine options).
        #[command(flatten)]
        node: Box<RunArgs>,
    },
}

/// Flags of `run` (each also settable by the environment variable shown in `--help`).
#[derive(Args, Debug, Clone, Default)]
struct RunArgs {
    /// TOML config file.
    #[arg(long, env = "FTKV_CONFIG")]
    config: Option<PathBuf>,
    /// Print the merged configuration as TOML and exit.
    #[arg(long)]
    print_config: bool,
    /// Node id (>= 1).
    #[arg(long, env = "FTKV_ID")]
    id: Option<u64>,
    /// Take the node id from the hostname's ordinal, as in a StatefulSet: ftkv-0 is node 1
    /// ($HOSTNAME, else the kernel's host name).
    #[arg(long, env = "FTKV_ID_FROM_HOSTNAME", conflicts_with = "id")]
    id_from_hostname: bool,
    /// Data directory.
    #[arg(long, env = "FTKV_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// Client gRPC listen address (default 127.0.0.1:7379).
    #[arg(long, env = "FTKV_LISTEN_CLIENT")]
    listen_client: Option<String>,
    /// Client address advertised to peers and clients.
    #[arg(long, env = "FTKV_ADVERTISE_CLIENT")]
    advertise_client: Option<String>,
    /// Peer gRPC listen address (default 127.0.0.1:7380).
    #[arg(long, env = "FTKV_LISTEN_PEER")]
    listen_peer: Option<String>,
    /// Peer address advertised to other nodes.
    #[arg(long, env = "FTKV_ADVERTISE_PEER")]
    advertise_peer: Option<String>,
    /// Status HTTP listen address (default 127.0.0.1:7381; empty disables).
    #[arg(long, env = "FTKV_LISTEN_STATUS")]
    listen_status: Option<String>,
    /// Initial voters: ID=PEER_HOST:PORT,...
    #[arg(long, env = "FTKV_INITIAL_CLUSTER")]
    initial_cluster: Option<String>,
    /// new | existing
    #[arg(long, env = "FTKV_INITIAL_CLUSTER_STATE", value_enum)]
    initial_cluster_state: Option<ClusterState>,
    /// Storage engine: fractal | sled
    #[arg(long, env = "FTKV_ENGINE")]
    engine: Option<String>,
    /// Engine cache size (e.g. 256MiB).
    #[arg(long, env = "FTKV_CACHE_SIZE")]
    cache_size: Option<String>,
    /// Log sync: "always" or a period such as 100ms (weaker durability).
    #[arg(long, env = "FTKV_LOG_SYNC")]
    log_sync: Option<String>,
    /// Acknowledge after: quorum | all
    #[arg(long, env = "FTKV_ACK")]
    ack: Option<String>,
    /// Checkpoint and snapshot after this many applied entries.
    #[arg(long, env = "FTKV_SNAPSHOT_EVERY_ENTRIES")]
    snapshot_every_entries: Option<u64>,
    /// Log entries kept behind a snapshot.
    #[arg(long, env = "FTKV_MAX_IN_SNAPSHOT_LOG_TO_KEEP")]
    max_in_snapshot_log_to_keep: Option<u64>,
    /// Data dir quota (`space.quota_bytes`, e.g. `8GiB`; `0B`: none): the NOSPACE alarm beyond.
    #[arg(long, env = "FTKV_QUOTA_BYTES")]
    quota_bytes: Option<String>,
    /// TEST ONLY: serve linearizable reads locally without ReadIndex (unsafe canary).
    #[arg(long, hide = true, env = "FTKV_UNSAFE_LOCAL_READS")]
    unsafe_local_reads: bool,
    /// TEST ONLY: acknowledge log appends before fsync (unsafe canary).
    #[arg(long, hide = true, env = "FTKV_UNSAFE_ACK_BEFORE_FSYNC")]
    unsafe_ack_before_fsync: bool,
    /// TEST ONLY: keep every unsynced write in process memory so that SIGKILL loses it, like a
    /// power cut (config `testing.lose_unsynced_on_kill`).
    #[arg(long, hide = true, env = "FTKV_UNSAFE_LOSE_UNSYNCED_ON_KILL")]
    unsafe_lose_unsynced_on_kill: bool,
    /// TEST ONLY: simulated fdatasync latency in the lose-unsynced mode, ms (default 10).
    #[arg(long, hide = true, env = "FTKV_UNSAFE_LOSE_UNSYNCED_SYNC_LATENCY_MS")]
    unsafe_lose_unsynced_sync_latency_ms: Option<u64>,
    /// Every other configuration key (`--raft-heartbeat-interval-ms`, `FTKV_LIMITS_MAX_KEY_BYTES`, ...).
    #[command(flatten)]
    config_flags: ftkv_node::config::ConfigFlags,
    /// TLS: --cert-file, --peer-cert-file, ... (etcd's names).
    #[command(flatten)]
    tls_flags: ftkv_node::config::TlsFlags,
}

impl RunArgs {
    fn config(&self) -> anyhow::Result<Config> {
        let mut c = match &self.config {
            Some(path) => Config::from_file(path)?,
            None => Config::default(),
        };
        if let Some(v) = self.id {
            c.id = v;
        }
        if self.id_from_hostname {
            c.id = ftkv_node::check_config::id_from_hostname(&ftkv_node::check_config::hostname())?;
        }
        if let Some(v) = &self.data_dir {
            c.data_dir = v.clone();
        }
        if let Some(v) = &self.listen_client {
            c.listen_client = v.clone();
        }
        if let Some(v) = &self.advertise_client {
            c.advertise_client = Some(v.clone());
        }
        if let Some(v) = &self.listen_peer {
            c.listen_peer = v.clone();
        }
        if let Some(v) = &self.advertise_peer {
            c.advertise_peer = Some(v.clone());
        }
        if let Some(v) = &self.listen_status {
            c.listen_status = v.clone();
        }
        if let Some(v) = &self.initial_cluster {
            c.initial_cluster = v.clone();
        }
        if let Some(v) = self.initial_cluster_state {
            c.initial_cluster_state = v;
        }
        if let Some(v) = &self.engine {
            c.engine.kind = serde_json::from_value(serde_json::Value::String(v.clone()))
                .map_err(|_| anyhow::anyhow!("--engine {v:?}: expected fractal or sled"))?;
        }
        if let Some(v) = &self.quota_bytes {
            c.space.quota_bytes = v
                .parse()
                .map_err(|e| anyhow::anyhow!("--quota-bytes {v:?}: {e}"))?;
        }
        if let Some(v) = &self.cache_size {
            c.engine.cache_size = v
                .parse()
                .map_err(|e| anyhow::anyhow!("--cache-size {v:?}: {e}"))?;
        }
        if let Some(v) = &self.log_sync {
            c.log.sync = LogSync::parse_flag(v)?;
        }
        if let Some(v) = &self.ack {
            c.raft.ack = serde_json::from_value(serde_json::Value::String(v.clone()))
                .map_err(|_| anyhow::anyhow!("--ack {v:?}: expected quorum or all"))?;
        }
        if let Some(v) = self.snapshot_every_entries {
            c.raft.snapshot_every_entries = v;
        }
        if let Some(v) = self.max_in_snapshot_log_to_keep {
            c.raft.max_in_snapshot_log_to_keep = v;
        }
        c.testing.unsafe_local_reads |= self.unsafe_local_reads;
        c.testing.unsafe_ack_before_fsync |= self.unsafe_ack_before_fsync;
        c.testing.lose_unsynced_on_kill |= self.unsafe_lose_unsynced_on_kill;
        if let Some(v) = self.unsafe_lose_unsynced_sync_latency_ms {
            c.testing.lose_unsynced_sync_latency_ms = v;
        }
        self.config_flags.apply(&mut c)?;
        self.tls_flags.apply(&mut c);
        c.validate()?;
        Ok(c)
    }
}

fn main() -> std::process::ExitCode {
    // Freed tree nodes and buffers must go back to the OS (see the function's doc).
    if let Err(e) = ftkv_vfs::disable_transparent_huge_pages() {
        eprintln!("ftkv-node: warning: could not turn transparent huge pages off: {e}");
    }
    // ring is the build's only rustls provider; making it the process default as well means
    // nothing can ever pick another one at run time.
    let _ = tokio_rustls::rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ftkv-node: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Some(Command::Playground(args)) => {
            ftkv_node::telemetry::logging::init(None, &ftkv_node::config::LoggingConfig::default());
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(ftkv_node::playground::run(args))
        }
        Some(Command::Check(args)) => {
            let config = args.config()?;
            let report = ftkv_node::run::check(&config)?;
            println!(
                "ok: {} keys, {} blocks, height {}, {} staged bulk-load chunks in {}",
                report.integrity.keys,
                report.integrity.blocks,
                report.integrity.height,
                report.staged_chunks,
                config.data_dir.display()
            );
            Ok(())
        }
        Some(Command::Certs(args)) => {
            anyhow::ensure!(args.nodes >= 1, "--nodes must be at least 1");
            let tls =
                ftkv_node::playground::tls::PlaygroundTls::prepare_in(&args.dir, args.nodes, &args.hosts)?;
            println!(
                "CA {}; node certificates node-1..{} and client.pem in {}",
                tls.ca.display(),
                args.nodes,
                tls.dir.display()
            );
            Ok(())
        }
        Some(Command::CheckConfig(args)) => {
            let report = ftkv_node::check_config::check(&args.config()?)?;
            for line in report.lines {
                println!("{line}");
            }
            println!("ok");
            Ok(())
        }
        Some(Command::Snapshot(SnapshotCommand::Status { file })) => {
            for line in ftkv_node::backup::status(&file)?.lines() {
                println!("{line}");
            }
            Ok(())
        }
        Some(Command::Snapshot(SnapshotCommand::Restore {
            file,
            initial_cluster_token,
            node,
        })) => {
            let config = node.config()?;
            let report = ftkv_node::backup::restore(&ftkv_node::backup::RestoreOptions {
                file,
                config: config.clone(),
                initial_cluster_token,
            })?;
            println!(
                "restored {} keys into {} for node {}: new cluster id {} (the backup's cluster was {})",
                report.keys,
                config.data_dir.display(),
                config.id,
                ftkv_node::cluster::cluster_id::format_cluster_id(report.cluster_id),
                ftkv_node::cluster::cluster_id::format_cluster_id(report.old_cluster_id),
            );
            Ok(())
        }
        Some(Command::Run(args)) => run_node(args),
        None => run_node(cli.run),
    }
}

fn run_node(args: RunArgs) -> anyhow::Result<()> {
    let config = args.config()?;
    if args.print_config {
        print!("{}", config.to_toml());
        return Ok(());
    }
    ftkv_node::telemetry::logging::init(Some(config.id), &config.logging);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start tokio")?;
    rt.block_on(ftkv_node::run::run(config))
}
