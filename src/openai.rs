//! The OpenAI chat-completions body model: just enough of the request to
//! compact its `messages` and splice the result back, byte for byte
//! everywhere else.
//!
//! Parsing borrows from the body (`RawValue` spans), so fields other than
//! `messages` are never decoded or re-encoded: key order, whitespace and
//! number spelling survive. Inside `messages`, a kept message is copied as
//! it came; a trimmed one has only its text replaced.
//!
//! Mapping to the engine (choices the spec leaves to the proxy):
//! - text = the string content, or the text parts of array content joined
//!   with nothing between them; image, audio and file parts count zero and
//!   are never touched. A cut that falls in a later part empties the text
//!   parts after it; emptied text parts are removed unless none would remain.
//! - tool-call names and arguments (custom tools' `input`, and legacy
//!   `function_call`) count as fixed chars: they weigh on the budget but are
//!   never cut.
//! - an assistant message with `tool_calls` and the `tool` messages answering
//!   it form one group, kept or dropped together; likewise a legacy
//!   `function_call` and the `function` message after it.

use std::borrow::Cow;
use std::ops::Range;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::engine::{self, text::char_count, Message, Report, Role};
use crate::policy::CompiledPolicy;

/// Why a body is forwarded without compaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("the body is not valid JSON")]
    InvalidJson,
    #[error("the body is not a chat-completions request (no messages array)")]
    NoMessages,
    #[error("message {0} has a form the proxy does not compact: {1}")]
    UnsupportedMessage(usize, &'static str),
    #[error("the body has {0} messages, more than the {1} the proxy compacts")]
    TooManyMessages(usize, usize),
}

impl Skip {
    /// The reason as it appears after `skipped; ` in `x-compaction-status`.
    pub fn reason(&self) -> &'static str {
        match self {
            Skip::InvalidJson => "invalid-json",
            Skip::NoMessages => "no-messages",
            Skip::UnsupportedMessage(..) => "unsupported-message",
            Skip::TooManyMessages(..) => "too-many-messages",
        }
    }
}

/// A parsed chat-completions body.
#[derive(Debug)]
pub struct ChatBody<'a> {
    body: &'a str,
    messages_span: Range<usize>,
    messages: Vec<WireMessage<'a>>,
}

#[derive(Debug)]
struct WireMessage<'a> {
    raw: &'a str,
    role: Role,
    content: Content<'a>,
    fixed_chars: usize,
    group: Option<u32>,
}

#[derive(Debug)]
enum Content<'a> {
    /// `null` or absent.
    None,
    /// A string; `span` is the JSON string within the message.
    Text {
        span: Range<usize>,
        text: Cow<'a, str>,
    },
    /// An array; `span` is the array within the message.
    Parts {
        span: Range<usize>,
        parts: Vec<Part<'a>>,
    },
}

#[derive(Debug)]
struct Part<'a> {
    raw: &'a str,
    /// For text parts: the JSON string's span within `raw`, and its text.
    text: Option<(Range<usize>, Cow<'a, str>)>,
}

#[derive(Deserialize)]
struct TopFields<'a> {
    #[serde(borrow)]
    messages: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct MessageFields<'a> {
    #[serde(borrow)]
    role: Cow<'a, str>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<Vec<ToolCall<'a>>>,
    #[serde(borrow, default)]
    tool_call_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    function_call: Option<FunctionCall<'a>>,
}

#[derive(Deserialize)]
struct ToolCall<'a> {
    #[serde(borrow)]
    id: Cow<'a, str>,
    #[serde(borrow, default)]
    function: Option<FunctionCall<'a>>,
    /// `"type": "custom"` tools carry free-form `input` instead of arguments.
    #[serde(borrow, default)]
    custom: Option<CustomCall<'a>>,
}

impl ToolCall<'_> {
    fn chars(&self) -> usize {
        self.function.as_ref().map_or(0, FunctionCall::chars)
            + self.custom.as_ref().map_or(0, |c| {
                c.name.as_deref().map_or(0, char_count) + c.input.as_deref().map_or(0, char_count)
            })
    }
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
    arguments: Option<Cow<'a, str>>,
}

impl FunctionCall<'_> {
    fn chars(&self) -> usize {
        self.name.as_deref().map_or(0, char_count) + self.arguments.as_deref().map_or(0, char_count)
    }
}

#[derive(Deserialize)]
struct PartFields<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
}

/// Byte offset of `inner` within `outer`; `inner` must borrow from `outer`.
fn offset(outer: &str, inner: &str) -> usize {
    inner.as_ptr() as usize - outer.as_ptr() as usize
}

