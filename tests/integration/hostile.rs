//! Hostile input: slow and half-sent requests, connection floods, bodies
//! sent a byte at a time, memory-compact bombs, early refusals, reloads of
//! a broken file, and requests a reverse proxy must not pass on. Each test
//! is the regression test of one finding of a hostile-input run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use compaction_proxy::cli;
use compaction_proxy::config::Overrides;
use compaction_proxy::memory_compact;
use http::Request;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// Reads from `stream` until `done` holds for what was read, the peer
/// closes, or `limit` passes; returns what was read and whether the peer
/// closed.
async fn read_until(
    stream: &mut TcpStream,
    limit: Duration,
    done: impl Fn(&[u8]) -> bool,
) -> (Vec<u8>, bool) {
    let deadline = tokio::time::Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        if done(&got) {
            return (got, false);
        }
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Err(_) => return (got, false),
            Ok(Ok(0)) | Ok(Err(_)) => return (got, true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// Whether a whole response head has arrived.
fn has_head(bytes: &[u8]) -> bool {
    bytes.windows(4).any(|w| w == b"\r\n\r\n")
}

/// The status code of a raw HTTP/1.1 response.
fn status_of(response: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(response);
    text.split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"))
}

/// The JSON error `code` of a raw response whose body has fully arrived.
fn error_code_of(response: &[u8]) -> String {
    let text = String::from_utf8_lossy(response);
    let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
    let value: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{text}"));
    value["error"]["code"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Sends raw bytes and reads the whole response head and JSON body.
async fn raw_exchange(proxy: &TestProxy, request: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(request).await.unwrap();
    let (got, _) = read_until(&mut stream, Duration::from_secs(5), |got| {
        has_head(got) && got.ends_with(b"}")
    })
    .await;
    got
}

#[test]
fn by_default_an_unfinished_header_and_a_stalled_body_are_closed_within_60_s() {
    let server = compaction_proxy::config::ServerConfig::default();
    assert!(server.header_read_timeout_secs <= 60.0);
    assert!(server.body_idle_timeout_secs <= 60.0);
    assert!(server.keep_alive_timeout_secs <= 60.0);
    assert!(server.max_connections > 0);
    assert!(server.max_buffered_bytes >= server.max_body_bytes);
}

/// Under `config`, sends `bytes` on a new connection and reads until the
/// proxy closes it or `limit` passes: what was read, whether it closed, how
/// long that took, and how many requests reached the upstream.
async fn send_then_wait_for_close(
    config: &str,
    bytes: &[u8],
    limit: Duration,
) -> (Vec<u8>, bool, Duration, usize) {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(config, &upstream.url()).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream.write_all(bytes).await.unwrap();
    let started = Instant::now();
    let (got, closed) = read_until(&mut stream, limit, |_| false).await;
    (got, closed, started.elapsed(), upstream.received().len())
}

#[tokio::test]
async fn an_unfinished_header_is_closed_after_the_header_timeout() {
    let (_, closed, after, forwarded) = send_then_wait_for_close(
        "[server]\nheader_read_timeout_secs = 0.4\nkeep_alive_timeout_secs = 30",
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Half: ",
        Duration::from_secs(5),
    )
    .await;
    assert!(closed, "a partial header line is still open after 5 s");
    assert!(after >= Duration::from_millis(300));
    assert_eq!(forwarded, 0);
}

#[tokio::test]
async fn a_stalled_body_on_a_compacted_route_gets_408_and_nothing_is_forwarded() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("[server]\nbody_idle_timeout_secs = 0.4", &upstream.url()).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"messages\":",
        )
        .await
        .unwrap();
    let started = Instant::now();
    let (got, _) = read_until(&mut stream, Duration::from_secs(5), |got| {
        has_head(got) && got.ends_with(b"}")
    })
    .await;
    assert_eq!(status_of(&got), 408, "{}", String::from_utf8_lossy(&got));
    assert_eq!(error_code_of(&got), "body_timeout");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert!(upstream.received().is_empty(), "nothing is forwarded");
    assert_eq!(proxy.state.buffers.held(), 0, "its buffer is given back");
}

#[tokio::test]
async fn a_stalled_streamed_body_gets_408_not_a_gateway_timeout() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[server]\nbody_idle_timeout_secs = 0.4\n[upstream]\nresponse_header_timeout_secs = 30",
        &upstream.url(),
    )
    .await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            b"POST /v1/files HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nthe first part, then nothing",
        )
        .await
        .unwrap();
    let (got, _) = read_until(&mut stream, Duration::from_secs(5), |got| {
        has_head(got) && got.ends_with(b"}")
    })
    .await;
    assert_eq!(status_of(&got), 408, "{}", String::from_utf8_lossy(&got));
    assert_eq!(error_code_of(&got), "body_timeout");
}

