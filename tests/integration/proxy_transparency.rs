//! Transparency: what reaches the upstream is the client's request with only
//! `messages` compacted, and every answer to a matched route carries the loss
//! report of INTERFACE.md.

use std::collections::BTreeMap;
use std::io::Write;

use crate::support::*;
use bytes::Bytes;
use compaction_proxy::engine::{self, Message, Policy, Report, Role};
use http::Request;
use http_body_util::Full;
use serde_json::value::RawValue;
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

/// A policy section with every knob spelled out, and the same policy as the
/// engine takes it (so expectations come from the engine, not the proxy).
fn policy_toml(name: &str, budget: usize, keep_last_n: usize, max_message_chars: usize) -> String {
    format!(
        "[policies.{name}]\nbudget_chars = {budget}\nkeep_last_n = {keep_last_n}\nkeep_roles = [\"system\"]\n\
         duplicate_threshold = 0.9\nmax_message_chars = {max_message_chars}\npin_first_user = false\n\
         pin_patterns = []\nallow_bypass = false\ndry_run = false\n{ENGINE_ONLY}"
    )
}

fn engine_policy(budget: usize, keep_last_n: usize, max_message_chars: usize) -> Policy {
    Policy {
        budget_chars: budget,
        keep_last_n,
        keep_roles: vec![Role::System],
        duplicate_threshold: 0.9,
        max_message_chars,
        scoring: compaction_proxy::engine::ScoringMethod::Seed,
    }
}

/// A plain-text conversation long enough to need trims and drops: several
/// sentences per message, non-ASCII text, escapes, and a duplicate.
fn conversation() -> Vec<(Role, String)> {
    let long = |topic: &str, n: usize| -> String {
        (0..n)
            .map(|i| format!("Step {i} of the {topic} — naïve café check, \"quoted\" part.\n"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    vec![
        (
            Role::System,
            "You are terse. Answer in one line.".to_owned(),
        ),
        (
            Role::User,
            format!("Fix the payment retry. {}", long("payment retry", 4)),
        ),
        (Role::Assistant, long("investigation", 5)),
        (
            Role::User,
            "Also check the flaky ledger test please.".to_owned(),
        ),
        (Role::Assistant, long("ledger test", 3)),
        (
            Role::User,
            "Also check the flaky ledger test please.".to_owned(),
        ),
        (Role::Assistant, format!("Résumé: {}", long("summary", 4))),
        (Role::User, long("deployment notes", 3)),
        (
            Role::Assistant,
            "Done. The retry now backs off exponentially.".to_owned(),
        ),
        (Role::User, "Great, what is left to do?".to_owned()),
    ]
}

fn wire_messages(conversation: &[(Role, String)]) -> Value {
    Value::Array(
        conversation
            .iter()
            .map(|(role, content)| json!({"role": role.as_str(), "content": content}))
            .collect(),
    )
}

fn engine_report(conversation: &[(Role, String)], policy: &Policy) -> Report {
    let messages: Vec<Message> = conversation
        .iter()
        .map(|(r, c)| Message::new(*r, c.clone()))
        .collect();
    engine::compact(&messages, policy)
}

fn survivors(report: &Report) -> Value {
    Value::Array(
        report
            .messages
            .iter()
            .map(|m| json!({"role": m.role.as_str(), "content": m.content}))
            .collect(),
    )
}

/// Splits a JSON object body around its `messages` value: the bytes before,
/// the raw array, and the bytes after.
fn split_messages(body: &[u8]) -> (&str, &str, &str) {
    let text = std::str::from_utf8(body).expect("UTF-8 body");
    let fields: BTreeMap<String, &RawValue> = serde_json::from_str(text).expect("JSON object");
    let raw = fields["messages"].get();
    let start = raw.as_ptr() as usize - text.as_ptr() as usize;
    let end = start + raw.len();
    (&text[..start], raw, &text[end..])
}

fn raw_items(array: &str) -> Vec<&str> {
    serde_json::from_str::<Vec<&RawValue>>(array)
        .unwrap()
        .into_iter()
        .map(|r| r.get())
        .collect()
}

fn chars(s: &str) -> usize {
    s.chars().count()
}

fn header_num(answer: &Answer, name: &str) -> f64 {
    answer
        .header(name)
        .unwrap_or_else(|| panic!("{name} present"))
        .parse()
        .unwrap_or_else(|_| panic!("{name} is a number"))
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

async fn ok_upstream() -> MockUpstream {
    MockUpstream::start(Behavior::Json(
        200,
        json!({"id": "chatcmpl-1", "object": "chat.completion"}),
    ))
    .await
}

#[tokio::test]
async fn forwarded_messages_are_the_engine_survivors() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 400, 2, 90), &upstream.url()).await;
    let conversation = conversation();
    let expected = engine_report(&conversation, &engine_policy(400, 2, 90));
    assert!(
        expected.loss.dropped_messages > 0,
        "the case drops something"
    );
    assert!(
        expected.loss.trimmed_messages > 0,
        "the case trims something"
    );
    assert!(
        expected.stages.dedupe.removed_messages > 0,
        "the case dedupes something"
    );

    let body = json!({"model": "gpt-4o", "messages": wire_messages(&conversation)});
    let answer = send(post_json(&proxy.url(CHAT), body.to_string())).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(upstream.last().json()["messages"], survivors(&expected));
}

#[tokio::test]
async fn every_other_top_level_field_keeps_its_bytes() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 400, 2, 90), &upstream.url()).await;
    let messages = wire_messages(&conversation()).to_string();
    let body = format!(
        "{{ \"temperature\":1.50,\n\t\"model\" :  \"gpt-4o\" , \"max_tokens\": 1e3,\"top_p\":0.10,\
         \"stop\" : [ \"\\n\\n\" , \"caf\\u00e9\" ],\n  \"messages\" :{messages} ,\"logit_bias\":{{\"50256\" : -100.0}},\
         \"n\":  2 ,\"user\":\"u\\/1\",  \"stream\":false }}\n"
    );
    let answer = send(post_json(&proxy.url(CHAT), body.clone())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));

    let received = upstream.last();
    let (sent_before, sent_messages, sent_after) = split_messages(body.as_bytes());
    let (got_before, got_messages, got_after) = split_messages(&received.body);
    assert_eq!(got_before, sent_before, "bytes before messages");
    assert_eq!(got_after, sent_after, "bytes after messages");
    assert_ne!(got_messages, sent_messages, "messages were compacted");
}

