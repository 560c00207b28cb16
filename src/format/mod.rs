//! Body formats: how each API's request body maps to the engine's neutral
//! message model and back.
//!
//! Every format does the same three things, which is the whole interface:
//! 1. **parse** the body into a [`Parsed`]: the neutral [`Conversation`]
//!    (roles, text, fixed chars, tool groups, tool calls and results) plus
//!    where each item sits in the original bytes; [`split`] finds the
//!    items so that serde reads each byte once;
//! 2. **count**: [`Conversation::total_chars`];
//! 3. **splice** a [`Plan`] (which items survive, with what text) back into
//!    the original bytes ([`Parsed::splice`], shared by all formats in
//!    [`splice`]); fields outside the compacted array keep their bytes.
//!
//! The formats sit side by side: [`chat`] (OpenAI chat completions),
//! [`anthropic`] (Anthropic Messages) and [`responses`] (OpenAI Responses).
//! Pin rules are not a format's business: the pipeline applies them to the
//! neutral model ([`crate::compaction`]). A message holding a block or part
//! a format does not know is kept whole, in place, as fixed content counted
//! by its bytes ([`Item::why_fixed`] says why); a body is skipped only when
//! it cannot be read as that API's request at all
//! ([`Skip::UnsupportedMessage`] names the message and the reason).
//!
//! Top-level fields are read as the upstreams read JSON: of a repeated key,
//! the last one wins ([`read_top`]).

pub mod agents;
pub mod anthropic;
pub mod chat;
pub mod recall;
pub mod responses;
pub mod resume;
pub(crate) mod rules;
pub(crate) mod splice;
pub(crate) mod split;

use std::borrow::Cow;
use std::ops::Range;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::engine::Role;
use splice::WireItem;

/// The API format of a route's bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// OpenAI chat completions: `messages`.
    #[default]
    Chat,
    /// Anthropic Messages: `system` and `messages` of content blocks.
    Anthropic,
    /// OpenAI Responses: `instructions` and an `input` item list.
    Responses,
}

impl Format {
    pub const ALL: [Format; 3] = [Format::Chat, Format::Anthropic, Format::Responses];

    pub fn as_str(self) -> &'static str {
        match self {
            Format::Chat => "chat",
            Format::Anthropic => "anthropic",
            Format::Responses => "responses",
        }
    }

    /// The format a route path implies when its route names none.
    pub fn for_path(path: &str) -> Format {
        let path = path.trim_end_matches('*').trim_end_matches('/');
        if path.ends_with("/messages") {
            Format::Anthropic
        } else if path.ends_with("/responses") || is_provider_compaction_path(path) {
            Format::Responses
        } else {
            Format::Chat
        }
    }

    /// Parses a body of at most `max_items` items of the compacted array.
    pub fn parse(self, body: &[u8], max_items: usize) -> Result<Parsed<'_>, Skip> {
        let body = std::str::from_utf8(body).map_err(|_| Skip::InvalidJson)?;
        match self {
            Format::Chat => chat::parse(body, max_items),
            Format::Anthropic => anthropic::parse(body, max_items),
            Format::Responses => responses::parse(body, max_items),
        }
    }
}

/// Whether a request path asks the provider to compact a conversation
/// (OpenAI's `POST /v1/responses/compact`): such a request is forwarded
/// untouched, whatever route or format matched it.
pub fn is_provider_compaction_path(path: &str) -> bool {
    path.trim_end_matches('/').ends_with("/responses/compact")
}

impl std::fmt::Display for Format {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Format::ALL
            .into_iter()
            .find(|f| f.as_str() == s)
            .ok_or_else(|| format!("unknown format {s:?}: expected chat, anthropic or responses"))
    }
}

