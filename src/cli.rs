//! The binary's commands: `serve` (the default), `compact` and
//! `check-config`. `main.rs` only parses flags and calls [`run`].

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::config::{self, ConfigErrors, LogFormat, Overrides};
use crate::memory_compact;
use crate::outcome::Status;
use crate::policy::Runtime;
use crate::proxy::workers::{self, Workers};
use crate::proxy::{self, AppState};

#[derive(Debug, Parser)]
#[command(
    name = "compaction-proxy",
    version,
    about = "A reverse proxy that compacts LLM conversation histories (OpenAI chat completions and compatible servers, Anthropic Messages, OpenAI Responses) to a budget on their way upstream, and reports what it removed",
    args_conflicts_with_subcommands = false
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// `--config` is global: valid before or after the subcommand, so
    /// `compaction-proxy --config f.toml check-config` checks `f.toml`.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// For `serve` (the default) and `check-config`, given before the
    /// subcommand.
    #[command(flatten)]
    pub network: NetworkArgs,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the proxy (the default).
    Serve {
        #[command(flatten)]
        network: NetworkArgs,
    },
    /// Compact one request read from stdin, offline (no network).
    Compact {
        /// Policy for API bodies (default: the first route's).
        #[arg(long, short = 'p')]
        policy: Option<String>,
        /// The body's format: chat, anthropic or responses (default: from
        /// the body's shape: `input` is responses, `messages` with a
        /// top-level `system` or Anthropic content blocks is anthropic,
        /// other `messages` chat; a body with `budget_chars` is a
        /// memory-compact request).
        #[arg(long)]
        format: Option<crate::format::Format>,
        /// For an API body: print the per-message report instead of the
        /// body, one line per message (kept, trimmed or dropped, stage,
        /// chars, reason).
        #[arg(long)]
        report: bool,
        /// With --report: the report as one JSON document (loss figures,
        /// every message's fate and tool-call decisions).
        #[arg(long, requires = "report")]
        json: bool,
    },
    /// Validate the configuration (file, environment and flags) and print
    /// every problem, or the routes in force.
    CheckConfig {
        #[command(flatten)]
        network: NetworkArgs,
    },
}

/// The flag every command reads the configuration with.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct GlobalArgs {
    /// TOML file layered over the embedded default.
    #[arg(long, short = 'c', global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// The flags of the commands that listen or forward.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct NetworkArgs {
    /// Address to listen on: 127.0.0.1:8080, localhost:8080, or :8080 for
    /// every interface.
    #[arg(long, short = 'l', value_name = "ADDR")]
    pub listen: Option<String>,
    /// Upstream base URL, e.g. https://api.openai.com or http://vllm:8000/v1.
    #[arg(long, short = 'u', value_name = "URL")]
    pub upstream: Option<String>,
}

impl NetworkArgs {
    /// These flags, each given after the subcommand winning over the same
    /// given before it.
    fn or(self, before: NetworkArgs) -> NetworkArgs {
        NetworkArgs {
            listen: self.listen.or(before.listen),
            upstream: self.upstream.or(before.upstream),
        }
    }

    fn overrides(&self) -> Overrides {
        Overrides {
            listen: self.listen.clone(),
            upstream: self.upstream.clone(),
        }
    }
}

/// What a command reads its configuration with.
#[derive(Debug, Clone, Default)]
struct Args {
    config: Option<PathBuf>,
    network: NetworkArgs,
}

impl Args {
    fn overrides(&self) -> Overrides {
        self.network.overrides()
    }
}

