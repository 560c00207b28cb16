//! A turn costs what is new (issue 29): a coding-agent session grown turn by
//! turn to about 3 MB, in chat, anthropic and responses format, in stable
//! and exact mode, each turn decided by the proxy's own entry point for one
//! request ([`compact::decide_decoded`]: the compaction cache, then the
//! pipeline with stable mode's checkpoints).
//!
//! Two parts:
//! - **the session table** (printed): every turn sent in order, as an agent
//!   sends it, timed in thread CPU time. *Warm*: the stores hold what the
//!   previous turns left (the proxy's steady state). *Cold*: fresh stores
//!   (a restart, another replica), measured every few turns. Each row gives
//!   body size and bytes added; a least-squares fit `t = a + b·MB of body +
//!   c·MB added` says which one the warm time follows.
//! - **criterion groups** `warm_turn` and `cold_turn`: one turn at about
//!   2.7 MB, repeated (each warm sample first sends the previous turn,
//!   untimed, to fresh stores).
//!
//! Run: `cargo bench --bench incremental` (`INCREMENTAL_QUICK=1`: one
//! format and mode, fewer turns; `INCREMENTAL_TABLE=0`: criterion only).

use std::sync::Arc;
use std::time::Duration;

use compaction_proxy::cache::{CheckpointStore, CompactionCache, PrefixCache};
use compaction_proxy::config::Mode;
use compaction_proxy::format::Format;
use compaction_proxy::policy::{CompiledPolicy, Runtime};
use compaction_proxy::proxy::body::Received;
use compaction_proxy::proxy::compact;
use criterion::{criterion_group, BenchmarkId, Criterion};
use serde_json::{json, Value};

/// The session's last body is at least this large.
const TARGET_BYTES: usize = 3 << 20;
/// The turn the criterion groups repeat: the first at least this large.
const PROBE_BYTES: usize = 2_700_000;
/// The budget of the measured session.
const BUDGET_CHARS: usize = 400_000;

/// The shipped default policy at the session's budget, in `mode`.
fn policy(mode: Mode) -> Arc<CompiledPolicy> {
    let runtime = Runtime::load_text(None, Vec::new(), &Default::default()).expect("defaults");
    let mut p = (*runtime.policy("default").expect("default policy")).clone();
    p.engine.budget_chars = BUDGET_CHARS;
    p.mode = mode;
    Arc::new(p)
}

/// A deterministic stream of pseudo-random numbers (xorshift).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

const WORDS: [&str; 24] = [
    "fn", "let", "mut", "self", "config", "request", "body", "parse", "stable", "cache", "prefix",
    "turn", "match", "Some", "None", "Ok", "return", "bytes", "len", "items", "policy", "format",
    "state", "=>",
];

/// A tool result of 4-30 KB: lines of code-like words.
fn tool_output(rng: &mut Rng) -> String {
    let size = 4_000 + rng.below(26_000) as usize;
    let mut out = String::with_capacity(size + 80);
    while out.len() < size {
        let words = 3 + rng.below(9);
        out.push_str(&"    ".repeat(rng.below(3) as usize));
        for _ in 0..words {
            out.push_str(WORDS[rng.below(WORDS.len() as u64) as usize]);
            out.push(' ');
        }
        out.push_str(&rng.below(100_000).to_string());
        out.push_str(";\n");
    }
    out
}

