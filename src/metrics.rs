//! Prometheus metrics and the per-request log line, emitted together from
//! one [`RequestEvent`] so the counters and the log cannot disagree.
//!
//! Labels are bounded: `route` is a configured route path or `unmatched`,
//! `policy` a configured policy name, `tenant` a configured tenant or
//! `other`, `status` one of [`Status`], `code` an HTTP status code.

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use prometheus::{
    exponential_buckets, Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter,
    IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// Route label of requests no route matched.
pub const UNMATCHED_ROUTE: &str = "unmatched";

use crate::format::Format;
use crate::outcome::{LossSummary, Status};

/// [`UNMATCHED_ROUTE`] as a shared label (a reference count per request).
fn unmatched_route() -> Arc<str> {
    static UNMATCHED: std::sync::LazyLock<Arc<str>> =
        std::sync::LazyLock::new(|| UNMATCHED_ROUTE.into());
    UNMATCHED.clone()
}

pub struct Metrics {
    registry: Registry,
    requests: IntCounterVec,
    input_chars: IntCounterVec,
    output_chars: IntCounterVec,
    dropped_messages: IntCounterVec,
    deduped_messages: IntCounterVec,
    trimmed_messages: IntCounterVec,
    budget_missed: IntCounterVec,
    pass_chars: IntCounterVec,
    input_tokens: IntCounterVec,
    output_tokens: IntCounterVec,
    skipped: IntCounterVec,
    retained_ratio: HistogramVec,
    compaction_duration: HistogramVec,
    upstream_duration: HistogramVec,
    upstream_first_byte: HistogramVec,
    upstream_responses: IntCounterVec,
    cache_hits: IntCounterVec,
    cache_misses: IntCounterVec,
    checkpoint_hits: IntCounterVec,
    checkpoint_misses: IntCounterVec,
    stable_rebases: IntCounterVec,
    config_reloads: IntCounterVec,
    summarizer_tokens: IntCounterVec,
    summarize_fallbacks: IntCounterVec,
    summary_store_errors: IntCounterVec,
    /// Tasks alive on [`Self::runtimes`], read at each scrape: what a soak
    /// watches for connections that are never let go.
    tasks: IntGauge,
    runtimes: Mutex<Vec<tokio::runtime::Handle>>,
    /// Label-resolved series per (route, policy, tenant): looking a label
    /// set up in a metric vector hashes the values and takes a lock, per
    /// metric; a request resolves its set here once instead.
    series: RwLock<SeriesMap>,
}

/// route -> policy -> tenant -> series; nested so a lookup borrows `&str`s.
type SeriesMap = FxHashMap<String, FxHashMap<String, FxHashMap<String, Arc<Series>>>>;

/// The series of one (route, policy, tenant), each created on first use so
/// the exposition shows only label sets that occurred.
struct Series {
    route: String,
    policy: String,
    tenant: String,
    /// By format (none, then [`Format::ALL`]), then status.
    requests: [[OnceLock<IntCounter>; 5]; 4],
    input_chars: OnceLock<IntCounter>,
    output_chars: OnceLock<IntCounter>,
    dropped_messages: OnceLock<IntCounter>,
    deduped_messages: OnceLock<IntCounter>,
    trimmed_messages: OnceLock<IntCounter>,
    budget_missed: OnceLock<IntCounter>,
    retained_ratio: OnceLock<Histogram>,
    compaction_duration: OnceLock<Histogram>,
    upstream_duration: OnceLock<Histogram>,
    upstream_first_byte: OnceLock<Histogram>,
    /// By pass: pruned, clipped, deduped_tool ([`PASSES`]).
    pass_chars: [OnceLock<IntCounter>; 3],
    input_tokens: OnceLock<IntCounter>,
    output_tokens: OnceLock<IntCounter>,
    /// The policy's cache hits and misses, made together so a hit ratio
    /// reads 0 rather than "no data" before the first hit.
    cache: OnceLock<[IntCounter; 2]>,
    /// The policy's checkpoint hits and misses (stable mode).
    checkpoints: OnceLock<[IntCounter; 2]>,
    stable_rebases: OnceLock<IntCounter>,
    /// `upstream_responses{route, code}` for codes 100 to 599, by code - 100.
    upstream_responses: Box<[OnceLock<IntCounter>]>,
}

/// The agent passes, as labelled in `pass_chars_total`.
const PASSES: [&str; 3] = ["pruned", "clipped", "deduped_tool"];

impl Series {
    fn new(route: &str, policy: &str, tenant: &str) -> Self {
        Series {
            route: route.to_owned(),
            policy: policy.to_owned(),
            tenant: tenant.to_owned(),
            requests: Default::default(),
            input_chars: OnceLock::new(),
            output_chars: OnceLock::new(),
            dropped_messages: OnceLock::new(),
            deduped_messages: OnceLock::new(),
            trimmed_messages: OnceLock::new(),
            budget_missed: OnceLock::new(),
            retained_ratio: OnceLock::new(),
            compaction_duration: OnceLock::new(),
            upstream_duration: OnceLock::new(),
            upstream_first_byte: OnceLock::new(),
            pass_chars: Default::default(),
            input_tokens: OnceLock::new(),
            output_tokens: OnceLock::new(),
            cache: OnceLock::new(),
            checkpoints: OnceLock::new(),
            stable_rebases: OnceLock::new(),
            upstream_responses: (100..600).map(|_| OnceLock::new()).collect(),
        }
    }

    fn loss<'a>(&self, cell: &'a OnceLock<IntCounter>, vec: &IntCounterVec) -> &'a IntCounter {
        cell.get_or_init(|| vec.with_label_values(&[&self.route, &self.policy, &self.tenant]))
    }
}

