//! Recall with a real coding agent (issue 27): Claude Code, unchanged,
//! through the proxy with `recall = true`, against the harness's fake model
//! (`scripts/agents/fake_upstream.py --recall-file`). The model's first tool
//! call reads a file that holds a secret token in its middle; once the
//! proxy has cut that tool result (a marker with its recall id in its
//! place), the model calls `compaction_recall` with that marker's id, the
//! proxy answers it from the request's own body, and the model ends the
//! session with the token. The token reaches Claude Code's answer only
//! through the recall: the forwarded request that asked for it held no
//! token.
//!
//! Runs in exact mode and on the shipped defaults (stable mode). Needs the
//! harness's clients (`npm ci` in scripts/agents); without them it prints
//! `skipped`, and with `REQUIRE_AGENT_CLIENTS=1` it fails instead.

use std::path::Path;

use serde_json::Value;

const AGENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/agents");

fn claude_installed() -> bool {
    if Path::new(AGENTS).join("node_modules/.bin/claude").exists() {
        return true;
    }
    assert!(
        std::env::var_os("REQUIRE_AGENT_CLIENTS").is_none(),
        "Claude Code is required here: `npm ci` in scripts/agents (see .ci/run)"
    );
    eprintln!("skipped: Claude Code is not installed (`npm ci` in scripts/agents)");
    false
}

/// The recorded requests of one run's fake upstream, in order.
fn upstream_log(dir: &Path) -> Vec<(Value, String)> {
    let mut names: Vec<_> = std::fs::read_dir(dir.join("upstream"))
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    names.sort();
    names
        .into_iter()
        .map(|p| {
            let entry: Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            let body = std::fs::read_to_string(p.with_extension("body")).unwrap_or_default();
            (entry, body)
        })
        .collect()
}

/// Runs the harness: Claude Code in `modes`, `--recall <recall>`, 8 turns at
/// 20,000 chars; its figures.
fn harness(modes: &str, recall: &str) -> Value {
    let work = std::env::temp_dir().join(format!(
        "agent-recall-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    crate::agent_clients::run_harness(
        &work,
        &[
            "--clients",
            "claude",
            "--modes",
            modes,
            "--recall",
            recall,
            "--turns",
            "8",
            "--budget",
            "20000",
            "--timeout",
            "120",
        ],
    )
}

/// After a recall the session goes on: the turn the proxy answered after
/// its recall round carries reasoning made with that round in its prefix,
/// which Claude Code's history lacks. The proxy asks the API to drop such
/// blocks (drop_block) whenever its tool goes, so no later request is
/// refused, in stable mode as in exact mode.
#[test]
fn claude_code_goes_on_after_a_recall_without_a_refused_request() {
    if !claude_installed() {
        return;
    }
    let figures = harness("exact,defaults", "continue");
    for run in figures["results"].as_array().unwrap() {
        let case = format!("{} (logs in {})", run["mode"], run["dir"]);
        assert_eq!(run["rc"], 0, "{case}: Claude Code failed");
        assert_eq!(run["refused"], 0, "{case}: {}", run["refused_by_reason"]);
        assert_eq!(run["turns"], 8, "{case}: the session ran to its end");
        assert_eq!(run["recall_calls"].as_array().unwrap().len(), 1, "{case}");
        assert_eq!(run["recall_rounds"], 1, "{case}");
        assert!(
            run["dropped_thinking"].as_u64().unwrap() > 0,
            "{case}: the stale reasoning was dropped by the API, as asked"
        );
    }
}

#[test]
fn claude_code_gets_a_cut_tool_result_back_through_compaction_recall() {
    if !claude_installed() {
        return;
    }
    let figures = harness("exact,defaults", "end");
    let secret = figures["secret"].as_str().unwrap().to_owned();
    assert!(secret.starts_with("VAULT-TOKEN-"), "{secret}");
    for mode in ["exact", "defaults"] {
        let run = figures["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["mode"] == mode)
            .unwrap_or_else(|| panic!("no {mode} run"));
        let dir = Path::new(run["dir"].as_str().unwrap());
        let case = format!("{mode} (logs in {dir:?})");
        assert_eq!(run["rc"], 0, "{case}: Claude Code failed");
        assert_eq!(run["refused"], 0, "{case}: {}", run["refused_by_reason"]);
        assert_eq!(run["errors"], 0, "{case}");
        // Claude Code's final answer holds the token.
        let answer = std::fs::read_to_string(dir.join("client-0.log")).unwrap();
        assert!(
            answer.contains(&format!(
                "The vault token in the file I read first is {secret}."
            )),
            "{case}: {answer}"
        );
        // One recall call, for one id, answered by the proxy in one round.
        let calls = run["recall_calls"].as_array().unwrap();
        assert_eq!(calls.len(), 1, "{case}: {calls:?}");
        let ids: Vec<&str> = calls[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_str().unwrap())
            .collect();
        assert_eq!(run["recall_rounds"], 1, "{case}");
        assert_eq!(run["recall_answers"], 1, "{case}");
        assert_eq!(
            run["recalled_ids"],
            serde_json::json!([ids.join(", ")]),
            "{case}"
        );

        let log = upstream_log(dir);
        let at = |kind: &str| {
            log.iter()
                .position(|(e, _)| e["kind"] == kind)
                .unwrap_or_else(|| panic!("{case}: no {kind} request"))
        };
        let (call, answered) = (at("recall-call"), at("recall-answer"));
        assert_eq!(answered, call + 1, "{case}: the follow-up came next");
        let (call_entry, call_body) = &log[call];
        // The request that made the model recall had the marker with that
        // id and the proxy's tool, and not the token: it had been cut.
        for id in &ids {
            assert!(
                call_body.contains(&format!("compaction_recall id: {id}")),
                "{case}: the marker of {id}"
            );
        }
        assert!(!call_body.contains(&secret), "{case}: the token was cut");
        let tools: Vec<&str> = call_entry["body"]["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str())
            .collect();
        assert_eq!(tools.last(), Some(&"compaction_recall"), "{case}");
        // The proxy's follow-up: the same request with the model's call and
        // the tool's answer, holding the original with the token.
        let (follow, follow_body) = &log[answered];
        let messages = follow["body"]["messages"].as_array().unwrap();
        let sent = call_entry["body"]["messages"].as_array().unwrap();
        assert_eq!(
            &messages[..sent.len()],
            &sent[..],
            "{case}: it only appends"
        );
        assert_eq!(messages.len(), sent.len() + 2, "{case}");
        assert!(follow_body.contains(&secret), "{case}");
        // Claude Code never saw the recall call: none of the requests it
        // made itself carries one.
        let recall_calls = |body: &Value| {
            body["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|m| m["content"].as_array())
                .flatten()
                .filter(|b| b["type"] == "tool_use" && b["name"] == "compaction_recall")
                .count()
        };
        assert_eq!(recall_calls(&follow["body"]), 1, "{case}");
        for (n, (entry, _)) in log.iter().enumerate() {
            if n != answered {
                assert_eq!(
                    recall_calls(&entry["body"]),
                    0,
                    "{case}: request {n} ({}) carries a recall call",
                    entry["kind"]
                );
            }
        }
    }
}
