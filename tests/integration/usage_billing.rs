//! Billed usage: the provider's own `usage`, read from plain and streamed
//! answers of all three formats as they pass, counted by kind, priced,
//! and never invented when the answer has none.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::json;

use crate::support::*;

const PRICES: &str = r#"
[prices."gpt-4o"]
uncached = 2.5
cache_read = 1.25
output = 10

[prices."claude-sonnet"]
uncached = 3
cache_read = 0.3
cache_write = 3.75
cache_write_1h = 6
output = 15

[prices."gpt-5"]
uncached = 1.25
cache_read = 0.125
output = 10
"#;

/// The value of the one sample of `name` whose labels include all of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .find(|l| labels.iter().all(|kv| l.contains(kv)))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

fn billed(text: &str, kind: &str, model: &str) -> Option<f64> {
    sample(
        text,
        "compaction_proxy_billed_input_tokens_total",
        &[&format!("kind=\"{kind}\""), &format!("model=\"{model}\"")],
    )
}

fn output(text: &str, model: &str) -> Option<f64> {
    sample(
        text,
        "compaction_proxy_billed_output_tokens_total",
        &[&format!("model=\"{model}\"")],
    )
}

fn cost(text: &str, model: &str) -> Option<f64> {
    sample(
        text,
        "compaction_proxy_billed_cost_total",
        &[&format!("model=\"{model}\"")],
    )
}

/// Waits for the requests' events (emitted when each response body ends,
/// just after the client read its last byte) and returns the exposition.
async fn metrics_after(proxy: &TestProxy, requests: f64) -> String {
    let counted = |text: &str| {
        text.lines()
            .filter(|l| l.starts_with("compaction_proxy_requests_total{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let state = proxy.state.clone();
    assert!(
        wait_until(Duration::from_secs(5), || counted(&state.metrics.render())
            >= requests)
        .await,
        "{} requests recorded",
        counted(&state.metrics.render())
    );
    proxy.state.metrics.render()
}

fn chat(stream: bool) -> String {
    json!({"model": "gpt-4o", "stream": stream, "stream_options": {"include_usage": true},
           "messages": [{"role": "user", "content": "hello"}]})
    .to_string()
}

#[tokio::test]
async fn chat_completions_usage_is_counted_by_kind_and_priced() {
    let completion = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                  "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0},
                  "completion_tokens_details": {"reasoning_tokens": 0}},
    });
    let upstream = MockUpstream::start(Behavior::Json(200, completion)).await;
    let proxy = TestProxy::start(PRICES, &upstream.url()).await;
    for _ in 0..3 {
        let answer = send(post_json(&proxy.url("/v1/chat/completions"), chat(false))).await;
        assert_eq!(answer.status, 200);
    }
    let text = metrics_after(&proxy, 3.0).await;
    assert_eq!(
        billed(&text, "uncached", "gpt-4o"),
        Some(3.0 * 86.0),
        "{text}"
    );
    assert_eq!(billed(&text, "cache_read", "gpt-4o"), Some(3.0 * 1920.0));
    assert_eq!(billed(&text, "cache_write", "gpt-4o"), Some(0.0));
    assert_eq!(output(&text, "gpt-4o"), Some(900.0));
    let want = 3.0 * (86.0 * 2.5 + 1920.0 * 1.25 + 300.0 * 10.0) / 1e6;
    let got = cost(&text, "gpt-4o").unwrap();
    assert!((got - want).abs() < 1e-9, "{got} vs {want}");
    // Labelled like the loss metrics.
    assert!(text.contains(
        "compaction_proxy_billed_output_tokens_total{model=\"gpt-4o\",policy=\"default\",route=\"/v1/chat/completions\",tenant=\"other\"} 900"
    ), "{text}");
}