/// The metric families this proxy exports (without the `_bucket`, `_sum`,
/// `_count` series of histograms). The `process_*` families of the
/// Prometheus process collector (RSS, open fds, CPU) come on top.
pub const FAMILIES: [&str; 23] = [
    "compaction_proxy_requests_total",
    "compaction_proxy_input_chars_total",
    "compaction_proxy_output_chars_total",
    "compaction_proxy_dropped_messages_total",
    "compaction_proxy_deduped_messages_total",
    "compaction_proxy_trimmed_messages_total",
    "compaction_proxy_budget_missed_total",
    "compaction_proxy_pass_chars_total",
    "compaction_proxy_input_tokens_total",
    "compaction_proxy_output_tokens_total",
    "compaction_proxy_skipped_total",
    "compaction_proxy_retained_ratio",
    "compaction_proxy_compaction_duration_seconds",
    "compaction_proxy_upstream_duration_seconds",
    "compaction_proxy_upstream_first_byte_seconds",
    "compaction_proxy_upstream_responses_total",
    "compaction_proxy_cache_hits_total",
    "compaction_proxy_cache_misses_total",
    "compaction_proxy_checkpoint_hits_total",
    "compaction_proxy_checkpoint_misses_total",
    "compaction_proxy_stable_rebases_total",
    "compaction_proxy_config_reloads_total",
    "compaction_proxy_tasks",
];

const LOSS_LABELS: &[&str] = &["route", "policy", "tenant"];

