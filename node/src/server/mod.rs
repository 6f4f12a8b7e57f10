//! The node's servers: the client gRPC server (`ftkv.v1.Kv`, `ftkv.v1.Cluster`,
//! `ftkv.v1.Maintenance`, `ftkv.v1.Auth` with its checks in [`auth`], gRPC health,
//! server reflection), the peer gRPC server (`ftkv.raft.v1.Raft`, from [`crate::cluster`]) and
//! the status HTTP server (`/metrics` in Prometheus format, `/livez`, `/readyz`).
//!
//! This is the only layer that formats gRPC statuses ([`errors`]). Every listener accepts
//! through [`conn`] (a connection cap per port, handshake and idle timeouts, accept that
//! survives descriptor exhaustion); both gRPC servers send HTTP/2 keepalive pings, so half-open
//! connections are closed after `keepalive_timeout`. With TLS on a port, the handshake runs
//! inside that accept path ([`crate::tls::accept`]), under the same handshake timeout.

pub mod auth;
pub mod batch;
mod bulk_load;
pub mod cluster_svc;
pub mod conn;
pub mod convert;
pub mod errors;
pub mod grpc_metrics;
pub mod kv;
pub mod maintenance;
pub mod readiness;
pub mod status_http;

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::cluster::ClusterNode;
use crate::limits::{Limits, MAX_RESPONSE_MESSAGE_BYTES};

/// Largest gRPC message the client server accepts (a max batch plus framing).
pub const CLIENT_MAX_MESSAGE_BYTES: usize = crate::limits::MAX_REQUEST_MESSAGE_BYTES;

/// The gRPC services of the client port, as reflection lists them.
pub const CLIENT_PORT_SERVICES: [&str; 6] = [
    "ftkv.v1.Kv",
    "ftkv.v1.Cluster",
    "ftkv.v1.Maintenance",
    "ftkv.v1.Auth",
    "grpc.health.v1.Health",
    "grpc.reflection.v1.ServerReflection",
];

/// Binds `addr` (fails at once with the address in the message when it is taken).
pub async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for {what} on {addr}: {e}"))?;
    Ok(listener)
}

/// How the gRPC servers treat connections (from `[server]`, the cap derived at start) and
/// which client calls they log as slow (`logging.slow_request_threshold_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// Cap and timeouts of each port.
    pub limits: conn::ConnectionLimits,
    /// HTTP/2 keepalive ping interval.
    pub keepalive_interval: Duration,
    /// A connection whose keepalive ping is not answered within this is closed.
    pub keepalive_timeout: Duration,
    /// Unary client calls slower than this are logged at warn (0: never).
    pub slow_request_threshold_ms: u64,
}

fn builder(options: &ConnectionOptions) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(options.keepalive_interval))
        .http2_keepalive_timeout(Some(options.keepalive_timeout))
}

/// What the client API checks requests against: the request limits and the lifetime of the
/// tokens it issues (`auth.token_ttl_ms`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientApiSettings {
    /// Request limits.
    pub limits: Limits,
    /// Lifetime of issued tokens, ms.
    pub token_ttl_ms: u64,
}

