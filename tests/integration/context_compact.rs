//! `POST /1/unstable/context/compact` with its own schema: the seed
//! example, V4 and V5 messages, map-reduce stats, 400, 422, and the
//! `compacted: false` passthrough.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::{json, Value};

use crate::summaries::{MockSummarizer, Mode};
use crate::support::{send, Answer, Behavior, MockUpstream, TestProxy};

const PATH: &str = "/1/unstable/context/compact";

async fn setup(summarizer_extra: &str) -> (MockSummarizer, MockUpstream, TestProxy) {
    let summarizer = MockSummarizer::start("chat", Mode::Canned).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let toml = format!(
        "[summarizers.lorem]\nurl = \"{}\"\nformat = \"chat\"\nmodel = \"configured\"\n{summarizer_extra}\n",
        summarizer.url()
    );
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    (summarizer, upstream, proxy)
}

async fn post(proxy: &TestProxy, body: &Value) -> Answer {
    send(
        Request::post(proxy.url(PATH))
            .header("content-type", "application/json")
            .header("authorization", "Bearer sk-caller")
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap(),
    )
    .await
}

fn v4(n: usize) -> Vec<Value> {
    (0..n)
        .map(|i| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            let text = format!("message {i} about the red boots order {}", "and more ".repeat(20));
            json!({"id": format!("m{i}"), "role": role, "content": text, "parts": [{"type": "text", "text": text}]})
        })
        .collect()
}

#[tokio::test]
async fn the_seeds_example_passes_through_with_compacted_false() {
    let (summarizer, upstream, proxy) = setup("").await;
    // The seed's own example request, verbatim.
    let example = json!({
        "providerID": "lorem", "model": "lorem",
        "messages": [{"id": "lorem", "role": "user", "content": "lorem",
                      "parts": [{"type": "text", "text": "lorem"}], "annotations": [{}]}],
        "keepLastMessages": 4, "instructions": "lorem", "targetTokensEstimate": 64
    });
    let answer = post(&proxy, &example).await;
    assert_eq!(answer.status, 200);
    let out = answer.json();
    assert_eq!(out["messages"], example["messages"]);
    assert_eq!(out["compaction"]["compacted"], false);
    assert_eq!(out["compaction"]["chunksProcessed"], 0);
    assert_eq!(out["compaction"]["passes"], 0);
    assert_eq!(out["compaction"]["targetTokensEstimate"], 64);
    assert_eq!(out["stats"]["messagesBefore"], 1);
    assert_eq!(out["stats"]["messagesAfter"], 1);
    assert_eq!(out["stats"]["messagesDropped"], 0);
    assert_eq!(summarizer.calls(), 0);
    assert!(
        upstream.received().is_empty(),
        "answered by the proxy itself"
    );
}

#[tokio::test]
async fn v4_messages_older_than_the_tail_become_one_user_summary() {
    let (summarizer, _upstream, proxy) = setup("").await;
    let messages = v4(10);
    let body = json!({"providerID": "lorem", "model": "gpt-4o-mini", "messages": messages,
                      "instructions": "keep every product reference", "targetTokensEstimate": 200});
    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let out = answer.json();
    let got = out["messages"].as_array().unwrap();
    assert_eq!(got.len(), 5, "the summary and the default 4 kept");
    assert_eq!(got[0]["role"], "user");
    assert_eq!(
        got[0]["content"],
        "SUMMARY-0: the user asked to fix build 7731."
    );
    assert_eq!(got[1..], messages[6..], "the tail verbatim");
    assert_eq!(out["stats"]["messagesBefore"], 10);
    assert_eq!(out["stats"]["messagesAfter"], 5);
    assert_eq!(out["stats"]["messagesDropped"], 5);
    assert!(
        out["stats"]["tokensAfterEstimate"].as_u64()
            < out["stats"]["tokensBeforeEstimate"].as_u64()
    );
    let c = &out["compaction"];
    assert_eq!(
        (
            c["compacted"].clone(),
            c["chunksProcessed"].clone(),
            c["passes"].clone()
        ),
        (json!(true), json!(1), json!(1))
    );
    assert_eq!(c["summarizerPromptTokens"], 100);
    assert_eq!(c["summarizerCompletionTokens"], 20);
    assert_eq!(c["targetTokensEstimate"], 200);
    let (headers, call) = &summarizer.received()[0];
    assert_eq!(call["model"], "gpt-4o-mini", "the request's model");
    assert_eq!(headers["authorization"], "Bearer sk-caller");
    let system = call["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("keep every product reference")
            && system.contains("Aim for about 150 words.")
    );
    let input = MockSummarizer::input_of(call);
    assert!(input.contains("message 5 ") && !input.contains("message 6 "));
}

