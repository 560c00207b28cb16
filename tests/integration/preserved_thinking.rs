//! Preserved thinking: a mock Messages API that signs each thinking block
//! against its prefix (system, tools and every message before it, as the
//! API received them) and refuses a request whose blocks no longer match,
//! as Anthropic's prefix check does. A client runs a long tool loop through
//! the proxy, resending its history as it came; compaction drops, trims,
//! prunes and re-compacts, and no request may fail the check. The mock
//! also holds the API's rule that the last turn of an open tool loop starts
//! with its thinking, and honours `drop_block` only with its beta header.

use std::sync::{Arc, Mutex};

use serde_json::{json, Value};

use crate::support::{post_json, send, AnthropicFn, Behavior, MockUpstream, TestProxy};

/// The signature the mock gives a thinking block produced after `prefix`.
fn sign(request: &Value, prefix: &[Value], thinking: &str) -> String {
    let bound = json!({
        "system": request["system"],
        "tools": request["tools"],
        "messages": prefix,
        "thinking": thinking,
    });
    // serde_json's maps are sorted: this text is canonical.
    format!(
        "{:032x}",
        xxhash_rust::xxh3::xxh3_128(bound.to_string().as_bytes())
    )
}

/// Whether the request asks the API to drop stale blocks, with the beta
/// that allows it.
fn drops_stale(request: &Value, beta: bool) -> bool {
    beta && request["thinking"]["block_binding"]["prefix_mismatch_behavior"] == "drop_block"
}

/// The API's open-loop rule: with thinking on, the assistant turn whose
/// calls the last user turn answers starts with a thinking block.
fn open_loop_rule(request: &Value) -> Result<(), String> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let [.., assistant, last] = messages.as_slice() else {
        return Ok(());
    };
    let answers_tools = last["content"]
        .as_array()
        .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"));
    if answers_tools && assistant["content"][0]["type"] != "thinking" {
        return Err("a final `assistant` message must start with a thinking block".into());
    }
    Ok(())
}

/// The mock's prefix check: the first thinking block whose signature does
/// not match what now precedes it, as the API's error names it.
fn prefix_check(request: &Value) -> Result<(), String> {
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    for (m, message) in messages.iter().enumerate() {
        let Some(blocks) = message["content"].as_array() else {
            continue;
        };
        for (b, block) in blocks.iter().enumerate() {
            if block["type"] != "thinking" {
                continue;
            }
            let thinking = block["thinking"].as_str().unwrap_or_default();
            if block["signature"] != sign(request, &messages[..m], thinking) {
                return Err(format!(
                    "messages.{m}.content.{b}: Invalid `signature` in `thinking` block. \
                     The block is bound to a different conversation."
                ));
            }
        }
    }
    Ok(())
}

/// What the mock saw: requests answered and refused.
#[derive(Default)]
struct Seen {
    answered: usize,
    refused: Vec<String>,
    /// Requests that asked for stale blocks to be dropped (and had some).
    dropped: usize,
    /// The last message answered, for a client reading a stream.
    last: Option<Value>,
}

fn signing_upstream(seen: Arc<Mutex<Seen>>) -> Behavior {
    Behavior::AnthropicWith(AnthropicFn(Arc::new(move |request: &Value, beta: bool| {
        let mut seen = seen.lock().unwrap();
        let checked = match prefix_check(request) {
            Err(_) if drops_stale(request, beta) => {
                seen.dropped += 1;
                Ok(())
            }
            other => other,
        };
        if let Err(why) = checked.and_then(|()| open_loop_rule(request)) {
            seen.refused.push(why.clone());
            return Err(
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": why}}),
            );
        }
        seen.answered += 1;
        let n = seen.answered;
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        let thinking = format!("Step {n}: read the next file to see how it fits.");
        let message = json!({
            "id": format!("msg_{n}"), "type": "message", "role": "assistant", "model": "mock",
            "content": [
                {"type": "thinking", "thinking": thinking, "signature": sign(request, &messages, &thinking)},
                {"type": "text", "text": format!("Reading file {n}.")},
                {"type": "tool_use", "id": format!("toolu_{n}"), "name": "read", "input": {"path": format!("src/file_{n}.rs")}},
            ],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 1, "output_tokens": 1},
        });
        seen.last = Some(message.clone());
        Ok(message)
    })))
}

/// A tool result of `n` KB-ish lines, different on every turn.
fn file_contents(turn: usize) -> String {
    (0..(turn % 5 + 1) * 30)
        .map(|line| format!("fn item_{turn}_{line}() {{ /* line {line} of file {turn} */ }}\n"))
        .collect()
}

struct Session {
    statuses: Vec<String>,
    stripped: usize,
    rebased: usize,
    /// Requests forwarded with a summary (`strategy = "summarize"`).
    summaries: usize,
    /// Requests still over budget after compaction.
    budget_missed: usize,
}

