//! One test per rule of the question in context and of cutting around the
//! match, each failing without its rule.

use super::*;
use crate::engine::{compact, Kept, Policy, RelevancePolicy, ScoringMethod};

fn user(s: &str) -> Message<'static> {
    Message::new(Role::User, s)
}
fn assistant(s: &str) -> Message<'static> {
    Message::new(Role::Assistant, s)
}

/// Ordinary work chat, `n` sentences, none about the facts.
fn filler(n: usize) -> String {
    (0..n)
        .map(|i| format!("Item {i} of the rollout plan looks fine to the team. "))
        .collect()
}

fn relevance_policy(budget: usize) -> Policy {
    let mut p = Policy::with_budget(budget);
    p.scoring = ScoringMethod::Relevance(RelevancePolicy::default());
    p
}

fn forwarded(report: &crate::engine::Report) -> String {
    report
        .messages
        .iter()
        .map(|m| m.content.as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn a_reference_is_resolved_through_the_previous_turn() {
    let messages = [
        assistant("Site notes for Norrby: the locker pin is 1188-BETA."),
        assistant("Site notes for Halden: the locker pin is 4471-KAPPA."),
        assistant(&filler(4)),
        user("Let's go back to the Halden site for a moment."),
        assistant("Sure, the team there works early shifts."),
        user("And what was its locker pin?"),
    ];
    let r = analyze(&messages, None);
    assert!(r.query_terms.iter().any(|t| t == "halden"), "{r:?}");
    assert!(r.relevance[1] > r.relevance[0], "{:?}", r.relevance);
    // A request that refers to nothing takes no context.
    let mut plain = messages.to_vec();
    plain[5] = user("And what was the locker pin at the main office?");
    let r = analyze(&plain, None);
    assert!(!r.query_terms.iter().any(|t| t == "halden"), "{r:?}");
}

#[test]
fn an_alias_links_its_names_both_ways() {
    let definition = user("Halden, also known as the northern depot, takes late deliveries.");
    // Asked by the alias, stated under the real name.
    let messages = [
        assistant("The gate code for Norrby is 1188-BETA."),
        assistant("The gate code for Halden is 4471-KAPPA."),
        definition.clone(),
        assistant(&filler(3)),
        user("What is the gate code for the northern depot?"),
    ];
    let r = analyze(&messages, None);
    assert!(r.relevance[1] > r.relevance[0], "{:?}", r.relevance);
    // Asked by the real name, stated under the alias.
    let messages = [
        assistant("The gate code for Norrby is 1188-BETA."),
        assistant("The gate code for the northern depot is 4471-KAPPA."),
        definition,
        assistant(&filler(3)),
        user("What is the gate code for Halden?"),
    ];
    let r = analyze(&messages, None);
    assert!(r.relevance[1] > r.relevance[0], "{:?}", r.relevance);
}

#[test]
fn a_calls_arguments_lift_its_result() {
    let config = |n: u32| format!("[limits]\ntimeout_ms = 300\nmax_connections = {n}\npool = 4");
    let mut billing = Message::new(Role::Tool, config(640));
    billing.subject = r#"read_file {"path": "deploy/billing/limits.toml"}"#.into();
    let mut ledger = Message::new(Role::Tool, config(220));
    ledger.subject = r#"read_file {"path": "deploy/ledger/limits.toml"}"#.into();
    let messages = [
        ledger.clone(),
        billing,
        ledger,
        user("What is max_connections in the billing limits config?"),
    ];
    let r = analyze(&messages, None);
    assert!(r.relevance[1] > r.relevance[0], "{:?}", r.relevance);
    assert!(r.relevance[1] > r.relevance[2], "{:?}", r.relevance);
    assert_eq!(r.relevance[1], 1.0);
}

#[test]
fn a_long_relevant_message_is_trimmed_around_its_match() {
    let fact = "The alarm code for Halden is 4471-KAPPA.";
    let long = format!("{} {fact} {}", filler(30), filler(30));
    let messages = [
        user("Keep track of the sites."),
        assistant(&long),
        assistant(&filler(20)),
        assistant(&filler(20)),
        user("What is the alarm code for Halden?"),
    ];
    let mut policy = relevance_policy(1_000);
    policy.max_message_chars = 400;
    policy.keep_last_n = 1;
    // No pin share: the message reaches the trim stage unprotected.
    if let ScoringMethod::Relevance(r) = &mut policy.scoring {
        r.relevant_pin_share = 0.0;
    }
    let report = compact(&messages, &policy);
    let kept = report.messages.iter().find(|m| m.index == 1).expect("kept");
    assert_eq!(kept.kept, Kept::Trimmed);
    assert!(kept.content.contains(fact), "{}", kept.content);
    assert!(kept.content.chars().count() <= 400);
    assert!(kept.content.contains("chars omitted"));
    assert!(report.budget.budget_met);
}

#[test]
fn the_latest_of_several_values_is_kept() {
    let update = format!(
        "{} Update: the headcount at Halden is now 44 after the new hires. {}",
        filler(2),
        filler(2)
    );
    let question = "What is the current headcount at Halden?";
    let messages = [
        user("Keep track of the sites."),
        assistant("The headcount at Halden is 41."),
        assistant(&filler(3)),
        assistant(&update),
        assistant(&filler(3)),
        user(question),
    ];
    let r = analyze(&messages, None);
    assert!(r.relevance[3] > r.relevance[1], "{:?}", r.relevance);
    assert!(r.relevance[1] < RelevancePolicy::DEFAULT_PIN_RELEVANT_ABOVE);
    // Room for the question and one statement: the update is the one kept.
    let mut policy = relevance_policy(question.len() + update.len() + 10);
    policy.keep_last_n = 1;
    if let ScoringMethod::Relevance(r) = &mut policy.scoring {
        r.relevant_pin_share = 0.0;
    }
    let report = compact(&messages, &policy);
    let text = forwarded(&report);
    assert!(text.contains("is now 44"), "{text}");
    assert!(!text.contains("is 41"), "{text}");
}

#[test]
fn a_table_row_is_kept_with_its_header_row() {
    let mut table =
        String::from("Shipments per site:\n\n| Site | Q1 | Q2 | Q3 |\n|---|---|---|---|\n");
    for i in 0..80 {
        table.push_str(&format!("| Place {i} | {i}10 | {i}20 | {i}30 |\n"));
    }
    table.push_str("| Halden | 417 | 981 | 523 |\n");
    for i in 80..120 {
        table.push_str(&format!("| Place {i} | {i}10 | {i}20 | {i}30 |\n"));
    }
    let messages = [
        user("Keep track of the sites."),
        assistant(&table),
        assistant(&filler(10)),
        assistant(&filler(10)),
        user(&filler(1)),
        user("In that table, what was the Q3 count for Halden?"),
    ];
    let total: usize = messages.iter().map(|m| m.content.chars().count()).sum();
    let mut policy = relevance_policy(total / 5);
    policy.keep_last_n = 2;
    let report = compact(&messages, &policy);
    assert!(
        table.chars().count() > total / 5,
        "the table cannot stay whole"
    );
    let kept = report.messages.iter().find(|m| m.index == 1).expect("kept");
    assert!(
        kept.content.contains("| Halden | 417 | 981 | 523 |"),
        "{}",
        kept.content
    );
    assert!(
        kept.content
            .contains("| Site | Q1 | Q2 | Q3 |\n|---|---|---|---|"),
        "{}",
        kept.content
    );
    assert!(report.budget.budget_met);
}