/// Why a body is forwarded without compaction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skip {
    #[error("the body is not valid JSON")]
    InvalidJson,
    #[error("the body has no array of messages to compact")]
    NoMessages,
    #[error("message {0} has a form the proxy does not compact: {1}")]
    UnsupportedMessage(usize, &'static str),
    #[error("the body has {0} messages, more than the {1} the proxy compacts")]
    TooManyMessages(usize, usize),
    #[error("the conversation is held by the server (previous_response_id)")]
    ServerState,
    /// The request asks the provider to compact the conversation: an
    /// Anthropic `compaction` request field, or a Responses input ending in
    /// a `compaction_trigger` item.
    #[error("the request asks the provider to compact the conversation ({0})")]
    ProviderCompaction(&'static str),
    /// The coding agent's own request for a summary of its history.
    #[error("the request is {0}'s own compaction request")]
    AgentCompaction(&'static str),
}

impl Skip {
    /// The reason as it appears after `skipped; ` in `x-compaction-status`.
    pub fn reason(&self) -> &'static str {
        match self {
            Skip::InvalidJson => "invalid-json",
            Skip::NoMessages => "no-messages",
            Skip::UnsupportedMessage(..) => "unsupported-message",
            Skip::TooManyMessages(..) => "too-many-messages",
            Skip::ServerState => "server-state",
            Skip::ProviderCompaction(_) => "provider-compaction",
            Skip::AgentCompaction(_) => "agent-compaction",
        }
    }

    /// What the status header and the log line add after the reason: the
    /// message and what is wrong with it. Unbounded values (indices) stay
    /// out of the metric label, which is [`Skip::reason`] alone.
    pub fn detail(&self) -> Option<String> {
        match self {
            Skip::UnsupportedMessage(i, why) => Some(format!("message {i}: {why}")),
            _ => None,
        }
    }
}

/// The neutral model of a request's conversation.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Conversation {
    pub items: Vec<Item>,
    /// Chars outside the compacted array that count toward the budget but
    /// are never cut (Anthropic `system`, Responses `instructions`).
    pub outside_chars: usize,
}

impl Conversation {
    /// Chars of everything that counts toward the budget.
    pub fn total_chars(&self) -> usize {
        self.outside_chars + self.items.iter().map(Item::chars).sum::<usize>()
    }

    /// [`Conversation::total_chars`], given the chars of each item's text
    /// (counted once and kept, as a resumed parse keeps them).
    pub fn total_chars_of(&self, text_chars: &[usize]) -> usize {
        debug_assert_eq!(text_chars.len(), self.items.len());
        self.outside_chars
            + text_chars
                .iter()
                .zip(&self.items)
                .map(|(chars, m)| chars + m.fixed_chars)
                .sum::<usize>()
    }
}

/// One item of the compacted array.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    pub role: Role,
    /// The trimmable text: the item's text pieces joined.
    pub text: String,
    /// Chars that count but are never cut (tool calls, thinking).
    pub fixed_chars: usize,
    /// Items sharing a group are kept or dropped together.
    pub group: Option<u32>,
    /// The format cannot drop or cut it (an item it only carries).
    pub fixed: bool,
    /// Why it is fixed, for the per-message report.
    pub why_fixed: Option<&'static str>,
    /// It holds a provider's compaction (an Anthropic `compaction` block, a
    /// Responses `compaction` item): the provider reads the conversation
    /// from here on.
    pub provider_compaction: bool,
    /// Tool calls this item makes, in order.
    pub tool_calls: Vec<ToolCall>,
    /// The call this item answers, when it is a tool result.
    pub answers: Option<String>,
    /// Char counts of the text pieces of an item whose text joins several
    /// tool results (Anthropic `tool_result` blocks in one user message,
    /// maybe beside text blocks), so that pruning cuts each result on its
    /// own and no cut empties one; empty otherwise.
    pub piece_chars: Vec<usize>,
    /// With `piece_chars`: the call each piece answers (empty for a text
    /// block beside the results).
    pub piece_answers: Vec<String>,
    /// Chars of the reasoning blocks the item carries that are bound to
    /// their prefix (Anthropic `thinking` and `redacted_thinking`, whose
    /// signature the API checks against everything before it); `None`
    /// when it carries none. They are part of `fixed_chars`.
    pub thinking: Option<usize>,
}

impl Item {
    /// A copy of this item with `text` for its text: the item's own text
    /// is not copied on the way.
    pub fn with_text(&self, text: String) -> Self {
        let Item {
            role,
            text: _,
            fixed_chars,
            group,
            fixed,
            why_fixed,
            provider_compaction,
            tool_calls,
            answers,
            piece_chars,
            piece_answers,
            thinking,
        } = self;
        Item {
            role: *role,
            text,
            fixed_chars: *fixed_chars,
            group: *group,
            fixed: *fixed,
            why_fixed: *why_fixed,
            provider_compaction: *provider_compaction,
            tool_calls: tool_calls.clone(),
            answers: answers.clone(),
            piece_chars: piece_chars.clone(),
            piece_answers: piece_answers.clone(),
            thinking: *thinking,
        }
    }

    pub fn new(role: Role, text: impl Into<String>) -> Self {
        Item {
            role,
            text: text.into(),
            fixed_chars: 0,
            group: None,
            fixed: false,
            why_fixed: None,
            provider_compaction: false,
            tool_calls: Vec::new(),
            answers: None,
            piece_chars: Vec::new(),
            piece_answers: Vec::new(),
            thinking: None,
        }
    }

