//! Real coding agents through the proxy, against the strict scripted fake
//! upstream of `scripts/agents/` (see docs/agents.md).
//!
//! The fake upstream's own rules are tested first, straight: it must refuse
//! what the real APIs refuse (or the agent tests below would prove nothing)
//! and bind thinking signatures to their prefix as Anthropic does.
//!
//! Then Claude Code, Codex and opencode, installed from npm into
//! `scripts/agents/node_modules` (`npm ci` there; CI does it and sets
//! `REQUIRE_AGENT_CLIENTS=1`), each run a 40-turn session with no proxy and
//! through the proxy on its shipped defaults at budget_chars = 60000, and
//! the shipped defaults must meet the coding-agent targets: every client
//! compacted, nothing refused, the bill at most 0.7x (Claude Code) or 0.6x
//! (Codex, opencode) the no-proxy bill, at least 0.8 of turns extending the
//! previous request, the budget met. Without the clients that test prints
//! `skipped`; with `REQUIRE_AGENT_CLIENTS=1` it fails instead.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::Full;
use hyper::Request;
use serde_json::{json, Value};

use crate::support::*;

const AGENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/agents");
const BIN: &str = env!("CARGO_BIN_EXE_compaction-proxy");
const BINDING_BETA: &str = "thinking-binding-controls-2026-08-01";

/// Runs the agent harness (`scripts/agents/run.py`) with `args`, the
/// proxy binary and `work` as its directory; its figures. At the lowest CPU
/// priority: the clients are heavy, and the suite's other tests (some
/// timed) run beside it.
pub(crate) fn run_harness(work: &Path, args: &[&str]) -> Value {
    let out = work.join("figures.json");
    let status = Command::new("nice")
        .args(["-n", "19", "python3"])
        .arg(format!("{AGENTS}/run.py"))
        .args(args)
        .arg("--proxy")
        .arg(BIN)
        .arg("--work")
        .arg(work)
        .arg("--json")
        .arg(&out)
        .status()
        .expect("python3 runs the harness");
    assert!(status.success(), "the harness failed (logs in {work:?})");
    serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap()
}

