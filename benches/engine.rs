//! Engine throughput: `compact` over synthetic conversations of 20, 200 and
//! 2,000 messages of about 1 KB each, with a budget of half the total so
//! that dedupe, trim and drop all do work.
//!
//! Run: `cargo bench --bench engine -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use compaction_proxy::engine::{compact, Message, Policy, Role};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// A tiny deterministic generator (Knuth's MMIX LCG), so every run benches
/// the same input without an RNG dependency.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) as u32
    }

    /// Uniform-ish in 0..n.
    fn below(&mut self, n: usize) -> usize {
        self.next() as usize % n
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

const WORDS: &[&str] = &[
    "the",
    "a",
    "to",
    "of",
    "and",
    "in",
    "is",
    "it",
    "for",
    "on",
    "with",
    "that",
    "this",
    "we",
    "you",
    "can",
    "will",
    "be",
    "not",
    "are",
    "order",
    "shipment",
    "customer",
    "warehouse",
    "delivery",
    "status",
    "tracking",
    "number",
    "refund",
    "invoice",
    "address",
    "carrier",
    "package",
    "delayed",
    "arrived",
    "scheduled",
    "update",
    "request",
    "account",
    "payment",
    "confirmed",
    "pending",
    "returned",
    "damaged",
    "replacement",
    "support",
    "ticket",
    "agent",
    "Berlin",
    "Hamburg",
    "Munich",
    "Tuesday",
    "Friday",
    "morning",
    "afternoon",
    "today",
    "tomorrow",
    "yesterday",
    "please",
    "check",
    "again",
    "thanks",
    "sorry",
    "issue",
    "problem",
    "solution",
    "service",
    "system",
    "database",
    "query",
    "result",
    "error",
    "timeout",
    "retry",
    "DE-4471",
    "03:10",
    "item",
    "items",
    "quantity",
    "price",
    "discount",
    "label",
    "route",
    "driver",
    "depot",
    "scan",
    "signature",
    "window",
    "estimate",
    "policy",
    "contract",
    "vendor",
    "supplier",
    "stock",
    "inventory",
    "backorder",
    "priority",
    "express",
    "standard",
    "weight",
    "dimensions",
    "customs",
    "declaration",
    "export",
    "import",
    "region",
    "zone",
    "fee",
    "charge",
    "credit",
    "balance",
    "history",
    "note",
    "comment",
    "question",
    "answer",
    "reply",
];

const ENDS: &[&str] = &[".", ".", ".", ".", "!", "?"];

/// One sentence of 6..18 words, capitalised, ending in `.`, `!` or `?`.
fn sentence(rng: &mut Lcg, out: &mut String) {
    let len = 6 + rng.below(13);
    for i in 0..len {
        let word = WORDS[rng.below(WORDS.len())];
        if i == 0 {
            let mut cs = word.chars();
            if let Some(first) = cs.next() {
                out.extend(first.to_uppercase());
                out.push_str(cs.as_str());
            }
        } else {
            out.push(' ');
            out.push_str(word);
            if rng.chance(6) {
                out.push(',');
            }
        }
    }
    out.push_str(ENDS[rng.below(ENDS.len())]);
}

/// About 1 KB (800..1200 chars) of sentences.
fn text(rng: &mut Lcg) -> String {
    let target = 800 + rng.below(400);
    let mut out = String::with_capacity(target + 200);
    while out.len() < target {
        if !out.is_empty() {
            out.push(' ');
        }
        sentence(rng, &mut out);
    }
    out
}

/// A near duplicate: the same text with two words replaced.
fn near_duplicate(rng: &mut Lcg, original: &str) -> String {
    let mut words: Vec<&str> = original.split(' ').collect();
    for _ in 0..2 {
        let at = rng.below(words.len());
        words[at] = WORDS[rng.below(WORDS.len())];
    }
    words.join(" ")
}

/// `n` messages: a system prompt, then mostly user/assistant turns with
/// some tool results; about one in eight repeats an earlier message of the
/// same role with small edits.
fn conversation(n: usize, seed: u64) -> Vec<Message> {
    let mut rng = Lcg(seed);
    let mut out: Vec<Message> = Vec::with_capacity(n);
    for i in 0..n {
        let role = match (i, rng.below(10)) {
            (0, _) => Role::System,
            (_, 0..=3) => Role::User,
            (_, 4..=7) => Role::Assistant,
            _ => Role::Tool,
        };
        let earlier: Vec<usize> = (0..i).filter(|&k| out[k].role == role).collect();
        let content = if !earlier.is_empty() && rng.chance(12) {
            let k = earlier[rng.below(earlier.len())];
            near_duplicate(&mut rng, &out[k].content)
        } else {
            text(&mut rng)
        };
        out.push(Message::new(role, content));
    }
    out
}

fn total_chars(messages: &[Message]) -> usize {
    messages.iter().map(|m| m.content.chars().count()).sum()
}

/// Half the total as budget. Trimming ~1 KB messages to 700 chars saves
/// about a third, so after dedupe and trim the drop stage still has work.
fn policy(messages: &[Message]) -> Policy {
    Policy {
        max_message_chars: 700,
        ..Policy::with_budget(total_chars(messages) / 2)
    }
}

fn bench_compact(c: &mut Criterion) {
    let mut group = c.benchmark_group("compact");
    for n in [20usize, 200, 2_000] {
        let messages = conversation(n, 0x5eed_0000 + n as u64);
        let policy = policy(&messages);
        let bytes: usize = messages.iter().map(|m| m.content.len()).sum();

        // Every stage must do work, or the bench measures less than it says.
        let report = compact(&messages, &policy);
        assert!(report.budget.budget_met, "compact/{n}: budget not met");
        assert!(
            !report.stages.dedupe.removed.is_empty(),
            "compact/{n}: no dedupe"
        );
        assert!(
            !report.stages.trim.trimmed.is_empty(),
            "compact/{n}: no trim"
        );
        assert!(
            !report.stages.drop.dropped.is_empty(),
            "compact/{n}: no drop"
        );

        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &messages, |b, messages| {
            b.iter(|| compact(black_box(messages), black_box(&policy)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench_compact);
criterion_main!(benches);
