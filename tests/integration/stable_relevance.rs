//! Stable mode with `scoring = "relevance"`: relevance decides what a
//! re-compaction of the stable form keeps, and nothing else. A turn that
//! only appends forwards the previous turn's form byte for byte, even when
//! its question makes other old messages relevant; a turn whose question
//! tips the form over its budget re-compacts it around that question.

use compaction_proxy::cache::CheckpointStore;
use compaction_proxy::config::Mode;
use compaction_proxy::engine::{Policy, RelevancePolicy, ScoringMethod};
use compaction_proxy::format::Format;
use compaction_proxy::outcome::Outcome;
use compaction_proxy::policy::CompiledPolicy;
use compaction_proxy::proxy::compact::outcome_of;
use serde_json::{json, Value};

const BUDGET: usize = 2_000;

fn policy(scoring: ScoringMethod) -> CompiledPolicy {
    let mut engine = Policy::with_budget(BUDGET);
    engine.scoring = scoring;
    let mut p = CompiledPolicy::plain("stable", engine);
    p.mode = Mode::Stable;
    p
}

fn relevance() -> CompiledPolicy {
    policy(ScoringMethod::Relevance(RelevancePolicy::default()))
}

fn note(i: usize) -> String {
    format!(
        "Note for depot D{i}: its gate code is {}-KAPPA and deliveries go to dock {}.",
        1000 + i * 37,
        i % 4
    )
}

/// A system prompt, then `notes` notes each acknowledged: a history that
/// outgrows the budget, so its replay re-compacts.
fn history(notes: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You keep depot notes."})];
    for i in 0..notes {
        messages.push(json!({"role": "user", "content": note(i)}));
        messages.push(json!({"role": "assistant", "content": format!("Noted depot D{i}.")}));
    }
    messages
}

fn ask(messages: &mut Vec<Value>, question: String) {
    messages.push(json!({"role": "user", "content": question}));
}

fn answer(messages: &mut Vec<Value>, text: String) {
    messages.push(json!({"role": "assistant", "content": text}));
}

fn run(messages: &[Value], policy: &CompiledPolicy, store: &CheckpointStore) -> Outcome {
    let body = json!({"model": "m", "messages": messages}).to_string();
    outcome_of(body.as_bytes(), policy, Format::Chat, usize::MAX, store).expect("compactable")
}

fn forwarded(outcome: &Outcome) -> Vec<Value> {
    let body: Value =
        serde_json::from_slice(outcome.rewritten.as_ref().expect("compacted")).unwrap();
    body["messages"].as_array().unwrap().clone()
}

fn holds(messages: &[Value], text: &str) -> bool {
    messages.iter().any(|m| m["content"] == text)
}

fn chars(messages: &[Value]) -> usize {
    messages
        .iter()
        .map(|m| m["content"].as_str().unwrap().chars().count())
        .sum()
}

#[test]
fn relevance_moves_nothing_on_an_appending_turn_and_keeps_the_asked_fact_on_a_rebase() {
    let p = relevance();
    let store = CheckpointStore::new(16 << 20);

    // Turn 1: a long history and a question about the newest depot.
    let mut messages = history(30);
    ask(&mut messages, "Which gate code opens depot D29?".into());
    let first = run(&messages, &p, &store);
    let first_sent = forwarded(&first);
    // The oldest notes were dropped on the way (the replay re-compacted).
    let dropped = (1..30)
        .find(|&i| !holds(&first_sent, &note(i)))
        .expect("a dropped note");

    // Turn 2 asks about a dropped note: it only appends, so the form stays
    // as it was, and the now relevant note does not come back.
    answer(&mut messages, "It is 2073-KAPPA.".into());
    ask(
        &mut messages,
        format!("And which gate code opens depot D{dropped}?"),
    );
    let second = run(&messages, &p, &store);
    let second_sent = forwarded(&second);
    let info = second.stable.expect("stable mode");
    assert!(!info.rebased, "the two short items fit: {info:?}");
    assert_eq!(
        second_sent[..first_sent.len()],
        first_sent[..],
        "the previous turn's form is forwarded byte for byte"
    );
    assert_eq!(second_sent.len(), first_sent.len() + 2);
    assert!(!holds(&second_sent, &note(dropped)));

    // Later turns: short answers and questions, until a question tips
    // the form over its budget. Asked about the newest depot, that
    // re-compaction drops some notes the form held...
    let mut previous = second_sent;
    for _ in 0..40 {
        answer(&mut messages, "Ok.".into());
        let answered = chars(&previous) + "Ok.".len();
        let ask_about = |asked: usize| {
            let mut turn = messages.clone();
            ask(&mut turn, format!("Which gate code opens depot D{asked}?"));
            let outcome = run(&turn, &p, &store);
            (
                turn,
                outcome.stable.expect("stable mode"),
                forwarded(&outcome),
            )
        };
        let (turn, info, about_newest) = ask_about(29);
        if !info.rebased {
            messages = turn;
            previous = about_newest;
            continue;
        }
        assert!(
            answered <= BUDGET,
            "the question, not the answer, tipped it"
        );
        let asked = (0..29)
            .find(|&i| holds(&previous, &note(i)) && !holds(&about_newest, &note(i)))
            .expect("the re-compaction drops a note the form held");
        // ... and asked about one of those, it keeps that one.
        let (_, info, about_it) = ask_about(asked);
        assert!(info.rebased);
        assert!(
            holds(&about_it, &note(asked)),
            "relevance keeps the asked note (D{asked}) on a rebase"
        );
        return;
    }
    panic!("no question tipped the form over its budget");
}

