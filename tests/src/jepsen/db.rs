//! Jepsen's `db`: a three-node cluster on a substrate, with the process and network faults the
//! nemeses need. `local` reuses the cluster fixture ([`crate::fixture::Cluster`], loopback
//! processes: kill and pause only); `netns` is [`NetnsCluster`] (namespaces, partitions);
//! `docker` is [`DockerCluster`] (containers of the ftkv image, partitions; no `clock`).
//!
//! Node modes for two nemeses (`fake_clock` not on `docker`): `lose_unsynced_on_kill` starts every node with
//! `--unsafe-lose-unsynced-on-kill` (a SIGKILL then loses what was not fsynced), and `fake_clock`
//! starts every node under libfaketime (`LD_PRELOAD`) reading its offset from a per-node file
//! `<dir>/clock/n<ID>.faketime` that [`Db::set_clock`] rewrites. libfaketime fakes
//! only `CLOCK_REALTIME` by default (`FAKETIME_DONT_FAKE_MONOTONIC=1`, as Jepsen's
//! `settimeofday` nemesis: NTP steps move the wall clock, never `CLOCK_MONOTONIC`, which is what
//! `Instant`, tokio timers and Raft's election and lease timers read); it re-reads the file at most once a second (`FAKETIME_CACHE_DURATION=1`: `FAKETIME_NO_CACHE=1`
//! re-reads it on every clock read, about 4 us each, twenty times the cached cost).
//! [`CLOCK_MONOTONIC_ENV`]`=1` skews `CLOCK_MONOTONIC` too: forward jumps and rate changes model
//! a paused or throttled VM, but the nemesis also steps it backwards, which no real monotonic
//! clock does (openraft 0.9 debug builds assert on it and stop the Raft core; the node exits).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::fixture::{Binaries, Cluster, ClusterOptions};
use crate::jepsen::docker::DockerCluster;
use crate::jepsen::netns::NetnsCluster;
use crate::jepsen::security::{Security, SecurityOptions};
use crate::jepsen::substrate::Substrate;

/// Substrate names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SubstrateKind {
    /// Each node in its own network namespace (root, iptables).
    Netns,
    /// Loopback processes (kill and pause only).
    Local,
    /// Containers of the ftkv image on a network of their own (root, Docker, iptables).
    Docker,
}

impl SubstrateKind {
    /// Command-line name.
    pub fn name(&self) -> &'static str {
        match self {
            SubstrateKind::Netns => "netns",
            SubstrateKind::Local => "local",
            SubstrateKind::Docker => "docker",
        }
    }
}

/// Image of the `docker` substrate when none is given (`--image`, `FTKV_JEPSEN_IMAGE`).
pub const DEFAULT_DOCKER_IMAGE: &str = "ftkv:latest";

/// Errors of the db layer, with the substrate's message.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// The substrate cannot do this (e.g. partitions on `local`).
    #[error("unsupported on this substrate: {0}")]
    Unsupported(String),
    /// The substrate failed.
    #[error("{0}")]
    Substrate(String),
}

/// Node flag of the `lose-unsynced` node mode.
pub const LOSE_UNSYNCED_FLAG: &str = "--unsafe-lose-unsynced-on-kill";

/// Where libfaketime is looked for (Debian's `faketime` package first); `FTKV_LIBFAKETIME`
/// overrides.
pub const LIBFAKETIME_PATHS: [&str; 4] = [
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
    "/usr/local/lib/faketime/libfaketime.so.1",
];

/// The libfaketime library to preload, or a `Substrate` error telling to install it (the harness
/// installs nothing itself; the run then fails with exit 2).
pub fn find_libfaketime() -> Result<PathBuf, DbError> {
    if let Some(p) = std::env::var_os("FTKV_LIBFAKETIME") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(DbError::Substrate(format!(
                "FTKV_LIBFAKETIME={} is not a file: install faketime (Debian package `faketime`)",
                p.display()
            )))
        };
    }
    LIBFAKETIME_PATHS
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| {
            DbError::Substrate(format!(
                "the clock nemesis needs libfaketime, not found in {}: install faketime (Debian package \
                 `faketime`, e.g. `apt-get install faketime`) or set FTKV_LIBFAKETIME",
                LIBFAKETIME_PATHS.join(", ")
            ))
        })
}