fn span(outer: &str, inner: &str) -> Range<usize> {
    let start = offset(outer, inner);
    start..start + inner.len()
}

impl<'a> ChatBody<'a> {
    pub fn parse(body: &'a [u8]) -> Result<ChatBody<'a>, Skip> {
        Self::parse_limited(body, usize::MAX)
    }

    /// Parses a body of at most `max_messages` messages. The count is known
    /// before any message is read, so an absurd body costs little.
    pub fn parse_limited(body: &'a [u8], max_messages: usize) -> Result<ChatBody<'a>, Skip> {
        let body = std::str::from_utf8(body).map_err(|_| Skip::InvalidJson)?;
        let top: TopFields = serde_json::from_str(body).map_err(|e| match e.classify() {
            serde_json::error::Category::Data => Skip::NoMessages,
            _ => Skip::InvalidJson,
        })?;
        // serde's derived structs also read arrays by position: only an
        // object is a chat-completions body (and a message, and a part).
        if !body.trim_start().starts_with('{') {
            return Err(Skip::NoMessages);
        }
        let raw_messages = top.messages.ok_or(Skip::NoMessages)?;
        let items: Vec<&RawValue> =
            serde_json::from_str(raw_messages.get()).map_err(|_| Skip::NoMessages)?;
        if items.len() > max_messages {
            return Err(Skip::TooManyMessages(items.len(), max_messages));
        }

        let mut messages = Vec::with_capacity(items.len());
        // tool_call id -> group of the assistant message that made the call
        let mut open_calls: Vec<(Cow<'a, str>, u32)> = Vec::new();
        let mut function_group: Option<u32> = None;
        for (i, raw) in items.into_iter().enumerate() {
            let raw = raw.get();
            if !raw.starts_with('{') {
                return Err(Skip::UnsupportedMessage(i, "not an object"));
            }
            let fields: MessageFields = serde_json::from_str(raw)
                .map_err(|_| Skip::UnsupportedMessage(i, "not an object with a string role"))?;
            let role =
                Role::parse(&fields.role).ok_or(Skip::UnsupportedMessage(i, "unknown role"))?;
            let content = match fields.content {
                None => Content::None,
                Some(c) => parse_content(raw, c).ok_or(Skip::UnsupportedMessage(
                    i,
                    "content is not a string, null, or an array of readable parts",
                ))?,
            };
            let mut fixed_chars = 0;
            let mut group = None;
            let calls = fields.tool_calls.unwrap_or_default();
            if !calls.is_empty() {
                let g = i as u32;
                group = Some(g);
                open_calls.clear();
                for call in calls {
                    fixed_chars += call.chars();
                    open_calls.push((call.id, g));
                }
            }
            if let Some(f) = &fields.function_call {
                fixed_chars += f.chars();
                group = Some(i as u32);
                function_group = group;
            }
            match role {
                Role::Tool => {
                    group = fields
                        .tool_call_id
                        .as_deref()
                        .and_then(|id| open_calls.iter().find(|(call, _)| *call == id))
                        .map(|&(_, g)| g);
                }
                Role::Function => group = function_group.take(),
                _ => {}
            }
            messages.push(WireMessage {
                raw,
                role,
                content,
                fixed_chars,
                group,
            });
        }
        Ok(ChatBody {
            body,
            messages_span: span(body, raw_messages.get()),
            messages,
        })
    }

    pub fn len(&self) -> usize {
        self.messages.len()
    }

    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
    }

    /// The chars all messages count toward a budget (text and tool calls).
    pub fn total_chars(&self) -> usize {
        self.messages
            .iter()
            .map(|m| m.text_chars() + m.fixed_chars)
            .sum()
    }

    /// The engine's view of the messages under `policy`'s pin rules.
    pub fn engine_messages(&self, policy: &CompiledPolicy) -> Vec<Message> {
        let first_user = self.messages.iter().position(|m| m.role == Role::User);
        self.messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let content = m.text();
                let pin = (policy.pin_first_user && first_user == Some(i))
                    || (!policy.pin_patterns.is_empty() && policy.pin_patterns.is_match(&content));
                Message {
                    role: m.role,
                    content,
                    id: None,
                    pin,
                    fixed_chars: m.fixed_chars,
                    group: m.group,
                }
            })
            .collect()
    }

    /// Runs the engine and, when anything changed, the body to forward.
    pub fn compact(&self, policy: &CompiledPolicy) -> (Report, Option<String>) {
        let messages = self.engine_messages(policy);
        let report = engine::compact(&messages, &policy.engine);
        let changed = report.loss.output_messages != report.loss.input_messages
            || report.loss.trimmed_messages > 0;
        let body = changed.then(|| self.rewrite(&report));
        (report, body)
    }

