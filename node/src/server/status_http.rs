//! Status HTTP server: `/metrics` (Prometheus text format from the `metrics` recorder, with the
//! gauges of [`crate::telemetry::Telemetry`] sampled at each scrape), `/livez` (the process
//! serves; never looks at the cluster), `/readyz` (200 or 503 with one line per check of
//! [`super::readiness`], as etcd answers).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;

use super::readiness::Readiness;
use crate::cluster::ClusterNode;
use crate::telemetry::Telemetry;

#[derive(Clone)]
struct AppState {
    cluster: ClusterNode,
    metrics: PrometheusHandle,
    telemetry: Telemetry,
    readiness: std::sync::Arc<Readiness>,
}

/// Serves until `shutdown` resolves.
pub async fn serve<L>(
    listener: L,
    cluster: ClusterNode,
    metrics: PrometheusHandle,
    telemetry: Telemetry,
    readiness: std::sync::Arc<Readiness>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/livez", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .with_state(AppState {
            cluster,
            metrics,
            telemetry,
            readiness,
        });
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}

async fn render_metrics(State(state): State<AppState>) -> String {
    state.telemetry.refresh(&state.cluster);
    crate::space::record_metrics(&state.cluster);
    state.metrics.render()
}

async fn ready(State(state): State<AppState>) -> (StatusCode, String) {
    let (ready, body) = super::readiness::render(&state.readiness.evaluate().await);
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body)
}
