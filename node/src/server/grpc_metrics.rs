//! gRPC server metrics with go-grpc-prometheus' names, as etcd exports them:
//! `grpc_server_started_total{grpc_service,grpc_method}`,
//! `grpc_server_handled_total{grpc_service,grpc_method,grpc_code}` and
//! `grpc_server_handling_seconds{grpc_service,grpc_method}` (a histogram).
//!
//! A call is finished when its status is known: in the response headers (a trailers-only
//! answer, e.g. a refusal) or in the trailers at the end of the body (streams included). A body
//! dropped before its trailers (the client went away) counts as `Canceled`. Paths answered
//! `Unimplemented` are labelled `unknown`, so a client inventing paths cannot grow the label set.
//!
//! The slow-request log lives here too: a unary call that takes longer than
//! `logging.slow_request_threshold_ms` is logged at warn with its method, code and duration
//! (streams, which stay open by design, never are: [`STREAMING_METHODS`]).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http::{HeaderMap, Request, Response};

/// The streaming methods the node serves (`/service/method`): never logged as slow.
pub const STREAMING_METHODS: &[&str] = &[
    "/ftkv.v1.Kv/Batch",
    "/ftkv.v1.Kv/BulkLoad",
    "/ftkv.v1.Maintenance/Snapshot",
    "/grpc.health.v1.Health/Watch",
    "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
    "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
];

/// The tower layer of [`GrpcMetrics`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMetricsLayer {
    /// Unary calls slower than this are logged (`None`: no slow-request log).
    pub slow_request_threshold: Option<Duration>,
}

impl GrpcMetricsLayer {
    /// The layer with the slow-request log above `threshold_ms` (0: off).
    pub fn with_slow_request_threshold_ms(threshold_ms: u64) -> Self {
        GrpcMetricsLayer {
            slow_request_threshold: (threshold_ms > 0).then(|| Duration::from_millis(threshold_ms)),
        }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics {
            inner,
            slow_request_threshold: self.slow_request_threshold,
        }
    }
}

/// Counts and times every call `inner` serves.
#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
    slow_request_threshold: Option<Duration>,
}

impl<S, ReqBody, ResBody> tower::Service<Request<ReqBody>> for GrpcMetrics<S>
where
    S: tower::Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Future: Send + 'static,
{
    type Response = Response<MeteredBody<ResBody>>;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let path = request.uri().path();
        let slow_after = self
            .slow_request_threshold
            .filter(|_| !STREAMING_METHODS.contains(&path));
        let mut call = Call::new(path, slow_after);
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if let Some(code) = status_code(response.headers()) {
                call.finish(code);
            }
            Ok(response.map(|inner| MeteredBody {
                inner,
                call: Some(call).filter(|c| !c.finished),
            }))
        })
    }
}

/// One call being measured.
#[derive(Debug)]
struct Call {
    service: String,
    method: String,
    started: Instant,
    finished: bool,
    /// Log the call at warn when it took longer (unary calls, when the log is on).
    slow_after: Option<Duration>,
}

impl Call {
    fn new(path: &str, slow_after: Option<Duration>) -> Self {
        let (service, method) = split_path(path);
        metrics::counter!(
            "grpc_server_started_total",
            "grpc_service" => service.clone(),
            "grpc_method" => method.clone()
        )
        .increment(1);
        Call {
            service,
            method,
            started: Instant::now(),
            finished: false,
            slow_after,
        }
    }

    fn finish(&mut self, code: i32) {
        if self.finished {
            return;
        }
        self.finished = true;
        let (service, method) = if code == tonic::Code::Unimplemented as i32 {
            ("unknown".to_string(), "unknown".to_string())
        } else {
            (self.service.clone(), self.method.clone())
        };
        metrics::counter!(
            "grpc_server_handled_total",
            "grpc_service" => service.clone(),
            "grpc_method" => method.clone(),
            "grpc_code" => code_name(code)
        )
        .increment(1);
        let elapsed = self.started.elapsed();
        if let Some(threshold) = self.slow_after.filter(|t| elapsed > *t) {
            tracing::warn!(
                grpc_service = %service,
                grpc_method = %method,
                grpc_code = code_name(code),
                elapsed_ms = elapsed.as_millis() as u64,
                threshold_ms = threshold.as_millis() as u64,
                "slow request"
            );
        }
        metrics::histogram!(
            "grpc_server_handling_seconds",
            "grpc_service" => service,
            "grpc_method" => method
        )
        .record(elapsed);
    }
}

impl Drop for Call {
    fn drop(&mut self) {
        // The body went away before its trailers: the client cancelled (or the connection died).
        self.finish(tonic::Code::Cancelled as i32);
    }
}

/// `/pkg.Service/Method` -> (`pkg.Service`, `Method`); anything else is (`unknown`, `unknown`).
/// Names are cut to 64 bytes (a well-formed path that is not served ends up `unknown` anyway,
/// see [`Call::finish`]; until then it is only counted as started).
fn split_path(path: &str) -> (String, String) {
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    match (parts.next(), parts.next()) {
        (Some(service), Some(method))
            if !service.is_empty() && !method.is_empty() && !method.contains('/') =>
        {
            (truncate(service), truncate(method))
        }
        _ => ("unknown".to_string(), "unknown".to_string()),
    }
}

