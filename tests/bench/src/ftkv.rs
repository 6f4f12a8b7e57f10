//! ftkv as a benchmark target: `ftkv-node playground` started as a child process (three node
//! processes on loopback, `log.sync = "always"`), driven through `ftkv-client`.
//!
//! [`Security`] turns on what a secured deployment runs: `tls` starts the playground with
//! `--tls` (every port on TLS, client-cert auth, authenticated peers; certificates in
//! `DIR/tls`) and the client connects with the CA and the client certificate; `auth` then
//! creates `root` and the user [`BENCH_USER`] with READWRITE on the bench's keys
//! ([`BENCH_PREFIX`]), enables auth, and the client authenticates as that user (a token on every
//! call, each put checked against the user's permissions). Target names: `ftkv-tls`,
//! `ftkv-auth`, `ftkv-tls-auth` ([`parse_target_kind`]).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// The user the bench's client authenticates as under auth.
pub const BENCH_USER: &str = "bench";
/// Every bench key starts with it (`bench/000000012345`).
pub const BENCH_PREFIX: &[u8] = b"bench/";
const BENCH_ROLE: &str = "bench-readwrite";
const BENCH_PASSWORD: &str = "bench-password";
const ROOT_PASSWORD: &str = "root-password";

/// TLS and auth of a benchmark cluster.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Security {
    /// TLS on every port, client-cert auth, authenticated peers.
    pub tls: bool,
    /// Users, roles and tokens.
    pub auth: bool,
}

/// The engine and security of an ftkv target kind (the name before any `@DIR`): `ftkv`,
/// `ftkv-sled`, `ftkv-tls`, `ftkv-auth`, `ftkv-tls-auth`, `ftkv-sled-tls`, ...; `None` when
/// it is not an ftkv target.
pub fn parse_target_kind(kind: &str) -> Option<(&'static str, Security)> {
    let mut rest = kind.strip_prefix("ftkv")?;
    let mut engine = "fractal";
    let mut security = Security::default();
    if let Some(r) = rest.strip_prefix("-sled") {
        engine = "sled";
        rest = r;
    }
    if let Some(r) = rest.strip_prefix("-tls") {
        security.tls = true;
        rest = r;
    }
    if let Some(r) = rest.strip_prefix("-auth") {
        security.auth = true;
        rest = r;
    }
    rest.is_empty().then_some((engine, security))
}

/// A running playground. Dropping it stops it.
pub struct FtkvCluster {
    child: Child,
    /// Client endpoints.
    pub endpoints: Vec<String>,
    dir: tempfile::TempDir,
    security: Security,
    tls: Option<ftkv_client::TlsOptions>,
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
        Self::start_secured(base_port, engine, node_args, bin_dir, Security::default()).await
    }

    /// [`FtkvCluster::start`] with `security` on (see the module docs); with auth, returns once
    /// auth is enabled.
    pub async fn start_secured(
        base_port: u16,
        engine: &str,
        node_args: &[String],
        bin_dir: Option<&Path>,
        security: Security,
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("ftkv-bench-").tempdir()?;
        let log = std::fs::File::create(dir.path().join("playground.log"))?;
        let mut cmd = Command::new(node_binary(bin_dir)?);
        cmd.arg("playground")
            .arg(format!("--dir={}", dir.path().display()))
            .arg(format!("--base-port={base_port}"))
            .arg(format!("--engine={engine}"));
        if security.tls {
            cmd.arg("--tls");
        }
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
        let tls = if security.tls {
            let t = dir.path().join("tls");
            Some(
                ftkv_client::TlsOptions::with_ca_file(&t.join("ca.pem"))?
                    .identity_files(&t.join("client.pem"), &t.join("client-key.pem"))?,
            )
        } else {
            None
        };
        let cluster = Self {
            child,
            endpoints,
            dir,
            security,
            tls,
        };
        if security.auth {
            cluster.enable_auth().await?;
        }
        Ok(cluster)
    }

    /// A client builder with the cluster's TLS settings (no user).
    fn builder(&self) -> ftkv_client::ClientBuilder {
        let b = ftkv_client::Client::builder().endpoints(self.endpoints.clone());
        match &self.tls {
            Some(t) => b.tls(t.clone()),
            None => b,
        }
    }

    /// Creates `root` and [`BENCH_USER`] (READWRITE on [`BENCH_PREFIX`]) and enables auth.
    async fn enable_auth(&self) -> anyhow::Result<()> {
        let admin = self.builder().build().await?;
        admin.user_add("root", ROOT_PASSWORD).await?;
        admin.role_add("root").await?;
        admin.user_grant_role("root", "root").await?;
        admin.user_add(BENCH_USER, BENCH_PASSWORD).await?;
        admin.role_add(BENCH_ROLE).await?;
        admin
            .role_grant_permission(
                BENCH_ROLE,
                ftkv_client::Permission {
                    perm_type: ftkv_client::PermType::ReadWrite,
                    key: BENCH_PREFIX.to_vec(),
                    range_end: ftkv_client::prefix_end(BENCH_PREFIX),
                },
            )
            .await?;
        admin.user_grant_role(BENCH_USER, BENCH_ROLE).await?;
        admin.auth_enable().await?;
        // Auth is on: a client without a token is refused.
        let refused = admin.put(b"bench/probe".to_vec(), b"x".to_vec()).await;
        anyhow::ensure!(
            matches!(refused, Err(ftkv_client::Error::Unauthenticated { .. })),
            "auth enabled, yet a put without a token got {refused:?}"
        );
        Ok(())
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

    /// A client over every endpoint (TLS and the bench user when the cluster has them).
    pub async fn client(&self) -> anyhow::Result<ftkv_client::Client> {
        let b = self.builder();
        let b = if self.security.auth {
            b.user(BENCH_USER, BENCH_PASSWORD)
        } else {
            b
        };
        Ok(b.build().await?)
    }

    /// A client as `root` (digest status, admin calls), or without a user when auth is off.
    pub async fn root_client(&self) -> anyhow::Result<ftkv_client::Client> {
        let b = self.builder();
        let b = if self.security.auth {
            b.user("root", ROOT_PASSWORD)
        } else {
            b
        };
        Ok(b.build().await?)
    }

    /// TLS and auth of this cluster.
    pub fn security(&self) -> Security {
        self.security
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_kinds_name_engine_and_security() {
        let plain = Security::default();
        let tls = Security {
            tls: true,
            auth: false,
        };
        let both = Security {
            tls: true,
            auth: true,
        };
        assert_eq!(parse_target_kind("ftkv"), Some(("fractal", plain)));
        assert_eq!(parse_target_kind("ftkv-sled"), Some(("sled", plain)));
        assert_eq!(parse_target_kind("ftkv-tls"), Some(("fractal", tls)));
        assert_eq!(parse_target_kind("ftkv-tls-auth"), Some(("fractal", both)));
        assert_eq!(
            parse_target_kind("ftkv-auth"),
            Some((
                "fractal",
                Security {
                    tls: false,
                    auth: true
                }
            ))
        );
        assert_eq!(parse_target_kind("ftkv-sled-tls-auth"), Some(("sled", both)));
        for bad in ["etcd", "ftkv-auth-tls", "ftkv-tl", "ftkvx", "ftkv-tls-"] {
            assert_eq!(parse_target_kind(bad), None, "{bad}");
        }
    }
}
