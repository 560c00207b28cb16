//! Preserved thinking: what a compaction must do to the reasoning blocks of
//! the turns it keeps.
//!
//! Anthropic's models with preserved thinking sign each `thinking` block
//! against its prefix: the system prompt, the tools and every message
//! before it, as sent when the block was produced. A request that sends the
//! block back after any of that changed fails the API's prefix check (a 400,
//! or the block silently ignored, depending on the model), and so does one
//! where a block between others was left out. Compaction changes earlier
//! messages by definition, so the proxy follows the API's rule for a
//! gateway that trims history: it forwards a kept turn **without** its
//! reasoning blocks once something before that turn differs from what the
//! model saw when it produced them. A turn whose prefix is as the model saw
//! it keeps its blocks byte for byte.
//!
//! What the model saw depends on the mode:
//! - **exact**: each request is compacted on its own, so a block's prefix
//!   is known only while it was forwarded as it came, that is while the
//!   request that produced it fit its budget. A block is kept when that
//!   request fit and nothing before the block changes now; from the first
//!   block that fails this, every later block goes too (each saw the ones
//!   before it).
//! - **stable**: the replay knows exactly what each earlier turn forwarded
//!   ([`super::stable`]); a re-compaction strips the blocks of every entry
//!   from its first changed position on, and that choice stays part of the
//!   form, so later turns forward the same bytes.
//!
//! One turn cannot lose its blocks: the last assistant turn of an open
//! tool loop (the one whose calls the request's final tool results answer)
//! must start with its thinking, or the API refuses the request. When that
//! turn's prefix changed, its blocks are kept and marked
//! [`Reasoning::Stale`]: the proxy then asks the API to drop them
//! (`thinking.block_binding.prefix_mismatch_behavior = "drop_block"`, with
//! its beta header), unless the policy says the upstream runs no check
//! (`thinking_drop_block = false`).
//!
//! Pure: it only marks [`Planned::thinking`].

use crate::engine::Role;
use crate::format::{Conversation, Item, Plan, Planned, Reasoning};

/// The position, among `items`, of the last assistant turn of an open tool
/// loop, when it carries prefix-bound reasoning: the items end with tool
/// results, and the assistant item before them made the calls.
pub fn open_loop_turn<'a>(
    items: impl DoubleEndedIterator<Item = &'a Item> + ExactSizeIterator,
) -> Option<usize> {
    let n = items.len();
    let mut from_end = items.rev().enumerate();
    let (_, last) = from_end.next()?;
    if last.role != Role::Tool {
        return None;
    }
    for (k, item) in from_end {
        match item.role {
            Role::Tool => continue,
            Role::Assistant if item.thinking.is_some() && !item.tool_calls.is_empty() => {
                return Some(n - 1 - k)
            }
            _ => return None,
        }
    }
    None
}

/// Exact mode: marks the planned items whose reasoning is stale. The items
/// before position `p` of `plan` were forwarded, when item `plan[p]` was
/// produced, only if the request of its time (`items[..index]` plus what
/// lies outside the array) fit `budget_chars`. Returns how many items lose
/// their reasoning.
pub fn strip_stale_exact(
    conversation: &Conversation,
    plan: &mut Plan,
    budget_chars: usize,
) -> usize {
    let items = &conversation.items;
    if !items.iter().any(|item| item.thinking.is_some()) {
        return 0;
    }
    // Chars of each request of the past: the outside plus items[..i].
    let mut prefix_chars = conversation.outside_chars;
    let mut next_item = 0;
    let mut unchanged_so_far = true;
    let mut stale = false;
    let mut stripped = 0;
    let open = open_loop_turn(plan.items.iter().map(|p| &items[p.index]));
    for (position, planned) in plan.items.iter_mut().enumerate() {
        let item = &items[planned.index];
        while next_item < planned.index {
            prefix_chars += items[next_item].chars();
            next_item += 1;
        }
        // Every item before this one is forwarded, as it came.
        unchanged_so_far &= planned.index == position;
        if item.thinking.is_some() {
            let fit_then = prefix_chars <= budget_chars;
            stale |= !(unchanged_so_far && fit_then);
            if stale && Some(position) == open {
                planned.thinking = Reasoning::Stale;
            } else if stale {
                planned.thinking = Reasoning::Stripped;
                stripped += 1;
            }
        }
        unchanged_so_far &= is_verbatim(planned);
    }
    stripped
}

