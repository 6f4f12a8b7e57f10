//! TLS and auth for a run (`ftkv-jepsen test --tls --auth`): the cluster under test with its
//! security on, as a deployment runs it.
//!
//! - `tls`: a throwaway CA and certificates from the node's own generator (`ftkv-node certs`,
//!   into `<run>/nodes/tls/`), node certificates naming `ftkv-node-<id>` (the peer identity) and
//!   the host each node listens on; every node runs with client TLS, client-cert auth and peer
//!   TLS (`FTKV_CERT_FILE`, `FTKV_CLIENT_CERT_AUTH`, `FTKV_PEER_*`), and every harness client
//!   (workers, status probes, the nemesis's admin calls) connects over TLS with the client
//!   certificate.
//! - `auth`: once a leader exists, the users `root` (role `root`) and [`WORKLOAD_USER`] (role
//!   [`WORKLOAD_ROLE`]: READWRITE on the workloads' prefix [`WORKLOAD_PREFIX`] only) are
//!   created with random passwords and auth is enabled; the workers authenticate as
//!   [`WORKLOAD_USER`] (tokens through [`ftkv_client::ClientBuilder::user`]), membership changes
//!   and digest reads as `root`. Tokens live `token_ttl_ms` (default
//!   [`DEFAULT_TOKEN_TTL_MS`], short so that runs renew them and see expired ones refused while
//!   faults hold requests back).
//!
//! Error classification stays the client's: an `UNAUTHENTICATED` answer carries the node's
//! `ErrorInfo` (refused before anything was proposed: not applied), the client authenticates
//! again once and retries, and a write that may have applied in an earlier attempt ends
//! [`ftkv_client::Error::Ambiguous`] whatever the last answer (`info` in the history), so
//! `fail` stays "certainly not applied".

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use rand::Rng;
use serde::{Deserialize, Serialize};

use crate::fixture::FixtureTls;

/// The user the workload's clients authenticate as.
pub const WORKLOAD_USER: &str = "jepsen";
/// Its role: READWRITE on [`WORKLOAD_PREFIX`].
pub const WORKLOAD_ROLE: &str = "jepsen-readwrite";
/// Every workload key starts with it ([`crate::jepsen::workload::key_bytes`]).
pub const WORKLOAD_PREFIX: &[u8] = b"jepsen/";
/// Token lifetime of `--auth` runs unless `--token-ttl` says otherwise, ms.
pub const DEFAULT_TOKEN_TTL_MS: u64 = 10_000;
/// Node certificates issued beyond the initial nodes (ids the membership nemesis adds).
pub const SPARE_NODE_CERTS: u64 = 32;

/// Security settings of a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityOptions {
    /// TLS on every port with client-cert auth, peers authenticated by certificate.
    pub tls: bool,
    /// Users, roles and tokens: auth enabled, clients authenticate.
    pub auth: bool,
    /// `auth.token_ttl_ms` of every node with `auth` (`None`: [`DEFAULT_TOKEN_TTL_MS`]).
    pub token_ttl_ms: Option<u64>,
}

impl SecurityOptions {
    /// Whether anything is on.
    pub fn any(&self) -> bool {
        self.tls || self.auth
    }

    /// The `ftkv-jepsen test` flags that select these settings (empty when off).
    pub fn flags(&self) -> String {
        let mut s = String::new();
        if self.tls {
            s.push_str(" --tls");
        }
        if self.auth {
            s.push_str(" --auth");
        }
        if let Some(ms) = self.token_ttl_ms {
            s.push_str(&format!(" --token-ttl {ms}ms"));
        }
        s
    }
}

/// A security setup error (the run fails with exit 2).
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// `ftkv-node certs` failed or its files are unreadable.
    #[error("certificates: {0}")]
    Certs(String),
    /// Creating the users and roles or enabling auth failed.
    #[error("enabling auth: {0}")]
    Auth(String),
}