    pub fn chars(&self) -> usize {
        crate::engine::text::char_count(&self.text) + self.fixed_chars
    }

    /// Makes the item fixed: kept whole and in place, for `why`.
    pub fn fix(&mut self, why: &'static str) {
        self.fixed = true;
        if self.why_fixed.is_none() {
            self.why_fixed = Some(why);
        }
    }
}

/// Why an item holding a block or part the format does not know is fixed.
pub const UNKNOWN_KEPT_WHOLE: &str = "unknown block type kept whole";
/// Why an item before the latest provider compaction is fixed.
pub const BEFORE_COMPACTION: &str =
    "before the provider's latest compaction: the provider does not read it";
/// Why an item holding a provider compaction is fixed.
pub const HOLDS_COMPACTION: &str = "holds the provider's compaction, forwarded byte for byte";

impl Conversation {
    /// The provider reads the conversation from its latest compaction on
    /// (Anthropic's API ignores what precedes a `compaction` block): items
    /// before it are forwarded as they came and count nothing.
    pub(crate) fn read_from_latest_compaction(&mut self) {
        let Some(at) = self.items.iter().rposition(|m| m.provider_compaction) else {
            return;
        };
        for item in &mut self.items[..at] {
            item.fix(BEFORE_COMPACTION);
            item.why_fixed = Some(BEFORE_COMPACTION);
            item.text.clear();
            item.fixed_chars = 0;
            item.group = None;
            item.tool_calls.clear();
            item.answers = None;
            item.piece_chars.clear();
            item.piece_answers.clear();
        }
        self.items[at].group = None;
    }
}

/// A tool call as the neutral model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

/// What to forward: the surviving items, in order.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Plan {
    pub items: Vec<Planned>,
}

/// One surviving item.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    pub index: usize,
    /// The item's new text, or `None` to keep it as it came. A prefix of the
    /// original is cut where it falls; other text replaces the first piece.
    pub text: Option<String>,
    /// New arguments (JSON text) by tool-call position within the item.
    pub arguments: Vec<(usize, String)>,
    /// The new text of each text piece, when a pass cut the pieces one by
    /// one (`text` is then their join); `None`: `text` is spread over the
    /// pieces as one text.
    pub pieces: Option<Vec<String>>,
    /// What becomes of the item's prefix-bound reasoning blocks
    /// ([`Item::thinking`]).
    pub thinking: Reasoning,
}

/// What a plan does with an item's prefix-bound reasoning blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reasoning {
    /// Forwarded as they came: nothing before them changed (or there are
    /// none).
    #[default]
    AsTheyCame,
    /// Removed: something before them changed.
    Stripped,
    /// Forwarded although something before them changed, because the API
    /// requires them there (the last turn of an open tool loop must start
    /// with its thinking): the request asks the API to drop them instead.
    Stale,
}

impl Plan {
    /// Whether the plan forwards reasoning the API must be asked to drop.
    pub fn has_stale_thinking(&self) -> bool {
        self.items.iter().any(|p| p.thinking == Reasoning::Stale)
    }
}

impl Planned {
    pub fn verbatim(index: usize) -> Self {
        Planned {
            index,
            text: None,
            arguments: Vec::new(),
            pieces: None,
            thinking: Reasoning::AsTheyCame,
        }
    }
}

/// A parsed body: the neutral conversation and where its items sit.
#[derive(Debug)]
pub struct Parsed<'a> {
    pub format: Format,
    pub conversation: Conversation,
    body: &'a str,
    /// The compacted array's bytes in the body.
    array_span: Range<usize>,
    wire: Vec<WireItem<'a>>,
    /// What an earlier turn computed over the same leading items, and
    /// what this one computes for the next ([`resume::Carried`]).
    carried: resume::Carried,
}

