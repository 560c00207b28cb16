//! Configuration: the TOML model and its layered loading with figment.
//!
//! Layers, later wins: built-in defaults -> `config/default.toml` (embedded)
//! -> `--config FILE` -> `COMPACTION_PROXY_<SECTION>__<KEY>` variables ->
//! command-line flags. The merged tree is then read section by section so
//! that every unknown key and every type error is reported at once, each
//! with its path. Semantic checks (policy references, regexes, bounds) live
//! with policy compilation in [`crate::policy`], which reads this module's
//! output and never the other way round.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use crate::compaction::policy::Mode;
pub use crate::compaction::summary::SummaryRole;
use crate::engine::{Policy, RelevancePolicy, Role, ScoringMethod};

mod load;
pub use load::{
    from_value, is_blank, load, load_text, nearest, read_file, read_layers, read_value, Overrides,
};

/// The shipped default configuration, embedded so the binary runs alone.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");
/// Prefix of environment overrides; `__` separates the key path.
pub const ENV_PREFIX: &str = "COMPACTION_PROXY_";
/// The top-level tables of a configuration.
const SECTIONS: [&str; 10] = [
    "server",
    "upstream",
    "cache",
    "policies",
    "routes",
    "tenants",
    "inspector",
    "prices",
    "summarizers",
    "store",
];

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Config {
    pub server: ServerConfig,
    pub upstream: UpstreamConfig,
    pub cache: CacheConfig,
    pub policies: BTreeMap<String, PolicyConfig>,
    pub routes: Vec<RouteConfig>,
    pub tenants: TenantsConfig,
    #[serde(default)]
    pub inspector: InspectorConfig,
    /// Prices per million tokens by model-name prefix (`[prices."gpt-4o"]`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, PriceConfig>,
    /// Models that write summaries (`strategy = "summarize"`), by name.
    #[serde(default)]
    pub summarizers: BTreeMap<String, SummarizerConfig>,
    /// Where summaries are kept beside the process's own memory.
    #[serde(default)]
    pub store: StoreConfig,
}

