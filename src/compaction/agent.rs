//! Agent passes: cheap, deterministic edits of tool traffic that run before
//! the engine (seed 002's `PruneConfig` and `TruncateArgsConfig`, seed 004's
//! tool units), on the neutral model.
//!
//! In order, each stopping as soon as the conversation fits its budget:
//! 1. **tool dedupe**: a tool result near-identical (word Jaccard at least
//!    `tool_duplicate_threshold`) to an earlier result of the same tool
//!    becomes a short marker naming the earlier call;
//! 2. **prune**: tool results older than the protected window and longer
//!    than `max_tool_result_chars` become head + marker + tail;
//! 3. **clip**: string values longer than `max_arg_chars` inside the JSON
//!    arguments of tool calls older than the protected window are cut, the
//!    rest of the JSON keeping its bytes.
//!
//! The **protected window** is the most recent tool output, walking back
//! from the newest item, up to `protect_tool_chars` chars and at most
//! `protect_tool_share` of the budget: a tail of huge tool results cannot
//! by itself keep a request over its budget.
//!
//! Never touched: pinned items (the caller's pins: fixed items, the first
//! user message, pin patterns, kept roles), `excluded_tools`, and, when
//! `eligible_tools` is set, every other tool. The passes only change text
//! and arguments; dropping whole units stays the engine's job.
//!
//! Pure: no I/O, and the same input always gives the same bytes.

use std::collections::HashMap;

pub use crate::engine::text::omission_marker;
use crate::engine::text::{char_count, char_prefix, MarkedSet, Vocabulary, WordSets};
use crate::engine::Role;
use crate::format::Conversation;

/// The agent passes' settings (policy keys of the same names).
#[derive(Debug, Clone, PartialEq)]
pub struct AgentPolicy {
    /// Longer tool results outside the protected window are pruned; 0 = off.
    pub max_tool_result_chars: usize,
    pub protect_tool_chars: usize,
    pub protect_tool_share: f64,
    /// Pruning runs only when it would save this much, or the whole excess.
    pub prune_minimum_chars: usize,
    /// Longer argument string values outside the window are clipped; 0 = off.
    pub max_arg_chars: usize,
    /// 0 = tool dedupe off.
    pub tool_duplicate_threshold: f64,
    pub excluded_tools: Vec<String>,
    /// Empty: every tool not excluded.
    pub eligible_tools: Vec<String>,
    /// 0 = no trigger of this kind.
    pub trigger_chars: usize,
    pub trigger_messages: usize,
    pub trigger_tokens: usize,
}

impl AgentPolicy {
    /// Seed 002's defaults, converted at 4 chars per token: protect 40k
    /// tokens of tool output, prune when 20k tokens are prunable, clip
    /// arguments at 2,000 chars.
    pub const DEFAULT: AgentPolicy = AgentPolicy {
        max_tool_result_chars: 2_000,
        protect_tool_chars: 160_000,
        protect_tool_share: 0.5,
        prune_minimum_chars: 80_000,
        max_arg_chars: 2_000,
        tool_duplicate_threshold: 0.9,
        excluded_tools: Vec::new(),
        eligible_tools: Vec::new(),
        trigger_chars: 0,
        trigger_messages: 0,
        trigger_tokens: 0,
    };

    /// Every pass off and no trigger: the engine alone.
    pub const OFF: AgentPolicy = AgentPolicy {
        max_tool_result_chars: 0,
        protect_tool_chars: 0,
        protect_tool_share: 0.0,
        prune_minimum_chars: 0,
        max_arg_chars: 0,
        tool_duplicate_threshold: 0.0,
        excluded_tools: Vec::new(),
        eligible_tools: Vec::new(),
        trigger_chars: 0,
        trigger_messages: 0,
        trigger_tokens: 0,
    };

    /// The least a pruned result or clipped value keeps, so head and tail
    /// say something.
    pub const MIN_KEPT_CHARS: usize = 16;

    /// Whether any trigger is reached (or none is set). Below every set
    /// trigger a request goes as it came, even over its budget.
    /// `tokens` counts the conversation's tokens, asked only when a token
    /// trigger is set.
    pub fn triggered(&self, conversation: &Conversation, tokens: impl FnOnce() -> usize) -> bool {
        if self.trigger_chars == 0 && self.trigger_messages == 0 && self.trigger_tokens == 0 {
            return true;
        }
        (self.trigger_chars > 0 && conversation.total_chars() >= self.trigger_chars)
            || (self.trigger_messages > 0 && conversation.items.len() >= self.trigger_messages)
            || (self.trigger_tokens > 0 && tokens() >= self.trigger_tokens)
    }

    fn touches(&self, tool: Option<&str>) -> bool {
        match tool {
            Some(name) => {
                !self.excluded_tools.iter().any(|t| t == name)
                    && (self.eligible_tools.is_empty()
                        || self.eligible_tools.iter().any(|t| t == name))
            }
            // A result whose call is missing: its tool is unknown.
            None => self.eligible_tools.is_empty(),
        }
    }