/// Exact mode, a request over its budget from which nothing may go: it is
/// forwarded whole, yet reasoning produced by an earlier request that was
/// compacted is bound to the prefix that request forwarded, not to this
/// one. The plan that keeps every item and strips (or, for an open loop's
/// last turn, marks) such reasoning; `None` when there is none.
pub fn stale_only(conversation: &Conversation, budget_chars: usize) -> Option<Plan> {
    let mut plan = Plan {
        items: (0..conversation.items.len())
            .map(Planned::verbatim)
            .collect(),
    };
    strip_stale_exact(conversation, &mut plan, budget_chars);
    plan.items
        .iter()
        .any(|p| p.thinking != Reasoning::AsTheyCame)
        .then_some(plan)
}

/// `recall = true`: the proxy adds its `compaction_recall` tool to a
/// request exactly when markers go with it ([`super::recall`]), and the
/// tools are part of every block's prefix. So a block whose producing
/// request carried no marker was made without the tool, and is stale now
/// that the tool goes. Its producing request is the forwarded conversation
/// before it, as the block is kept only while that is unchanged: it carried
/// a marker when a marker message (`inserts`, each placed before the plan's
/// item at its position) or a cut item (a marked text or arguments) comes
/// before the block. Marks every kept block before the first marker as
/// [`stale_exact`](strip_stale_exact) would (the open loop's last turn
/// [`Reasoning::Stale`], the others stripped); returns how many lose them.
///
/// Later blocks need nothing: in exact mode a block after a cut is stripped
/// already, and in stable mode each later block was made by a request that
/// had the markers and the tool, and the blocks stripped here, as now.
pub fn strip_made_without_the_tool(
    conversation: &Conversation,
    plan: &mut Plan,
    inserts: &[(usize, String)],
) -> usize {
    let items = &conversation.items;
    if !items.iter().any(|item| item.thinking.is_some()) {
        return 0;
    }
    let first_insert = inserts.iter().map(|(at, _)| *at).min();
    let open = open_loop_turn(plan.items.iter().map(|p| &items[p.index]));
    let mut stripped = 0;
    for (position, planned) in plan.items.iter_mut().enumerate() {
        if first_insert.is_some_and(|at| at <= position) {
            break;
        }
        let item = &items[planned.index];
        if item.thinking.is_some() && planned.thinking == Reasoning::AsTheyCame {
            if Some(position) == open {
                planned.thinking = Reasoning::Stale;
            } else {
                planned.thinking = Reasoning::Stripped;
                stripped += 1;
            }
        }
        let cut_text = planned.text.as_ref().is_some_and(|t| *t != item.text);
        let cut_arguments = planned.arguments.iter().any(|(call, args)| {
            item.tool_calls
                .get(*call)
                .is_some_and(|c| c.arguments != *args)
        });
        if cut_text || cut_arguments {
            break;
        }
    }
    stripped
}

