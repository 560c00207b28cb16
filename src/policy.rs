//! Policy resolution: turns a loaded [`Config`] into compiled policies,
//! checking everything serde cannot (references, bounds, regexes, URLs), and
//! picks the policy for a request from its route and tenant.

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
    /// Checks and compiles `config`, reporting every problem at once.
    /// Loads the configuration layers and compiles them, reporting every
    /// problem at once: those of reading (unknown keys, bad values) and
    /// those of compiling what could be read, each path once.
    pub fn load_text(
        file_text: Option<&str>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Runtime, ConfigErrors> {
        let (config, mut problems) = config::read_layers(file_text, env, overrides)?;
        match Runtime::new(config) {
            Ok(runtime) if problems.is_empty() => return Ok(runtime),
            Ok(_) => {}
            Err(semantic) => problems.extend(semantic.0),
        }
        // A value refused while reading took its default; a check of that
        // default at the same path would only repeat the complaint.
        let mut seen = std::collections::HashSet::new();
        problems.retain(|p| seen.insert(p.path.clone()));
        Err(ConfigErrors(problems))
    }

    /// [`Runtime::load_text`] of a file.
    pub fn load(
        file: Option<&std::path::Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Runtime, ConfigErrors> {
        let text = file.map(config::read_file).transpose()?;
        Runtime::load_text(text.as_deref(), env, overrides)
    }

    /// Checks and compiles a configuration that was read without problems.
    /// Variables the configuration names (`inspector.token_env`) are read
    /// from the process environment.
    pub fn new(config: Config) -> Result<Runtime, ConfigErrors> {
        Runtime::with_env(config, &|name| std::env::var(name).ok())
    }

    /// [`Runtime::new`], reading the variables the configuration names
    /// with `env` (tests pass their own).
    pub fn with_env(
        config: Config,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Runtime, ConfigErrors> {
        let mut problems = Vec::new();
        let mut problem =
            |path: String, message: String| problems.push(ConfigProblem { path, message });

        let listen =
            parse_listen(&config.server.listen).map_err(|m| problem("server.listen".into(), m));
        if config.server.max_body_bytes == 0 {
            problem("server.max_body_bytes".into(), "must be at least 1".into());
        }
        if config.server.max_messages == 0 {
            problem("server.max_messages".into(), "must be at least 1".into());
        }
        if config.server.workers > MAX_WORKERS {
            problem(
                "server.workers".into(),
                format!("must be at most {MAX_WORKERS} (0: one per core)"),
            );
        }
        if config.server.max_connections == 0 {
            problem("server.max_connections".into(), "must be at least 1".into());
        }
        if config.server.max_buffered_bytes < config.server.max_body_bytes {
            problem(
                "server.max_buffered_bytes".into(),
                "must be at least server.max_body_bytes, or no body of the allowed size fits"
                    .into(),
            );
        }
        // Every duration typed once, here; a value that is negative, not
        // finite, or too large for a Duration is a problem, never a panic.
        let mut seconds = |key: &str, value: f64, zero_allowed: bool| {
            let ok = value.is_finite() && (value > 0.0 || (zero_allowed && value == 0.0));
            match Duration::try_from_secs_f64(value) {
                Ok(d) if ok => d,
                _ => {
                    problem(
                        key.into(),
                        if zero_allowed {
                            "must be a non-negative number of seconds".into()
                        } else {
                            "must be a positive number of seconds".into()
                        },
                    );
                    Duration::ZERO
                }
            }
        };
        let (server, up) = (&config.server, &config.upstream);
        let timeouts = Timeouts {
            shutdown_delay: seconds(
                "server.shutdown_delay_secs",
                server.shutdown_delay_secs,
                true,
            ),
            shutdown_grace: seconds(
                "server.shutdown_grace_secs",
                server.shutdown_grace_secs,
                true,
            ),
            connect: seconds(
                "upstream.connect_timeout_secs",
                up.connect_timeout_secs,
                false,
            ),
            response_header: seconds(
                "upstream.response_header_timeout_secs",
                up.response_header_timeout_secs,
                false,
            ),
            upstream_idle: seconds("upstream.idle_timeout_secs", up.idle_timeout_secs, false),
            header_read: seconds(
                "server.header_read_timeout_secs",
                server.header_read_timeout_secs,
                false,
            ),
            body_idle: seconds(
                "server.body_idle_timeout_secs",
                server.body_idle_timeout_secs,
                false,
            ),
            keep_alive: seconds(
                "server.keep_alive_timeout_secs",
                server.keep_alive_timeout_secs,
                false,
            ),
        };
        let upstream =
            parse_upstream(&config.upstream.url).map_err(|m| problem("upstream.url".into(), m));
        let upstream_roots = match &config.upstream.ca_file {
            None => Vec::new(),
            Some(path) => read_roots(path).unwrap_or_else(|m| {
                problem("upstream.ca_file".into(), m);
                Vec::new()
            }),
        };

        let analyses = Arc::new(
            AnalysisStore::new(config.cache.relevance_max_bytes)
                .with_word_lists(config.cache.word_lists_max_bytes),
        );
        let mut summarizers = HashMap::new();
        for (name, s) in &config.summarizers {
            match compile_summarizer(name, s, upstream.as_ref().ok()) {
                Ok(settings) => {
                    summarizers.insert(name.clone(), Arc::new(settings));
                }
                Err(list) => {
                    for (key, message) in list {
                        problem(format!("summarizers.{name}.{key}"), message);
                    }
                }
            }
        }
        if config.store.redis_timeout_ms == 0 {
            problem(
                "store.redis_timeout_ms".into(),
                "must be at least 1 (milliseconds)".into(),
            );
        }
        if let Some(url) = &config.store.redis_url {
            let scheme_ok = url.starts_with("redis://") || url.starts_with("unix://");
            if !scheme_ok || redis::Client::open(url.as_str()).is_err() {
                problem(
                    "store.redis_url".into(),
                    format!("{:?} is not a Redis URL such as redis://127.0.0.1:6379/0 (TLS, rediss://, is not supported)", crate::store::redacted_url(url)),
                );
            }
        }
        let mut policies = HashMap::new();
        for (name, p) in &config.policies {
            let summary = match summary_policy(p, &summarizers, &config.summarizers) {
                Ok(summary) => summary,
                Err((key, message)) => {
                    problem(format!("policies.{name}.{key}"), message);
                    None
                }
            };
            let decisions = match decision_model(p, &summarizers) {
                Ok(decisions) => decisions,
                Err((key, message)) => {
                    problem(format!("policies.{name}.{key}"), message);
                    None
                }
            };
            match compile_policy(name, p, &analyses) {
                Ok(mut c) => {
                    c.summary = summary;
                    c.decisions = decisions;
                    policies.insert(name.clone(), Arc::new(c));
                }
                Err(list) => {
                    for (key, message) in list {
                        problem(format!("policies.{name}.{key}"), message);
                    }
                }
            }
        }

        let mut routes = Vec::new();
        for (i, r) in config.routes.iter().enumerate() {
            if r.path.is_empty() {
                problem(
                    format!("routes[{i}].path"),
                    "is required: an exact path, or a prefix ending in *".into(),
                );
            } else if !r.path.starts_with('/') {
                problem(format!("routes[{i}].path"), "must start with /".into());
            }
            let format = r.format.unwrap_or_else(|| Format::for_path(&r.path));
            match policies.get(&r.policy) {
                Some(policy) => routes.push(Route::new(&r.path, format, policy.clone())),
                None if config.policies.contains_key(&r.policy) => {} // already reported
                None if r.policy.is_empty() => problem(
                    format!("routes[{i}].policy"),
                    "is required: the name of a policy".into(),
                ),
                None => problem(
                    format!("routes[{i}].policy"),
                    format!("no policy named {:?}", r.policy),
                ),
            }
        }

        let tenant_header = HeaderName::try_from(config.tenants.header.as_str()).map_err(|_| {
            problem(
                "tenants.header".into(),
                format!("{:?} is not a valid header name", config.tenants.header),
            )
        });
        let mut tenants = HashMap::new();
        for (tenant, policy) in &config.tenants.policies {
            match policies.get(policy) {
                Some(p) => {
                    tenants.insert(tenant.as_str().into(), p.clone());
                }
                None if config.policies.contains_key(policy) => {}
                None => problem(
                    format!("tenants.policies.{tenant}"),
                    format!("no policy named {policy:?}"),
                ),
            }
        }

        let prices = crate::usage::Prices::compile(&config.prices).unwrap_or_else(|list| {
            for (path, message) in list {
                problem(path, message);
            }
            crate::usage::Prices::default()
        });

        let inspector = crate::inspector::Settings::resolve(&config.inspector, env)
            .map_err(|m| problem("inspector.token_env".into(), m));

        match (listen, upstream, tenant_header, inspector) {
            (Ok(listen), Ok(upstream), Ok(tenant_header), Ok(inspector)) if problems.is_empty() => {
                Ok(Runtime {
                    prices: Arc::new(prices),
                    config,
                    listen,
                    upstream,
                    upstream_roots,
                    timeouts,
                    routes,
                    summarizers,
                    tenant_header,
                    tenants,
                    inspector,
                })
            }
            _ => Err(ConfigErrors(problems)),
        }
    }

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

/// A listen address in the forms nginx and Caddy users write: `host:port`
/// with an IP (`127.0.0.1:8080`, `[::1]:8080`), a host name resolved now
/// (`localhost:8080`), or `:8080` for every interface (`0.0.0.0`).
pub fn parse_listen(listen: &str) -> Result<SocketAddr, String> {
    if let Some(port) = listen.strip_prefix(':') {
        return port
            .parse::<u16>()
            .map(|port| SocketAddr::from(([0, 0, 0, 0], port)))
            .map_err(|e| format!("{listen:?}: {e}: expected :PORT such as :8080"));
    }
    if let Ok(addr) = listen.parse::<SocketAddr>() {
        return Ok(addr);
    }
    use std::net::ToSocketAddrs;
    let expected =
        "expected host:port such as 127.0.0.1:8080, localhost:8080, or :8080 for all interfaces";
    match listen.to_socket_addrs() {
        // IPv4 first: `localhost` is what most users mean by 127.0.0.1.
        Ok(addrs) => {
            let addrs: Vec<SocketAddr> = addrs.collect();
            addrs
                .iter()
                .find(|a| a.is_ipv4())
                .or(addrs.first())
                .copied()
                .ok_or_else(|| format!("{listen:?} resolves to no address: {expected}"))
        }
        Err(e) => Err(format!("{listen:?}: {e}: {expected}")),
    }
}

fn read_roots(path: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect())
        .map_err(|e| format!("cannot read certificates from {path:?}: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{path:?} holds no PEM certificate"));
    }
    Ok(certs)
}

/// Messages never quote the URL: its userinfo or query may be a credential.
fn parse_upstream(url: &str) -> Result<Uri, String> {
    let uri: Uri = url
        .parse()
        .map_err(|e| format!("{e}: expected a URL such as https://api.openai.com"))?;
    if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
        return Err(
            "must not carry credentials (user:password@): they would not be sent; \
                    clients pass their own Authorization header through the proxy"
                .to_owned(),
        );
    }
    if uri.query().is_some() {
        return Err("must not have a query (it would not be sent)".to_owned());
    }
    match uri.scheme_str() {
        Some("http") | Some("https") => {}
        _ => return Err("must start with http:// or https://".to_owned()),
    }
    if uri.authority().is_none() {
        return Err("has no host".to_owned());
    }
    Ok(uri)
}