/// Set to `1` in the harness's environment to skew `CLOCK_MONOTONIC` as well as
/// `CLOCK_REALTIME`; by default only the wall clock moves (libfaketime's
/// `FAKETIME_DONT_FAKE_MONOTONIC=1`), as with Jepsen's `settimeofday`-based clock nemesis.
pub const CLOCK_MONOTONIC_ENV: &str = "FTKV_JEPSEN_CLOCK_MONOTONIC";

/// The libfaketime offset spec meaning "no skew".
pub const CLOCK_NO_SKEW: &str = "+0";

/// The cluster under test.
pub struct Db {
    inner: Box<dyn Substrate>,
    /// Current member ids (membership changes replace ids).
    members: Mutex<Vec<u64>>,
    next_id: Mutex<u64>,
    /// Nodes run with [`LOSE_UNSYNCED_FLAG`].
    lose_unsynced_on_kill: bool,
    /// Folder of the per-node libfaketime files, when nodes run under libfaketime.
    clock_dir: Option<PathBuf>,
    /// TLS and auth of the nodes and of every harness client.
    security: Security,
}

fn sub<E: std::fmt::Display>(e: E) -> DbError {
    DbError::Substrate(e.to_string())
}

/// Database settings.
#[derive(Debug, Clone)]
pub struct DbOptions {
    /// Substrate.
    pub substrate: SubstrateKind,
    /// Node count.
    pub nodes: u64,
    /// Extra node flags (engine, canaries, snapshot thresholds).
    pub node_args: Vec<String>,
    /// Folder for node data and logs (netns) and the clock files; the local fixture keeps node
    /// data in its own temporary folder.
    pub dir: PathBuf,
    /// Start nodes with [`LOSE_UNSYNCED_FLAG`] (nemesis `lose-unsynced`; also on when
    /// `node_args` has the flag).
    pub lose_unsynced_on_kill: bool,
    /// Start nodes under libfaketime with per-node clock files (nemesis `clock`); setup fails
    /// with "install faketime" when the library is missing (and on `docker`: unsupported).
    pub fake_clock: bool,
    /// Image of the `docker` substrate's containers.
    pub docker_image: String,
    /// TLS and auth (certificates go into `dir/tls`; see [`crate::jepsen::security`]).
    pub security: SecurityOptions,
}

