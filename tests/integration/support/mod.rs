//! Test support: an in-process mock upstream that records what it received
//! and answers as told (JSON, slow SSE, reset, stall), and the real proxy
//! server started in-process against it.

#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use compaction_proxy::config::{self, Overrides};
use compaction_proxy::policy::Runtime;
use compaction_proxy::proxy::{self, AppState};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// What the mock upstream received.
#[derive(Debug, Clone)]
pub struct Received {
    pub method: http::Method,
    pub uri: http::Uri,
    pub version: http::Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Received {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("upstream received JSON")
    }
}

/// How the mock answers.
#[derive(Debug, Clone)]
pub enum Behavior {
    /// A JSON body with this status.
    Json(u16, serde_json::Value),
    /// `text/event-stream`: each chunk sent after `gap`, then the body ends.
    Sse { chunks: Vec<String>, gap: Duration },
    /// Sends these SSE chunks, then resets the connection mid-stream.
    ResetAfter(Vec<String>),
    /// Never sends response headers.
    Stall,
    /// The handler fails before answering: HTTP/2 resets the stream,
    /// HTTP/1.1 closes the connection.
    FailStream,
    /// Answers `{"ok": true}` after this long.
    SlowHeaders(Duration),
    /// Accepts a protocol upgrade (101) and then echoes what it reads, in
    /// upper case, until the connection closes.
    UpgradeEcho,
    /// Sends headers, then nothing (an idle body).
    SilentBody,
    /// Answers like the OpenAI API: a chat completion, or its SSE stream
    /// when the request has `"stream": true`. The reply text reports how
    /// many messages arrived (`"received N messages"`).
    OpenAiChat,
    /// A JSON body with this status and these extra response headers.
    JsonWithHeaders(u16, Vec<(String, String)>, serde_json::Value),
    /// Answers like the Anthropic Messages API: a message, or its SSE
    /// stream (`message_start` ... `message_stop`) when the request has
    /// `"stream": true`. With `tools` in the request and no `tool_result`
    /// in its last message, the answer is a `tool_use` of the first tool;
    /// otherwise the text `"received N messages"`.
    AnthropicMessages,
    /// Answers like the OpenAI Responses API: a response, or its SSE stream
    /// (`response.created` ... `response.completed`) when the request has
    /// `"stream": true`. The output text is `"received N items"` (a string
    /// `input` is one item).
    OpenAiResponses,
    /// Answers a Messages request with what the function makes of its JSON
    /// body (and whether the thinking-binding beta was sent): `Ok(message)`
    /// as a message (or its SSE stream when the request has
    /// `"stream": true`), `Err(error)` as a 400 with that body.
    AnthropicWith(AnthropicFn),
}

/// The function of [`Behavior::AnthropicWith`].
#[derive(Clone)]
#[allow(clippy::type_complexity)]
pub struct AnthropicFn(
    pub  Arc<
        dyn Fn(&serde_json::Value, bool) -> Result<serde_json::Value, serde_json::Value>
            + Send
            + Sync,
    >,
);

impl std::fmt::Debug for AnthropicFn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnthropicFn")
    }
}

#[derive(Default)]
struct Shared {
    received: Vec<Received>,
    /// Requests whose handling was cut off by the proxy (connection closed).
    cancelled: usize,
    /// Connections accepted.
    connections: usize,
    behavior: Option<Behavior>,
}

#[derive(Clone)]
pub struct MockUpstream {
    pub addr: SocketAddr,
    shared: Arc<Mutex<Shared>>,
}

struct CancelGuard {
    shared: Arc<Mutex<Shared>>,
    done: bool,
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done {
            self.shared.lock().unwrap().cancelled += 1;
        }
    }
}

/// A body stream that counts as cancelled if dropped before its end.
struct GuardedStream {
    rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>,
    guard: CancelGuard,
}

impl http_body::Body for GuardedStream {
    type Data = Bytes;
    type Error = std::io::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        let polled = self.rx.poll_recv(cx);
        if let std::task::Poll::Ready(None) = polled {
            self.guard.done = true;
        }
        polled
    }
}

