//! `tool_decisions = "model"` (seed 004, ReMe's decision compaction): the
//! pure half. A model judges old tool calls; everything it is shown, and
//! everything its answer may change, is decided here, with no I/O:
//!
//! 1. [`candidates`]: deterministic guards pick the calls a model may judge:
//!    a finished call (its result is in the conversation) from a tool in
//!    `eligible_tools` (none listed: no candidates, as ReMe's empty
//!    allowlist), with valid JSON arguments, its id used by no other call,
//!    answered by exactly one result item that answers nothing else, whose
//!    content is all text and not an error. Neither side may be protected
//!    (pins, kept roles, the first message, the last `keep_last_n` items).
//! 2. [`observation`]: what the model sees, bounded: the goal (the latest
//!    user request), the conversation's text, and per candidate its tool,
//!    shortened input and result size. Never a result's body.
//! 3. [`apply`]: the model's `keep` / `drop_result` / `drop_call` per call
//!    as edits the pipeline applies before its own passes. `drop_result`
//!    keeps the call and cuts the result to a head and a marker (only when
//!    that is shorter); `drop_call` removes the call's whole unit, but only
//!    when every call of that unit is dropped and its call message holds
//!    no text of its own (ReMe removes a message only when it would be
//!    empty): otherwise the call's result is dropped instead. Units go
//!    whole, so the request stays one the API accepts.

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use super::agent::{AgentEdits, TextEdit};
use crate::compaction::policy::CompiledPolicy;
use crate::engine::text::{char_count, char_prefix, omission_marker};
use crate::engine::Role;
use crate::format::{Conversation, Parsed};

/// What a model decided for one call (ReMe's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    /// The call and its whole result stay.
    Keep,
    /// The call stays; its result is cut to a head and a marker.
    DropResult,
    /// The call and its result go.
    DropCall,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Keep => "keep",
            Action::DropResult => "drop_result",
            Action::DropCall => "drop_call",
        }
    }
}

/// One call a model may judge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub id: String,
    pub name: String,
    /// Its arguments as they came (JSON text).
    pub arguments: String,
    /// The item making the call.
    pub call_item: usize,
    /// The one item answering it.
    pub result_item: usize,
    /// Chars of that result.
    pub result_chars: usize,
}

/// Chars of a result `drop_result` keeps (ReMe's `truncate_head_chars`).
pub const HEAD_CHARS: usize = 300;
/// Chars of a call's input shown to the model.
pub const INPUT_CHARS: usize = 200;
/// Chars of a message's text shown to the model (then shortened further
/// when the observation does not fit).
pub const TEXT_CHARS: usize = 400;
/// Chars of the goal shown to the model.
pub const GOAL_CHARS: usize = 2000;

/// The calls a model may judge in `parsed` under `policy`, in call order.
pub fn candidates(parsed: &Parsed, policy: &CompiledPolicy) -> Vec<Candidate> {
    let conversation = &parsed.conversation;
    let items = &conversation.items;
    let eligible = &policy.agent.eligible_tools;
    if eligible.is_empty() || items.is_empty() {
        return Vec::new();
    }
    let protected = super::protected_items(conversation, policy);
    let recent_from = items.len().saturating_sub(policy.engine.keep_last_n);
    let open = |i: usize| i > 0 && i < recent_from && !protected[i] && !items[i].fixed;
    let mut call_count: HashMap<&str, usize> = HashMap::new();
    for item in items {
        for call in &item.tool_calls {
            *call_count.entry(call.id.as_str()).or_default() += 1;
        }
    }
    // The items answering each id, and whether each answers that id alone.
    let answering = super::agent::answering_items(items);
    let answers_only = |r: usize, id: &str| {
        let item = &items[r];
        item.answers.as_deref() == Some(id) && item.piece_answers.iter().all(|a| a == id)
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        for call in &item.tool_calls {
            let eligible_tool =
                eligible.contains(&call.name) && !policy.agent.excluded_tools.contains(&call.name);
            if !eligible_tool || call_count.get(call.id.as_str()) != Some(&1) || !open(i) {
                continue;
            }
            let Some([r]) = answering.get(call.id.as_str()).map(Vec::as_slice) else {
                continue;
            };
            let r = *r;
            if r <= i || !open(r) || !answers_only(r, &call.id) {
                continue;
            }
            if serde_json::from_str::<serde_json::Value>(&call.arguments).is_err() {
                continue;
            }
            if !plain_text_result(parsed.item_bytes(r)) {
                continue;
            }
            out.push(Candidate {
                id: call.id.clone(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                call_item: i,
                result_item: r,
                result_chars: char_count(&items[r].text),
            });
        }
    }
    out
}

/// Whether a result item's JSON is all text and no error: no `is_error:
/// true` anywhere, and every typed part a text part (an image, a file or a
/// document makes it ineligible).
fn plain_text_result(bytes: &[u8]) -> bool {
    const TEXT_TYPES: [&str; 7] = [
        "text",
        "input_text",
        "output_text",
        "tool_result",
        "function_call_output",
        "custom_tool_call_output",
        "message",
    ];
    fn walk(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::Object(map) => {
                if map.get("is_error").and_then(serde_json::Value::as_bool) == Some(true) {
                    return false;
                }
                if let Some(kind) = map.get("type").and_then(serde_json::Value::as_str) {
                    if !TEXT_TYPES.contains(&kind) {
                        return false;
                    }
                }
                map.values().all(walk)
            }
            serde_json::Value::Array(list) => list.iter().all(walk),
            _ => true,
        }
    }
    serde_json::from_slice::<serde_json::Value>(bytes).is_ok_and(|v| walk(&v))
}

