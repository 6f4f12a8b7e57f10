//! Certificate, key and CA files to rustls configurations, with errors naming the option and
//! the file. Every configuration is built with the ring provider explicitly (the build holds no
//! other, and nothing depends on a process-wide default).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_rustls::rustls::{
    self,
    crypto::CryptoProvider,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};

use crate::config::{TlsConfig, TlsVersion};

/// ALPN of the gRPC ports.
pub(crate) const ALPN_H2: &[u8] = b"h2";
/// ALPN of the status HTTP port.
pub(crate) const ALPN_HTTP1: &[u8] = b"http/1.1";

/// Why a TLS file or configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TlsError {
    /// A file is missing, unreadable or holds nothing usable.
    #[error("{option} {}: {message}", path.display())]
    File {
        /// The option naming the file (e.g. `tls.cert_file (--cert-file)`).
        option: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The files do not fit together (e.g. a key that does not match its certificate).
    #[error("{0}")]
    Invalid(String),
}

/// The crypto provider of every TLS configuration of the node (ring).
pub(crate) fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

static TLS13_ONLY: &[&rustls::SupportedProtocolVersion] = &[&rustls::version::TLS13];

/// The protocol versions from `min_version` up.
pub(crate) fn versions(min: TlsVersion) -> &'static [&'static rustls::SupportedProtocolVersion] {
    match min {
        TlsVersion::Tls12 => rustls::ALL_VERSIONS,
        TlsVersion::Tls13 => TLS13_ONLY,
    }
}

fn read(option: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        option,
        path: path.to_path_buf(),
        message: format!("cannot read: {e}"),
    })
}

/// Every certificate of a PEM file (at least one).
pub fn read_certs(option: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(option, path)?;
    let bad = |message: String| TlsError::File {
        option,
        path: path.to_path_buf(),
        message,
    };
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(bad("holds no PEM CERTIFICATE block".into()));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn read_key(option: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(option, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsError::File {
        option,
        path: path.to_path_buf(),
        message: format!("holds no usable PEM private key: {e}"),
    })
}

/// A CA file as a root store.
pub fn read_roots(option: &'static str, path: &Path) -> Result<Arc<RootCertStore>, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(option, path)? {
        roots.add(cert).map_err(|e| TlsError::File {
            option,
            path: path.to_path_buf(),
            message: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(Arc::new(roots))
}

/// The files of one TLS port, with their option names for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFiles {
    /// Certificate chain.
    pub cert_file: PathBuf,
    /// Its key.
    pub key_file: PathBuf,
    /// CA of client certificates.
    pub trusted_ca_file: Option<PathBuf>,
    /// A client certificate is required.
    pub client_cert_auth: bool,
    /// Lowest version.
    pub min_version: TlsVersion,
    /// Option names: cert, key, CA.
    pub options: [&'static str; 3],
}

impl ServerFiles {
    /// The client (and status) port's files of `tls`, if client TLS is on.
    pub fn client(tls: &TlsConfig) -> Option<ServerFiles> {
        Some(ServerFiles {
            cert_file: tls.cert_file.clone()?,
            key_file: tls.key_file.clone()?,
            trusted_ca_file: tls.trusted_ca_file.clone(),
            client_cert_auth: tls.client_cert_auth,
            min_version: tls.min_version,
            options: [
                "tls.cert_file (--cert-file)",
                "tls.key_file (--key-file)",
                "tls.trusted_ca_file (--trusted-ca-file)",
            ],
        })
    }

    /// The peer port's files of `tls`, if peer TLS is on (a peer certificate is always required).
    pub fn peer(tls: &TlsConfig) -> Option<ServerFiles> {
        Some(ServerFiles {
            cert_file: tls.peer_cert_file.clone()?,
            key_file: tls.peer_key_file.clone()?,
            trusted_ca_file: Some(tls.peer_trusted_ca_file.clone()?),
            client_cert_auth: true,
            min_version: tls.min_version,
            options: [
                "tls.peer_cert_file (--peer-cert-file)",
                "tls.peer_key_file (--peer-key-file)",
                "tls.peer_trusted_ca_file (--peer-trusted-ca-file)",
            ],
        })
    }

    /// Every file, for the modification check.
    pub fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.cert_file.clone(), self.key_file.clone()];
        paths.extend(self.trusted_ca_file.clone());
        paths
    }

    /// Reads the files and builds the server configuration offering `alpn`.
    pub fn server_config(&self, alpn: &[u8]) -> Result<ServerConfig, TlsError> {
        let [cert_option, key_option, ca_option] = self.options;
        let certs = read_certs(cert_option, &self.cert_file)?;
        let key = read_key(key_option, &self.key_file)?;
        let provider = provider();
        let verifier = match &self.trusted_ca_file {
            Some(ca) => {
                let builder =
                    WebPkiClientVerifier::builder_with_provider(read_roots(ca_option, ca)?, provider.clone());
                let builder = if self.client_cert_auth {
                    builder
                } else {
                    builder.allow_unauthenticated()
                };
                builder
                    .build()
                    .map_err(|e| TlsError::Invalid(format!("{ca_option} {}: {e}", ca.display())))?
            }
            None => WebPkiClientVerifier::no_client_auth(),
        };
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions(self.min_version))
            .map_err(|e| TlsError::Invalid(format!("tls.min_version: {e}")))?
            .with_client_cert_verifier(verifier)
            .with_single_cert(certs, key)
            .map_err(|e| match e {
                rustls::Error::InconsistentKeys(_) => TlsError::Invalid(format!(
                    "{key_option} {} does not match the certificate of {cert_option} {}",
                    self.key_file.display(),
                    self.cert_file.display()
                )),
                e => TlsError::Invalid(format!(
                    "{cert_option} {} with {key_option} {}: {e}",
                    self.cert_file.display(),
                    self.key_file.display()
                )),
            })?;
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(config)
    }
}

/// Loads every file `tls` names and builds every configuration once (what each start and
/// `ftkv-node check-config` check).
pub fn check_config(tls: &TlsConfig) -> Result<(), TlsError> {
    for files in [ServerFiles::client(tls), ServerFiles::peer(tls)]
        .into_iter()
        .flatten()
    {
        files.server_config(ALPN_H2)?;
    }
    if tls.peer_tls() {
        crate::tls::peer_client::client_config(tls)?;
    }
    Ok(())
}
