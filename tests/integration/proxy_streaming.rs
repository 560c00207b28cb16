//! Streaming: answers go back event by event as the upstream sends them,
//! failures of the stream reach the client as errors, and a departing client
//! cancels the upstream request.

use std::time::{Duration, Instant};

use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::json;

const CHAT: &str = "/v1/chat/completions";

fn chat_body() -> String {
    json!({"model": "m", "stream": true, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello."},
    ]})
    .to_string()
}

fn sse_chunks() -> Vec<String> {
    vec![
        ": keep-alive\n\n".to_owned(),
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"}}]}\n\n".to_owned(),
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n".to_owned(),
        "event: error\ndata: {\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}\n\n".to_owned(),
        "data: [DONE]\n\n".to_owned(),
    ]
}

#[tokio::test]
async fn sse_events_reach_the_client_one_by_one() {
    let gap = Duration::from_millis(150);
    let chunks = sse_chunks();
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks: chunks.clone(),
        gap,
    })
    .await;
    let proxy = TestProxy::start("", &upstream.url()).await;

    let started = Instant::now();
    let response = client()
        .request(post_json(&proxy.url(CHAT), chat_body()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let (frames, end) = frames_with_times(response).await;
    assert_eq!(end, Ok(()));

    let received: Vec<&Bytes> = frames.iter().map(|(_, b)| b).collect();
    let expected: Vec<Bytes> = chunks.iter().map(|c| Bytes::from(c.clone())).collect();
    assert_eq!(
        received,
        expected.iter().collect::<Vec<_>>(),
        "each event arrives alone and unchanged"
    );

    let first = frames[0].0 - started;
    let spread = frames[frames.len() - 1].0 - frames[0].0;
    let mock_done = gap * chunks.len() as u32;
    assert!(
        spread >= Duration::from_millis(400),
        "events were spread over {spread:?}"
    );
    assert!(
        first < mock_done - Duration::from_millis(300),
        "first event after {first:?}: buffered?"
    );
    for pair in frames.windows(2) {
        assert!(
            pair[1].0 - pair[0].0 >= Duration::from_millis(60),
            "two events arrived together"
        );
    }
}

#[tokio::test]
async fn streaming_answer_carries_the_loss_report() {
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks: vec!["data: {}\n\n".into(), "data: [DONE]\n\n".into()],
        gap: Duration::from_millis(10),
    })
    .await;
    let proxy = TestProxy::start(
        "[policies.default]\nbudget_chars = 30\nkeep_last_n = 1\npin_first_user = false",
        &upstream.url(),
    )
    .await;
    let body = json!({"stream": true, "messages": [
        {"role": "user", "content": "an old question that no longer matters at all"},
        {"role": "user", "content": "Say hello."},
    ]});
    let response = client()
        .request(post_json(&proxy.url(CHAT), body.to_string()))
        .await
        .unwrap();
    let headers = response.headers().clone();
    let (frames, end) = frames_with_times(response).await;
    assert_eq!(end, Ok(()));
    assert_eq!(frames.len(), 2);
    let get = |name: &str| headers.get(name).map(|v| v.to_str().unwrap().to_owned());
    assert_eq!(get("x-compaction-status").as_deref(), Some("compacted"));
    assert_eq!(get("x-compaction-policy").as_deref(), Some("default"));
    assert_eq!(get("x-compaction-input-messages").as_deref(), Some("2"));
    assert_eq!(get("x-compaction-output-messages").as_deref(), Some("1"));
    assert_eq!(get("x-compaction-dropped-messages").as_deref(), Some("1"));
    assert_eq!(get("x-compaction-trimmed-messages").as_deref(), Some("0"));
    assert_eq!(get("x-compaction-output-chars").as_deref(), Some("10"));
    assert_eq!(get("x-compaction-budget-met").as_deref(), Some("true"));
    for name in ["x-compaction-input-chars", "x-compaction-retained-ratio"] {
        assert!(get(name).is_some(), "{name} missing");
    }
}