#[tokio::test]
async fn a_silent_upstream_on_a_get_does_not_blame_the_request_body() {
    let upstream = MockUpstream::start(Behavior::Stall).await;
    let proxy = TestProxy::start(
        "[upstream]\nresponse_header_timeout_secs = 0.3",
        &upstream.url(),
    )
    .await;
    let answer = send(
        Request::get(proxy.url("/v1/models"))
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(answer.status, 504);
    assert_eq!(answer.json()["error"]["code"], "upstream_timeout");
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_but_a_slow_answer_is_not() {
    let upstream = MockUpstream::start(Behavior::SlowHeaders(Duration::from_millis(800))).await;
    let proxy = TestProxy::start(
        "[server]\nkeep_alive_timeout_secs = 0.3\nheader_read_timeout_secs = 30",
        &upstream.url(),
    )
    .await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    // A request in flight longer than the keep-alive timeout is answered...
    stream
        .write_all(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (got, closed) = read_until(&mut stream, Duration::from_secs(5), |got| {
        has_head(got) && got.ends_with(b"}")
    })
    .await;
    assert_eq!(status_of(&got), 200, "{}", String::from_utf8_lossy(&got));
    assert!(!closed);
    // ...and the connection, idle after it, is closed.
    let idle = Instant::now();
    let (_, closed) = read_until(&mut stream, Duration::from_secs(5), |_| false).await;
    assert!(
        closed,
        "an idle keep-alive connection is still open after 5 s"
    );
    assert!(idle.elapsed() >= Duration::from_millis(200));
}

#[tokio::test]
async fn an_upstream_that_stops_reading_a_body_does_not_hold_the_client_after_the_504() {
    // An upstream that accepts and never reads, with a small receive
    // buffer: a large streamed body stops moving almost at once.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let deaf = socket.listen(16).unwrap();
    let upstream_url = format!("http://{}", deaf.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((stream, _)) = deaf.accept().await {
            held.push(stream);
        }
    });
    let proxy = TestProxy::start(
        "[upstream]\nresponse_header_timeout_secs = 1",
        &upstream_url,
    )
    .await;
    let (mut from_proxy, mut to_proxy) = TcpStream::connect(proxy.addr).await.unwrap().into_split();
    // An unmatched route: the body is streamed to the upstream as it comes.
    let sending = tokio::spawn(async move {
        let size = 64 << 20;
        let head = format!("POST /v1/other HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n");
        to_proxy.write_all(head.as_bytes()).await?;
        let chunk = vec![b'x'; 64 << 10];
        for _ in 0..size / chunk.len() {
            to_proxy.write_all(&chunk).await?;
        }
        std::io::Result::Ok(())
    });
    let mut got = Vec::new();
    let mut buf = [0u8; 8192];
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match from_proxy.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .is_ok();
    assert_eq!(status_of(&got), 504, "{}", String::from_utf8_lossy(&got));
    assert!(
        closed,
        "the client's connection is still held 20 s after its 504: {}",
        String::from_utf8_lossy(&got)
    );
    sending.abort();
    held.abort();
}

/// 20,000 messages of 8 to 13 words drawn from 30 (about 1.8 MB): every
/// earlier message of the same role shares the words dedupe searches on.
fn narrow_vocabulary_body(seed: u64) -> String {
    let vocabulary: Vec<String> = (0..30).map(|i| format!("term{i}")).collect();
    let mut state = seed;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 33) % n) as usize
    };
    let messages: Vec<Value> = (0..20_000)
        .map(|i| {
            let words: Vec<&str> = (0..8 + next(6))
                .map(|_| vocabulary[next(30)].as_str())
                .collect();
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            json!({"role": role, "content": words.join(" ")})
        })
        .collect();
    json!({"model": "m", "messages": messages}).to_string()
}

