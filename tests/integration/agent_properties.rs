//! Property tests of the agent passes (tool dedupe, tool-result pruning,
//! argument clipping) through the whole exact-mode pipeline on chat bodies:
//! random agent conversations with parallel tool calls, missing and error
//! results, array and multimodal content and the `developer` role go
//! through `compaction::compact` and the splice, and the forwarded body must
//! pass a checker of OpenAI's rules:
//! - every `tool_calls` id answered in the request is answered in the
//!   forwarded body, and no tool message answers a call that was not kept;
//! - every forwarded `arguments` parses as JSON;
//! - excluded tools' calls and results, and protected messages (kept roles,
//!   the first user message, the latest message), are byte-identical;
//! - everything outside `messages` is byte-identical;
//! - the reported output chars are the forwarded body's, and the budget is
//!   met whenever the protected part fits it.
//!
//! `PROPTEST_CASES=10000` runs the 10,000 conversations.

use std::collections::{HashMap, HashSet};

use compaction_proxy::compaction::agent::AgentPolicy;
use compaction_proxy::compaction::{self, stable::NoCheckpoints};
use compaction_proxy::engine::{Policy, Role};
use compaction_proxy::format::Format;
use compaction_proxy::policy::CompiledPolicy;
use proptest::prelude::*;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

const TOOLS: [&str; 5] = [
    "read_file",
    "grep",
    "run_tests",
    "write_file",
    "secret_tool",
];
const EXCLUDED: &str = "secret_tool";

