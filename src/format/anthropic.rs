//! Anthropic Messages (`POST /v1/messages`): `messages` is compacted; every
//! other field keeps its bytes.
//!
//! Mapping to the neutral model:
//! - top-level `system` (a string or text blocks) counts toward the budget
//!   as chars outside the array and is never cut;
//! - `text` blocks are the item's text and can be trimmed (an emptied block
//!   is removed); `image`, `document` and other media blocks count zero;
//! - `tool_use` blocks are tool calls: name and `input` count as fixed chars;
//! - `tool_result` blocks are the text of the user message that carries
//!   them (their string content, or their text blocks); a user message made
//!   only of tool results is a `tool` item;
//! - an assistant message with `tool_use` and the user message(s) answering
//!   it form one group, even when several results share one message;
//! - `thinking` and `redacted_thinking` count as fixed chars and are kept
//!   byte for byte with their signatures, inside their assistant turn;
//! - `cache_control` markers are breakpoints: a marker on a block that goes
//!   moves to the nearest kept block before it that has none (or, with
//!   none before, the nearest after), so their number stays the same unless
//!   every block left has one; never onto a thinking block (the API refuses
//!   it there, and its bytes are signed).
//!
//! - `role: "system"` entries inside `messages` (mid-conversation system
//!   messages) are protected like the top-level `system`: they count, stay
//!   in place and are never cut or dropped; [`crate::format::Format::repair`]
//!   keeps the API's placement rule around them;
//! - a `compaction` block (the provider's signed summary) is forwarded byte
//!   for byte with its message; the API ignores everything before it, so
//!   what precedes the latest one counts nothing and is forwarded as it came;
//!   a request with the top-level `compaction` field asks for one and is
//!   skipped (`provider-compaction`);
//! - a message holding any other block type is kept whole, in place, its
//!   unknown blocks counted by their bytes; unknown fields keep their bytes.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::resume::{ReadState, Resume, Start};
use super::splice::{span, ArgumentsForm, Marker, WireItem};
use super::split;
use super::{
    array_field, read_top, top_fields, Conversation, Format, Item, Parsed, Skip, ToolCall,
    HOLDS_COMPACTION, UNKNOWN_KEPT_WHOLE,
};
use crate::engine::text::char_count;
use crate::engine::Role;

const MEDIA_BLOCKS: [&str; 2] = ["image", "document"];

const SYSTEM_IN_MESSAGES: &str = "a system message inside messages, kept in place";

/// The top-level fields read, in [`read_top`]'s order.
const TOP_FIELDS: [&str; 3] = ["messages", "system", "compaction"];

/// Whether the top-level `compaction` field asks the API for a summary.
fn asks_for_compaction(field: Option<&RawValue>) -> bool {
    field.is_some_and(|f| f.get() != "null")
}

#[derive(Deserialize)]
struct MessageFields<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow)]
    content: &'a RawValue,
}

#[derive(Deserialize)]
struct BlockFields<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_use_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    thinking: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    data: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    cache_control: Option<&'a RawValue>,
}

pub(super) fn parse(body: &str, max_items: usize) -> Result<Parsed<'_>, Skip> {
    match parse_split(body, max_items) {
        Some(parsed) => Ok(parsed),
        None => parse_plain(body, max_items),
    }
}

/// [`parse`] the plain way: serde reads the whole body, then each message.
fn parse_plain(body: &str, max_items: usize) -> Result<Parsed<'_>, Skip> {
    let [messages, system, compaction] = top_fields(body, TOP_FIELDS)?;
    if asks_for_compaction(compaction) {
        return Err(Skip::ProviderCompaction("the compaction field"));
    }
    let raw = messages.ok_or(Skip::NoMessages)?;
    let items = array_field(messages)?.ok_or(Skip::NoMessages)?;
    let array_span = span(body, raw.get());
    let system = system.map(system_chars);
    let items = items.into_iter().map(RawValue::get).collect();
    read_messages(body, items, array_span, system, max_items, Start::default()).map(|(p, _)| p)
}

/// [`parse`] with the messages found by [`split`]: serde reads each byte
/// once. `None` when anything fails, for the plain way to find out why.
fn parse_split(body: &str, max_items: usize) -> Option<Parsed<'_>> {
    parse_split_from(body, max_items, Resume::default()).map(|(parsed, _)| parsed)
}