#[tokio::test]
async fn narrow_vocabulary_bodies_are_compacted_and_a_small_request_beside_them_is_not_queued() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy =
        TestProxy::start("[policies.default]\nbudget_chars = 100000", &upstream.url()).await;
    let url = proxy.url("/v1/chat/completions");
    let finished = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut large = Vec::new();
    for seed in 0..4 {
        let (url, finished) = (url.clone(), finished.clone());
        let body = narrow_vocabulary_body(seed);
        large.push(tokio::spawn(async move {
            let answer = send(post_json(&url, body)).await;
            finished.lock().unwrap().push("large");
            answer
        }));
    }
    // The small request comes while the large ones are being compacted.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let small = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let answer = send(post_json(&url, small.to_string())).await;
    finished.lock().unwrap().push("small");
    assert_eq!(answer.status, 200);
    for handle in large {
        let answer = handle.await.unwrap();
        assert_eq!(answer.status, 200);
        assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
        assert_eq!(answer.header("x-compaction-budget-met"), Some("true"));
    }
    assert_eq!(
        finished.lock().unwrap()[0],
        "small",
        "a request needing no compaction waited for the large ones"
    );
}

#[tokio::test]
async fn an_idle_http2_client_that_never_acknowledges_the_close_is_dropped() {
    // HTTP/2 with prior knowledge: the preface and an empty SETTINGS frame,
    // then nothing: no SETTINGS ack and no answer to the GOAWAY's PING.
    let (got, closed, _, _) = send_then_wait_for_close(
        "[server]\nkeep_alive_timeout_secs = 0.3\nheader_read_timeout_secs = 30",
        b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00",
        Duration::from_secs(10),
    )
    .await;
    assert!(
        closed,
        "still open 10 s after a 0.3 s keep-alive timeout ({} bytes read)",
        got.len()
    );
}

#[tokio::test]
async fn connections_past_the_cap_wait_until_one_closes() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[server]\nmax_connections = 2\nheader_read_timeout_secs = 30\nkeep_alive_timeout_secs = 30",
        &upstream.url(),
    )
    .await;
    let first = TcpStream::connect(proxy.addr).await.unwrap();
    let _second = TcpStream::connect(proxy.addr).await.unwrap();
    let mut third = TcpStream::connect(proxy.addr).await.unwrap(); // in the backlog
    third
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let (got, _) = read_until(&mut third, Duration::from_millis(400), has_head).await;
    assert!(got.is_empty(), "served past the cap: {got:?}");
    drop(first);
    let (got, _) = read_until(&mut third, Duration::from_secs(5), |got| {
        has_head(got) && got.ends_with(b"ok\n")
    })
    .await;
    assert_eq!(status_of(&got), 200);
}

#[tokio::test]
async fn one_byte_chunks_are_held_in_one_buffer_counted_against_the_budget() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let text = "abcdefghij ".repeat(10_000);
    let payload = Bytes::from(
        json!({"model": "m", "messages": [{"role": "user", "content": text}]}).to_string(),
    );
    let chunks: Vec<Bytes> = (0..payload.len())
        .map(|i| payload.slice(i..i + 1))
        .collect();
    let request = Request::post(proxy.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Chunked::new(chunks))
        .unwrap();
    let response = chunked_client().request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(upstream.last().body, payload, "forwarded whole");
    let peak = proxy.state.buffers.peak();
    assert!(
        peak >= payload.len(),
        "the budget counts what is held: {peak}"
    );
    assert!(
        peak <= 2 * payload.len(),
        "{peak} bytes held for a {} byte body",
        payload.len()
    );
    assert!(
        wait_until(Duration::from_secs(2), || proxy.state.buffers.held() == 0).await,
        "the buffer is given back when the request finishes"
    );
}