/// Whether a planned item is forwarded as it came.
pub(crate) fn is_verbatim(planned: &Planned) -> bool {
    planned.text.is_none()
        && planned.arguments.is_empty()
        && planned.thinking == Reasoning::AsTheyCame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thinking_turn(text: &str) -> Item {
        let mut item = Item::new(Role::Assistant, text);
        item.thinking = Some(10);
        item.fixed_chars = 10;
        item
    }

    fn conversation() -> Conversation {
        Conversation {
            items: vec![
                Item::new(Role::User, "u".repeat(50)),
                thinking_turn("a1"),
                Item::new(Role::User, "u".repeat(50)),
                thinking_turn("a2"),
                Item::new(Role::User, "now"),
            ],
            outside_chars: 0,
        }
    }

    fn plan_of(indices: &[usize]) -> Plan {
        Plan {
            items: indices.iter().map(|&i| Planned::verbatim(i)).collect(),
        }
    }

    fn stripped(plan: &Plan) -> Vec<usize> {
        plan.items
            .iter()
            .filter(|p| p.thinking == Reasoning::Stripped)
            .map(|p| p.index)
            .collect()
    }

    #[test]
    fn with_the_recall_tool_added_reasoning_before_the_first_marker_is_stale() {
        let c = conversation();
        // Exact mode kept turn 1 (nothing before it changed, its request
        // fit), and item 2 was cut, with a marker: turn 1 was made without
        // the tool that goes now.
        let mut plan = plan_of(&[0, 1, 2, 3, 4]);
        plan.items[2].text = Some("u".into());
        assert_eq!(strip_stale_exact(&c, &mut plan, 10_000), 1);
        assert_eq!(stripped(&plan), [3]);
        assert_eq!(strip_made_without_the_tool(&c, &mut plan, &[]), 1);
        assert_eq!(stripped(&plan), [1, 3]);
        // A marker message before turn 1: its request had the marker and
        // the tool, so turn 1 keeps its reasoning.
        let mut plan = plan_of(&[0, 1, 2, 3, 4]);
        let marker = vec![(1, "{}".to_owned())];
        assert_eq!(strip_made_without_the_tool(&c, &mut plan, &marker), 0);
        assert!(stripped(&plan).is_empty());
        // A marker message after it: stale.
        let marker = vec![(2, "{}".to_owned())];
        assert_eq!(strip_made_without_the_tool(&c, &mut plan, &marker), 1);
        assert_eq!(stripped(&plan), [1]);
    }

    #[test]
    fn a_drop_before_a_turn_strips_it_and_every_later_turn() {
        let c = conversation();
        let mut plan = plan_of(&[1, 2, 3, 4]);
        assert_eq!(strip_stale_exact(&c, &mut plan, 10_000), 2);
        assert_eq!(stripped(&plan), [1, 3]);
    }

    #[test]
    fn a_drop_right_before_a_turn_strips_it() {
        let c = conversation();
        let mut plan = plan_of(&[0, 3, 4]);
        assert_eq!(strip_stale_exact(&c, &mut plan, 10_000), 1);
        assert_eq!(stripped(&plan), [3]);
    }

    #[test]
    fn turns_before_the_first_change_keep_their_reasoning() {
        let c = conversation();
        // Item 2 trimmed: item 1 saw an unchanged prefix, item 3 did not.
        let mut plan = plan_of(&[0, 1, 2, 3, 4]);
        plan.items[2].text = Some("u".into());
        assert_eq!(strip_stale_exact(&c, &mut plan, 10_000), 1);
        assert_eq!(stripped(&plan), [3]);
    }

    #[test]
    fn a_turn_produced_by_a_request_over_its_budget_is_stale_even_unchanged() {
        let c = conversation();
        // items[..3] came to 112 chars: that request was compacted, so
        // what turn 3 saw is unknown now, and item 4 was dropped.
        let mut plan = plan_of(&[0, 1, 2, 3]);
        assert_eq!(strip_stale_exact(&c, &mut plan, 100), 1);
        assert_eq!(stripped(&plan), [3]);
    }

    #[test]
    fn the_last_turn_of_an_open_tool_loop_keeps_its_stale_reasoning() {
        let mut c = conversation();
        c.items[3].tool_calls.push(crate::format::ToolCall {
            id: "t".into(),
            name: "read".into(),
            arguments: "{}".into(),
        });
        c.items[4] = Item::new(Role::Tool, "file");
        let mut plan = plan_of(&[1, 2, 3, 4]);
        assert_eq!(strip_stale_exact(&c, &mut plan, 10_000), 1);
        assert_eq!(stripped(&plan), [1]);
        assert_eq!(plan.items[2].thinking, Reasoning::Stale);
        assert!(plan.has_stale_thinking());
    }

    #[test]
    fn a_whole_request_over_budget_still_loses_reasoning_bound_to_a_compacted_prefix() {
        let c = conversation();
        // items[..3] came to 112 chars, over 100: the request that produced
        // item 3 was compacted, so its reasoning saw another prefix.
        let plan = stale_only(&c, 100).expect("a plan that strips");
        assert_eq!(plan.items.len(), c.items.len(), "every item kept");
        assert_eq!(stripped(&plan), [3]);
        // Every earlier request fit: nothing is stale, no plan.
        assert!(stale_only(&c, 10_000).is_none());
    }

    #[test]
    fn a_conversation_without_reasoning_is_left_alone() {
        let c = Conversation {
            items: vec![Item::new(Role::User, "a"), Item::new(Role::Assistant, "b")],
            outside_chars: 0,
        };
        let mut plan = plan_of(&[1]);
        assert_eq!(strip_stale_exact(&c, &mut plan, 1), 0);
    }
}
