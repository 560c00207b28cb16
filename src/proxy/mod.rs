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
//!    compactable is forwarded as received and marked `skipped`. Then the
//!    model-backed steps, each falling back to what came before it: a
//!    model's tool-call decisions ([`decisions`], `tool_decisions = "model"`)
//!    and a summary in place of the removed messages ([`summaries`],
//!    `strategy = "summarize"`), both reading one [`model_input`] (the body
//!    decoded and parsed once, the headers, the goal); with `recall = true`, markers with recall
//!    ids mark the cuts and the `compaction_recall` tool goes with them.
//! 6. **forward** ([`upstream`]): hop-by-hop headers stripped, Host set for
//!    the upstream; 502 if unreachable, 504 without headers in time, each
//!    in the error shape of the route's format.
//! 7. **stream back** ([`in_flight::Watched`]): the response goes back frame by
//!    frame with the loss report headers ([`headers`]), cut after an idle
//!    timeout; a departing client drops the upstream request. A protocol
//!    upgrade (WebSocket) answered 101 becomes a byte tunnel. With recall
//!    active ([`recall`]), the proxy answers the model's `compaction_recall`
//!    calls itself from this request's body and sends the follow-ups
//!    upstream, so the client gets only the final answer.
//! 8. **record** ([`crate::metrics::RequestEvent`]): when the response body
//!    ends, one event updates the metrics and writes the log line, with the
//!    bill ([`crate::usage`]): the `usage` the provider reported, read from
//!    the frames as they passed in step 7, priced, and set against the
//!    estimated cost of the original request.

pub mod admin;
pub mod body;
pub mod compact;
pub mod context_compact;
pub mod decisions;
pub mod headers;
pub mod in_flight;
mod model_input;
pub mod recall;
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
use body::{Collected, ProxyBody};
use in_flight::BodyEnd;
pub use state::AppState;
use state::TunnelGuard;

