//! Checkers of what the Anthropic Messages and OpenAI Responses APIs accept,
//! applied to a body the proxy forwards, against the body it received.
//! Shared by the property tests, the SDK tests, the fixture tests and the
//! stable-mode tests of these formats.
//!
//! Items are matched to the original by an identity: a tool call's id, a
//! thinking block's signature, an item's `id`, or a text tag `[t…]` that the
//! generators put at the start of every text (the engine cuts prefixes, so a
//! tag survives a trim). Items with no identity skip the per-item checks.

use std::collections::HashMap;

use serde_json::value::RawValue;
use serde_json::Value;

pub type Verdict = Result<(), String>;

macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err(format!($($msg)+));
        }
    };
}

/// The bytes before and after the top-level `key`'s value.
fn outside<'a>(body: &'a str, key: &str) -> Result<(&'a str, &'a str), String> {
    let top: HashMap<String, &RawValue> =
        serde_json::from_str(body).map_err(|e| format!("not a JSON object: {e}"))?;
    let value = top.get(key).ok_or(format!("no top-level {key}"))?.get();
    let start = value.as_ptr() as usize - body.as_ptr() as usize;
    Ok((&body[..start], &body[start + value.len()..]))
}

/// What the proxy adds to a Messages request's `thinking` object when the
/// last turn of an open tool loop keeps reasoning whose prefix changed.
const DROP_BLOCK: &str = r#""block_binding":{"prefix_mismatch_behavior":"drop_block"}"#;

/// Everything outside the compacted array keeps its bytes (but for the
/// request to drop stale reasoning, [`DROP_BLOCK`]).
pub fn outside_identical(original: &[u8], forwarded: &[u8], key: &str) -> Verdict {
    let original = std::str::from_utf8(original).map_err(|e| e.to_string())?;
    let forwarded = std::str::from_utf8(forwarded).map_err(|e| format!("not UTF-8: {e}"))?;
    serde_json::from_str::<Value>(forwarded).map_err(|e| format!("invalid JSON: {e}"))?;
    let asked = forwarded
        .replacen(&format!("{DROP_BLOCK},"), "", 1)
        .replacen(DROP_BLOCK, "", 1);
    let forwarded = if original.contains(DROP_BLOCK) {
        forwarded
    } else {
        &asked
    };
    let (a, b) = (outside(original, key)?, outside(forwarded, key)?);
    ensure!(a == b, "bytes outside `{key}` changed");
    Ok(())
}

/// The raw elements of a JSON array text.
fn raw_elements(array: &str) -> Vec<&RawValue> {
    serde_json::from_str(array).unwrap_or_default()
}

/// The raw text of each block of each message (empty for string content).
fn raw_message_blocks(body: &str) -> Vec<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        messages: &'a RawValue,
    }
    #[derive(serde::Deserialize)]
    struct Message<'a> {
        #[serde(borrow)]
        content: &'a RawValue,
    }
    let Ok(top) = serde_json::from_str::<Top>(body) else {
        return Vec::new();
    };
    raw_elements(top.messages.get())
        .into_iter()
        .map(|m| {
            let m: Message = serde_json::from_str(m.get()).expect("a message object");
            raw_elements(m.content.get())
                .into_iter()
                .map(|b| b.get().to_owned())
                .collect()
        })
        .collect()
}

/// A text's identity tag: `[t…]` at its start.
fn tag(text: &str) -> Option<String> {
    let rest = text.strip_prefix("[t")?;
    let end = rest.find(']')?;
    Some(format!("[t{}]", &rest[..end]))
}

fn blocks(message: &Value) -> Vec<Value> {
    match &message["content"] {
        Value::Array(blocks) => blocks.clone(),
        Value::String(s) => vec![serde_json::json!({"type": "text", "text": s})],
        _ => Vec::new(),
    }
}

/// Every identity a Messages message carries.
fn anthropic_identities(message: &Value) -> Vec<String> {
    let mut out = Vec::new();
    for b in blocks(message) {
        match b["type"].as_str() {
            Some("text") => out.extend(b["text"].as_str().and_then(tag)),
            Some("tool_use") => out.extend(b["id"].as_str().map(|id| format!("use:{id}"))),
            Some("tool_result") => {
                out.extend(b["tool_use_id"].as_str().map(|id| format!("result:{id}")))
            }
            Some("thinking") => out.extend(b["signature"].as_str().map(|s| format!("sig:{s}"))),
            Some("redacted_thinking") => out.extend(b["data"].as_str().map(|s| format!("sig:{s}"))),
            _ => {}
        }
    }
    out
}

