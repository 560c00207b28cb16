//! The reverse proxy. One request's path through it, in order:
//!
//! 1. **accept** ([`server`]): TCP with Nagle off, HTTP/1.1 or HTTP/2, at
//!    most `max_connections` at once, header, keep-alive and body
//!    timeouts; each connection is served for its life on one per-core
//!    worker runtime ([`workers`]), with that worker's upstream client.
//!    `CONNECT`, targets that are not paths and transfer codings other
//!    than chunked are refused ([`server::check_request`]).
//! 2. **admin** ([`admin`], given only [`state::AppState::admin_handles`]):
//!    `/healthz`, `/readyz`, `/metrics`, `/v1/memory-compact` and live
//!    reports are answered here, never forwarded.
//! 3. **route + policy** ([`crate::policy::Runtime::resolve`]): the first
//!    matching route's policy and body format, the policy overridden by a
//!    configured tenant's. Unmatched requests are forwarded untouched, body
//!    streamed.
//! 4. **collect** ([`body`]): a POST on a matched route is collected into
//!    one buffer up to `max_body_bytes` (413 past it, nothing forwarded;
//!    408 when it stalls), all bodies together under `max_buffered_bytes`
//!    (503); gzip/deflate is decoded under the same cap in step 5.
//! 5. **compact** ([`compact`]): the route's [`crate::format`] parses the
//!    body into the neutral conversation, [`crate::compaction`] plans what
//!    survives (pins, then the engine in exact mode or the stable replay),
//!    and the format splices the plan back into the original bytes. Small
//!    bodies are decided on the connection's worker, large ones on the blocking
//!    pool; repeated bodies come from [`crate::cache`]. Anything not
//!    compactable is forwarded as received and marked `skipped`.
//! 6. **forward** ([`upstream`]): hop-by-hop headers stripped, Host set for
//!    the upstream; 502 if unreachable, 504 without headers in time, each
//!    in the error shape of the route's format.
//! 7. **stream back** ([`body::Watched`]): the response goes back frame by
//!    frame with the loss report headers ([`headers`]), cut after an idle
//!    timeout; a departing client drops the upstream request. A protocol
//!    upgrade (WebSocket) answered 101 becomes a byte tunnel.
//! 8. **record** ([`crate::metrics::RequestEvent`]): when the response body
//!    ends, one event updates the metrics and writes the log line.

pub mod admin;
pub mod body;
pub mod compact;
pub mod context_compact;
pub mod headers;
pub mod server;
pub mod state;
pub mod stream_end;
pub mod summaries;
pub mod upstream;
pub mod workers;

use std::sync::Arc;
use std::time::Instant;

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;

use crate::compaction::stable::StableInfo;
use crate::error::ProxyError;
use crate::format::Format;
use crate::metrics::{Ending, RequestEvent};
use crate::outcome::{LossSummary, Status};
use crate::policy::{Resolution, Runtime};
use body::{BodyEnd, Collected, ProxyBody};
pub use state::AppState;
use state::TunnelGuard;