/// A chat stream's chunks, the last one with `usage` when `include_usage`
/// was asked for.
fn chat_stream(usage: bool) -> Vec<String> {
    let chunk = |delta: serde_json::Value, finish: serde_json::Value, usage: serde_json::Value| {
        let event = json!({"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
                           "choices": if finish == json!("none") { json!([]) } else {
                               json!([{"index": 0, "delta": delta, "finish_reason": finish}]) },
                           "usage": usage});
        format!("data: {event}\n\n")
    };
    let null = serde_json::Value::Null;
    let mut chunks = vec![
        chunk(
            json!({"role": "assistant", "content": ""}),
            null.clone(),
            null.clone(),
        ),
        chunk(
            json!({"content": "the usage: {\"prompt_tokens\": 1}"}),
            null.clone(),
            null.clone(),
        ),
        chunk(json!({}), json!("stop"), null.clone()),
    ];
    if usage {
        let last = chunk(
            json!({}),
            json!("none"),
            json!({"prompt_tokens": 1200, "completion_tokens": 42, "total_tokens": 1242,
                   "prompt_tokens_details": {"cached_tokens": 1024}}),
        );
        // Cut inside the usage object, in the middle of a key.
        let cut = last.find("ompletion_tokens").unwrap();
        chunks.push(last[..cut].to_owned());
        chunks.push(last[cut..].to_owned());
    }
    chunks.push("data: [DONE]\n\n".into());
    chunks
}

#[tokio::test]
async fn a_chat_stream_bills_its_final_chunk_only_when_it_has_usage() {
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks: chat_stream(true),
        gap: Duration::from_millis(5),
    })
    .await;
    let proxy = TestProxy::start(PRICES, &upstream.url()).await;
    let answer = send(post_json(&proxy.url("/v1/chat/completions"), chat(true))).await;
    let expected: String = chat_stream(true).concat();
    assert_eq!(answer.body, Bytes::from(expected), "forwarded unchanged");
    let text = metrics_after(&proxy, 1.0).await;
    // `gpt-4o-mini` is priced by its longest prefix, `gpt-4o`.
    assert_eq!(billed(&text, "uncached", "gpt-4o"), Some(176.0), "{text}");
    assert_eq!(billed(&text, "cache_read", "gpt-4o"), Some(1024.0));
    assert_eq!(output(&text, "gpt-4o"), Some(42.0));

    // Without include_usage the stream has no usage: nothing is billed,
    // not a zero.
    upstream.set_behavior(Behavior::Sse {
        chunks: chat_stream(false),
        gap: Duration::from_millis(5),
    });
    let plain = TestProxy::start(PRICES, &upstream.url()).await;
    send(post_json(&plain.url("/v1/chat/completions"), chat(true))).await;
    let text = metrics_after(&plain, 1.0).await;
    assert!(
        !text.contains("compaction_proxy_billed_"),
        "no usage, no bill: {text}"
    );
}

fn anthropic_body(stream: bool) -> String {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "stream": stream,
           "messages": [{"role": "user", "content": "hello"}]})
    .to_string()
}

fn anthropic_stream() -> Vec<String> {
    let event = |name: &str, data: serde_json::Value| format!("event: {name}\ndata: {data}\n\n");
    vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                   "model": "claude-sonnet-4-5-20250929", "content": [], "stop_reason": null, "stop_sequence": null,
                   "usage": {"input_tokens": 40, "cache_creation_input_tokens": 3000, "cache_read_input_tokens": 12000,
                             "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 1000},
                             "output_tokens": 1, "service_tier": "standard"}}}),
        ),
        event("ping", json!({"type": "ping"})),
        event(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        event(
            "content_block_delta",
            json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "\"usage\":{\"output_tokens\":99999}"}}),
        ),
        event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 0}),
        ),
        event(
            "message_delta",
            json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null},
                   "usage": {"output_tokens": 250}}),
        ),
        event("message_stop", json!({"type": "message_stop"})),
    ]
}

#[tokio::test]
async fn an_anthropic_stream_bills_cache_writes_of_both_lives_and_the_cumulative_output() {
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks: anthropic_stream(),
        gap: Duration::from_millis(5),
    })
    .await;
    let proxy = TestProxy::start(PRICES, &upstream.url()).await;
    for _ in 0..2 {
        send(post_json(&proxy.url("/v1/messages"), anthropic_body(true))).await;
    }
    let text = metrics_after(&proxy, 2.0).await;
    let m = "claude-sonnet";
    assert_eq!(billed(&text, "uncached", m), Some(80.0), "{text}");
    assert_eq!(billed(&text, "cache_read", m), Some(24_000.0));
    assert_eq!(billed(&text, "cache_write", m), Some(6000.0));
    // message_delta's count replaces message_start's 1: 250 each.
    assert_eq!(output(&text, m), Some(500.0));
    let want =
        2.0 * (40.0 * 3.0 + 12_000.0 * 0.3 + 2000.0 * 3.75 + 1000.0 * 6.0 + 250.0 * 15.0) / 1e6;
    let got = cost(&text, m).unwrap();
    assert!((got - want).abs() < 1e-9, "{got} vs {want}");
}