/// Runs the parsed command; the exit code says whether it succeeded.
pub fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let args = |network: NetworkArgs| Args {
        config: cli.global.config.clone(),
        network: network.or(cli.network.clone()),
    };
    match cli.command {
        None => serve(args(NetworkArgs::default())),
        Some(Command::Serve { ref network }) => serve(args(network.clone())),
        Some(Command::Compact {
            policy,
            format,
            report,
            json,
        }) => {
            if cli.network.listen.is_some() || cli.network.upstream.is_some() {
                eprintln!(
                    "note: --listen and --upstream do nothing for compact (it uses no network)"
                );
            }
            compact(
                &args(NetworkArgs::default()),
                policy,
                format,
                report.then_some(json),
            )
        }
        Some(Command::CheckConfig { ref network }) => check_config(&args(network.clone())),
    }
}

fn load(file: Option<&PathBuf>, overrides: &Overrides) -> Result<Runtime, ConfigErrors> {
    Runtime::load(file.map(PathBuf::as_path), std::env::vars(), overrides)
        .map_err(|e| name_flags(e, overrides))
}

/// A problem with a value that came from a flag names the flag, not only
/// the key it sets.
fn name_flags(mut errors: ConfigErrors, overrides: &Overrides) -> ConfigErrors {
    for problem in &mut errors.0 {
        let flag = match problem.path.as_str() {
            "server.listen" if overrides.listen.is_some() => "--listen",
            "upstream.url" if overrides.upstream.is_some() => "--upstream",
            _ => continue,
        };
        problem.path = format!("{flag} (sets {})", problem.path);
    }
    errors
}