/// [`parse_split`] from where `from` says, and the read loop's state at
/// the end.
pub(super) fn parse_split_from<'a>(
    body: &'a str,
    max_items: usize,
    from: Resume<'a>,
) -> Option<(Parsed<'a>, ReadState)> {
    let Resume { start, at } = from;
    let (array, system) = split::split_body_from(body, "messages", at, |outside| {
        let [messages, system, compaction] = read_top(outside, TOP_FIELDS).ok()?;
        if asks_for_compaction(compaction) {
            return None;
        }
        Some((messages?, system.map(system_chars)))
    })?;
    read_messages(body, array.elements, array.span, system, max_items, start).ok()
}

/// Reads the messages (`items`, each one's text in `body`) of the array at
/// `array_span` into the neutral model, after the items `start` holds
/// (`items` are the ones after them), and the loop's state at the end;
/// `system` is the top-level system prompt's chars when there is one
/// (`Some(None)`: not a valid one).
fn read_messages<'a>(
    body: &'a str,
    items: Vec<&'a str>,
    array_span: std::ops::Range<usize>,
    system: Option<Option<usize>>,
    max_items: usize,
    start: Start<'a>,
) -> Result<(Parsed<'a>, ReadState), Skip> {
    let first = start.items.len();
    if first + items.len() > max_items {
        return Err(Skip::TooManyMessages(first + items.len(), max_items));
    }
    let mut conversation = Conversation {
        items: start.items,
        outside_chars: match system {
            None => 0,
            Some(chars) => chars.ok_or(Skip::NoMessages)?,
        },
    };
    conversation.items.reserve(items.len());

    let mut wire = start.wire;
    wire.reserve(items.len());
    // tool_use id -> group of the assistant message that made the call
    // (hashed: a message may hold thousands of calls, and each result
    // looks its id up)
    let mut open_calls: HashMap<String, u32> = start.state.open_calls;
    let count = first + items.len();
    let mut before_last = None;
    for (i, raw) in (first..).zip(items) {
        if i + 1 == count {
            before_last = Some(Box::new(ReadState {
                open_calls: open_calls.clone(),
                ..ReadState::default()
            }));
        }
        if !raw.starts_with('{') {
            return Err(Skip::UnsupportedMessage(i, "not an object"));
        }
        let fields = message_fields(raw).ok_or(Skip::UnsupportedMessage(
            i,
            "not an object with role and content",
        ))?;
        let role = match fields.role.as_ref() {
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "system" => Role::System,
            _ => return Err(Skip::UnsupportedMessage(i, "unknown role")),
        };
        let mut item = Item::new(role, "");
        if role == Role::System {
            item.fix(SYSTEM_IN_MESSAGES);
        }
        let mut w = WireItem {
            span: span(body, raw),
            ..WireItem::default()
        };
        let mut results = 0;
        let mut others = 0;
        // The call each text piece of a tool_result answers.
        let mut piece_answers: Vec<String> = Vec::new();
        let content = fields.content.get();
        match content.as_bytes().first() {
            Some(b'"') => {
                w.push_text(body, fields.content, None)
                    .ok_or(Skip::UnsupportedMessage(i, "bad string"))?;
                others += 1;
            }
            Some(b'[') => {
                let blocks = w
                    .open_array(
                        body,
                        content,
                        "content is not a string or array",
                        "a content block is not an object",
                    )
                    .map_err(|why| Skip::UnsupportedMessage(i, why))?;
                for (element, raw) in blocks {
                    let Some(b) = serde_json::from_str::<BlockFields>(raw).ok() else {
                        // Not a block this proxy can read (no string type,
                        // or a field of an unexpected type): kept whole.
                        item.fixed_chars += raw.len();
                        item.fix(UNKNOWN_KEPT_WHOLE);
                        others += 1;
                        continue;
                    };
                    if let Some(marker) = b.cache_control {
                        w.markers.push(Marker {
                            value: marker.get(),
                            element,
                        });
                    }
                    match b.kind.as_ref() {
                        "text" => match b.text.and_then(|t| w.push_text(body, t, Some(element))) {
                            Some(()) => others += 1,
                            None => {
                                item.fixed_chars += raw.len();
                                item.fix(UNKNOWN_KEPT_WHOLE);
                                others += 1;
                            }
                        },
                        "tool_use" => {
                            let input = b.input.map_or("{}", RawValue::get);
                            w.arguments.push(
                                b.input
                                    .map(|raw| (span(body, raw.get()), ArgumentsForm::Inline)),
                            );
                            let name = b.name.as_deref().unwrap_or_default();
                            item.fixed_chars += char_count(name) + char_count(input);
                            let id = b.id.as_deref().unwrap_or_default().to_owned();
                            item.tool_calls.push(ToolCall {
                                id: id.clone(),
                                name: name.to_owned(),
                                arguments: input.to_owned(),
                            });
                            if item.group.is_none() {
                                open_calls.clear();
                            }
                            item.group = Some(i as u32);
                            open_calls.insert(id, i as u32);
                            others += 1;
                        }
                        "tool_result" => {
                            results += 1;
                            let id = b.tool_use_id.as_deref().unwrap_or_default();
                            if let Some(&g) = open_calls.get(id) {
                                item.group = Some(g);
                            }
                            if item.answers.is_none() {
                                item.answers = Some(id.to_owned());
                            }
                            if let Some(c) = b.content {
                                let before = w.texts.len();
                                read_result_content(body, c, &mut w, &mut item);
                                piece_answers
                                    .extend((before..w.texts.len()).map(|_| id.to_owned()));
                            }
                        }
                        "thinking" | "redacted_thinking" => {
                            let chars = if b.kind == "thinking" {
                                b.thinking.as_deref().map_or(0, char_count)
                            } else {
                                b.data.as_deref().map_or(0, char_count)
                            };
                            item.fixed_chars += chars;
                            *item.thinking.get_or_insert(0) += chars;
                            w.unmarkable.push(element);
                            w.thinking.push(element);
                            others += 1;
                        }
                        "compaction" => {
                            // The API reads the message from this block on.
                            item.provider_compaction = true;
                            item.fix(HOLDS_COMPACTION);
                            item.why_fixed = Some(HOLDS_COMPACTION);
                            w.texts.clear();
                            piece_answers.clear();
                            item.fixed_chars = b.content.map_or(0, |c| {
                                serde_json::from_str::<Cow<str>>(c.get())
                                    .map_or(c.get().len(), |t| char_count(&t))
                            });
                            others += 1;
                        }
                        kind if MEDIA_BLOCKS.contains(&kind) => others += 1,
                        _ => {
                            item.fixed_chars += raw.len();
                            item.fix(UNKNOWN_KEPT_WHOLE);
                            others += 1;
                        }
                    }
                }
            }
            _ => {
                return Err(Skip::UnsupportedMessage(
                    i,
                    "content is not a string or array",
                ))
            }
        }
        if item.fixed {
            // Its bytes go as they came: no moved breakpoint lands on it.
            w.sealed = true;
        }
        if role == Role::User && results > 0 && others == 0 {
            item.role = Role::Tool;
        }
        item.text = w.text();
        if results > 0 && w.texts.len() > 1 && !item.fixed {
            // Each piece on its own: a tool result's never goes empty. A
            // text block's piece answers nothing ("").
            let mut answers = piece_answers.into_iter();
            item.piece_answers = w
                .texts
                .iter()
                .map(|t| match t.element {
                    Some(e) if e.array == 0 => String::new(),
                    _ => answers.next().unwrap_or_default(),
                })
                .collect();
            item.piece_chars = w.texts.iter().map(|t| char_count(&t.text)).collect();
        }
        conversation.items.push(item);
        wire.push(w);
    }
    conversation.read_from_latest_compaction();
    let state = ReadState {
        open_calls,
        before_last,
        ..ReadState::default()
    };
    let parsed = Parsed {
        format: Format::Anthropic,
        conversation,
        body,
        array_span,
        wire,
        carried: Default::default(),
    };
    Ok((parsed, state))
}