#[tokio::test]
async fn an_anthropic_answer_with_server_compaction_bills_its_iterations() {
    let message = json!({
        "id": "msg_2", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
        "content": [{"type": "compaction", "content": "Summary of the conversation"},
                    {"type": "tool_use", "id": "t", "name": "x", "input": {"usage": {"input_tokens": 5}}}],
        "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 23000, "output_tokens": 1000, "cache_read_input_tokens": 0,
                  "cache_creation_input_tokens": 0,
                  "iterations": [{"type": "compaction", "input_tokens": 180000, "output_tokens": 3500},
                                 {"type": "message", "input_tokens": 23000, "output_tokens": 1000}]},
    });
    let upstream = MockUpstream::start(Behavior::Json(200, message)).await;
    let proxy = TestProxy::start(PRICES, &upstream.url()).await;
    send(post_json(&proxy.url("/v1/messages"), anthropic_body(false))).await;
    let text = metrics_after(&proxy, 1.0).await;
    assert_eq!(
        billed(&text, "uncached", "claude-sonnet"),
        Some(203_000.0),
        "{text}"
    );
    assert_eq!(output(&text, "claude-sonnet"), Some(4500.0));
}

fn responses_completed(usage: serde_json::Value) -> serde_json::Value {
    json!({"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-5-2025-08-07",
           "output": [{"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": "done", "annotations": []}]}],
           "usage": usage})
}

#[tokio::test]
async fn responses_bill_from_the_completed_event_and_the_plain_object() {
    let usage = json!({"input_tokens": 5000, "input_tokens_details": {"cached_tokens": 4096},
                       "output_tokens": 120, "output_tokens_details": {"reasoning_tokens": 64},
                       "total_tokens": 5120});
    let event = |data: serde_json::Value| {
        format!(
            "event: {}\ndata: {data}\n\n",
            data["type"].as_str().unwrap()
        )
    };
    let mut created = responses_completed(serde_json::Value::Null);
    created["status"] = json!("in_progress");
    let completed = event(
        json!({"type": "response.completed", "response": responses_completed(usage.clone())}),
    );
    let (head, tail) = completed.split_at(completed.find("cached_tokens").unwrap());
    let chunks = vec![
        event(json!({"type": "response.created", "response": created})),
        event(json!({"type": "response.output_text.delta", "delta": "done"})),
        head.to_owned(),
        tail.to_owned(),
    ];
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks,
        gap: Duration::from_millis(5),
    })
    .await;
    let proxy = TestProxy::start(PRICES, &upstream.url()).await;
    let body = json!({"model": "gpt-5", "stream": true, "input": "hello"}).to_string();
    send(post_json(&proxy.url("/v1/responses"), body.clone())).await;
    upstream.set_behavior(Behavior::Json(200, responses_completed(usage)));
    send(post_json(&proxy.url("/v1/responses"), body)).await;
    let text = metrics_after(&proxy, 2.0).await;
    assert_eq!(
        billed(&text, "uncached", "gpt-5"),
        Some(2.0 * 904.0),
        "{text}"
    );
    assert_eq!(billed(&text, "cache_read", "gpt-5"), Some(2.0 * 4096.0));
    assert_eq!(output(&text, "gpt-5"), Some(240.0));
}

#[tokio::test]
async fn an_answer_without_usage_or_with_an_error_bills_nothing() {
    let upstream = MockUpstream::start(Behavior::Json(
        200,
        json!({"id": "x", "model": "gpt-4o", "choices": [], "usage": null}),
    ))
    .await;
    let proxy = TestProxy::start(PRICES, &upstream.url()).await;
    send(post_json(&proxy.url("/v1/chat/completions"), chat(false))).await;
    upstream.set_behavior(Behavior::Json(
        429,
        json!({"error": {"message": "slow down"}, "usage": {"prompt_tokens": 5, "completion_tokens": 5}}),
    ));
    send(post_json(&proxy.url("/v1/chat/completions"), chat(false))).await;
    let text = metrics_after(&proxy, 2.0).await;
    assert!(!text.contains("compaction_proxy_billed_"), "{text}");
}

