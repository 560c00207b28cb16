//! Prometheus metrics and the per-request log line, emitted together from
//! one [`RequestEvent`] so the counters and the log cannot disagree.
//!
//! Labels are bounded: `route` is a configured route path or `unmatched`,
//! `policy` a configured policy name, `tenant` a configured tenant or
//! `other`, `status` one of [`Status`](crate::outcome::Status), `code` an HTTP status code.

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

mod event;
pub use event::{Ending, RequestEvent};

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

#[cfg(test)]
mod tests;
