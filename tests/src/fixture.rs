//! Cluster fixture: a real ftkv cluster of `ftkv-node` processes on loopback, for tests and
//! the Jepsen-style harness.
//!
//! [`Cluster::start`] picks free ports, gives every node its own directory in one temporary
//! folder, spawns `ftkv-node run` per node (stdout and stderr appended to `node-N/node.log`),
//! and waits until a leader exists by polling `ftkv.v1.Cluster/Status` on every node. The
//! fixture then offers the faults a Jepsen `db` offers (SIGKILL, SIGTERM, SIGSTOP/SIGCONT,
//! restart, wipe, add a node) and waits (leader, catch-up, convergence).
//!
//! Guarantees: no node outlives its [`Cluster`] (Drop SIGKILLs every child) nor the test process
//! (children carry `PR_SET_PDEATHSIG = SIGKILL`); when a test panics, Drop prints the tail of
//! every node log; with `FTKV_KEEP_TEST_DIR=1` the folder is kept and its path printed.
//!
//! Every method takes `&self` (node state sits behind a mutex), so a nemesis task and checkers
//! can share one `Arc<Cluster>`. Binaries come from [`Binaries::try_locate`]: run
//! `cargo build --workspace --bins` first.
//!
//! Source: Jepsen's `db` protocol (setup, teardown, kill, start, pause, resume, primaries) and
//! etcd's `tests/framework/e2e` cluster of real processes.

mod process;
mod workload;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use ftkv_proto::v1::cluster_client::ClusterClient;
use ftkv_proto::v1::{StatusRequest, StatusResponse};

pub use process::{free_ports, send_signal, spawn_tied, Binaries};
pub use workload::{AckedWrite, WriteLoad, WriteOutcome};

/// Serializes cluster tests inside one test binary: hold the guard for the whole test.
///
/// Cargo runs test binaries one after another but the tests of one binary in parallel threads;
/// several 3-node clusters at once on a 2-core machine would make the functional time bounds
/// (failover under 5 s) measure the machine instead of ftkv. A test that panicked while holding
/// the guard does not poison it for the others.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    SERIAL.lock().await
}

/// Everything that can go wrong while driving a cluster.
///
/// `Debug` prints the same message as `Display`, so a test's `.unwrap()` shows it readably
/// (for example the hint to build the binaries).
#[derive(thiserror::Error)]
pub enum FixtureError {
    /// A binary is missing: build them first.
    #[error(
        "{path} not found: run `cargo build --workspace --bins` first (or set FTKV_BIN_DIR to the \
         folder holding ftkv-node and ftkvctl)"
    )]
    MissingBinary {
        /// The path looked at.
        path: PathBuf,
    },
    /// A file or process operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What the fixture was doing.
        context: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// No free port could be found.
    #[error("cannot find free TCP ports on {host}")]
    Ports {
        /// The host the ports were looked for on.
        host: String,
    },
    /// No node with this id.
    #[error("no node {id} in this cluster")]
    UnknownNode {
        /// The id asked for.
        id: u64,
    },
    /// The node is running but the operation needs it stopped (restart, wipe).
    #[error("node {id} is running")]
    NodeRunning {
        /// The node.
        id: u64,
    },
    /// The node is not running but the operation needs it running.
    #[error("node {id} is not running")]
    NodeNotRunning {
        /// The node.
        id: u64,
    },
    /// The node's process exited when it should not have.
    #[error("node {id} exited unexpectedly ({status}); log tail:\n{log_tail}")]
    NodeExited {
        /// The node.
        id: u64,
        /// Its exit status.
        status: String,
        /// The last lines of its log.
        log_tail: String,
    },
    /// A `Status` call failed (connection refused, timeout, error status).
    #[error("status of node {id}: {message}")]
    Status {
        /// The node.
        id: u64,
        /// What failed.
        message: String,
    },
    /// A wait did not reach its goal in time.
    #[error("timed out after {waited_ms} ms waiting for {what}; last seen: {last_seen}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the fixture waited, in milliseconds.
        waited_ms: u128,
        /// The last observation (statuses or errors), for the failure message.
        last_seen: String,
    },
    /// Building an `ftkv_client::Client` failed.
    #[error("client: {0}")]
    Client(#[from] ftkv_client::Error),
    /// The cluster did not come up; every node's log tail is attached (the folder is gone
    /// unless `FTKV_KEEP_TEST_DIR` is set).
    #[error("cluster start failed: {source}\n{log_tails}")]
    StartFailed {
        /// Why.
        source: Box<FixtureError>,
        /// The last lines of every node's log.
        log_tails: String,
    },
    /// A node log mentions a panic.
    #[error("node {id} log mentions a panic:\n{lines}")]
    Panicked {
        /// The node.
        id: u64,
        /// The matching lines.
        lines: String,
    },
}

