//! Property tests of the Anthropic Messages and OpenAI Responses formats:
//! random conversations (parallel tool use, thinking blocks with
//! signatures, images and documents, `cache_control` on varied blocks,
//! results without content, a prefilled answer; reasoning items,
//! function calls with their outputs, item references) compacted under
//! random policies, exact and stable. Each forwarded body must pass the
//! API's checker ([`crate::format_rules`]), keep everything outside the
//! compacted array byte for byte, report the chars it forwards, and meet
//! the budget whenever the protected part fits in it.
//!
//! A conversation is a list of turn specs (an assistant turn and the user
//! turn that follows it); each spec's numbers choose the turn's shape, so
//! proptest shrinks a failure to the fewest, plainest turns.

use compaction_proxy::compaction::stable::NoCheckpoints;
use compaction_proxy::config::Mode;
use compaction_proxy::engine::{Policy, Role};
use compaction_proxy::format::{Conversation, Format};
use compaction_proxy::policy::CompiledPolicy;
use compaction_proxy::proxy::compact::outcome_of;
use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};

use crate::format_rules::{check_anthropic, check_responses, Verdict};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 160,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// One assistant turn and the user turn after it.
#[derive(Debug, Clone)]
struct Turn {
    /// Chars of the turn's texts.
    len: u16,
    /// Parallel tool calls (0: a plain answer).
    calls: u8,
    /// Bits choosing the turn's shape (see the builders).
    flags: u32,
}

fn turns() -> impl Strategy<Value = Vec<Turn>> {
    vec(
        (
            0u16..700,
            prop_oneof![3 => Just(0u8), 2 => 1u8..4],
            any::<u32>(),
        )
            .prop_map(|(len, calls, flags)| Turn { len, calls, flags }),
        1..10,
    )
}

/// A policy to compact with, and its description for failure messages.
#[derive(Debug, Clone)]
struct PolicySpec {
    budget: usize,
    keep_last_n: usize,
    max_message_chars: usize,
    pin_first_user: bool,
    stable: bool,
}

fn policies() -> impl Strategy<Value = PolicySpec> {
    (
        0usize..5000,
        0usize..4,
        50usize..400,
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(budget, keep_last_n, max_message_chars, pin_first_user, stable)| PolicySpec {
                budget,
                keep_last_n,
                max_message_chars,
                pin_first_user,
                stable,
            },
        )
}

impl PolicySpec {
    fn compile(&self) -> CompiledPolicy {
        let mut engine = Policy::with_budget(self.budget);
        engine.keep_last_n = self.keep_last_n;
        engine.max_message_chars = self.max_message_chars;
        engine.keep_roles = vec![Role::System, Role::Developer];
        let mut policy = CompiledPolicy::plain("prop", engine);
        policy.pin_first_user = self.pin_first_user;
        if self.stable {
            policy.mode = Mode::Stable;
        }
        policy
    }
}

/// Tagged text of about `len` chars, in sentences (so trims cut at their
/// ends sometimes), its words chosen by `seed`.
fn text(tag: usize, len: usize, seed: u32) -> String {
    const WORDS: [&str; 12] = [
        "retry", "payment", "the", "tests", "fail", "again", "because", "of", "a", "timeout",
        "häufig", "ok",
    ];
    let mut out = format!("[t{tag}] ");
    let mut state = seed | 1;
    while out.chars().count() < len {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        out.push_str(WORDS[state as usize % WORDS.len()]);
        out.push_str(if state % 7 == 0 { ". " } else { " " });
    }
    out
}

fn bit(flags: u32, n: u32) -> bool {
    flags >> n & 1 == 1
}

/// Counters so every id, tag and signature in a body is unique.
#[derive(Default)]
struct Ids(usize);

impl Ids {
    fn next(&mut self) -> usize {
        self.0 += 1;
        self.0
    }
}

/// Marks `block` with `cache_control` when bit `n` of `flags` is set.
fn maybe_cache(mut block: Value, flags: u32, n: u32) -> Value {
    if bit(flags, n) {
        block["cache_control"] = json!({"type": "ephemeral"});
    }
    block
}

// ------------------------------------------------------------- anthropic

