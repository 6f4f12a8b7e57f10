//! gRPC server metrics with go-grpc-prometheus' names, as etcd exports them:
//! `grpc_server_started_total{grpc_service,grpc_method}`,
//! `grpc_server_handled_total{grpc_service,grpc_method,grpc_code}` and
//! `grpc_server_handling_seconds{grpc_service,grpc_method}` (a histogram).
//!
//! A call is finished when its status is known: in the response headers (a trailers-only
//! answer, e.g. a refusal) or in the trailers at the end of the body (streams included). A body
//! dropped before its trailers (the client went away) counts as `Canceled`. Paths answered
//! `Unimplemented` are labelled `unknown`, so a client inventing paths cannot grow the label set.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use tonic::codegen::http::{HeaderMap, Request, Response};

/// The tower layer of [`GrpcMetrics`].
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcMetricsLayer;

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetrics<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcMetrics { inner }
    }
}

/// Counts and times every call `inner` serves.
#[derive(Debug, Clone)]
pub struct GrpcMetrics<S> {
    inner: S,
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
        let mut call = Call::new(request.uri().path());
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
}

impl Call {
    fn new(path: &str) -> Self {
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
        metrics::histogram!(
            "grpc_server_handling_seconds",
            "grpc_service" => service,
            "grpc_method" => method
        )
        .record(self.started.elapsed());
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
}
