//! The agent passes through the real server: what reaches the upstream, the
//! per-pass headers, and triggers.

use serde_json::json;

use crate::support::*;

// Exact mode: the passes alone make this body fit. (Stable mode aims a
// re-compaction below the budget, to leave room for the next turns, and
// drops the old tool group too.)
const AGENT_POLICY: &str = "[policies.default]
mode = \"exact\"
budget_chars = 400
keep_last_n = 1
max_tool_result_chars = 100
protect_tool_chars = 0
prune_minimum_chars = 0
max_arg_chars = 40
";

fn agent_body() -> serde_json::Value {
    let output: String = (0..200).map(|k| format!("line{k} ")).collect();
    let args = json!({"path": "a.rs", "content": "y".repeat(300)}).to_string();
    json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "Task: fix it."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "write_file", "arguments": args}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
        {"role": "user", "content": "Now test it."},
    ]})
}

#[tokio::test]
async fn old_tool_output_is_pruned_and_arguments_clipped_with_headers() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(AGENT_POLICY, &upstream.url()).await;
    let body = agent_body();
    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.to_string(),
    ))
    .await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));

    let sent = upstream.last().json();
    let messages = sent["messages"].as_array().unwrap();
    assert_eq!(
        messages.len(),
        4,
        "pruning and clipping fit: nothing dropped"
    );
    let original = body["messages"][2]["content"].as_str().unwrap();
    let pruned = messages[2]["content"].as_str().unwrap();
    assert_eq!(messages[2]["tool_call_id"], "call_1");
    assert!(
        pruned.starts_with(&original[..50]) && pruned.ends_with(&original[original.len() - 50..])
    );
    let omitted = original.chars().count() - 100;
    assert!((1_000..1_000_000).contains(&omitted));
    let marker = format!(
        "[… {},{:03} chars omitted …]",
        omitted / 1000,
        omitted % 1000
    );
    assert!(pruned.contains(&marker), "{pruned}");
    let args: serde_json::Value = serde_json::from_str(
        messages[1]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args["path"], "a.rs");
    assert!(args["content"]
        .as_str()
        .unwrap()
        .starts_with(&"y".repeat(40)));

    let header = |name| answer.header(name).unwrap().parse::<usize>().unwrap();
    assert_eq!(
        header("x-compaction-pruned-chars"),
        original.chars().count() - pruned.chars().count()
    );
    let clipped_args = messages[1]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    let original_args = body["messages"][1]["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    assert_eq!(
        header("x-compaction-clipped-chars"),
        original_args.chars().count() - clipped_args.chars().count()
    );
    assert_eq!(header("x-compaction-deduped-tool-chars"), 0);
    assert_eq!(header("x-compaction-trimmed-messages"), 0);
    assert_eq!(header("x-compaction-dropped-messages"), 0);
}

#[tokio::test]
async fn below_every_trigger_the_body_goes_as_it_came() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let policy = format!("{AGENT_POLICY}trigger_messages = 5\ntrigger_chars = 100000\n");
    let proxy = TestProxy::start(&policy, &upstream.url()).await;
    let body = agent_body().to_string();
    let answer = send(post_json(&proxy.url("/v1/chat/completions"), body.clone())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("unchanged"));
    // Below every trigger a body is within what its policy allows: never
    // "unchanged" beside a budget miss.
    assert_eq!(answer.header("x-compaction-budget-met"), Some("true"));
    assert_eq!(upstream.last().body, body.as_bytes());

    // One more message reaches the message trigger.
    let mut longer = agent_body();
    longer["messages"]
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "user", "content": "and again"}));
    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        longer.to_string(),
    ))
    .await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
}

fn o200k(text: &str) -> usize {
    tiktoken_rs::o200k_base_singleton()
        .encode_ordinary(text)
        .len()
}

/// The o200k tokens of the message contents the upstream last received.
fn forwarded_tokens(upstream: &MockUpstream) -> usize {
    upstream.last().json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| o200k(m["content"].as_str().unwrap()))
        .sum()
}

#[tokio::test]
async fn a_token_budget_is_met_and_reported() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[policies.default]\nbudget_chars = 200000\nbudget_tokens = 300\nkeep_last_n = 1\npin_first_user = false\n",
        &upstream.url(),
    )
    .await;
    let (body, texts) = long_chat("gpt-4o-mini");
    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.to_string(),
    ))
    .await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let input: usize = texts.iter().map(|t| o200k(t)).sum();
    let header = |name| answer.header(name).unwrap().parse::<usize>().unwrap();
    assert_eq!(header("x-compaction-input-tokens"), input);
    let output = forwarded_tokens(&upstream);
    assert_eq!(header("x-compaction-output-tokens"), output);
    assert!(output <= 300, "{output}");
    assert_eq!(answer.header("x-compaction-budget-met"), Some("true"));
}

/// Twelve long user messages (o200k tokens each, well over 100) for
/// `model`, and their texts.
fn long_chat(model: &str) -> (serde_json::Value, Vec<String>) {
    let texts: Vec<String> = (0..12)
        .map(|k| format!("Message {k}: the payment retry loop needs a bounded budget. ").repeat(8))
        .collect();
    let messages: Vec<serde_json::Value> = texts
        .iter()
        .map(|t| json!({"role": "user", "content": t}))
        .collect();
    (json!({"model": model, "messages": messages}), texts)
}

