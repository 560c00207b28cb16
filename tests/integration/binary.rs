//! The real binary, spawned: the `compact` and `check-config` commands, the
//! admin API, environment overrides, SIGHUP reload, SIGTERM drain, and what
//! it writes to its logs.
//!
//! Each test owns its processes through [`Proc`], which kills the child when
//! dropped, so a failing assertion never leaves a proxy running. Output goes
//! to files (a trace log would fill a pipe nobody reads).

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use compaction_proxy::format::chat::ChatBody;
use compaction_proxy::outcome::LossSummary;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};

const BIN: &str = env!("CARGO_BIN_EXE_compaction-proxy");

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(path)
}

/// The seed file: its parsed value and the exact text of its `outputExample`.
fn seed() -> (Value, String) {
    let raw = std::fs::read_to_string(data("memory-compact-seed.json")).unwrap();
    let seed: Value = serde_json::from_str(&raw).unwrap();
    let start = raw.find("\"outputExample\":").unwrap() + "\"outputExample\":".len();
    let printed = raw[start..raw.trim_end().len() - 1].to_owned();
    assert_eq!(
        serde_json::from_str::<Value>(&printed).unwrap(),
        seed["outputExample"],
        "slicing the seed"
    );
    (seed, printed)
}

/// Runs a one-shot command with `stdin`, without inheriting our config env.
pub(crate) fn run_cli(args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(BIN)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin); // the command may stop reading early
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A port nothing listens on right now (bound, then released).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A spawned `serve` process, killed on drop.
struct Proc {
    child: Child,
    port: u16,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Proc {
    /// Starts `compaction-proxy serve --listen 127.0.0.1:<free>` with `args`
    /// and `env`, and waits until `/healthz` answers.
    fn start(rt: &tokio::runtime::Runtime, args: &[&str], env: &[(&str, &str)]) -> Proc {
        Proc::start_in(rt, Command::new(BIN), args, env)
    }

    /// [`Proc::start`] with at most `limit` file descriptors (`ulimit -n`).
    fn start_with_fd_limit(rt: &tokio::runtime::Runtime, limit: u32, args: &[&str]) -> Proc {
        let mut shell = Command::new("sh");
        shell.args([
            "-c",
            &format!("ulimit -n {limit} && exec \"$0\" \"$@\""),
            BIN,
        ]);
        Proc::start_in(rt, shell, args, &[])
    }

    fn start_in(
        rt: &tokio::runtime::Runtime,
        mut command: Command,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Proc {
        let port = free_port();
        let dir = temp_file("stdout", b"").parent().unwrap().to_owned();
        let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
        let listen = format!("127.0.0.1:{port}");
        let child = command
            .arg("serve")
            .args(["--listen", &listen])
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(File::create(&stdout).unwrap())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .expect("binary starts");
        let mut proc = Proc {
            child,
            port,
            stdout,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(status) = proc.child.try_wait().unwrap() {
                panic!("the proxy exited early ({status}):\n{}", proc.stderr());
            }
            if let Some(answer) = rt.block_on(try_send(get(&proc.url("/healthz")))) {
                assert_eq!(answer.status, 200);
                return proc;
            }
            assert!(
                Instant::now() < deadline,
                "no /healthz within 10 s:\n{}",
                proc.stderr()
            );
            std::thread::sleep(Duration::from_millis(25));
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    fn pid(&self) -> String {
        self.child.id().to_string()
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.pid()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{name} failed");
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.stdout).unwrap_or_default()
    }

    /// Waits up to `limit` for the process to exit.
    fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then the exit status (killed after 10 s).
    fn stop(&mut self) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit(Duration::from_secs(10))
            .expect("the proxy exits on SIGTERM")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn get(url: &str) -> Request<Full<Bytes>> {
    Request::get(url).body(Full::new(Bytes::new())).unwrap()
}

/// Like `send`, but `None` when the connection fails.
async fn try_send(request: Request<Full<Bytes>>) -> Option<Answer> {
    use http_body_util::BodyExt;
    let response = tokio::time::timeout(Duration::from_secs(5), client().request(request))
        .await
        .ok()?
        .ok()?;
    let (parts, body) = response.into_parts();
    let body = body.collect().await.ok()?.to_bytes();
    Some(Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

fn config_file(toml: &str) -> PathBuf {
    temp_file("config.toml", toml.as_bytes())
}

/// The chat fixture's loss and forwarded body under `toml` (over the
/// embedded default), computed in-process with the library.
fn expected_compaction(toml: &str, body: &[u8]) -> (LossSummary, Option<String>) {
    let rt = crate::support::runtime(toml, "http://127.0.0.1:1");
    let policy = rt.policy("default").expect("default policy");
    let (report, rewritten) = ChatBody::parse(body).unwrap().compact(&policy);
    (LossSummary::from_report(&report), rewritten)
}

fn policy_toml(budget: usize) -> String {
    format!(
        "[policies.default]\nbudget_chars = {budget}\nkeep_last_n = 2\npin_first_user = false\n{ENGINE_ONLY}"
    )
}

// ---------------------------------------------------------------------------
// compact
// ---------------------------------------------------------------------------

#[test]
fn compact_prints_exactly_the_seed_output_example() {
    let (seed, printed) = seed();
    let out = run_cli(&["compact"], seed["requestExample"].to_string().as_bytes());
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert_eq!(
        stdout.strip_suffix('\n').unwrap_or(&stdout),
        printed,
        "one JSON document, one newline at most"
    );
}

#[test]
fn compact_refuses_a_bad_request_naming_every_offending_path() {
    let (seed, _) = seed();
    let mut bad = seed["requestExample"].clone();
    bad["budget_chars"] = json!(5);
    bad["messages"][1]["role"] = json!("robot");
    bad["colour"] = json!("blue");
    let out = run_cli(&["compact"], bad.to_string().as_bytes());
    assert!(!out.status.success());
    assert!(
        out.stdout.is_empty(),
        "nothing on stdout: {}",
        text(&out.stdout)
    );
    let stderr = text(&out.stderr);
    for path in ["/budget_chars", "/messages/1/role", "/colour"] {
        assert!(stderr.contains(path), "{path} not named in:\n{stderr}");
    }

    let out = run_cli(&["compact"], b"{\"messages\": [");
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(text(&out.stderr).contains("JSON"), "{}", text(&out.stderr));
}

#[test]
fn compact_prints_the_forwarded_chat_body_and_a_loss_summary() {
    let toml = policy_toml(5000);
    let config = config_file(&toml);
    let fixture = fixture("chat-200-messages.json");
    let out = run_cli(&["compact", "--config", config.to_str().unwrap()], &fixture);
    assert!(out.status.success(), "{}", text(&out.stderr));

    let forwarded: Value = serde_json::from_slice(&out.stdout).expect("stdout is JSON");
    let original: Value = serde_json::from_slice(&fixture).unwrap();
    let (n_in, n_out) = (
        original["messages"].as_array().unwrap().len(),
        forwarded["messages"].as_array().unwrap().len(),
    );
    assert!(n_out < n_in, "{n_out} of {n_in} messages");
    for key in ["model", "stream"] {
        assert_eq!(forwarded[key], original[key], "{key} untouched");
    }
    let (loss, rewritten) = expected_compaction(&toml, &fixture);
    assert_eq!(
        text(&out.stdout),
        rewritten.expect("the fixture is over budget"),
        "the body the proxy would forward"
    );
    assert_eq!(loss.output_messages, n_out);

    let stderr = text(&out.stderr);
    for figure in [
        loss.input_chars,
        loss.output_chars,
        loss.input_messages,
        loss.output_messages,
        loss.dropped_messages,
    ] {
        assert!(
            stderr.contains(&figure.to_string()),
            "{figure} missing from the summary: {stderr}"
        );
    }
    assert!(stderr.contains("default"), "the policy is named: {stderr}");
}

#[test]
fn compact_prints_what_the_proxy_would_forward_when_it_would_not_compact() {
    // Under a dry-run policy the proxy forwards the original.
    let config = config_file(&format!("{}dry_run = true\n", policy_toml(5000)));
    let fixture = fixture("chat-200-messages.json");
    let out = run_cli(&["compact", "--config", config.to_str().unwrap()], &fixture);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, fixture.to_vec());
    assert!(
        text(&out.stderr).contains("dry run"),
        "{}",
        text(&out.stderr)
    );

    // A body the proxy skips is forwarded untouched: printed as it came.
    let odd = br#"{"model": "m", "messages": [{"role": "critic", "content": "x"}]}"#;
    let out = run_cli(&["compact"], odd);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(out.stdout, odd.to_vec());
    assert!(
        text(&out.stderr).contains("skipped; unsupported-message"),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// check-config
// ---------------------------------------------------------------------------

#[test]
fn check_config_accepts_a_good_file() {
    let config = config_file(&format!(
        "{}\n[tenants.policies]\nacme = \"default\"\n",
        policy_toml(1000)
    ));
    let out = run_cli(&["check-config", "--config", config.to_str().unwrap()], b"");
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

#[test]
fn check_config_lists_every_problem_with_its_path() {
    let config = config_file(
        r#"
[server]
listn = "127.0.0.1:1"

[policies.default]
budget_chars = "lots"

[policies.strict]
budget_chars = 100
pin_patterns = ["(unclosed"]

[[routes]]
path = "/v1/responses"
policy = "ghost"
"#,
    );
    assert_check_config_reports(
        &config,
        &[
            "server.listn",
            "policies.default.budget_chars",
            "policies.strict.pin_patterns",
            "routes[0].policy",
        ],
    );
}

/// `check-config` on `config` fails and names every one of `paths`.
fn assert_check_config_reports(config: &std::path::Path, paths: &[&str]) {
    let out = run_cli(&["check-config", "--config", config.to_str().unwrap()], b"");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    for path in paths {
        assert!(stderr.contains(path), "{path} not reported in:\n{stderr}");
    }
}

#[test]
fn check_config_lists_every_semantic_problem_with_its_path() {
    // Only problems serde cannot see: each must be reported, not just the first.
    let config = config_file(
        r#"
[policies.strict]
budget_chars = 0
pin_patterns = ["(unclosed"]

[[routes]]
path = "/v1/responses"
policy = "ghost"

[tenants.policies]
acme = "phantom"
"#,
    );
    assert_check_config_reports(
        &config,
        &[
            "policies.strict.budget_chars",
            "policies.strict.pin_patterns",
            "routes[0].policy",
            "tenants.policies.acme",
        ],
    );
}

#[test]
fn check_config_reports_agent_pass_keys_out_of_range() {
    let config = config_file(
        r#"
[policies.agent]
budget_chars = 1000
protect_tool_share = 1.5
tool_duplicate_threshold = -0.1
max_tool_result_chars = 3
max_arg_chars = 2
excluded_tools = ["bash"]
eligible_tools = ["bash"]
tokenizer_fallback = "p50k_base"
"#,
    );
    assert_check_config_reports(
        &config,
        &[
            "policies.agent.protect_tool_share",
            "policies.agent.tool_duplicate_threshold",
            "policies.agent.max_tool_result_chars",
            "policies.agent.max_arg_chars",
            "policies.agent.eligible_tools",
            "policies.agent.tokenizer_fallback",
        ],
    );
}

// ---------------------------------------------------------------------------
// serve
// ---------------------------------------------------------------------------

#[test]
fn memory_compact_endpoint_answers_what_the_cli_prints() {
    let (seed, printed) = seed();
    let request = seed["requestExample"].to_string();
    let cli = run_cli(&["compact"], request.as_bytes());
    assert!(cli.status.success());

    let rt = runtime();
    let config = config_file("[server]\nmax_body_bytes = 4096\n");
    let proxy = Proc::start(
        &rt,
        &[
            "--config",
            config.to_str().unwrap(),
            "--upstream",
            "http://127.0.0.1:9",
        ],
        &[],
    );
    let url = proxy.url("/v1/memory-compact");
    let post = |content_type: &str, body: String| {
        Request::post(&url)
            .header("content-type", content_type)
            .body(Full::new(Bytes::from(body)))
            .unwrap()
    };

    let answer = rt.block_on(send(post("application/json", request.clone())));
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let cli_stdout = text(&cli.stdout);
    assert_eq!(
        text(&answer.body),
        cli_stdout.strip_suffix('\n').unwrap_or(&cli_stdout)
    );
    assert_eq!(text(&answer.body), printed);

    let answer = rt.block_on(send(get(&url)));
    assert_eq!(answer.status, 405);
    assert_eq!(answer.header("allow"), Some("POST"));
    let answer = rt.block_on(send(post("text/plain", request.clone())));
    assert_eq!(answer.status, 415);

    let mut bad = seed["requestExample"].clone();
    bad["budget_chars"] = json!(5);
    bad["keep_last_n"] = json!(-1);
    bad["messages"][0]["content"] = json!("");
    bad["messages"][2]["role"] = json!("robot");
    let answer = rt.block_on(send(post("application/json", bad.to_string())));
    assert_eq!(answer.status, 400);
    let details = answer.json()["error"]["details"]
        .as_array()
        .expect("error.details")
        .clone();
    let paths: Vec<&str> = details
        .iter()
        .map(|d| d["path"].as_str().unwrap())
        .collect();
    for path in [
        "/budget_chars",
        "/keep_last_n",
        "/messages/0/content",
        "/messages/2/role",
    ] {
        assert!(paths.contains(&path), "{path} missing from {paths:?}");
    }

    let mut huge = seed["requestExample"].clone();
    huge["messages"][0]["content"] = json!("x".repeat(5000));
    let answer = rt.block_on(send(post("application/json", huge.to_string())));
    assert_eq!(answer.status, 413);
    assert_eq!(answer.json()["error"]["code"], "body_too_large");
}

#[test]
fn an_environment_variable_overrides_the_file_budget() {
    let rt = runtime();
    let upstream = rt.block_on(MockUpstream::start(Behavior::Json(
        200,
        json!({"ok": true}),
    )));
    let config = config_file(&policy_toml(6000));
    let proxy = Proc::start(
        &rt,
        &[
            "--config",
            config.to_str().unwrap(),
            "--upstream",
            &upstream.url(),
        ],
        &[("COMPACTION_PROXY_POLICIES__DEFAULT__BUDGET_CHARS", "2500")],
    );
    let body = fixture("chat-200-messages.json");
    let answer = rt.block_on(send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.clone(),
    )));
    assert_eq!(answer.status, 200);
    let (want, rewritten) = expected_compaction(&policy_toml(2500), &body);
    let (file_budget, _) = expected_compaction(&policy_toml(6000), &body);
    assert_ne!(
        want.output_chars, file_budget.output_chars,
        "the two budgets are told apart"
    );
    assert_eq!(
        answer.header("x-compaction-output-chars"),
        Some(want.output_chars.to_string().as_str())
    );
    assert_eq!(upstream.last().body, rewritten.unwrap().as_bytes());
}

/// `x-compaction-output-chars` of the fixture sent through `proxy`.
fn output_chars(rt: &tokio::runtime::Runtime, proxy: &Proc, body: &Bytes) -> usize {
    let answer = rt.block_on(send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.clone(),
    )));
    assert_eq!(answer.status, 200);
    answer
        .header("x-compaction-output-chars")
        .unwrap()
        .parse()
        .unwrap()
}

/// A binary running on a config file with budget A, a body whose
/// compaction differs under budget B, and both expected outcomes.
struct ReloadCase {
    rt: tokio::runtime::Runtime,
    _upstream: MockUpstream,
    body: Bytes,
    a: usize,
    b: usize,
    config: PathBuf,
    proxy: Proc,
}

impl ReloadCase {
    fn start() -> ReloadCase {
        let rt = runtime();
        let upstream = rt.block_on(MockUpstream::start(Behavior::Json(
            200,
            json!({"ok": true}),
        )));
        let body = fixture("chat-200-messages.json");
        let (a, _) = expected_compaction(&policy_toml(6000), &body);
        let (b, _) = expected_compaction(&policy_toml(2500), &body);
        assert_ne!(a.output_chars, b.output_chars);
        let config = config_file(&policy_toml(6000));
        let proxy = Proc::start(
            &rt,
            &[
                "--config",
                config.to_str().unwrap(),
                "--upstream",
                &upstream.url(),
            ],
            &[],
        );
        let case = ReloadCase {
            rt,
            _upstream: upstream,
            body,
            a: a.output_chars,
            b: b.output_chars,
            config,
            proxy,
        };
        assert_eq!(case.output_chars(), case.a);
        case
    }

    fn output_chars(&self) -> usize {
        output_chars(&self.rt, &self.proxy, &self.body)
    }

    /// Polls until requests get `expected` output chars, for at most 5 s.
    fn wait_for(&self, expected: usize, after: &str) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.output_chars() != expected {
            assert!(
                Instant::now() < deadline,
                "new budget not in force 5 s after {after}:\n{}",
                self.proxy.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

#[test]
fn sighup_reloads_the_file_and_a_broken_file_keeps_the_config_in_force() {
    let mut case = ReloadCase::start();
    std::fs::write(&case.config, policy_toml(2500)).unwrap();
    case.proxy.signal("HUP");
    case.wait_for(case.b, "SIGHUP");

    std::fs::write(
        &case.config,
        "[policies.default]\nbudget_chars = \"lots\"\nkeep_lsat_n = 1\n",
    )
    .unwrap();
    case.proxy.signal("HUP");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !case.proxy.stderr().contains("reload refused") {
        assert!(
            Instant::now() < deadline,
            "the refused reload is not logged:\n{}",
            case.proxy.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        case.output_chars(),
        case.b,
        "the previous configuration stays"
    );
    assert!(
        case.proxy.child.try_wait().unwrap().is_none(),
        "still running after a bad reload"
    );
    let log = case.proxy.stderr();
    assert!(
        log.contains("policies.default.budget_chars"),
        "the problem is logged with its path:\n{log}"
    );
    assert!(
        log.contains("SIGHUP"),
        "the reload names its trigger:\n{log}"
    );
    // Both outcomes are counted (the file watcher may see each change too).
    let metrics = case.rt.block_on(send(get(&case.proxy.url("/metrics"))));
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    let reloads = |result: &str| -> f64 {
        let prefix = format!("compaction_proxy_config_reloads_total{{result=\"{result}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0.0)
    };
    assert!(reloads("applied") >= 1.0, "{text}");
    assert!(reloads("refused") >= 1.0, "{text}");
    assert!(case.proxy.stop().success());
}

#[test]
fn a_changed_config_file_is_reloaded_without_a_signal() {
    let mut case = ReloadCase::start();
    std::fs::write(&case.config, policy_toml(2500)).unwrap();
    case.wait_for(case.b, "the file changed");
    assert!(case.proxy.stderr().contains("config file changed"));
    assert!(case.proxy.stop().success());
}

/// Waits up to 5 s for `needle` in the proxy's log.
fn wait_for_log(proxy: &Proc, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !proxy.stderr().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log within 5 s:\n{}",
            proxy.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_emptied_config_file_leaves_the_upstream_unchanged() {
    let rt = runtime();
    let upstream = rt.block_on(MockUpstream::start(Behavior::Json(
        200,
        json!({"ok": true}),
    )));
    // The upstream comes from the file itself, as in a real deployment.
    let config = config_file(&format!("[upstream]\nurl = \"{}\"\n", upstream.url()));
    let mut proxy = Proc::start(&rt, &["--config", config.to_str().unwrap()], &[]);
    std::fs::write(&config, "").unwrap(); // truncated
    wait_for_log(&proxy, "reload refused");
    let answer = rt.block_on(send(get(&proxy.url("/v1/models"))));
    assert_eq!(
        answer.status, 200,
        "still forwarded to the configured upstream"
    );
    assert_eq!(upstream.received().len(), 1);
    assert!(proxy.stderr().contains("empty"), "{}", proxy.stderr());

    // A rewrite naming another upstream is reloaded, but not its upstream.
    std::fs::write(
        &config,
        "[upstream]\nurl = \"http://127.0.0.1:9\"\n[policies.default]\nbudget_chars = 1234\n",
    )
    .unwrap();
    wait_for_log(&proxy, "configuration reloaded");
    assert!(
        proxy.stderr().contains("upstream.url"),
        "the upstream change is logged as restart-only:\n{}",
        proxy.stderr()
    );
    let answer = rt.block_on(send(get(&proxy.url("/v1/models"))));
    assert_eq!(answer.status, 200);
    assert_eq!(upstream.received().len(), 2);
    assert!(proxy.stop().success());
}

#[test]
fn a_config_file_caught_mid_rewrite_is_read_only_once_it_settles() {
    let mut case = ReloadCase::start();
    let whole = policy_toml(2500);
    let (half, _) = whole.split_at(whole.len() / 2);
    // A non-atomic rewrite, slower than a poll would be if the poller read
    // each change at once: the half file is never loaded.
    for _ in 0..2 {
        std::fs::write(&case.config, half).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        std::fs::write(&case.config, &whole).unwrap();
        std::thread::sleep(Duration::from_millis(600));
    }
    case.wait_for(case.b, "the rewrite settled");
    assert!(
        !case.proxy.stderr().contains("reload refused"),
        "a half-written file was read:\n{}",
        case.proxy.stderr()
    );
    assert!(case.proxy.stop().success());
}

#[test]
fn running_out_of_descriptors_does_not_stop_the_accept_loop() {
    let rt = runtime();
    let upstream = rt.block_on(MockUpstream::start(Behavior::Json(
        200,
        json!({"ok": true}),
    )));
    let mut proxy = Proc::start_with_fd_limit(&rt, 48, &["--upstream", &upstream.url()]);
    // Half-sent requests until the proxy has no descriptor left.
    let mut clients = Vec::new();
    for _ in 0..80 {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
        let _ = stream.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n");
        clients.push(stream);
    }
    wait_for_log(&proxy, "accept failed");
    drop(clients);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(answer) = rt.block_on(try_send(get(&proxy.url("/healthz")))) {
            assert_eq!(answer.status, 200);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not accepting 5 s after descriptors freed up:\n{}",
            proxy.stderr()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(proxy.child.try_wait().unwrap().is_none(), "still running");
    assert!(proxy.stop().success());
}

/// Six SSE events `gap` apart from a mock upstream, and a proxy in front
/// of it on `toml`; with the events and the body of a streamed request.
struct StreamingSetup {
    chunks: Vec<String>,
    body: String,
    proxy: Proc,
    _upstream: MockUpstream,
}

impl StreamingSetup {
    fn start(rt: &tokio::runtime::Runtime, gap: Duration, toml: &str) -> Self {
        let chunks: Vec<String> = (0..6).map(|i| format!("data: {{\"n\":{i}}}\n\n")).collect();
        let upstream = rt.block_on(MockUpstream::start(Behavior::Sse {
            chunks: chunks.clone(),
            gap,
        }));
        let config = config_file(toml);
        let proxy = Proc::start(
            rt,
            &[
                "--config",
                config.to_str().unwrap(),
                "--upstream",
                &upstream.url(),
            ],
            &[],
        );
        let body =
            json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
                .to_string();
        StreamingSetup {
            chunks,
            body,
            proxy,
            _upstream: upstream,
        }
    }
}

/// The data frames of a stream, as one string.
fn text_of(frames: &[(Instant, Bytes)]) -> String {
    frames
        .iter()
        .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
        .collect()
}

#[test]
fn sigterm_lets_an_open_stream_finish_refuses_new_connections_and_exits_zero() {
    let rt = runtime();
    let StreamingSetup {
        chunks,
        body,
        mut proxy,
        _upstream,
    } = StreamingSetup::start(
        &rt,
        Duration::from_millis(180),
        "[server]\nshutdown_grace_secs = 8\n",
    );
    let response = rt
        .block_on(client().request(post_json(&proxy.url("/v1/chat/completions"), body)))
        .expect("stream starts");
    assert_eq!(response.status(), 200);
    let started = Instant::now();
    let reader = rt.spawn(frames_with_times(response));

    std::thread::sleep(Duration::from_millis(250)); // one or two events in
    proxy.signal("TERM");
    let signalled = Instant::now();

    // The listener closes while the stream is still running.
    let deadline = Instant::now() + Duration::from_secs(2);
    while std::net::TcpStream::connect(("127.0.0.1", proxy.port)).is_ok() {
        assert!(
            Instant::now() < deadline,
            "still accepting connections after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !reader.is_finished(),
        "the stream should still be running when the listener closes"
    );

    let (frames, end) = rt.block_on(reader).unwrap();
    assert_eq!(end, Ok(()), "the stream ends cleanly");
    assert_eq!(text_of(&frames), chunks.concat(), "every event arrives");
    assert!(started.elapsed() >= Duration::from_millis(900));

    let status = proxy
        .wait_exit(Duration::from_secs(8))
        .expect("exits within the grace period");
    assert_eq!(status.code(), Some(0), "{}", proxy.stderr());
    assert!(signalled.elapsed() < Duration::from_secs(8));
    assert!(
        rt.block_on(try_send(get(&proxy.url("/healthz")))).is_none(),
        "nothing answers after exit"
    );
}

/// `compaction_proxy_tasks` as the proxy's /metrics reports it now.
fn tasks(rt: &tokio::runtime::Runtime, proxy: &Proc) -> i64 {
    let metrics = rt.block_on(send(get(&proxy.url("/metrics"))));
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    text.lines()
        .find_map(|l| l.strip_prefix("compaction_proxy_tasks "))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no compaction_proxy_tasks in\n{text}"))
}

#[test]
fn the_tasks_gauge_counts_open_streams_and_comes_back_down_after_them() {
    let rt = runtime();
    // One worker: its tasks are the accept loop's, the log flusher's and,
    // once a connection is pooled, the pool reaper's.
    let StreamingSetup {
        chunks,
        body,
        proxy,
        _upstream,
    } = StreamingSetup::start(&rt, Duration::from_millis(150), "[server]\nworkers = 1\n");
    // A scrape's connection may outlive it briefly: the least of a few.
    let quiet = (0..3)
        .map(|_| {
            std::thread::sleep(Duration::from_millis(50));
            tasks(&rt, &proxy)
        })
        .min()
        .unwrap();
    assert!(quiet > 0, "the runtimes' own tasks are counted");

    let readers: Vec<_> = (0..3)
        .map(|_| {
            let client = client();
            let response = rt
                .block_on(
                    client.request(post_json(&proxy.url("/v1/chat/completions"), body.clone())),
                )
                .expect("stream starts");
            // The client goes with the reader, so its connection closes
            // once the stream has been read.
            rt.spawn(async move {
                let _client = client;
                frames_with_times(response).await
            })
        })
        .collect();
    // Each stream: its client connection and its upstream connection.
    let streaming = tasks(&rt, &proxy);
    assert!(
        streaming >= quiet + 6,
        "{streaming} tasks with 3 streams open, {quiet} before"
    );
    for reader in readers {
        let (frames, end) = rt.block_on(reader).unwrap();
        assert_eq!(end, Ok(()));
        assert_eq!(text_of(&frames), chunks.concat());
    }
    // The client connections' tasks end; the 3 upstream connections stay
    // pooled, and the pool's reaper has started.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let after = tasks(&rt, &proxy);
        if after <= quiet + 4 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{after} tasks 5 s after the streams ended, {quiet} before them"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------------------
// Logs
// ---------------------------------------------------------------------------

const MARKERS: [&str; 5] = [
    "sk-SECRETbearer0xA1B2C3",
    "SECRETapikey0xD4E5F6",
    "SECRETxapikey0x778899",
    "SECRETcookie0xAABBCC",
    "SECRETproxyauth0xDDEEFF",
];

fn with_secrets(mut request: Request<Full<Bytes>>) -> Request<Full<Bytes>> {
    let h = request.headers_mut();
    h.insert(
        "authorization",
        format!("Bearer {}", MARKERS[0]).parse().unwrap(),
    );
    h.insert("api-key", MARKERS[1].parse().unwrap());
    h.insert("x-api-key", MARKERS[2].parse().unwrap());
    h.insert("cookie", format!("session={}", MARKERS[3]).parse().unwrap());
    h.insert(
        "proxy-authorization",
        format!("Basic {}", MARKERS[4]).parse().unwrap(),
    );
    request
}

/// The JSON log lines whose message is `request`.
fn request_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str::<Value>(l)
                .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))
        })
        .filter(|v| v["message"] == "request")
        .collect()
}

#[test]
fn secrets_never_reach_the_logs_and_each_proxied_request_logs_one_line() {
    let rt = runtime();
    let upstream = rt.block_on(MockUpstream::start(Behavior::Json(
        200,
        json!({"ok": true}),
    )));
    let env = [
        ("RUST_LOG", "trace"),
        ("COMPACTION_PROXY_SERVER__LOG_FORMAT", "json"),
    ];
    let config = config_file(&policy_toml(2500));
    let config = config.to_str().unwrap();
    let body = fixture("chat-200-messages.json");

    // A working upstream: a compacted request, an unmatched one, a skipped one.
    let mut up = Proc::start(
        &rt,
        &["--config", config, "--upstream", &upstream.url()],
        &env,
    );
    let chat = up.url("/v1/chat/completions?api-key=SECRETquery0x1234");
    let answer = rt.block_on(send(with_secrets(post_json(&chat, body.clone()))));
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let answer = rt.block_on(send(with_secrets(get(&up.url("/v1/models")))));
    assert_eq!(answer.status, 200);
    let answer = rt.block_on(send(with_secrets(post_json(&chat, "not json"))));
    assert!(answer
        .header("x-compaction-status")
        .unwrap()
        .starts_with("skipped"));
    // The upstream still gets the credentials (except the hop-by-hop one).
    let last = upstream.last();
    assert!(last.headers["authorization"]
        .to_str()
        .unwrap()
        .contains(MARKERS[0]));
    assert!(last.headers.get("proxy-authorization").is_none());
    // Admin requests are not proxied requests.
    rt.block_on(send(with_secrets(get(&up.url("/metrics")))));
    assert_eq!(up.stop().code(), Some(0));

    // No upstream: 502 on a matched and an unmatched route.
    let mut down = Proc::start(
        &rt,
        &[
            "--config",
            config,
            "--upstream",
            &format!("http://127.0.0.1:{}", free_port()),
        ],
        &env,
    );
    let answer = rt.block_on(send(with_secrets(post_json(
        &down.url("/v1/chat/completions"),
        body.clone(),
    ))));
    assert_eq!(answer.status, 502);
    let answer = rt.block_on(send(with_secrets(get(
        &down.url("/v1/models?key=SECRETquery0x1234")
    ))));
    assert_eq!(answer.status, 502);
    assert_eq!(down.stop().code(), Some(0));

    let mut secrets = MARKERS.to_vec();
    secrets.push("SECRETquery0x1234");
    for (name, proc, expected) in [("working", &up, 3), ("down", &down, 2)] {
        let (stdout, stderr) = (proc.stdout(), proc.stderr());
        assert!(
            stderr.lines().count() > expected,
            "{name}: RUST_LOG=trace logged almost nothing:\n{stderr}"
        );
        for secret in &secrets {
            assert!(
                !stdout.contains(secret),
                "{name}: {secret} on stdout:\n{stdout}"
            );
            assert!(
                !stderr.contains(secret),
                "{name}: {secret} in the log:\n{stderr}"
            );
        }
        let lines = request_lines(&stderr);
        assert_eq!(
            lines.len(),
            expected,
            "{name}: one request line per proxied request:\n{stderr}"
        );
        for line in &lines {
            let f = &line;
            assert!(
                f["route"].is_string() && f["tenant"] == "other",
                "{name}: {line}"
            );
            assert!(f["response_status"].is_u64(), "{name}: {line}");
            if f["route"] == "/v1/chat/completions" {
                assert_eq!(f["policy"], "default", "{name}: {line}");
                assert!(f["compaction"].is_string(), "{name}: {line}");
            } else {
                assert_eq!(f["route"], "unmatched", "{name}: {line}");
            }
        }
    }
    let up_lines = request_lines(&up.stderr());
    let statuses: Vec<&str> = up_lines
        .iter()
        .map(|l| l["compaction"].as_str().unwrap_or("-"))
        .collect();
    assert_eq!(
        statuses.iter().filter(|s| **s == "compacted").count(),
        1,
        "{statuses:?}"
    );
    let down_lines = request_lines(&down.stderr());
    assert!(
        down_lines.iter().all(|l| l["response_status"] == 502),
        "{down_lines:?}"
    );
}

#[test]
fn sigterm_lets_an_open_websocket_tunnel_finish() {
    use std::io::{Read, Write};
    let rt = runtime();
    let upstream = rt.block_on(MockUpstream::start(Behavior::UpgradeEcho));
    let config = config_file("[server]\nshutdown_grace_secs = 8\n");
    let mut proxy = Proc::start(
        &rt,
        &[
            "--config",
            config.to_str().unwrap(),
            "--upstream",
            &upstream.url(),
        ],
        &[],
    );
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    stream
        .write_all(b"GET /v1/realtime HTTP/1.1\r\nHost: p\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 101"), "{}", text(&head));
    let echo = |stream: &mut std::net::TcpStream, message: &str| {
        stream.write_all(message.as_bytes()).unwrap();
        let mut back = vec![0u8; message.len()];
        stream.read_exact(&mut back).unwrap();
        text(&back)
    };
    assert_eq!(echo(&mut stream, "before"), "BEFORE");

    proxy.signal("TERM");
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(echo(&mut stream, "during the drain"), "DURING THE DRAIN");
    assert!(
        proxy.child.try_wait().unwrap().is_none(),
        "the proxy waits for the tunnel"
    );

    drop(stream);
    let status = proxy
        .wait_exit(Duration::from_secs(5))
        .expect("it exits once the tunnel closes");
    assert!(status.success());
    assert!(
        proxy.stderr().contains("upgraded connection closed"),
        "{}",
        proxy.stderr()
    );
}

#[test]
fn log_levels_follow_how_each_request_ended() {
    let rt = runtime();
    let upstream = rt.block_on(MockUpstream::start(Behavior::Json(
        200,
        json!({"ok": true}),
    )));
    let config = config_file(&format!(
        "{}[server]\nmax_body_bytes = 100000\n",
        policy_toml(2500)
    ));
    let mut proxy = Proc::start(
        &rt,
        &[
            "--config",
            config.to_str().unwrap(),
            "--upstream",
            &upstream.url(),
        ],
        &[("COMPACTION_PROXY_SERVER__LOG_FORMAT", "json")],
    );
    let chat = proxy.url("/v1/chat/completions");
    // A JSON answer with a length, on a matched and an unmatched route.
    rt.block_on(send(post_json(&chat, fixture("chat-200-messages.json"))));
    rt.block_on(send(get(&proxy.url("/v1/models"))));
    // A stream (no length).
    upstream.set_behavior(Behavior::Sse {
        chunks: vec!["data: {}\n\n".into(), "data: [DONE]\n\n".into()],
        gap: Duration::from_millis(10),
    });
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    rt.block_on(send(post_json(&chat, body.to_string())));
    // A client's mistake: a body over the limit.
    let answer = rt.block_on(send(post_json(&chat, "x".repeat(200_000))));
    assert_eq!(answer.status, 413);
    // A client that leaves before the upstream answers.
    upstream.set_behavior(Behavior::SlowHeaders(Duration::from_millis(400)));
    let gone = rt.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(100),
            send(post_json(&chat, body.to_string())),
        )
        .await
    });
    assert!(gone.is_err(), "the client gave up first");
    std::thread::sleep(Duration::from_millis(100));
    assert!(proxy.stop().success());

    // Each worker thread buffers its own lines, so the log is in order per
    // worker; the timestamps give the order across them.
    let mut lines = request_lines(&proxy.stderr());
    lines.sort_by_key(|l| l["timestamp"].as_str().unwrap_or_default().to_owned());
    let seen: Vec<(String, String, String)> = lines
        .iter()
        .map(|l| {
            (
                l["level"].as_str().unwrap_or_default().to_owned(),
                l["ending"].as_str().unwrap_or_default().to_owned(),
                l["response_status"].to_string(),
            )
        })
        .collect();
    // The compacted request is INFO; the unmatched GET and the unchanged
    // stream passed through untouched, which is DEBUG: not at the default
    // level.
    let expected: Vec<(String, String, String)> = [
        ("INFO", "complete", "200"),
        ("WARN", "refused", "413"),
        ("INFO", "client-gone", "0"),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(seen, expected, "{}", proxy.stderr());
}
