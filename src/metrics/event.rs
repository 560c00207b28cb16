//! One finished request as a [`RequestEvent`]: recorded in the [`Metrics`]
//! and written as its log line in one call, so the two cannot disagree.

use std::sync::{Arc, OnceLock};

use prometheus::{IntCounter, IntCounterVec};

use super::{code_class, unmatched_route, Metrics, CODE_CLASSES, PASSES};
use crate::error::UpstreamCause;
use crate::format::Format;
use crate::outcome::{LossSummary, Status};

/// Everything known about one finished request.
#[derive(Debug, Clone)]
pub struct RequestEvent {
    pub method: http::Method,
    /// Path without query (queries may carry keys).
    pub path: String,
    pub route: Arc<str>,
    pub policy: Option<Arc<str>>,
    pub tenant: Arc<str>,
    pub status: Option<Status>,
    pub loss: Option<LossSummary>,
    pub compaction_seconds: Option<f64>,
    pub upstream_status: Option<u16>,
    /// Time from forwarding to the upstream's response headers.
    pub upstream_first_byte_seconds: Option<f64>,
    pub upstream_seconds: Option<f64>,
    pub response_status: u16,
    pub total_seconds: f64,
    pub ending: Ending,
    /// The route's body format, on matched routes.
    pub format: Option<Format>,
    /// Stable mode re-compacted on this turn.
    pub rebased: bool,
    /// Stable mode: whether the replay found a checkpoint (`None`: no
    /// replay ran).
    pub checkpoint_hit: Option<bool>,
    /// Whether the compaction cache answered (`None`: not looked up).
    pub cache_hit: Option<bool>,
    /// A skip's detail (the message and what is wrong with it), for the
    /// log line; never a metric label.
    pub skip_detail: Option<String>,
    /// How the upstream failed the request, if it did.
    pub upstream_failure: Option<UpstreamCause>,
    /// The request's `x-request-id`, given or made.
    pub request_id: Option<http::HeaderValue>,
    /// What the provider billed, priced, and the estimate (when the
    /// response reported its usage).
    pub bill: Option<crate::usage::Bill>,
    /// `strategy = "summarize"`: the summary this request forwarded.
    pub summary: Option<crate::outcome::SummaryReport>,
    /// `tool_decisions = "model"`: the model's decisions this request
    /// applied, counted in `tool_decisions_total` and logged.
    pub decisions: Option<crate::outcome::DecisionCounts>,
}

/// How a request ended, which sets the level of its log line: a client's
/// mistake is a WARN, the upstream's or our failure an ERROR, a client
/// leaving early is ordinary (INFO).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Ending {
    /// The response went out whole.
    #[default]
    Complete,
    /// The client left before the end.
    ClientGone,
    /// The upstream failed or fell silent in the middle of its response.
    UpstreamFailed(String),
    /// The proxy answered with an error of its own (413, 502, 504, ...).
    Refused(String),
}

impl Ending {
    fn label(&self) -> &'static str {
        match self {
            Ending::Complete => "complete",
            Ending::ClientGone => "client-gone",
            Ending::UpstreamFailed(_) => "upstream-failed",
            Ending::Refused(_) => "refused",
        }
    }

    fn detail(&self) -> Option<&str> {
        match self {
            Ending::UpstreamFailed(e) | Ending::Refused(e) => Some(e),
            _ => None,
        }
    }
}

impl RequestEvent {
    /// An event for a request not yet routed or answered.
    pub fn new(method: http::Method, path: String) -> Self {
        RequestEvent {
            method,
            path,
            route: unmatched_route(),
            policy: None,
            tenant: crate::policy::other_tenant(),
            status: None,
            loss: None,
            compaction_seconds: None,
            upstream_status: None,
            upstream_first_byte_seconds: None,
            upstream_seconds: None,
            response_status: 0,
            total_seconds: 0.0,
            ending: Ending::Complete,
            format: None,
            rebased: false,
            checkpoint_hit: None,
            cache_hit: None,
            skip_detail: None,
            upstream_failure: None,
            request_id: None,
            bill: None,
            summary: None,
            decisions: None,
        }
    }

