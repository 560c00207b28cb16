//! Stable mode (issue 7): what a conversation sent turn by turn costs on a
//! provider with prompt caching, and that the forwarded bytes are a
//! function of the request and the policy alone (replicas, restarts and an
//! evicted cache all forward the same bytes).
//!
//! The small version of `benches/stable.rs`: the same generators and
//! billing, with the targets as assertions.

#[path = "../../benches/support/conversation_sim.rs"]
pub(crate) mod sim;

use crate::support::*;
use bytes::Bytes;
use compaction_proxy::cache::CheckpointStore;
use compaction_proxy::config::Mode;
use compaction_proxy::engine::{Policy, Role};
use compaction_proxy::format::Format;
use compaction_proxy::policy::CompiledPolicy;
use serde_json::Value;
use sim::*;

/// The shipped default policy's keys, at `budget` chars, in `mode`.
fn policy(budget: usize, mode: Mode) -> CompiledPolicy {
    let mut engine = Policy::with_budget(budget);
    engine.keep_roles = vec![Role::System, Role::Developer];
    engine.max_message_chars = 4000;
    let mut p = CompiledPolicy::plain("default", engine);
    p.pin_first_user = true;
    p.mode = mode;
    p
}

fn check_targets(name: &str, requests: &[Vec<u8>], budget: usize) {
    let plain = bill_cold(requests, None);
    let exact = bill_cold(requests, Some(&policy(budget, Mode::Exact)));
    let store = CheckpointStore::new(16 << 20);
    let stable = bill(requests, Some(&policy(budget, Mode::Stable)), &store);
    let figures = format!(
        "{name}: billed uncompacted {:.0}, exact {:.0}, stable {:.0}; extending exact {:.2}, stable {:.2}; fill stable {:.2} over {} outgrown turns",
        plain.billed,
        exact.billed,
        stable.billed,
        exact.extending_share(),
        stable.extending_share(),
        stable.fill,
        stable.outgrown_turns
    );
    assert!(stable.outgrown_turns > 0, "{figures}");
    assert!(stable.billed <= 0.6 * plain.billed, "{figures}");
    assert!(stable.billed <= 0.25 * exact.billed, "{figures}");
    assert!(stable.extending_share() >= 0.9, "{figures}");
    assert!(stable.fill >= 0.6, "{figures}");
    assert!(stable.fill <= 1.0, "budget exceeded: {figures}");
}

#[test]
fn stable_mode_bills_a_dispatcher_chat_below_uncompacted_and_exact() {
    let (history, ends) = dispatcher_chat(120, 7);
    check_targets("dispatcher", &requests(&history, &ends), 30_000);
}

#[test]
fn stable_mode_bills_a_coding_agent_below_uncompacted_and_exact() {
    // The bench's agent at a quarter of its size and 120 of its turns: it
    // outgrows its budget after about 40 of them, as the bench's does.
    let (history, ends) = coding_agent(120, 11, 25);
    check_targets("agent", &requests(&history, &ends), 70_000);
}

#[test]
fn checkpoints_and_their_eviction_never_change_the_bytes() {
    let (history, ends) = coding_agent(60, 3, 25);
    let requests = requests(&history, &ends);
    let p = policy(20_000, Mode::Stable);
    let cold = bill_cold(&requests, Some(&p));
    let warm_store = CheckpointStore::new(16 << 20);
    let warm = bill(&requests, Some(&p), &warm_store);
    // A store so small it keeps almost nothing: constant eviction.
    let tiny = CheckpointStore::new(200);
    let evicted = bill(&requests, Some(&p), &tiny);
    for (turn, ((c, w), e)) in cold
        .forwarded
        .iter()
        .zip(&warm.forwarded)
        .zip(&evicted.forwarded)
        .enumerate()
    {
        assert!(c == w, "turn {turn}: warm replay forwarded other bytes");
        assert!(
            c == e,
            "turn {turn}: an evicted store forwarded other bytes"
        );
    }
}

