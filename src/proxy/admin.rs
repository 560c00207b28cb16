//! The proxy's own endpoints on the same listener: health, readiness,
//! metrics, the engine as an API (`POST /v1/memory-compact`), live reports
//! and the inspector ([`crate::inspector`]).

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use hyper::body::Incoming;

use super::body::{self, BufferBudget, CollectLimits, ProxyBody};
use crate::error::ProxyError;
use crate::explain::ReportStore;
use crate::memory_compact;
use crate::metrics::Metrics;

/// What the admin endpoints use of the shared state, and nothing more.
pub struct Handles<'a> {
    /// False once shutdown began: `/readyz` answers 503.
    pub ready: bool,
    /// The summary store serves from this process alone (Redis fails).
    pub store_degraded: bool,
    pub metrics: &'a Metrics,
    pub reports: &'a ReportStore,
    /// Bills of reported requests whose answer ended, added to their report.
    pub bills: &'a crate::usage::BillStore,
    /// What recall did for reported requests whose answer went out.
    pub recalled: &'a crate::explain::RecalledStore,
    /// The compaction permits `/v1/memory-compact` shares with the proxy.
    pub compactions: &'a Arc<tokio::sync::Semaphore>,
    pub buffers: &'a Arc<BufferBudget>,
    /// Body limits of the configuration in force.
    pub limits: CollectLimits,
    /// The inspector's settings in force and its recent requests.
    pub inspector: crate::inspector::Handles<'a>,
    /// The prefix cache, whose counters a scrape reads.
    pub prefixes: &'a crate::cache::PrefixCache,
}

pub const HEALTHZ: &str = "/healthz";
pub const READYZ: &str = "/readyz";
pub const METRICS: &str = "/metrics";
pub const MEMORY_COMPACT: &str = "/v1/memory-compact";
/// `GET /v1/compaction-reports/<id>`: a live per-message report.
pub const REPORTS: &str = "/v1/compaction-reports/";

/// Whether [`handle`] answers `path` (cheap: checked on every request).
pub fn is_admin_path(path: &str) -> bool {
    matches!(path, HEALTHZ | READYZ | METRICS | MEMORY_COMPACT)
        || path.starts_with(REPORTS)
        || crate::inspector::is_inspector_path(path)
}

/// A report with its request's bill, as the log line has it, once the
/// answer has ended (`"bill": null` before, or when the answer reported
/// no usage). Reports are serialised objects, so the field is spliced in
/// before the closing brace.
fn with_bill(report: Bytes, bill: Option<&crate::usage::Bill>) -> Bytes {
    with_field(report, "bill", &bill)
}

/// A report with what recall did for its request once the answer went
/// out (`recall = true` with markers forwarded): the lines whose recall
/// id the model recalled say `"recalled": true`, and a `recall` field
/// gives the rounds, the recalled ids and the refused count. Reports of
/// requests recall was not active for are as they were.
fn with_recalled(report: Bytes, done: Option<&crate::compaction::recall::Recalled>) -> Bytes {
    let Some(done) = done else {
        return report;
    };
    let marked = crate::explain::mark_recalled(&report, &done.recalled_ids);
    with_field(marked.into(), "recall", done)
}

/// `report` (a serialised object) with `key` set to `value` as its last
/// field, spliced in before the closing brace.
fn with_field(report: Bytes, key: &str, value: &impl serde::Serialize) -> Bytes {
    let Some(close) = report.iter().rposition(|&b| b == b'}') else {
        return report;
    };
    let value = serde_json::to_vec(value).expect("report fields serialise");
    let mut out = Vec::with_capacity(report.len() + value.len() + key.len() + 4);
    out.extend_from_slice(&report[..close]);
    let empty = report[..close]
        .iter()
        .rev()
        .find(|b| !b.is_ascii_whitespace())
        == Some(&b'{');
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(&serde_json::to_vec(key).expect("keys serialise"));
    out.push(b':');
    out.extend_from_slice(&value);
    out.extend_from_slice(&report[close..]);
    out.into()
}