impl MockUpstream {
    pub async fn start(behavior: Behavior) -> MockUpstream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Mutex::new(Shared {
            behavior: Some(behavior),
            ..Default::default()
        }));
        let mock = MockUpstream { addr, shared };
        let server = mock.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                server.shared.lock().unwrap().connections += 1;
                let server = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| {
                        let server = server.clone();
                        async move {
                            let fail = matches!(
                                server.shared.lock().unwrap().behavior,
                                Some(Behavior::FailStream)
                            );
                            if fail {
                                return Err(std::io::Error::other("the mock fails this stream"));
                            }
                            Ok(server.answer(req).await)
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        mock
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_behavior(&self, behavior: Behavior) {
        self.shared.lock().unwrap().behavior = Some(behavior);
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.lock().unwrap().received.clone()
    }

    pub fn last(&self) -> Received {
        self.received().pop().expect("upstream received a request")
    }

    pub fn cancelled(&self) -> usize {
        self.shared.lock().unwrap().cancelled
    }

    /// How many connections the mock has accepted.
    pub fn connections(&self) -> usize {
        self.shared.lock().unwrap().connections
    }

    async fn answer(
        &self,
        req: Request<Incoming>,
    ) -> Response<http_body_util::combinators::BoxBody<Bytes, std::io::Error>> {
        let (mut parts, body) = req.into_parts();
        let on_upgrade = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
        let body = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let behavior = {
            let mut shared = self.shared.lock().unwrap();
            shared.received.push(Received {
                method: parts.method,
                uri: parts.uri,
                version: parts.version,
                headers: parts.headers,
                body,
            });
            shared.behavior.clone().expect("behavior set")
        };
        match behavior {
            Behavior::Json(status, value) => Response::builder()
                .status(status)
                .header("content-type", "application/json")
                .body(
                    Full::new(Bytes::from(value.to_string()))
                        .map_err(|e| match e {})
                        .boxed(),
                )
                .unwrap(),
            Behavior::JsonWithHeaders(status, headers, value) => {
                let mut builder = Response::builder()
                    .status(status)
                    .header("content-type", "application/json");
                for (name, value) in headers {
                    builder = builder.header(name, value);
                }
                builder
                    .body(
                        Full::new(Bytes::from(value.to_string()))
                            .map_err(|e| match e {})
                            .boxed(),
                    )
                    .unwrap()
            }
            Behavior::Sse { chunks, gap } => self.sse(chunks, gap, false),
            Behavior::OpenAiChat => {
                let request: serde_json::Value =
                    serde_json::from_slice(&self.last().body).unwrap_or_default();
                let n = request["messages"].as_array().map_or(0, Vec::len);
                let text = format!("received {n} messages");
                if request["stream"] == serde_json::Value::Bool(true) {
                    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
                        let event = serde_json::json!({
                            "id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": "mock",
                            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                        });
                        format!("data: {event}\n\n")
                    };
                    let mut chunks = vec![chunk(
                        serde_json::json!({"role": "assistant", "content": ""}),
                        serde_json::Value::Null,
                    )];
                    for word in text.split_inclusive(' ') {
                        chunks.push(chunk(
                            serde_json::json!({"content": word}),
                            serde_json::Value::Null,
                        ));
                    }
                    chunks.push(chunk(serde_json::json!({}), serde_json::json!("stop")));
                    chunks.push("data: [DONE]\n\n".to_owned());
                    self.sse(chunks, Duration::from_millis(5), false)
                } else {
                    let completion = serde_json::json!({
                        "id": "chatcmpl-mock", "object": "chat.completion", "created": 1, "model": "mock",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    });
                    Response::builder()
                        .header("content-type", "application/json")
                        .body(
                            Full::new(Bytes::from(completion.to_string()))
                                .map_err(|e| match e {})
                                .boxed(),
                        )
                        .unwrap()
                }
            }
            Behavior::AnthropicMessages => {
                let request: serde_json::Value =
                    serde_json::from_slice(&self.last().body).unwrap_or_default();
                let (message, stream) = anthropic_answer(&request);
                if stream {
                    self.sse(anthropic_events(&message), Duration::from_millis(2), false)
                } else {
                    json_response(&message)
                }
            }
            Behavior::AnthropicWith(answer) => {
                let last = self.last();
                let request: serde_json::Value =
                    serde_json::from_slice(&last.body).unwrap_or_default();
                let beta = last.headers.get_all("anthropic-beta").iter().any(|v| {
                    v.to_str().is_ok_and(|v| {
                        v.split(',')
                            .any(|b| b.trim() == "thinking-binding-controls-2026-08-01")
                    })
                });
                match (answer.0)(&request, beta) {
                    Ok(message) if request["stream"] == serde_json::Value::Bool(true) => {
                        self.sse(anthropic_events(&message), Duration::from_millis(1), false)
                    }
                    Ok(message) => json_response(&message),
                    Err(error) => {
                        let mut refused = json_response(&error);
                        *refused.status_mut() = StatusCode::BAD_REQUEST;
                        refused
                    }
                }
            }
            Behavior::OpenAiResponses => {
                let request: serde_json::Value =
                    serde_json::from_slice(&self.last().body).unwrap_or_default();
                let n = request["input"]
                    .as_array()
                    .map_or(usize::from(request["input"].is_string()), Vec::len);
                let text = format!("received {n} items");
                if request["stream"] == serde_json::Value::Bool(true) {
                    self.sse(responses_events(&text), Duration::from_millis(2), false)
                } else {
                    json_response(&responses_object(&text, "completed"))
                }
            }
            Behavior::ResetAfter(chunks) => self.sse(chunks, Duration::from_millis(20), true),
            Behavior::UpgradeEcho => {
                let on_upgrade = on_upgrade.expect("an upgradable request");
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let Ok(upgraded) = on_upgrade.await else {
                        return;
                    };
                    let mut io = TokioIo::new(upgraded);
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = io.read(&mut buf).await {
                        if n == 0 || io.write_all(&buf[..n].to_ascii_uppercase()).await.is_err() {
                            return;
                        }
                    }
                });
                Response::builder()
                    .status(StatusCode::SWITCHING_PROTOCOLS)
                    .header("connection", "upgrade")
                    .header("upgrade", "websocket")
                    .header("sec-websocket-accept", "mock")
                    .body(Full::new(Bytes::new()).map_err(|e| match e {}).boxed())
                    .unwrap()
            }
            Behavior::SlowHeaders(delay) => {
                tokio::time::sleep(delay).await;
                Response::builder()
                    .header("content-type", "application/json")
                    .body(
                        Full::new(Bytes::from_static(b"{\"ok\":true}"))
                            .map_err(|e| match e {})
                            .boxed(),
                    )
                    .unwrap()
            }
            Behavior::FailStream => unreachable!("failed before answering"),
            Behavior::Stall => {
                let _guard = CancelGuard {
                    shared: self.shared.clone(),
                    done: false,
                };
                tokio::time::sleep(Duration::from_secs(3600)).await;
                unreachable!("the proxy gives up first")
            }
            Behavior::SilentBody => {
                let (tx, rx) = tokio::sync::mpsc::channel(1);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_secs(3600)).await;
                    drop(tx);
                });
                let stream = self.guarded(rx);
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(stream.boxed())
                    .unwrap()
            }
        }
    }

    /// A response body from `rx` that records a cancellation if the proxy
    /// drops it before its end.
    fn guarded(
        &self,
        rx: tokio::sync::mpsc::Receiver<Result<Frame<Bytes>, std::io::Error>>,
    ) -> GuardedStream {
        GuardedStream {
            rx,
            guard: CancelGuard {
                shared: self.shared.clone(),
                done: false,
            },
        }
    }

    fn sse(
        &self,
        chunks: Vec<String>,
        gap: Duration,
        reset: bool,
    ) -> Response<http_body_util::combinators::BoxBody<Bytes, std::io::Error>> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            for chunk in chunks {
                tokio::time::sleep(gap).await;
                if tx.send(Ok(Frame::data(Bytes::from(chunk)))).await.is_err() {
                    return; // the proxy went away: the guard records it
                }
            }
            if reset {
                let _ = tx
                    .send(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "mock reset",
                    )))
                    .await;
            }
        });
        let stream = self.guarded(rx);
        Response::builder()
            .header("content-type", "text/event-stream")
            .header("cache-control", "no-cache")
            .body(stream.boxed())
            .unwrap()
    }
}

