//! Node configuration: one typed struct, read from a TOML file, then overridden by environment
//! variables (`FTKV_*`), then by command-line flags. Unknown keys are errors; sizes and
//! durations use human units (`"64MiB"`, `"500ms"`). `ftkv-node --print-config` prints the
//! merged result. A commented template lives in `deploy/ftkv.toml`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytesize::ByteSize;
use serde::{Deserialize, Serialize};

use crate::cluster::AckPolicy;
use crate::limits::Limits;

pub mod flags;
pub mod logging;
pub mod server;
pub use flags::ConfigFlags;
pub use logging::{LogFormat, LoggingConfig};
pub mod auth;
pub mod space;
pub use auth::AuthConfig;
pub use server::ServerConfig;
pub use space::SpaceConfig;
pub mod tls;
pub use tls::{TlsConfig, TlsFlags, TlsVersion};

/// Errors while building the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid (syntax, unknown key, bad unit).
    #[error("invalid config file {path}: {message}")]
    Parse {
        /// File.
        path: PathBuf,
        /// The TOML parser's message (names the key and line).
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("invalid config: {0}")]
    Invalid(String),
}

/// The whole node configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// This node's id (>= 1).
    pub id: u64,
    /// Data directory: `engine/`, `log/`, `snapshots/`, `LOCK`.
    pub data_dir: PathBuf,
    /// Address the client gRPC server binds (`ftkv.v1`).
    pub listen_client: String,
    /// Client address other nodes and clients are told (defaults to `listen_client`).
    pub advertise_client: Option<String>,
    /// Address the peer gRPC server binds (`ftkv.raft.v1`).
    pub listen_peer: String,
    /// Peer address other nodes are told (defaults to `listen_peer`).
    pub advertise_peer: Option<String>,
    /// Address of the status HTTP server (`/metrics`, `/livez`, `/readyz`); empty disables it.
    pub listen_status: String,
    /// Initial voters as `ID=PEER_HOST:PORT,...` (used only with `initial_cluster_state = "new"`
    /// on an empty data dir).
    pub initial_cluster: String,
    /// `new`: the lowest id of `initial_cluster` initializes the cluster. `existing`: join an
    /// existing cluster (wait to be added with `ftkvctl member add`).
    pub initial_cluster_state: ClusterState,
    /// Storage engine.
    pub engine: EngineConfig,
    /// Raft log.
    pub log: LogConfig,
    /// Replication.
    pub raft: RaftConfig,
    /// Proposal batcher.
    pub batch: BatchConfig,
    /// Request limits.
    pub limits: Limits,
    /// Connections on every port.
    pub server: ServerConfig,
    /// Data dir quota and disk reserve (NOSPACE alarm).
    pub space: SpaceConfig,
    /// TLS on the client, peer and status ports.
    pub tls: TlsConfig,
    /// Token lifetime (users and roles are replicated state).
    pub auth: AuthConfig,
    /// The node's diagnostic log: format, level, slow-request threshold.
    pub logging: LoggingConfig,
    /// Test-only switches that break guarantees on purpose (for the fault harness canaries).
    pub testing: TestingConfig,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            id: 1,
            data_dir: PathBuf::from("ftkv-data"),
            listen_client: "127.0.0.1:7379".into(),
            advertise_client: None,
            listen_peer: "127.0.0.1:7380".into(),
            advertise_peer: None,
            listen_status: "127.0.0.1:7381".into(),
            initial_cluster: String::new(),
            initial_cluster_state: ClusterState::New,
            engine: EngineConfig::default(),
            log: LogConfig::default(),
            raft: RaftConfig::default(),
            batch: BatchConfig::default(),
            limits: Limits::default(),
            server: ServerConfig::default(),
            space: SpaceConfig::default(),
            tls: TlsConfig::default(),
            auth: AuthConfig::default(),
            logging: LoggingConfig::default(),
            testing: TestingConfig::default(),
        }
    }
}

/// `initial_cluster_state`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ClusterState {
    /// Bootstrap a new cluster from `initial_cluster`.
    New,
    /// Join an existing cluster.
    Existing,
}

