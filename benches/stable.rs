//! Stable mode on a provider with prompt caching (issue 7): a 300-turn
//! coding agent and a 120-turn dispatcher chat sent turn by turn, each
//! uncompacted, under `exact` and under `stable` compaction. Prints billed
//! input (the repeated prefix at 10%), the share of turns whose forwarded
//! messages extend the previous turn's, budget fill once the history has
//! outgrown the budget, and per-turn compaction time with a cold and a warm
//! checkpoint store.
//!
//! Run: `cargo bench --bench stable`

#[path = "support/conversation_sim.rs"]
mod sim;

use compaction_proxy::cache::CheckpointStore;
use compaction_proxy::config::Mode;
use compaction_proxy::engine::{Policy, Role};
use compaction_proxy::policy::CompiledPolicy;
use sim::*;

fn policy(budget: usize, mode: Mode) -> CompiledPolicy {
    let mut engine = Policy::with_budget(budget);
    engine.keep_roles = vec![Role::System, Role::Developer];
    engine.max_message_chars = 4000;
    let mut p = CompiledPolicy::plain("default", engine);
    p.pin_first_user = true;
    p.mode = mode;
    p
}

fn ms(s: f64) -> String {
    format!("{:.3} ms", s * 1e3)
}

fn report(name: &str, requests: &[Vec<u8>], budget: usize) {
    let plain = bill_cold(requests, None);
    let exact = bill_cold(requests, Some(&policy(budget, Mode::Exact)));
    let stable_cold = bill_cold(requests, Some(&policy(budget, Mode::Stable)));
    let store = CheckpointStore::new(64 << 20);
    let stable_warm = bill(requests, Some(&policy(budget, Mode::Stable)), &store);
    assert!(stable_cold.forwarded == stable_warm.forwarded);
    let last = requests.last().map_or(0, Vec::len);
    println!(
        "\n{name}: {} turns, budget {budget} chars, last request {} KB, outgrown on {} turns",
        requests.len(),
        last / 1024,
        stable_warm.outgrown_turns
    );
    println!("| sent as | billed input | × uncompacted | turns extending the previous | budget fill | compaction p50 | p99 |");
    println!("|---|---|---|---|---|---|---|");
    for (label, b) in [
        ("uncompacted", &plain),
        ("exact", &exact),
        ("stable, cold (no checkpoints)", &stable_cold),
        ("stable, warm checkpoints", &stable_warm),
    ] {
        println!(
            "| {label} | {:.0} | {:.2} | {:.2} | {} | {} | {} |",
            b.billed,
            b.billed / plain.billed,
            b.extending_share(),
            if b.outgrown_turns > 0 {
                format!("{:.2}", b.fill)
            } else {
                "-".into()
            },
            ms(percentile(&b.seconds, 50.0)),
            ms(percentile(&b.seconds, 99.0)),
        );
    }
    println!(
        "stable / exact billed: {:.3}",
        stable_warm.billed / exact.billed
    );
}

fn main() {
    let (history, ends) = coding_agent(300, 11, 100);
    report("coding agent", &requests(&history, &ends), 280_000);
    let (history, ends) = dispatcher_chat(120, 7);
    report("dispatcher chat", &requests(&history, &ends), 30_000);
}
