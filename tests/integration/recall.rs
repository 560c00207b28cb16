//! Recoverable compaction (`recall = true`) through the real server, in
//! front of a scripted model that calls `compaction_recall` when it sees a
//! marker, in all three formats, whole and streamed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::support::*;

const FACT: &str = "7731-KAPPA";

/// What the scripted model does.
#[derive(Clone, Default)]
struct Script {
    /// Asks for these ids instead of the markers' own.
    ids: Option<Vec<String>>,
    /// Writes this text before its recall call.
    text_before: Option<String>,
    /// Calls this client tool beside recall, and again after the answer.
    client_tool: Option<String>,
    /// Calls recall in every round, answered or not.
    always_recall: bool,
}

#[derive(Clone, Copy, PartialEq)]
enum Api {
    Chat,
    Anthropic,
    Responses,
}

impl Api {
    const ALL: [Api; 3] = [Api::Chat, Api::Anthropic, Api::Responses];

    fn path(self) -> &'static str {
        match self {
            Api::Chat => "/v1/chat/completions",
            Api::Anthropic => "/v1/messages",
            Api::Responses => "/v1/responses",
        }
    }
}

/// A call the model makes: (name, arguments).
type Call = (String, Value);

/// The scripted model: records each request's body and answers it.
#[derive(Clone)]
struct Model {
    addr: SocketAddr,
    received: Arc<Mutex<Vec<Bytes>>>,
}

