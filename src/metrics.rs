//! Prometheus metrics and the per-request log line, emitted together from
//! one [`RequestEvent`] so the counters and the log cannot disagree.
//!
//! Labels are bounded: `route` is a configured route path or `unmatched`,
//! `policy` a configured policy name, `tenant` a configured tenant or
//! `other`, `status` one of [`Status`], `code` an HTTP status code.

use prometheus::{
    exponential_buckets, Encoder, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry,
    TextEncoder,
};

/// Route label of requests no route matched.
pub const UNMATCHED_ROUTE: &str = "unmatched";

/// What the proxy did with a request's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Compacted,
    /// Forwarded as received: it fit the budget, or nothing could be removed.
    Unchanged,
    Skipped(&'static str),
    Bypassed,
    DryRun,
}

impl Status {
    /// The metric label (no skip reason, to keep it bounded).
    pub fn label(self) -> &'static str {
        match self {
            Status::Compacted => "compacted",
            Status::Unchanged => "unchanged",
            Status::Skipped(_) => "skipped",
            Status::Bypassed => "bypassed",
            Status::DryRun => "dry-run",
        }
    }

    /// The `x-compaction-status` header value.
    pub fn header(self) -> String {
        match self {
            Status::Skipped(reason) => format!("skipped; {reason}"),
            other => other.label().to_owned(),
        }
    }
}

/// The loss figures reported in headers and metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LossSummary {
    pub input_chars: usize,
    pub output_chars: usize,
    pub input_messages: usize,
    pub output_messages: usize,
    pub dropped_messages: usize,
    pub trimmed_messages: usize,
    pub retained_ratio: f64,
    pub budget_met: bool,
    /// Chars the agent passes removed from messages that survive: pruned
    /// tool results, clipped tool-call arguments, repeated tool results.
    pub pruned_chars: usize,
    pub clipped_chars: usize,
    pub deduped_tool_chars: usize,
    /// Tokens in and out, when the policy has a token budget.
    pub input_tokens: Option<usize>,
    pub output_tokens: Option<usize>,
}

impl LossSummary {
    /// A conversation forwarded as it came: nothing lost, budget met.
    pub fn unchanged(chars: usize, messages: usize) -> Self {
        LossSummary {
            input_chars: chars,
            output_chars: chars,
            input_messages: messages,
            output_messages: messages,
            dropped_messages: 0,
            trimmed_messages: 0,
            retained_ratio: 1.0,
            budget_met: true,
            pruned_chars: 0,
            clipped_chars: 0,
            deduped_tool_chars: 0,
            input_tokens: None,
            output_tokens: None,
        }
    }

    /// A conversation forwarded as it came, measured against `budget`.
    pub fn unchanged_within(chars: usize, messages: usize, budget: usize) -> Self {
        LossSummary {
            budget_met: chars <= budget,
            ..Self::unchanged(chars, messages)
        }
    }

    pub fn from_report(report: &crate::engine::Report) -> Self {
        LossSummary {
            input_chars: report.loss.input_chars,
            output_chars: report.loss.output_chars,
            input_messages: report.loss.input_messages,
            output_messages: report.loss.output_messages,
            dropped_messages: report.loss.dropped_messages,
            trimmed_messages: report.loss.trimmed_messages,
            retained_ratio: report.loss.retained_char_ratio,
            budget_met: report.budget.budget_met,
            pruned_chars: 0,
            clipped_chars: 0,
            deduped_tool_chars: 0,
            input_tokens: None,
            output_tokens: None,
        }
    }
}

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    input_chars: IntCounterVec,
    output_chars: IntCounterVec,
    dropped_messages: IntCounterVec,
    trimmed_messages: IntCounterVec,
    budget_missed: IntCounterVec,
    pass_chars: IntCounterVec,
    input_tokens: IntCounterVec,
    output_tokens: IntCounterVec,
    retained_ratio: HistogramVec,
    compaction_duration: HistogramVec,
    upstream_duration: HistogramVec,
    upstream_responses: IntCounterVec,
    cache_hits: IntCounterVec,
    cache_misses: IntCounterVec,
}

/// The metric families this proxy exports (without the `_bucket`, `_sum`,
/// `_count` series of histograms).
pub const FAMILIES: [&str; 15] = [
    "compaction_proxy_requests_total",
    "compaction_proxy_input_chars_total",
    "compaction_proxy_output_chars_total",
    "compaction_proxy_dropped_messages_total",
    "compaction_proxy_trimmed_messages_total",
    "compaction_proxy_budget_missed_total",
    "compaction_proxy_pass_chars_total",
    "compaction_proxy_input_tokens_total",
    "compaction_proxy_output_tokens_total",
    "compaction_proxy_retained_ratio",
    "compaction_proxy_compaction_duration_seconds",
    "compaction_proxy_upstream_duration_seconds",
    "compaction_proxy_upstream_responses_total",
    "compaction_proxy_cache_hits_total",
    "compaction_proxy_cache_misses_total",
];

