//! Stage 1, pin: decide which messages are protected and why.

use rustc_hash::{FxHashMap, FxHashSet};

use super::relevance::{excerpt_cached, Relevance};
use super::{Cut, PinRule, PinStage, Policy, ProtectedBecause, RelevancePolicy, Trimmed, Working};

/// Marks protected messages; returns the stage record, each message's
/// reasons (empty when unprotected), in the order pin, role, recent, and
/// the messages pinned for their relevance (when `relevance` gives each
/// message's relevance and the knobs).
pub(super) fn run(
    work: &mut Working,
    policy: &Policy,
    relevance: Option<(&Relevance, &RelevancePolicy)>,
    caches: &dyn super::Caches,
) -> (PinStage, Vec<Vec<ProtectedBecause>>, Vec<usize>) {
    let n = work.messages.len();
    let first_recent = n.saturating_sub(policy.keep_last_n);
    let mut reasons: Vec<Vec<ProtectedBecause>> = work
        .messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let mut why = Vec::new();
            if m.pin {
                why.push(ProtectedBecause::Pin);
            }
            if policy.keep_roles.contains(&m.role) {
                why.push(ProtectedBecause::Role);
            }
            if i >= first_recent {
                why.push(ProtectedBecause::Recent);
            }
            why
        })
        .collect();

    protect_groups(work, &mut reasons);
    let relevant_pins = match relevance {
        Some((relevance, knobs)) => {
            let pins = pin_relevant(work, &mut reasons, relevance, knobs, policy, caches);
            protect_groups(work, &mut reasons);
            pins
        }
        None => Vec::new(),
    };

    let mut protected_indices = Vec::new();
    for (i, why) in reasons.iter().enumerate() {
        if !why.is_empty() {
            work.protected[i] = true;
            protected_indices.push(i);
        }
    }
    let stage = PinStage {
        stage: "pin",
        order: 1,
        protected_messages: protected_indices.len(),
        protected_indices,
        rule: PinRule {
            keep_roles: policy.keep_roles.clone(),
            keep_last_n: policy.keep_last_n,
            explicit_pins: work.messages.iter().filter(|m| m.pin).count(),
        },
    };
    (stage, reasons, relevant_pins)
}

/// A group is kept whole, so one protected member protects all of them.
fn protect_groups(work: &Working, reasons: &mut [Vec<ProtectedBecause>]) {
    let protected_groups: FxHashSet<u32> = work
        .messages
        .iter()
        .zip(reasons.iter())
        .filter(|(_, why)| !why.is_empty())
        .filter_map(|(m, _)| m.group)
        .collect();
    if !protected_groups.is_empty() {
        for (m, why) in work.messages.iter().zip(reasons.iter_mut()) {
            if why.is_empty() && m.group.is_some_and(|g| protected_groups.contains(&g)) {
                why.push(ProtectedBecause::ToolGroup);
            }
        }
    }
}

/// Adds reason `relevant` to the unprotected messages whose relevance is at
/// least `pin_relevant_above`, most relevant first (the later message first
/// on a tie: a fact restated later is the current one), each with the rest
/// of its tool-call group, while their chars fit the cap: the smaller of
/// `relevant_pin_share` of the budget and what the budget has left after
/// the messages already protected. A unit that does not fit is skipped and
/// smaller ones after it may still be pinned. Returns the pinned indices,
/// ascending.
fn pin_relevant(
    work: &mut Working,
    reasons: &mut [Vec<ProtectedBecause>],
    found: &Relevance,
    knobs: &RelevancePolicy,
    policy: &Policy,
    caches: &dyn super::Caches,
) -> Vec<usize> {
    let relevance = found.relevance.as_slice();
    let protected_chars: usize = (0..work.messages.len())
        .filter(|&i| !reasons[i].is_empty())
        .map(|i| work.chars(i))
        .sum();
    let share = (knobs.relevant_pin_share.clamp(0.0, 1.0) * work.budget as f64).floor() as usize;
    let mut room = share.min(work.budget.saturating_sub(protected_chars));

    let mut order: Vec<usize> = (0..work.messages.len())
        .filter(|&i| reasons[i].is_empty())
        .filter(|&i| relevance[i] > 0.0 && relevance[i] >= knobs.pin_relevant_above)
        .collect();
    order.sort_by(|&a, &b| relevance[b].total_cmp(&relevance[a]).then(b.cmp(&a)));

    let mut groups: FxHashMap<u32, Vec<usize>> = FxHashMap::default();
    for (i, m) in work.messages.iter().enumerate() {
        if let Some(g) = m.group {
            groups.entry(g).or_default().push(i);
        }
    }
    let mut pinned = Vec::new();
    for i in order {
        if !reasons[i].is_empty() {
            continue; // pinned with its group already
        }
        let unit = match work.messages[i].group.and_then(|g| groups.get(&g)) {
            Some(members) => members.as_slice(),
            None => std::slice::from_ref(&i),
        };
        let chars: usize = unit.iter().map(|&k| work.chars(k)).sum();
        if chars > room && !work.fits() {
            // Too long whole: the unit's longest text cut around the
            // match, when that fits (a tool result, not its call).
            let Some(&longest) = unit.iter().max_by_key(|&&k| (work.kept_chars[k], k)) else {
                continue;
            };
            let others = chars - work.chars(longest);
            let cap = policy
                .max_message_chars
                .min(room.saturating_sub(others + work.messages[longest].fixed_chars));
            let content = &work.messages[longest].content;
            let Some(cut) = excerpt_cached(content, &found.query, cap, caches) else {
                continue;
            };
            let original_chars = work.chars(longest);
            work.set_excerpt(longest, cut);
            work.pinned_excerpts.push(Trimmed {
                index: longest,
                original_chars,
                chars: work.chars(longest),
                cut: Cut::Match,
            });
        }
        let chars: usize = unit.iter().map(|&k| work.chars(k)).sum();
        if chars > room {
            continue;
        }
        room -= chars;
        for &k in unit {
            if k != i {
                reasons[k].push(ProtectedBecause::ToolGroup);
            }
        }
        reasons[i].push(ProtectedBecause::Relevant);
        pinned.push(i);
    }
    pinned.sort_unstable();
    pinned
}
