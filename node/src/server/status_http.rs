//! Status HTTP server: `/metrics` (Prometheus text format from the `metrics` recorder),
//! `/livez` (the process serves), `/readyz` (a leader is known and this node applied what it
//! knows to be committed... approximately: applied >= commit index at the time of the call; never
//! on a node its peers refuse as removed, nor while its NOSPACE alarm is raised: 503 with the
//! alarm's message).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use crate::cluster::ClusterNode;

#[derive(Clone)]
struct AppState {
    cluster: ClusterNode,
    metrics: PrometheusHandle,
}

/// Serves until `shutdown` resolves.
pub async fn serve(
    listener: super::conn::GuardedListener,
    cluster: ClusterNode,
    metrics: PrometheusHandle,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState { cluster, metrics });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

async fn render_metrics(State(state): State<AppState>) -> String {
    let st = state.cluster.status();
    metrics::gauge!("ftkv_raft_term").set(st.term as f64);
    metrics::gauge!("ftkv_raft_applied_index").set(st.applied_index as f64);
    metrics::gauge!("ftkv_raft_commit_index").set(st.commit_index as f64);
    metrics::gauge!("ftkv_raft_last_log_index").set(st.last_log_index as f64);
    metrics::gauge!("ftkv_raft_is_leader").set(if st.leader_id == Some(st.node_id) {
        1.0
    } else {
        0.0
    });
    metrics::gauge!("ftkv_batch_ops_per_entry").set(st.ops_per_entry);
    crate::space::record_metrics(&state.cluster);
    state.metrics.render()
}

async fn ready(State(state): State<AppState>) -> (StatusCode, String) {
    let st = state.cluster.status();
    if st.role == "shutdown" {
        return (StatusCode::SERVICE_UNAVAILABLE, "raft stopped\n".into());
    }
    if st.role == "removed" {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "removed from the cluster (peers refuse this node as not a member)\n".into(),
        );
    }
    if let Some(alarm) = state.cluster.alarm() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("alarm NOSPACE: {}\n", alarm.message),
        );
    }
    match st.leader_id {
        Some(leader) if st.applied_index >= st.commit_index => {
            (StatusCode::OK, format!("ready (leader {leader})\n"))
        }
        Some(_) => (StatusCode::SERVICE_UNAVAILABLE, "catching up\n".into()),
        None => (StatusCode::SERVICE_UNAVAILABLE, "no leader\n".into()),
    }
}
