//! The recall tool in each format's own shapes: the tool definition added
//! to a forwarded request, the model's turn and the tool's results
//! appended for the follow-up request (this file), and the model's calls
//! and usage read from a response, whole or streamed ([`response`]). Pure:
//! the proxy's recall loop ([`crate::proxy::recall`]) does the I/O.

use serde_json::{json, Value};

use super::splice::span;
use super::{read_top, Format};

mod response;
pub use response::{
    add_usage, events, read_json, read_stream, strip_recall_json, strip_recall_stream,
    with_usage_json, with_usage_stream, write_events, Call, Event, Turn,
};

/// The name of the tool the proxy adds and answers itself.
pub const TOOL_NAME: &str = "compaction_recall";

/// What the model is told about the tool.
pub const DESCRIPTION: &str =
    "The proxy in front of you shortened this conversation to fit your context: \
where it cut or dropped content it left a bracketed `[compaction-proxy ...]` marker \
that ends with a recall id (it starts with `rc_`). \
Call this tool with those ids when you need the exact text that was cut \
(a file's lines, a command's output, an earlier message) to answer correctly; \
do not call it for content you can see. It returns the original text.";

fn parameters() -> Value {
    json!({
        "type": "object",
        "properties": {
            "ids": {
                "type": "array",
                "items": {"type": "string"},
                "description": "Recall ids exactly as the markers give them."
            }
        },
        "required": ["ids"],
        "additionalProperties": false
    })
}

/// The tool definition in `format`'s shape.
pub fn tool(format: Format) -> String {
    let value = match format {
        Format::Chat => json!({
            "type": "function",
            "function": {"name": TOOL_NAME, "description": DESCRIPTION, "parameters": parameters()}
        }),
        Format::Anthropic => {
            json!({"name": TOOL_NAME, "description": DESCRIPTION, "input_schema": parameters()})
        }
        Format::Responses => json!({
            "type": "function", "name": TOOL_NAME, "description": DESCRIPTION,
            "parameters": parameters(), "strict": false
        }),
    };
    serde_json::to_string(&value).expect("JSON values encode")
}

/// Why the proxy did not add its tool to a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotAdded {
    /// The client has a tool of the same name: the client's wins.
    ClientTool,
    /// `tool_choice` forces a tool of the client's or forbids tools.
    ToolChoice,
    /// `tools` is there but not an array.
    Unreadable,
}

impl NotAdded {
    /// The reason as the `x-compaction-recall` header gives it.
    pub fn reason(self) -> &'static str {
        match self {
            NotAdded::ClientTool => "off; client-tool",
            NotAdded::ToolChoice => "off; tool-choice",
            NotAdded::Unreadable => "off; tools-unreadable",
        }
    }
}

/// The name of a tool definition in `format`'s shape.
fn tool_name(format: Format, tool: &Value) -> Option<&str> {
    match format {
        Format::Chat => tool.pointer("/function/name").or_else(|| tool.get("name")),
        Format::Anthropic | Format::Responses => tool.get("name"),
    }
    .and_then(Value::as_str)
}

/// Whether `tool_choice` leaves the model free to call the recall tool.
fn choice_allows_recall(format: Format, choice: &Value) -> bool {
    match choice {
        Value::String(s) => s != "none",
        Value::Object(o) => {
            let kind = o.get("type").and_then(Value::as_str);
            match format {
                Format::Anthropic => matches!(kind, Some("auto" | "any")),
                Format::Chat | Format::Responses => matches!(kind, Some("auto" | "required")),
            }
        }
        Value::Null => true,
        _ => false,
    }
}

/// Whether [`add_tool`] adds the tool to `body` (it reads only the
/// `tools` and `tool_choice` fields).
pub fn adds_tool(format: Format, body: &str) -> bool {
    tools_taking_recall(format, body).is_ok()
}

