//! Compiling a configuration: every check serde cannot make (references,
//! bounds, regexes, URLs, certificates), reported all at once, and the
//! compiled policies, routes and summarizers a [`Runtime`] holds.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderName, Uri};
use regex::RegexSet;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;

use super::{Configured, ModelCalls, Route, Runtime, SummaryPolicy, Timeouts, MAX_WORKERS};
use crate::analysis_store::AnalysisStore;
use crate::compaction::agent::AgentPolicy;
use crate::compaction::budget::AutoBudget;
use crate::compaction::policy::{CompiledPolicy, Mode};
use crate::compaction::tokens::Encoding;
use crate::config::{
    self, BudgetMode, Config, ConfigErrors, ConfigProblem, Overrides, PolicyConfig, Scoring,
};
use crate::format::Format;

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
                Ok(c) => {
                    let models = ModelCalls { summary, decisions };
                    let configured = Configured {
                        policy: Arc::new(c),
                        models: Arc::new(models),
                    };
                    policies.insert(name.clone(), configured);
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

pub(super) fn compile_policy(
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
            id: crate::compaction::policy::next_policy_id(),
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
            recall: p.recall.then_some(crate::compaction::recall::RecallLimits {
                max_chars: p.recall_max_chars,
                max_rounds: p.recall_max_rounds,
                max_added_bytes: p.recall_max_added_bytes,
            }),
        }),
        _ => Err(problems),
    }
}