#[test]
fn every_forwarded_turn_keeps_tool_groups_whole_and_meets_the_budget() {
    let (history, ends) = coding_agent(60, 5, 25);
    let requests = requests(&history, &ends);
    let budget = 20_000;
    let stable = bill_cold(&requests, Some(&policy(budget, Mode::Stable)));
    for (turn, body) in stable.forwarded.iter().enumerate() {
        let v: Value = serde_json::from_slice(body).unwrap();
        let messages = v["messages"].as_array().unwrap();
        assert_eq!(
            messages[0]["role"], "system",
            "turn {turn}: the system prompt is kept"
        );
        assert!(
            messages[1]["content"]
                .as_str()
                .unwrap()
                .starts_with("Task:"),
            "turn {turn}: the task is pinned"
        );
        let mut open: Vec<String> = Vec::new();
        for m in messages {
            if let Some(calls) = m["tool_calls"].as_array() {
                assert!(open.is_empty(), "turn {turn}: a call left unanswered");
                open = calls
                    .iter()
                    .map(|c| c["id"].as_str().unwrap().to_owned())
                    .collect();
            } else if m["role"] == "tool" {
                let id = m["tool_call_id"].as_str().unwrap();
                let at = open.iter().position(|c| c == id);
                assert!(
                    at.is_some(),
                    "turn {turn}: result {id} answers no kept call"
                );
                open.remove(at.unwrap());
            } else {
                assert!(open.is_empty(), "turn {turn}: a call left unanswered");
            }
        }
        let chars = compaction_proxy::format::chat::ChatBody::parse(body)
            .unwrap()
            .total_chars();
        assert!(chars <= budget, "turn {turn}: {chars} chars over {budget}");
    }
}

#[test]
fn an_edited_earlier_message_falls_back_to_a_correct_compaction() {
    let (mut history, ends) = dispatcher_chat(80, 9);
    let p = policy(20_000, Mode::Stable);
    let store = CheckpointStore::new(16 << 20);
    let warm = bill(&requests(&history, &ends), Some(&p), &store);
    assert!(warm.outgrown_turns > 0);
    // The client rewrites an early user message (and the store still holds
    // checkpoints of the old history).
    history[3]["content"] = Value::from("EDITED: the depot moved to Norrby.");
    let last = requests(&history, &ends[ends.len() - 1..]);
    let edited_warm = bill(&last, Some(&p), &store);
    let edited_cold = bill_cold(&last, Some(&p));
    assert!(edited_warm.forwarded[0] == edited_cold.forwarded[0]);
    let chars = compaction_proxy::format::chat::ChatBody::parse(&edited_warm.forwarded[0])
        .unwrap()
        .total_chars();
    assert!(chars <= 20_000);
}

/// Two proxy instances behind a load balancer, alternating turn by turn,
/// forward exactly the bytes one instance alone forwards; so does a proxy
/// restarted between turns (a fresh instance with empty caches).
#[tokio::test]
async fn alternating_replicas_forward_the_bytes_of_one_instance() {
    let config = "[policies.default]\nbudget_chars = 20000\nmode = \"stable\"\nkeep_roles = [\"system\", \"developer\"]\npin_first_user = true\nmax_message_chars = 4000";
    let (history, ends) = dispatcher_chat(50, 21);
    let requests = requests(&history, &ends);

    async fn forwarded(
        config: &str,
        requests: &[Vec<u8>],
        n_proxies: usize,
    ) -> (Vec<Bytes>, Vec<(Option<String>, Option<String>)>) {
        let mock = MockUpstream::start(Behavior::Json(200, serde_json::json!({"ok": true}))).await;
        let mut proxies = Vec::new();
        for _ in 0..n_proxies {
            proxies.push(TestProxy::start(config, &mock.url()).await);
        }
        let mut headers = Vec::new();
        for (turn, body) in requests.iter().enumerate() {
            let proxy = &proxies[turn % n_proxies];
            let answer = send(post_json(
                &proxy.url("/v1/chat/completions"),
                Bytes::from(body.clone()),
            ))
            .await;
            assert_eq!(answer.status, 200);
            headers.push((
                answer
                    .header("x-compaction-stable-messages")
                    .map(str::to_owned),
                answer.header("x-compaction-rebased").map(str::to_owned),
            ));
        }
        let bodies = mock.received().into_iter().map(|r| r.body).collect();
        (bodies, headers)
    }
    let (one, one_headers) = forwarded(config, &requests, 1).await;
    let (two, two_headers) = forwarded(config, &requests, 2).await;
    let (fresh, _) = forwarded(config, &requests, requests.len()).await; // a new instance every turn
    assert_eq!(one.len(), requests.len());
    assert!(one == two, "alternating replicas forwarded other bytes");
    assert!(one == fresh, "restarted instances forwarded other bytes");
    assert_eq!(one_headers, two_headers);
    assert!(
        one_headers
            .iter()
            .any(|(_, r)| r.as_deref() == Some("true")),
        "the conversation outgrew its budget: some turn rebased"
    );
}