impl Db {
    /// Sets up the cluster, waits (up to `wait`) for a leader and, with auth, creates the users
    /// and enables auth.
    pub async fn start(options: &DbOptions, wait: Duration) -> Result<Db, DbError> {
        let mut node_args = options.node_args.clone();
        let lose_unsynced_on_kill =
            options.lose_unsynced_on_kill || node_args.iter().any(|a| a == LOSE_UNSYNCED_FLAG);
        if lose_unsynced_on_kill && !node_args.iter().any(|a| a == LOSE_UNSYNCED_FLAG) {
            node_args.push(LOSE_UNSYNCED_FLAG.into());
        }
        let mut env = Vec::new();
        if options.fake_clock && options.substrate == SubstrateKind::Docker {
            return Err(DbError::Unsupported(
                "the clock nemesis preloads the host's libfaketime into node processes: not on the docker substrate"
                    .into(),
            ));
        }
        let clock_dir = if options.fake_clock {
            let lib = find_libfaketime()?;
            let dir = options.dir.join("clock");
            // Absolute: nodes may run in another working directory.
            let dir = std::fs::create_dir_all(&dir)
                .and_then(|()| std::fs::canonicalize(&dir))
                .map_err(|e| DbError::Substrate(format!("{}: {e}", dir.display())))?;
            for id in 1..=options.nodes {
                write_clock_file(&dir, id, CLOCK_NO_SKEW)?;
            }
            env.push(("LD_PRELOAD".to_string(), lib.display().to_string()));
            env.push((
                "FAKETIME_TIMESTAMP_FILE".to_string(),
                dir.join("n{id}.faketime").display().to_string(),
            ));
            env.push(("FAKETIME_CACHE_DURATION".to_string(), "1".to_string()));
            if !std::env::var(CLOCK_MONOTONIC_ENV).is_ok_and(|v| v == "1") {
                env.push(("FAKETIME_DONT_FAKE_MONOTONIC".to_string(), "1".to_string()));
            }
            Some(dir)
        } else {
            None
        };
        let mut security = Security::new(options.security, &absolute(&options.dir.join("tls"))?);
        env.extend(security.node_env());
        let inner = match options.substrate {
            SubstrateKind::Local => {
                if options.security.tls {
                    let bins = Binaries::try_locate().map_err(sub)?;
                    security
                        .generate_certs(&bins.node, options.nodes, None)
                        .map_err(sub)?;
                }
                let cluster = Cluster::start(ClusterOptions {
                    nodes: options.nodes as usize,
                    extra_args: node_args,
                    env,
                    wait_timeout: wait,
                    client_tls: security.fixture_tls(),
                    ..Default::default()
                })
                .await
                .map_err(sub)?;
                Box::new(cluster) as Box<dyn Substrate>
            }
            SubstrateKind::Netns => {
                crate::jepsen::netns::available().map_err(DbError::Unsupported)?;
                let bins = Binaries::try_locate().map_err(sub)?;
                let dir = options.dir.clone();
                let n = options.nodes;
                let (cluster, prepared) = tokio::task::spawn_blocking(move || {
                    let cluster =
                        NetnsCluster::start_prepared(n, &dir, &bins.node, node_args, env, |hosts| {
                            security
                                .generate_certs(&bins.node, n, Some(hosts))
                                .map_err(|e| e.to_string())
                        });
                    (cluster, security)
                })
                .await
                .map_err(sub)?;
                security = prepared;
                Box::new(cluster.map_err(sub)?)
            }
            SubstrateKind::Docker => {
                let dir = options.dir.clone();
                let n = options.nodes;
                let image = options.docker_image.clone();
                let cluster = tokio::task::spawn_blocking(move || {
                    DockerCluster::start(n, &dir, &image, node_args, env)
                })
                .await
                .map_err(sub)?
                .map_err(|e| match e {
                    crate::jepsen::docker::DockerError::Unavailable(m) => DbError::Unsupported(m),
                    e => sub(e),
                })?;
                Box::new(cluster)
            }
        };
        let db = Db {
            inner,
            members: Mutex::new((1..=options.nodes).collect()),
            next_id: Mutex::new(options.nodes + 1),
            lose_unsynced_on_kill,
            clock_dir,
            security,
        };
        db.wait_for_leader(wait).await?;
        db.security
            .enable_auth(&db.endpoints(), wait)
            .await
            .map_err(sub)?;
        Ok(db)
    }

    /// TLS and auth of this cluster.
    pub fn security(&self) -> &Security {
        &self.security
    }

    /// A client builder for the workload with `endpoints`: TLS and the workload user when the
    /// run has them.
    pub fn client_builder(&self, endpoints: Vec<String>) -> ftkv_client::ClientBuilder {
        self.security.client_builder(endpoints)
    }

    /// A client builder as `root` (membership changes) with `endpoints`.
    pub fn admin_builder(&self, endpoints: Vec<String>) -> ftkv_client::ClientBuilder {
        self.security.admin_builder(endpoints)
    }

