//! `tool_decisions = "model"` (seed 004) against a mock decision model
//! (chat completions) that records what it was shown and answers per
//! candidate id: decisions applied and the request still valid in each
//! format, an answer that is not the decision JSON or names wrong ids
//! falling back to the passes, and decisions reused from the store.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::support::{send, Behavior, MockUpstream, TestProxy};

/// How the mock decision model answers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answering {
    /// `drop_call` for `a`, `drop_result` for `b`, `keep` for the rest.
    Rule,
    /// Prose, not JSON.
    Garbage,
    /// Valid JSON naming an id that is no candidate.
    WrongIds,
    /// JSON of another shape.
    WrongShape,
    /// The rule, after this long.
    Slow(Duration),
}

#[derive(Clone)]
struct MockDecider {
    addr: SocketAddr,
    answering: Answering,
    seen: Arc<Mutex<Vec<Value>>>,
}

impl MockDecider {
    async fn start(answering: Answering) -> MockDecider {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mock = MockDecider {
            addr: listener.local_addr().unwrap(),
            answering,
            seen: Arc::default(),
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

    fn calls(&self) -> usize {
        self.seen.lock().unwrap().len()
    }

    /// The observation the `n`th call was shown.
    fn observation(&self, n: usize) -> String {
        let seen = self.seen.lock().unwrap();
        let messages = seen[n]["messages"].as_array().unwrap();
        messages.last().unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    async fn answer(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let body = req.into_body().collect().await.unwrap().to_bytes();
        let value: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        self.seen.lock().unwrap().push(value.clone());
        let observation = value["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_owned();
        // The candidates' ids, as the observation lists them.
        let ids: Vec<String> = observation
            .lines()
            .filter_map(|l| l.strip_prefix("- id: "))
            .filter_map(|l| l.split(" | ").next())
            .map(str::to_owned)
            .collect();
        let rule = || {
            let decisions: Vec<Value> = ids
                .iter()
                .map(|id| {
                    let action = match id.as_str() {
                        "a" => "drop_call",
                        "b" => "drop_result",
                        _ => "keep",
                    };
                    json!({"id": id, "action": action})
                })
                .collect();
            json!({"decisions": decisions}).to_string()
        };
        let text = match self.answering {
            Answering::Rule => rule(),
            Answering::Slow(delay) => {
                tokio::time::sleep(delay).await;
                rule()
            }
            Answering::Garbage => "Sure, drop the icon search and keep the rest.".to_owned(),
            Answering::WrongIds => {
                json!({"decisions": [{"id": "nope", "action": "keep"}]}).to_string()
            }
            Answering::WrongShape => json!({"keep": ids}).to_string(),
        };
        let answer = json!({
            "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 300, "completion_tokens": 40},
        });
        Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(answer.to_string())))
            .unwrap()
    }
}

fn config(url: &str) -> String {
    format!(
        r#"
[summarizers.decider]
url = "{url}"
format = "chat"
model = "mini"
timeout_secs = 1
window_tokens = 8000
max_output_tokens = 200

[policies.default]
mode = "exact"
budget_chars = 6000
keep_last_n = 2
max_tool_result_chars = 0
max_arg_chars = 0
tool_duplicate_threshold = 0.0
tool_decisions = "model"
summarizer = "decider"
eligible_tools = ["search_code", "read_file"]
"#
    )
}

fn big(tag: &str) -> String {
    (0..150).map(|k| format!("{tag} line {k}\n")).collect()
}

/// A session with four finished calls: `a` (search, its own message),
/// `b` (read), `c` (a tool not allowlisted), `d` (read), then the request.
/// Each call sits alone in an assistant turn with no text, so every unit
/// can go whole.
fn body(format: &str) -> (&'static str, Value) {
    let calls = [
        ("a", "search_code", json!({"pattern": "logo"})),
        ("b", "read_file", json!({"path": "pay.rs"})),
        ("c", "run_shell", json!({"cmd": "ls"})),
        ("d", "read_file", json!({"path": "retry.rs"})),
    ];
    let task = "Fix the payment retries.";
    let ask = "Now patch the retry loop in pay.rs.";
    match format {
        "chat" => {
            let mut messages = vec![json!({"role": "user", "content": task})];
            for (id, name, args) in &calls {
                messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
                    {"id": id, "type": "function", "function": {"name": name, "arguments": args.to_string()}}]}));
                messages.push(json!({"role": "tool", "tool_call_id": id, "content": big(id)}));
            }
            messages.push(json!({"role": "assistant", "content": "Done reading."}));
            messages.push(json!({"role": "user", "content": ask}));
            (
                "/v1/chat/completions",
                json!({"model": "gpt-4o", "messages": messages}),
            )
        }
        "anthropic" => {
            let mut messages = vec![json!({"role": "user", "content": task})];
            for (id, name, args) in &calls {
                messages.push(json!({"role": "assistant", "content": [
                    {"type": "tool_use", "id": id, "name": name, "input": args}]}));
                messages.push(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": id, "content": big(id)}]}));
            }
            messages.push(json!({"role": "assistant", "content": "Done reading."}));
            messages.push(json!({"role": "user", "content": ask}));
            (
                "/v1/messages",
                json!({"model": "claude-sonnet-4-5", "max_tokens": 100, "messages": messages}),
            )
        }
        _ => {
            let mut input = vec![json!({"role": "user", "content": task})];
            for (id, name, args) in &calls {
                input.push(json!({"type": "function_call", "call_id": id, "name": name, "arguments": args.to_string()}));
                input.push(
                    json!({"type": "function_call_output", "call_id": id, "output": big(id)}),
                );
            }
            input.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Done reading."}]}));
            input.push(json!({"role": "user", "content": ask}));
            ("/v1/responses", json!({"model": "gpt-5", "input": input}))
        }
    }
}