/// Why no observation could be made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TooLarge {
    pub needed: usize,
    pub room: usize,
}

/// What the model is shown, at most `room` chars: the goal, the
/// conversation's text oldest first (each message cut to [`TEXT_CHARS`],
/// then shorter, then old text-only messages left out when it does not
/// fit), and the candidates with their tools, shortened inputs and result
/// sizes. Result bodies are never in it.
///
/// The goal is `goal` when the request gives one (the policy's
/// `relevance_goal_header`, [`CompiledPolicy::relevance_goal`]), else the
/// latest user request.
pub fn observation(
    conversation: &Conversation,
    candidates: &[Candidate],
    room: usize,
    goal: Option<&str>,
) -> Result<String, TooLarge> {
    let latest = || {
        conversation
            .items
            .iter()
            .rev()
            .find(|m| m.role == Role::User && m.answers.is_none() && !m.text.trim().is_empty())
            .map_or("", |m| m.text.as_str())
    };
    let (goal, heading) = match goal {
        Some(goal) => (goal, "## Goal (given with the request)\n"),
        None => (latest(), "## Goal (the latest request)\n"),
    };
    let by_call: HashMap<usize, Vec<&Candidate>> =
        candidates.iter().fold(HashMap::new(), |mut map, c| {
            map.entry(c.call_item).or_insert_with(Vec::new).push(c);
            map
        });
    let results: HashSet<usize> = candidates.iter().map(|c| c.result_item).collect();
    let mut needed = 0;
    for (text_chars, keep_text_only) in [(TEXT_CHARS, true), (120, true), (120, false), (0, false)]
    {
        let mut out = String::new();
        out.push_str(heading);
        out.push_str(&one_line(goal, GOAL_CHARS));
        out.push_str("\n\n## Conversation (oldest first)\n");
        for (i, item) in conversation.items.iter().enumerate() {
            let calls = by_call.get(&i);
            if results.contains(&i) || item.answers.is_some() || !item.piece_answers.is_empty() {
                // Tool results are never shown, candidates' or not.
                let chars = char_count(&item.text);
                out.push_str(&format!(
                    "[{i}] tool result: {chars} chars (body omitted)\n"
                ));
                continue;
            }
            if calls.is_none() && !keep_text_only && text_chars > 0 {
                // An old text-only message: left out at this stage.
                if i + 8 < conversation.items.len() {
                    continue;
                }
            }
            let role = role_name(item.role);
            let text = one_line(&item.text, text_chars);
            out.push_str(&format!("[{i}] {role}: {text}\n"));
            for call in &item.tool_calls {
                let id = calls
                    .and_then(|cs| cs.iter().find(|c| c.id == call.id))
                    .map_or(String::new(), |c| format!(" candidate {}", c.id));
                out.push_str(&format!("    calls {}{id}\n", call.name));
            }
        }
        out.push_str("\n## Candidates\n");
        for c in candidates {
            out.push_str(&format!(
                "- id: {} | tool: {} | input: {} | result: {} chars\n",
                c.id,
                c.name,
                one_line(&c.arguments, INPUT_CHARS),
                c.result_chars
            ));
        }
        needed = char_count(&out);
        if needed <= room {
            return Ok(out);
        }
    }
    Err(TooLarge { needed, room })
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::System | Role::Developer => "system",
        _ => "other",
    }
}

/// `text` on one line, cut to `max` chars with a marker of what was cut.
fn one_line(text: &str, max: usize) -> String {
    let flat: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let total = char_count(&flat);
    if total <= max {
        return flat;
    }
    format!(
        "{} {}",
        char_prefix(&flat, max),
        omission_marker(total - max)
    )
}

/// The model's decisions, validated against the candidates: one per
/// candidate, in candidate order.
pub type Decisions = Vec<(String, Action)>;

