//! What each API requires of the items a plan keeps, applied after the
//! engine and the passes chose them ([`Format::repair`]):
//! - **no invalid leftovers** (every format): a cut never leaves an empty
//!   text piece where the API refuses one (a tool result, a text block, a
//!   message): a piece whose every char went becomes a marker saying how
//!   many went, so the plan counts what is really forwarded;
//! - **Messages opens with a user turn**: assistant items left at the front
//!   go too (with their tool groups), unless they are fixed (a provider's
//!   compaction opens the conversation the API reads);
//! - **Messages' system entries sit where the API allows them**: a
//!   `role: "system"` entry carrying content follows a user turn and
//!   precedes an assistant turn or ends the list; when the engine dropped
//!   a neighbour that made it so, the neighbour comes back as it came.

use super::{Conversation, Format, Item, Plan, Planned};
use crate::engine::text::{char_count, char_prefix, omission_marker};
use crate::engine::Role;

impl Format {
    /// Applies what the API requires of the survivors (see the module).
    /// A Messages conversation must open with a user turn: assistant items
    /// the engine left at the front go too (with their tool groups; tool
    /// results are user turns on the wire), until a user turn leads.
    /// Dropping a lead's group can bring another assistant item to the
    /// front, hence the loop. When no user turn would be left at all (none
    /// survived, or nothing did), the conversation's last plain user
    /// message is forwarded alone: it is the request being made, and the
    /// API refuses an empty list.
    pub fn repair(self, conversation: &Conversation, plan: &mut Plan) {
        if self == Format::Anthropic {
            lead_with_user(conversation, plan);
            place_system_entries(conversation, plan);
            restore_a_leading_user(conversation, plan);
        }
        no_empty_leftovers(conversation, plan);
    }
}

fn lead_with_user(conversation: &Conversation, plan: &mut Plan) {
    let items = &conversation.items;
    loop {
        let lead = plan
            .items
            .iter()
            .take_while(|p| items[p.index].role == Role::Assistant && !items[p.index].fixed)
            .count();
        if lead == plan.items.len() {
            let last_user = items
                .iter()
                .rposition(|m| m.role == Role::User && m.group.is_none());
            if let Some(last_user) = last_user {
                plan.items = vec![Planned::verbatim(last_user)];
            }
            return;
        }
        if lead == 0 {
            return;
        }
        let groups: Vec<u32> = plan.items[..lead]
            .iter()
            .filter_map(|p| items[p.index].group)
            .collect();
        let mut n = 0;
        plan.items.retain(|p| {
            n += 1;
            n > lead && !items[p.index].group.is_some_and(|g| groups.contains(&g))
        });
    }
}

/// A user turn on the wire: a user message or one of tool results.
fn user_turn(item: &Item) -> bool {
    matches!(item.role, Role::User | Role::Tool)
}

/// Puts back, as they came, the neighbours a kept run of system entries
/// needs: the item before it when what precedes it now is no user turn,
/// the item after it when what follows now is a user turn (each with its
/// tool group). An entry with no content (an effort change alone) may sit
/// anywhere.
fn place_system_entries(conversation: &Conversation, plan: &mut Plan) {
    let items = &conversation.items;
    if !items.iter().any(|m| m.role == Role::System) {
        return;
    }
    // Each round puts back at least one item: at most all of them.
    for _ in 0..=items.len() {
        let kept: Vec<usize> = plan.items.iter().map(|p| p.index).collect();
        let mut missing = None;
        let mut k = 0;
        while k < kept.len() && missing.is_none() {
            if items[kept[k]].role != Role::System {
                k += 1;
                continue;
            }
            let start = k;
            while k < kept.len() && items[kept[k]].role == Role::System {
                k += 1;
            }
            let run = &kept[start..k];
            if run.iter().all(|&i| items[i].chars() == 0) {
                continue;
            }
            let (first, last) = (run[0], run[run.len() - 1]);
            // As it came, or after a user turn.
            let after_ok =
                start > 0 && (kept[start - 1] + 1 == first || user_turn(&items[kept[start - 1]]));
            let before_ok =
                k == kept.len() || kept[k] == last + 1 || items[kept[k]].role == Role::Assistant;
            if !after_ok && first > 0 {
                missing = Some(first - 1);
            } else if !before_ok && last + 1 < items.len() {
                missing = Some(last + 1);
            }
        }
        let Some(missing) = missing else { return };
        restore(items, plan, missing);
    }
}

/// Puts item `index` back into the plan as it came, with its tool group.
fn restore(items: &[Item], plan: &mut Plan, index: usize) {
    let group = items[index].group;
    for (i, item) in items.iter().enumerate() {
        let wanted = i == index || (group.is_some() && item.group == group);
        if wanted && !plan.items.iter().any(|p| p.index == i) {
            plan.items.push(Planned::verbatim(i));
        }
    }
    plan.items.sort_by_key(|p| p.index);
}

