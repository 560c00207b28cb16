//! Smoke test of the harness: a compacted request reaches the mock upstream.

use crate::support::*;

#[tokio::test]
async fn compacted_messages_reach_the_upstream() {
    let upstream = MockUpstream::start(Behavior::Json(200, serde_json::json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[policies.default]\nbudget_chars = 50\nkeep_last_n = 1\npin_first_user = false",
        &upstream.url(),
    )
    .await;
    let body = serde_json::json!({"model": "m", "messages": [
        {"role": "user", "content": "x".repeat(100)},
        {"role": "user", "content": "hello"},
    ]});
    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.to_string(),
    ))
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let got = upstream.last().json();
    assert_eq!(
        got["messages"],
        serde_json::json!([{"role": "user", "content": "hello"}])
    );
}

#[tokio::test]
async fn a_request_in_flight_keeps_the_policy_it_started_with() {
    let upstream =
        MockUpstream::start(Behavior::SlowHeaders(std::time::Duration::from_millis(300))).await;
    let before = "[policies.first]\nbudget_chars = 50\nkeep_last_n = 1\npin_first_user = false\n[[routes]]\npath = \"/v1/chat/completions\"\npolicy = \"first\"";
    let proxy = TestProxy::start(before, &upstream.url()).await;
    let body = serde_json::json!({"messages": [
        {"role": "user", "content": "x".repeat(100)},
        {"role": "user", "content": "hello"},
    ]});
    let in_flight = tokio::spawn(send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.to_string(),
    )));
    assert!(
        wait_until(std::time::Duration::from_secs(2), || upstream
            .received()
            .len()
            == 1)
        .await,
        "the first request reached the upstream"
    );

    let after = before
        .replace("\"first\"", "\"second\"")
        .replace("policies.first", "policies.second")
        .replace("budget_chars = 50", "budget_chars = 1000");
    proxy.state.reload(runtime(&after, &upstream.url()));
    let answer = in_flight.await.unwrap();
    assert_eq!(answer.header("x-compaction-policy"), Some("first"));
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));

    let next = send(post_json(
        &proxy.url("/v1/chat/completions"),
        body.to_string(),
    ))
    .await;
    assert_eq!(next.header("x-compaction-policy"), Some("second"));
    assert_eq!(next.header("x-compaction-status"), Some("unchanged"));
}

#[tokio::test]
async fn shutdown_turns_readiness_off_before_closing_the_listener() {
    let upstream = MockUpstream::start(Behavior::Json(200, serde_json::json!({"ok": true}))).await;
    let mut proxy = TestProxy::start("[server]\nshutdown_delay_secs = 0.5", &upstream.url()).await;
    let get = |path: &str| {
        http::Request::get(proxy.url(path))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    assert_eq!(send(get("/readyz")).await.status, 200);
    let (ready, health) = (get("/readyz"), get("/healthz"));

    proxy.stop();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // Still accepting, but no longer ready: load balancers drain the pod.
    assert_eq!(send(ready).await.status, 503);
    assert_eq!(send(health).await.status, 200);

    let closed = wait_until(std::time::Duration::from_secs(3), || {
        std::net::TcpStream::connect(proxy.addr).is_err()
    })
    .await;
    assert!(closed, "the listener closes after the delay");
}

/// Word lists kept from a conversation's earlier turn (the default
/// `cache.word_lists_max_bytes`) change nothing the upstream receives: the
/// 200-message chat fixture's next turn, compacted after its previous one,
/// goes out byte for byte as it does through a proxy that keeps none.
#[tokio::test]
async fn word_lists_from_the_previous_turn_forward_the_same_bytes() {
    let chat: serde_json::Value =
        serde_json::from_slice(&fixture("chat-200-messages.json")).unwrap();
    let messages = chat["messages"].as_array().unwrap();
    let turn = |n: usize| serde_json::json!({"model": "m", "messages": messages[..n]}).to_string();
    let (earlier, later) = (turn(messages.len() - 2), turn(messages.len()));
    // No outcome cache, so every request runs the engine.
    let policy = |word_lists: u64| {
        format!(
            "[cache]\nmax_bytes = 0\nword_lists_max_bytes = {word_lists}\n\
             [policies.default]\nbudget_chars = 20000\nkeep_last_n = 2\n"
        )
    };
    let warm =
        compacted_upstream_bodies(&policy(32 << 20), vec![earlier.clone(), later.clone()]).await;
    let cold = compacted_upstream_bodies(&policy(0), vec![earlier, later]).await;
    assert_eq!(warm, cold);
}

/// A parse resumed from the previous turn's (with
/// `cache.prefix_max_bytes` set) changes nothing the upstream receives: turns
/// of the 200-message chat fixture, each appending to the one before (and
/// one editing an earlier message), go out byte for byte as through a
/// proxy that parses every body whole.
#[tokio::test]
async fn a_parse_resumed_from_the_previous_turn_forwards_the_same_bytes() {
    let chat: serde_json::Value =
        serde_json::from_slice(&fixture("chat-200-messages.json")).unwrap();
    let messages = chat["messages"].as_array().unwrap();
    let turn = |n: usize| serde_json::json!({"model": "m", "messages": messages[..n]}).to_string();
    let n = messages.len();
    let mut edited = messages[..n].to_vec();
    edited[3]["content"] = serde_json::Value::String("an edited earlier message".into());
    let edited = serde_json::json!({"model": "m", "messages": edited}).to_string();
    let bodies = vec![
        turn(n - 6),
        turn(n - 4),
        turn(n - 2),
        turn(n),
        edited,
        turn(n),
    ];
    assert!(bodies[0].len() >= compaction_proxy::format::resume::MIN_SNAPSHOT_BYTES);
    let policy = |prefixes: u64| {
        format!(
            "[cache]\nmax_bytes = 0\nprefix_max_bytes = {prefixes}\n\
             [policies.default]\nbudget_chars = 20000\nkeep_last_n = 2\n"
        )
    };
    let resumed = compacted_upstream_bodies(&policy(64 << 20), bodies.clone()).await;
    let whole = compacted_upstream_bodies(&policy(0), bodies).await;
    assert_eq!(resumed, whole);
}