/// Handles one request end to end (the numbered steps above).
pub async fn handle(state: Arc<AppState>, request: Request<Incoming>) -> Response<ProxyBody> {
    if let Err(refused) = server::check_request(&request) {
        tracing::warn!(method = %request.method(), code = refused.code(), "request refused: {refused}");
        let (parts, body) = refused.to_response().into_parts();
        return Response::from_parts(parts, body::full(body));
    }
    let request = if admin::is_admin_path(request.uri().path()) {
        // Boxed, as admin requests are rare: inline, their 2 KB future
        // would be part of every proxied request's.
        match Box::pin(admin::handle(state.admin_handles(), request)).await {
            Ok(answered) => return answered,
            Err(request) => request,
        }
    } else {
        request
    };
    if request.uri().path() == context_compact::PATH && request.method() == Method::POST {
        return Box::pin(context_compact::handle(&state, request)).await;
    }
    let runtime = state.runtime();
    let mut record = Recorder::new(
        state.clone(),
        RequestEvent::new(request.method().clone(), request.uri().path().to_owned()),
    );

    let Some(resolution) = runtime.resolve(request.uri().path(), request.headers()) else {
        let (parts, body) = request.into_parts();
        return forward(&state, &runtime, parts, streamed(body), None, record).await;
    };
    // Shared labels: each copy is a reference count.
    record.route = resolution.route.clone();
    record.format = Some(resolution.format);
    record.policy = Some(resolution.policy.name.clone());
    record.tenant = resolution.tenant.clone();

    let (mut parts, body) = request.into_parts();
    let wants_bypass = headers::wants_bypass(&parts.headers);
    let bypass_refused = wants_bypass && !resolution.policy.allow_bypass;
    // Requests that are not compacted keep their body streaming.
    let untouched = if parts.method != Method::POST {
        Some(Status::Skipped("not-post"))
    } else if wants_bypass && resolution.policy.allow_bypass {
        Some(Status::Bypassed)
    } else {
        None
    };
    if let Some(status) = untouched {
        let verdict = Verdict {
            resolution,
            status,
            loss: None,
            bypass_refused,
            stable: None,
            report_id: None,
            summary: None,
        };
        return forward(
            &state,
            &runtime,
            parts,
            streamed(body),
            Some(verdict),
            record,
        )
        .await;
    }

    let received =
        body::collect_request(&parts, body, body::limits(&runtime), &state.buffers).await;
    let Collected { bytes: raw, hold } = match received {
        Ok(collected) => collected,
        Err(e) => return refuse(e, Some(&resolution), record),
    };
    let coding = body::request_coding(&parts.headers);
    let goal = resolution.policy.relevance_goal(&parts.headers);
    let decided =
        match compact::decide(&state, &runtime, &resolution, raw.clone(), coding, goal).await {
            Ok(decided) => decided,
            Err(e) => return refuse(e, Some(&resolution), record),
        };
    let (decided, summary) = summaries::apply(
        &state,
        &runtime,
        &resolution,
        &raw,
        coding,
        &parts.headers,
        decided,
    )
    .await;
    record.summary = summary.clone();
    record.compaction_seconds = decided.seconds;
    record.cache_hit = decided.cache_hit;
    let report_id = (resolution.policy.allow_report && headers::wants_report(&parts.headers))
        .then(|| schedule_report(&state, &runtime, &resolution, raw.clone(), coding));
    let (status, outcome) = (decided.status, decided.outcome);
    let body = match outcome.as_ref().and_then(|o| o.rewritten.clone()) {
        Some(rewritten) if status.is_compacted() => {
            // The rewritten body is plain JSON whatever the client sent.
            parts.headers.remove(header::CONTENT_ENCODING);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
            rewritten
        }
        _ => raw,
    };
    let stable = outcome.as_ref().and_then(|o| o.stable);
    let loss = outcome.map(|o| o.loss);
    record.loss = loss;
    record.rebased = stable.is_some_and(|s| s.rebased);
    record.checkpoint_hit = stable.and_then(|s| s.resumed);
    let verdict = Verdict {
        resolution,
        status,
        loss,
        bypass_refused,
        stable,
        report_id,
        summary,
    };
    forward(
        &state,
        &runtime,
        parts,
        body::full_holding(body, hold),
        Some(verdict),
        record,
    )
    .await
}

/// Computes a request's per-message report off the request path (on the
/// blocking pool, after the answer has gone on its way) and keeps it under
/// a fresh id, which is returned at once.
fn schedule_report(
    state: &Arc<AppState>,
    runtime: &Runtime,
    resolution: &Resolution,
    raw: bytes::Bytes,
    coding: body::Coding,
) -> String {
    let id = state.reports.new_id();
    let (state, policy, format) = (state.clone(), resolution.policy.clone(), resolution.format);
    let (limit, max_messages) = (
        runtime.config.server.max_body_bytes,
        runtime.config.server.max_messages,
    );
    let key = id.clone();
    tokio::task::spawn_blocking(move || {
        let Ok(decoded) = body::decode(&raw, coding, limit) else {
            return;
        };
        let report =
            crate::explain::report_for(&decoded, &policy.name, &policy, format, max_messages);
        if let Ok(json) = report.map(|r| serde_json::to_vec(&r)) {
            state
                .reports
                .insert(key, json.expect("reports serialise").into());
        }
    });
    id
}

