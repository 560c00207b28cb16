//! What a newcomer and an operator meet, second round: routes that merge,
//! base URLs without `/v1`, refusals told apart from skips, headers the
//! proxy keeps to itself, and the CLI's habits.

use serde_json::json;

use crate::operator::{repo, run, text};
use crate::support::*;

/// The routes of the embedded default, as `check-config` prints them.
fn builtin_routes() -> Vec<(String, String)> {
    let rt = compaction_proxy::policy::Runtime::load_text(None, Vec::new(), &Default::default())
        .unwrap();
    rt.config
        .routes
        .iter()
        .map(|r| (r.path.clone(), r.policy.clone()))
        .collect()
}

fn anthropic_body() -> String {
    let mut messages = Vec::new();
    for i in 0..40 {
        messages.push(
            json!({"role": "user", "content": format!("question {i}: {}", "words ".repeat(60))}),
        );
        messages.push(
            json!({"role": "assistant", "content": format!("answer {i}: {}", "more ".repeat(60))}),
        );
    }
    messages.push(json!({"role": "user", "content": "and now?"}));
    json!({"model": "claude", "max_tokens": 10, "messages": messages}).to_string()
}

// ---------------------------------------------------------------------------
// routes: a file's come first, the built-in ones it does not override after
// ---------------------------------------------------------------------------

#[test]
fn check_config_lists_the_file_routes_then_the_built_in_ones() {
    let out = run(
        &["check-config", "--config", "examples/two-tenant.toml"],
        b"",
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let builtin = builtin_routes();
    assert!(builtin.len() >= 3, "{builtin:?}");
    assert!(
        stdout.contains(&format!("{} routes", builtin.len())),
        "the file's one route overrides a built-in one of the same path: {stdout}"
    );
    let listed: Vec<&str> = stdout.lines().filter(|l| l.starts_with("  /")).collect();
    assert_eq!(listed.len(), builtin.len(), "{stdout}");
    assert!(
        listed[0].starts_with("  /v1/chat/completions -> default (chat)"),
        "{stdout}"
    );
    for (path, policy) in &builtin {
        assert!(
            listed
                .iter()
                .any(|l| l.starts_with(&format!("  {path} -> {policy} ("))),
            "{path} missing: {stdout}"
        );
    }
}

#[tokio::test]
async fn a_file_with_one_route_still_compacts_the_other_apis() {
    let upstream = MockUpstream::start(Behavior::AnthropicMessages).await;
    let file = std::fs::read_to_string(repo("examples/two-tenant.toml")).unwrap();
    let proxy = TestProxy::start(&file, &upstream.url()).await;
    let mut request = post_json(&proxy.url("/v1/messages"), anthropic_body());
    request
        .headers_mut()
        .insert("x-tenant-id", "globex".parse().unwrap());
    let answer = send(request).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(answer.header("x-compaction-policy"), Some("small"));
}

#[tokio::test]
async fn a_file_route_with_a_built_in_path_replaces_that_route() {
    let upstream = MockUpstream::start(Behavior::AnthropicMessages).await;
    let toml = "[policies.tight]\nbudget_chars = 2000\n\n[[routes]]\npath = \"/v1/messages\"\npolicy = \"tight\"\n";
    let proxy = TestProxy::start(toml, &upstream.url()).await;
    let answer = send(post_json(&proxy.url("/v1/messages"), anthropic_body())).await;
    assert_eq!(answer.header("x-compaction-policy"), Some("tight"));
    let rt = &proxy.state.runtime();
    let paths: Vec<&str> = rt.config.routes.iter().map(|r| r.path.as_str()).collect();
    assert_eq!(paths[0], "/v1/messages");
    assert_eq!(
        paths.iter().filter(|p| **p == "/v1/messages").count(),
        1,
        "{paths:?}"
    );
}

// ---------------------------------------------------------------------------
// base URLs: the shipped routes match the forms clients are given
// ---------------------------------------------------------------------------

#[tokio::test]
async fn the_shipped_routes_match_the_common_base_url_forms() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let responses = json!({"model": "m", "input": "hi"});
    for (path, body, format) in [
        ("/v1/chat/completions", &chat, "chat"),
        ("/chat/completions", &chat, "chat"),
        ("/openai/v1/chat/completions", &chat, "chat"),
        ("/openai/deployments/gpt-4o/chat/completions", &chat, "chat"),
        ("/v1/responses", &responses, "responses"),
        ("/responses", &responses, "responses"),
        ("/openai/v1/responses", &responses, "responses"),
        ("/openai/responses", &responses, "responses"),
    ] {
        let answer = send(post_json(&proxy.url(path), body.to_string())).await;
        assert_eq!(
            answer.header("x-compaction-status"),
            Some("unchanged"),
            "{path}"
        );
        let rt = proxy.state.runtime();
        let resolved = rt.resolve(path, &http::HeaderMap::new()).unwrap();
        assert_eq!(resolved.format.as_str(), format, "{path}");
    }
}