type MockResponse = Response<http_body_util::combinators::BoxBody<Bytes, std::io::Error>>;

fn json_response(value: &serde_json::Value) -> MockResponse {
    Response::builder()
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(value.to_string()))
                .map_err(|e| match e {})
                .boxed(),
        )
        .unwrap()
}

/// The Messages API's answer to `request`, and whether it is streamed.
fn anthropic_answer(request: &serde_json::Value) -> (serde_json::Value, bool) {
    use serde_json::json;
    let messages = request["messages"].as_array().cloned().unwrap_or_default();
    let answered_tool = messages.last().is_some_and(|m| {
        m["content"]
            .as_array()
            .is_some_and(|b| b.iter().any(|b| b["type"] == "tool_result"))
    });
    let tool = request["tools"][0]["name"].as_str();
    let (content, stop_reason) = match tool {
        Some(name) if !answered_tool => (
            json!([{"type": "tool_use", "id": "toolu_mock_1", "name": name, "input": {"path": "src/lib.rs"}}]),
            "tool_use",
        ),
        _ => (
            json!([{"type": "text", "text": format!("received {} messages", messages.len())}]),
            "end_turn",
        ),
    };
    let message = json!({
        "id": "msg_mock", "type": "message", "role": "assistant", "model": "mock",
        "content": content, "stop_reason": stop_reason, "stop_sequence": null,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    });
    (message, request["stream"] == serde_json::Value::Bool(true))
}