fn scratch(name: &str) -> PathBuf {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("{name}-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `scripts/agents/fake_upstream.py` on a port of its own, killed on drop.
pub(crate) struct FakeUpstream {
    child: Child,
    port: u16,
}

impl FakeUpstream {
    /// Scripted for `turns` tool-call turns over this repository's tree.
    pub(crate) fn start(turns: u32) -> FakeUpstream {
        let dir = scratch("fake-upstream");
        let port_file = dir.join("port");
        let log_dir = dir.join("log");
        let child = Command::new("python3")
            .arg(format!("{AGENTS}/fake_upstream.py"))
            .args(["--listen", "0", "--turns", &turns.to_string()])
            .arg("--tree")
            .arg(env!("CARGO_MANIFEST_DIR"))
            .arg("--port-file")
            .arg(&port_file)
            .arg("--log-dir")
            .arg(&log_dir)
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 runs the fake upstream");
        let started = Instant::now();
        let port = loop {
            if let Some(port) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|p| p.trim().parse().ok())
            {
                break port;
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the fake upstream did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        FakeUpstream { child, port }
    }

    pub(crate) fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for FakeUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn post(url: &str, body: &Value, beta: Option<&str>) -> Answer {
    let mut request = Request::post(url)
        .header("content-type", "application/json")
        .header("x-api-key", "sk-ant-test-key");
    if let Some(beta) = beta {
        request = request.header("anthropic-beta", beta);
    }
    send(
        request
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap(),
    )
    .await
}

fn error_message(answer: &Answer) -> String {
    answer.json()["error"]["message"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// The error message of the answer, which must be a 400.
fn refused(answer: &Answer) -> String {
    assert_eq!(
        answer.status,
        400,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    error_message(answer)
}

/// The answer's JSON, which must be a 200.
fn accepted(answer: &Answer) -> Value {
    assert_eq!(
        answer.status,
        200,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    answer.json()
}

/// Appends the assistant turn `content` and a user turn answering its tool call.
fn answer_tool_call(body: &mut Value, content: &Value, result: &str) {
    let id = content
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["type"] == "tool_use")
        .expect("a tool call")["id"]
        .clone();
    let messages = body["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": content}));
    messages.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": id, "content": result}]}));
}

fn anthropic(messages: Value) -> Value {
    json!({"model": "claude-sonnet-4-5", "max_tokens": 2048, "messages": messages})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_upstream_refuses_what_the_real_apis_refuse() {
    let fake = FakeUpstream::start(5);
    let tool_use = json!({"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}});
    let cases = [
        (
            "/v1/messages",
            anthropic(json!([{"role": "assistant", "content": "hi"}])),
            "first message must use the \"user\" role",
        ),
        (
            "/v1/messages",
            anthropic(json!([{"role": "user", "content": [{"type": "text", "text": ""}]}])),
            "text content blocks must be non-empty",
        ),
        (
            "/v1/messages",
            anthropic(json!([{"role": "user", "content": [{"type": "text", "text": " \n"}]}])),
            "text content blocks must contain non-whitespace text",
        ),
        (
            "/v1/messages",
            anthropic(json!([
                {"role": "user", "content": "read it"},
                {"role": "assistant", "content": [tool_use]},
                {"role": "user", "content": "go on"},
            ])),
            "`tool_use` ids were found without `tool_result` blocks immediately after: toolu_1",
        ),
        (
            "/v1/messages",
            anthropic(json!([
                {"role": "user", "content": "read it"},
                {"role": "assistant", "content": "sure"},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]},
            ])),
            "unexpected `tool_use_id` found in `tool_result` blocks: toolu_9",
        ),
        (
            "/v1/messages",
            anthropic(json!([
                {"role": "user", "content": "read it"},
                {"role": "assistant", "content": [tool_use]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                    "content": [{"type": "text", "text": ""}]}]},
            ])),
            "text content blocks must be non-empty",
        ),
        (
            "/v1/responses",
            json!({"model": "gpt-5-codex", "input": [
                {"type": "message", "role": "user", "content": "hi"},
                {"type": "function_call_output", "call_id": "call_7", "output": "x"},
            ]}),
            "No tool call found for function call output with call_id call_7.",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "tool", "tool_call_id": "call_1", "content": "x"},
            ]}),
            "messages with role 'tool' must be a response to a preceeding message with 'tool_calls'",
        ),
        (
            "/v1/chat/completions",
            json!({"model": "m", "messages": [
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                    "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
                {"role": "user", "content": "and?"},
            ]}),
            "The following tool_call_ids did not have response messages: call_1",
        ),
    ];
    for (path, body, expected) in cases {
        let answer = post(&fake.url(path), &body, None).await;
        let message = refused(&answer);
        assert!(message.contains(expected), "{path}: {message}");
        let kind = if path == "/v1/messages" {
            answer.json()["type"].clone()
        } else {
            answer.json()["error"]["type"].clone()
        };
        let want = if path == "/v1/messages" {
            "error"
        } else {
            "invalid_request_error"
        };
        assert_eq!(kind, want, "{path}: the API's error shape");
    }
}

/// Turn 0 of a scripted session with thinking on: the answer, and the
/// request that answers its tool call.
async fn thinking_turn(fake: &FakeUpstream) -> (Value, Value) {
    let tools = json!([{"name": "Read", "description": "read a file", "input_schema":
        {"type": "object", "properties": {"file_path": {"type": "string"}}}}]);
    let mut body = anthropic(json!([{"role": "user", "content": "Survey the tree."}]));
    body["tools"] = tools;
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    let reply = accepted(&post(&fake.url("/v1/messages"), &body, None).await);
    let content = &reply["content"];
    assert_eq!(content[0]["type"], "thinking");
    assert!(content[0]["signature"].as_str().unwrap().len() > 20);
    answer_tool_call(&mut body, content, "fn main() {}");
    (reply, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_upstream_binds_thinking_blocks_to_their_prefix() {
    let fake = FakeUpstream::start(5);
    let (first, next) = thinking_turn(&fake).await;
    assert_eq!(first["usage"]["cache_read_input_tokens"], 0);

    // Sent back unchanged: accepted, the scripted turn 1, the prefix billed as cached.
    let reply = accepted(&post(&fake.url("/v1/messages"), &next, None).await);
    assert!(reply["usage"]["cache_read_input_tokens"].as_u64().unwrap() > 0);
    let turn1 = reply["content"].as_array().unwrap();
    assert!(turn1.iter().any(|b| b["type"] == "tool_use"));

    // An earlier message changed: the block is bound to a different conversation.
    let mut changed = next.clone();
    changed["messages"][0]["content"] = json!("Survey the tree, briefly.");
    let message = refused(&post(&fake.url("/v1/messages"), &changed, None).await);
    assert!(
        message.starts_with(
            "messages.1.content.0: Invalid `signature` in `thinking` block. The block is bound to a different conversation."
        ),
        "{message}"
    );

    // The tools changed: the same.
    let mut retooled = next.clone();
    retooled["tools"][0]["description"] = json!("read one file");
    refused(&post(&fake.url("/v1/messages"), &retooled, None).await);

    // drop_block needs its beta header ...
    changed["thinking"]["block_binding"] = json!({"prefix_mismatch_behavior": "drop_block"});
    let message = refused(&post(&fake.url("/v1/messages"), &changed, None).await);
    assert!(message.contains(BINDING_BETA), "{message}");
    // ... and with it the failing block is dropped, not refused.
    let answer = accepted(&post(&fake.url("/v1/messages"), &changed, Some(BINDING_BETA)).await);
    assert_eq!(
        answer["input_transformations"],
        json!([{"type": "thinking_dropped", "path": "messages.1.content.0", "reason": "prefix_mismatch"}])
    );

    // A thinking block between others left out: the later one fails.
    let mut second = next.clone();
    answer_tool_call(&mut second, &reply["content"], "struct A;");
    accepted(&post(&fake.url("/v1/messages"), &second, None).await);
    let blocks = second["messages"][1]["content"].as_array_mut().unwrap();
    blocks.remove(0);
    let message = refused(&post(&fake.url("/v1/messages"), &second, None).await);
    assert!(
        message.starts_with("messages.3.content.0: Invalid `signature`"),
        "{message}"
    );
}

fn clients_installed() -> bool {
    let bin = Path::new(AGENTS).join("node_modules/.bin");
    let missing: Vec<&str> = ["claude", "codex", "opencode"]
        .into_iter()
        .filter(|p| !bin.join(p).exists())
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var_os("REQUIRE_AGENT_CLIENTS").is_none(),
        "the agent clients {missing:?} are required here: `npm ci` in scripts/agents (see .ci/run)"
    );
    eprintln!(
        "skipped: the agent clients {missing:?} are not installed (`npm ci` in scripts/agents)"
    );
    false
}

fn row<'a>(results: &'a [Value], client: &str, mode: &str) -> &'a Value {
    results
        .iter()
        .find(|r| r["client"] == client && r["mode"] == mode)
        .unwrap_or_else(|| panic!("no run for {client} in mode {mode}"))
}

