//! ftkv as a benchmark target: `ftkv-node playground` started as a child process (three node
//! processes on loopback, `log.sync = "always"`), driven through `ftkv-client`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// A running playground. Dropping it stops it.
pub struct FtkvCluster {
    child: Child,
    /// Client endpoints.
    pub endpoints: Vec<String>,
    dir: tempfile::TempDir,
}

/// Finds `ftkv-node`: in `bin_dir` when given (a target `ftkv@DIR`), else in env
/// `FTKV_BIN_DIR`, else beside this executable.
pub fn node_binary(bin_dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    let dir = match (bin_dir, std::env::var("FTKV_BIN_DIR")) {
        (Some(d), _) => d.to_path_buf(),
        (None, Ok(d)) => PathBuf::from(d),
        (None, Err(_)) => std::env::current_exe()?
            .parent()
            .context("executable has no directory")?
            .to_path_buf(),
    };
    let p = dir.join("ftkv-node");
    anyhow::ensure!(
        p.is_file(),
        "{} not found: run `cargo build --release --workspace --bins` first",
        p.display()
    );
    Ok(p)
}

impl FtkvCluster {
    /// Starts a three-node playground on `base_port` with `engine` and extra node flags, from
    /// the `ftkv-node` in `bin_dir` (see [`node_binary`]).
    pub async fn start(
        base_port: u16,
        engine: &str,
        node_args: &[String],
        bin_dir: Option<&Path>,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("ftkv-bench-").tempdir()?;
        let log = std::fs::File::create(dir.path().join("playground.log"))?;
        let mut cmd = Command::new(node_binary(bin_dir)?);
        cmd.arg("playground")
            .arg(format!("--dir={}", dir.path().display()))
            .arg(format!("--base-port={base_port}"))
            .arg(format!("--engine={engine}"));
        for a in node_args {
            cmd.arg(format!("--node-arg={a}"));
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let endpoints_file = dir.path().join("endpoints");
        let deadline = Instant::now() + Duration::from_secs(120);
        let endpoints = loop {
            if let Ok(text) = std::fs::read_to_string(&endpoints_file) {
                if !text.trim().is_empty() {
                    break text.trim().split(',').map(str::to_string).collect::<Vec<_>>();
                }
            }
            anyhow::ensure!(Instant::now() < deadline, "ftkv playground not ready after 120 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        Ok(Self {
            child,
            endpoints,
            dir,
        })
    }

    /// The playground's directory: `node-i` data dirs (engine file under `engine`, Raft log
    /// under `log`), `node-i.log` node logs, `playground.log`, `endpoints`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Process id of the playground process (the node processes are its children).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A client over every endpoint.
    pub async fn client(&self) -> anyhow::Result<ftkv_client::Client> {
        Ok(ftkv_client::Client::builder()
            .endpoints(self.endpoints.clone())
            .build()
            .await?)
    }
}

/// Leaves `count` idle client sessions in the cluster's session table: one put each (key
/// `idle/N`) under its own client id, 64 in flight, sent to the leader. The load that follows
/// then runs beside a table of that many clients, as a node serving many short-lived clients
/// holds (up to `MAX_CLIENTS` = 4096 and as many tombstones).
pub async fn seed_idle_sessions(endpoints: &[String], count: u64) -> anyhow::Result<()> {
    use ftkv_proto::v1::kv_client::KvClient;
    use ftkv_proto::v1::{PutRequest, Session};
    if count == 0 {
        return Ok(());
    }
    let put = |i: u64| PutRequest {
        key: format!("idle/{i}").into_bytes(),
        value: b"x".to_vec(),
        session: Some(Session {
            client_id: 0x1d1e_0000_0000 + i,
            sequence: 1,
            first_incomplete: 1,
        }),
    };
    // The leader is the endpoint that takes a write (followers answer NOT_LEADER).
    let deadline = Instant::now() + Duration::from_secs(60);
    let leader = 'found: loop {
        for e in endpoints {
            if let Ok(mut kv) = KvClient::connect(format!("http://{e}")).await {
                if kv.put(put(0)).await.is_ok() {
                    break 'found kv;
                }
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no leader took the idle-session writes"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut pending = tokio::task::JoinSet::new();
    for i in 1..count {
        if pending.len() >= 64 {
            if let Some(done) = pending.join_next().await {
                done??;
            }
        }
        let mut kv = leader.clone();
        let request = put(i);
        pending.spawn(async move { kv.put(request).await.map(|_| ()) });
    }
    while let Some(done) = pending.join_next().await {
        done??;
    }
    Ok(())
}

impl FtkvCluster {
    /// Stops the playground (SIGTERM: each node syncs its log and checkpoints its engine before
    /// it exits; SIGKILL after 15 s) and keeps its directory until the cluster is dropped, so
    /// the data dirs can be measured at rest. Returns whether it stopped within the 15 s.
    pub fn stop(&mut self) -> bool {
        if let Ok(Some(_)) = self.child.try_wait() {
            return true;
        }
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for FtkvCluster {
    fn drop(&mut self) {
        self.stop();
    }
}
