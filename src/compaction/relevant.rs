//! What `scoring = "relevance"` adds to the pipeline around the engine:
//! tool results scored with their calls, relevant tool units protected
//! whole from the agent passes, and relevant results pruned around their
//! match rather than to head and tail.

use std::collections::HashMap;

use foldhash::fast::RandomState;

/// Call ids come from clients: a map of them is keyed at random (foldhash,
/// a few multiplies where SipHash was a tenth of relevance's cost on an
/// agent's turn).
type IdMap<'a, V> = HashMap<&'a str, V, RandomState>;

use super::agent::{AgentEdits, TextEdit};
use crate::compaction::policy::CompiledPolicy;
use crate::engine::relevance::{excerpt_cached, AnalysisCache, Relevance};
use crate::engine::{text::char_count, ScoringMethod};
use crate::format::Conversation;

/// What relevance reads of each item beside its text: for a tool result,
/// its call's name and arguments (a config file's path is often only
/// there). The call itself is scored on its own text: calls to the same
/// tool with the same arguments would all tie, whatever they returned.
/// Empty under seed scoring.
pub fn subjects(conversation: &Conversation, policy: &CompiledPolicy) -> Vec<String> {
    let items = &conversation.items;
    if policy.engine.scoring == ScoringMethod::Seed {
        return vec![String::new(); items.len()];
    }
    // Each call id's first call; its text ("name arguments") is written
    // into each result's subject, not formatted once per call.
    let count = items.iter().map(|item| item.tool_calls.len()).sum();
    let mut calls: IdMap<&crate::format::ToolCall> =
        IdMap::with_capacity_and_hasher(count, RandomState::default());
    for item in items {
        for call in &item.tool_calls {
            calls.entry(call.id.as_str()).or_insert(call);
        }
    }
    let mut text = String::new();
    items
        .iter()
        .map(|item| {
            let mut subject = String::new();
            for id in item.answers.iter().chain(&item.piece_answers) {
                if let Some(call) = calls.get(id.as_str()) {
                    // Nearly every result answers one call: its subject is
                    // that call's, written straight in. Searching an empty
                    // subject would still cost a pass over the arguments
                    // (the substring search's setup).
                    if subject.is_empty() {
                        subject.reserve_exact(call.name.len() + call.arguments.len() + 2);
                        subject.push_str(&call.name);
                        subject.push(' ');
                        subject.push_str(&call.arguments);
                        subject.push('\n');
                        continue;
                    }
                    text.clear();
                    text.push_str(&call.name);
                    text.push(' ');
                    text.push_str(&call.arguments);
                    if !subject.contains(text.as_str()) {
                        subject.push_str(&text);
                        subject.push('\n');
                    }
                }
            }
            subject
        })
        .collect()
}

/// Marks in `protected` every item `relevant` marks and the other items of
/// its tool calls: a relevant result protects its call, a relevant call
/// its results.
pub fn protect_units(conversation: &Conversation, relevant: &[bool], protected: &mut [bool]) {
    let items = &conversation.items;
    if !relevant.iter().any(|&r| r) {
        return;
    }
    // The ids of the calls the relevant items make or answer (few): an
    // item is in a relevant unit when it makes or answers one of them.
    let mut ids: std::collections::HashSet<&str, RandomState> = Default::default();
    for (item, _) in items.iter().zip(relevant).filter(|(_, &r)| r) {
        ids.extend(call_ids(item));
    }
    for (i, item) in items.iter().enumerate() {
        if relevant[i] || (!ids.is_empty() && call_ids(item).any(|id| ids.contains(id))) {
            protected[i] = true;
        }
    }
}

/// The ids of the calls `item` makes or answers.
fn call_ids(item: &crate::format::Item) -> impl Iterator<Item = &str> {
    item.tool_calls
        .iter()
        .map(|c| c.id.as_str())
        .chain(item.answers.iter().map(String::as_str))
        .chain(item.piece_answers.iter().map(String::as_str))
}

/// Re-cuts each result the prune pass cut to head and tail that relevance
/// finds the query in: the same number of chars, around its matching
/// lines (a table row with its header), so the pruned text still holds
/// the terms that made it relevant. Results pruned piece by piece stay as
/// they are.
pub fn prune_around_matches(
    conversation: &Conversation,
    found: &Relevance,
    edits: &mut AgentEdits,
) {
    prune_around_matches_cached(conversation, found, edits, &crate::engine::NoCaches);
}