#[tokio::test]
async fn past_the_global_buffer_budget_bodies_get_503_until_buffers_free_up() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[server]\nmax_body_bytes = 1000\nmax_buffered_bytes = 1500",
        &upstream.url(),
    )
    .await;
    // A slow upload holds 1,000 bytes of the 1,500...
    let mut slow = TcpStream::connect(proxy.addr).await.unwrap();
    slow.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"messages\":",
    )
    .await
    .unwrap();
    assert!(
        wait_until(Duration::from_secs(2), || proxy.state.buffers.held()
            >= 1000)
        .await
    );
    // ...so another body of that size does not fit.
    let body = format!("{{\"pad\":\"{}\"}}", "x".repeat(900));
    let answer = send(post_json(&proxy.url("/v1/chat/completions"), body.clone())).await;
    assert_eq!(answer.status, 503);
    assert_eq!(answer.header("retry-after"), Some("1"));
    assert_eq!(answer.json()["error"]["code"], "proxy_overloaded");
    // The slow client leaves: its share comes back.
    drop(slow);
    assert!(
        wait_until(Duration::from_secs(2), || proxy.state.buffers.held() == 0).await,
        "a departed client's buffer is given back"
    );
    let answer = send(post_json(&proxy.url("/v1/chat/completions"), body)).await;
    assert_eq!(answer.status, 200);
}

