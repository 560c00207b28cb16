//! Property test of recall's markers (`recall = true`) over all three
//! formats: random agent conversations (parallel tool results, string and
//! block content) through the whole pipeline under random policies (exact
//! and stable, with and without the agent passes, at budgets that force
//! trims, prunes and drops). The forwarded body, markers and the proxy's
//! tool included, must stay valid for its API: no empty text, block,
//! tool result or message; every tool call answered in the next turn and
//! every result answering a call; a Messages body opening with a user
//! turn. Every marker id must be answerable from the body it came from,
//! and the same body compacted twice (by two compilations of the policy)
//! must give the same bytes and the same ids.

use std::collections::{BTreeSet, HashSet};

use compaction_proxy::compaction::recall::{self, RecallLimits};
use compaction_proxy::compaction::stable::NoCheckpoints;
use compaction_proxy::format::Format;
use compaction_proxy::proxy::compact::outcome_of;
use proptest::prelude::*;
use serde_json::Value;

use crate::leftover_properties::{
    anthropic, chat, config, no_empty, responses, rounds, specs, Spec,
};

fn text_of(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match &p["content"] {
                Value::Null => p["text"].as_str().unwrap_or_default().to_owned(),
                inner => text_of(inner),
            })
            .collect(),
        _ => String::new(),
    }
}

/// The tool-call rules of each API, as its validator states them.
fn calls_paired(format: Format, body: &Value) -> Result<(), String> {
    match format {
        Format::Anthropic => {
            let messages = body["messages"].as_array().ok_or("no messages")?;
            if messages.first().map(|m| &m["role"]) != Some(&Value::from("user")) {
                return Err("the first message is not a user turn".into());
            }
            // Consecutive turns of one role are one turn to the API.
            let mut groups: Vec<(&str, Vec<&Value>)> = Vec::new();
            for m in messages {
                let role = m["role"].as_str().ok_or("a message without a role")?;
                let blocks: Vec<&Value> = m["content"].as_array().into_iter().flatten().collect();
                match groups.last_mut() {
                    Some((r, b)) if *r == role => b.extend(blocks),
                    _ => groups.push((role, blocks)),
                }
            }
            for (g, (role, blocks)) in groups.iter().enumerate() {
                let ids = |blocks: &[&Value], kind: &str, key: &str| -> BTreeSet<String> {
                    blocks
                        .iter()
                        .filter(|b| b["type"] == kind)
                        .filter_map(|b| b[key].as_str().map(str::to_owned))
                        .collect()
                };
                if *role == "assistant" {
                    let uses = ids(blocks, "tool_use", "id");
                    if let (false, Some((_, next))) = (uses.is_empty(), groups.get(g + 1)) {
                        let answered = ids(next, "tool_result", "tool_use_id");
                        if !uses.is_subset(&answered) {
                            return Err(format!("turn {g}: tool_use without tool_result"));
                        }
                    }
                } else {
                    let results = ids(blocks, "tool_result", "tool_use_id");
                    let offered = match g.checked_sub(1).map(|p| &groups[p]) {
                        Some(("assistant", prev)) => ids(prev, "tool_use", "id"),
                        _ => BTreeSet::new(),
                    };
                    if !results.is_subset(&offered) {
                        return Err(format!("turn {g}: tool_result without tool_use"));
                    }
                }
            }
        }
        Format::Chat => {
            let mut pending: Option<HashSet<String>> = None;
            for (i, m) in body["messages"]
                .as_array()
                .ok_or("no messages")?
                .iter()
                .enumerate()
            {
                if m["role"] == "tool" {
                    let id = m["tool_call_id"].as_str().unwrap_or_default();
                    if !pending.as_mut().is_some_and(|p| p.remove(id)) {
                        return Err(format!("message {i}: a tool message answering no call"));
                    }
                    continue;
                }
                if pending.as_ref().is_some_and(|p| !p.is_empty()) {
                    return Err(format!("message {i}: tool calls left unanswered"));
                }
                pending = m["tool_calls"].as_array().map(|calls| {
                    calls
                        .iter()
                        .filter_map(|c| c["id"].as_str().map(str::to_owned))
                        .collect()
                });
            }
        }
        Format::Responses => {
            let items = body["input"].as_array().ok_or("no input")?;
            let of = |kind: &str| -> BTreeSet<String> {
                items
                    .iter()
                    .filter(|i| i["type"] == kind)
                    .filter_map(|i| i["call_id"].as_str().map(str::to_owned))
                    .collect()
            };
            let (calls, outputs) = (of("function_call"), of("function_call_output"));
            if calls != outputs {
                return Err(format!("calls {calls:?} and outputs {outputs:?} differ"));
            }
            for (n, item) in items.iter().enumerate() {
                if item["type"] == "function_call_output" {
                    let id = &item["call_id"];
                    if !items[..n]
                        .iter()
                        .any(|c| c["type"] == "function_call" && c["call_id"] == *id)
                    {
                        return Err(format!("item {n}: an output before its call"));
                    }
                }
            }
        }
    }
    Ok(())
}

