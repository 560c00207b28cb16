//! The proxy's own endpoints on the same listener: health, readiness,
//! metrics, and the engine as an API (`POST /v1/memory-compact`).

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::error::ProxyError;
use crate::memory_compact;
use crate::proxy::body::{self, ProxyBody};
use crate::proxy::AppState;

pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";
pub const MEMORY_COMPACT: &str = "/v1/memory-compact";
/// `GET /v1/compaction-reports/<id>`: a live per-message report.
pub const REPORTS: &str = "/v1/compaction-reports/";

/// Answers admin paths; hands every other request back, to be proxied.
pub async fn handle(
    state: &Arc<AppState>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Request<Incoming>> {
    Ok(match request.uri().path() {
        HEALTHZ => text(StatusCode::OK, "ok\n"),
        READYZ if state.is_ready() => text(StatusCode::OK, "ready\n"),
        READYZ => text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
        METRICS => {
            let mut r = text(StatusCode::OK, state.metrics.render());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        MEMORY_COMPACT => memory_compact(state, request).await,
        path if path.starts_with(REPORTS) => {
            let found = match request.method() {
                &Method::GET => state
                    .reports
                    .get(&path[REPORTS.len()..])
                    .ok_or(ProxyError::ReportNotFound),
                other => Err(ProxyError::MethodNotAllowed(other.clone())),
            };
            match found {
                Ok(report) => {
                    let mut r = Response::new(body::full(report));
                    r.headers_mut().insert(
                        header::CONTENT_TYPE,
                        HeaderValue::from_static("application/json"),
                    );
                    r
                }
                Err(e) => {
                    let (parts, bytes) = e.to_response().into_parts();
                    Response::from_parts(parts, body::full(bytes))
                }
            }
        }
        _ => return Err(request),
    })
}

/// `POST /v1/memory-compact`: validates, compacts, answers the report.
async fn memory_compact(state: &Arc<AppState>, request: Request<Incoming>) -> Response<ProxyBody> {
    match compact_report(state, request).await {
        Ok(report) => {
            let mut r = Response::new(body::full(report));
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        }
        Err(e) => {
            if e.is_client_error() {
                tracing::warn!(code = e.code(), error = %e, "memory-compact request refused");
            }
            let (parts, bytes) = e.to_response().into_parts();
            Response::from_parts(parts, body::full(bytes))
        }
    }
}

async fn compact_report(
    state: &Arc<AppState>,
    request: Request<Incoming>,
) -> Result<Bytes, ProxyError> {
    if request.method() != Method::POST {
        return Err(ProxyError::MethodNotAllowed(request.method().clone()));
    }
    let is_json = request
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| mime.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ProxyError::UnsupportedMediaType);
    }
    let limit = state.runtime().config.server.max_body_bytes;
    let bytes = body::collect_limited(request.into_body(), limit).await?;
    let parsed = memory_compact::parse(&bytes)?;
    let report = parsed.compact();
    Ok(serde_json::to_vec(&report)
        .expect("reports serialise")
        .into())
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut r = Response::new(body::full(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}
