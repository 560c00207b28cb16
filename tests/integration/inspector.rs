//! The inspector (`/inspector`): off by default, a list of every request
//! of a policy with `allow_report`, a side-by-side view that agrees with
//! the per-message report and with what the upstream received, its bearer
//! token, its security headers; and the page itself in Debian's Chromium
//! (`inspector_page_in_chromium`), driven by tests/inspector/drive.mjs.

use std::time::Duration;

use bytes::Bytes;
use compaction_proxy::config::{self, Overrides};
use compaction_proxy::policy::Runtime;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};

use crate::support::*;

const TOKEN: &str = "insp-7f3a9c2e-test-token";
const SECRET: &str = "sk-test-secret-0123456789";

/// Two policies: `reported` keeps reports (on the chat route and for
/// the tenants acme and globex), `default` does not (on /v1/messages).
const CONFIG: &str = r#"
[inspector]
enabled = true

[policies.reported]
mode = "exact"          # every stage of the engine shows, dedupe included
budget_chars = 1500
keep_last_n = 2
max_message_chars = 500
allow_report = true

[policies.recalled]      # the reported policy with recall's markers
mode = "exact"
budget_chars = 1500
keep_last_n = 2
max_message_chars = 500
allow_report = true
recall = true

[policies.default]
allow_report = false

[[routes]]
path = "/v1/chat/completions"
policy = "reported"

[[routes]]
path = "/v1/messages"
policy = "default"

[tenants.policies]
acme = "reported"
globex = "reported"
initech = "recalled"
"#;

/// [`CONFIG`] with the token read from a variable only this test has.
fn runtime_with_token(toml: &str, upstream: &str) -> Runtime {
    let toml = toml.replace(
        "[inspector]\nenabled = true\n",
        "[inspector]\nenabled = true\ntoken_env = \"INSPECTOR_TEST_TOKEN\"\n",
    );
    let path = temp_file("config.toml", toml.as_bytes());
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        upstream: Some(upstream.into()),
    };
    let config = config::load(Some(&path), Vec::new(), &overrides).expect("test config loads");
    Runtime::with_env(config, &|name| {
        (name == "INSPECTOR_TEST_TOKEN").then(|| TOKEN.to_owned())
    })
    .expect("test config is valid")
}

/// A history long enough to be compacted: old steps that go, a
/// duplicate, a long message that is trimmed, and the given messages last.
fn history(last: &[(&str, &str)]) -> Value {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a careful coding assistant."}),
        json!({"role": "user", "content": "Port the billing module to the new ledger API."}),
    ];
    for i in 0..6 {
        let step = "looked at files, nothing notable. ".repeat(6);
        messages.push(json!({"role": "assistant", "content": format!("Older step {i}: {step}")}));
    }
    let ask = "run the tests again please and show me the failures";
    messages.push(json!({"role": "user", "content": ask}));
    messages.push(json!({"role": "user", "content": ask}));
    let parts = [
        "fees", "refunds", "invoices", "credits", "taxes", "payouts", "disputes", "rates",
    ];
    let long: Vec<String> = parts
        .iter()
        .enumerate()
        .map(|(i, n)| format!("Part {i}: billing/{n}.py calls ledger.post_{n}() with cents; the new API wants a Decimal amount and an idempotency key."))
        .collect();
    messages.push(json!({"role": "assistant", "content": long.join(" ")}));
    for (role, text) in last {
        messages.push(json!({"role": role, "content": text}));
    }
    json!({"model": "gpt-4o", "messages": messages})
}

fn post(url: &str, body: &Value, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    let mut request = Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {SECRET}"))
        .header("api-key", SECRET)
        .header("cookie", format!("session={SECRET}"));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request
        .body(Full::new(Bytes::from(serde_json::to_vec(body).unwrap())))
        .unwrap()
}

fn get(url: &str, token: Option<&str>) -> Request<Full<Bytes>> {
    let mut request = Request::get(url);
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request.body(Full::new(Bytes::new())).unwrap()
}

