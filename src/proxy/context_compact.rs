//! `POST /1/unstable/context/compact`: Algolia's context-compaction API at
//! its own path, with its request and response schema. Everything but the
//! last `keepLastMessages` messages (AI SDK v4 or v5 shapes) is summarized
//! by the summarizer `providerID` names (map-reduce within its limits); the
//! answer is the summary as a user message, then the kept tail verbatim,
//! with before/after stats and what the summary took.
//!
//! - invalid input: 422 with the schema's `HTTPValidationError` body
//!   (`{"detail": [{"loc", "msg", "type"}]}`);
//! - a conversation that cannot be summarized within the chunk and pass
//!   limits: 400 `{"message"}`; a summarizer that fails: 502 `{"message"}`;
//! - nothing older than the kept tail: the messages as they came,
//!   `compacted: false`.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use serde_json::{json, Map, Value};

use super::body::{self, ProxyBody};
use super::summaries::prefix_keys;
use super::AppState;
use crate::policy::SummaryPolicy;
use crate::store::StoredSummary;
use crate::summarizer::client::CallerKey;
use crate::summarizer::mapreduce::estimate_tokens;
use crate::summarizer::prompt::{self, PromptSettings};
use crate::summarizer::SummarizeError;

pub const PATH: &str = "/1/unstable/context/compact";

/// The most chars of `instructions`.
pub const MAX_INSTRUCTIONS_CHARS: usize = 2000;
pub const DEFAULT_KEEP_LAST: usize = 4;
pub const MIN_TARGET_TOKENS: u64 = 64;

/// One validation problem, as the schema's `ValidationError`.
#[derive(Debug, Clone, PartialEq)]
pub struct Invalid {
    pub loc: Vec<Value>,
    pub msg: String,
    pub kind: &'static str,
}

fn invalid(loc: &[Value], msg: impl Into<String>, kind: &'static str) -> Invalid {
    let mut full = vec![json!("body")];
    full.extend_from_slice(loc);
    Invalid {
        loc: full,
        msg: msg.into(),
        kind,
    }
}

/// The message shapes of the AI SDK.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `content` (a string) with optional `parts` and `toolInvocations`.
    V4,
    /// `parts` only.
    V5,
}

/// A checked request.
#[derive(Debug, Clone)]
pub struct Checked {
    pub provider: String,
    pub model: String,
    pub messages: Vec<Value>,
    pub shape: Shape,
    pub instructions: String,
    pub keep_last: usize,
    pub target_tokens: Option<u64>,
}

/// Validates a request body against the schema, every problem at once.
pub fn check(body: &[u8]) -> Result<Checked, Vec<Invalid>> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        vec![invalid(
            &[],
            format!("JSON decode error: {e}"),
            "json_invalid",
        )]
    })?;
    let Value::Object(top) = value else {
        return Err(vec![invalid(
            &[],
            "Input should be a valid dictionary",
            "model_attributes_type",
        )]);
    };
    let mut problems = Vec::new();
    let string = |key: &str, problems: &mut Vec<Invalid>| match top.get(key) {
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => {
            problems.push(invalid(
                &[json!(key)],
                "Input should be a valid string",
                "string_type",
            ));
            None
        }
        None => {
            problems.push(invalid(&[json!(key)], "Field required", "missing"));
            None
        }
    };
    let provider = string("providerID", &mut problems);
    let model = string("model", &mut problems);
    let instructions = match top.get("instructions") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(s)) if s.chars().count() <= MAX_INSTRUCTIONS_CHARS => s.clone(),
        Some(Value::String(_)) => {
            problems.push(invalid(
                &[json!("instructions")],
                format!("String should have at most {MAX_INSTRUCTIONS_CHARS} characters"),
                "string_too_long",
            ));
            String::new()
        }
        Some(_) => {
            problems.push(invalid(
                &[json!("instructions")],
                "Input should be a valid string",
                "string_type",
            ));
            String::new()
        }
    };
    let keep_last = match top.get("keepLastMessages") {
        None => DEFAULT_KEEP_LAST,
        Some(v) => match v.as_u64() {
            Some(n) => usize::try_from(n).unwrap_or(usize::MAX),
            None if v.as_i64().is_some() => {
                problems.push(invalid(
                    &[json!("keepLastMessages")],
                    "Input should be greater than or equal to 0",
                    "greater_than_equal",
                ));
                DEFAULT_KEEP_LAST
            }
            None => {
                problems.push(invalid(
                    &[json!("keepLastMessages")],
                    "Input should be a valid integer",
                    "int_type",
                ));
                DEFAULT_KEEP_LAST
            }
        },
    };
    let target_tokens = match top.get("targetTokensEstimate") {
        None | Some(Value::Null) => None,
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(n), _) if n >= MIN_TARGET_TOKENS => Some(n),
            (Some(_), _) | (None, Some(_)) => {
                problems.push(invalid(
                    &[json!("targetTokensEstimate")],
                    format!("Input should be greater than or equal to {MIN_TARGET_TOKENS}"),
                    "greater_than_equal",
                ));
                None
            }
            _ => {
                problems.push(invalid(
                    &[json!("targetTokensEstimate")],
                    "Input should be a valid integer",
                    "int_type",
                ));
                None
            }
        },
    };
    let (messages, shape) = match top.get("messages") {
        Some(Value::Array(messages)) => {
            let shape = if messages.iter().any(|m| m.get("content").is_some()) {
                Shape::V4
            } else {
                Shape::V5
            };
            for (i, m) in messages.iter().enumerate() {
                check_message(m, i, shape, &mut problems);
            }
            (messages.clone(), shape)
        }
        Some(_) => {
            problems.push(invalid(
                &[json!("messages")],
                "Input should be a valid list",
                "list_type",
            ));
            (Vec::new(), Shape::V4)
        }
        None => {
            problems.push(invalid(&[json!("messages")], "Field required", "missing"));
            (Vec::new(), Shape::V4)
        }
    };
    match (provider, model) {
        (Some(provider), Some(model)) if problems.is_empty() => Ok(Checked {
            provider,
            model,
            messages,
            shape,
            instructions,
            keep_last,
            target_tokens,
        }),
        _ => Err(problems),
    }
}

