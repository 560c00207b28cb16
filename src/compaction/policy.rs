//! A policy ready to apply: every knob the compaction pipeline reads,
//! checked and compiled once from the configuration ([`crate::policy`]
//! compiles it; the model calls a policy may also make are kept there).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use http::{HeaderMap, HeaderName};
use regex::RegexSet;
use serde::{Deserialize, Serialize};

use crate::analysis_store::AnalysisStore;
use crate::compaction::agent::AgentPolicy;
use crate::compaction::budget::AutoBudget;
use crate::compaction::tokens::Encoding;
use crate::engine::Policy;

/// How a policy compacts across turns (`mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Compact each request on its own.
    Exact,
    /// Keep the forwarded prefix stable across turns, so prompt caching
    /// keeps working ([`crate::compaction::stable`]).
    #[default]
    Stable,
}

/// A policy ready to apply.
#[derive(Debug, Clone)]
pub struct CompiledPolicy {
    /// Unique per compilation: a reloaded policy of the same name is a
    /// different policy, so outcomes cached under the old one never apply.
    pub id: u64,
    pub name: Arc<str>,
    pub engine: Policy,
    pub mode: Mode,
    pub pin_first_user: bool,
    pub pin_patterns: RegexSet,
    pub allow_bypass: bool,
    pub dry_run: bool,
    pub allow_report: bool,
    /// Forward a coding agent's own compaction request untouched.
    pub detect_agent_compaction: bool,
    /// Ask Anthropic's API to drop stale reasoning it requires in place.
    pub thinking_drop_block: bool,
    /// `scoring = "relevance"`: the request header whose text is the goal.
    pub relevance_goal_header: Option<HeaderName>,
    /// Stable mode's low-water mark and kept head, as shares of the budget.
    pub stable_target_ratio: f64,
    pub stable_head_ratio: f64,
    /// Tool-result pruning, argument clipping, tool dedupe and triggers.
    pub agent: AgentPolicy,
    /// A token budget beside the char budget.
    pub budget_tokens: Option<usize>,
    /// The encoding for models the token table does not know.
    pub tokenizer_fallback: Encoding,
    /// Relevance scoring's per-message analyses, shared by every policy of
    /// one configuration (`cache.relevance_max_bytes`) and dropped with it
    /// on reload; a disabled store for a policy built outside a runtime.
    pub analyses: Arc<AnalysisStore>,
    /// `budget = "auto"`: each request's token budget comes from its
    /// model's context window.
    pub auto_budget: Option<AutoBudget>,
    /// `recall = true`: markers with recall ids, and their limits.
    pub recall: Option<crate::compaction::recall::RecallLimits>,
}

/// The most chars of a goal header that join the relevance query: a goal
/// is a sentence or two, and the query's cost grows with its terms.
pub const MAX_GOAL_CHARS: usize = 2000;

pub(crate) fn next_policy_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

impl CompiledPolicy {
    /// A policy with only the engine's knobs: no pins, bypass or dry run.
    pub fn plain(name: &str, engine: Policy) -> Self {
        CompiledPolicy {
            id: next_policy_id(),
            name: name.into(),
            engine,
            mode: Mode::Exact,
            pin_first_user: false,
            pin_patterns: RegexSet::empty(),
            allow_bypass: false,
            dry_run: false,
            allow_report: false,
            detect_agent_compaction: true,
            thinking_drop_block: true,
            relevance_goal_header: None,
            stable_target_ratio: 0.7,
            stable_head_ratio: 0.4,
            agent: AgentPolicy::OFF,
            budget_tokens: None,
            tokenizer_fallback: Encoding::O200kBase,
            analyses: Arc::new(AnalysisStore::new(0)),
            auto_budget: None,
            recall: None,
        }
    }

    /// The goal a request gives in the policy's `relevance_goal_header`:
    /// its text when the header is set, valid UTF-8 and not blank, cut to
    /// [`MAX_GOAL_CHARS`]. `None` for every request when the policy names no
    /// header.
    pub fn relevance_goal(&self, headers: &HeaderMap) -> Option<String> {
        let value = headers.get(self.relevance_goal_header.as_ref()?)?;
        let text = std::str::from_utf8(value.as_bytes()).ok()?.trim();
        (!text.is_empty())
            .then(|| crate::engine::text::char_prefix(text, MAX_GOAL_CHARS).to_owned())
    }

    /// This policy for a request that gives `goal`: the same policy, same
    /// id, with the goal joining the relevance query. A goal changes the
    /// outcome but not the cache key, so an outcome computed under it must
    /// not be cached.
    pub fn with_goal(&self, goal: String) -> CompiledPolicy {
        CompiledPolicy {
            id: self.id,
            name: self.name.clone(),
            engine: self.engine.with_goal(Some(goal)),
            mode: self.mode,
            pin_first_user: self.pin_first_user,
            pin_patterns: self.pin_patterns.clone(),
            allow_bypass: self.allow_bypass,
            dry_run: self.dry_run,
            allow_report: self.allow_report,
            detect_agent_compaction: self.detect_agent_compaction,
            thinking_drop_block: self.thinking_drop_block,
            relevance_goal_header: self.relevance_goal_header.clone(),
            stable_target_ratio: self.stable_target_ratio,
            stable_head_ratio: self.stable_head_ratio,
            agent: self.agent.clone(),
            budget_tokens: self.budget_tokens,
            tokenizer_fallback: self.tokenizer_fallback,
            analyses: self.analyses.clone(),
            auto_budget: self.auto_budget.clone(),
            recall: self.recall,
        }
    }
}