#[tokio::test]
async fn a_billed_streams_events_still_arrive_as_they_are_sent() {
    let gap = Duration::from_millis(120);
    let chunks = chat_stream(true);
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks: chunks.clone(),
        gap,
    })
    .await;
    let proxy = TestProxy::start(PRICES, &upstream.url()).await;
    let started = Instant::now();
    let response = client()
        .request(post_json(&proxy.url("/v1/chat/completions"), chat(true)))
        .await
        .unwrap();
    let (frames, end) = frames_with_times(response).await;
    assert_eq!(end, Ok(()));
    let received: Vec<Bytes> = frames.iter().map(|(_, b)| b.clone()).collect();
    let sent: Vec<Bytes> = chunks.into_iter().map(Bytes::from).collect();
    assert_eq!(received, sent, "each frame passes alone and unchanged");
    assert!(
        frames[0].0 - started < gap * 3,
        "first frame after {:?}: held back?",
        frames[0].0 - started
    );
    for pair in frames.windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= gap / 2,
            "two frames arrived together: the usage chunk was held?"
        );
    }
    let text = metrics_after(&proxy, 1.0).await;
    assert_eq!(
        billed(&text, "cache_read", "gpt-4o"),
        Some(1024.0),
        "{text}"
    );
}

#[tokio::test]
async fn a_kept_reports_bill_is_in_its_report_once_the_answer_ends() {
    let completion = json!({
        "id": "c", "object": "chat.completion", "model": "gpt-4o",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 100, "completion_tokens": 7, "prompt_tokens_details": {"cached_tokens": 64}},
    });
    let upstream = MockUpstream::start(Behavior::Json(200, completion)).await;
    let config = format!("{PRICES}\n[policies.default]\nallow_report = true\n");
    let proxy = TestProxy::start(&config, &upstream.url()).await;
    let mut request = post_json(&proxy.url("/v1/chat/completions"), chat(false));
    request
        .headers_mut()
        .insert("x-compaction-report", "true".parse().unwrap());
    let answer = send(request).await;
    let id = answer.header("x-compaction-report-id").unwrap().to_owned();
    let state = proxy.state.clone();
    assert!(wait_until(Duration::from_secs(5), || state.bills.get(&id).is_some()).await);
    let bill = proxy.state.bills.get(&id).unwrap();
    assert_eq!(
        (
            bill.usage.uncached_input,
            bill.usage.cache_read,
            bill.usage.output
        ),
        (36, 64, 7)
    );
    assert_eq!(&*bill.family, "gpt-4o");
    assert_eq!(bill.model.as_deref(), Some("gpt-4o"));
    // The request went as it came: its estimate is its bill.
    let estimate = bill.estimate.unwrap();
    assert_eq!((estimate.saved, estimate.extra), (0.0, 0.0));
    // The report endpoint carries the same figures.
    let url = proxy.url(&format!("/v1/compaction-reports/{id}"));
    let mut report = None;
    for _ in 0..100 {
        let got = send(Request::get(&url).body(Full::new(Bytes::new())).unwrap()).await;
        if got.status == 200 {
            report = Some(got.json());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = report.expect("the report is kept");
    let usage = &report["bill"]["usage"];
    assert_eq!(
        (
            &usage["uncached_input"],
            &usage["cache_read"],
            &usage["output"]
        ),
        (&json!(36), &json!(64), &json!(7)),
        "{report}"
    );
    assert_eq!(report["bill"], serde_json::to_value(&*bill).unwrap());
}

#[tokio::test]
async fn a_compacted_requests_answer_is_billed_too() {
    let upstream = MockUpstream::start(Behavior::Json(
        200,
        json!({"model": "gpt-4o", "usage": {"prompt_tokens": 10, "completion_tokens": 2}}),
    ))
    .await;
    let config = format!("{PRICES}\n[policies.default]\nbudget_chars = 400\nkeep_last_n = 1\n");
    let proxy = TestProxy::start(&config, &upstream.url()).await;
    let messages: Vec<serde_json::Value> = (0..20)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("message number {i} with some words in it to fill the budget")}))
        .collect();
    let body = json!({"model": "gpt-4o", "messages": messages}).to_string();
    let answer = send(post_json(&proxy.url("/v1/chat/completions"), body)).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let text = metrics_after(&proxy, 1.0).await;
    assert_eq!(output(&text, "gpt-4o"), Some(2.0), "{text}");
}