/// A tool result's content: a string, or blocks whose text counts; a block
/// of a type this proxy does not know makes the item fixed.
fn read_result_content<'a>(
    body: &'a str,
    content: &'a RawValue,
    w: &mut WireItem<'a>,
    item: &mut Item,
) {
    let raw = content.get();
    let unknown = |item: &mut Item, bytes: usize| {
        item.fixed_chars += bytes;
        item.fix(UNKNOWN_KEPT_WHOLE);
    };
    match raw.as_bytes().first() {
        Some(b'"') => {
            if w.push_text(body, content, None).is_none() {
                unknown(item, raw.len());
            }
        }
        Some(b'[') => {
            let Ok(blocks) = w.open_array(body, raw, "", "") else {
                return unknown(item, raw.len());
            };
            for (element, raw) in blocks {
                let Ok(b) = serde_json::from_str::<BlockFields>(raw) else {
                    unknown(item, raw.len());
                    continue;
                };
                if let Some(marker) = b.cache_control {
                    w.markers.push(Marker {
                        value: marker.get(),
                        element,
                    });
                }
                match b.kind.as_ref() {
                    "text" => {
                        if b.text
                            .and_then(|t| w.push_text(body, t, Some(element)))
                            .is_none()
                        {
                            unknown(item, raw.len());
                        }
                    }
                    kind if MEDIA_BLOCKS.contains(&kind) => {}
                    _ => unknown(item, raw.len()),
                }
            }
        }
        Some(b'n') => {}
        _ => unknown(item, raw.len()),
    }
}

