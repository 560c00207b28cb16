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
//!    together, the last question at the end) in one run: seed scoring,
//!    relevance scoring cold (no analysis cached) and relevance scoring
//!    warm (the previous turn's analyses cached in an `AnalysisStore`, this
//!    turn adding an answer and a new question), and `relevance::analyze`
//!    alone: cold without a cache, cold building every analysis but
//!    storing none, cold filling an empty `AnalysisStore`, and warm; the
//!    differences to seed are what relevance adds. The fastest of 300 runs
//!    of each is printed last (`docs/relevance.md` keeps the figures).
//!
//! 3. **A warm turn through the pipeline** (`warm_turn`): two ~200 KB
//!    histories, a coding agent's (tool calls
//!    and results, `tests/data/fixtures/agent-150-turns.json`'s first 214
//!    messages, then its next turn) and the chat history of 2., each
//!    compacted by `compaction::compact` in exact mode under the shipped
//!    default policy at a quarter of its chars, with the previous turn's
//!    analyses and word lists in the store; under seed and under relevance
//!    scoring. The difference is what relevance adds to a warm turn.
//!    `WARM_TURN_ONCE=agent_200kb/relevance` runs that case's turn once (after
//!    warming its store) and exits, for instruction counts:
//!    `valgrind --tool=callgrind --toggle-collect='*measured_turn*' <bench binary>`;
//!    `WARM_TURN_FASTEST=200` prints each case's fastest of 200 turns and exits.
//!
//! 4. **The harder set** (`benches/support/relevance_cases.rs`): 300
//!    generated cases of six kinds whose questions do not repeat the
//!    answer's words, per kind at 50%, 25% and 10% budgets (printed after
//!    the first table).
//!
//! Profiling one case: `RELEVANCE_BENCH_NO_FASTEST=1` skips the retention
//! table and the fastest-of runs, e.g. under `perf record` with
//! `--bench analyze/cold`.
//!
//! Run: `cargo bench --bench relevance -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use compaction_proxy::analysis_store::AnalysisStore;
use compaction_proxy::compaction::stable::NoCheckpoints;
use compaction_proxy::engine::{compact, compact_cached, relevance, Message, Role};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};

#[allow(dead_code)]
#[path = "../tests/integration/fact_chats.rs"]
mod fact_chats;

use fact_chats::{policy, retention, Strategy};

#[path = "support/relevance_cases.rs"]
mod relevance_cases;

/// The harder set's seed and size (its test version uses another seed).
const CASES_SEED: u64 = 202_625;
const CASES_PER_KIND: usize = 50;

/// The per-kind table of the harder set (`benches/support/relevance_cases.rs`)
/// under the shipped default policy, the same with `scoring = "relevance"`,
/// and that in stable mode with the agent passes on.
fn print_cases() {
    use relevance_cases::{default_policy, generate, markdown, table, with_relevance};
    let cases = generate(CASES_SEED, CASES_PER_KIND);
    let shipped = default_policy();
    let relevant = with_relevance(&shipped);
    let mut agentic = relevant.clone();
    agentic.mode = compaction_proxy::config::Mode::Stable;
    agentic.agent.max_tool_result_chars = 2_000;
    agentic.agent.max_arg_chars = 2_000;
    agentic.agent.tool_duplicate_threshold = 0.9;
    let mut exact_agentic = agentic.clone();
    exact_agentic.mode = compaction_proxy::config::Mode::Exact;
    for (name, policy) in [
        ("the shipped default policy", &shipped),
        ("the default with scoring = \"relevance\"", &relevant),
        ("...and the agent passes on (exact mode)", &exact_agentic),
        ("...and the agent passes on, stable mode", &agentic),
    ] {
        println!(
            "\nShare of {} cases forwarding what the answer needs, {name}",
            cases.len()
        );
        print!("{}", markdown(&table(&cases, policy)));
    }
    println!();
}

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
fn history_of(bytes: usize) -> Vec<Message<'static>> {
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

/// A cache that is on but keeps nothing: every message's analysis is built
/// as for a store, without a store's inserts, to tell the two costs apart.
struct KeepsNothing;

impl relevance::AnalysisCache for KeepsNothing {
    fn get(&self, _: u128) -> Option<relevance::CachedAnalysis> {
        None
    }
    fn put(&self, _: u128, _: relevance::CachedAnalysis) {}
}

