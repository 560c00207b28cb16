//! What a newcomer and an operator meet: flags wherever they are put,
//! check-config reporting everything at once, the per-message report, the
//! example files the README uses, the startup and bind-failure log lines,
//! and an upstream base URL with a path prefix.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use compaction_proxy::format::chat::ChatBody;
use compaction_proxy::outcome::LossSummary;
use serde_json::{json, Value};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_compaction-proxy");

pub(crate) fn repo(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Runs the binary in the repository root (where the README's commands
/// run), with `stdin`, without our COMPACTION_PROXY_ environment.
pub(crate) fn run(args: &[&str], stdin: &[u8]) -> Output {
    let mut command = Command::new(BIN);
    for (key, _) in std::env::vars() {
        if key.starts_with("COMPACTION_PROXY_") {
            command.env_remove(key);
        }
    }
    let mut child = command
        .args(args)
        .current_dir(repo(""))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("binary starts");
    let mut input = child.stdin.take().unwrap();
    let stdin = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap();
    out
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

// ---------------------------------------------------------------------------
// flags
// ---------------------------------------------------------------------------

#[test]
fn config_before_or_after_the_subcommand_is_read() {
    let bad = temp_file("bad.toml", b"[policies.default]\nbudget_chars = 0\n");
    let bad = bad.to_str().unwrap();
    for args in [
        ["--config", bad, "check-config"],
        ["check-config", "--config", bad],
    ] {
        let out = run(&args, b"");
        assert!(
            !out.status.success(),
            "{args:?} passed a bad file:\n{}",
            text(&out.stdout)
        );
        assert!(
            text(&out.stderr).contains("policies.default.budget_chars"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    // --upstream is read by check-config too, in either place.
    for args in [
        ["--upstream", "ftp://nowhere", "check-config"],
        ["check-config", "--upstream", "ftp://nowhere"],
    ] {
        let out = run(&args, b"");
        assert!(!out.status.success(), "{args:?}");
        assert!(text(&out.stderr).contains("upstream.url"), "{args:?}");
    }
}

#[test]
fn typos_in_commands_and_flags_get_a_suggestion() {
    let out = run(&["check-confg"], b"");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("'check-config'"),
        "{}",
        text(&out.stderr)
    );
    let out = run(&["check-config", "--confg", "x.toml"], b"");
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("'--config'"),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// check-config
// ---------------------------------------------------------------------------

#[test]
fn check_config_reports_every_problem_at_once_with_full_paths() {
    // The issue's file: a typo'd key, a bad regex among good ones, a route to
    // an unknown policy, and out-of-range values side by side.
    let config = temp_file(
        "everything-wrong.toml",
        br#"
[policies.small]
budget_chars = 0
keep_lst_n = 3
duplicate_threshold = 1.5
max_message_chars = -1
pin_patterns = ["(?i)must not", "(unclosed", "fine"]

[[routes]]
path = "/v1/chat/completions"
policy = "smal"
"#,
    );
    let out = run(&["check-config", "--config", config.to_str().unwrap()], b"");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    for expected in [
        "policies.small.keep_lst_n: unknown key; did you mean `keep_last_n`?",
        "policies.small.budget_chars: must be at least 1",
        "policies.small.duplicate_threshold: must be in (0, 1]",
        "policies.small.max_message_chars: invalid value: integer `-1`",
        "policies.small.pin_patterns[1]: regex parse error",
        "routes[0].policy: no policy named \"smal\"",
    ] {
        assert!(
            stderr.contains(expected),
            "missing {expected:?} in:\n{stderr}"
        );
    }
    assert!(
        !stderr.contains("pin_patterns[0]") && !stderr.contains("pin_patterns[2]"),
        "only the bad pattern is named:\n{stderr}"
    );
}

// ---------------------------------------------------------------------------
// the README's commands and example files, as written
// ---------------------------------------------------------------------------

#[test]
fn the_example_files_work_with_the_readme_commands() {
    let out = run(
        &["check-config", "--config", "examples/two-tenant.toml"],
        b"",
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    let request = std::fs::read(repo("examples/request.json")).unwrap();
    let out = run(&["compact"], &request);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["loss"]["dropped_messages"].as_u64().unwrap() > 0);

    let chat = std::fs::read(repo("examples/chat-body.json")).unwrap();
    let out = run(&["compact", "--policy", "default"], &chat);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).starts_with("policy default: "));
    assert!(out.stdout.len() < chat.len(), "the body was compacted");
}

#[test]
fn the_report_says_what_became_of_every_message() {
    let chat = std::fs::read(repo("examples/chat-body.json")).unwrap();
    let config = "examples/two-tenant.toml";
    let out = run(
        &[
            "compact", "--config", config, "--policy", "small", "--report", "--json",
        ],
        &chat,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();

    // The same compaction computed in-process with the library.
    let rt = runtime(
        &std::fs::read_to_string(repo(config)).unwrap(),
        "http://127.0.0.1:1",
    );
    let policy = rt.policy("small").unwrap();
    let (engine, _) = ChatBody::parse(&chat).unwrap().compact(&policy);
    let loss = LossSummary::from_report(&engine);

    assert_eq!(report["policy"], "small");
    assert_eq!(report["status"], "compacted");
    assert_eq!(report["loss"]["dropped_messages"], loss.dropped_messages);
    assert_eq!(report["loss"]["deduped_messages"], loss.deduped_messages);
    let lines = report["messages"].as_array().unwrap();
    assert_eq!(lines.len(), loss.input_messages, "one line per message");
    let count = |fate: &str, stage: &str| {
        lines
            .iter()
            .filter(|l| l["fate"] == fate && l["stage"] == stage)
            .count()
    };
    assert_eq!(count("dropped", "dedupe"), loss.deduped_messages);
    assert_eq!(
        count("dropped", "drop"),
        loss.dropped_messages - loss.deduped_messages
    );
    assert_eq!(count("trimmed", "trim"), loss.trimmed_messages);
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], i, "in input order");
        assert!(!line["reason"].as_str().unwrap().is_empty());
    }
    assert_eq!(
        lines[1]["reason"], "protected (pinned by rule: first user message or pin_patterns)",
        "the task statement is pinned by default"
    );
}

// ---------------------------------------------------------------------------
// serve: what it logs
// ---------------------------------------------------------------------------

/// Runs `serve` with `args` until `until` shows in stderr (or it exits),
/// then stops it; returns stderr.
pub(crate) fn serve_until(args: &[&str], until: &str) -> String {
    let log = temp_file("serve.log", b"");
    let mut child = Command::new(BIN)
        .arg("serve")
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let stderr = std::fs::read_to_string(&log).unwrap();
        let exited = child.try_wait().unwrap().is_some();
        if stderr.contains(until) || exited || Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return std::fs::read_to_string(&log).unwrap();
        }
        std::thread::sleep(Duration::from_millis(25));
    }
}