/// Checks and compiles one `[summarizers.<name>]` section; its URL left
/// out is the upstream's.
fn compile_summarizer(
    name: &str,
    s: &config::SummarizerConfig,
    upstream: Option<&Uri>,
) -> Result<crate::summarizer::Settings, Vec<(String, String)>> {
    let mut problems = Vec::new();
    let base = match &s.url {
        Some(url) => match parse_upstream(url) {
            Ok(uri) => Some(uri),
            Err(m) => {
                problems.push(("url".into(), m));
                None
            }
        },
        None => upstream.cloned(),
    };
    if s.model.trim().is_empty() {
        problems.push((
            "model".into(),
            "is required: the model that writes summaries".into(),
        ));
    }
    let credentials = crate::summarizer::Credentials::parse(&s.credentials)
        .map_err(|m| problems.push(("credentials".into(), m)))
        .ok();
    let timeout = match Duration::try_from_secs_f64(s.timeout_secs) {
        Ok(d) if s.timeout_secs.is_finite() && s.timeout_secs > 0.0 => Some(d),
        _ => {
            problems.push((
                "timeout_secs".into(),
                "must be a positive number of seconds".into(),
            ));
            None
        }
    };
    for (key, value) in [
        ("max_concurrency", s.max_concurrency),
        ("max_chunks", s.max_chunks),
        ("max_passes", s.max_passes),
        ("max_output_tokens", s.max_output_tokens),
    ] {
        if value == 0 {
            problems.push((key.into(), "must be at least 1".into()));
        }
    }
    if s.window_tokens < s.max_output_tokens.saturating_mul(2).max(1024) {
        problems.push((
            "window_tokens".into(),
            "must be at least 1024 and twice max_output_tokens: the input needs room beside the answer"
                .into(),
        ));
    }
    match (base, credentials, timeout) {
        (Some(base), Some(credentials), Some(timeout)) if problems.is_empty() => {
            Ok(crate::summarizer::Settings {
                name: name.into(),
                endpoint: crate::summarizer::Settings::endpoint_for(&base, s.format),
                format: s.format,
                model: s.model.clone(),
                credentials,
                timeout,
                window_tokens: s.window_tokens,
                max_concurrency: s.max_concurrency,
                max_chunks: s.max_chunks,
                max_passes: s.max_passes,
                max_output_tokens: s.max_output_tokens,
            })
        }
        _ => Err(problems),
    }
}

