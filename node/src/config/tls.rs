//! `[tls]`: TLS on the client, peer and status ports, with etcd's option names.
//!
//! - Client TLS (`cert_file` + `key_file`) covers the client gRPC port and the status HTTP
//!   port. `trusted_ca_file` verifies client certificates when a client presents one;
//!   `client_cert_auth` requires one (signed by that CA).
//! - Peer TLS (`peer_cert_file` + `peer_key_file` + `peer_trusted_ca_file`) covers the peer
//!   port and the node's outgoing Raft connections, and always authenticates peers: the other
//!   node must present a certificate signed by the peer CA that names it (`ftkv-node-<id>` as
//!   CN or DNS SAN, see `crate::tls::identity`), optionally one of `peer_cert_allowed_cn`.
//! - `min_version`: `"1.2"` (default) or `"1.3"`. `reload_interval_ms`: how often the files'
//!   modification times are compared (certificates are also reloaded on SIGHUP).
//!
//! Flags and variables are etcd's: `--cert-file` / `FTKV_CERT_FILE`, `--peer-cert-file` /
//! `FTKV_PEER_CERT_FILE`, `--tls-min-version` / `FTKV_TLS_MIN_VERSION`, ...

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{Config, ConfigError};

/// Lowest TLS version a port accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum TlsVersion {
    /// TLS 1.2 and 1.3.
    #[default]
    #[serde(rename = "1.2")]
    Tls12,
    /// TLS 1.3 only.
    #[serde(rename = "1.3")]
    Tls13,
}

impl std::str::FromStr for TlsVersion {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s
            .trim()
            .trim_start_matches("TLS")
            .trim_start_matches("tls")
            .trim()
        {
            "1.2" => Ok(TlsVersion::Tls12),
            "1.3" => Ok(TlsVersion::Tls13),
            _ => Err(format!("{s:?}: expected 1.2 or 1.3")),
        }
    }
}

/// Default period of the certificate files' modification check.
pub const DEFAULT_RELOAD_INTERVAL_MS: u64 = 5_000;

/// `[tls]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// Certificate (PEM, leaf first, then intermediates) of the client and status ports.
    pub cert_file: Option<PathBuf>,
    /// Private key (PEM) of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// CA (PEM) that client certificates must be signed by.
    pub trusted_ca_file: Option<PathBuf>,
    /// Require a client certificate signed by `trusted_ca_file` on the client and status ports.
    pub client_cert_auth: bool,
    /// Certificate (PEM) of the peer port, also this node's client certificate towards peers.
    pub peer_cert_file: Option<PathBuf>,
    /// Private key (PEM) of `peer_cert_file`.
    pub peer_key_file: Option<PathBuf>,
    /// CA (PEM) that peers' certificates (client and server side) must be signed by.
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// Peers are always authenticated when peer TLS is on; `false` is refused then.
    pub peer_client_cert_auth: bool,
    /// When not empty, a peer's certificate must also carry one of these names (CN or DNS SAN).
    pub peer_cert_allowed_cn: Vec<String>,
    /// Lowest TLS version accepted and offered.
    pub min_version: TlsVersion,
    /// Period of the check of the certificate and key files' modification times, ms.
    pub reload_interval_ms: u64,
}

impl Default for TlsConfig {
    fn default() -> Self {
        Self {
            cert_file: None,
            key_file: None,
            trusted_ca_file: None,
            client_cert_auth: false,
            peer_cert_file: None,
            peer_key_file: None,
            peer_trusted_ca_file: None,
            peer_client_cert_auth: true,
            peer_cert_allowed_cn: Vec::new(),
            min_version: TlsVersion::Tls12,
            reload_interval_ms: DEFAULT_RELOAD_INTERVAL_MS,
        }
    }
}

impl TlsConfig {
    /// Whether the client and status ports speak TLS.
    pub fn client_tls(&self) -> bool {
        self.cert_file.is_some()
    }

    /// Whether the peer port and outgoing Raft connections speak TLS.
    pub fn peer_tls(&self) -> bool {
        self.peer_cert_file.is_some()
    }