mod properties {
    use super::*;
    use compaction_proxy::compaction::stable::NoCheckpoints;
    use compaction_proxy::format::Format;
    use compaction_proxy::proxy::compact::outcome_of;
    use proptest::prelude::*;

    fn messages(body: &[u8]) -> Vec<Value> {
        let v: Value = serde_json::from_slice(body).unwrap();
        v["messages"].as_array().unwrap().clone()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        /// Turn by turn: a turn that did not rebase extends the previous
        /// turn's forwarded messages; warm and cold replays agree; the
        /// budget is met (the budget's floor holds the pinned system prompt
        /// and task and the kept tail of these generators).
        #[test]
        fn turns_extend_until_a_rebase(
            seed in 0u64..1_000,
            turns in 5usize..30,
            agent in any::<bool>(),
            budget in 12_000usize..30_000,
            target in 0.5f64..0.9,
        ) {
            let (history, ends) = if agent {
                coding_agent(turns, seed, 10)
            } else {
                dispatcher_chat(turns, seed)
            };
            let requests = requests(&history, &ends);
            let mut p = policy(budget, Mode::Stable);
            p.stable_target_ratio = target;
            p.stable_head_ratio = target / 2.0;
            let store = CheckpointStore::new(1 << 20);
            let mut previous: Option<Vec<Value>> = None;
            for (turn, request) in requests.iter().enumerate() {
                let warm = outcome_of(request, &p, Format::Chat, usize::MAX, &store).unwrap();
                let cold = outcome_of(request, &p, Format::Chat, usize::MAX, &NoCheckpoints).unwrap();
                prop_assert_eq!(&warm.rewritten, &cold.rewritten, "turn {}", turn);
                let forwarded = warm.rewritten.as_deref().unwrap_or(request);
                let now = messages(forwarded);
                let info = warm.stable.expect("stable mode reports");
                if let Some(before) = &previous {
                    if !info.rebased {
                        prop_assert!(now.len() >= before.len(), "turn {}", turn);
                        prop_assert_eq!(&now[..before.len()], &before[..], "turn {} did not rebase but changed the prefix", turn);
                        prop_assert_eq!(info.stable_messages, before.len());
                    }
                }
                prop_assert!(warm.loss.budget_met, "turn {}: {:?}", turn, warm.loss);
                previous = Some(now);
            }
        }
    }
}

