//! Property test over all three formats: no trim or prune leaves an empty
//! text block or an empty tool result, which the APIs refuse ("text content
//! blocks must contain non-whitespace text"). Random agent conversations
//! (several tool results in one message, string and block content, long
//! results older than `keep_last_n`) go through the whole pipeline under
//! random policies: exact and stable, with and without the agent passes,
//! at budgets that force trims, prunes and drops.

use compaction_proxy::compaction::agent::AgentPolicy;
use compaction_proxy::compaction::stable::NoCheckpoints;
use compaction_proxy::config::Mode;
use compaction_proxy::engine::{Policy, Role};
use compaction_proxy::format::Format;
use compaction_proxy::policy::CompiledPolicy;
use compaction_proxy::proxy::compact::outcome_of;
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};

pub(crate) fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(192);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Words, no sentence ends: a trim cuts where the limit falls.
pub(crate) fn words(seed: usize, chars: usize) -> String {
    const WORDS: [&str; 8] = ["fn", "main", "error", "retry", "ok", "ünï", "test", "line"];
    let mut out = format!("[{seed}] ");
    let mut k = seed;
    while out.chars().count() < chars {
        k = k
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        out.push_str(WORDS[(k >> 33) % WORDS.len()]);
        out.push(' ');
    }
    out
}

/// One tool round: the sizes of its parallel results, and whether they
/// are blocks (else strings).
#[derive(Debug, Clone)]
pub(crate) struct Round {
    pub(crate) results: Vec<usize>,
    pub(crate) blocks: bool,
}

pub(crate) fn rounds() -> impl Strategy<Value = Vec<Round>> {
    vec(
        (vec(1usize..900, 1..4), any::<bool>())
            .prop_map(|(results, blocks)| Round { results, blocks }),
        1..6,
    )
}

pub(crate) fn anthropic(rounds: &[Round]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": words(0, 40)})];
    let mut n = 0;
    for r in rounds {
        let ids: Vec<String> = r
            .results
            .iter()
            .map(|_| {
                n += 1;
                format!("toolu_{n}")
            })
            .collect();
        messages.push(json!({"role": "assistant", "content": ids.iter().map(|id| json!(
            {"type": "tool_use", "id": id, "name": "read", "input": {"path": id}})).collect::<Vec<_>>()}));
        messages.push(json!({"role": "user", "content": ids.iter().zip(&r.results).map(|(id, &len)| {
            let text = words(n + len, len);
            let content = if r.blocks { json!([{"type": "text", "text": text}]) } else { json!(text) };
            json!({"type": "tool_result", "tool_use_id": id, "content": content})
        }).collect::<Vec<_>>()}));
    }
    messages.push(json!({"role": "assistant", "content": words(1, 300)}));
    messages.push(json!({"role": "user", "content": [
        {"type": "text", "text": words(2, 300)}, {"type": "text", "text": words(3, 300)}]}));
    json!({"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": messages})
}

pub(crate) fn chat(rounds: &[Round]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": words(0, 40)})];
    let mut n = 0;
    for r in rounds {
        let ids: Vec<String> = r
            .results
            .iter()
            .map(|_| {
                n += 1;
                format!("call_{n}")
            })
            .collect();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": ids.iter().map(|id| json!(
            {"id": id, "type": "function", "function": {"name": "read", "arguments": "{}"}})).collect::<Vec<_>>()}));
        for (id, &len) in ids.iter().zip(&r.results) {
            let text = words(n + len, len);
            let content = if r.blocks {
                json!([{"type": "text", "text": text}, {"type": "text", "text": words(len, 50)}])
            } else {
                json!(text)
            };
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
        }
    }
    messages.push(json!({"role": "assistant", "content": words(1, 300)}));
    messages.push(json!({"role": "user", "content": [
        {"type": "text", "text": words(2, 300)}, {"type": "text", "text": words(3, 300)}]}));
    json!({"model": "gpt-4o", "messages": messages})
}

pub(crate) fn responses(rounds: &[Round]) -> Value {
    let mut input = vec![json!({"role": "user", "content": words(0, 40)})];
    let mut n = 0;
    for r in rounds {
        let ids: Vec<String> = r
            .results
            .iter()
            .map(|_| {
                n += 1;
                format!("call_{n}")
            })
            .collect();
        for id in &ids {
            input.push(
                json!({"type": "function_call", "call_id": id, "name": "read", "arguments": "{}"}),
            );
        }
        for (id, &len) in ids.iter().zip(&r.results) {
            let text = words(n + len, len);
            let output = if r.blocks {
                json!([{"type": "input_text", "text": text}, {"type": "input_text", "text": words(len, 50)}])
            } else {
                json!(text)
            };
            input.push(json!({"type": "function_call_output", "call_id": id, "output": output}));
        }
    }
    input.push(json!({"type": "message", "role": "assistant", "content": [
        {"type": "output_text", "text": words(1, 300)}]}));
    input.push(json!({"role": "user", "content": [
        {"type": "input_text", "text": words(2, 300)}, {"type": "input_text", "text": words(3, 300)}]}));
    json!({"model": "gpt-5", "input": input})
}

