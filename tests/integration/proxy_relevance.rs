//! `scoring = "relevance"` through the real proxy: the goal header the
//! policy names joins the query and changes what is forwarded, and an
//! outcome computed without a goal is never served for a request with one.

use crate::support::*;

const POLICY: &str = "[policies.default]\nmode = \"exact\"\nbudget_chars = 60\nkeep_last_n = 1\n\
    pin_first_user = false\nscoring = \"relevance\"\n\
    relevance_goal_header = \"x-compaction-goal\"";

const INVOICE: &str = "The invoice total for Kestrel was 4410 EUR.";
const SHIPMENT: &str = "The rail shipment to Halden leaves at 06:40.";

fn body() -> String {
    serde_json::json!({"model": "m", "messages": [
        {"role": "user", "content": INVOICE},
        {"role": "assistant", "content": "Filler about the weather and lunch. ".repeat(6)},
        {"role": "assistant", "content": SHIPMENT},
        {"role": "user", "content": "continue"},
    ]})
    .to_string()
}

fn forwarded(upstream: &MockUpstream) -> Vec<String> {
    upstream.last().json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn the_goal_header_decides_what_is_kept() {
    let upstream = MockUpstream::start(Behavior::Json(200, serde_json::json!({"ok": true}))).await;
    let proxy = TestProxy::start(POLICY, &upstream.url()).await;
    let url = proxy.url("/v1/chat/completions");

    // "continue" matches nothing: the seed order keeps the most recent.
    let answer = send(post_json(&url, body())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(forwarded(&upstream), [SHIPMENT, "continue"]);

    // The same body with a goal: not the cached outcome, the invoice.
    let mut request = post_json(&url, body());
    request.headers_mut().insert(
        "x-compaction-goal",
        "invoice total of Kestrel".parse().unwrap(),
    );
    let answer = send(request).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(forwarded(&upstream), [INVOICE, "continue"]);

    // A blank goal is no goal.
    let mut request = post_json(&url, body());
    request
        .headers_mut()
        .insert("x-compaction-goal", "  ".parse().unwrap());
    send(request).await;
    assert_eq!(forwarded(&upstream), [SHIPMENT, "continue"]);
}

#[test]
fn check_config_refuses_bad_relevance_keys() {
    let loaded = compaction_proxy::config::load(
        Some(&temp_file(
            "relevance.toml",
            b"[policies.default]\nbudget_chars = 10\nscoring = \"relevance\"\n\
              pin_relevant_above = 1.5\nrelevant_pin_share = -0.1\n\
              relevance_goal_header = \"bad header\"\n\
              [policies.plain]\nbudget_chars = 10\npin_relevant_above = 0.5",
        )),
        Vec::new(),
        &Default::default(),
    );
    let err = match loaded {
        Err(err) => err,
        Ok(config) => compaction_proxy::policy::Runtime::new(config).unwrap_err(),
    };
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "policies.default.pin_relevant_above",
            "policies.default.relevant_pin_share",
            "policies.default.relevance_goal_header",
            "policies.plain.pin_relevant_above",
        ],
        "{err}"
    );
}

/// Two long tool results, the older one holding the fact the last request
/// asks about; the budget is reached once the other is pruned and its
/// call clipped.
fn agent_body() -> serde_json::Value {
    let numbered =
        |n: usize, tag: &str| -> String { (0..n).map(|k| format!("{tag}{k} ")).collect() };
    let args = |path: &str| serde_json::json!({"path": path, "pad": "y".repeat(200)}).to_string();
    let fact = format!(
        "{}The gate code for depot Norrby is 7731-KAPPA. {}",
        numbered(60, "line"),
        numbered(60, "line")
    );
    serde_json::json!({"model": "m", "messages": [
        {"role": "user", "content": "Task: check the sites."},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read_file", "arguments": args("a.txt")}}
        ]},
        {"role": "tool", "tool_call_id": "call_1", "content": fact},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "read_file", "arguments": args("b.txt")}}
        ]},
        {"role": "tool", "tool_call_id": "call_2", "content": numbered(120, "row")},
        {"role": "user", "content": "What is the gate code for depot Norrby?"},
    ]})
}