    pub(crate) fn any_pass(&self) -> bool {
        self.max_tool_result_chars > 0
            || self.max_arg_chars > 0
            || self.tool_duplicate_threshold > 0.0
    }
}

/// Which pass changed an item's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TextEdit {
    /// Head + marker + tail.
    Pruned(String),
    /// A marker naming the earlier call with the same output.
    Deduped { text: String, of: String },
}

impl TextEdit {
    pub fn text(&self) -> &str {
        match self {
            TextEdit::Pruned(t) => t,
            TextEdit::Deduped { text, .. } => text,
        }
    }
}

/// What the passes changed, by item index.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AgentEdits {
    pub texts: HashMap<usize, TextEdit>,
    /// New arguments by item, as (call position, JSON text).
    pub arguments: HashMap<usize, Vec<(usize, String)>>,
    /// Items pruned result by result
    /// ([`Item::piece_chars`](crate::format::Item::piece_chars)): each
    /// piece's new text, whose join is the item's `Pruned` text.
    pub pieces: HashMap<usize, Vec<String>>,
}

impl AgentEdits {
    pub fn is_empty(&self) -> bool {
        self.texts.is_empty() && self.arguments.is_empty()
    }

    /// The conversation with the edits applied: what the engine sees next.
    pub fn apply(&self, conversation: &Conversation) -> Conversation {
        let mut out = conversation.clone();
        for (&i, edit) in &self.texts {
            let item = &mut out.items[i];
            item.text = edit.text().to_owned();
            item.piece_chars = self
                .pieces
                .get(&i)
                .map(|pieces| pieces.iter().map(|p| char_count(p)).collect())
                .unwrap_or_default();
        }
        for (&i, args) in &self.arguments {
            let item = &mut out.items[i];
            for (call, new) in args {
                let old = &mut item.tool_calls[*call].arguments;
                item.fixed_chars = item.fixed_chars - char_count(old) + char_count(new);
                *old = new.clone();
            }
        }
        out
    }

    /// Chars the dedupe and prune passes removed from item `i`'s text
    /// (`text_chars` chars long), as (pruned, deduped).
    pub fn text_saving(&self, text_chars: usize, i: usize) -> (usize, usize) {
        match self.texts.get(&i) {
            None => (0, 0),
            Some(edit) => {
                let saved = text_chars.saturating_sub(char_count(edit.text()));
                match edit {
                    TextEdit::Pruned(_) => (saved, 0),
                    TextEdit::Deduped { .. } => (0, saved),
                }
            }
        }
    }

    /// Chars the clip pass removed from item `i`'s arguments.
    pub fn clip_saving(&self, conversation: &Conversation, i: usize) -> usize {
        self.arguments.get(&i).map_or(0, |args| {
            args.iter()
                .map(|(call, new)| {
                    char_count(&conversation.items[i].tool_calls[*call].arguments)
                        .saturating_sub(char_count(new))
                })
                .sum()
        })
    }
}

/// The text that stands for a tool result repeating call `of`'s.
pub fn duplicate_marker(of: &str) -> String {
    format!("[same output as tool call {of}]")
}

/// `text` cut to `keep` chars, half head and half tail around a marker;
/// `None` when that is not shorter.
pub fn head_and_tail(text: &str, keep: usize) -> Option<String> {
    let chars = char_count(text);
    let head = keep / 2;
    let tail = keep - head;
    let omitted = chars.checked_sub(keep)?;
    let marker = omission_marker(omitted);
    if keep + char_count(&marker) + 2 >= chars {
        return None;
    }
    // Counted from the end: the tail is short, the text may not be.
    let tail_start = match tail {
        0 => text.len(),
        _ if chars == text.len() => text.len() - tail,
        _ => text
            .char_indices()
            .rev()
            .nth(tail - 1)
            .map_or(0, |(at, _)| at),
    };
    Some(format!(
        "{}\n{marker}\n{}",
        char_prefix(text, head),
        &text[tail_start..]
    ))
}

/// JSON text `arguments` with every string value (not key) longer than
/// `max` chars cut to `max` chars and a marker; every other byte as it was.
/// `None` when nothing is cut or the text is not JSON.
pub fn clip_arguments(arguments: &str, max: usize) -> Option<String> {
    serde_json::from_str::<serde::de::IgnoredAny>(arguments).ok()?;
    let bytes = arguments.as_bytes();
    let mut out = String::with_capacity(arguments.len());
    let mut copied = 0;
    let mut at = 0;
    let mut changed = false;
    while at < bytes.len() {
        if bytes[at] != b'"' {
            at += 1;
            continue;
        }
        // The string literal's end: the next unescaped quote.
        let start = at;
        at += 1;
        while at < bytes.len() && bytes[at] != b'"' {
            at += if bytes[at] == b'\\' { 2 } else { 1 };
        }
        let end = (at + 1).min(bytes.len());
        at = end;
        let literal = &arguments[start..end];
        let is_key = arguments[end..].trim_start().starts_with(':');
        // Cheap skip: the literal's bytes bound its chars from above.
        if is_key || literal.len() <= max + 2 {
            continue;
        }
        let Ok(value) = serde_json::from_str::<String>(literal) else {
            continue;
        };
        let chars = char_count(&value);
        if chars <= max {
            continue;
        }
        let clipped = format!(
            "{} {}",
            char_prefix(&value, max),
            omission_marker(chars - max)
        );
        if char_count(&clipped) >= chars {
            continue;
        }
        out.push_str(&arguments[copied..start]);
        out.push_str(&crate::format::splice::json_string(&clipped));
        copied = end;
        changed = true;
    }
    if !changed {
        return None;
    }
    out.push_str(&arguments[copied..]);
    Some(out)
}