fn check_config(args: &Args) -> anyhow::Result<ExitCode> {
    // What a running proxy would do with the file: a reload refuses a
    // blank one, so check-config does too.
    let checked = match &args.config {
        Some(path) => config::read_file(path).and_then(|text| {
            refuse_blank(path, &text)?;
            Runtime::load_text(Some(&text), std::env::vars(), &args.overrides())
                .map_err(|e| name_flags(e, &args.overrides()))
        }),
        None => load(None, &args.overrides()),
    };
    match checked {
        Ok(rt) => {
            println!(
                "configuration OK: {} policies, {} routes, upstream {}",
                rt.config.policies.len(),
                rt.config.routes.len(),
                rt.upstream
            );
            println!("routes, first match wins (other paths pass through uncompacted):");
            for route in &rt.config.routes {
                let format = route
                    .format
                    .unwrap_or_else(|| crate::format::Format::for_path(&route.path));
                println!("  {} -> {} ({})", route.path, route.policy, format.as_str());
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            eprintln!("{errors}");
            Ok(ExitCode::FAILURE)
        }
    }
}

fn compact(
    args: &Args,
    policy: Option<String>,
    format: Option<crate::format::Format>,
    // `Some(json)`: print the report (as JSON when true) instead of the body.
    report: Option<bool>,
) -> anyhow::Result<ExitCode> {
    let mut input = Vec::new();
    std::io::stdin().read_to_end(&mut input)?;
    let value: serde_json::Value = match serde_json::from_slice(&input) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("error: stdin is not valid JSON: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let mut stdout = std::io::stdout().lock();
    let detected = match format {
        Some(format) => Some(format),
        None => {
            let detected = detect_format(&value);
            // Chat is the default the docs give; another API is said.
            if let Some(format) = detected.filter(|f| *f != crate::format::Format::Chat) {
                eprintln!(
                    "format: {} (from the body's shape; --format chat|anthropic|responses to choose)",
                    format.as_str()
                );
            }
            detected
        }
    };
    if detected.is_none() {
        // The memory-compact API's request: print exactly what the API answers.
        return match memory_compact::validate(&value) {
            Ok(request) => {
                // Byte for byte what the API answers (no trailing newline).
                serde_json::to_writer(&mut stdout, &request.compact())?;
                Ok(ExitCode::SUCCESS)
            }
            Err(invalid) => {
                eprintln!("error: the memory-compact request is invalid:");
                for v in &invalid.0 {
                    eprintln!(
                        "  {}: {}",
                        if v.path.is_empty() { "/" } else { &v.path },
                        v.message
                    );
                }
                Ok(ExitCode::FAILURE)
            }
        };
    }

    let runtime = match load(args.config.as_ref(), &args.overrides()) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let name = policy
        .or_else(|| runtime.config.routes.first().map(|r| r.policy.clone()))
        .unwrap_or_else(|| "default".into());
    let Some(policy) = runtime.policy(&name) else {
        let known: Vec<&str> = runtime.config.policies.keys().map(String::as_str).collect();
        eprintln!(
            "error: no policy named {name:?}; the policies are: {}",
            known.join(", ")
        );
        return Ok(ExitCode::FAILURE);
    };
    // As the proxy decides (same code): what cannot be compacted, and
    // everything under a dry-run policy, is forwarded as it came.
    let max_messages = runtime.config.server.max_messages;
    let format = detected.unwrap_or_default();
    if let Some(json) = report {
        return print_report(
            &input,
            &name,
            &policy,
            format,
            max_messages,
            json,
            &mut stdout,
        );
    }
    let outcome = match proxy::compact::outcome_of(
        &input,
        &policy,
        format,
        max_messages,
        &crate::compaction::stable::NoCheckpoints,
    ) {
        Ok(outcome) => outcome,
        Err(skip) => {
            stdout.write_all(&input)?;
            eprintln!("policy {name}: skipped; {}: {skip}", skip.reason());
            return Ok(ExitCode::SUCCESS);
        }
    };
    match (
        crate::compaction::status::status_of(&policy, &outcome),
        &outcome.rewritten,
    ) {
        (Status::Compacted, Some(body)) => stdout.write_all(body)?,
        _ => stdout.write_all(&input)?,
    }
    let loss = outcome.loss;
    eprintln!(
        "policy {name}{}: {} -> {} chars, {} -> {} messages ({} dropped, {} trimmed), retained {}, budget {}",
        if policy.dry_run { " (dry run, original printed)" } else { "" },
        loss.input_chars,
        loss.output_chars,
        loss.input_messages,
        loss.output_messages,
        loss.dropped_messages,
        loss.trimmed_messages,
        loss.retained_ratio,
        if loss.budget_met { "met" } else { "missed" },
    );
    Ok(ExitCode::SUCCESS)
}

/// The API a body is for, from its shape; `None` for a memory-compact
/// request (`budget_chars`, or no conversation at all). A Responses body
/// has `input`; a Messages body `messages` with a top-level `system`, or
/// content blocks only Anthropic has; any other `messages` body is chat.
pub fn detect_format(body: &serde_json::Value) -> Option<crate::format::Format> {
    use crate::format::Format;
    if body.get("budget_chars").is_some() {
        return None;
    }
    let Some(messages) = body.get("messages").and_then(|m| m.as_array()) else {
        return body.get("input").is_some().then_some(Format::Responses);
    };
    let chat_roles = ["system", "developer", "tool", "function"];
    let anthropic_blocks = [
        "tool_use",
        "tool_result",
        "thinking",
        "redacted_thinking",
        "document",
    ];
    fn role(m: &serde_json::Value) -> &str {
        m.get("role").and_then(|r| r.as_str()).unwrap_or("")
    }
    if messages.iter().any(|m| chat_roles.contains(&role(m))) {
        return Some(Format::Chat);
    }
    let anthropic_block = messages
        .iter()
        .filter_map(|m| m.get("content")?.as_array())
        .flatten()
        .filter_map(|block| block.get("type")?.as_str())
        .any(|kind| anthropic_blocks.contains(&kind));
    if body.get("system").is_some() || anthropic_block {
        return Some(Format::Anthropic);
    }
    Some(Format::Chat)
}

/// `compact --report`: a line of loss figures, then one line per input
/// message (kept, trimmed or dropped, by which stage, chars, why); with
/// `--json` the whole report as one JSON document.
fn print_report(
    input: &[u8],
    name: &str,
    policy: &crate::policy::CompiledPolicy,
    format: crate::format::Format,
    max_messages: usize,
    json: bool,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    match crate::explain::report_for(input, name, policy, format, max_messages) {
        Ok(document) if json => {
            serde_json::to_writer_pretty(&mut *out, &document)?;
            writeln!(out)?;
            Ok(ExitCode::SUCCESS)
        }
        Ok(document) => {
            write_report_lines(&document, out)?;
            Ok(ExitCode::SUCCESS)
        }
        Err(skip) => {
            eprintln!("policy {name}: skipped; {}: {skip}", skip.reason());
            Ok(ExitCode::FAILURE)
        }
    }
}

/// The report for a terminal: a summary line, a header, then a line per
/// message.
fn write_report_lines(
    report: &crate::explain::RequestReport<'_>,
    out: &mut impl Write,
) -> std::io::Result<()> {
    let loss = &report.loss;
    writeln!(
        out,
        "policy {}: {}; {} -> {} messages ({} dropped, {} deduped, {} trimmed), {} -> {} chars, retained {:.4}, budget {}",
        report.policy,
        report.status,
        loss.input_messages,
        loss.output_messages,
        loss.dropped_messages,
        loss.deduped_messages,
        loss.trimmed_messages,
        loss.input_chars,
        loss.output_chars,
        loss.retained_ratio,
        if loss.budget_met { "met" } else { "missed" },
    )?;
    writeln!(
        out,
        "{:>5}  {:<9}  {:<7}  {:<6}  {:>15}  reason",
        "#", "role", "fate", "stage", "chars"
    )?;
    let word = |value: serde_json::Value| value.as_str().unwrap_or("?").to_owned();
    for m in &report.messages {
        let mut reason = m.reason.replace(['\n', '\r'], " ");
        if let Some(decision) = m.decision {
            let decision = word(serde_json::to_value(decision).unwrap_or_default());
            reason.push_str(&format!(" [tool result: {decision}]"));
        }
        for call in &m.tool_calls {
            let decision = word(serde_json::to_value(call.decision).unwrap_or_default());
            reason.push_str(&format!(" [call {} {}: {decision}]", call.name, call.id));
        }
        if let Some(id) = &m.recall_id {
            reason.push_str(&format!(" [recall id {id}]"));
        }
        writeln!(
            out,
            "{:>5}  {:<9}  {:<7}  {:<6}  {:>15}  {}",
            m.index.map_or_else(|| "-".to_owned(), |i| i.to_string()),
            word(serde_json::to_value(m.role).unwrap_or_default()),
            word(serde_json::to_value(m.fate).unwrap_or_default()),
            m.stage.unwrap_or("-"),
            format!("{}/{}", m.chars, m.original_chars),
            reason
        )?;
    }
    Ok(())
}

fn serve(args: Args) -> anyhow::Result<ExitCode> {
    let overrides = args.overrides();
    let runtime = match load(args.config.as_ref(), &overrides) {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    init_logging(runtime.config.server.log_format);
    if let Err(e) = proxy::server::raise_descriptor_limit(runtime.config.server.max_connections) {
        tracing::warn!(error = %e, "cannot read or raise the descriptor limit");
    }
    // This runtime accepts, reloads and handles signals; connections are
    // served on the per-core workers.
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let pool = Workers::Pool(workers::Pool::start(workers::count_for(
        runtime.config.server.workers,
    ))?);
    let workers = &pool;
    tokio.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(runtime.listen).await {
            Ok(listener) => listener,
            Err(e) => {
                // Said once, in the log (stderr).
                tracing::error!(
                    listen = runtime.listen.to_string().as_str(),
                    "cannot listen on {}: {e}",
                    runtime.listen
                );
                return Ok(ExitCode::FAILURE);
            }
        };
        if runtime.config.server.listen.starts_with(':') {
            tracing::warn!(
                listen = %runtime.listen,
                "listening on every interface ({} given): anyone who can reach this host can use the proxy",
                runtime.config.server.listen
            );
        }
        let names = |keys: Vec<&String>| {
            keys.iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(",")
        };
        let routes = runtime
            .config
            .routes
            .iter()
            .map(|r| format!("{}->{}", r.path, r.policy))
            .collect::<Vec<_>>()
            .join(",");
        // String fields as &str: quoted in text, as the request lines are.
        tracing::info!(
            listen = listener.local_addr()?.to_string().as_str(),
            upstream = runtime.upstream.to_string().as_str(),
            config = args.config.as_ref().map_or("(embedded default)".into(), |p| p.display().to_string()).as_str(),
            policies = names(runtime.config.policies.keys().collect()).as_str(),
            routes = routes.as_str(),
            tenants = names(runtime.config.tenants.policies.keys().collect()).as_str(),
            "compaction-proxy listening"
        );
        let state = AppState::new(runtime);
        state
            .metrics
            .count_tasks_of(tokio::runtime::Handle::current());
        for worker in workers.runtimes() {
            state.metrics.count_tasks_of(worker);
        }
        tokio::spawn(reload_on_sighup(state.clone(), args, overrides));
        tokio::spawn(crate::memory::return_freed_periodically());
        proxy::server::serve_on(listener, state, shutdown_signal(), workers).await;
        Ok(ExitCode::SUCCESS)
    })
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only for a person at a terminal: `kubectl logs` and files get
    // plain text.
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(crate::log_buffer::Stderr);
    match format {
        // Flat: a request's fields beside its message, not under `fields`.
        LogFormat::Json => builder.json().flatten_event(true).init(),
        LogFormat::Text => builder.init(),
    }
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM received"),
        _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received"),
    }
}