/// A message's role and content; of a repeated key the last one wins, as
/// the API reads it (serde's derived struct, the fast way, refuses one).
/// The `anthropic-beta` value that lets a request set
/// `thinking.block_binding`.
pub const THINKING_BINDING_BETA: &str = "thinking-binding-controls-2026-08-01";

/// `body` with `"block_binding": {"prefix_mismatch_behavior": "drop_block"}`
/// added to its top-level `thinking` object, so that the API drops
/// reasoning whose prefix changed instead of refusing the request; `None`
/// when there is no `thinking` object, or it already says what to do.
pub fn ask_to_drop_stale_thinking(body: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct Top<'a> {
        #[serde(borrow)]
        thinking: Option<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Thinking<'a> {
        #[serde(borrow)]
        block_binding: Option<&'a RawValue>,
    }
    let top: Top = serde_json::from_str(body).ok()?;
    let thinking = top.thinking?.get();
    let parsed: Thinking = serde_json::from_str(thinking).ok()?;
    if parsed.block_binding.is_some() || !thinking.starts_with('{') {
        return None;
    }
    let at = span(body, thinking).start + 1;
    let empty = thinking[1..].trim_start().starts_with('}');
    let mut out = String::with_capacity(body.len() + 64);
    out.push_str(&body[..at]);
    out.push_str(r#""block_binding":{"prefix_mismatch_behavior":"drop_block"}"#);
    if !empty {
        out.push(',');
    }
    out.push_str(&body[at..]);
    Some(out)
}

fn message_fields(raw: &str) -> Option<MessageFields<'_>> {
    if let Ok(fields) = serde_json::from_str::<MessageFields>(raw) {
        return Some(fields);
    }
    let [role, content] = read_top(raw, ["role", "content"]).ok()?;
    Some(MessageFields {
        role: serde_json::from_str(role?.get()).ok()?,
        content: content?,
    })
}

