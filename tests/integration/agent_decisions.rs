//! ReMe's per-unit decisions (seed 004: keep, drop_result, drop_call) in the
//! live report, checked against what the upstream actually received.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::support::*;

/// Old tool units with long distinct outputs, a recent short one, and a
/// last user turn.
fn agent_body() -> Value {
    let output =
        |tag: &str| -> String { (0..300).map(|k| format!("{tag}{k} ")).collect::<String>() };
    let call = |id: &str, name: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": id, "type": "function", "function": {"name": name, "arguments": "{\"path\":\"src/lib.rs\"}"}}
        ]})
    };
    let result =
        |id: &str, text: String| json!({"role": "tool", "tool_call_id": id, "content": text});
    json!({"model": "gpt-4o", "messages": [
        {"role": "user", "content": "Task: find why the payment retry loop never stops."},
        call("call_a", "read_file"),
        result("call_a", output("alpha")),
        {"role": "assistant", "content": "Nothing in that file; the loop is elsewhere, I will search for it."},
        call("call_b", "grep"),
        result("call_b", output("beta")),
        {"role": "assistant", "content": "Found the loop, reading the retry module now."},
        call("call_c", "read_file"),
        result("call_c", output("gamma")),
        call("call_d", "run_tests"),
        result("call_d", "2 passed".to_owned()),
        {"role": "user", "content": "Now fix it."},
    ]})
}

async fn fetch_report(proxy: &TestProxy, id: &str) -> Value {
    let url = proxy.url(&format!("/v1/compaction-reports/{id}"));
    let get = || {
        http::Request::get(&url)
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let mut fetched = send(get()).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while fetched.status == 404 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
        fetched = send(get()).await;
    }
    assert_eq!(fetched.status, 200);
    serde_json::from_slice(&fetched.body).unwrap()
}

#[tokio::test]
async fn every_tool_call_has_the_decision_of_what_was_forwarded() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(
        "[policies.default]
budget_chars = 1300
keep_last_n = 3
allow_report = true
max_tool_result_chars = 400
protect_tool_chars = 0
prune_minimum_chars = 0
",
        &upstream.url(),
    )
    .await;
    let body = agent_body();
    let mut request = post_json(&proxy.url("/v1/chat/completions"), body.to_string());
    request
        .headers_mut()
        .insert("x-compaction-report", "true".parse().unwrap());
    let answer = send(request).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let report = fetch_report(&proxy, answer.header("x-compaction-report-id").unwrap()).await;

    let sent = upstream.last().json();
    let original = body["messages"].as_array().unwrap();
    let forwarded = sent["messages"].as_array().unwrap();
    let forwarded_call = |id: &str| {
        forwarded.iter().any(|m| {
            m["tool_calls"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["id"] == id))
        })
    };
    let result_of = |messages: &[Value], id: &str| {
        messages
            .iter()
            .find(|m| m["tool_call_id"] == id)
            .map(|m| m["content"].clone())
    };

    let lines = report["messages"].as_array().unwrap();
    let mut seen = Vec::new();
    for line in lines {
        let index = line["index"].as_u64().unwrap() as usize;
        for call in line["tool_calls"].as_array().into_iter().flatten() {
            let id = call["id"].as_str().unwrap();
            assert_eq!(
                original[index]["tool_calls"][0]["id"], id,
                "on its own line"
            );
            assert_eq!(
                call["name"],
                original[index]["tool_calls"][0]["function"]["name"]
            );
            let decision = call["decision"].as_str().unwrap();
            match decision {
                "drop_call" => {
                    assert!(!forwarded_call(id), "{id}");
                    assert_eq!(result_of(forwarded, id), None, "{id}");
                }
                "drop_result" => {
                    assert!(forwarded_call(id), "{id}");
                    let sent = result_of(forwarded, id).expect("the result is forwarded");
                    assert_ne!(Some(sent), result_of(original, id), "{id} is shortened");
                }
                "keep" => {
                    assert!(forwarded_call(id), "{id}");
                    assert_eq!(result_of(forwarded, id), result_of(original, id), "{id}");
                }
                other => panic!("unknown decision {other}"),
            }
            // The result's line carries its call's decision.
            let result_index = original
                .iter()
                .position(|m| m["tool_call_id"] == id)
                .unwrap();
            let result_line = lines.iter().find(|l| l["index"] == result_index).unwrap();
            assert_eq!(result_line["decision"], decision, "{id}");
            seen.push(decision.to_owned());
        }
    }
    assert_eq!(seen.len(), 4, "one decision per call: {report:#}");
    for decision in ["keep", "drop_result", "drop_call"] {
        assert!(
            seen.iter().any(|d| d == decision),
            "the scenario shows {decision}: {seen:?}"
        );
    }
    // Messages without tool traffic carry no decision.
    assert!(lines[0].get("decision").is_none() && lines[0].get("tool_calls").is_none());
}