/// ReMe's decision for one tool call (seed 004), derived from what the
/// forwarded plan did to the call and its results.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum UnitDecision {
    /// The call and its whole results were forwarded.
    Keep,
    /// The call was forwarded; a result was shortened (pruned to head +
    /// marker + tail, replaced by a same-output marker, or trimmed).
    DropResult,
    /// The call went, and its results with it (the unit was dropped).
    DropCall,
}

/// One tool call's decision, for the report.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CallDecision {
    pub id: String,
    pub name: String,
    pub decision: UnitDecision,
    /// String values in its arguments were clipped (`max_arg_chars`); the
    /// decision is about its results.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub arguments_clipped: bool,
    /// `"model"` when a decision model judged the call
    /// (`tool_decisions = "model"`); absent for the passes' own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decided_by: Option<&'static str>,
    /// The item making the call.
    #[serde(skip)]
    pub item: usize,
    /// The items answering it.
    #[serde(skip)]
    pub results: Vec<usize>,
}

/// Every tool call's decision under `plan` (`None`: everything forwarded
/// as it came), in call order. A call's results are the items answering its
/// id, as their `answers` or one of their `piece_answers` (Anthropic's
/// tool_result blocks sharing a message: each call is judged by its own
/// blocks when they were pruned one by one). A call no item names takes
/// its unit's result items.
pub fn call_decisions(
    conversation: &Conversation,
    plan: Option<&crate::format::Plan>,
) -> Vec<CallDecision> {
    let items = &conversation.items;
    let mut planned: Vec<Option<&crate::format::Planned>> = vec![None; items.len()];
    if let Some(plan) = plan {
        for p in &plan.items {
            if let Some(slot) = planned.get_mut(p.index) {
                *slot = Some(p);
            }
        }
    }
    let forwarded = |i: usize| plan.is_none() || planned[i].is_some();
    // Whether the part of result `r` answering `id` was shortened: its own
    // pieces when they were cut one by one, else the whole text.
    let shortened = |r: usize, id: &str| {
        let Some(p) = planned[r].filter(|p| p.text.is_some()) else {
            return false;
        };
        let item = &items[r];
        match (&p.pieces, split_pieces(&item.text, &item.piece_chars)) {
            (Some(new), Some(old))
                if new.len() == old.len() && item.piece_answers.len() == old.len() =>
            {
                old.iter()
                    .zip(new)
                    .zip(&item.piece_answers)
                    .any(|((old, new), answers)| answers == id && *old != new.as_str())
            }
            _ => true,
        }
    };
    let answering = answering_items(items);
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        for (pos, call) in item.tool_calls.iter().enumerate() {
            let results = match answering.get(call.id.as_str()) {
                Some(found) => found.clone(),
                None => (0..items.len())
                    .filter(|&k| {
                        k != i
                            && item.group.is_some()
                            && items[k].group == item.group
                            && items[k].answers.is_some()
                    })
                    .collect(),
            };
            let decision = if !forwarded(i) {
                UnitDecision::DropCall
            } else if results
                .iter()
                .any(|&r| !forwarded(r) || shortened(r, &call.id))
            {
                UnitDecision::DropResult
            } else {
                UnitDecision::Keep
            };
            out.push(CallDecision {
                id: call.id.clone(),
                name: call.name.clone(),
                decision,
                arguments_clipped: planned[i]
                    .is_some_and(|p| p.arguments.iter().any(|(c, _)| *c == pos)),
                decided_by: None,
                item: i,
                results,
            });
        }
    }
    out
}

/// `text` split into its pieces of `piece_chars` chars each, when it has
/// several and they add up to it.
pub(crate) fn split_pieces<'t>(text: &'t str, piece_chars: &[usize]) -> Option<Vec<&'t str>> {
    if piece_chars.len() < 2 {
        return None;
    }
    let mut pieces = Vec::with_capacity(piece_chars.len());
    let mut rest = text;
    for &chars in piece_chars {
        let piece = char_prefix(rest, chars);
        if char_count(piece) != chars {
            return None;
        }
        pieces.push(piece);
        rest = &rest[piece.len()..];
    }
    rest.is_empty().then_some(pieces)
}

/// The pieces of `pieces` cut where the prefix `new` of their join ends;
/// `None` when `new` is not such a prefix.
pub fn cut_pieces(pieces: &[String], new: &str) -> Option<Vec<String>> {
    let mut left = new;
    let mut out = Vec::with_capacity(pieces.len());
    for piece in pieces {
        if let Some(rest) = left.strip_prefix(piece.as_str()) {
            out.push(piece.clone());
            left = rest;
        } else if piece.starts_with(left) {
            out.push(left.to_owned());
            left = "";
        } else {
            return None;
        }
    }
    left.is_empty().then_some(out)
}