/// Handles one request end to end (the numbered steps above).
pub async fn handle(state: Arc<AppState>, request: Request<Incoming>) -> Response<ProxyBody> {
    if let Err(refused) = server::check_request(&request) {
        tracing::warn!(
            method = request.method().as_str(),
            code = refused.code(),
            "request refused: {refused}"
        );
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
    // The request's id: the client's `x-request-id`, or a new one; sent
    // upstream, logged, and returned to the client.
    let mut request = request;
    let request_id = headers::request_id(request.headers_mut());
    let mut response = Box::pin(proxy_request(state, request, request_id.clone())).await;
    // An upstream's own id (OpenAI answers with one) is passed on as it came.
    response
        .headers_mut()
        .entry(headers::REQUEST_ID)
        .or_insert(request_id);
    response
}

/// Steps 3-8 for a request that is not the proxy's own.
async fn proxy_request(
    state: Arc<AppState>,
    request: Request<Incoming>,
    request_id: HeaderValue,
) -> Response<ProxyBody> {
    if request.uri().path() == context_compact::PATH && request.method() == Method::POST {
        return Box::pin(context_compact::handle(&state, request)).await;
    }
    let runtime = state.runtime();
    let mut record = Recorder::new(
        state.clone(),
        RequestEvent::new(request.method().clone(), request.uri().path().to_owned()),
    );
    record.request_id = Some(request_id);

    let Some(resolution) = runtime.resolve(request.uri().path(), request.headers()) else {
        if request.method() == Method::POST {
            note_unmatched_api_path(&state, request.uri().path());
        }
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
    let report_refused = headers::wants_report(&parts.headers) && !resolution.policy.allow_report;
    // Requests that are not compacted keep their body streaming.
    let untouched = if parts.method != Method::POST {
        Some(Status::Skipped("not-post"))
    } else if crate::format::is_provider_compaction_path(parts.uri.path()) {
        // The provider compacts it: its body is the provider's to read.
        Some(Status::Skipped("provider-compaction"))
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
            report_refused,
            stable: None,
            report_id: None,
            detail: None,
            baseline: None,
            summary: None,
            recall: None,
            decisions: None,
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
    let collected = match received {
        Ok(collected) => collected,
        Err(e) => return refuse(e, Some(&resolution), record),
    };
    let Collected { received, hold } = collected;
    let raw = received.bytes().clone();
    let coding = body::request_coding(&parts.headers);
    let goal = resolution.policy.relevance_goal(&parts.headers);
    let decided = match compact::decide(
        &state,
        &runtime,
        &resolution,
        received,
        coding,
        goal.clone(),
    )
    .await
    {
        Ok(decided) => decided,
        Err(e) => return refuse(e, Some(&resolution), record),
    };
    // The model-backed steps read the body decoded and parsed once.
    let decoded = model_input::wanted(&resolution, &decided)
        .then(|| model_input::decode(&runtime, &raw, coding))
        .flatten();
    let input = decoded.as_ref().and_then(|(decoded, seconds)| {
        let (input, parsing) = model_input::ModelInput::parse(
            &runtime,
            &resolution,
            decoded,
            &parts.headers,
            goal.as_deref(),
        )?;
        Some((input, seconds + parsing))
    });
    let (decided, tool_decisions, summary) = match &input {
        Some((input, seconds)) => {
            let decided = compact::Decided {
                seconds: decided.seconds.map(|s| s + seconds),
                ..decided
            };
            let (decided, tool_decisions) = decisions::apply(&state, input, decided).await;
            let (decided, summary) = summaries::apply(&state, input, decided).await;
            (decided, tool_decisions, summary)
        }
        None => (decided, None, None),
    };
    record.summary = summary.clone();
    record.decisions = tool_decisions.as_ref().map(|d| d.counts);
    record.compaction_seconds = decided.seconds;
    record.cache_hit = decided.cache_hit;
    record.skip_detail = decided.detail.clone();
    let baseline = decided.baseline;
    let (status, outcome) = (decided.status, decided.outcome);
    // A report is made when the request asks for one, and for the
    // inspector of every request (both only under `allow_report`).
    let asked = resolution.policy.allow_report && headers::wants_report(&parts.headers);
    let inspected = resolution.policy.allow_report && runtime.inspector.enabled;
    let report_id = (asked || inspected).then(|| {
        let id = state.reports.new_id();
        if inspected {
            let loss = outcome.as_ref().map(|o| o.loss);
            state
                .inspector
                .insert(inspected_summary(&id, &resolution, status, loss));
            record.inspected = Some(id.clone());
        }
        let keep = Keep {
            report: asked,
            inspector: inspected,
            decided: tool_decisions.as_ref().map(|d| d.applied.clone()),
        };
        schedule_report(
            &state,
            &runtime,
            &resolution,
            raw.clone(),
            coding,
            &id,
            keep,
        );
        id
    });
    let report_id = report_id.filter(|_| asked);
    // Recall reads the originals from the body as the client sent it.
    let original = resolution.policy.recall.map(|_| raw.clone());
    let body = match outcome.as_ref().and_then(|o| o.rewritten.clone()) {
        Some(rewritten) if status.is_compacted() => {
            // The rewritten body is plain JSON whatever the client sent.
            parts.headers.remove(header::CONTENT_ENCODING);
            parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(rewritten.len()));
            if let Some(beta) = outcome.as_ref().and_then(|o| o.beta) {
                headers::add_anthropic_beta(&mut parts.headers, beta);
            }
            rewritten
        }
        _ => raw,
    };
    let recall = match original {
        Some(original) if status.is_compacted() => recall::activate(
            &resolution.policy,
            resolution.format,
            &original,
            coding,
            &body,
            runtime.config.server.max_body_bytes,
            runtime.config.server.max_messages,
        ),
        _ => None,
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
        report_refused,
        stable,
        report_id,
        detail: decided.detail,
        baseline,
        summary,
        recall,
        decisions: tool_decisions,
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

/// Where a computed report goes.
#[derive(Clone)]
struct Keep {
    /// To the live reports (`x-compaction-report: true`).
    report: bool,
    /// To the inspector, with its side-by-side view.
    inspector: bool,
    /// The model's tool-call decisions the request applied, which the
    /// report's compaction applies too.
    decided: Option<Arc<crate::compaction::decisions::Applied>>,
}

/// What the inspector's list shows of a request's bill: the provider's
/// usage, and the estimated saving against the original request.
fn inspector_bill(
    bill: &crate::usage::Bill,
) -> (
    crate::inspector::BilledUsage,
    Option<crate::inspector::EstimatedSaving>,
) {
    let u = &bill.usage;
    let usage = crate::inspector::BilledUsage {
        uncached_input_tokens: Some(u.uncached_input),
        cache_read_input_tokens: Some(u.cache_read),
        cache_write_input_tokens: Some(u.cache_write),
        output_tokens: Some(u.output),
        cost: bill.cost,
    };
    let input = |u: &crate::usage::Usage| (u.uncached_input + u.cache_read + u.cache_write) as i64;
    let saving = bill.estimate.map(|e| crate::inspector::EstimatedSaving {
        input_tokens: Some(input(&e.original) - input(u)),
        cost: Some(e.saved - e.extra),
    });
    (usage, saving)
}

/// The inspector's line for a request, as decided.
fn inspected_summary(
    id: &str,
    resolution: &Resolution,
    status: Status,
    loss: Option<LossSummary>,
) -> crate::inspector::Summary {
    let time_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    crate::inspector::Summary {
        id: id.to_owned(),
        time_ms,
        route: resolution.route.clone(),
        format: resolution.format.as_str(),
        tenant: resolution.tenant.clone(),
        policy: resolution.policy.name.clone(),
        status: status.header(),
        status_label: status.label(),
        http_status: None,
        loss,
        usage: None,
        estimated_saving: None,
        pending: true,
        recall: None,
    }
}

/// Says once, at INFO, that a POST to a path that looks like one of the
/// APIs (it ends as chat completions, Messages or Responses do) matched no
/// route, so it went upstream uncompacted: the usual cause of a missing
/// `x-compaction-status` is a base URL whose paths no route names.
fn note_unmatched_api_path(state: &AppState, path: &str) {
    let format = match path.trim_end_matches('/') {
        p if p.ends_with("/chat/completions") => Format::Chat,
        p if p.ends_with("/messages") => Format::Anthropic,
        p if p.ends_with("/responses") => Format::Responses,
        _ => return,
    };
    let noted = &state.unmatched_noted[format as usize];
    if !noted.swap(true, std::sync::atomic::Ordering::Relaxed) {
        tracing::info!(
            path = %path,
            format = format.as_str(),
            "a POST matched no route: forwarded uncompacted, without x-compaction headers; add a [[routes]] entry for its path to compact it (said once per API)"
        );
    }
}

/// Computes a request's per-message report off the request path (on the
/// blocking pool, after the answer has gone on its way) and keeps it under
/// `id`: as a live report, or in the inspector with its side-by-side view.
fn schedule_report(
    state: &Arc<AppState>,
    runtime: &Runtime,
    resolution: &Resolution,
    raw: bytes::Bytes,
    coding: body::Coding,
    id: &str,
    keep: Keep,
) {
    let (state, policy, format) = (state.clone(), resolution.policy.clone(), resolution.format);
    let (limit, max_messages) = (
        runtime.config.server.max_body_bytes,
        runtime.config.server.max_messages,
    );
    let key = id.to_owned();
    tokio::task::spawn_blocking(move || {
        let explained = body::decode(&raw, coding, limit)
            .map_err(|_| "the body could not be decoded".to_owned())
            .and_then(|decoded| {
                let explained = crate::explain::explain_decided(
                    &decoded,
                    &policy.name,
                    &policy,
                    format,
                    max_messages,
                    keep.decided.as_deref(),
                )
                .map_err(|skip| format!("not compactable: {}", skip.reason()))?;
                let report = keep
                    .report
                    .then(|| serde_json::to_vec(&explained.report).expect("reports serialise"));
                let view = keep
                    .inspector
                    .then(|| crate::inspector::view::detail(&explained));
                Ok((report, view))
            });
        match explained {
            Ok((report, view)) => {
                if let Some(json) = report {
                    state.reports.insert(key.clone(), json.into());
                }
                if let Some(view) = view {
                    state.inspector.set_detail(&key, view);
                }
            }
            Err(why) if keep.inspector => state
                .inspector
                .set_detail(&key, crate::inspector::view::Detail::unavailable(why)),
            Err(_) => {}
        }
    });
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
    /// A report was asked for and the policy refuses it.
    report_refused: bool,
    stable: Option<StableInfo>,
    /// The id under which this request's per-message report is kept.
    report_id: Option<String>,
    /// A skip's detail, after its reason in `x-compaction-status`.
    detail: Option<String>,
    /// What the bill's estimate knows of the original request.
    baseline: Option<crate::usage::Baseline>,
    /// The summary forwarded in place of older messages.
    summary: Option<crate::outcome::SummaryReport>,
    /// `recall = true` with markers forwarded: the tool's answerer, or why
    /// the tool did not go.
    recall: Option<Result<recall::Active, recall::Note>>,
    /// The model's tool-call decisions applied (`tool_decisions = "model"`).
    decisions: Option<decisions::DecisionReport>,
}

impl Verdict {
    fn write_to(&self, headers: &mut http::HeaderMap) {
        headers::write_loss_report(
            headers,
            self.status,
            &self.resolution.policy.name,
            self.loss.as_ref(),
        );
        if let Some(detail) = &self.detail {
            headers::append_status_detail(headers, detail);
        }
        if self.bypass_refused {
            headers::note_bypass_refused(headers);
        }
        if self.report_refused {
            headers::note_report_refused(headers);
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
        if let Some(Err(note)) = &self.recall {
            note.write_to(headers);
        }
        if let Some(decided) = &self.decisions {
            headers::write_tool_decisions(headers, &decided.counts);
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
    /// The request's id in the inspector, when it keeps it.
    inspected: Option<String>,
}

impl Recorder {
    fn new(state: Arc<AppState>, event: RequestEvent) -> Self {
        Recorder {
            state,
            event,
            started: Instant::now(),
            done: false,
            inspected: None,
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
        // 0: the client left before an answer went out.
        // The bill first: a line with its status is a line complete.
        if let (Some(id), Some(bill)) = (&self.inspected, &self.event.bill) {
            let (usage, saving) = inspector_bill(bill);
            self.state.inspector.set_usage(id, usage);
            if let Some(saving) = saving {
                self.state.inspector.set_saving(id, saving);
            }
        }
        if let (Some(id), status @ 1..) = (&self.inspected, self.event.response_status) {
            self.state.inspector.set_http_status(id, status);
        }
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
    mut verdict: Option<Verdict>,
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
    headers::strip_control(&mut parts.headers, runtime.own_tenant_header());
    match state.upstream.host() {
        Some(host) => parts.headers.insert(header::HOST, host.clone()),
        None => parts.headers.remove(header::HOST),
    };

    // Recall answers the model's calls itself: it keeps what a follow-up needs.
    let recall = match verdict.as_mut().and_then(|v| v.recall.take()) {
        Some(Ok(active)) => {
            recall::Template::prepare(&mut parts.headers);
            let template = recall::Template {
                method: parts.method.clone(),
                uri: parts.uri.clone(),
                headers: parts.headers.clone(),
            };
            Some((active, template))
        }
        Some(Err(note)) => {
            if let Some(v) = verdict.as_mut() {
                v.recall = Some(Err(note));
            }
            None
        }
        None => None,
    };
    let header_timeout = runtime.timeouts.response_header;
    let idle = runtime.timeouts.upstream_idle;
    let body_idle = runtime.timeouts.body_idle;
    let sent = Instant::now();
    let response = match state
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
            record.upstream_failure = e.upstream_cause();
            if let Some(v) = &verdict {
                v.write_to(response.headers_mut());
            }
            record.response_status = response.status().as_u16();
            record.finish(ending);
            return response;
        }
    };
    let mut response = match recall {
        Some((active, template)) => {
            let timeouts = (header_timeout, idle, body_idle);
            match recall::answer(state, active, template, response, timeouts).await {
                Ok((answered, done)) => {
                    // The report and the inspector say what was recalled.
                    let done = done.record();
                    if let Some(id) = verdict.as_ref().and_then(|v| v.report_id.clone()) {
                        state.recalled.insert(id, done.clone());
                    }
                    if let Some(id) = &record.inspected {
                        state.inspector.set_recall(id, done);
                    }
                    answered.map(|b| http_body_util::Either::Right(body::full(b)))
                }
                Err(e) => return recall_failed(&e, verdict.as_ref(), record),
            }
        }
        None => response.map(http_body_util::Either::Left),
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

    // Step 8's bill: the usage the response reports, on matched routes.
    let reader = verdict.as_ref().and_then(|v| {
        crate::usage::Reader::for_response(v.resolution.format, parts.status, &parts.headers)
    });
    let billing = verdict.map(|v| {
        (
            runtime.prices.clone(),
            v.baseline,
            v.resolution.format,
            v.report_id,
        )
    });
    let watched = in_flight::Watched::new(upstream_body, idle, move |end: BodyEnd, read| {
        if let (Some(read), Some((prices, baseline, format, report_id))) = (read, billing) {
            record.bill = crate::usage::Bill::of(read, &prices, baseline.as_ref(), format);
            if let (Some(id), Some(bill)) = (report_id, &record.bill) {
                record.state.bills.insert(id, bill.clone());
            }
        }
        record.upstream_seconds = Some(sent.elapsed().as_secs_f64());
        let ending = match end {
            BodyEnd::Complete => Ending::Complete,
            BodyEnd::Failed(e, cause) => {
                record.upstream_failure = Some(cause);
                Ending::UpstreamFailed(e)
            }
            BodyEnd::Abandoned => Ending::ClientGone,
        };
        record.finish(ending);
    });
    Response::from_parts(parts, watched.reading(reader).boxed_unsync())
}

/// The proxy's answer when a recall round failed upstream: as for the
/// first round's failure, in the route's error shape with the loss report.
fn recall_failed(
    error: &ProxyError,
    verdict: Option<&Verdict>,
    mut record: Recorder,
) -> Response<ProxyBody> {
    let format = verdict.map(|v| v.resolution.format);
    let (mut response, ending) = error_response(error, format.unwrap_or_default());
    record.upstream_failure = error.upstream_cause();
    if let Some(v) = verdict {
        v.write_to(response.headers_mut());
    }
    record.response_status = response.status().as_u16();
    record.finish(ending);
    response
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
        // The upstream failed (502, 504): not a refusal of the proxy's.
        e if e.upstream_cause().is_some() => Ending::UpstreamFailed(e.to_string()),
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
        let status = Status::Refused(error.refusal_reason());
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