fn post(url: &str, body: &Value) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}

/// The call ids the forwarded body still makes, and the result text per id.
fn forwarded_calls(format: &str, forwarded: &Value) -> (Vec<String>, Vec<(String, String)>) {
    let mut calls = Vec::new();
    let mut results = Vec::new();
    let array = match format {
        "responses" => forwarded["input"].as_array().unwrap().clone(),
        _ => forwarded["messages"].as_array().unwrap().clone(),
    };
    for m in &array {
        match format {
            "chat" => {
                for c in m["tool_calls"].as_array().into_iter().flatten() {
                    calls.push(c["id"].as_str().unwrap().to_owned());
                }
                if m["role"] == "tool" {
                    results.push((
                        m["tool_call_id"].as_str().unwrap().to_owned(),
                        m["content"].as_str().unwrap().to_owned(),
                    ));
                }
            }
            "anthropic" => {
                for b in m["content"].as_array().into_iter().flatten() {
                    if b["type"] == "tool_use" {
                        calls.push(b["id"].as_str().unwrap().to_owned());
                    }
                    if b["type"] == "tool_result" {
                        let text = match &b["content"] {
                            Value::String(s) => s.clone(),
                            other => other[0]["text"].as_str().unwrap_or("").to_owned(),
                        };
                        results.push((b["tool_use_id"].as_str().unwrap().to_owned(), text));
                    }
                }
            }
            _ => {
                if m["type"] == "function_call" {
                    calls.push(m["call_id"].as_str().unwrap().to_owned());
                }
                if m["type"] == "function_call_output" {
                    results.push((
                        m["call_id"].as_str().unwrap().to_owned(),
                        m["output"].as_str().unwrap().to_owned(),
                    ));
                }
            }
        }
    }
    (calls, results)
}