/// What applying the decisions gives the pipeline.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Applied {
    /// `drop_result` cuts, by result item.
    pub edits: AgentEdits,
    /// Items that go (`drop_call` units).
    pub dropped: Vec<bool>,
    /// Items a decision covers: the deterministic passes leave them alone.
    pub decided: Vec<bool>,
    /// What was applied per call id (a `drop_call` that could not remove
    /// its unit became `drop_result`).
    pub applied: Vec<(String, Action)>,
}

impl Applied {
    pub fn is_empty(&self) -> bool {
        self.applied.is_empty()
    }
}

/// Applies `decisions` (validated: one per candidate) to `conversation`.
pub fn apply(
    conversation: &Conversation,
    candidates: &[Candidate],
    decisions: &Decisions,
) -> Applied {
    let items = &conversation.items;
    let n = items.len();
    let action: HashMap<&str, Action> = decisions.iter().map(|(id, a)| (id.as_str(), *a)).collect();
    let mut out = Applied {
        dropped: vec![false; n],
        decided: vec![false; n],
        ..Applied::default()
    };
    let by_id: HashMap<&str, &Candidate> = candidates.iter().map(|c| (c.id.as_str(), c)).collect();
    // The items of each call item's unit: its group, or the call and its
    // result when it has none.
    let unit_of = |c: &Candidate| -> Vec<usize> {
        match items[c.call_item].group {
            Some(g) => (0..n).filter(|&k| items[k].group == Some(g)).collect(),
            None => vec![c.call_item, c.result_item],
        }
    };
    let removable = |c: &Candidate| {
        let unit = unit_of(c);
        // Every call in the unit is a candidate decided drop_call, and the
        // unit holds nothing else: no text beside the calls, no other item.
        let calls_dropped = unit.iter().all(|&k| {
            items[k].tool_calls.iter().all(|call| {
                by_id.contains_key(call.id.as_str())
                    && action.get(call.id.as_str()) == Some(&Action::DropCall)
            })
        });
        let only_calls_and_results = unit.iter().all(|&k| {
            let item = &items[k];
            if item.answers.is_some() {
                by_id
                    .get(item.answers.as_deref().unwrap_or(""))
                    .is_some_and(|c| c.result_item == k)
            } else {
                !item.tool_calls.is_empty() && item.text.trim().is_empty()
            }
        });
        calls_dropped && only_calls_and_results
    };
    for c in candidates {
        let Some(&wanted) = action.get(c.id.as_str()) else {
            continue;
        };
        out.decided[c.call_item] = true;
        out.decided[c.result_item] = true;
        let done = match wanted {
            Action::Keep => Action::Keep,
            Action::DropCall if removable(c) => {
                for k in unit_of(c) {
                    out.dropped[k] = true;
                }
                Action::DropCall
            }
            Action::DropCall | Action::DropResult => {
                let text = &items[c.result_item].text;
                let total = char_count(text);
                if total > HEAD_CHARS {
                    let cut = format!(
                        "{}\n{}",
                        char_prefix(text, HEAD_CHARS),
                        omission_marker(total - HEAD_CHARS)
                    );
                    if char_count(&cut) < total {
                        out.edits.texts.insert(c.result_item, TextEdit::Pruned(cut));
                    }
                }
                Action::DropResult
            }
        };
        out.applied.push((c.id.clone(), done));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::agent::tests::{call, numbered, result};
    use crate::format::{Format, Item};

    fn chat_body() -> String {
        let big = numbered(80, "line");
        serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "user", "content": "Fix the payment retries."},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "search_code", "arguments": "{\"pattern\":\"logo\"}"}}]},
                {"role": "tool", "tool_call_id": "c1", "content": big},
                {"role": "assistant", "content": "Reading the retry code.", "tool_calls": [
                    {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"pay.rs\"}"}}]},
                {"role": "tool", "tool_call_id": "c2", "content": big},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c3", "type": "function", "function": {"name": "run_shell", "arguments": "{\"cmd\":\"ls\"}"}}]},
                {"role": "tool", "tool_call_id": "c3", "content": big},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c4", "type": "function", "function": {"name": "search_code", "arguments": "not json"}}]},
                {"role": "tool", "tool_call_id": "c4", "content": big},
                {"role": "user", "content": "Now patch the retry loop."},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "go"}
            ]
        })
        .to_string()
    }

    fn policy() -> CompiledPolicy {
        let mut engine = crate::engine::Policy::with_budget(0);
        engine.keep_last_n = 2;
        let mut policy = CompiledPolicy::plain("t", engine);
        policy.agent.eligible_tools = vec!["search_code".into(), "read_file".into()];
        policy
    }

    #[test]
    fn the_guards_pick_finished_allowlisted_calls_with_json_inputs() {
        let body = chat_body();
        let parsed = Format::Chat.parse(body.as_bytes(), 100).unwrap();
        let found = candidates(&parsed, &policy());
        let ids: Vec<&str> = found.iter().map(|c| c.id.as_str()).collect();
        // c3: not allowlisted; c4: its input is not JSON.
        assert_eq!(ids, ["c1", "c2"]);
        assert_eq!((found[0].call_item, found[0].result_item), (1, 2));
        let mut none = policy();
        none.agent.eligible_tools.clear();
        assert!(candidates(&parsed, &none).is_empty(), "an empty allowlist");
    }

    #[test]
    fn an_error_or_an_image_result_is_not_a_candidate() {
        assert!(plain_text_result(
            br#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"ok"}]}"#
        ));
        assert!(!plain_text_result(
            br#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"no","is_error":true}]}"#
        ));
        assert!(!plain_text_result(
            br#"{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image","source":{}}]}]}"#
        ));
    }

    #[test]
    fn duplicate_ids_and_results_before_calls_are_ineligible() {
        let body = serde_json::json!({"messages": [
            {"role": "user", "content": "task"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "d", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "d", "content": "x"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "d", "type": "function", "function": {"name": "read_file", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "d", "content": "y"},
            {"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}
        ]})
        .to_string();
        let parsed = Format::Chat.parse(body.as_bytes(), 100).unwrap();
        assert!(candidates(&parsed, &policy()).is_empty());
    }

    #[test]
    fn the_observation_holds_no_result_body_and_fits_its_room() {
        let body = chat_body();
        let parsed = Format::Chat.parse(body.as_bytes(), 100).unwrap();
        let found = candidates(&parsed, &policy());
        let seen = observation(&parsed.conversation, &found, 100_000, None).unwrap();
        assert!(seen.contains("Now patch the retry loop."), "{seen}");
        assert!(seen.contains("id: c1 | tool: search_code"), "{seen}");
        assert!(!seen.contains("line40"), "no result body: {seen}");
        let small = observation(&parsed.conversation, &found, 700, None).unwrap();
        assert!(char_count(&small) <= 700);
        assert!(observation(&parsed.conversation, &found, 50, None).is_err());
    }

    #[test]
    fn a_goal_given_with_the_request_is_the_observations_goal() {
        let body = chat_body();
        let parsed = Format::Chat.parse(body.as_bytes(), 100).unwrap();
        let found = candidates(&parsed, &policy());
        let goal_of = |seen: &str| {
            let start = seen.find("## Goal").unwrap();
            let end = seen.find("## Conversation").unwrap();
            seen[start..end].to_owned()
        };
        let latest = observation(&parsed.conversation, &found, 100_000, None).unwrap();
        assert_eq!(goal_of(&latest), "## Goal (the latest request)\ngo\n\n");
        let given = observation(
            &parsed.conversation,
            &found,
            100_000,
            Some("audit the logo search"),
        )
        .unwrap();
        assert_eq!(
            goal_of(&given),
            "## Goal (given with the request)\naudit the logo search\n\n"
        );
        // The conversation still shows the latest request.
        assert!(given.contains("[11] user: go"), "{given}");
    }

    #[test]
    fn drop_call_removes_a_unit_only_when_it_holds_nothing_else() {
        let conversation = Conversation {
            items: vec![
                Item::new(Role::User, "task"),
                call("a", "read_file", "{}"),
                result("a", &numbered(80, "line")),
                {
                    let mut m = call("b", "read_file", "{}");
                    m.text = "I will read b.".into();
                    m
                },
                result("b", &numbered(80, "row")),
            ],
            outside_chars: 0,
        };
        let cands: Vec<Candidate> = [("a", 1, 2), ("b", 3, 4)]
            .into_iter()
            .map(|(id, call_item, result_item)| Candidate {
                id: id.into(),
                name: "read_file".into(),
                arguments: "{}".into(),
                call_item,
                result_item,
                result_chars: char_count(&conversation.items[result_item].text),
            })
            .collect();
        let decisions = vec![
            ("a".to_owned(), Action::DropCall),
            ("b".to_owned(), Action::DropCall),
        ];
        let applied = apply(&conversation, &cands, &decisions);
        assert_eq!(applied.dropped, [false, true, true, false, false]);
        assert_eq!(
            applied.applied,
            [
                ("a".to_owned(), Action::DropCall),
                ("b".to_owned(), Action::DropResult)
            ]
        );
        let cut = applied.edits.texts.get(&4).unwrap().text().to_owned();
        assert!(
            cut.starts_with("row0 row1") && cut.contains("chars omitted"),
            "{cut}"
        );
        assert_eq!(applied.decided, [false, true, true, true, true]);
    }
}
