//! Certificates and keys reloaded without a restart.
//!
//! Each TLS port holds a [`ServerTls`]: the rustls configuration new connections are accepted
//! with. [`watch`] reloads every one on SIGHUP and whenever a file's modification time or size
//! changed (checked every `tls.reload_interval_ms`). A reload builds a whole new configuration
//! from the files first; only when that succeeds does it replace the current one, so a broken
//! or half-written file is rejected, logged with the reason, and the old certificate stays.
//! Connections already open keep the session they negotiated; only new ones see the new
//! certificate. The outgoing peer configuration ([`PeerClientTls`]) is reloaded alongside.
//!
//! The node listens for SIGHUP whether or not TLS is on, so that a SIGHUP never kills it
//! (the default action of the signal); without TLS it only logs that there is nothing to reload.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use tokio_rustls::rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

use super::load::{ServerFiles, TlsError};
use super::peer_client::PeerClientTls;

/// What identifies a file's version: modification time and size (`None` when unreadable).
type Stamp = Option<(SystemTime, u64)>;

fn stamps(paths: &[PathBuf]) -> Vec<Stamp> {
    paths
        .iter()
        .map(|p| {
            let m = std::fs::metadata(p).ok()?;
            Some((m.modified().ok()?, m.len()))
        })
        .collect()
}

/// The TLS configuration of one port, replaced by successful reloads.
#[derive(Debug)]
pub struct ServerTls {
    /// The port, for logs and metrics (`client`, `peer`, `status`).
    pub port: &'static str,
    files: ServerFiles,
    alpn: &'static [u8],
    current: RwLock<Arc<ServerConfig>>,
    seen: Mutex<Vec<Stamp>>,
}

impl ServerTls {
    /// Loads `files` for `port`, offering `alpn`.
    pub fn load(port: &'static str, files: ServerFiles, alpn: &'static [u8]) -> Result<Arc<Self>, TlsError> {
        let seen = stamps(&files.paths());
        let config = files.server_config(alpn)?;
        Ok(Arc::new(Self {
            port,
            files,
            alpn,
            current: RwLock::new(Arc::new(config)),
            seen: Mutex::new(seen),
        }))
    }

    /// An acceptor with the current configuration.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().clone())
    }

    /// Whether a file changed since the last load attempt (remembers the new stamps).
    fn changed(&self) -> bool {
        let now = stamps(&self.files.paths());
        let mut seen = self.seen.lock();
        if *seen == now {
            return false;
        }
        *seen = now;
        true
    }

    /// Builds a configuration from the files again and, if it loads, makes it current.
    pub fn reload(&self) -> Result<(), TlsError> {
        *self.seen.lock() = stamps(&self.files.paths());
        let config = self.files.server_config(self.alpn)?;
        *self.current.write() = Arc::new(config);
        Ok(())
    }
}

fn reload_logged(port: &'static str, why: &str, result: Result<(), TlsError>) {
    match result {
        Ok(()) => {
            metrics::counter!("ftkv_tls_reloads_total", "port" => port, "result" => "ok").increment(1);
            tracing::info!(port, why, "TLS certificates reloaded");
        }
        Err(e) => {
            metrics::counter!("ftkv_tls_reloads_total", "port" => port, "result" => "rejected").increment(1);
            tracing::error!(port, why, error = %e, "TLS reload rejected; the previous certificate stays in use");
        }
    }
}

/// Every reloadable TLS configuration of the node.
#[derive(Debug, Clone, Default)]
pub struct Reloadable {
    /// The listening ports'.
    pub servers: Vec<Arc<ServerTls>>,
    /// The outgoing peer connections' (reloaded when the peer port's files change).
    pub peer_client: Option<Arc<PeerClientTls>>,
}

impl Reloadable {
    /// Reloads what changed (`force`: everything, as on SIGHUP).
    pub fn reload(&self, force: bool, why: &str) {
        for server in &self.servers {
            if force || server.changed() {
                let result = server.reload();
                let loaded = result.is_ok();
                reload_logged(server.port, why, result);
                // The outgoing side follows only files the server side accepted (rustls checked
                // them whole, the key against the certificate): a half-rotated pair or a broken
                // file must not reach new peer connections either.
                if loaded && server.port == "peer" {
                    if let Some(client) = &self.peer_client {
                        reload_logged("peer-client", why, client.reload());
                    }
                }
            }
        }
    }
}

/// Listens for SIGHUP (always, so that it never kills the node) and polls the files every
/// `interval`; reloads as described in the module docs. Runs until the process ends.
pub fn watch(reloadable: Reloadable, interval: Duration) {
    let mut hangup = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; certificates reload on file changes only");
            None
        }
    };
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let hup = async {
                match hangup.as_mut() {
                    Some(h) => h.recv().await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = hup => {
                    if reloadable.servers.is_empty() {
                        tracing::info!("SIGHUP: TLS is off, nothing to reload");
                    } else {
                        reloadable.reload(true, "SIGHUP");
                    }
                }
                _ = tick.tick(), if !reloadable.servers.is_empty() => reloadable.reload(false, "file changed"),
            }
        }
    });
}
