//! Prometheus metrics and the per-request log line, emitted together from
//! one [`RequestEvent`] so the counters and the log cannot disagree.
//!
//! Labels are bounded: `route` is a configured route path or `unmatched`,
//! `policy` a configured policy name, `tenant` a configured tenant or
//! `other`, `status` one of [`Status`], `code` an HTTP status code.

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use prometheus::{
    exponential_buckets, Counter, CounterVec, Encoder, Histogram, HistogramOpts, HistogramVec,
    IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

/// The Prometheus process collector, its `process_cpu_seconds_total` read
/// to the microsecond (`getrusage`) rather than in the whole seconds the
/// collector counts.
struct ProcessMetrics(prometheus::process_collector::ProcessCollector);

impl prometheus::core::Collector for ProcessMetrics {
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        self.0.desc()
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        let mut families = self.0.collect();
        if let Some(seconds) = cpu_seconds() {
            for family in &mut families {
                if family.name() == "process_cpu_seconds_total" {
                    for metric in family.mut_metric() {
                        let mut counter = prometheus::proto::Counter::default();
                        counter.set_value(seconds);
                        metric.set_counter(counter);
                    }
                }
            }
        }
        families
    }
}

/// User and system CPU time of this process, in seconds.
fn cpu_seconds() -> Option<f64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a whole rusage into the pointer it is given
    // and reports failure by its return value.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let time = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

/// What recall counts, by policy: the model's calls, ids answered and
/// refused, chars answered, and follow-up rounds.
#[derive(Clone)]
pub struct RecallCounters {
    pub calls: IntCounterVec,
    pub ids: IntCounterVec,
    pub refused_ids: IntCounterVec,
    pub answer_chars: IntCounterVec,
    pub rounds: IntCounterVec,
}

/// Route label of requests no route matched.
pub const UNMATCHED_ROUTE: &str = "unmatched";

use crate::error::UpstreamCause;
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
    refused: IntCounterVec,
    retained_ratio: HistogramVec,
    compaction_duration: HistogramVec,
    upstream_duration: HistogramVec,
    upstream_first_byte: HistogramVec,
    upstream_responses: IntCounterVec,
    upstream_failures: IntCounterVec,
    cache_hits: IntCounterVec,
    cache_misses: IntCounterVec,
    checkpoint_hits: IntCounterVec,
    checkpoint_misses: IntCounterVec,
    stable_rebases: IntCounterVec,
    config_reloads: IntCounterVec,
    billed_input_tokens: IntCounterVec,
    billed_output_tokens: IntCounterVec,
    billed_cost: CounterVec,
    estimated_saved_cost: CounterVec,
    estimated_extra_cost: CounterVec,
    summarizer_tokens: IntCounterVec,
    summarize_fallbacks: IntCounterVec,
    summary_store_errors: IntCounterVec,
    /// Recall's counters (`recall = true`).
    recall: RecallCounters,
    tool_decisions: IntCounterVec,
    tool_decision_fallbacks: IntCounterVec,
    /// The prefix cache's resumed parses and misses ([`Self::count_prefix_cache`]).
    prefix_cache: Mutex<[IntCounter; 2]>,
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
    /// By format (none, then [`Format::ALL`]), then status, then the
    /// class of the status code sent to the client ([`code_class`]).
    requests: [[[OnceLock<IntCounter>; CODE_CLASSES.len()]; 6]; 4],
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
    /// `upstream_failures{route, cause}`, by [`UpstreamCause::ALL`].
    upstream_failures: [OnceLock<IntCounter>; 4],
    /// The billing series by model family (a bounded label).
    bills: RwLock<FxHashMap<Arc<str>, Arc<BillSeries>>>,
}

/// Values of the `code_class` label of `requests_total`: the class of the
/// status code the client was sent, or `none` when it was sent none (it
/// left first).
pub const CODE_CLASSES: [&str; 6] = ["1xx", "2xx", "3xx", "4xx", "5xx", "none"];

/// The position in [`CODE_CLASSES`] of a status code (0: none sent).
fn code_class(code: u16) -> usize {
    match code {
        100..=599 => usize::from(code / 100) - 1,
        _ => CODE_CLASSES.len() - 1,
    }
}