/// Largest `engine.cleaner_period_ms` accepted: one hour.
pub const MAX_CLEANER_PERIOD_MS: u64 = 3_600_000;

/// `[engine]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EngineConfig {
    /// `"fractal"` (default) or `"sled"`.
    pub kind: ftkv_engine::EngineKind,
    /// Memory budget of the engine cache (TokuDB `tokudb_cache_size`).
    #[serde(serialize_with = "serialize_size")]
    pub cache_size: ByteSize,
    /// Node compression: `"none"` or `{ zstd = LEVEL }`.
    pub compression: Compression,
    /// Fractal engine: period of the cleaner thread, which flushes message buffers in the
    /// background once writes pause, in milliseconds (TokuDB `tokudb_cleaner_period`, in
    /// seconds there); `0` turns the cleaner off (flushes then only run inside writes). At most
    /// one hour.
    pub cleaner_period_ms: u64,
    /// Memory a committed bulk load (`ftkvctl load`) may use to sort its rows before it
    /// spills sorted runs to `engine/bulk-tmp/` (TokuDB `tokudb_loader_memory_size`); at least
    /// 1MiB. Every replica sorts with its own setting.
    #[serde(serialize_with = "serialize_size")]
    pub loader_memory_size: ByteSize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            kind: ftkv_engine::EngineKind::Fractal,
            cache_size: ByteSize::mib(256),
            compression: Compression::default(),
            cleaner_period_ms: ftkv_engine::DEFAULT_CLEANER_PERIOD_MS,
            loader_memory_size: ByteSize::mib(64),
        }
    }
}

impl EngineConfig {
    /// The cleaner period for [`ftkv_engine::FractalOptions::cleaner_period_ms`]:
    /// `None` when `cleaner_period_ms` is 0.
    pub fn cleaner_period(&self) -> Option<u64> {
        (self.cleaner_period_ms > 0).then_some(self.cleaner_period_ms)
    }
}

/// Node compression setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Compression {
    /// `"none"`.
    None(NoneTag),
    /// `{ zstd = LEVEL }` (1..=22).
    Zstd {
        /// zstd level.
        zstd: i32,
    },
}

/// The literal `"none"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NoneTag {
    /// No compression.
    None,
}

impl Default for Compression {
    fn default() -> Self {
        Compression::Zstd { zstd: 1 }
    }
}

impl Compression {
    /// zstd level, or `None` for no compression.
    pub fn zstd_level(self) -> Option<i32> {
        match self {
            Compression::None(_) => None,
            Compression::Zstd { zstd } => Some(zstd),
        }
    }
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `"always"` (fdatasync before acknowledging; default) or `{ period_ms = N }` (sync every
    /// N ms: an acknowledged write can be lost if a majority of nodes lose power together).
    pub sync: LogSync,
    /// Segment file size.
    #[serde(serialize_with = "serialize_size")]
    pub segment_size: ByteSize,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            sync: LogSync::Always(AlwaysTag::Always),
            segment_size: ByteSize::mib(64),
        }
    }
}

/// `log.sync`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LogSync {
    /// `"always"`.
    Always(AlwaysTag),
    /// `{ period_ms = N }`.
    Periodic {
        /// Sync period.
        period_ms: u64,
    },
}

/// The literal `"always"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlwaysTag {
    /// Sync before every acknowledgement.
    Always,
}

impl LogSync {
    /// As the log's sync mode.
    pub fn to_mode(self) -> ftkv_log::SyncMode {
        match self {
            LogSync::Always(_) => ftkv_log::SyncMode::Always,
            LogSync::Periodic { period_ms } => ftkv_log::SyncMode::Periodic { period_ms },
        }
    }

    /// Parses the flag form: `always` or a duration such as `100ms`.
    pub fn parse_flag(s: &str) -> Result<Self, ConfigError> {
        if s == "always" {
            return Ok(LogSync::Always(AlwaysTag::Always));
        }
        let d = humantime::parse_duration(s).map_err(|e| {
            ConfigError::Invalid(format!(
                "--log-sync {s:?}: expected \"always\" or a duration: {e}"
            ))
        })?;
        Ok(LogSync::Periodic {
            period_ms: d.as_millis().max(1) as u64,
        })
    }
}