impl Parsed<'_> {
    pub fn len(&self) -> usize {
        self.conversation.items.len()
    }

    pub fn is_empty(&self) -> bool {
        self.conversation.items.is_empty()
    }

    /// The request's top-level `model`, if it names one.
    pub fn model(&self) -> Option<String> {
        self.request_limits().0
    }

    /// The request's top-level `model` and the most output tokens it asks
    /// for: `max_tokens` (Messages, older Chat), `max_completion_tokens`
    /// (Chat) or `max_output_tokens` (Responses), the largest one set.
    pub fn request_limits(&self) -> (Option<String>, Option<usize>) {
        // Of repeated keys the last wins, as the upstreams read them.
        let Ok([model, max_tokens, max_completion_tokens, max_output_tokens]) = read_top(
            self.body,
            [
                "model",
                "max_tokens",
                "max_completion_tokens",
                "max_output_tokens",
            ],
        ) else {
            return (None, None);
        };
        // A limit that is not a whole number is the upstream's to refuse.
        let max_output = [max_tokens, max_completion_tokens, max_output_tokens]
            .into_iter()
            .filter_map(|v| serde_json::from_str::<u64>(v?.get()).ok())
            .max()
            .map(|n| usize::try_from(n).unwrap_or(usize::MAX));
        let model = model.and_then(|m| serde_json::from_str::<Cow<str>>(m.get()).ok());
        (model.map(Cow::into_owned), max_output)
    }

    /// Whether the `compaction_recall` tool would be added to this body
    /// (its `tools` and `tool_choice` allow it: [`recall::add_tool`]).
    pub fn takes_recall_tool(&self) -> bool {
        recall::adds_tool(self.format, self.body)
    }

    /// The bytes of item `i` as it came.
    pub fn item_bytes(&self, i: usize) -> &[u8] {
        self.body[self.wire[i].span.clone()].as_bytes()
    }
}

/// The values of the top-level fields `names` of a JSON object, each as
/// its raw text; of a repeated key the last one wins, as the upstreams
/// read JSON (serde's derived structs refuse a repeated key). Not an
/// object: a data error.
pub(crate) fn read_top<'a, const N: usize>(
    body: &'a str,
    names: [&str; N],
) -> Result<[Option<&'a RawValue>; N], serde_json::Error> {
    use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
    struct Fields<'n, const N: usize>(&'n [&'n str; N]);
    impl<'de, const N: usize> Visitor<'de> for Fields<'_, N> {
        type Value = [Option<&'de RawValue>; N];
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut values = [None; N];
            while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                match self.0.iter().position(|n| *n == key) {
                    Some(at) => values[at] = Some(map.next_value::<&'de RawValue>()?),
                    None => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            Ok(values)
        }
    }
    impl<'de, const N: usize> DeserializeSeed<'de> for Fields<'_, N> {
        type Value = [Option<&'de RawValue>; N];
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_map(self)
        }
    }
    let mut de = serde_json::Deserializer::from_str(body);
    let values = Fields(&names).deserialize(&mut de)?;
    de.end()?;
    Ok(values)
}

/// [`read_top`] for a body: it must be a JSON object.
fn top_fields<'a, const N: usize>(
    body: &'a str,
    names: [&str; N],
) -> Result<[Option<&'a RawValue>; N], Skip> {
    if !body.trim_start().starts_with('{') {
        return match serde_json::from_str::<serde::de::IgnoredAny>(body) {
            Ok(_) => Err(Skip::NoMessages),
            Err(_) => Err(Skip::InvalidJson),
        };
    }
    read_top(body, names).map_err(|e| match e.classify() {
        serde_json::error::Category::Data => Skip::NoMessages,
        _ => Skip::InvalidJson,
    })
}

/// A top-level value that must be an array, as its elements; `null` or
/// missing: none.
fn array_field(raw: Option<&RawValue>) -> Result<Option<Vec<&RawValue>>, Skip> {
    match raw {
        None => Ok(None),
        Some(raw) if raw.get() == "null" => Ok(None),
        Some(raw) => splice::elements(raw.get())
            .map(Some)
            .ok_or(Skip::NoMessages),
    }
}

#[cfg(test)]
mod limit_tests {
    use super::*;