impl Model {
    async fn start(api: Api, script: Script) -> Model {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let model = Model {
            addr,
            received: received.clone(),
        };
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (received, script) = (received.clone(), script.clone());
                tokio::spawn(async move {
                    let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                        let (received, script) = (received.clone(), script.clone());
                        async move {
                            let body = req.into_body().collect().await.unwrap().to_bytes();
                            received.lock().unwrap().push(body.clone());
                            let value: Value = serde_json::from_slice(&body).unwrap();
                            let (text, calls) = decide(&script, &body, &value);
                            let stream = value["stream"] == true;
                            let answer = render(api, stream, text.as_deref(), &calls);
                            let kind = if stream {
                                "text/event-stream"
                            } else {
                                "application/json"
                            };
                            Ok::<_, Infallible>(
                                Response::builder()
                                    .header("content-type", kind)
                                    .body(Full::new(Bytes::from(answer)))
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        model
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn received(&self) -> Vec<Bytes> {
        self.received.lock().unwrap().clone()
    }
}

/// The marker ids a request names.
fn marker_ids(body: &str) -> Vec<String> {
    let re = regex::Regex::new(r"compaction_recall id: (rc_[A-Za-z0-9_.\-]+)").unwrap();
    let mut ids: Vec<String> = re.captures_iter(body).map(|c| c[1].to_owned()).collect();
    ids.dedup();
    ids
}

fn has_recall_tool(value: &Value) -> bool {
    value["tools"].as_array().is_some_and(|tools| {
        tools.iter().any(|t| {
            t["name"] == "compaction_recall" || t["function"]["name"] == "compaction_recall"
        })
    })
}

/// The model's turn: text, and calls.
fn decide(script: &Script, body: &[u8], value: &Value) -> (Option<String>, Vec<Call>) {
    let text = String::from_utf8_lossy(body);
    let answered = text.contains("[compaction_recall rc_");
    let recall = |ids: Vec<String>| ("compaction_recall".to_owned(), json!({"ids": ids}));
    if !answered || script.always_recall {
        let ids = script.ids.clone().unwrap_or_else(|| marker_ids(&text));
        if !ids.is_empty() && has_recall_tool(value) {
            let mut calls = vec![recall(ids)];
            if let Some(tool) = &script.client_tool {
                calls.push((tool.clone(), json!({"path": "a.txt"})));
            }
            return (script.text_before.clone(), calls);
        }
        if !answered {
            return (Some("I do not know.".into()), Vec::new());
        }
    }
    let re = regex::Regex::new(r"gate code for depot Norrby is ([0-9A-Z\-]+)").unwrap();
    let reply = match re.captures(&text) {
        Some(c) => format!("The gate code is {}.", &c[1]),
        None if text.contains("refused") => "REFUSED".to_owned(),
        None => "I do not know.".to_owned(),
    };
    let calls = match &script.client_tool {
        Some(tool) => vec![(tool.clone(), json!({"path": "a.txt"}))],
        None => Vec::new(),
    };
    (Some(reply), calls)
}

fn sse(events: &[(Option<&str>, Value)]) -> String {
    let mut out = String::new();
    for (name, data) in events {
        if let Some(name) = name {
            out.push_str(&format!("event: {name}\n"));
        }
        out.push_str(&format!("data: {data}\n\n"));
    }
    out
}

/// Each round bills 100 input and 10 output tokens.
fn render(api: Api, stream: bool, text: Option<&str>, calls: &[Call]) -> String {
    match (api, stream) {
        (Api::Chat, false) => {
            let tool_calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| json!({"id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": args.to_string()}}))
                .collect();
            let mut message = json!({"role": "assistant", "content": text});
            if !tool_calls.is_empty() {
                message["tool_calls"] = Value::Array(tool_calls);
            }
            let finish = if calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            };
            json!({"id": "chatcmpl-1", "object": "chat.completion", "model": "m",
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})
            .to_string()
        }
        (Api::Chat, true) => {
            let chunk = |delta: Value, finish: Value| {
                (
                    None,
                    json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}),
                )
            };
            let mut events = vec![chunk(
                json!({"role": "assistant", "content": ""}),
                Value::Null,
            )];
            if let Some(text) = text {
                events.push(chunk(json!({"content": text}), Value::Null));
            }
            for (i, (name, args)) in calls.iter().enumerate() {
                events.push(chunk(json!({"tool_calls": [{"index": i, "id": format!("call_{i}"), "type": "function", "function": {"name": name, "arguments": ""}}]}), Value::Null));
                events.push(chunk(json!({"tool_calls": [{"index": i, "function": {"arguments": args.to_string()}}]}), Value::Null));
            }
            let finish = if calls.is_empty() {
                "stop"
            } else {
                "tool_calls"
            };
            events.push(chunk(json!({}), finish.into()));
            events.push((None, json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}})));
            sse(&events) + "data: [DONE]\n\n"
        }
        (Api::Anthropic, stream) => {
            let mut content = Vec::new();
            if let Some(text) = text {
                content.push(json!({"type": "text", "text": text}));
            }
            for (i, (name, args)) in calls.iter().enumerate() {
                content.push(json!({"type": "tool_use", "id": format!("toolu_{i}"), "name": name, "input": args}));
            }
            let stop = if calls.is_empty() {
                "end_turn"
            } else {
                "tool_use"
            };
            if !stream {
                return json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                    "content": content, "stop_reason": stop,
                    "usage": {"input_tokens": 100, "output_tokens": 10}})
                .to_string();
            }
            let mut events = vec![(
                Some("message_start"),
                json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": null, "usage": {"input_tokens": 100, "output_tokens": 1}}}),
            )];
            for (i, block) in content.iter().enumerate() {
                let (start, delta) = if block["type"] == "text" {
                    (
                        json!({"type": "text", "text": ""}),
                        json!({"type": "text_delta", "text": block["text"]}),
                    )
                } else {
                    let mut start = block.clone();
                    start["input"] = json!({});
                    (
                        start,
                        json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                    )
                };
                events.push((
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": i, "content_block": start}),
                ));
                events.push((
                    Some("content_block_delta"),
                    json!({"type": "content_block_delta", "index": i, "delta": delta}),
                ));
                events.push((
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": i}),
                ));
            }
            events.push((Some("message_delta"), json!({"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 10}})));
            events.push((Some("message_stop"), json!({"type": "message_stop"})));
            sse(&events)
        }
        (Api::Responses, stream) => {
            let mut output = Vec::new();
            if let Some(text) = text {
                output.push(json!({"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": text, "annotations": []}]}));
            }
            for (i, (name, args)) in calls.iter().enumerate() {
                output.push(json!({"type": "function_call", "id": format!("fc_{i}"), "call_id": format!("call_{i}"),
                    "name": name, "arguments": args.to_string(), "status": "completed"}));
            }
            let response = json!({"id": "resp_1", "object": "response", "status": "completed", "model": "m",
                "output": output, "usage": {"input_tokens": 100, "output_tokens": 10, "total_tokens": 110}});
            if !stream {
                return response.to_string();
            }
            let mut created = response.clone();
            created["status"] = "in_progress".into();
            created["output"] = json!([]);
            let mut events = vec![(
                Some("response.created"),
                json!({"type": "response.created", "sequence_number": 0, "response": created}),
            )];
            for (i, item) in output.iter().enumerate() {
                events.push((
                    Some("response.output_item.added"),
                    json!({"type": "response.output_item.added", "output_index": i, "item": item}),
                ));
                if item["type"] == "message" {
                    events.push((Some("response.output_text.delta"), json!({"type": "response.output_text.delta", "output_index": i, "content_index": 0, "delta": item["content"][0]["text"]})));
                }
                events.push((
                    Some("response.output_item.done"),
                    json!({"type": "response.output_item.done", "output_index": i, "item": item}),
                ));
            }
            events.push((
                Some("response.completed"),
                json!({"type": "response.completed", "response": response}),
            ));
            sse(&events)
        }
    }
}