/// When what leads the plan is no user turn and no provider compaction
/// (a fixed assistant message, a system entry, a tool round put back),
/// the nearest plain user message before it comes back as it came.
fn restore_a_leading_user(conversation: &Conversation, plan: &mut Plan) {
    let items = &conversation.items;
    let Some(first) = plan.items.first().map(|p| p.index) else {
        return;
    };
    let lead = &items[first];
    if user_turn(lead)
        || lead.provider_compaction
        || lead.why_fixed == Some(super::BEFORE_COMPACTION)
    {
        return;
    }
    if let Some(user) = items[..first]
        .iter()
        .rposition(|m| m.role == Role::User && m.group.is_none())
    {
        restore(items, plan, user);
    }
}

/// No text piece a plan keeps is left empty where the API refuses it: a
/// cut that would empty a tool result (the engine cuts an item joining
/// several results as one text) shares the chars it keeps among the
/// results instead, each keeping its head, so the item forwards as many
/// chars as the cut chose; a piece that would still be empty or blank, or
/// an item's whole text cut to nothing, becomes a marker of the chars that
/// went (counted: the plan says what is forwarded).
fn no_empty_leftovers(conversation: &Conversation, plan: &mut Plan) {
    for p in &mut plan.items {
        let Some(text) = &p.text else { continue };
        let item = &conversation.items[p.index];
        let n = item.piece_chars.len();
        // A text block beside results may go; a result may not.
        let required = |k: usize| item.piece_answers.get(k).map_or(true, |a| !a.is_empty());
        if n >= 2 {
            let pieces = match &p.pieces {
                Some(pieces) if pieces.len() == n => Some(pieces.clone()),
                _ => prefix_pieces(&item.text, text, &item.piece_chars),
            };
            let pieces = pieces.unwrap_or_else(|| {
                // Other text goes whole into the first piece, as the
                // splice would spread it, and the rest are emptied.
                let mut pieces = vec![String::new(); n];
                pieces[0] = text.clone();
                pieces
            });
            let blank = |k: usize, piece: &str| {
                required(k) && item.piece_chars[k] > 0 && piece.trim().is_empty()
            };
            if !(0..n).any(|k| blank(k, &pieces[k])) {
                continue;
            }
            let Some(originals) = prefix_pieces(&item.text, &item.text, &item.piece_chars) else {
                continue;
            };
            let kept: usize = pieces.iter().map(|piece| char_count(piece)).sum();
            let shares = share(&item.piece_chars, kept);
            let mut pieces: Vec<String> = originals
                .iter()
                .zip(&shares)
                .map(|(original, &chars)| char_prefix(original, chars).to_owned())
                .collect();
            for (k, piece) in pieces.iter_mut().enumerate() {
                if blank(k, piece) {
                    *piece = omission_marker(item.piece_chars[k]);
                }
            }
            p.text = Some(pieces.concat());
            p.pieces = Some(pieces);
        } else if text.trim().is_empty() && !item.text.trim().is_empty() {
            p.text = Some(omission_marker(char_count(&item.text)));
        }
    }
}

/// `total` chars shared among pieces of `caps` chars each, evenly, a piece
/// never getting more than it has (what one cannot take goes to the rest).
fn share(caps: &[usize], mut total: usize) -> Vec<usize> {
    let mut shares = vec![0; caps.len()];
    let mut open: Vec<usize> = (0..caps.len()).filter(|&k| caps[k] > 0).collect();
    while total > 0 && !open.is_empty() {
        let each = (total / open.len()).max(1);
        let mut still = Vec::with_capacity(open.len());
        for &k in &open {
            let give = each.min(caps[k] - shares[k]).min(total);
            shares[k] += give;
            total -= give;
            if shares[k] < caps[k] {
                still.push(k);
            }
        }
        open = still;
    }
    shares
}