async fn setup(answering: Answering) -> (MockDecider, MockUpstream, TestProxy) {
    let decider = MockDecider::start(answering).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let url = format!("http://{}", decider.addr);
    let proxy = TestProxy::start(&config(&url), &upstream.url()).await;
    (decider, upstream, proxy)
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
async fn the_models_decisions_are_applied_and_the_request_stays_valid_in_each_format() {
    for format in ["chat", "anthropic", "responses"] {
        let (decider, upstream, proxy) = setup(Answering::Rule).await;
        let (path, body) = body(format);
        let answer = send(post(&proxy.url(path), &body)).await;
        assert_eq!(answer.status, 200, "{format}");
        assert_eq!(
            answer.header("x-compaction-status"),
            Some("compacted"),
            "{format}"
        );
        assert_eq!(
            answer.header("x-compaction-tool-decisions"),
            Some("keep=1, drop_result=1, drop_call=1"),
            "{format}"
        );
        assert_eq!(
            answer.header("x-compaction-tool-decisions-source"),
            Some("model")
        );
        assert_eq!(decider.calls(), 1, "{format}");
        // Shown: the goal, the tools and sizes; never a result's body; `c`
        // (not allowlisted) is no candidate.
        let seen = decider.observation(0);
        assert!(
            seen.contains("Now patch the retry loop in pay.rs."),
            "{seen}"
        );
        assert!(seen.contains("- id: a | tool: search_code"), "{seen}");
        assert!(!seen.contains("- id: c "), "{seen}");
        assert!(!seen.contains("a line 7"), "no result body: {seen}");
        let forwarded = upstream.last().json();
        let (calls, results) = forwarded_calls(format, &forwarded);
        // a: dropped whole; b: kept, result cut to a head; c, d: whole.
        assert_eq!(calls, ["b", "c", "d"], "{format}: {forwarded}");
        let result = |id: &str| {
            results
                .iter()
                .find(|(r, _)| r == id)
                .map(|(_, t)| t.clone())
                .unwrap()
        };
        assert!(result("b").starts_with("b line 0"), "{format}");
        assert!(result("b").contains("chars omitted"), "{format}");
        assert!(result("b").chars().count() < 400, "{format}");
        assert_eq!(result("d"), big("d"), "{format}: kept whole");
        // Every call still has its result and every result its call.
        let answered: Vec<&String> = results.iter().map(|(id, _)| id).collect();
        assert_eq!(answered, calls.iter().collect::<Vec<_>>(), "{format}");
        let text = metrics(&proxy).await;
        assert!(
            text.contains(
                r#"compaction_proxy_tool_decisions_total{action="drop_call",policy="default"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(r#"compaction_proxy_summarizer_tokens_total{kind="prompt",policy="default",summarizer="decider"} 300"#), "{text}");
    }
}

#[tokio::test]
async fn a_second_turn_reuses_the_decisions_from_the_store() {
    let (decider, upstream, proxy) = setup(Answering::Rule).await;
    let (path, body) = body("chat");
    let first = send(post(&proxy.url(path), &body)).await;
    let second = send(post(&proxy.url(path), &body)).await;
    assert_eq!(decider.calls(), 1, "the model is asked once");
    assert_eq!(
        second.header("x-compaction-tool-decisions-source"),
        Some("store")
    );
    assert_eq!(
        second.header("x-compaction-tool-decisions-prompt-tokens"),
        Some("0")
    );
    assert_eq!(
        first.header("x-compaction-tool-decisions"),
        second.header("x-compaction-tool-decisions")
    );
    let received = upstream.received();
    assert_eq!(
        received[0].body, received[1].body,
        "the same bytes forwarded"
    );
}

#[tokio::test]
async fn an_unusable_answer_falls_back_to_the_passes_with_status_and_metric() {
    for (answering, reason) in [
        (Answering::Garbage, "garbage"),
        (Answering::WrongShape, "garbage"),
        (Answering::WrongIds, "invalid-decisions"),
        (Answering::Slow(Duration::from_secs(3)), "timeout"),
    ] {
        let (decider, upstream, proxy) = setup(answering).await;
        let (path, body) = body("chat");
        let started = std::time::Instant::now();
        let answer = send(post(&proxy.url(path), &body)).await;
        assert!(started.elapsed() < Duration::from_millis(2500), "{reason}");
        assert_eq!(answer.status, 200, "{reason}");
        assert_eq!(
            answer.header("x-compaction-status"),
            Some("compacted; decisions-fallback"),
            "{reason}"
        );
        assert_eq!(answer.header("x-compaction-tool-decisions"), None);
        assert_eq!(decider.calls(), 1);
        // The engine's own compaction went: every call kept its result.
        let (calls, results) = forwarded_calls("chat", &upstream.last().json());
        assert_eq!(calls.len(), results.len(), "{reason}");
        let text = metrics(&proxy).await;
        let series = format!(
            r#"compaction_proxy_tool_decision_fallbacks_total{{policy="default",reason="{reason}"}} 1"#
        );
        assert!(text.contains(&series), "{reason}: {text}");
    }
}

#[tokio::test]
async fn a_body_within_its_budget_or_without_candidates_calls_no_model() {
    let (decider, _upstream, proxy) = setup(Answering::Rule).await;
    let small = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    let answer = send(post(&proxy.url("/v1/chat/completions"), &small)).await;
    assert_eq!(answer.header("x-compaction-status"), Some("unchanged"));
    let plain: Vec<Value> = (0..40)
        .map(
            |k| json!({"role": if k % 2 == 0 { "user" } else { "assistant" }, "content": big("x")}),
        )
        .collect();
    let answer = send(post(
        &proxy.url("/v1/chat/completions"),
        &json!({"model": "gpt-4o", "messages": plain}),
    ))
    .await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(decider.calls(), 0);
}

/// The paths of a configuration's problems, as check-config prints them.
fn problems(toml: &str) -> Vec<String> {
    match compaction_proxy::policy::Runtime::load_text(
        Some(toml),
        Vec::new(),
        &compaction_proxy::config::Overrides::default(),
    ) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.0.into_iter().map(|p| p.path).collect(),
    }
}

#[test]
fn check_config_refuses_model_decisions_without_what_they_need() {
    let base = config("http://127.0.0.1:9");
    assert!(problems(&base).is_empty(), "{:?}", problems(&base));
    let stable = base.replace("mode = \"exact\"", "mode = \"stable\"");
    assert_eq!(problems(&stable), ["policies.default.tool_decisions"]);
    let no_tools = base.replace("eligible_tools = [\"search_code\", \"read_file\"]", "");
    assert_eq!(problems(&no_tools), ["policies.default.eligible_tools"]);
    let no_model = base.replace("summarizer = \"decider\"", "");
    assert_eq!(problems(&no_model), ["policies.default.summarizer"]);
}

#[tokio::test]
async fn the_report_shows_the_models_decisions_as_remes() {
    let decider = MockDecider::start(Answering::Rule).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let url = format!("http://{}", decider.addr);
    let toml = config(&url).replace("mode = \"exact\"", "mode = \"exact\"\nallow_report = true");
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let (path, body) = body("chat");
    let mut request = post(&proxy.url(path), &body);
    request.headers_mut().insert(
        "x-compaction-report",
        http::HeaderValue::from_static("true"),
    );
    let answer = send(request).await;
    let id = answer.header("x-compaction-report-id").unwrap().to_owned();
    let report_url = proxy.url(&format!("/v1/compaction-reports/{id}"));
    let get = || {
        Request::get(&report_url)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let mut fetched = send(get()).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while fetched.status == 404 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        fetched = send(get()).await;
    }
    let report: Value = serde_json::from_slice(&fetched.body).unwrap();
    let calls: Vec<(String, String, Option<String>)> = report["messages"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
        .map(|c| {
            (
                c["id"].as_str().unwrap().to_owned(),
                c["decision"].as_str().unwrap().to_owned(),
                c["decided_by"].as_str().map(str::to_owned),
            )
        })
        .collect();
    let model = || Some("model".to_owned());
    assert_eq!(
        calls,
        [
            ("a".into(), "drop_call".into(), model()),
            ("b".into(), "drop_result".into(), model()),
            ("c".into(), "keep".into(), None),
            ("d".into(), "keep".into(), model()),
        ],
        "{report}"
    );
}

/// The text of the observation's goal section.
fn goal_section(observation: &str) -> &str {
    let start = observation.find("## Goal").expect("a goal section");
    let end = observation.find("## Conversation").expect("a conversation");
    &observation[start..end]
}

#[tokio::test]
async fn a_relevance_goal_header_is_the_observations_goal_and_scores_the_re_compaction() {
    const INVOICE: &str = "The invoice total for Kestrel was 4410 EUR.";
    const SHIPMENT: &str = "The rail shipment to Halden leaves at 06:40.";
    let decider = MockDecider::start(Answering::Rule).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let url = format!("http://{}", decider.addr);
    let toml = config(&url).replace(
        "budget_chars = 6000",
        "budget_chars = 3450\nscoring = \"relevance\"\nrelevance_goal_header = \"x-compaction-goal\"",
    );
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let (path, mut body) = body("chat");
    let facts = [
        json!({"role": "user", "content": INVOICE}),
        json!({"role": "assistant", "content": "Filler about the weather and lunch. ".repeat(6)}),
        json!({"role": "user", "content": SHIPMENT}),
    ];
    let messages = body["messages"].as_array_mut().unwrap();
    for (k, fact) in facts.into_iter().enumerate() {
        messages.insert(1 + k, fact);
    }
    let texts = |upstream: &MockUpstream| -> Vec<String> {
        upstream.last().json()["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|m| m["content"].as_str().map(str::to_owned))
            .collect()
    };

    // No goal: the latest request is the goal, and the invoice (older,
    // matching nothing asked) does not fit.
    let answer = send(post(&proxy.url(path), &body)).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(
        answer.header("x-compaction-tool-decisions"),
        Some("keep=1, drop_result=1, drop_call=1")
    );
    let seen = decider.observation(0);
    assert!(
        goal_section(&seen).contains("Now patch the retry loop in pay.rs."),
        "{seen}"
    );
    let without = texts(&upstream);

    // The header's goal: shown as the goal, and the re-compaction after the
    // decisions keeps what it asks for.
    let mut request = post(&proxy.url(path), &body);
    request.headers_mut().insert(
        "x-compaction-goal",
        http::HeaderValue::from_static("invoice total of Kestrel"),
    );
    let answer = send(request).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(
        answer.header("x-compaction-tool-decisions"),
        Some("keep=1, drop_result=1, drop_call=1")
    );
    assert_eq!(decider.calls(), 2, "another goal, another observation");
    let seen = decider.observation(1);
    let goal = goal_section(&seen);
    assert!(goal.contains("invoice total of Kestrel"), "{seen}");
    assert!(!goal.contains("Now patch the retry loop"), "{seen}");
    let with = texts(&upstream);
    assert!(with.iter().any(|t| t == INVOICE), "{with:?}");
    assert!(!without.iter().any(|t| t == INVOICE), "{without:?}");
}