#[tokio::test]
async fn upstream_reset_mid_stream_ends_the_client_stream_with_an_error() {
    let upstream = MockUpstream::start(Behavior::ResetAfter(vec![
        "data: {\"a\":1}\n\n".into(),
        "data: {\"a\":2}\n\n".into(),
    ]))
    .await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let response = client()
        .request(post_json(&proxy.url(CHAT), chat_body()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (frames, end) = tokio::time::timeout(Duration::from_secs(2), frames_with_times(response))
        .await
        .expect("stream ends");
    assert!(
        end.is_err(),
        "a reset upstream must not look like a clean end"
    );
    let got: Vec<u8> = frames.iter().flat_map(|(_, b)| b.to_vec()).collect();
    assert_eq!(got, b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\n");
}

#[tokio::test]
async fn client_disconnect_mid_stream_cancels_the_upstream_request() {
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks: sse_chunks(),
        gap: Duration::from_millis(150),
    })
    .await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let response = client()
        .request(post_json(&proxy.url(CHAT), chat_body()))
        .await
        .unwrap();
    let mut body = response.into_body();
    let first = body
        .frame()
        .await
        .expect("a first event")
        .expect("no error");
    assert_eq!(first.into_data().unwrap(), ": keep-alive\n\n");
    assert_eq!(upstream.cancelled(), 0);
    drop(body);
    assert_one_cancelled(&upstream).await;
}

/// Waits (bounded) for the upstream to see exactly one request cut off.
async fn assert_one_cancelled(upstream: &MockUpstream) {
    let cancelled = wait_until(Duration::from_millis(1500), || upstream.cancelled() == 1).await;
    assert!(
        cancelled,
        "the upstream saw {} cancelled requests",
        upstream.cancelled()
    );
}

#[tokio::test]
async fn client_disconnect_before_response_headers_cancels_the_upstream_request() {
    let upstream = MockUpstream::start(Behavior::Stall).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let request = client().request(post_json(&proxy.url(CHAT), chat_body()));
    let waited = tokio::time::timeout(Duration::from_millis(200), request).await;
    assert!(waited.is_err(), "a stalled upstream sends no headers");
    assert_eq!(
        upstream.received().len(),
        1,
        "the request reached the upstream"
    );
    assert_one_cancelled(&upstream).await;
}

#[tokio::test]
async fn silent_upstream_body_is_cut_after_the_idle_timeout() {
    let upstream = MockUpstream::start(Behavior::SilentBody).await;
    let proxy = TestProxy::start("[upstream]\nidle_timeout_secs = 0.3", &upstream.url()).await;
    let started = Instant::now();
    let response = client()
        .request(post_json(&proxy.url(CHAT), chat_body()))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let (frames, end) = tokio::time::timeout(Duration::from_secs(2), frames_with_times(response))
        .await
        .expect("stream is cut");
    let elapsed = started.elapsed();
    assert!(frames.is_empty());
    assert!(end.is_err(), "an idle cut must not look like a clean end");
    assert!(
        elapsed >= Duration::from_millis(250),
        "cut after {elapsed:?}"
    );
    let cancelled = wait_until(Duration::from_millis(1000), || upstream.cancelled() == 1).await;
    assert!(cancelled, "the idle upstream request is dropped");
}

#[tokio::test]
async fn http2_prior_knowledge_clients_are_served() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[policies.default]\nbudget_chars = 30\nkeep_last_n = 1\npin_first_user = false",
        &upstream.url(),
    )
    .await;
    let body = json!({"messages": [
        {"role": "user", "content": "an old question that no longer matters at all"},
        {"role": "user", "content": "Say hello."},
    ]});
    let request = Request::post(proxy.url(CHAT))
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-h2")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = h2_client().request(request).await.expect("h2c works");
    assert_eq!(response.version(), http::Version::HTTP_2);
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["x-compaction-status"], "compacted");
    let answer = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&answer).unwrap(),
        json!({"ok": true})
    );

    let received = upstream.last();
    assert_eq!(
        received.json()["messages"],
        json!([{"role": "user", "content": "Say hello."}])
    );
    assert_eq!(received.headers["authorization"], "Bearer sk-h2");
    assert_eq!(received.headers["host"], upstream.addr.to_string().as_str());
}

#[tokio::test]
async fn http2_clients_get_sse_streamed() {
    let gap = Duration::from_millis(100);
    let chunks = sse_chunks();
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks: chunks.clone(),
        gap,
    })
    .await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let request = Request::post(proxy.url(CHAT))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_body())))
        .unwrap();
    let response = h2_client().request(request).await.expect("h2c works");
    assert_eq!(response.version(), http::Version::HTTP_2);
    let (frames, end) = frames_with_times(response).await;
    assert_eq!(end, Ok(()));
    // HTTP/2 may end the stream with an empty DATA frame: not an event.
    let frames: Vec<_> = frames.into_iter().filter(|(_, b)| !b.is_empty()).collect();
    let got: Vec<String> = frames
        .iter()
        .map(|(_, b)| String::from_utf8(b.to_vec()).unwrap())
        .collect();
    assert_eq!(got, chunks);
    assert!(frames[frames.len() - 1].0 - frames[0].0 >= Duration::from_millis(250));
}
