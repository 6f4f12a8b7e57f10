//! Accepting connections without letting them exhaust the node's file descriptors.
//!
//! Every listener (client gRPC, peer gRPC, status HTTP) accepts through [`accept_loop`]:
//!
//! - at most `max_connections` open connections per port (a semaphore permit per connection);
//!   one over the cap is accepted and closed at once (a refused connection);
//! - a connection that has not sent its first [`HANDSHAKE_BYTES`] bytes (the HTTP/2 client
//!   preface) within `handshake_timeout` is closed, and so is one from which nothing was read
//!   for `idle_timeout` (a live gRPC client answers the server's HTTP/2 keepalive pings, so only
//!   silent or dead peers are closed; half-open ones fail the keepalive sooner);
//! - `EMFILE`/`ENFILE` on accept never ends the loop or reaches storage: the loop frees a spare
//!   descriptor, accepts the waiting connection and closes it (so it is refused, not left
//!   queued), takes the spare back, and backs off briefly.
//!
//! [`raise_nofile_limit`] raises `RLIMIT_NOFILE`'s soft limit to the hard one at start; the
//! caller derives the per-port cap from it so that a reserve of descriptors stays free for the
//! engine, the log and outgoing peer connections.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// Bytes a connection must send within the handshake timeout: the 24-byte HTTP/2 client preface
/// (`PRI * HTTP/2.0...`); for the HTTP/1 status server, the start of the first request.
pub const HANDSHAKE_BYTES: usize = 24;

/// Back-off after the descriptor table was full on accept.
const FD_EXHAUSTED_BACKOFF: Duration = Duration::from_millis(50);

/// How one listener treats its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once on the port.
    pub max_connections: usize,
    /// A connection from which nothing was read this long is closed.
    pub idle_timeout: Duration,
    /// A connection that has not sent [`HANDSHAKE_BYTES`] bytes this long after accept is closed.
    pub handshake_timeout: Duration,
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit now in force (on
/// platforms without it, or if reading it fails, an error).
// The only unsafe code of the node: two libc calls on a stack struct they fill or read, with
// the return codes checked; no pointer outlives the call.
#[allow(unsafe_code)]
pub fn raise_nofile_limit() -> io::Result<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit for the duration of the call.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            limit.rlim_cur = limit.rlim_max;
        } else {
            tracing::warn!(
                error = %io::Error::last_os_error(),
                soft = limit.rlim_cur,
                hard = limit.rlim_max,
                "cannot raise RLIMIT_NOFILE to its hard limit"
            );
        }
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is u64 on Linux, not everywhere
    Ok(limit.rlim_cur as u64)
}

/// Accepts connections of `listener` (named `what` in logs and metrics) under `limits` and sends
/// them on the returned channel; runs until the receiver is dropped.
pub fn accept_loop(
    listener: TcpListener,
    limits: ConnectionLimits,
    what: &'static str,
) -> mpsc::Receiver<GuardedStream> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(async move {
        let permits = Arc::new(Semaphore::new(limits.max_connections));
        // A descriptor to give up when the table is full, so the waiting connection can be
        // accepted and closed instead of staying queued.
        let mut spare = std::fs::File::open("/dev/null").ok();
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                _ = tx.closed() => return,
            };
            match accepted {
                Ok((socket, peer)) => {
                    let Ok(permit) = permits.clone().try_acquire_owned() else {
                        metrics::counter!("ftkv_connections_refused_total", "port" => what, "reason" => "cap")
                            .increment(1);
                        tracing::debug!(%peer, what, cap = limits.max_connections, "connection over the cap refused");
                        drop(socket);
                        continue;
                    };
                    let _ = socket.set_nodelay(true);
                    if tx.send(GuardedStream::new(socket, permit, limits)).await.is_err() {
                        return;
                    }
                }
                Err(e) if is_descriptor_exhaustion(&e) => {
                    metrics::counter!("ftkv_connections_refused_total", "port" => what, "reason" => "descriptors")
                        .increment(1);
                    tracing::warn!(error = %e, what, "out of file descriptors on accept; refusing a connection");
                    if spare.take().is_some() {
                        if let Ok(Ok((socket, _))) =
                            tokio::time::timeout(Duration::from_millis(1), listener.accept()).await
                        {
                            drop(socket);
                        }
                        spare = std::fs::File::open("/dev/null").ok();
                    }
                    tokio::time::sleep(FD_EXHAUSTED_BACKOFF).await;
                }
                // ECONNABORTED and the like concern one connection, not the listener.
                Err(e) => tracing::debug!(error = %e, what, "accept failed"),
            }
        }
    });
    rx
}