const LOSS_LABELS: &[&str] = &["route", "policy", "tenant"];

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(format!("compaction_proxy_{name}"), help), labels)
                .expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: Vec<f64>| {
            let h = HistogramVec::new(
                HistogramOpts::new(format!("compaction_proxy_{name}"), help).buckets(buckets),
                labels,
            )
            .expect("valid metric");
            registry
                .register(Box::new(h.clone()))
                .expect("unique metric");
            h
        };
        Metrics {
            requests: counter(
                "requests_total",
                "Requests to matched routes by what compaction did.",
                &["route", "policy", "tenant", "status"],
            ),
            input_chars: counter("input_chars_total", "Message chars received.", LOSS_LABELS),
            output_chars: counter(
                "output_chars_total",
                "Message chars forwarded.",
                LOSS_LABELS,
            ),
            dropped_messages: counter(
                "dropped_messages_total",
                "Messages removed (dedupe and drop).",
                LOSS_LABELS,
            ),
            trimmed_messages: counter(
                "trimmed_messages_total",
                "Forwarded messages that were trimmed.",
                LOSS_LABELS,
            ),
            budget_missed: counter(
                "budget_missed_total",
                "Requests still over budget after compaction (protected messages exceed it).",
                LOSS_LABELS,
            ),
            pass_chars: counter(
                "pass_chars_total",
                "Chars the agent passes removed from forwarded messages, by pass (pruned, clipped, deduped_tool).",
                &["route", "policy", "tenant", "pass"],
            ),
            input_tokens: counter(
                "input_tokens_total",
                "Message tokens received (policies with a token budget).",
                LOSS_LABELS,
            ),
            output_tokens: counter(
                "output_tokens_total",
                "Message tokens forwarded (policies with a token budget).",
                LOSS_LABELS,
            ),
            retained_ratio: histogram(
                "retained_ratio",
                "Share of message chars forwarded, per compacted request.",
                LOSS_LABELS,
                vec![
                    0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0,
                ],
            ),
            compaction_duration: histogram(
                "compaction_duration_seconds",
                "Time to parse, compact and rewrite a request body.",
                &["route", "policy"],
                exponential_buckets(0.000_01, 2.5, 12).expect("valid buckets"), // 10us .. ~0.6s
            ),
            upstream_duration: histogram(
                "upstream_duration_seconds",
                "Time from forwarding to the end of the upstream response body (streams included).",
                &["route"],
                vec![
                    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
                    300.0, 600.0,
                ],
            ),
            upstream_responses: counter(
                "upstream_responses_total",
                "Upstream responses by HTTP status code.",
                &["route", "code"],
            ),
            cache_hits: counter(
                "cache_hits_total",
                "Compactions answered from the cache.",
                &["policy"],
            ),
            cache_misses: counter("cache_misses_total", "Compactions computed.", &["policy"]),
            registry,
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        String::from_utf8(out).expect("exposition is UTF-8")
    }

    pub fn cache_lookup(&self, policy: &str, hit: bool) {
        // Both series of the policy exist from its first lookup, so a hit
        // ratio reads 0 rather than "no data" before the first hit.
        let hits = self.cache_hits.with_label_values(&[policy]);
        let misses = self.cache_misses.with_label_values(&[policy]);
        if hit {
            hits.inc()
        } else {
            misses.inc()
        }
    }
}

