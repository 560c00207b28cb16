//! Summaries in the pipeline, pure like the rest of it: which items a
//! summary replaces, where the one summary message goes, what it looks
//! like in each format, and the loss it reports. Fetching the summary (the
//! store, the model) is the proxy's business ([`crate::proxy::summaries`]);
//! this module only decides and splices.
//!
//! - **Exact mode** ([`exact_removal`]): every unprotected item older than
//!   the kept tail (the last `keep_last_n` items, widened back to the start
//!   of a tool group) is replaced.
//! - **Stable mode** ([`stable_removal`]): the items the replay left out,
//!   which change only at a re-compaction, so the summary (and with it the
//!   forwarded prefix) stays the same between re-compactions.
//!
//! Protected items (system and developer roles, pins, the format's fixed
//! items) and the tail go verbatim. The summary message goes right after
//! the last replaced item, before the first survivor that follows it, never
//! inside a tool group, so each API's pairing rules hold. It opens with a
//! marker line ([`marker`]) that the report and the next turn recognise.
//!
//! Preserved thinking: a summary never replaces the tail, which holds the
//! latest assistant turn and its thinking blocks verbatim, and tool groups
//! (calls, results and the thinking of their turn) go whole or not at all;
//! [`respect_preserved_thinking`] is where a stricter rule of the engine
//! applies to summaries too.

use crate::compaction::policy::CompiledPolicy;
use crate::engine::Role;
use crate::format::{Conversation, Format, Parsed, Plan, Planned};
use crate::outcome::LossSummary;
use serde::{Deserialize, Serialize};

/// The role of a chat completions summary message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummaryRole {
    #[default]
    User,
    System,
}

/// The first line of every summary message.
pub const MARKER_PREFIX: &str = "[compaction-proxy summary ";

/// The marker line of summary `id`.
pub fn marker(id: &str) -> String {
    format!("{MARKER_PREFIX}{id}]")
}

/// The id of the summary a text is, when it opens with a marker line.
pub fn summary_id(text: &str) -> Option<&str> {
    let rest = text.strip_prefix(MARKER_PREFIX)?;
    let end = rest.find(']')?;
    let id = &rest[..end];
    (!id.is_empty() && !id.contains('\n')).then_some(id)
}

/// What a summary replaces and what survives around it.
#[derive(Debug, Clone, PartialEq)]
pub struct Removal {
    /// The replaced items, in order.
    pub removed: Vec<usize>,
    /// The survivors.
    pub plan: Plan,
    /// Where in `plan.items` the summary goes (before that survivor).
    pub insert_at: usize,
}

/// Items a policy protects, widened to whole tool groups.
fn protected_groups(conversation: &Conversation, policy: &CompiledPolicy) -> Vec<bool> {
    let mut protected = super::protected_items(conversation, policy);
    let items = &conversation.items;
    let groups: std::collections::HashSet<u32> = items
        .iter()
        .zip(&protected)
        .filter(|(_, &p)| p)
        .filter_map(|(m, _)| m.group)
        .collect();
    for (i, m) in items.iter().enumerate() {
        if m.group.is_some_and(|g| groups.contains(&g)) {
            protected[i] = true;
        }
    }
    protected
}

/// Exact mode: the unprotected items older than the kept tail. `None`
/// when nothing is older than the tail.
pub fn exact_removal(
    conversation: &Conversation,
    policy: &CompiledPolicy,
    format: Format,
) -> Option<Removal> {
    let items = &conversation.items;
    let mut tail = items.len().saturating_sub(policy.engine.keep_last_n);
    // The tail never starts inside a tool group.
    while tail > 0 && items[tail].group.is_some() && items[tail - 1].group == items[tail].group {
        tail -= 1;
    }
    let protected = protected_groups(conversation, policy);
    let mut removed: Vec<usize> = (0..tail).filter(|&i| !protected[i]).collect();
    respect_preserved_thinking(conversation, &mut removed);
    if removed.is_empty() {
        return None;
    }
    let plan = Plan {
        items: (0..items.len())
            .filter(|i| !removed.contains(i))
            .map(Planned::verbatim)
            .collect(),
    };
    Some(place(conversation, plan, removed, format))
}

/// Stable mode: the items the replay's `plan` leaves out. `None` when it
/// leaves none out (it only trimmed).
pub fn stable_removal(conversation: &Conversation, plan: &Plan, format: Format) -> Option<Removal> {
    let mut kept = vec![false; conversation.items.len()];
    for p in &plan.items {
        kept[p.index] = true;
    }
    let mut removed: Vec<usize> = (0..kept.len()).filter(|&i| !kept[i]).collect();
    respect_preserved_thinking(conversation, &mut removed);
    if removed.is_empty() {
        return None;
    }
    Some(place(conversation, plan.clone(), removed, format))
}