/// The inspector's list, once every request in it has its view.
async fn settled_list(proxy: &TestProxy, token: Option<&str>, expected: usize) -> Value {
    let url = proxy.url("/inspector/api/requests");
    let mut list = Value::Null;
    for _ in 0..200 {
        list = send(get(&url, token)).await.json();
        let requests = list["requests"].as_array().unwrap();
        if requests.len() >= expected
            && requests
                .iter()
                .all(|r| r["pending"] == false && r["http_status"].is_u64())
        {
            return list;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the inspector did not settle: {list:#}");
}

#[tokio::test]
async fn the_inspector_is_not_found_while_off_and_never_forwarded() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy =
        TestProxy::start("[policies.default]\nallow_report = true\n", &upstream.url()).await;
    for path in [
        "/inspector",
        "/inspector/",
        "/inspector/api/requests",
        "/inspector/inspector.js",
    ] {
        let answer = send(get(&proxy.url(path), None)).await;
        assert_eq!(answer.status, 404, "{path}");
        assert!(answer.header("content-security-policy").is_some());
    }
    // A request is proxied, and nothing is kept for an inspector that is off.
    send(post(&proxy.url("/v1/chat/completions"), &history(&[]), &[])).await;
    assert_eq!(
        upstream.received().len(),
        1,
        "only the chat request went upstream"
    );
    assert_eq!(proxy.state.inspector.size().0, 0);
}

#[tokio::test]
async fn it_lists_every_request_of_a_reporting_policy_newest_first() {
    let upstream = MockUpstream::start(Behavior::OpenAiChat).await;
    let proxy = TestProxy::start(CONFIG, &upstream.url()).await;
    let chat = proxy.url("/v1/chat/completions");
    let first = send(post(
        &chat,
        &history(&[("user", "what failed?")]),
        &[("x-tenant-id", "acme")],
    ))
    .await;
    assert_eq!(first.header("x-compaction-status"), Some("compacted"));
    assert_eq!(
        first.header("x-compaction-report-id"),
        None,
        "no report id when the request did not ask for one"
    );
    let small = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]});
    send(post(&chat, &small, &[("x-tenant-id", "globex")])).await;
    // A policy without allow_report is not kept.
    let messages = json!({"model": "claude", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]});
    send(post(&proxy.url("/v1/messages"), &messages, &[])).await;

    let list = settled_list(&proxy, None, 2).await;
    let requests = list["requests"].as_array().unwrap();
    assert_eq!(requests.len(), 2, "{list:#}");
    let (newest, oldest) = (&requests[0], &requests[1]);
    assert_eq!(newest["tenant"], "globex");
    assert_eq!(newest["status"], "unchanged");
    assert_eq!(oldest["tenant"], "acme");
    assert_eq!(oldest["policy"], "reported");
    assert_eq!(oldest["route"], "/v1/chat/completions");
    assert_eq!(oldest["status"], "compacted");
    assert_eq!(oldest["http_status"], 200);
    assert!(oldest["time_ms"].as_u64().unwrap() <= newest["time_ms"].as_u64().unwrap());
    let loss = &oldest["loss"];
    assert!(loss["output_chars"].as_u64() < loss["input_chars"].as_u64());
    // The mock's answer bills one input and one output token; no price is
    // configured, so no cost.
    assert_eq!(oldest["usage"]["uncached_input_tokens"], 1, "{oldest}");
    assert_eq!(oldest["usage"]["output_tokens"], 1, "{oldest}");
    assert_eq!(oldest["usage"]["cost"], Value::Null, "{oldest}");
    assert_eq!(oldest["estimated_saving"], Value::Null);
    assert_eq!(list["tenants"], json!(["acme", "globex"]));
    assert_eq!(list["policies"], json!(["reported"]));

    // Filters.
    let filtered = |query: &'static str| {
        let url = proxy.url(&format!("/inspector/api/requests?{query}"));
        async move {
            let list = send(get(&url, None)).await.json();
            list["requests"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["tenant"].as_str().unwrap().to_owned())
                .collect::<Vec<_>>()
        }
    };
    assert_eq!(filtered("tenant=acme").await, ["acme"]);
    assert_eq!(filtered("status=unchanged").await, ["globex"]);
    assert_eq!(
        filtered("status=compacted&tenant=globex").await,
        Vec::<String>::new()
    );
    assert_eq!(filtered("policy=reported&limit=1").await, ["globex"]);
    assert_eq!(filtered("policy=default").await, Vec::<String>::new());
}

