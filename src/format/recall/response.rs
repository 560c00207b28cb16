//! The model's side of recall: its calls and usage read from an upstream
//! response, whole or streamed, the usage of earlier rounds added to the
//! answer, and the recall calls stripped from what the client gets.

use serde_json::{json, Value};

use super::super::splice::span;
use super::super::{read_top, Format};
use super::TOOL_NAME;

/// A tool call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    /// The arguments as JSON text.
    pub arguments: String,
}

impl Call {
    pub fn is_recall(&self) -> bool {
        self.name == TOOL_NAME
    }

    /// The ids a recall call asks for (none when its arguments are not
    /// `{"ids": [...]}`; a single string is taken as one id).
    pub fn ids(&self) -> Vec<String> {
        let value: Value = serde_json::from_str(&self.arguments).unwrap_or(Value::Null);
        match value.get("ids").or_else(|| value.get("id")) {
            Some(Value::Array(ids)) => ids
                .iter()
                .filter_map(|i| i.as_str().map(str::to_owned))
                .collect(),
            Some(Value::String(id)) => vec![id.clone()],
            _ => Vec::new(),
        }
    }
}

/// What one upstream response says, as far as recall cares.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Turn {
    /// Every tool call, in order.
    pub calls: Vec<Call>,
    /// The model's turn as elements to append, with the recall calls only
    /// (the client's own calls cannot be answered here: the model makes
    /// them again after the recall, in the answer the client gets).
    pub assistant: Vec<Value>,
    /// The response's usage object, as the API spells it.
    pub usage: Option<Value>,
}

impl Turn {
    pub fn recall_calls(&self) -> impl Iterator<Item = &Call> {
        self.calls.iter().filter(|c| c.is_recall())
    }

    pub fn calls_recall(&self) -> bool {
        self.recall_calls().next().is_some()
    }
}

/// Reads a whole (non-streamed) response body.
pub fn read_json(format: Format, body: &[u8]) -> Option<Turn> {
    let value: Value = serde_json::from_slice(body).ok()?;
    Some(turn_of(format, &value))
}

fn turn_of(format: Format, value: &Value) -> Turn {
    let usage = value.get("usage").filter(|u| u.is_object()).cloned();
    match format {
        Format::Chat => {
            let message = value
                .pointer("/choices/0/message")
                .cloned()
                .unwrap_or(json!({}));
            chat_turn(message, usage)
        }
        Format::Anthropic => {
            let content = value.get("content").and_then(Value::as_array).cloned();
            anthropic_turn(content.unwrap_or_default(), usage)
        }
        Format::Responses => {
            let output = value.get("output").and_then(Value::as_array).cloned();
            responses_turn(output.unwrap_or_default(), usage)
        }
    }
}

fn chat_turn(message: Value, usage: Option<Value>) -> Turn {
    let mut calls = Vec::new();
    let mut recall = Vec::new();
    for c in message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let call = Call {
            id: str_at(c, "/id"),
            name: str_at(c, "/function/name"),
            arguments: str_at(c, "/function/arguments"),
        };
        if call.is_recall() {
            recall.push(c.clone());
        }
        calls.push(call);
    }
    let content = message.get("content").cloned().unwrap_or(Value::Null);
    let mut assistant = json!({"role": "assistant", "content": content});
    if !recall.is_empty() {
        assistant["tool_calls"] = Value::Array(recall);
    }
    Turn {
        calls,
        assistant: vec![assistant],
        usage,
    }
}

fn anthropic_turn(content: Vec<Value>, usage: Option<Value>) -> Turn {
    let mut calls = Vec::new();
    let mut kept = Vec::new();
    for block in content {
        if block.get("type").and_then(Value::as_str) == Some("tool_use") {
            let call = Call {
                id: str_at(&block, "/id"),
                name: str_at(&block, "/name"),
                arguments: block.get("input").map_or("{}".into(), Value::to_string),
            };
            let recall = call.is_recall();
            calls.push(call);
            if !recall {
                continue;
            }
        }
        kept.push(block);
    }
    Turn {
        calls,
        assistant: vec![json!({"role": "assistant", "content": kept})],
        usage,
    }
}

fn responses_turn(output: Vec<Value>, usage: Option<Value>) -> Turn {
    let mut calls = Vec::new();
    let mut kept = Vec::new();
    for item in output {
        if item.get("type").and_then(Value::as_str) == Some("function_call") {
            let call = Call {
                id: str_at(&item, "/call_id"),
                name: str_at(&item, "/name"),
                arguments: str_at(&item, "/arguments"),
            };
            let recall = call.is_recall();
            calls.push(call);
            if !recall {
                continue;
            }
        }
        kept.push(item);
    }
    Turn {
        calls,
        assistant: kept,
        usage,
    }
}