/// Answers admin paths; hands every other request back, to be proxied.
pub async fn handle(
    state: Handles<'_>,
    request: Request<Incoming>,
) -> Result<Response<ProxyBody>, Request<Incoming>> {
    Ok(match request.uri().path() {
        HEALTHZ => text(StatusCode::OK, "ok\n"),
        READYZ if state.ready && state.store_degraded => text(
            StatusCode::OK,
            "ready\nnote: the summary store's Redis fails; summaries are kept in this process only\n",
        ),
        READYZ if state.ready => text(StatusCode::OK, "ready\n"),
        READYZ => text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"),
        METRICS => {
            state
                .metrics
                .count_prefix_cache(state.prefixes.hits(), state.prefixes.misses());
            let mut r = text(StatusCode::OK, state.metrics.render());
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            r
        }
        MEMORY_COMPACT => memory_compact(&state, request).await,
        path if crate::inspector::is_inspector_path(path) => {
            let (parts, bytes) = crate::inspector::handle(state.inspector, &request).into_parts();
            Response::from_parts(parts, body::full(bytes))
        }
        path if path.starts_with(REPORTS) => {
            let id = &path[REPORTS.len()..];
            let found = match request.method() {
                &Method::GET => state
                    .reports
                    .get(id)
                    .map(|report| with_recalled(report, state.recalled.get(id).as_deref()))
                    .map(|report| with_bill(report, state.bills.get(id).as_deref()))
                    .ok_or(ProxyError::ReportNotFound),
                other => Err(ProxyError::MethodNotAllowed(other.clone(), "GET")),
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
async fn memory_compact(state: &Handles<'_>, request: Request<Incoming>) -> Response<ProxyBody> {
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
    state: &Handles<'_>,
    request: Request<Incoming>,
) -> Result<Bytes, ProxyError> {
    if request.method() != Method::POST {
        return Err(ProxyError::MethodNotAllowed(
            request.method().clone(),
            "POST",
        ));
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
    // No valid request is larger than the schema allows: a bigger body is
    // refused on its Content-Length, or as soon as it passes the bound.
    let mut limits = state.limits;
    limits.max_bytes = limits.max_bytes.min(memory_compact::MAX_BODY_BYTES);
    let (parts, request_body) = request.into_parts();
    let collected = body::collect_request(&parts, request_body, limits, state.buffers).await?;
    // Parsing and the engine cost CPU in proportion to the body: off the
    // async workers, under the proxy path's one-compaction-per-core bound.
    let permit = state
        .compactions
        .clone()
        .acquire_owned()
        .await
        .expect("the compaction semaphore is never closed");
    let computed = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        let parsed = memory_compact::parse(collected.received.bytes())?;
        drop(collected);
        let report = parsed.compact();
        Ok::<_, ProxyError>(serde_json::to_vec(&report).expect("reports serialise"))
    })
    .await;
    match computed {
        Ok(report) => Ok(report?.into()),
        Err(e) => Err(ProxyError::Internal(e.to_string())),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::usage::{Bill, Usage};

    fn bill() -> Bill {
        Bill {
            model: Some("gpt-4o-mini".into()),
            family: "gpt-4o".into(),
            usage: Usage {
                uncached_input: 100,
                cache_read: 900,
                output: 7,
                ..Usage::default()
            },
            cost: Some(0.5),
            estimate: None,
        }
    }

    #[test]
    fn a_report_gains_its_bill_as_a_last_field_and_stays_json() {
        let report = Bytes::from_static(br#"{"status":"compacted","messages":[{"i":0}]}"#);
        let out = with_bill(report, Some(&bill()));
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["status"], "compacted");
        assert_eq!(value["messages"][0]["i"], 0);
        assert_eq!(value["bill"]["usage"]["cache_read"], 900);
        assert_eq!(value["bill"]["usage"]["uncached_input"], 100);
        assert_eq!(value["bill"]["family"], "gpt-4o");
        assert_eq!(value["bill"]["cost"], 0.5);
    }

    #[test]
    fn a_report_marks_the_lines_whose_id_was_recalled_and_says_what_recall_did() {
        let report = Bytes::from_static(
            br#"{"messages":[{"index":1,"reason":"\"recall_id\":\"rc_d1-2_00000000000000aa\"","recall_id":"rc_d1-2_00000000000000aa"},{"index":2,"recall_id":"rc_d1-2_00000000000000aa"},{"index":null,"recall_id":"rc_d1-2_00000000000000aa","stands_for":[1,2]},{"index":3,"recall_id":"rc_t3_00000000000000bb"},{"index":4}]}"#,
        );
        let done = crate::compaction::recall::Recalled {
            rounds: 1,
            recalled_ids: vec!["rc_d1-2_00000000000000aa@10-20".into()],
            refused_ids: 2,
        };
        let out = with_bill(with_recalled(report.clone(), Some(&done)), None);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let recalled: Vec<bool> = value["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| l["recalled"] == true)
            .collect();
        assert_eq!(recalled, [true, true, true, false, false]);
        // A reason that spells the pattern inside its string is left alone.
        assert_eq!(
            value["messages"][0]["reason"],
            "\"recall_id\":\"rc_d1-2_00000000000000aa\""
        );
        assert_eq!(value["recall"]["rounds"], 1);
        assert_eq!(value["recall"]["refused_ids"], 2);
        assert_eq!(
            value["recall"]["recalled_ids"][0],
            "rc_d1-2_00000000000000aa@10-20"
        );
        assert_eq!(value["bill"], serde_json::Value::Null);
        // No recall for the request: the report is as it was.
        assert_eq!(with_recalled(report.clone(), None), report);
    }

    #[test]
    fn a_report_before_its_answer_ends_says_its_bill_is_not_known() {
        let out = with_bill(Bytes::from_static(b"{\"a\":1}\n"), None);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value, serde_json::json!({"a": 1, "bill": null}));
        let out = with_bill(Bytes::from_static(b"{ }"), None);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value, serde_json::json!({"bill": null}));
    }
}