fn truncate(s: &str) -> String {
    let mut end = s.len().min(64);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

fn status_code(headers: &HeaderMap) -> Option<i32> {
    headers.get("grpc-status")?.to_str().ok()?.trim().parse().ok()
}

/// The code's name as go-grpc-prometheus (and so etcd) labels it.
fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "Canceled",
        2 => "Unknown",
        3 => "InvalidArgument",
        4 => "DeadlineExceeded",
        5 => "NotFound",
        6 => "AlreadyExists",
        7 => "PermissionDenied",
        8 => "ResourceExhausted",
        9 => "FailedPrecondition",
        10 => "Aborted",
        11 => "OutOfRange",
        12 => "Unimplemented",
        13 => "Internal",
        14 => "Unavailable",
        15 => "DataLoss",
        16 => "Unauthenticated",
        _ => "Unknown",
    }
}

/// A response body that finishes its call's measurement at the trailers.
#[derive(Debug)]
pub struct MeteredBody<B> {
    inner: B,
    call: Option<Call>,
}

impl<B> Body for MeteredBody<B>
where
    B: Body + Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = status_code(trailers).unwrap_or(tonic::Code::Unknown as i32);
                    if let Some(mut call) = this.call.take() {
                        call.finish(code);
                    }
                }
            }
            Poll::Ready(Some(Err(_))) => {
                if let Some(mut call) = this.call.take() {
                    call.finish(tonic::Code::Internal as i32);
                }
            }
            Poll::Ready(None) => {
                // Ended without trailers: the status was in the headers (already counted) or
                // missing, which a gRPC client reads as Unknown.
                if let Some(mut call) = this.call.take() {
                    call.finish(tonic::Code::Unknown as i32);
                }
            }
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn paths_split_into_service_and_method() {
        assert_eq!(split_path("/ftkv.v1.Kv/Put"), ("ftkv.v1.Kv".into(), "Put".into()));
        assert_eq!(split_path("/nonsense"), ("unknown".into(), "unknown".into()));
        assert_eq!(split_path("/a/b/c"), ("unknown".into(), "unknown".into()));
        assert_eq!(split_path(""), ("unknown".into(), "unknown".into()));
        let long = format!("/{}/M", "é".repeat(100));
        assert!(split_path(&long).0.len() <= 64);
    }

    #[test]
    fn codes_are_named_as_go_grpc_prometheus_does() {
        assert_eq!(code_name(0), "OK");
        assert_eq!(code_name(14), "Unavailable");
        assert_eq!(code_name(99), "Unknown");
    }

    /// Every streaming method of the proto files is in [`STREAMING_METHODS`], or a stream
    /// added later would be logged as slow on every call.
    #[test]
    fn every_streaming_method_of_the_protos_is_listed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/ftkv/v1");
        let mut streaming = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            let mut service = String::new();
            for line in text.lines().map(str::trim) {
                if let Some(rest) = line.strip_prefix("service ") {
                    service = rest.trim_end_matches('{').trim().to_string();
                }
                if let Some(rest) = line.strip_prefix("rpc ") {
                    let name = rest.split('(').next().unwrap().trim();
                    if rest.contains("(stream ") {
                        streaming.push(format!("/ftkv.v1.{service}/{name}"));
                    }
                }
            }
        }
        assert!(
            streaming.contains(&"/ftkv.v1.Kv/Batch".to_string()),
            "{streaming:?}"
        );
        for method in &streaming {
            assert!(
                STREAMING_METHODS.contains(&method.as_str()),
                "{method} is not in STREAMING_METHODS"
            );
        }
    }

    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What the layer logs for one call to `path` that takes `sleep_ms`, with `layer`.
    fn log_of_call(layer: GrpcMetricsLayer, path: &str, sleep_ms: u64) -> String {
        use tower::{Layer, Service};
        let out = Captured::default();
        let writer = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let inner = tower::service_fn(move |_request: Request<()>| async move {
            tokio::time::sleep(Duration::from_millis(sleep_ms)).await;
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .header("grpc-status", "0")
                    .body(String::new())
                    .unwrap(),
            )
        });
        let mut service = layer.layer(inner);
        let request = Request::builder().uri(path).body(()).unwrap();
        tracing::subscriber::with_default(subscriber, || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
                .block_on(service.call(request))
                .unwrap();
        });
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn a_unary_call_over_the_threshold_is_logged_and_others_are_not() {
        let layer = GrpcMetricsLayer::with_slow_request_threshold_ms(20);
        let log = log_of_call(layer, "/ftkv.v1.Kv/Put", 60);
        assert!(log.contains("slow request"), "{log}");
        assert!(
            log.contains("grpc_method=Put") && log.contains("grpc_code=\"OK\""),
            "{log}"
        );
        assert_eq!(
            log_of_call(layer, "/ftkv.v1.Kv/Put", 0),
            "",
            "a fast call is not logged"
        );
        assert_eq!(
            log_of_call(layer, "/ftkv.v1.Kv/Batch", 60),
            "",
            "a stream is never slow"
        );
        let off = GrpcMetricsLayer::with_slow_request_threshold_ms(0);
        assert_eq!(log_of_call(off, "/ftkv.v1.Kv/Put", 60), "", "0 turns the log off");
    }
}