/// The security of one run: node environment, client settings, credentials.
pub struct Security {
    options: SecurityOptions,
    tls_dir: PathBuf,
    client_tls: Option<ftkv_client::TlsOptions>,
    fixture_tls: Option<FixtureTls>,
    root_password: String,
    user_password: String,
    /// Root's client for calls that need the role `root` (digests), built once.
    root_client: tokio::sync::OnceCell<ftkv_client::Client>,
}

impl std::fmt::Debug for Security {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Security")
            .field("options", &self.options)
            .field("tls_dir", &self.tls_dir)
            .finish_non_exhaustive()
    }
}

fn password() -> String {
    let mut rng = rand::thread_rng();
    (0..24).map(|_| format!("{:x}", rng.gen_range(0..16u8))).collect()
}

impl Security {
    /// Settings whose certificates (with `tls`) go into `tls_dir` once
    /// [`Security::generate_certs`] ran.
    pub fn new(options: SecurityOptions, tls_dir: &Path) -> Self {
        Security {
            options,
            tls_dir: tls_dir.to_path_buf(),
            client_tls: None,
            fixture_tls: None,
            root_password: password(),
            user_password: password(),
            root_client: tokio::sync::OnceCell::new(),
        }
    }

    /// No TLS, no auth.
    pub fn off() -> Self {
        Self::new(SecurityOptions::default(), Path::new("."))
    }

    /// The settings.
    pub fn options(&self) -> SecurityOptions {
        self.options
    }

    /// Environment of every node (`{id}` is the node id): the TLS files and flags, the token TTL.
    pub fn node_env(&self) -> Vec<(String, String)> {
        let mut env = Vec::new();
        if self.options.tls {
            let p = |name: &str| self.tls_dir.join(name).display().to_string();
            env.extend([
                ("FTKV_CERT_FILE".to_string(), p("node-{id}.pem")),
                ("FTKV_KEY_FILE".to_string(), p("node-{id}-key.pem")),
                ("FTKV_TRUSTED_CA_FILE".to_string(), p("ca.pem")),
                ("FTKV_CLIENT_CERT_AUTH".to_string(), "true".to_string()),
                ("FTKV_PEER_CERT_FILE".to_string(), p("node-{id}.pem")),
                ("FTKV_PEER_KEY_FILE".to_string(), p("node-{id}-key.pem")),
                ("FTKV_PEER_TRUSTED_CA_FILE".to_string(), p("ca.pem")),
            ]);
        }
        if self.options.auth {
            env.push((
                "FTKV_AUTH_TOKEN_TTL_MS".to_string(),
                self.options
                    .token_ttl_ms
                    .unwrap_or(DEFAULT_TOKEN_TTL_MS)
                    .to_string(),
            ));
        }
        env
    }