fn str_at(value: &Value, pointer: &str) -> String {
    value
        .pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

/// One server-sent event: its `event:` name and its `data:` text.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: Option<String>,
    pub data: String,
}

/// The events of a whole SSE body.
pub fn events(body: &str) -> Vec<Event> {
    let body = body.replace("\r\n", "\n");
    body.split("\n\n")
        .filter_map(|block| {
            let mut name = None;
            let mut data: Vec<&str> = Vec::new();
            for line in block.lines() {
                if let Some(v) = line.strip_prefix("event:") {
                    name = Some(v.trim().to_owned());
                } else if let Some(v) = line.strip_prefix("data:") {
                    data.push(v.strip_prefix(' ').unwrap_or(v));
                }
            }
            (name.is_some() || !data.is_empty()).then(|| Event {
                name,
                data: data.join("\n"),
            })
        })
        .collect()
}

/// Writes events back as an SSE body.
pub fn write_events(events: &[Event]) -> String {
    let mut out = String::new();
    for e in events {
        if let Some(name) = &e.name {
            out.push_str("event: ");
            out.push_str(name);
            out.push('\n');
        }
        for line in e.data.split('\n') {
            out.push_str("data: ");
            out.push_str(line);
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

/// Reads a whole streamed response body.
pub fn read_stream(format: Format, body: &[u8]) -> Option<Turn> {
    let body = std::str::from_utf8(body).ok()?;
    let data = events(body)
        .into_iter()
        .filter_map(|e| serde_json::from_str::<Value>(&e.data).ok());
    match format {
        Format::Chat => {
            let mut content = String::new();
            let mut calls: Vec<Value> = Vec::new();
            let mut usage = None;
            for chunk in data {
                if let Some(u) = chunk.get("usage").filter(|u| u.is_object()) {
                    usage = Some(u.clone());
                }
                let Some(delta) = chunk.pointer("/choices/0/delta") else {
                    continue;
                };
                if let Some(text) = delta.get("content").and_then(Value::as_str) {
                    content.push_str(text);
                }
                for c in delta
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let index = c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                    while calls.len() <= index {
                        calls.push(json!({"id": "", "type": "function", "function": {"name": "", "arguments": ""}}));
                    }
                    let call = &mut calls[index];
                    if let Some(id) = c.get("id").and_then(Value::as_str) {
                        call["id"] = id.into();
                    }
                    for field in ["name", "arguments"] {
                        if let Some(piece) = c
                            .pointer(&format!("/function/{field}"))
                            .and_then(Value::as_str)
                        {
                            let old = call["function"][field]
                                .as_str()
                                .unwrap_or_default()
                                .to_owned();
                            call["function"][field] = (old + piece).into();
                        }
                    }
                }
            }
            let content = if content.is_empty() {
                Value::Null
            } else {
                content.into()
            };
            let mut message = json!({"role": "assistant", "content": content});
            if !calls.is_empty() {
                message["tool_calls"] = Value::Array(calls);
            }
            Some(chat_turn(message, usage))
        }
        Format::Anthropic => {
            let mut blocks: Vec<Value> = Vec::new();
            let mut inputs: Vec<String> = Vec::new();
            let mut usage: Option<Value> = None;
            for event in data {
                match event.get("type").and_then(Value::as_str) {
                    Some("message_start") => {
                        usage = event.pointer("/message/usage").cloned();
                    }
                    Some("content_block_start") => {
                        let index =
                            event.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                        let block = event.get("content_block").cloned().unwrap_or(json!({}));
                        while blocks.len() <= index {
                            blocks.push(Value::Null);
                            inputs.push(String::new());
                        }
                        blocks[index] = block;
                    }
                    Some("content_block_delta") => {
                        let index =
                            event.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
                        let (Some(block), Some(delta)) =
                            (blocks.get_mut(index), event.get("delta"))
                        else {
                            continue;
                        };
                        let piece = |key: &str| {
                            delta
                                .get(key)
                                .and_then(Value::as_str)
                                .unwrap_or_default()
                                .to_owned()
                        };
                        match delta.get("type").and_then(Value::as_str) {
                            Some("text_delta") => append_str(block, "text", &piece("text")),
                            Some("thinking_delta") => {
                                append_str(block, "thinking", &piece("thinking"))
                            }
                            Some("signature_delta") => {
                                append_str(block, "signature", &piece("signature"))
                            }
                            Some("input_json_delta") => {
                                inputs[index].push_str(&piece("partial_json"))
                            }
                            _ => {}
                        }
                    }
                    Some("message_delta") => {
                        if let (Some(u), Some(delta)) = (usage.as_mut(), event.get("usage")) {
                            if let (Some(u), Some(delta)) = (u.as_object_mut(), delta.as_object()) {
                                for (k, v) in delta {
                                    if !v.is_null() {
                                        u.insert(k.clone(), v.clone());
                                    }
                                }
                            }
                        } else if let Some(delta) = event.get("usage") {
                            usage = Some(delta.clone());
                        }
                    }
                    _ => {}
                }
            }
            for (block, input) in blocks.iter_mut().zip(&inputs) {
                if block.get("type").and_then(Value::as_str) == Some("tool_use")
                    && !input.is_empty()
                {
                    block["input"] = serde_json::from_str(input).unwrap_or(json!({}));
                }
            }
            blocks.retain(|b| !b.is_null());
            Some(anthropic_turn(blocks, usage))
        }
        Format::Responses => {
            let mut done = None;
            for event in data {
                if event.get("type").and_then(Value::as_str) == Some("response.completed") {
                    done = event.get("response").cloned();
                }
            }
            Some(turn_of(Format::Responses, &done?))
        }
    }
}

fn append_str(block: &mut Value, key: &str, piece: &str) {
    let old = block
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    block[key] = (old + piece).into();
}

/// Adds every number of `earlier` into `total`, field by field, nested
/// objects included: a usage object that covers several rounds.
pub fn add_usage(total: &mut Value, earlier: &Value) {
    let (Some(total), Some(earlier)) = (total.as_object_mut(), earlier.as_object()) else {
        return;
    };
    for (key, value) in earlier {
        match (total.get_mut(key), value) {
            (Some(t @ Value::Number(_)), Value::Number(e)) => {
                if let (Some(a), Some(b)) = (t.as_u64(), e.as_u64()) {
                    *t = (a + b).into();
                }
            }
            (Some(t @ Value::Object(_)), Value::Object(_)) => add_usage(t, value),
            (None, Value::Number(_)) => {
                total.insert(key.clone(), value.clone());
            }
            _ => {}
        }
    }
}

/// A whole response body with `earlier` rounds' usage added to its own.
pub fn with_usage_json(body: &[u8], earlier: &Value) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let [usage] = read_top(text, ["usage"]).ok()?;
    let usage = usage?;
    let mut total: Value = serde_json::from_str(usage.get()).ok()?;
    add_usage(&mut total, earlier);
    let at = span(text, usage.get());
    Some(format!("{}{}{}", &text[..at.start], total, &text[at.end..]).into_bytes())
}

/// A whole streamed body with `earlier` rounds' usage added to each usage
/// its events report (Anthropic's `message_start` and `message_delta`,
/// chat's usage chunk, Responses' `response.completed`).
pub fn with_usage_stream(format: Format, body: &[u8], earlier: &Value) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut list = events(text);
    for event in &mut list {
        let Ok(mut value) = serde_json::from_str::<Value>(&event.data) else {
            continue;
        };
        let pointer = match (format, value.get("type").and_then(Value::as_str)) {
            (Format::Anthropic, Some("message_start")) => "/message/usage",
            (Format::Anthropic, Some("message_delta")) => "/usage",
            (Format::Responses, Some("response.completed")) => "/response/usage",
            (Format::Chat, _) => "/usage",
            _ => continue,
        };
        match value.pointer_mut(pointer) {
            Some(usage) if usage.is_object() => add_usage(usage, earlier),
            _ => continue,
        }
        event.data = value.to_string();
    }
    Some(write_events(&list).into_bytes())
}