fn agent_policy(scoring: &str) -> String {
    format!(
        "[policies.default]\nmode = \"exact\"\nbudget_chars = 1400\nkeep_last_n = 1\nscoring = \"{scoring}\"\n\
         max_tool_result_chars = 100\nprotect_tool_chars = 0\nprune_minimum_chars = 0\n\
         max_arg_chars = 40\n"
    )
}

#[tokio::test]
async fn the_agent_passes_leave_a_relevant_tool_result_whole() {
    let body = agent_body();
    let sent = |scoring: &'static str| {
        let body = body.clone();
        async move {
            let upstream =
                MockUpstream::start(Behavior::Json(200, serde_json::json!({"ok": true}))).await;
            let proxy = TestProxy::start(&agent_policy(scoring), &upstream.url()).await;
            let answer = send(post_json(
                &proxy.url("/v1/chat/completions"),
                body.to_string(),
            ))
            .await;
            assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
            upstream.last().json()["messages"].clone()
        }
    };
    let original = &body["messages"];

    let relevant = sent("relevance").await;
    assert_eq!(relevant.as_array().unwrap().len(), 6, "nothing dropped");
    assert_eq!(relevant[2], original[2], "the fact's result goes whole");
    assert_eq!(relevant[1], original[1], "its call keeps its arguments");
    assert_ne!(relevant[4], original[4], "the other result is pruned");
    assert_ne!(relevant[3], original[3], "its call is clipped");

    // Seed scoring prunes the older result first: the fact is cut.
    let seed = sent("seed").await;
    let fact = seed[2]["content"].as_str().unwrap();
    assert!(!fact.contains("7731-KAPPA"), "{fact}");
}

/// A history of `turns` notes about depots, then a question about each of
/// `asked` in turn (answered, but for the last).
fn turns_body(turns: usize, asked: &[usize]) -> String {
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You help with depots."})];
    for i in 0..turns {
        messages.push(serde_json::json!({"role": "user",
            "content": format!("Note for depot D{i}: its gate code is {}-KAPPA and the dock is {}.", 1000 + i * 37, i % 4)}));
        messages.push(serde_json::json!({"role": "assistant",
            "content": format!("Noted the gate code of depot D{i}. The weather there is mild and the crew is ready.")}));
    }
    for (n, depot) in asked.iter().enumerate() {
        if n > 0 {
            messages
                .push(serde_json::json!({"role": "assistant", "content": "See the notes above."}));
        }
        messages.push(serde_json::json!({"role": "user", "content": format!("Which gate code opens depot D{depot}?")}));
    }
    serde_json::json!({"model": "m", "messages": messages}).to_string()
}

#[tokio::test]
async fn cached_analyses_forward_the_same_bytes_as_a_cold_compaction() {
    // No outcome cache, so every request runs the engine.
    let policy = |analyses: u64| {
        format!(
            "[cache]\nmax_bytes = 0\nrelevance_max_bytes = {analyses}\n\
             [policies.default]\nmode = \"exact\"\nbudget_chars = 900\nkeep_last_n = 2\nscoring = \"relevance\"\n"
        )
    };
    let earlier = turns_body(12, &[3]);
    let later = turns_body(12, &[3, 5]);
    // Warm: the later turn finds the earlier turn's analyses; then all its own.
    let warm = compacted_upstream_bodies(
        &policy(1 << 20),
        vec![earlier, later.clone(), later.clone()],
    )
    .await;
    let cold = compacted_upstream_bodies(&policy(0), vec![later]).await;
    assert_eq!(warm[1], cold[0]);
    assert_eq!(warm[2], cold[0]);
    let kept = String::from_utf8_lossy(&cold[0]).into_owned();
    assert!(
        kept.contains("depot D5: its gate code is 1185-KAPPA"),
        "{kept}"
    );
}
