//! OpenAI Responses (`POST /v1/responses`): the `input` item list is
//! compacted; every other field keeps its bytes.
//!
//! Mapping to the neutral model:
//! - `instructions` counts toward the budget as chars outside the list and
//!   is never cut; `input` as a string is the same (nothing to compact);
//! - `message` items (with or without `"type"`): `input_text` and
//!   `output_text` parts (or string content) are the text; image, file and
//!   audio parts count zero; a refusal counts as fixed chars;
//! - `function_call` items are tool calls (name and arguments fixed); the
//!   calls of one model turn (consecutive calls) and the
//!   `function_call_output` items answering them by `call_id` form one
//!   group; an output's string (or its text parts) is its text;
//! - a `reasoning` item is kept with the item that follows it (one group);
//! - `item_reference` and item types this format does not know are kept
//!   as they are: never dropped or cut, an unknown item counted by its
//!   bytes (a reference as zero); a message or output holding a part of a
//!   type this format does not know is kept whole the same way;
//! - a `compaction` item (the provider's summary, `encrypted_content`) is
//!   forwarded byte for byte, and the provider reads the input from the
//!   latest one on: what precedes it counts nothing and goes as it came;
//!   an input ending in a `compaction_trigger` item asks the provider to
//!   compact and is skipped (`provider-compaction`).
//!
//! A request with `previous_response_id` carries only new items (the
//! conversation is held by the server): it is forwarded as received.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::resume::{ReadState, Resume, Start};
use super::splice::{span, string_at, ArgumentsForm, WireItem};
use super::split;
use super::{
    array_field, read_top, top_fields, Conversation, Format, Item, Parsed, Skip, ToolCall,
    HOLDS_COMPACTION, UNKNOWN_KEPT_WHOLE,
};
use crate::engine::text::char_count;
use crate::engine::Role;

const MEDIA_PARTS: [&str; 3] = ["input_image", "input_file", "input_audio"];

/// The top-level fields read, in [`read_top`]'s order.
const TOP_FIELDS: [&str; 3] = ["input", "instructions", "previous_response_id"];

/// The chars of the top level's `instructions`; an error when the
/// conversation is held by the server (`previous_response_id`) or the
/// instructions are not text.
fn outside_of(instructions: Option<&RawValue>, previous: Option<&RawValue>) -> Result<usize, Skip> {
    if previous.is_some_and(|p| p.get() != "null") {
        return Err(Skip::ServerState);
    }
    match instructions {
        None => Ok(0),
        Some(raw) if raw.get() == "null" => Ok(0),
        Some(raw) => serde_json::from_str::<Cow<str>>(raw.get())
            .map(|text| char_count(&text))
            .map_err(|_| Skip::NoMessages),
    }
}

#[derive(Deserialize, Default)]
struct ItemFields<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    role: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
    #[serde(borrow, default)]
    summary: Option<Vec<SummaryPart<'a>>>,
}

#[derive(Deserialize)]
struct SummaryPart<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PartFields<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    refusal: Option<Cow<'a, str>>,
}

pub(super) fn parse(body: &str, max_items: usize) -> Result<Parsed<'_>, Skip> {
    match parse_split(body, max_items) {
        Some(parsed) => Ok(parsed),
        None => parse_plain(body, max_items),
    }
}

/// [`parse`] the plain way: serde reads the whole body, then each item.
fn parse_plain(body: &str, max_items: usize) -> Result<Parsed<'_>, Skip> {
    let [input, instructions, previous] = top_fields(body, TOP_FIELDS)?;
    let instructions_chars = outside_of(instructions, previous)?;
    let raw = input.ok_or(Skip::NoMessages)?;
    if raw.get().starts_with('"') {
        // A single string: nothing to compact, all of it counts.
        let text: Cow<str> = serde_json::from_str(raw.get()).map_err(|_| Skip::NoMessages)?;
        return Ok(Parsed {
            format: Format::Responses,
            conversation: Conversation {
                outside_chars: instructions_chars + char_count(&text),
                ..Conversation::default()
            },
            body,
            array_span: span(body, raw.get()),
            wire: Vec::new(),
            carried: Default::default(),
        });
    }
    let items = array_field(input)?.ok_or(Skip::NoMessages)?;
    let array_span = span(body, raw.get());
    let items = items.into_iter().map(RawValue::get).collect();
    let start = Start::default();
    read_items(
        body,
        items,
        array_span,
        instructions_chars,
        max_items,
        start,
    )
    .map(|(p, _)| p)
}