fn config() -> ProptestConfig {
    // Big bodies: 64 by default keeps the suite quick; PROPTEST_CASES wins.
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// Deterministic filler text of `words` words drawn from `seed`.
fn filler(seed: u64, words: usize) -> String {
    const WORDS: [&str; 12] = [
        "retry",
        "payment",
        "fn",
        "let",
        "error",
        "test",
        "ok",
        "src",
        "mod",
        "é",
        "ünïcode",
        "🦀",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..words)
        .map(|k| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            format!(
                "{}{}",
                WORDS[(x % 12) as usize],
                (x >> 8) % 1000 + k as u64 % 3
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[derive(Debug, Clone)]
struct CallSpec {
    tool: usize,
    arg_words: usize,
    /// None: the result is missing.
    result: Option<ResultSpec>,
}

#[derive(Debug, Clone)]
struct ResultSpec {
    words: usize,
    error: bool,
    as_parts: bool,
    /// Repeat the output of an earlier result of the same tool, if any.
    repeat: bool,
}

#[derive(Debug, Clone)]
enum Turn {
    User { words: usize, image: bool },
    Assistant { words: usize },
    Developer { words: usize },
    Tools(Vec<CallSpec>),
}

fn result_spec() -> impl Strategy<Value = Option<ResultSpec>> {
    prop_oneof![
        1 => Just(None),
        9 => (0usize..900, any::<bool>(), any::<bool>(), prop::bool::weighted(0.2))
            .prop_map(|(words, error, as_parts, repeat)| Some(ResultSpec { words, error, as_parts, repeat })),
    ]
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        2 => (1usize..60, prop::bool::weighted(0.2)).prop_map(|(words, image)| Turn::User { words, image }),
        2 => (1usize..80).prop_map(|words| Turn::Assistant { words }),
        1 => (1usize..20).prop_map(|words| Turn::Developer { words }),
        5 => prop::collection::vec(
            (0usize..TOOLS.len(), 0usize..500, result_spec())
                .prop_map(|(tool, arg_words, result)| CallSpec { tool, arg_words, result }),
            1..5,
        ).prop_map(Turn::Tools),
    ]
}

#[derive(Debug)]
struct Knobs {
    budget_permille: usize,
    keep_last_n: usize,
    pin_first_user: bool,
    agent: AgentPolicy,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        (50usize..1_000, 1usize..5, any::<bool>()),
        (0usize..600, 0usize..8_000, 0.0f64..=1.0, 0usize..10_000),
        (0usize..400, prop_oneof![Just(0.0), 0.5f64..=1.0], 0usize..3),
    )
        .prop_map(
            |(
                (budget_permille, keep_last_n, pin_first_user),
                (max_result, protect, share, minimum),
                (max_arg, dup, tools),
            )| {
                let size = |n: usize| if n < 16 { 0 } else { n };
                Knobs {
                    budget_permille,
                    keep_last_n,
                    pin_first_user,
                    agent: AgentPolicy {
                        max_tool_result_chars: size(max_result),
                        protect_tool_chars: protect,
                        protect_tool_share: share,
                        prune_minimum_chars: minimum,
                        max_arg_chars: size(max_arg),
                        tool_duplicate_threshold: dup,
                        excluded_tools: if tools == 2 {
                            Vec::new()
                        } else {
                            vec![EXCLUDED.into()]
                        },
                        eligible_tools: if tools == 1 {
                            vec!["read_file".into(), "grep".into()]
                        } else {
                            Vec::new()
                        },
                        trigger_chars: 0,
                        trigger_messages: 0,
                        trigger_tokens: 0,
                    },
                }
            },
        )
}

/// The body's messages as JSON values.
fn build(turns: &[Turn]) -> Vec<Value> {
    let mut messages = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": format!("Task: {}", filler(1, 12))}),
    ];
    let mut outputs: HashMap<usize, Vec<String>> = HashMap::new();
    let mut seed = 10u64;
    let mut call_no = 0;
    for turn in turns {
        seed += 1;
        match turn {
            Turn::User { words, image } => {
                let text = filler(seed, *words);
                messages.push(if *image {
                    json!({"role": "user", "content": [
                        {"type": "text", "text": text},
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
                    ]})
                } else {
                    json!({"role": "user", "content": text})
                });
            }
            Turn::Assistant { words } => {
                messages.push(json!({"role": "assistant", "content": filler(seed, *words)}))
            }
            Turn::Developer { words } => {
                messages.push(json!({"role": "developer", "content": filler(seed, *words)}))
            }
            Turn::Tools(calls) => {
                let mut tool_calls = Vec::new();
                let mut results = Vec::new();
                for (k, c) in calls.iter().enumerate() {
                    call_no += 1;
                    let id = format!("call_{call_no}");
                    let name = TOOLS[c.tool];
                    let args = json!({"path": format!("src/f{k}.rs"), "content": filler(seed + k as u64, c.arg_words), "n": 1.5});
                    tool_calls.push(json!({"id": id, "type": "function",
                        "function": {"name": name, "arguments": args.to_string()}}));
                    let Some(r) = &c.result else { continue };
                    let earlier = outputs.entry(c.tool).or_default();
                    let mut text = match earlier.last() {
                        Some(prev) if r.repeat => prev.clone(),
                        _ => filler(seed * 31 + k as u64, r.words),
                    };
                    if r.error {
                        text = format!("Error: {text}");
                    }
                    earlier.push(text.clone());
                    let content = if r.as_parts {
                        let (a, b) = text.split_at(
                            text.char_indices()
                                .nth(text.chars().count() / 2)
                                .map_or(0, |(i, _)| i),
                        );
                        json!([{"type": "text", "text": a}, {"type": "text", "text": b}])
                    } else {
                        json!(text)
                    };
                    results.push(json!({"role": "tool", "tool_call_id": id, "content": content}));
                }
                messages
                    .push(json!({"role": "assistant", "content": null, "tool_calls": tool_calls}));
                messages.extend(results);
            }
        }
    }
    messages.push(json!({"role": "user", "content": format!("Now {}", filler(seed + 99, 5))}));
    messages
}

fn body_text(messages: &[Value]) -> String {
    // Fields on both sides of messages, in odd spellings.
    format!(
        "{{\"model\":\"gpt-4o\",  \"temperature\": 1.50,\n\"messages\": {},\"tools\":[{{\"type\":\"function\",\"function\":{{\"name\":\"grep\"}}}}], \"z\": 1e3}}",
        serde_json::to_string(messages).unwrap()
    )
}

#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow)]
    messages: &'a RawValue,
}

/// Bytes before and after the messages array.
fn outside(body: &str) -> (String, String) {
    let top: Top = serde_json::from_str(body).expect("a body with messages");
    let raw = top.messages.get();
    let start = raw.as_ptr() as usize - body.as_ptr() as usize;
    (
        body[..start].to_owned(),
        body[start + raw.len()..].to_owned(),
    )
}