/// `[raft]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RaftConfig {
    /// `"quorum"` (leader + a majority durable; default) or `"all"` (every voter).
    pub ack: AckPolicy,
    /// With `ack = "all"`, answer "committed, not on all replicas" after this long.
    pub ack_all_timeout_ms: u64,
    /// Heartbeat interval (also the AppendEntries timeout, which includes the follower fsync).
    pub heartbeat_interval_ms: u64,
    /// Election timeout lower bound.
    pub election_timeout_min_ms: u64,
    /// Election timeout upper bound.
    pub election_timeout_max_ms: u64,
    /// Checkpoint + snapshot after this many applied entries.
    pub snapshot_every_entries: u64,
    /// Log entries kept behind a snapshot for followers that lag a little.
    pub max_in_snapshot_log_to_keep: u64,
    /// Largest gRPC message between peers.
    #[serde(serialize_with = "serialize_size")]
    pub peer_max_message_size: ByteSize,
}

impl Default for RaftConfig {
    fn default() -> Self {
        Self {
            ack: AckPolicy::Quorum,
            ack_all_timeout_ms: 2_000,
            heartbeat_interval_ms: 250,
            election_timeout_min_ms: 1_000,
            election_timeout_max_ms: 1_500,
            snapshot_every_entries: 50_000,
            max_in_snapshot_log_to_keep: 10_000,
            peer_max_message_size: ByteSize::mib(64),
        }
    }
}

/// `[batch]`: the proposal batcher in front of Raft.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Most client ops packed in one Raft entry.
    pub max_ops: usize,
    /// Most payload bytes packed in one Raft entry.
    #[serde(serialize_with = "serialize_size")]
    pub max_bytes: ByteSize,
    /// Most entries proposed and not yet committed at once.
    pub max_in_flight: usize,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_ops: 4_096,
            max_bytes: ByteSize::mib(4),
            max_in_flight: 2,
        }
    }
}

/// `[testing]`: switches that deliberately break guarantees so the fault harness can prove it
/// catches them (canaries). Never set them in production.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TestingConfig {
    /// Serve linearizable reads from the local state machine without a ReadIndex round.
    pub unsafe_local_reads: bool,
    /// Acknowledge log appends before fsync.
    pub unsafe_ack_before_fsync: bool,
    /// Open the log and the engine files through `ftkv_vfs::UnsyncedBufferVfs`: every write since
    /// a file's last fdatasync stays in process memory, so a SIGKILL loses exactly what was not
    /// synced, like a power cut (the fault harness's `lose-unsynced` nemesis). Safe as such (the
    /// node loses nothing it acknowledged) but slower and memory-hungry; tests only.
    pub lose_unsynced_on_kill: bool,
    /// With `lose_unsynced_on_kill`: simulated latency of each fdatasync of a file with unsynced
    /// writes, ms (default 10, a slow disk; test machines' virtual disks sync in about 0.1 ms,
    /// which would leave a kill almost no unsynced window to lose).
    pub lose_unsynced_sync_latency_ms: u64,
}

impl Default for TestingConfig {
    fn default() -> Self {
        Self {
            unsafe_local_reads: false,
            unsafe_ack_before_fsync: false,
            lose_unsynced_on_kill: false,
            lose_unsynced_sync_latency_ms: 10,
        }
    }
}