/// A session's requests, turn by turn: each is the previous one plus the
/// model's tool call and the tool's result (and now and then a line of the
/// user's), until the body passes [`TARGET_BYTES`] (`max_turns` stops it
/// earlier).
fn session(format: Format, max_turns: usize) -> Vec<Vec<u8>> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ format as u64);
    let system = "You are a coding agent. Read files with read_file and answer briefly.";
    let task = "Find why the proxy parses the whole body on every turn and fix it.";
    let mut items: Vec<Value> = match format {
        Format::Chat => vec![
            json!({"role": "system", "content": system}),
            json!({"role": "user", "content": task}),
        ],
        Format::Anthropic => vec![json!({"role": "user", "content": task})],
        Format::Responses => vec![json!({"role": "user", "content": task})],
    };
    let mut requests = Vec::new();
    for turn in 0..max_turns {
        let id = format!("call_{turn:04}");
        let args = format!("{{\"path\":\"src/file_{turn}.rs\"}}");
        let output = tool_output(&mut rng);
        match format {
            Format::Chat => {
                items.push(json!({"role": "assistant", "content": "Reading it.", "tool_calls": [
                    {"id": id, "type": "function", "function": {"name": "read_file", "arguments": args}}
                ]}));
                items.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            Format::Anthropic => {
                items.push(json!({"role": "assistant", "content": [
                    {"type": "text", "text": "Reading it."},
                    {"type": "tool_use", "id": id, "name": "read_file",
                     "input": {"path": format!("src/file_{turn}.rs")}}
                ]}));
                items.push(json!({"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": id, "content": output}
                ]}));
            }
            Format::Responses => {
                items.push(
                    json!({"type": "function_call", "call_id": id, "name": "read_file",
                                  "arguments": args}),
                );
                items
                    .push(json!({"type": "function_call_output", "call_id": id, "output": output}));
            }
        }
        if turn % 10 == 9 {
            let note = "Good. Keep going, and mind the tests.";
            items.push(json!({"role": "assistant", "content": "Noted."}));
            items.push(json!({"role": "user", "content": note}));
        }
        let body = match format {
            Format::Chat => json!({"model": "gpt-4o", "messages": items, "stream": true}),
            Format::Anthropic => json!({"model": "claude-sonnet-4-5", "max_tokens": 8192,
                "system": system, "messages": items, "stream": true}),
            Format::Responses => {
                json!({"model": "gpt-5", "instructions": system, "input": items, "stream": true})
            }
        };
        let bytes = serde_json::to_vec(&body).expect("json");
        let done = bytes.len() >= TARGET_BYTES;
        requests.push(bytes);
        if done {
            break;
        }
    }
    requests
}

/// The proxy's stores, as `[cache]` ships them.
struct Stores {
    cache: CompactionCache,
    checkpoints: CheckpointStore,
    prefixes: PrefixCache,
}

/// Which path a turn takes: `Full` is the code before issue 29 (every turn
/// parsed whole: `prefix_max_bytes = 0`), `Resumed` parses only what a
/// turn appends.
#[derive(Clone, Copy, Debug)]
enum Path {
    Full,
    Resumed,
}

impl Stores {
    fn new(path: Path) -> Self {
        Stores {
            cache: CompactionCache::new(64 << 20),
            checkpoints: CheckpointStore::new(16 << 20),
            prefixes: PrefixCache::new(match path {
                Path::Full => 0,
                Path::Resumed => 64 << 20,
            }),
        }
    }

    /// Decides one body as the proxy does; the bytes it would forward.
    fn decide(&self, policy: &CompiledPolicy, format: Format, body: &Received) -> usize {
        let (outcome, _) = compact::decide_decoded(
            &self.cache,
            &self.checkpoints,
            &self.prefixes,
            policy,
            format,
            body,
            100_000,
        )
        .expect("the session compacts");
        outcome.rewritten.as_ref().map_or(body.len(), |b| b.len())
    }
}

/// `body` as the proxy receives a large one: in many frames, gathered into
/// a buffer of its own (made before the turn is timed: receiving is not
/// the decision's work).
fn received(body: &[u8]) -> Received {
    Received::from_vec(body.to_vec())
}

/// This thread's CPU time, in seconds: what the proxy spends, whatever else
/// the machine runs.
fn cpu_seconds() -> f64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
}

/// Minor page faults this thread has taken: touching freshly mapped pages,
/// which the CPU time counts and instruction counts do not show.
fn minor_faults() -> i64 {
    // SAFETY: getrusage writes the rusage it is given; zeroed is a valid one.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_THREAD is this thread's own.
    unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut usage) };
    usage.ru_minflt
}

fn timed<R>(f: impl FnOnce() -> R) -> (R, f64) {
    let (r, seconds, _) = timed_faults(f);
    (r, seconds)
}

/// [`timed`], and the minor page faults taken meanwhile.
fn timed_faults<R>(f: impl FnOnce() -> R) -> (R, f64, i64) {
    let (start, faults) = (cpu_seconds(), minor_faults());
    let r = f();
    (r, cpu_seconds() - start, minor_faults() - faults)
}

fn quick() -> bool {
    std::env::var("INCREMENTAL_QUICK").is_ok_and(|v| v != "0")
}