/// The proxy's store on a conversation's first turn, as the request sees
/// it: the store takes on the analyses to make them after the request
/// (here, nowhere), so the request counts from the text.
struct FillsAfterwards;

impl relevance::AnalysisCache for FillsAfterwards {
    fn get(&self, _: u128) -> Option<relevance::CachedAnalysis> {
        None
    }
    fn put(&self, _: u128, _: relevance::CachedAnalysis) {}
    fn fill_later(&self, _history: u128, texts: &[&str]) -> bool {
        // What the store does on the request's path: copy the texts.
        black_box(texts.iter().map(|t| t.to_string()).collect::<Vec<_>>());
        true
    }
}

impl compaction_proxy::engine::word_lists::WordListCache for FillsAfterwards {
    fn word_lists_enabled(&self) -> bool {
        false
    }
    fn history_words(
        &self,
        _: u128,
    ) -> Option<std::sync::Arc<compaction_proxy::engine::word_lists::HistoryWords>> {
        None
    }
    fn put_history_words(
        &self,
        _: u128,
        _: std::sync::Arc<compaction_proxy::engine::word_lists::HistoryWords>,
    ) {
    }
    fn remove_history_words(&self, _: u128) {}
}

fn cost(c: &mut Criterion) {
    let history = history_of(200 * 1024);
    // The turn after `history`: an answer and a new question, about
    // another chat's fact, so other old messages become relevant.
    let next_chats = fact_chats::generate(BENCH_SEED + 2, 1);
    let mut next_turn = history.clone();
    next_turn.push(Message::new(Role::Assistant, "It is in the notes above."));
    next_turn.push(Message::new(Role::User, next_chats[0].direct.clone()));

    let bytes: usize = next_turn.iter().map(|m| m.content.len()).sum();
    let chars: usize = next_turn.iter().map(|m| m.content.chars().count()).sum();
    println!("cost input: {} messages, {bytes} bytes", next_turn.len());
    let seed = policy(Strategy::Seed, chars / 4);
    let relevant = policy(Strategy::Relevance, chars / 4);
    // Warm: the analyses of `history` (the previous turn) are cached, so
    // only the two new messages are analysed.
    let warm_cache = || {
        let store = AnalysisStore::new(64 << 20);
        compact_cached(&history, &relevant, &store);
        // Between two turns moka's housekeeping of the inserts has run.
        store.weighted_size();
        store
    };
    let mut group = c.benchmark_group("relevance_200kb");
    group.throughput(Throughput::Bytes(bytes as u64));
    group.bench_function("compact/seed", |b| {
        b.iter(|| compact(black_box(&next_turn), black_box(&seed)))
    });
    group.bench_function("compact/relevance_cold", |b| {
        b.iter(|| compact(black_box(&next_turn), black_box(&relevant)))
    });
    // Each iteration gets a cache holding the previous turn only (built
    // and dropped outside the timing), as the proxy's would when this turn
    // arrives.
    group.bench_function("compact/relevance_warm", |b| {
        b.iter_batched_ref(
            warm_cache,
            |store| compact_cached(black_box(&next_turn), black_box(&relevant), &*store),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("analyze/cold", |b| {
        b.iter(|| relevance::analyze(black_box(&next_turn), None))
    });
    // An empty store filled with every analysis during the call (outside
    // a runtime; the proxy fills it after the request).
    group.bench_function("analyze/filling", |b| {
        b.iter_batched_ref(
            || AnalysisStore::new(64 << 20),
            |store| relevance::analyze_cached(black_box(&next_turn), None, &*store),
            BatchSize::PerIteration,
        )
    });
    group.bench_function("analyze/analyses_kept_nowhere", |b| {
        b.iter(|| relevance::analyze_cached(black_box(&next_turn), None, &KeepsNothing))
    });
    group.bench_function("analyze/warm", |b| {
        b.iter_batched_ref(
            warm_cache,
            |store| relevance::analyze_cached(black_box(&next_turn), None, &*store),
            BatchSize::PerIteration,
        )
    });
    group.finish();
    if std::env::var_os("RELEVANCE_BENCH_NO_FASTEST").is_some() {
        return; // profiling one case: skip the runs below
    }

    // The machine may be shared: the fastest of many runs is the closest
    // to what one compaction costs on an idle core. Each warm run gets a
    // cache holding the previous turn only (built outside the timing).
    let fastest = |f: &mut dyn FnMut() -> std::time::Duration| (0..300).map(|_| f()).min().unwrap();
    let time = |f: &dyn Fn()| {
        let started = std::time::Instant::now();
        f();
        started.elapsed()
    };
    let seed_time =
        fastest(&mut || time(&|| drop(black_box(compact(black_box(&next_turn), &seed)))));
    let cold_time =
        fastest(&mut || time(&|| drop(black_box(compact(black_box(&next_turn), &relevant)))));
    let warm_time = fastest(&mut || {
        let store = warm_cache();
        time(&|| {
            drop(black_box(compact_cached(
                black_box(&next_turn),
                &relevant,
                &store,
            )))
        })
    });
    // Nothing cached yet, and every message's analysis stored for the
    // next turn during the call: a first turn outside a tokio runtime.
    let filling_time = fastest(&mut || {
        let store = AnalysisStore::new(64 << 20);
        time(&|| {
            drop(black_box(compact_cached(
                black_box(&next_turn),
                &relevant,
                &store,
            )))
        })
    });
    // The proxy's first turn: its store analyses the messages after it.
    let first_turn_time = fastest(&mut || {
        time(&|| {
            drop(black_box(compact_cached(
                black_box(&next_turn),
                &relevant,
                &FillsAfterwards,
            )))
        })
    });
    let analyze_cold =
        fastest(&mut || time(&|| drop(black_box(relevance::analyze(black_box(&next_turn), None)))));
    let analyze_warm = fastest(&mut || {
        let store = warm_cache();
        time(&|| {
            drop(black_box(relevance::analyze_cached(
                black_box(&next_turn),
                None,
                &store,
            )))
        })
    });
    let analyze_building = fastest(&mut || {
        time(&|| {
            drop(black_box(relevance::analyze_cached(
                black_box(&next_turn),
                None,
                &KeepsNothing,
            )))
        })
    });
    let analyze_filling = fastest(&mut || {
        let store = AnalysisStore::new(64 << 20);
        time(&|| {
            drop(black_box(relevance::analyze_cached(
                black_box(&next_turn),
                None,
                &store,
            )))
        })
    });
    println!(
        "fastest of 300: compact seed {seed_time:?}, relevance cold {cold_time:?} (+{:?}), \
         relevance on the proxy's first turn (analyses made after it) {first_turn_time:?} (+{:?}), \
         relevance cold filling an empty cache during the request {filling_time:?} (+{:?}), \
         relevance warm {warm_time:?} (+{:?}); analyze cold {analyze_cold:?}, \
         building every analysis but keeping none {analyze_building:?}, \
         filling an empty cache {analyze_filling:?}, warm {analyze_warm:?}",
        cold_time.saturating_sub(seed_time),
        first_turn_time.saturating_sub(seed_time),
        filling_time.saturating_sub(seed_time),
        warm_time.saturating_sub(seed_time),
    );
}

/// A chat completions body of `messages` (plain text, no tools).
fn chat_body(messages: &[Message]) -> String {
    let messages: Vec<serde_json::Value> = messages
        .iter()
        .map(|m| serde_json::json!({"role": m.role.as_str(), "content": m.content}))
        .collect();
    serde_json::json!({"model": "gpt-4o", "messages": messages}).to_string()
}

/// The agent fixture's body cut to its first `messages` messages.
fn agent_body(messages: usize) -> String {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../tests/data/fixtures/agent-150-turns.json"))
            .expect("the fixture is JSON");
    let mut body = fixture.clone();
    let all = fixture["messages"].as_array().expect("messages");
    body["messages"] = serde_json::Value::Array(all[..messages].to_vec());
    body.to_string()
}

/// One warm-turn case: the previous turn's body and this turn's.
struct Turns {
    name: &'static str,
    previous: String,
    next: String,
}

fn warm_turn_cases() -> Vec<Turns> {
    let history = history_of(200 * 1024);
    let next_chats = fact_chats::generate(BENCH_SEED + 2, 1);
    let mut next = history.clone();
    next.push(Message::new(Role::Assistant, "It is in the notes above."));
    next.push(Message::new(Role::User, next_chats[0].direct.clone()));
    vec![
        // Messages 0..=213 end with a user turn ("Step 108"); the next
        // turn's request is message 220, after a tool loop.
        Turns {
            name: "agent_200kb",
            previous: agent_body(214),
            next: agent_body(221),
        },
        Turns {
            name: "chat_200kb",
            previous: chat_body(&history),
            next: chat_body(&next),
        },
    ]
}

/// The shipped default policy in exact mode at `budget_chars`, scoring by
/// seed or relevance, with `store` as its analyses.
fn warm_policy(
    relevance: bool,
    budget_chars: usize,
    store: AnalysisStore,
) -> compaction_proxy::policy::CompiledPolicy {
    let shipped = relevance_cases::default_policy();
    let mut policy = if relevance {
        relevance_cases::with_relevance(&shipped)
    } else {
        shipped
    };
    policy.mode = compaction_proxy::config::Mode::Exact;
    policy.engine.budget_chars = budget_chars;
    policy.analyses = std::sync::Arc::new(store);
    policy
}

/// A store as the proxy's holds it when `previous` was the last turn.
fn warmed(
    previous: &compaction_proxy::format::Parsed,
    relevance: bool,
    budget_chars: usize,
) -> compaction_proxy::policy::CompiledPolicy {
    let store = AnalysisStore::new(32 << 20).with_word_lists(32 << 20);
    let policy = warm_policy(relevance, budget_chars, store);
    compaction_proxy::compaction::compact(previous, &policy, &NoCheckpoints);
    // Between two turns moka's housekeeping of the inserts has run.
    policy.analyses.weighted_size();
    policy.analyses.word_lists_weighted_size();
    policy
}

/// The measured call (a symbol of its own for callgrind's toggle).
#[inline(never)]
fn measured_turn(
    parsed: &compaction_proxy::format::Parsed,
    policy: &compaction_proxy::policy::CompiledPolicy,
) -> compaction_proxy::compaction::Compacted {
    compaction_proxy::compaction::compact(parsed, policy, &NoCheckpoints)
}

fn warm_turn(c: &mut Criterion) {
    use compaction_proxy::format::Format;
    let once = std::env::var("WARM_TURN_ONCE").ok();
    let fastest_of: Option<usize> = std::env::var("WARM_TURN_FASTEST")
        .ok()
        .and_then(|n| n.parse().ok());
    let mut group = c.benchmark_group("warm_turn");
    for case in warm_turn_cases() {
        let previous = Format::Chat
            .parse(case.previous.as_bytes(), usize::MAX)
            .expect("parses");
        let next = Format::Chat
            .parse(case.next.as_bytes(), usize::MAX)
            .expect("parses");
        let budget = next.conversation.total_chars() / 4;
        for (scoring, relevance) in [("seed", false), ("relevance", true)] {
            let id = format!("{}/{scoring}", case.name);
            if let Some(runs) = fastest_of {
                // The machine may be shared: the fastest of many runs is
                // the closest to one turn on an idle core.
                let best = (0..runs)
                    .map(|_| {
                        let policy = warmed(&previous, relevance, budget);
                        let started = std::time::Instant::now();
                        black_box(measured_turn(black_box(&next), &policy));
                        started.elapsed()
                    })
                    .min()
                    .unwrap_or_default();
                println!("warm_turn {id}: fastest of {runs} {best:?}");
                continue;
            }
            if let Some(only) = &once {
                if *only == id {
                    let policy = warmed(&previous, relevance, budget);
                    black_box(measured_turn(&next, &policy));
                    std::process::exit(0);
                }
                continue;
            }
            group.throughput(Throughput::Bytes(case.next.len() as u64));
            group.bench_function(&id, |b| {
                b.iter_batched_ref(
                    || warmed(&previous, relevance, budget),
                    |policy| measured_turn(black_box(&next), policy),
                    BatchSize::PerIteration,
                )
            });
        }
    }
    group.finish();
    if once.is_some() {
        eprintln!("WARM_TURN_ONCE: no such case");
        std::process::exit(1);
    }
    if fastest_of.is_some() {
        std::process::exit(0);
    }
}

fn benches(c: &mut Criterion) {
    if std::env::var_os("WARM_TURN_ONCE").is_some()
        || std::env::var_os("WARM_TURN_FASTEST").is_some()
    {
        warm_turn(c);
    }
    if std::env::var_os("RELEVANCE_BENCH_NO_FASTEST").is_none() {
        print_retention();
        print_cases();
    }
    cost(c);
    warm_turn(c);
}

criterion_group!(relevance_benches, benches);
criterion_main!(relevance_benches);
