//! Stage 1, pin: decide which messages are protected and why.

use rustc_hash::FxHashSet;

use super::{PinRule, PinStage, Policy, ProtectedBecause, Working};

/// Marks protected messages; returns the stage record and each message's
/// reasons (empty when unprotected), in the order pin, role, recent.
pub(super) fn run(work: &mut Working, policy: &Policy) -> (PinStage, Vec<Vec<ProtectedBecause>>) {
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

    // A group is kept whole, so one protected member protects all of them.
    let protected_groups: FxHashSet<u32> = work
        .messages
        .iter()
        .zip(&reasons)
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
    (stage, reasons)
}