    #[test]
    fn the_messages_array_is_found_in_the_body_empty_or_not() {
        let user = r#"{"role":"user","content":"hi"}"#;
        for format in [Format::Chat, Format::Anthropic] {
            for (body, array) in [
                (
                    r#"{"model":"m", "messages" : [ ] }"#.to_owned(),
                    "[ ]".to_owned(),
                ),
                (r#"{"messages":[]}"#.to_owned(), "[]".to_owned()),
                (
                    format!("{{\"messages\":\n[ {user},\t{user} ]\n, \"system\": \"s\"}}"),
                    format!("[ {user},\t{user} ]"),
                ),
            ] {
                let parsed = format.parse(body.as_bytes(), usize::MAX).unwrap();
                assert_eq!(&body[parsed.array_span.clone()], array, "{format:?} {body}");
            }
            for not_an_array in [
                r#"{"messages": {}}"#,
                r#"{"messages": "hi"}"#,
                r#"{"model": "m"}"#,
            ] {
                assert_eq!(
                    format
                        .parse(not_an_array.as_bytes(), usize::MAX)
                        .unwrap_err(),
                    Skip::NoMessages,
                    "{format:?} {not_an_array}"
                );
            }
        }
    }

    #[test]
    fn the_responses_input_is_found_in_the_body_list_or_string() {
        let item = r#"{"role":"user","content":"hi"}"#;
        for (body, input) in [
            (
                r#"{"model":"m", "input" : [ ] }"#.to_owned(),
                "[ ]".to_owned(),
            ),
            (
                format!("{{\"input\":\n[ {item},\t{item} ]\n, \"instructions\": \"s\"}}"),
                format!("[ {item},\t{item} ]"),
            ),
            (
                r#"{"input" : "one \"quoted\" prompt", "model":"m"}"#.to_owned(),
                r#""one \"quoted\" prompt""#.to_owned(),
            ),
            (r#"{"input":"plain"}"#.to_owned(), r#""plain""#.to_owned()),
        ] {
            let parsed = Format::Responses
                .parse(body.as_bytes(), usize::MAX)
                .unwrap();
            assert_eq!(&body[parsed.array_span.clone()], input, "{body}");
        }
        // A string counts whole, as the text the model reads.
        let parsed = Format::Responses
            .parse(br#"{"input":"a \u00e9 b","instructions":"xy"}"#, usize::MAX)
            .unwrap();
        assert_eq!(parsed.conversation.outside_chars, 5 + 2);
        for not_an_input in [
            r#"{"input": {}}"#,
            r#"{"input": 5}"#,
            r#"{"input": null}"#,
            r#"{"model": "m"}"#,
        ] {
            assert_eq!(
                Format::Responses
                    .parse(not_an_input.as_bytes(), usize::MAX)
                    .unwrap_err(),
                Skip::NoMessages,
                "{not_an_input}"
            );
        }
    }

    #[test]
    fn request_limits_read_the_model_and_the_largest_output_limit() {
        let limits = |body: &str, format: Format| {
            format
                .parse(body.as_bytes(), usize::MAX)
                .unwrap()
                .request_limits()
        };
        let chat = r#"{"model":"gpt-4o","max_completion_tokens":4000,"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            limits(chat, Format::Chat),
            (Some("gpt-4o".into()), Some(4000))
        );
        let legacy =
            r#"{"max_tokens":50,"messages":[{"role":"user","content":"hi"}],"model":"gpt-4"}"#;
        assert_eq!(
            limits(legacy, Format::Chat),
            (Some("gpt-4".into()), Some(50))
        );
        let responses = r#"{"model":"gpt-5","max_output_tokens":1234,"input":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            limits(responses, Format::Responses),
            (Some("gpt-5".into()), Some(1234))
        );
        let anthropic = r#"{"model":"claude-sonnet-4-5","max_tokens":8192,"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            limits(anthropic, Format::Anthropic),
            (Some("claude-sonnet-4-5".into()), Some(8192))
        );
        // No limit, or one that is not a whole number: nothing to subtract.
        let odd =
            r#"{"model":"m","max_tokens":"lots","messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(limits(odd, Format::Chat), (Some("m".into()), None));
        let none = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(limits(none, Format::Chat), (None, None));
    }

    #[test]
    fn repeated_keys_are_read_as_the_upstreams_read_them_the_last_wins() {
        let limits = |body: &str, format: Format| {
            format
                .parse(body.as_bytes(), usize::MAX)
                .unwrap()
                .request_limits()
        };
        let twice = r#"{"model":"gpt-3.5","max_tokens":10,"model":"gpt-4o","max_tokens":4000,"messages":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            limits(twice, Format::Chat),
            (Some("gpt-4o".into()), Some(4000))
        );
        let anthropic = r#"{"model":"claude-sonnet-4-5","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"max_tokens":8192}"#;
        assert_eq!(
            limits(anthropic, Format::Anthropic),
            (Some("claude-sonnet-4-5".into()), Some(8192))
        );
        // The fields a format reads, too: the last system prompt counts,
        // the last messages array is the one compacted.
        let body = br#"{"system":"a much longer first system prompt","messages":[{"role":"user","content":"first"}],"system":"short","messages":[{"role":"user","content":"hello"}]}"#;
        let parsed = Format::Anthropic.parse(body, 10).unwrap();
        assert_eq!(parsed.conversation.outside_chars, 5);
        assert_eq!(parsed.conversation.items[0].text, "hello");
        // A message's repeated keys as well.
        let body = br#"{"messages":[{"role":"user","content":"a","content":"bcd"}]}"#;
        let parsed = Format::Anthropic.parse(body, 10).unwrap();
        assert_eq!(parsed.conversation.items[0].text, "bcd");
    }
}