/// Where a summary of a removal goes in its plan: before the first
/// survivor after the last replaced item, moved past any survivor of the
/// same tool group as the one before it. A Messages conversation must open
/// with a user turn: when its survivors before that point do not, the
/// summary (a user turn) goes first.
fn place(conversation: &Conversation, plan: Plan, removed: Vec<usize>, format: Format) -> Removal {
    let items = &conversation.items;
    let last = *removed.last().expect("a removal removes something");
    let mut insert_at = plan
        .items
        .iter()
        .position(|p| p.index > last)
        .unwrap_or(plan.items.len());
    while insert_at > 0 && insert_at < plan.items.len() {
        let (before, at) = (
            &items[plan.items[insert_at - 1].index],
            &items[plan.items[insert_at].index],
        );
        if before.group.is_some() && before.group == at.group {
            insert_at += 1;
        } else {
            break;
        }
    }
    if format == Format::Anthropic && insert_at > 0 && items[plan.items[0].index].role != Role::User
    {
        insert_at = 0;
    }
    let mut plan = plan;
    strip_after_summary(conversation, &mut plan, &removed, insert_at);
    Removal {
        removed,
        plan,
        insert_at,
    }
}

/// The preserved-thinking rule ([`super::thinking`]) for a summary: every
/// kept turn after the summary, or after the first replaced item, sees a
/// prefix the model never saw, so it loses its reasoning blocks; the last
/// turn of an open tool loop keeps them marked stale (the proxy then asks
/// the API to drop them). Turns before both keep theirs.
fn strip_after_summary(
    conversation: &Conversation,
    plan: &mut Plan,
    removed: &[usize],
    insert_at: usize,
) {
    let items = &conversation.items;
    let Some(&first_removed) = removed.first() else {
        return;
    };
    if !plan.items.iter().any(|p| items[p.index].thinking.is_some()) {
        return;
    }
    let changed_from = plan
        .items
        .iter()
        .position(|p| p.index > first_removed)
        .unwrap_or(plan.items.len())
        .min(insert_at);
    let open = super::thinking::open_loop_turn(plan.items.iter().map(|p| &items[p.index]));
    for (position, planned) in plan.items.iter_mut().enumerate().skip(changed_from) {
        if items[planned.index].thinking.is_none() {
            continue;
        }
        planned.thinking = if Some(position) == open {
            crate::format::Reasoning::Stale
        } else {
            crate::format::Reasoning::Stripped
        };
    }
}

/// What must stay out of `removed` for the API's thinking checks: nothing
/// more than the tail and whole tool groups already keep (the latest
/// assistant turn with its thinking). The kept turns after a summary lose
/// their reasoning in [`place`] instead, as after any other cut.
pub fn respect_preserved_thinking(_conversation: &Conversation, _removed: &mut Vec<usize>) {}

/// The summary message as an element of the format's compacted array.
pub fn summary_item(format: Format, role: SummaryRole, id: &str, text: &str) -> String {
    let content = format!("{}\n{}", marker(id), text);
    let value = match format {
        Format::Chat => serde_json::json!({
            "role": match role {
                SummaryRole::User => "user",
                SummaryRole::System => "system",
            },
            "content": content,
        }),
        Format::Anthropic => serde_json::json!({
            "role": "user",
            "content": [{"type": "text", "text": content}],
        }),
        Format::Responses => serde_json::json!({
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": content}],
        }),
    };
    serde_json::to_string(&value).expect("JSON values encode")
}

/// The chars a summary message counts: its text, marker line included.
pub fn summary_chars(id: &str, text: &str) -> usize {
    crate::engine::text::char_count(&marker(id)) + 1 + crate::engine::text::char_count(text)
}

/// The body with the removal's items replaced by the summary message.
pub fn splice(parsed: &Parsed, removal: &Removal, item: &str) -> String {
    parsed.splice_inserting(&removal.plan, Some((removal.insert_at, item)))
}