fn is_descriptor_exhaustion(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

/// The accepted connections of [`accept_loop`] as tonic's incoming stream.
pub fn incoming(
    rx: mpsc::Receiver<GuardedStream>,
) -> impl futures::Stream<Item = Result<GuardedStream, io::Error>> {
    futures::StreamExt::map(tokio_stream::wrappers::ReceiverStream::new(rx), Ok)
}

/// The accepted connections of [`accept_loop`] as an axum listener (the status HTTP server).
pub struct GuardedListener {
    rx: mpsc::Receiver<GuardedStream>,
    local_addr: std::net::SocketAddr,
}

impl GuardedListener {
    /// Accepts on `listener` under `limits`.
    pub fn new(listener: TcpListener, limits: ConnectionLimits, what: &'static str) -> io::Result<Self> {
        let local_addr = listener.local_addr()?;
        Ok(Self {
            rx: accept_loop(listener, limits, what),
            local_addr,
        })
    }
}

impl axum::serve::Listener for GuardedListener {
    type Io = GuardedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (GuardedStream, std::net::SocketAddr) {
        loop {
            match self.rx.recv().await {
                Some(stream) => match stream.inner.peer_addr() {
                    Ok(peer) => return (stream, peer),
                    Err(_) => continue, // already gone
                },
                // The accept loop ended (it only does when this receiver is dropped).
                None => std::future::pending::<()>().await,
            }
        }
    }

    fn local_addr(&self) -> io::Result<std::net::SocketAddr> {
        Ok(self.local_addr)
    }
}

/// An accepted TCP connection holding its slot under the port's cap, closed (its reads fail
/// with `TimedOut`, so the server drops it) after the handshake or idle timeout.
pub struct GuardedStream {
    inner: TcpStream,
    _permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
    /// Bytes still due before the handshake deadline no longer applies.
    handshake_bytes_left: usize,
    /// When the last byte was read (or the connection accepted).
    last_read: Instant,
    /// Fires at the handshake deadline, then at `last_read + idle_timeout` (re-armed lazily).
    deadline: Pin<Box<Sleep>>,
}

impl GuardedStream {
    fn new(inner: TcpStream, permit: OwnedSemaphorePermit, limits: ConnectionLimits) -> Self {
        let now = Instant::now();
        Self {
            inner,
            _permit: permit,
            idle_timeout: limits.idle_timeout,
            handshake_bytes_left: HANDSHAKE_BYTES,
            last_read: now,
            deadline: Box::pin(tokio::time::sleep_until(now + limits.handshake_timeout)),
        }
    }

    /// Reads the next bytes into `buf` without consuming them (the TLS accept path looks at the
    /// first byte to tell a TLS client from a plaintext one).
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.peek(buf).await
    }

    /// Address of the other end.
    pub fn peer_addr(&self) -> io::Result<std::net::SocketAddr> {
        self.inner.peer_addr()
    }

    /// Whether the connection is past its deadline (re-arms the timer when bytes came since).
    fn expired(&mut self, cx: &mut Context<'_>) -> bool {
        loop {
            if self.deadline.as_mut().poll(cx).is_pending() {
                return false;
            }
            if self.handshake_bytes_left > 0 {
                return true;
            }
            let idle_until = self.last_read + self.idle_timeout;
            if idle_until <= Instant::now() {
                return true;
            }
            self.deadline.as_mut().reset(idle_until);
        }
    }
}