#[tokio::test]
async fn body_within_budget_is_forwarded_byte_for_byte() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let body = "{\"model\":\"gpt-4o\",   \"messages\":[ {\"role\":\"user\" ,\"content\":\"h\\u00e9llo\"} ],\n\"temperature\":1.50,\"max_tokens\":1e3}";
    let answer = send(post_json(&proxy.url(CHAT), body)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("unchanged"));
    assert_eq!(answer.header("x-compaction-policy"), Some("default"));
    let received = upstream.last();
    assert_eq!(received.body, Bytes::from(body));
    assert_eq!(
        received.headers["content-length"],
        body.len().to_string().as_str()
    );
}

#[tokio::test]
async fn content_length_matches_the_rewritten_body() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 400, 2, 90), &upstream.url()).await;
    let body = json!({"model": "m", "messages": wire_messages(&conversation())}).to_string();
    let answer = send(post_json(&proxy.url(CHAT), body.clone())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let received = upstream.last();
    assert!(received.body.len() < body.len());
    let declared: usize = received.headers["content-length"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(declared, received.body.len());
    assert!(received.headers.get("transfer-encoding").is_none());
}

#[tokio::test]
async fn hop_by_hop_request_headers_are_stripped_and_host_rewritten() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let request = Request::post(proxy.url(CHAT))
        .header("content-type", "application/json")
        .header("connection", "keep-alive, x-hop-custom")
        .header("x-hop-custom", "secret-hop")
        .header("keep-alive", "timeout=5, max=100")
        .header("te", "trailers")
        .header("upgrade", "websocket")
        .header("proxy-authorization", "Basic cHJveHk6c2VjcmV0")
        .header("x-end-to-end", "kept")
        .body(Full::new(Bytes::from(
            r#"{"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let answer = send(request).await;
    assert_eq!(answer.status, 200);
    let received = upstream.last();
    for name in [
        "connection",
        "keep-alive",
        "te",
        "upgrade",
        "proxy-authorization",
        "x-hop-custom",
    ] {
        assert!(
            received.headers.get(name).is_none(),
            "{name} reached the upstream: {:?}",
            received.headers
        );
    }
    assert_eq!(received.headers["x-end-to-end"], "kept");
    assert_eq!(received.headers["host"], upstream.addr.to_string().as_str());
}

#[tokio::test]
async fn hop_by_hop_response_headers_are_stripped() {
    let upstream = MockUpstream::start(Behavior::JsonWithHeaders(
        200,
        vec![
            ("connection".into(), "x-resp-hop".into()),
            ("x-resp-hop".into(), "1".into()),
            ("keep-alive".into(), "timeout=5".into()),
            ("upgrade".into(), "h2c".into()),
            ("proxy-authenticate".into(), "Basic".into()),
            ("x-request-id".into(), "req-42".into()),
        ],
        json!({"ok": true}),
    ))
    .await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    for path in [CHAT, "/v1/models"] {
        let answer = send(post_json(&proxy.url(path), r#"{"messages":[]}"#)).await;
        assert_eq!(answer.status, 200);
        for name in [
            "connection",
            "keep-alive",
            "upgrade",
            "proxy-authenticate",
            "x-resp-hop",
        ] {
            assert!(
                answer.headers.get(name).is_none(),
                "{name} reached the client on {path}: {:?}",
                answer.headers
            );
        }
        assert_eq!(answer.header("x-request-id"), Some("req-42"));
        assert_eq!(answer.json(), json!({"ok": true}));
    }
}

#[tokio::test]
async fn credentials_method_path_and_query_pass_through() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 400, 2, 90), &upstream.url()).await;
    let path = "/v1/chat/completions?api-version=2024-06-01&x=a%20b";
    let request = Request::post(proxy.url(path))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test-AbC123")
        .header("api-key", "azure-key-1")
        .header("x-api-key", "anthropic-key-2")
        .header("cookie", "session=abc; theme=dark")
        .body(Full::new(Bytes::from(
            json!({"messages": wire_messages(&conversation())}).to_string(),
        )))
        .unwrap();
    let answer = send(request).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let received = upstream.last();
    assert_eq!(received.method, http::Method::POST);
    assert_eq!(received.uri.path_and_query().unwrap().as_str(), path);
    assert_eq!(received.headers["authorization"], "Bearer sk-test-AbC123");
    assert_eq!(received.headers["api-key"], "azure-key-1");
    assert_eq!(received.headers["x-api-key"], "anthropic-key-2");
    assert_eq!(received.headers["cookie"], "session=abc; theme=dark");

    for method in [http::Method::GET, http::Method::DELETE, http::Method::PUT] {
        let request = Request::builder()
            .method(method.clone())
            .uri(proxy.url("/v1/files/file-1?purpose=fine-tune"))
            .header("authorization", "Bearer sk-test-AbC123")
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(send(request).await.status, 200);
        let received = upstream.last();
        assert_eq!(received.method, method);
        assert_eq!(
            received.uri.path_and_query().unwrap().as_str(),
            "/v1/files/file-1?purpose=fine-tune"
        );
        assert_eq!(received.headers["authorization"], "Bearer sk-test-AbC123");
    }
}

#[tokio::test]
async fn gzip_body_is_decoded_and_compacted() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 400, 2, 90), &upstream.url()).await;
    let conversation = conversation();
    let expected = engine_report(&conversation, &engine_policy(400, 2, 90));
    let body = json!({"model": "m", "messages": wire_messages(&conversation)}).to_string();
    let request = Request::post(proxy.url(CHAT))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(Full::new(Bytes::from(gzip(body.as_bytes()))))
        .unwrap();
    let answer = send(request).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let received = upstream.last();
    assert!(
        received.headers.get("content-encoding").is_none(),
        "forwarded body is plain JSON"
    );
    assert_eq!(
        received.headers["content-length"],
        received.body.len().to_string().as_str()
    );
    let got = received.json();
    assert_eq!(got["messages"], survivors(&expected));
    assert_eq!(got["model"], "m");
}

