//! etcd as a benchmark target: a three-member etcd cluster (the Debian `etcd-server` binary,
//! 3.4) started on loopback in a temp dir, and a client over etcd's gRPC `KV.Put`.
//!
//! Requests go round-robin over the three members, as etcd's own benchmark tool does; followers
//! forward proposals to the leader.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

/// Code generated from `tests/etcd/rpc_subset.proto`.
pub mod pb {
    #![allow(missing_docs, clippy::all)]
    tonic::include_proto!("etcdserverpb");
}

/// A client spreading requests over every member.
#[derive(Clone)]
pub struct EtcdClient {
    kv: Arc<Vec<pb::kv_client::KvClient<tonic::transport::Channel>>>,
    next: Arc<AtomicUsize>,
}

impl EtcdClient {
    /// Connects lazily to `endpoints` (`host:port`).
    pub fn connect(endpoints: &[String]) -> anyhow::Result<Self> {
        let mut kv = Vec::new();
        for e in endpoints {
            let ch = tonic::transport::Endpoint::from_shared(format!("http://{e}"))?
                .timeout(Duration::from_secs(10))
                .connect_lazy();
            kv.push(pb::kv_client::KvClient::new(ch));
        }
        anyhow::ensure!(!kv.is_empty(), "no etcd endpoints");
        Ok(Self {
            kv: Arc::new(kv),
            next: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// One put.
    pub async fn put(&self, key: Vec<u8>, value: Vec<u8>) -> anyhow::Result<()> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.kv.len();
        let mut c = self.kv[i].clone();
        c.put(pb::PutRequest {
            key,
            value,
            lease: 0,
            prev_kv: false,
        })
        .await?;
        Ok(())
    }

    /// One linearizable get.
    pub async fn get(&self, key: Vec<u8>) -> anyhow::Result<Option<Vec<u8>>> {
        let i = self.next.fetch_add(1, Ordering::Relaxed) % self.kv.len();
        let mut c = self.kv[i].clone();
        let r = c
            .range(pb::RangeRequest {
                key,
                ..Default::default()
            })
            .await?
            .into_inner();
        Ok(r.kvs.into_iter().next().map(|kv| kv.value))
    }
}

/// A three-member etcd cluster on loopback. Dropping it kills the members.
pub struct EtcdCluster {
    children: Vec<Child>,
    /// Client endpoints.
    pub endpoints: Vec<String>,
    _dir: tempfile::TempDir,
}

/// Finds the etcd binary (env `ETCD_BIN`, else `etcd` on PATH).
pub fn etcd_binary() -> anyhow::Result<PathBuf> {
    if let Ok(p) = std::env::var("ETCD_BIN") {
        return Ok(PathBuf::from(p));
    }
    for dir in std::env::var("PATH").unwrap_or_default().split(':') {
        let p = Path::new(dir).join("etcd");
        if p.is_file() {
            return Ok(p);
        }
    }
    anyhow::bail!("etcd not found: install it (Debian: apt-get install etcd-server) or set ETCD_BIN")
}

impl EtcdCluster {
    /// Starts three members with client ports `base`, `base+2`, `base+4` (peer = client + 1),
    /// fsync on (etcd's default), and waits until a put succeeds.
    pub async fn start(base_port: u16) -> anyhow::Result<Self> {
        let bin = etcd_binary()?;
        let dir = tempfile::Builder::new().prefix("ftkv-bench-etcd-").tempdir()?;
        let ports: Vec<(u16, u16)> = (0..3)
            .map(|i| (base_port + 2 * i, base_port + 2 * i + 1))
            .collect();
        let initial = ports
            .iter()
            .enumerate()
            .map(|(i, (_, peer))| format!("e{i}=http://127.0.0.1:{peer}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut children = Vec::new();
        for (i, (client, peer)) in ports.iter().enumerate() {
            let log = std::fs::File::create(dir.path().join(format!("etcd-{i}.log")))?;
            let child = Command::new(&bin)
                .arg(format!("--name=e{i}"))
                .arg(format!(
                    "--data-dir={}",
                    dir.path().join(format!("e{i}")).display()
                ))
                .arg(format!("--listen-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--advertise-client-urls=http://127.0.0.1:{client}"))
                .arg(format!("--listen-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer}"))
                .arg(format!("--initial-cluster={initial}"))
                .arg("--initial-cluster-state=new")
                .arg("--initial-cluster-token=ftkv-bench")
                .arg("--quota-backend-bytes=8589934592")
                .arg("--logger=zap")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log)
                .spawn()
                .with_context(|| format!("cannot start {}", bin.display()))?;
            children.push(child);
        }
        let endpoints: Vec<String> = ports.iter().map(|(c, _)| format!("127.0.0.1:{c}")).collect();
        let cluster = Self {
            children,
            endpoints,
            _dir: dir,
        };
        let client = EtcdClient::connect(&cluster.endpoints)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if client.put(b"bench/ready".to_vec(), b"1".to_vec()).await.is_ok() {
                break;
            }
            anyhow::ensure!(Instant::now() < deadline, "etcd cluster not ready after 60 s");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(cluster)
    }
}

impl EtcdCluster {
    /// The cluster's directory: member `i`'s data dir is `e{i}` (`member/snap/db` the bbolt
    /// backend, `member/wal` the write-ahead log), its log `etcd-{i}.log`.
    pub fn dir(&self) -> &Path {
        self._dir.path()
    }

    /// Process ids of the three members.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }
}

impl Drop for EtcdCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
