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
        messages.push(json!({"role": "user", "content": format!("question {i}: {}", "words ".repeat(60))}));
        messages.push(json!({"role": "assistant", "content": format!("answer {i}: {}", "more ".repeat(60))}));
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
    let listed: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("  /"))
        .collect();
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