/// [`parse`] with the items found by [`split`]: serde reads each byte
/// once. `None` when anything fails or the input is one string, for the
/// plain way.
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
    let (array, instructions_chars) = split::split_body_from(body, "input", at, |outside| {
        let [input, instructions, previous] = read_top(outside, TOP_FIELDS).ok()?;
        Some((input?, outside_of(instructions, previous).ok()?))
    })?;
    read_items(
        body,
        array.elements,
        array.span,
        instructions_chars,
        max_items,
        start,
    )
    .ok()
}

/// Reads the items (`items`, each one's text in `body`) of the array at
/// `array_span` into the neutral model, after the items `start` holds
/// (`items` are the ones after them), and the loop's state at the end;
/// `instructions_chars` count outside.
fn read_items<'a>(
    body: &'a str,
    items: Vec<&'a str>,
    array_span: std::ops::Range<usize>,
    instructions_chars: usize,
    max_items: usize,
    start: Start<'a>,
) -> Result<(Parsed<'a>, ReadState), Skip> {
    let first = start.items.len();
    let count = first + items.len();
    if count > max_items {
        return Err(Skip::TooManyMessages(count, max_items));
    }
    let mut conversation = Conversation {
        items: start.items,
        outside_chars: instructions_chars,
    };
    conversation.items.reserve(items.len());

    let mut wire = start.wire;
    wire.reserve(items.len());
    // call_id -> group of the model turn that made the call
    let mut open_calls: std::collections::HashMap<String, u32> = start.state.open_calls;
    // The group of the model turn being read (consecutive calls share it).
    let mut turn_group: Option<u32> = start.state.turn_group;
    // Reasoning items waiting for the item they belong with.
    let mut reasoning: Vec<usize> = start.state.reasoning;
    let mut before_last = None;
    for (i, raw) in (first..).zip(items) {
        let last = i + 1 == count;
        if last {
            before_last = Some(Box::new(ReadState {
                open_calls: open_calls.clone(),
                turn_group,
                reasoning: reasoning.clone(),
                ..ReadState::default()
            }));
        }
        if !raw.starts_with('{') {
            return Err(Skip::UnsupportedMessage(i, "not an object"));
        }
        let f = item_fields(raw).ok_or(Skip::UnsupportedMessage(i, "not an item"))?;
        let mut w = WireItem {
            span: span(body, raw),
            ..WireItem::default()
        };
        let kind = f.kind.as_deref().unwrap_or("message");
        let mut item = Item::new(Role::User, "");
        let mut in_turn = false;
        match kind {
            "message" => {
                let role = f
                    .role
                    .as_deref()
                    .and_then(Role::parse)
                    .filter(|r| {
                        matches!(
                            r,
                            Role::System | Role::Developer | Role::User | Role::Assistant
                        )
                    })
                    .ok_or(Skip::UnsupportedMessage(i, "unknown role"))?;
                item.role = role;
                if let Some(content) = f.content {
                    read_content(body, content, &mut w, &mut item)
                        .map_err(|why| Skip::UnsupportedMessage(i, why))?;
                }
            }
            "function_call" => {
                item.role = Role::Assistant;
                let args = f.arguments.and_then(|a| string_at(body, a));
                w.arguments.push(
                    args.as_ref()
                        .map(|(s, _)| (s.clone(), ArgumentsForm::Encoded)),
                );
                let name = f.name.as_deref().unwrap_or_default().to_owned();
                let arguments = args.map(|(_, a)| a.into_owned()).unwrap_or_default();
                item.fixed_chars = char_count(&name) + char_count(&arguments);
                let id = f.call_id.as_deref().unwrap_or_default().to_owned();
                let g = *turn_group.get_or_insert(i as u32);
                open_calls.insert(id.clone(), g);
                item.group = Some(g);
                item.tool_calls.push(ToolCall {
                    id,
                    name,
                    arguments,
                });
                in_turn = true;
            }
            "function_call_output" => {
                item.role = Role::Tool;
                let id = f.call_id.as_deref().unwrap_or_default();
                item.answers = Some(id.to_owned());
                item.group = open_calls.get(id).copied();
                if let Some(output) = f.output {
                    read_content(body, output, &mut w, &mut item)
                        .map_err(|why| Skip::UnsupportedMessage(i, why))?;
                }
            }
            "reasoning" => {
                item.role = Role::Assistant;
                item.fixed_chars = f
                    .summary
                    .iter()
                    .flatten()
                    .map(|p| p.text.as_deref().map_or(0, char_count))
                    .sum();
                reasoning.push(i);
                in_turn = turn_group.is_some();
            }
            "compaction" => {
                // The provider's summary: it reads the input from here on.
                item.role = Role::Assistant;
                item.provider_compaction = true;
                item.fix(HOLDS_COMPACTION);
                item.fixed_chars = raw.len();
            }
            "compaction_trigger" if last => {
                return Err(Skip::ProviderCompaction("a compaction_trigger item"));
            }
            "item_reference" => {
                // The item it names is the server's: its size is unknown.
                item.role = Role::Assistant;
                item.fix("an item_reference, kept in place");
            }
            _ => {
                // Types this format does not read.
                item.role = Role::Assistant;
                item.fix(UNKNOWN_KEPT_WHOLE);
                item.fixed_chars = raw.len();
            }
        }
        // A fixed item's bytes go as they came.
        w.sealed = item.fixed;
        if !in_turn {
            turn_group = None;
        }
        item.text = w.text();
        conversation.items.push(item);
        wire.push(w);
        if kind != "reasoning" && !reasoning.is_empty() {
            // Reasoning goes with this item: join its group, or make one.
            let g = match conversation.items[i].group {
                Some(g) => g,
                None => {
                    conversation.items[i].group = Some(reasoning[0] as u32);
                    reasoning[0] as u32
                }
            };
            for r in reasoning.drain(..) {
                conversation.items[r].group = Some(g);
            }
        }
    }
    for &r in &reasoning {
        // Trailing reasoning belongs with nothing yet: keep it.
        conversation.items[r].fix("reasoning with no item after it yet");
    }
    conversation.read_from_latest_compaction();
    let state = ReadState {
        open_calls,
        turn_group,
        reasoning,
        before_last,
        ..ReadState::default()
    };
    let parsed = Parsed {
        format: Format::Responses,
        conversation,
        body,
        array_span,
        wire,
        carried: Default::default(),
    };
    Ok((parsed, state))
}