/// A Messages API answer as its SSE events.
fn anthropic_events(message: &serde_json::Value) -> Vec<String> {
    use serde_json::json;
    let event = |name: &str, data: serde_json::Value| format!("event: {name}\ndata: {data}\n\n");
    let mut start = message.clone();
    start["content"] = json!([]);
    start["stop_reason"] = serde_json::Value::Null;
    let mut events = vec![
        event(
            "message_start",
            json!({"type": "message_start", "message": start}),
        ),
        event("ping", json!({"type": "ping"})),
    ];
    for (index, block) in message["content"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        if block["type"] == "text" {
            events.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}}),
            ));
            for word in block["text"].as_str().unwrap_or("").split_inclusive(' ') {
                events.push(event(
                    "content_block_delta",
                    json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": word}}),
                ));
            }
        } else {
            let mut empty = block.clone();
            empty["input"] = json!({});
            events.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": empty}),
            ));
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": block["input"].to_string()}}),
            ));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": message["stop_reason"], "stop_sequence": null}, "usage": {"output_tokens": 3}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events
}

/// A Responses API response object with one output message of `text`.
fn responses_object(text: &str, status: &str) -> serde_json::Value {
    use serde_json::json;
    let output = if status == "completed" {
        json!([{"type": "message", "id": "msg_mock", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}])
    } else {
        json!([])
    };
    json!({
        "id": "resp_mock", "object": "response", "created_at": 1, "status": status,
        "model": "mock", "output": output, "parallel_tool_calls": true, "tool_choice": "auto",
        "tools": [], "error": null, "incomplete_details": null, "instructions": null,
        "metadata": {}, "temperature": 1.0, "top_p": 1.0,
        "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                  "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    })
}

/// A Responses API answer of `text` as its SSE events.
fn responses_events(text: &str) -> Vec<String> {
    use serde_json::json;
    let mut sequence = 0;
    let mut event = |mut data: serde_json::Value| {
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        format!(
            "event: {}\ndata: {data}\n\n",
            data["type"].as_str().unwrap()
        )
    };
    let item = |status: &str, text: &str| {
        json!({"type": "message", "id": "msg_mock", "status": status, "role": "assistant",
               "content": if text.is_empty() { json!([]) } else {
                   json!([{"type": "output_text", "text": text, "annotations": []}]) }})
    };
    let part = |text: &str| json!({"type": "output_text", "text": text, "annotations": []});
    let at = json!({"item_id": "msg_mock", "output_index": 0, "content_index": 0});
    let with = |mut base: serde_json::Value, extra: serde_json::Value| {
        for (k, v) in extra.as_object().unwrap() {
            base[k] = v.clone();
        }
        base
    };
    let mut events = vec![
        event(
            json!({"type": "response.created", "response": responses_object(text, "in_progress")}),
        ),
        event(
            json!({"type": "response.in_progress", "response": responses_object(text, "in_progress")}),
        ),
        event(
            json!({"type": "response.output_item.added", "output_index": 0, "item": item("in_progress", "")}),
        ),
        event(with(
            at.clone(),
            json!({"type": "response.content_part.added", "part": part("")}),
        )),
    ];
    for word in text.split_inclusive(' ') {
        events.push(event(with(
            at.clone(),
            json!({"type": "response.output_text.delta", "delta": word, "logprobs": []}),
        )));
    }
    events.push(event(with(
        at.clone(),
        json!({"type": "response.output_text.done", "text": text, "logprobs": []}),
    )));
    events.push(event(with(
        at,
        json!({"type": "response.content_part.done", "part": part(text)}),
    )));
    events.push(event(json!({"type": "response.output_item.done", "output_index": 0, "item": item("completed", text)})));
    events.push(event(
        json!({"type": "response.completed", "response": responses_object(text, "completed")}),
    ));
    events
}

/// The real proxy server, in-process, on an ephemeral port.
pub struct TestProxy {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    stop: Option<oneshot::Sender<()>>,
    pub config_path: std::path::PathBuf,
}

impl TestProxy {
    /// Starts the proxy with `toml` layered over the embedded default and
    /// the upstream set to `upstream`.
    pub async fn start(toml: &str, upstream: &str) -> TestProxy {
        TestProxy::from_runtime(runtime(toml, upstream)).await
    }