#[test]
fn the_startup_line_names_config_policies_routes_and_tenants_without_colour() {
    let stderr = serve_until(
        &[
            "--config",
            repo("examples/two-tenant.toml").to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        "listening",
    );
    let line = stderr
        .lines()
        .find(|l| l.contains("compaction-proxy listening"))
        .unwrap_or_else(|| panic!("no startup line:\n{stderr}"));
    for part in [
        "two-tenant.toml",
        "policies=\"default,small\"",
        "routes=\"/v1/chat/completions->default,",
        // The built-in routes the file does not override follow its own.
        "/v1/messages->default",
        "/v1/responses->default",
        "tenants=\"acme,globex\"",
    ] {
        assert!(line.contains(part), "{part} missing: {line}");
    }
    assert!(
        !stderr.contains('\u{1b}'),
        "no ANSI escapes off a terminal: {stderr:?}"
    );
}

#[test]
fn a_bind_failure_names_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let stderr = serve_until(&["--listen", &addr], "cannot listen");
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// upstream base URL with a path prefix
// ---------------------------------------------------------------------------

#[tokio::test]
async fn an_upstream_with_or_without_v1_reaches_v1_chat_completions() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    for base in [upstream.url(), format!("{}/v1", upstream.url())] {
        let proxy = TestProxy::start("", &base).await;
        let answer = send(post_json(
            &proxy.url("/v1/chat/completions?x=1"),
            body.to_string(),
        ))
        .await;
        assert_eq!(answer.status, 200, "base {base}");
        assert_eq!(
            upstream.last().uri.path_and_query().unwrap().as_str(),
            "/v1/chat/completions?x=1",
            "base {base}"
        );
    }
}

// ---------------------------------------------------------------------------
// deployment: the sidecar recipe, rendered
// ---------------------------------------------------------------------------

/// The `ENV KEY=VALUE` lines of the Dockerfile: the image's environment.
fn image_env() -> Vec<(String, String)> {
    std::fs::read_to_string(repo("Dockerfile"))
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("ENV "))
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// The first YAML block of the chart README's sidecar section.
fn sidecar_recipe() -> serde_yaml::Value {
    let readme = std::fs::read_to_string(repo("charts/compaction-proxy/README.md")).unwrap();
    let section = &readme[readme
        .find("## Running as a sidecar")
        .expect("a sidecar section")..];
    let start = section.find("```yaml\n").expect("a yaml block") + "```yaml\n".len();
    let end = start + section[start..].find("```").unwrap();
    serde_yaml::from_str(&section[start..end]).expect("the recipe is valid YAML")
}