    /// `Cluster.Status` of one endpoint through a one-endpoint client (TLS when on), bounded by
    /// `timeout`. Without digest no user is needed; with it (the role `root` under auth) the
    /// call goes through root's long-lived client.
    pub async fn status(
        &self,
        endpoint: &str,
        with_digest: bool,
        timeout: Duration,
    ) -> Result<ftkv_client::NodeStatus, String> {
        let fut = async {
            if with_digest && self.security.options().auth {
                let root = self.security.root_client(&self.endpoints()).await?;
                return root.status_with(endpoint, true).await.map_err(|e| e.to_string());
            }
            let client = self
                .security
                .anonymous_builder(vec![endpoint.to_string()])
                .connect_timeout(timeout)
                .request_timeout(timeout)
                .retry(ftkv_client::RetryPolicy::no_retry(timeout))
                .build()
                .await
                .map_err(|e| e.to_string())?;
            client
                .status_with(endpoint, with_digest)
                .await
                .map_err(|e| e.to_string())
        };
        tokio::time::timeout(timeout + Duration::from_secs(1), fut)
            .await
            .map_err(|_| format!("status of {endpoint}: timed out"))?
    }

    /// The substrate in use.
    pub fn substrate(&self) -> SubstrateKind {
        self.inner.kind()
    }

    /// Whether nodes run with [`LOSE_UNSYNCED_FLAG`] (a kill loses what was not fsynced).
    pub fn loses_unsynced_on_kill(&self) -> bool {
        self.lose_unsynced_on_kill
    }

    /// Whether nodes run under libfaketime ([`Db::set_clock`] works).
    pub fn fakes_clock(&self) -> bool {
        self.clock_dir.is_some()
    }

    /// Sets node `id`'s libfaketime offset spec: `"+5s"`, `"-3s"`, `"+0 x1.5"` (rate 1.5 from the
    /// process start: the clock also jumps by 0.5 x uptime), [`CLOCK_NO_SKEW`] to undo. Applies to
    /// the node's `CLOCK_REALTIME` (and `CLOCK_MONOTONIC` with [`CLOCK_MONOTONIC_ENV`]`=1`) within
    /// about a second (libfaketime's file cache); survives restarts until reset. Errors: `Unsupported` when nodes do not run under
    /// libfaketime, `Substrate` when the file cannot be written.
    pub fn set_clock(&self, id: u64, spec: &str) -> Result<(), DbError> {
        let dir = self.clock_dir.as_ref().ok_or_else(|| {
            DbError::Unsupported("nodes do not run under libfaketime (fake_clock is off)".into())
        })?;
        write_clock_file(dir, id, spec)
    }

    /// Current member ids.
    pub fn members(&self) -> Vec<u64> {
        self.members.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Client endpoint of node `id`.
    pub fn endpoint(&self, id: u64) -> Result<String, DbError> {
        self.inner.endpoint(id)
    }

    /// Client endpoints of the current members.
    pub fn endpoints(&self) -> Vec<String> {
        self.members()
            .into_iter()
            .filter_map(|id| self.endpoint(id).ok())
            .collect()
    }

    /// Data dir of node `id`.
    pub fn data_dir(&self, id: u64) -> Result<PathBuf, DbError> {
        self.inner.data_dir(id)
    }

    /// Log file of node `id`.
    pub fn log_path(&self, id: u64) -> Result<PathBuf, DbError> {
        self.inner.log_path(id)
    }

    /// SIGKILL node `id`.
    pub fn kill(&self, id: u64) -> Result<(), DbError> {
        self.inner.kill(id)
    }

    /// Start node `id` again on its data dir.
    pub fn restart(&self, id: u64) -> Result<(), DbError> {
        self.inner.restart(id)
    }

    /// Whether node `id` runs.
    pub fn is_running(&self, id: u64) -> bool {
        self.inner.is_running(id)
    }

    /// SIGSTOP node `id`.
    pub fn pause(&self, id: u64) -> Result<(), DbError> {
        self.inner.pause(id)
    }

    /// SIGCONT node `id`.
    pub fn resume(&self, id: u64) -> Result<(), DbError> {
        self.inner.resume(id)
    }

    /// Network partition into `groups` (netns and docker).
    pub fn partition(&self, groups: &[Vec<u64>]) -> Result<(), DbError> {
        self.inner.partition(groups)
    }

    /// Removes every partition (no-op on local).
    pub fn heal(&self) -> Result<(), DbError> {
        self.inner.heal()
    }

    /// Deletes the data dir of stopped node `id`.
    pub fn wipe(&self, id: u64) -> Result<(), DbError> {
        self.inner.wipe(id)
    }

    /// Starts a brand-new node (next free id) with `--initial-cluster-state existing`; returns
    /// its id and (client, peer) endpoints. It joins once added as learner and promoted.
    pub fn add_node(&self) -> Result<(u64, String, String), DbError> {
        let id = {
            let mut next = self.next_id.lock().unwrap_or_else(|e| e.into_inner());
            let id = *next;
            *next += 1;
            id
        };
        if let Some(dir) = &self.clock_dir {
            write_clock_file(dir, id, CLOCK_NO_SKEW)?;
        }
        let (client, peer) = self.inner.add_node(id)?;
        Ok((id, client, peer))
    }

    /// Sets the member list to `ids` (the membership the cluster reported: see
    /// [`crate::jepsen::nemesis`]'s membership read-back).
    pub fn set_members(&self, ids: &[u64]) {
        let mut m = self.members.lock().unwrap_or_else(|e| e.into_inner());
        *m = ids.to_vec();
    }

    /// Counts node `id` as a member (once).
    pub fn add_member(&self, id: u64) {
        let mut m = self.members.lock().unwrap_or_else(|e| e.into_inner());
        if !m.contains(&id) {
            m.push(id);
        }
    }

    /// Every node the substrate started, members or not.
    pub fn node_ids(&self) -> Vec<u64> {
        self.inner.ids()
    }

    /// The leader, if a node claims it now (the highest term wins).
    pub async fn leader(&self) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for id in self.members() {
            let Ok(ep) = self.endpoint(id) else { continue };
            if let Ok(st) = self.status(&ep, false, Duration::from_secs(2)).await {
                if st.is_leader && best.is_none_or(|(t, _)| st.term > t) {
                    best = Some((st.term, id));
                }
            }
        }
        best.map(|(_, id)| id)
    }