fn number(value: &Value) -> f64 {
    value.as_f64().unwrap_or(f64::NAN)
}

#[test]
fn agent_clients_run_through_the_shipped_defaults_valid_and_compacted() {
    if !clients_installed() {
        return;
    }
    let clients = ["claude", "claude-sonnet", "codex", "opencode"];
    let work = scratch("agents");
    let clients_arg = clients.join(",");
    let figures = run_harness(
        &work,
        &[
            "--clients",
            &clients_arg,
            "--modes",
            "none,defaults",
            "--turns",
            "40",
            "--budget",
            "60000",
            "--timeout",
            "300",
        ],
    );
    let results = figures["results"].as_array().unwrap();
    for client in clients {
        let none = row(results, client, "none");
        let defaults = row(results, client, "defaults");
        for r in [none, defaults] {
            let mode = &r["mode"];
            assert_eq!(
                r["rc"], 0,
                "{client} {mode}: the client failed (logs in {work:?})"
            );
            assert_eq!(
                r["turns"], 40,
                "{client} {mode}: the session ran to its end"
            );
            assert_eq!(
                r["refused"], 0,
                "{client} {mode}: requests the strict upstream refused: {}",
                r["refused_by_reason"]
            );
            assert_eq!(r["errors"], 0, "{client} {mode}: the fake upstream failed");
        }
        // Every client's turns reach the upstream through the proxy.
        assert_eq!(
            number(&defaults["compacted"])
                + number(&defaults["unchanged"])
                + number(&defaults["skipped"]),
            number(&defaults["requests"]),
            "{client}: every request answered with a compaction status"
        );
        let ratio = number(&defaults["billed"]) / number(&none["billed"]);
        eprintln!(
            "{client}: {} requests, {} compacted, bill {ratio:.2}x, extends {}/{}, budget missed {}",
            defaults["requests"],
            defaults["compacted"],
            defaults["extends"],
            defaults["follow_turns"],
            defaults["budget_missed"]
        );
        assert!(
            number(&defaults["compacted"]) >= 1.0,
            "{client}: the shipped defaults compacted nothing ({})",
            defaults["skip_reasons"]
        );
        let limit = if client.starts_with("claude") {
            0.7
        } else {
            0.6
        };
        assert!(
            ratio <= limit,
            "{client}: bill {ratio:.2}x the no-proxy bill"
        );
        let extends = number(&defaults["extends"]) / number(&defaults["follow_turns"]);
        assert!(
            extends >= 0.8,
            "{client}: {extends:.2} of turns extend the previous request"
        );
        assert_eq!(defaults["budget_missed"], 0, "{client}: budget missed");
    }
    let _ = std::fs::remove_dir_all(&work);
}
