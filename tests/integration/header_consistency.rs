//! The loss report never contradicts itself: `unchanged` means the body
//! fit (or stayed below every trigger), so it never comes with
//! `x-compaction-budget-met: false` or `x-compaction-rebased: true`; a
//! rebase is only reported when something forwarded changed.
//!
//! Property: random conversations, sent turn by turn (so stable mode
//! replays and re-compacts), under random budgets, modes, triggers and
//! pins, through the real server's headers.

use proptest::prelude::*;
use serde_json::{json, Value};

use crate::support::*;

#[derive(Debug, Clone)]
struct Case {
    /// Message lengths, alternating user and assistant.
    lengths: Vec<usize>,
    budget: usize,
    stable: bool,
    keep_last_n: usize,
    trigger_chars: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(1usize..400, 2..24),
        50usize..3000,
        any::<bool>(),
        1usize..6,
        prop_oneof![Just(0usize), 100usize..4000],
    )
        .prop_map(
            |(lengths, budget, stable, keep_last_n, trigger_chars)| Case {
                lengths,
                budget,
                stable,
                keep_last_n,
                trigger_chars,
            },
        )
}

fn messages(lengths: &[usize]) -> Vec<Value> {
    lengths
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            // Words of five letters, different from message to message.
            let text: String = (0..n.div_ceil(6))
                .map(|k| {
                    let c = char::from(b'a' + ((i * 7 + k) % 26) as u8);
                    format!("{} ", c.to_string().repeat(5))
                })
                .collect();
            json!({"role": role, "content": text})
        })
        .collect()
}

async fn check(case: Case) -> Result<(), TestCaseError> {
    let upstream = MockUpstream::start(Behavior::OpenAiChat).await;
    let toml = format!(
        "[policies.default]\nmode = \"{}\"\nbudget_chars = {}\nkeep_last_n = {}\ntrigger_chars = {}\n",
        if case.stable { "stable" } else { "exact" },
        case.budget,
        case.keep_last_n,
        case.trigger_chars,
    );
    let proxy = TestProxy::start(&toml, &upstream.url()).await;
    let all = messages(&case.lengths);
    // Each request ends on a user message, as a client's turns do.
    for end in (1..=all.len()).step_by(2) {
        let body = json!({"model": "m", "messages": &all[..end]}).to_string();
        let answer = send(post_json(&proxy.url("/v1/chat/completions"), body)).await;
        let status = answer
            .header("x-compaction-status")
            .unwrap_or("")
            .to_owned();
        let budget_met = answer.header("x-compaction-budget-met");
        let rebased = answer.header("x-compaction-rebased");
        if status == "unchanged" {
            prop_assert_eq!(budget_met, Some("true"), "turn ending {}", end);
            prop_assert_ne!(rebased, Some("true"), "turn ending {}", end);
            prop_assert_eq!(
                answer.header("x-compaction-input-chars"),
                answer.header("x-compaction-output-chars")
            );
        }
        if rebased == Some("true") {
            prop_assert_eq!(status.as_str(), "compacted", "turn ending {}", end);
        }
        if status == "compacted" {
            let (input, output): (usize, usize) = (
                answer
                    .header("x-compaction-input-chars")
                    .unwrap()
                    .parse()
                    .unwrap(),
                answer
                    .header("x-compaction-output-chars")
                    .unwrap()
                    .parse()
                    .unwrap(),
            );
            prop_assert!(
                output < input,
                "compacted forwards less: {input} -> {output}"
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn no_response_says_unchanged_beside_a_miss_or_a_rebase(case in case()) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(check(case))?;
    }
}