/// One `[prices."<model prefix>"]` table: prices per million tokens.
/// `uncached` and `output` are required; `cache_read` and `cache_write`
/// default to `uncached` (no discount known), `cache_write_1h` to
/// `cache_write`; `currency` is a note, the same for every table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PriceConfig {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uncached: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_read: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_write_1h: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub currency: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct ServerConfig {
    pub listen: String,
    /// Decoded request bytes allowed on a compacted route.
    pub max_body_bytes: usize,
    /// Bodies with more messages are forwarded uncompacted: the engine's
    /// memory grows with the message count.
    pub max_messages: usize,
    /// On SIGTERM, `/readyz` turns 503 and connections are still accepted
    /// this long before the listener closes (let load balancers catch up).
    pub shutdown_delay_secs: f64,
    pub shutdown_grace_secs: f64,
    pub log_format: LogFormat,
    /// A client must finish a request's header lines within this long
    /// (HTTP/1). hyper also runs this timer while an HTTP/1 connection
    /// waits for its next request, so it bounds keep-alive idleness too.
    pub header_read_timeout_secs: f64,
    /// A request body that sends nothing for this long is answered 408;
    /// a collected one is never forwarded.
    pub body_idle_timeout_secs: f64,
    /// A connection with no request in flight for this long is closed
    /// (HTTP/1 and HTTP/2).
    pub keep_alive_timeout_secs: f64,
    /// Client connections served at once; further ones wait in the
    /// listen backlog until one closes. Keep it under half of `ulimit -n`:
    /// each client connection may hold an upstream connection too.
    pub max_connections: usize,
    /// Request bytes held in memory across all requests being collected
    /// and forwarded; past it new bodies get 503 with Retry-After.
    pub max_buffered_bytes: usize,
    /// Threads serving connections, each a single-threaded runtime that a
    /// connection stays on (0: one per core). Restart only.
    pub workers: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: "127.0.0.1:8080".into(),
            max_body_bytes: 16 * 1024 * 1024,
            max_messages: 20_000,
            shutdown_delay_secs: 0.0,
            shutdown_grace_secs: 30.0,
            log_format: LogFormat::Text,
            header_read_timeout_secs: 20.0,
            body_idle_timeout_secs: 30.0,
            keep_alive_timeout_secs: 15.0,
            max_connections: 1024,
            max_buffered_bytes: 256 * 1024 * 1024,
            workers: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct UpstreamConfig {
    pub url: String,
    pub connect_timeout_secs: f64,
    /// Without response headers by then the client gets 504.
    pub response_header_timeout_secs: f64,
    /// A response body silent this long is cut off (streams have no total limit).
    pub idle_timeout_secs: f64,
    /// PEM file of extra CA certificates trusted for https upstreams (an
    /// internal gateway), on top of the bundled public roots.
    pub ca_file: Option<String>,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            url: "https://api.openai.com".into(),
            connect_timeout_secs: 10.0,
            response_header_timeout_secs: 120.0,
            idle_timeout_secs: 300.0,
            ca_file: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct CacheConfig {
    /// Bytes of request and forwarded bodies the cache may hold; 0 turns it off.
    pub max_bytes: u64,
    /// Bytes of stable mode's replay checkpoints (a few bytes per forwarded
    /// message of each recent conversation); 0 turns them off, which only
    /// makes each turn replay its whole history.
    pub checkpoint_max_bytes: u64,
    /// Bytes of relevance scoring's per-message analyses (term counts of
    /// each message of recent conversations, about as many bytes as the
    /// text), so a new turn analyses only its new messages; 0 turns the
    /// cache off, which only makes every turn analyse its whole history.
    pub relevance_max_bytes: u64,
    /// Bytes of what reading each history's words for the drop score gave
    /// (its vocabulary, counts and word sets: usually under the text's
    /// bytes), so a new turn reads only its new messages' words; 0 turns
    /// the cache off, which only makes every compaction read its whole
    /// history.
    pub word_lists_max_bytes: u64,
    /// Bytes of recent large bodies' parses (each about three times the
    /// body), so a turn that appends to the previous one parses only what
    /// it appends; 0 turns them off, which only makes every turn parse its
    /// whole body.
    pub prefix_max_bytes: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            max_bytes: 64 * 1024 * 1024,
            checkpoint_max_bytes: 16 * 1024 * 1024,
            relevance_max_bytes: 32 * 1024 * 1024,
            word_lists_max_bytes: 32 * 1024 * 1024,
            prefix_max_bytes: 64 * 1024 * 1024,
        }
    }
}

/// Where a policy's token budget comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BudgetMode {
    /// `budget_chars`, and `budget_tokens` when set.
    #[default]
    Fixed,
    /// Per request: the model's context window (`context_windows`, then
    /// the built-in table) minus the requested output tokens and
    /// `reserve_tokens` ([`crate::compaction::budget`]).
    Auto,
}

/// How a policy scores drop candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scoring {
    /// The score of `COMPACTION.md`: recency, role, topic overlap.
    #[default]
    Seed,
    /// The seed score plus relevance to the latest request, with pins for
    /// the most relevant messages (`engine::relevance`).
    Relevance,
}

/// What a policy does with the messages a compaction removes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// They are gone from the model's view (the deterministic engine).
    #[default]
    Drop,
    /// One summary message, written by the policy's `summarizer`, takes
    /// their place ([`crate::summarizer`]).
    Summarize,
}

/// When a summary is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SummaryTiming {
    /// While the request waits (bounded by the summarizer's `timeout_secs`).
    #[default]
    Inline,
    /// Off the request path: the turn that needs one is compacted by the
    /// engine alone, a later one uses the summary once it is ready.
    Background,
}

/// Who decides what becomes of old tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolDecisions {
    /// The deterministic agent passes (dedupe, prune, clip).
    #[default]
    Passes,
    /// The policy's `summarizer` model judges each eligible call (`keep`,
    /// `drop_result`, `drop_call`, seed 004) before the passes run.
    Model,
}