    /// With `tls`: runs `node_bin certs` for node ids `1..=nodes + SPARE_NODE_CERTS`, each
    /// certificate also naming `host_pattern` with `{id}` replaced (the node's listen address;
    /// `127.0.0.1` is always named), and loads the client certificate. A no-op without `tls`.
    pub fn generate_certs(
        &mut self,
        node_bin: &Path,
        nodes: u64,
        host_pattern: Option<&str>,
    ) -> Result<(), SecurityError> {
        if !self.options.tls {
            return Ok(());
        }
        let mut cmd = Command::new(node_bin);
        cmd.arg("certs")
            .arg("--dir")
            .arg(&self.tls_dir)
            .arg("--nodes")
            .arg((nodes + SPARE_NODE_CERTS).to_string());
        if let Some(h) = host_pattern {
            cmd.arg("--host").arg(h);
        }
        let out = cmd
            .stdin(Stdio::null())
            .output()
            .map_err(|e| SecurityError::Certs(format!("running {} certs: {e}", node_bin.display())))?;
        if !out.status.success() {
            return Err(SecurityError::Certs(format!(
                "{} certs exited with {}: {}",
                node_bin.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        let read = |name: &str| {
            let p = self.tls_dir.join(name);
            std::fs::read_to_string(&p).map_err(|e| SecurityError::Certs(format!("{}: {e}", p.display())))
        };
        let (ca, cert, key) = (read("ca.pem")?, read("client.pem")?, read("client-key.pem")?);
        self.client_tls =
            Some(ftkv_client::TlsOptions::with_ca_pem(ca.clone()).identity_pem(cert.clone(), key.clone()));
        self.fixture_tls = Some(FixtureTls {
            ca_pem: ca,
            identity: Some((cert, key)),
        });
        Ok(())
    }

    /// The fixture's TLS (local substrate), once certificates exist.
    pub fn fixture_tls(&self) -> Option<FixtureTls> {
        self.fixture_tls.clone()
    }

    fn base_builder(&self, endpoints: Vec<String>) -> ftkv_client::ClientBuilder {
        let builder = ftkv_client::Client::builder().endpoints(endpoints);
        match &self.client_tls {
            Some(tls) => builder.tls(tls.clone()),
            None => builder,
        }
    }

    /// A client builder for the workload: TLS with the client certificate, and with `auth` the
    /// workload user.
    pub fn client_builder(&self, endpoints: Vec<String>) -> ftkv_client::ClientBuilder {
        let builder = self.base_builder(endpoints);
        if self.options.auth {
            builder.user(WORKLOAD_USER, self.user_password.clone())
        } else {
            builder
        }
    }

    /// A client builder for calls that need no user (`Cluster.Status` without digest,
    /// `Members`): TLS only, so no password hash per probe.
    pub fn anonymous_builder(&self, endpoints: Vec<String>) -> ftkv_client::ClientBuilder {
        self.base_builder(endpoints)
    }

    /// A client builder as `root` (membership changes, digests).
    pub fn admin_builder(&self, endpoints: Vec<String>) -> ftkv_client::ClientBuilder {
        let builder = self.base_builder(endpoints);
        if self.options.auth {
            builder.user("root", self.root_password.clone())
        } else {
            builder
        }
    }

    /// Root's long-lived client (one token, renewed by the client), for calls that need the
    /// role `root` often.
    pub async fn root_client(&self, endpoints: &[String]) -> Result<&ftkv_client::Client, String> {
        self.root_client
            .get_or_try_init(|| async {
                self.admin_builder(endpoints.to_vec())
                    .connect_timeout(Duration::from_secs(2))
                    .request_timeout(Duration::from_secs(10))
                    .retry(ftkv_client::RetryPolicy::no_retry(Duration::from_secs(10)))
                    .build()
                    .await
                    .map_err(|e| e.to_string())
            })
            .await
    }

    /// With `auth`: creates `root` and the workload user and role, then enables auth, retrying
    /// each step until `deadline` (a step answered "already exists" after a lost answer counts
    /// as done). A no-op without `auth`.
    pub async fn enable_auth(&self, endpoints: &[String], deadline: Duration) -> Result<(), SecurityError> {
        if !self.options.auth {
            return Ok(());
        }
        let started = std::time::Instant::now();
        let admin = self
            .base_builder(endpoints.to_vec())
            .connect_timeout(Duration::from_secs(2))
            .request_timeout(Duration::from_secs(10))
            .build()
            .await
            .map_err(|e| SecurityError::Auth(e.to_string()))?;
        let permission = ftkv_client::Permission {
            perm_type: ftkv_client::PermType::ReadWrite,
            key: WORKLOAD_PREFIX.to_vec(),
            range_end: ftkv_client::prefix_end(WORKLOAD_PREFIX),
        };
        let steps: [(&str, Step<'_>); 6] = [
            ("user add root", Step::UserAdd("root", &self.root_password)),
            ("role add root", Step::RoleAdd("root")),
            ("user grant-role root root", Step::Grant("root", "root")),
            (
                "user add jepsen",
                Step::UserAdd(WORKLOAD_USER, &self.user_password),
            ),
            ("role add jepsen-readwrite", Step::RoleAdd(WORKLOAD_ROLE)),
            (
                "user grant-role jepsen jepsen-readwrite",
                Step::Grant(WORKLOAD_USER, WORKLOAD_ROLE),
            ),
        ];
        for (what, step) in &steps {
            loop {
                let result = match step {
                    Step::UserAdd(u, p) => admin.user_add(u, p).await,
                    Step::RoleAdd(r) => admin.role_add(r).await,
                    Step::Grant(u, r) => admin.user_grant_role(u, r).await,
                };
                match result {
                    Ok(()) => break,
                    Err(e) if e.to_string().contains("already") => break,
                    Err(e) if started.elapsed() < deadline => {
                        tracing::warn!("auth setup: {what}: {e}; retrying");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => return Err(SecurityError::Auth(format!("{what}: {e}"))),
                }
            }
        }
        loop {
            let result = admin
                .role_grant_permission(WORKLOAD_ROLE, permission.clone())
                .await;
            match result {
                Ok(()) => break,
                Err(e) if started.elapsed() < deadline => {
                    tracing::warn!("auth setup: grant permission: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(SecurityError::Auth(format!("role grant-permission: {e}"))),
            }
        }
        loop {
            // Once enabled, this client (no user) is refused: check as root.
            match admin.auth_enable().await {
                Ok(()) => break,
                Err(e) if started.elapsed() < deadline => {
                    let root = self
                        .admin_builder(endpoints.to_vec())
                        .build()
                        .await
                        .map_err(|e| SecurityError::Auth(e.to_string()));
                    if let Ok(root) = root {
                        if root.auth_status().await.is_ok_and(|s| s.enabled) {
                            break;
                        }
                    }
                    tracing::warn!("auth setup: auth enable: {e}; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(SecurityError::Auth(format!("auth enable: {e}"))),
            }
        }
        Ok(())
    }
}

enum Step<'a> {
    UserAdd(&'a str, &'a str),
    RoleAdd(&'a str),
    Grant(&'a str, &'a str),
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn node_environment_follows_the_options() {
        let dir = Path::new("/tmp/x/tls");
        assert!(Security::off().node_env().is_empty());
        let tls = Security::new(
            SecurityOptions {
                tls: true,
                ..Default::default()
            },
            dir,
        );
        let env = tls.node_env();
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("FTKV_CERT_FILE").unwrap(), "/tmp/x/tls/node-{id}.pem");
        assert_eq!(get("FTKV_PEER_TRUSTED_CA_FILE").unwrap(), "/tmp/x/tls/ca.pem");
        assert_eq!(get("FTKV_CLIENT_CERT_AUTH").unwrap(), "true");
        assert_eq!(get("FTKV_AUTH_TOKEN_TTL_MS"), None);
        let auth = Security::new(
            SecurityOptions {
                auth: true,
                token_ttl_ms: Some(4000),
                ..Default::default()
            },
            dir,
        );
        assert_eq!(
            auth.node_env(),
            vec![("FTKV_AUTH_TOKEN_TTL_MS".to_string(), "4000".to_string())]
        );
        assert_ne!(auth.root_password, auth.user_password);
        assert_eq!(auth.root_password.len(), 24);
    }

    #[test]
    fn flags_replay_the_options() {
        assert_eq!(SecurityOptions::default().flags(), "");
        let o = SecurityOptions {
            tls: true,
            auth: true,
            token_ttl_ms: Some(5000),
        };
        assert_eq!(o.flags(), " --tls --auth --token-ttl 5000ms");
        assert!(o.any() && !SecurityOptions::default().any());
    }

    #[test]
    fn the_workload_prefix_covers_every_workload_key() {
        use crate::jepsen::workload::{key_bytes, WorkloadKind};
        for kind in [
            WorkloadKind::Register,
            WorkloadKind::Set,
            WorkloadKind::Counter,
            WorkloadKind::Bank,
            WorkloadKind::Append,
            WorkloadKind::Load,
        ] {
            assert!(key_bytes(kind, &serde_json::json!(7)).starts_with(WORKLOAD_PREFIX));
        }
    }
}