/// `new`, a prefix of `original`, split over pieces of `piece_chars` chars
/// each; `None` when it is no prefix.
fn prefix_pieces(original: &str, new: &str, piece_chars: &[usize]) -> Option<Vec<String>> {
    if !original.starts_with(new) {
        return None;
    }
    let mut left = new;
    Some(
        piece_chars
            .iter()
            .map(|&chars| {
                let piece = char_prefix(left, chars);
                left = &left[piece.len()..];
                piece.to_owned()
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(indices: &[usize]) -> Plan {
        Plan {
            items: indices.iter().map(|&i| Planned::verbatim(i)).collect(),
        }
    }

    fn indices(plan: &Plan) -> Vec<usize> {
        plan.items.iter().map(|p| p.index).collect()
    }

    fn system(text: &str) -> Item {
        let mut item = Item::new(Role::System, text);
        item.fix("test");
        item
    }

    #[test]
    fn a_system_entry_gets_back_the_assistant_turn_it_preceded() {
        // user, system, assistant, user: dropping the assistant would leave
        // the system entry before a user turn, which the API refuses.
        let conversation = Conversation {
            items: vec![
                Item::new(Role::User, "task"),
                system("from now on, be brief"),
                Item::new(Role::Assistant, "a long answer"),
                Item::new(Role::User, "next"),
            ],
            outside_chars: 0,
        };
        let mut plan = plan_of(&[0, 1, 3]);
        Format::Anthropic.repair(&conversation, &mut plan);
        assert_eq!(indices(&plan), [0, 1, 2, 3]);
        // An effort change alone (no content) may sit anywhere.
        let mut quiet = conversation.clone();
        quiet.items[1] = system("");
        let mut plan = plan_of(&[0, 1, 3]);
        Format::Anthropic.repair(&quiet, &mut plan);
        assert_eq!(indices(&plan), [0, 1, 3]);
        // Chat has no such rule.
        let mut plan = plan_of(&[0, 1, 3]);
        Format::Chat.repair(&conversation, &mut plan);
        assert_eq!(indices(&plan), [0, 1, 3]);
    }

    #[test]
    fn a_system_entry_gets_back_the_user_turn_it_followed_with_its_round() {
        let mut call = Item::new(Role::Assistant, "");
        call.group = Some(1);
        let mut result = Item::new(Role::Tool, "output");
        result.group = Some(1);
        let conversation = Conversation {
            items: vec![
                Item::new(Role::User, "task"),
                Item::new(Role::Assistant, "reading"),
                call,
                result,
                system("the file changed on disk"),
                Item::new(Role::Assistant, "ok"),
            ],
            outside_chars: 0,
        };
        // The round went: the system entry would follow an assistant turn.
        let mut plan = plan_of(&[0, 1, 4, 5]);
        Format::Anthropic.repair(&conversation, &mut plan);
        assert_eq!(indices(&plan), [0, 1, 2, 3, 4, 5]);
        // The task went too: the round put back, then a user turn leads.
        let mut plan = plan_of(&[4, 5]);
        Format::Anthropic.repair(&conversation, &mut plan);
        assert_eq!(indices(&plan), [0, 2, 3, 4, 5]);
    }

    #[test]
    fn a_fixed_lead_stays_and_a_compaction_may_open_the_conversation() {
        let mut compaction = Item::new(Role::Assistant, "");
        compaction.provider_compaction = true;
        compaction.fix(super::super::HOLDS_COMPACTION);
        let conversation = Conversation {
            items: vec![
                compaction,
                Item::new(Role::User, "go on"),
                Item::new(Role::Assistant, "b"),
                Item::new(Role::User, "c"),
            ],
            outside_chars: 0,
        };
        let mut plan = plan_of(&[0, 2, 3]);
        Format::Anthropic.repair(&conversation, &mut plan);
        assert_eq!(indices(&plan), [0, 2, 3]);
        // A fixed assistant message that is no compaction gets the user
        // turn before it back.
        let mut unknown = conversation.clone();
        unknown.items[0] = Item::new(Role::User, "task");
        unknown.items[2].fix(super::super::UNKNOWN_KEPT_WHOLE);
        let mut plan = plan_of(&[2, 3]);
        Format::Anthropic.repair(&unknown, &mut plan);
        assert_eq!(indices(&plan), [1, 2, 3]);
    }

    #[test]
    fn shares_are_even_and_capped() {
        assert_eq!(share(&[50, 30], 20), [10, 10]);
        assert_eq!(share(&[50, 4], 20), [16, 4]);
        assert_eq!(share(&[3, 0, 3], 10), [3, 0, 3]);
        assert_eq!(share(&[5, 5, 5], 2), [1, 1, 0]);
    }

    #[test]
    fn an_emptied_tool_result_keeps_a_head_or_becomes_a_marker() {
        let mut results = Item::new(Role::Tool, format!("{}{}", "a".repeat(50), "b".repeat(30)));
        results.piece_chars = vec![50, 30];
        results.piece_answers = vec!["t1".into(), "t2".into()];
        let conversation = Conversation {
            items: vec![results, Item::new(Role::Tool, "alone")],
            outside_chars: 0,
        };
        for format in Format::ALL {
            let mut plan = Plan {
                items: vec![
                    Planned {
                        text: Some("a".repeat(20)),
                        ..Planned::verbatim(0)
                    },
                    Planned {
                        text: Some(String::new()),
                        ..Planned::verbatim(1)
                    },
                ],
            };
            format.repair(&conversation, &mut plan);
            // The 20 chars kept are shared: each result keeps its head.
            let heads = ["a".repeat(10), "b".repeat(10)];
            assert_eq!(plan.items[0].pieces.as_deref(), Some(&heads[..]));
            assert_eq!(plan.items[0].text, Some(heads.concat()));
            // Nothing kept at all: a marker.
            assert_eq!(plan.items[1].text, Some(omission_marker(5)));
        }
    }
}