fn is_recall_call(format: Format, v: &Value) -> bool {
    let name = match format {
        Format::Chat => v.pointer("/function/name"),
        Format::Anthropic => (v.get("type").and_then(Value::as_str) == Some("tool_use"))
            .then(|| v.get("name"))
            .flatten(),
        Format::Responses => (v.get("type").and_then(Value::as_str) == Some("function_call"))
            .then(|| v.get("name"))
            .flatten(),
    };
    name.and_then(Value::as_str) == Some(TOOL_NAME)
}

/// A whole response with its recall calls taken out (the rounds are
/// spent): the client sees only its own calls, and a response left with
/// none ends as a plain answer.
pub fn strip_recall_json(format: Format, body: &[u8]) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(body).ok()?;
    match format {
        Format::Chat => {
            for choice in value.get_mut("choices")?.as_array_mut()? {
                let Some(message) = choice.get_mut("message") else {
                    continue;
                };
                if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
                    calls.retain(|c| !is_recall_call(format, c));
                    if calls.is_empty() {
                        message.as_object_mut()?.remove("tool_calls");
                        if message.get("content").map_or(true, Value::is_null) {
                            message["content"] = "".into();
                        }
                        if choice.get("finish_reason").and_then(Value::as_str) == Some("tool_calls")
                        {
                            choice["finish_reason"] = "stop".into();
                        }
                    }
                }
            }
        }
        Format::Anthropic => {
            let content = value.get_mut("content")?.as_array_mut()?;
            content.retain(|b| !is_recall_call(format, b));
            let any_tool = content
                .iter()
                .any(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"));
            if !any_tool && value.get("stop_reason").and_then(Value::as_str) == Some("tool_use") {
                value["stop_reason"] = "end_turn".into();
            }
        }
        Format::Responses => {
            value
                .get_mut("output")?
                .as_array_mut()?
                .retain(|i| !is_recall_call(format, i));
        }
    }
    serde_json::to_vec(&value).ok()
}

