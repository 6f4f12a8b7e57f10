//! `ftkv-node playground --tls`: a throwaway CA and certificates in `DIR/tls/` (kept across
//! restarts on the same `--dir`), every port of every node on TLS with client-cert auth, peers
//! authenticated by their certificates.
//!
//! Files: `ca.pem` (the CA of every port) and `ca-key.pem` (its key, to issue new certificates
//! by hand), `node-<i>.pem` / `node-<i>-key.pem` (CN and DNS SAN
//! `ftkv-node-<i>`, SANs `localhost` and `127.0.0.1`; used on the client, peer and status
//! ports), `client.pem` / `client-key.pem` (CN `ftkvctl`, for ftkvctl and applications).

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::tls::certs::Authority;
use crate::tls::identity::node_name;

/// Where the playground's certificates are.
#[derive(Debug, Clone)]
pub struct PlaygroundTls {
    /// `DIR/tls`.
    pub dir: PathBuf,
    /// The CA certificate.
    pub ca: PathBuf,
    /// The client certificate.
    pub client_cert: PathBuf,
    /// Its key.
    pub client_key: PathBuf,
}

impl PlaygroundTls {
    /// Creates the files for `nodes` nodes under `dir/tls`, unless a CA is already there.
    pub fn prepare(dir: &Path, nodes: u64) -> anyhow::Result<Self> {
        Self::prepare_in(&dir.join("tls"), nodes, &[])
    }

    /// Creates the files for `nodes` nodes in `tls_dir`, unless they are all there already.
    /// Each node certificate names `ftkv-node-<i>` (its identity), `localhost`, `127.0.0.1`
    /// and every pattern of `hosts` with `{id}` replaced by the node id (`ftkv-{id}`: the
    /// Compose service names) and `{ordinal}` by id - 1 (`ftkv-{ordinal}.ftkv-peer`: the
    /// StatefulSet's pods).
    pub fn prepare_in(tls_dir: &Path, nodes: u64, hosts: &[String]) -> anyhow::Result<Self> {
        let tls_dir = tls_dir.to_path_buf();
        let this = Self {
            ca: tls_dir.join("ca.pem"),
            client_cert: tls_dir.join("client.pem"),
            client_key: tls_dir.join("client-key.pem"),
            dir: tls_dir,
        };
        let complete = this.ca.exists()
            && this.client_cert.exists()
            && (1..=nodes).all(|i| this.node_files(i).0.exists() && this.node_files(i).1.exists());
        if complete {
            return Ok(this);
        }
        std::fs::create_dir_all(&this.dir)
            .with_context(|| format!("cannot create {}", this.dir.display()))?;
        let ca = Authority::new("ftkv playground CA")?;
        std::fs::write(&this.ca, ca.cert_pem())
            .with_context(|| format!("cannot write {}", this.ca.display()))?;
        let ca_key = this.dir.join("ca-key.pem");
        std::fs::write(&ca_key, ca.key_pem())
            .with_context(|| format!("cannot write {}", ca_key.display()))?;
        for i in 1..=nodes {
            let name = node_name(i);
            let mut names = vec![name.clone(), "localhost".into(), "127.0.0.1".into()];
            names.extend(hosts.iter().map(|h| {
                h.replace("{id}", &i.to_string())
                    .replace("{ordinal}", &(i - 1).to_string())
            }));
            ca.issue(&name, &names)?.write(&this.dir, &format!("node-{i}"))?;
        }
        ca.issue("ftkvctl", &["ftkvctl".into()])?
            .write(&this.dir, "client")?;
        Ok(this)
    }

    /// Certificate and key of node `id`.
    pub fn node_files(&self, id: u64) -> (PathBuf, PathBuf) {
        (
            self.dir.join(format!("node-{id}.pem")),
            self.dir.join(format!("node-{id}-key.pem")),
        )
    }

    /// The TLS flags of node `id`.
    pub fn node_args(&self, id: u64) -> Vec<String> {
        let (cert, key) = self.node_files(id);
        let ca = self.ca.display();
        vec![
            format!("--cert-file={}", cert.display()),
            format!("--key-file={}", key.display()),
            format!("--trusted-ca-file={ca}"),
            "--client-cert-auth".into(),
            format!("--peer-cert-file={}", cert.display()),
            format!("--peer-key-file={}", key.display()),
            format!("--peer-trusted-ca-file={ca}"),
        ]
    }

    /// `ftkvctl` flags that connect with the client certificate.
    pub fn ctl_flags(&self) -> String {
        format!(
            "--cacert {} --cert {} --key {}",
            self.ca.display(),
            self.client_cert.display(),
            self.client_key.display()
        )
    }

    /// The client library's settings.
    pub fn client_options(&self) -> anyhow::Result<ftkv_client::TlsOptions> {
        Ok(ftkv_client::TlsOptions::with_ca_file(&self.ca)?
            .identity_files(&self.client_cert, &self.client_key)?)
    }

    /// tonic's settings for the raw status calls of the playground.
    pub fn tonic_config(&self) -> anyhow::Result<tonic::transport::ClientTlsConfig> {
        let read = |p: &Path| std::fs::read(p).with_context(|| format!("cannot read {}", p.display()));
        Ok(tonic::transport::ClientTlsConfig::new()
            .ca_certificate(tonic::transport::Certificate::from_pem(read(&self.ca)?))
            .identity(tonic::transport::Identity::from_pem(
                read(&self.client_cert)?,
                read(&self.client_key)?,
            )))
    }
}