fn policy(extra: &str) -> String {
    format!(
        "[policies.default]\nbudget_chars = 300\nkeep_last_n = 1\nmode = \"exact\"\nrecall = true\n{extra}"
    )
}

fn filler(tag: &str) -> String {
    (0..40).map(|k| format!("{tag}{k} ")).collect()
}

/// A conversation whose fact sits in an old message the budget drops.
fn conversation() -> Vec<Value> {
    vec![
        json!({"role": "user", "content": "Task: keep track of the depots."}),
        json!({"role": "assistant", "content": format!("Understood. {}", filler("a"))}),
        json!({"role": "user", "content": format!("Depot Norrby: the gate code for depot Norrby is {FACT}. {}", filler("b"))}),
        json!({"role": "assistant", "content": format!("Noted. {}", filler("c"))}),
        json!({"role": "user", "content": format!("Depot Sala: nothing to note. {}", filler("d"))}),
        json!({"role": "assistant", "content": format!("Fine. {}", filler("e"))}),
        json!({"role": "user", "content": "What is the gate code for depot Norrby?"}),
    ]
}

fn body(api: Api, stream: bool, extra: Value) -> Value {
    let mut body = match api {
        Api::Chat | Api::Anthropic => {
            json!({"model": "m", "max_tokens": 100, "messages": conversation()})
        }
        Api::Responses => {
            let input: Vec<Value> = conversation()
                .into_iter()
                .map(|m| json!({"type": "message", "role": m["role"], "content": m["content"]}))
                .collect();
            json!({"model": "m", "input": input})
        }
    };
    if stream {
        body["stream"] = true.into();
    }
    if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
        for (k, v) in extra {
            body.insert(k.clone(), v.clone());
        }
    }
    body
}

/// The text a client reads from a whole or streamed answer.
fn answer_text(api: Api, stream: bool, body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    if !stream {
        let v: Value = serde_json::from_slice(body).unwrap();
        return match api {
            Api::Chat => v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
            Api::Anthropic => v["content"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect(),
            Api::Responses => v["output"]
                .as_array()
                .unwrap()
                .iter()
                .filter_map(|i| i["content"][0]["text"].as_str())
                .collect(),
        };
    }
    let mut out = String::new();
    for line in text.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        let piece = match api {
            Api::Chat => v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned),
            Api::Anthropic => v["delta"]["text"].as_str().map(str::to_owned),
            Api::Responses => (v["type"] == "response.output_text.delta")
                .then(|| v["delta"].as_str().unwrap_or_default().to_owned()),
        };
        out.push_str(&piece.unwrap_or_default());
    }
    out
}

/// The usage a client reads: (input, output) tokens.
fn answer_usage(api: Api, stream: bool, body: &[u8]) -> (u64, u64) {
    let pick = |u: &Value| match api {
        Api::Chat => (
            u["prompt_tokens"].as_u64().unwrap_or(0),
            u["completion_tokens"].as_u64().unwrap_or(0),
        ),
        _ => (
            u["input_tokens"].as_u64().unwrap_or(0),
            u["output_tokens"].as_u64().unwrap_or(0),
        ),
    };
    if !stream {
        let v: Value = serde_json::from_slice(body).unwrap();
        return pick(&v["usage"]);
    }
    let mut found = (0, 0);
    for line in String::from_utf8_lossy(body).lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        match api {
            Api::Chat if v["usage"].is_object() => found = pick(&v["usage"]),
            Api::Anthropic if v["type"] == "message_start" => {
                found.0 = pick(&v["message"]["usage"]).0
            }
            Api::Anthropic if v["type"] == "message_delta" => found.1 = pick(&v["usage"]).1,
            Api::Responses if v["type"] == "response.completed" => {
                found = pick(&v["response"]["usage"])
            }
            _ => {}
        }
    }
    found
}

/// The text of the recall answer a follow-up carries.
fn recall_result(api: Api, followup: &Value) -> String {
    let items = match api {
        Api::Responses => followup["input"].as_array().unwrap(),
        _ => followup["messages"].as_array().unwrap(),
    };
    let last = items.last().unwrap();
    match api {
        Api::Chat => {
            assert_eq!(last["role"], "tool");
            last["content"].as_str().unwrap().to_owned()
        }
        Api::Anthropic => {
            assert_eq!(last["content"][0]["type"], "tool_result");
            last["content"][0]["content"].as_str().unwrap().to_owned()
        }
        Api::Responses => {
            assert_eq!(last["type"], "function_call_output");
            last["output"].as_str().unwrap().to_owned()
        }
    }
}