/// Every text the forwarded body holds where the API refuses it empty: a
/// text block or part, a string content, a tool result (an empty array is
/// one too); `Err` names the first empty one.
pub(crate) fn no_empty(format: Format, body: &Value) -> Result<(), String> {
    let empty = |v: &Value| match v {
        Value::String(s) => s.trim().is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    };
    let list = match format {
        Format::Responses => &body["input"],
        _ => &body["messages"],
    };
    for (k, m) in list.as_array().ok_or("no list")?.iter().enumerate() {
        let content = if m["type"] == "function_call_output" {
            &m["output"]
        } else {
            &m["content"]
        };
        if content.is_null() {
            continue;
        }
        if empty(content) {
            return Err(format!("item {k}: empty content {content}"));
        }
        for part in content.as_array().into_iter().flatten() {
            if part.get("text").is_some_and(empty) {
                return Err(format!("item {k}: empty text part {part}"));
            }
            if part["type"] == "tool_result" {
                let inner = &part["content"];
                if empty(inner) {
                    return Err(format!("item {k}: empty tool result {part}"));
                }
                for block in inner.as_array().into_iter().flatten() {
                    if block.get("text").is_some_and(empty) {
                        return Err(format!(
                            "item {k}: empty text block in a tool result {part}"
                        ));
                    }
                }
            }
        }
    }
    Ok(())
}

#[derive(Debug, Clone)]
pub(crate) struct Spec {
    pub(crate) budget: usize,
    pub(crate) keep_last_n: usize,
    pub(crate) max_message_chars: usize,
    pub(crate) passes: bool,
    pub(crate) stable: bool,
}

pub(crate) fn specs() -> impl Strategy<Value = Spec> {
    (
        0usize..3000,
        0usize..4,
        1usize..400,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(budget, keep_last_n, max_message_chars, passes, stable)| Spec {
                budget,
                keep_last_n,
                max_message_chars,
                passes,
                stable,
            },
        )
}

impl Spec {
    pub(crate) fn compile(&self) -> CompiledPolicy {
        let mut engine = Policy::with_budget(self.budget);
        engine.keep_last_n = self.keep_last_n;
        engine.max_message_chars = self.max_message_chars;
        engine.keep_roles = vec![Role::System, Role::Developer];
        let mut policy = CompiledPolicy::plain("leftovers", engine);
        policy.pin_first_user = true;
        if self.passes {
            policy.agent = AgentPolicy {
                max_tool_result_chars: 60,
                protect_tool_chars: 0,
                prune_minimum_chars: 0,
                tool_duplicate_threshold: 0.9,
                ..AgentPolicy::DEFAULT
            };
        }
        if self.stable {
            policy.mode = Mode::Stable;
        }
        policy
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn no_trim_or_prune_leaves_an_empty_text_block_or_tool_result(
        rounds in rounds(),
        spec in specs(),
        which in 0usize..3,
    ) {
        let format = Format::ALL[which];
        let body = match format {
            Format::Anthropic => anthropic(&rounds),
            Format::Chat => chat(&rounds),
            Format::Responses => responses(&rounds),
        };
        let bytes = serde_json::to_vec(&body).unwrap();
        let outcome = outcome_of(&bytes, &spec.compile(), format, 100_000, &NoCheckpoints)
            .map_err(|skip| TestCaseError::fail(format!("skipped: {skip}")))?;
        let sent = outcome.rewritten.as_deref().unwrap_or(&bytes);
        let forwarded: Value = serde_json::from_slice(sent).unwrap();
        no_empty(format, &forwarded)
            .map_err(|why| TestCaseError::fail(format!("{format}: {why}\n{forwarded}")))?;
        // What the report counts is what goes, markers included.
        let reparsed = format.parse(sent, 100_000).unwrap();
        prop_assert_eq!(reparsed.total_chars(), outcome.loss.output_chars);
    }
}

/// The sweep's case, by hand: an Anthropic user message with two
/// tool_result blocks each holding one long text part, older than
/// `keep_last_n` and over budget, in exact and stable mode, with and
/// without the passes.
#[test]
fn two_long_results_in_one_message_keep_both_non_empty() {
    let round = |blocks| Round {
        results: vec![800, 800],
        blocks,
    };
    for blocks in [true, false] {
        for passes in [false, true] {
            for stable in [false, true] {
                let spec = Spec {
                    budget: 1600,
                    keep_last_n: 2,
                    max_message_chars: 500,
                    passes,
                    stable,
                };
                let body = serde_json::to_vec(&anthropic(&[round(blocks)])).unwrap();
                let outcome = outcome_of(
                    &body,
                    &spec.compile(),
                    Format::Anthropic,
                    1000,
                    &NoCheckpoints,
                )
                .unwrap();
                let forwarded: Value =
                    serde_json::from_slice(outcome.rewritten.as_deref().expect("compacted"))
                        .unwrap();
                no_empty(Format::Anthropic, &forwarded)
                    .unwrap_or_else(|why| panic!("{spec:?} blocks={blocks}: {why}\n{forwarded}"));
            }
        }
    }
}