/// One `[summarizers.<name>]` section: a model the proxy asks for summaries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SummarizerConfig {
    /// Base URL; left out: the upstream's. The format's path is appended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    pub format: crate::format::Format,
    pub model: String,
    /// `"caller"`: the request's own key goes to the summarizer;
    /// `"env:NAME"`: the key in environment variable NAME.
    pub credentials: String,
    /// A total deadline for one summary (all its calls).
    pub timeout_secs: f64,
    /// The summarizer's input window, in tokens: a larger prefix is split.
    pub window_tokens: usize,
    /// Chunk summaries written at once.
    pub max_concurrency: usize,
    pub max_chunks: usize,
    pub max_passes: usize,
    /// The most tokens one summarizer answer may take.
    pub max_output_tokens: usize,
}

impl Default for SummarizerConfig {
    fn default() -> Self {
        SummarizerConfig {
            url: None,
            format: crate::format::Format::Chat,
            model: String::new(),
            credentials: "caller".into(),
            timeout_secs: 30.0,
            window_tokens: 32_000,
            max_concurrency: 4,
            max_chunks: 16,
            max_passes: 3,
            max_output_tokens: 2048,
        }
    }
}

/// `[store]`: where summaries are kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreConfig {
    /// Summaries kept in this process, in bytes (0: the built-in 16 MiB).
    pub max_bytes: u64,
    /// Shared with other replicas in Redis (`redis://host:port/db`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub redis_url: Option<String>,
    /// The deadline of one Redis command, and of connecting, in
    /// milliseconds (at least 1).
    pub redis_timeout_ms: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            max_bytes: 0,
            redis_url: None,
            redis_timeout_ms: 250,
        }
    }
}

