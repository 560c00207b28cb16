//! `strategy = "summarize"` against a mock summarizer that records its
//! inputs and answers canned summaries in each of the three wire formats:
//! what is forwarded (system and pins, the summary, the tail, in order),
//! map-reduce, reuse, stable mode, background timing, fallbacks, keys and
//! cost.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::support::{send, wait_until, Behavior, MockUpstream, TestProxy};

/// How the mock summarizer answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// A canned summary `SUMMARY-<n>` (n counts calls from 0), usage 100/20.
    Canned,
    /// HTTP 500.
    Error,
    /// Not JSON.
    Garbage,
    /// A refusal in the format's own way.
    Refusal,
    /// The canned answer after this long.
    Slow(Duration),
}

#[derive(Default)]
struct Calls {
    received: Vec<(HeaderMap, Value)>,
    answered: usize,
}

#[derive(Clone)]
pub struct MockSummarizer {
    pub addr: SocketAddr,
    format: &'static str,
    mode: Mode,
    calls: Arc<Mutex<Calls>>,
}

impl MockSummarizer {
    pub async fn start(format: &'static str, mode: Mode) -> MockSummarizer {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mock = MockSummarizer {
            addr: listener.local_addr().unwrap(),
            format,
            mode,
            calls: Arc::default(),
        };
        let server = mock.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let server = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let server = server.clone();
                        async move { Ok::<_, std::convert::Infallible>(server.answer(req).await) }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        mock
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn calls(&self) -> usize {
        self.calls.lock().unwrap().received.len()
    }

    pub fn answered(&self) -> usize {
        self.calls.lock().unwrap().answered
    }

    pub fn received(&self) -> Vec<(HeaderMap, Value)> {
        self.calls.lock().unwrap().received.clone()
    }

    /// The text a call was asked to summarize, whatever the format.
    pub fn input_of(body: &Value) -> String {
        if let Some(input) = body["input"].as_str() {
            return input.to_owned();
        }
        let messages = body["messages"].as_array().unwrap();
        messages.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let n = {
            let mut calls = self.calls.lock().unwrap();
            calls.received.push((parts.headers, value));
            calls.received.len() - 1
        };
        let mode = self.mode;
        if let Mode::Slow(delay) = mode {
            tokio::time::sleep(delay).await;
        }
        self.calls.lock().unwrap().answered += 1;
        let text = format!("SUMMARY-{n}: the user asked to fix build 7731.");
        let (status, answer) = match (mode, self.format) {
            (Mode::Error, _) => (500, json!({"error": {"message": "boom"}}).to_string()),
            (Mode::Garbage, _) => (200, "<html>gateway</html>".to_owned()),
            (Mode::Refusal, "chat") => (
                200,
                json!({"choices": [{"message": {"role": "assistant", "content": null, "refusal": "I can't."}, "finish_reason": "stop"}]}).to_string(),
            ),
            (Mode::Refusal, "anthropic") => (
                200,
                json!({"type": "message", "content": [], "stop_reason": "refusal"}).to_string(),
            ),
            (Mode::Refusal, _) => (
                200,
                json!({"output": [{"type": "message", "content": [{"type": "refusal", "refusal": "no"}]}]}).to_string(),
            ),
            (_, "chat") => (
                200,
                json!({"choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 100, "completion_tokens": 20}}).to_string(),
            ),
            (_, "anthropic") => (
                200,
                json!({"type": "message", "role": "assistant", "content": [{"type": "text", "text": text}],
                       "stop_reason": "end_turn", "usage": {"input_tokens": 100, "output_tokens": 20}}).to_string(),
            ),
            (_, _) => (
                200,
                json!({"output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}],
                       "usage": {"input_tokens": 100, "output_tokens": 20}}).to_string(),
            ),
        };
        Response::builder()
            .status(status)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(answer)))
            .unwrap()
    }
}