/// The billing series of one (route, policy, tenant, model family).
struct BillSeries {
    /// By kind: uncached, cache_read, cache_write ([`INPUT_KINDS`]).
    input: [IntCounter; 3],
    output: IntCounter,
    cost: OnceLock<Counter>,
    /// Saved and extra, made together so either reads 0 before it moves.
    estimate: OnceLock<[Counter; 2]>,
}

/// The `kind` label of `billed_input_tokens_total`.
pub const INPUT_KINDS: [&str; 3] = ["uncached", "cache_read", "cache_write"];

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
            upstream_failures: Default::default(),
            bills: RwLock::default(),
        }
    }

    /// The billing series of `family`, made on its first bill.
    fn bill(&self, metrics: &Metrics, family: &Arc<str>) -> Arc<BillSeries> {
        if let Some(found) = self
            .bills
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(family)
        {
            return found.clone();
        }
        let labels = [&*self.route, &*self.policy, &*self.tenant, &**family];
        let made = Arc::new(BillSeries {
            input: INPUT_KINDS.map(|kind| {
                let [route, policy, tenant, model] = labels;
                metrics
                    .billed_input_tokens
                    .with_label_values(&[route, policy, tenant, model, kind])
            }),
            output: metrics.billed_output_tokens.with_label_values(&labels),
            cost: OnceLock::new(),
            estimate: OnceLock::new(),
        });
        self.bills
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .entry(family.clone())
            .or_insert(made)
            .clone()
    }

    fn loss<'a>(&self, cell: &'a OnceLock<IntCounter>, vec: &IntCounterVec) -> &'a IntCounter {
        cell.get_or_init(|| vec.with_label_values(&[&self.route, &self.policy, &self.tenant]))
    }
}

/// The metric families this proxy exports (without the `_bucket`, `_sum`,
/// `_count` series of histograms). The `process_*` families of the
/// Prometheus process collector (RSS, open fds, CPU) come on top.
pub const FAMILIES: [&str; 33] = [
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
    "compaction_proxy_refused_total",
    "compaction_proxy_retained_ratio",
    "compaction_proxy_compaction_duration_seconds",
    "compaction_proxy_upstream_duration_seconds",
    "compaction_proxy_upstream_first_byte_seconds",
    "compaction_proxy_upstream_responses_total",
    "compaction_proxy_upstream_failures_total",
    "compaction_proxy_cache_hits_total",
    "compaction_proxy_cache_misses_total",
    "compaction_proxy_checkpoint_hits_total",
    "compaction_proxy_checkpoint_misses_total",
    "compaction_proxy_stable_rebases_total",
    "compaction_proxy_config_reloads_total",
    "compaction_proxy_tasks",
    "compaction_proxy_build_info",
    "compaction_proxy_billed_input_tokens_total",
    "compaction_proxy_billed_output_tokens_total",
    "compaction_proxy_billed_cost_total",
    "compaction_proxy_estimated_saved_cost_total",
    "compaction_proxy_estimated_extra_cost_total",
    "compaction_proxy_prefix_cache_hits_total",
    "compaction_proxy_prefix_cache_misses_total",
];

/// The labels of the billing metrics: the loss labels and the model family.
const BILL_LABELS: &[&str] = &["route", "policy", "tenant", "model"];

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

