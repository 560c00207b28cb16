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
//! Any other block type is refused (`unsupported-message`).

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::splice::{span, ArgumentsForm, Marker, WireItem};
use super::split;
use super::{top_array_span, top_level, Conversation, Format, Item, Parsed, Skip, ToolCall};
use crate::engine::text::char_count;
use crate::engine::Role;

const MEDIA_BLOCKS: [&str; 2] = ["image", "document"];

/// The top level; the messages read as the array they must be in the same
/// pass as the body.
#[derive(Deserialize)]
struct TopFields<'a> {
    #[serde(borrow)]
    messages: Option<Vec<&'a RawValue>>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
}

/// The top level outside the messages, which [`split`] replaced by `[]`.
#[derive(Deserialize)]
struct Outside<'a> {
    #[serde(borrow)]
    messages: &'a RawValue,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
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
    let top: TopFields = top_level(body)?;
    let items = top.messages.ok_or(Skip::NoMessages)?;
    let array_span = top_array_span(body, "messages", &items)?;
    let system = top.system.map(system_chars);
    let items = items.into_iter().map(RawValue::get).collect();
    read_messages(body, items, array_span, system, max_items)
}

/// [`parse`] with the messages found by [`split`]: serde reads each byte
/// once. `None` when anything fails, for the plain way to find out why.
fn parse_split(body: &str, max_items: usize) -> Option<Parsed<'_>> {
    let (array, system) = split::split_body(body, "messages", |outside| {
        let top: Outside = serde_json::from_str(outside).ok()?;
        Some((top.messages, top.system.map(system_chars)))
    })?;
    read_messages(body, array.elements, array.span, system, max_items).ok()
}

/// Reads the messages (`items`, each one's text in `body`) of the array at
/// `array_span` into the neutral model; `system` is the top-level system
/// prompt's chars when there is one (`Some(None)`: not a valid one).
fn read_messages<'a>(
    body: &'a str,
    items: Vec<&'a str>,
    array_span: std::ops::Range<usize>,
    system: Option<Option<usize>>,
    max_items: usize,
) -> Result<Parsed<'a>, Skip> {
    if items.len() > max_items {
        return Err(Skip::TooManyMessages(items.len(), max_items));
    }
    let mut conversation = Conversation {
        items: Vec::with_capacity(items.len()),
        outside_chars: match system {
            None => 0,
            Some(chars) => chars.ok_or(Skip::NoMessages)?,
        },
    };

    let mut wire = Vec::with_capacity(items.len());
    // tool_use id -> group of the assistant message that made the call
    // (hashed: a message may hold thousands of calls, and each result
    // looks its id up)
    let mut open_calls: HashMap<String, u32> = HashMap::new();
    for (i, raw) in items.into_iter().enumerate() {
        if !raw.starts_with('{') {
            return Err(Skip::UnsupportedMessage(i, "not an object"));
        }
        let fields: MessageFields = serde_json::from_str(raw)
            .map_err(|_| Skip::UnsupportedMessage(i, "not an object with role and content"))?;
        let assistant = match fields.role.as_ref() {
            "user" => false,
            "assistant" => true,
            _ => return Err(Skip::UnsupportedMessage(i, "unknown role")),
        };
        let mut item = Item::new(
            if assistant {
                Role::Assistant
            } else {
                Role::User
            },
            "",
        );
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
                    let b: BlockFields = serde_json::from_str(raw).map_err(|_| {
                        Skip::UnsupportedMessage(i, "a content block has no string type")
                    })?;
                    if let Some(marker) = b.cache_control {
                        w.markers.push(Marker {
                            value: marker.get(),
                            element,
                        });
                    }
                    match b.kind.as_ref() {
                        "text" => {
                            b.text
                                .and_then(|t| w.push_text(body, t, Some(element)))
                                .ok_or(Skip::UnsupportedMessage(i, "a text block without text"))?;
                            others += 1;
                        }
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
                                read_result_content(body, c, &mut w)
                                    .map_err(|why| Skip::UnsupportedMessage(i, why))?;
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
                        kind if MEDIA_BLOCKS.contains(&kind) => others += 1,
                        _ => return Err(Skip::UnsupportedMessage(i, "unknown content block type")),
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
        if !assistant && results > 0 && others == 0 {
            item.role = Role::Tool;
        }
        item.text = w.text();
        if item.role == Role::Tool && w.texts.len() > 1 && piece_answers.len() == w.texts.len() {
            item.piece_chars = w.texts.iter().map(|t| char_count(&t.text)).collect();
            item.piece_answers = piece_answers;
        }
        conversation.items.push(item);
        wire.push(w);
    }
    Ok(Parsed {
        format: Format::Anthropic,
        conversation,
        body,
        array_span,
        wire,
    })
}

/// A tool result's content: a string, or blocks whose text counts.
fn read_result_content<'a>(
    body: &'a str,
    content: &'a RawValue,
    w: &mut WireItem<'a>,
) -> Result<(), &'static str> {
    let raw = content.get();
    match raw.as_bytes().first() {
        Some(b'"') => w.push_text(body, content, None).ok_or("bad string"),
        Some(b'[') => {
            let blocks = w.open_array(
                body,
                raw,
                "tool_result content is not a string or array",
                "a tool_result block is not an object",
            )?;
            for (element, raw) in blocks {
                let b: BlockFields =
                    serde_json::from_str(raw).map_err(|_| "a tool_result block has no type")?;
                if let Some(marker) = b.cache_control {
                    w.markers.push(Marker {
                        value: marker.get(),
                        element,
                    });
                }
                match b.kind.as_ref() {
                    "text" => b
                        .text
                        .and_then(|t| w.push_text(body, t, Some(element)))
                        .ok_or("a text block without text")?,
                    kind if MEDIA_BLOCKS.contains(&kind) => {}
                    _ => return Err("unknown tool_result block type"),
                }
            }
            Ok(())
        }
        Some(b'n') => Ok(()),
        _ => Err("tool_result content is not a string or array"),
    }
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
    fn unknown_blocks_skip_the_body() {
        let body =
            br#"{"messages":[{"role":"user","content":[{"type":"server_tool_use","id":"x"}]}]}"#;
        assert_eq!(
            Format::Anthropic.parse(body, 10).unwrap_err().reason(),
            "unsupported-message"
        );
        let body = br#"{"messages":[{"role":"system","content":"x"}]}"#;
        assert_eq!(
            Format::Anthropic.parse(body, 10).unwrap_err().reason(),
            "unsupported-message"
        );
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
