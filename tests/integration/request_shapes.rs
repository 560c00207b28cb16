//! Today's request shapes through the real server: coding agents' own
//! compaction requests and the providers' compaction go upstream byte for
//! byte with their status; Claude Code's current conversations (system
//! entries inside `messages`, unknown fields, unknown blocks) are compacted,
//! not skipped; and a body that cannot be read names the message and why.
//!
//! The bodies are hand-made in the shape the clients send (the prompts'
//! opening words as they are; the rest shortened).

use serde_json::{json, Value};

use crate::support::*;

const SMALL: &str = "[policies.default]
budget_chars = 2000
keep_last_n = 2
";

fn long(word: &str, n: usize) -> String {
    format!("{word} ").repeat(n)
}

/// Claude Code's summary request: a normal Messages request (model,
/// system, tools, thinking) whose last user message ends in the summary
/// prompt.
fn claude_code_summary_request() -> Value {
    json!({
        "model": "claude-sonnet-4-5", "max_tokens": 20000, "stream": true,
        "system": [{"type": "text", "text": "You are Claude Code, Anthropic's official CLI for Claude."}],
        "tools": [{"name": "Read", "description": "Reads a file", "input_schema": {"type": "object"}}],
        "thinking": {"type": "adaptive"},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix the failing test in src/parser.rs"}]},
            {"role": "assistant", "content": [{"type": "text", "text": long("Looking at the parser first.", 100)}]},
            {"role": "user", "content": [{"type": "text", "text": long("Go on, read it.", 100)}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "src/parser.rs"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": long("fn parse() {}", 400)},
                {"type": "text", "text": "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n- Do NOT use Read, Bash, Grep, Glob, Edit, Write, or ANY other tool.\n\nYour task is to create a detailed summary of the conversation so far, paying close attention to the user's explicit requests and your previous actions."}
            ]}
        ]
    })
}

fn codex_checkpoint_request() -> Value {
    json!({
        "model": "gpt-5-codex", "instructions": "You are Codex, a coding agent.", "tools": [],
        "metadata": {"request_kind": "compaction"}, "stream": true, "store": false,
        "input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix the failing test"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": long("Looking at the parser first.", 100)}]},
            {"type": "function_call", "call_id": "call_1", "name": "shell", "arguments": "{\"command\":[\"cat\",\"src/parser.rs\"]}"},
            {"type": "function_call_output", "call_id": "call_1", "output": long("fn parse() {}", 400)},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will resume the task."}]}
        ]
    })
}

fn opencode_summary_request() -> Value {
    json!({
        "model": "gpt-4.1", "stream": true,
        "messages": [
            {"role": "system", "content": "You are a context summarization agent. You are given a conversation between a user and an agent. Your goal is to produce a structured summary matching the format specified so another coding agent can continue the work."},
            {"role": "user", "content": format!("Here is the conversation so far:\n<conversation>\n{}\n</conversation>", long("user: fix the test. assistant: reading src/parser.rs.", 100))}
        ]
    })
}

/// Sends `body` to `path` through a proxy on `toml` and returns the
/// status header and what the upstream received.
async fn through(toml: &str, path: &str, body: &Value) -> (Option<String>, bytes::Bytes) {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(toml, &upstream.url()).await;
    let answer = send(post_json(&proxy.url(path), body.to_string())).await;
    assert_eq!(answer.status, 200);
    (
        answer.header("x-compaction-status").map(str::to_owned),
        upstream.last().body.clone(),
    )
}

#[tokio::test]
async fn each_agents_own_compaction_request_goes_upstream_untouched() {
    for (path, body) in [
        ("/v1/messages", claude_code_summary_request()),
        ("/v1/responses", codex_checkpoint_request()),
        ("/v1/chat/completions", opencode_summary_request()),
    ] {
        let sent = body.to_string();
        let (status, received) = through(SMALL, path, &body).await;
        assert_eq!(
            status.as_deref(),
            Some("skipped; agent-compaction"),
            "{path}"
        );
        assert_eq!(received, sent.as_bytes(), "{path}: byte for byte");
    }
}

#[tokio::test]
async fn with_detection_off_an_agents_compaction_request_is_compacted() {
    let toml = "[policies.default]
budget_chars = 2000
keep_last_n = 1
detect_agent_compaction = false
";
    for (path, body, expected) in [
        ("/v1/messages", claude_code_summary_request(), "compacted"),
        ("/v1/responses", codex_checkpoint_request(), "compacted"),
        // Its two messages are a kept role and the latest: nothing to cut,
        // over the budget.
        (
            "/v1/chat/completions",
            opencode_summary_request(),
            "skipped; nothing-removable",
        ),
    ] {
        let (status, received) = through(toml, path, &body).await;
        assert_eq!(status.as_deref(), Some(expected), "{path}");
        if expected == "compacted" {
            assert!(received.len() < body.to_string().len(), "{path}");
        }
    }
}