/// Serves the client API on `listener` until `shutdown` resolves. The gRPC health of `""` and
/// `ftkv.v1.Kv` follows `readiness` ([`readiness::Readiness::track_health`]); `ftkv.v1.Cluster`
/// stays `SERVING` while the process runs (membership commands must reach a node that is not
/// ready). Every call is counted and timed ([`grpc_metrics`]).
pub async fn serve_client(
    listener: TcpListener,
    cluster: ClusterNode,
    api: ClientApiSettings,
    options: ConnectionOptions,
    readiness: std::sync::Arc<readiness::Readiness>,
    tls: Option<crate::tls::accept::AcceptOptions>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    for service in ["", readiness::KV_SERVICE] {
        health_reporter
            .set_service_status(service, tonic_health::ServingStatus::NotServing)
            .await;
    }
    health_reporter
        .set_serving::<ftkv_proto::v1::cluster_server::ClusterServer<cluster_svc::ClusterService>>()
        .await;
    let (health_stop, health_stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(readiness.track_health(health_reporter, async move {
        let _ = health_stopped.await;
    }));
    // Reflection lists exactly the services of this port: not `ftkv.raft.v1.Raft` (the peer
    // port's, in the same descriptor set), and the health service too.
    let mut reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ftkv_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET);
    for service in CLIENT_PORT_SERVICES {
        reflection = reflection.with_service_name(service);
    }
    let reflection = reflection.build_v1()?;
    let ClientApiSettings { limits, token_ttl_ms } = api;
    let guard = auth::AuthGuard::new(cluster.clone(), token_ttl_ms);
    let auth_svc =
        ftkv_proto::v1::auth_server::AuthServer::new(auth::service::AuthService::new(guard.clone(), limits));
    let kv =
        ftkv_proto::v1::kv_server::KvServer::new(kv::KvService::new(cluster.clone(), limits, guard.clone()))
            .max_decoding_message_size(CLIENT_MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RESPONSE_MESSAGE_BYTES);
    let maintenance = ftkv_proto::v1::maintenance_server::MaintenanceServer::new(
        maintenance::MaintenanceService::new(cluster.clone(), guard.clone()),
    )
    .max_encoding_message_size(MAX_RESPONSE_MESSAGE_BYTES);
    let cluster_svc =
        ftkv_proto::v1::cluster_server::ClusterServer::new(cluster_svc::ClusterService::new(cluster, guard))
            .max_decoding_message_size(CLIENT_MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_RESPONSE_MESSAGE_BYTES);
    let router = builder(&options)
        .layer(grpc_metrics::GrpcMetricsLayer::with_slow_request_threshold_ms(
            options.slow_request_threshold_ms,
        ))
        .layer(tower::util::MapResponseLayer::new(size_limit_details))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(kv)
        .add_service(cluster_svc)
        .add_service(maintenance)
        .add_service(auth_svc);
    let accepted = conn::accept_loop(listener, options.limits, "client");
    match tls {
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(
                    crate::tls::accept::incoming(crate::tls::accept::tls_accept(accepted, tls)),
                    shutdown,
                )
                .await?
        }
        None => {
            router
                .serve_with_incoming_shutdown(conn::incoming(accepted), shutdown)
                .await?
        }
    }
    drop(health_stop);
    Ok(())
}

/// Gives tonic's bare refusal of a request over the decoding limit (a trailers-only answer with
/// `OUT_OF_RANGE` and no details) the node's `RESOURCE_EXHAUSTED` with an `ErrorInfo` naming
/// the limit ([`errors::request_too_large`]); every other response passes untouched. (A
/// `Kv.Batch` stream's oversized message is answered by the batch driver itself.)
fn size_limit_details<B>(
    mut response: tonic::codegen::http::Response<B>,
) -> tonic::codegen::http::Response<B> {
    let headers = response.headers_mut();
    if !headers.contains_key("grpc-status") || headers.contains_key("grpc-status-details-bin") {
        return response;
    }
    let Some(status) = tonic::Status::from_header_map(headers) else {
        return response;
    };
    if !errors::is_decode_size_limit(&status) {
        return response;
    }
    headers.remove("grpc-message");
    if let Err(e) = errors::request_too_large(status.message()).add_header(headers) {
        tracing::warn!(error = %e, "cannot encode a size-limit status");
    }
    response
}

/// Serves the peer API on `listener` until `shutdown` resolves. Accepted connections get
/// `TCP_NODELAY` in [`conn::accept_loop`] (`Server::tcp_nodelay` applies only to listeners
/// tonic binds itself; without it small responses wait for the peer's delayed ACK).
pub async fn serve_peer(
    listener: TcpListener,
    cluster: ClusterNode,
    options: ConnectionOptions,
    tls: Option<crate::tls::accept::AcceptOptions>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let router = builder(&options).add_service(cluster.peer_service());
    let accepted = conn::accept_loop(listener, options.limits, "peer");
    match tls {
        Some(tls) => {
            router
                .serve_with_incoming_shutdown(
                    crate::tls::accept::incoming(crate::tls::accept::tls_accept(accepted, tls)),
                    shutdown,
                )
                .await?
        }
        None => {
            router
                .serve_with_incoming_shutdown(conn::incoming(accepted), shutdown)
                .await?
        }
    }
    Ok(())
}

/// Local address of a bound listener, for logs.
pub fn local(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map(|a: SocketAddr| a.to_string())
        .unwrap_or_default()
}