/// Starts the binary serving on a free port with `args`; returns it, its
/// address and the file its stderr goes to.
pub(crate) async fn serve(args: &[&str]) -> (std::process::Child, String, std::path::PathBuf) {
    let addr = unused_addr().await.to_string();
    let log = temp_file("serve.log", b"");
    let child = std::process::Command::new(crate::operator::BIN)
        .arg("serve")
        .args(["--listen", &addr])
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let up = wait_until(std::time::Duration::from_secs(10), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains("listening"))
    })
    .await;
    assert!(up, "{}", std::fs::read_to_string(&log).unwrap());
    (child, addr, log)
}

#[tokio::test]
async fn an_unmatched_post_to_an_api_path_is_noted_once_at_info() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let (mut child, addr, log) = serve(&["--upstream", &upstream.url()]).await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for path in [
        "/llm/chat/completions",
        "/other/chat/completions",
        "/v1/embeddings",
    ] {
        let answer = send(post_json(&format!("http://{addr}{path}"), chat.clone())).await;
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("x-compaction-status"), None);
    }
    let noted = |log: &str| log.matches("matched no route").count();
    wait_until(std::time::Duration::from_secs(3), || {
        noted(&std::fs::read_to_string(&log).unwrap()) > 0
    })
    .await;
    // Another API's path is noted on its own.
    let _ = send(post_json(
        &format!("http://{addr}/llm/messages"),
        chat.clone(),
    ))
    .await;
    let both = wait_until(std::time::Duration::from_secs(3), || {
        noted(&std::fs::read_to_string(&log).unwrap()) == 2
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(both, "{text}");
    let line = text
        .lines()
        .find(|l| l.contains("matched no route"))
        .unwrap();
    assert!(line.contains("INFO"), "{line}");
    assert!(line.contains("/llm/chat/completions"), "{line}");
    assert!(line.contains("uncompacted"), "{line}");
}

// ---------------------------------------------------------------------------
// 405s name the method the path takes
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_405_names_the_method_its_path_allows() {
    let proxy = TestProxy::start("", "http://127.0.0.1:9").await;
    let request = |method: &str, path: &str| {
        http::Request::builder()
            .method(method)
            .uri(proxy.url(path))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from_static(b"{}")))
            .unwrap()
    };
    let answer = send(request("POST", "/v1/compaction-reports/abc")).await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.header("allow"), Some("GET"));
    let answer = send(request("GET", "/v1/memory-compact")).await;
    assert_eq!(answer.status, 405);
    assert_eq!(answer.header("allow"), Some("POST"));
}

// ---------------------------------------------------------------------------
// refusals are not skips
// ---------------------------------------------------------------------------

#[tokio::test]
async fn a_refused_request_is_marked_and_counted_as_refused_not_skipped() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[server]\nmax_body_bytes = 100\nmax_buffered_bytes = 1000",
        &upstream.url(),
    )
    .await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(500)}]});
    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.to_string(),
    ))
    .await;
    assert_eq!(answer.status, 413);
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("refused; body-too-large")
    );
    let metric = |name: &str, labels: &[&str]| crate::outages::metric(&proxy, name, labels);
    assert_eq!(
        metric(
            "compaction_proxy_refused_total",
            &["reason=\"body-too-large\""]
        ),
        1.0
    );
    assert_eq!(metric("compaction_proxy_skipped_total", &[]), 0.0);
    assert_eq!(
        metric(
            "compaction_proxy_requests_total",
            &["status=\"refused\"", "code_class=\"4xx\""]
        ),
        1.0
    );
    assert!(upstream.received().is_empty());
}

// ---------------------------------------------------------------------------
// compact --report: a line per message
// ---------------------------------------------------------------------------