    /// The body with `messages` replaced by the report's survivors.
    fn rewrite(&self, report: &Report) -> String {
        let mut out = String::with_capacity(self.body.len());
        out.push_str(&self.body[..self.messages_span.start]);
        out.push('[');
        for (n, kept) in report.messages.iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            let m = &self.messages[kept.index];
            if kept.kept == engine::Kept::Verbatim {
                out.push_str(m.raw);
            } else {
                m.write_trimmed(kept.chars - m.fixed_chars, &mut out);
            }
        }
        out.push(']');
        out.push_str(&self.body[self.messages_span.end..]);
        out
    }
}

fn parse_content<'a>(message: &'a str, content: &'a RawValue) -> Option<Content<'a>> {
    let raw = content.get();
    match raw.as_bytes().first()? {
        b'"' => Some(Content::Text {
            span: span(message, raw),
            text: serde_json::from_str(raw).ok()?,
        }),
        b'[' => {
            let items: Vec<&RawValue> = serde_json::from_str(raw).ok()?;
            let parts = items
                .into_iter()
                .map(|item| {
                    let raw = item.get();
                    let fields = if raw.starts_with('{') {
                        // An object part we cannot read (a duplicate "text"
                        // or "type" key, which the upstream's parser reads
                        // as the last one) would count zero chars: skip the
                        // body rather than let it past the budget.
                        Some(serde_json::from_str::<PartFields>(raw).ok()?)
                    } else {
                        None
                    };
                    let text = fields
                        .filter(|p| p.kind == "text")
                        .and_then(|p| p.text)
                        .and_then(|t| {
                            Some((span(raw, t.get()), serde_json::from_str(t.get()).ok()?))
                        });
                    Some(Part { raw, text })
                })
                .collect::<Option<_>>()?;
            Some(Content::Parts {
                span: span(message, raw),
                parts,
            })
        }
        _ => None,
    }
}

impl WireMessage<'_> {
    fn text(&self) -> String {
        match &self.content {
            Content::None => String::new(),
            Content::Text { text, .. } => text.clone().into_owned(),
            Content::Parts { parts, .. } => parts
                .iter()
                .filter_map(|p| p.text.as_ref())
                .map(|(_, t)| t.as_ref())
                .collect(),
        }
    }

    fn text_chars(&self) -> usize {
        match &self.content {
            Content::None => 0,
            Content::Text { text, .. } => char_count(text),
            Content::Parts { parts, .. } => parts
                .iter()
                .filter_map(|p| p.text.as_ref())
                .map(|(_, t)| char_count(t))
                .sum(),
        }
    }

    /// Writes this message with its text cut to `keep` chars.
    fn write_trimmed(&self, keep: usize, out: &mut String) {
        match &self.content {
            Content::None => out.push_str(self.raw),
            Content::Text { span, text } => {
                splice(self.raw, span, engine::text::char_prefix(text, keep), out);
            }
            Content::Parts {
                span: content_span,
                parts,
            } => {
                out.push_str(&self.raw[..content_span.start]);
                out.push('[');
                let mut left = keep;
                let mut written = 0;
                let non_text = parts.iter().filter(|p| p.text.is_none()).count();
                for part in parts {
                    let piece = match &part.text {
                        None => Some(Cow::Borrowed(part.raw)),
                        Some((span, text)) => {
                            let chars = char_count(text);
                            if left >= chars {
                                left -= chars;
                                Some(Cow::Borrowed(part.raw))
                            } else if left > 0 || (written == 0 && non_text == 0) {
                                let mut s = String::new();
                                splice(
                                    part.raw,
                                    span,
                                    engine::text::char_prefix(text, left),
                                    &mut s,
                                );
                                left = 0;
                                Some(Cow::Owned(s))
                            } else {
                                None // emptied text part: removed
                            }
                        }
                    };
                    if let Some(piece) = piece {
                        if written > 0 {
                            out.push(',');
                        }
                        out.push_str(&piece);
                        written += 1;
                    }
                }
                out.push(']');
                out.push_str(&self.raw[content_span.end..]);
            }
        }
    }
}

/// `raw` with the JSON string at `span` replaced by `text`, JSON-encoded.
fn splice(raw: &str, span: &Range<usize>, text: &str, out: &mut String) {
    out.push_str(&raw[..span.start]);
    out.push_str(&serde_json::to_string(text).expect("strings always encode"));
    out.push_str(&raw[span.end..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Policy;
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
        let chat = ChatBody::parse(body.as_bytes()).unwrap();
        assert_eq!(chat.total_chars(), 0, "an array part is not a text part");
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
}
