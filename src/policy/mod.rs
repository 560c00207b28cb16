//! Policy resolution: the compiled configuration a request runs under
//! ([`Runtime`]), and the policy for a request from its route and tenant.
//! Turning a loaded [`Config`] into it, with every check serde cannot make,
//! is [`compile`].

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, HeaderName, Uri};
use regex::RegexSet;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use crate::analysis_store::AnalysisStore;
use crate::compaction::agent::AgentPolicy;
use crate::compaction::budget::AutoBudget;
use crate::compaction::tokens::Encoding;
use crate::config::{
    self, BudgetMode, Config, ConfigErrors, ConfigProblem, Mode, Overrides, PolicyConfig, Scoring,
};
use crate::engine::Policy;
use crate::format::Format;

mod compile;
use compile::compile_policy;
pub use compile::parse_listen;

/// More worker threads than this would be a typo, not a machine.
pub const MAX_WORKERS: usize = 1024;

/// Label used for tenants that are not configured (bounded metric labels).
pub const OTHER_TENANT: &str = "other";

/// [`OTHER_TENANT`] as a shared label: every request's copy is a reference
/// count, not an allocation.
pub fn other_tenant() -> Arc<str> {
    static OTHER: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| OTHER_TENANT.into());
    OTHER.clone()
}

/// Every configured duration, typed once when the configuration is
/// compiled (the TOML keys are seconds, `*_secs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub shutdown_delay: Duration,
    pub shutdown_grace: Duration,
    pub connect: Duration,
    pub response_header: Duration,
    pub upstream_idle: Duration,
    pub header_read: Duration,
    pub body_idle: Duration,
    pub keep_alive: Duration,
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
    pub agent: crate::compaction::agent::AgentPolicy,
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
    /// `strategy = "summarize"`: how this policy's summaries are written.
    pub summary: Option<Arc<SummaryPolicy>>,
    /// `recall = true`: markers with recall ids, and their limits.
    pub recall: Option<crate::compaction::recall::RecallLimits>,
    /// `tool_decisions = "model"`: the model that judges old tool calls.
    pub decisions: Option<Arc<crate::summarizer::Settings>>,
}

/// A policy's summaries: its summarizer, timing and prompt.
#[derive(Debug, Clone)]
pub struct SummaryPolicy {
    pub summarizer: Arc<crate::summarizer::Settings>,
    pub timing: config::SummaryTiming,
    pub role: config::SummaryRole,
    pub prompt: crate::summarizer::prompt::PromptSettings,
}

/// The most chars of a goal header that join the relevance query: a goal
/// is a sentence or two, and the query's cost grows with its terms.
pub const MAX_GOAL_CHARS: usize = 2000;

fn next_policy_id() -> u64 {
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
            agent: crate::compaction::agent::AgentPolicy::OFF,
            budget_tokens: None,
            tokenizer_fallback: Encoding::O200kBase,
            analyses: Arc::new(AnalysisStore::new(0)),
            auto_budget: None,
            summary: None,
            recall: None,
            decisions: None,
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
            summary: self.summary.clone(),
            recall: self.recall,
            decisions: self.decisions.clone(),
        }
    }
}

#[derive(Debug)]
struct Route {
    /// The configured path: the route's metric label.
    label: Arc<str>,
    /// The path's segments after the leading `/`; `*` matches any one.
    segments: Vec<String>,
    /// The path ended in `*`: its last segment is a prefix of the rest of
    /// the request path, however deep.
    prefix: bool,
    format: Format,
    policy: Arc<CompiledPolicy>,
}

impl Route {
    fn new(path: &str, format: Format, policy: Arc<CompiledPolicy>) -> Self {
        let (pattern, prefix) = match path.strip_suffix('*') {
            Some(p) => (p, true),
            None => (path, false),
        };
        Route {
            label: path.into(),
            segments: pattern
                .strip_prefix('/')
                .unwrap_or(pattern)
                .split('/')
                .map(str::to_owned)
                .collect(),
            prefix,
            format,
            policy,
        }
    }