#[tokio::test]
async fn the_view_agrees_with_the_report_and_with_what_the_upstream_got() {
    let upstream = MockUpstream::start(Behavior::OpenAiChat).await;
    let proxy = TestProxy::start(CONFIG, &upstream.url()).await;
    let answer = send(post(
        &proxy.url("/v1/chat/completions"),
        &history(&[("assistant", "Two tests fail."), ("user", "fix them")]),
        &[("x-compaction-report", "true")],
    ))
    .await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let id = answer
        .header("x-compaction-report-id")
        .expect("asked for")
        .to_owned();
    settled_list(&proxy, None, 1).await;
    let report = send(get(
        &proxy.url(&format!("/v1/compaction-reports/{id}")),
        None,
    ))
    .await
    .json();
    let one = send(get(
        &proxy.url(&format!("/inspector/api/requests/{id}")),
        None,
    ))
    .await;
    assert_eq!(one.status, 200);
    let one = one.json();
    assert_eq!(
        one["request"]["id"],
        id.as_str(),
        "the inspector keeps it under the report's id"
    );
    let rows = one["view"]["rows"].as_array().unwrap();
    let lines = report["messages"].as_array().unwrap();
    assert_eq!(rows.len(), lines.len());
    let mut marks = std::collections::BTreeMap::new();
    for (row, line) in rows.iter().zip(lines) {
        assert_eq!(row["index"], line["index"]);
        assert_eq!(row["fate"], line["fate"], "{row:#}");
        assert_eq!(row["stage"], line["stage"]);
        let expected = match (line["fate"].as_str().unwrap(), line["stage"].as_str()) {
            ("dropped", Some("dedupe")) => "deduplicated",
            ("dropped", _) => "dropped",
            ("trimmed", _) => "trimmed",
            _ => "kept",
        };
        assert_eq!(row["mark"], expected, "{row:#}");
        assert_eq!(
            row["forwarded"].is_null(),
            expected == "dropped" || expected == "deduplicated"
        );
        *marks.entry(expected).or_insert(0) += 1;
    }
    for mark in ["kept", "trimmed", "deduplicated", "dropped"] {
        assert!(
            marks.contains_key(mark),
            "the fixture has a {mark} message: {marks:?}"
        );
    }
    // The right side is what the upstream received, message for message.
    let received = upstream.last().json();
    let sent: Vec<&Value> = received["messages"].as_array().unwrap().iter().collect();
    let forwarded: Vec<&Value> = rows.iter().filter_map(|r| r.get("forwarded")).collect();
    assert_eq!(forwarded.len(), sent.len());
    for (shown, sent) in forwarded.iter().zip(sent) {
        assert_eq!(shown["text"], sent["content"]);
        assert_eq!(shown["role"], sent["role"]);
    }
    // The left side is what the client sent.
    let original: Vec<&Value> = rows.iter().map(|r| &r["original"]["text"]).collect();
    assert_eq!(
        original[1],
        "Port the billing module to the new ledger API."
    );
    let trimmed = rows.iter().find(|r| r["mark"] == "trimmed").unwrap();
    let (full, cut) = (
        trimmed["original"]["text"].as_str().unwrap(),
        trimmed["forwarded"]["text"].as_str().unwrap(),
    );
    assert!(
        cut.len() < full.len() && full.starts_with(cut.trim_end()),
        "{cut}"
    );
}

