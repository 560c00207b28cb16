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
//!   as they are: never dropped or cut, counted as zero.
//!
//! A request with `previous_response_id` carries only new items (the
//! conversation is held by the server): it is forwarded as received.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::splice::{span, string_at, ArgumentsForm, WireItem};
use super::split;
use super::{top_array_span, top_level, Conversation, Format, Item, Parsed, Skip, ToolCall};
use crate::engine::text::char_count;
use crate::engine::Role;

const MEDIA_PARTS: [&str; 3] = ["input_image", "input_file", "input_audio"];

#[derive(Deserialize)]
struct TopFields<'a> {
    #[serde(borrow, default)]
    input: Option<Input<'a>>,
    #[serde(borrow, default)]
    instructions: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    previous_response_id: Option<&'a RawValue>,
}

/// The top level outside the input list, which [`split`] replaced by `[]`.
#[derive(Deserialize)]
struct Outside<'a> {
    #[serde(borrow)]
    input: &'a RawValue,
    #[serde(borrow, default)]
    instructions: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    previous_response_id: Option<&'a RawValue>,
}

/// `input`: one string (nothing to compact) or the item list, whose items
/// are found in the body's own pass, as chat's messages are. Any other
/// value fails the top level's read: not a Responses request.
enum Input<'a> {
    Text(Cow<'a, str>),
    Items(Vec<&'a RawValue>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Input<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> serde::de::Visitor<'de> for Visit<'a> {
            type Value = Input<'a>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or an array of items")
            }

            fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Self::Value, E> {
                Ok(Input::Text(Cow::Borrowed(text)))
            }

            fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
                Ok(Input::Text(Cow::Owned(text.to_owned())))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    items.push(item);
                }
                Ok(Input::Items(items))
            }
        }
        deserializer.deserialize_any(Visit(std::marker::PhantomData))
    }
}

#[derive(Deserialize)]
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
    let top: TopFields = top_level(body)?;
    if top.previous_response_id.is_some_and(|p| p.get() != "null") {
        return Err(Skip::ServerState);
    }
    let input = top.input.ok_or(Skip::NoMessages)?;
    let instructions_chars = top.instructions.as_deref().map_or(0, char_count);
    let items = match input {
        Input::Text(text) => {
            // A single string: nothing to compact, all of it counts.
            return Ok(Parsed {
                format: Format::Responses,
                conversation: Conversation {
                    outside_chars: instructions_chars + char_count(&text),
                    ..Conversation::default()
                },
                body,
                array_span: top_array_span(body, "input", &[])?,
                wire: Vec::new(),
            });
        }
        Input::Items(items) => items,
    };
    let array_span = top_array_span(body, "input", &items)?;
    let items = items.into_iter().map(RawValue::get).collect();
    read_items(body, items, array_span, instructions_chars, max_items)
}

/// [`parse`] with the items found by [`split`]: serde reads each byte
/// once. `None` when anything fails or the input is one string, for the
/// plain way.
fn parse_split(body: &str, max_items: usize) -> Option<Parsed<'_>> {
    let (array, instructions_chars) = split::split_body(body, "input", |outside| {
        let top: Outside = serde_json::from_str(outside).ok()?;
        if top.previous_response_id.is_some_and(|p| p.get() != "null") {
            return None;
        }
        Some((top.input, top.instructions.as_deref().map_or(0, char_count)))
    })?;
    read_items(
        body,
        array.elements,
        array.span,
        instructions_chars,
        max_items,
    )
    .ok()
}

/// Reads the items (`items`, each one's text in `body`) of the array at
/// `array_span` into the neutral model; `instructions_chars` count outside.
fn read_items<'a>(
    body: &'a str,
    items: Vec<&'a str>,
    array_span: std::ops::Range<usize>,
    instructions_chars: usize,
    max_items: usize,
) -> Result<Parsed<'a>, Skip> {
    if items.len() > max_items {
        return Err(Skip::TooManyMessages(items.len(), max_items));
    }
    let mut conversation = Conversation {
        items: Vec::with_capacity(items.len()),
        outside_chars: instructions_chars,
    };

    let mut wire = Vec::with_capacity(items.len());
    // call_id -> group of the model turn that made the call
    let mut open_calls: std::collections::HashMap<String, u32> = Default::default();
    // The group of the model turn being read (consecutive calls share it).
    let mut turn_group: Option<u32> = None;
    // Reasoning items waiting for the item they belong with.
    let mut reasoning: Vec<usize> = Vec::new();
    for (i, raw) in items.into_iter().enumerate() {
        if !raw.starts_with('{') {
            return Err(Skip::UnsupportedMessage(i, "not an object"));
        }
        let f: ItemFields =
            serde_json::from_str(raw).map_err(|_| Skip::UnsupportedMessage(i, "not an item"))?;
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
            _ => {
                // item_reference and types this format does not read.
                item.role = Role::Assistant;
                item.fixed = true;
            }
        }
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
    for r in reasoning {
        // Trailing reasoning belongs with nothing yet: keep it.
        conversation.items[r].fixed = true;
    }
    Ok(Parsed {
        format: Format::Responses,
        conversation,
        body,
        array_span,
        wire,
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
                let p: PartFields =
                    serde_json::from_str(raw).map_err(|_| "a content part has no string type")?;
                match p.kind.as_ref() {
                    "input_text" | "output_text" => p
                        .text
                        .and_then(|t| w.push_text(body, t, Some(element)))
                        .ok_or("a text part without text")?,
                    "refusal" => item.fixed_chars += p.refusal.as_deref().map_or(0, char_count),
                    kind if MEDIA_PARTS.contains(&kind) => {}
                    _ => return Err("unknown content part type"),
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
        assert_eq!(
            parse(&json!({"input": [{"role": "user", "content": [{"type": "mystery"}]}]}))
                .unwrap_err()
                .reason(),
            "unsupported-message"
        );
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
