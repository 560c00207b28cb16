//! The upstream connection pool: a connection is reused once its response
//! has been read to the end, never while a response is still on it, and a
//! connection the upstream closed while pooled costs no request.

use std::time::Duration;

use crate::support::*;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

const CHAT: &str = "/v1/chat/completions";

fn chat_body(stream: bool) -> String {
    json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hello"}]})
        .to_string()
}

#[tokio::test]
async fn requests_one_after_another_share_one_upstream_connection() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    for _ in 0..5 {
        let answer = send(post_json(&proxy.url(CHAT), chat_body(false))).await;
        assert_eq!(answer.status, 200);
        // An unmatched route, body streamed: the same connection.
        let models = Request::get(proxy.url("/v1/models"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        assert_eq!(send(models).await.status, 200);
    }
    // Streams of unknown length go back to the pool once read to the end.
    upstream.set_behavior(Behavior::Sse {
        chunks: vec!["data: {\"n\":1}\n\n".into(), "data: [DONE]\n\n".into()],
        gap: Duration::from_millis(5),
    });
    for _ in 0..5 {
        let answer = send(post_json(&proxy.url(CHAT), chat_body(true))).await;
        assert_eq!(answer.status, 200);
        assert!(answer.body.ends_with(b"data: [DONE]\n\n"));
    }
    assert_eq!(upstream.received().len(), 15);
    assert_eq!(
        upstream.connections(),
        1,
        "every request reused the first connection"
    );
}

#[tokio::test]
async fn a_connection_whose_client_left_mid_stream_is_not_reused() {
    let upstream = MockUpstream::start(Behavior::Sse {
        chunks: (0..50)
            .map(|i| format!("data: {{\"n\":{i}}}\n\n"))
            .collect(),
        gap: Duration::from_millis(20),
    })
    .await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let response = client()
        .request(post_json(&proxy.url(CHAT), chat_body(true)))
        .await
        .unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some());
    drop(body);

    // The next request cannot go on the connection still carrying the
    // abandoned stream: it gets a new one, and its own answer.
    upstream.set_behavior(Behavior::Json(200, json!({"after": "leaving"})));
    let answer = send(post_json(&proxy.url(CHAT), chat_body(false))).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.json(), json!({"after": "leaving"}));
    assert_eq!(upstream.connections(), 2);
}

/// An upstream that answers one request per connection and then closes it,
/// without saying so (no `Connection: close`): what an upstream whose idle
/// timeout is shorter than the pool's looks like.
async fn closing_upstream() -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut socket, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                // Reads the head and the Content-Length body, then answers.
                let mut read = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    let Ok(n) = socket.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    read.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&read);
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length = text[..end]
                            .lines()
                            .find_map(|l| {
                                let (name, value) = l.split_once(':')?;
                                name.eq_ignore_ascii_case("content-length")
                                    .then(|| value.trim().parse::<usize>().ok())?
                            })
                            .unwrap_or(0);
                        if read.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let body = r#"{"ok":true}"#;
                let answer = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
                // Closed as soon as answered.
            });
        }
    });
    addr
}

#[tokio::test]
async fn an_upstream_closing_pooled_connections_costs_no_request() {
    let upstream = closing_upstream().await;
    let proxy = TestProxy::start("", &format!("http://{upstream}")).await;
    for i in 0..40 {
        let answer = send(post_json(&proxy.url(CHAT), chat_body(false))).await;
        assert_eq!(answer.status, 200, "request {i}: {:?}", answer.body);
        assert_eq!(answer.json(), json!({"ok": true}));
        // Sometimes the close has been seen before the next request,
        // sometimes not.
        if i % 2 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}

#[tokio::test]
async fn a_response_ending_in_trailers_gives_its_connection_back() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    let accepted = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                // Bodiless GETs, answered one after another on the connection.
                let mut read = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = read.windows(4).position(|w| w == b"\r\n\r\n") {
                        read.drain(..end + 4);
                        let answer = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-t\r\n\r\n2\r\nok\r\n0\r\nx-t: 1\r\n\r\n";
                        if socket.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match socket.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => read.extend_from_slice(&chunk[..n]),
                    }
                }
            });
        }
    });
    let proxy = TestProxy::start("", &format!("http://{upstream}")).await;
    for _ in 0..5 {
        let request = Request::get(proxy.url("/v1/models"))
            .header("te", "trailers")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let answer = send(request).await;
        assert_eq!(answer.status, 200);
        assert_eq!(&answer.body[..], b"ok");
    }
    assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1);
}
