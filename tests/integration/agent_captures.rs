//! Request bodies captured from the real clients (Claude Code 2.1.332,
//! Codex CLI 0.171, opencode 1.18; `tests/data/agents/README.md` says how)
//! through the real server: each client's own compaction request goes
//! upstream byte for byte, `skipped; agent-compaction`; each client's
//! ordinary turn is compacted, never skipped, with what the API requires
//! held (Claude Code's system entries whole, in place; no empty text).

use serde_json::{json, Value};

use crate::support::*;

fn capture(name: &str) -> bytes::Bytes {
    std::fs::read(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/agents")
            .join(name),
    )
    .unwrap_or_else(|e| panic!("{name}: {e}"))
    .into()
}

/// Well below every capture's size, so each would be compacted.
const TIGHT: &str = "[policies.default]
budget_chars = 20000
keep_last_n = 2
";

/// Sends capture `name` to `path` through a proxy on `toml`: the status
/// header, and what the upstream received.
async fn through(toml: &str, path: &str, name: &str) -> (Option<String>, bytes::Bytes) {
    let upstream = MockUpstream::start(Behavior::Json(200, serde_json::json!({"ok": true}))).await;
    let proxy = TestProxy::start(toml, &upstream.url()).await;
    let answer = send(post_json(&proxy.url(path), capture(name))).await;
    assert_eq!(answer.status, 200, "{name}");
    (
        answer.header("x-compaction-status").map(str::to_owned),
        upstream.last().body.clone(),
    )
}

#[tokio::test]
async fn each_clients_own_compaction_request_goes_upstream_untouched() {
    for (path, name) in [
        (
            "/v1/messages?beta=true",
            "claude-code-opus-5-5-compact.json",
        ),
        (
            "/v1/messages?beta=true",
            "claude-code-sonnet-4-5-compact.json",
        ),
        ("/v1/responses", "codex-checkpoint-compaction.json"),
        ("/v1/chat/completions", "opencode-summarize.json"),
    ] {
        let (status, received) = through(TIGHT, path, name).await;
        assert_eq!(
            status.as_deref(),
            Some("skipped; agent-compaction"),
            "{name}"
        );
        assert_eq!(received, capture(name), "{name}: byte for byte");
    }
}

#[tokio::test]
async fn each_clients_turn_is_compacted_not_skipped_and_stays_valid() {
    for (path, name, list) in [
        (
            "/v1/messages?beta=true",
            "claude-code-opus-5-5-turn.json",
            "messages",
        ),
        ("/v1/responses", "codex-turn.json", "input"),
        ("/v1/chat/completions", "opencode-turn.json", "messages"),
    ] {
        let (status, received) = through(TIGHT, path, name).await;
        assert_eq!(status.as_deref(), Some("compacted"), "{name}");
        let original: Value = serde_json::from_slice(&capture(name)).unwrap();
        let sent: Value = serde_json::from_slice(&received).unwrap();
        // Every field beside the compacted list, as it came; but Claude
        // Code's open tool loop ends in a turn whose reasoning saw what was
        // cut, so the API is asked to drop it (preserved thinking).
        for (key, value) in original.as_object().unwrap() {
            if key == "thinking" && sent[key].get("block_binding").is_some() {
                let mut asked = value.clone();
                asked["block_binding"] = json!({"prefix_mismatch_behavior": "drop_block"});
                assert_eq!(&sent[key], &asked, "{name}: {key}");
            } else if key != list {
                assert_eq!(&sent[key], value, "{name}: {key}");
            }
        }
        let items = sent[list].as_array().unwrap();
        assert!(
            items.len() < original[list].as_array().unwrap().len(),
            "{name}"
        );
        // No empty text anywhere in what is forwarded.
        for item in items {
            let text = item.to_string();
            assert!(!text.contains(r#""text":"""#), "{name}: {text}");
            assert!(!text.contains(r#""content":"""#), "{name}: {text}");
            assert!(!text.contains(r#""content":[]"#), "{name}: {text}");
        }
    }
}

#[tokio::test]
async fn claude_codes_system_entry_stays_whole_in_place() {
    let name = "claude-code-opus-5-5-turn.json";
    let (_, received) = through(TIGHT, "/v1/messages?beta=true", name).await;
    let original: Value = serde_json::from_slice(&capture(name)).unwrap();
    let sent: Value = serde_json::from_slice(&received).unwrap();
    let messages = sent["messages"].as_array().unwrap();
    let entries: Vec<&Value> = original["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "system")
        .collect();
    assert!(!entries.is_empty(), "the capture has system entries");
    for entry in entries {
        let k = messages
            .iter()
            .position(|m| m == entry)
            .expect("kept whole");
        let role = |j: usize| messages[j]["role"].as_str().unwrap();
        let before = (0..k).rev().find(|&j| role(j) != "system");
        let after = (k + 1..messages.len()).find(|&j| role(j) != "system");
        assert!(before.is_some_and(|j| role(j) == "user"), "{sent}");
        assert!(after.map_or(true, |j| role(j) == "assistant"), "{sent}");
    }
    assert_eq!(messages[0]["role"], "user");
}