    fn matches(&self, path: &str) -> bool {
        let mut rest = path;
        for (i, want) in self.segments.iter().enumerate() {
            let Some(r) = rest.strip_prefix('/') else {
                return false;
            };
            if self.prefix && i + 1 == self.segments.len() {
                return r.starts_with(want.as_str());
            }
            let (segment, tail) = r.split_at(r.find('/').unwrap_or(r.len()));
            if want != "*" && want != segment {
                return false;
            }
            rest = tail;
        }
        rest.is_empty()
    }
}

/// Everything the proxy needs from one configuration, checked and compiled.
/// Swapped whole on reload; a request keeps the one it started with.
#[derive(Debug)]
pub struct Runtime {
    pub config: Config,
    pub listen: SocketAddr,
    pub upstream: Uri,
    /// Extra CA certificates for the upstream (`upstream.ca_file`).
    pub upstream_roots: Vec<CertificateDer<'static>>,
    pub timeouts: Timeouts,
    routes: Vec<Route>,
    /// The `[summarizers.<name>]` sections, compiled.
    summarizers: HashMap<String, Arc<crate::summarizer::Settings>>,
    tenant_header: HeaderName,
    tenants: HashMap<Arc<str>, Arc<CompiledPolicy>>,
    /// `[inspector]`, its token read.
    pub inspector: crate::inspector::Settings,
    /// `[prices]`, compiled: costs and the model-family label of billing.
    pub prices: Arc<crate::usage::Prices>,
}

/// What applies to one request on a matched route.
#[derive(Debug, Clone)]
pub struct Resolution {
    /// The route's configured path: a bounded metric label.
    pub route: Arc<str>,
    pub policy: Arc<CompiledPolicy>,
    /// The tenant if configured, else [`OTHER_TENANT`].
    pub tenant: Arc<str>,
    /// The route's body format.
    pub format: Format,
}

impl Runtime {
    /// The summarizer named `name`, if a section defines it.
    pub fn summarizer(&self, name: &str) -> Option<Arc<crate::summarizer::Settings>> {
        self.summarizers.get(name).cloned()
    }

    /// The policy for a request: the first matching route's, overridden by a
    /// configured tenant's. `None` when no route matches (pass through).
    pub fn resolve(&self, path: &str, headers: &HeaderMap) -> Option<Resolution> {
        let route = self.routes.iter().find(|r| r.matches(path))?;
        let tenant = headers
            .get(&self.tenant_header)
            .and_then(|v| v.to_str().ok())
            .and_then(|t| self.tenants.get_key_value(t));
        let (tenant, policy) = match tenant {
            Some((name, policy)) => (name.clone(), policy.clone()),
            None => (other_tenant(), route.policy.clone()),
        };
        Some(Resolution {
            route: self.route_label(route),
            policy,
            tenant,
            format: route.format,
        })
    }

    /// The tenant header, when it is the proxy's alone (`None` with
    /// `tenants.forward_header = true`: it goes upstream too).
    pub fn own_tenant_header(&self) -> Option<&HeaderName> {
        (!self.config.tenants.forward_header).then_some(&self.tenant_header)
    }

    fn route_label(&self, route: &Route) -> Arc<str> {
        route.label.clone()
    }

    /// A named policy, for the offline `compact` command.
    pub fn policy(&self, name: &str) -> Option<Arc<CompiledPolicy>> {
        self.routes
            .iter()
            .map(|r| &r.policy)
            .chain(self.tenants.values())
            .find(|p| &*p.name == name)
            .cloned()
            .or_else(|| {
                // One offline compaction: nothing to share analyses with.
                let analyses = Arc::new(AnalysisStore::new(0));
                compile_policy(name, self.config.policies.get(name)?, &analyses)
                    .ok()
                    .map(Arc::new)
            })
    }
}

#[cfg(test)]
mod tests;
