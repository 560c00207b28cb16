//! The official Anthropic Python SDK (messages, a tool round, streaming
//! with `messages.stream`) and the OpenAI SDKs' `responses.create` (plain
//! and streaming) work unchanged through the proxy, only the base URL
//! changed, against mocks answering like those APIs, with compaction
//! happening. Each script sends every request twice, straight to the mock
//! and then through the proxy, so the test holds the body the SDK wrote
//! and the body the proxy forwarded, and checks the second against the
//! API's rules ([`crate::format_rules`]).
//!
//! CI installs the SDKs and sets `REQUIRE_ANTHROPIC_SDK=1` and
//! `REQUIRE_OPENAI_SDKS=1`; elsewhere a missing SDK makes its test say it
//! was skipped.

use serde_json::Value;

use crate::format_rules::{check_anthropic, check_responses};
use crate::sdk_openai::{sdk_available, sdk_available_unless};
use crate::support::*;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk");

/// Small enough that every conversation the scripts send is compacted.
const POLICY: &str = "[policies.default]\nbudget_chars = 3000";

/// Runs an SDK script with these arguments; what it printed, as JSON.
async fn run_script(program: &'static str, script: String, args: Vec<String>) -> Value {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(program)
            .arg(&script)
            .args(&args)
            .output()
            .expect("the SDK script runs")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "SDK script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("script prints JSON")
}

fn len(value: &Value) -> usize {
    value.as_array().map_or(0, Vec::len)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_python_sdk_works_unchanged_tool_use_and_streaming_included() {
    let probe = ["-c", "import anthropic"];
    let what = "the anthropic Python package";
    if !sdk_available_unless(what, "python3", &probe, "REQUIRE_ANTHROPIC_SDK") {
        return;
    }
    let upstream = MockUpstream::start(Behavior::AnthropicMessages).await;
    let proxy = TestProxy::start(POLICY, &upstream.url()).await;
    let script = format!("{DIR}/anthropic_python.py");
    let seen = run_script("python3", script, vec![proxy.url(""), upstream.url()]).await;

    let received = upstream.received();
    assert_eq!(
        received.len(),
        8,
        "four requests, each sent direct and proxied"
    );
    let sent = seen["sent_messages"].as_array().expect("sent counts");
    for (pair, sent) in received.chunks(2).zip(sent) {
        let (original, forwarded) = (&pair[0], &pair[1]);
        assert_eq!(forwarded.uri.path(), "/v1/messages");
        assert_eq!(
            len(&original.json()["messages"]),
            sent.as_u64().unwrap() as usize
        );
        check_anthropic(&original.body, &forwarded.body)
            .unwrap_or_else(|why| panic!("{why}\n{}", String::from_utf8_lossy(&forwarded.body)));
        assert!(
            len(&forwarded.json()["messages"]) < len(&original.json()["messages"]),
            "the history was compacted"
        );
        // The key goes through in whichever header this SDK version puts it
        // (`x-api-key`, or `Authorization: Bearer` from anthropic 2), as
        // the SDK sent it.
        crate::sdk_openai::assert_key_passed_through(
            &original.headers,
            &forwarded.headers,
            "sk-ant-sdk-test-key",
        );
        assert_eq!(
            forwarded.headers.get("anthropic-version"),
            original.headers.get("anthropic-version")
        );
    }
    let kept = |i: usize| len(&received[i].json()["messages"]);
    let answer = |i: usize| format!("received {} messages", kept(i));
    assert_eq!(seen["status_header"], "compacted");
    assert_eq!(seen["output_messages_header"], kept(1).to_string());
    assert_eq!(seen["text"], answer(1).as_str());

    assert_eq!(seen["tool_use"]["name"], "read_file");
    assert_eq!(seen["tool_use"]["stop_reason"], "tool_use");
    assert_eq!(seen["tool_use"]["input"]["path"], "src/lib.rs");
    let round = received[5].json();
    let messages = round["messages"].as_array().unwrap();
    let last = &messages[messages.len() - 1]["content"][0];
    assert_eq!(last["type"], "tool_result", "the tool result was kept");
    assert_eq!(last["tool_use_id"], "toolu_mock_1");
    assert_eq!(seen["tool_round_text"], answer(5).as_str());

    assert_eq!(received[7].json()["stream"], true);
    assert_eq!(
        seen["streamed_text"],
        answer(7).as_str(),
        "the stream arrived whole through the proxy"
    );
    assert_eq!(seen["final_text"], answer(7).as_str());
}

/// Runs a Responses script and checks what the SDK saw and the mock got.
async fn drive_responses(program: &'static str, script: String, api_path: &str) {
    let upstream = MockUpstream::start(Behavior::OpenAiResponses).await;
    let proxy = TestProxy::start(POLICY, &upstream.url()).await;
    let args = vec![proxy.url(api_path), format!("{}{api_path}", upstream.url())];
    let seen = run_script(program, script, args).await;

    let received = upstream.received();
    assert_eq!(
        received.len(),
        4,
        "two requests, each sent direct and proxied"
    );
    for pair in received.chunks(2) {
        let (original, forwarded) = (&pair[0], &pair[1]);
        assert_eq!(forwarded.uri.path(), "/v1/responses");
        assert_eq!(
            len(&original.json()["input"]),
            seen["sent_items"].as_u64().unwrap() as usize
        );
        check_responses(&original.body, &forwarded.body)
            .unwrap_or_else(|why| panic!("{why}\n{}", String::from_utf8_lossy(&forwarded.body)));
        assert!(
            len(&forwarded.json()["input"]) < len(&original.json()["input"]),
            "the input was compacted"
        );
        assert_eq!(forwarded.headers["authorization"], "Bearer sk-sdk-test-key");
    }
    let answer = |i: usize| format!("received {} items", len(&received[i].json()["input"]));
    assert_eq!(seen["status_header"], "compacted");
    assert_eq!(
        seen["output_messages_header"],
        len(&received[1].json()["input"]).to_string()
    );
    assert_eq!(seen["text"], answer(1).as_str());
    assert_eq!(received[3].json()["stream"], true);
    assert_eq!(
        seen["streamed_text"],
        answer(3).as_str(),
        "the stream arrived whole through the proxy"
    );
    assert_eq!(seen["completed_text"], answer(3).as_str());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_python_sdk_responses_work_unchanged_streaming_included() {
    if sdk_available(
        "the openai Python package",
        "python3",
        &["-c", "import openai"],
    ) {
        drive_responses(
            "python3",
            format!("{DIR}/openai_responses_python.py"),
            "/v1",
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_node_sdk_responses_work_unchanged_streaming_included() {
    let probe = format!("{DIR}/node/node_modules/openai/package.json");
    if sdk_available(
        "the openai Node package in tests/sdk/node",
        "node",
        &["-e", &format!("require('{probe}')")],
    ) {
        drive_responses(
            "node",
            format!("{DIR}/node/openai_responses_node.mjs"),
            "/v1",
        )
        .await;
    }
}