/// [`prune_around_matches`], reading where each result's terms stand
/// through `cache` (the same cuts, sooner on the next turn).
pub fn prune_around_matches_cached(
    conversation: &Conversation,
    found: &Relevance,
    edits: &mut AgentEdits,
    cache: &dyn AnalysisCache,
) {
    for (&i, edit) in edits.texts.iter_mut() {
        let TextEdit::Pruned(cut) = edit else {
            continue;
        };
        if edits.pieces.contains_key(&i) || !found.relevance.get(i).is_some_and(|&r| r > 0.0) {
            continue;
        }
        let text = &conversation.items[i].text;
        if let Some(around) = excerpt_cached(text, &found.query, char_count(cut), cache) {
            *cut = around;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::agent::tests::{call, result};
    use super::*;
    use crate::engine::{self, RelevancePolicy, Role};
    use crate::format::{Format, Item};

    fn relevance_policy(budget: usize, pin_relevant_above: f64) -> CompiledPolicy {
        let mut engine = engine::Policy::with_budget(budget);
        engine.scoring = ScoringMethod::Relevance(RelevancePolicy {
            pin_relevant_above,
            ..RelevancePolicy::default()
        });
        CompiledPolicy::plain("t", engine)
    }

    #[test]
    fn a_result_is_scored_with_its_calls_name_and_arguments() {
        let conversation = Conversation {
            items: vec![
                call(
                    "c1",
                    "read_file",
                    r#"{"path": "deploy/billing/limits.toml"}"#,
                ),
                result("c1", "max_connections = 640"),
                Item::new(Role::User, "max_connections of billing?"),
            ],
            outside_chars: 0,
        };
        let policy = relevance_policy(10, 0.5);
        let subjects = subjects(&conversation, &policy);
        assert!(subjects[1].contains("read_file"));
        assert!(subjects[1].contains("deploy/billing/limits.toml"));
        assert!(subjects[0].is_empty() && subjects[2].is_empty());
        let seed = CompiledPolicy::plain("s", engine::Policy::with_budget(10));
        assert!(super::subjects(&conversation, &seed)
            .iter()
            .all(String::is_empty));
        let messages = super::super::engine_messages(&conversation, &policy);
        assert_eq!(messages[1].subject, subjects[1]);
    }

    #[test]
    fn a_relevant_call_protects_its_results_and_a_result_its_call() {
        let conversation = Conversation {
            items: vec![
                call("c1", "read_file", "{}"),
                result("c1", "a"),
                call("c2", "read_file", "{}"),
                result("c2", "b"),
                Item::new(Role::User, "q"),
            ],
            outside_chars: 0,
        };
        let mut protected = vec![false; 5];
        protect_units(
            &conversation,
            &[true, false, false, true, false],
            &mut protected,
        );
        assert_eq!(protected, [true, true, true, true, false]);
    }

    #[test]
    fn a_relevant_tool_result_is_pruned_around_its_matching_line() {
        let log = |fact: Option<&str>| {
            let mut lines: Vec<String> = (0..150)
                .map(|i| format!("2026-03-14T02:{:02}:00Z INFO request {i} handled", i % 60))
                .collect();
            if let Some(fact) = fact {
                lines[75] = fact.to_owned();
            }
            lines.join("\n")
        };
        let fact = "2026-03-14T02:11:09Z ERROR upstream refused the batch, code E4471";
        let body = serde_json::json!({"model": "m", "messages": [
            {"role": "user", "content": "Watch the workers."},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "tail_log", "arguments": "{\"service\": \"worker\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": log(Some(fact))},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c2", "type": "function",
                "function": {"name": "tail_log", "arguments": "{\"service\": \"audit\"}"}}]},
            {"role": "tool", "tool_call_id": "c2", "content": log(None)},
            {"role": "user", "content": "Which error code did the upstream refuse the batch with?"},
        ]})
        .to_string();
        let parsed = Format::Chat.parse(body.as_bytes(), usize::MAX).unwrap();
        // Nothing is relevant enough to be protected: the result is pruned.
        let mut policy = relevance_policy(3_000, 1.01);
        policy.agent = super::super::agent::AgentPolicy {
            max_tool_result_chars: 400,
            protect_tool_chars: 0,
            prune_minimum_chars: 0,
            ..super::super::agent::AgentPolicy::OFF
        };
        let (plan, edits, _) = super::super::run_passes(&parsed, &policy);
        assert!(matches!(edits.texts.get(&2), Some(TextEdit::Pruned(_))));
        let plan = plan.expect("compacted");
        let text = plan
            .items
            .iter()
            .find(|p| p.index == 2)
            .and_then(|p| p.text.clone())
            .expect("the result is forwarded pruned");
        assert!(text.contains("code E4471"), "{text}");
        assert!(text.contains("chars omitted"), "{text}");
        assert!(char_count(&text) <= 440, "{}", char_count(&text));
    }
}