#[tokio::test]
async fn gzip_body_over_the_decoded_limit_is_refused() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start("[server]\nmax_body_bytes = 20000", &upstream.url()).await;
    let body = json!({"messages": [{"role": "user", "content": "a".repeat(60_000)}]}).to_string();
    let compressed = gzip(body.as_bytes());
    assert!(
        compressed.len() < 20_000,
        "the compressed body itself is within the limit"
    );
    let request = Request::post(proxy.url(CHAT))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(Full::new(Bytes::from(compressed)))
        .unwrap();
    let answer = send(request).await;
    assert_eq!(answer.status, 413);
    assert_eq!(answer.json()["error"]["code"], "body_too_large");
    assert!(
        upstream.received().is_empty(),
        "nothing reached the upstream"
    );
}

/// Checks the OpenAI pairing rule: every assistant message with `tool_calls`
/// is followed directly by tool messages answering each of its ids, and every
/// tool message answers the assistant message just before its run.
fn assert_tool_pairing(messages: &[Value]) {
    let mut open: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap();
        if role == "tool" {
            let id = m["tool_call_id"].as_str().unwrap();
            let at = open.iter().position(|o| o == id);
            assert!(
                at.is_some(),
                "tool message {i} answers {id}, which no preceding assistant call in the run made"
            );
            open.remove(at.unwrap());
            continue;
        }
        assert!(
            open.is_empty(),
            "calls {open:?} are unanswered before message {i}"
        );
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
            open = calls
                .iter()
                .map(|c| c["id"].as_str().unwrap().to_owned())
                .collect();
        }
    }
    assert!(open.is_empty(), "calls {open:?} are unanswered at the end");
}

