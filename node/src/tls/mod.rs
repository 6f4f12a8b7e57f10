//! TLS and mutual TLS on every port (rustls through tokio-rustls and tonic, ring provider).
//!
//! - [`load`]: files to rustls configurations; the checks of every start and `check-config`
//!   (missing or unparsable files, a key that does not match its certificate,
//!   `client_cert_auth` without a CA: see `config::tls`).
//! - [`accept`]: the handshake inside the accept loop of `server::conn`, under the port's
//!   handshake timeout; plaintext clients of a TLS port are told `TLS_REQUIRED`.
//! - [`identity`]: peer certificates bind node ids (`ftkv-node-<id>` as CN or DNS SAN).
//! - [`peer_client`]: the client side of peer TLS (outgoing Raft connections).
//! - [`reload`]: SIGHUP and file-change reloads that keep the old certificate when a new file
//!   is broken.
//! - [`certs`]: throwaway CAs and certificates (rcgen) for the playground and tests.

pub mod accept;
pub mod certs;
pub mod identity;
pub mod load;
pub mod peer_client;
pub mod reload;

use std::sync::Arc;
use std::time::Duration;

pub use load::TlsError;

use crate::config::TlsConfig;

/// The TLS state of a running node: one configuration per TLS port, the outgoing peer one.
#[derive(Debug, Clone, Default)]
pub struct NodeTls {
    /// Client gRPC port (`None`: plaintext).
    pub client: Option<Arc<reload::ServerTls>>,
    /// Status HTTP port (same files as the client port).
    pub status: Option<Arc<reload::ServerTls>>,
    /// Peer gRPC port.
    pub peer: Option<Arc<reload::ServerTls>>,
    /// Outgoing peer connections.
    pub peer_client: Option<Arc<peer_client::PeerClientTls>>,
    /// `tls.peer_cert_allowed_cn`.
    pub allowed_peer_names: Arc<Vec<String>>,
    /// `tls.reload_interval_ms`.
    pub reload_interval: Duration,
}

impl NodeTls {
    /// Loads every configured file.
    pub fn load(tls: &TlsConfig) -> Result<Self, TlsError> {
        let client_files = load::ServerFiles::client(tls);
        let client = client_files
            .clone()
            .map(|f| reload::ServerTls::load("client", f, load::ALPN_H2))
            .transpose()?;
        let status = client_files
            .map(|f| reload::ServerTls::load("status", f, load::ALPN_HTTP1))
            .transpose()?;
        let peer = load::ServerFiles::peer(tls)
            .map(|f| reload::ServerTls::load("peer", f, load::ALPN_H2))
            .transpose()?;
        let peer_client = if tls.peer_tls() {
            Some(Arc::new(peer_client::PeerClientTls::load(tls)?))
        } else {
            None
        };
        Ok(Self {
            client,
            status,
            peer,
            peer_client,
            allowed_peer_names: Arc::new(tls.peer_cert_allowed_cn.clone()),
            reload_interval: Duration::from_millis(tls.reload_interval_ms.max(1)),
        })
    }

    /// Starts the reload watcher (SIGHUP is listened for even without TLS).
    pub fn watch(&self) {
        reload::watch(
            reload::Reloadable {
                servers: [&self.client, &self.status, &self.peer]
                    .into_iter()
                    .flatten()
                    .cloned()
                    .collect(),
                peer_client: self.peer_client.clone(),
            },
            self.reload_interval,
        );
    }

    /// How a TLS port accepts (`server` is one of this node's configurations).
    pub fn accept_options(
        &self,
        server: &Arc<reload::ServerTls>,
        handshake_timeout: Duration,
        plaintext: accept::PlaintextAnswer,
    ) -> accept::AcceptOptions {
        let allowed_names = if server.port == "peer" {
            self.allowed_peer_names.clone()
        } else {
            Arc::new(Vec::new())
        };
        accept::AcceptOptions {
            tls: server.clone(),
            handshake_timeout,
            allowed_names,
            plaintext,
        }
    }
}