/// The loss of a removal whose summary counts `summary_chars`.
pub fn loss(
    conversation: &Conversation,
    removal: &Removal,
    summary_chars: usize,
    budget: usize,
) -> LossSummary {
    let mut loss = super::loss_of(conversation, &removal.plan, budget);
    loss.output_chars += summary_chars;
    loss.output_messages += 1;
    loss.dropped_messages = removal.removed.len();
    loss.retained_ratio = if loss.input_chars == 0 {
        1.0
    } else {
        crate::engine::round_to(loss.output_chars as f64 / loss.input_chars as f64, 4)
    };
    loss.budget_met = loss.output_chars <= budget;
    loss
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::agent::tests::{call, result};
    use crate::engine;
    use crate::format::Item;

    fn policy(keep_last_n: usize) -> CompiledPolicy {
        let mut engine = engine::Policy::with_budget(100);
        engine.keep_last_n = keep_last_n;
        engine.keep_roles = vec![Role::System];
        let mut policy = CompiledPolicy::plain("t", engine);
        policy.pin_first_user = true;
        policy
    }

    fn conversation() -> Conversation {
        let mut items = vec![
            Item::new(Role::System, "You are terse."),
            Item::new(Role::User, "Task: fix the build."),
            Item::new(Role::Assistant, "Looking."),
            call("c1", "read_file", r#"{"path":"a"}"#),
            result("c1", "contents"),
            Item::new(Role::User, "And the tests?"),
            Item::new(Role::Assistant, "Running them."),
            Item::new(Role::User, "Go on."),
        ];
        // The call and its result form one group, as the formats make them.
        items[3].group = Some(3);
        items[4].group = Some(3);
        Conversation {
            items,
            outside_chars: 0,
        }
    }

    #[test]
    fn exact_mode_replaces_the_unprotected_items_older_than_the_tail() {
        let removal = exact_removal(&conversation(), &policy(3), Format::Chat).unwrap();
        assert_eq!(removal.removed, vec![2, 3, 4]);
        let kept: Vec<usize> = removal.plan.items.iter().map(|p| p.index).collect();
        assert_eq!(kept, vec![0, 1, 5, 6, 7]);
        // System and the pinned task, then the summary, then the tail.
        assert_eq!(removal.insert_at, 2);
    }

    #[test]
    fn the_tail_never_starts_inside_a_tool_group() {
        // keep_last_n = 4 would start the tail at the result (index 4).
        let removal = exact_removal(&conversation(), &policy(4), Format::Chat).unwrap();
        assert_eq!(removal.removed, vec![2]);
        let kept: Vec<usize> = removal.plan.items.iter().map(|p| p.index).collect();
        assert_eq!(kept, vec![0, 1, 3, 4, 5, 6, 7]);
    }

    #[test]
    fn nothing_older_than_the_tail_is_no_removal() {
        assert_eq!(
            exact_removal(&conversation(), &policy(8), Format::Chat),
            None
        );
        assert_eq!(
            exact_removal(&conversation(), &policy(6), Format::Chat),
            None
        );
    }

    #[test]
    fn stable_mode_replaces_what_the_replay_left_out() {
        let plan = Plan {
            items: [0, 1, 5, 6, 7].into_iter().map(Planned::verbatim).collect(),
        };
        let removal = stable_removal(&conversation(), &plan, Format::Chat).unwrap();
        assert_eq!(removal.removed, vec![2, 3, 4]);
        assert_eq!(removal.insert_at, 2);
        let all = Plan {
            items: (0..8).map(Planned::verbatim).collect(),
        };
        assert_eq!(stable_removal(&conversation(), &all, Format::Chat), None);
    }

    #[test]
    fn a_messages_conversation_opens_with_the_summary_when_no_user_leads() {
        let mut c = conversation();
        c.items[1].role = Role::Assistant; // nothing pinned as a user turn
        let mut p = policy(3);
        p.pin_patterns = regex::RegexSet::new(["fix the build"]).unwrap();
        p.pin_first_user = false;
        let removal = exact_removal(&c, &p, Format::Anthropic).unwrap();
        let first = c.items[removal.plan.items[0].index].role;
        assert_eq!(first, Role::System);
        // System is outside a Messages array in practice; here the lead is
        // not a user turn, so the summary goes first.
        assert_eq!(removal.insert_at, 0);
    }

    #[test]
    fn markers_carry_the_id_and_are_recognised() {
        let item = summary_item(Format::Chat, SummaryRole::User, "ab12", "## Task\nFix.");
        let value: serde_json::Value = serde_json::from_str(&item).unwrap();
        assert_eq!(value["role"], "user");
        let text = value["content"].as_str().unwrap();
        assert_eq!(summary_id(text), Some("ab12"));
        assert_eq!(summary_chars("ab12", "## Task\nFix."), text.chars().count());
        assert_eq!(summary_id("[compaction-proxy summary ]"), None);
        assert_eq!(summary_id("plain text"), None);
        let system = summary_item(Format::Chat, SummaryRole::System, "x", "t");
        assert!(system.contains(r#""role":"system""#));
        let anthropic: serde_json::Value = serde_json::from_str(&summary_item(
            Format::Anthropic,
            SummaryRole::System,
            "x",
            "t",
        ))
        .unwrap();
        assert_eq!(
            anthropic["role"], "user",
            "a Messages summary is a user turn"
        );
        assert_eq!(anthropic["content"][0]["type"], "text");
        let responses: serde_json::Value = serde_json::from_str(&summary_item(
            Format::Responses,
            SummaryRole::User,
            "x",
            "t",
        ))
        .unwrap();
        assert_eq!(responses["type"], "message");
        assert_eq!(responses["content"][0]["type"], "input_text");
    }
}
