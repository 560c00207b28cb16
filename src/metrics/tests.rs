use super::*;
use crate::error::UpstreamCause;
use crate::format::Format;
use crate::outcome::{LossSummary, Status};

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