fn configs() -> Vec<(Format, Mode)> {
    if quick() {
        return vec![(Format::Chat, Mode::Stable)];
    }
    // `INCREMENTAL_ONLY=chat/stable,anthropic/exact`: those alone.
    let only = std::env::var("INCREMENTAL_ONLY").unwrap_or_default();
    let mut all = Vec::new();
    for format in Format::ALL {
        for mode in [Mode::Stable, Mode::Exact] {
            let name = format!("{format}/{}", mode_name(mode));
            if only.is_empty() || only.split(',').any(|o| o == name) {
                all.push((format, mode));
            }
        }
    }
    all
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Stable => "stable",
        Mode::Exact => "exact",
    }
}

/// Least squares of `t = a + b·x + c·y`; (a, b, c).
fn fit(rows: &[(f64, f64, f64)]) -> (f64, f64, f64) {
    // Normal equations, 3x3, solved by Cramer's rule.
    let (mut s, mut m) = ([0f64; 3], [[0f64; 3]; 3]);
    for &(x, y, t) in rows {
        let v = [1.0, x, y];
        for i in 0..3 {
            s[i] += v[i] * t;
            for j in 0..3 {
                m[i][j] += v[i] * v[j];
            }
        }
    }
    let det = |m: [[f64; 3]; 3]| {
        m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
            - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
            + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0])
    };
    let d = det(m);
    let col = |k: usize| {
        let mut c = m;
        for i in 0..3 {
            c[i][k] = s[i];
        }
        det(c) / d
    };
    (col(0), col(1), col(2))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// The session table of one format and mode.
fn table(format: Format, mode: Mode, requests: &[Vec<u8>]) {
    let policy = policy(mode);
    let full = Stores::new(Path::Full);
    let resumed = Stores::new(Path::Resumed);
    let cold_every = if quick() { 20 } else { 10 };
    println!(
        "\n{format} / {}: {} turns to {:.2} MB, budget {BUDGET_CHARS} chars",
        mode_name(mode),
        requests.len(),
        requests.last().map_or(0, Vec::len) as f64 / 1e6
    );
    println!(
        "| turn | body MB | added KB | forwarded KB | warm ms, full parse | warm ms, resumed | cold ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    let (mut rows_full, mut rows_resumed) = (Vec::new(), Vec::new());
    let (mut big_full, mut big_resumed) = (Vec::new(), Vec::new());
    let (mut faults_full, mut faults_resumed) = (Vec::new(), Vec::new());
    let mut prev = 0;
    for (turn, body) in requests.iter().enumerate() {
        let (for_full, for_resumed, for_cold) = (received(body), received(body), received(body));
        let (forwarded, full_s, full_faults) =
            timed_faults(|| full.decide(&policy, format, &for_full));
        let (again, resumed_s, resumed_faults) =
            timed_faults(|| resumed.decide(&policy, format, &for_resumed));
        assert_eq!(forwarded, again, "turn {turn}: both paths forward the same");
        let added = body.len().saturating_sub(prev);
        prev = body.len();
        let cold = (turn % cold_every == cold_every - 1 || turn + 1 == requests.len())
            .then(|| timed(|| Stores::new(Path::Full).decide(&policy, format, &for_cold)).1);
        if turn > 0 {
            let (mb, added_mb) = (body.len() as f64 / 1e6, added as f64 / 1e6);
            rows_full.push((mb, added_mb, full_s * 1e3));
            rows_resumed.push((mb, added_mb, resumed_s * 1e3));
        }
        if (2_300_000..=2_800_000).contains(&body.len()) {
            big_full.push(full_s * 1e3);
            big_resumed.push(resumed_s * 1e3);
            faults_full.push(full_faults as f64);
            faults_resumed.push(resumed_faults as f64);
        }
        if cold.is_some() {
            println!(
                "| {turn} | {:.2} | {:.1} | {:.0} | {:.3} | {:.3} | {:.2} |",
                body.len() as f64 / 1e6,
                added as f64 / 1e3,
                forwarded as f64 / 1e3,
                full_s * 1e3,
                resumed_s * 1e3,
                cold.unwrap_or_default() * 1e3
            );
        }
    }
    for (label, rows, big, faults) in [
        ("full parse", &rows_full, big_full, faults_full),
        ("resumed", &rows_resumed, big_resumed, faults_resumed),
    ] {
        let (a, b, c) = fit(rows);
        let mut sorted = big.clone();
        sorted.sort_by(f64::total_cmp);
        let at = |q: usize| sorted.get(sorted.len() * q / 100).copied().unwrap_or(0.0);
        println!(
            "warm fit, {label}: {a:.3} ms + {b:.3} ms per MB of body + {c:.3} ms per MB added; \
             median warm turn at 2.3-2.8 MB: {:.3} ms ({} turns; p10 {:.3}, p90 {:.3}), \
             {:.0} minor page faults",
            median(big.clone()),
            big.len(),
            at(10),
            at(90),
            median(faults)
        );
    }
    println!(
        "resumed parses: {} hits, {} misses",
        resumed.prefixes.hits(),
        resumed.prefixes.misses()
    );
}

fn tables() {
    if std::env::var("INCREMENTAL_TABLE").is_ok_and(|v| v == "0") {
        return;
    }
    let turns = if quick() { 120 } else { 1000 };
    for (format, mode) in configs() {
        table(format, mode, &session(format, turns));
    }
}

/// The probe turn (the first at least [`PROBE_BYTES`]) and the one before.
fn probe(requests: &[Vec<u8>]) -> (&[u8], &[u8]) {
    let at = requests
        .iter()
        .position(|r| r.len() >= PROBE_BYTES)
        .unwrap_or(requests.len() - 1)
        .max(1);
    (&requests[at - 1], &requests[at])
}

fn turns(c: &mut Criterion) {
    let mut warm = c.benchmark_group("warm_turn");
    warm.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let sessions: Vec<_> = configs()
        .into_iter()
        .map(|(format, mode)| (format, mode, session(format, 1000)))
        .collect();
    for ((format, mode, requests), path) in sessions
        .iter()
        .flat_map(|s| [(s, Path::Full), (s, Path::Resumed)])
    {
        let (before, body) = probe(requests);
        let policy = policy(*mode);
        let id = BenchmarkId::new(
            format!("{format}/{}/{path:?}", mode_name(*mode)),
            body.len(),
        );
        warm.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let stores = Stores::new(path);
                    stores.decide(&policy, *format, &received(before));
                    let body = received(body);
                    let start = std::time::Instant::now();
                    std::hint::black_box(stores.decide(&policy, *format, &body));
                    spent += start.elapsed();
                }
                spent
            })
        });
    }
    warm.finish();
    let mut cold = c.benchmark_group("cold_turn");
    cold.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for (format, mode, requests) in &sessions {
        let (_, body) = probe(requests);
        let policy = policy(*mode);
        let id = BenchmarkId::new(format!("{format}/{}", mode_name(*mode)), body.len());
        cold.bench_function(id, |b| {
            b.iter_custom(|iters| {
                let mut spent = Duration::ZERO;
                for _ in 0..iters {
                    let stores = Stores::new(Path::Full);
                    let body = received(body);
                    let start = std::time::Instant::now();
                    std::hint::black_box(stores.decide(&policy, *format, &body));
                    spent += start.elapsed();
                }
                spent
            })
        });
    }
    cold.finish();
}