impl std::fmt::Debug for FixtureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

/// How to start a cluster. Construct with `ClusterOptions { nodes: 5, ..Default::default() }`.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Number of nodes (ids 1..=nodes). Default 3.
    pub nodes: usize,
    /// `--engine` for every node (`"fractal"` or `"sled"`); `None` keeps the node's default.
    pub engine: Option<String>,
    /// Extra flags appended to every node's command line (e.g. `--snapshot-every-entries 100`).
    pub extra_args: Vec<String>,
    /// Extra environment for every node; `{id}` in a value is replaced by the node's id (per-node
    /// files, e.g. a libfaketime clock file). `RUST_LOG` defaults to the test's own value, else
    /// `info`; `NO_COLOR=1` is always set (plain log files).
    pub env: Vec<(String, String)>,
    /// Host every node binds and advertises. Default `127.0.0.1`.
    pub host: String,
    /// Default bound for every wait of the fixture (start, leader, catch-up, stop). Default 60 s,
    /// generous on purpose: a loaded 2-core machine runs debug builds of several clusters.
    pub wait_timeout: Duration,
    /// Bound for one `ftkvctl` run through [`Cluster::ctl`]. Default 60 s.
    pub ctl_timeout: Duration,
    /// TLS of the fixture's own calls (status polling, [`Cluster::client_builder`]) when the
    /// nodes' client ports speak TLS (the nodes' TLS flags go in `extra_args`). Default none.
    pub client_tls: Option<FixtureTls>,
}

/// PEM material the fixture connects to TLS client ports with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FixtureTls {
    /// CA of the nodes' certificates.
    pub ca_pem: String,
    /// Client certificate and key, if the nodes require one.
    pub identity: Option<(String, String)>,
}

impl FixtureTls {
    /// The client library's settings.
    pub fn client_options(&self) -> ftkv_client::TlsOptions {
        let options = ftkv_client::TlsOptions::with_ca_pem(self.ca_pem.clone());
        match &self.identity {
            Some((cert, key)) => options.identity_pem(cert.clone(), key.clone()),
            None => options,
        }
    }

    fn tonic_config(&self) -> tonic::transport::ClientTlsConfig {
        let config = tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(&self.ca_pem));
        match &self.identity {
            Some((cert, key)) => config.identity(tonic::transport::Identity::from_pem(cert, key)),
            None => config,
        }
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            nodes: 3,
            engine: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            host: "127.0.0.1".into(),
            wait_timeout: Duration::from_secs(60),
            ctl_timeout: Duration::from_secs(60),
            client_tls: None,
        }
    }
}

/// Where one node listens and keeps its files.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    /// Node id (1-based).
    pub id: u64,
    /// Client gRPC address `host:port` (`ftkv.v1`), listened on and advertised.
    pub client_addr: String,
    /// Peer gRPC address `host:port` (`ftkv.raft.v1`).
    pub peer_addr: String,
    /// Status HTTP address `host:port` (`/metrics`, `/livez`, `/readyz`).
    pub status_addr: String,
    /// The node's folder: holds `data/` and `node.log`.
    pub dir: PathBuf,
    /// `--data-dir`.
    pub data_dir: PathBuf,
    /// stdout and stderr of every run of this node, appended, each run after a header line.
    pub log_path: PathBuf,
}

/// Output of one `ftkvctl` run.
#[derive(Debug, Clone)]
pub struct CtlOutput {
    /// Exit status.
    pub status: ExitStatus,
    /// Everything written to stdout (lossy UTF-8).
    pub stdout: String,
    /// Everything written to stderr (lossy UTF-8).
    pub stderr: String,
    /// Wall time of the run.
    pub elapsed: Duration,
}

impl CtlOutput {
    /// True when the exit code was 0.
    pub fn success(&self) -> bool {
        self.status.success()
    }
}

/// One node's process state.
struct Slot {
    info: NodeInfo,
    /// `--initial-cluster-state` of this node's first start.
    initial_state: &'static str,
    child: Option<Child>,
    paused: bool,
    starts: u32,
    last_exit: Option<ExitStatus>,
}

/// A running ftkv cluster of real processes. See the module docs.
pub struct Cluster {
    dir: Option<tempfile::TempDir>,
    binaries: Binaries,
    options: ClusterOptions,
    /// `1=host:peer,2=...` of the founding members.
    initial_cluster: String,
    slots: Mutex<BTreeMap<u64, Slot>>,
    started_at: Instant,
}

