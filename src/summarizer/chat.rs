//! OpenAI chat completions as a summarizer's wire format.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{checked, SummarizeError, Summary, SummaryRequest, Usage};

/// The request body: the frame as the system message, the work as the user's.
pub fn body(model: &str, request: &SummaryRequest) -> Value {
    json!({
        "model": model,
        "messages": [
            {"role": "system", "content": request.system},
            {"role": "user", "content": request.user},
        ],
        "max_completion_tokens": request.max_output_tokens,
        "stream": false,
    })
}

/// Reads an answer: the first choice's text, its usage; a `refusal` or a
/// `content_filter` finish is a refusal.
pub fn read(answer: &[u8]) -> Result<Summary, SummarizeError> {
    #[derive(Deserialize)]
    struct Answer {
        choices: Vec<Choice>,
        #[serde(default)]
        usage: Option<WireUsage>,
    }
    #[derive(Deserialize)]
    struct Choice {
        message: Message,
        #[serde(default)]
        finish_reason: Option<String>,
    }
    #[derive(Deserialize)]
    struct Message {
        #[serde(default)]
        content: Option<Value>,
        #[serde(default)]
        refusal: Option<String>,
    }
    #[derive(Deserialize)]
    struct WireUsage {
        #[serde(default)]
        prompt_tokens: Option<u64>,
        #[serde(default)]
        completion_tokens: Option<u64>,
    }
    let answer: Answer = serde_json::from_slice(answer).map_err(|_| SummarizeError::Garbage)?;
    let choice = answer
        .choices
        .into_iter()
        .next()
        .ok_or(SummarizeError::Garbage)?;
    let usage = answer.usage.map_or(Usage::default(), |u| Usage {
        prompt_tokens: u.prompt_tokens,
        completion_tokens: u.completion_tokens,
    });
    if choice.message.refusal.is_some_and(|r| !r.is_empty())
        || choice.finish_reason.as_deref() == Some("content_filter")
    {
        return Err(SummarizeError::Refusal);
    }
    let text = match choice.message.content {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(text)) => text,
        // Content parts: their texts joined.
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text")?.as_str())
            .collect(),
        Some(_) => return Err(SummarizeError::Garbage),
    };
    checked(text, usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_carries_frame_work_and_limit() {
        let request = SummaryRequest {
            system: "frame".into(),
            user: "work".into(),
            max_output_tokens: 300,
        };
        let body = body("gpt-4o-mini", &request);
        assert_eq!(body["messages"][0]["role"], "system");
        assert_eq!(body["messages"][0]["content"], "frame");
        assert_eq!(body["messages"][1]["content"], "work");
        assert_eq!(body["max_completion_tokens"], 300);
        assert_eq!(body["model"], "gpt-4o-mini");
    }

    #[test]
    fn answers_give_text_and_usage_or_a_typed_failure() {
        let ok = br#"{"choices":[{"message":{"role":"assistant","content":"Task: A"},"finish_reason":"stop"}],"usage":{"prompt_tokens":120,"completion_tokens":30}}"#;
        let summary = read(ok).unwrap();
        assert_eq!(summary.text, "Task: A");
        assert_eq!(summary.usage.prompt_tokens, Some(120));
        assert_eq!(summary.usage.completion_tokens, Some(30));
        let no_usage = br#"{"choices":[{"message":{"content":"x"}}]}"#;
        assert_eq!(read(no_usage).unwrap().usage, Usage::default());
        let refused = br#"{"choices":[{"message":{"content":null,"refusal":"no"}}]}"#;
        assert_eq!(read(refused), Err(SummarizeError::Refusal));
        let filtered =
            br#"{"choices":[{"message":{"content":"x"},"finish_reason":"content_filter"}]}"#;
        assert_eq!(read(filtered), Err(SummarizeError::Refusal));
        assert_eq!(read(b"<html>"), Err(SummarizeError::Garbage));
        assert_eq!(read(br#"{"choices":[]}"#), Err(SummarizeError::Garbage));
        let empty = br#"{"choices":[{"message":{"content":""}}]}"#;
        assert_eq!(read(empty), Err(SummarizeError::Empty));
    }
}