/// A request body passed on as it arrives, never collected.
fn streamed(body: Incoming) -> ProxyBody {
    body.map_err(Into::into).boxed_unsync()
}

/// What the loss report headers of a matched route's response say.
struct Verdict {
    resolution: Resolution,
    status: Status,
    loss: Option<LossSummary>,
    /// A bypass was asked for and the policy refuses it.
    bypass_refused: bool,
    stable: Option<StableInfo>,
    /// The id under which this request's per-message report is kept.
    report_id: Option<String>,
    /// The summary forwarded in place of older messages.
    summary: Option<crate::outcome::SummaryReport>,
}

impl Verdict {
    fn write_to(&self, headers: &mut http::HeaderMap) {
        headers::write_loss_report(
            headers,
            self.status,
            &self.resolution.policy.name,
            self.loss.as_ref(),
        );
        if self.bypass_refused {
            headers::note_bypass_refused(headers);
        }
        if let Some(stable) = &self.stable {
            headers::write_stable_report(headers, stable);
        }
        if let Some(id) = &self.report_id {
            headers::write_report_id(headers, id);
        }
        if let Some(summary) = &self.summary {
            headers::write_summary(headers, summary);
        }
    }
}

/// Carries a request's event to its one emission. Dropped unfinished (the
/// client left before the response went out, and hyper dropped the
/// handler), it records the request as `ClientGone`.
struct Recorder {
    state: Arc<AppState>,
    event: RequestEvent,
    started: Instant,
    done: bool,
}

impl Recorder {
    fn new(state: Arc<AppState>, event: RequestEvent) -> Self {
        Recorder {
            state,
            event,
            started: Instant::now(),
            done: false,
        }
    }

    fn finish(mut self, ending: Ending) {
        self.emit(ending);
    }

    fn emit(&mut self, ending: Ending) {
        self.done = true;
        self.event.ending = ending;
        self.event.total_seconds = self.started.elapsed().as_secs_f64();
        self.event.emit(&self.state.metrics);
    }
}

impl std::ops::Deref for Recorder {
    type Target = RequestEvent;
    fn deref(&self) -> &RequestEvent {
        &self.event
    }
}

impl std::ops::DerefMut for Recorder {
    fn deref_mut(&mut self) -> &mut RequestEvent {
        &mut self.event
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        if !self.done {
            self.emit(Ending::ClientGone);
        }
    }
}