/// A 40-turn tool loop through a proxy with `policy`, streamed or not.
async fn run_session(policy: &str, stream: bool) -> (Session, Arc<Mutex<Seen>>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let upstream = MockUpstream::start(signing_upstream(seen.clone())).await;
    let config = format!("[policies.default]\n{policy}\n");
    let proxy = TestProxy::start(&config, &upstream.url()).await;
    let mut history = vec![
        json!({"role": "user", "content": "Read the files one by one and explain the crate."}),
    ];
    let mut session = Session {
        statuses: Vec::new(),
        stripped: 0,
        rebased: 0,
        summaries: 0,
        budget_missed: 0,
    };
    for turn in 0..40 {
        let body = json!({
            "model": "claude-mock-5",
            "max_tokens": 1024,
            "stream": stream,
            "thinking": {"type": "adaptive"},
            "system": [{"type": "text", "text": "You are a coding agent. ".repeat(40)}],
            "tools": [{"name": "read", "description": "Reads a file", "input_schema": {"type": "object"}}],
            "messages": history,
        });
        let answer = send(post_json(&proxy.url("/v1/messages"), body.to_string())).await;
        assert_eq!(
            answer.status,
            200,
            "turn {turn}: {:?}",
            seen.lock().unwrap().refused
        );
        session.statuses.push(
            answer
                .header("x-compaction-status")
                .unwrap_or("")
                .to_owned(),
        );
        session.stripped += answer
            .header("x-compaction-stripped-thinking")
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(0);
        session.rebased += usize::from(answer.header("x-compaction-rebased") == Some("true"));
        session.summaries += usize::from(answer.header("x-compaction-summary-id").is_some());
        session.budget_missed +=
            usize::from(answer.header("x-compaction-budget-met") == Some("false"));
        // A streaming client assembles the message from the events; the
        // mock's own copy is the same message.
        let message = if stream {
            seen.lock().unwrap().last.clone().expect("answered")
        } else {
            answer.json()
        };
        let id = message["content"][2]["id"].clone();
        history.push(json!({"role": "assistant", "content": message["content"]}));
        history.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": file_contents(turn)},
        ]}));
    }
    (session, seen)
}

const CUTS: &str = "budget_chars = 30000\nkeep_last_n = 4\nmax_message_chars = 3000\nmax_tool_result_chars = 1500\nprotect_tool_chars = 4000\nprune_minimum_chars = 1000";

async fn check(mode: &str, stream: bool) {
    let policy = format!("mode = \"{mode}\"\n{CUTS}");
    let (session, seen) = run_session(&policy, stream).await;
    let seen = seen.lock().unwrap();
    assert!(
        seen.refused.is_empty(),
        "{mode}: refused {:?}",
        seen.refused
    );
    assert_eq!(seen.answered, 40);
    let compacted = session
        .statuses
        .iter()
        .filter(|s| s.as_str() == "compacted")
        .count();
    assert!(compacted >= 20, "{mode}: {:?}", session.statuses);
    assert!(session.stripped > 0, "{mode}: no reasoning was ever stale");
    // Every request ends an open tool loop: once its last turn's prefix
    // changed, the API was asked to drop that turn's blocks.
    assert!(
        seen.dropped > 0,
        "{mode}: the API was never asked to drop a block"
    );
    if mode == "stable" {
        assert!(
            session.rebased >= 2,
            "{mode}: {} re-compactions",
            session.rebased
        );
    }
}

#[tokio::test]
async fn exact_mode_never_fails_the_prefix_check() {
    check("exact", false).await;
}

#[tokio::test]
async fn exact_mode_never_fails_the_prefix_check_streaming() {
    check("exact", true).await;
}

#[tokio::test]
async fn stable_mode_never_fails_the_prefix_check() {
    check("stable", false).await;
}

#[tokio::test]
async fn stable_mode_never_fails_the_prefix_check_streaming() {
    check("stable", true).await;
}

/// Exact mode where some turns' protected tail alone is over the budget
/// (the budget is missed), with the passes off: every request still passes
/// the prefix check.
#[tokio::test]
async fn exact_mode_holds_the_prefix_check_when_the_tail_alone_is_over_budget() {
    let policy = "mode = \"exact\"\nbudget_chars = 11000\nkeep_last_n = 4\nmax_message_chars = 100000\nmax_tool_result_chars = 0\nmax_arg_chars = 0\ntool_duplicate_threshold = 0";
    let (session, seen) = run_session(policy, false).await;
    let seen = seen.lock().unwrap();
    assert!(seen.refused.is_empty(), "refused {:?}", seen.refused);
    assert_eq!(seen.answered, 40);
    assert!(
        session.budget_missed > 0,
        "no turn was over budget with nothing removable: {:?}",
        session.statuses
    );
    assert!(session.stripped > 0);
}

#[tokio::test]
async fn without_compaction_the_mock_accepts_the_session_as_it_came() {
    // The mock's check is not what fails: a session that never outgrows
    // its budget passes it with every block kept.
    let (session, seen) = run_session("budget_chars = 100000000", false).await;
    assert!(seen.lock().unwrap().refused.is_empty());
    assert_eq!(session.stripped, 0);
    assert!(session.statuses.iter().all(|s| s == "unchanged"));
}

