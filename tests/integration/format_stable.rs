//! Stable mode through the proxy on the Anthropic Messages and OpenAI
//! Responses formats: a conversation grows turn by turn, and each turn's
//! forwarded array begins with the previous turn's forwarded array, byte
//! for byte, unless the proxy says this turn rebased
//! (`x-compaction-rebased: true`). Every forwarded body passes the API's
//! checker.

use serde_json::json;

use crate::format_rules::{check_anthropic, check_responses, Verdict};
use crate::support::*;

const POLICY: &str =
    "[policies.default]\nbudget_chars = 3000\nkeep_last_n = 2\nmode = \"stable\"\n";

fn words(tag: &str, n: usize) -> String {
    format!("[{tag}] ") + &"the retry loop now backs off. ".repeat(n)
}

/// A Messages conversation of `turns` rounds of tool use, as the bodies an
/// agent sends: one request after each user turn (a tool result or a
/// question), each holding the whole conversation so far.
fn anthropic_requests(turns: usize) -> Vec<Vec<u8>> {
    let mut messages = vec![json!({"role": "user", "content": [
        {"type": "text", "text": words("task", 3), "cache_control": {"type": "ephemeral"}}
    ]})];
    let mut requests = Vec::new();
    let mut send = |messages: &[serde_json::Value]| {
        let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 512,
            "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
            "messages": messages});
        requests.push(serde_json::to_vec(&body).unwrap());
    };
    send(&messages);
    for t in 0..turns {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": format!("step {t}"), "signature": format!("sig-{t}")},
            {"type": "text", "text": words(&format!("plan{t}"), 4)},
            {"type": "tool_use", "id": format!("toolu_{t}"), "name": "read", "input": {"turn": t}}
        ]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": format!("toolu_{t}"), "content": words(&format!("out{t}"), 12)}
        ]}));
        send(&messages);
        messages.push(json!({"role": "assistant", "content": words(&format!("note{t}"), 2)}));
        messages.push(json!({"role": "user", "content": words(&format!("ask{t}"), 1)}));
        send(&messages);
    }
    requests
}

/// The same as Responses requests; each tool-calling model turn is a
/// reasoning item, a preamble message and the call, as GPT-5 answers.
fn responses_requests(turns: usize) -> Vec<Vec<u8>> {
    let mut input = vec![json!({"role": "user", "content": words("task", 3)})];
    let mut requests = Vec::new();
    let mut send = |input: &[serde_json::Value]| {
        let body =
            json!({"model": "gpt-5", "instructions": "Be brief.", "store": false, "input": input});
        requests.push(serde_json::to_vec(&body).unwrap());
    };
    send(&input);
    for t in 0..turns {
        input.push(json!({"type": "reasoning", "id": format!("rs_{t}"), "summary": [{"type": "summary_text", "text": format!("step {t}")}]}));
        // One model turn: reasoning, a preamble message, then the call.
        input.push(json!({"type": "message", "role": "assistant", "id": format!("pre_{t}"), "content": [{"type": "output_text", "text": words(&format!("pre{t}"), 3)}]}));
        input.push(json!({"type": "function_call", "id": format!("fc_{t}"), "call_id": format!("call_{t}"), "name": "read", "arguments": format!("{{\"turn\":{t}}}")}));
        input.push(json!({"type": "function_call_output", "call_id": format!("call_{t}"), "output": words(&format!("out{t}"), 12)}));
        send(&input);
        input.push(json!({"type": "message", "role": "assistant", "id": format!("msg_{t}"), "content": [{"type": "output_text", "text": words(&format!("note{t}"), 2)}]}));
        input.push(json!({"role": "user", "content": words(&format!("ask{t}"), 1)}));
        send(&input);
    }
    requests
}

/// The raw bytes of each element of the body's `key` array.
fn raw_items(body: &[u8], key: &str) -> Vec<String> {
    let top: std::collections::HashMap<String, &serde_json::value::RawValue> =
        serde_json::from_slice(body).unwrap();
    let items: Vec<&serde_json::value::RawValue> = serde_json::from_str(top[key].get()).unwrap();
    items.into_iter().map(|i| i.get().to_owned()).collect()
}

/// Sends the requests through the proxy in turn; each forwarded array
/// extends the previous one unless the turn rebased, and most turns do not
/// rebase.
async fn turns_extend_each_other(
    path: &str,
    behavior: Behavior,
    key: &str,
    requests: Vec<Vec<u8>>,
    rules: fn(&[u8], &[u8]) -> Verdict,
) {
    let upstream = MockUpstream::start(behavior).await;
    let proxy = TestProxy::start(POLICY, &upstream.url()).await;
    let mut previous: Option<Vec<String>> = None;
    let (mut extended, mut compacted) = (0, 0);
    let mut previous_compacted = false;
    for (turn, body) in requests.into_iter().enumerate() {
        let answer = send(post_json(&proxy.url(path), body.clone())).await;
        assert_eq!(answer.status, 200);
        let forwarded = upstream.last().body;
        rules(&body, &forwarded).unwrap_or_else(|why| panic!("turn {turn}: {why}"));
        let status = answer
            .header("x-compaction-status")
            .unwrap_or("")
            .to_owned();
        compacted += usize::from(status == "compacted");
        let items = raw_items(&forwarded, key);
        let rebased = answer.header("x-compaction-rebased") == Some("true");
        if let (Some(previous), false) = (&previous, rebased) {
            let short = |items: &[String]| -> Vec<String> {
                items.iter().map(|i| i.chars().take(90).collect()).collect()
            };
            assert!(
                items.len() >= previous.len() && items[..previous.len()] == previous[..],
                "turn {turn} ({status}) does not extend turn {}'s forwarded array:\n{:#?}\n{:#?}",
                turn - 1,
                short(previous),
                short(&items)
            );
            let stable: usize = answer
                .header("x-compaction-stable-messages")
                .and_then(|v| v.parse().ok())
                .expect("stable mode reports its stable messages");
            assert_eq!(
                stable,
                previous.len(),
                "turn {turn} ({status}): the previous turn's forwarded items are the stable ones"
            );
            // Counted when both turns were compacted: the case that matters.
            extended += usize::from(status == "compacted" && previous_compacted);
        }
        previous_compacted = status == "compacted";
        previous = Some(items);
    }
    assert!(compacted >= 8, "only {compacted} turns were compacted");
    assert!(
        extended >= 5,
        "only {extended} compacted turns extended the previous compacted one"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stable_anthropic_turns_extend_the_previous_forwarded_messages() {
    turns_extend_each_other(
        "/v1/messages",
        Behavior::AnthropicMessages,
        "messages",
        anthropic_requests(12),
        check_anthropic,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stable_responses_turns_extend_the_previous_forwarded_input() {
    turns_extend_each_other(
        "/v1/responses",
        Behavior::OpenAiResponses,
        "input",
        responses_requests(12),
        check_responses,
    )
    .await;
}