impl Config {
    /// Reads a TOML file (unknown keys are errors naming the key).
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// The merged config as TOML (what `--print-config` prints).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).unwrap_or_else(|e| format!("# cannot render config: {e}\n"))
    }

    /// Advertised client address.
    pub fn client_addr(&self) -> String {
        self.advertise_client
            .clone()
            .unwrap_or_else(|| self.listen_client.clone())
    }

    /// Advertised peer address.
    pub fn peer_addr(&self) -> String {
        self.advertise_peer
            .clone()
            .unwrap_or_else(|| self.listen_peer.clone())
    }

    /// `initial_cluster` parsed into id -> peer address.
    pub fn initial_peers(&self) -> Result<BTreeMap<u64, String>, ConfigError> {
        parse_initial_cluster(&self.initial_cluster)
    }

    /// Checks ranges and consistency.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.id == 0 {
            return Err(ConfigError::Invalid("id must be >= 1".into()));
        }
        let peers = self.initial_peers()?;
        if self.initial_cluster_state == ClusterState::New
            && !peers.is_empty()
            && !peers.contains_key(&self.id)
        {
            return Err(ConfigError::Invalid(format!(
                "initial_cluster {:?} does not contain this node's id {}",
                self.initial_cluster, self.id
            )));
        }
        if self.raft.election_timeout_min_ms >= self.raft.election_timeout_max_ms {
            return Err(ConfigError::Invalid(
                "raft.election_timeout_min_ms must be < election_timeout_max_ms".into(),
            ));
        }
        if self.raft.heartbeat_interval_ms * 2 > self.raft.election_timeout_min_ms {
            return Err(ConfigError::Invalid(
                "raft.heartbeat_interval_ms must be at most half of election_timeout_min_ms".into(),
            ));
        }
        if let Compression::Zstd { zstd } = self.engine.compression {
            if !(1..=22).contains(&zstd) {
                return Err(ConfigError::Invalid(format!(
                    "engine.compression zstd level {zstd} not in 1..=22"
                )));
            }
        }
        if self.batch.max_ops == 0 || self.batch.max_in_flight == 0 {
            return Err(ConfigError::Invalid(
                "batch.max_ops and batch.max_in_flight must be >= 1".into(),
            ));
        }
        if self.engine.cleaner_period_ms > MAX_CLEANER_PERIOD_MS {
            return Err(ConfigError::Invalid(format!(
                "engine.cleaner_period_ms {} is over one hour ({MAX_CLEANER_PERIOD_MS}); 0 turns the cleaner off",
                self.engine.cleaner_period_ms
            )));
        }
        if self.engine.loader_memory_size.as_u64() < 1024 * 1024 {
            return Err(ConfigError::Invalid(format!(
                "engine.loader_memory_size {} is under 1MiB",
                self.engine.loader_memory_size
            )));
        }
        if self.engine.cache_size.as_u64() < 1024 * 1024 {
            return Err(ConfigError::Invalid(
                "engine.cache_size must be at least 1MiB".into(),
            ));
        }
        let largest_peer_entry_bytes = self
            .batch
            .max_bytes
            .as_u64()
            .max(self.limits.max_batch_bytes.as_u64());
        self.limits
            .validate(self.raft.peer_max_message_size.as_u64(), largest_peer_entry_bytes)
            .map_err(ConfigError::Invalid)?;
        self.server.validate()?;
        self.space.validate()?;
        self.tls.validate()?;
        self.auth.validate()?;
        self.logging.validate()?;
        if self.log.segment_size.as_u64() < 64 * 1024 {
            return Err(ConfigError::Invalid(
                "log.segment_size must be at least 64KiB".into(),
            ));
        }
        Ok(())
    }

    /// Heartbeat interval as a duration.
    pub fn heartbeat(&self) -> Duration {
        Duration::from_millis(self.raft.heartbeat_interval_ms)
    }
}

/// Serializes a size exactly, in the largest binary unit that divides it (`"64MiB"`, `"1000B"`),
/// so that `--print-config` output reads back to the same values (bytesize's own `Display` rounds
/// to decimal units, "67.1 MB").
pub fn serialize_size<S: serde::Serializer>(size: &ByteSize, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&exact_size(size.as_u64()))
}

/// `n` bytes as an exact human string.
pub fn exact_size(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
    ];
    for (unit, name) in UNITS {
        if n >= unit && n.is_multiple_of(unit) {
            return format!("{}{name}", n / unit);
        }
    }
    format!("{n}B")
}

