//! Token counting speed on the 150-turn agent fixture (about 260 KB of
//! text): cold (every text counted by the BPE, no piece seen before), cold
//! text whose pieces were seen before (a new history in a running
//! process), and warm (a repeated turn, every text's count from the
//! per-text cache).
//!
//! Run: `cargo bench --bench tokens -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use compaction_proxy::compaction::tokens::Encoding;
use compaction_proxy::format::Format;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};

fn bench(c: &mut Criterion) {
    let body = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/fixtures/agent-150-turns.json"
    ))
    .expect("fixture");
    let parsed = Format::Chat.parse(&body, usize::MAX).expect("parses");
    let conversation = &parsed.conversation;
    // Every counted text: each item's text and each call's arguments.
    let texts: Vec<&str> = conversation
        .items
        .iter()
        .flat_map(|i| {
            std::iter::once(i.text.as_str())
                .chain(i.tool_calls.iter().map(|c| c.arguments.as_str()))
        })
        .collect();
    let bytes: usize = texts.iter().map(|t| t.len()).sum();
    let count_each = || {
        texts
            .iter()
            .map(|t| Encoding::O200kBase.count(t))
            .sum::<usize>()
    };
    let mut group = c.benchmark_group("tokens");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("cold (uncached BPE)", |b| {
        b.iter(|| {
            // Every piece unseen, as for a history counted the first time.
            Encoding::forget_pieces();
            count_each()
        })
    });
    // The same texts through the counters this one replaced or builds on,
    // for a comparison within one run (the machine's load varies).
    group.bench_function("baseline: tiktoken-rs encode_ordinary", |b| {
        let bpe = tiktoken_rs::o200k_base_singleton();
        b.iter(|| {
            texts
                .iter()
                .map(|t| bpe.encode_ordinary(t).len())
                .sum::<usize>()
        })
    });
    group.bench_function("baseline: bpe-openai count, no piece table", |b| {
        let tokenizer = bpe_openai::o200k_base();
        b.iter(|| texts.iter().map(|t| tokenizer.count(*t)).sum::<usize>())
    });
    // A new history in a process that has counted others: its texts are
    // uncached, its words and numbers are not new.
    group.bench_function("cold text, pieces seen before", |b| b.iter(&count_each));
    Encoding::O200kBase.conversation(conversation);
    group.bench_function("warm (per-text cache)", |b| {
        b.iter(|| Encoding::O200kBase.conversation(black_box(conversation)))
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