#[test]
fn the_sidecar_recipe_keeps_the_proxy_on_loopback_in_the_image() {
    let recipe = sidecar_recipe();
    let containers = recipe["containers"].as_sequence().unwrap();
    let proxy = containers
        .iter()
        .find(|c| c["name"] == "compaction-proxy")
        .expect("a compaction-proxy container");
    // Kubernetes: a container's env entries replace the image's variables
    // of the same name.
    let mut env = image_env();
    assert!(
        env.iter()
            .any(|(k, _)| k == "COMPACTION_PROXY_SERVER__LISTEN"),
        "the image sets a listen address: {env:?}"
    );
    for var in proxy["env"].as_sequence().into_iter().flatten() {
        let (name, value) = (
            var["name"].as_str().unwrap().to_owned(),
            var["value"].as_str().unwrap().to_owned(),
        );
        env.retain(|(k, _)| *k != name);
        env.push((name, value));
    }
    // The args, as the binary parses them (flags beat the environment).
    let args: Vec<String> = proxy["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect();
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let overrides = compaction_proxy::config::Overrides {
        listen: flag("--listen"),
        upstream: flag("--upstream"),
    };
    // The ConfigMap holds the chart's rendering of values.yaml, whose
    // listen is config/default.toml's; the embedded default stands for it.
    let config = compaction_proxy::config::load(None, env, &overrides).unwrap();
    let listen: std::net::SocketAddr = config.server.listen.parse().unwrap();
    assert!(
        listen.ip().is_loopback(),
        "the sidecar would listen on {listen}, reachable from the cluster network"
    );
    let app = containers.iter().find(|c| c["name"] == "app").unwrap();
    let base_url = app["env"][0]["value"].as_str().unwrap();
    assert_eq!(
        base_url,
        format!("http://{listen}/v1"),
        "the app reaches it"
    );
}

#[test]
fn notes_and_chart_readme_agree_that_config_changes_reload() {
    let notes =
        std::fs::read_to_string(repo("charts/compaction-proxy/templates/NOTES.txt")).unwrap();
    let readme = std::fs::read_to_string(repo("charts/compaction-proxy/README.md")).unwrap();
    let words = |t: &str| t.split_whitespace().collect::<Vec<_>>().join(" ");
    for text in [words(&notes), words(&readme)] {
        assert!(text.contains("reloads `config.toml`") || text.contains("reloads config.toml"));
        assert!(text.contains("within about a minute"));
        assert!(!text.contains("restart the app's pods yourself"));
    }
}

#[test]
fn the_docker_context_leaves_out_node_modules_and_the_install_pushes_the_image() {
    let ignore = std::fs::read_to_string(repo(".dockerignore")).unwrap();
    assert!(
        ignore
            .lines()
            .any(|l| l.trim() == "tests/sdk/node/node_modules"),
        "{ignore}"
    );
    let readme = std::fs::read_to_string(repo("charts/compaction-proxy/README.md")).unwrap();
    let build = readme.find("docker build -t ").unwrap();
    let push = readme.find("docker push ").expect("an image push step");
    let install = readme.find("helm install cproxy").unwrap();
    assert!(build < push && push < install, "build, push, then install");
}

#[test]
fn the_dashboard_selects_job_namespace_and_instance_everywhere() {
    let path = repo("charts/compaction-proxy/dashboards/compaction-proxy.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let names: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    for variable in ["job", "namespace", "instance"] {
        assert!(names.contains(&variable), "{variable} missing: {names:?}");
    }
    let mut selectors = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            // Every series selector of ours carries the three variables.
            for (at, _) in expr.match_indices('{') {
                let before = &expr[..at];
                let name_start = before
                    .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .map_or(0, |i| i + 1);
                let name = &before[name_start..];
                if name.starts_with("compaction_proxy_") || name.starts_with("process_") {
                    selectors += 1;
                    assert!(
                        expr[at..].starts_with(
                            "{job=~\"$job\",namespace=~\"$namespace\",instance=~\"$instance\""
                        ),
                        "{}: {expr}",
                        panel["title"]
                    );
                }
            }
        }
    }
    assert!(selectors > 40, "the scan found {selectors} selectors");
    // The retained-ratio panels read the histogram that holds compacted
    // requests only, and say so.
    let ratio_panels = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["title"].as_str().unwrap().starts_with("Retained ratio"));
    for panel in ratio_panels {
        assert!(panel["description"]
            .as_str()
            .unwrap()
            .contains("compacted requests only"));
    }
}