impl AsyncRead for GuardedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                let read = buf.filled().len() - before;
                if read > 0 {
                    let this = self.as_mut().get_mut();
                    this.last_read = Instant::now();
                    if this.handshake_bytes_left > 0 {
                        this.handshake_bytes_left = this.handshake_bytes_left.saturating_sub(read);
                        if this.handshake_bytes_left == 0 {
                            let idle_until = this.last_read + this.idle_timeout;
                            this.deadline.as_mut().reset(idle_until);
                        }
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                if self.as_mut().get_mut().expired(cx) {
                    let what = if self.handshake_bytes_left > 0 {
                        "no handshake within the handshake timeout"
                    } else {
                        "idle for the idle timeout"
                    };
                    metrics::counter!("ftkv_connections_timed_out_total").increment(1);
                    return Poll::Ready(Err(io::Error::new(io::ErrorKind::TimedOut, what)));
                }
                Poll::Pending
            }
        }
    }
}

impl AsyncWrite for GuardedStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for GuardedStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    async fn listen(limits: ConnectionLimits) -> (std::net::SocketAddr, mpsc::Receiver<GuardedStream>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        (addr, accept_loop(listener, limits, "test"))
    }

    /// Reads until EOF or error; true when the server closed the connection within `within`.
    async fn closed_within(socket: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0u8; 64];
        matches!(
            tokio::time::timeout(within, socket.read(&mut buf)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }

    /// Echoes everything read back, like a server that keeps a connection as long as it reads.
    fn serve(mut rx: mpsc::Receiver<GuardedStream>) {
        tokio::spawn(async move {
            while let Some(mut stream) = rx.recv().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 256];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
    }

    #[tokio::test]
    async fn connections_over_the_cap_are_refused_and_slots_come_back() {
        let limits = ConnectionLimits {
            max_connections: 2,
            idle_timeout: Duration::from_secs(60),
            handshake_timeout: Duration::from_secs(60),
        };
        let (addr, rx) = listen(limits).await;
        serve(rx);
        let mut a = TcpStream::connect(addr).await.unwrap();
        let mut b = TcpStream::connect(addr).await.unwrap();
        let mut c = TcpStream::connect(addr).await.unwrap();
        assert!(
            closed_within(&mut c, Duration::from_secs(5)).await,
            "the third is refused"
        );
        a.write_all(&[1; 24]).await.unwrap();
        let mut echo = [0u8; 24];
        a.read_exact(&mut echo).await.unwrap();
        drop(b.shutdown().await);
        drop(b);
        // the freed slot serves a new connection
        let mut ok = None;
        for _ in 0..50 {
            let mut d = TcpStream::connect(addr).await.unwrap();
            d.write_all(&[2; 24]).await.unwrap();
            let mut echo = [0u8; 24];
            if tokio::time::timeout(Duration::from_millis(200), d.read_exact(&mut echo))
                .await
                .is_ok_and(|r| r.is_ok())
            {
                ok = Some(d);
                break;
            }
        }
        assert!(ok.is_some(), "a slot freed by a closed connection is reused");
    }

    #[tokio::test]
    async fn silent_connections_are_closed_after_the_handshake_and_idle_timeouts() {
        let limits = ConnectionLimits {
            max_connections: 10,
            idle_timeout: Duration::from_millis(600),
            handshake_timeout: Duration::from_millis(300),
        };
        let (addr, rx) = listen(limits).await;
        serve(rx);
        let mut silent = TcpStream::connect(addr).await.unwrap();
        let started = std::time::Instant::now();
        assert!(closed_within(&mut silent, Duration::from_secs(5)).await);
        assert!(
            started.elapsed() >= Duration::from_millis(250),
            "{:?}",
            started.elapsed()
        );

        let mut talker = TcpStream::connect(addr).await.unwrap();
        // it keeps talking past both timeouts, so it stays open
        let mut last_echo = std::time::Instant::now();
        for _ in 0..8 {
            talker.write_all(&[3; 24]).await.unwrap();
            let mut echo = [0u8; 24];
            talker.read_exact(&mut echo).await.unwrap();
            last_echo = std::time::Instant::now();
            tokio::time::sleep(Duration::from_millis(150)).await;
        }
        // then it falls silent and is closed after the idle timeout
        assert!(closed_within(&mut talker, Duration::from_secs(5)).await);
        assert!(
            last_echo.elapsed() >= Duration::from_millis(550),
            "closed {:?} after it last sent",
            last_echo.elapsed()
        );
    }

    #[test]
    fn the_soft_descriptor_limit_is_raised_to_the_hard_limit() {
        let soft = raise_nofile_limit().unwrap();
        assert!(soft > 0);
    }
}