#[tokio::test]
async fn an_early_413_is_read_by_a_client_that_sends_its_whole_body_first() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("[server]\nmax_body_bytes = 1024", &upstream.url()).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    let total = 8 * 1024 * 1024;
    stream
        .write_all(
            format!(
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {total}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // Like Python's urllib: the whole body goes out before anything is read.
    let piece = vec![b' '; 64 * 1024];
    for i in 0..total / piece.len() {
        if let Err(e) = stream.write_all(&piece).await {
            panic!("the proxy stopped reading after {i} pieces: {e}");
        }
        if i % 16 == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let (got, _) = read_until(&mut stream, Duration::from_secs(5), |got| {
        has_head(got) && got.ends_with(b"}")
    })
    .await;
    assert_eq!(status_of(&got), 413, "{}", String::from_utf8_lossy(&got));
    assert_eq!(error_code_of(&got), "body_too_large");
    assert!(upstream.received().is_empty());
}

#[tokio::test]
async fn memory_compact_refuses_a_body_larger_than_the_schema_allows_before_reading_it() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let declared = 14 * 1024 * 1024;
    assert!(declared > memory_compact::MAX_BODY_BYTES);
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            format!(
                "POST /v1/memory-compact HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    // Not one body byte sent: the answer comes from the declared length.
    let (got, _) = read_until(&mut stream, Duration::from_secs(5), |got| {
        has_head(got) && got.ends_with(b"}")
    })
    .await;
    assert_eq!(status_of(&got), 413, "{}", String::from_utf8_lossy(&got));
    assert_eq!(proxy.state.buffers.peak(), 0, "nothing was buffered");

    // A chunked body is cut off at the bound, not at `max_body_bytes`.
    let chunk = Bytes::from(vec![b' '; 1024 * 1024]);
    let chunks = (0..10).map(|_| chunk.clone());
    let request = Request::post(proxy.url("/v1/memory-compact"))
        .header("content-type", "application/json")
        .body(Chunked::new(chunks))
        .unwrap();
    let response = chunked_client().request(request).await.unwrap();
    assert_eq!(response.status(), 413);
    let peak = proxy.state.buffers.peak();
    assert!(
        peak <= memory_compact::MAX_BODY_BYTES,
        "{peak} bytes held for memory-compact"
    );
}

#[test]
fn the_memory_compact_bound_admits_the_largest_valid_request() {
    let messages: Vec<Value> = (0..200)
        .map(|i| {
            json!({"id": format!("{i:0>128}"), "role": "user", "content": "\u{10348}".repeat(8000)})
        })
        .collect();
    let largest = serde_json::to_vec_pretty(&json!({
        "messages": messages, "budget_chars": 400000, "keep_last_n": 50,
        "keep_roles": ["system", "user", "assistant", "tool"],
        "duplicate_threshold": 0.5, "max_message_chars": 4000,
    }))
    .unwrap();
    assert!(
        memory_compact::parse(&largest).is_ok(),
        "the request is valid"
    );
    assert!(
        largest.len() <= memory_compact::MAX_BODY_BYTES,
        "{} > {}",
        largest.len(),
        memory_compact::MAX_BODY_BYTES
    );
}

#[tokio::test]
async fn connect_is_refused_not_forwarded() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let got = raw_exchange(
        &proxy,
        b"CONNECT internal.example:443 HTTP/1.1\r\nHost: internal.example:443\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&got), 405, "{}", String::from_utf8_lossy(&got));
    assert_eq!(error_code_of(&got), "method_not_allowed");
    assert!(upstream.received().is_empty());
}

#[tokio::test]
async fn a_target_that_is_not_a_path_is_refused_not_forwarded_as_root() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let got = raw_exchange(&proxy, b"GET x HTTP/1.1\r\nHost: x\r\n\r\n").await;
    assert_eq!(status_of(&got), 400, "{}", String::from_utf8_lossy(&got));
    assert_eq!(error_code_of(&got), "invalid_request_target");
    assert!(upstream.received().is_empty());
}

#[tokio::test]
async fn a_transfer_coding_other_than_chunked_is_refused() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let got = raw_exchange(
        &proxy,
        b"POST /v1/files HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(status_of(&got), 501, "{}", String::from_utf8_lossy(&got));
    assert_eq!(error_code_of(&got), "unsupported_transfer_coding");
    assert!(upstream.received().is_empty());
}

#[tokio::test]
async fn a_duplicate_text_key_is_not_a_way_past_the_budget() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[policies.default]\nbudget_chars = 1000\nkeep_last_n = 1\npin_first_user = false",
        &upstream.url(),
    )
    .await;
    let long = "word ".repeat(2000);
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":[{{"type":"text","text":"short","text":"{long}"}}]}},{{"role":"user","content":"hi"}}]}}"#
    );
    let answer = send(post_json(&proxy.url("/v1/chat/completions"), body.clone())).await;
    assert_eq!(answer.status, 200);
    // The part it cannot read keeps its message whole, counted by its
    // bytes: never less than what the upstream reads. Over the budget with
    // nothing to remove: not "unchanged", which says it fit.
    assert_eq!(
        answer.header("x-compaction-status"),
        Some("skipped; nothing-removable")
    );
    assert_eq!(answer.header("x-compaction-budget-met"), Some("false"));
    let counted: usize = answer
        .header("x-compaction-input-chars")
        .unwrap()
        .parse()
        .unwrap();
    assert!(counted >= long.len(), "{counted}");
    assert_eq!(
        upstream.last().body,
        Bytes::from(body),
        "forwarded untouched"
    );
}

