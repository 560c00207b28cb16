//! Recognises a coding agent's own compaction request: the request in
//! which Claude Code, Codex or opencode asks the model for a summary of
//! its whole history. The proxy forwards it untouched (`skipped;
//! agent-compaction`), so the agent summarizes all it has, not a part.
//!
//! It runs on every request, so it looks at the tail first (the last
//! item's text, a few prefix comparisons) and reads a top-level field only
//! when the tail already matches:
//! - **Claude Code** (Messages): the last user message ends in a text block
//!   starting "CRITICAL: Respond with TEXT ONLY" that asks to "create a
//!   detailed summary of the conversation so far";
//! - **Codex** with a custom provider (Responses): the input ends in a user
//!   message starting "You are performing a CONTEXT CHECKPOINT COMPACTION",
//!   and the request offers no tools (`tools: []`) or says `request_kind:
//!   "compaction"` (in `metadata`, or in `client_metadata`'s
//!   `x-codex-turn-metadata`);
//! - **opencode** (chat completions): a system message starting "You are a
//!   context summarization agent", then one user message holding the
//!   conversation as text, and no tools.

use std::borrow::Cow;

use super::{read_top, Format, Parsed};
use crate::engine::Role;

/// An agent whose compaction request is recognised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    ClaudeCode,
    Codex,
    Opencode,
}

impl Agent {
    pub fn name(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "claude-code",
            Agent::Codex => "codex",
            Agent::Opencode => "opencode",
        }
    }
}

const CLAUDE_CODE_START: &str = "CRITICAL: Respond with TEXT ONLY";
const CLAUDE_CODE_ASK: &str = "create a detailed summary of the conversation so far";
const CODEX_START: &str = "You are performing a CONTEXT CHECKPOINT COMPACTION";
const OPENCODE_START: &str = "You are a context summarization agent";

/// How far into a text the Claude Code request's ask is looked for.
const ASK_WITHIN: usize = 4096;

impl Parsed<'_> {
    /// The agent whose own compaction request this body is, if any.
    pub fn agent_compaction(&self) -> Option<Agent> {
        let items = &self.conversation.items;
        let last = items.len().checked_sub(1)?;
        let texts = &self.wire[last].texts;
        match self.format {
            Format::Anthropic => {
                if !matches!(items[last].role, Role::User | Role::Tool) {
                    return None;
                }
                // The block is appended: the last text piece, a block of
                // its own (not a tool result's text).
                let t = texts
                    .last()
                    .filter(|t| t.element.is_some_and(|e| e.array == 0))?;
                let text = t.text.trim_start();
                let head = &text[..floor(text, ASK_WITHIN)];
                (text.starts_with(CLAUDE_CODE_START) && head.contains(CLAUDE_CODE_ASK))
                    .then_some(Agent::ClaudeCode)
            }
            Format::Responses => {
                let starts = items[last].role == Role::User
                    && texts
                        .first()
                        .is_some_and(|t| t.text.trim_start().starts_with(CODEX_START));
                if !starts {
                    return None;
                }
                let [tools, metadata, client] =
                    read_top(self.body, ["tools", "metadata", "client_metadata"]).ok()?;
                let kind = metadata
                    .and_then(|m| read_top(m.get(), ["request_kind"]).ok())
                    .and_then(|[kind]| serde_json::from_str::<Cow<str>>(kind?.get()).ok());
                // Codex also says it in its turn metadata, a JSON string.
                let turn = client
                    .and_then(|m| read_top(m.get(), ["x-codex-turn-metadata"]).ok())
                    .and_then(|[turn]| serde_json::from_str::<Cow<str>>(turn?.get()).ok())
                    .and_then(|turn| {
                        let [kind] = read_top(&turn, ["request_kind"]).ok()?;
                        serde_json::from_str::<String>(kind?.get()).ok()
                    });
                let compaction = |k: Option<&str>| k == Some("compaction");
                (no_tools(tools) || compaction(kind.as_deref()) || compaction(turn.as_deref()))
                    .then_some(Agent::Codex)
            }
            Format::Chat => {
                // System messages, then the one user message.
                let (user, before) = items.split_last()?;
                let shape = user.role == Role::User
                    && !before.is_empty()
                    && before
                        .iter()
                        .all(|m| matches!(m.role, Role::System | Role::Developer))
                    && before
                        .iter()
                        .any(|m| m.text.trim_start().starts_with(OPENCODE_START));
                if !shape {
                    return None;
                }
                let [tools] = read_top(self.body, ["tools"]).ok()?;
                no_tools(tools).then_some(Agent::Opencode)
            }
        }
    }
}

