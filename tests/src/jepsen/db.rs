//! Jepsen's `db`: a three-node cluster on a substrate, with the process and network faults the
//! nemeses need. `local` reuses the cluster fixture ([`crate::fixture::Cluster`], loopback
//! processes: kill and pause only); `netns` is [`NetnsCluster`] (namespaces, partitions).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::fixture::{Binaries, Cluster, ClusterOptions};
use crate::jepsen::netns::NetnsCluster;

/// Substrate names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SubstrateKind {
    /// Each node in its own network namespace (root, iptables).
    Netns,
    /// Loopback processes (kill and pause only).
    Local,
}

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

enum Inner {
    Local(Cluster),
    Netns(NetnsCluster),
}

/// The cluster under test.
pub struct Db {
    inner: Inner,
    /// Current member ids (membership changes replace ids).
    members: Mutex<Vec<u64>>,
    next_id: Mutex<u64>,
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
    /// Folder for node data and logs (netns); the local fixture uses its own temporary folder.
    pub dir: PathBuf,
}

impl Db {
    /// Sets up the cluster and waits (up to `wait`) for a leader.
    pub async fn start(options: &DbOptions, wait: Duration) -> Result<Db, DbError> {
        let inner = match options.substrate {
            SubstrateKind::Local => {
                let cluster = Cluster::start(ClusterOptions {
                    nodes: options.nodes as usize,
                    extra_args: options.node_args.clone(),
                    wait_timeout: wait,
                    ..Default::default()
                })
                .await
                .map_err(sub)?;
                Inner::Local(cluster)
            }
            SubstrateKind::Netns => {
                crate::jepsen::netns::available().map_err(DbError::Unsupported)?;
                let bins = Binaries::try_locate().map_err(sub)?;
                let dir = options.dir.clone();
                let args = options.node_args.clone();
                let n = options.nodes;
                let cluster =
                    tokio::task::spawn_blocking(move || NetnsCluster::start(n, &dir, &bins.node, args))
                        .await
                        .map_err(sub)?
                        .map_err(sub)?;
                Inner::Netns(cluster)
            }
        };
        let db = Db {
            inner,
            members: Mutex::new((1..=options.nodes).collect()),
            next_id: Mutex::new(options.nodes + 1),
        };
        db.wait_for_leader(wait).await?;
        Ok(db)
    }

    /// The substrate in use.
    pub fn substrate(&self) -> SubstrateKind {
        match self.inner {
            Inner::Local(_) => SubstrateKind::Local,
            Inner::Netns(_) => SubstrateKind::Netns,
        }
    }