    /// Checks that the options fit together, then loads every file (PEM that parses, a key
    /// that matches its certificate, CAs that hold a certificate), naming the option and file.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |m: String| Err(ConfigError::Invalid(m));
        if self.cert_file.is_some() != self.key_file.is_some() {
            return invalid("tls.cert_file and tls.key_file (--cert-file, --key-file) go together".into());
        }
        if self.client_cert_auth && self.trusted_ca_file.is_none() {
            return invalid(
                "tls.client_cert_auth (--client-cert-auth) needs tls.trusted_ca_file (--trusted-ca-file): \
                 the CA that client certificates must be signed by"
                    .into(),
            );
        }
        if self.trusted_ca_file.is_some() && self.cert_file.is_none() {
            return invalid(
                "tls.trusted_ca_file (--trusted-ca-file) needs tls.cert_file and tls.key_file: \
                 client certificates are only checked on a TLS port"
                    .into(),
            );
        }
        let peer = [
            self.peer_cert_file.is_some(),
            self.peer_key_file.is_some(),
            self.peer_trusted_ca_file.is_some(),
        ];
        if peer.iter().any(|p| *p) && !peer.iter().all(|p| *p) {
            return invalid(
                "peer TLS needs all three of tls.peer_cert_file, tls.peer_key_file and \
                 tls.peer_trusted_ca_file (--peer-cert-file, --peer-key-file, --peer-trusted-ca-file): \
                 peers are always authenticated by the peer CA"
                    .into(),
            );
        }
        if self.peer_tls() && !self.peer_client_cert_auth {
            return invalid(
                "tls.peer_client_cert_auth = false is refused: with peer TLS on, every peer must \
                 present a certificate signed by tls.peer_trusted_ca_file"
                    .into(),
            );
        }
        if !self.peer_cert_allowed_cn.is_empty() && !self.peer_tls() {
            return invalid("tls.peer_cert_allowed_cn (--peer-cert-allowed-cn) needs peer TLS".into());
        }
        if self.reload_interval_ms == 0 {
            return invalid("tls.reload_interval_ms must be >= 1".into());
        }
        crate::tls::load::check_config(self).map_err(|e| ConfigError::Invalid(e.to_string()))
    }
}

/// The TLS flags of `ftkv-node` (etcd's names), each also an `FTKV_*` variable.
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "TLS (TOML section [tls])")]
pub struct TlsFlags {
    /// tls.cert_file: certificate (PEM) of the client and status ports.
    #[arg(long, env = "FTKV_CERT_FILE")]
    pub cert_file: Option<PathBuf>,
    /// tls.key_file: its private key (PEM).
    #[arg(long, env = "FTKV_KEY_FILE")]
    pub key_file: Option<PathBuf>,
    /// tls.trusted_ca_file: CA (PEM) of client certificates.
    #[arg(long, env = "FTKV_TRUSTED_CA_FILE")]
    pub trusted_ca_file: Option<PathBuf>,
    /// tls.client_cert_auth: require a client certificate signed by --trusted-ca-file.
    #[arg(long, env = "FTKV_CLIENT_CERT_AUTH")]
    pub client_cert_auth: bool,
    /// tls.peer_cert_file: certificate (PEM) of the peer port and of outgoing peer connections.
    #[arg(long, env = "FTKV_PEER_CERT_FILE")]
    pub peer_cert_file: Option<PathBuf>,
    /// tls.peer_key_file: its private key (PEM).
    #[arg(long, env = "FTKV_PEER_KEY_FILE")]
    pub peer_key_file: Option<PathBuf>,
    /// tls.peer_trusted_ca_file: CA (PEM) of every peer's certificate.
    #[arg(long, env = "FTKV_PEER_TRUSTED_CA_FILE")]
    pub peer_trusted_ca_file: Option<PathBuf>,
    /// tls.peer_client_cert_auth (always on with peer TLS; accepted for etcd compatibility).
    #[arg(long, env = "FTKV_PEER_CLIENT_CERT_AUTH")]
    pub peer_client_cert_auth: bool,
    /// tls.peer_cert_allowed_cn: names (CN or DNS SAN) a peer certificate must carry one of.
    #[arg(long, env = "FTKV_PEER_CERT_ALLOWED_CN", value_delimiter = ',')]
    pub peer_cert_allowed_cn: Vec<String>,
    /// tls.min_version: 1.2 | 1.3.
    #[arg(long, env = "FTKV_TLS_MIN_VERSION")]
    pub tls_min_version: Option<TlsVersion>,
    /// tls.reload_interval_ms: period of the certificate files' modification check.
    #[arg(long, env = "FTKV_TLS_RELOAD_INTERVAL_MS")]
    pub tls_reload_interval_ms: Option<u64>,
}