/// A policy's summaries, when its strategy is `"summarize"`: its
/// `summarizer` must name a section (one that compiled, or its problems
/// are reported there already).
fn summary_policy(
    p: &PolicyConfig,
    compiled: &HashMap<String, Arc<crate::summarizer::Settings>>,
    defined: &std::collections::BTreeMap<String, config::SummarizerConfig>,
) -> Result<Option<Arc<SummaryPolicy>>, (String, String)> {
    if let Some(name) = &p.summarizer {
        if !defined.contains_key(name) {
            return Err((
                "summarizer".into(),
                format!("no [summarizers.{name}] section defines {name:?}"),
            ));
        }
    }
    if p.strategy != config::Strategy::Summarize {
        return Ok(None);
    }
    let Some(name) = &p.summarizer else {
        return Err((
            "summarizer".into(),
            "is required with strategy = \"summarize\": the name of a [summarizers.<name>] section"
                .into(),
        ));
    };
    if p.summary_instructions.chars().count() > 2000 {
        return Err((
            "summary_instructions".into(),
            "must be at most 2000 chars".into(),
        ));
    }
    let Some(summarizer) = compiled.get(name) else {
        return Ok(None); // its own problems are reported
    };
    Ok(Some(Arc::new(SummaryPolicy {
        summarizer: summarizer.clone(),
        timing: p.summary_timing,
        role: p.summary_role,
        prompt: crate::summarizer::prompt::PromptSettings {
            frame: p.summary_prompt.clone(),
            instructions: p.summary_instructions.clone(),
            target_tokens: p.summary_target_tokens,
        },
    })))
}