/// Items of `excluded_tools`' units: calls to an excluded tool and the
/// results answering them. Not only the passes: the engine may drop such a
/// unit whole but never cut its text.
pub fn excluded_items(conversation: &Conversation, policy: &AgentPolicy) -> Vec<bool> {
    let items = &conversation.items;
    let mut out = vec![false; items.len()];
    if policy.excluded_tools.is_empty() {
        return out;
    }
    let excluded = |name: &str| policy.excluded_tools.iter().any(|t| t == name);
    let mut excluded_calls: Vec<&str> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        for call in &item.tool_calls {
            if excluded(&call.name) {
                excluded_calls.push(&call.id);
                out[i] = true;
            }
        }
    }
    for (i, item) in items.iter().enumerate() {
        if item
            .answers
            .iter()
            .chain(&item.piece_answers)
            .any(|id| excluded_calls.contains(&id.as_str()))
        {
            out[i] = true;
        }
    }
    out
}

/// Tool results the passes may cut: a result holding one output (not
/// several results sharing a message) whose call's tool the policy touches.
pub fn prunable_results(conversation: &Conversation, policy: &AgentPolicy) -> Vec<bool> {
    let items = &conversation.items;
    // Hashed with Fx, not SipHash: stable mode reads every call of the
    // history on every turn.
    let mut tools: rustc_hash::FxHashMap<&str, &str> = Default::default();
    for item in items {
        for call in &item.tool_calls {
            tools.entry(call.id.as_str()).or_insert(call.name.as_str());
        }
    }
    items
        .iter()
        .map(|item| {
            item.role == Role::Tool
                && item.piece_chars.len() <= 1
                && item
                    .answers
                    .as_deref()
                    .is_some_and(|id| policy.touches(tools.get(id).copied()))
        })
        .collect()
}

