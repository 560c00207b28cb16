//! The summarizer's prompt: a frame the proxy owns (replaceable by the
//! operator), the policy's instructions inside it, a size hint as words,
//! and the transcript of what is summarized, tool traffic rendered
//! compactly.
//!
//! The default frame follows the structured summary prompt of AgentScope's
//! compaction (a Java agent framework): one summary with fixed sections the
//! next turn can rely on. Instructions go inside the frame, as Algolia's
//! context-compaction API does, so the model follows them without echoing
//! them into the summary.

use std::collections::HashMap;

use crate::engine::text::{char_count, char_prefix};
use crate::engine::Role;
use crate::format::Item;

/// The default frame. `{instructions}` and `{size}` mark where the
/// policy's guidance and the size hint go.
pub const DEFAULT_FRAME: &str = "\
You write the summary that replaces the older part of a conversation between a user and an AI assistant that may call tools. \
The assistant continues from your summary and the most recent messages, which it still sees verbatim. \
Write only the summary, with no preamble, under these headings:

## Task
What the user asked for and why, in their own words where the wording matters.
## Decisions
What was decided or done, and what was ruled out, with the reasons.
## Files and identifiers
Every file path, function, command, URL, ID, number and name that still matters, exactly as written.
## Open items
What is unfinished, failing, or promised next.
## The user's constraints
The preferences, requirements and prohibitions the user stated.

Keep every fact exact and invent none. Leave out a heading with nothing under it.
{instructions}{size}";

/// Longest tool-call arguments in a transcript, in chars.
pub const MAX_ARGUMENT_CHARS: usize = 200;
/// Longest tool result in a transcript, in chars: its first
/// [`RESULT_HEAD_CHARS`] and its last [`RESULT_TAIL_CHARS`]. Results are
/// most of what a summary replaces in an agent's session (three quarters
/// of the transcript at 1,000 chars a result on the summaries bench), the
/// summarizer reads each once at full price, and what a summary keeps of a
/// result is its identifiers and outcome: where the result starts (the
/// file, the command) and how it ends (the error, the test verdict).
pub const MAX_RESULT_CHARS: usize = RESULT_HEAD_CHARS + RESULT_TAIL_CHARS;
/// The head of a capped tool result in a transcript, in chars.
pub const RESULT_HEAD_CHARS: usize = 350;
/// The tail of a capped tool result in a transcript, in chars.
pub const RESULT_TAIL_CHARS: usize = 150;

/// What shapes a policy's prompt; part of a summary's store key.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct PromptSettings {
    /// The operator's frame; `None`: [`DEFAULT_FRAME`].
    pub frame: Option<String>,
    pub instructions: String,
    /// Desired summary size in tokens; 0: concise.
    pub target_tokens: usize,
}

impl PromptSettings {
    /// The system prompt of every call.
    pub fn system(&self) -> String {
        let frame = self.frame.as_deref().unwrap_or(DEFAULT_FRAME);
        let instructions = if self.instructions.trim().is_empty() {
            String::new()
        } else {
            format!(
                "\nFollow this guidance, without quoting it in the summary:\n<guidance>\n{}\n</guidance>\n",
                self.instructions.trim()
            )
        };
        let size = format!("\n{}", size_guidance(self.target_tokens));
        let mut out = frame.replace("{instructions}", &instructions);
        // A frame without the marks still gets both, at its end.
        if !frame.contains("{instructions}") {
            out.push_str(&instructions);
        }
        if frame.contains("{size}") {
            out = out.replace("{size}", &size);
        } else {
            out.push_str(&size);
        }
        out
    }
}

/// A size hint in words: about three quarters of a word per token, the
/// usual ratio of English text.
pub fn size_guidance(target_tokens: usize) -> String {
    if target_tokens == 0 {
        return "Be concise.".into();
    }
    let words = (target_tokens * 3 / 4).max(10);
    format!("Aim for about {words} words.")
}

/// The user message of a map call: a transcript part.
pub fn map_input(transcript: &str, part: Option<(usize, usize)>) -> String {
    match part {
        Some((n, of)) => format!(
            "Part {n} of {of} of the conversation to summarize, oldest first:\n\n{transcript}"
        ),
        None => format!("The conversation to summarize, oldest first:\n\n{transcript}"),
    }
}

/// The user message of a reduce call: partial summaries to merge.
pub fn reduce_input(parts: &[String]) -> String {
    let mut out = String::from(
        "Summaries of consecutive parts of one conversation, oldest first. Merge them into one summary under the same headings:\n",
    );
    for (i, part) in parts.iter().enumerate() {
        out.push_str(&format!(
            "\n<part {}>\n{}\n</part {}>\n",
            i + 1,
            part,
            i + 1
        ));
    }
    out
}

/// The transcript piece that stands for an earlier summary being extended.
pub fn previous_summary(text: &str) -> String {
    format!("[summary of the conversation before this point]\n{text}")
}

/// Each item as one transcript entry: its role, its text, its tool calls
/// by name with shortened arguments, tool results by the tool's name and
/// capped.
pub fn render(items: &[&Item]) -> Vec<String> {
    let mut names: HashMap<&str, &str> = HashMap::new();
    for item in items {
        for call in &item.tool_calls {
            names.insert(call.id.as_str(), call.name.as_str());
        }
    }
    items.iter().map(|item| render_item(item, &names)).collect()
}