/// A policy's decision model, when `tool_decisions = "model"`: its
/// `summarizer` (a name no section defines is reported by
/// [`summary_policy`]), in exact mode, with the drop strategy, and with
/// `eligible_tools` listing the tools it may judge (ReMe's allowlist: the
/// proxy cannot tell a read-only tool by its name).
fn decision_model(
    p: &PolicyConfig,
    compiled: &HashMap<String, Arc<crate::summarizer::Settings>>,
) -> Result<Option<Arc<crate::summarizer::Settings>>, (String, String)> {
    if p.tool_decisions != config::ToolDecisions::Model {
        return Ok(None);
    }
    let Some(name) = &p.summarizer else {
        return Err((
            "summarizer".into(),
            "is required with tool_decisions = \"model\": the [summarizers.<name>] that decides"
                .into(),
        ));
    };
    if p.mode != Mode::Exact {
        return Err((
            "tool_decisions".into(),
            "\"model\" needs mode = \"exact\" (stable mode's prefix would follow the model's answers)".into(),
        ));
    }
    if p.strategy != config::Strategy::Drop {
        return Err((
            "tool_decisions".into(),
            "\"model\" needs strategy = \"drop\" (a summary replaces the calls it would judge)"
                .into(),
        ));
    }
    if p.eligible_tools.is_empty() {
        return Err((
            "eligible_tools".into(),
            "must list the tools the model may judge with tool_decisions = \"model\"".into(),
        ));
    }
    Ok(compiled.get(name).cloned())
}