fn body_of(format: Format, rounds: &[crate::leftover_properties::Round]) -> Vec<u8> {
    let body = match format {
        Format::Anthropic => anthropic(rounds),
        Format::Chat => chat(rounds),
        Format::Responses => responses(rounds),
    };
    serde_json::to_vec(&body).unwrap()
}

fn compact(format: Format, bytes: &[u8], spec: &Spec) -> Result<(Vec<u8>, usize), TestCaseError> {
    let mut policy = spec.compile();
    policy.recall = Some(RecallLimits::DEFAULT);
    let outcome = outcome_of(bytes, &policy, format, 100_000, &NoCheckpoints)
        .map_err(|skip| TestCaseError::fail(format!("skipped: {skip}")))?;
    let sent = outcome.rewritten.as_deref().unwrap_or(bytes).to_vec();
    Ok((sent, outcome.loss.output_chars))
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn markers_keep_every_forwarded_body_valid_and_their_ids_stable(
        rounds in rounds(),
        spec in specs(),
        which in 0usize..3,
    ) {
        let format = Format::ALL[which];
        let bytes = body_of(format, &rounds);
        let (sent, output_chars) = compact(format, &bytes, &spec)?;
        let forwarded: Value = serde_json::from_slice(&sent)
            .map_err(|e| TestCaseError::fail(format!("not JSON: {e}")))?;
        let fail = |why: String| TestCaseError::fail(format!("{format} {spec:?}: {why}\n{forwarded}"));
        no_empty(format, &forwarded).map_err(fail)?;
        calls_paired(format, &forwarded).map_err(fail)?;
        // What the report counts is what goes, markers included.
        let reparsed = format.parse(&sent, 100_000).map_err(|s| fail(format!("refused: {s}")))?;
        prop_assert_eq!(reparsed.total_chars(), output_chars);

        let ids = recall::forwarded_ids(&sent);
        let tools = forwarded["tools"].as_array().cloned().unwrap_or_default();
        let named = |t: &Value| t["name"] == recall::TOOL_NAME || t["function"]["name"] == recall::TOOL_NAME;
        // The tool goes exactly with the markers, once, after the client's.
        prop_assert_eq!(tools.iter().filter(|t| named(t)).count(), usize::from(!ids.is_empty()));
        if !ids.is_empty() {
            prop_assert!(named(tools.last().unwrap()));
        }
        // Each marker message is a user turn with a non-empty text naming
        // one id, and every id answers from the body it came from.
        let list = match format { Format::Responses => &forwarded["input"], _ => &forwarded["messages"] };
        for item in list.as_array().unwrap() {
            let text = text_of(&item["content"]);
            if text.starts_with("[compaction-proxy dropped") {
                prop_assert_eq!(&item["role"], "user");
                prop_assert_eq!(recall::forwarded_ids(text.as_bytes()).len(), 1);
            }
        }
        let parsed = format.parse(&bytes, 100_000).unwrap();
        for id in &ids {
            let answer = recall::answer(&parsed, &ids, id, usize::MAX)
                .map_err(|why| fail(format!("{id} refused: {why}")))?;
            prop_assert!(!answer.is_empty(), "{} answers nothing", id);
        }

        // The same body again, by another compilation of the policy: the
        // same bytes, the same ids.
        let (again, _) = compact(format, &bytes, &spec)?;
        prop_assert_eq!(&recall::forwarded_ids(&again), &ids);
        prop_assert!(again == sent, "two compactions of one body differ");
    }
}

/// The property's checkers can fail: a body that breaks each rule is refused.
#[test]
fn the_pairing_checker_refuses_unpaired_calls() {
    let rounds = vec![crate::leftover_properties::Round {
        results: vec![10, 10],
        blocks: false,
    }];
    for format in Format::ALL {
        let good: Value = serde_json::from_slice(&body_of(format, &rounds)).unwrap();
        assert_eq!(calls_paired(format, &good), Ok(()), "{format}");
        let mut broken = good.clone();
        let key = if format == Format::Responses {
            "input"
        } else {
            "messages"
        };
        // Without its first tool result (Messages: the whole user turn).
        let at = match format {
            Format::Anthropic => 2,
            _ => good[key]
                .as_array()
                .unwrap()
                .iter()
                .position(|m| m["role"] == "tool" || m["type"] == "function_call_output")
                .unwrap(),
        };
        broken[key].as_array_mut().unwrap().remove(at);
        assert!(calls_paired(format, &broken).is_err(), "{format}: {broken}");
    }
}
