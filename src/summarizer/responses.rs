//! OpenAI Responses as a summarizer's wire format.

use serde::Deserialize;
use serde_json::{json, Value};

use super::{checked, SummarizeError, Summary, SummaryRequest, Usage};

/// The request body: the frame as `instructions`, the work as the input;
/// nothing is stored on the provider's side.
pub fn body(model: &str, request: &SummaryRequest) -> Value {
    json!({
        "model": model,
        "instructions": request.system,
        "input": request.user,
        "max_output_tokens": request.max_output_tokens,
        "store": false,
    })
}

/// Reads an answer: the `output_text` parts of its message items joined,
/// its usage; a `refusal` part is a refusal.
pub fn read(answer: &[u8]) -> Result<Summary, SummarizeError> {
    #[derive(Deserialize)]
    struct Answer {
        output: Vec<Value>,
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
    let usage = answer.usage.map_or(Usage::default(), |u| Usage {
        prompt_tokens: u.input_tokens,
        completion_tokens: u.output_tokens,
    });
    let mut text = String::new();
    for item in &answer.output {
        if item.get("type").and_then(Value::as_str) != Some("message") {
            continue;
        }
        let Some(parts) = item.get("content").and_then(Value::as_array) else {
            continue;
        };
        for part in parts {
            match part.get("type").and_then(Value::as_str) {
                Some("refusal") => return Err(SummarizeError::Refusal),
                Some("output_text") => {
                    text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                }
                _ => {}
            }
        }
    }
    checked(text, usage)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_has_instructions_and_input() {
        let request = SummaryRequest {
            system: "frame".into(),
            user: "work".into(),
            max_output_tokens: 200,
        };
        let body = body("gpt-5-mini", &request);
        assert_eq!(body["instructions"], "frame");
        assert_eq!(body["input"], "work");
        assert_eq!(body["max_output_tokens"], 200);
        assert_eq!(body["store"], false);
    }

    #[test]
    fn answers_give_text_and_usage_or_a_typed_failure() {
        let ok = br#"{"output":[{"type":"reasoning","summary":[]},{"type":"message","role":"assistant","content":[{"type":"output_text","text":"Task: C"}]}],"usage":{"input_tokens":70,"output_tokens":9}}"#;
        let summary = read(ok).unwrap();
        assert_eq!(summary.text, "Task: C");
        assert_eq!(summary.usage.prompt_tokens, Some(70));
        assert_eq!(summary.usage.completion_tokens, Some(9));
        let refused =
            br#"{"output":[{"type":"message","content":[{"type":"refusal","refusal":"no"}]}]}"#;
        assert_eq!(read(refused), Err(SummarizeError::Refusal));
        assert_eq!(read(b"null"), Err(SummarizeError::Garbage));
        assert_eq!(read(br#"{"output":[]}"#), Err(SummarizeError::Empty));
    }
}