/// A config: one summarizer of `format` at `url`, the default policy
/// summarizing with `extra` policy keys (exact mode unless they name a
/// mode), the summarizer's `summarizer_extra`.
fn config(url: &str, format: &str, extra: &str, summarizer_extra: &str) -> String {
    let mode = if extra.contains("mode =") {
        ""
    } else {
        "mode = \"exact\""
    };
    format!(
        r#"
[summarizers.mock]
url = "{url}"
format = "{format}"
model = "mini"
timeout_secs = 3
window_tokens = 4000
max_output_tokens = 200
{summarizer_extra}

[policies.default]
budget_chars = 3000
keep_last_n = 3
strategy = "summarize"
summarizer = "mock"
{mode}
{extra}
"#
    )
}

const SYSTEM: &str = "You are a careful coding agent.";

/// A long plain conversation: the task, then turns of ~300 chars.
fn turns(n: usize) -> Vec<(&'static str, String)> {
    let mut out = vec![(
        "user",
        "Task: fix build 7731 in the payments service.".to_owned(),
    )];
    for i in 0..n {
        let role = if i % 2 == 0 { "assistant" } else { "user" };
        out.push((
            role,
            format!(
                "Turn {i}: {}",
                "details of the investigation so far ".repeat(8)
            ),
        ));
    }
    out
}

/// The path and body of a request of `format` holding `turns`.
fn request(format: &str, turns: &[(&str, String)]) -> (&'static str, String) {
    match format {
        "chat" => {
            let mut messages = vec![json!({"role": "system", "content": SYSTEM})];
            messages.extend(turns.iter().map(|(r, t)| json!({"role": r, "content": t})));
            (
                "/v1/chat/completions",
                json!({"model": "gpt-4o", "messages": messages}).to_string(),
            )
        }
        "anthropic" => {
            let messages: Vec<Value> = turns
                .iter()
                .map(|(r, t)| json!({"role": r, "content": [{"type": "text", "text": t}]}))
                .collect();
            (
                "/v1/messages",
                json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "system": SYSTEM, "messages": messages})
                    .to_string(),
            )
        }
        _ => {
            let input: Vec<Value> = turns
                .iter()
                .map(|(r, t)| {
                    let kind = if *r == "user" {
                        "input_text"
                    } else {
                        "output_text"
                    };
                    json!({"type": "message", "role": r, "content": [{"type": kind, "text": t}]})
                })
                .collect();
            (
                "/v1/responses",
                json!({"model": "gpt-5", "instructions": SYSTEM, "input": input}).to_string(),
            )
        }
    }
}

fn post(url: &str, body: &str, key: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {key}"))
        .header("x-api-key", key)
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

/// The texts of the forwarded array's items, whatever the format.
fn texts(format: &str, forwarded: &Value) -> Vec<(String, String)> {
    let array = match format {
        "responses" => forwarded["input"].as_array().unwrap(),
        _ => forwarded["messages"].as_array().unwrap(),
    };
    array
        .iter()
        .map(|m| {
            let role = m["role"].as_str().unwrap_or("").to_owned();
            let text = match &m["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect::<String>(),
                _ => String::new(),
            };
            (role, text)
        })
        .collect()
}

async fn setup(
    format: &'static str,
    mode: Mode,
    extra: &str,
) -> (MockSummarizer, MockUpstream, TestProxy) {
    let summarizer = MockSummarizer::start(format, mode).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        &config(&summarizer.url(), format, extra, ""),
        &upstream.url(),
    )
    .await;
    (summarizer, upstream, proxy)
}