/// No tools offered: the field missing, `null` or `[]`.
fn no_tools(tools: Option<&serde_json::value::RawValue>) -> bool {
    tools.map_or(true, |t| {
        let t = t.get();
        t == "null" || (t.starts_with('[') && t[1..t.len() - 1].trim().is_empty())
    })
}

/// The largest char boundary of `text` at most `at`.
fn floor(text: &str, at: usize) -> usize {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn agent(format: Format, body: &Value) -> Option<Agent> {
        let bytes = serde_json::to_vec(body).unwrap();
        format.parse(&bytes, usize::MAX).unwrap().agent_compaction()
    }

    /// Claude Code's summary request, as it appends it to the last user
    /// message (its wording, shortened).
    pub(crate) fn claude_code_summary() -> String {
        "CRITICAL: Respond with TEXT ONLY. Do NOT call any tools.\n\n- Do NOT use Read, Bash, Grep, Glob, Edit, Write, or ANY other tool.\n- You already have all the context you need in the conversation above.\n\nYour task is to create a detailed summary of the conversation so far, paying close attention to the user's explicit requests and your previous actions.".to_owned()
    }

    #[test]
    fn claude_codes_summary_request_is_recognised_by_its_last_block() {
        let body = |last: Value| {
            json!({"model": "claude-sonnet-4-5", "max_tokens": 20000,
            "tools": [{"name": "Read", "input_schema": {"type": "object"}}],
            "messages": [
                {"role": "user", "content": "fix the bug"},
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
                {"role": "user", "content": last}
            ]})
        };
        let summary = claude_code_summary();
        let asked = body(json!([
            {"type": "tool_result", "tool_use_id": "t1", "content": "fn main() {}"},
            {"type": "text", "text": summary}
        ]));
        assert_eq!(agent(Format::Anthropic, &asked), Some(Agent::ClaudeCode));
        // The same words anywhere but at the end, or only half of them, are
        // an ordinary request.
        let quoted = body(json!([
            {"type": "tool_result", "tool_use_id": "t1", "content": summary},
            {"type": "text", "text": "what does this prompt do?"}
        ]));
        assert_eq!(agent(Format::Anthropic, &quoted), None);
        let half = body(json!([
            {"type": "tool_result", "tool_use_id": "t1", "content": "x"},
            {"type": "text", "text": "CRITICAL: Respond with TEXT ONLY. Keep it short."}
        ]));
        assert_eq!(agent(Format::Anthropic, &half), None);
    }

    #[test]
    fn codexs_checkpoint_request_needs_no_tools_or_its_request_kind() {
        let checkpoint = "You are performing a CONTEXT CHECKPOINT COMPACTION. Create a handoff summary for another LLM that will resume the task.";
        let body = |tools: Value, metadata: Value| {
            json!({"model": "gpt-5-codex", "tools": tools, "metadata": metadata, "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the bug"}]},
                {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "c1", "output": "ok"},
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": checkpoint}]}
            ]})
        };
        let tool = json!([{"type": "function", "name": "shell"}]);
        assert_eq!(
            agent(Format::Responses, &body(json!([]), json!(null))),
            Some(Agent::Codex)
        );
        assert_eq!(
            agent(
                Format::Responses,
                &body(tool.clone(), json!({"request_kind": "compaction"}))
            ),
            Some(Agent::Codex)
        );
        assert_eq!(
            agent(
                Format::Responses,
                &body(tool, json!({"request_kind": "turn"}))
            ),
            None
        );
    }

    #[test]
    fn opencodes_summarization_agent_is_recognised_without_tools() {
        let body = |tools: Option<Value>| {
            let mut body = json!({"model": "gpt-4.1", "messages": [
                {"role": "system", "content": "You are a context summarization agent. You are given a conversation between a user and an agent."},
                {"role": "user", "content": "Here is the conversation so far:\n<conversation>\nuser: fix the bug\n</conversation>"}
            ]});
            if let Some(tools) = tools {
                body["tools"] = tools;
            }
            body
        };
        assert_eq!(agent(Format::Chat, &body(None)), Some(Agent::Opencode));
        assert_eq!(
            agent(Format::Chat, &body(Some(json!([])))),
            Some(Agent::Opencode)
        );
        let with_tools = body(Some(
            json!([{"type": "function", "function": {"name": "read"}}]),
        ));
        assert_eq!(agent(Format::Chat, &with_tools), None);
        // A conversation that goes on after the user message is not it.
        let mut longer = body(None);
        longer["messages"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "assistant", "content": "sure"}));
        assert_eq!(agent(Format::Chat, &longer), None);
    }
}