fn call_ids(message: &Value) -> Vec<(String, String, String)> {
    message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    (
                        c["id"].as_str().unwrap_or_default().to_owned(),
                        c["function"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                        c["function"]["arguments"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn check(turns: &[Turn], knobs: &Knobs) -> Result<(), TestCaseError> {
    let input_messages = build(turns);
    let body = body_text(&input_messages);
    let parsed = Format::Chat
        .parse(body.as_bytes(), usize::MAX)
        .map_err(|e| TestCaseError::fail(format!("parse: {e}")))?;
    let total = parsed.total_chars();
    let mut engine = Policy::with_budget((total * knobs.budget_permille / 1000).max(1));
    engine.keep_last_n = knobs.keep_last_n;
    engine.keep_roles = vec![Role::System, Role::Developer];
    let mut policy = CompiledPolicy::plain("agent-properties", engine);
    policy.pin_first_user = knobs.pin_first_user;
    policy.agent = knobs.agent.clone();
    let budget = policy.engine.budget_chars;

    let compacted = compaction::compact(&parsed, &policy, &NoCheckpoints);
    let out = match &compacted.plan {
        Some(plan) => parsed.splice(plan),
        None => body.clone(),
    };
    let value: Value = serde_json::from_str(&out)
        .map_err(|e| TestCaseError::fail(format!("forwarded body is not JSON: {e}")))?;
    prop_assert_eq!(outside(&out), outside(&body), "bytes outside messages");
    let output_messages = value["messages"].as_array().expect("messages").clone();

    // Pairing rules.
    let answered_in: HashSet<&str> = input_messages
        .iter()
        .filter_map(|m| m["tool_call_id"].as_str())
        .collect();
    let kept_calls: HashSet<String> = output_messages
        .iter()
        .flat_map(call_ids)
        .map(|(id, _, _)| id)
        .collect();
    let answered_out: HashSet<&str> = output_messages
        .iter()
        .filter_map(|m| m["tool_call_id"].as_str())
        .collect();
    for id in &kept_calls {
        prop_assert_eq!(
            answered_out.contains(id.as_str()),
            answered_in.contains(id.as_str()),
            "call {} answered in the request must be answered when forwarded",
            id
        );
    }
    for id in &answered_out {
        prop_assert!(
            kept_calls.contains(*id),
            "tool message answers dropped call {}",
            id
        );
    }

    // Arguments parse; excluded tools keep their bytes.
    let input_args: HashMap<String, (String, String)> = input_messages
        .iter()
        .flat_map(call_ids)
        .map(|(id, name, args)| (id, (name, args)))
        .collect();
    let input_results: HashMap<&str, &Value> = input_messages
        .iter()
        .filter_map(|m| Some((m["tool_call_id"].as_str()?, m)))
        .collect();
    for (id, name, args) in output_messages.iter().flat_map(call_ids) {
        prop_assert!(
            serde_json::from_str::<Value>(&args).is_ok(),
            "arguments of {} are not JSON: {}",
            id,
            args
        );
        let (_, original) = &input_args[&id];
        if knobs.agent.excluded_tools.contains(&name) {
            prop_assert_eq!(&args, original, "excluded tool's arguments changed");
        }
        if &args != original {
            // Only string values changed, each to a clipped prefix.
            let (a, b): (Value, Value) = (
                serde_json::from_str(&args).unwrap(),
                serde_json::from_str(original).unwrap(),
            );
            prop_assert_eq!(&a["path"], &b["path"]);
            prop_assert_eq!(&a["n"], &b["n"]);
            prop_assert!(a["content"].as_str().unwrap().contains("chars omitted"));
        }
    }
    for m in &output_messages {
        let Some(id) = m["tool_call_id"].as_str() else {
            continue;
        };
        let (name, _) = &input_args[id];
        if knobs.agent.excluded_tools.contains(name) {
            prop_assert_eq!(m, input_results[id], "excluded tool's result changed");
        }
    }

    // Protected messages: kept roles, the first user message when pinned,
    // the latest message.
    let first_user = input_messages.iter().position(|m| m["role"] == "user");
    let last = input_messages.len() - 1;
    for (i, m) in input_messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap();
        let protected = role == "system"
            || role == "developer"
            || i == last
            || (knobs.pin_first_user && Some(i) == first_user);
        if protected {
            prop_assert!(
                output_messages.contains(m),
                "protected message {} changed or dropped",
                i
            );
        }
    }

    // Accounting: the report's output is the forwarded body's size.
    let reparsed = Format::Chat.parse(out.as_bytes(), usize::MAX).unwrap();
    let loss = &compacted.loss;
    prop_assert_eq!(
        loss.output_chars,
        reparsed.total_chars(),
        "reported output chars"
    );
    prop_assert_eq!(loss.output_messages, output_messages.len());
    prop_assert!(
        loss.input_chars - loss.output_chars
            >= loss.pruned_chars + loss.clipped_chars + loss.deduped_tool_chars
    );
    // With only the latest message kept by recency, everything but the
    // protected part can go: the budget is met whenever that part fits.
    if knobs.keep_last_n == 1 {
        let protected_chars: usize = parsed
            .conversation
            .items
            .iter()
            .enumerate()
            .filter(|(i, item)| {
                matches!(item.role, Role::System | Role::Developer)
                    || *i == last
                    || (knobs.pin_first_user && Some(*i) == first_user)
            })
            .map(|(_, item)| item.chars())
            .sum();
        if protected_chars <= budget {
            prop_assert!(
                loss.budget_met,
                "{} of {} protected, not met",
                protected_chars,
                budget
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn forwarded_agent_conversations_keep_openai_rules(
        turns in prop::collection::vec(turn(), 0..40),
        knobs in knobs(),
    ) {
        check(&turns, &knobs)?;
    }
}

/// The passes do run in these conversations (the properties are not
/// vacuous): a fixed long conversation at a tight budget prunes, clips and
/// dedupes.
#[test]
fn the_passes_run_on_a_long_agent_conversation() {
    let mut turns = Vec::new();
    for k in 0..30 {
        turns.push(Turn::Tools(vec![CallSpec {
            tool: k % 2,
            arg_words: 400,
            result: Some(ResultSpec {
                words: 800,
                error: false,
                as_parts: k % 3 == 0,
                repeat: k % 5 == 4,
            }),
        }]));
        turns.push(Turn::Assistant { words: 10 });
    }
    let body = body_text(&build(&turns));
    let parsed = Format::Chat.parse(body.as_bytes(), usize::MAX).unwrap();
    let total = parsed.total_chars();
    let mut engine = Policy::with_budget(total / 3);
    engine.keep_last_n = 3;
    let mut policy = CompiledPolicy::plain("agent", engine);
    policy.agent = AgentPolicy {
        prune_minimum_chars: 0,
        ..AgentPolicy::DEFAULT
    };
    policy.agent.max_tool_result_chars = 500;
    policy.agent.max_arg_chars = 200;
    let compacted = compaction::compact(&parsed, &policy, &NoCheckpoints);
    let loss = compacted.loss;
    assert!(loss.deduped_tool_chars > 0, "{loss:?}");
    assert!(loss.pruned_chars > 0, "{loss:?}");
    assert!(loss.budget_met, "{loss:?}");
    assert_eq!(loss.dropped_messages, 0, "pruning alone fits: {loss:?}");
    // A tighter budget needs clipping too.
    policy.engine.budget_chars = total / 8;
    let loss = compaction::compact(&parsed, &policy, &NoCheckpoints).loss;
    assert!(loss.clipped_chars > 0, "{loss:?}");
}

/// Checkpoints in a map: the accelerator stable mode may use.
#[derive(Default)]
struct MapCheckpoints(
    std::sync::Mutex<HashMap<u128, std::sync::Arc<compaction::stable::ReplayState>>>,
);

impl compaction::stable::Checkpoints for MapCheckpoints {
    fn get(&self, key: u128) -> Option<std::sync::Arc<compaction::stable::ReplayState>> {
        self.0.lock().unwrap().get(&key).cloned()
    }
    fn put(&self, key: u128, state: std::sync::Arc<compaction::stable::ReplayState>) {
        self.0.lock().unwrap().insert(key, state);
    }
}

/// The messages forwarded for `messages` in stable mode.
fn stable_turn(
    messages: &[Value],
    policy: &CompiledPolicy,
    checkpoints: &dyn compaction::stable::Checkpoints,
) -> (Vec<Value>, compaction::Compacted) {
    let body = body_text(messages);
    let parsed = Format::Chat.parse(body.as_bytes(), usize::MAX).unwrap();
    let compacted = compaction::compact(&parsed, policy, checkpoints);
    let out = match &compacted.plan {
        Some(plan) => parsed.splice(plan),
        None => body.clone(),
    };
    let value: Value = serde_json::from_str(&out).expect("forwarded body is JSON");
    (value["messages"].as_array().unwrap().clone(), compacted)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 8, ..config() })]

    /// Stable mode with the agent passes, turn by turn (each request ends
    /// where the next assistant message starts): a turn that does not
    /// re-compact forwards the previous turn's messages as a prefix, every
    /// forwarded call is answered and its arguments parse, and checkpoints
    /// change nothing.
    #[test]
    fn stable_turns_with_agent_passes_extend_the_previous_form(
        turns in prop::collection::vec(turn(), 10..30),
        budget_permille in 100usize..600,
    ) {
        let messages = build(&turns);
        let whole = Format::Chat
            .parse(body_text(&messages).as_bytes(), usize::MAX)
            .unwrap()
            .total_chars();
        let mut engine = Policy::with_budget(whole * budget_permille / 1000);
        engine.keep_last_n = 2;
        let mut policy = CompiledPolicy::plain("stable-agent", engine);
        policy.mode = compaction_proxy::config::Mode::Stable;
        policy.agent = AgentPolicy {
            max_tool_result_chars: 200,
            max_arg_chars: 100,
            prune_minimum_chars: 0,
            protect_tool_chars: 2_000,
            excluded_tools: vec![EXCLUDED.into()],
            ..AgentPolicy::DEFAULT
        };
        let cuts: Vec<usize> = (1..messages.len())
            .filter(|&i| messages[i]["role"] == "assistant")
            .chain([messages.len()])
            .collect();
        let warm = MapCheckpoints::default();
        let mut previous: Option<Vec<Value>> = None;
        for &cut in &cuts {
            let (forwarded, compacted) = stable_turn(&messages[..cut], &policy, &warm);
            let (cold, _) = stable_turn(&messages[..cut], &policy, &NoCheckpoints);
            prop_assert_eq!(&forwarded, &cold, "checkpoints changed the result at {}", cut);
            let info = compacted.stable.expect("stable mode reports");
            if let Some(before) = &previous {
                if !info.rebased {
                    prop_assert!(
                        forwarded.len() >= before.len() && forwarded[..before.len()] == before[..],
                        "turn ending at {} did not extend the previous form", cut
                    );
                }
            }
            let answered: HashSet<&str> = messages[..cut]
                .iter()
                .filter_map(|m| m["tool_call_id"].as_str())
                .collect();
            let kept_calls: HashSet<String> =
                forwarded.iter().flat_map(call_ids).map(|(id, _, _)| id).collect();
            for (id, _, args) in forwarded.iter().flat_map(call_ids) {
                prop_assert!(serde_json::from_str::<Value>(&args).is_ok());
                if answered.contains(id.as_str()) {
                    prop_assert!(forwarded.iter().any(|m| m["tool_call_id"] == id.as_str()));
                }
            }
            for m in &forwarded {
                if let Some(id) = m["tool_call_id"].as_str() {
                    prop_assert!(kept_calls.contains(id), "orphan result {}", id);
                }
            }
            previous = Some(forwarded);
        }
    }
}

#[test]
fn stable_mode_runs_the_passes_when_it_re_compacts() {
    let mut turns = Vec::new();
    for k in 0..30 {
        turns.push(Turn::Tools(vec![CallSpec {
            tool: k % 2,
            arg_words: 300,
            result: Some(ResultSpec {
                words: 600,
                error: false,
                as_parts: false,
                repeat: false,
            }),
        }]));
    }
    let messages = build(&turns);
    let whole = Format::Chat
        .parse(body_text(&messages).as_bytes(), usize::MAX)
        .unwrap()
        .total_chars();
    let mut engine = Policy::with_budget(whole / 3);
    engine.keep_last_n = 2;
    let mut policy = CompiledPolicy::plain("stable-agent", engine);
    policy.mode = compaction_proxy::config::Mode::Stable;
    policy.agent = AgentPolicy {
        max_tool_result_chars: 200,
        prune_minimum_chars: 0,
        ..AgentPolicy::DEFAULT
    };
    let (_, compacted) = stable_turn(&messages, &policy, &NoCheckpoints);
    let loss = compacted.loss;
    assert!(compacted.stable.unwrap().recompactions > 0);
    assert!(loss.pruned_chars > 0 && loss.clipped_chars > 0, "{loss:?}");
    assert!(loss.budget_met, "{loss:?}");
}

/// The passes on the other formats: Anthropic's inline `input` objects and
/// `tool_result` blocks, Responses' `function_call` / `function_call_output`.
#[test]
fn the_passes_splice_into_anthropic_and_responses_bodies() {
    let output = filler(7, 400);
    let content = filler(8, 300);
    let policy = |total: usize| {
        let mut engine = Policy::with_budget(total / 3);
        engine.keep_last_n = 1;
        let mut p = CompiledPolicy::plain("formats", engine);
        p.agent = AgentPolicy {
            max_tool_result_chars: 100,
            max_arg_chars: 50,
            protect_tool_chars: 0,
            prune_minimum_chars: 0,
            ..AgentPolicy::DEFAULT
        };
        p
    };
    let anthropic = json!({"model": "claude", "system": "be brief", "messages": [
        {"role": "user", "content": "Task: write the file."},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Writing."},
            {"type": "tool_use", "id": "tu_1", "name": "write_file", "input": {"path": "a.rs", "content": content}}
        ]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "tu_1", "content": [{"type": "text", "text": output}]}
        ]},
        {"role": "user", "content": "Now test it."}
    ]});
    let responses = json!({"model": "gpt-5", "input": [
        {"role": "user", "content": "Task: write the file."},
        {"type": "function_call", "call_id": "fc_1", "name": "write_file",
         "arguments": json!({"path": "a.rs", "content": content}).to_string()},
        {"type": "function_call_output", "call_id": "fc_1", "output": output},
        {"role": "user", "content": "Now test it."}
    ]});
    for (format, body, array) in [
        (Format::Anthropic, anthropic, "messages"),
        (Format::Responses, responses, "input"),
    ] {
        let text = body.to_string();
        let parsed = format.parse(text.as_bytes(), usize::MAX).unwrap();
        let p = policy(parsed.total_chars());
        let compacted = compaction::compact(&parsed, &p, &NoCheckpoints);
        let loss = compacted.loss;
        assert!(
            loss.pruned_chars > 0 && loss.clipped_chars > 0,
            "{format}: {loss:?}"
        );
        assert_eq!(loss.dropped_messages, 0, "{format}: {loss:?}");
        let out: Value = serde_json::from_str(&parsed.splice(&compacted.plan.unwrap())).unwrap();
        let items = out[array].as_array().unwrap();
        assert_eq!(items.len(), 4, "{format}");
        let (args, result) = match format {
            Format::Anthropic => (
                items[1]["content"][1]["input"].clone(),
                items[2]["content"][0]["content"][0]["text"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
            ),
            _ => (
                serde_json::from_str(items[1]["arguments"].as_str().unwrap()).unwrap(),
                items[2]["output"].as_str().unwrap().to_owned(),
            ),
        };
        assert_eq!(args["path"], "a.rs", "{format}");
        assert!(
            args["content"].as_str().unwrap().contains("chars omitted"),
            "{format}"
        );
        assert!(
            result.contains("chars omitted") && result.len() < output.len(),
            "{format}"
        );
        assert_eq!(
            loss.output_chars,
            format
                .parse(serde_json::to_string(&out).unwrap().as_bytes(), usize::MAX)
                .unwrap()
                .total_chars(),
            "{format}"
        );
    }
}