fn compile_policy(
    name: &str,
    p: &PolicyConfig,
    analyses: &Arc<AnalysisStore>,
) -> Result<CompiledPolicy, Vec<(String, String)>> {
    let mut problems = Vec::new();
    if p.budget_chars == 0 {
        problems.push(("budget_chars".into(), "must be at least 1".to_owned()));
    }
    if !(p.duplicate_threshold > 0.0 && p.duplicate_threshold <= 1.0) {
        problems.push(("duplicate_threshold".into(), "must be in (0, 1]".to_owned()));
    }
    if p.keep_last_n == 0 {
        // With nothing protected the drop stage may remove every message,
        // and an empty `messages` array is a request the upstream refuses.
        problems.push((
            "keep_last_n".into(),
            "must be at least 1 in the proxy: the latest message is the one the model answers"
                .to_owned(),
        ));
    }
    if p.max_message_chars == 0 {
        problems.push(("max_message_chars".into(), "must be at least 1".to_owned()));
    }
    if !(p.stable_target_ratio > 0.0 && p.stable_target_ratio <= 1.0) {
        problems.push(("stable_target_ratio".into(), "must be in (0, 1]".to_owned()));
    }
    if !(p.stable_head_ratio >= 0.0 && p.stable_head_ratio < p.stable_target_ratio) {
        problems.push((
            "stable_head_ratio".into(),
            "must be in [0, stable_target_ratio)".to_owned(),
        ));
    }
    if !(p.protect_tool_share >= 0.0 && p.protect_tool_share <= 1.0) {
        problems.push(("protect_tool_share".into(), "must be in [0, 1]".to_owned()));
    }
    if !(p.tool_duplicate_threshold >= 0.0 && p.tool_duplicate_threshold <= 1.0) {
        problems.push((
            "tool_duplicate_threshold".into(),
            "must be in [0, 1] (0 turns tool dedupe off)".to_owned(),
        ));
    }
    if p.max_tool_result_chars > 0 && p.max_tool_result_chars < AgentPolicy::MIN_KEPT_CHARS {
        problems.push((
            "max_tool_result_chars".into(),
            format!(
                "must be 0 (off) or at least {}: head and tail need room",
                AgentPolicy::MIN_KEPT_CHARS
            ),
        ));
    }
    if p.max_arg_chars > 0 && p.max_arg_chars < AgentPolicy::MIN_KEPT_CHARS {
        problems.push((
            "max_arg_chars".into(),
            format!(
                "must be 0 (off) or at least {}",
                AgentPolicy::MIN_KEPT_CHARS
            ),
        ));
    }
    let tokenizer_fallback = Encoding::parse(&p.tokenizer_fallback);
    if tokenizer_fallback.is_none() {
        problems.push((
            "tokenizer_fallback".into(),
            "must be \"o200k_base\" or \"cl100k_base\"".to_owned(),
        ));
    }
    if p.budget == BudgetMode::Fixed && !p.context_windows.is_empty() {
        problems.push((
            "context_windows".into(),
            "has no effect unless budget = \"auto\"".to_owned(),
        ));
    }
    for (model, &window) in &p.context_windows {
        if model.is_empty() {
            problems.push((
                "context_windows".into(),
                "a model-name prefix must not be empty".to_owned(),
            ));
        }
        if window == 0 {
            problems.push((
                format!("context_windows.{model:?}"),
                "must be at least 1 (tokens)".to_owned(),
            ));
        }
    }
    for tool in &p.excluded_tools {
        if p.eligible_tools.contains(tool) {
            problems.push((
                "eligible_tools".into(),
                format!("{tool:?} is also in excluded_tools"),
            ));
        }
    }
    for (key, value) in [
        ("pin_relevant_above", p.pin_relevant_above),
        ("relevant_pin_share", p.relevant_pin_share),
    ] {
        if value.is_some_and(|v| !(0.0..=1.0).contains(&v)) {
            problems.push((key.into(), "must be in [0, 1]".to_owned()));
        }
    }
    let relevance_goal_header = p
        .relevance_goal_header
        .as_deref()
        .map(|h| HeaderName::try_from(h).map_err(|_| format!("{h:?} is not a valid header name")));
    if let Some(Err(e)) = &relevance_goal_header {
        problems.push(("relevance_goal_header".into(), e.clone()));
    }
    if p.scoring == Scoring::Seed {
        for (key, set) in [
            ("pin_relevant_above", p.pin_relevant_above.is_some()),
            ("relevant_pin_share", p.relevant_pin_share.is_some()),
            ("relevance_goal_header", p.relevance_goal_header.is_some()),
        ] {
            if set {
                problems.push((
                    key.into(),
                    "has no effect unless scoring = \"relevance\"".to_owned(),
                ));
            }
        }
    }
    // Each pattern on its own first, so every bad one is named by index.
    for (i, pattern) in p.pin_patterns.iter().enumerate() {
        if let Err(e) = regex::Regex::new(pattern) {
            problems.push((format!("pin_patterns[{i}]"), e.to_string()));
        }
    }
    let pin_patterns = RegexSet::new(&p.pin_patterns).map_err(|e| e.to_string());
    if let (Err(e), true) = (&pin_patterns, problems.is_empty()) {
        problems.push(("pin_patterns".into(), e.clone()));
    }
    match pin_patterns {
        Ok(pin_patterns) if problems.is_empty() => Ok(CompiledPolicy {
            id: next_policy_id(),
            name: name.into(),
            engine: p.engine_policy(),
            mode: p.mode,
            pin_first_user: p.pin_first_user,
            pin_patterns,
            allow_bypass: p.allow_bypass,
            dry_run: p.dry_run,
            allow_report: p.allow_report,
            detect_agent_compaction: p.detect_agent_compaction,
            thinking_drop_block: p.thinking_drop_block,
            relevance_goal_header: relevance_goal_header.and_then(Result::ok),
            stable_target_ratio: p.stable_target_ratio,
            stable_head_ratio: p.stable_head_ratio,
            agent: p.agent_policy(),
            budget_tokens: (p.budget_tokens > 0).then_some(p.budget_tokens),
            tokenizer_fallback: tokenizer_fallback.unwrap_or(Encoding::O200kBase),
            analyses: analyses.clone(),
            auto_budget: (p.budget == BudgetMode::Auto).then(|| AutoBudget {
                windows: p
                    .context_windows
                    .iter()
                    .map(|(model, &tokens)| (model.clone(), tokens))
                    .collect(),
                reserve_tokens: p.reserve_tokens,
            }),
            summary: None,
            recall: p.recall.then_some(crate::compaction::recall::RecallLimits {
                max_chars: p.recall_max_chars,
                max_rounds: p.recall_max_rounds,
                max_added_bytes: p.recall_max_added_bytes,
            }),
            decisions: None,
        }),
        _ => Err(problems),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{self, Overrides};

    fn runtime(toml: &str) -> Result<Runtime, ConfigErrors> {
        let value: serde_json::Value =
            figment::Figment::from(figment::providers::Serialized::defaults(
                serde_json::to_value(
                    config::load(None, Vec::new(), &Overrides::default()).unwrap(),
                )
                .unwrap(),
            ))
            .merge(<figment::providers::Toml as figment::providers::Format>::string(toml))
            .extract()
            .unwrap();
        Runtime::new(config::from_value(&value)?)
    }

    #[test]
    fn tenant_policy_overrides_the_route_policy() {
        let rt =
            runtime("[policies.small]\nbudget_chars = 10\n[tenants.policies]\nacme = \"small\"")
                .unwrap();
        let mut headers = HeaderMap::new();
        let r = rt.resolve("/v1/chat/completions", &headers).unwrap();
        assert_eq!((&*r.policy.name, &*r.tenant), ("default", OTHER_TENANT));
        headers.insert("x-tenant-id", "acme".parse().unwrap());
        let r = rt.resolve("/v1/chat/completions", &headers).unwrap();
        assert_eq!((&*r.policy.name, &*r.tenant), ("small", "acme"));
        headers.insert("x-tenant-id", "unknown-co".parse().unwrap());
        let r = rt.resolve("/v1/chat/completions", &headers).unwrap();
        assert_eq!((&*r.policy.name, &*r.tenant), ("default", OTHER_TENANT));
    }

    #[test]
    fn tenant_values_match_exactly_and_case_sensitively() {
        // Tenant ids are opaque keys (often from an auth layer): folding
        // case could merge two tenants, so `Acme` is not `acme`. The header
        // name, like every HTTP header name, matches in any case.
        let rt =
            runtime("[policies.small]\nbudget_chars = 10\n[tenants.policies]\nacme = \"small\"")
                .unwrap();
        let tenant_of = |value: &str| {
            let mut headers = HeaderMap::new();
            headers.insert("X-Tenant-Id", value.parse().unwrap());
            rt.resolve("/v1/chat/completions", &headers)
                .unwrap()
                .tenant
                .to_string()
        };
        assert_eq!(tenant_of("acme"), "acme");
        assert_eq!(tenant_of("ACME"), OTHER_TENANT);
        assert_eq!(tenant_of("Acme"), OTHER_TENANT);
    }

    #[test]
    fn unmatched_paths_resolve_to_nothing() {
        let rt = runtime("").unwrap();
        assert!(rt.resolve("/v1/models", &HeaderMap::new()).is_none());
        assert!(rt
            .resolve("/v1/chat/completions/x", &HeaderMap::new())
            .is_none());
    }

    #[test]
    fn first_matching_route_wins_and_prefixes_match() {
        let rt = runtime(
            "[policies.a]\nbudget_chars = 1\n[[routes]]\npath = \"/v1/chat/completions\"\npolicy = \"a\"\n[[routes]]\npath = \"/v1/*\"\npolicy = \"default\"",
        )
        .unwrap();
        assert_eq!(
            &*rt.resolve("/v1/chat/completions", &HeaderMap::new())
                .unwrap()
                .policy
                .name,
            "a"
        );
        let r = rt.resolve("/v1/other", &HeaderMap::new()).unwrap();
        assert_eq!((&*r.policy.name, &*r.route), ("default", "/v1/*"));
    }

    #[test]
    fn every_semantic_problem_is_reported() {
        let err = runtime(
            "[server]\nlisten = \"nowhere\"\n[upstream]\nurl = \"ftp://x\"\n[policies.bad]\nbudget_chars = 0\nduplicate_threshold = 1.5\npin_patterns = [\"(\"]\n[[routes]]\npath = \"v1\"\npolicy = \"missing\"\n[tenants.policies]\nacme = \"ghost\"",
        )
        .unwrap_err();
        let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "server.listen",
                "upstream.url",
                "policies.bad.budget_chars",
                "policies.bad.duplicate_threshold",
                "policies.bad.pin_patterns[0]",
                "routes[0].path",
                "routes[0].policy",
                "tenants.policies.acme",
            ],
            "{err}"
        );
    }

    #[test]
    fn a_worker_count_beyond_any_machine_is_a_problem() {
        assert!(runtime("[server]\nworkers = 4").is_ok());
        let err = runtime("[server]\nworkers = 100000").unwrap_err();
        let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(paths, ["server.workers"], "{err}");
    }

    #[test]
    fn auto_budget_keys_are_checked_and_compiled() {
        let rt = runtime(
            "[policies.default]\nbudget = \"auto\"\nreserve_tokens = 1000\n[policies.default.context_windows]\n\"my-model\" = 32768",
        )
        .unwrap();
        let policy = rt.policy("default").unwrap();
        let auto = policy.auto_budget.as_ref().expect("auto budget compiled");
        assert_eq!(auto.reserve_tokens, 1000);
        assert_eq!(
            auto.budget_tokens(Some("my-model-v2"), Some(768)),
            Some(31_000)
        );
        assert!(runtime("")
            .unwrap()
            .policy("default")
            .unwrap()
            .auto_budget
            .is_none());

        let err = runtime(
            "[policies.a]\nbudget = \"auto\"\nmode = \"stable\"\ncontext_windows = { \"m\" = 0, \"\" = 5 }\n[policies.b]\ncontext_windows = { \"m\" = 5 }",
        )
        .unwrap_err();
        let problems: Vec<(&str, &str)> = err
            .0
            .iter()
            .map(|p| (p.path.as_str(), p.message.as_str()))
            .collect();
        let has = |path: &str, words: &str| {
            problems
                .iter()
                .any(|(p, m)| *p == path && m.contains(words))
        };
        // Stable mode takes a token budget as exact mode does.
        assert!(
            !problems.iter().any(|(p, _)| *p == "policies.a.budget"),
            "{err}"
        );
        assert!(
            has("policies.a.context_windows.\"m\"", "at least 1"),
            "{err}"
        );
        assert!(
            has("policies.a.context_windows", "must not be empty"),
            "{err}"
        );
        assert!(
            has("policies.b.context_windows", "unless budget = \"auto\""),
            "{err}"
        );
        // Type errors: an unknown mode, a window that is not a number.
        let err = runtime(
            "[policies.c]\nbudget = \"dynamic\"\n[policies.d]\nbudget = \"auto\"\ncontext_windows = { \"m\" = \"big\" }",
        )
        .unwrap_err();
        let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            ["policies.c.budget", "policies.d.context_windows.m"],
            "{err}"
        );
    }

    #[test]
    fn an_unreadable_or_empty_ca_file_is_a_problem() {
        let err = runtime("[upstream]\nca_file = \"/nonexistent/ca.pem\"").unwrap_err();
        assert_eq!(err.0[0].path, "upstream.ca_file");
        let empty = std::env::temp_dir().join(format!("cp-empty-ca-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate").unwrap();
        let err = runtime(&format!(
            "[upstream]\nca_file = {:?}",
            empty.to_str().unwrap()
        ))
        .unwrap_err();
        std::fs::remove_file(&empty).ok();
        assert!(err.0[0].message.contains("no PEM certificate"), "{err}");
    }

    #[test]
    fn upstream_credentials_are_refused_without_echoing_them() {
        for url in [
            "https://user:s3cret@gw.example/openai",
            "https://user:s3cret@gw.example/?x=1",
            "ftp://user:s3cret@gw.example/",
            "https://gw.example/?api_key=s3cret",
        ] {
            let err = runtime(&format!("[upstream]\nurl = {url:?}")).unwrap_err();
            assert_eq!(err.0[0].path, "upstream.url");
            assert!(!err.to_string().contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn a_policy_must_keep_the_latest_message() {
        let err = runtime("[policies.default]\nkeep_last_n = 0").unwrap_err();
        assert_eq!(err.0[0].path, "policies.default.keep_last_n");
    }

    #[test]
    fn stable_mode_is_accepted_and_its_ratios_checked() {
        let rt = runtime("[policies.default]\nmode = \"stable\"").unwrap();
        let p = rt.policy("default").unwrap();
        assert_eq!(p.mode, Mode::Stable);
        assert_eq!((p.stable_target_ratio, p.stable_head_ratio), (0.7, 0.4));
        let err = runtime(
            "[policies.default]\nmode = \"stable\"\nstable_target_ratio = 1.5\nstable_head_ratio = -1",
        )
        .unwrap_err();
        let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
        assert!(
            paths.contains(&"policies.default.stable_target_ratio"),
            "{paths:?}"
        );
        assert!(
            paths.contains(&"policies.default.stable_head_ratio"),
            "{paths:?}"
        );
    }

    #[test]
    fn routes_name_or_imply_their_format_and_match_star_segments() {
        let rt = runtime(
            "[[routes]]\npath = \"/openai/deployments/*/chat/completions\"\npolicy = \"default\"\n\
             [[routes]]\npath = \"/v1/messages\"\npolicy = \"default\"\n\
             [[routes]]\npath = \"/custom\"\npolicy = \"default\"\nformat = \"responses\"",
        )
        .unwrap();
        let h = HeaderMap::new();
        let azure = rt
            .resolve("/openai/deployments/gpt4o/chat/completions", &h)
            .unwrap();
        assert_eq!(azure.format, Format::Chat);
        assert_eq!(&*azure.route, "/openai/deployments/*/chat/completions");
        assert!(rt
            .resolve("/openai/deployments/a/b/chat/completions", &h)
            .is_none());
        assert_eq!(
            rt.resolve("/v1/messages", &h).unwrap().format,
            Format::Anthropic
        );
        assert_eq!(Format::for_path("/v1/responses"), Format::Responses);
        assert_eq!(rt.resolve("/custom", &h).unwrap().format, Format::Responses);
        assert!(rt.resolve("/v1/messages/count_tokens", &h).is_none());
    }

    #[test]
    fn syntax_and_semantic_problems_are_reported_together() {
        let err = Runtime::load_text(
            Some(
            "colour = 1\n[policies.a]\nbudget_chars = \"lots\"\nduplicate_threshold = 2.0\nmax_message_chars = 0\npin_patterns = [\"ok\", \"(\"]\n[policies.b]\nbudget_chars = 5\nkeep_lst_n = 2\npin_patterns = [\"(\"]\n[[routes]]\npath = \"/x\"\npolicy = \"a\"\n[[routes]]\npath = \"/y\"\npolicy = \"ghost\"\n[[routes]]\npolicy = \"b\"",
            ),
            Vec::new(),
            &Overrides::default(),
        )
        .unwrap_err();
        let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "colour",
                "policies.a.budget_chars",
                "policies.b.keep_lst_n",
                "policies.a.duplicate_threshold",
                "policies.a.max_message_chars",
                "policies.a.pin_patterns[1]",
                "policies.b.pin_patterns[0]",
                "routes[1].policy",
                "routes[2].path",
            ],
            "{err}"
        );
    }

    #[test]
    fn price_tables_are_read_and_checked_with_their_paths() {
        let rt = Runtime::load_text(
            Some("[prices.\"gpt-4o\"]\nuncached = 2.5\ncache_read = 1.25\noutput = 10\ncurrency = \"USD\""),
            Vec::new(),
            &Overrides::default(),
        )
        .unwrap();
        let price = rt.prices.price(Some("gpt-4o-2024-08-06")).unwrap();
        assert_eq!(
            (price.uncached, price.cache_read, price.cache_write),
            (2.5, 1.25, 2.5)
        );
        assert_eq!(rt.prices.currency, "USD");
        let err = Runtime::load_text(
            Some("[prices.\"gpt-4o\"]\nuncached = -1\noutput = 10\ncach_read = 1\n[prices.claude]\nuncached = 3\noutput = 15\ncurrency = \"EUR\""),
            Vec::new(),
            &Overrides::default(),
        )
        .unwrap_err();
        let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "prices.\"gpt-4o\".cach_read",
                "prices.\"gpt-4o\".uncached",
                // Tables are read in name order: claude's currency first.
                "prices.\"gpt-4o\".currency",
            ],
            "{err}"
        );
    }
}

#[cfg(test)]
mod timeout_tests {
    use super::*;

    #[test]
    fn durations_are_typed_once_and_absurd_ones_are_problems_not_panics() {
        let rt = Runtime::load_text(
            Some("[upstream]\nconnect_timeout_secs = 2.5"),
            Vec::new(),
            &Overrides::default(),
        )
        .unwrap();
        assert_eq!(rt.timeouts.connect, Duration::from_millis(2500));
        assert_eq!(rt.timeouts.shutdown_delay, Duration::ZERO);
        let err = Runtime::load_text(
            Some("[upstream]\nidle_timeout_secs = 1e300\n[server]\nshutdown_grace_secs = -1"),
            Vec::new(),
            &Overrides::default(),
        )
        .unwrap_err();
        let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
        assert!(paths.contains(&"upstream.idle_timeout_secs"), "{paths:?}");
        assert!(paths.contains(&"server.shutdown_grace_secs"), "{paths:?}");
    }
}
