//! OpenAI chat completions: `messages` is compacted; every other field keeps
//! its bytes.
//!
//! Mapping to the neutral model:
//! - text = the string content, or the text parts of array content joined
//!   with nothing between them; image, audio and file parts count zero and
//!   are never touched; a refusal part counts as fixed chars. A message
//!   holding any other part type is kept whole, in place, the unknown part
//!   counted by its bytes.
//! - tool-call names and arguments (custom tools' `input`, and legacy
//!   `function_call`) count as fixed chars: they weigh on the budget but are
//!   never trimmed.
//! - an assistant message with `tool_calls` and the `tool` messages answering
//!   it form one group, kept or dropped together; likewise a legacy
//!   `function_call` and the `function` message after it.

use std::borrow::Cow;
use std::collections::HashMap;

use serde::Deserialize;
use serde_json::value::RawValue;

use super::resume::{ReadState, Resume, Start};
use super::splice::{span, string_at, ArgumentsForm, WireItem};
use super::split;
use super::{
    array_field, read_top, top_fields, Conversation, Format, Item, Parsed, Skip, ToolCall,
    UNKNOWN_KEPT_WHOLE,
};
use crate::engine::text::char_count;
use crate::engine::Role;

/// Part types that hold no text and count zero.
const MEDIA_PARTS: [&str; 4] = ["image_url", "input_audio", "file", "audio"];

#[derive(Deserialize)]
struct MessageFields<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<WireToolCall<'a>>>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function_call: Option<FunctionCall<'a>>,
}

#[derive(Deserialize)]
struct WireToolCall<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow, default)]
    function: Option<FunctionCall<'a>>,
    /// `"type": "custom"` tools carry free-form `input` instead of arguments.
    #[serde(borrow, default)]
    custom: Option<CustomCall<'a>>,
}

#[derive(Deserialize)]
struct CustomCall<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct FunctionCall<'a> {
    #[serde(borrow, default)]
    name: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
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

/// [`parse`] the plain way: serde reads the whole body, then each message.
fn parse_plain(body: &str, max_items: usize) -> Result<Parsed<'_>, Skip> {
    let [messages] = top_fields(body, ["messages"])?;
    let raw = messages.ok_or(Skip::NoMessages)?;
    let items = array_field(messages)?.ok_or(Skip::NoMessages)?;
    let array_span = span(body, raw.get());
    let items = items.into_iter().map(RawValue::get).collect();
    read_messages(body, items, array_span, max_items, Start::default()).map(|(p, _)| p)
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
    let (array, ()) = split::split_body_from(body, "messages", at, |outside| {
        let [messages] = read_top(outside, ["messages"]).ok()?;
        Some((messages?, ()))
    })?;
    read_messages(body, array.elements, array.span, max_items, start).ok()
}