#[tokio::test]
async fn v5_messages_with_tool_parts_are_summarized_and_map_reduce_is_reported() {
    let (summarizer, _upstream, proxy) =
        setup("window_tokens = 1200\nmax_output_tokens = 200").await;
    let mut messages: Vec<Value> = Vec::new();
    for i in 0..30 {
        messages.push(json!({"role": "user", "parts": [{"type": "text", "text": format!("question {i} {}", "detail ".repeat(40))}]}));
        messages.push(json!({"role": "assistant", "parts": [
            {"type": "step-start"},
            {"type": "tool-search", "toolCallId": format!("t{i}"), "state": "output-available",
             "input": {"q": format!("boots {i}")}, "output": {"hits": i}},
            {"type": "text", "text": format!("answer {i}")}]}));
    }
    let body =
        json!({"providerID": "lorem", "model": "m", "messages": messages, "keepLastMessages": 2});
    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let out = answer.json();
    let got = out["messages"].as_array().unwrap();
    assert_eq!(got.len(), 3);
    assert_eq!(got[0]["role"], "user");
    assert!(
        got[0].get("content").is_none(),
        "a V5 message has parts only"
    );
    assert_eq!(got[0]["parts"][0]["type"], "text");
    assert_eq!(got[1..], messages[58..]);
    let chunks = out["compaction"]["chunksProcessed"].as_u64().unwrap() as usize;
    assert!(chunks >= 2, "{out}");
    assert_eq!(out["compaction"]["passes"], 2);
    assert_eq!(summarizer.calls(), chunks + 1);
    assert_eq!(
        out["compaction"]["summarizerPromptTokens"],
        100 * (chunks as u64 + 1)
    );
    let first = MockSummarizer::input_of(&summarizer.received()[0].1);
    assert!(
        first.contains("[assistant calls search({\"q\":\"boots 0\"})]"),
        "{first}"
    );
    assert!(first.contains("[result of search] {\"hits\":0}"), "{first}");
}

#[tokio::test]
async fn a_conversation_beyond_the_chunk_limit_is_400_not_500() {
    let (summarizer, _upstream, proxy) =
        setup("window_tokens = 1200\nmax_output_tokens = 200\nmax_chunks = 2").await;
    let body = json!({"providerID": "lorem", "model": "m", "messages": v4(60)});
    let answer = post(&proxy, &body).await;
    assert_eq!(answer.status, 400);
    assert!(answer.json()["message"]
        .as_str()
        .unwrap()
        .contains("chunks"));
    assert_eq!(summarizer.calls(), 0);
}

#[tokio::test]
async fn invalid_input_is_422_in_the_validation_error_shape() {
    let (_summarizer, _upstream, proxy) = setup("").await;
    for (body, loc) in [
        (
            json!({"model": "m", "messages": []}),
            json!(["body", "providerID"]),
        ),
        (
            json!({"providerID": "lorem", "model": "m", "messages": [], "keepLastMessages": -1}),
            json!(["body", "keepLastMessages"]),
        ),
        (
            json!({"providerID": "lorem", "model": "m", "messages": [], "targetTokensEstimate": 63}),
            json!(["body", "targetTokensEstimate"]),
        ),
        (
            json!({"providerID": "lorem", "model": "m", "messages": [], "instructions": "x".repeat(2001)}),
            json!(["body", "instructions"]),
        ),
        (
            json!({"providerID": "lorem", "model": "m", "messages": [{"role": "tool", "content": "x"}]}),
            json!(["body", "messages", 0, "role"]),
        ),
        (
            json!({"providerID": "nobody", "model": "m", "messages": []}),
            json!(["body", "providerID"]),
        ),
    ] {
        let answer = post(&proxy, &body).await;
        assert_eq!(answer.status, 422, "{body}");
        let detail = answer.json()["detail"].as_array().unwrap().clone();
        assert!(
            detail
                .iter()
                .any(|d| d["loc"] == loc && d["msg"].is_string() && d["type"].is_string()),
            "{loc}: {detail:?}"
        );
    }
}