#[tokio::test]
async fn the_token_is_enforced_on_the_data_and_credentials_never_show() {
    let upstream = MockUpstream::start(Behavior::OpenAiChat).await;
    let proxy = TestProxy::from_runtime(runtime_with_token(CONFIG, &upstream.url())).await;
    send(post(
        &proxy.url("/v1/chat/completions"),
        &history(&[("user", "go")]),
        &[],
    ))
    .await;
    let list_url = proxy.url("/inspector/api/requests");
    for token in [None, Some("wrong"), Some(&TOKEN[..TOKEN.len() - 1])] {
        let answer = send(get(&list_url, token)).await;
        assert_eq!(answer.status, 401, "{token:?}");
        assert_eq!(
            answer.header("www-authenticate"),
            Some("Bearer realm=\"inspector\"")
        );
        assert!(!String::from_utf8_lossy(&answer.body).contains("billing"));
    }
    let list = settled_list(&proxy, Some(TOKEN), 1).await;
    let id = list["requests"][0]["id"].as_str().unwrap().to_owned();
    let detail_url = proxy.url(&format!("/inspector/api/requests/{id}"));
    assert_eq!(send(get(&detail_url, None)).await.status, 401);
    let detail = send(get(&detail_url, Some(TOKEN))).await;
    assert_eq!(detail.status, 200);
    // No credential of the request is kept: not in the list, not in the view.
    for body in [
        serde_json::to_string(&list).unwrap(),
        String::from_utf8_lossy(&detail.body).into_owned(),
    ] {
        assert!(body.contains("billing") || body.contains("requests"));
        assert!(!body.contains(SECRET), "a credential leaked: {body}");
        assert!(!body.to_ascii_lowercase().contains("authorization"));
    }
    // The page and its assets hold no data: served without the token, locked down.
    for (path, content_type) in [
        ("/inspector", "text/html; charset=utf-8"),
        ("/inspector/inspector.js", "text/javascript; charset=utf-8"),
        ("/inspector/inspector.css", "text/css; charset=utf-8"),
    ] {
        let answer = send(get(&proxy.url(path), None)).await;
        assert_eq!(answer.status, 200, "{path}");
        assert_eq!(answer.header("content-type"), Some(content_type));
        let csp = answer.header("content-security-policy").unwrap();
        assert!(csp.starts_with("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'"), "{csp}");
        assert_eq!(answer.header("x-content-type-options"), Some("nosniff"));
        assert_eq!(answer.header("referrer-policy"), Some("no-referrer"));
        assert_eq!(answer.header("cache-control"), Some("no-store"));
    }
    let api = send(get(&list_url, Some(TOKEN))).await;
    assert!(api.header("content-security-policy").is_some());
    assert_eq!(api.header("cache-control"), Some("no-store"));
    assert_eq!(
        send(
            Request::post(&list_url)
                .header("authorization", format!("Bearer {TOKEN}"))
                .body(Full::new(Bytes::new()))
                .unwrap()
        )
        .await
        .status,
        405
    );
}