/// Reads the messages (`items`, each one's text in `body`) of the array at
/// `array_span` into the neutral model, after the items `start` holds
/// (`items` are the ones after them), and the loop's state at the end.
fn read_messages<'a>(
    body: &'a str,
    items: Vec<&'a str>,
    array_span: std::ops::Range<usize>,
    max_items: usize,
    start: Start<'a>,
) -> Result<(Parsed<'a>, ReadState), Skip> {
    let first = start.items.len();
    if first + items.len() > max_items {
        return Err(Skip::TooManyMessages(first + items.len(), max_items));
    }

    let mut conversation = Conversation {
        items: start.items,
        ..Conversation::default()
    };
    conversation.items.reserve(items.len());
    let mut wire = start.wire;
    wire.reserve(items.len());
    // tool_call id -> group of the assistant message that made the call
    // (hashed: a message may hold thousands of calls, and each tool
    // message looks its id up)
    let mut open_calls: HashMap<String, u32> = start.state.open_calls;
    let mut function_group: Option<u32> = start.state.function_group;
    let count = first + items.len();
    let mut before_last = None;
    for (i, raw) in (first..).zip(items) {
        if i + 1 == count {
            before_last = Some(Box::new(ReadState {
                open_calls: open_calls.clone(),
                function_group,
                ..ReadState::default()
            }));
        }
        if !raw.starts_with('{') {
            return Err(Skip::UnsupportedMessage(i, "not an object"));
        }
        let fields: MessageFields = serde_json::from_str(raw)
            .map_err(|_| Skip::UnsupportedMessage(i, "not an object with a string role"))?;
        let role = Role::parse(&fields.role).ok_or(Skip::UnsupportedMessage(i, "unknown role"))?;
        let mut item = Item::new(role, String::new());
        let mut w = WireItem {
            span: span(body, raw),
            ..WireItem::default()
        };
        if let Some(content) = fields.content {
            read_content(body, content, &mut w, &mut item)
                .map_err(|why| Skip::UnsupportedMessage(i, why))?;
        }
        // Its bytes go as they came.
        w.sealed = item.fixed;

        let calls = fields.tool_calls.unwrap_or_default();
        if !calls.is_empty() {
            let g = i as u32;
            item.group = Some(g);
            open_calls.clear();
            for call in calls {
                let (name, arguments) = match (&call.function, &call.custom) {
                    (Some(f), _) => {
                        let args = f.arguments.and_then(|a| string_at(body, a));
                        w.arguments.push(
                            args.as_ref()
                                .map(|(s, _)| (s.clone(), ArgumentsForm::Encoded)),
                        );
                        (
                            f.name.as_deref().unwrap_or_default().to_owned(),
                            args.map(|(_, a)| a.into_owned()).unwrap_or_default(),
                        )
                    }
                    (None, Some(c)) => {
                        w.arguments.push(None);
                        (
                            c.name.as_deref().unwrap_or_default().to_owned(),
                            c.input.as_deref().unwrap_or_default().to_owned(),
                        )
                    }
                    (None, None) => {
                        w.arguments.push(None);
                        Default::default()
                    }
                };
                item.fixed_chars += char_count(&name) + char_count(&arguments);
                item.tool_calls.push(ToolCall {
                    id: call.id.clone().into_owned(),
                    name,
                    arguments,
                });
                open_calls.insert(call.id.into_owned(), g);
            }
        }
        if let Some(f) = &fields.function_call {
            let args = f.arguments.and_then(|a| string_at(body, a));
            item.fixed_chars += f.name.as_deref().map_or(0, char_count)
                + args.as_ref().map_or(0, |(_, a)| char_count(a));
            item.group = Some(i as u32);
            function_group = item.group;
        }
        match role {
            Role::Tool => {
                item.answers = fields.tool_call_id.as_deref().map(str::to_owned);
                item.group = fields
                    .tool_call_id
                    .as_deref()
                    .and_then(|id| open_calls.get(id))
                    .copied();
            }
            Role::Function => item.group = function_group.take(),
            _ => {}
        }
        item.text = w.text();
        conversation.items.push(item);
        wire.push(w);
    }
    let state = ReadState {
        open_calls,
        function_group,
        before_last,
        ..ReadState::default()
    };
    let parsed = Parsed {
        format: Format::Chat,
        conversation,
        body,
        array_span,
        wire,
        carried: Default::default(),
    };
    Ok((parsed, state))
}

/// Reads string or array content into the item's text pieces.
fn read_content<'a>(
    body: &'a str,
    content: &'a RawValue,
    w: &mut WireItem<'a>,
    item: &mut Item,
) -> Result<(), &'static str> {
    const NOT_CONTENT: &str = "content is not a string, array or null";
    let raw = content.get();
    match raw.as_bytes().first() {
        Some(b'n') => Ok(()),
        Some(b'"') => w.push_text(body, content, None).ok_or(NOT_CONTENT),
        Some(b'[') => {
            for (element, raw) in
                w.open_array(body, raw, NOT_CONTENT, "a content part is not an object")?
            {
                let unknown = |item: &mut Item| {
                    item.fixed_chars += raw.len();
                    item.fix(UNKNOWN_KEPT_WHOLE);
                };
                let Ok(fields) = serde_json::from_str::<PartFields>(raw) else {
                    unknown(item);
                    continue;
                };
                match fields.kind.as_ref() {
                    "text" => {
                        if fields
                            .text
                            .and_then(|t| w.push_text(body, t, Some(element)))
                            .is_none()
                        {
                            unknown(item);
                        }
                    }
                    "refusal" => {
                        item.fixed_chars += fields.refusal.as_deref().map_or(0, char_count);
                    }
                    kind if MEDIA_PARTS.contains(&kind) => {}
                    _ => unknown(item),
                }
            }
            Ok(())
        }
        _ => Err(NOT_CONTENT),
    }
}

/// The chat-completions body model under the name the library has always
/// offered: parse, count, compact and splice in one value.
pub struct ChatBody;