async fn ask(proxy: &TestProxy, api: Api, body: &Value) -> Answer {
    send(post_json(&proxy.url(api.path()), body.to_string())).await
}

#[tokio::test]
async fn the_model_recalls_a_dropped_fact_and_the_client_sees_only_the_answer() {
    for api in Api::ALL {
        for stream in [false, true] {
            let model = Model::start(api, Script::default()).await;
            let proxy = TestProxy::start(&policy(""), &model.url()).await;
            let request = body(api, stream, json!({}));
            let answer = ask(&proxy, api, &request).await;
            let case = format!("{} stream={stream}", api.path());
            assert_eq!(answer.status, 200, "{case}");
            assert_eq!(
                answer.header("x-compaction-status"),
                Some("compacted"),
                "{case}"
            );
            assert_eq!(
                answer.header("x-compaction-recall-rounds"),
                Some("1"),
                "{case}"
            );
            assert_eq!(
                answer_text(api, stream, &answer.body),
                format!("The gate code is {FACT}."),
                "{case}"
            );
            let client_body = String::from_utf8_lossy(&answer.body);
            assert!(
                !client_body.contains("compaction_recall"),
                "{case}: {client_body}"
            );
            assert_eq!(answer_usage(api, stream, &answer.body), (200, 20), "{case}");

            let received = model.received();
            assert_eq!(received.len(), 2, "{case}");
            let first: Value = serde_json::from_slice(&received[0]).unwrap();
            assert!(has_recall_tool(&first), "{case}");
            assert!(
                !String::from_utf8_lossy(&received[0]).contains(FACT),
                "{case}: the fact was dropped"
            );
            let ids = marker_ids(&String::from_utf8_lossy(&received[0]));
            assert_eq!(
                answer.header("x-compaction-recalled-ids"),
                Some(ids.join(", ").as_str()),
                "{case}"
            );
            // The follow-up only appends to what went first, and its
            // answer carries the dropped items' original bytes.
            let followup: Value = serde_json::from_slice(&received[1]).unwrap();
            let key = if api == Api::Responses {
                "input"
            } else {
                "messages"
            };
            let sent = first[key].as_array().unwrap();
            assert_eq!(
                &followup[key].as_array().unwrap()[..sent.len()],
                &sent[..],
                "{case}"
            );
            let result = recall_result(api, &followup);
            let original =
                String::from_utf8_lossy(&serde_json::to_vec(&request).unwrap()).into_owned();
            let fact_item = match api {
                Api::Responses => request["input"][2].to_string(),
                _ => request["messages"][2].to_string(),
            };
            assert!(original.contains(&fact_item));
            assert!(result.contains(&fact_item), "{case}: {result}");
        }
    }
}