/// [`long_chat`] asking for `max_output` tokens in `limit_key`.
fn long_chat_limited(
    model: &str,
    limit_key: &str,
    max_output: usize,
) -> (serde_json::Value, Vec<String>) {
    let (mut body, texts) = long_chat(model);
    body[limit_key] = json!(max_output);
    (body, texts)
}

const AUTO_POLICY: &str = "[policies.default]
budget_chars = 200000
budget = \"auto\"
reserve_tokens = 200
keep_last_n = 1
pin_first_user = false
[policies.default.context_windows]
\"test-model\" = 1000
";

#[tokio::test]
async fn an_auto_budget_is_the_window_minus_output_and_reserve() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(AUTO_POLICY, &upstream.url()).await;
    for (limit_key, max_output) in [("max_completion_tokens", 300), ("max_tokens", 500)] {
        let (body, texts) = long_chat_limited("test-model-2", limit_key, max_output);
        let answer = send(post_json(
            &proxy.url("/v1/chat/completions"),
            body.to_string(),
        ))
        .await;
        assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
        let budget = 1000 - max_output - 200;
        let header = |name| answer.header(name).unwrap().parse::<usize>().unwrap();
        assert_eq!(header("x-compaction-budget-tokens"), budget, "{limit_key}");
        let input: usize = texts.iter().map(|t| o200k(t)).sum();
        assert!(input > 1000, "the conversation must be over the window");
        assert_eq!(header("x-compaction-input-tokens"), input);
        let output = forwarded_tokens(&upstream);
        assert_eq!(header("x-compaction-output-tokens"), output);
        assert!(output <= budget, "{output} > {budget}");
        assert!(
            output > budget / 2,
            "{output}: the budget is used, not emptied"
        );
        assert_eq!(answer.header("x-compaction-budget-met"), Some("true"));
        // The derived budget alone applies: the char budget was far away.
        assert!(body.to_string().len() < 200_000);
    }
}

#[tokio::test]
async fn an_auto_budget_for_an_unknown_model_falls_back_to_the_fixed_budgets() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(AUTO_POLICY, &upstream.url()).await;
    let (body, _) = long_chat_limited("mystery-llm", "max_tokens", 10);
    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.to_string(),
    ))
    .await;
    // Under budget_chars and no budget_tokens: forwarded as it came.
    assert_eq!(answer.header("x-compaction-status"), Some("unchanged"));
    assert_eq!(answer.header("x-compaction-budget-tokens"), None);
    assert_eq!(upstream.last().json(), body);
}

#[tokio::test]
async fn anthropic_tool_results_in_one_message_are_pruned_one_by_one() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        // Exact mode cuts the results one by one (stable mode spreads a
        // pruned text as one).
        "[policies.default]\nmode = \"exact\"\nbudget_chars = 3000\nkeep_last_n = 1\nmax_tool_result_chars = 200\nprotect_tool_chars = 0\nprune_minimum_chars = 0\n",
        &upstream.url(),
    )
    .await;
    let output = |tag: &str| -> String { (0..300).map(|k| format!("{tag}{k} ")).collect() };
    let outputs = [output("alpha"), output("beta"), output("gamma")];
    let body = json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": [
        {"role": "user", "content": "Task: read the three files."},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "read_file", "input": {"path": "a"}},
            {"type": "tool_use", "id": "toolu_2", "name": "read_file", "input": {"path": "b"}},
            {"type": "tool_use", "id": "toolu_3", "name": "read_file", "input": {"path": "c"}}
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": outputs[0]},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": [{"type": "text", "text": outputs[1]}]},
            {"type": "tool_result", "tool_use_id": "toolu_3", "content": outputs[2]}
        ]},
        {"role": "assistant", "content": "Read them."},
        {"role": "user", "content": "Now summarise."}
    ]});
    let answer = send(post_json(&proxy.url("/v1/messages"), body.to_string())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let sent = upstream.last().json();
    let results = sent["messages"][2]["content"].as_array().unwrap();
    assert_eq!(results.len(), 3, "{sent:#}");
    for (k, (result, original)) in results.iter().zip(&outputs).enumerate() {
        assert_eq!(result["tool_use_id"], format!("toolu_{}", k + 1));
        let text = match &result["content"] {
            serde_json::Value::String(s) => s.clone(),
            blocks => blocks[0]["text"].as_str().unwrap().to_owned(),
        };
        // Its own head and tail around a marker: nothing of another result.
        assert!(text.starts_with(&original[..50]), "{k}: {text}");
        assert!(
            text.ends_with(&original[original.len() - 50..]),
            "{k}: {text}"
        );
        assert!(text.contains("chars omitted"), "{k}: {text}");
        assert!(text.chars().count() < 300, "{k}: {text}");
    }
    let pruned = outputs.iter().map(|o| o.chars().count()).sum::<usize>()
        - results
            .iter()
            .map(|r| match &r["content"] {
                serde_json::Value::String(s) => s.chars().count(),
                blocks => blocks[0]["text"].as_str().unwrap().chars().count(),
            })
            .sum::<usize>();
    assert_eq!(
        answer.header("x-compaction-pruned-chars"),
        Some(pruned.to_string().as_str())
    );
}
