//! The TLS handshake inside the node's accept loop (`server::conn`).
//!
//! Each connection accepted under the port's cap gets its own task that, within the port's
//! handshake timeout, looks at the first byte the client sent and then:
//!
//! - a TLS record (`0x16`, a ClientHello): runs the handshake with the port's current
//!   configuration ([`ServerTls::acceptor`], so reloads reach new connections); on the peer
//!   port it also checks `tls.peer_cert_allowed_cn`; the finished stream goes to the server;
//! - anything else on a gRPC port (a plaintext HTTP/2 client): answers every request with
//!   `FAILED_PRECONDITION`, reason `TLS_REQUIRED` ("this port requires TLS"), so the client
//!   reports the mismatch instead of a broken connection; on the status port, an HTTP/1 `400`
//!   saying the same.
//!
//! A handshake that fails or runs out of time closes the connection and is counted in
//! `ftkv_tls_handshake_failures_total{port, reason}`.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_rustls::server::TlsStream;

use super::identity::CertNames;
use super::reload::ServerTls;
use crate::server::conn::GuardedStream;

/// First byte of a TLS handshake record.
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How the plaintext client of a TLS port is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PlaintextAnswer {
    /// gRPC: a `FAILED_PRECONDITION` status on every request.
    Grpc,
    /// HTTP/1: a `400 Bad Request`.
    Http1,
}

/// How one TLS port accepts.
#[derive(Debug, Clone)]
pub struct AcceptOptions {
    /// The port's configuration.
    pub tls: Arc<ServerTls>,
    /// Bound of the whole handshake (the port's `server.handshake_timeout_ms`).
    pub handshake_timeout: Duration,
    /// On the peer port: names one of which a client certificate must carry (empty: any).
    pub allowed_names: Arc<Vec<String>>,
    /// How a plaintext client is answered.
    pub plaintext: PlaintextAnswer,
}

fn failed(port: &'static str, reason: &'static str) {
    metrics::counter!("ftkv_tls_handshake_failures_total", "port" => port, "reason" => reason).increment(1);
}

/// Runs the TLS handshake of every connection of `rx` (see the module docs); the finished
/// streams come out of the returned channel. Ends when the receiver is dropped.
pub fn tls_accept(
    mut rx: mpsc::Receiver<GuardedStream>,
    options: AcceptOptions,
) -> mpsc::Receiver<TlsStream<GuardedStream>> {
    let (tx, out) = mpsc::channel(16);
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                s = rx.recv() => match s { Some(s) => s, None => return },
                _ = tx.closed() => return,
            };
            let tx = tx.clone();
            let options = options.clone();
            tokio::spawn(async move {
                let port = options.tls.port;
                let timeout = options.handshake_timeout;
                match tokio::time::timeout(timeout, handshake(stream, &options)).await {
                    Ok(Ok(Some(tls))) => {
                        let _ = tx.send(tls).await;
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(e)) => {
                        failed(port, "handshake");
                        tracing::debug!(port, error = %e, "TLS handshake failed");
                    }
                    Err(_) => {
                        failed(port, "timeout");
                        tracing::debug!(port, ?timeout, "no TLS handshake within the handshake timeout");
                    }
                }
            });
        }
    });
    out
}

async fn handshake(
    stream: GuardedStream,
    options: &AcceptOptions,
) -> io::Result<Option<TlsStream<GuardedStream>>> {
    let port = options.tls.port;
    let mut first = [0u8; 1];
    if stream.peek(&mut first).await? == 0 {
        return Ok(None); // closed before sending anything
    }
    if first[0] != TLS_HANDSHAKE_RECORD {
        failed(port, "plaintext");
        tracing::debug!(port, "plaintext client on a TLS port; telling it TLS is required");
        answer_plaintext(stream, options.plaintext).await;
        return Ok(None);
    }
    let tls = options.tls.acceptor().accept(stream).await?;
    if !options.allowed_names.is_empty() {
        let names = tls
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|leaf| CertNames::of(leaf.as_ref()));
        match names {
            Some(Ok(names)) if names.any_of(&options.allowed_names) => {}
            other => {
                failed(port, "name not allowed");
                let names = match other {
                    Some(Ok(n)) => n.describe(),
                    Some(Err(e)) => e,
                    None => "no certificate".into(),
                };
                tracing::warn!(
                    port,
                    names = %names,
                    allowed = ?options.allowed_names,
                    "peer certificate names none of tls.peer_cert_allowed_cn; connection closed"
                );
                return Ok(None);
            }
        }
    }
    Ok(Some(tls))
}

/// Tells a plaintext client that the port requires TLS, then closes.
async fn answer_plaintext(mut stream: GuardedStream, how: PlaintextAnswer) {
    match how {
        PlaintextAnswer::Http1 => {
            let body = "this port requires TLS: use https://\n";
            let response = format!(
                "HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain\r\nconnection: close\r\n\
                 content-length: {}\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
        PlaintextAnswer::Grpc => {
            let Ok(mut conn) = h2::server::handshake(stream).await else {
                return;
            };
            // Answer the requests of this connection's first moments, then go away.
            let deadline = tokio::time::sleep(Duration::from_secs(2));
            tokio::pin!(deadline);
            loop {
                tokio::select! {
                    next = conn.accept() => match next {
                        Some(Ok((_request, mut respond))) => {
                            let _ = respond.send_response(tls_required_response(), true);
                        }
                        _ => return,
                    },
                    _ = &mut deadline => break,
                }
            }
            conn.graceful_shutdown();
            let _ = tokio::time::timeout(
                Duration::from_secs(1),
                futures::future::poll_fn(|cx| conn.poll_closed(cx)),
            )
            .await;
        }
    }
}

/// A trailers-only gRPC response carrying [`crate::server::errors::tls_required`].
fn tls_required_response() -> tonic::codegen::http::Response<()> {
    let mut headers = tonic::codegen::http::HeaderMap::new();
    if let Err(e) = crate::server::errors::tls_required().add_header(&mut headers) {
        tracing::warn!(error = %e, "cannot encode the TLS-required status");
    }
    let mut response = tonic::codegen::http::Response::new(());
    headers.insert(
        tonic::codegen::http::header::CONTENT_TYPE,
        tonic::codegen::http::HeaderValue::from_static("application/grpc"),
    );
    *response.headers_mut() = headers;
    response
}

/// The TLS connections of a port as an axum listener (the status HTTP server).
pub struct TlsListener {
    rx: mpsc::Receiver<TlsStream<GuardedStream>>,
    local_addr: std::net::SocketAddr,
}

impl TlsListener {
    /// Accepts on `listener` under `limits`, with TLS as `options` say.
    pub fn new(
        listener: tokio::net::TcpListener,
        limits: crate::server::conn::ConnectionLimits,
        options: AcceptOptions,
    ) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let rx = crate::server::conn::accept_loop(listener, limits, options.tls.port);
        Ok(Self {
            rx: tls_accept(rx, options),
            local_addr,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<GuardedStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, std::net::SocketAddr) {
        loop {
            match self.rx.recv().await {
                Some(stream) => match stream.get_ref().0.peer_addr() {
                    Ok(peer) => return (stream, peer),
                    Err(_) => continue,
                },
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        Ok(self.local_addr)
    }
}

/// The finished TLS connections as tonic's incoming stream.
pub fn incoming(
    rx: mpsc::Receiver<TlsStream<GuardedStream>>,
) -> impl futures::Stream<Item = Result<TlsStream<GuardedStream>, io::Error>> {
    futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok)
}
