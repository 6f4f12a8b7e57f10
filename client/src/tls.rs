//! TLS settings of a [`Client`](crate::Client) ([`ClientBuilder::tls`](crate::ClientBuilder::tls))
//! and the recognition of TLS mismatches in transport failures.
//!
//! With TLS set every endpoint is reached over `https://` (rustls with the ring provider,
//! through tonic): the server's certificate must be signed by the CA given and name the host
//! of the endpoint (DNS or IP SAN); with a client certificate and key the client also
//! authenticates itself (a node with `--client-cert-auth` requires it).
//!
//! A mismatch comes back as [`Error::Tls`](crate::Error::Tls) naming it, not as a generic
//! transport error: a plaintext client at a TLS port gets the node's `TLS_REQUIRED` answer; a
//! TLS client at a plaintext port, a server certificate the CA did not sign, or a handshake the
//! server refused (no or a wrong client certificate) are recognized in the transport's causes.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use crate::error::{Error, Result};

/// TLS settings: the CA of the servers, optionally a client certificate and key (PEM).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsOptions {
    ca_pem: Vec<u8>,
    identity: Option<(Vec<u8>, Vec<u8>)>,
    domain_name: Option<String>,
}

fn read(what: &str, path: &Path) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path).map_err(|e| Error::Tls {
        message: format!("cannot read the {what} {}: {e}", path.display()),
    })?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(Error::Tls {
            message: format!("the {what} {} is not a PEM file", path.display()),
        });
    }
    Ok(bytes)
}

impl TlsOptions {
    /// Trusts the CA certificate(s) of `ca_pem` (PEM) for the servers' certificates.
    pub fn with_ca_pem(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: ca_pem.into(),
            ..Self::default()
        }
    }

    /// [`TlsOptions::with_ca_pem`] from a file (`ftkvctl --cacert`).
    pub fn with_ca_file(path: &Path) -> Result<Self> {
        Ok(Self::with_ca_pem(read("CA file (--cacert)", path)?))
    }

    /// Presents this client certificate and key (PEM) to the servers.
    pub fn identity_pem(mut self, cert_pem: impl Into<Vec<u8>>, key_pem: impl Into<Vec<u8>>) -> Self {
        self.identity = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// [`TlsOptions::identity_pem`] from files (`ftkvctl --cert --key`).
    pub fn identity_files(self, cert: &Path, key: &Path) -> Result<Self> {
        let cert = read("client certificate (--cert)", cert)?;
        let key = read("client key (--key)", key)?;
        Ok(self.identity_pem(cert, key))
    }

    /// Verifies the servers' certificates against this name instead of each endpoint's host.
    pub fn domain_name(mut self, name: impl Into<String>) -> Self {
        self.domain_name = Some(name.into());
        self
    }

    pub(crate) fn to_tonic(&self) -> ClientTlsConfig {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca_pem));
        if let Some((cert, key)) = &self.identity {
            config = config.identity(Identity::from_pem(cert, key));
        }
        if let Some(name) = &self.domain_name {
            config = config.domain_name(name.clone());
        }
        config
    }
}

/// What a transport failure's causes (`message`, the whole chain) say about TLS, if anything:
/// the explanation [`Error::Tls`] carries.
pub(crate) fn mismatch(message: &str) -> Option<String> {
    let has = |needle: &str| message.contains(needle);
    if has("InvalidContentType") || has("corrupt message") || has("tls handshake eof") {
        return Some(format!(
            "the endpoint does not speak TLS (a plaintext port? connect without --cacert / https://): {message}"
        ));
    }
    if has("invalid peer certificate") {
        return Some(format!(
            "the server's certificate was refused (is --cacert the CA that signed it, and does it name \
             the host connected to?): {message}"
        ));
    }
    if has("received fatal alert") || has("HandshakeFailure") {
        return Some(format!(
            "the server refused the TLS handshake (it may require a client certificate, --cert/--key, \
             signed by its trusted CA): {message}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_causes_are_recognized_and_others_are_not() {
        let plain = mismatch("transport error: received corrupt message of type InvalidContentType")
            .unwrap_or_default();
        assert!(plain.contains("does not speak TLS"), "{plain}");
        let ca = mismatch("invalid peer certificate: UnknownIssuer").unwrap_or_default();
        assert!(ca.contains("--cacert"), "{ca}");
        let auth = mismatch("received fatal alert: CertificateRequired").unwrap_or_default();
        assert!(auth.contains("--cert/--key"), "{auth}");
        assert_eq!(
            mismatch("tcp connect error: Connection refused (os error 111)"),
            None
        );
    }

    #[test]
    fn files_that_are_not_pem_are_refused_naming_the_flag() {
        let dir = std::env::temp_dir().join(format!("ftkv-client-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).ok();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, b"not a certificate").ok();
        match TlsOptions::with_ca_file(&junk) {
            Err(Error::Tls { message }) => assert!(message.contains("--cacert"), "{message}"),
            other => panic!("{other:?}"),
        }
        match TlsOptions::with_ca_file(&dir.join("missing.pem")) {
            Err(Error::Tls { message }) => assert!(message.contains("cannot read"), "{message}"),
            other => panic!("{other:?}"),
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