// ---------------------------------------------------------------------------
// how requests are counted and logged
// ---------------------------------------------------------------------------

/// A response body that sends its frames and then never ends (the
/// upstream's end not yet read when the client leaves).
struct ThenSilence(std::collections::VecDeque<bytes::Bytes>);

impl http_body::Body for ThenSilence {
    type Data = bytes::Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, Self::Error>>> {
        match self.0.pop_front() {
            Some(data) => std::task::Poll::Ready(Some(Ok(http_body::Frame::data(data)))),
            None => std::task::Poll::Pending,
        }
    }
}

/// How a watched stream is recorded when the client leaves after `frames`.
async fn ending_after(frames: &[&'static str]) -> compaction_proxy::proxy::in_flight::BodyEnd {
    use http_body_util::BodyExt;
    let (tx, rx) = std::sync::mpsc::channel();
    let body = ThenSilence(
        frames
            .iter()
            .map(|f| bytes::Bytes::from_static(f.as_bytes()))
            .collect(),
    );
    let mut watched = compaction_proxy::proxy::in_flight::Watched::new(
        body,
        Duration::from_secs(60),
        move |end, _| tx.send(end).unwrap(),
    );
    for _ in frames {
        watched.frame().await.unwrap().unwrap();
    }
    drop(watched); // the client closes the connection
    rx.recv().unwrap()
}

#[tokio::test]
async fn a_stream_that_delivered_its_terminal_event_is_complete_when_the_client_leaves() {
    use compaction_proxy::proxy::in_flight::BodyEnd;
    for terminal in [
        "data: [DONE]\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n",
    ] {
        let frames = ["data: {\"choices\":[]}\n\n", terminal];
        assert_eq!(ending_after(&frames).await, BodyEnd::Complete, "{terminal}");
    }
    // The marker cut between two frames, as a socket read may cut it.
    assert_eq!(
        ending_after(&["data: {\"choices\":[]}\n\ndata: [DO", "NE]\n\n"]).await,
        BodyEnd::Complete
    );
    // A Responses stream ends with the whole response, thousands of bytes
    // after the event's name.
    let completed: &'static str = Box::leak(
        format!(
            "event: response.completed\ndata: {{\"type\":\"response.completed\",\"response\":{{\"output_text\":\"{}\"}}}}\n\n",
            "word ".repeat(1000)
        )
        .into_boxed_str(),
    );
    assert_eq!(ending_after(&[completed]).await, BodyEnd::Complete);
    assert_eq!(
        ending_after(&["data: {\"choices\":[]}\n\n"]).await,
        BodyEnd::Abandoned,
        "a client leaving mid-stream is still client-gone"
    );
    assert_eq!(
        ending_after(&["data: {\"delta\":\"quoting data: [DONE] in text\"}\n\n"]).await,
        BodyEnd::Abandoned,
        "a marker inside a line is text, not an ending"
    );
}

#[tokio::test]
async fn deduplicated_messages_are_reported_apart_from_the_other_drops() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[policies.default]\nmode = \"exact\"\nbudget_chars = 200\nkeep_last_n = 1\npin_first_user = false",
        &upstream.url(),
    )
    .await;
    let repeated = "the deploy failed again with the same timeout error on stage two";
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": repeated},
        {"role": "assistant", "content": "Looking at it. ".repeat(8)},
        {"role": "user", "content": repeated},
        {"role": "assistant", "content": "Another answer here. ".repeat(8)},
        {"role": "user", "content": "and now?"},
    ]});
    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.to_string(),
    ))
    .await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let number = |name: &str| -> usize { answer.header(name).unwrap().parse().unwrap() };
    assert_eq!(number("x-compaction-deduped-messages"), 1);
    assert!(
        number("x-compaction-dropped-messages") > 1,
        "dropped counts the duplicate and the drops"
    );
    let metrics = send(
        http::Request::get(proxy.url("/metrics"))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    let text = String::from_utf8_lossy(&metrics.body).into_owned();
    assert!(
        text.lines().any(
            |l| l.starts_with("compaction_proxy_deduped_messages_total{") && l.ends_with(" 1")
        ),
        "{text}"
    );
}

