//! Relevance scoring: what it keeps and what it costs.
//!
//! 1. **Retention**: on 200 generated chats (`tests/integration/fact_chats.rs`:
//!    80 messages, five facts planted in the first half, distractors that
//!    share the fact's words, a final question asked directly or by
//!    paraphrase), the share of chats whose forwarded messages still hold
//!    the asked fact at 50%, 25% and 10% budgets, for the seed engine,
//!    relevance scoring with default keys, and keep-last truncation.
//!    Printed as a table before the timings.
//! 2. **Cost**: `compact` on one ~200 KB history (generated chats strung
//!    together, the last question at the end) under seed and relevance
//!    scoring in one run, and `relevance::analyze` alone; the difference
//!    is what relevance adds to a cold compaction.
//!
//! Run: `cargo bench --bench relevance -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use compaction_proxy::engine::{compact, relevance, Message, Role};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

#[allow(dead_code)]
#[path = "../tests/integration/fact_chats.rs"]
mod fact_chats;

use fact_chats::{policy, retention, Strategy};

const BENCH_SEED: u64 = 2026;
const CHATS: usize = 200;
const BUDGETS: [f64; 3] = [0.50, 0.25, 0.10];

fn print_retention() {
    let chats = fact_chats::generate(BENCH_SEED, CHATS);
    for paraphrased in [false, true] {
        println!(
            "\nShare of {CHATS} chats forwarding the asked fact ({} questions)",
            if paraphrased { "paraphrased" } else { "direct" }
        );
        println!("| strategy | 50% budget | 25% budget | 10% budget |");
        println!("|---|---|---|---|");
        for strategy in Strategy::ALL {
            let cells: Vec<String> = BUDGETS
                .iter()
                .map(|&share| format!("{:.3}", retention(&chats, share, strategy, paraphrased)))
                .collect();
            println!("| {} | {} |", strategy.name(), cells.join(" | "));
        }
    }
    println!();
}

/// Generated chats strung together until the history holds `bytes`, with
/// the first chat's direct question last.
fn history_of(bytes: usize) -> Vec<Message> {
    let chats = fact_chats::generate(BENCH_SEED + 1, 64);
    let mut messages = vec![chats[0].history[0].clone()];
    let mut size = messages[0].content.len();
    'fill: for chat in &chats {
        for m in &chat.history[1..] {
            if size >= bytes {
                break 'fill;
            }
            size += m.content.len();
            messages.push(m.clone());
        }
    }
    messages.push(Message::new(Role::User, chats[0].direct.clone()));
    messages
}

fn cost(c: &mut Criterion) {
    let messages = history_of(200 * 1024);
    let bytes: usize = messages.iter().map(|m| m.content.len()).sum();
    let chars: usize = messages.iter().map(|m| m.content.chars().count()).sum();
    println!("cost input: {} messages, {bytes} bytes", messages.len());
    let mut group = c.benchmark_group("relevance_200kb");
    group.throughput(Throughput::Bytes(bytes as u64));
    for strategy in [Strategy::Seed, Strategy::Relevance] {
        let policy = policy(strategy, chars / 4);
        group.bench_function(format!("compact/{strategy:?}"), |b| {
            b.iter(|| compact(black_box(&messages), black_box(&policy)))
        });
    }
    group.bench_function("analyze", |b| {
        b.iter(|| relevance::analyze(black_box(&messages), None))
    });
    group.finish();

    // The machine may be shared: the fastest of many runs is the closest
    // to what one cold compaction costs on an idle core.
    let fastest = |f: &dyn Fn()| {
        (0..300)
            .map(|_| {
                let started = std::time::Instant::now();
                f();
                started.elapsed()
            })
            .min()
            .unwrap()
    };
    let seed = policy(Strategy::Seed, chars / 4);
    let relevant = policy(Strategy::Relevance, chars / 4);
    println!(
        "fastest of 300: compact seed {:?}, compact relevance {:?}, analyze {:?}",
        fastest(&|| drop(black_box(compact(black_box(&messages), &seed)))),
        fastest(&|| drop(black_box(compact(black_box(&messages), &relevant)))),
        fastest(&|| drop(black_box(relevance::analyze(black_box(&messages), None)))),
    );
}

fn benches(c: &mut Criterion) {
    print_retention();
    cost(c);
}

criterion_group!(relevance_benches, benches);
criterion_main!(relevance_benches);