/// Item types this format reads.
const KNOWN_ITEMS: [&str; 6] = [
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "compaction",
    "compaction_trigger",
];

/// An item's fields; an item of a type this format does not read whose
/// fields it cannot read either is its type alone (kept whole).
fn item_fields(raw: &str) -> Option<ItemFields<'_>> {
    if let Ok(fields) = serde_json::from_str::<ItemFields>(raw) {
        return Some(fields);
    }
    let [kind] = read_top(raw, ["type"]).ok()?;
    let kind: Cow<str> = serde_json::from_str(kind?.get()).ok()?;
    (!KNOWN_ITEMS.contains(&kind.as_ref())).then(|| ItemFields {
        kind: Some(kind),
        ..ItemFields::default()
    })
}

/// Message content or a call's output: a string, or parts.
fn read_content<'a>(
    body: &'a str,
    content: &'a RawValue,
    w: &mut WireItem<'a>,
    item: &mut Item,
) -> Result<(), &'static str> {
    const NOT_CONTENT: &str = "content is not a string or array";
    let raw = content.get();
    match raw.as_bytes().first() {
        Some(b'"') => w.push_text(body, content, None).ok_or("bad string"),
        Some(b'[') => {
            for (element, raw) in
                w.open_array(body, raw, NOT_CONTENT, "a content part is not an object")?
            {
                let unknown = |item: &mut Item| {
                    item.fixed_chars += raw.len();
                    item.fix(UNKNOWN_KEPT_WHOLE);
                };
                let Ok(p) = serde_json::from_str::<PartFields>(raw) else {
                    unknown(item);
                    continue;
                };
                match p.kind.as_ref() {
                    "input_text" | "output_text" => {
                        if p.text
                            .and_then(|t| w.push_text(body, t, Some(element)))
                            .is_none()
                        {
                            unknown(item);
                        }
                    }
                    "refusal" => item.fixed_chars += p.refusal.as_deref().map_or(0, char_count),
                    kind if MEDIA_PARTS.contains(&kind) => {}
                    _ => unknown(item),
                }
            }
            Ok(())
        }
        Some(b'n') => Ok(()),
        _ => Err(NOT_CONTENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(body: &serde_json::Value) -> Result<Conversation, Skip> {
        let bytes = serde_json::to_vec(body).unwrap();
        Format::Responses
            .parse(&bytes, usize::MAX)
            .map(|p| p.conversation)
    }

    #[test]
    fn calls_outputs_and_reasoning_group_by_turn() {
        let c = parse(&json!({"instructions": "be kind", "input": [
            {"role": "user", "content": "read both"},
            {"type": "reasoning", "id": "r1", "summary": [{"type": "summary_text", "text": "plan"}]},
            {"type": "function_call", "call_id": "a", "name": "read", "arguments": "{\"p\":1}"},
            {"type": "function_call", "call_id": "b", "name": "read", "arguments": "{\"p\":2}"},
            {"type": "function_call_output", "call_id": "a", "output": "AAA"},
            {"type": "function_call_output", "call_id": "b", "output": [{"type": "input_text", "text": "BBB"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done", "annotations": []}]},
            {"type": "item_reference", "id": "x"}
        ]}))
        .unwrap();
        assert_eq!(c.outside_chars, 7);
        let groups: Vec<Option<u32>> = c.items.iter().map(|i| i.group).collect();
        assert_eq!(groups[1], groups[2]);
        assert_eq!(groups[2], groups[3]);
        assert_eq!(groups[3], groups[4]);
        assert_eq!(groups[4], groups[5]);
        assert!(groups[1].is_some());
        assert_eq!(groups[6], None);
        assert_eq!(c.items[4].text, "AAA");
        assert_eq!(c.items[5].text, "BBB");
        assert_eq!(c.items[1].fixed_chars, 4);
        assert!(c.items[7].fixed);
        assert_eq!(c.items[2].fixed_chars, 4 + 7);
    }

    #[test]
    fn a_model_turn_of_reasoning_a_message_and_calls_is_one_turn() {
        let c = parse(&json!({"input": [
            {"role": "user", "content": "read it"},
            {"type": "reasoning", "id": "r1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading."}]},
            {"type": "function_call", "call_id": "a", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "AAA"}
        ]}))
        .unwrap();
        // The previous request was the user's message alone.
        assert_eq!(crate::compaction::stable::previous_turn_end(&c), 1);
    }

    #[test]
    fn server_state_and_string_input() {
        assert_eq!(
            parse(&json!({"previous_response_id": "resp_1", "input": []})).unwrap_err(),
            Skip::ServerState
        );
        let c = parse(&json!({"input": "hello", "instructions": "x"})).unwrap();
        assert!(c.items.is_empty());
        assert_eq!(c.total_chars(), 6);
        let c =
            parse(&json!({"input": [{"role": "user", "content": [{"type": "mystery"}]}]})).unwrap();
        assert!(c.items[0].fixed, "an unknown part: kept whole");
        assert_eq!(c.items[0].fixed_chars, r#"{"type":"mystery"}"#.len());
    }

    #[test]
    fn compaction_items_count_from_the_latest_and_a_trigger_is_the_providers() {
        let compaction =
            json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAB"});
        let c = parse(&json!({"input": [
            {"role": "user", "content": "old task"},
            {"type": "function_call", "call_id": "a", "name": "read", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "a", "output": "old output"},
            compaction.clone(),
            {"role": "user", "content": "go on"}
        ]}))
        .unwrap();
        assert!(c.items[..4].iter().all(|i| i.fixed));
        assert!(c.items[3].provider_compaction);
        assert_eq!(c.items[..3].iter().map(Item::chars).sum::<usize>(), 0);
        assert_eq!(
            c.total_chars(),
            serde_json::to_string(&compaction).unwrap().len() + "go on".len()
        );
        assert_eq!(
            parse(&json!({"input": [
                {"role": "user", "content": "old task"},
                {"type": "compaction_trigger"}
            ]}))
            .unwrap_err()
            .reason(),
            "provider-compaction"
        );
        // An item of a type this format does not know whose fields do not
        // read either is kept whole; a known one whose fields do not read
        // is no Responses item.
        let c = parse(&json!({"input": [{"type": "web_search_call", "name": {"a": 1}}]})).unwrap();
        assert!(c.items[0].fixed);
        assert!(parse(&json!({"input": [{"type": "function_call", "name": {"a": 1}}]})).is_err());
    }

    /// Pieces of Responses bodies, tricky for a scan that splits the
    /// items (see the chat tests).
    const PIECES: [&str; 11] = [
        r#"{"role":"user","content":"hi ], } \" \\"}"#,
        r#" { "type" : "message", "role" : "assistant" , "content" : [{"type":"output_text","text":"é 😀 \u00e9"}] } "#,
        r#"{"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":[\"]\"]}"}"#,
        r#"{"type":"function_call_output","call_id":"c1","output":"[1, 2]"}"#,
        r#"{"type":"reasoning","id":"r1","summary":[]}"#,
        r#"{"role":"user","content":[{"type":"input_image","image_url":"data:,"},{"type":"input_text","text":"x"}]}"#,
        r#"{"type":"mystery"}"#,
        r#"[1]"#,
        "null",
        r#"{"role":"user","content":"a","content":"b"}"#,
        r#"{"role":"user","content":"\\\""}"#,
    ];
    const TOP_FIELDS: [&str; 7] = [
        r#""model":"gpt-5""#,
        r#""instructions":"Be [terse], \"brief\".""#,
        r#""instructions":5"#,
        r#""previous_response_id":"resp_1""#,
        r#""previous_response_id":null"#,
        r#""input":"one string""#,
        r#""tools":[{"type":"function","name":"input","parameters":{"input":[]}}]"#,
    ];

    split::testing::split_agreement!("input", PIECES, TOP_FIELDS);
}