/// Runs the passes on `conversation`, whose items `pinned` protects, until
/// it fits `budget`. `replaceable(item, call)` says whether a call's
/// arguments can be replaced in the body.
pub fn run(
    conversation: &Conversation,
    pinned: &[bool],
    budget: usize,
    policy: &AgentPolicy,
    replaceable: &dyn Fn(usize, usize) -> bool,
) -> AgentEdits {
    let mut edits = AgentEdits::default();
    let mut total = conversation.total_chars();
    if total <= budget || !policy.any_pass() {
        return edits;
    }
    let items = &conversation.items;

    // Each call's tool name, and the tool of each result.
    let mut calls: HashMap<&str, (usize, &str)> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        for call in &item.tool_calls {
            calls
                .entry(call.id.as_str())
                .or_insert((i, call.name.as_str()));
        }
    }
    let tool_of = |i: usize| -> Option<&str> {
        let id = items[i].answers.as_deref()?;
        calls.get(id).map(|&(_, name)| name)
    };
    let is_result = |i: usize| items[i].role == Role::Tool && items[i].answers.is_some();

    // The protected window: the newest tool output within the cap.
    let cap = policy
        .protect_tool_chars
        .min((budget as f64 * policy.protect_tool_share) as usize);
    let mut window_start = items.len();
    let mut seen = 0usize;
    for i in (0..items.len()).rev() {
        if !is_result(i) {
            continue;
        }
        seen += char_count(&items[i].text);
        if seen > cap {
            break;
        }
        window_start = i;
    }
    // Calls whose results are in the window are in it too.
    let protected_calls: Vec<&str> = items[window_start..]
        .iter()
        .filter_map(|item| item.answers.as_deref())
        .collect();
    // Every call an item answers (several for results sharing a message)
    // must be one the passes may touch.
    let touched = |i: usize| {
        policy.touches(tool_of(i))
            && items[i]
                .piece_answers
                .iter()
                .all(|id| policy.touches(calls.get(id.as_str()).map(|&(_, name)| name)))
    };
    let candidate = |i: usize| i < window_start && is_result(i) && !pinned[i] && touched(i);

    // 1. Tool dedupe: later near-duplicates of an earlier result.
    let mut referenced = vec![false; items.len()];
    if policy.tool_duplicate_threshold > 0.0 {
        let mut vocabulary = Vocabulary::default();
        let mut sets = WordSets::new();
        let mut ids = Vec::new();
        let mut marked = MarkedSet::new();
        // Earlier results by tool: (item, word set).
        let mut earlier: HashMap<&str, Vec<(usize, Vec<u32>)>> = HashMap::new();
        for i in 0..window_start {
            // Several results in one message are several outputs: one
            // marker cannot stand for them (pruning cuts them one by one).
            if !is_result(i) || items[i].piece_chars.len() > 1 {
                continue;
            }
            let Some(tool) = tool_of(i) else { continue };
            ids.clear();
            vocabulary.words_of(&items[i].text, &mut ids);
            let set = sets.of(&ids, vocabulary.len());
            let list = earlier.entry(tool).or_default();
            if total > budget && candidate(i) && !set.is_empty() {
                // The most recent earlier results are the likely repeats.
                marked.mark(&set, vocabulary.len());
                let found = list.iter().rev().take(64).find(|(k, other)| {
                    items[*k].text == items[i].text
                        || marked
                            .jaccard_at_least(other, policy.tool_duplicate_threshold)
                            .is_some()
                });
                if let Some(&(k, _)) = found {
                    let of = items[k].answers.clone().unwrap_or_default();
                    let text = duplicate_marker(&of);
                    let before = char_count(&items[i].text);
                    let after = char_count(&text);
                    if after < before {
                        total -= before - after;
                        referenced[k] = true;
                        edits.texts.insert(i, TextEdit::Deduped { text, of });
                        continue;
                    }
                }
            }
            list.push((i, set));
        }
    }

    // 2. Prune: oldest first, when it saves enough.
    if total > budget && policy.max_tool_result_chars > 0 {
        let pruned: Vec<(usize, String, usize, Option<Vec<String>>)> = (0..window_start)
            .filter(|&i| candidate(i) && !referenced[i] && !edits.texts.contains_key(&i))
            .filter_map(|i| {
                let text = &items[i].text;
                let (new, pieces) = match split_pieces(text, &items[i].piece_chars) {
                    // Several results in one item: each is cut on its own.
                    Some(pieces) => {
                        let cut: Vec<String> = pieces
                            .iter()
                            .map(|p| {
                                head_and_tail(p, policy.max_tool_result_chars)
                                    .unwrap_or_else(|| (*p).to_owned())
                            })
                            .collect();
                        (cut.concat(), Some(cut))
                    }
                    None => (head_and_tail(text, policy.max_tool_result_chars)?, None),
                };
                let saved = char_count(text).checked_sub(char_count(&new))?;
                (saved > 0).then_some((i, new, saved, pieces))
            })
            .collect();
        let prunable: usize = pruned.iter().map(|(_, _, saved, _)| saved).sum();
        if prunable >= policy.prune_minimum_chars.min(total - budget) {
            for (i, new, saved, pieces) in pruned {
                if total <= budget {
                    break;
                }
                total -= saved;
                edits.texts.insert(i, TextEdit::Pruned(new));
                if let Some(pieces) = pieces {
                    edits.pieces.insert(i, pieces);
                }
            }
        }
    }

    // 3. Clip arguments of calls older than the window, oldest first.
    if total > budget && policy.max_arg_chars > 0 {
        'items: for (i, item) in items.iter().enumerate().take(window_start) {
            if pinned[i] {
                continue;
            }
            for (pos, call) in item.tool_calls.iter().enumerate() {
                if total <= budget {
                    break 'items;
                }
                if protected_calls.contains(&call.id.as_str())
                    || !policy.touches(Some(&call.name))
                    || !replaceable(i, pos)
                {
                    continue;
                }
                let Some(new) = clip_arguments(&call.arguments, policy.max_arg_chars) else {
                    continue;
                };
                total -= char_count(&call.arguments) - char_count(&new);
                edits.arguments.entry(i).or_default().push((pos, new));
            }
        }
    }
    edits
}