#[tokio::test]
async fn a_pruned_tool_result_is_marked_and_recalled_with_its_original_text() {
    let output: String = (0..300).map(|k| format!("line{k} ")).collect();
    let output = format!("{output} the gate code for depot Norrby is {FACT}. {output}");
    let request = json!({"model": "m", "messages": [
        {"role": "user", "content": "Task: read the file."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": "{\"path\":\"a.txt\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": output},
        {"role": "user", "content": "What is the gate code for depot Norrby?"},
    ], "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}]});
    let model = Model::start(Api::Chat, Script::default()).await;
    let toml = "[policies.default]\nbudget_chars = 1500\nkeep_last_n = 1\nmode = \"exact\"\nrecall = true\n\
        max_tool_result_chars = 200\nprotect_tool_chars = 0\nprune_minimum_chars = 0\n";
    let proxy = TestProxy::start(toml, &model.url()).await;
    let answer = ask(&proxy, Api::Chat, &request).await;
    assert_eq!(
        answer_text(Api::Chat, false, &answer.body),
        format!("The gate code is {FACT}.")
    );
    let received = model.received();
    let first: Value = serde_json::from_slice(&received[0]).unwrap();
    let pruned = first["messages"][2]["content"].as_str().unwrap();
    assert!(pruned.contains("chars omitted"), "{pruned}");
    assert!(pruned.contains("[compaction-proxy cut "), "{pruned}");
    assert!(marker_ids(pruned)[0].starts_with("rc_t2_"));
    // The client's tool stays first, the proxy's follows it.
    assert_eq!(first["tools"][0]["function"]["name"], "read_file");
    assert_eq!(first["tools"][1]["function"]["name"], "compaction_recall");
    let followup: Value = serde_json::from_slice(&received[1]).unwrap();
    let result = recall_result(Api::Chat, &followup);
    assert!(
        result.ends_with(&output),
        "the whole original text comes back"
    );
}

#[tokio::test]
async fn an_id_not_in_the_request_is_refused() {
    // A well-formed id of another conversation (its own hash), and junk.
    let other = Model::start(Api::Chat, Script::default()).await;
    let proxy = TestProxy::start(&policy(""), &other.url()).await;
    let mut elsewhere = body(Api::Chat, false, json!({}));
    for i in 1..6 {
        elsewhere["messages"][i]["content"] =
            format!("Another tenant's secret {i} {}", filler("z")).into();
    }
    ask(&proxy, Api::Chat, &elsewhere).await;
    let foreign = marker_ids(&String::from_utf8_lossy(&other.received()[0]));
    assert!(!foreign.is_empty());

    for ids in [foreign, vec!["rc_t2_0123456789abcdef".to_owned()]] {
        let script = Script {
            ids: Some(ids.clone()),
            ..Script::default()
        };
        let model = Model::start(Api::Chat, script).await;
        let proxy = TestProxy::start(&policy(""), &model.url()).await;
        let asked = ids.len().to_string();
        let answer = ask(&proxy, Api::Chat, &body(Api::Chat, false, json!({}))).await;
        assert_eq!(answer_text(Api::Chat, false, &answer.body), "REFUSED");
        assert_eq!(
            answer.header("x-compaction-recall-refused-ids"),
            Some(asked.as_str())
        );
        assert_eq!(answer.header("x-compaction-recalled-ids"), None);
        let followup: Value = serde_json::from_slice(&model.received()[1]).unwrap();
        let result = recall_result(Api::Chat, &followup);
        assert!(result.contains("refused"), "{result}");
        assert!(!result.contains("secret"), "{result}");
    }
}

#[tokio::test]
async fn a_call_mixed_with_a_client_tool_answers_recall_first_and_returns_the_clients_call() {
    for api in Api::ALL {
        for stream in [false, true] {
            let script = Script {
                client_tool: Some("read_file".into()),
                ..Script::default()
            };
            let model = Model::start(api, script).await;
            let proxy = TestProxy::start(&policy(""), &model.url()).await;
            let tool = match api {
                Api::Chat => {
                    json!({"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}})
                }
                Api::Anthropic => json!({"name": "read_file", "input_schema": {"type": "object"}}),
                Api::Responses => {
                    json!({"type": "function", "name": "read_file", "parameters": {"type": "object"}})
                }
            };
            let answer = ask(&proxy, api, &body(api, stream, json!({"tools": [tool]}))).await;
            let case = format!("{} stream={stream}", api.path());
            let client = String::from_utf8_lossy(&answer.body).into_owned();
            assert!(client.contains("read_file"), "{case}: {client}");
            assert!(!client.contains("compaction_recall"), "{case}: {client}");
            assert!(
                answer_text(api, stream, &answer.body).contains(FACT),
                "{case}"
            );
            // The follow-up's model turn holds the recall call alone.
            let followup = String::from_utf8_lossy(&model.received()[1]).into_owned();
            let followup: Value = serde_json::from_str(&followup).unwrap();
            let turn = match api {
                Api::Chat => followup["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .rev()
                    .nth(1)
                    .unwrap()
                    .to_string(),
                Api::Anthropic => followup["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .rev()
                    .nth(1)
                    .unwrap()
                    .to_string(),
                Api::Responses => followup["input"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .rev()
                    .nth(1)
                    .unwrap()
                    .to_string(),
            };
            assert!(
                turn.contains("compaction_recall") && !turn.contains("read_file"),
                "{case}: {turn}"
            );
        }
    }
}

#[tokio::test]
async fn text_before_a_recall_call_goes_into_the_follow_up_not_to_the_client() {
    for api in Api::ALL {
        for stream in [false, true] {
            let script = Script {
                text_before: Some("Let me look that up.".into()),
                ..Script::default()
            };
            let model = Model::start(api, script).await;
            let proxy = TestProxy::start(&policy(""), &model.url()).await;
            let answer = ask(&proxy, api, &body(api, stream, json!({}))).await;
            let case = format!("{} stream={stream}", api.path());
            assert_eq!(
                answer_text(api, stream, &answer.body),
                format!("The gate code is {FACT}."),
                "{case}"
            );
            let followup = String::from_utf8_lossy(&model.received()[1]).into_owned();
            assert!(followup.contains("Let me look that up."), "{case}");
        }
    }
}

#[tokio::test]
async fn rounds_are_bounded_and_the_last_rounds_recall_calls_never_reach_the_client() {
    for api in Api::ALL {
        for stream in [false, true] {
            let script = Script {
                always_recall: true,
                text_before: Some("Still looking.".into()),
                ..Script::default()
            };
            let model = Model::start(api, script).await;
            let proxy = TestProxy::start(&policy("recall_max_rounds = 2\n"), &model.url()).await;
            let answer = ask(&proxy, api, &body(api, stream, json!({}))).await;
            let case = format!("{} stream={stream}", api.path());
            assert_eq!(answer.status, 200, "{case}");
            assert_eq!(
                model.received().len(),
                3,
                "{case}: one request and two follow-ups"
            );
            assert_eq!(
                answer.header("x-compaction-recall-rounds"),
                Some("2"),
                "{case}"
            );
            let client = String::from_utf8_lossy(&answer.body).into_owned();
            assert!(!client.contains("compaction_recall"), "{case}: {client}");
            assert_eq!(
                answer_text(api, stream, &answer.body),
                "Still looking.",
                "{case}"
            );
            assert_eq!(answer_usage(api, stream, &answer.body), (300, 30), "{case}");
        }
    }
}

#[tokio::test]
async fn answers_are_cut_to_recall_max_chars_and_refused_past_the_added_bytes() {
    let model = Model::start(Api::Chat, Script::default()).await;
    let proxy = TestProxy::start(&policy("recall_max_chars = 100\n"), &model.url()).await;
    ask(&proxy, Api::Chat, &body(Api::Chat, false, json!({}))).await;
    let followup: Value = serde_json::from_slice(&model.received()[1]).unwrap();
    let result = recall_result(Api::Chat, &followup);
    // The first id's answer: the answers of several ids are blank-line apart.
    let first = result.split("\n\n").next().unwrap();
    let original = first.split_once('\n').unwrap().1;
    let head_tail = original.split('\n').collect::<Vec<_>>();
    assert_eq!(head_tail.len(), 3, "{original}");
    assert_eq!(
        head_tail[0].chars().count() + head_tail[2].chars().count(),
        100
    );
    assert!(
        head_tail[1].contains("chars omitted; compaction_recall id: rc_d"),
        "{original}"
    );
    assert!(head_tail[1].contains('@'), "the rest has an id of its own");

    let model = Model::start(Api::Chat, Script::default()).await;
    let proxy = TestProxy::start(&policy("recall_max_added_bytes = 10\n"), &model.url()).await;
    let answer = ask(&proxy, Api::Chat, &body(Api::Chat, false, json!({}))).await;
    let asked = marker_ids(&String::from_utf8_lossy(&model.received()[0])).len();
    assert!(asked > 0);
    // Every original is longer than 10 bytes: each id is refused.
    assert_eq!(
        answer.header("x-compaction-recall-refused-ids"),
        Some(asked.to_string().as_str())
    );
    assert_eq!(answer.header("x-compaction-recalled-ids"), None);
    let followup: Value = serde_json::from_slice(&model.received()[1]).unwrap();
    assert!(recall_result(Api::Chat, &followup).contains("size limit"));
}

#[tokio::test]
async fn a_forcing_tool_choice_or_a_client_tool_of_the_same_name_keeps_the_tool_out() {
    let model = Model::start(Api::Chat, Script::default()).await;
    let proxy = TestProxy::start(&policy(""), &model.url()).await;
    let forced = json!({
        "tools": [{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object"}}}],
        "tool_choice": {"type": "function", "function": {"name": "read_file"}},
    });
    let answer = ask(&proxy, Api::Chat, &body(Api::Chat, false, forced)).await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("x-compaction-recall"),
        Some("off; tool-choice")
    );
    assert_eq!(answer.header("x-compaction-recall-rounds"), None);
    let sent = model.received().pop().unwrap();
    let sent: Value = serde_json::from_slice(&sent).unwrap();
    assert_eq!(sent["tools"].as_array().unwrap().len(), 1);

    // The client's own compaction_recall: its call reaches the client.
    let theirs = json!({"tools": [{"type": "function", "function": {"name": "compaction_recall", "parameters": {"type": "object"}}}]});
    let answer = ask(&proxy, Api::Chat, &body(Api::Chat, false, theirs)).await;
    assert_eq!(
        answer.header("x-compaction-recall"),
        Some("off; client-tool")
    );
    assert_eq!(
        answer.json()["choices"][0]["message"]["tool_calls"][0]["function"]["name"],
        "compaction_recall"
    );
    assert_eq!(model.received().len(), 2, "no follow-up of the proxy's");
}

#[tokio::test]
async fn stable_mode_forwards_the_same_bytes_from_two_proxies_turn_after_turn() {
    let toml = "[policies.default]\nbudget_chars = 300\nkeep_last_n = 1\nmode = \"stable\"\nrecall = true\n";
    let mut forwarded = Vec::new();
    for _ in 0..2 {
        let model = Model::start(Api::Chat, Script::default()).await;
        let proxy = TestProxy::start(toml, &model.url()).await;
        let mut messages = conversation();
        for turn in 0..3 {
            let request = json!({"model": "m", "messages": messages});
            let answer = ask(&proxy, Api::Chat, &request).await;
            assert_eq!(answer.status, 200);
            messages.push(
                json!({"role": "assistant", "content": format!("Answer {turn}. {}", filler("f"))}),
            );
            messages.push(json!({"role": "user", "content": format!("Next question {turn}?")}));
        }
        forwarded.push(model.received());
    }
    assert_eq!(forwarded[0], forwarded[1], "two proxies, the same bytes");
    let first_turn = String::from_utf8_lossy(&forwarded[0][0]).into_owned();
    assert!(!marker_ids(&first_turn).is_empty(), "markers went out");
}

/// The fact-retention run: 20 conversations, each asking for a fact the
/// budget dropped. The scripted model recalls when it sees a marker and
/// answers only from what it can read; with recall off it never can.
#[tokio::test]
async fn a_dropped_fact_comes_back_in_every_conversation_with_recall_and_in_none_without() {
    const RUNS: usize = 20;
    let mut retained = [0usize; 2];
    for (arm, recall) in [false, true].into_iter().enumerate() {
        let model = Model::start(Api::Chat, Script::default()).await;
        let toml = format!(
            "[policies.default]\nbudget_chars = 300\nkeep_last_n = 1\nmode = \"exact\"\nrecall = {recall}\n"
        );
        let proxy = TestProxy::start(&toml, &model.url()).await;
        for run in 0..RUNS {
            let code = format!("{:04}-RUN{run}", 1000 + run * 37);
            let mut request = body(Api::Chat, false, json!({}));
            request["messages"][2]["content"] = format!(
                "Depot Norrby: the gate code for depot Norrby is {code}. {}",
                filler(&format!("r{run}x"))
            )
            .into();
            let answer = ask(&proxy, Api::Chat, &request).await;
            assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
            let forwarded = model.received();
            let first =
                String::from_utf8_lossy(&forwarded[forwarded.len() - 1 - usize::from(recall)])
                    .into_owned();
            assert!(!first.contains(&code), "the fact was dropped");
            if answer_text(Api::Chat, false, &answer.body) == format!("The gate code is {code}.") {
                retained[arm] += 1;
            }
        }
    }
    assert_eq!(
        retained,
        [0, RUNS],
        "without recall / with recall, of {RUNS}"
    );
}

/// Reads a kept report, once it is made (it is computed after the answer).
async fn fetch_report(proxy: &TestProxy, id: &str) -> Value {
    let url = proxy.url(&format!("/v1/compaction-reports/{id}"));
    let get = || {
        http::Request::get(&url)
            .body(Full::new(Bytes::new()))
            .unwrap()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let fetched = send(get()).await;
        if fetched.status == 200 || std::time::Instant::now() > deadline {
            assert_eq!(fetched.status, 200, "the report is kept");
            return fetched.json();
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The per-message report lists each marker message the proxy put in as a
/// line of its own (stage `marker`), where the forwarded body has it, and,
/// once the answer went out, marks the lines whose id the model recalled;
/// the inspector's view marks the same rows.
#[tokio::test]
async fn the_report_lists_the_marker_messages_and_marks_what_was_recalled() {
    for api in Api::ALL {
        for stream in [false, true] {
            let case = format!("{} stream={stream}", api.path());
            let model = Model::start(api, Script::default()).await;
            let toml = format!(
                "[inspector]\nenabled = true\n{}allow_report = true\n",
                policy("")
            );
            let proxy = TestProxy::start(&toml, &model.url()).await;
            let mut request = post_json(
                &proxy.url(api.path()),
                body(api, stream, json!({})).to_string(),
            );
            request.headers_mut().insert(
                "x-compaction-report",
                http::HeaderValue::from_static("true"),
            );
            let answer = send(request).await;
            assert_eq!(
                answer.header("x-compaction-recall-rounds"),
                Some("1"),
                "{case}"
            );
            let id = answer.header("x-compaction-report-id").unwrap().to_owned();
            // What was forwarded: its items, and the marker messages among them.
            let first: Value = serde_json::from_slice(&model.received()[0]).unwrap();
            let key = if api == Api::Responses {
                "input"
            } else {
                "messages"
            };
            let forwarded = first[key].as_array().unwrap();
            let text_of = |item: &Value| match &item["content"] {
                Value::String(s) => s.clone(),
                Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
                _ => String::new(),
            };
            let markers: Vec<(usize, String)> = forwarded
                .iter()
                .enumerate()
                .filter(|(_, item)| text_of(item).starts_with("[compaction-proxy dropped"))
                .map(|(pos, item)| (pos, marker_ids(&text_of(item))[0].clone()))
                .collect();
            assert!(!markers.is_empty(), "{case}: the fixture drops a run");

            let report = fetch_report(&proxy, &id).await;
            let lines = report["messages"].as_array().unwrap();
            let marker_lines: Vec<&Value> =
                lines.iter().filter(|l| l["stage"] == "marker").collect();
            assert_eq!(marker_lines.len(), markers.len(), "{case}: {report:#}");
            for (line, (_, marker_id)) in marker_lines.iter().zip(&markers) {
                assert_eq!(line["index"], Value::Null, "{case}");
                assert_eq!(line["fate"], "inserted", "{case}");
                assert_eq!(line["recall_id"], marker_id.as_str(), "{case}");
                let chars = line["chars"].as_u64().unwrap() as usize;
                let forwarded_text = forwarded
                    .iter()
                    .map(text_of)
                    .find(|t| t.contains(marker_id.as_str()) && t.starts_with("[compaction"))
                    .unwrap();
                assert_eq!(chars, forwarded_text.chars().count(), "{case}");
            }
            // Lines in forwarded order: each marker line right after the
            // run it stands for, every one of whose lines names its id.
            for (at, line) in lines.iter().enumerate() {
                if line["stage"] != "marker" {
                    continue;
                }
                let [first, last] = [0, 1].map(|k| line["stands_for"][k].as_u64().unwrap());
                assert_eq!(lines[at - 1]["index"], last, "{case}");
                let run: Vec<&Value> = lines
                    .iter()
                    .filter(|l| {
                        l["index"]
                            .as_u64()
                            .is_some_and(|i| (first..=last).contains(&i))
                    })
                    .collect();
                assert_eq!(run.len() as u64, last - first + 1, "{case}");
                for member in run {
                    assert_eq!(member["fate"], "dropped", "{case}");
                    assert_eq!(member["recall_id"], line["recall_id"], "{case}");
                }
            }
            // The model recalled every marker's id: those lines say so, no
            // other line does, and the report says what recall did.
            let recalled_ids: Vec<String> =
                marker_ids(&String::from_utf8_lossy(&model.received()[0]));
            for line in lines {
                let named = line["recall_id"]
                    .as_str()
                    .is_some_and(|id| recalled_ids.iter().any(|r| r == id));
                assert_eq!(line["recalled"] == true, named, "{case}: {line}");
            }
            assert!(lines.iter().any(|l| l["recalled"] == true), "{case}");
            assert_eq!(report["recall"]["rounds"], 1, "{case}");
            assert_eq!(
                report["recall"]["recalled_ids"],
                json!(recalled_ids),
                "{case}"
            );
            assert_eq!(report["recall"]["refused_ids"], 0, "{case}");

            // The inspector's view: the same rows, marked the same.
            let view_url = proxy.url(&format!("/inspector/api/requests/{id}"));
            let mut view = Value::Null;
            for _ in 0..500 {
                view = send(
                    http::Request::get(&view_url)
                        .body(Full::new(Bytes::new()))
                        .unwrap(),
                )
                .await
                .json();
                if view["view"]["rows"].is_array() && view["request"]["recall"].is_object() {
                    break;
                }
                tokio::time::sleep(std::time::Duration::from_millis(20)).await;
            }
            let rows = view["view"]["rows"].as_array().unwrap();
            assert_eq!(rows.len(), lines.len(), "{case}: {view:#}");
            for (row, line) in rows.iter().zip(lines) {
                assert_eq!(row["index"], line["index"], "{case}");
                assert_eq!(row["recall_id"], line["recall_id"], "{case}");
                let expected = if line["stage"] == "marker" {
                    "marker"
                } else if line["recalled"] == true {
                    "recalled"
                } else {
                    row["mark"].as_str().unwrap()
                };
                assert_eq!(row["mark"], expected, "{case}: {row:#}");
                assert_eq!(row["recalled"] == true, line["recalled"] == true, "{case}");
            }
            // A marker row's right side is the marker message forwarded.
            for (row, (pos, marker_id)) in
                rows.iter().filter(|r| r["mark"] == "marker").zip(&markers)
            {
                assert_eq!(row["position"], *pos, "{case}");
                assert!(
                    row["forwarded"]["text"]
                        .as_str()
                        .unwrap()
                        .contains(marker_id.as_str()),
                    "{case}"
                );
            }
            assert_eq!(view["request"]["recall"]["rounds"], 1, "{case}");
        }
    }
}