/// Everything known about one finished request.
#[derive(Debug, Clone)]
pub struct RequestEvent {
    pub method: http::Method,
    /// Path without query (queries may carry keys).
    pub path: String,
    pub route: String,
    pub policy: Option<String>,
    pub tenant: String,
    pub status: Option<Status>,
    pub loss: Option<LossSummary>,
    pub compaction_seconds: Option<f64>,
    pub upstream_status: Option<u16>,
    pub upstream_seconds: Option<f64>,
    pub response_status: u16,
    pub total_seconds: f64,
    pub ending: Ending,
    /// The route's body format, on matched routes.
    pub format: Option<crate::format::Format>,
    /// Stable mode re-compacted on this turn.
    pub rebased: bool,
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
            route: UNMATCHED_ROUTE.to_owned(),
            policy: None,
            tenant: crate::policy::OTHER_TENANT.to_owned(),
            status: None,
            loss: None,
            compaction_seconds: None,
            upstream_status: None,
            upstream_seconds: None,
            response_status: 0,
            total_seconds: 0.0,
            ending: Ending::Complete,
            format: None,
            rebased: false,
        }
    }

    /// Records the event in `metrics` and writes its log line.
    pub fn emit(&self, metrics: &Metrics) {
        let policy = self.policy.as_deref().unwrap_or("none");
        if let Some(status) = self.status {
            metrics
                .requests
                .with_label_values(&[&self.route, policy, &self.tenant, status.label()])
                .inc();
        }
        if let Some(loss) = &self.loss {
            let labels = [self.route.as_str(), policy, self.tenant.as_str()];
            metrics
                .input_chars
                .with_label_values(&labels)
                .inc_by(loss.input_chars as u64);
            metrics
                .output_chars
                .with_label_values(&labels)
                .inc_by(loss.output_chars as u64);
            metrics
                .dropped_messages
                .with_label_values(&labels)
                .inc_by(loss.dropped_messages as u64);
            metrics
                .trimmed_messages
                .with_label_values(&labels)
                .inc_by(loss.trimmed_messages as u64);
            for (pass, chars) in [
                ("pruned", loss.pruned_chars),
                ("clipped", loss.clipped_chars),
                ("deduped_tool", loss.deduped_tool_chars),
            ] {
                metrics
                    .pass_chars
                    .with_label_values(&[labels[0], labels[1], labels[2], pass])
                    .inc_by(chars as u64);
            }
            if let (Some(input), Some(output)) = (loss.input_tokens, loss.output_tokens) {
                metrics
                    .input_tokens
                    .with_label_values(&labels)
                    .inc_by(input as u64);
                metrics
                    .output_tokens
                    .with_label_values(&labels)
                    .inc_by(output as u64);
            }
            // Created at 0 on the first request of a label set, so the series
            // exists (and rates read 0, not "no data") before any miss.
            let missed = metrics.budget_missed.with_label_values(&labels);
            if !loss.budget_met {
                missed.inc();
            }
            metrics
                .retained_ratio
                .with_label_values(&labels)
                .observe(loss.retained_ratio);
        }
        if let Some(seconds) = self.compaction_seconds {
            metrics
                .compaction_duration
                .with_label_values(&[&self.route, policy])
                .observe(seconds);
        }
        if let Some(code) = self.upstream_status {
            metrics
                .upstream_responses
                .with_label_values(&[self.route.as_str(), code.to_string().as_str()])
                .inc();
        }
        if let Some(seconds) = self.upstream_seconds {
            metrics
                .upstream_duration
                .with_label_values(&[&self.route])
                .observe(seconds);
        }
        self.log();
    }

    fn log(&self) {
        let status = self.status.map(Status::header);
        let (chars_in, chars_out) = self.loss.map_or((None, None), |l| {
            (Some(l.input_chars), Some(l.output_chars))
        });
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    method = %self.method,
                    path = %self.path,
                    route = %self.route,
                    policy = self.policy.as_deref(),
                    tenant = %self.tenant,
                    compaction = status.as_deref(),
                    chars_in,
                    chars_out,
                    response_status = self.response_status,
                    upstream_status = self.upstream_status,
                    compaction_ms = self.compaction_seconds.map(|s| s * 1e3),
                    upstream_ms = self.upstream_seconds.map(|s| s * 1e3),
                    total_ms = self.total_seconds * 1e3,
                    ending = self.ending.label(),
                    error = self.ending.detail(),
                    "request"
                )
            };
        }
        match &self.ending {
            Ending::Refused(_) if self.response_status < 500 => line!(warn),
            Ending::Refused(_) | Ending::UpstreamFailed(_) => line!(error),
            Ending::Complete | Ending::ClientGone => line!(info),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exported_families_match_the_registered_ones() {
        let m = Metrics::new();
        m.cache_lookup("p", true);
        let event = RequestEvent {
            method: http::Method::POST,
            path: "/v1/chat/completions".into(),
            route: "/v1/chat/completions".into(),
            policy: Some("p".into()),
            tenant: "other".into(),
            status: Some(Status::Compacted),
            loss: Some(LossSummary {
                input_chars: 10,
                output_chars: 4,
                input_messages: 3,
                output_messages: 2,
                dropped_messages: 1,
                trimmed_messages: 0,
                retained_ratio: 0.4,
                budget_met: false,
                pruned_chars: 0,
                clipped_chars: 0,
                deduped_tool_chars: 0,
                input_tokens: Some(5),
                output_tokens: Some(3),
            }),
            compaction_seconds: Some(0.001),
            upstream_status: Some(200),
            upstream_seconds: Some(0.2),
            response_status: 200,
            total_seconds: 0.2,
            format: None,
            rebased: false,
            ending: Ending::Complete,
        };
        event.emit(&m);
        m.cache_lookup("p", false);
        let mut names: Vec<String> = m
            .registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .collect();
        names.sort();
        let mut expected: Vec<String> = FAMILIES.iter().map(|s| s.to_string()).collect();
        expected.sort();
        assert_eq!(names, expected);
        let text = m.render();
        assert!(text.contains(
            "compaction_proxy_requests_total{policy=\"p\",route=\"/v1/chat/completions\",status=\"compacted\",tenant=\"other\"} 1"
        ), "{text}");
        assert!(text.contains("compaction_proxy_budget_missed_total{policy=\"p\",route=\"/v1/chat/completions\",tenant=\"other\"} 1"));
    }
}