    /// Waits for a leader.
    pub async fn wait_for_leader(&self, wait: Duration) -> Result<u64, DbError> {
        let started = Instant::now();
        loop {
            if let Some(l) = self.leader().await {
                return Ok(l);
            }
            if started.elapsed() > wait {
                return Err(DbError::Substrate(format!(
                    "no leader within {} s",
                    wait.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Copies every node's log into `dir` as `n<ID>.log`.
    pub fn copy_logs(&self, dir: &Path) {
        for id in self.node_ids() {
            if let Ok(p) = self.log_path(id) {
                let _ = std::fs::copy(&p, dir.join(format!("n{id}.log")));
            }
        }
    }

    /// Stops everything and removes what the substrate created.
    pub fn teardown(&self) {
        self.inner.teardown()
    }
}

/// Writes `spec` into node `id`'s libfaketime file atomically (temporary file + rename), so that
/// libfaketime never reads half a spec.
fn write_clock_file(dir: &Path, id: u64, spec: &str) -> Result<(), DbError> {
    let path = dir.join(format!("n{id}.faketime"));
    let tmp = dir.join(format!(".n{id}.faketime.tmp"));
    std::fs::write(&tmp, format!("{spec}\n"))
        .and_then(|()| std::fs::rename(&tmp, &path))
        .map_err(|e| DbError::Substrate(format!("writing clock file {}: {e}", path.display())))
}

/// `path` made absolute (nodes may run in another working directory).
fn absolute(path: &Path) -> Result<PathBuf, DbError> {
    std::path::absolute(path).map_err(|e| DbError::Substrate(format!("{}: {e}", path.display())))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn clock_files_are_replaced_whole() {
        let dir = tempfile::tempdir().unwrap();
        write_clock_file(dir.path(), 2, "+5s").unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("n2.faketime")).unwrap(),
            "+5s\n"
        );
        write_clock_file(dir.path(), 2, CLOCK_NO_SKEW).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("n2.faketime")).unwrap(),
            "+0\n"
        );
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("n2.faketime")],
            "temporary file left"
        );
        assert!(write_clock_file(&dir.path().join("missing"), 1, "+1s").is_err());
    }
}