#[tokio::test]
async fn the_mock_refuses_a_block_whose_prefix_changed() {
    // The check the tests above rely on does refuse a changed prefix.
    let request = json!({"system": "s", "tools": [], "messages": [
        {"role": "user", "content": "a"},
    ]});
    let signature = sign(&request, &request["messages"].as_array().unwrap()[..1], "t");
    let mut later = request.clone();
    later["messages"] = json!([
        {"role": "user", "content": "a, edited"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "t", "signature": signature}]},
    ]);
    assert!(prefix_check(&later).is_err());
    later["messages"][0]["content"] = json!("a");
    assert!(prefix_check(&later).is_ok());
    // Dropping is honoured only with the beta header.
    later["thinking"] =
        json!({"type": "adaptive", "block_binding": {"prefix_mismatch_behavior": "drop_block"}});
    assert!(drops_stale(&later, true) && !drops_stale(&later, false));
    // An open loop whose last turn lost its thinking is refused.
    let open = json!({"messages": [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]},
    ]});
    assert!(open_loop_rule(&open).is_err());
}

/// A summary replaces earlier messages: the turns kept after it lose their
/// reasoning (the open loop's last turn is asked to be dropped), so no
/// request with a summary fails the prefix check either.
async fn check_summaries(mode: &str) {
    use crate::summaries::{MockSummarizer, Mode};
    let summarizer = MockSummarizer::start("chat", Mode::Canned).await;
    let policy = format!(
        "mode = \"{mode}\"\n{CUTS}\nstrategy = \"summarize\"\nsummarizer = \"mock\"\n\
         [summarizers.mock]\nurl = \"{}\"\nformat = \"chat\"\nmodel = \"mini\"\ntimeout_secs = 5\n",
        summarizer.url()
    );
    let (session, seen) = run_session(&policy, false).await;
    let seen = seen.lock().unwrap();
    assert!(
        seen.refused.is_empty(),
        "{mode}: refused {:?}",
        seen.refused
    );
    assert_eq!(seen.answered, 40);
    assert!(
        session.summaries >= 10,
        "{mode}: {} requests with a summary ({:?})",
        session.summaries,
        session.statuses
    );
    assert!(summarizer.calls() > 0);
    assert!(
        seen.dropped > 0,
        "{mode}: the open loop's stale turn was never asked to be dropped"
    );
}

#[tokio::test]
async fn summaries_in_exact_mode_never_fail_the_prefix_check() {
    check_summaries("exact").await;
}

/// A request over its budget from which nothing may go is forwarded whole,
/// but reasoning an earlier, compacted request produced is bound to the
/// prefix that request forwarded: it loses that reasoning (the open loop's
/// last turn: `drop_block`). Here the earlier turn ran under a policy that
/// could drop (as before a reload that raised `keep_last_n`).
#[tokio::test]
async fn a_whole_request_over_budget_drops_reasoning_bound_to_a_compacted_prefix() {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let upstream = MockUpstream::start(signing_upstream(seen.clone())).await;
    let config = "[policies.default]\nmode = \"exact\"\nbudget_chars = 2000\nkeep_last_n = 2\npin_first_user = false\nmax_message_chars = 100000\nmax_tool_result_chars = 0\nmax_arg_chars = 0\ntool_duplicate_threshold = 0\n\n[policies.whole]\nmode = \"exact\"\nbudget_chars = 2000\nkeep_last_n = 50\npin_first_user = false\nmax_message_chars = 100000\nmax_tool_result_chars = 0\nmax_arg_chars = 0\ntool_duplicate_threshold = 0\n\n[tenants.policies]\nwhole = \"whole\"\n";
    let proxy = TestProxy::start(config, &upstream.url()).await;
    let request = |history: &Vec<Value>| {
        json!({
            "model": "claude-mock-5", "max_tokens": 1024, "thinking": {"type": "adaptive"},
            "system": "You are a coding agent.",
            "tools": [{"name": "read", "description": "Reads a file", "input_schema": {"type": "object"}}],
            "messages": history,
        })
        .to_string()
    };
    let mut history = vec![
        json!({"role": "user", "content": format!("Context: {}", "old notes ".repeat(300))}),
        json!({"role": "assistant", "content": "Noted."}),
        json!({"role": "user", "content": "Read the first file."}),
    ];
    // Turn 1 is compacted: the old context goes.
    let answer = send(post_json(&proxy.url("/v1/messages"), request(&history))).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let message = answer.json();
    let id = message["content"][2]["id"].clone();
    history.push(json!({"role": "assistant", "content": message["content"]}));
    history.push(json!({"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": id, "content": "fn main() {}"},
    ]}));
    // Turn 2: over budget, nothing may go under its policy.
    let mut turn = post_json(&proxy.url("/v1/messages"), request(&history));
    turn.headers_mut()
        .insert("x-tenant-id", "whole".parse().unwrap());
    let answer = send(turn).await;
    assert_eq!(
        answer.status,
        200,
        "refused: {:?}",
        seen.lock().unwrap().refused
    );
    assert_eq!(answer.header("x-compaction-budget-met"), Some("false"));
    let seen = seen.lock().unwrap();
    assert!(seen.refused.is_empty(), "{:?}", seen.refused);
    assert_eq!(seen.dropped, 1, "the API was asked to drop the stale block");
}
