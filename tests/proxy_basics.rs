//! Smoke test of the harness: a compacted request reaches the mock upstream.

mod support;

use support::*;

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