fn check_message(m: &Value, i: usize, shape: Shape, problems: &mut Vec<Invalid>) {
    let at = |key: &str| [json!("messages"), json!(i), json!(key)];
    let Some(object) = m.as_object() else {
        problems.push(invalid(
            &[json!("messages"), json!(i)],
            "Input should be a valid dictionary",
            "model_attributes_type",
        ));
        return;
    };
    match object.get("role").and_then(Value::as_str) {
        Some("user") | Some("assistant") => {}
        Some(_) => problems.push(invalid(
            &at("role"),
            "Input tag should be 'user' or 'assistant'",
            "union_tag_invalid",
        )),
        None => problems.push(invalid(&at("role"), "Field required", "missing")),
    }
    match shape {
        Shape::V4 => match object.get("content") {
            Some(Value::String(_)) => {}
            Some(_) => problems.push(invalid(
                &at("content"),
                "Input should be a valid string",
                "string_type",
            )),
            None => problems.push(invalid(&at("content"), "Field required", "missing")),
        },
        Shape::V5 => {}
    }
    match object.get("parts") {
        None | Some(Value::Array(_)) => {}
        Some(_) => problems.push(invalid(
            &at("parts"),
            "Input should be a valid list",
            "list_type",
        )),
    }
}

/// The text of a JSON value for a transcript: strings as they are,
/// anything else as compact JSON.
fn plain(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A message as one transcript entry: its text, its tool invocations
/// (name, shortened input, capped result); UI data parts are left out.
pub fn render(m: &Value, shape: Shape) -> String {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
    let mut lines = Vec::new();
    let tool = |name: &str, input: &Value, output: Option<&Value>, lines: &mut Vec<String>| {
        lines.push(format!(
            "[{role} calls {name}({})]",
            prompt::capped_argument(&plain(input))
        ));
        if let Some(output) = output.filter(|o| !o.is_null()) {
            lines.push(format!(
                "[result of {name}] {}",
                prompt::capped_result(&plain(output))
            ));
        }
    };
    let parts = m.get("parts").and_then(Value::as_array);
    match shape {
        Shape::V4 => {
            let content = m.get("content").and_then(Value::as_str).unwrap_or("");
            if !content.trim().is_empty() {
                lines.push(format!("{role}: {}", content.trim()));
            }
            let invocations = m
                .get("toolInvocations")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .chain(
                    parts
                        .into_iter()
                        .flatten()
                        .filter_map(|p| p.get("toolInvocation")),
                );
            for t in invocations {
                let name = t.get("toolName").and_then(Value::as_str).unwrap_or("tool");
                tool(
                    name,
                    t.get("args").unwrap_or(&Value::Null),
                    t.get("result"),
                    &mut lines,
                );
            }
        }
        Shape::V5 => {
            for p in parts.into_iter().flatten() {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                if kind == "text" {
                    let text = p.get("text").and_then(Value::as_str).unwrap_or("");
                    if !text.trim().is_empty() {
                        lines.push(format!("{role}: {}", text.trim()));
                    }
                } else if let Some(name) = kind.strip_prefix("tool-") {
                    let output = p.get("output").or_else(|| p.get("errorText"));
                    tool(
                        name,
                        p.get("input").unwrap_or(&Value::Null),
                        output,
                        &mut lines,
                    );
                }
            }
        }
    }
    if lines.is_empty() {
        format!("{role}: (no text)")
    } else {
        lines.join("\n")
    }
}

/// A token estimate of messages, as the stats report it (heuristic: four
/// chars a token of each message's JSON).
pub fn tokens_of(messages: &[Value]) -> usize {
    messages
        .iter()
        .map(|m| estimate_tokens(&m.to_string()))
        .sum()
}

/// The summary as a user message of the request's shape.
pub fn summary_message(text: &str, shape: Shape) -> Value {
    match shape {
        Shape::V4 => {
            json!({"role": "user", "content": text, "parts": [{"type": "text", "text": text}]})
        }
        Shape::V5 => json!({"role": "user", "parts": [{"type": "text", "text": text}]}),
    }
}

/// Why a request was not answered 200.
#[derive(Debug)]
enum Refused {
    Invalid(Vec<Invalid>),
    OverLimits(String),
    Summarizer(SummarizeError),
    TooLarge,
}

impl Refused {
    fn response(&self) -> (StatusCode, Value) {
        match self {
            Refused::Invalid(problems) => (
                StatusCode::UNPROCESSABLE_ENTITY,
                json!({"detail": problems.iter().map(|p| json!({"loc": p.loc, "msg": p.msg, "type": p.kind})).collect::<Vec<_>>()}),
            ),
            Refused::OverLimits(message) => (StatusCode::BAD_REQUEST, json!({"message": message})),
            Refused::Summarizer(e) => (
                StatusCode::BAD_GATEWAY,
                json!({"message": format!("the conversation could not be summarized: {e}")}),
            ),
            Refused::TooLarge => (
                StatusCode::PAYLOAD_TOO_LARGE,
                json!({"message": "the request body is larger than the proxy accepts"}),
            ),
        }
    }
}

/// Answers one request to [`PATH`].
pub async fn handle(state: &Arc<AppState>, request: Request<Incoming>) -> Response<ProxyBody> {
    let (status, value) = match answer(state, request).await {
        Ok(value) => (StatusCode::OK, value),
        Err(refused) => {
            if let Refused::Summarizer(e) = &refused {
                tracing::warn!(reason = e.reason(), error = %e, "context compact: the summarizer failed");
            }
            refused.response()
        }
    };
    let mut response = Response::new(body::full(Bytes::from(value.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}

async fn answer(state: &Arc<AppState>, request: Request<Incoming>) -> Result<Value, Refused> {
    let runtime = state.runtime();
    let caller = CallerKey::from_headers(request.headers());
    let limit = runtime.config.server.max_body_bytes;
    let bytes = http_body_util::Limited::new(request.into_body(), limit)
        .collect()
        .await
        .map_err(|_| Refused::TooLarge)?
        .to_bytes();
    let checked = check(&bytes).map_err(Refused::Invalid)?;
    let Some(settings) = runtime.summarizer(&checked.provider) else {
        return Err(Refused::Invalid(vec![invalid(
            &[json!("providerID")],
            format!("no summarizer named {:?} is configured", checked.provider),
            "value_error",
        )]));
    };
    let messages = &checked.messages;
    let before = messages.len();
    let tokens_before = tokens_of(messages);
    let split = before.saturating_sub(checked.keep_last);
    if split == 0 {
        return Ok(json!({
            "messages": messages,
            "stats": stats(before, before, tokens_before, tokens_before),
            "compaction": {
                "compacted": false, "chunksProcessed": 0, "passes": 0,
                "summarizerPromptTokens": null, "summarizerCompletionTokens": null,
                "targetTokensEstimate": checked.target_tokens,
            },
        }));
    }
    let mut settings = (*settings).clone();
    settings.model = checked.model.clone();
    let policy = SummaryPolicy {
        summarizer: Arc::new(settings),
        timing: crate::config::SummaryTiming::Inline,
        role: crate::config::SummaryRole::User,
        prompt: PromptSettings {
            frame: None,
            instructions: checked.instructions.clone(),
            target_tokens: checked.target_tokens.map_or(0, |t| t as usize),
        },
    };
    let entries: Vec<String> = messages[..split]
        .iter()
        .map(|m| render(m, checked.shape))
        .collect();
    let key = *prefix_keys(&policy, &entries).last().expect("entries");
    let (stored, fresh) = match state.summary_store.get(key).await {
        Some(found) => (found, false),
        None => {
            let settings = policy.summarizer.clone();
            let written = crate::summarizer::summarize_within(
                &state.summarizer_client,
                settings.clone(),
                caller,
                &entries,
                &policy.prompt,
            )
            .await
            .map_err(|e| {
                if e.is_over_limits() {
                    Refused::OverLimits(format!(
                        "the conversation cannot be summarized within the limits: {e}"
                    ))
                } else {
                    Refused::Summarizer(e)
                }
            })?;
            state
                .metrics
                .summarizer_tokens("context-compact", &settings.name, written.usage);
            let stored = StoredSummary {
                id: key.hex()[..12].to_owned(),
                text: written.text,
                chunks: written.chunks,
                passes: written.passes,
                usage: written.usage,
            };
            (state.summary_store.put_if_absent(key, stored).await, true)
        }
    };
    let mut out = vec![summary_message(&stored.text, checked.shape)];
    out.extend(messages[split..].iter().cloned());
    let after = out.len();
    let tokens_after = tokens_of(&out);
    let (prompt_tokens, completion_tokens) = if fresh {
        (stored.usage.prompt_tokens, stored.usage.completion_tokens)
    } else {
        (Some(0), Some(0))
    };
    Ok(json!({
        "messages": out,
        "stats": stats(before, after, tokens_before, tokens_after),
        "compaction": {
            "compacted": true,
            "chunksProcessed": stored.chunks,
            "passes": stored.passes,
            "summarizerPromptTokens": prompt_tokens,
            "summarizerCompletionTokens": completion_tokens,
            "targetTokensEstimate": checked.target_tokens,
        },
    }))
}

fn stats(before: usize, after: usize, tokens_before: usize, tokens_after: usize) -> Value {
    let mut stats = Map::new();
    stats.insert("messagesBefore".into(), json!(before));
    stats.insert("messagesAfter".into(), json!(after));
    stats.insert("tokensBeforeEstimate".into(), json!(tokens_before));
    stats.insert("tokensAfterEstimate".into(), json!(tokens_after));
    stats.insert(
        "messagesDropped".into(),
        json!(before.saturating_sub(after)),
    );
    Value::Object(stats)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seeds_example_request_is_valid_with_its_defaults() {
        let body = br#"{"providerID":"lorem","model":"lorem","messages":[{"id":"lorem","role":"user","content":"lorem","parts":[{"type":"text","text":"lorem"}],"annotations":[{}]}],"keepLastMessages":4,"instructions":"lorem","targetTokensEstimate":64}"#;
        let checked = check(body).unwrap();
        assert_eq!(checked.shape, Shape::V4);
        assert_eq!(checked.keep_last, 4);
        assert_eq!(checked.target_tokens, Some(64));
        let minimal = br#"{"providerID":"p","model":"m","messages":[{"role":"user","parts":[{"type":"text","text":"hi"}]}]}"#;
        let checked = check(minimal).unwrap();
        assert_eq!(
            (checked.shape, checked.keep_last, checked.target_tokens),
            (Shape::V5, 4, None)
        );
    }

    #[test]
    fn every_violation_is_reported_with_its_location() {
        let long = "x".repeat(2001);
        let body = json!({"model": 5, "messages": [{"role": "system", "content": "a"}],
            "instructions": long, "keepLastMessages": -1, "targetTokensEstimate": 10});
        let problems = check(body.to_string().as_bytes()).unwrap_err();
        let locs: Vec<String> = problems
            .iter()
            .map(|p| Value::Array(p.loc.clone()).to_string())
            .collect();
        for expected in [
            r#"["body","providerID"]"#,
            r#"["body","model"]"#,
            r#"["body","instructions"]"#,
            r#"["body","keepLastMessages"]"#,
            r#"["body","targetTokensEstimate"]"#,
            r#"["body","messages",0,"role"]"#,
        ] {
            assert!(locs.iter().any(|l| l == expected), "{expected}: {locs:?}");
        }
        assert!(check(b"not json").is_err());
    }

    #[test]
    fn tool_invocations_are_rendered_in_both_shapes() {
        let v4 = json!({"role": "assistant", "content": "Checking.", "toolInvocations": [
            {"toolCallId": "1", "toolName": "search", "args": {"q": "boots"}, "result": {"hits": 3}}]});
        assert_eq!(
            render(&v4, Shape::V4),
            "assistant: Checking.\n[assistant calls search({\"q\":\"boots\"})]\n[result of search] {\"hits\":3}"
        );
        let v5 = json!({"role": "assistant", "parts": [{"type": "step-start"}, {"type": "text", "text": "Found."},
            {"type": "tool-search", "toolCallId": "1", "state": "output-available", "input": {"q": "boots"}, "output": {"hits": 3}},
            {"type": "data-suggestions", "data": {}}]});
        assert_eq!(
            render(&v5, Shape::V5),
            "assistant: Found.\n[assistant calls search({\"q\":\"boots\"})]\n[result of search] {\"hits\":3}"
        );
    }
}