fn render_item(item: &Item, names: &HashMap<&str, &str>) -> String {
    let role = match item.role {
        Role::System => "system",
        Role::Developer => "developer",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
        Role::Function => "function",
    };
    let mut out = String::new();
    let text = item.text.trim();
    if let Some(id) = &item.answers {
        let name = names.get(id.as_str()).copied().unwrap_or("tool");
        out.push_str(&format!("[result of {name}] {}", capped_result(text)));
    } else if !item.piece_answers.is_empty() {
        // Several results in one item (Anthropic tool_result blocks).
        let mut at = 0;
        let chars: Vec<char> = item.text.chars().collect();
        for (len, id) in item.piece_chars.iter().zip(&item.piece_answers) {
            let piece: String = chars[at.min(chars.len())..(at + len).min(chars.len())]
                .iter()
                .collect();
            at += len;
            let name = names.get(id.as_str()).copied().unwrap_or("tool");
            if !out.is_empty() {
                out.push('\n');
            }
            out.push_str(&format!(
                "[result of {name}] {}",
                capped_result(piece.trim())
            ));
        }
        let rest: String = chars[at.min(chars.len())..].iter().collect();
        if !rest.trim().is_empty() {
            out.push_str(&format!("\n{role}: {}", rest.trim()));
        }
    } else if !text.is_empty() {
        out.push_str(&format!("{role}: {text}"));
    }
    for call in &item.tool_calls {
        if !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&format!(
            "[{role} calls {}({})]",
            call.name,
            capped_argument(call.arguments.trim())
        ));
    }
    if out.is_empty() {
        out = format!("{role}: (no text)");
    }
    out
}

/// Tool-call arguments as a transcript shows them: cut to
/// [`MAX_ARGUMENT_CHARS`], saying how much was left out.
pub fn capped_argument(text: &str) -> String {
    let chars = char_count(text);
    if chars <= MAX_ARGUMENT_CHARS {
        return text.to_owned();
    }
    format!(
        "{}… [{} more chars]",
        char_prefix(text, MAX_ARGUMENT_CHARS),
        chars - MAX_ARGUMENT_CHARS
    )
}

/// A tool result as a transcript shows it: at most [`MAX_RESULT_CHARS`],
/// its head and its tail around a note of how much was left out.
pub fn capped_result(text: &str) -> String {
    let chars = char_count(text);
    if chars <= MAX_RESULT_CHARS {
        return text.to_owned();
    }
    let head = char_prefix(text, RESULT_HEAD_CHARS);
    let tail_start = text
        .char_indices()
        .nth(chars - RESULT_TAIL_CHARS)
        .map_or(text.len(), |(byte, _)| byte);
    format!(
        "{head} … [{} chars left out] … {}",
        chars - MAX_RESULT_CHARS,
        &text[tail_start..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ToolCall;

    #[test]
    fn instructions_and_size_go_inside_the_frame() {
        let settings = PromptSettings {
            frame: None,
            instructions: "keep every product reference".into(),
            target_tokens: 400,
        };
        let system = settings.system();
        let guidance = system.find("keep every product reference").unwrap();
        assert!(system.find("## Task").unwrap() < guidance);
        assert!(system.contains("Aim for about 300 words."));
        assert!(!system.contains("{instructions}") && !system.contains("{size}"));
        let plain = PromptSettings::default().system();
        assert!(plain.contains("Be concise.") && !plain.contains("guidance"));
    }

    #[test]
    fn an_operator_frame_replaces_ours_and_still_gets_the_guidance() {
        let settings = PromptSettings {
            frame: Some("Summarize tersely.".into()),
            instructions: "mention prices".into(),
            target_tokens: 0,
        };
        let system = settings.system();
        assert!(system.starts_with("Summarize tersely."));
        assert!(system.contains("mention prices") && system.contains("Be concise."));
        assert!(!system.contains("## Task"));
    }

    #[test]
    fn tool_traffic_is_rendered_by_name_shortened_and_capped() {
        let mut call = Item::new(Role::Assistant, "Reading it.");
        call.tool_calls.push(ToolCall {
            id: "c1".into(),
            name: "read_file".into(),
            arguments: format!(r#"{{"path":"src/main.rs","pad":"{}"}}"#, "x".repeat(500)),
        });
        let mut result = Item::new(Role::Tool, "y".repeat(3000));
        result.answers = Some("c1".into());
        let user = Item::new(Role::User, "Fix DE-4471.");
        let out = render(&[&user, &call, &result]);
        assert_eq!(out[0], "user: Fix DE-4471.");
        assert!(out[1].starts_with(
            "assistant: Reading it.\n[assistant calls read_file({\"path\":\"src/main.rs\""
        ));
        assert!(out[1].contains("more chars]"));
        assert!(out[1].chars().count() < 300);
        assert!(out[2].starts_with("[result of read_file] yyy"));
        assert!(out[2].contains(" … [2500 chars left out] … yyy"));
        assert!(out[2].chars().count() < 600);
    }

    #[test]
    fn a_capped_result_keeps_its_head_and_its_tail() {
        let text = format!("cargo test{}test result: FAILED", "·".repeat(5000));
        let out = capped_result(&text);
        assert!(out.starts_with("cargo test··"), "{out}");
        assert!(out.ends_with("··test result: FAILED"), "{out}");
        let left_out = char_count(&text) - MAX_RESULT_CHARS;
        assert!(out.contains(&format!("[{left_out} chars left out]")));
        let kept = char_count(&out) - char_count(&format!(" … [{left_out} chars left out] … "));
        assert_eq!(kept, MAX_RESULT_CHARS);
        let short = "x".repeat(MAX_RESULT_CHARS);
        assert_eq!(capped_result(&short), short);
    }
}