#[tokio::test]
async fn the_forwarded_request_holds_pins_the_summary_and_the_tail_in_each_format() {
    for format in ["chat", "anthropic", "responses"] {
        let (summarizer, upstream, proxy) = setup(format, Mode::Canned, "").await;
        let conversation = turns(20);
        let (path, body) = request(format, &conversation);
        let answer = send(post(&proxy.url(path), &body, "sk-caller")).await;
        assert_eq!(answer.status, 200, "{format}");
        assert_eq!(
            answer.header("x-compaction-status"),
            Some("compacted"),
            "{format}"
        );
        assert_eq!(summarizer.calls(), 1, "{format}");
        let forwarded = upstream.last().json();
        let got = texts(format, &forwarded);
        // The pinned task, the summary, then the last three verbatim.
        let mut expected_tail: Vec<(String, String)> = conversation[conversation.len() - 3..]
            .iter()
            .map(|(r, t)| (r.to_string(), t.clone()))
            .collect();
        let lead = if format == "chat" {
            vec![("system".to_owned(), SYSTEM.to_owned())]
        } else {
            Vec::new()
        };
        assert_eq!(got.len(), lead.len() + 2 + 3, "{format}: {got:?}");
        assert_eq!(got[..lead.len()], lead[..], "{format}");
        let at = lead.len();
        assert_eq!(
            got[at],
            ("user".to_owned(), conversation[0].1.clone()),
            "{format}"
        );
        let (role, summary) = &got[at + 1];
        assert_eq!(role, "user", "{format}");
        let id = answer.header("x-compaction-summary-id").unwrap();
        assert_eq!(
            summary,
            &format!(
                "[compaction-proxy summary {id}]\nSUMMARY-0: the user asked to fix build 7731."
            )
        );
        assert_eq!(
            got[at + 2..].to_vec(),
            expected_tail.split_off(0),
            "{format}"
        );
        // Everything else of the body is as it came.
        let original: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(forwarded["model"], original["model"], "{format}");
        if format == "anthropic" {
            assert_eq!(forwarded["system"], SYSTEM);
        }
        if format == "responses" {
            assert_eq!(forwarded["input"][1]["type"], "message");
            assert_eq!(forwarded["instructions"], SYSTEM);
        }
        // The summarizer saw the replaced turns, in order, and not the tail.
        let (_, call) = &summarizer.received()[0];
        assert_eq!(call["model"], "mini");
        let input = MockSummarizer::input_of(call);
        let first = input.find("Turn 0:").expect("the oldest replaced turn");
        let last = input.find("Turn 16:").expect("the newest replaced turn");
        assert!(first < last);
        assert!(!input.contains("Turn 17:"), "the tail is not summarized");
        assert!(
            !input.contains("Task: fix build"),
            "a pinned message stays verbatim"
        );
        assert_eq!(answer.header("x-compaction-summary-chunks"), Some("1"));
        assert_eq!(answer.header("x-compaction-summary-passes"), Some("1"));
        assert_eq!(answer.header("x-compaction-summary-replaced"), Some("17"));
        assert_eq!(
            answer.header("x-compaction-output-messages"),
            Some(if format == "chat" { "6" } else { "5" })
        );
    }
}

#[tokio::test]
async fn a_prefix_larger_than_the_window_is_mapped_in_chunks_and_reduced() {
    for format in ["chat", "anthropic", "responses"] {
        let summarizer = MockSummarizer::start(format, Mode::Canned).await;
        let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
        // Room per call: 1200 - 200 (answer) - ~330 (frame) - 152 (margin).
        let toml = config(
            &summarizer.url(),
            format,
            "",
            "window_tokens = 1200\nmax_concurrency = 2",
        );
        let proxy =
            TestProxy::start(&toml.replace("window_tokens = 4000\n", ""), &upstream.url()).await;
        let (path, body) = request(format, &turns(40));
        let answer = send(post(&proxy.url(path), &body, "k")).await;
        assert_eq!(
            answer.header("x-compaction-status"),
            Some("compacted"),
            "{format}"
        );
        let chunks: usize = answer
            .header("x-compaction-summary-chunks")
            .unwrap()
            .parse()
            .unwrap();
        assert!(chunks >= 3, "{format}: {chunks}");
        assert_eq!(
            answer.header("x-compaction-summary-passes"),
            Some("2"),
            "{format}"
        );
        assert_eq!(
            summarizer.calls(),
            chunks + 1,
            "{format}: one call per chunk, one reduce"
        );
        let received = summarizer.received();
        let reduce = MockSummarizer::input_of(&received.last().unwrap().1);
        assert!(
            reduce.starts_with("Summaries of consecutive parts"),
            "{format}"
        );
        for n in 0..chunks {
            assert!(reduce.contains(&format!("<part {}>", n + 1)), "{format}");
        }
        // 100/20 per call, every call counted.
        let prompt = (100 * (chunks + 1)).to_string();
        assert_eq!(
            answer.header("x-compaction-summarizer-prompt-tokens"),
            Some(prompt.as_str())
        );
    }
}