/// How often the config file is checked for changes.
const CONFIG_POLL: Duration = Duration::from_secs(1);

/// Reloads the configuration on SIGHUP and when the config file changes
/// (polled: cheap, and it sees Kubernetes' ConfigMap symlink swaps). A
/// changed file is read only once it has stopped changing (the same
/// modification time and size on two polls in a row), so a rewrite is not
/// caught halfway. A bad or blank file is refused with its problems
/// logged; the configuration in force stays.
async fn reload_on_sighup(state: Arc<AppState>, args: Args, overrides: Overrides) {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = match signal(SignalKind::hangup()) {
        Ok(hup) => Some(hup),
        Err(e) => {
            tracing::warn!(error = %e, "cannot listen for SIGHUP; reload on file change only");
            None
        }
    };
    let fingerprint = |path: &PathBuf| {
        std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().ok(), m.len()))
    };
    let mut seen = args.config.as_ref().map(fingerprint);
    // A change seen on the last poll, reloaded if the next sees it unchanged.
    let mut settling = None;
    let mut poll = tokio::time::interval(CONFIG_POLL);
    loop {
        let reason = tokio::select! {
            Some(()) = async { hup.as_mut()?.recv().await } => "SIGHUP",
            _ = poll.tick() => {
                let now = args.config.as_ref().map(fingerprint);
                if now == seen {
                    settling = None;
                    continue;
                }
                if settling.as_ref() != Some(&now) {
                    settling = Some(now);
                    continue;
                }
                seen = now;
                settling = None;
                "config file changed"
            }
        };
        match reload(&state.runtime(), args.config.as_ref(), &overrides) {
            Ok(runtime) => {
                tracing::info!(
                    reason,
                    policies = runtime.config.policies.len(),
                    "configuration reloaded"
                );
                state.reload(runtime);
                state.metrics.config_reload(crate::metrics::RELOAD_APPLIED);
            }
            Err(errors) => {
                state.metrics.config_reload(crate::metrics::RELOAD_REFUSED);
                // One line per event: the problems joined, not the
                // multi-line list check-config prints.
                let problems = errors
                    .0
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                tracing::error!(
                    reason,
                    problems = problems.as_str(),
                    "configuration reload refused; the previous configuration stays in force"
                );
            }
        }
    }
}