criterion_group!(benches, turns);

/// The warm probe turn alone, for callgrind: `INCREMENTAL_PROFILE=chat/stable
/// valgrind --tool=callgrind --toggle-collect='*profiled_turn*' <bench>`
/// counts only the second request of the pair.
#[inline(never)]
fn profiled_turn(
    stores: &Stores,
    policy: &CompiledPolicy,
    format: Format,
    body: &Received,
) -> usize {
    stores.decide(policy, format, body)
}

fn profile(which: &str) {
    let (format, mode) = which.split_once('/').expect("format/mode");
    let format: Format = format.parse().expect("format");
    let mode = if mode == "exact" {
        Mode::Exact
    } else {
        Mode::Stable
    };
    let requests = session(format, 1000);
    let (before, body) = probe(&requests);
    let policy = policy(mode);
    let path = match std::env::var("INCREMENTAL_PATH").as_deref() {
        Ok("full") => Path::Full,
        _ => Path::Resumed,
    };
    let stores = Stores::new(path);
    stores.decide(&policy, format, &received(before));
    let body = &received(body);
    let (forwarded, seconds, faults) =
        timed_faults(|| std::hint::black_box(profiled_turn(&stores, &policy, format, body)));
    println!(
        "{which}: {} bytes after {} bytes, {forwarded} forwarded, {:.3} ms, {faults} minor page faults",
        body.len(),
        before.len(),
        seconds * 1e3
    );
}

fn main() {
    if let Ok(which) = std::env::var("INCREMENTAL_PROFILE") {
        return profile(&which);
    }
    tables();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