    /// Records the event in `metrics` and writes its log line.
    pub fn emit(&self, metrics: &Metrics) {
        let policy = self.policy.as_deref().unwrap_or("none");
        let series = metrics.series(&self.route, policy, &self.tenant);
        if let Some(status) = self.status {
            let format = self.format.map_or(0, |f| 1 + f as usize);
            let class = code_class(self.response_status);
            series.requests[format][status.index()][class]
                .get_or_init(|| {
                    metrics.requests.with_label_values(&[
                        &*self.route,
                        policy,
                        &*self.tenant,
                        status.label(),
                        self.format.map_or("none", Format::as_str),
                        CODE_CLASSES[class],
                    ])
                })
                .inc();
            // A reason is one of the proxy's own &'static str: bounded.
            match status {
                Status::Skipped(reason) => metrics
                    .skipped
                    .with_label_values(&[&self.route, policy, reason])
                    .inc(),
                Status::Refused(reason) => metrics
                    .refused
                    .with_label_values(&[&self.route, policy, reason])
                    .inc(),
                _ => {}
            }
        }
        if let Some(loss) = &self.loss {
            series
                .loss(&series.input_chars, &metrics.input_chars)
                .inc_by(loss.input_chars as u64);
            series
                .loss(&series.output_chars, &metrics.output_chars)
                .inc_by(loss.output_chars as u64);
            series
                .loss(&series.dropped_messages, &metrics.dropped_messages)
                .inc_by(loss.dropped_messages as u64);
            series
                .loss(&series.deduped_messages, &metrics.deduped_messages)
                .inc_by(loss.deduped_messages as u64);
            series
                .loss(&series.trimmed_messages, &metrics.trimmed_messages)
                .inc_by(loss.trimmed_messages as u64);
            let passes = [
                loss.pruned_chars,
                loss.clipped_chars,
                loss.deduped_tool_chars,
            ];
            for ((cell, pass), chars) in series.pass_chars.iter().zip(PASSES).zip(passes) {
                cell.get_or_init(|| {
                    metrics.pass_chars.with_label_values(&[
                        &*self.route,
                        policy,
                        &*self.tenant,
                        pass,
                    ])
                })
                .inc_by(chars as u64);
            }
            if let (Some(input), Some(output)) = (loss.input_tokens, loss.output_tokens) {
                series
                    .loss(&series.input_tokens, &metrics.input_tokens)
                    .inc_by(input as u64);
                series
                    .loss(&series.output_tokens, &metrics.output_tokens)
                    .inc_by(output as u64);
            }
            // Created at 0 on the first request of a label set, so the series
            // exists (and rates read 0, not "no data") before any miss.
            let missed = series.loss(&series.budget_missed, &metrics.budget_missed);
            if !loss.budget_met {
                missed.inc();
            }
            // Only requests whose messages were cut: an unchanged request's
            // 1.0 would pull every percentile to 1 and hide the loss.
            if self.status.is_some_and(Status::is_compacted) {
                series
                    .retained_ratio
                    .get_or_init(|| {
                        metrics.retained_ratio.with_label_values(&[
                            &self.route,
                            policy,
                            &self.tenant,
                        ])
                    })
                    .observe(loss.retained_ratio);
            }
        }
        if let Some(seconds) = self.compaction_seconds {
            series
                .compaction_duration
                .get_or_init(|| {
                    metrics
                        .compaction_duration
                        .with_label_values(&[&self.route, policy])
                })
                .observe(seconds);
        }
        let hit_or_miss = |hit: bool,
                           cell: &OnceLock<[IntCounter; 2]>,
                           vecs: [&IntCounterVec; 2]| {
            let [hits, misses] = cell.get_or_init(|| vecs.map(|v| v.with_label_values(&[policy])));
            if hit {
                hits.inc()
            } else {
                misses.inc()
            }
        };
        if let Some(hit) = self.cache_hit {
            hit_or_miss(
                hit,
                &series.cache,
                [&metrics.cache_hits, &metrics.cache_misses],
            );
        }
        if let Some(hit) = self.checkpoint_hit {
            let vecs = [&metrics.checkpoint_hits, &metrics.checkpoint_misses];
            hit_or_miss(hit, &series.checkpoints, vecs);
        }
        if self.rebased {
            series
                .stable_rebases
                .get_or_init(|| {
                    metrics
                        .stable_rebases
                        .with_label_values(&[&self.route, policy, &self.tenant])
                })
                .inc();
        }
        if let Some(code) = self.upstream_status {
            let count = || {
                metrics
                    .upstream_responses
                    .with_label_values(&[&*self.route, code.to_string().as_str()])
            };
            match series
                .upstream_responses
                .get(usize::from(code).wrapping_sub(100))
            {
                Some(cell) => cell.get_or_init(count).inc(),
                None => count().inc(),
            }
        }
        if let Some(cause) = self.upstream_failure {
            let i = UpstreamCause::ALL
                .iter()
                .position(|c| *c == cause)
                .expect("every cause is in ALL");
            series.upstream_failures[i]
                .get_or_init(|| {
                    metrics
                        .upstream_failures
                        .with_label_values(&[&*self.route, cause.label()])
                })
                .inc();
        }
        if let Some(seconds) = self.upstream_first_byte_seconds {
            series
                .upstream_first_byte
                .get_or_init(|| {
                    metrics
                        .upstream_first_byte
                        .with_label_values(&[&self.route])
                })
                .observe(seconds);
        }
        if let Some(bill) = &self.bill {
            let billed = series.bill(metrics, &bill.family);
            let u = &bill.usage;
            for (counter, tokens) in
                billed
                    .input
                    .iter()
                    .zip([u.uncached_input, u.cache_read, u.cache_write])
            {
                counter.inc_by(tokens);
            }
            billed.output.inc_by(u.output);
            let labels = [&*self.route, policy, &*self.tenant, &*bill.family];
            if let Some(cost) = bill.cost {
                billed
                    .cost
                    .get_or_init(|| metrics.billed_cost.with_label_values(&labels))
                    .inc_by(cost);
            }
            if let Some(estimate) = &bill.estimate {
                let [saved, extra] = billed.estimate.get_or_init(|| {
                    [&metrics.estimated_saved_cost, &metrics.estimated_extra_cost]
                        .map(|v| v.with_label_values(&labels))
                });
                saved.inc_by(estimate.saved);
                extra.inc_by(estimate.extra);
            }
        }
        if let Some(decided) = &self.decisions {
            metrics.tool_decisions(policy, decided);
        }
        if let Some(seconds) = self.upstream_seconds {
            series
                .upstream_duration
                .get_or_init(|| metrics.upstream_duration.with_label_values(&[&self.route]))
                .observe(seconds);
        }
        self.log();
    }