#[test]
fn the_report_is_a_line_per_message_and_json_on_request() {
    let chat = std::fs::read(repo("examples/chat-body.json")).unwrap();
    let messages = serde_json::from_slice::<serde_json::Value>(&chat).unwrap()["messages"]
        .as_array()
        .unwrap()
        .len();
    let out = run(&["compact", "--policy", "default", "--report"], &chat);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    // A summary, a header, then one line per input message.
    assert_eq!(
        lines.len(),
        messages + 2,
        "{}",
        &stdout[..stdout.len().min(2000)]
    );
    assert!(
        lines[0].starts_with("policy default: compacted; "),
        "{}",
        lines[0]
    );
    for (i, line) in lines[2..].iter().enumerate() {
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some(i.to_string().as_str()), "{line}");
        let fate = words.nth(1).unwrap();
        assert!(["kept", "trimmed", "dropped"].contains(&fate), "{line}");
        assert!(line.len() < 400, "readable in a terminal: {line}");
    }
    let json = run(
        &["compact", "--policy", "default", "--report", "--json"],
        &chat,
    );
    let report: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    assert_eq!(report["messages"].as_array().unwrap().len(), messages);
}

#[test]
fn check_config_refuses_a_blank_file_as_a_reload_does() {
    let blank = temp_file("blank.toml", b"# nothing yet\n\n");
    let out = run(&["check-config", "--config", blank.to_str().unwrap()], b"");
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("sets nothing"),
        "{}",
        text(&out.stderr)
    );
}

// ---------------------------------------------------------------------------
// --listen in the forms nginx and Caddy users write
// ---------------------------------------------------------------------------

#[test]
fn listen_takes_host_names_and_a_bare_port() {
    use compaction_proxy::policy::parse_listen;
    assert_eq!(
        parse_listen("127.0.0.1:8080").unwrap().to_string(),
        "127.0.0.1:8080"
    );
    assert_eq!(parse_listen(":8080").unwrap().to_string(), "0.0.0.0:8080");
    assert!(parse_listen("localhost:8080").unwrap().ip().is_loopback());
    assert!(parse_listen(":http").is_err());
    assert!(parse_listen("8080").is_err());
}

#[test]
fn a_bad_listen_flag_is_reported_as_the_flag() {
    let out = run(&["check-config", "--listen", "nowhere:port"], b"");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("--listen (sets server.listen)"), "{stderr}");
    let out = run(&["check-config", "--listen", "localhost:8080"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(&["check-config", "--listen", ":8080"], b"");
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_bare_port_listens_everywhere_and_says_so() {
    let stderr = crate::operator::serve_until(&["--listen", ":0"], "listening on every interface");
    assert!(stderr.contains("listening on every interface"), "{stderr}");
    assert!(stderr.contains("0.0.0.0:"), "{stderr}");
}

// ---------------------------------------------------------------------------
// control headers: read by the proxy, kept from the provider
// ---------------------------------------------------------------------------

fn with_headers(
    url: &str,
    body: String,
    headers: &[(&str, &str)],
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    let mut request = post_json(url, body);
    for (name, value) in headers {
        request.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    request
}

#[tokio::test]
async fn yes_spellings_count_and_a_refused_report_says_so() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let url = proxy.url("/v1/chat/completions");
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    for yes in ["1", "yes", "TRUE", "on"] {
        let answer = send(with_headers(
            &url,
            chat.clone(),
            &[("x-compaction-bypass", yes)],
        ))
        .await;
        assert_eq!(
            answer.header("x-compaction-status"),
            Some("bypassed"),
            "{yes}"
        );
    }
    let answer = send(with_headers(
        &url,
        chat.clone(),
        &[("x-compaction-bypass", "no")],
    ))
    .await;
    assert_eq!(answer.header("x-compaction-status"), Some("unchanged"));
    // The default policy keeps no reports: the status says why none came.
    let answer = send(with_headers(&url, chat, &[("x-compaction-report", "1")])).await;
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("unchanged; report-not-allowed")
    );
    assert_eq!(answer.header("x-compaction-report-id"), None);
}

#[tokio::test]
async fn the_proxys_own_headers_do_not_reach_the_upstream() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let control = [
        ("x-tenant-id", "acme"),
        ("x-compaction-bypass", "false"),
        ("x-compaction-report", "true"),
        ("x-other", "kept"),
    ];
    let proxy = TestProxy::start("", &upstream.url()).await;
    for path in ["/v1/chat/completions", "/v1/models"] {
        send(with_headers(&proxy.url(path), chat.clone(), &control)).await;
        let got = upstream.last().headers;
        for name in ["x-tenant-id", "x-compaction-bypass", "x-compaction-report"] {
            assert!(
                got.get(name).is_none(),
                "{name} reached the upstream on {path}"
            );
        }
        assert_eq!(got["x-other"], "kept");
        assert!(got.get("authorization").is_some());
    }
    // Upstreams that read the tenant header too can be given it.
    let proxy = TestProxy::start("[tenants]\nforward_header = true", &upstream.url()).await;
    send(with_headers(
        &proxy.url("/v1/chat/completions"),
        chat,
        &control,
    ))
    .await;
    let got = upstream.last().headers;
    assert_eq!(got["x-tenant-id"], "acme");
    assert!(got.get("x-compaction-report").is_none());
}