fn image_parts(messages_raw: &str) -> Vec<String> {
    let mut out = Vec::new();
    for item in raw_items(messages_raw) {
        let fields: BTreeMap<String, &RawValue> = serde_json::from_str(item).unwrap();
        let Some(content) = fields.get("content") else {
            continue;
        };
        if !content.get().starts_with('[') {
            continue;
        }
        for part in raw_items(content.get()) {
            let v: Value = serde_json::from_str(part).unwrap();
            if v["type"] != "text" {
                out.push(part.to_owned());
            }
        }
    }
    out
}

#[tokio::test]
async fn fixture_tool_calls_stay_paired_under_a_small_budget() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start("[policies.default]\nbudget_chars = 20000", &upstream.url()).await;
    let body = fixture("agent-150-turns.json");
    let original: Value = serde_json::from_slice(&body).unwrap();
    assert_tool_pairing(original["messages"].as_array().unwrap());

    let answer = send(post_json(&proxy.url(CHAT), body.clone())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let received = upstream.last();
    let forwarded = received.json();
    let messages = forwarded["messages"].as_array().unwrap();
    assert!(messages.len() < original["messages"].as_array().unwrap().len() / 2);
    assert!(
        messages.iter().any(|m| m
            .get("tool_calls")
            .is_some_and(|c| c.as_array().unwrap().len() > 1)),
        "a parallel call survives"
    );
    assert_tool_pairing(messages);

    // An image part that survives is the fixture's bytes, not a re-encoding.
    let original_images = image_parts(split_messages(&body).1);
    for part in image_parts(split_messages(&received.body).1) {
        assert!(
            original_images.contains(&part),
            "image part changed: {part}"
        );
    }
    assert_eq!(forwarded["tools"], original["tools"]);
}

#[tokio::test]
async fn fixture_image_parts_are_forwarded_byte_identical() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(
        "[policies.default]\nbudget_chars = 20000\npin_patterns = [\"screenshot of the failure\"]",
        &upstream.url(),
    )
    .await;
    let body = fixture("agent-150-turns.json");
    let answer = send(post_json(&proxy.url(CHAT), body.clone())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let received = upstream.last();
    let original_images = image_parts(split_messages(&body).1);
    let forwarded_images = image_parts(split_messages(&received.body).1);
    assert_eq!(original_images.len(), 8);
    assert_eq!(
        forwarded_images, original_images,
        "every pinned image message survives with its bytes"
    );
    assert!(
        forwarded_images[0].contains('\n'),
        "the fixture's own layout, not a re-encoding"
    );
    assert_tool_pairing(received.json()["messages"].as_array().unwrap());
}