/// Upstream latency buckets, from a fast local model to a 10-minute stream.
const UPSTREAM_BUCKETS: [f64; 15] = [
    0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// The families of summaries, exported once a summarizing policy has
/// run (beside [`FAMILIES`], which every proxy exports).
pub const SUMMARY_FAMILIES: [&str; 3] = [
    "compaction_proxy_summarizer_tokens_total",
    "compaction_proxy_summarize_fallbacks_total",
    "compaction_proxy_summary_store_errors_total",
];

/// Values of the `result` label of `config_reloads_total`.
pub const RELOAD_APPLIED: &str = "applied";
pub const RELOAD_REFUSED: &str = "refused";

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
        // RSS, open fds, CPU seconds, start time (Linux only; elsewhere the
        // collector exports nothing).
        registry
            .register(Box::new(
                prometheus::process_collector::ProcessCollector::for_self(),
            ))
            .expect("unique metric");
        let config_reloads = counter(
            "config_reloads_total",
            "Configuration reloads (SIGHUP or file change) by result: applied or refused.",
            &["result"],
        );
        for result in [RELOAD_APPLIED, RELOAD_REFUSED] {
            config_reloads.with_label_values(&[result]);
        }
        let tasks = IntGauge::new(
            "compaction_proxy_tasks",
            "Tokio tasks alive on the proxy's runtimes: one per client and per upstream connection, plus a few of the proxy's own.",
        )
        .expect("valid metric");
        registry
            .register(Box::new(tasks.clone()))
            .expect("unique metric");
        let summarizer_tokens = counter(
            "summarizer_tokens_total",
            "Tokens the summarizers' providers reported, by policy, summarizer and kind (prompt or completion).",
            &["policy", "summarizer", "kind"],
        );
        let summarize_fallbacks = counter(
            "summarize_fallbacks_total",
            "Requests of a summarizing policy compacted by the engine alone, by policy and why the summary could not be had.",
            &["policy", "reason"],
        );
        let summary_store_errors = counter(
            "summary_store_errors_total",
            "Summary store commands to Redis that failed or timed out, by operation (connect, get, put); the store then serves from this process alone.",
            &["operation"],
        );
        Metrics {
            summary_store_errors,
            summarizer_tokens,
            summarize_fallbacks,
            requests: counter(
                "requests_total",
                "Requests to matched routes by body format and what compaction did.",
                &["route", "policy", "tenant", "status", "format"],
            ),
            input_chars: counter("input_chars_total", "Message chars received.", LOSS_LABELS),
            output_chars: counter(
                "output_chars_total",
                "Message chars forwarded.",
                LOSS_LABELS,
            ),
            dropped_messages: counter(
                "dropped_messages_total",
                "Messages removed (dedupe and drop, as the report's loss counts them).",
                LOSS_LABELS,
            ),
            deduped_messages: counter(
                "deduped_messages_total",
                "Messages removed by the dedupe stage (a part of dropped_messages_total).",
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
            skipped: counter(
                "skipped_total",
                "Requests forwarded uncompacted (status skipped), by reason (a fixed set).",
                &["route", "policy", "reason"],
            ),
            retained_ratio: histogram(
                "retained_ratio",
                "Share of message chars forwarded, per compacted request (status compacted only).",
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
                UPSTREAM_BUCKETS.to_vec(),
            ),
            upstream_first_byte: histogram(
                "upstream_first_byte_seconds",
                "Time from forwarding to the upstream's response headers (time to first byte).",
                &["route"],
                UPSTREAM_BUCKETS.to_vec(),
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
            checkpoint_hits: counter(
                "checkpoint_hits_total",
                "Stable-mode replays resumed from an earlier turn's checkpoint.",
                &["policy"],
            ),
            checkpoint_misses: counter(
                "checkpoint_misses_total",
                "Stable-mode replays run from the first message (no checkpoint found).",
                &["policy"],
            ),
            stable_rebases: counter(
                "stable_rebases_total",
                "Stable-mode turns whose new messages caused a re-compaction.",
                LOSS_LABELS,
            ),
            config_reloads,
            tasks,
            runtimes: Mutex::default(),
            series: RwLock::new(FxHashMap::default()),
            registry,
        }
    }

    /// Counts the tasks of `runtime` in `compaction_proxy_tasks` from now on.
    pub fn count_tasks_of(&self, runtime: tokio::runtime::Handle) {
        self.runtimes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(runtime);
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let tasks: usize = self
            .runtimes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|runtime| runtime.metrics().num_alive_tasks())
            .sum();
        self.tasks.set(i64::try_from(tasks).unwrap_or(i64::MAX));
        let mut out = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut out)
            .expect("text encoding cannot fail");
        String::from_utf8(out).expect("exposition is UTF-8")
    }

    /// Counts what one summary cost at its provider.
    pub fn summarizer_tokens(
        &self,
        policy: &str,
        summarizer: &str,
        usage: crate::summarizer::Usage,
    ) {
        for (kind, tokens) in [
            ("prompt", usage.prompt_tokens),
            ("completion", usage.completion_tokens),
        ] {
            if let Some(tokens) = tokens {
                self.summarizer_tokens
                    .with_label_values(&[policy, summarizer, kind])
                    .inc_by(tokens);
            }
        }
    }

    /// The counter the shared summary store counts its failures in.
    pub fn summary_store_errors(&self) -> IntCounterVec {
        self.summary_store_errors.clone()
    }

    /// Counts one request that fell back to the engine, by its reason
    /// (a [`crate::summarizer::SummarizeError::reason`]: bounded).
    pub fn summarize_fallback(&self, policy: &str, reason: &'static str) {
        self.summarize_fallbacks
            .with_label_values(&[policy, reason])
            .inc();
    }

    /// Counts one configuration reload by its result
    /// ([`RELOAD_APPLIED`] or [`RELOAD_REFUSED`]).
    pub fn config_reload(&self, result: &'static str) {
        self.config_reloads.with_label_values(&[result]).inc();
    }

    /// The series of one label set, resolved once and reused. Labels are
    /// bounded (configured routes, policies, tenants), so is this map.
    fn series(&self, route: &str, policy: &str, tenant: &str) -> Arc<Series> {
        let found = self
            .series
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(route)
            .and_then(|p| p.get(policy))
            .and_then(|t| t.get(tenant))
            .cloned();
        if let Some(found) = found {
            return found;
        }
        let mut map = self.series.write().unwrap_or_else(|e| e.into_inner());
        map.entry(route.to_owned())
            .or_default()
            .entry(policy.to_owned())
            .or_default()
            .entry(tenant.to_owned())
            .or_insert_with(|| Arc::new(Series::new(route, policy, tenant)))
            .clone()
    }
}

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
    /// `strategy = "summarize"`: the summary this request forwarded.
    pub summary: Option<crate::outcome::SummaryReport>,
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
            summary: None,
        }
    }

    /// Records the event in `metrics` and writes its log line.
    pub fn emit(&self, metrics: &Metrics) {
        let policy = self.policy.as_deref().unwrap_or("none");
        let series = metrics.series(&self.route, policy, &self.tenant);
        if let Some(status) = self.status {
            let format = self.format.map_or(0, |f| 1 + f as usize);
            series.requests[format][status.index()]
                .get_or_init(|| {
                    metrics.requests.with_label_values(&[
                        &*self.route,
                        policy,
                        &*self.tenant,
                        status.label(),
                        self.format.map_or("none", Format::as_str),
                    ])
                })
                .inc();
            if let Status::Skipped(reason) = status {
                // `reason` is one of the proxy's own &'static str: bounded.
                metrics
                    .skipped
                    .with_label_values(&[&self.route, policy, reason])
                    .inc();
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
        if let Some(seconds) = self.upstream_seconds {
            series
                .upstream_duration
                .get_or_init(|| metrics.upstream_duration.with_label_values(&[&self.route]))
                .observe(seconds);
        }
        self.log();
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
    /// Whether the request went upstream as it came, by rule: nothing to
    /// report beyond the metrics.
    fn passed_through(&self) -> bool {
        matches!(
            self.status,
            None | Some(Status::Unchanged | Status::Bypassed | Status::Skipped("not-post"))
        )
    }

    fn log(&self) {
        let (chars_in, chars_out) = self.loss.map_or((None, None), |l| {
            (Some(l.input_chars), Some(l.output_chars))
        });
        let ms = |seconds: f64| (seconds * 1e6).round() / 1e3;
        macro_rules! line {
            ($level:ident) => {
                tracing::$level!(
                    method = %self.method,
                    path = %self.path,
                    route = %self.route,
                    policy = self.policy.as_deref(),
                    tenant = %self.tenant,
                    format = self.format.map(crate::format::Format::as_str),
                    compaction = self.status.as_ref().map(tracing::field::display),
                    rebased = self.rebased.then_some(true),
                    chars_in,
                    chars_out,
                    response_status = self.response_status,
                    upstream_status = self.upstream_status,
                    compaction_ms = self.compaction_seconds.map(ms),
                    upstream_ms = self.upstream_seconds.map(ms),
                    total_ms = ms(self.total_seconds),
                    ending = self.ending.label(),
                    error = self.ending.detail(),
                    summary_id = self.summary.as_ref().map(|s| s.id.as_str()),
                    summary_chunks = self.summary.as_ref().map(|s| s.chunks),
                    summary_passes = self.summary.as_ref().map(|s| s.passes),
                    summarizer_prompt_tokens = self.summary.as_ref().and_then(|s| s.prompt_tokens),
                    summarizer_completion_tokens = self.summary.as_ref().and_then(|s| s.completion_tokens),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Tests that emit take turns: the log line's callsites cache whether
    /// anyone listens, and a test emitting with no subscriber while the
    /// log test listens could leave it nothing to read.
    static EMITTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn serially(f: impl FnOnce()) {
        let _turn = EMITTING.lock().unwrap_or_else(|e| e.into_inner());
        f()
    }

    fn event(status: Status, loss: Option<LossSummary>) -> RequestEvent {
        RequestEvent {
            route: "/v1/chat/completions".into(),
            policy: Some("p".into()),
            status: Some(status),
            loss,
            compaction_seconds: Some(0.001),
            upstream_status: Some(200),
            upstream_first_byte_seconds: Some(0.05),
            upstream_seconds: Some(0.2),
            response_status: 200,
            total_seconds: 0.2,
            format: Some(Format::Chat),
            ..RequestEvent::new(http::Method::POST, "/v1/chat/completions".into())
        }
    }

    fn loss(ratio: f64) -> LossSummary {
        LossSummary {
            input_chars: 10,
            output_chars: 4,
            input_messages: 3,
            output_messages: 1,
            dropped_messages: 2,
            deduped_messages: 1,
            trimmed_messages: 0,
            retained_ratio: ratio,
            budget_met: false,
            pruned_chars: 0,
            clipped_chars: 0,
            deduped_tool_chars: 0,
            input_tokens: Some(5),
            output_tokens: Some(3),
            budget_tokens: None,
        }
    }

    /// The value of the one sample of `name` whose labels include `labels`.
    fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
        text.lines()
            .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
            .find(|l| labels.iter().all(|kv| l.contains(kv)))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
    }

    #[test]
    fn exported_families_match_the_registered_ones() {
        let m = Metrics::new();
        let mut cached = event(Status::Compacted, Some(loss(0.4)));
        cached.cache_hit = Some(true);
        serially(|| cached.emit(&m));
        serially(|| event(Status::Skipped("invalid-json"), None).emit(&m));
        for hit in [true, false] {
            let mut stable = event(Status::Compacted, Some(loss(0.4)));
            stable.rebased = true;
            stable.checkpoint_hit = Some(hit);
            stable.cache_hit = Some(false);
            serially(|| stable.emit(&m));
        }
        m.config_reload(RELOAD_APPLIED);
        let mut names: Vec<String> = m
            .registry
            .gather()
            .iter()
            .map(|f| f.name().to_owned())
            .filter(|n| n.starts_with("compaction_proxy_"))
            .collect();
        names.sort();
        let mut expected: Vec<String> = FAMILIES.iter().map(|s| s.to_string()).collect();
        expected.sort();
        assert_eq!(names, expected);
        let text = m.render();
        // One plain compacted request and two stable ones.
        assert!(text.contains(
            "compaction_proxy_requests_total{format=\"chat\",policy=\"p\",route=\"/v1/chat/completions\",status=\"compacted\",tenant=\"other\"} 3"
        ), "{text}");
        assert!(text.contains("compaction_proxy_budget_missed_total{policy=\"p\",route=\"/v1/chat/completions\",tenant=\"other\"} 3"));
        assert!(text.contains("compaction_proxy_stable_rebases_total{policy=\"p\",route=\"/v1/chat/completions\",tenant=\"other\"} 2"));
        assert!(text.contains("compaction_proxy_checkpoint_hits_total{policy=\"p\"} 1"));
        assert!(text.contains("compaction_proxy_checkpoint_misses_total{policy=\"p\"} 1"));
        assert!(text.contains("compaction_proxy_cache_hits_total{policy=\"p\"} 1"));
        assert!(text.contains("compaction_proxy_cache_misses_total{policy=\"p\"} 2"));
    }

    #[test]
    fn requests_are_counted_by_the_format_of_their_route() {
        let m = Metrics::new();
        serially(|| event(Status::Unchanged, None).emit(&m));
        let mut anthropic = event(Status::Unchanged, None);
        anthropic.route = "/v1/messages".into();
        anthropic.format = Some(Format::Anthropic);
        serially(|| anthropic.emit(&m));
        serially(|| anthropic.emit(&m));
        let text = m.render();
        let requests = |route: &str, format: &str| {
            sample(
                &text,
                "compaction_proxy_requests_total",
                &[
                    &format!("route=\"{route}\""),
                    &format!("format=\"{format}\""),
                ],
            )
        };
        assert_eq!(
            requests("/v1/chat/completions", "chat"),
            Some(1.0),
            "{text}"
        );
        assert_eq!(requests("/v1/messages", "anthropic"), Some(2.0), "{text}");
        assert_eq!(requests("/v1/messages", "chat"), None, "{text}");
    }

    #[test]
    fn retained_ratio_observes_compacted_requests_only() {
        let m = Metrics::new();
        serially(|| event(Status::Compacted, Some(loss(0.4))).emit(&m));
        serially(|| event(Status::Unchanged, Some(LossSummary::unchanged(10, 3))).emit(&m));
        serially(|| event(Status::DryRun, Some(loss(0.5))).emit(&m));
        let text = m.render();
        assert_eq!(
            sample(&text, "compaction_proxy_retained_ratio_count", &[]),
            Some(1.0),
            "{text}"
        );
        assert_eq!(
            sample(&text, "compaction_proxy_retained_ratio_sum", &[]),
            Some(0.4)
        );
        assert_eq!(
            sample(&text, "compaction_proxy_input_chars_total", &[]),
            Some(30.0),
            "the other counters still count every request with a loss"
        );
        assert_eq!(
            sample(&text, "compaction_proxy_deduped_messages_total", &[]),
            Some(2.0)
        );
        assert_eq!(
            sample(&text, "compaction_proxy_dropped_messages_total", &[]),
            Some(4.0)
        );
    }

    #[test]
    fn skip_reasons_reload_results_and_first_byte_are_counted() {
        let m = Metrics::new();
        serially(|| event(Status::Skipped("invalid-json"), None).emit(&m));
        serially(|| event(Status::Skipped("invalid-json"), None).emit(&m));
        serially(|| event(Status::Skipped("too-many-messages"), None).emit(&m));
        m.config_reload(RELOAD_REFUSED);
        let text = m.render();
        let skipped = |reason: &str| {
            sample(
                &text,
                "compaction_proxy_skipped_total",
                &[&format!("reason=\"{reason}\"")],
            )
        };
        assert_eq!(skipped("invalid-json"), Some(2.0), "{text}");
        assert_eq!(skipped("too-many-messages"), Some(1.0));
        let reloads = |result: &str| {
            sample(
                &text,
                "compaction_proxy_config_reloads_total",
                &[&format!("result=\"{result}\"")],
            )
        };
        assert_eq!(
            (reloads("applied"), reloads("refused")),
            (Some(0.0), Some(1.0))
        );
        assert_eq!(
            sample(
                &text,
                "compaction_proxy_upstream_first_byte_seconds_count",
                &[]
            ),
            Some(3.0)
        );
    }

    #[test]
    fn label_sets_resolve_to_the_same_series_each_time() {
        let m = Metrics::new();
        let a = m.series("/r", "p", "t");
        let b = m.series("/r", "p", "t");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &m.series("/r", "p", "other")));
        for _ in 0..3 {
            serially(|| event(Status::Compacted, Some(loss(0.4))).emit(&m));
        }
        let text = m.render();
        assert_eq!(
            sample(&text, "compaction_proxy_input_chars_total", &[]),
            Some(30.0)
        );
    }

    /// Collects what a JSON subscriber writes while `f` runs.
    fn json_log_of(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Sink {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(buf);
                Ok(buf.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let writer = sink.clone();
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_writer(move || writer.clone())
            .finish();
        serially(|| {
            tracing::subscriber::with_default(subscriber, || {
                // A test that emitted earlier with no subscriber may have
                // cached "never" for the log line's callsites: ask again.
                tracing::callsite::rebuild_interest_cache();
                f()
            })
        });
        let bytes = sink.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    #[test]
    fn the_log_line_rounds_durations_to_microseconds() {
        let m = Metrics::new();
        let mut e = event(Status::Compacted, Some(loss(0.4)));
        e.total_seconds = 0.002_327_405;
        e.compaction_seconds = Some(0.000_123_456_7);
        e.upstream_seconds = Some(1.0 / 3.0);
        let log = json_log_of(|| e.emit(&m));
        let line: serde_json::Value = serde_json::from_str(log.trim()).unwrap();
        let fields = &line["fields"];
        assert_eq!(fields["total_ms"], 2.327, "{log}");
        assert_eq!(fields["compaction_ms"], 0.123, "{log}");
        assert_eq!(fields["upstream_ms"], 333.333, "{log}");
        assert_eq!(fields["compaction"], "compacted", "{log}");
    }

    #[test]
    fn tasks_counts_what_is_alive_on_the_runtimes_given() {
        let m = Metrics::new();
        let tasks = |m: &Metrics| sample(&m.render(), "compaction_proxy_tasks", &[]);
        assert_eq!(tasks(&m), Some(0.0), "no runtime given yet");
        let runtimes: Vec<_> = (0..2)
            .map(|_| {
                tokio::runtime::Builder::new_current_thread()
                    .build()
                    .unwrap()
            })
            .collect();
        for runtime in &runtimes {
            m.count_tasks_of(runtime.handle().clone());
        }
        let pending: Vec<_> = [0, 1, 1]
            .map(|i| runtimes[i].spawn(std::future::pending::<()>()))
            .into();
        assert_eq!(tasks(&m), Some(3.0));
        pending[1].abort();
        // An aborted task is gone once its runtime has run.
        runtimes[1].block_on(tokio::task::yield_now());
        assert_eq!(tasks(&m), Some(2.0));
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_metrics_are_exported() {
        let text = Metrics::new().render();
        for name in [
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_cpu_seconds_total",
        ] {
            assert!(
                sample(&text, name, &[]).is_some(),
                "{name} missing:\n{text}"
            );
        }
    }
}