/// Objects carrying `cache_control` within `value`, and whether any sits on
/// a thinking block.
fn markers(value: &Value) -> (usize, bool) {
    match value {
        Value::Object(map) => {
            let here = usize::from(map.contains_key("cache_control"));
            let on_thinking = here == 1
                && matches!(
                    map.get("type").and_then(Value::as_str),
                    Some("thinking" | "redacted_thinking")
                );
            map.values()
                .map(markers)
                .fold((here, on_thinking), |a, b| (a.0 + b.0, a.1 || b.1))
        }
        Value::Array(items) => items
            .iter()
            .map(markers)
            .fold((0, false), |a, b| (a.0 + b.0, a.1 || b.1)),
        _ => (0, false),
    }
}

/// Content blocks a `cache_control` marker may sit on: the blocks of the
/// messages and of their tool results, thinking blocks excepted.
fn markable_blocks(messages: &[Value]) -> usize {
    let markable = |b: &&Value| b["type"] != "thinking" && b["type"] != "redacted_thinking";
    messages
        .iter()
        .filter_map(|m| m["content"].as_array())
        .flatten()
        .filter(markable)
        .map(|b| 1 + b["content"].as_array().map_or(0, Vec::len))
        .sum()
}

/// The rules of the Messages API, and what the proxy promises on top.
pub fn check_anthropic(original: &[u8], forwarded: &[u8]) -> Verdict {
    outside_identical(original, forwarded, "messages")?;
    let before: Value = serde_json::from_slice(original).map_err(|e| e.to_string())?;
    let after: Value = serde_json::from_slice(forwarded).map_err(|e| e.to_string())?;
    let old = before["messages"]
        .as_array()
        .ok_or("original has no messages")?;
    let new = after["messages"].as_array().ok_or("no messages array")?;
    ensure!(!new.is_empty(), "no messages left");
    ensure!(
        new[0]["role"] == "user",
        "the first message is {}",
        new[0]["role"]
    );
    let answered: Vec<String> = old
        .iter()
        .flat_map(blocks)
        .filter(|b| b["type"] == "tool_result")
        .filter_map(|b| b["tool_use_id"].as_str().map(str::to_owned))
        .collect();
    for (k, m) in new.iter().enumerate() {
        ensure!(
            m["role"] == "user" || m["role"] == "assistant",
            "message {k} has role {}",
            m["role"]
        );
        let uses = |m: &Value| -> Vec<String> {
            blocks(m)
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .filter_map(|b| b["id"].as_str().map(str::to_owned))
                .collect()
        };
        for b in blocks(m).iter().filter(|b| b["type"] == "tool_result") {
            let id = b["tool_use_id"].as_str().unwrap_or_default();
            ensure!(
                k > 0
                    && new[k - 1]["role"] == "assistant"
                    && uses(&new[k - 1]).iter().any(|u| u == id),
                "message {k}: tool_result {id} answers no tool_use in the message before it"
            );
        }
        for id in uses(m).iter().filter(|id| answered.contains(id)) {
            let results = new.get(k + 1).map(blocks).unwrap_or_default();
            ensure!(
                results
                    .iter()
                    .any(|b| b["type"] == "tool_result" && b["tool_use_id"] == id.as_str()),
                "message {k}: tool_use {id} lost the tool_result that answered it"
            );
        }
    }

    // Thinking blocks: byte for byte, all of a kept turn's or none.
    let original_text = std::str::from_utf8(original).map_err(|e| e.to_string())?;
    let forwarded_text = std::str::from_utf8(forwarded).map_err(|e| e.to_string())?;
    let old_raw = raw_message_blocks(original_text);
    let new_raw = raw_message_blocks(forwarded_text);
    let thinking = |raw: &[String]| -> Vec<String> {
        raw.iter()
            .filter(|b| {
                let v: Value = serde_json::from_str(b).unwrap_or_default();
                v["type"] == "thinking" || v["type"] == "redacted_thinking"
            })
            .cloned()
            .collect()
    };
    let mut by_identity: HashMap<String, usize> = HashMap::new();
    for (i, m) in old.iter().enumerate() {
        for id in anthropic_identities(m) {
            by_identity.insert(id, i);
        }
    }
    let mut last = None;
    for (k, m) in new.iter().enumerate() {
        let mut origins: Vec<usize> = anthropic_identities(m)
            .iter()
            .filter_map(|id| by_identity.get(id).copied())
            .collect();
        origins.dedup();
        ensure!(origins.len() <= 1, "message {k} mixes messages {origins:?}");
        let kept_thinking = thinking(&new_raw[k]);
        if let Some(&o) = origins.first() {
            ensure!(
                !matches!(last, Some(l) if l >= o),
                "message {k} (was {o}) is out of order"
            );
            last = Some(o);
            // All of a kept turn's blocks as they came, or none: a turn
            // after a cut loses its reasoning (preserved thinking).
            ensure!(
                kept_thinking.is_empty() || kept_thinking == thinking(&old_raw[o]),
                "message {k}: thinking blocks differ from message {o}'s"
            );
        }
        for t in &kept_thinking {
            ensure!(
                original_text.contains(t.as_str()),
                "a thinking block changed: {t}"
            );
        }
    }

    // cache_control: never on thinking, and the same number (a marker
    // whose block went moved to another), unless too few blocks are left.
    let (old_markers, _) = markers(&before["messages"]);
    let (new_markers, on_thinking) = markers(&after["messages"]);
    ensure!(
        !on_thinking,
        "a cache_control marker sits on a thinking block"
    );
    let expected = old_markers.min(markable_blocks(new));
    ensure!(
        new_markers == expected,
        "{new_markers} cache_control markers where {expected} were due ({old_markers} before)"
    );
    Ok(())
}