impl Cluster {
    /// Starts `options.nodes` nodes and waits (up to `options.wait_timeout`) until one of them
    /// reports itself leader.
    ///
    /// # Errors
    /// [`FixtureError::MissingBinary`] when `ftkv-node` or `ftkvctl` is not built (see
    /// [`Binaries::try_locate`]), port or file trouble, a node exiting during start-up (with its
    /// log tail), or no leader in time (with every node's last status).
    pub async fn start(options: ClusterOptions) -> Result<Cluster, FixtureError> {
        let binaries = Binaries::try_locate()?;
        let dir = tempfile::Builder::new()
            .prefix("ftkv-cluster-")
            .tempdir()
            .map_err(|source| FixtureError::Io {
                context: "creating the cluster folder".into(),
                source,
            })?;
        let count = options.nodes.max(1);
        let ports = free_ports(&options.host, count * 3)?;
        let mut slots = BTreeMap::new();
        for index in 0..count {
            let id = index as u64 + 1;
            let info = node_info(dir.path(), &options.host, id, &ports[index * 3..index * 3 + 3]);
            slots.insert(
                id,
                Slot {
                    info,
                    initial_state: "new",
                    child: None,
                    paused: false,
                    starts: 0,
                    last_exit: None,
                },
            );
        }
        let initial_cluster = slots
            .values()
            .map(|slot| format!("{}={}", slot.info.id, slot.info.peer_addr))
            .collect::<Vec<_>>()
            .join(",");
        let cluster = Cluster {
            dir: Some(dir),
            binaries,
            options,
            initial_cluster,
            slots: Mutex::new(slots),
            started_at: Instant::now(),
        };
        let started = async {
            for id in cluster.ids() {
                cluster.spawn(id)?;
            }
            cluster.wait_for_leader().await
        };
        match started.await {
            Ok(_) => Ok(cluster),
            Err(error) => Err(FixtureError::StartFailed {
                source: Box::new(error),
                log_tails: cluster.log_tails(40),
            }),
        }
    }

    /// The options this cluster was started with.
    pub fn options(&self) -> &ClusterOptions {
        &self.options
    }