#[tokio::test]
async fn array_content_is_trimmed_and_image_parts_untouched() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 60, 1, 30), &upstream.url()).await;
    let first = "First sentence here. Second sentence is much longer than that";
    let trailing = "a trailing part that will be cut off entirely";
    let image = r#"{ "type" : "image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo=", "detail":"low"} }"#;
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":{}}},{image},{{"type":"text","text":{}}}]}},{{"role":"user","content":"last question"}}]}}"#,
        json!(first),
        json!(trailing)
    );
    let conversation = [
        (Role::User, format!("{first}{trailing}")),
        (Role::User, "last question".to_owned()),
    ];
    let expected = engine_report(&conversation, &engine_policy(60, 1, 30));
    assert_eq!(expected.messages.len(), 2);
    assert_eq!(expected.loss.trimmed_messages, 1);
    let kept_text = &expected.messages[0].content;
    assert!(
        kept_text.len() < first.len(),
        "the cut falls in the first text part"
    );

    let answer = send(post_json(&proxy.url(CHAT), body)).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let received = upstream.last();
    let (_, raw_messages, _) = split_messages(&received.body);
    let first_raw: BTreeMap<String, &RawValue> =
        serde_json::from_str(raw_items(raw_messages)[0]).unwrap();
    let parts = raw_items(first_raw["content"].get());
    assert_eq!(
        parts.len(),
        2,
        "the emptied trailing text part is removed: {parts:?}"
    );
    let text_part: Value = serde_json::from_str(parts[0]).unwrap();
    assert_eq!(text_part, json!({"type": "text", "text": kept_text}));
    assert_eq!(parts[1], image, "the image part keeps its bytes");
    assert_eq!(
        received.json()["messages"][1],
        json!({"role": "user", "content": "last question"})
    );
}

#[tokio::test]
async fn unmatched_paths_pass_through_untouched() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 10, 1, 5), &upstream.url()).await;

    let request = Request::get(proxy.url("/v1/models?limit=5"))
        .header("authorization", "Bearer sk-x")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = send(request).await;
    assert_eq!(answer.status, 200);
    assert_eq!(compaction_headers(&answer.headers), vec![]);
    let received = upstream.last();
    assert_eq!(
        (received.method.as_str(), received.uri.to_string().as_str()),
        ("GET", "/v1/models?limit=5")
    );

    // A chat-shaped body on another path is not compacted, even over budget.
    let body =
        json!({"model": "e", "messages": wire_messages(&conversation()), "input": "x"}).to_string();
    let answer = send(post_json(&proxy.url("/v1/embeddings"), body.clone())).await;
    assert_eq!(answer.status, 200);
    assert_eq!(compaction_headers(&answer.headers), vec![]);
    assert_eq!(upstream.last().body, Bytes::from(body));
}

#[tokio::test]
async fn invalid_json_is_forwarded_untouched_and_marked_skipped() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 10, 1, 5), &upstream.url()).await;
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "unterminated"#;
    let answer = send(post_json(&proxy.url(CHAT), body)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("skipped; invalid-json")
    );
    assert_eq!(answer.header("x-compaction-policy"), Some("default"));
    assert_eq!(upstream.last().body, Bytes::from(body));
}

#[tokio::test]
async fn json_without_messages_is_forwarded_untouched_and_marked_skipped() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 10, 1, 5), &upstream.url()).await;
    let body = r#"{"model": "m",  "prompt": "a long long long long prompt"}"#;
    let answer = send(post_json(&proxy.url(CHAT), body)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("skipped; no-messages")
    );
    assert_eq!(upstream.last().body, Bytes::from(body));
}

fn tenant_request(url: &str, tenant: Option<&str>, body: &str) -> Request<Full<Bytes>> {
    let mut request = post_json(url, body.to_owned());
    if let Some(tenant) = tenant {
        request
            .headers_mut()
            .insert("x-tenant-id", tenant.parse().unwrap());
    }
    request
}

#[tokio::test]
async fn tenant_header_selects_the_tenant_policy() {
    let upstream = ok_upstream().await;
    let toml = format!(
        "{}[tenants.policies]\nacme = \"small\"\n",
        policy_toml("small", 400, 2, 90)
    );
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let conversation = conversation();
    let body = json!({"messages": wire_messages(&conversation)}).to_string();

    let answer = send(tenant_request(&proxy.url(CHAT), Some("acme"), &body)).await;
    assert_eq!(answer.header("x-compaction-policy"), Some("small"));
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let expected = engine_report(&conversation, &engine_policy(400, 2, 90));
    assert_eq!(upstream.last().json()["messages"], survivors(&expected));

    for tenant in [Some("globex"), None] {
        let answer = send(tenant_request(&proxy.url(CHAT), tenant, &body)).await;
        assert_eq!(
            answer.header("x-compaction-policy"),
            Some("default"),
            "tenant {tenant:?}"
        );
        assert_eq!(
            answer.header("x-compaction-status"),
            Some("unchanged"),
            "tenant {tenant:?}"
        );
        assert_eq!(upstream.last().body, Bytes::from(body.clone()));
    }
}