/// [`strip_recall_json`] for a whole streamed response: the events of
/// recall calls go, the indexes after them close up.
pub fn strip_recall_stream(format: Format, body: &[u8]) -> Option<Vec<u8>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut out = Vec::new();
    // Recall calls' indexes (tool-call index, content block, output item).
    let mut gone: Vec<u64> = Vec::new();
    let mut client_calls = false;
    let shift = |gone: &[u64], i: u64| i - gone.iter().filter(|&&g| g < i).count() as u64;
    for mut event in events(text) {
        let Ok(mut value) = serde_json::from_str::<Value>(&event.data) else {
            out.push(event);
            continue;
        };
        let kind = value
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        let keep = match format {
            Format::Chat => {
                let Some(choice) = value.pointer_mut("/choices/0") else {
                    out.push(event);
                    continue;
                };
                if let Some(calls) = choice
                    .pointer_mut("/delta/tool_calls")
                    .and_then(Value::as_array_mut)
                {
                    for c in calls.iter() {
                        let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                        if is_recall_call(format, c) {
                            gone.push(index);
                        } else if c.pointer("/function/name").is_some() {
                            client_calls = true;
                        }
                    }
                    calls.retain(|c| {
                        !gone.contains(&c.get("index").and_then(Value::as_u64).unwrap_or(0))
                    });
                    for c in calls.iter_mut() {
                        let index = c.get("index").and_then(Value::as_u64).unwrap_or(0);
                        c["index"] = shift(&gone, index).into();
                    }
                    if calls.is_empty() {
                        choice["delta"].as_object_mut()?.remove("tool_calls");
                    }
                }
                if !client_calls
                    && choice.get("finish_reason").and_then(Value::as_str) == Some("tool_calls")
                {
                    choice["finish_reason"] = "stop".into();
                }
                true
            }
            Format::Anthropic => {
                if kind == "content_block_start" {
                    let index = value.get("index").and_then(Value::as_u64).unwrap_or(0);
                    match value.get("content_block") {
                        Some(b) if is_recall_call(format, b) => gone.push(index),
                        Some(b) if b.get("type").and_then(Value::as_str) == Some("tool_use") => {
                            client_calls = true
                        }
                        _ => {}
                    }
                }
                if kind == "message_delta"
                    && !client_calls
                    && value.pointer("/delta/stop_reason").and_then(Value::as_str)
                        == Some("tool_use")
                {
                    value["delta"]["stop_reason"] = "end_turn".into();
                }
                match value.get("index").and_then(Value::as_u64) {
                    Some(i) if gone.contains(&i) => false,
                    Some(i) => {
                        value["index"] = shift(&gone, i).into();
                        true
                    }
                    None => true,
                }
            }
            Format::Responses => {
                if kind == "response.output_item.added" {
                    let index = value
                        .get("output_index")
                        .and_then(Value::as_u64)
                        .unwrap_or(0);
                    if value.get("item").is_some_and(|i| is_recall_call(format, i)) {
                        gone.push(index);
                    }
                }
                if let Some(output) = value
                    .pointer_mut("/response/output")
                    .and_then(Value::as_array_mut)
                {
                    output.retain(|i| !is_recall_call(format, i));
                }
                match value.get("output_index").and_then(Value::as_u64) {
                    Some(i) if gone.contains(&i) => false,
                    Some(i) => {
                        value["output_index"] = shift(&gone, i).into();
                        true
                    }
                    None => true,
                }
            }
        };
        if keep {
            event.data = value.to_string();
            out.push(event);
        }
    }
    Some(write_events(&out).into_bytes())
}