/// The chars of `system`: a string or text blocks.
fn system_chars(system: &RawValue) -> Option<usize> {
    #[derive(Deserialize)]
    struct SystemBlock<'a> {
        #[serde(borrow, default)]
        text: Option<Cow<'a, str>>,
    }
    let raw = system.get();
    match raw.as_bytes().first()? {
        b'"' => Some(char_count(&serde_json::from_str::<Cow<str>>(raw).ok()?)),
        b'[' => {
            let blocks: Vec<SystemBlock> = serde_json::from_str(raw).ok()?;
            Some(
                blocks
                    .iter()
                    .map(|b| b.text.as_deref().map_or(0, char_count))
                    .sum(),
            )
        }
        b'n' => Some(0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::{self, stable::NoCheckpoints};
    use crate::engine::Policy;
    use crate::policy::CompiledPolicy;
    use serde_json::{json, Value};

    fn compact(body: &Value, budget: usize, keep_last_n: usize) -> Option<Value> {
        let bytes = serde_json::to_vec(body).unwrap();
        let parsed = Format::Anthropic.parse(&bytes, usize::MAX).unwrap();
        let mut p = Policy::with_budget(budget);
        p.keep_last_n = keep_last_n;
        p.max_message_chars = 4000;
        let mut policy = CompiledPolicy::plain("t", p);
        policy.pin_first_user = true;
        let out = compaction::compact(&parsed, &policy, &NoCheckpoints);
        out.plan
            .map(|plan| serde_json::from_str(&parsed.splice(&plan)).expect("JSON"))
    }

    fn long(word: &str) -> String {
        format!("{word} ").repeat(40)
    }

    #[test]
    fn system_counts_and_tool_use_groups_with_its_results() {
        let body = json!({
            "model": "claude", "max_tokens": 100,
            "system": [{"type": "text", "text": "be brief"}],
            "messages": [
                {"role": "user", "content": long("task")},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "hmm", "signature": "sig"},
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {"path": "a"}},
                    {"type": "tool_use", "id": "t2", "name": "read", "input": {"path": "b"}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": long("alpha")},
                    {"type": "tool_result", "tool_use_id": "t2", "content": [{"type": "text", "text": long("beta")}]}]},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "next?"}
            ]
        });
        let bytes = serde_json::to_vec(&body).unwrap();
        let parsed = Format::Anthropic.parse(&bytes, usize::MAX).unwrap();
        let items = &parsed.conversation.items;
        assert_eq!(parsed.conversation.outside_chars, 8);
        assert_eq!(items[1].group, items[2].group);
        assert!(items[1].group.is_some());
        assert_eq!(items[2].role, Role::Tool);
        assert_eq!(items[1].tool_calls.len(), 2);
        assert_eq!(items[1].fixed_chars, 3 + 4 + 12 + 4 + 12);

        let out = compact(&body, 300, 2).expect("compacted");
        let roles: Vec<&str> = out["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(out["messages"][0]["role"], "user", "{roles:?}");
        for (k, m) in out["messages"].as_array().unwrap().iter().enumerate() {
            if let Some(blocks) = m["content"].as_array() {
                for b in blocks.iter().filter(|b| b["type"] == "tool_result") {
                    let prev = &out["messages"][k - 1]["content"];
                    assert!(prev
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|u| u["type"] == "tool_use" && u["id"] == b["tool_use_id"]));
                }
            }
        }
        assert_eq!(out["system"], body["system"]);
    }

    #[test]
    fn a_dropped_blocks_cache_control_moves_to_the_block_before() {
        let marker = json!({"type": "ephemeral"});
        let body = json!({
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "first, pinned by the tail"}]},
                {"role": "assistant", "content": [{"type": "text", "text": long("old"), "cache_control": marker}]},
                {"role": "user", "content": [{"type": "text", "text": long("older"), "cache_control": marker}]},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": [{"type": "text", "text": "last", "cache_control": marker}]}
            ]
        });
        let out = compact(&body, 60, 2).expect("compacted");
        let count = |v: &Value| v.to_string().matches("cache_control").count();
        assert!(count(&out) <= count(&body));
        assert_eq!(out["messages"][0]["content"][0]["cache_control"], marker);
        assert_eq!(
            out["messages"].as_array().unwrap().last().unwrap()["content"][0]["cache_control"],
            marker
        );
    }

    #[test]
    fn stale_thinking_is_dropped_by_asking_in_the_thinking_object() {
        let body =
            r#"{"model":"m","thinking": {"type":"adaptive","display":"omitted"},"messages":[]}"#;
        let out = ask_to_drop_stale_thinking(body).unwrap();
        let v: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(
            v["thinking"]["block_binding"]["prefix_mismatch_behavior"],
            "drop_block"
        );
        assert_eq!(v["thinking"]["type"], "adaptive");
        assert!(
            out.ends_with(r#""display":"omitted"},"messages":[]}"#),
            "{out}"
        );
        let empty = ask_to_drop_stale_thinking(r#"{"thinking":{ }}"#).unwrap();
        assert!(serde_json::from_str::<Value>(&empty).is_ok(), "{empty}");
        // The client's own choice stands, and no object means nothing to ask.
        let chosen = r#"{"thinking":{"type":"adaptive","block_binding":{"prefix_mismatch_behavior":"error"}}}"#;
        assert_eq!(ask_to_drop_stale_thinking(chosen), None);
        assert_eq!(ask_to_drop_stale_thinking(r#"{"model":"m"}"#), None);
    }

    #[test]
    fn a_moved_cache_control_never_lands_on_a_thinking_block() {
        let marker = json!({"type": "ephemeral"});
        let thinking = json!({"type": "thinking", "thinking": "plan", "signature": "sig"});
        // The thinking turn comes before the dropped message, so it keeps
        // its reasoning (nothing before it changed), and the marker of the
        // dropped message passes over the thinking block nearest to it.
        let body = json!({
            "messages": [
                {"role": "user", "content": "task"},
                {"role": "assistant", "content": [{"type": "text", "text": "ok"}, thinking]},
                {"role": "user", "content": [{"type": "text", "text": long("older"), "cache_control": marker}]},
                {"role": "assistant", "content": long("fine")},
                {"role": "user", "content": "last"}
            ]
        });
        // The plan the engine could make: the two long messages go.
        let bytes = serde_json::to_vec(&body).unwrap();
        let parsed = Format::Anthropic.parse(&bytes, usize::MAX).unwrap();
        let plan = crate::format::Plan {
            items: [0, 1, 4]
                .into_iter()
                .map(crate::format::Planned::verbatim)
                .collect(),
        };
        let out: Value = serde_json::from_str(&parsed.splice(&plan)).unwrap();
        let kept = &out["messages"][1]["content"];
        assert_eq!(kept[1], thinking, "{out}");
        assert_eq!(kept[0]["cache_control"], marker, "{out}");
    }

    #[test]
    fn a_moved_cache_control_skips_blocks_that_have_one_so_none_is_lost() {
        let marker = json!({"type": "ephemeral"});
        let image = json!({"type": "image", "source": {"type": "url", "url": "https://x/a.png"}});
        let body = json!({
            "messages": [
                {"role": "user", "content": "task"},
                {"role": "assistant", "content": [{"type": "text", "text": long("old"), "cache_control": marker}]},
                {"role": "user", "content": [{"type": "text", "text": "q", "cache_control": marker}, image]}
            ]
        });
        let out = compact(&body, 60, 1).expect("compacted");
        assert_eq!(out["messages"].as_array().unwrap().len(), 2, "{out}");
        let kept = &out["messages"][1]["content"];
        assert_eq!(kept[0]["cache_control"], marker, "{out}");
        assert_eq!(kept[1]["cache_control"], marker, "{out}");
    }

    #[test]
    fn dropping_a_leading_tool_round_never_leaves_an_assistant_first() {
        let mut tool_use = Item::new(Role::Assistant, "");
        tool_use.group = Some(1);
        let mut tool_result = Item::new(Role::Tool, "result");
        tool_result.group = Some(1);
        let conversation = Conversation {
            items: vec![
                Item::new(Role::User, "task"),
                tool_use,
                tool_result,
                Item::new(Role::Assistant, "done"),
                Item::new(Role::User, "next"),
            ],
            outside_chars: 0,
        };
        let plan_of = |indices: &[usize]| crate::format::Plan {
            items: indices
                .iter()
                .map(|&i| crate::format::Planned::verbatim(i))
                .collect(),
        };
        let mut plan = plan_of(&[1, 2, 3, 4]);
        Format::Anthropic.repair(&conversation, &mut plan);
        assert_eq!(plan, plan_of(&[4]));
        // Only assistant turns survived: the last user message is the request.
        let mut plan = plan_of(&[1, 3]);
        Format::Anthropic.repair(&conversation, &mut plan);
        assert_eq!(plan, plan_of(&[4]));
        let mut plan = plan_of(&[]);
        Format::Anthropic.repair(&conversation, &mut plan);
        assert_eq!(plan, plan_of(&[4]));
    }

    #[test]
    fn a_message_with_an_unknown_block_is_kept_whole_and_unknown_fields_keep_their_bytes() {
        let server =
            r#"{"type":"server_tool_use","id":"x","name":"web_search","input":{"q":"rust"}}"#;
        let body = format!(
            r#"{{"model":"claude","context_management":{{"edits":[{{"type":"clear_tool_uses_20250919"}}]}},"output_config":{{"effort":"low"}},"thinking":{{"type":"adaptive"}},"messages":[{{"role":"user","content":"{old}"}},{{"role":"assistant","content":[{server},{{"type":"text","text":"{old}"}}],"output_config":{{"effort":"high"}}}},{{"role":"user","content":"{old}"}},{{"role":"assistant","content":"ok"}},{{"role":"user","content":"last"}}]}}"#,
            old = long("old").trim_end(),
        );
        let parsed = Format::Anthropic.parse(body.as_bytes(), 10).unwrap();
        let item = &parsed.conversation.items[1];
        assert!(item.fixed);
        assert_eq!(item.why_fixed, Some(UNKNOWN_KEPT_WHOLE));
        assert_eq!(item.fixed_chars, server.len());
        let out = compact(&serde_json::from_str(&body).unwrap(), 200, 1).expect("compacted");
        let messages = out["messages"].as_array().unwrap();
        let kept = messages
            .iter()
            .find(|m| m["content"][0]["type"] == "server_tool_use")
            .expect("kept in place");
        let original: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            kept, &original["messages"][1],
            "whole, unknown field included"
        );
        for field in ["context_management", "output_config", "thinking"] {
            assert_eq!(out[field], original[field], "{field}");
        }
        // A block of a known type whose fields do not read is kept whole too.
        let odd = br#"{"messages":[{"role":"user","content":[{"type":"text","text":5}]}]}"#;
        assert!(Format::Anthropic.parse(odd, 10).unwrap().conversation.items[0].fixed);
        // A body that is no Messages request at all still names the message.
        let bad = br#"{"messages":[{"role":"user","content":"a"},{"role":"user","content":5}]}"#;
        let skip = Format::Anthropic.parse(bad, 10).unwrap_err();
        assert_eq!(skip.reason(), "unsupported-message");
        assert_eq!(
            skip.detail().as_deref(),
            Some("message 1: content is not a string or array")
        );
    }

    #[test]
    fn system_entries_inside_messages_are_counted_kept_in_place_and_never_cut() {
        let reminder = long("remember");
        let body = json!({"messages": [
            {"role": "user", "content": long("task")},
            {"role": "system", "content": [{"type": "text", "text": reminder}]},
            {"role": "assistant", "content": long("answer")},
            {"role": "user", "content": long("more")},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": long("file")}]},
            {"role": "system", "content": "the file changed on disk", "clear_at": "next_user_message"},
            {"role": "assistant", "content": long("reply")},
            {"role": "user", "content": "last"}
        ]});
        let bytes = serde_json::to_vec(&body).unwrap();
        let parsed = Format::Anthropic.parse(&bytes, 20).unwrap();
        let items = &parsed.conversation.items;
        assert_eq!(items[1].role, Role::System);
        assert!(items[1].fixed && items[6].fixed);
        assert_eq!(items[1].chars(), reminder.chars().count());
        // Far over budget: both entries stay whole, where they were, each
        // after a user turn and before an assistant turn or the end.
        let out = compact(&body, 10, 1).expect("compacted");
        let messages = out["messages"].as_array().unwrap();
        for (k, m) in messages.iter().enumerate() {
            if m["role"] != "system" {
                continue;
            }
            let original = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .find(|o| o["content"] == m["content"])
                .expect("never cut");
            assert_eq!(m, original);
            // A run of entries follows a user turn and precedes an
            // assistant turn or ends the list.
            let role = |j: usize| messages[j]["role"].as_str().unwrap();
            let before = (0..k).rev().find(|&j| role(j) != "system");
            let after = (k + 1..messages.len()).find(|&j| role(j) != "system");
            assert!(before.is_some_and(|j| role(j) == "user"), "{out}");
            assert!(after.map_or(true, |j| role(j) == "assistant"), "{out}");
        }
        assert_eq!(
            messages.iter().filter(|m| m["role"] == "system").count(),
            2,
            "{out}"
        );
    }

    #[test]
    fn compaction_blocks_go_byte_for_byte_and_what_precedes_them_counts_nothing() {
        let compaction = r#"{"type":"compaction","content":"Summary: the user fixed the parser.","signature":"c2lnbmVk"}"#;
        let old = long("old").trim_end().to_owned();
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"{old}"}},{{"role":"assistant","content":"{old}"}},{{"role":"assistant","content":[{compaction},{{"type":"text","text":"Continuing."}}]}},{{"role":"user","content":"{old}"}},{{"role":"assistant","content":"{old}"}},{{"role":"user","content":"last"}}]}}"#
        );
        let parsed = Format::Anthropic.parse(body.as_bytes(), 10).unwrap();
        let items = &parsed.conversation.items;
        assert!(items[2].provider_compaction && items[2].fixed);
        assert!(items[0].fixed && items[1].fixed);
        assert_eq!(items[0].chars() + items[1].chars(), 0);
        // Counted: the summary, then what follows it.
        let after = "Continuing.".len() + 2 * old.chars().count() + "last".len();
        assert_eq!(
            parsed.total_chars(),
            "Summary: the user fixed the parser.".len() + after
        );
        let out = compact(&serde_json::from_str(&body).unwrap(), 60, 1).expect("compacted");
        let text = out.to_string();
        let forwarded: Value = serde_json::from_str(&body).unwrap();
        let messages = out["messages"].as_array().unwrap();
        assert_eq!(
            messages[..3],
            forwarded["messages"].as_array().unwrap()[..3]
        );
        assert!(text.contains("c2lnbmVk"));
        // Byte for byte in the forwarded body.
        let bytes = serde_json::to_vec(&serde_json::from_str::<Value>(&body).unwrap()).unwrap();
        let parsed = Format::Anthropic.parse(&bytes, 10).unwrap();
        let mut p = Policy::with_budget(60);
        p.keep_last_n = 1;
        let policy = CompiledPolicy::plain("t", p);
        let plan = compaction::compact(&parsed, &policy, &NoCheckpoints)
            .plan
            .unwrap();
        let spliced = parsed.splice(&plan);
        let block = std::str::from_utf8(parsed.item_bytes(2)).unwrap();
        assert!(spliced.contains(block), "{spliced}");
    }

    #[test]
    fn a_request_asking_for_a_compaction_is_the_providers() {
        let body =
            br#"{"compaction":{"type":"summarize"},"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            Format::Anthropic.parse(body, 10).unwrap_err().reason(),
            "provider-compaction"
        );
        let body = br#"{"compaction":null,"messages":[{"role":"user","content":"hi"}]}"#;
        assert!(Format::Anthropic.parse(body, 10).is_ok());
    }

    #[test]
    fn a_cut_never_leaves_an_empty_text_block_or_tool_result() {
        let part = |word: &str| json!([{"type": "text", "text": long(word)}]);
        for content in [
            [part("alpha"), part("beta")],
            [json!(long("alpha")), json!(long("beta"))],
        ] {
            let body = json!({"messages": [
                {"role": "user", "content": "task"},
                {"role": "assistant", "content": [
                    {"type": "tool_use", "id": "t1", "name": "read", "input": {}},
                    {"type": "tool_use", "id": "t2", "name": "read", "input": {}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "t1", "content": content[0]},
                    {"type": "tool_result", "tool_use_id": "t2", "content": content[1]}]},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": "next?"}
            ]});
            let bytes = serde_json::to_vec(&body).unwrap();
            let parsed = Format::Anthropic.parse(&bytes, 10).unwrap();
            let mut p = Policy::with_budget(150);
            p.keep_last_n = 2;
            p.max_message_chars = 100;
            let policy = CompiledPolicy::plain("t", p);
            let out = compaction::compact(&parsed, &policy, &NoCheckpoints);
            let plan = out.plan.expect("compacted");
            let forwarded: Value = serde_json::from_str(&parsed.splice(&plan)).unwrap();
            let results = &forwarded["messages"][2]["content"];
            assert_eq!(results.as_array().unwrap().len(), 2, "{forwarded}");
            for r in results.as_array().unwrap() {
                let text = match &r["content"] {
                    Value::String(s) => s.clone(),
                    blocks => blocks[0]["text"].as_str().unwrap().to_owned(),
                };
                assert!(!text.trim().is_empty(), "{forwarded}");
            }
            // Each result keeps its head: the second is not emptied.
            let head = |r: &Value| match &r["content"] {
                Value::String(s) => s.clone(),
                blocks => blocks[0]["text"].as_str().unwrap().to_owned(),
            };
            assert!(long("beta").starts_with(&head(&results[1])), "{forwarded}");
            // The report counts what is forwarded, marker included.
            let text_chars: usize = plan
                .items
                .iter()
                .map(|p| match &p.text {
                    Some(t) => t.chars().count(),
                    None => parsed.conversation.items[p.index].text.chars().count(),
                })
                .sum();
            let fixed: usize = plan
                .items
                .iter()
                .map(|p| parsed.conversation.items[p.index].fixed_chars)
                .sum();
            assert_eq!(out.loss.output_chars, text_chars + fixed);
        }
    }

    #[test]
    fn a_conversation_left_opening_with_an_assistant_turn_loses_it() {
        let body = json!({"messages": [
            {"role": "user", "content": long("one")},
            {"role": "assistant", "content": "short answer"},
            {"role": "user", "content": long("two")},
            {"role": "assistant", "content": "b"},
            {"role": "user", "content": "c"}
        ]});
        let out = compact(&body, 60, 2).expect("compacted");
        assert_eq!(out["messages"][0]["role"], "user");
    }

    /// Pieces of Messages bodies, tricky for a scan that splits the
    /// messages (see the chat tests).
    const PIECES: [&str; 12] = [
        r#"{"role":"user","content":"hi ], } \" \\"}"#,
        r#" { "role" : "assistant" , "content" : [{"type":"text","text":"é 😀 \u00e9"}] } "#,
        r#"{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{"a":["]"]}}]}"#,
        r#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"[1, 2]"}]}"#,
        r#"{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"AA=="}},{"type":"text","text":"x"}]}"#,
        r#"{"role":"system","content":"x"}"#,
        r#"{"role":"user"}"#,
        r#"[1]"#,
        "null",
        r#"{"role":"user","content":"a","content":"b"}"#,
        r#"{"role":"user","content":[{"type":"mystery"}]}"#,
        r#"{"role":"user","content":"\\\""}"#,
    ];
    const TOP_FIELDS: [&str; 6] = [
        r#""model":"claude-sonnet-4-5""#,
        r#""system":"You are [terse], \"brief\".""#,
        r#""system":[{"type":"text","text":"a ] b"},{"type":"text","text":"é"}]"#,
        r#""system":5"#,
        r#""messages":[]"#,
        r#""max_tokens":1024"#,
    ];

    split::testing::split_agreement!("messages", PIECES, TOP_FIELDS);
}