/// The identity of a Responses item, when it has one.
fn responses_identity(item: &Value) -> Option<String> {
    let kind = item["type"].as_str().unwrap_or("message");
    if let Some(id) = item["id"].as_str() {
        return Some(format!("id:{id}"));
    }
    match kind {
        "function_call" | "function_call_output" => {
            item["call_id"].as_str().map(|c| format!("{kind}:{c}"))
        }
        _ => match &item["content"] {
            Value::String(s) => tag(s),
            Value::Array(parts) => parts.iter().find_map(|p| p["text"].as_str().and_then(tag)),
            _ => None,
        },
    }
}

/// The rules of the Responses API, and what the proxy promises on top.
pub fn check_responses(original: &[u8], forwarded: &[u8]) -> Verdict {
    outside_identical(original, forwarded, "input")?;
    let before: Value = serde_json::from_slice(original).map_err(|e| e.to_string())?;
    let after: Value = serde_json::from_slice(forwarded).map_err(|e| e.to_string())?;
    let Some(old) = before["input"].as_array() else {
        ensure!(after["input"] == before["input"], "a string input changed");
        return Ok(());
    };
    let new = after["input"]
        .as_array()
        .ok_or("input is no longer an array")?;
    let kind = |item: &Value| item["type"].as_str().unwrap_or("message").to_owned();
    let calls = |items: &[Value], k: &str| -> Vec<String> {
        items
            .iter()
            .filter(|i| kind(i) == k)
            .filter_map(|i| i["call_id"].as_str().map(str::to_owned))
            .collect()
    };
    let old_outputs = calls(old, "function_call_output");
    for (k, item) in new.iter().enumerate() {
        let call = item["call_id"].as_str().unwrap_or_default();
        match kind(item).as_str() {
            "function_call_output" => ensure!(
                calls(&new[..k], "function_call").iter().any(|c| c == call),
                "item {k}: output of {call} without its function_call before it"
            ),
            "function_call" if old_outputs.iter().any(|c| c == call) => ensure!(
                calls(&new[k..], "function_call_output")
                    .iter()
                    .any(|c| c == call),
                "item {k}: function_call {call} lost its output"
            ),
            _ => {}
        }
    }

    // Items in order; reasoning stays directly before the item it preceded;
    // reasoning and references byte for byte, and never dropped.
    let original_text = std::str::from_utf8(original).map_err(|e| e.to_string())?;
    let identity_of: Vec<Option<String>> = old.iter().map(responses_identity).collect();
    let position = |item: &Value| {
        let id = responses_identity(item)?;
        identity_of.iter().position(|o| o.as_deref() == Some(&id))
    };
    let origins: Vec<Option<usize>> = new.iter().map(position).collect();
    let mut last = None;
    for (k, o) in origins.iter().enumerate() {
        let Some(o) = *o else { continue };
        ensure!(
            !matches!(last, Some(l) if l >= o),
            "item {k} (was {o}) is out of order"
        );
        last = Some(o);
        if kind(&old[o]) == "reasoning" && o + 1 < old.len() {
            ensure!(
                origins.get(k + 1).copied().flatten() == Some(o + 1),
                "item {k}: reasoning {o} no longer precedes item {}",
                o + 1
            );
        }
        if o > 0 && kind(&old[o - 1]) == "reasoning" {
            ensure!(
                k > 0 && origins[k - 1] == Some(o - 1),
                "item {k} (was {o}) lost the reasoning before it"
            );
        }
    }
    let raw_new: Vec<&RawValue> = {
        #[derive(serde::Deserialize)]
        struct Top<'a> {
            #[serde(borrow)]
            input: &'a RawValue,
        }
        let top: Top = serde_json::from_slice(forwarded).map_err(|e| e.to_string())?;
        raw_elements(top.input.get())
    };
    for (k, raw) in raw_new.iter().enumerate() {
        let item = &new[k];
        if !matches!(
            kind(item).as_str(),
            "message" | "function_call" | "function_call_output"
        ) {
            ensure!(
                original_text.contains(raw.get()),
                "item {k} ({}) changed",
                kind(item)
            );
        }
    }
    for (o, item) in old.iter().enumerate() {
        let carried = !matches!(
            kind(item).as_str(),
            "message" | "function_call" | "function_call_output" | "reasoning"
        );
        if carried && identity_of[o].is_some() {
            ensure!(
                origins.contains(&Some(o)),
                "item {o} ({}) was dropped",
                kind(item)
            );
        }
    }
    Ok(())
}
