//! The per-request metrics update: `RequestEvent::emit` (label sets
//! resolved once per route, policy and tenant, then reused) next to the
//! same updates done by resolving every label set on every request, the
//! way the proxy did before. No log subscriber is installed, so the log
//! line costs only its level check.
//!
//! Run: `cargo bench --bench metrics -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use compaction_proxy::metrics::{Metrics, RequestEvent};
use compaction_proxy::outcome::{LossSummary, Status};
use criterion::{criterion_group, criterion_main, Criterion};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

fn event() -> RequestEvent {
    RequestEvent {
        route: "/v1/chat/completions".into(),
        policy: Some("default".into()),
        tenant: "acme".into(),
        status: Some(Status::Compacted),
        loss: Some(LossSummary {
            input_chars: 263_330,
            output_chars: 196_361,
            input_messages: 303,
            output_messages: 210,
            dropped_messages: 93,
            deduped_messages: 35,
            trimmed_messages: 10,
            retained_ratio: 0.7457,
            budget_met: true,
            pruned_chars: 0,
            clipped_chars: 0,
            deduped_tool_chars: 0,
            stripped_thinking: 0,
            input_tokens: None,
            output_tokens: None,
            budget_tokens: None,
        }),
        compaction_seconds: Some(0.002),
        upstream_status: Some(200),
        upstream_first_byte_seconds: Some(0.05),
        upstream_seconds: Some(0.2),
        response_status: 200,
        total_seconds: 0.21,
        ..RequestEvent::new(http::Method::POST, "/v1/chat/completions".into())
    }
}

/// The same families, updated by looking every label set up each time.
struct PerRequestLookup {
    counters: Vec<IntCounterVec>,
    requests: IntCounterVec,
    histograms: Vec<HistogramVec>,
    upstream_responses: IntCounterVec,
}

impl PerRequestLookup {
    fn new() -> Self {
        let registry = Registry::new();
        let counter = |name: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, "h"), labels).unwrap();
            registry.register(Box::new(c.clone())).unwrap();
            c
        };
        let loss = ["route", "policy", "tenant"];
        PerRequestLookup {
            counters: ["a", "b", "c", "d", "e", "f"]
                .iter()
                .map(|n| counter(n, &loss))
                .collect(),
            requests: counter("r", &["route", "policy", "tenant", "status"]),
            histograms: ["h1", "h2", "h3", "h4"]
                .iter()
                .map(|n| {
                    let h = HistogramVec::new(HistogramOpts::new(*n, "h"), &loss).unwrap();
                    registry.register(Box::new(h.clone())).unwrap();
                    h
                })
                .collect(),
            upstream_responses: counter("u", &["route", "code"]),
        }
    }

    fn emit(&self, e: &RequestEvent) {
        let policy = e.policy.as_deref().unwrap_or("none");
        let labels = [&*e.route, policy, &*e.tenant];
        self.requests
            .with_label_values(&[&e.route, policy, &e.tenant, "compacted"])
            .inc();
        for c in &self.counters {
            c.with_label_values(&labels).inc_by(1);
        }
        for h in &self.histograms {
            h.with_label_values(&labels).observe(0.5);
        }
        self.upstream_responses
            .with_label_values(&[&*e.route, "200"])
            .inc();
    }
}

fn bench(c: &mut Criterion) {
    let e = event();
    let metrics = Metrics::new();
    c.bench_function("emit, label sets resolved once", |b| {
        b.iter(|| black_box(&e).emit(&metrics))
    });
    let baseline = PerRequestLookup::new();
    c.bench_function("same updates, label sets looked up per request", |b| {
        b.iter(|| baseline.emit(black_box(&e)))
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
