//! Failures: the proxy's own errors are OpenAI-style JSON answers with the
//! right status, carry the policy on matched routes, and an oversized body
//! never reaches the upstream.

use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

const CHAT: &str = "/v1/chat/completions";

fn chat_body() -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": "hello"}]}).to_string()
}

/// Checks the `{"error": {"message", "type", "code"}}` shape and returns the code.
fn error_code(answer: &Answer) -> String {
    assert_eq!(answer.header("content-type"), Some("application/json"));
    let body: Value = answer.json();
    let error = &body["error"];
    assert!(
        error["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{body}"
    );
    assert!(
        error["type"].as_str().is_some_and(|t| !t.is_empty()),
        "{body}"
    );
    error["code"].as_str().expect("a string code").to_owned()
}

#[tokio::test]
async fn unreachable_upstream_is_a_502_with_a_json_error() {
    let nowhere = unused_addr().await;
    let proxy = TestProxy::start("", &format!("http://{nowhere}")).await;
    let answer = send(post_json(&proxy.url(CHAT), chat_body())).await;
    assert_eq!(answer.status, 502);
    assert_eq!(error_code(&answer), "upstream_unreachable");
    assert_eq!(answer.json()["error"]["type"], "proxy_error");
    assert_eq!(answer.header("x-compaction-policy"), Some("default"));
    // The loss report still says what was done to the request.
    assert_eq!(answer.header("x-compaction-status"), Some("unchanged"));
    assert!(answer.header("x-compaction-input-chars").is_some());

    // An unmatched route fails the same way, without a loss report.
    let request = Request::get(proxy.url("/v1/models"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let answer = send(request).await;
    assert_eq!(answer.status, 502);
    assert_eq!(error_code(&answer), "upstream_unreachable");
    assert_eq!(compaction_headers(&answer.headers), vec![]);
}

#[tokio::test]
async fn stalled_upstream_is_a_504_after_the_header_timeout() {
    let upstream = MockUpstream::start(Behavior::Stall).await;
    let proxy = TestProxy::start(
        "[upstream]\nresponse_header_timeout_secs = 0.3",
        &upstream.url(),
    )
    .await;
    let started = Instant::now();
    let answer = send(post_json(&proxy.url(CHAT), chat_body())).await;
    let elapsed = started.elapsed();
    assert_eq!(answer.status, 504);
    assert_eq!(error_code(&answer), "upstream_timeout");
    assert_eq!(answer.header("x-compaction-policy"), Some("default"));
    assert!(
        elapsed >= Duration::from_millis(250) && elapsed < Duration::from_millis(1500),
        "{elapsed:?}"
    );
    assert_eq!(upstream.received().len(), 1);
    assert!(
        wait_until(Duration::from_secs(1), || upstream.cancelled() == 1).await,
        "the timed-out request is dropped"
    );
}

#[tokio::test]
async fn declared_oversized_body_is_a_413_and_nothing_is_forwarded() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({}))).await;
    let proxy = TestProxy::start("[server]\nmax_body_bytes = 1000", &upstream.url()).await;
    let body = json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]}).to_string();
    let answer = send(post_json(&proxy.url(CHAT), body)).await;
    assert_eq!(answer.status, 413);
    assert_eq!(error_code(&answer), "body_too_large");
    assert_eq!(answer.json()["error"]["type"], "invalid_request_error");
    assert_eq!(answer.header("x-compaction-policy"), Some("default"));
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("refused; body-too-large")
    );
    assert!(
        upstream.received().is_empty(),
        "nothing reached the upstream"
    );
}

#[tokio::test]
async fn chunked_oversized_body_is_a_413_and_nothing_is_forwarded() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({}))).await;
    let proxy = TestProxy::start("[server]\nmax_body_bytes = 1000", &upstream.url()).await;
    let body = json!({"messages": [{"role": "user", "content": "x".repeat(3000)}]}).to_string();
    let chunks: Vec<Bytes> = body
        .as_bytes()
        .chunks(400)
        .map(Bytes::copy_from_slice)
        .collect();
    let request = Request::post(proxy.url(CHAT))
        .header("content-type", "application/json")
        .body(Chunked::new(chunks))
        .unwrap();
    let response = chunked_client()
        .request(request)
        .await
        .expect("proxy answers");
    let (parts, body) = response.into_parts();
    let answer = Answer {
        status: parts.status,
        headers: parts.headers,
        body: body.collect().await.unwrap().to_bytes(),
    };
    assert_eq!(answer.status, 413);
    assert_eq!(error_code(&answer), "body_too_large");
    assert_eq!(answer.header("x-compaction-policy"), Some("default"));
    assert!(
        upstream.received().is_empty(),
        "nothing reached the upstream"
    );
}

#[tokio::test]
async fn chunked_body_within_the_limit_is_forwarded() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({}))).await;
    let proxy = TestProxy::start("[server]\nmax_body_bytes = 1000", &upstream.url()).await;
    let body = chat_body();
    let chunks: Vec<Bytes> = body
        .as_bytes()
        .chunks(10)
        .map(Bytes::copy_from_slice)
        .collect();
    let request = Request::post(proxy.url(CHAT))
        .header("content-type", "application/json")
        .body(Chunked::new(chunks))
        .unwrap();
    let response = chunked_client()
        .request(request)
        .await
        .expect("proxy answers");
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-compaction-status"], "unchanged");
    assert_eq!(upstream.last().body, Bytes::from(body));
}

/// A request body that arrives in the pieces sent on its channel, when
/// they are sent; it ends when the sender is dropped.
struct SlowBody(tokio::sync::mpsc::Receiver<Bytes>);

impl http_body::Body for SlowBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, Self::Error>>> {
        self.0
            .poll_recv(cx)
            .map(|piece| piece.map(|b| Ok(hyper::body::Frame::data(b))))
    }
}

#[tokio::test]
async fn a_slow_upload_is_not_a_silent_upstream() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[upstream]\nresponse_header_timeout_secs = 0.3",
        &upstream.url(),
    )
    .await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        for piece in ["part one, ", "part two, ", "part three, ", "the end"] {
            tokio::time::sleep(Duration::from_millis(150)).await;
            let _ = tx.send(Bytes::from(piece)).await;
        }
    });
    // 600 ms of upload on an unmatched route (streamed, like a file upload).
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<SlowBody>();
    let request = Request::post(proxy.url("/v1/files"))
        .body(SlowBody(rx))
        .unwrap();
    let response = client.request(request).await.expect("the proxy answers");
    assert_eq!(response.status(), 200);
    assert_eq!(
        upstream.last().body,
        Bytes::from("part one, part two, part three, the end")
    );
}

#[tokio::test]
async fn an_upload_that_stops_moving_is_cut_off_as_the_clients_timeout() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("[server]\nbody_idle_timeout_secs = 0.3", &upstream.url()).await;
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(Bytes::from("the first part, then nothing"))
        .await
        .unwrap();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<SlowBody>();
    let request = Request::post(proxy.url("/v1/files"))
        .body(SlowBody(rx))
        .unwrap();
    let started = Instant::now();
    let response = tokio::time::timeout(Duration::from_secs(3), client.request(request))
        .await
        .expect("the proxy does not hold the request forever")
        .expect("the proxy answers");
    // The client stopped sending: 408, not a gateway timeout.
    assert_eq!(response.status(), 408);
    assert!(started.elapsed() >= Duration::from_millis(300));
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let error: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(error["error"]["code"], "body_timeout");
    drop(tx);
}