    /// Whether the request went upstream as it came, by rule: nothing to
    /// report beyond the metrics.
    fn passed_through(&self) -> bool {
        matches!(
            self.status,
            None | Some(Status::Unchanged | Status::Bypassed | Status::Skipped("not-post"))
        )
    }

    /// One line per request, at a level that says what happened:
    /// - ERROR: the upstream or the proxy failed; WARN: a client's mistake
    ///   refused by the proxy;
    /// - INFO: the proxy changed the request (compacted, a dry run), could
    ///   not compact it (skipped), or the client left;
    /// - DEBUG: a request passed through untouched (unmatched, unchanged,
    ///   bypassed, not a POST). At thousands of requests a second these
    ///   lines cost as much CPU as the proxying and say nothing the metrics
    ///   do not; `RUST_LOG=info,compaction_proxy::metrics=debug` shows them.
    ///
    /// Written without allocation for its fields, durations rounded to
    /// microseconds, no colour off a terminal, buffered per worker
    /// ([`crate::log_buffer`]).
    fn log(&self) {
        let (chars_in, chars_out) = self.loss.map_or((None, None), |l| {
            (Some(l.input_chars), Some(l.output_chars))
        });
        let ms = |seconds: f64| (seconds * 1e6).round() / 1e3;
        // Every string field is a &str: quoted in text logs, a string in
        // JSON, the same for all of them.
        let status = self.status.map(|s| match s {
            Status::Skipped(_) | Status::Refused(_) => std::borrow::Cow::Owned(s.header()),
            s => std::borrow::Cow::Borrowed(s.label()),
        });
        let request_id = self.request_id.as_ref().and_then(|v| v.to_str().ok());
        let usage = self.bill.as_ref().map(|b| b.usage);
        let estimate = self.bill.as_ref().and_then(|b| b.estimate);
        let decided = self.decisions.as_ref();
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    request_id,
                    method = self.method.as_str(),
                    path = self.path.as_str(),
                    route = &*self.route,
                    policy = self.policy.as_deref(),
                    tenant = &*self.tenant,
                    format = self.format.map(crate::format::Format::as_str),
                    compaction = status.as_deref(),
                    skip = self.skip_detail.as_deref(),
                    rebased = self.rebased.then_some(true),
                    chars_in,
                    chars_out,
                    response_status = self.response_status,
                    upstream_status = self.upstream_status,
                    compaction_ms = self.compaction_seconds.map(ms),
                    upstream_ms = self.upstream_seconds.map(ms),
                    total_ms = ms(self.total_seconds),
                    model = self.bill.as_ref().map(|b| &*b.family),
                    billed_uncached = usage.map(|u| u.uncached_input),
                    billed_cache_read = usage.map(|u| u.cache_read),
                    billed_cache_write = usage.map(|u| u.cache_write),
                    billed_output = usage.map(|u| u.output),
                    billed_cost = self.bill.as_ref().and_then(|b| b.cost),
                    estimated_saved_cost = estimate.map(|e| e.saved),
                    estimated_extra_cost = estimate.map(|e| e.extra),
                    ending = self.ending.label(),
                    error = self.ending.detail(),
                    summary_id = self.summary.as_ref().map(|s| s.id.as_str()),
                    summary_chunks = self.summary.as_ref().map(|s| s.chunks),
                    summary_passes = self.summary.as_ref().map(|s| s.passes),
                    summarizer_prompt_tokens = self.summary.as_ref().and_then(|s| s.prompt_tokens),
                    summarizer_completion_tokens =
                        self.summary.as_ref().and_then(|s| s.completion_tokens),
                    tool_decisions_keep = decided.map(|d| d.keep),
                    tool_decisions_drop_result = decided.map(|d| d.drop_result),
                    tool_decisions_drop_call = decided.map(|d| d.drop_call),
                    tool_decisions_source = decided.map(|d| d.source),
                    tool_decisions_prompt_tokens = decided.and_then(|d| d.prompt_tokens),
                    tool_decisions_completion_tokens = decided.and_then(|d| d.completion_tokens),
                    "request"
                )
            };
        }
        match &self.ending {
            Ending::Refused(_) if self.response_status < 500 => line!(warn),
            Ending::Refused(_) | Ending::UpstreamFailed(_) => line!(error),
            Ending::Complete if self.passed_through() => line!(debug),
            Ending::Complete | Ending::ClientGone => line!(info),
        }
    }
}