/// One named policy. Every key left out takes the value of
/// [`PolicyConfig::default`], whatever the policy's name: the proxy's
/// defaults, which differ from the engine's spec defaults (those stay with
/// the memory-compact API) where a proxy user wants more protection:
/// developer messages are protected with system ones, the first user
/// message (an agent's task statement) is pinned, and long messages are
/// trimmed at 4000 chars rather than 400.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PolicyConfig {
    pub budget_chars: usize,
    pub keep_last_n: usize,
    pub keep_roles: Vec<Role>,
    pub duplicate_threshold: f64,
    pub max_message_chars: usize,
    pub mode: Mode,
    /// Protect the first user message (most agents' task statement).
    pub pin_first_user: bool,
    /// Protect messages whose text matches any of these regexes.
    pub pin_patterns: Vec<String>,
    /// Honour `x-compaction-bypass: true` on requests.
    pub allow_bypass: bool,
    /// Compute and report, but forward the original body.
    pub dry_run: bool,
    /// Honour `x-compaction-report: true`: keep the request's per-message
    /// report for a few minutes, fetchable by the id the response names.
    /// Off by default: a report holds the conversation's text.
    pub allow_report: bool,
    /// Forward a coding agent's own compaction request (Claude Code's
    /// summary, Codex's checkpoint, opencode's summarization agent)
    /// untouched, so it summarizes its whole history.
    pub detect_agent_compaction: bool,
    /// Anthropic: when the last turn of an open tool loop keeps reasoning
    /// whose prefix changed, ask the API to drop it (`drop_block`, with its
    /// beta header); off for compatible upstreams that run no prefix check.
    pub thinking_drop_block: bool,
    pub scoring: Scoring,
    /// Relevance only: protect messages at least this relevant, in [0, 1].
    /// Left out: [`RelevancePolicy::DEFAULT_PIN_RELEVANT_ABOVE`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pin_relevant_above: Option<f64>,
    /// Relevance only: the budget share those pins may take, in [0, 1].
    /// Left out: [`RelevancePolicy::DEFAULT_RELEVANT_PIN_SHARE`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relevant_pin_share: Option<f64>,
    /// Relevance only: the request header whose text joins the latest user
    /// message as what the request is about.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relevance_goal_header: Option<String>,
    /// Stable mode: a re-compaction brings the form down to this share of
    /// the budget, so the next turns only append.
    pub stable_target_ratio: f64,
    /// Stable mode: a re-compaction keeps the leading items within this
    /// share of the budget as they were, so their cached prefix survives.
    pub stable_head_ratio: f64,
    /// Agent passes (exact mode): tool results older than the protected
    /// window and longer than this become head + marker + tail; 0 = off.
    #[serde(default = "default_max_tool_result_chars")]
    pub max_tool_result_chars: usize,
    /// The most recent tool output (chars) that pruning never touches.
    #[serde(default = "default_protect_tool_chars")]
    pub protect_tool_chars: usize,
    /// The protected tool output is at most this share of the budget.
    #[serde(default = "default_protect_tool_share")]
    pub protect_tool_share: f64,
    /// Pruning runs only when it would save at least this many chars (or
    /// everything the conversation is over the budget by).
    #[serde(default = "default_prune_minimum_chars")]
    pub prune_minimum_chars: usize,
    /// String values in older tool-call arguments are clipped to this; 0 = off.
    #[serde(default = "default_max_arg_chars")]
    pub max_arg_chars: usize,
    /// A later tool result this similar (word Jaccard) to an earlier one of
    /// the same tool becomes a marker naming it; 0 = off.
    #[serde(default = "default_tool_duplicate_threshold")]
    pub tool_duplicate_threshold: f64,
    /// Tools whose calls and results the agent passes never touch.
    #[serde(default)]
    pub excluded_tools: Vec<String>,
    /// When not empty, the only tools the agent passes touch.
    #[serde(default)]
    pub eligible_tools: Vec<String>,
    /// Compact only at or above this many chars (0 = no char trigger).
    #[serde(default)]
    pub trigger_chars: usize,
    /// Compact only at or above this many messages (0 = no message trigger).
    #[serde(default)]
    pub trigger_messages: usize,
    /// Compact only at or above this many tokens (0 = no token trigger).
    #[serde(default)]
    pub trigger_tokens: usize,
    /// A token budget beside `budget_chars` (0 = none; exact mode).
    #[serde(default)]
    pub budget_tokens: usize,
    /// The encoding for models the token table does not know.
    #[serde(default = "default_tokenizer_fallback")]
    pub tokenizer_fallback: String,
    /// `"auto"`: the token budget is the model's context window minus the
    /// requested output and `reserve_tokens` (exact mode).
    #[serde(default)]
    pub budget: BudgetMode,
    /// `budget = "auto"`: tokens kept free beside the requested output.
    #[serde(default = "default_reserve_tokens")]
    pub reserve_tokens: usize,
    /// `budget = "auto"`: context windows (tokens) by model-name prefix,
    /// before the built-in table.
    #[serde(default)]
    pub context_windows: BTreeMap<String, usize>,
    /// `"summarize"`: what a compaction removes becomes one summary message.
    #[serde(default)]
    pub strategy: Strategy,
    /// The `[summarizers.<name>]` that writes this policy's summaries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summarizer: Option<String>,
    #[serde(default)]
    pub summary_timing: SummaryTiming,
    /// Chat completions: the summary's role.
    #[serde(default)]
    pub summary_role: SummaryRole,
    /// Guidance for the summarizer, placed inside the prompt's frame.
    #[serde(default)]
    pub summary_instructions: String,
    /// The summary's desired size in tokens, as word-count guidance; 0: concise.
    #[serde(default)]
    pub summary_target_tokens: usize,
    /// Replaces the prompt's frame; `{instructions}` and `{size}` mark
    /// where those go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary_prompt: Option<String>,
    /// Markers with recall ids where compaction cut, and the
    /// `compaction_recall` tool the proxy answers itself (docs/recall.md).
    #[serde(default)]
    pub recall: bool,
    /// The most chars one recall id answers with; longer: head and tail.
    #[serde(default = "default_recall_max_chars")]
    pub recall_max_chars: usize,
    /// The most follow-up requests recall makes for one client request.
    #[serde(default = "default_recall_max_rounds")]
    pub recall_max_rounds: usize,
    /// The most bytes recall answers add to one client request's follow-ups.
    #[serde(default = "default_recall_max_added_bytes")]
    pub recall_max_added_bytes: usize,
    /// `"model"`: the `summarizer` decides per eligible tool call (exact
    /// mode, `eligible_tools` set); any failure falls back to the passes.
    #[serde(default)]
    pub tool_decisions: ToolDecisions,
}