impl ChatBody {
    #[allow(clippy::new_ret_no_self)]
    pub fn parse(body: &[u8]) -> Result<Parsed<'_>, Skip> {
        Format::Chat.parse(body, usize::MAX)
    }

    pub fn parse_limited(body: &[u8], max_messages: usize) -> Result<Parsed<'_>, Skip> {
        Format::Chat.parse(body, max_messages)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{self, text::char_count, Policy, Report};
    use crate::policy::CompiledPolicy;
    use serde_json::{json, Value};

    fn policy(budget: usize, keep_last_n: usize) -> CompiledPolicy {
        let mut p = Policy::with_budget(budget);
        p.keep_last_n = keep_last_n;
        p.max_message_chars = 40;
        CompiledPolicy::plain("test", p)
    }

    fn compact(body: &Value, policy: &CompiledPolicy) -> (Report, Option<Value>) {
        let bytes = serde_json::to_vec(body).unwrap();
        let parsed = ChatBody::parse(&bytes).unwrap();
        let (report, out) = parsed.compact(policy);
        (
            report,
            out.map(|s| serde_json::from_str(&s).expect("forwarded body is JSON")),
        )
    }

    #[test]
    fn skips_name_their_reason() {
        assert_eq!(
            ChatBody::parse(b"{\"messages\": [").unwrap_err(),
            Skip::InvalidJson
        );
        assert_eq!(ChatBody::parse(b"\xff").unwrap_err(), Skip::InvalidJson);
        assert_eq!(ChatBody::parse(b"[1]").unwrap_err(), Skip::NoMessages);
        assert_eq!(
            ChatBody::parse(b"{\"model\": \"x\"}").unwrap_err(),
            Skip::NoMessages
        );
        assert_eq!(
            ChatBody::parse(b"{\"messages\": {}}").unwrap_err(),
            Skip::NoMessages
        );
        assert_eq!(
            ChatBody::parse(br#"{"messages": [{"role": "critic", "content": "x"}]}"#)
                .unwrap_err()
                .reason(),
            "unsupported-message"
        );
        assert_eq!(
            ChatBody::parse(br#"{"messages": [{"role": "user", "content": 5}]}"#)
                .unwrap_err()
                .reason(),
            "unsupported-message"
        );
    }

    #[test]
    fn fields_outside_messages_keep_their_bytes() {
        let body = br#"{"model":"m",  "temperature": 1.50, "messages": [{"role":"user","content":"aaaa aaaa aaaa"},{"role":"user","content":"bbbb"}], "z": {"k": [1e3]}}"#;
        let parsed = ChatBody::parse(body).unwrap();
        let (_, out) = parsed.compact(&policy(5, 1));
        assert_eq!(
            out.unwrap(),
            r#"{"model":"m",  "temperature": 1.50, "messages": [{"role":"user","content":"bbbb"}], "z": {"k": [1e3]}}"#
        );
    }

    #[test]
    fn a_body_within_budget_is_not_rewritten() {
        let body = json!({"messages": [{"role": "user", "content": "hello"}]});
        assert!(compact(&body, &policy(100, 0)).1.is_none());
    }

    #[test]
    fn tool_calls_and_their_results_go_together() {
        let body = json!({"messages": [
            {"role": "system", "content": "sys"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "read", "arguments": "{}"}},
                {"id": "b", "type": "function", "function": {"name": "grep", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "x".repeat(30)},
            {"role": "tool", "tool_call_id": "b", "content": "y".repeat(30)},
            {"role": "user", "content": "next question please"},
        ]});
        let (report, out) = compact(&body, &policy(40, 1));
        let out = out.unwrap();
        let roles: Vec<&str> = out["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        assert_eq!(roles, ["system", "user"], "{report:?}");
        assert_eq!(report.stages.drop.dropped.len(), 3);
    }

    #[test]
    fn a_protected_tool_result_protects_its_call() {
        let body = json!({"messages": [
            {"role": "user", "content": "u".repeat(50)},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "result"},
        ]});
        let (_, out) = compact(&body, &policy(20, 1));
        let out = out.unwrap();
        let msgs = out["messages"].as_array().unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(msgs[0]["tool_calls"][0]["id"], "a");
        assert_eq!(msgs[1]["tool_call_id"], "a");
    }

    #[test]
    fn tool_call_arguments_count_but_are_never_cut() {
        let args = "{\"path\": \"src/main.rs\"}";
        let body = json!({"messages": [
            {"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "read", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "a", "content": "ok"},
        ]});
        let bytes = serde_json::to_vec(&body).unwrap();
        let parsed = ChatBody::parse(&bytes).unwrap();
        let messages = parsed.engine_messages(&policy(1, 0));
        assert_eq!(messages[0].fixed_chars, 4 + args.chars().count());
        assert_eq!(messages[0].group, messages[1].group);
        assert!(messages[0].group.is_some());
    }

    #[test]
    fn array_content_trims_text_parts_and_leaves_images_alone() {
        let image =
            json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}});
        let body = json!({"messages": [
            {"role": "user", "content": [
                {"type": "text", "text": "First sentence here. Second sentence is much longer"},
                image.clone(),
                {"type": "text", "text": "a trailing part that will be cut off entirely"},
            ]},
            {"role": "user", "content": "last"},
        ]});
        let (report, out) = compact(&body, &policy(30, 1));
        let out = out.unwrap();
        let parts = out["messages"][0]["content"].as_array().unwrap();
        assert_eq!(report.stages.trim.trimmed[0].cut, engine::Cut::Sentence);
        assert_eq!(parts.len(), 2, "{parts:?}");
        assert_eq!(parts[0]["text"], "First sentence here.");
        assert_eq!(parts[1], image);
    }

    #[test]
    fn total_chars_is_what_the_engine_counts() {
        let body = serde_json::to_vec(&json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "héllo"}, {"type": "image_url", "image_url": {"url": "u"}}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "a", "content": "配送🚚"},
        ]}))
        .unwrap();
        let chat = ChatBody::parse(&body).unwrap();
        let report = engine::compact(
            &chat.engine_messages(&policy(1000, 0)),
            &Policy::with_budget(1000),
        );
        assert_eq!(chat.total_chars(), report.loss.input_chars);
        assert_eq!(chat.total_chars(), 5 + 3 + 3);
    }

    #[test]
    fn only_objects_are_bodies_messages_and_parts() {
        let long = "hello there, this is long";
        assert_eq!(
            ChatBody::parse(format!(r#"[[{{"role":"user","content":"{long}"}}]]"#).as_bytes())
                .unwrap_err(),
            Skip::NoMessages
        );
        assert_eq!(
            ChatBody::parse(format!(r#"{{"messages":[["user","{long}"]]}}"#).as_bytes())
                .unwrap_err(),
            Skip::UnsupportedMessage(0, "not an object")
        );
        let body = format!(r#"{{"messages":[{{"role":"user","content":[["text","{long}"]]}}]}}"#);
        assert_eq!(
            ChatBody::parse(body.as_bytes()).unwrap_err().reason(),
            "unsupported-message",
            "an array part is not a part"
        );
    }

    #[test]
    fn custom_tool_call_input_counts_as_fixed_chars() {
        let body = json!({"messages": [
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c", "type": "custom", "custom": {"name": "sh", "input": "ls -la"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"},
        ]});
        let bytes = serde_json::to_vec(&body).unwrap();
        let m = ChatBody::parse(&bytes)
            .unwrap()
            .engine_messages(&policy(1, 0));
        assert_eq!(m[0].fixed_chars, 2 + 6);
        assert_eq!(m[0].group, m[1].group);
    }

    #[test]
    fn images_count_zero_chars() {
        let body = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "text", "text": "héllo"}]}]});
        let bytes = serde_json::to_vec(&body).unwrap();
        let m = ChatBody::parse(&bytes)
            .unwrap()
            .engine_messages(&policy(1, 0));
        assert_eq!(char_count(&m[0].content) + m[0].fixed_chars, 5);
    }

    #[test]
    fn pins_first_user_message_and_patterns() {
        let mut p = policy(1, 0);
        p.pin_first_user = true;
        p.pin_patterns = RegexSet::new(["(?i)must not"]).unwrap();
        let body = json!({"messages": [
            {"role": "system", "content": "s"},
            {"role": "user", "content": "the task"},
            {"role": "user", "content": "You MUST NOT touch prod"},
            {"role": "user", "content": "chatter"},
        ]});
        let bytes = serde_json::to_vec(&body).unwrap();
        let pins: Vec<bool> = ChatBody::parse(&bytes)
            .unwrap()
            .engine_messages(&p)
            .iter()
            .map(|m| m.pin)
            .collect();
        assert_eq!(pins, [false, true, true, false]);
    }

    #[test]
    fn escaped_strings_are_read_and_rewritten_as_json() {
        let body = br#"{"messages":[{"role":"user","content":"Line one.\nQuote: \"x\" \u00e9 and much more text follows here"},{"role":"user","content":"z"}]}"#;
        let parsed = ChatBody::parse(body).unwrap();
        let (report, out) = parsed.compact(&policy(45, 1));
        assert_eq!(report.messages[0].index, 0);
        let out: Value = serde_json::from_str(&out.unwrap()).unwrap();
        let kept = report.messages[0].content.clone();
        assert_eq!(out["messages"][0]["content"], kept);
        assert!("Line one.\nQuote: \"x\" é and much more text follows here".starts_with(&kept));
    }

    use regex::RegexSet;

    /// Pieces of chat bodies, tricky for a scan that splits the messages:
    /// brackets, commas and quotes inside strings, escapes, non-ASCII.
    const PIECES: [&str; 16] = [
        r#"{"role":"user","content":"hi"}"#,
        r#"{"role":"assistant","content":"a ], b } \"c\" \\"}"#,
        r#" { "role" : "system" , "content" : "é 😀 \u00e9 \n" } "#,
        r#"{"role":"user","content":[{"type":"text","text":"x]}"},{"type":"image_url","image_url":{"url":"u"}}]}"#,
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{\"a\":[1]}"}}]}"#,
        r#"{"role":"tool","tool_call_id":"c1","content":"[1, 2]"}"#,
        r#"{"role":"user","content":"x","extra":[true,false,null,-1.5e3,{"k":[]}]}"#,
        r#"{"role":"nobody","content":"x"}"#,
        r#"[1]"#,
        r#""messages""#,
        "7",
        r#"{"role":"user","content":"x","role":"user"}"#,
        r#"{"role":"user","content":{"a":1}}"#,
        "{}",
        r#"{"role":"user","content":"\""}"#,
        r#"{"role":"user","content":"a\\"}"#,
    ];
    const TOP_FIELDS: [&str; 6] = [
        r#""model":"gpt-4o""#,
        r#""tools":[{"type":"function","function":{"name":"messages","parameters":{"messages":[]}}}]"#,
        r#""stream" : true"#,
        r#""metadata":{"messages":"[\"x\"]"}"#,
        r#""messages":[]"#,
        r#""n":1"#,
    ];

    /// The split way reads each message on its own, two levels higher than
    /// inside the body, and serde_json limits nesting to 128 levels where it
    /// reads into types: the ways must still agree at every depth around
    /// that limit (skipped values, like an unknown field, have none).
    #[test]
    fn the_split_way_agrees_with_the_plain_way_on_deep_nesting() {
        for depth in (100..140).chain([1_000]) {
            let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
            for body in [
                format!(r#"{{"messages":[{{"role":"user","content":"x","n":{nested}}}]}}"#),
                format!(
                    r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":"x","n":{nested}}}]}}]}}"#
                ),
                format!(
                    r#"{{"messages":[{{"role":"assistant","tool_calls":[{{"id":"c","function":{{"name":"f","arguments":{nested}}}}}]}}]}}"#
                ),
            ] {
                let plain = parse_plain(&body, 10);
                match parse_split(&body, 10) {
                    Some(split) => assert_eq!(
                        format!("{split:?}"),
                        format!("{:?}", plain.expect("the plain way reads it")),
                        "{depth}"
                    ),
                    None => assert!(plain.is_err(), "{depth}: not split"),
                }
            }
        }
    }

    split::testing::split_agreement!("messages", PIECES, TOP_FIELDS);
}