impl TlsFlags {
    /// Overrides the keys given on the command line or in the environment.
    pub fn apply(&self, c: &mut Config) {
        let t = &mut c.tls;
        for (flag, key) in [
            (&self.cert_file, &mut t.cert_file),
            (&self.key_file, &mut t.key_file),
            (&self.trusted_ca_file, &mut t.trusted_ca_file),
            (&self.peer_cert_file, &mut t.peer_cert_file),
            (&self.peer_key_file, &mut t.peer_key_file),
            (&self.peer_trusted_ca_file, &mut t.peer_trusted_ca_file),
        ] {
            if let Some(v) = flag {
                *key = Some(v.clone());
            }
        }
        t.client_cert_auth |= self.client_cert_auth;
        t.peer_client_cert_auth |= self.peer_client_cert_auth;
        if !self.peer_cert_allowed_cn.is_empty() {
            t.peer_cert_allowed_cn = self.peer_cert_allowed_cn.clone();
        }
        if let Some(v) = self.tls_min_version {
            t.min_version = v;
        }
        if let Some(v) = self.tls_reload_interval_ms {
            t.reload_interval_ms = v;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: TlsFlags,
    }

    fn config_of(args: &[&str]) -> Config {
        let mut argv = vec!["x"];
        argv.extend_from_slice(args);
        let mut c = Config::default();
        Cli::try_parse_from(argv).unwrap().flags.apply(&mut c);
        c
    }

    #[test]
    fn flags_land_in_their_keys() {
        let c = config_of(&[
            "--cert-file=/c.pem",
            "--key-file=/k.pem",
            "--trusted-ca-file=/ca.pem",
            "--client-cert-auth",
            "--peer-cert-file=/pc.pem",
            "--peer-key-file=/pk.pem",
            "--peer-trusted-ca-file=/pca.pem",
            "--peer-cert-allowed-cn=a,b",
            "--tls-min-version=1.3",
            "--tls-reload-interval-ms=100",
        ]);
        assert_eq!(c.tls.cert_file, Some(PathBuf::from("/c.pem")));
        assert_eq!(c.tls.key_file, Some(PathBuf::from("/k.pem")));
        assert_eq!(c.tls.trusted_ca_file, Some(PathBuf::from("/ca.pem")));
        assert!(c.tls.client_cert_auth);
        assert_eq!(c.tls.peer_cert_file, Some(PathBuf::from("/pc.pem")));
        assert_eq!(c.tls.peer_key_file, Some(PathBuf::from("/pk.pem")));
        assert_eq!(c.tls.peer_trusted_ca_file, Some(PathBuf::from("/pca.pem")));
        assert_eq!(c.tls.peer_cert_allowed_cn, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(c.tls.min_version, TlsVersion::Tls13);
        assert_eq!(c.tls.reload_interval_ms, 100);
        assert_eq!(config_of(&[]).tls, TlsConfig::default());
    }

    #[test]
    fn options_that_do_not_fit_together_are_refused_naming_the_flags() {
        for (args, needle) in [
            (&["--cert-file=/c.pem"][..], "--key-file"),
            (&["--client-cert-auth"][..], "--trusted-ca-file"),
            (&["--trusted-ca-file=/ca.pem"][..], "tls.cert_file"),
            (&["--peer-cert-file=/pc.pem"][..], "--peer-trusted-ca-file"),
            (&["--peer-cert-allowed-cn=a"][..], "needs peer TLS"),
            (&["--tls-reload-interval-ms=0"][..], "reload_interval_ms"),
        ] {
            let err = config_of(args).tls.validate().unwrap_err().to_string();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
        TlsConfig::default().validate().unwrap();
        assert!("1.1".parse::<TlsVersion>().is_err());
        assert_eq!("TLS1.3".parse::<TlsVersion>().unwrap(), TlsVersion::Tls13);
    }
}