#[test]
fn check_config_refuses_a_token_variable_that_is_unset_or_empty() {
    let config = temp_file(
        "inspector.toml",
        b"[inspector]\nenabled = true\ntoken_env = \"INSPECTOR_TOKEN_FOR_CHECK\"\n",
    );
    let check = |value: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_compaction-proxy"));
        command.args(["check-config", "--config", config.to_str().unwrap()]);
        command.env_remove("INSPECTOR_TOKEN_FOR_CHECK");
        if let Some(value) = value {
            command.env("INSPECTOR_TOKEN_FOR_CHECK", value);
        }
        command.output().unwrap()
    };
    for value in [None, Some(""), Some("   ")] {
        let out = check(value);
        assert!(!out.status.success(), "{value:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("inspector.token_env"), "{stderr}");
        assert!(stderr.contains("INSPECTOR_TOKEN_FOR_CHECK"), "{stderr}");
    }
    let out = check(Some("a-token"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("a-token"));
}

// ---------------------------------------------------------------------------
// The page in a real browser
// ---------------------------------------------------------------------------

const DRIVER_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/inspector");
const CHROMIUM: &str = "/usr/bin/chromium";

/// Chromium and the driver's node modules, or a visible skip (a failure
/// when `REQUIRE_CHROMIUM` is set, as CI sets it).
fn browser_available() -> bool {
    let chromium = std::path::Path::new(CHROMIUM).exists();
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    let modules = std::path::Path::new(DRIVER_DIR)
        .join("node_modules/playwright-core")
        .exists();
    let found = chromium && node && modules;
    if !found {
        assert!(
            std::env::var_os("REQUIRE_CHROMIUM").is_none(),
            "chromium ({chromium}), node ({node}) and tests/inspector's node modules ({modules}) are required here (see .ci/run)"
        );
        eprintln!("skipped: the inspector's browser test needs {CHROMIUM}, node and `npm ci` in tests/inspector (see .ci/run)");
    }
    found
}

#[tokio::test]
async fn inspector_page_in_chromium() {
    if !browser_available() {
        return;
    }
    let upstream = MockUpstream::start(Behavior::OpenAiChat).await;
    let proxy = TestProxy::from_runtime(runtime_with_token(CONFIG, &upstream.url())).await;
    let chat = proxy.url("/v1/chat/completions");
    let report = [("x-compaction-report", "true")];
    // Requests for the list; the second is the one the page is checked on.
    let small = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "What does the ledger API return on a conflict?"}]});
    send(post(&chat, &small, &[("x-tenant-id", "globex")])).await;
    let main = send(post(
        &chat,
        &history(&[
            (
                "assistant",
                "Two tests fail: test_refund_rounding and test_ledger_conflict.",
            ),
            (
                "user",
                "Fix the rounding first, then the conflict handling.",
            ),
        ]),
        &[report[0], ("x-tenant-id", "acme")],
    ))
    .await;
    // A request of the recall policy: its markers, and what the model
    // recalled (set below, as the recall step sets it when it answers).
    let recall = send(post(
        &chat,
        &history(&[("user", "What did the old steps find?")]),
        &[report[0], ("x-tenant-id", "initech")],
    ))
    .await;
    let hostile = send(post(
        &chat,
        &history(&[
            ("assistant", "<script>window.__pwned=1</script>"),
            (
                "user",
                "<img src=x onerror=\"window.__pwned=1\"> and <b>bold</b>",
            ),
        ]),
        &[report[0]],
    ))
    .await;
    let main_id = main.header("x-compaction-report-id").unwrap().to_owned();
    let hostile_id = hostile.header("x-compaction-report-id").unwrap().to_owned();
    let recall_id = recall.header("x-compaction-report-id").unwrap().to_owned();
    settled_list(&proxy, Some(TOKEN), 4).await;
    // The model recalls the first dropped run (what the recall step keeps
    // once it has answered; recall::the_report_lists_the_marker_messages_…
    // drives the real step).
    let recall_report = send(get(
        &proxy.url(&format!("/v1/compaction-reports/{recall_id}")),
        None,
    ))
    .await
    .json();
    let run_id = recall_report["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["stage"] == "marker")
        .and_then(|l| l["recall_id"].as_str())
        .expect("the recall request has a marker message")
        .to_owned();
    let done = compaction_proxy::compaction::recall::Recalled {
        rounds: 1,
        recalled_ids: vec![run_id.clone()],
        refused_ids: 0,
    };
    proxy.state.recalled.insert(recall_id.clone(), done.clone());
    proxy.state.inspector.set_recall(&recall_id, done);
    // What the usage reader fills in once a response's usage is read: the
    // page shows it (these figures are the page's input, not the proxy's).
    proxy.state.inspector.set_usage(
        &main_id,
        compaction_proxy::inspector::BilledUsage {
            uncached_input_tokens: Some(1210),
            cache_read_input_tokens: Some(3400),
            cache_write_input_tokens: Some(0),
            output_tokens: Some(96),
            cost: None,
        },
    );
    proxy.state.inspector.set_saving(
        &main_id,
        compaction_proxy::inspector::EstimatedSaving {
            input_tokens: Some(1150),
            cost: None,
        },
    );

    let screenshot = std::env::var("INSPECTOR_SCREENSHOT").unwrap_or_else(|_| {
        std::env::temp_dir()
            .join(format!("inspector-{}.png", std::process::id()))
            .to_string_lossy()
            .into_owned()
    });
    let args = json!({
        "base": proxy.url(""),
        "token": TOKEN,
        "chromium": CHROMIUM,
        "main_id": main_id,
        "hostile_id": hostile_id,
        "recall_id": recall_id,
        "screenshot": screenshot,
        "live_body": small,
    });
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("node")
            .arg(format!("{DRIVER_DIR}/drive.mjs"))
            .arg(args.to_string())
            .current_dir(DRIVER_DIR)
            .output()
            .expect("node runs")
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the browser test failed:\n{stdout}\n{stderr}"
    );
    let seen: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .expect("the driver prints JSON last");
    // What the page showed, checked here against the proxy's own report.
    let report = send(get(
        &proxy.url(&format!("/v1/compaction-reports/{main_id}")),
        None,
    ))
    .await
    .json();
    let lines = report["messages"].as_array().unwrap();
    let page_rows = seen["main_rows"].as_array().unwrap();
    assert_eq!(page_rows.len(), lines.len(), "one row per message");
    for (row, line) in page_rows.iter().zip(lines) {
        assert_eq!(row["index"], line["index"].to_string().as_str());
        assert_eq!(row["fate"], line["fate"], "{row} vs {line}");
    }
    // The recall request: every marker line is a marker row with its id,
    // every recalled line a recalled row, and no other row says either.
    let recall_json = send(get(
        &proxy.url(&format!("/v1/compaction-reports/{recall_id}")),
        None,
    ))
    .await
    .json();
    let recall_lines = recall_json["messages"].as_array().unwrap();
    let recall_rows = seen["recall_rows"].as_array().unwrap();
    assert_eq!(recall_rows.len(), recall_lines.len(), "one row per line");
    let (mut markers, mut recalled) = (0, 0);
    for (row, line) in recall_rows.iter().zip(recall_lines) {
        assert_eq!(row["fate"], line["fate"], "{row} vs {line}");
        assert_eq!(row["recall_id"], line["recall_id"], "{row} vs {line}");
        if line["stage"] == "marker" {
            markers += 1;
            assert_eq!(row["mark"], "marker", "{row} vs {line}");
            assert_eq!(row["index"], Value::Null, "{row}");
        } else {
            assert_eq!(row["index"], line["index"].to_string().as_str());
            assert_eq!(
                row["mark"] == "recalled",
                line["recalled"] == true,
                "{row} vs {line}"
            );
        }
        if line["recalled"] == true {
            recalled += 1;
            assert_eq!(row["recalled"], true, "{row}");
            assert_eq!(line["recall_id"], run_id.as_str());
        } else {
            assert_eq!(row["recalled"], false, "{row}");
        }
    }
    assert!(
        markers > 0 && recalled > 1,
        "{markers} markers, {recalled} recalled"
    );
    assert_eq!(recall_json["recall"]["recalled_ids"], json!([run_id]));
    let marked = |mark: &str| page_rows.iter().filter(|r| r["mark"] == mark).count();
    let fated = |fate: &str| lines.iter().filter(|l| l["fate"] == fate).count();
    assert_eq!(marked("dropped") + marked("deduplicated"), fated("dropped"));
    assert_eq!(marked("trimmed"), fated("trimmed"));
    assert!(
        fated("dropped") > 0 && fated("trimmed") > 0,
        "the fixture drops and trims"
    );
    assert!(std::path::Path::new(&screenshot).exists());
}