/// A file that sets nothing (empty, or comments only: what a truncated
/// file looks like) is refused by reloads and check-config alike.
fn refuse_blank(path: &std::path::Path, text: &str) -> Result<(), ConfigErrors> {
    if config::is_blank(text) {
        return Err(ConfigErrors::one(
            "",
            format!(
                "{} sets nothing (empty, or comments only); an empty file is never reloaded",
                path.display()
            ),
        ));
    }
    Ok(())
}

/// Keeps a restart-only setting as it runs, noting `key` when the file
/// changed it.
fn keep<T: PartialEq + Clone>(
    key: &'static str,
    new: &mut T,
    old: &T,
    changed: &mut Vec<&'static str>,
) {
    if new != old {
        changed.push(key);
        new.clone_from(old);
    }
}

/// The configuration a reload puts in force after `current`: the file
/// read once, refused when blank (a truncated file would otherwise reload
/// the embedded defaults, upstream included), and with every restart-only
/// setting kept as it is, each change logged. The upstream is one of them:
/// clients' credentials must never follow a file edit to another host.
pub fn reload(
    current: &Runtime,
    file: Option<&PathBuf>,
    overrides: &Overrides,
) -> Result<Runtime, ConfigErrors> {
    let text = file.map(|p| config::read_file(p)).transpose()?;
    if let (Some(path), Some(text)) = (file, &text) {
        refuse_blank(path, text)?;
    }
    let mut runtime = Runtime::load_text(text.as_deref(), std::env::vars(), overrides)?;
    // Restart-only settings stay as they are in force, each change logged:
    // what check-config and the logs show, and what the next reload is
    // compared with, is what runs.
    let mut changed = Vec::new();
    keep(
        "server.listen",
        &mut runtime.listen,
        &current.listen,
        &mut changed,
    );
    keep(
        "upstream.url",
        &mut runtime.upstream,
        &current.upstream,
        &mut changed,
    );
    let (new, old) = (&mut runtime.config, &current.config);
    let (server, upstream) = (&mut new.server, &mut new.upstream);
    let c = &mut changed;
    keep(
        "upstream.connect_timeout_secs",
        &mut upstream.connect_timeout_secs,
        &old.upstream.connect_timeout_secs,
        c,
    );
    keep(
        "upstream.ca_file",
        &mut upstream.ca_file,
        &old.upstream.ca_file,
        c,
    );
    keep(
        "cache.max_bytes",
        &mut new.cache.max_bytes,
        &old.cache.max_bytes,
        c,
    );
    keep(
        "server.log_format",
        &mut server.log_format,
        &old.server.log_format,
        c,
    );
    keep(
        "server.header_read_timeout_secs",
        &mut server.header_read_timeout_secs,
        &old.server.header_read_timeout_secs,
        c,
    );
    keep(
        "server.keep_alive_timeout_secs",
        &mut server.keep_alive_timeout_secs,
        &old.server.keep_alive_timeout_secs,
        c,
    );
    keep(
        "server.max_connections",
        &mut server.max_connections,
        &old.server.max_connections,
        c,
    );
    keep(
        "server.workers",
        &mut server.workers,
        &old.server.workers,
        c,
    );
    for key in changed {
        tracing::warn!(key, "changed; it takes effect on restart only");
    }
    // What the kept settings are read from and compiled into.
    new.server.listen.clone_from(&old.server.listen);
    new.upstream.url.clone_from(&old.upstream.url);
    runtime.upstream_roots.clone_from(&current.upstream_roots);
    runtime.timeouts.connect = current.timeouts.connect;
    runtime.timeouts.header_read = current.timeouts.header_read;
    runtime.timeouts.keep_alive = current.timeouts.keep_alive;
    Ok(runtime)
}