fn bypass_request(url: &str, body: &str) -> Request<Full<Bytes>> {
    let mut request = post_json(url, body.to_owned());
    request
        .headers_mut()
        .insert("x-compaction-bypass", "true".parse().unwrap());
    request
}

#[tokio::test]
async fn bypass_header_is_honoured_when_the_policy_allows_it() {
    let upstream = ok_upstream().await;
    let toml =
        policy_toml("default", 400, 2, 90).replace("allow_bypass = false", "allow_bypass = true");
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let body = json!({"messages": wire_messages(&conversation())}).to_string();
    let answer = send(bypass_request(&proxy.url(CHAT), &body)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("bypassed"));
    assert_eq!(answer.header("x-compaction-policy"), Some("default"));
    assert_eq!(upstream.last().body, Bytes::from(body));
}

#[tokio::test]
async fn bypass_header_is_ignored_when_the_policy_forbids_it() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 400, 2, 90), &upstream.url()).await;
    let conversation = conversation();
    let body = json!({"messages": wire_messages(&conversation)}).to_string();
    let answer = send(bypass_request(&proxy.url(CHAT), &body)).await;
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("compacted; bypass-not-allowed"),
        "the status says why the bypass had no effect"
    );
    let expected = engine_report(&conversation, &engine_policy(400, 2, 90));
    assert_eq!(upstream.last().json()["messages"], survivors(&expected));
}

#[tokio::test]
async fn dry_run_forwards_the_original_and_reports_the_would_be_loss() {
    let upstream = ok_upstream().await;
    let toml = policy_toml("default", 400, 2, 90).replace("dry_run = false", "dry_run = true");
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let conversation = conversation();
    let expected = engine_report(&conversation, &engine_policy(400, 2, 90));
    let body = json!({"messages": wire_messages(&conversation)}).to_string();
    let answer = send(post_json(&proxy.url(CHAT), body.clone())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("dry-run"));
    assert_eq!(upstream.last().body, Bytes::from(body));
    assert_eq!(
        header_num(&answer, "x-compaction-input-messages") as usize,
        conversation.len()
    );
    assert_eq!(
        header_num(&answer, "x-compaction-output-messages") as usize,
        expected.messages.len()
    );
    assert_eq!(
        header_num(&answer, "x-compaction-dropped-messages") as usize,
        expected.loss.dropped_messages
    );
    assert_eq!(
        header_num(&answer, "x-compaction-trimmed-messages") as usize,
        expected.loss.trimmed_messages
    );
    assert_eq!(
        header_num(&answer, "x-compaction-output-chars") as usize,
        expected.loss.output_chars
    );
    assert!(expected.loss.dropped_messages > 0);
}

#[tokio::test]
async fn loss_headers_are_consistent_with_the_forwarded_body() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 400, 2, 90), &upstream.url()).await;
    let conversation = conversation();
    let body = json!({"messages": wire_messages(&conversation)}).to_string();
    let answer = send(post_json(&proxy.url(CHAT), body)).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(answer.header("x-compaction-policy"), Some("default"));

    let forwarded = upstream.last().json();
    let forwarded = forwarded["messages"].as_array().unwrap();
    let input_chars: usize = conversation.iter().map(|(_, c)| chars(c)).sum();
    let output_chars: usize = forwarded
        .iter()
        .map(|m| chars(m["content"].as_str().unwrap()))
        .sum();
    let originals: Vec<&str> = conversation.iter().map(|(_, c)| c.as_str()).collect();
    let trimmed = forwarded
        .iter()
        .filter(|m| !originals.contains(&m["content"].as_str().unwrap()))
        .count();

    assert_eq!(
        header_num(&answer, "x-compaction-input-messages") as usize,
        conversation.len()
    );
    assert_eq!(
        header_num(&answer, "x-compaction-output-messages") as usize,
        forwarded.len()
    );
    assert_eq!(
        header_num(&answer, "x-compaction-dropped-messages") as usize,
        conversation.len() - forwarded.len()
    );
    assert_eq!(
        header_num(&answer, "x-compaction-trimmed-messages") as usize,
        trimmed
    );
    assert!(trimmed > 0);
    assert_eq!(
        header_num(&answer, "x-compaction-input-chars") as usize,
        input_chars
    );
    assert_eq!(
        header_num(&answer, "x-compaction-output-chars") as usize,
        output_chars
    );
    let ratio = header_num(&answer, "x-compaction-retained-ratio");
    let want = (output_chars as f64 / input_chars as f64 * 10_000.0).round() / 10_000.0;
    assert!((ratio - want).abs() < 1e-9, "ratio {ratio} vs {want}");
    assert_eq!(
        answer.header("x-compaction-budget-met"),
        Some(if output_chars <= 400 { "true" } else { "false" })
    );
}