/// Steps 6-8: forwards the request and streams the response back.
async fn forward(
    state: &Arc<AppState>,
    runtime: &Runtime,
    mut parts: http::request::Parts,
    body: ProxyBody,
    verdict: Option<Verdict>,
    mut record: Recorder,
) -> Response<ProxyBody> {
    if let Some(verdict) = &verdict {
        record.status = Some(verdict.status);
    }
    parts.uri = upstream::target(&runtime.upstream, &parts.uri);
    parts.version = http::Version::HTTP_11;
    // A protocol upgrade (WebSocket): both sides' connections are joined
    // once the upstream agrees.
    let client_upgrade = parts.extensions.remove::<OnUpgrade>();
    let upgrade = headers::strip_hop_by_hop_keeping_upgrade(&mut parts.headers);
    match state.upstream.host() {
        Some(host) => parts.headers.insert(header::HOST, host.clone()),
        None => parts.headers.remove(header::HOST),
    };

    let header_timeout = runtime.timeouts.response_header;
    let idle = runtime.timeouts.upstream_idle;
    let body_idle = runtime.timeouts.body_idle;
    let sent = Instant::now();
    let mut response = match state
        .upstream
        .send(
            Request::from_parts(parts, body),
            upgrade.is_some(),
            header_timeout,
            body_idle,
        )
        .await
    {
        Ok(response) => response,
        Err(e) => {
            // The loss report still says what was done to the request.
            let format = verdict.as_ref().map(|v| v.resolution.format);
            let (mut response, ending) = error_response(&e, format.unwrap_or_default());
            if let Some(v) = &verdict {
                v.write_to(response.headers_mut());
            }
            record.response_status = response.status().as_u16();
            record.finish(ending);
            return response;
        }
    };

    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let (Some(client), Some(_)) = (client_upgrade, &upgrade) {
            let guard = TunnelGuard::open(state);
            tokio::spawn(tunnel(client, hyper::upgrade::on(&mut response), guard));
        }
    }
    let (mut parts, upstream_body) = response.into_parts();
    if parts.status == StatusCode::SWITCHING_PROTOCOLS {
        headers::strip_hop_by_hop_keeping_upgrade(&mut parts.headers);
    } else {
        headers::strip_hop_by_hop(&mut parts.headers);
    }
    if let Some(v) = &verdict {
        v.write_to(&mut parts.headers);
    }
    record.upstream_status = Some(parts.status.as_u16());
    record.upstream_first_byte_seconds = Some(sent.elapsed().as_secs_f64());
    record.response_status = parts.status.as_u16();

    let watched = body::Watched::new(upstream_body, idle, move |end: BodyEnd| {
        record.upstream_seconds = Some(sent.elapsed().as_secs_f64());
        record.finish(match end {
            BodyEnd::Complete => Ending::Complete,
            BodyEnd::Failed(e) => Ending::UpstreamFailed(e),
            BodyEnd::Abandoned => Ending::ClientGone,
        });
    });
    Response::from_parts(parts, watched.boxed_unsync())
}

/// Joins an upgraded client connection to the upgraded upstream one and
/// copies bytes both ways until either side closes.
async fn tunnel(client: OnUpgrade, upstream: OnUpgrade, _open: TunnelGuard) {
    let started = Instant::now();
    match tokio::try_join!(client, upstream) {
        Ok((client, upstream)) => {
            let mut client = hyper_util::rt::TokioIo::new(client);
            let mut upstream = hyper_util::rt::TokioIo::new(upstream);
            let copied = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            let seconds = started.elapsed().as_secs_f64();
            match copied {
                Ok((up, down)) => {
                    tracing::info!(
                        bytes_up = up,
                        bytes_down = down,
                        seconds,
                        "upgraded connection closed"
                    )
                }
                Err(e) => {
                    tracing::info!(error = %e, seconds, "upgraded connection ended with an error")
                }
            }
        }
        Err(e) => tracing::warn!(error = %e, "protocol upgrade failed"),
    }
}

/// The proxy's own answer to `error`, and how it ends the request.
fn error_response(error: &ProxyError, format: Format) -> (Response<ProxyBody>, Ending) {
    let (parts, body) = error.to_response_in(format).into_parts();
    let ending = match error {
        // Nobody reads this answer: the client left mid-upload.
        ProxyError::ClientBody(_) => Ending::ClientGone,
        e => Ending::Refused(e.to_string()),
    };
    (Response::from_parts(parts, body::full(body)), ending)
}

/// Refuses a request on a matched route before anything is forwarded.
fn refuse(
    error: ProxyError,
    resolution: Option<&Resolution>,
    mut record: Recorder,
) -> Response<ProxyBody> {
    let format = resolution.map(|r| r.format).unwrap_or_default();
    let (mut response, ending) = error_response(&error, format);
    if let Some(resolution) = resolution {
        let status = Status::Skipped(error.skip_reason());
        record.status = Some(status);
        headers::write_loss_report(
            response.headers_mut(),
            status,
            &resolution.policy.name,
            None,
        );
    }
    record.response_status = response.status().as_u16();
    record.finish(ending);
    response
}