#[test]
fn the_readme_loss_report_is_what_the_proxy_computes_for_the_example() {
    let readme = std::fs::read_to_string(repo("README.md")).unwrap();
    let figures: std::collections::HashMap<&str, &str> = readme
        .split_whitespace()
        .collect::<Vec<_>>()
        .windows(2)
        .filter_map(|w| Some((w[0].strip_prefix("x-compaction-")?.strip_suffix(':')?, w[1])))
        .collect();
    let chat = std::fs::read(repo("examples/chat-body.json")).unwrap();
    let rt = runtime("", "http://127.0.0.1:1");
    let policy = rt.policy("default").unwrap();
    let loss = compaction_proxy::proxy::compact::outcome_of(
        &chat,
        &policy,
        compaction_proxy::format::Format::Chat,
        usize::MAX,
        &compaction_proxy::compaction::stable::NoCheckpoints,
    )
    .unwrap()
    .loss;
    let expected = [
        ("status", "compacted".to_owned()),
        ("policy", "default".to_owned()),
        ("input-chars", loss.input_chars.to_string()),
        ("output-chars", loss.output_chars.to_string()),
        ("input-messages", loss.input_messages.to_string()),
        ("output-messages", loss.output_messages.to_string()),
        ("dropped-messages", loss.dropped_messages.to_string()),
        ("deduped-messages", loss.deduped_messages.to_string()),
        ("trimmed-messages", loss.trimmed_messages.to_string()),
        ("retained-ratio", loss.retained_ratio.to_string()),
        ("budget-met", loss.budget_met.to_string()),
    ];
    for (name, value) in expected {
        assert_eq!(
            figures.get(name),
            Some(&value.as_str()),
            "x-compaction-{name}"
        );
    }
}

// ---------------------------------------------------------------------------
// the live per-message report
// ---------------------------------------------------------------------------

fn get_request(url: &str) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    http::Request::get(url)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap()
}

fn with_report_header(
    mut request: http::Request<http_body_util::Full<bytes::Bytes>>,
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    request
        .headers_mut()
        .insert("x-compaction-report", "true".parse().unwrap());
    request
}

#[tokio::test]
async fn a_policy_that_allows_it_keeps_a_live_report_fetchable_by_id() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[policies.default]\nbudget_chars = 50000\nallow_report = true\n\
         [policies.closed]\nbudget_chars = 50000\n\
         [[routes]]\npath = \"/v1/chat/completions\"\npolicy = \"default\"\n\
         [[routes]]\npath = \"/closed/chat/completions\"\npolicy = \"closed\"",
        &upstream.url(),
    )
    .await;
    let chat = std::fs::read(repo("examples/chat-body.json")).unwrap();
    let answer = send(with_report_header(post_json(
        &proxy.url("/v1/chat/completions"),
        chat.clone(),
    )))
    .await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let id = answer
        .header("x-compaction-report-id")
        .expect("a report id")
        .to_owned();
    let report_url = proxy.url(&format!("/v1/compaction-reports/{id}"));
    let mut fetched = send(get_request(&report_url)).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fetched.status == 404 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        fetched = send(get_request(&report_url)).await;
    }
    assert_eq!(fetched.status, 200);
    let report: Value = serde_json::from_slice(&fetched.body).unwrap();
    assert_eq!(report["status"], "compacted");
    assert_eq!(
        report["loss"]["output_chars"].to_string(),
        answer.header("x-compaction-output-chars").unwrap(),
        "the report and the headers tell the same story"
    );
    let lines = report["messages"].as_array().unwrap();
    assert_eq!(
        lines.len().to_string(),
        answer.header("x-compaction-input-messages").unwrap()
    );
    assert!(lines.iter().any(|l| l["fate"] == "dropped"));

    // An unknown (or expired) id is a 404.
    let missing = send(get_request(&proxy.url("/v1/compaction-reports/nope"))).await;
    assert_eq!(missing.status, 404);
    let error: Value = serde_json::from_slice(&missing.body).unwrap();
    assert_eq!(error["error"]["code"], "report_not_found");

    // A policy that does not allow reports keeps none, gives no id, and
    // says why.
    let closed = send(with_report_header(post_json(
        &proxy.url("/closed/chat/completions"),
        chat,
    )))
    .await;
    assert_eq!(
        closed.header("x-compaction-status"),
        Some("compacted; report-not-allowed")
    );
    assert!(closed.header("x-compaction-report-id").is_none());
}

#[tokio::test]
async fn client_errors_use_one_type_spelling() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let invalid = send(post_json(
        &proxy.url("/v1/memory-compact"),
        json!({"messages": [], "budget_chars": 1}).to_string(),
    ))
    .await;
    assert_eq!(invalid.status, 400);
    let body: Value = serde_json::from_slice(&invalid.body).unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["error"]["code"], "validation_failed");
    let missing = send(get_request(&proxy.url("/v1/compaction-reports/x"))).await;
    let body: Value = serde_json::from_slice(&missing.body).unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
}
