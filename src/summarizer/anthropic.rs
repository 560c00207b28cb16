//! Anthropic Messages as a summarizer's wire format.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{checked, SummarizeError, Summary, SummaryRequest, Usage};

/// The API version the requests name (`anthropic-version`).
pub const VERSION: &str = "2023-06-01";

/// The request body: the frame as `system`, the work as one user turn.
pub fn body(model: &str, request: &SummaryRequest) -> Value {
    json!({
        "model": model,
        "max_tokens": request.max_output_tokens,
        "system": request.system,
        "messages": [{"role": "user", "content": request.user}],
    })
}

/// Reads an answer: its text blocks joined, its usage; a `refusal` stop
/// is a refusal.
pub fn read(answer: &[u8]) -> Result<Summary, SummarizeError> {
    #[derive(Deserialize)]
    struct Answer {
        content: Vec<Value>,
        #[serde(default)]
        stop_reason: Option<String>,
        #[serde(default)]
        usage: Option<WireUsage>,
    }
    #[derive(Deserialize)]
    struct WireUsage {
        #[serde(default)]
        input_tokens: Option<u64>,
        #[serde(default)]
        output_tokens: Option<u64>,
    }
    let answer: Answer = serde_json::from_slice(answer).map_err(|_| SummarizeError::Garbage)?;
    if answer.stop_reason.as_deref() == Some("refusal") {
        return Err(SummarizeError::Refusal);
    }
    let usage = answer.usage.map_or(Usage::default(), |u| Usage {
        prompt_tokens: u.input_tokens,
        completion_tokens: u.output_tokens,
    });
    let text = answer
        .content
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text")?.as_str())
        .collect::<String>();
    checked(text, usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_a_system_and_one_user_turn() {
        let request = SummaryRequest {
            system: "frame".into(),
            user: "work".into(),
            max_output_tokens: 512,
        };
        let body = body("claude-haiku-4-5", &request);
        assert_eq!(body["system"], "frame");
        assert_eq!(body["messages"][0]["role"], "user");
        assert_eq!(body["messages"][0]["content"], "work");
        assert_eq!(body["max_tokens"], 512);
    }

    #[test]
    fn answers_give_text_and_usage_or_a_typed_failure() {
        let ok = br#"{"type":"message","content":[{"type":"thinking","thinking":"hm"},{"type":"text","text":"Task: "},{"type":"text","text":"B"}],"stop_reason":"end_turn","usage":{"input_tokens":90,"output_tokens":12}}"#;
        let summary = read(ok).unwrap();
        assert_eq!(summary.text, "Task: B");
        assert_eq!(summary.usage.prompt_tokens, Some(90));
        assert_eq!(summary.usage.completion_tokens, Some(12));
        let refused = br#"{"content":[],"stop_reason":"refusal"}"#;
        assert_eq!(read(refused), Err(SummarizeError::Refusal));
        assert_eq!(read(br#"{"error":{}}"#), Err(SummarizeError::Garbage));
        let empty = br#"{"content":[{"type":"text","text":" "}]}"#;
        assert_eq!(read(empty), Err(SummarizeError::Empty));
    }
}
