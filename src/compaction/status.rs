//! What a body's compaction is reported as: the status its outcome earns
//! under its policy, and the one kind of body that is never compacted (a
//! coding agent's own compaction request). Shared by the proxy, the
//! `compact` command and the per-message reports, so they cannot disagree.

use crate::compaction::policy::CompiledPolicy;
use crate::format::{Parsed, Skip};
use crate::outcome::{Outcome, Status};

/// The coding agent's own compaction request is forwarded untouched
/// (`detect_agent_compaction`), so the agent summarizes all it has.
pub fn refuse_agent_compaction(parsed: &Parsed, policy: &CompiledPolicy) -> Result<(), Skip> {
    match parsed.agent_compaction() {
        Some(agent) if policy.detect_agent_compaction => Err(Skip::AgentCompaction(agent.name())),
        _ => Ok(()),
    }
}

/// How a compactable body is reported; only `Compacted` forwards the rewrite.
pub fn status_of(policy: &CompiledPolicy, outcome: &Outcome) -> Status {
    if policy.dry_run {
        Status::DryRun
    } else if outcome.rewritten.is_some() {
        Status::Compacted
    } else if !outcome.loss.budget_met {
        // Over its budget, yet nothing in it may go (pins, kept roles,
        // the last turns): not "unchanged", which says it fit.
        Status::Skipped("nothing-removable")
    } else {
        Status::Unchanged
    }
}