/// The same `messages` cold to a proxy that keeps checkpoints and to one
/// that keeps none (a replay from the start), then a turn that appends a
/// short answer and question to the first.
fn cold_then_appended(
    messages: &[Value],
    p: &CompiledPolicy,
) -> (Vec<Value>, Vec<Value>, Vec<Value>) {
    let store = CheckpointStore::new(16 << 20);
    let kept = forwarded(&run(messages, p, &store));
    let replayed = forwarded(&run(messages, p, &CheckpointStore::new(0)));
    let mut next = messages.to_vec();
    answer(&mut next, "Done.".into());
    ask(&mut next, "Thanks, anything else?".into());
    let outcome = run(&next, p, &store);
    let info = outcome.stable.expect("stable mode");
    assert!(!info.rebased, "{info:?}");
    assert_eq!(info.resumed, Some(true));
    (kept, replayed, forwarded(&outcome))
}

fn texts(messages: &[Value]) -> String {
    messages
        .iter()
        .map(|m| m["content"].as_str().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_cold_request_is_compacted_around_its_question_and_the_next_turn_extends_it() {
    let p = relevance();
    // Replayed from the start, old notes go before the question is asked
    // (the head's stay); cold with a checkpoint store, the asked one stays.
    let mut checked = 0;
    for asked in 1..29 {
        let mut messages = history(30);
        ask(
            &mut messages,
            format!("Which gate code opens depot D{asked}?"),
        );
        let (kept, replayed, next) = cold_then_appended(&messages, &p);
        assert_eq!(next[..kept.len()], kept[..], "extended byte for byte");
        assert_eq!(next.len(), kept.len() + 2);
        if !holds(&replayed, &note(asked)) {
            assert!(holds(&kept, &note(asked)), "D{asked}: {kept:#?}");
            checked += 1;
        }
    }
    assert!(checked >= 5, "{checked} notes the replay drops");
}

/// A long old message holding the fact in its middle, over
/// `max_message_chars`.
fn long_note(fact: &str) -> String {
    let filler = |from: usize| {
        (from..from + 25)
            .map(|i| format!("Routine entry {i} about the weekly rota and the canteen menu."))
            .collect::<Vec<_>>()
            .join(" ")
    };
    format!("{} {fact} {}", filler(0), filler(100))
}

#[test]
fn a_relevant_long_message_keeps_its_match_in_stable_mode_and_after() {
    let mut p = relevance();
    p.engine.max_message_chars = 400;
    p.engine.budget_chars = 3_000;
    let fact = "The locker pin of the Vantaa annex is 4471-ZETA.";
    let mut messages = vec![
        json!({"role": "system", "content": "You keep site notes."}),
        json!({"role": "user", "content": "Start."}),
        json!({"role": "user", "content": long_note(fact)}),
        json!({"role": "assistant", "content": "Noted."}),
    ];
    for i in 0..20 {
        messages.push(json!({"role": "user", "content": format!("Small talk number {i} about nothing much at all.")}));
        messages.push(json!({"role": "assistant", "content": format!("Reply {i}.")}));
    }
    ask(
        &mut messages,
        "What is the locker pin of the Vantaa annex?".into(),
    );
    let (kept, _, next) = cold_then_appended(&messages, &p);
    let text = texts(&kept);
    // Cut around the match, not to its head.
    assert!(text.contains(fact), "{text}");
    assert!(text.contains("chars omitted"), "{text}");
    assert_eq!(next[..kept.len()], kept[..]);
}

#[test]
fn a_relevant_tool_result_is_pruned_around_its_match_in_stable_mode() {
    let mut p = policy(ScoringMethod::Relevance(RelevancePolicy {
        // Nothing relevant enough to be protected from the prune pass.
        pin_relevant_above: 1.01,
        ..RelevancePolicy::default()
    }));
    p.engine.budget_chars = 4_000;
    p.agent = compaction_proxy::compaction::agent::AgentPolicy {
        max_tool_result_chars: 400,
        protect_tool_chars: 0,
        prune_minimum_chars: 0,
        ..compaction_proxy::compaction::agent::AgentPolicy::OFF
    };
    let log = |fact: Option<&str>| {
        let mut lines: Vec<String> = (0..150)
            .map(|i| format!("2026-03-14T02:{:02}:00Z INFO request {i} handled", i % 60))
            .collect();
        if let Some(fact) = fact {
            lines[75] = fact.to_owned();
        }
        lines.join("\n")
    };
    let fact = "2026-03-14T02:11:09Z ERROR upstream refused the batch, code E4471";
    let tail_log = |id: &str, service: &str| {
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function",
            "function": {"name": "tail_log", "arguments": format!("{{\"service\": \"{service}\"}}")}}]})
    };
    let mut messages = vec![
        json!({"role": "system", "content": "You watch services."}),
        json!({"role": "user", "content": "Watch the workers."}),
        tail_log("c1", "worker"),
        json!({"role": "tool", "tool_call_id": "c1", "content": log(Some(fact))}),
        tail_log("c2", "audit"),
        json!({"role": "tool", "tool_call_id": "c2", "content": log(None)}),
    ];
    ask(
        &mut messages,
        "Which error code did the upstream refuse the batch with?".into(),
    );
    let (kept, _, next) = cold_then_appended(&messages, &p);
    let result = kept
        .iter()
        .find(|m| m["tool_call_id"] == "c1")
        .and_then(|m| m["content"].as_str())
        .expect("the result is forwarded");
    assert!(result.contains("code E4471"), "{result}");
    assert!(result.contains("chars omitted"), "{result}");
    assert_eq!(next[..kept.len()], kept[..]);
}