/// `body`'s `tools` (its raw text when present and not null, and the
/// list), when the recall tool may join them.
fn tools_taking_recall(
    format: Format,
    body: &str,
) -> Result<(Option<&serde_json::value::RawValue>, Vec<Value>), NotAdded> {
    let [tools, choice] =
        read_top(body, ["tools", "tool_choice"]).map_err(|_| NotAdded::Unreadable)?;
    if let Some(choice) = choice {
        let choice: Value = serde_json::from_str(choice.get()).map_err(|_| NotAdded::Unreadable)?;
        if !choice_allows_recall(format, &choice) {
            return Err(NotAdded::ToolChoice);
        }
    }
    let tools = tools.filter(|t| t.get() != "null");
    let list: Vec<Value> = match tools {
        Some(raw) => serde_json::from_str(raw.get()).map_err(|_| NotAdded::Unreadable)?,
        None => Vec::new(),
    };
    if list.iter().any(|t| tool_name(format, t) == Some(TOOL_NAME)) {
        return Err(NotAdded::ClientTool);
    }
    Ok((tools, list))
}

/// `body` with the recall tool added at the end of its `tools` (created
/// when it has none), or why not.
pub fn add_tool(format: Format, body: &str) -> Result<String, NotAdded> {
    let (tools, list) = tools_taking_recall(format, body)?;
    let tool = tool(format);
    match tools {
        Some(raw) => {
            let at = span(body, raw.get());
            let close = body[..at.end].rfind(']').ok_or(NotAdded::Unreadable)?;
            let sep = if list.is_empty() { "" } else { "," };
            Ok(format!("{}{sep}{tool}{}", &body[..close], &body[close..]))
        }
        None => {
            let close = body.rfind('}').ok_or(NotAdded::Unreadable)?;
            let inner = body[..close].trim_end();
            let sep = if inner.ends_with('{') { "" } else { "," };
            Ok(format!("{inner}{sep}\"tools\":[{tool}]{}", &body[close..]))
        }
    }
}

/// `body` with `elements` (JSON text) appended to its compacted array:
/// the follow-up request, which only appends, so the model's reasoning so
/// far stays valid. A Responses `input` string becomes a user message.
pub fn append(format: Format, body: &str, elements: &[String]) -> Option<String> {
    let name = match format {
        Format::Chat | Format::Anthropic => "messages",
        Format::Responses => "input",
    };
    let [raw] = read_top(body, [name]).ok()?;
    let raw = raw?;
    let at = span(body, raw.get());
    let added = elements.join(",");
    if raw.get().starts_with('"') {
        let first = json!({"type": "message", "role": "user", "content": serde_json::from_str::<Value>(raw.get()).ok()?});
        return Some(format!(
            "{}[{first},{added}]{}",
            &body[..at.start],
            &body[at.end..]
        ));
    }
    let close = at.start + raw.get().rfind(']')?;
    let empty = raw.get()[1..raw.get().len() - 1].trim().is_empty();
    let sep = if empty { "" } else { "," };
    Some(format!("{}{sep}{added}{}", &body[..close], &body[close..]))
}

/// The tool's answers, `(call id, text)`, as elements to append.
pub fn results(format: Format, answers: &[(String, String)]) -> Vec<Value> {
    match format {
        Format::Chat => answers
            .iter()
            .map(|(id, text)| json!({"role": "tool", "tool_call_id": id, "content": text}))
            .collect(),
        Format::Anthropic => {
            let blocks: Vec<Value> = answers
                .iter()
                .map(
                    |(id, text)| json!({"type": "tool_result", "tool_use_id": id, "content": text}),
                )
                .collect();
            vec![json!({"role": "user", "content": blocks})]
        }
        Format::Responses => answers
            .iter()
            .map(
                |(id, text)| json!({"type": "function_call_output", "call_id": id, "output": text}),
            )
            .collect(),
    }
}

#[cfg(test)]
mod tests;
