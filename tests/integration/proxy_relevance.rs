//! `scoring = "relevance"` through the real proxy: the goal header the
//! policy names joins the query and changes what is forwarded, and an
//! outcome computed without a goal is never served for a request with one.

use crate::support::*;

const POLICY: &str = "[policies.default]\nbudget_chars = 60\nkeep_last_n = 1\n\
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