// ---------------------------------------------------------------------------
// logs: one event a line, flat JSON, a request id, upstream failures named
// ---------------------------------------------------------------------------

#[tokio::test]
async fn json_logs_are_flat_and_carry_the_request_id_which_is_returned() {
    let closed = unused_addr().await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let config = temp_file("json.toml", b"[server]\nlog_format = \"json\"\n");
    let (mut child, addr, log) = serve(&[
        "--config",
        config.to_str().unwrap(),
        "--upstream",
        &format!("http://{closed}"),
    ])
    .await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let url = format!("http://{addr}/v1/chat/completions");
    let given = send(with_headers(
        &url,
        chat.clone(),
        &[("x-request-id", "req-given-1")],
    ))
    .await;
    assert_eq!(given.status, 502);
    assert_eq!(given.header("x-request-id"), Some("req-given-1"));
    let made = send(post_json(&url, chat)).await;
    let made_id = made
        .header("x-request-id")
        .expect("an id is made")
        .to_owned();
    assert_eq!(made_id.len(), 32, "{made_id}");
    let logged = wait_until(std::time::Duration::from_secs(5), || {
        std::fs::read_to_string(&log).unwrap().contains(&made_id)
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(logged, "{text}");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let requests: Vec<&serde_json::Value> =
        lines.iter().filter(|l| l["message"] == "request").collect();
    assert_eq!(requests.len(), 2, "{text}");
    assert_eq!(requests[0]["request_id"], "req-given-1");
    assert_eq!(requests[1]["request_id"], made_id.as_str());
    for line in &requests {
        assert!(line.get("fields").is_none(), "flat: {line}");
        // A closed port is the upstream's failure, as the docs list it.
        assert_eq!(line["ending"], "upstream-failed", "{line}");
        assert_eq!(line["level"], "ERROR");
    }
    drop(upstream);
}

#[tokio::test]
async fn text_logs_quote_every_string_and_keep_an_event_on_one_line() {
    let upstream = MockUpstream::start(Behavior::Stall).await;
    let config = temp_file(
        "slow.toml",
        b"[upstream]\nresponse_header_timeout_secs = 1\n",
    );
    let (mut child, addr, log) = serve(&[
        "--config",
        config.to_str().unwrap(),
        "--upstream",
        &upstream.url(),
    ])
    .await;
    let chat = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let answer = send(post_json(
        &format!("http://{addr}/v1/chat/completions"),
        chat,
    ))
    .await;
    assert_eq!(answer.status, 504);
    assert!(answer.json()["error"]["message"]
        .as_str()
        .unwrap()
        .ends_with("within 1 second"));
    // A refused reload: the problems on the one line of its event.
    std::fs::write(
        &config,
        "[policies.default]\nbudget_chars = 0\nkeep_lst_n = 1\n",
    )
    .unwrap();
    let refused = wait_until(std::time::Duration::from_secs(8), || {
        std::fs::read_to_string(&log)
            .unwrap()
            .contains("reload refused")
    })
    .await;
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(refused, "{text}");
    for line in text.lines() {
        assert!(
            line.contains(" INFO ") || line.contains(" WARN ") || line.contains(" ERROR "),
            "every line is an event of its own: {line:?}\n{text}"
        );
    }
    let request = text.lines().find(|l| l.contains("request")).unwrap();
    for part in [
        "method=\"POST\"",
        "path=\"/v1/chat/completions\"",
        "route=\"/v1/chat/completions\"",
        "tenant=\"other\"",
        "ending=\"upstream-failed\"",
        "request_id=\"",
    ] {
        assert!(request.contains(part), "{part} missing: {request}");
    }
    let reload = text.lines().find(|l| l.contains("reload refused")).unwrap();
    assert!(
        reload.contains("budget_chars") && reload.contains("keep_lst_n"),
        "{reload}"
    );
}

// ---------------------------------------------------------------------------
// compact: the format from the body's shape
// ---------------------------------------------------------------------------

#[test]
fn compact_tells_the_format_from_the_body() {
    use compaction_proxy::cli::detect_format;
    use compaction_proxy::format::Format;
    let detect = |v: serde_json::Value| detect_format(&v);
    assert_eq!(detect(json!({"budget_chars": 10, "messages": []})), None);
    assert_eq!(
        detect(json!({"model": "m", "input": "hi"})),
        Some(Format::Responses)
    );
    assert_eq!(
        detect(
            json!({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]})
        ),
        Some(Format::Chat)
    );
    assert_eq!(
        detect(
            json!({"system": "s", "max_tokens": 5, "messages": [{"role": "user", "content": "u"}]})
        ),
        Some(Format::Anthropic)
    );
    assert_eq!(
        detect(
            json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "x"}]}]})
        ),
        Some(Format::Anthropic)
    );

    // A Responses body through the binary, no --format: compacted, not
    // read as a memory-compact request.
    let mut input = Vec::new();
    for i in 0..60 {
        input.push(
            json!({"role": "user", "content": format!("turn {i}: {}", "words ".repeat(400))}),
        );
        input.push(
            json!({"role": "assistant", "content": format!("reply {i}: {}", "more ".repeat(400))}),
        );
    }
    let body = json!({"model": "m", "input": input}).to_string();
    let out = run(&["compact", "--policy", "default"], body.as_bytes());
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("format: responses"), "{stderr}");
    let forwarded: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        forwarded["input"].as_array().unwrap().len() < 120,
        "{stderr}"
    );
}