#[cfg(test)]
mod strict_parts {
    use super::*;
    use crate::engine::Policy;
    use crate::policy::CompiledPolicy;
    use serde_json::Value;

    #[test]
    fn a_message_with_an_unknown_part_is_kept_whole_in_place() {
        let part = r#"{"type":"tool_result","content":"x"}"#;
        let body = format!(
            r#"{{"messages":[{{"role":"user","content":"{old}"}},{{"role":"user","content":[{part},{{"type":"text","text":"{old}"}}],"x_new":1}},{{"role":"user","content":"{old}"}},{{"role":"user","content":"last"}}],"z_new":{{"a":[1]}}}}"#,
            old = "old words ".repeat(20).trim_end(),
        );
        let parsed = ChatBody::parse(body.as_bytes()).unwrap();
        let item = &parsed.conversation.items[1];
        assert!(item.fixed);
        assert_eq!(item.fixed_chars, part.len());
        let mut p = Policy::with_budget(20);
        p.keep_last_n = 1;
        let (_, out) = parsed.compact(&CompiledPolicy::plain("t", p));
        let out: Value = serde_json::from_str(&out.unwrap()).unwrap();
        let original: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(out["messages"][0], original["messages"][1], "{out}");
        assert_eq!(out["z_new"], original["z_new"]);
    }

    #[test]
    fn refusal_parts_count_as_fixed() {
        let body = br#"{"messages":[{"role":"assistant","content":[{"type":"refusal","refusal":"no way"}]}]}"#;
        let parsed = ChatBody::parse(body).unwrap();
        assert_eq!(parsed.total_chars(), 6);
        assert_eq!(parsed.conversation.items[0].text, "");
    }
}
