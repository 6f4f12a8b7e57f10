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
    _dir: tempfile::TempDir,
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
            _dir: dir,
        })
    }

    /// A client over every endpoint.
    pub async fn client(&self) -> anyhow::Result<ftkv_client::Client> {
        Ok(ftkv_client::Client::builder()
            .endpoints(self.endpoints.clone())
            .build()
            .await?)
    }
}

impl Drop for FtkvCluster {
    fn drop(&mut self) {
        // SIGTERM lets the playground stop its children; then make sure.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