#[tokio::test]
async fn the_providers_compaction_requests_go_upstream_untouched() {
    // OpenAI's compact endpoint: the shipped routes match it, so the
    // answer says why nothing was done.
    let compact = json!({"model": "gpt-5", "input": [
        {"role": "user", "content": long("old", 1000)},
        {"role": "user", "content": "latest"}
    ]});
    let (status, received) = through(SMALL, "/v1/responses/compact", &compact).await;
    assert_eq!(status.as_deref(), Some("skipped; provider-compaction"));
    assert_eq!(received, compact.to_string().as_bytes());
    // Codex with OpenAI as provider: the input ends in a trigger.
    let mut trigger = codex_checkpoint_request();
    let input = trigger["input"].as_array_mut().unwrap();
    input.pop();
    input.push(json!({"type": "compaction_trigger"}));
    let (status, received) = through(SMALL, "/v1/responses", &trigger).await;
    assert_eq!(status.as_deref(), Some("skipped; provider-compaction"));
    assert_eq!(received, trigger.to_string().as_bytes());
    // Anthropic's compaction on demand: the top-level field.
    let mut on_demand = claude_code_summary_request();
    on_demand["messages"][2]["content"]
        .as_array_mut()
        .unwrap()
        .pop();
    on_demand["compaction"] = json!({"type": "summarize"});
    let (status, received) = through(SMALL, "/v1/messages", &on_demand).await;
    assert_eq!(status.as_deref(), Some("skipped; provider-compaction"));
    assert_eq!(received, on_demand.to_string().as_bytes());
}

#[tokio::test]
async fn responses_compaction_items_pass_byte_for_byte_and_the_loss_counts_after_them() {
    let compaction = r#"{"type":"compaction","id":"cmp_1","encrypted_content":"gAAAAABpZ2VuZXJhdGVkLWJ5LXRoZS1wcm92aWRlcg=="}"#;
    let old = long("old", 300);
    let body = format!(
        r#"{{"model":"gpt-5","input":[{{"role":"user","content":"{old}"}},{{"role":"assistant","content":"{old}"}},{compaction},{{"role":"user","content":"{old}"}},{{"role":"assistant","content":"{old}"}},{{"role":"user","content":"{old}"}},{{"role":"assistant","content":"ok"}},{{"role":"user","content":"latest"}}]}}"#
    );
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(SMALL, &upstream.url()).await;
    let answer = send(post_json(&proxy.url("/v1/responses"), body.clone())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let received = String::from_utf8(upstream.last().body.to_vec()).unwrap();
    // Everything up to and including the compaction item, as it came.
    let head = &body[..body.find(compaction).unwrap() + compaction.len()];
    assert!(received.starts_with(head), "{received}");
    // The two items before it count nothing.
    let counted = compaction.len() + 3 * old.chars().count() + "ok".len() + "latest".len();
    assert_eq!(
        answer.header("x-compaction-input-chars"),
        Some(counted.to_string().as_str())
    );
}

#[tokio::test]
async fn claude_codes_current_conversation_is_compacted_and_stays_valid() {
    let reminder = "<system-reminder>The user opened src/parser.rs</system-reminder>";
    let body = json!({
        "model": "claude-opus-4-8", "max_tokens": 32000,
        "thinking": {"type": "adaptive"}, "output_config": {"effort": "high"},
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Fix the failing test"}]},
            {"role": "system", "content": [{"type": "text", "text": reminder}]},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": long("line", 800)}]},
            {"role": "system", "content": "Keep going.", "output_config": {"effort": "low"}},
            {"role": "assistant", "content": [
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "rust"}},
                {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
                {"type": "text", "text": long("found", 50)}]},
            {"role": "user", "content": long("more", 300)},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "now run the tests"}
        ]
    });
    let (status, received) = through(SMALL, "/v1/messages", &body).await;
    assert_eq!(status.as_deref(), Some("compacted"));
    let sent: Value = serde_json::from_slice(&received).unwrap();
    for field in ["thinking", "output_config", "context_management"] {
        assert_eq!(sent[field], body[field], "{field}");
    }
    let messages = sent["messages"].as_array().unwrap();
    // Both system entries and the unknown blocks' message, whole.
    for k in [1, 4, 5] {
        assert!(
            messages.contains(&body["messages"][k]),
            "message {k}: {sent}"
        );
    }
    // A run of system entries follows a user turn and precedes an
    // assistant turn or ends the list.
    let role = |k: usize| messages[k]["role"].as_str().unwrap();
    for k in (0..messages.len()).filter(|&k| role(k) == "system") {
        let before = (0..k).rev().find(|&j| role(j) != "system");
        let after = (k + 1..messages.len()).find(|&j| role(j) != "system");
        assert!(before.is_some_and(|j| role(j) == "user"), "{sent}");
        assert!(after.map_or(true, |j| role(j) == "assistant"), "{sent}");
    }
    assert_eq!(messages[0]["role"], "user");
}

#[tokio::test]
async fn a_body_that_cannot_be_read_names_the_message_and_why() {
    let body = json!({"model": "claude-sonnet-4-5", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": 42}
    ]});
    let (status, received) = through(SMALL, "/v1/messages", &body).await;
    assert_eq!(
        status.as_deref(),
        Some("skipped; unsupported-message; message 2: content is not a string or array")
    );
    assert_eq!(received, body.to_string().as_bytes());
}