#[tokio::test]
async fn a_reload_refuses_an_empty_file_and_never_moves_the_upstream() {
    let path = temp_file("config.toml", b"[upstream]\nurl = \"http://127.0.0.1:9\"\n");
    let overrides = Overrides::default();
    let current = cli::reload(&runtime("", "http://127.0.0.1:9"), Some(&path), &overrides)
        .expect("the first file loads");
    assert_eq!(current.upstream.to_string(), "http://127.0.0.1:9/");

    for blank in ["", "\n  \n", "# all commented out\n"] {
        std::fs::write(&path, blank).unwrap();
        let refused = cli::reload(&current, Some(&path), &overrides);
        assert!(refused.is_err(), "{blank:?} was reloaded");
    }

    std::fs::write(
        &path,
        "[upstream]\nurl = \"https://api.openai.com\"\n[policies.default]\nbudget_chars = 1234\n",
    )
    .unwrap();
    let reloaded = cli::reload(&current, Some(&path), &overrides).expect("a valid file loads");
    assert_eq!(
        reloaded.config.policies["default"].budget_chars, 1234,
        "the rest of the file is in force"
    );
    assert_eq!(
        reloaded.upstream, current.upstream,
        "the upstream changes on restart only"
    );
    assert_eq!(reloaded.config.upstream.url, current.config.upstream.url);

    // Every restart-only setting stays as it runs, so the next reload of
    // the original file finds nothing changed.
    std::fs::write(
        &path,
        "[server]\nlisten = \"127.0.0.1:1\"\nmax_connections = 7\nworkers = 3\nkeep_alive_timeout_secs = 1\n[cache]\nmax_bytes = 5\n",
    )
    .unwrap();
    let reloaded = cli::reload(&current, Some(&path), &overrides).expect("a valid file loads");
    assert_eq!(reloaded.listen, current.listen);
    assert_eq!(reloaded.timeouts.keep_alive, current.timeouts.keep_alive);
    let (new, old) = (&reloaded.config, &current.config);
    assert_eq!(new.server.listen, old.server.listen);
    assert_eq!(new.server.max_connections, old.server.max_connections);
    assert_eq!(new.server.workers, old.server.workers);
    assert_eq!(
        new.server.keep_alive_timeout_secs,
        old.server.keep_alive_timeout_secs
    );
    assert_eq!(new.cache.max_bytes, old.cache.max_bytes);
}

#[tokio::test]
async fn requests_keep_their_upstream_after_a_reload_that_names_another() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let other = MockUpstream::start(Behavior::Json(200, json!({"other": true}))).await;
    let path = temp_file(
        "config.toml",
        format!("[upstream]\nurl = \"{}\"\n", other.url()).as_bytes(),
    );
    let reloaded =
        cli::reload(&proxy.state.runtime(), Some(&path), &Overrides::default()).expect("loads");
    proxy.state.reload(reloaded);
    let answer = send(
        Request::get(proxy.url("/v1/models"))
            .body(http_body_util::Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(upstream.received().len(), 1);
    assert!(other.received().is_empty());
}

/// One assistant message of 40,000 calls answered by 40,000 results whose
/// ids match none (Anthropic blocks in one message, chat `tool` messages)
/// parses. That matching the results to the calls stays linear
/// is measured in `benches/engine.rs` (`unmatched_tool_results`), not here.
#[test]
fn thousands_of_tool_results_are_matched_in_linear_time() {
    use compaction_proxy::format::Format;
    const N: usize = 40_000;
    let calls: Vec<serde_json::Value> = (0..N)
        .map(|k| json!({"type": "tool_use", "id": format!("toolu_{k:08}"), "name": "f", "input": {}}))
        .collect();
    let results: Vec<serde_json::Value> = (0..N)
        .map(|k| json!({"type": "tool_result", "tool_use_id": format!("other_{k:08}"), "content": "x"}))
        .collect();
    let anthropic = json!({"messages": [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": calls},
        {"role": "user", "content": results},
    ]})
    .to_string();
    let chat_calls: Vec<serde_json::Value> = (0..N)
        .map(|k| json!({"id": format!("call_{k:08}"), "type": "function", "function": {"name": "f", "arguments": "{}"}}))
        .collect();
    let mut messages =
        vec![json!({"role": "assistant", "content": null, "tool_calls": chat_calls})];
    messages.extend(
        (0..N).map(
            |k| json!({"role": "tool", "tool_call_id": format!("other_{k:08}"), "content": "x"}),
        ),
    );
    let chat = json!({ "messages": messages }).to_string();
    for (format, body) in [(Format::Anthropic, anthropic), (Format::Chat, chat)] {
        let parsed = format.parse(body.as_bytes(), usize::MAX).expect("parses");
        assert!(parsed.conversation.items.len() >= 3, "{format:?}");
    }
}