fn default_recall_max_chars() -> usize {
    crate::compaction::recall::RecallLimits::DEFAULT.max_chars
}
fn default_recall_max_rounds() -> usize {
    crate::compaction::recall::RecallLimits::DEFAULT.max_rounds
}
fn default_recall_max_added_bytes() -> usize {
    crate::compaction::recall::RecallLimits::DEFAULT.max_added_bytes
}

fn default_reserve_tokens() -> usize {
    // Seed 002's `reserved`: room for the model's own overhead.
    20_000
}

fn default_tokenizer_fallback() -> String {
    "o200k_base".into()
}

fn default_max_tool_result_chars() -> usize {
    // On by default: what coding agents send (measured in docs/agents.md).
    crate::compaction::agent::AgentPolicy::DEFAULT.max_tool_result_chars
}
fn default_protect_tool_chars() -> usize {
    crate::compaction::agent::AgentPolicy::DEFAULT.protect_tool_chars
}
fn default_protect_tool_share() -> f64 {
    crate::compaction::agent::AgentPolicy::DEFAULT.protect_tool_share
}
fn default_prune_minimum_chars() -> usize {
    crate::compaction::agent::AgentPolicy::DEFAULT.prune_minimum_chars
}
fn default_max_arg_chars() -> usize {
    // On by default: what coding agents send (measured in docs/agents.md).
    crate::compaction::agent::AgentPolicy::DEFAULT.max_arg_chars
}
fn default_tool_duplicate_threshold() -> f64 {
    // On by default: what coding agents send (measured in docs/agents.md).
    crate::compaction::agent::AgentPolicy::DEFAULT.tool_duplicate_threshold
}

impl Default for PolicyConfig {
    /// The one set of policy defaults (documented in
    /// `docs/configuration.md`; `config/default.toml` spells them out).
    fn default() -> Self {
        PolicyConfig {
            budget_chars: 200_000,
            keep_last_n: Policy::DEFAULT_KEEP_LAST_N,
            keep_roles: vec![Role::System, Role::Developer],
            duplicate_threshold: Policy::DEFAULT_DUPLICATE_THRESHOLD,
            max_message_chars: 4000,
            mode: Mode::Stable,
            pin_first_user: true,
            pin_patterns: Vec::new(),
            allow_bypass: true,
            dry_run: false,
            allow_report: false,
            detect_agent_compaction: true,
            thinking_drop_block: true,
            scoring: Scoring::Seed,
            pin_relevant_above: None,
            relevant_pin_share: None,
            relevance_goal_header: None,
            stable_target_ratio: 0.7,
            stable_head_ratio: 0.4,
            max_tool_result_chars: default_max_tool_result_chars(),
            protect_tool_chars: default_protect_tool_chars(),
            protect_tool_share: default_protect_tool_share(),
            prune_minimum_chars: default_prune_minimum_chars(),
            max_arg_chars: default_max_arg_chars(),
            tool_duplicate_threshold: default_tool_duplicate_threshold(),
            excluded_tools: Vec::new(),
            eligible_tools: Vec::new(),
            trigger_chars: 0,
            trigger_messages: 0,
            trigger_tokens: 0,
            budget_tokens: 0,
            tokenizer_fallback: default_tokenizer_fallback(),
            budget: BudgetMode::Fixed,
            reserve_tokens: default_reserve_tokens(),
            context_windows: BTreeMap::new(),
            strategy: Strategy::Drop,
            summarizer: None,
            summary_timing: SummaryTiming::Inline,
            summary_role: SummaryRole::User,
            summary_instructions: String::new(),
            summary_target_tokens: 0,
            summary_prompt: None,
            recall: false,
            recall_max_chars: default_recall_max_chars(),
            recall_max_rounds: default_recall_max_rounds(),
            recall_max_added_bytes: default_recall_max_added_bytes(),
            tool_decisions: ToolDecisions::Passes,
        }
    }
}

