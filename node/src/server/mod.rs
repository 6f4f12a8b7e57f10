//! The node's servers: the client gRPC server (`ftkv.v1.Kv`, `ftkv.v1.Cluster`, gRPC health,
//! server reflection), the peer gRPC server (`ftkv.raft.v1.Raft`, from [`crate::cluster`]) and
//! the status HTTP server (`/metrics` in Prometheus format, `/livez`, `/readyz`).
//!
//! This is the only layer that formats gRPC statuses ([`errors`]).

pub mod batch;
pub mod cluster_svc;
pub mod convert;
pub mod errors;
pub mod kv;
pub mod status_http;

use std::net::SocketAddr;

use tokio::net::TcpListener;

use crate::cluster::ClusterNode;
use crate::limits::Limits;

/// Largest gRPC message the client server accepts or sends (a max batch plus framing).
pub const CLIENT_MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Binds `addr` (fails at once with the address in the message when it is taken).
pub async fn bind(addr: &str, what: &str) -> anyhow::Result<TcpListener> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen for {what} on {addr}: {e}"))?;
    Ok(listener)
}

/// Serves the client API on `listener` until `shutdown` resolves.
pub async fn serve_client(
    listener: TcpListener,
    cluster: ClusterNode,
    limits: Limits,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ftkv_proto::v1::kv_server::KvServer<kv::KvService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ftkv_proto::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let kv = ftkv_proto::v1::kv_server::KvServer::new(kv::KvService::new(cluster.clone(), limits))
        .max_decoding_message_size(CLIENT_MAX_MESSAGE_BYTES)
        .max_encoding_message_size(CLIENT_MAX_MESSAGE_BYTES);
    let cluster_svc =
        ftkv_proto::v1::cluster_server::ClusterServer::new(cluster_svc::ClusterService::new(cluster))
            .max_decoding_message_size(CLIENT_MAX_MESSAGE_BYTES)
            .max_encoding_message_size(CLIENT_MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(health_service)
        .add_service(reflection)
        .add_service(kv)
        .add_service(cluster_svc)
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// Serves the peer API on `listener` until `shutdown` resolves.
pub async fn serve_peer(
    listener: TcpListener,
    cluster: ClusterNode,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    tonic::transport::Server::builder()
        .tcp_nodelay(true)
        .add_service(cluster.peer_service())
        .serve_with_incoming_shutdown(incoming(listener), shutdown)
        .await?;
    Ok(())
}

/// Accepted connections of `listener` with `TCP_NODELAY` set. `Server::tcp_nodelay` applies
/// only to listeners tonic binds itself: without this, small responses wait for the peer's
/// delayed ACK (Nagle), adding ~40 ms to a share of the calls under load.
fn incoming(listener: TcpListener) -> tonic::transport::server::TcpIncoming {
    tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true))
}

/// Local address of a bound listener, for logs.
pub fn local(listener: &TcpListener) -> String {
    listener
        .local_addr()
        .map(|a: SocketAddr| a.to_string())
        .unwrap_or_default()
}