/// The families of recall, exported once a recall call was answered.
pub const RECALL_FAMILIES: [&str; 5] = [
    "compaction_proxy_recall_calls_total",
    "compaction_proxy_recall_ids_total",
    "compaction_proxy_recall_refused_ids_total",
    "compaction_proxy_recall_answer_chars_total",
    "compaction_proxy_recall_rounds_total",
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
            .register(Box::new(ProcessMetrics(
                prometheus::process_collector::ProcessCollector::for_self(),
            )))
            .expect("unique metric");
        let build_info = prometheus::IntGaugeVec::new(
            Opts::new(
                "compaction_proxy_build_info",
                "1, labelled with the running binary's version.",
            ),
            &["version"],
        )
        .expect("valid metric");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        registry
            .register(Box::new(build_info))
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
        // Unlabelled: one prefix cache serves every policy and route.
        let prefix_cache = [
            (
                "compaction_proxy_prefix_cache_hits_total",
                "Parses of large bodies resumed from an earlier turn's parse (only what the turn appended was read).",
            ),
            (
                "compaction_proxy_prefix_cache_misses_total",
                "Parses of large bodies (32 KiB and up) that found no earlier turn to resume from and read the whole body.",
            ),
        ]
        .map(|(name, help)| {
            let c = IntCounter::new(name, help).expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        });
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
        let tool_decisions = counter(
            "tool_decisions_total",
            "Tool calls a decision model judged (tool_decisions = \"model\"), by policy and the action applied: keep, drop_result, drop_call.",
            &["policy", "action"],
        );
        let tool_decision_fallbacks = counter(
            "tool_decision_fallbacks_total",
            "Requests of a tool_decisions = \"model\" policy compacted by the deterministic passes because the decisions could not be had, by policy and reason.",
            &["policy", "reason"],
        );
        let float_counter = |name: &str, help: &str| {
            let c = CounterVec::new(
                Opts::new(format!("compaction_proxy_{name}"), help),
                BILL_LABELS,
            )
            .expect("valid metric");
            registry
                .register(Box::new(c.clone()))
                .expect("unique metric");
            c
        };
        let recall = RecallCounters {
            calls: counter(
                "recall_calls_total",
                "compaction_recall calls the model made and the proxy answered itself, by policy.",
                &["policy"],
            ),
            ids: counter(
                "recall_ids_total",
                "Recall ids answered with their originals, by policy.",
                &["policy"],
            ),
            refused_ids: counter(
                "recall_refused_ids_total",
                "Recall ids refused (not in the request's markers, malformed, or past a limit), by policy.",
                &["policy"],
            ),
            answer_chars: counter(
                "recall_answer_chars_total",
                "Chars of originals the proxy sent back in recall answers, by policy.",
                &["policy"],
            ),
            rounds: counter(
                "recall_rounds_total",
                "Follow-up requests the proxy sent upstream to answer recall calls, by policy.",
                &["policy"],
            ),
        };
        Metrics {
            recall,
            tool_decisions,
            tool_decision_fallbacks,
            summary_store_errors,
            summarizer_tokens,
            summarize_fallbacks,
            billed_input_tokens: counter(
                "billed_input_tokens_total",
                "Input tokens the provider reported, by kind: uncached, cache_read, cache_write.",
                &["route", "policy", "tenant", "model", "kind"],
            ),
            billed_output_tokens: counter(
                "billed_output_tokens_total",
                "Output tokens the provider reported.",
                BILL_LABELS,
            ),
            billed_cost: float_counter(
                "billed_cost_total",
                "What the reported usage cost at the configured prices (models with a price).",
            ),
            estimated_saved_cost: float_counter(
                "estimated_saved_cost_total",
                "Estimated cost the proxy saved: the original requests' estimated cost less the billed one, on requests where that is positive.",
            ),
            estimated_extra_cost: float_counter(
                "estimated_extra_cost_total",
                "Estimated cost the proxy added (lost prompt-cache hits): the billed cost less the original requests' estimated one, where that is positive.",
            ),
            requests: counter(
                "requests_total",
                "Requests to matched routes by body format, what compaction did, and the class of the status code sent to the client.",
                &["route", "policy", "tenant", "status", "format", "code_class"],
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
            refused: counter(
                "refused_total",
                "Requests on matched routes the proxy refused and never forwarded (status refused: a body too large or too slow, full buffers), by reason.",
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
            upstream_failures: counter(
                "upstream_failures_total",
                "Requests the upstream failed, by cause: connect (no connection), timeout (connect, response headers or a silent body), reset (closed after connecting), tls.",
                &["route", "cause"],
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
            prefix_cache: Mutex::new(prefix_cache),
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

    /// Brings the prefix cache's counters up to its own totals (`hits`,
    /// `misses`, which only grow), read before a scrape: the cache counts
    /// with atomics on the hot path, the exposition follows.
    pub fn count_prefix_cache(&self, hits: u64, misses: u64) {
        let counters = self.prefix_cache.lock().unwrap_or_else(|e| e.into_inner());
        for (counter, total) in counters.iter().zip([hits, misses]) {
            counter.inc_by(total.saturating_sub(counter.get()));
        }
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

    /// Recall's counters.
    pub fn recall(&self) -> &RecallCounters {
        &self.recall
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

    /// Counts the decisions applied to one request's tool calls.
    fn tool_decisions(&self, policy: &str, decided: &crate::outcome::DecisionCounts) {
        for (action, count) in decided.by_action() {
            if count > 0 {
                self.tool_decisions
                    .with_label_values(&[policy, action])
                    .inc_by(count as u64);
            }
        }
    }

    /// Counts one request whose model decisions fell back to the passes,
    /// by its reason (a [`crate::summarizer::SummarizeError::reason`]).
    pub fn tool_decision_fallback(&self, policy: &str, reason: &'static str) {
        self.tool_decision_fallbacks
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
            stripped_thinking: 0,
            input_tokens: Some(5),
            output_tokens: Some(3),
            budget_tokens: None,
        }
    }

    /// A priced bill with an estimate: 100 uncached, 800 read, 50 written, 20 out.
    fn bill() -> crate::usage::Bill {
        let usage = crate::usage::Usage {
            uncached_input: 100,
            cache_read: 800,
            cache_write: 50,
            output: 20,
            ..Default::default()
        };
        crate::usage::Bill {
            model: Some("gpt-4o-2024-08-06".into()),
            family: "gpt-4o".into(),
            usage,
            cost: Some(0.25),
            estimate: Some(crate::usage::Estimate {
                original: usage,
                original_cost: 0.75,
                saved: 0.5,
                extra: 0.0,
            }),
        }
    }

    #[test]
    fn model_decisions_are_counted_by_action_and_reach_the_log_line() {
        let m = Metrics::new();
        let mut e = event(Status::Compacted, Some(loss(0.4)));
        e.decisions = Some(crate::outcome::DecisionCounts {
            keep: 1,
            drop_result: 2,
            drop_call: 3,
            source: "model",
            prompt_tokens: Some(410),
            completion_tokens: Some(37),
        });
        let log = json_log_of(|| e.emit(&m));
        let text = m.render();
        let decided = |action: &str| {
            sample(
                &text,
                "compaction_proxy_tool_decisions_total",
                &["policy=\"p\"", &format!("action=\"{action}\"")],
            )
        };
        assert_eq!(decided("keep"), Some(1.0), "{text}");
        assert_eq!(decided("drop_result"), Some(2.0));
        assert_eq!(decided("drop_call"), Some(3.0));
        let fields: serde_json::Value = serde_json::from_str(log.trim()).unwrap();
        assert_eq!(fields["tool_decisions_keep"], 1, "{log}");
        assert_eq!(fields["tool_decisions_drop_result"], 2, "{log}");
        assert_eq!(fields["tool_decisions_drop_call"], 3, "{log}");
        assert_eq!(fields["tool_decisions_source"], "model", "{log}");
        assert_eq!(fields["tool_decisions_prompt_tokens"], 410, "{log}");
        assert_eq!(fields["tool_decisions_completion_tokens"], 37, "{log}");
        // Reused decisions: from the store, no tokens; the counters add up.
        e.decisions = Some(crate::outcome::DecisionCounts {
            keep: 0,
            drop_result: 1,
            drop_call: 0,
            source: "store",
            prompt_tokens: Some(0),
            completion_tokens: Some(0),
        });
        let log = json_log_of(|| e.emit(&m));
        let fields: serde_json::Value = serde_json::from_str(log.trim()).unwrap();
        assert_eq!(fields["tool_decisions_source"], "store", "{log}");
        assert_eq!(fields["tool_decisions_prompt_tokens"], 0, "{log}");
        let text = m.render();
        assert_eq!(
            sample(
                &text,
                "compaction_proxy_tool_decisions_total",
                &["action=\"drop_result\""]
            ),
            Some(3.0)
        );
        // A request without decisions logs none of their fields.
        e.decisions = None;
        let log = json_log_of(|| e.emit(&m));
        assert!(!log.contains("tool_decisions"), "{log}");
    }

    #[test]
    fn bills_add_up_by_kind_and_model_family_and_reach_the_log_line() {
        let m = Metrics::new();
        let mut e = event(Status::Compacted, Some(loss(0.4)));
        e.bill = Some(bill());
        serially(|| e.emit(&m));
        let log = json_log_of(|| e.emit(&m));
        let text = m.render();
        let input = |kind: &str| {
            sample(
                &text,
                "compaction_proxy_billed_input_tokens_total",
                &[&format!("kind=\"{kind}\""), "model=\"gpt-4o\""],
            )
        };
        assert_eq!(input("uncached"), Some(200.0), "{text}");
        assert_eq!(input("cache_read"), Some(1600.0));
        assert_eq!(input("cache_write"), Some(100.0));
        let one = |name: &str| sample(&text, name, &["model=\"gpt-4o\"", "tenant=\"other\""]);
        assert_eq!(
            one("compaction_proxy_billed_output_tokens_total"),
            Some(40.0)
        );
        assert_eq!(one("compaction_proxy_billed_cost_total"), Some(0.5));
        assert_eq!(
            one("compaction_proxy_estimated_saved_cost_total"),
            Some(1.0)
        );
        assert_eq!(
            one("compaction_proxy_estimated_extra_cost_total"),
            Some(0.0)
        );
        // JSON log lines are flat: the fields sit at the top level.
        let fields: serde_json::Value = serde_json::from_str(log.trim()).unwrap();
        assert_eq!(fields["billed_cache_read"], 800, "{log}");
        assert_eq!(fields["billed_uncached"], 100, "{log}");
        assert_eq!(fields["model"], "gpt-4o", "{log}");
        assert_eq!(fields["estimated_saved_cost"], 0.5, "{log}");
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
        cached.bill = Some(bill());
        serially(|| cached.emit(&m));
        serially(|| event(Status::Skipped("invalid-json"), None).emit(&m));
        serially(|| event(Status::Refused("body-too-large"), None).emit(&m));
        for hit in [true, false] {
            let mut stable = event(Status::Compacted, Some(loss(0.4)));
            stable.rebased = true;
            stable.checkpoint_hit = Some(hit);
            stable.cache_hit = Some(false);
            serially(|| stable.emit(&m));
        }
        let mut failed = event(Status::Unchanged, None);
        failed.upstream_failure = Some(UpstreamCause::Connect);
        failed.response_status = 502;
        serially(|| failed.emit(&m));
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
            "compaction_proxy_requests_total{code_class=\"2xx\",format=\"chat\",policy=\"p\",route=\"/v1/chat/completions\",status=\"compacted\",tenant=\"other\"} 3"
        ), "{text}");
        assert!(text.contains(
            "compaction_proxy_requests_total{code_class=\"5xx\",format=\"chat\",policy=\"p\",route=\"/v1/chat/completions\",status=\"unchanged\",tenant=\"other\"} 1"
        ), "{text}");
        assert!(text.contains(
            "compaction_proxy_upstream_failures_total{cause=\"connect\",route=\"/v1/chat/completions\"} 1"
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
            .flatten_event(true)
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
        // Flat, as the proxy writes JSON logs: fields beside the message.
        let fields = &line;
        assert_eq!(line["message"], "request", "{log}");
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

    #[test]
    fn build_info_names_the_version() {
        let text = Metrics::new().render();
        let line = format!(
            "compaction_proxy_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        );
        assert!(text.contains(&line), "{text}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn cpu_seconds_have_fractions() {
        // Burn a little CPU, then read: whole seconds would read 0 here.
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        let text = Metrics::new().render();
        let cpu = sample(&text, "process_cpu_seconds_total", &[]).unwrap();
        assert!(cpu > 0.0 && cpu.fract() != 0.0, "{cpu}");
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