    /// Starts the proxy on a runtime built by the test.
    pub async fn from_runtime(runtime: Runtime) -> TestProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = AppState::new(runtime);
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(proxy::server::serve(listener, state.clone(), async move {
            let _ = stopped.await;
        }));
        TestProxy {
            addr,
            state,
            stop: Some(stop),
            config_path: std::path::PathBuf::new(),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

impl Drop for TestProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A runtime from `toml` over the embedded default, upstream overridden.
pub fn runtime(toml: &str, upstream: &str) -> Runtime {
    let path = temp_file("config.toml", toml.as_bytes());
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        upstream: Some(upstream.into()),
    };
    let config = config::load(Some(&path), Vec::new(), &overrides).expect("test config loads");
    Runtime::new(config).expect("test config is valid")
}

pub fn temp_file(name: &str, contents: &[u8]) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "compaction-proxy-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, contents).unwrap();
    path
}

pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    Full<Bytes>,
>;

pub fn client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http()
}

/// A whole response: status, headers, body.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends a request and reads the whole answer.
pub async fn send(request: Request<Full<Bytes>>) -> Answer {
    let response = client().request(request).await.expect("proxy answers");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body completes").to_bytes();
    Answer {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

pub fn post_json(url: &str, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", "Bearer sk-test-secret-0123456789")
        .body(Full::new(body.into()))
        .unwrap()
}

/// Starts a proxy on `toml` in front of a mock upstream, sends each of
/// `bodies` to chat completions in turn, checks each was compacted, and
/// gives what the upstream received for each.
pub async fn compacted_upstream_bodies(toml: &str, bodies: Vec<String>) -> Vec<Bytes> {
    let upstream = MockUpstream::start(Behavior::Json(200, serde_json::json!({"ok": true}))).await;
    let proxy = TestProxy::start(toml, &upstream.url()).await;
    let mut sent = Vec::new();
    for body in bodies {
        let answer = send(post_json(&proxy.url("/v1/chat/completions"), body)).await;
        assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
        sent.push(upstream.last().body.clone());
    }
    sent
}

/// Reads a fixture body from `tests/data/fixtures`.
pub fn fixture(name: &str) -> Bytes {
    std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/fixtures")
            .join(name),
    )
    .unwrap()
    .into()
}

/// Reads frames from a streaming response, returning each with its arrival time.
pub async fn frames_with_times(
    response: Response<Incoming>,
) -> (Vec<(Instant, Bytes)>, Result<(), String>) {
    let mut body = response.into_body();
    let mut frames = Vec::new();
    loop {
        match body.frame().await {
            None => return (frames, Ok(())),
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    frames.push((Instant::now(), data));
                }
            }
            Some(Err(e)) => return (frames, Err(e.to_string())),
        }
    }
}

/// A client that speaks HTTP/2 with prior knowledge (h2c) only.
pub fn h2_client() -> Client {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

/// A request body sent in chunks with no declared length (HTTP/1.1
/// `Transfer-Encoding: chunked`).
pub struct Chunked(std::collections::VecDeque<Bytes>);

impl Chunked {
    pub fn new(chunks: impl IntoIterator<Item = Bytes>) -> Self {
        Chunked(chunks.into_iter().collect())
    }
}

impl http_body::Body for Chunked {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        std::task::Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

pub type ChunkedClient =
    hyper_util::client::legacy::Client<hyper_util::client::legacy::connect::HttpConnector, Chunked>;

pub fn chunked_client() -> ChunkedClient {
    hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http()
}

/// Polls `condition` every 10 ms until it holds or `limit` passes; true if it held.
pub async fn wait_until(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An address where nothing listens (bound, then released).
pub async fn unused_addr() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    listener.local_addr().unwrap()
}

/// The `x-compaction-*` headers of a response, by name.
pub fn compaction_headers(headers: &HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .filter(|(name, _)| name.as_str().starts_with("x-compaction-"))
        .map(|(name, value)| {
            (
                name.as_str().to_owned(),
                value.to_str().unwrap_or("").to_owned(),
            )
        })
        .collect()
}

/// Policy keys for the engine of `COMPACTION.md` on its own: exact mode,
/// no agent passes (the shipped default is stable mode with the passes on).
pub const ENGINE_ONLY: &str =
    "mode = \"exact\"\nmax_tool_result_chars = 0\nmax_arg_chars = 0\ntool_duplicate_threshold = 0\n";
