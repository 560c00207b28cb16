//! `tool_decisions = "model"`: asking the summarizer model which old tool
//! calls still matter (seed 004), through the same [`Summarize`] trait as a
//! summary: a frame, the observation
//! ([`crate::compaction::decisions::observation`]) as the user text, and
//! an answer read in one strict JSON shape:
//!
//! ```json
//! {"decisions": [{"id": "<call id>", "action": "keep" | "drop_result" | "drop_call"}]}
//! ```
//!
//! exactly one entry per candidate, nothing else (a `reason` string per
//! entry is allowed and ignored). Anything else is a [`SummarizeError`]:
//! not that JSON is `garbage`, wrong, missing or repeated ids are
//! `invalid-decisions`; the proxy then falls back to the deterministic
//! passes.

use std::collections::HashSet;

use serde::Deserialize;

use super::{Summarize, SummarizeError, SummaryRequest, Usage};
use crate::compaction::decisions::{Action, Candidate, Decisions};

/// The system prompt of a decision call.
pub const FRAME: &str = "You help an AI agent keep its context small. You are shown the agent's \
goal (its latest request), its conversation, and a list of earlier tool calls (candidates) with \
their tool, a shortened input and the size of their result. You do not see the results.\n\
For each candidate decide what the agent still needs for its next action:\n\
- \"keep\": the call and its full result must stay verbatim;\n\
- \"drop_result\": the call still matters, but its full result is not needed (a short head is kept);\n\
- \"drop_call\": neither the call nor its result matters any more.\n\
When unsure, answer \"keep\".\n\
Answer with JSON only, no prose and no code fence, in exactly this shape, with one entry per \
candidate id:\n\
{\"decisions\": [{\"id\": \"<candidate id>\", \"action\": \"keep\"}]}";

/// The most answer tokens a decision call asks for: a few per candidate.
pub fn max_output_tokens(candidates: usize, cap: usize) -> usize {
    (64 + candidates * 24).min(cap.max(64))
}

/// The request for one decision call.
pub fn request(observation: &str, candidates: usize, cap: usize) -> SummaryRequest {
    SummaryRequest {
        system: FRAME.to_owned(),
        user: observation.to_owned(),
        max_output_tokens: max_output_tokens(candidates, cap),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Answer {
    decisions: Vec<Entry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    id: String,
    action: Action,
    #[serde(default)]
    #[allow(dead_code)] // Accepted so a model may say why; not used.
    reason: Option<String>,
}

/// Reads and validates a decision answer against `candidates`: the
/// decisions in candidate order.
pub fn parse(text: &str, candidates: &[Candidate]) -> Result<Decisions, SummarizeError> {
    let answer: Answer = serde_json::from_str(text.trim()).map_err(|_| SummarizeError::Garbage)?;
    let wanted: HashSet<&str> = candidates.iter().map(|c| c.id.as_str()).collect();
    let mut seen = HashSet::new();
    for entry in &answer.decisions {
        if !wanted.contains(entry.id.as_str()) {
            return Err(SummarizeError::InvalidDecisions(format!(
                "no candidate has the id {:?}",
                crate::engine::text::char_prefix(&entry.id, 64)
            )));
        }
        if !seen.insert(entry.id.as_str()) {
            return Err(SummarizeError::InvalidDecisions(
                "a candidate is decided twice".into(),
            ));
        }
    }
    if seen.len() != wanted.len() {
        return Err(SummarizeError::InvalidDecisions(format!(
            "{} of {} candidates are decided",
            seen.len(),
            wanted.len()
        )));
    }
    Ok(candidates
        .iter()
        .map(|c| {
            let action = answer
                .decisions
                .iter()
                .find(|e| e.id == c.id)
                .map(|e| e.action)
                .expect("every candidate is decided");
            (c.id.clone(), action)
        })
        .collect())
}

/// Asks `model` for the decisions on `candidates` given `observation`.
pub async fn decide(
    model: &dyn Summarize,
    observation: &str,
    candidates: &[Candidate],
    max_output_tokens: usize,
) -> Result<(Decisions, Usage), SummarizeError> {
    let request = request(observation, candidates.len(), max_output_tokens);
    let answer = model.summarize(&request).await?;
    Ok((parse(&answer.text, candidates)?, answer.usage))
}

/// The decisions as the store keeps them (the same JSON shape).
pub fn stored_text(decisions: &Decisions) -> String {
    let entries: Vec<serde_json::Value> = decisions
        .iter()
        .map(|(id, action)| serde_json::json!({"id": id, "action": action.as_str()}))
        .collect();
    serde_json::json!({ "decisions": entries }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidates(ids: &[&str]) -> Vec<Candidate> {
        ids.iter()
            .enumerate()
            .map(|(k, id)| Candidate {
                id: (*id).into(),
                name: "read_file".into(),
                arguments: "{}".into(),
                call_item: 2 * k + 1,
                result_item: 2 * k + 2,
                result_chars: 10,
            })
            .collect()
    }

    #[test]
    fn a_valid_answer_is_read_in_candidate_order() {
        let c = candidates(&["a", "b"]);
        let got = parse(
            r#"{"decisions":[{"id":"b","action":"drop_call","reason":"done"},{"id":"a","action":"keep"}]}"#,
            &c,
        )
        .unwrap();
        assert_eq!(
            got,
            [("a".into(), Action::Keep), ("b".into(), Action::DropCall)]
        );
        // What the store keeps reads back the same.
        assert_eq!(parse(&stored_text(&got), &c).unwrap(), got);
    }

    #[test]
    fn anything_else_is_refused() {
        let c = candidates(&["a", "b"]);
        for (answer, reason) in [
            ("Sure! Here you go.", "garbage"),
            (r#"{"decisions":[{"id":"a","action":"maybe"}]}"#, "garbage"),
            (
                r#"{"decisions":[{"id":"a","action":"keep"}],"extra":1}"#,
                "garbage",
            ),
            (
                r#"{"decisions":[{"id":"a","action":"keep"}]}"#,
                "invalid-decisions",
            ),
            (
                r#"{"decisions":[{"id":"a","action":"keep"},{"id":"zz","action":"keep"}]}"#,
                "invalid-decisions",
            ),
            (
                r#"{"decisions":[{"id":"a","action":"keep"},{"id":"a","action":"keep"},{"id":"b","action":"keep"}]}"#,
                "invalid-decisions",
            ),
        ] {
            assert_eq!(parse(answer, &c).unwrap_err().reason(), reason, "{answer}");
        }
    }
}