fn anthropic_body(first: &Turn, turns: &[Turn], top: u32) -> Vec<u8> {
    let mut ids = Ids::default();
    let mut messages =
        vec![json!({"role": "user", "content": text(ids.next(), first.len as usize, first.flags)})];
    for t in turns {
        let (len, f) = (t.len as usize, t.flags);
        let mut assistant = Vec::new();
        if bit(f, 0) {
            let n = ids.next();
            assistant.push(json!({"type": "thinking", "thinking": text(n, len / 3, f), "signature": format!("sig{n}")}));
        }
        if bit(f, 1) {
            assistant.push(
                json!({"type": "redacted_thinking", "data": format!("redacted{}", ids.next())}),
            );
        }
        if t.calls == 0 || bit(f, 2) {
            assistant.push(maybe_cache(
                json!({"type": "text", "text": text(ids.next(), len, f >> 3)}),
                f,
                8,
            ));
        }
        let mut calls = Vec::new();
        for c in 0..t.calls {
            let id = format!("toolu_{}", ids.next());
            assistant.push(maybe_cache(
                json!({"type": "tool_use", "id": id, "name": "read", "input": {"path": format!("src/{c}.rs")}}),
                f,
                9 + u32::from(c),
            ));
            calls.push(id);
        }
        let plain = t.calls == 0 && !bit(f, 0) && !bit(f, 1) && bit(f, 3) && !bit(f, 8);
        messages.push(json!({"role": "assistant", "content": if plain {
            assistant[0]["text"].clone()
        } else {
            Value::Array(assistant)
        }}));

        let mut user = Vec::new();
        if bit(f, 4) {
            calls.reverse();
        }
        for (c, id) in calls.iter().enumerate() {
            let body = text(ids.next(), len / 2, f >> 5);
            let content = if bit(f, 21) && c == 0 {
                Value::Null // a result with no content: the call's effect was enough
            } else if bit(f, 5) {
                let mut parts = vec![maybe_cache(json!({"type": "text", "text": body}), f, 12)];
                if bit(f, 6) {
                    parts.push(json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}));
                }
                Value::Array(parts)
            } else {
                Value::String(body)
            };
            let mut result = json!({"type": "tool_result", "tool_use_id": id, "is_error": c == 1});
            if !content.is_null() {
                result["content"] = content;
            }
            user.push(maybe_cache(result, f, 13 + c as u32));
        }
        if calls.is_empty() || bit(f, 7) {
            if bit(f, 16) {
                user.push(maybe_cache(
                    json!({"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}),
                    f,
                    17,
                ));
            }
            user.push(maybe_cache(
                json!({"type": "text", "text": text(ids.next(), len / 2 + 10, f >> 7)}),
                f,
                18,
            ));
            if bit(f, 19) {
                user.push(json!({"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}}));
            }
        }
        let plain = calls.is_empty() && user.len() == 1 && bit(f, 20) && !bit(f, 18);
        messages.push(json!({"role": "user", "content": if plain {
            user[0]["text"].clone()
        } else {
            Value::Array(user)
        }}));
    }
    if bit(top, 4) {
        // A prefill: the answer's opening, which the model continues.
        messages.push(json!({"role": "assistant", "content": format!("[t{}] Sure,", ids.next())}));
    }
    let mut body = json!({
        "model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": messages,
        "tools": [{"name": "read", "description": "reads a file", "input_schema": {"type": "object"}}],
        "metadata": {"user_id": "u-1"},
    });
    match top % 3 {
        0 => {}
        1 => body["system"] = json!("You are a coding agent. Keep fixes minimal."),
        _ => {
            body["system"] = json!([
                {"type": "text", "text": "You are a coding agent."},
                {"type": "text", "text": "Keep fixes minimal.", "cache_control": {"type": "ephemeral"}}
            ])
        }
    }
    if bit(top, 2) {
        body["thinking"] = json!({"type": "enabled", "budget_tokens": 2048});
    }
    if bit(top, 3) {
        serde_json::to_vec_pretty(&body).unwrap()
    } else {
        serde_json::to_vec(&body).unwrap()
    }
}

// ------------------------------------------------------------- responses

fn responses_body(first: &Turn, turns: &[Turn], top: u32) -> Vec<u8> {
    let mut ids = Ids::default();
    let user = |ids: &mut Ids, t: &Turn, f: u32| {
        let body = text(ids.next(), t.len as usize / 2 + 10, f);
        let mut item = if bit(f, 10) {
            json!({"role": "user", "content": [
                {"type": "input_text", "text": body},
                {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo=", "detail": "low"}
            ]})
        } else {
            json!({"role": if bit(f, 11) { "developer" } else { "user" }, "content": body})
        };
        if bit(f, 12) {
            item["type"] = json!("message");
        }
        item
    };
    let mut input = vec![user(&mut ids, first, first.flags & !(1 << 11))];
    for t in turns {
        let (len, f) = (t.len as usize, t.flags);
        let reasoning = |ids: &mut Ids| {
            let n = ids.next();
            json!({"type": "reasoning", "id": format!("rs_{n}"), "summary": [
                {"type": "summary_text", "text": text(n, len / 4, f)}
            ], "encrypted_content": format!("gAAAA{n}")})
        };
        if bit(f, 0) {
            input.push(reasoning(&mut ids));
        }
        let mut calls = Vec::new();
        for c in 0..t.calls {
            if c == 1 && bit(f, 1) {
                input.push(reasoning(&mut ids));
            }
            let n = ids.next();
            input.push(json!({"type": "function_call", "id": format!("fc_{n}"), "call_id": format!("call_{n}"),
                "name": "read", "arguments": format!("{{\"path\":\"src/{c}.rs\"}}"), "status": "completed"}));
            calls.push(format!("call_{n}"));
        }
        if bit(f, 4) {
            calls.reverse();
        }
        for call in &calls {
            let body = text(ids.next(), len / 2, f >> 5);
            let output = if bit(f, 5) {
                json!([{"type": "input_text", "text": body}])
            } else {
                json!(body)
            };
            input.push(json!({"type": "function_call_output", "call_id": call, "output": output}));
        }
        if t.calls == 0 || bit(f, 2) {
            let n = ids.next();
            input.push(json!({"type": "message", "role": "assistant", "id": format!("msg_{n}"), "status": "completed",
                "content": [{"type": "output_text", "text": text(n, len, f >> 3), "annotations": []}]}));
        }
        if bit(f, 6) {
            input.push(json!({"type": "item_reference", "id": format!("ref_{}", ids.next())}));
        }
        if calls.is_empty() || bit(f, 7) {
            input.push(user(&mut ids, t, f >> 7));
        }
    }
    let mut body = json!({
        "model": "gpt-5", "input": input, "store": false,
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
        "include": ["reasoning.encrypted_content"], "reasoning": {"effort": "low"},
    });
    if bit(top, 0) {
        body["instructions"] = json!("You are a coding agent. Keep fixes minimal.");
    }
    if bit(top, 3) {
        serde_json::to_vec_pretty(&body).unwrap()
    } else {
        serde_json::to_vec(&body).unwrap()
    }
}

// ---------------------------------------------------------------- checks

/// Chars the policy can never remove: outside the array, fixed items, pins,
/// protected roles and the last `keep_last_n` items, with their groups. A
/// Messages request needs a user turn: with none of those left, the last
/// plain user message is forwarded, so it counts too.
fn protected_chars(format: Format, conversation: &Conversation, spec: &PolicySpec) -> usize {
    let items = &conversation.items;
    let first_user = items.iter().position(|m| m.role == Role::User);
    let last_plain_user = items
        .iter()
        .rposition(|m| m.role == Role::User && m.group.is_none())
        .filter(|_| format == Format::Anthropic);
    let mut protected: Vec<bool> = items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.fixed
                || (spec.pin_first_user && first_user == Some(i))
                || matches!(m.role, Role::System | Role::Developer)
                || i + spec.keep_last_n >= items.len()
                || last_plain_user == Some(i)
        })
        .collect();
    let groups: Vec<u32> = items
        .iter()
        .zip(&protected)
        .filter_map(|(m, p)| if *p { m.group } else { None })
        .collect();
    for (m, p) in items.iter().zip(protected.iter_mut()) {
        *p |= m.group.is_some_and(|g| groups.contains(&g));
    }
    conversation.outside_chars
        + items
            .iter()
            .zip(&protected)
            .filter(|(_, p)| **p)
            .map(|(m, _)| m.chars())
            .sum::<usize>()
}

/// Compacts `body` under `spec` and checks the forwarded body.
fn check(
    format: Format,
    body: &[u8],
    spec: &PolicySpec,
    rules: fn(&[u8], &[u8]) -> Verdict,
) -> Result<(), TestCaseError> {
    let policy = spec.compile();
    let outcome = outcome_of(body, &policy, format, 100_000, &NoCheckpoints)
        .map_err(|skip| TestCaseError::fail(format!("skipped: {skip}")))?;
    let forwarded = outcome.rewritten.as_deref().unwrap_or(body);
    let text = || String::from_utf8_lossy(forwarded).into_owned();
    rules(body, forwarded).map_err(|why| TestCaseError::fail(format!("{why}\n{}", text())))?;

    let reparsed = format
        .parse(forwarded, 100_000)
        .map_err(|skip| TestCaseError::fail(format!("the forwarded body is refused: {skip}")))?;
    prop_assert_eq!(reparsed.total_chars(), outcome.loss.output_chars);
    let parsed = format.parse(body, 100_000).unwrap();
    prop_assert_eq!(parsed.total_chars(), outcome.loss.input_chars);
    if protected_chars(format, &parsed.conversation, spec) <= spec.budget {
        prop_assert!(
            outcome.loss.output_chars <= spec.budget,
            "{} chars forwarded over a budget of {} that the protected part fits",
            outcome.loss.output_chars,
            spec.budget
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn anthropic_forwarded_bodies_are_valid_messages_requests(
        first in turns(), rest in turns(), top in any::<u32>(), spec in policies(),
    ) {
        let body = anthropic_body(&first[0], &rest, top);
        check(Format::Anthropic, &body, &spec, check_anthropic)?;
    }

    #[test]
    fn responses_forwarded_bodies_are_valid_responses_requests(
        first in turns(), rest in turns(), top in any::<u32>(), spec in policies(),
    ) {
        let body = responses_body(&first[0], &rest, top);
        check(Format::Responses, &body, &spec, check_responses)?;
    }
}

/// The checkers can fail: a body that breaks each rule is refused.
#[test]
fn the_checkers_refuse_what_the_apis_refuse() {
    let original = json!({"model": "m", "messages": [
        {"role": "user", "content": "[t1] go"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "x", "signature": "s1"},
            {"type": "tool_use", "id": "u1", "name": "read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "u1", "content": "r", "cache_control": {"type": "ephemeral"}}]},
        {"role": "assistant", "content": "[t2] done"},
        {"role": "user", "content": "[t3] next"}
    ]});
    let bytes = serde_json::to_vec(&original).unwrap();
    assert_eq!(check_anthropic(&bytes, &bytes), Ok(()));
    let mut broken = original.clone();
    broken["messages"].as_array_mut().unwrap().remove(1);
    assert!(check_anthropic(&bytes, &serde_json::to_vec(&broken).unwrap()).is_err());
    let mut broken = original.clone();
    broken["messages"].as_array_mut().unwrap().remove(0);
    assert!(check_anthropic(&bytes, &serde_json::to_vec(&broken).unwrap()).is_err());
    let mut broken = original.clone();
    broken["messages"][1]["content"][0]["thinking"] = json!("y");
    assert!(check_anthropic(&bytes, &serde_json::to_vec(&broken).unwrap()).is_err());
    let mut broken = original.clone();
    broken["messages"][4]["content"] =
        json!([{"type": "text", "text": "[t3] next", "cache_control": {"type": "ephemeral"}}]);
    broken["messages"][3]["content"] =
        json!([{"type": "text", "text": "[t2] done", "cache_control": {"type": "ephemeral"}}]);
    assert!(check_anthropic(&bytes, &serde_json::to_vec(&broken).unwrap()).is_err());
    let mut broken = original.clone();
    broken["model"] = json!("other");
    assert!(check_anthropic(&bytes, &serde_json::to_vec(&broken).unwrap()).is_err());

    let original = json!({"input": [
        {"role": "user", "content": "[t1] go"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c1", "name": "read", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "r"},
        {"type": "item_reference", "id": "ref_1"},
        {"role": "user", "content": "[t2] next"}
    ]});
    let bytes = serde_json::to_vec(&original).unwrap();
    assert_eq!(check_responses(&bytes, &bytes), Ok(()));
    for drop in [1, 2, 3, 4] {
        let mut broken = original.clone();
        broken["input"].as_array_mut().unwrap().remove(drop);
        assert!(
            check_responses(&bytes, &serde_json::to_vec(&broken).unwrap()).is_err(),
            "dropping item {drop} passes"
        );
    }
}