    /// Current member ids.
    pub fn members(&self) -> Vec<u64> {
        self.members.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Client endpoint of node `id`.
    pub fn endpoint(&self, id: u64) -> Result<String, DbError> {
        match &self.inner {
            Inner::Local(c) => c.endpoint(id).map_err(sub),
            Inner::Netns(c) => c.endpoint(id).map_err(sub),
        }
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
        match &self.inner {
            Inner::Local(c) => c.data_dir(id).map_err(sub),
            Inner::Netns(c) => c.data_dir(id).map_err(sub),
        }
    }

    /// Log file of node `id`.
    pub fn log_path(&self, id: u64) -> Result<PathBuf, DbError> {
        match &self.inner {
            Inner::Local(c) => c.node(id).map(|n| n.log_path).map_err(sub),
            Inner::Netns(c) => c.log_path(id).map_err(sub),
        }
    }

    /// SIGKILL node `id`.
    pub fn kill(&self, id: u64) -> Result<(), DbError> {
        match &self.inner {
            Inner::Local(c) => {
                if c.is_paused(id) {
                    let _ = c.resume(id);
                }
                c.kill(id).map_err(sub)
            }
            Inner::Netns(c) => c.kill(id).map_err(sub),
        }
    }

    /// Start node `id` again on its data dir.
    pub fn restart(&self, id: u64) -> Result<(), DbError> {
        match &self.inner {
            Inner::Local(c) => c.restart(id).map_err(sub),
            Inner::Netns(c) => c.restart(id).map_err(sub),
        }
    }

    /// Whether node `id` runs.
    pub fn is_running(&self, id: u64) -> bool {
        match &self.inner {
            Inner::Local(c) => c.is_running(id),
            Inner::Netns(c) => c.is_running(id),
        }
    }

    /// SIGSTOP node `id`.
    pub fn pause(&self, id: u64) -> Result<(), DbError> {
        match &self.inner {
            Inner::Local(c) => c.pause(id).map_err(sub),
            Inner::Netns(c) => c.pause(id).map_err(sub),
        }
    }

    /// SIGCONT node `id`.
    pub fn resume(&self, id: u64) -> Result<(), DbError> {
        match &self.inner {
            Inner::Local(c) => c.resume(id).map_err(sub),
            Inner::Netns(c) => c.resume(id).map_err(sub),
        }
    }

    /// Network partition into `groups` (netns only).
    pub fn partition(&self, groups: &[Vec<u64>]) -> Result<(), DbError> {
        match &self.inner {
            Inner::Local(_) => Err(DbError::Unsupported("partitions need the netns substrate".into())),
            Inner::Netns(c) => c.partition(groups).map_err(sub),
        }
    }

    /// Removes every partition (no-op on local).
    pub fn heal(&self) -> Result<(), DbError> {
        match &self.inner {
            Inner::Local(_) => Ok(()),
            Inner::Netns(c) => c.heal().map_err(sub),
        }
    }

    /// Deletes the data dir of stopped node `id`.
    pub fn wipe(&self, id: u64) -> Result<(), DbError> {
        match &self.inner {
            Inner::Local(c) => c.wipe(id).map_err(sub),
            Inner::Netns(c) => c.wipe(id).map_err(sub),
        }
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
        match &self.inner {
            Inner::Local(c) => {
                let info = c.add_node(id).map_err(sub)?;
                Ok((id, info.client_addr, info.peer_addr))
            }
            Inner::Netns(c) => {
                c.add_node(id).map_err(sub)?;
                Ok((
                    id,
                    c.endpoint(id).map_err(sub)?,
                    c.peer_endpoint(id).map_err(sub)?,
                ))
            }
        }
    }

    /// Replaces member `old` by `new` in the member list.
    pub fn replace_member(&self, old: u64, new: u64) {
        let mut m = self.members.lock().unwrap_or_else(|e| e.into_inner());
        m.retain(|&x| x != old);
        m.push(new);
    }

    /// The leader, if a node claims it now (the highest term wins).
    pub async fn leader(&self) -> Option<u64> {
        let mut best: Option<(u64, u64)> = None;
        for id in self.members() {
            let Ok(ep) = self.endpoint(id) else { continue };
            if let Ok(st) = status(&ep, false, Duration::from_secs(2)).await {
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
        let ids: Vec<u64> = match &self.inner {
            Inner::Local(c) => c.ids(),
            Inner::Netns(c) => c.ids(),
        };
        for id in ids {
            if let Ok(p) = self.log_path(id) {
                let _ = std::fs::copy(&p, dir.join(format!("n{id}.log")));
            }
        }
    }

    /// Stops everything and removes what the substrate created.
    pub fn teardown(&self) {
        match &self.inner {
            Inner::Local(c) => {
                for id in c.ids() {
                    if c.is_paused(id) {
                        let _ = c.resume(id);
                    }
                    if c.is_running(id) {
                        let _ = c.kill(id);
                    }
                }
            }
            Inner::Netns(c) => c.teardown(),
        }
    }
}

/// `Cluster.Status` of one endpoint through a one-endpoint client, bounded by `timeout`.
pub async fn status(
    endpoint: &str,
    with_digest: bool,
    timeout: Duration,
) -> Result<ftkv_client::NodeStatus, String> {
    let fut = async {
        let client = ftkv_client::Client::builder()
            .endpoints([endpoint.to_string()])
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