    /// The binaries in use.
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// The cluster's folder (one `node-N/` per node).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().map(|dir| dir.path()).unwrap_or(Path::new("."))
    }

    /// Ids of every node, running or not, ascending.
    pub fn ids(&self) -> Vec<u64> {
        self.lock().keys().copied().collect()
    }

    /// Where node `id` listens and keeps its files.
    pub fn node(&self, id: u64) -> Result<NodeInfo, FixtureError> {
        self.with_slot(id, |slot| Ok(slot.info.clone()))
    }

    /// Client endpoints `host:port` of every node, by ascending id.
    pub fn endpoints(&self) -> Vec<String> {
        self.lock()
            .values()
            .map(|slot| slot.info.client_addr.clone())
            .collect()
    }

    /// Client endpoint `host:port` of node `id`.
    pub fn endpoint(&self, id: u64) -> Result<String, FixtureError> {
        self.with_slot(id, |slot| Ok(slot.info.client_addr.clone()))
    }

    /// A client builder with every node's endpoint preset (set timeouts or test hooks on it).
    pub fn client_builder(&self) -> ftkv_client::ClientBuilder {
        let builder = ftkv_client::Client::builder().endpoints(self.endpoints());
        match &self.options.client_tls {
            Some(tls) => builder.tls(tls.client_options()),
            None => builder,
        }
    }

    /// A client of the whole cluster with default settings.
    pub async fn client(&self) -> Result<ftkv_client::Client, FixtureError> {
        Ok(self.client_builder().build().await?)
    }

    /// A client that knows only node `id`'s endpoint (it may still learn the leader's from a
    /// `NOT_LEADER` redirect for writes).
    pub async fn client_for(&self, id: u64) -> Result<ftkv_client::Client, FixtureError> {
        let builder = ftkv_client::Client::builder().endpoints([self.endpoint(id)?]);
        let builder = match &self.options.client_tls {
            Some(tls) => builder.tls(tls.client_options()),
            None => builder,
        };
        Ok(builder.build().await?)
    }

    /// A raw gRPC `ftkv.v1.Kv` client to exactly node `id` (no redirects, no retries): for
    /// reads that must be served by that node (serializable reads on a follower).
    pub async fn kv_raw(
        &self,
        id: u64,
    ) -> Result<ftkv_proto::v1::kv_client::KvClient<tonic::transport::Channel>, FixtureError> {
        let addr = self.endpoint(id)?;
        let failed = |message: String| FixtureError::Status { id, message };
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|error| failed(error.to_string()))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .map_err(|error| failed(format!("connect {addr}: {error}")))?;
        Ok(ftkv_proto::v1::kv_client::KvClient::new(channel)
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024))
    }

    /// Every pair of `[start, end)` (empty `end` = unbounded) as node `id` itself serves it,
    /// following continuations (pages of 1000). `serializable` reads node `id`'s local state;
    /// otherwise each page is a linearizable read that node `id` serves (or refuses).
    pub async fn scan_node(
        &self,
        id: u64,
        start: &[u8],
        end: &[u8],
        serializable: bool,
    ) -> Result<BTreeMap<Vec<u8>, Vec<u8>>, FixtureError> {
        use ftkv_proto::v1::{ReadConsistency, ScanRequest};
        let mut kv = self.kv_raw(id).await?;
        let consistency = if serializable {
            ReadConsistency::Serializable
        } else {
            ReadConsistency::Linearizable
        };
        let mut pairs = BTreeMap::new();
        let mut cursor = start.to_vec();
        loop {
            let request = ScanRequest {
                start: cursor.clone(),
                end: end.to_vec(),
                limit: 1000,
                consistency: consistency as i32,
                keys_only: false,
            };
            let page = kv
                .scan(request)
                .await
                .map_err(|status| FixtureError::Status {
                    id,
                    message: format!("scan: {}: {}", status.code(), status.message()),
                })?
                .into_inner();
            for pair in page.kvs {
                pairs.insert(pair.key, pair.value);
            }
            if !page.more {
                return Ok(pairs);
            }
            if page.next_start <= cursor {
                return Err(FixtureError::Status {
                    id,
                    message: "scan continuation did not advance".into(),
                });
            }
            cursor = page.next_start;
        }
    }

    /// `--data-dir` of node `id`.
    pub fn data_dir(&self, id: u64) -> Result<PathBuf, FixtureError> {
        self.with_slot(id, |slot| Ok(slot.info.data_dir.clone()))
    }

    /// Process id of node `id` while it runs.
    pub fn pid(&self, id: u64) -> Option<u32> {
        let mut slots = self.lock();
        let slot = slots.get_mut(&id)?;
        refresh(slot);
        slot.child.as_ref().map(Child::id)
    }

    /// True while node `id`'s process exists (running or paused).
    pub fn is_running(&self, id: u64) -> bool {
        self.pid(id).is_some()
    }

    /// True while node `id` is stopped by [`Cluster::pause`].
    pub fn is_paused(&self, id: u64) -> bool {
        self.lock()
            .get(&id)
            .is_some_and(|slot| slot.paused && slot.child.is_some())
    }

    /// Exit status of node `id`'s last run, once it has exited.
    pub fn exit_status(&self, id: u64) -> Option<ExitStatus> {
        let mut slots = self.lock();
        let slot = slots.get_mut(&id)?;
        refresh(slot);
        slot.last_exit
    }

    /// How many times node `id` has been started.
    pub fn starts(&self, id: u64) -> u32 {
        self.lock().get(&id).map_or(0, |slot| slot.starts)
    }

    /// SIGKILLs node `id` and reaps it (no clean shutdown: `kill -9`). A paused node dies too.
    /// Killing a node that is not running is not an error.
    pub fn kill(&self, id: u64) -> Result<(), FixtureError> {
        self.with_slot(id, |slot| {
            if let Some(mut child) = slot.child.take() {
                let _ = child.kill();
                let status = child.wait().map_err(|source| FixtureError::Io {
                    context: format!("reaping node {id}"),
                    source,
                })?;
                slot.last_exit = Some(status);
            }
            slot.paused = false;
            Ok(())
        })
    }

    /// SIGTERMs node `id` (clean shutdown) and waits for it to exit; after `wait_timeout` it is
    /// SIGKILLed and [`FixtureError::Timeout`] returned. Returns the exit status.
    pub async fn stop(&self, id: u64) -> Result<ExitStatus, FixtureError> {
        let pid = self.with_slot(id, |slot| {
            refresh(slot);
            let pid = slot
                .child
                .as_ref()
                .map(Child::id)
                .ok_or(FixtureError::NodeNotRunning { id })?;
            if slot.paused {
                let _ = send_signal(pid, libc::SIGCONT);
                slot.paused = false;
            }
            Ok(pid)
        })?;
        send_signal(pid, libc::SIGTERM).map_err(|source| FixtureError::Io {
            context: format!("SIGTERM to node {id}"),
            source,
        })?;
        let deadline = Instant::now() + self.options.wait_timeout;
        loop {
            let exited = self.with_slot(id, |slot| {
                refresh(slot);
                Ok(if slot.child.is_none() {
                    slot.last_exit
                } else {
                    None
                })
            })?;
            if let Some(status) = exited {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                self.kill(id)?;
                return Err(FixtureError::Timeout {
                    what: format!("node {id} to exit after SIGTERM (SIGKILLed it)"),
                    waited_ms: self.options.wait_timeout.as_millis(),
                    last_seen: self.log_tail(id, 20),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Starts node `id` again on the same data dir and ports (after kill, stop or an exit).
    pub fn restart(&self, id: u64) -> Result<(), FixtureError> {
        self.spawn(id)
    }

    /// SIGSTOPs node `id` (a process pause: it keeps its sockets but answers nothing).
    pub fn pause(&self, id: u64) -> Result<(), FixtureError> {
        self.signal_running(id, libc::SIGSTOP, true)
    }

    /// SIGCONTs node `id` after [`Cluster::pause`].
    pub fn resume(&self, id: u64) -> Result<(), FixtureError> {
        self.signal_running(id, libc::SIGCONT, false)
    }

    /// Deletes node `id`'s data dir (the node must not be running): with
    /// [`Cluster::add_node`] this models a replaced disk.
    pub fn wipe(&self, id: u64) -> Result<(), FixtureError> {
        self.with_slot(id, |slot| {
            refresh(slot);
            if slot.child.is_some() {
                return Err(FixtureError::NodeRunning { id });
            }
            let data_dir = slot.info.data_dir.clone();
            if data_dir.exists() {
                std::fs::remove_dir_all(&data_dir).map_err(|source| FixtureError::Io {
                    context: format!("wiping {}", data_dir.display()),
                    source,
                })?;
            }
            Ok(())
        })
    }

    /// Starts a new node `id` with fresh ports and `--initial-cluster-state existing`; it joins
    /// nothing by itself: add it with `AddLearner` (its addresses are in the returned
    /// [`NodeInfo`]) and `Promote` it through the client.
    pub fn add_node(&self, id: u64) -> Result<NodeInfo, FixtureError> {
        let ports = free_ports(&self.options.host, 3)?;
        let info = node_info(self.dir(), &self.options.host, id, &ports);
        {
            let mut slots = self.lock();
            if slots.contains_key(&id) {
                return Err(FixtureError::NodeRunning { id });
            }
            slots.insert(
                id,
                Slot {
                    info: info.clone(),
                    initial_state: "existing",
                    child: None,
                    paused: false,
                    starts: 0,
                    last_exit: None,
                },
            );
        }
        self.spawn(id)?;
        Ok(info)
    }

    /// The full command line (after the binary) node `id` is started with.
    pub fn node_args(&self, id: u64) -> Result<Vec<String>, FixtureError> {
        self.with_slot(id, |slot| Ok(self.args_for(slot)))
    }

    /// `ftkv.v1.Cluster/Status` of node `id` (one connection, bounded by 2 s).
    pub async fn status(&self, id: u64) -> Result<StatusResponse, FixtureError> {
        let addr = self.endpoint(id)?;
        status_at(
            id,
            &addr,
            self.options.client_tls.as_ref(),
            Duration::from_secs(2),
        )
        .await
    }

    /// Statuses of every running, unpaused node that answers, by id.
    pub async fn statuses(&self) -> BTreeMap<u64, Result<StatusResponse, FixtureError>> {
        let targets: Vec<(u64, String)> = {
            let mut slots = self.lock();
            slots
                .values_mut()
                .filter_map(|slot| {
                    refresh(slot);
                    (slot.child.is_some() && !slot.paused)
                        .then(|| (slot.info.id, slot.info.client_addr.clone()))
                })
                .collect()
        };
        let mut tasks = tokio::task::JoinSet::new();
        for (id, addr) in targets {
            let tls = self.options.client_tls.clone();
            tasks.spawn(async move {
                (
                    id,
                    status_at(id, &addr, tls.as_ref(), Duration::from_secs(2)).await,
                )
            });
        }
        let mut statuses = BTreeMap::new();
        while let Some(joined) = tasks.join_next().await {
            if let Ok((id, status)) = joined {
                statuses.insert(id, status);
            }
        }
        statuses
    }

    /// The current leader if a running node claims leadership now (the highest term wins when
    /// several claim it, as after a partition); `None` otherwise. Does not wait.
    pub async fn leader_id(&self) -> Option<u64> {
        leader_of(&self.statuses().await)
    }

    /// Waits up to `wait_timeout` for a leader and returns its id.
    ///
    /// # Errors
    /// [`FixtureError::Timeout`] with every node's last status; [`FixtureError::NodeExited`] as
    /// soon as every node has exited.
    pub async fn wait_for_leader(&self) -> Result<u64, FixtureError> {
        self.wait_for_leader_within(self.options.wait_timeout).await
    }

    /// [`Cluster::wait_for_leader`] with an explicit bound.
    pub async fn wait_for_leader_within(&self, timeout: Duration) -> Result<u64, FixtureError> {
        let started = Instant::now();
        loop {
            let statuses = self.statuses().await;
            if let Some(leader) = leader_of(&statuses) {
                return Ok(leader);
            }
            self.fail_if_all_exited()?;
            if started.elapsed() >= timeout {
                return Err(FixtureError::Timeout {
                    what: "a leader".into(),
                    waited_ms: started.elapsed().as_millis(),
                    last_seen: describe(&statuses),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits until node `id` has applied at least `index`; returns its status then.
    pub async fn wait_caught_up(&self, id: u64, index: u64) -> Result<StatusResponse, FixtureError> {
        let started = Instant::now();
        loop {
            let status = self.status(id).await;
            if let Ok(status) = &status {
                if status.applied_index >= index {
                    return Ok(status.clone());
                }
            }
            if !self.is_running(id) {
                return Err(self.exited_error(id));
            }
            if started.elapsed() >= self.options.wait_timeout {
                return Err(FixtureError::Timeout {
                    what: format!("node {id} to apply index {index}"),
                    waited_ms: started.elapsed().as_millis(),
                    last_seen: format!("{status:?}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits for a leader, then until it has committed every entry its log held when first
    /// asked (a leader elected a moment ago has not yet committed its blank entry, and so not
    /// the entries of earlier terms it still holds: its commit index then is behind what the
    /// cluster will have committed), then until every running, unpaused node has applied that
    /// commit index. Returns the index.
    pub async fn wait_all_caught_up(&self) -> Result<u64, FixtureError> {
        let started = Instant::now();
        let first = self.status(self.wait_for_leader().await?).await?;
        let mut index = first.commit_index;
        while index < first.last_log_index {
            if started.elapsed() >= self.options.wait_timeout {
                return Err(FixtureError::Timeout {
                    what: format!("the leader to commit its log up to {}", first.last_log_index),
                    waited_ms: started.elapsed().as_millis(),
                    last_seen: format!("commit index {index}"),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            index = self.status(self.wait_for_leader().await?).await?.commit_index;
        }
        for id in self.ids() {
            if self.is_running(id) && !self.is_paused(id) {
                self.wait_caught_up(id, index).await?;
            }
        }
        Ok(index)
    }

    /// Everything node `id` has logged, across all its runs (lossy UTF-8; empty if none yet).
    pub fn node_log(&self, id: u64) -> String {
        match self.node(id) {
            Ok(info) => std::fs::read(&info.log_path)
                .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
                .unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// The last `lines` lines of node `id`'s log.
    pub fn log_tail(&self, id: u64, lines: usize) -> String {
        tail(&self.node_log(id), lines)
    }

    /// Fails with the offending lines when any node's log mentions `panicked`.
    pub fn check_no_panics(&self) -> Result<(), FixtureError> {
        for id in self.ids() {
            let log = self.node_log(id);
            let lines: Vec<&str> = log.lines().filter(|line| line.contains("panicked")).collect();
            if !lines.is_empty() {
                return Err(FixtureError::Panicked {
                    id,
                    lines: lines.join("\n"),
                });
            }
        }
        Ok(())
    }

    /// Runs `ftkvctl --endpoints <every node> ARGS...` with no stdin, bounded by `ctl_timeout`.
    pub async fn ctl(&self, args: &[&str]) -> Result<CtlOutput, FixtureError> {
        let endpoints = self.endpoints().join(",");
        let mut full = vec!["--endpoints", endpoints.as_str()];
        full.extend_from_slice(args);
        run_ctl(&self.binaries, &full, None, self.options.ctl_timeout).await
    }

    /// Like [`Cluster::ctl`] with `stdin` fed to the process (e.g. a `txn` script).
    pub async fn ctl_with_stdin(&self, args: &[&str], stdin: &str) -> Result<CtlOutput, FixtureError> {
        let endpoints = self.endpoints().join(",");
        let mut full = vec!["--endpoints", endpoints.as_str()];
        full.extend_from_slice(args);
        run_ctl(&self.binaries, &full, Some(stdin), self.options.ctl_timeout).await
    }

    /// Every node's log tail (`lines` lines each), each under a header naming the file.
    pub fn log_tails(&self, lines: usize) -> String {
        self.ids()
            .into_iter()
            .map(|id| {
                let path = self
                    .node(id)
                    .map(|info| info.log_path.display().to_string())
                    .unwrap_or_default();
                format!(
                    "===== node {id} log tail ({path}) =====\n{}\n",
                    self.log_tail(id, lines)
                )
            })
            .collect()
    }

    /// Prints every node's log tail (`lines` lines each) to stderr.
    pub fn dump_logs(&self, lines: usize) {
        eprint!("{}", self.log_tails(lines));
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<u64, Slot>> {
        self.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn with_slot<T>(
        &self,
        id: u64,
        action: impl FnOnce(&mut Slot) -> Result<T, FixtureError>,
    ) -> Result<T, FixtureError> {
        let mut slots = self.lock();
        let slot = slots.get_mut(&id).ok_or(FixtureError::UnknownNode { id })?;
        action(slot)
    }

    fn signal_running(&self, id: u64, signal: libc::c_int, paused: bool) -> Result<(), FixtureError> {
        self.with_slot(id, |slot| {
            refresh(slot);
            let pid = slot
                .child
                .as_ref()
                .map(Child::id)
                .ok_or(FixtureError::NodeNotRunning { id })?;
            send_signal(pid, signal).map_err(|source| FixtureError::Io {
                context: format!("signal {signal} to node {id}"),
                source,
            })?;
            slot.paused = paused;
            Ok(())
        })
    }

    fn args_for(&self, slot: &Slot) -> Vec<String> {
        let info = &slot.info;
        let mut args: Vec<String> = vec![
            "run".into(),
            "--id".into(),
            info.id.to_string(),
            "--data-dir".into(),
            info.data_dir.display().to_string(),
            "--listen-client".into(),
            info.client_addr.clone(),
            "--advertise-client".into(),
            info.client_addr.clone(),
            "--listen-peer".into(),
            info.peer_addr.clone(),
            "--advertise-peer".into(),
            info.peer_addr.clone(),
            "--listen-status".into(),
            info.status_addr.clone(),
            "--initial-cluster".into(),
            if slot.initial_state == "new" {
                self.initial_cluster.clone()
            } else {
                format!("{},{}={}", self.initial_cluster, info.id, info.peer_addr)
            },
            "--initial-cluster-state".into(),
            slot.initial_state.into(),
        ];
        if let Some(engine) = &self.options.engine {
            args.push("--engine".into());
            args.push(engine.clone());
        }
        args.extend(self.options.extra_args.iter().cloned());
        args
    }

    fn spawn(&self, id: u64) -> Result<(), FixtureError> {
        let mut slots = self.lock();
        let slot = slots.get_mut(&id).ok_or(FixtureError::UnknownNode { id })?;
        refresh(slot);
        if slot.child.is_some() {
            return Err(FixtureError::NodeRunning { id });
        }
        let args = self.args_for(slot);
        let io_error = |context: String| move |source| FixtureError::Io { context, source };
        std::fs::create_dir_all(&slot.info.dir)
            .map_err(io_error(format!("creating {}", slot.info.dir.display())))?;
        let mut log: File = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&slot.info.log_path)
            .map_err(io_error(format!("opening {}", slot.info.log_path.display())))?;
        slot.starts += 1;
        let _ = writeln!(
            log,
            "===== ftkv-tests fixture: start #{} of node {id} at +{:.3}s: {} {} =====",
            slot.starts,
            self.started_at.elapsed().as_secs_f64(),
            self.binaries.node.display(),
            args.join(" ")
        );
        let stderr = log
            .try_clone()
            .map_err(io_error("cloning the log handle".into()))?;
        let mut command = Command::new(&self.binaries.node);
        command
            .args(&args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(stderr);
        if std::env::var_os("RUST_LOG").is_none()
            && !self.options.env.iter().any(|(key, _)| key == "RUST_LOG")
        {
            command.env("RUST_LOG", "info");
        }
        // The fixture's own variables are not node configuration.
        command
            .env_remove("FTKV_BIN_DIR")
            .env_remove("FTKV_KEEP_TEST_DIR");
        // Plain logs (no ANSI colours) so tests and people can grep them.
        command.env("NO_COLOR", "1");
        let id_text = id.to_string();
        command.envs(
            self.options
                .env
                .iter()
                .map(|(key, value)| (key, value.replace("{id}", &id_text))),
        );
        let child = spawn_tied(command).map_err(io_error(format!("spawning node {id}")))?;
        slot.child = Some(child);
        slot.paused = false;
        slot.last_exit = None;
        Ok(())
    }

    fn exited_error(&self, id: u64) -> FixtureError {
        let status = self
            .exit_status(id)
            .map_or_else(|| "killed by the fixture".into(), |s| s.to_string());
        FixtureError::NodeExited {
            id,
            status,
            log_tail: self.log_tail(id, 30),
        }
    }

    fn fail_if_all_exited(&self) -> Result<(), FixtureError> {
        let ids = self.ids();
        if ids.iter().all(|&id| !self.is_running(id)) {
            if let Some(&id) = ids.first() {
                return Err(self.exited_error(id));
            }
        }
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let panicking = std::thread::panicking();
        {
            let mut slots = self.lock();
            for slot in slots.values_mut() {
                if let Some(mut child) = slot.child.take() {
                    let _ = child.kill();
                    let _ = child.wait();
                }
            }
        }
        if panicking {
            self.dump_logs(40);
        }
        if std::env::var_os("FTKV_KEEP_TEST_DIR").is_some() {
            if let Some(dir) = self.dir.take() {
                eprintln!("ftkv-tests fixture: kept cluster folder {}", dir.keep().display());
            }
        }
    }
}

/// Reaps an exited child: moves its exit status to `last_exit`.
fn refresh(slot: &mut Slot) {
    if let Some(child) = slot.child.as_mut() {
        if let Ok(Some(status)) = child.try_wait() {
            slot.last_exit = Some(status);
            slot.child = None;
            slot.paused = false;
        }
    }
}

fn node_info(root: &Path, host: &str, id: u64, ports: &[u16]) -> NodeInfo {
    let dir = root.join(format!("node-{id}"));
    let port = |index: usize| ports.get(index).copied().unwrap_or(0);
    NodeInfo {
        id,
        client_addr: format!("{host}:{}", port(0)),
        peer_addr: format!("{host}:{}", port(1)),
        status_addr: format!("{host}:{}", port(2)),
        data_dir: dir.join("data"),
        log_path: dir.join("node.log"),
        dir,
    }
}

/// One `Status` call over a fresh connection (a cached channel could hold a dead connection
/// to a restarted node).
async fn status_at(
    id: u64,
    addr: &str,
    tls: Option<&FixtureTls>,
    timeout: Duration,
) -> Result<StatusResponse, FixtureError> {
    let failed = |message: String| FixtureError::Status { id, message };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let mut endpoint = tonic::transport::Endpoint::from_shared(format!("{scheme}://{addr}"))
        .map_err(|error| failed(error.to_string()))?
        .connect_timeout(timeout)
        .timeout(timeout);
    if let Some(tls) = tls {
        endpoint = endpoint
            .tls_config(tls.tonic_config())
            .map_err(|error| failed(error.to_string()))?;
    }
    let channel = endpoint
        .connect()
        .await
        .map_err(|error| failed(format!("connect {addr}: {error}")))?;
    let mut client = ClusterClient::new(channel);
    let response = client
        .status(StatusRequest { with_digest: false })
        .await
        .map_err(|status| failed(format!("{}: {}", status.code(), status.message())))?;
    Ok(response.into_inner())
}

fn leader_of(statuses: &BTreeMap<u64, Result<StatusResponse, FixtureError>>) -> Option<u64> {
    statuses
        .iter()
        .filter_map(|(id, status)| {
            status
                .as_ref()
                .ok()
                .filter(|s| s.is_leader)
                .map(|s| (s.term, *id))
        })
        .max()
        .map(|(_, id)| id)
}

fn describe(statuses: &BTreeMap<u64, Result<StatusResponse, FixtureError>>) -> String {
    if statuses.is_empty() {
        return "no running node".into();
    }
    statuses
        .iter()
        .map(|(id, status)| match status {
            Ok(s) => format!(
                "node {id}: role={} leader={} term={} last_log={} commit={} applied={}",
                s.role, s.leader_id, s.term, s.last_log_index, s.commit_index, s.applied_index
            ),
            Err(error) => format!("node {id}: {error}"),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

async fn run_ctl(
    binaries: &Binaries,
    args: &[&str],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<CtlOutput, FixtureError> {
    use tokio::io::AsyncWriteExt as _;
    let started = Instant::now();
    let mut command = tokio::process::Command::new(&binaries.ctl);
    command
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().map_err(|source| FixtureError::Io {
        context: format!("spawning ftkvctl {}", args.join(" ")),
        source,
    })?;
    if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
        // A CLI that rejects its input early may close stdin: a write error is not ours to report.
        let _ = pipe.write_all(input.as_bytes()).await;
        drop(pipe);
    }
    let output = tokio::time::timeout(timeout, child.wait_with_output())
        .await
        .map_err(|_| FixtureError::Timeout {
            what: format!("ftkvctl {}", args.join(" ")),
            waited_ms: timeout.as_millis(),
            last_seen: String::new(),
        })?;
    let output = output.map_err(|source| FixtureError::Io {
        context: "running ftkvctl".into(),
        source,
    })?;
    Ok(CtlOutput {
        status: output.status,
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        elapsed: started.elapsed(),
    })
}

/// Runs `ftkvctl ARGS...` (no implicit `--endpoints`) bounded by `timeout`: for tests of the
/// CLI's own error handling (unreachable endpoints, bad flags).
///
/// # Errors
/// [`FixtureError::MissingBinary`] when the binaries are not built; spawning or timeout errors.
pub async fn run_ftkvctl(
    args: &[&str],
    stdin: Option<&str>,
    timeout: Duration,
) -> Result<CtlOutput, FixtureError> {
    run_ctl(&Binaries::try_locate()?, args, stdin, timeout).await
}