/// Parses `1=host:port,2=host:port`.
pub fn parse_initial_cluster(text: &str) -> Result<BTreeMap<u64, String>, ConfigError> {
    let mut peers = BTreeMap::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (id, addr) = part.split_once('=').ok_or_else(|| {
            ConfigError::Invalid(format!("initial_cluster entry {part:?} is not ID=HOST:PORT"))
        })?;
        let id: u64 = id.trim().parse().map_err(|_| {
            ConfigError::Invalid(format!("initial_cluster entry {part:?}: id is not a number"))
        })?;
        if id == 0 {
            return Err(ConfigError::Invalid("initial_cluster ids must be >= 1".into()));
        }
        let addr = addr.trim();
        if !addr.contains(':') {
            return Err(ConfigError::Invalid(format!(
                "initial_cluster entry {part:?}: address needs a port"
            )));
        }
        if peers.insert(id, addr.to_string()).is_some() {
            return Err(ConfigError::Invalid(format!(
                "initial_cluster names id {id} twice"
            )));
        }
    }
    Ok(peers)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn template_parses_and_unknown_keys_fail() {
        let cfg = Config::from_toml(
            r#"
            id = 2
            data_dir = "/tmp/x"
            initial_cluster = "1=a:1,2=b:2"
            [engine]
            kind = "sled"
            cache_size = "64MiB"
            compression = "none"
            [log]
            sync = { period_ms = 1000 }
            [raft]
            ack = "all"
            "#,
        )
        .unwrap();
        assert_eq!(cfg.id, 2);
        assert_eq!(cfg.engine.cache_size, ByteSize::mib(64));
        assert_eq!(cfg.engine.compression.zstd_level(), None);
        assert_eq!(cfg.log.sync, LogSync::Periodic { period_ms: 1000 });
        assert_eq!(cfg.raft.ack, AckPolicy::All);
        cfg.validate().unwrap();
        let err = Config::from_toml("id = 1\nbogus_key = 3\n").unwrap_err();
        assert!(err.contains("bogus_key"), "{err}");
        let err = Config::from_toml("[engine]\ncache_sise = \"1MiB\"\n").unwrap_err();
        assert!(err.contains("cache_sise"), "{err}");
        // Round trip of the printed config, including sizes that are not whole units.
        let mut cfg = cfg;
        cfg.limits.max_value_bytes = ByteSize::b(1_000_001);
        cfg.engine.cache_size = ByteSize::kib(1536);
        let printed = cfg.to_toml();
        assert!(
            printed.contains("\"1536KiB\"") && printed.contains("\"1000001B\""),
            "{printed}"
        );
        assert_eq!(Config::from_toml(&printed).unwrap(), cfg);
        assert_eq!(exact_size(64 << 20), "64MiB");
    }

    #[test]
    fn the_deploy_template_parses_and_holds_the_defaults() {
        // deploy/ftkv.toml documents every key with its default; its "example" values are the
        // only ones that differ.
        let cfg = Config::from_toml(include_str!("../../deploy/ftkv.toml")).unwrap();
        let defaults = Config::default();
        assert_eq!(cfg.listen_client, defaults.listen_client);
        assert_eq!(cfg.listen_peer, defaults.listen_peer);
        assert_eq!(cfg.listen_status, defaults.listen_status);
        assert_eq!(cfg.initial_cluster_state, defaults.initial_cluster_state);
        assert_eq!(cfg.engine, defaults.engine);
        assert_eq!(cfg.log, defaults.log);
        assert_eq!(cfg.raft, defaults.raft);
        assert_eq!(cfg.batch, defaults.batch);
        assert_eq!(cfg.limits, defaults.limits);
        assert_eq!(cfg.server, defaults.server);
        assert_eq!(cfg.space, defaults.space);
        assert_eq!(cfg.auth, defaults.auth);
        assert_eq!(cfg.testing, defaults.testing);
    }

    #[test]
    fn nonsensical_limits_are_refused_naming_the_option() {
        let refused = |toml: &str, option: &str| {
            let err = Config::from_toml(toml)
                .unwrap()
                .validate()
                .unwrap_err()
                .to_string();
            assert!(err.contains(option), "{toml:?}: {err}");
        };
        refused("[limits]\nmax_value_bytes = \"0B\"\n", "limits.max_value_bytes");
        refused("[limits]\nmax_key_bytes = \"0B\"\n", "limits.max_key_bytes");
        refused("[limits]\nmax_batch_ops = 0\n", "limits.max_batch_ops");
        refused(
            "[limits]\nmax_value_bytes = \"8MiB\"\nmax_batch_bytes = \"16MiB\"\n",
            "limits.max_value_bytes",
        );
        refused(
            "[limits]\nmax_batch_bytes = \"512KiB\"\n",
            "limits.max_batch_bytes",
        );
        refused(
            "[limits]\nmax_batch_bytes = \"128MiB\"\n",
            "limits.max_batch_bytes",
        );
        refused(
            "[raft]\npeer_max_message_size = \"1MiB\"\n",
            "raft.peer_max_message_size",
        );
        refused("[batch]\nmax_bytes = \"80MiB\"\n", "raft.peer_max_message_size");
        refused(
            "[server]\nhandshake_timeout_ms = 0\n",
            "server.handshake_timeout_ms",
        );
        // at the edges: a largest pair that just fits a response
        let cfg = Config::from_toml("[limits]\nmax_value_bytes = \"2MiB\"\n").unwrap();
        cfg.validate().unwrap();
    }

    #[test]
    fn loader_memory_defaults_to_64mib_and_must_be_at_least_1mib() {
        let cfg = Config::from_toml("id = 1\n").unwrap();
        assert_eq!(cfg.engine.loader_memory_size, ByteSize::mib(64));
        let cfg = Config::from_toml("id = 1\n[engine]\nloader_memory_size = \"8MiB\"\n").unwrap();
        assert_eq!(cfg.engine.loader_memory_size, ByteSize::mib(8));
        let mut cfg = Config::from_toml("id = 1\n[engine]\nloader_memory_size = \"512KiB\"\n").unwrap();
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("engine.loader_memory_size"), "{err}");
        cfg.engine.loader_memory_size = ByteSize::mib(1);
        cfg.validate().unwrap();
    }

    #[test]
    fn cleaner_period_defaults_to_one_second_and_zero_turns_it_off() {
        let cfg = Config::from_toml("id = 1\n").unwrap();
        assert_eq!(cfg.engine.cleaner_period_ms, 1000);
        assert_eq!(cfg.engine.cleaner_period(), Some(1000));
        let cfg = Config::from_toml("id = 1\n[engine]\ncleaner_period_ms = 0\n").unwrap();
        assert_eq!(cfg.engine.cleaner_period(), None);
        let cfg = Config::from_toml("id = 1\n[engine]\ncleaner_period_ms = 250\n").unwrap();
        assert_eq!(cfg.engine.cleaner_period(), Some(250));
        let mut cfg = cfg;
        cfg.engine.cleaner_period_ms = MAX_CLEANER_PERIOD_MS + 1;
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("engine.cleaner_period_ms"), "{err}");
        let err = Config::from_toml("id = 1\n[engine]\ncleaner_period_ms = -5\n").unwrap_err();
        assert!(err.contains("cleaner_period_ms"), "{err}");
    }

    #[test]
    fn testing_section_lose_unsynced_keys() {
        let cfg = Config::default();
        assert!(!cfg.testing.lose_unsynced_on_kill);
        assert_eq!(cfg.testing.lose_unsynced_sync_latency_ms, 10);
        let cfg = Config::from_toml(
            "[testing]\nlose_unsynced_on_kill = true\nlose_unsynced_sync_latency_ms = 50\n",
        )
        .unwrap();
        assert!(cfg.testing.lose_unsynced_on_kill);
        assert_eq!(cfg.testing.lose_unsynced_sync_latency_ms, 50);
        assert_eq!(Config::from_toml(&cfg.to_toml()).unwrap(), cfg);
    }

    #[test]
    fn initial_cluster_parsing() {
        let peers = parse_initial_cluster("1=127.0.0.1:7380, 2=h:1").unwrap();
        assert_eq!(peers.len(), 2);
        assert!(parse_initial_cluster("x=a:1").is_err());
        assert!(parse_initial_cluster("1=a").is_err());
        assert!(parse_initial_cluster("1=a:1,1=b:2").is_err());
        assert_eq!(
            LogSync::parse_flag("100ms").unwrap(),
            LogSync::Periodic { period_ms: 100 }
        );
        assert!(LogSync::parse_flag("sometimes").is_err());
    }
}