/// The items answering each call id (a whole result, or pieces of one),
/// in order, each item once per id.
pub(crate) fn answering_items(items: &[crate::format::Item]) -> HashMap<&str, Vec<usize>> {
    let mut answering: HashMap<&str, Vec<usize>> = HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let mut ids: Vec<&str> = item.answers.iter().map(String::as_str).collect();
        for id in &item.piece_answers {
            if !ids.contains(&id.as_str()) {
                ids.push(id);
            }
        }
        for id in ids {
            answering.entry(id).or_default().push(i);
        }
    }
    answering
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::format::{Item, ToolCall};

    /// An assistant item making one tool call (also the pipeline's tests').
    pub(crate) fn call(id: &str, name: &str, arguments: &str) -> Item {
        let mut item = Item::new(Role::Assistant, "");
        item.tool_calls.push(ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        });
        item.fixed_chars = char_count(name) + char_count(arguments);
        item
    }

    /// A tool item answering the call `id`.
    pub(crate) fn result(id: &str, text: &str) -> Item {
        let mut item = Item::new(Role::Tool, text);
        item.answers = Some(id.into());
        item
    }

    /// `n` numbered words: `{tag}0 {tag}1 ...`.
    pub(crate) fn numbered(n: usize, tag: &str) -> String {
        (0..n).map(|k| format!("{tag}{k} ")).collect()
    }

    fn policy() -> AgentPolicy {
        AgentPolicy {
            max_tool_result_chars: 100,
            protect_tool_chars: 1_000,
            prune_minimum_chars: 0,
            max_arg_chars: 50,
            ..AgentPolicy::DEFAULT
        }
    }

    fn conversation(items: Vec<Item>) -> Conversation {
        Conversation {
            items,
            outside_chars: 0,
        }
    }

    fn run_all(c: &Conversation, budget: usize, p: &AgentPolicy) -> AgentEdits {
        run(c, &vec![false; c.items.len()], budget, p, &|_, _| true)
    }

    #[test]
    fn decisions_follow_what_the_plan_forwards() {
        use crate::format::{Plan, Planned};
        let mut anthropic_like = call("call_x", "read_file", "{}");
        anthropic_like.tool_calls.push(ToolCall {
            id: "call_y".into(),
            name: "grep".into(),
            arguments: "{}".into(),
        });
        anthropic_like.group = Some(7);
        // One item answers both calls, naming only the first.
        let mut both = result("call_x", "two results in one message");
        both.group = Some(7);
        let c = conversation(vec![
            Item::new(Role::User, "task"),
            call("call_a", "read_file", "{}"),
            result("call_a", "a"),
            call("call_b", "grep", "{\"q\":\"long\"}"),
            result("call_b", "b"),
            call("call_c", "read_file", "{}"),
            result("call_c", "c"),
            anthropic_like,
            both,
        ]);
        let decided = |plan: Option<&Plan>| -> Vec<(String, UnitDecision, bool)> {
            call_decisions(&c, plan)
                .into_iter()
                .map(|d| (d.id, d.decision, d.arguments_clipped))
                .collect()
        };
        // Nothing changed: every call is kept.
        assert!(decided(None)
            .iter()
            .all(|(_, d, clipped)| *d == UnitDecision::Keep && !clipped));
        let mut plan = Plan {
            items: [0, 3, 4, 5, 6, 7, 8].map(Planned::verbatim).to_vec(),
        };
        plan.items[1].arguments = vec![(0, "{}".into())];
        plan.items[4].text = Some("[same output as tool call call_a]".into());
        plan.items[6].text = Some("two res[… 5 chars omitted …]".into());
        let decisions = decided(Some(&plan));
        use UnitDecision::*;
        assert_eq!(
            decisions,
            [
                ("call_a".to_owned(), DropCall, false),
                ("call_b".to_owned(), Keep, true),
                ("call_c".to_owned(), DropResult, false),
                ("call_x".to_owned(), DropResult, false),
                ("call_y".to_owned(), DropResult, false),
            ]
        );
        let found = call_decisions(&c, Some(&plan));
        assert_eq!((found[4].item, found[4].results.clone()), (7, vec![8]));
    }

    #[test]
    fn pieces_split_by_chars_and_cut_where_a_prefix_ends() {
        assert_eq!(
            split_pieces("héllo wörld!", &[5, 6, 1]),
            Some(vec!["héllo", " wörld", "!"])
        );
        assert_eq!(split_pieces("abc", &[3]), None, "one piece is no split");
        assert_eq!(split_pieces("abc", &[1, 1]), None, "pieces must add up");
        let pieces: Vec<String> = ["ab", "cd", "ef"].map(String::from).to_vec();
        assert_eq!(
            cut_pieces(&pieces, "abc"),
            Some(vec!["ab".into(), "c".into(), String::new()])
        );
        assert_eq!(cut_pieces(&pieces, "abcdef"), Some(pieces.clone()));
        assert_eq!(cut_pieces(&pieces, "abX"), None);
    }

    #[test]
    fn several_results_in_one_item_are_pruned_one_by_one() {
        let (a, b) = (numbered(100, "a"), numbered(100, "b"));
        let mut both = result("call_1", &format!("{a}{b}"));
        both.piece_chars = vec![char_count(&a), char_count(&b)];
        let c = conversation(vec![
            Item::new(Role::User, "task"),
            call("call_1", "read_file", "{}"),
            both,
            Item::new(Role::User, "next"),
        ]);
        let p = AgentPolicy {
            protect_tool_chars: 0,
            ..policy()
        };
        let edits = run_all(&c, 100, &p);
        let pieces = &edits.pieces[&2];
        assert_eq!(pieces.len(), 2);
        for (piece, original) in pieces.iter().zip([&a, &b]) {
            assert_eq!(Some(piece.clone()), head_and_tail(original, 100));
        }
        assert_eq!(edits.texts[&2].text(), pieces.concat());
        let applied = edits.apply(&c);
        assert_eq!(
            applied.items[2].piece_chars,
            pieces.iter().map(|p| char_count(p)).collect::<Vec<_>>()
        );
    }

    #[test]
    fn results_sharing_a_message_are_judged_and_excluded_by_their_own_call() {
        use crate::format::{Plan, Planned};
        let mut calls = call("toolu_1", "read_file", "{}");
        calls.tool_calls.push(ToolCall {
            id: "toolu_2".into(),
            name: "deploy".into(),
            arguments: "{}".into(),
        });
        let (long, short) = (numbered(100, "a"), "ok".to_owned());
        let mut shared = result("toolu_1", &format!("{long}{short}"));
        shared.piece_chars = vec![char_count(&long), char_count(&short)];
        shared.piece_answers = vec!["toolu_1".into(), "toolu_2".into()];
        let c = conversation(vec![
            Item::new(Role::User, "task"),
            calls,
            shared,
            Item::new(Role::User, "next"),
        ]);
        // Pruned one by one: only the long block changed.
        let cut = vec![head_and_tail(&long, 100).unwrap(), short.clone()];
        let mut plan = Plan {
            items: [0, 1, 2, 3].map(Planned::verbatim).to_vec(),
        };
        plan.items[2].text = Some(cut.concat());
        plan.items[2].pieces = Some(cut);
        let decisions: Vec<(String, UnitDecision)> = call_decisions(&c, Some(&plan))
            .into_iter()
            .map(|d| (d.id, d.decision))
            .collect();
        assert_eq!(
            decisions,
            [
                ("toolu_1".to_owned(), UnitDecision::DropResult),
                ("toolu_2".to_owned(), UnitDecision::Keep),
            ]
        );
        // The second block answers an excluded tool: the message is its unit's.
        let p = AgentPolicy {
            protect_tool_chars: 0,
            excluded_tools: vec!["deploy".into()],
            ..policy()
        };
        assert_eq!(excluded_items(&c, &p), [false, true, true, false]);
        assert!(run_all(&c, 50, &p).texts.is_empty(), "never cut");
    }

    #[test]
    fn markers_say_how_much_was_cut() {
        assert_eq!(omission_marker(18_204), "[… 18,204 chars omitted …]");
        use crate::engine::text::thousands;
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1_000), "1,000");
        assert_eq!(thousands(1_234_567), "1,234,567");
    }

    #[test]
    fn head_and_tail_keeps_both_ends() {
        let text: String = ('a'..='z').cycle().take(1_000).collect();
        let cut = head_and_tail(&text, 100).unwrap();
        assert!(cut.starts_with(&text[..50]));
        assert!(cut.ends_with(&text[950..]));
        assert!(cut.contains("[… 900 chars omitted …]"));
        assert_eq!(head_and_tail(&text[..110], 100), None, "not shorter");
        // Chars, not bytes.
        let wide = "é".repeat(500);
        let cut = head_and_tail(&wide, 20).unwrap();
        assert!(cut.starts_with(&"é".repeat(10)) && cut.ends_with(&"é".repeat(10)));
        // A tail of other chars than the head's: counted from the end.
        let mixed = format!("{}{}", "é".repeat(300), "ab".repeat(150));
        let cut = head_and_tail(&mixed, 21).unwrap();
        assert!(cut.starts_with(&"é".repeat(10)), "{cut}");
        assert!(
            cut.ends_with(&format!("\n{}", "ba".repeat(5) + "b")),
            "{cut}"
        );
    }

    #[test]
    fn clipping_changes_only_long_string_values() {
        let long = "x".repeat(300);
        let args = format!(
            "{{\"path\" : \"a.rs\", \"{long}\": 1, \"content\":\"{long}\", \"n\": [1.50, \"\\\"{long}\"]}}"
        );
        let clipped = clip_arguments(&args, 50).unwrap();
        let value: serde_json::Value = serde_json::from_str(&clipped).unwrap();
        assert_eq!(value["path"], "a.rs");
        assert_eq!(value[long.as_str()], 1, "keys are never clipped");
        let content = value["content"].as_str().unwrap();
        assert!(content.starts_with(&"x".repeat(50)));
        assert!(content.ends_with("[… 250 chars omitted …]"));
        let escaped = value["n"][1].as_str().unwrap();
        assert!(escaped.starts_with('"') && escaped.contains("251 chars omitted"));
        // Bytes outside the clipped values are as they were.
        assert!(clipped.starts_with("{\"path\" : \"a.rs\", "));
        assert!(clipped.contains(", \"n\": [1.50, \""));
        assert_eq!(clip_arguments("{\"a\": \"short\"}", 50), None);
        assert_eq!(clip_arguments("not json", 5), None);
    }

    #[test]
    fn old_tool_results_are_pruned_and_the_window_is_kept() {
        let big = numbered(300, "w");
        let c = conversation(vec![
            Item::new(Role::User, "task"),
            call("a", "read", "{}"),
            result("a", &big),
            call("b", "read", "{}"),
            result("b", &numbered(300, "v")),
            Item::new(Role::User, "next"),
        ]);
        let p = AgentPolicy {
            protect_tool_chars: big.len(),
            protect_tool_share: 1.0,
            ..policy()
        };
        let edits = run_all(&c, 2_000, &p);
        assert!(matches!(edits.texts.get(&2), Some(TextEdit::Pruned(_))));
        assert!(
            !edits.texts.contains_key(&4),
            "the newest output is protected"
        );
        let after = edits.apply(&c);
        assert!(after.total_chars() < c.total_chars());
        assert!(after.items[2].text.contains("chars omitted"));
    }

    #[test]
    fn the_window_is_capped_by_the_budget_share() {
        // Two results, each alone over half the budget: both prunable.
        let c = conversation(vec![
            call("a", "read", "{}"),
            result("a", &numbered(300, "w")),
            result("b", &numbered(300, "v")),
        ]);
        let edits = run_all(&c, 2_000, &policy());
        assert!(edits.texts.contains_key(&1));
        let total = edits.apply(&c).total_chars();
        assert!(total <= 2_000, "{total}");
    }

    #[test]
    fn pruning_waits_for_its_minimum_unless_it_fits() {
        let c = conversation(vec![
            call("a", "read", "{}"),
            result("a", &numbered(300, "w")),
            Item::new(Role::User, numbered(100, "u")),
        ]);
        let total = c.total_chars();
        let p = AgentPolicy {
            protect_tool_chars: 0,
            prune_minimum_chars: total,
            ..policy()
        };
        // Pruning the result fits 1,200 chars: it runs despite the minimum.
        assert!(!run_all(&c, 1_200, &p).is_empty());
        // It cannot fit 100 chars and saves less than the minimum: it waits.
        assert!(run_all(&c, 100, &p).texts.is_empty());
    }

    #[test]
    fn pruning_stops_once_the_conversation_fits() {
        let c = conversation(vec![
            call("a", "read", "{}"),
            result("a", &numbered(300, "w")),
            result("b", &numbered(300, "v")),
            Item::new(Role::User, "go"),
        ]);
        let p = AgentPolicy {
            protect_tool_chars: 0,
            ..policy()
        };
        let budget = c.total_chars() - 100;
        let edits = run_all(&c, budget, &p);
        assert_eq!(edits.texts.len(), 1);
        assert!(edits.texts.contains_key(&1), "oldest first");
    }

    #[test]
    fn excluded_pinned_and_ineligible_tools_are_untouched() {
        let long_args = format!("{{\"content\": \"{}\"}}", "y".repeat(500));
        let c = conversation(vec![
            call("a", "write", &long_args),
            result("a", &numbered(300, "w")),
            call("b", "read", &long_args),
            result("b", &numbered(300, "v")),
            result("c", &numbered(300, "z")),
            Item::new(Role::User, "go"),
        ]);
        let p = AgentPolicy {
            protect_tool_chars: 0,
            excluded_tools: vec!["write".into()],
            ..policy()
        };
        let mut pinned = vec![false; c.items.len()];
        pinned[3] = true;
        let edits = run(&c, &pinned, 10, &p, &|_, _| true);
        assert!(!edits.texts.contains_key(&1), "excluded tool");
        assert!(!edits.arguments.contains_key(&0), "excluded tool");
        assert!(!edits.texts.contains_key(&3), "pinned");
        assert!(edits.texts.contains_key(&4), "unknown tool, no allow-list");
        assert!(edits.arguments.contains_key(&2));

        let p = AgentPolicy {
            eligible_tools: vec!["write".into()],
            excluded_tools: Vec::new(),
            ..p
        };
        let edits = run(&c, &pinned, 10, &p, &|_, _| true);
        assert!(edits.texts.contains_key(&1) && edits.arguments.contains_key(&0));
        assert!(!edits.arguments.contains_key(&2), "not eligible");
        assert!(
            !edits.texts.contains_key(&4),
            "unknown tool, allow-list set"
        );
        // A call whose arguments the body cannot take back stays.
        let edits = run(&c, &pinned, 10, &p, &|_, _| false);
        assert!(edits.arguments.is_empty());
    }

    #[test]
    fn a_repeated_result_names_the_earlier_call() {
        let output = numbered(100, "line");
        let mut near = output.clone();
        near.push_str("tail");
        let c = conversation(vec![
            call("a", "read", "{}"),
            result("a", &output),
            call("b", "grep", "{}"),
            result("b", &output),
            call("c", "read", "{}"),
            result("c", &near),
            Item::new(Role::User, "go"),
        ]);
        let p = AgentPolicy {
            protect_tool_chars: 0,
            max_tool_result_chars: 0,
            ..policy()
        };
        let edits = run_all(&c, 10, &p);
        assert!(!edits.texts.contains_key(&3), "another tool's output");
        match edits.texts.get(&5) {
            Some(TextEdit::Deduped { text, of }) => {
                assert_eq!(of, "a");
                assert_eq!(text, "[same output as tool call a]");
            }
            other => panic!("{other:?}"),
        }
        assert!(!edits.texts.contains_key(&1), "the earlier one stays");
    }

    #[test]
    fn triggers_gate_compaction() {
        let c = conversation(vec![Item::new(Role::User, "x".repeat(100))]);
        assert!(AgentPolicy::DEFAULT.triggered(&c, || 0), "no trigger set");
        let p = AgentPolicy {
            trigger_chars: 101,
            trigger_messages: 2,
            ..AgentPolicy::DEFAULT
        };
        assert!(!p.triggered(&c, || 0));
        assert!(AgentPolicy {
            trigger_chars: 100,
            ..p.clone()
        }
        .triggered(&c, || 0));
        assert!(AgentPolicy {
            trigger_messages: 1,
            ..p
        }
        .triggered(&c, || 0));
    }

    #[test]
    fn under_budget_nothing_changes() {
        let c = conversation(vec![
            call("a", "read", "{}"),
            result("a", &numbered(300, "w")),
        ]);
        assert!(run_all(&c, c.total_chars(), &policy()).is_empty());
    }
}