impl PolicyConfig {
    /// The agent passes' settings.
    pub fn agent_policy(&self) -> crate::compaction::agent::AgentPolicy {
        crate::compaction::agent::AgentPolicy {
            max_tool_result_chars: self.max_tool_result_chars,
            protect_tool_chars: self.protect_tool_chars,
            protect_tool_share: self.protect_tool_share,
            prune_minimum_chars: self.prune_minimum_chars,
            max_arg_chars: self.max_arg_chars,
            tool_duplicate_threshold: self.tool_duplicate_threshold,
            excluded_tools: self.excluded_tools.clone(),
            eligible_tools: self.eligible_tools.clone(),
            trigger_chars: self.trigger_chars,
            trigger_messages: self.trigger_messages,
            trigger_tokens: self.trigger_tokens,
        }
    }

    pub fn engine_policy(&self) -> Policy {
        Policy {
            budget_chars: self.budget_chars,
            keep_last_n: self.keep_last_n,
            keep_roles: self.keep_roles.clone(),
            duplicate_threshold: self.duplicate_threshold,
            max_message_chars: self.max_message_chars,
            scoring: match self.scoring {
                Scoring::Seed => ScoringMethod::Seed,
                Scoring::Relevance => ScoringMethod::Relevance(RelevancePolicy {
                    pin_relevant_above: self
                        .pin_relevant_above
                        .unwrap_or(RelevancePolicy::DEFAULT_PIN_RELEVANT_ABOVE),
                    relevant_pin_share: self
                        .relevant_pin_share
                        .unwrap_or(RelevancePolicy::DEFAULT_RELEVANT_PIN_SHARE),
                    goal: None,
                }),
            },
        }
    }
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RouteConfig {
    /// An exact path; a `*` segment matches any one segment, and a
    /// trailing `*` any rest of the path.
    pub path: String,
    pub policy: String,
    /// The body format; by default the one the path implies (`.../messages`
    /// is anthropic, `.../responses` is responses, anything else chat).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<crate::format::Format>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default)]
pub struct TenantsConfig {
    /// The request header that names the tenant.
    pub header: String,
    /// Tenant -> policy; overrides the route's policy.
    pub policies: BTreeMap<String, String>,
    /// Pass the tenant header on to the upstream (for upstreams that read
    /// the same header); by default the proxy keeps it to itself.
    pub forward_header: bool,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig {
            header: "x-tenant-id".into(),
            policies: BTreeMap::new(),
            forward_header: false,
        }
    }
}

/// `[inspector]`: the web page of recent requests (docs/inspector.md).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct InspectorConfig {
    /// Serve `/inspector` and record every request of a policy with
    /// `allow_report` for it.
    pub enabled: bool,
    /// The environment variable holding the bearer token the inspector's
    /// data requires; unset: no token.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_env: Option<String>,
    /// Requests kept at most; the oldest go first past it (restart to change).
    pub max_requests: usize,
    /// Bytes of kept requests (their texts, twice) at most (restart to change).
    pub max_bytes: u64,
}

impl Default for InspectorConfig {
    fn default() -> Self {
        InspectorConfig {
            enabled: false,
            token_env: None,
            max_requests: 200,
            max_bytes: 32 * 1024 * 1024,
        }
    }
}

/// One configuration problem at a key path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub path: String,
    pub message: String,
}

impl std::fmt::Display for ConfigProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a configuration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.iter().map(|p| format!("  - {p}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigErrors(pub Vec<ConfigProblem>);

impl ConfigErrors {
    pub fn one(path: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigErrors(vec![ConfigProblem {
            path: path.into(),
            message: message.into(),
        }])
    }
}

#[cfg(test)]
mod tests;