/// Stable turns through the proxy count their checkpoint hits and misses
/// and their rebases in `/metrics`.
#[tokio::test]
async fn stable_turns_are_counted_in_metrics() {
    let config = "[policies.default]\nbudget_chars = 8000\nmode = \"stable\"";
    let (history, ends) = dispatcher_chat(30, 4);
    let mock = MockUpstream::start(Behavior::Json(200, serde_json::json!({"ok": true}))).await;
    let proxy = TestProxy::start(config, &mock.url()).await;
    let mut rebased = 0;
    for body in requests(&history, &ends) {
        let answer = send(post_json(
            &proxy.url("/v1/chat/completions"),
            Bytes::from(body),
        ))
        .await;
        rebased += usize::from(answer.header("x-compaction-rebased") == Some("true"));
    }
    assert!(rebased > 0, "the chat outgrew its budget");
    let metrics = proxy.state.metrics.render();
    let value = |prefix: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(prefix))
            .and_then(|l| l.rsplit(' ').next())
            .map_or(0.0, |v| v.parse().unwrap())
    };
    assert_eq!(
        value("compaction_proxy_stable_rebases_total{"),
        rebased as f64,
        "{metrics}"
    );
    // Every replayed turn after the first found the previous turn's state.
    assert!(
        value("compaction_proxy_checkpoint_hits_total{") >= 1.0,
        "{metrics}"
    );
    assert_eq!(
        value("compaction_proxy_checkpoint_misses_total{"),
        1.0,
        "{metrics}"
    );
}

/// Stable mode under `toml`'s token budget: every forwarded turn within
/// `budget_tokens` (by the o200k tokenizer gpt-4o uses), most turns
/// extending the previous one, and the token headers' figures.
fn check_token_budget(toml: &str, budget_tokens: usize) {
    let runtime = runtime(toml, "http://127.0.0.1:9");
    let policy = runtime.policy("default").unwrap();
    let (history, ends) = coding_agent(80, 11, 25);
    let requests = requests(&history, &ends);
    let store = CheckpointStore::new(16 << 20);
    let stable = bill(&requests, Some(&policy), &store);
    let encoding = compaction_proxy::compaction::tokens::Encoding::O200kBase;
    let mut outgrown = 0;
    for (turn, (request, body)) in requests.iter().zip(&stable.forwarded).enumerate() {
        let sent = Format::Chat.parse(request, usize::MAX).unwrap();
        let forwarded = Format::Chat.parse(body, usize::MAX).unwrap();
        let tokens = encoding.conversation(&forwarded.conversation);
        assert!(
            tokens <= budget_tokens,
            "turn {turn}: {tokens} tokens over {budget_tokens}"
        );
        outgrown += usize::from(encoding.conversation(&sent.conversation) > budget_tokens);
    }
    assert!(
        outgrown > 20,
        "the history outgrew the budget on {outgrown} turns only"
    );
    assert!(
        stable.extending_share() >= 0.8,
        "{:.2} of turns extend the previous one",
        stable.extending_share()
    );
}

#[test]
fn stable_mode_keeps_every_turn_within_a_token_budget() {
    check_token_budget(
        "[policies.default]\nmode = \"stable\"\nbudget_chars = 10000000\nbudget_tokens = 6000",
        6000,
    );
}

#[test]
fn stable_mode_keeps_every_turn_within_an_auto_budget() {
    // The window less the requested output (none) less the reserve.
    check_token_budget(
        "[policies.default]\nmode = \"stable\"\nbudget = \"auto\"\nreserve_tokens = 2000\ncontext_windows = { \"gpt-4o\" = 9000 }",
        7000,
    );
}

#[tokio::test]
async fn stable_mode_reports_tokens_in_its_headers() {
    let upstream = MockUpstream::start(Behavior::OpenAiChat).await;
    let proxy = TestProxy::start(
        "[policies.default]\nmode = \"stable\"\nbudget_tokens = 3000",
        &upstream.url(),
    )
    .await;
    let (history, ends) = coding_agent(40, 3, 25);
    let body = requests(&history, &ends).pop().unwrap();
    let answer = send(post_json(&proxy.url("/v1/chat/completions"), body)).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(answer.header("x-compaction-budget-tokens"), Some("3000"));
    let out: usize = answer
        .header("x-compaction-output-tokens")
        .unwrap()
        .parse()
        .unwrap();
    let input: usize = answer
        .header("x-compaction-input-tokens")
        .unwrap()
        .parse()
        .unwrap();
    assert!(out <= 3000 && input > out, "{input} -> {out}");
    assert_eq!(answer.header("x-compaction-budget-met"), Some("true"));
}