#[tokio::test]
async fn the_list_shows_the_usage_the_provider_billed() {
    // The upstream bills 1,000 input tokens, 600 of them from its cache.
    let upstream = MockUpstream::start(Behavior::Json(
        200,
        json!({"id": "c", "object": "chat.completion", "model": "gpt-4o",
               "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": 1000, "completion_tokens": 20, "total_tokens": 1020,
                         "prompt_tokens_details": {"cached_tokens": 600}}}),
    ))
    .await;
    let proxy = TestProxy::start(
        "[inspector]\nenabled = true\n[policies.default]\nallow_report = true\n\
         [prices.\"gpt-4o\"]\nuncached = 2.5\ncache_read = 1.25\noutput = 10\n",
        &upstream.url(),
    )
    .await;
    let answer = send(post(&proxy.url("/v1/chat/completions"), &history(&[]), &[])).await;
    assert_eq!(answer.status, 200);
    let mut usage = Value::Null;
    for _ in 0..200 {
        let list = settled_list(&proxy, None, 1).await;
        usage = list["requests"][0]["usage"].clone();
        if !usage.is_null() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(usage["uncached_input_tokens"], 400, "{usage}");
    assert_eq!(usage["cache_read_input_tokens"], 600, "{usage}");
    assert_eq!(usage["output_tokens"], 20, "{usage}");
    // 400 at 2.5, 600 at 1.25 and 20 at 10 per million tokens.
    let cost = usage["cost"].as_f64().unwrap();
    assert!((cost - 0.00195).abs() < 1e-9, "{cost}");
}
