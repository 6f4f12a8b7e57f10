//! The TLS settings of this node's outgoing peer connections (Raft RPCs, `GetNodeInfo`): the
//! peer certificate and key as the client identity, the peer CA to verify the other node's
//! server certificate (whose SAN must name the host of its advertised peer address, DNS name or
//! IP). Reloaded with the peer port's files: connections opened after a reload use the new
//! certificate ([`PeerClientTls::current`] carries a generation the channel cache compares).

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;
use tonic::transport::{Certificate, ClientTlsConfig, Identity};

use super::load::TlsError;
use crate::config::TlsConfig;

fn read(option: &'static str, path: &std::path::Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|e| TlsError::File {
        option,
        path: path.to_path_buf(),
        message: format!("cannot read: {e}"),
    })
}

/// The tonic client configuration of `tls`'s peer files (peer TLS must be on). The files are
/// parsed first so that a broken one is refused here, not at the first connection.
pub fn client_config(tls: &TlsConfig) -> Result<ClientTlsConfig, TlsError> {
    let (Some(cert), Some(key), Some(ca)) =
        (&tls.peer_cert_file, &tls.peer_key_file, &tls.peer_trusted_ca_file)
    else {
        return Err(TlsError::Invalid("peer TLS is not configured".into()));
    };
    super::load::read_certs("tls.peer_cert_file (--peer-cert-file)", cert)?;
    super::load::read_key("tls.peer_key_file (--peer-key-file)", key)?;
    super::load::read_roots("tls.peer_trusted_ca_file (--peer-trusted-ca-file)", ca)?;
    Ok(ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read("tls.peer_trusted_ca_file", ca)?))
        .identity(Identity::from_pem(
            read("tls.peer_cert_file", cert)?,
            read("tls.peer_key_file", key)?,
        )))
}

/// The current outgoing peer TLS configuration, replaced at each successful reload.
#[derive(Debug)]
pub struct PeerClientTls {
    tls: TlsConfig,
    generation: AtomicU64,
    current: RwLock<ClientTlsConfig>,
}

impl PeerClientTls {
    /// Loads the peer files of `tls`.
    pub fn load(tls: &TlsConfig) -> Result<Self, TlsError> {
        Ok(Self {
            current: RwLock::new(client_config(tls)?),
            generation: AtomicU64::new(0),
            tls: tls.clone(),
        })
    }

    /// The configuration and its generation (bumped at each reload).
    pub fn current(&self) -> (u64, ClientTlsConfig) {
        let config = self.current.read().clone();
        (self.generation.load(Ordering::Acquire), config)
    }

    /// Reads the files again; on error the current configuration stays.
    pub fn reload(&self) -> Result<(), TlsError> {
        let config = client_config(&self.tls)?;
        *self.current.write() = config;
        self.generation.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }
}