#[tokio::test]
async fn pin_first_user_keeps_the_task_statement() {
    let upstream = ok_upstream().await;
    let task = "Task: migrate the billing cron to the new scheduler and keep the audit log intact.";
    let mut conversation = conversation();
    conversation[1] = (Role::User, task.to_owned());
    let body = json!({"messages": wire_messages(&conversation)}).to_string();

    // Without the pin the engine drops it; with the pin it survives whole.
    let unpinned = engine_report(&conversation, &engine_policy(300, 2, 90));
    assert!(
        unpinned.messages.iter().all(|m| m.index != 1),
        "the case needs the pin"
    );
    let mut messages: Vec<Message> = conversation
        .iter()
        .map(|(r, c)| Message::new(*r, c.clone()))
        .collect();
    messages[1].pin = true;
    let expected = engine::compact(&messages, &engine_policy(300, 2, 90));

    let toml = policy_toml("default", 300, 2, 90)
        .replace("pin_first_user = false", "pin_first_user = true");
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let answer = send(post_json(&proxy.url(CHAT), body)).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let forwarded = upstream.last().json();
    assert_eq!(forwarded["messages"], survivors(&expected));
    assert!(forwarded["messages"]
        .as_array()
        .unwrap()
        .contains(&json!({"role": "user", "content": task})));
}

#[tokio::test]
async fn pin_patterns_keep_matching_messages() {
    let upstream = ok_upstream().await;
    let rule = "Never deploy on Fridays: the on-call rota is empty then and rollbacks are slow.";
    let mut conversation = conversation();
    conversation[3] = (Role::User, rule.to_owned());
    let body = json!({"messages": wire_messages(&conversation)}).to_string();
    let unpinned = engine_report(&conversation, &engine_policy(300, 2, 90));
    assert!(
        unpinned.messages.iter().all(|m| m.index != 3),
        "the case needs the pin"
    );

    let toml = policy_toml("default", 300, 2, 90)
        .replace("pin_patterns = []", "pin_patterns = [\"(?i)never deploy\"]");
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let answer = send(post_json(&proxy.url(CHAT), body)).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let mut messages: Vec<Message> = conversation
        .iter()
        .map(|(r, c)| Message::new(*r, c.clone()))
        .collect();
    messages[3].pin = true;
    let expected = engine::compact(&messages, &engine_policy(300, 2, 90));
    let forwarded = upstream.last().json();
    assert_eq!(forwarded["messages"], survivors(&expected));
    assert!(forwarded["messages"]
        .as_array()
        .unwrap()
        .contains(&json!({"role": "user", "content": rule})));
}

#[tokio::test]
async fn a_body_the_proxy_cannot_decode_is_forwarded_untouched_and_marked_skipped() {
    let upstream = ok_upstream().await;
    let proxy = TestProxy::start(&policy_toml("default", 10, 1, 5), &upstream.url()).await;
    // Raw deflate without the zlib wrapper HTTP's "deflate" means: a common
    // client mistake the upstream may still accept.
    let garbled = Bytes::from_static(b"\x4b\xcc\x49\xca\x4f\x04\x00not zlib");
    let mut request = post_json(&proxy.url(CHAT), garbled.clone());
    request
        .headers_mut()
        .insert("content-encoding", "deflate".parse().unwrap());
    let answer = send(request).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("skipped; undecodable-body")
    );
    let received = upstream.last();
    assert_eq!(received.body, garbled);
    assert_eq!(received.headers["content-encoding"], "deflate");
}

#[tokio::test]
async fn a_body_with_more_messages_than_the_limit_is_forwarded_untouched() {
    let upstream = ok_upstream().await;
    let config = format!(
        "[server]\nmax_messages = 3\n{}",
        policy_toml("default", 10, 1, 5)
    );
    let proxy = TestProxy::start(&config, &upstream.url()).await;
    let body = json!({"model": "m", "messages": wire_messages(&conversation())}).to_string();
    let answer = send(post_json(&proxy.url(CHAT), body.clone())).await;
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("skipped; too-many-messages")
    );
    assert_eq!(upstream.last().body, Bytes::from(body));
}