// ---------------------------------------------------------------------------
// CLI habits
// ---------------------------------------------------------------------------

#[test]
fn help_names_all_three_apis_and_only_the_flags_a_command_reads() {
    let top = text(&run(&["--help"], b"").stdout);
    for api in [
        "OpenAI chat completions",
        "Anthropic Messages",
        "OpenAI Responses",
    ] {
        assert!(top.contains(api), "{api}: {top}");
    }
    let compact = text(&run(&["compact", "--help"], b"").stdout);
    assert!(
        compact.contains("--policy") && compact.contains("--config"),
        "{compact}"
    );
    assert!(
        !compact.contains("--listen") && !compact.contains("--upstream"),
        "{compact}"
    );
    let check = text(&run(&["check-config", "--help"], b"").stdout);
    assert!(
        check.contains("--upstream") && check.contains("--config"),
        "{check}"
    );
    assert!(
        !check.contains("--report") && !check.contains("--policy"),
        "{check}"
    );
}

#[test]
fn c_is_short_for_config() {
    let bad = temp_file("bad.toml", b"[policies.default]\nbudget_chars = 0\n");
    let out = run(&["check-config", "-c", bad.to_str().unwrap()], b"");
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains("policies.default.budget_chars"));
}

#[test]
fn an_unknown_policy_lists_the_ones_there_are() {
    let out = run(
        &[
            "compact",
            "-c",
            "examples/two-tenant.toml",
            "--policy",
            "nosuch",
        ],
        &std::fs::read(repo("examples/chat-body.json")).unwrap(),
    );
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(stderr.contains("no policy named \"nosuch\""), "{stderr}");
    assert!(stderr.contains("default, small"), "{stderr}");
}

#[test]
fn a_misspelled_variable_is_reported_as_the_variable() {
    let out = std::process::Command::new(crate::operator::BIN)
        .args(["check-config"])
        .env("COMPACTION_PROXY_SERVER__LISTN", "127.0.0.1:1")
        .current_dir(repo(""))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("COMPACTION_PROXY_SERVER__LISTN (sets server.listn): unknown key; did you mean `listen`?"),
        "{stderr}"
    );
}

#[test]
fn a_bind_failure_is_said_once() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    // The bind fails, so serve exits: all it printed is there.
    let out = run(&["serve", "--listen", &addr], b"");
    assert!(!out.status.success());
    let stderr = text(&out.stderr);
    assert_eq!(stderr.matches("cannot listen").count(), 1, "{stderr}");
    assert!(
        stderr.contains(&format!("cannot listen on {addr}")),
        "{stderr}"
    );
}

#[test]
fn the_release_profile_ships_no_debug_info() {
    let cargo = std::fs::read_to_string(repo("Cargo.toml")).unwrap();
    let release = &cargo[cargo.find("[profile.release]").unwrap()..];
    let release = &release[..release[1..].find("\n[").map_or(release.len(), |i| i + 1)];
    assert!(release.contains("strip = \"debuginfo\""), "{release}");
    assert!(release.contains("debug = false"), "{release}");
}