#[tokio::test]
async fn too_many_chunks_fall_back_to_the_engine() {
    let summarizer = MockSummarizer::start("chat", Mode::Canned).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let toml = config(&summarizer.url(), "chat", "", "max_chunks = 2")
        .replace("window_tokens = 4000", "window_tokens = 1200");
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let (path, body) = request("chat", &turns(40));
    let answer = send(post(&proxy.url(path), &body, "k")).await;
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("compacted; summarize-fallback")
    );
    assert_eq!(summarizer.calls(), 0);
    let metrics = metrics(&proxy).await;
    assert!(metrics.contains(r#"compaction_proxy_summarize_fallbacks_total{policy="default",reason="too-many-chunks"} 1"#), "{metrics}");
}

#[tokio::test]
async fn a_repeated_prefix_reuses_its_summary() {
    let (summarizer, upstream, proxy) = setup("chat", Mode::Canned, "").await;
    let (path, body) = request("chat", &turns(20));
    let first = send(post(&proxy.url(path), &body, "k")).await;
    let second = send(post(&proxy.url(path), &body, "k")).await;
    assert_eq!(summarizer.calls(), 1);
    assert_eq!(first.header("x-compaction-summary-source"), Some("model"));
    assert_eq!(second.header("x-compaction-summary-source"), Some("store"));
    assert_eq!(
        second.header("x-compaction-summarizer-prompt-tokens"),
        Some("0")
    );
    let received = upstream.received();
    assert_eq!(
        received[0].body, received[1].body,
        "the same bytes forwarded"
    );
}

#[tokio::test]
async fn stable_mode_calls_the_model_only_at_re_compactions() {
    let (summarizer, upstream, proxy) = setup("chat", Mode::Canned, "mode = \"stable\"").await;
    let all = turns(60);
    let mut rebased_turns = 0;
    let mut previous: Option<Value> = None;
    // Each request ends with the user's new message, as an agent's do.
    for n in (21..=61).step_by(2) {
        let (path, body) = request("chat", &all[..n]);
        let answer = send(post(&proxy.url(path), &body, "k")).await;
        assert_eq!(answer.status, 200);
        let rebased = answer.header("x-compaction-rebased") == Some("true");
        if rebased {
            rebased_turns += 1;
        }
        let forwarded = upstream.last().json();
        let messages = forwarded["messages"].as_array().unwrap().clone();
        if let (Some(prev), false) = (&previous, rebased) {
            // Between re-compactions the forwarded prefix only grows.
            let prev = prev.as_array().unwrap();
            assert_eq!(messages[..prev.len()], prev[..], "turn of {n} messages");
        }
        previous = Some(Value::Array(messages));
    }
    assert!(rebased_turns >= 2, "{rebased_turns}");
    assert!(summarizer.calls() >= 1);
    assert!(
        summarizer.calls() <= rebased_turns + 1,
        "{} calls for {rebased_turns} re-compactions",
        summarizer.calls()
    );
    // A later re-compaction extends the earlier summary.
    if summarizer.calls() > 1 {
        let last = MockSummarizer::input_of(&summarizer.received().last().unwrap().1);
        assert!(
            last.contains("[summary of the conversation before this point]\nSUMMARY-"),
            "{last}"
        );
    }
}

#[tokio::test]
async fn background_timing_never_makes_a_request_wait_for_the_model() {
    let (summarizer, upstream, proxy) = setup(
        "chat",
        Mode::Slow(Duration::from_millis(1500)),
        "summary_timing = \"background\"",
    )
    .await;
    let (path, body) = request("chat", &turns(20));
    let answer = send(post(&proxy.url(path), &body, "k")).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(
        answer.header("x-compaction-summary-id"),
        None,
        "the engine's body went"
    );
    assert_eq!(
        summarizer.answered(),
        0,
        "answered before the summarizer did"
    );
    let first = upstream.last().json();
    assert!(!first.to_string().contains("[compaction-proxy summary"));
    assert!(wait_until(Duration::from_secs(10), || summarizer.answered() == 1).await);
    // Stored a moment after the answer.
    let mut used = None;
    for _ in 0..100 {
        let again = send(post(&proxy.url(path), &body, "k")).await;
        if let Some(id) = again.header("x-compaction-summary-id") {
            used = Some(id.to_owned());
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        used.is_some(),
        "the next request uses the summary once ready"
    );
    assert_eq!(summarizer.calls(), 1);
}

async fn metrics(proxy: &TestProxy) -> String {
    let answer = send(
        Request::get(proxy.url("/metrics"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    String::from_utf8(answer.body.to_vec()).unwrap()
}

#[tokio::test]
async fn every_failure_falls_back_to_the_engine_in_time_with_status_and_metric() {
    for format in ["chat", "anthropic", "responses"] {
        for (mode, reason) in [
            (Mode::Error, "status"),
            (Mode::Garbage, "garbage"),
            (Mode::Refusal, "refusal"),
            (Mode::Slow(Duration::from_secs(30)), "timeout"),
        ] {
            let summarizer = MockSummarizer::start(format, mode).await;
            let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
            let toml = config(&summarizer.url(), format, "", "")
                .replace("timeout_secs = 3", "timeout_secs = 0.5");
            let proxy = TestProxy::start(&toml, &upstream.url()).await;
            let (path, body) = request(format, &turns(20));
            let started = Instant::now();
            let answer = send(post(&proxy.url(path), &body, "k")).await;
            let took = started.elapsed();
            assert_eq!(answer.status, 200, "{format} {reason}");
            assert_eq!(
                answer.header("x-compaction-status"),
                Some("compacted; summarize-fallback"),
                "{format} {reason}"
            );
            assert!(
                took < Duration::from_secs(10),
                "{format} {reason}: {took:?}"
            );
            assert_eq!(summarizer.calls(), 1, "{format} {reason}");
            let forwarded = upstream.last().body;
            assert!(!String::from_utf8_lossy(&forwarded).contains("[compaction-proxy summary"));
            let metrics = metrics(&proxy).await;
            let line = format!(
                r#"compaction_proxy_summarize_fallbacks_total{{policy="default",reason="{reason}"}} 1"#
            );
            assert!(metrics.contains(&line), "{format} {reason}:\n{metrics}");
            // The engine's body: what a drop-only policy forwards.
            let drop_only = TestProxy::start(
                &toml.replace("strategy = \"summarize\"", "strategy = \"drop\""),
                &upstream.url(),
            )
            .await;
            let plain = send(post(&drop_only.url(path), &body, "k")).await;
            assert_eq!(plain.header("x-compaction-status"), Some("compacted"));
            assert_eq!(upstream.last().body, forwarded, "{format} {reason}");
        }
    }
}

#[tokio::test]
async fn the_callers_key_reaches_the_summarizer_only_with_caller_credentials() {
    for format in ["chat", "anthropic"] {
        let (summarizer, _upstream, proxy) = setup(format, Mode::Canned, "").await;
        let (path, body) = request(format, &turns(20));
        send(post(&proxy.url(path), &body, "sk-caller-key")).await;
        let (headers, _) = &summarizer.received()[0];
        assert_eq!(headers["authorization"], "Bearer sk-caller-key", "{format}");
        assert_eq!(headers["x-api-key"], "sk-caller-key", "{format}");
    }
    for (format, header, value) in [
        ("chat", "authorization", "Bearer sk-from-env-1"),
        ("anthropic", "x-api-key", "sk-from-env-1"),
    ] {
        std::env::set_var("COMPACTION_TEST_SUMMARY_KEY", "sk-from-env-1");
        let summarizer = MockSummarizer::start(format, Mode::Canned).await;
        let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
        let toml = config(
            &summarizer.url(),
            format,
            "",
            "credentials = \"env:COMPACTION_TEST_SUMMARY_KEY\"",
        );
        let proxy = TestProxy::start(&toml, &upstream.url()).await;
        let (path, body) = request(format, &turns(20));
        let answer = send(post(&proxy.url(path), &body, "sk-caller-key")).await;
        assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
        let (headers, _) = &summarizer.received()[0];
        assert_eq!(headers[header], value, "{format}");
        let all: Vec<String> = headers
            .values()
            .map(|v| v.to_str().unwrap_or("").to_owned())
            .collect();
        assert!(
            !all.iter().any(|v| v.contains("sk-caller-key")),
            "{format}: the caller's key stays with the upstream: {all:?}"
        );
        // The upstream still got the caller's own key.
        assert_eq!(
            upstream.last().headers["authorization"],
            "Bearer sk-caller-key"
        );
    }
}

#[tokio::test]
async fn the_summarizers_tokens_are_in_the_metrics_and_the_report() {
    let (_summarizer, _upstream, proxy) = setup("anthropic", Mode::Canned, "").await;
    let (path, body) = request("anthropic", &turns(20));
    let answer = send(post(&proxy.url(path), &body, "k")).await;
    assert_eq!(
        answer.header("x-compaction-summarizer-prompt-tokens"),
        Some("100")
    );
    assert_eq!(
        answer.header("x-compaction-summarizer-completion-tokens"),
        Some("20")
    );
    let metrics = metrics(&proxy).await;
    for line in [
        r#"compaction_proxy_summarizer_tokens_total{kind="prompt",policy="default",summarizer="mock"} 100"#,
        r#"compaction_proxy_summarizer_tokens_total{kind="completion",policy="default",summarizer="mock"} 20"#,
    ] {
        assert!(metrics.contains(line), "{line}\n{metrics}");
    }
    assert!(!metrics.contains("sk-"), "no key in the metrics");
}

#[tokio::test]
async fn a_conversation_within_its_budget_calls_no_summarizer() {
    let (summarizer, upstream, proxy) = setup("chat", Mode::Canned, "").await;
    let (path, body) = request("chat", &turns(3));
    let answer = send(post(&proxy.url(path), &body, "k")).await;
    assert_eq!(answer.header("x-compaction-status"), Some("unchanged"));
    assert_eq!(summarizer.calls(), 0);
    assert_eq!(upstream.last().body, Bytes::from(body));
}

/// Every problem of a configuration, as check-config prints them.
fn problems(toml: &str) -> Vec<String> {
    match compaction_proxy::policy::Runtime::load_text(
        Some(toml),
        Vec::new(),
        &compaction_proxy::config::Overrides::default(),
    ) {
        Ok(_) => Vec::new(),
        Err(errors) => errors
            .0
            .into_iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect(),
    }
}

#[test]
fn check_config_refuses_a_policy_naming_an_undefined_summarizer() {
    let found =
        problems("[policies.default]\nstrategy = \"summarize\"\nsummarizer = \"nowhere\"\n");
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("policies.default.summarizer: no [summarizers.nowhere]")),
        "{found:?}"
    );
    let missing = problems("[policies.default]\nstrategy = \"summarize\"\n");
    assert!(
        missing
            .iter()
            .any(|p| p.starts_with("policies.default.summarizer: is required")),
        "{missing:?}"
    );
    let bad = problems(
        "[summarizers.s]\nformat = \"chat\"\ncredentials = \"token\"\nwindow_tokens = 100\ntimeout_secs = 0\n[store]\nredis_url = \"http://x\"\n",
    );
    for key in [
        "summarizers.s.model",
        "summarizers.s.credentials",
        "summarizers.s.window_tokens",
        "summarizers.s.timeout_secs",
        "store.redis_url",
    ] {
        assert!(bad.iter().any(|p| p.starts_with(key)), "{key}: {bad:?}");
    }
    let fine = problems(
        "[summarizers.s]\nmodel = \"m\"\ncredentials = \"env:KEY\"\n[policies.default]\nstrategy = \"summarize\"\nsummarizer = \"s\"\n",
    );
    assert!(fine.is_empty(), "{fine:?}");
}

#[tokio::test]
async fn background_stable_mode_writes_about_one_summary_per_re_compaction() {
    let (summarizer, upstream, proxy) = setup(
        "chat",
        Mode::Canned,
        "mode = \"stable\"\nsummary_timing = \"background\"",
    )
    .await;
    let all = turns(60);
    let (mut rebased_turns, mut summarized) = (0, 0);
    let mut previous: Option<Vec<Value>> = None;
    for n in (21..=61).step_by(2) {
        let (path, body) = request("chat", &all[..n]);
        let answer = send(post(&proxy.url(path), &body, "k")).await;
        let rebased = answer.header("x-compaction-rebased") == Some("true");
        rebased_turns += usize::from(rebased);
        summarized += usize::from(answer.header("x-compaction-summary-id").is_some());
        let messages = upstream.last().json()["messages"]
            .as_array()
            .unwrap()
            .clone();
        if let (Some(prev), false) = (&previous, rebased) {
            // A summary is taken up only at a re-compaction.
            assert_eq!(messages[..prev.len()], prev[..], "turn of {n} messages");
        }
        previous = Some(messages);
        // Let the background summary land before the next turn.
        let calls = summarizer.calls();
        wait_until(Duration::from_secs(5), || summarizer.answered() == calls).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(summarized > 0, "later re-compactions use the summaries");
    assert!(
        summarizer.calls() <= rebased_turns + 1,
        "{} calls for {rebased_turns} re-compactions",
        summarizer.calls()
    );
}

#[tokio::test]
async fn a_relevance_goal_header_keeps_what_it_asks_for_beside_the_summary() {
    const INVOICE: &str = "The invoice total for Kestrel was 4410 EUR.";
    let extra =
        "mode = \"stable\"\nscoring = \"relevance\"\nrelevance_goal_header = \"x-compaction-goal\"";
    let (summarizer, upstream, proxy) = setup("chat", Mode::Canned, extra).await;
    let mut all = turns(30);
    all.insert(4, ("user", INVOICE.to_owned()));
    let (path, body) = request("chat", &all);
    let mut request = post(&proxy.url(path), &body, "k");
    request.headers_mut().insert(
        "x-compaction-goal",
        http::HeaderValue::from_static("invoice total of Kestrel"),
    );
    let answer = send(request).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert!(answer.header("x-compaction-summary-id").is_some());
    assert_eq!(summarizer.calls(), 1);
    let forwarded = texts("chat", &upstream.last().json());
    // The goal's compaction kept the invoice: the summary replaces what it
    // removed, not what a compaction without the goal would have.
    assert!(forwarded.iter().any(|(_, t)| t == INVOICE), "{forwarded:?}");
    let asked = MockSummarizer::input_of(&summarizer.received()[0].1);
    assert!(!asked.contains("Kestrel"), "{asked}");
}
