//! A generated benchmark of questions whose words are not the answer's:
//! references to earlier turns, aliases, facts inside old tool results
//! whose subject is only in the call's arguments, values that changed,
//! near-identical distractors, and one cell of an old markdown table.
//! Shared by `benches/relevance.rs` (the full table) and the suite's
//! `relevance_cases` test (a smaller set, the targets asserted).
//!
//! Each case is an OpenAI chat completions body: a system message, a short
//! task, 60-120 messages of ordinary work (a third of them tool calls and
//! their results) of 17k-365k chars, the messages the answer needs in the
//! first half, short recent turns and the question last. Every case is
//! checked to be solvable: the needed messages, the system message and
//! the question alone fit its smallest budget. A case passes a budget when
//! every one of its needles (the answer, and for references, aliases and
//! tables what makes it readable) is still in the forwarded body.
//!
//! Everything comes from one seeded SplitMix64: the same seed, the same
//! bodies, byte for byte.

#![allow(dead_code)]

use compaction_proxy::cache::CheckpointStore;
use compaction_proxy::format::Format;
use compaction_proxy::policy::CompiledPolicy;
use compaction_proxy::proxy::compact::outcome_of;
use serde_json::{json, Value};

/// SplitMix64: small and fixed, so the set never changes under us.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.range(0, items.len() - 1)]
    }

    /// `k` distinct items of `items`.
    pub fn distinct<T: Copy + PartialEq>(&mut self, items: &[T], k: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(k);
        while out.len() < k {
            let x = self.pick(items);
            if !out.contains(&x) {
                out.push(x);
            }
        }
        out
    }
}

/// The six kinds, in report order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    References,
    Aliases,
    ToolResults,
    Updates,
    Distractors,
    Tables,
}

impl Kind {
    pub const ALL: [Kind; 6] = [
        Kind::References,
        Kind::Aliases,
        Kind::ToolResults,
        Kind::Updates,
        Kind::Distractors,
        Kind::Tables,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::References => "references",
            Kind::Aliases => "aliases",
            Kind::ToolResults => "tool results",
            Kind::Updates => "updated values",
            Kind::Distractors => "near-identical distractors",
            Kind::Tables => "table cells",
        }
    }
}

/// One message of a case.
#[derive(Debug, Clone)]
pub enum Msg {
    System(String),
    User(String),
    Assistant(String),
    Call {
        id: String,
        name: String,
        arguments: String,
    },
    Result {
        id: String,
        text: String,
    },
}

impl Msg {
    /// Chars as the pipeline counts them: text, or a call's name and
    /// arguments.
    pub fn chars(&self) -> usize {
        match self {
            Msg::System(t) | Msg::User(t) | Msg::Assistant(t) => t.chars().count(),
            Msg::Call {
                name, arguments, ..
            } => name.chars().count() + arguments.chars().count(),
            Msg::Result { text, .. } => text.chars().count(),
        }
    }

    fn json(&self) -> Value {
        match self {
            Msg::System(t) => json!({"role": "system", "content": t}),
            Msg::User(t) => json!({"role": "user", "content": t}),
            Msg::Assistant(t) => json!({"role": "assistant", "content": t}),
            Msg::Call {
                id,
                name,
                arguments,
            } => json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}
            ]}),
            Msg::Result { id, text } => {
                json!({"role": "tool", "tool_call_id": id, "content": text})
            }
        }
    }
}

/// One generated conversation.
#[derive(Debug, Clone)]
pub struct Case {
    pub kind: Kind,
    pub messages: Vec<Msg>,
    /// The messages the answer needs (the system message and the question
    /// included: the stand-in of the solvability check keeps them too).
    pub needed: Vec<usize>,
    /// What the forwarded body must still hold.
    pub needles: Vec<String>,
}

impl Case {
    pub fn total_chars(&self) -> usize {
        self.messages.iter().map(Msg::chars).sum()
    }

    pub fn needed_chars(&self) -> usize {
        self.needed.iter().map(|&i| self.messages[i].chars()).sum()
    }

    /// The chat completions body.
    pub fn body(&self) -> String {
        let messages: Vec<Value> = self.messages.iter().map(Msg::json).collect();
        json!({"model": "gpt-4o", "messages": messages}).to_string()
    }

    /// Whether a stand-in keeping only the needed messages fits `budget`.
    pub fn solvable(&self, budget: usize) -> bool {
        self.needed_chars() <= budget
    }

    /// Whether `policy` (its budget set to `share` of the case) forwards
    /// every needle.
    pub fn kept(&self, policy: &CompiledPolicy, share: f64) -> bool {
        let body = self.body();
        let mut policy = policy.clone();
        policy.engine.budget_chars = budget_of(self.total_chars(), share);
        let outcome = outcome_of(
            body.as_bytes(),
            &policy,
            Format::Chat,
            usize::MAX,
            // A cold request to a proxy that keeps checkpoints (the
            // shipped `cache.checkpoint_max_bytes`).
            &CheckpointStore::new(1 << 24),
        )
        .expect("a generated body parses");
        let forwarded = match &outcome.rewritten {
            Some(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            None => body,
        };
        let texts = texts_of(&forwarded);
        self.needles.iter().all(|n| texts.contains(n.as_str()))
    }
}

/// The forwarded messages' texts and tool-call arguments, one a line.
fn texts_of(body: &str) -> String {
    let value: Value = serde_json::from_str(body).expect("the forwarded body is JSON");
    let mut out = String::new();
    for m in value["messages"].as_array().into_iter().flatten() {
        if let Some(text) = m["content"].as_str() {
            out.push_str(text);
            out.push('\n');
        }
        for call in m["tool_calls"].as_array().into_iter().flatten() {
            out.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            out.push('\n');
        }
    }
    out
}

/// The char budget of `share` of `total`.
pub fn budget_of(total: usize, share: f64) -> usize {
    (total as f64 * share).floor() as usize
}

/// The smallest budget share the set is measured at.
pub const SMALLEST_SHARE: f64 = 0.10;

const PLACES: &[&str] = &[
    "Halden",
    "Norrby",
    "Kestrel",
    "Vantaa",
    "Moravec",
    "Tindra",
    "Ostrava",
    "Lindqvist",
    "Brisket",
    "Calloway",
    "Dunmore",
    "Everholt",
    "Farrow",
    "Gullane",
    "Hexley",
    "Ingleby",
    "Juniper",
    "Karsten",
    "Lowther",
    "Mirabel",
    "Nettle",
    "Oakhurst",
    "Pellham",
    "Quarry",
    "Rosling",
    "Sandvik",
    "Thornbury",
    "Ulverston",
    "Wexcombe",
    "Yarrow",
];

const SERVICES: &[&str] = &[
    "billing",
    "ledger",
    "courier",
    "search",
    "payments",
    "inventory",
    "notifier",
    "gateway",
    "scheduler",
    "reports",
    "checkout",
    "catalog",
    "identity",
    "pricing",
    "shipping",
    "audit",
];

const ATTRIBUTES: &[&str] = &[
    "locker pin",
    "gate code",
    "alarm code",
    "loading bay",
    "safe combination",
    "dock number",
];

const ADJECTIVES: &[&str] = &[
    "northern",
    "riverside",
    "harbour",
    "hilltop",
    "lakeside",
    "eastern",
    "granite",
    "meadow",
];

const NOUNS: &[&str] = &["depot", "warehouse", "yard", "hub"];

const GREEK: &[&str] = &[
    "ALPHA", "BETA", "GAMMA", "DELTA", "KAPPA", "SIGMA", "OMEGA", "THETA", "ZETA", "LAMBDA",
];

/// Ordinary sentences of the chats around the facts; they share words
/// ("code", "site", "config", "gate", "table") with the facts and questions.
const FILLER: &[&str] = &[
    "I went through the deployment notes again and the rollout plan still looks sound.",
    "The team wants a short summary of the open tickets before the weekly review.",
    "Can you check whether the retry budget is documented anywhere in the repo?",
    "We moved the staging database to the new cluster last week without trouble.",
    "The dashboard shows a small spike in latency around noon, probably the batch job.",
    "Please keep the changelog entries short and in the present tense.",
    "The site survey is done and the report will go out on Monday.",
    "Someone asked about the code review rota; it rotates every second week.",
    "The config loader reads environment variables before the file, so they win.",
    "We agreed to keep the old endpoint alive until the mobile clients migrate.",
    "The gate at the loading area is being repainted, so trucks use the side road.",
    "I updated the table of owners in the wiki, but the on-call page still lags.",
    "The vendor confirmed the new contract terms, nothing changes for the depots.",
    "Our test suite takes eleven minutes on CI; most of it is the integration part.",
    "The pin on the shared calendar was wrong, I fixed the meeting time.",
    "Let me know if the new alerting thresholds are too noisy for the night shift.",
    "The warehouse team asked for a printable version of the shift schedule.",
    "Logs from the last incident are archived in the usual bucket for ninety days.",
    "The status page template needs the new logo and a shorter footer.",
    "I think the cache eviction policy is fine, the misses come from cold starts.",
    "Quarterly numbers will be in the finance table once the books close.",
    "The network team replaced a switch in the server room on Tuesday night.",
    "Documentation for the export job is thin; I will add an example config.",
    "The budget review moved to Thursday because half the team is travelling.",
];

const ROWS_HEADER: &str = "| Site | Q1 | Q2 | Q3 | Q4 |";

/// Filler prose of about `chars` chars.
fn prose(r: &mut Rng, chars: usize) -> String {
    let mut out = String::new();
    while out.len() < chars {
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(r.pick(FILLER));
    }
    out
}

/// Prose of about `chars` chars with `fact` somewhere inside.
fn prose_with(r: &mut Rng, chars: usize, fact: &str) -> String {
    let before = r.range(0, chars);
    let after = chars.saturating_sub(before);
    let mut out = prose(r, before);
    if !out.is_empty() {
        out.push(' ');
    }
    out.push_str(fact);
    if after > 0 {
        out.push(' ');
        out.push_str(&prose(r, after));
    }
    out
}

fn code(r: &mut Rng) -> String {
    format!("{}-{}", r.range(1000, 9999), r.pick(GREEK))
}

/// Lines of a filler tool output, about `chars` chars.
fn log_lines(r: &mut Rng, chars: usize, service: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut size = 0;
    while size < chars {
        let line = format!(
            "2026-03-{:02}T{:02}:{:02}:{:02}Z INFO {} request handled in {} ms, queue depth {}",
            r.range(1, 28),
            r.range(0, 23),
            r.range(0, 59),
            r.range(0, 59),
            service,
            r.range(2, 900),
            r.range(0, 40)
        );
        size += line.len() + 1;
        lines.push(line);
    }
    lines
}

/// A tool output of `lines` with `fact_line` in its middle third.
fn with_line_inside(r: &mut Rng, mut lines: Vec<String>, fact_line: String) -> String {
    let n = lines.len();
    let at = if n < 3 {
        n / 2
    } else {
        r.range(n / 3, 2 * n / 3)
    };
    lines.insert(at, fact_line);
    lines.join("\n")
}

/// The parts of a case before it is laid out: the old messages it needs,
/// old distractors, the recent turns and the question.
struct Plan {
    /// Old messages the answer needs, in order, with their needles.
    needed: Vec<Vec<Msg>>,
    /// Old messages that look like the needed ones but are not.
    distractors: Vec<Vec<Msg>>,
    /// Recent turns before the question (short).
    recent: Vec<Msg>,
    question: String,
    needles: Vec<String>,
    /// Whether `needed` must stay in its order (an update after its
    /// first value).
    ordered: bool,
}

struct Ids(usize);

impl Ids {
    fn next(&mut self) -> String {
        self.0 += 1;
        format!("call_{:04}", self.0)
    }
}

fn call(ids: &mut Ids, name: &str, arguments: Value, text: String) -> Vec<Msg> {
    let id = ids.next();
    vec![
        Msg::Call {
            id: id.clone(),
            name: name.into(),
            arguments: arguments.to_string(),
        },
        Msg::Result { id, text },
    ]
}

/// Generates `per_kind` cases of each kind from `seed`.
pub fn generate(seed: u64, per_kind: usize) -> Vec<Case> {
    let mut r = Rng::new(seed);
    let mut cases = Vec::with_capacity(per_kind * Kind::ALL.len());
    for k in 0..per_kind {
        for kind in Kind::ALL {
            cases.push(case(&mut r, kind, k));
        }
    }
    cases
}

fn case(r: &mut Rng, kind: Kind, k: usize) -> Case {
    // Sizes spread over 17k..365k: 60-120 messages of 280..3,000 chars on
    // average, log-uniform.
    let count = r.range(60, 120);
    let log_lo = (17_500.0f64 / count as f64).ln();
    let log_hi = (360_000.0f64 / count as f64).ln();
    let t = (r.next_u64() % 10_000) as f64 / 10_000.0;
    let average = (log_lo + t * (log_hi - log_lo)).exp() as usize;
    let total = average * count;
    // A needed message may take this much: with the question and the
    // system message it fits the smallest budget.
    let mut room = (budget_of(total, SMALLEST_SHARE) * 3 / 4).saturating_sub(400);
    loop {
        let mut ids = Ids(k * 1000);
        let plan = plan(r, kind, room, &mut ids);
        let case = lay_out(r, kind, plan, count, average, &mut ids);
        // Sizes are aimed at, not exact: a case that came out too large
        // for its smallest budget is made again with smaller parts.
        if case.solvable(budget_of(case.total_chars(), SMALLEST_SHARE)) || room < 200 {
            return case;
        }
        room = room * 3 / 4;
    }
}

fn plan(r: &mut Rng, kind: Kind, room: usize, ids: &mut Ids) -> Plan {
    let places = r.distinct(PLACES, 5);
    let (place, others) = (places[0], &places[1..]);
    let attribute = r.pick(ATTRIBUTES);
    let value = code(r);
    // Each needed message of a case takes at most `share` of the room.
    let sized = |parts: usize| room / parts;
    match kind {
        Kind::References => {
            let fact = format!("Site notes for {place}: the {attribute} is {value}, and deliveries use the east entrance.");
            let needed = vec![vec![Msg::Assistant(prose_with(
                r,
                sized(1).min(1_500),
                &fact,
            ))]];
            let distractors = others
                .iter()
                .map(|o| {
                    let v = code(r);
                    let text = format!("Site notes for {o}: the {attribute} is {v}, and deliveries use the east entrance.");
                    vec![Msg::Assistant(prose_with(r, 600, &text))]
                })
                .collect();
            let named = format!("Let's go back to the {place} site for a moment.");
            let recent = vec![
                Msg::User(named.clone()),
                Msg::Assistant(format!(
                    "Sure. {place} is one of the smaller sites; the team there works early shifts."
                )),
            ];
            let question = r
                .pick(&[
                    "And what was its {a} again?",
                    "Which {a} does that one use?",
                    "What is the {a} there?",
                ])
                .replace("{a}", attribute);
            Plan {
                needed,
                distractors,
                recent,
                question,
                needles: vec![value, named],
                ordered: false,
            }
        }
        Kind::Aliases => {
            let alias = format!("{} {}", r.pick(ADJECTIVES), r.pick(NOUNS));
            let definition = r
                .pick(&[
                    "{p}, also known as the {a}, takes the late deliveries.",
                    "Everyone calls it the {a}: {p} (aka the {a}) is where the spare parts go.",
                    "Note that {p} is known as the {a} among the drivers.",
                ])
                .replace("{p}", place)
                .replace("{a}", &alias);
            // Both directions: the fact under the real name and the
            // question by the alias, or the other way round.
            let by_alias = k_flip(r);
            let (stated, asked) = if by_alias {
                (place.to_owned(), format!("the {alias}"))
            } else {
                (format!("the {alias}"), place.to_owned())
            };
            let fact = format!("The {attribute} for {stated} is {value}.");
            let needed = vec![
                vec![Msg::User(prose_with(r, sized(2).min(900), &definition))],
                vec![Msg::Assistant(prose_with(r, sized(2).min(900), &fact))],
            ];
            let distractors = others
                .iter()
                .map(|o| {
                    let v = code(r);
                    vec![Msg::Assistant(prose_with(
                        r,
                        500,
                        &format!("The {attribute} for {o} is {v}."),
                    ))]
                })
                .collect();
            Plan {
                needed,
                distractors,
                recent: Vec::new(),
                question: format!("What is the {attribute} for {asked}?"),
                needles: vec![value, definition],
                ordered: false,
            }
        }
        Kind::ToolResults => {
            let services = r.distinct(SERVICES, 4);
            let service = services[0];
            let (needed, question, needle) = match r.range(0, 3) {
                0 => {
                    // A config file: the service is only in the path.
                    let limit = r.range(100, 9_999);
                    let fact = format!("max_connections = {limit}");
                    let text = config_file(r, sized(1), Some(&fact));
                    let args = json!({"path": format!("deploy/{service}/limits.toml")});
                    (
                        call(ids, "read_file", args, text),
                        format!("What is max_connections in the {service} limits config?"),
                        fact,
                    )
                }
                1 => {
                    // A directory listing: the service is only in the path.
                    let archive = format!("snapshot-{}.tar.gz", code(r).to_lowercase());
                    let lines = listing(r, sized(1));
                    let fact = format!("-rw-r--r-- 1 deploy deploy 48211 Mar 14 02:10 {archive}");
                    let text = with_line_inside(r, lines, fact);
                    let args = json!({"path": format!("/srv/{service}/backups")});
                    (
                        call(ids, "list_dir", args, text),
                        format!("Which snapshot archive is in the {service} backups directory?"),
                        archive,
                    )
                }
                2 => {
                    // Status JSON: the service is only in the arguments.
                    let version =
                        format!("v{}.{}.{}", r.range(1, 9), r.range(0, 30), r.range(0, 99));
                    let text = status_json(r, sized(1), &version);
                    let args = json!({"service": service});
                    (
                        call(ids, "get_status", args, text),
                        format!("What version is {service} running according to its status check?"),
                        format!("\"version\": \"{version}\""),
                    )
                }
                _ => {
                    // A log: the error line names no service.
                    let error = format!("E{}", r.range(1000, 9999));
                    let lines = log_lines(r, sized(1), "worker");
                    let fact = format!(
                        "2026-03-14T02:11:09Z ERROR upstream refused the batch, code {error}"
                    );
                    let text = with_line_inside(r, lines, fact);
                    let args = json!({"service": service, "lines": 200});
                    (
                        call(ids, "tail_log", args, text),
                        format!("Which error code did the {service} log show?"),
                        format!("code {error}"),
                    )
                }
            };
            let distractors = services[1..]
                .iter()
                .map(|s| {
                    let limit = r.range(100, 9_999);
                    let text = config_file(r, 1_200, Some(&format!("max_connections = {limit}")));
                    call(
                        ids,
                        "read_file",
                        json!({"path": format!("deploy/{s}/limits.toml")}),
                        text,
                    )
                })
                .collect();
            Plan {
                needed: vec![needed],
                distractors,
                recent: Vec::new(),
                question,
                needles: vec![needle],
                ordered: false,
            }
        }
        Kind::Updates => {
            let first = r.range(10, 60);
            let latest = first + r.range(1, 20);
            let needed = vec![vec![Msg::Assistant(prose_with(
                r,
                sized(1).min(900),
                &format!("Update: the headcount at {place} is now {latest} after the new hires."),
            ))]];
            let mut distractors: Vec<Vec<Msg>> = vec![vec![Msg::Assistant(prose_with(
                r,
                700,
                &format!("The headcount at {place} is {first}."),
            ))]];
            for o in others {
                let n = r.range(10, 80);
                distractors.push(vec![Msg::Assistant(prose_with(
                    r,
                    500,
                    &format!("The headcount at {o} is {n}."),
                ))]);
            }
            Plan {
                needed,
                distractors,
                recent: Vec::new(),
                question: format!("What is the current headcount at {place}?"),
                needles: vec![format!("is now {latest} after")],
                ordered: true,
            }
        }
        Kind::Distractors => {
            let fact = format!("The backup {attribute} for depot {place} is {value}.");
            let needed = vec![vec![Msg::Assistant(prose_with(
                r,
                sized(1).min(900),
                &fact,
            ))]];
            let mut distractors = Vec::new();
            for text in [
                format!("The main {attribute} for depot {place} is {}.", code(r)),
                format!(
                    "The backup {attribute} for depot {} is {}.",
                    others[0],
                    code(r)
                ),
                format!(
                    "The backup {attribute} for depot {} is {}.",
                    others[1],
                    code(r)
                ),
                format!(
                    "The old backup {attribute} for depot {} was {}.",
                    others[2],
                    code(r)
                ),
            ] {
                distractors.push(vec![Msg::Assistant(prose_with(r, 500, &text))]);
            }
            Plan {
                needed,
                distractors,
                recent: Vec::new(),
                question: format!("What is the backup {attribute} for depot {place}?"),
                needles: vec![value],
                ordered: false,
            }
        }
        Kind::Tables => {
            let rows = (sized(1).min(3_000) / 42).clamp(6, 80);
            let mut names: Vec<String> = Vec::with_capacity(rows);
            for i in 0..rows {
                names.push(if i == 0 {
                    place.to_owned()
                } else {
                    format!("{} {}", r.pick(PLACES), i)
                });
            }
            let target = r.range(rows / 3, rows - 1);
            names.swap(0, target);
            let mut lines = vec![ROWS_HEADER.to_owned(), "|---|---|---|---|---|".to_owned()];
            let mut row_of_place = String::new();
            for name in &names {
                let row = format!(
                    "| {name} | {} | {} | {} | {} |",
                    r.range(100, 999),
                    r.range(100, 999),
                    r.range(100, 999),
                    r.range(100, 999)
                );
                if name == place {
                    row_of_place = row.clone();
                }
                lines.push(row);
            }
            let table = format!("Here are the quarterly shipment counts per site:\n\n{}\n\nTell me if you need another breakdown.", lines.join("\n"));
            Plan {
                needed: vec![vec![Msg::Assistant(table)]],
                distractors: Vec::new(),
                recent: Vec::new(),
                question: format!("In that quarterly table, what was the Q3 count for {place}?"),
                needles: vec![row_of_place, ROWS_HEADER.to_owned()],
                ordered: false,
            }
        }
    }
}

/// A coin flip.
fn k_flip(r: &mut Rng) -> bool {
    r.next_u64() & 1 == 1
}

/// A TOML config of about `chars` chars, `fact` among its keys.
fn config_file(r: &mut Rng, chars: usize, fact: Option<&str>) -> String {
    const KEYS: &[&str] = &[
        "timeout_ms",
        "retry_budget",
        "pool_size",
        "queue_depth",
        "batch_size",
        "idle_secs",
        "max_body_kb",
        "workers",
    ];
    let mut lines = vec!["[limits]".to_owned()];
    let mut size = 0;
    let mut section = 0;
    while size < chars {
        let line = if lines.len() % 9 == 0 {
            section += 1;
            format!("\n[limits.tier{section}]")
        } else {
            format!("{} = {}", r.pick(KEYS), r.range(1, 5_000))
        };
        size += line.len() + 1;
        lines.push(line);
    }
    match fact {
        Some(fact) => with_line_inside(r, lines, fact.to_owned()),
        None => lines.join("\n"),
    }
}

/// A directory listing of about `chars` chars.
fn listing(r: &mut Rng, chars: usize) -> Vec<String> {
    let mut lines = vec![format!("total {}", r.range(100, 9_000))];
    let mut size = 0;
    while size < chars {
        let line = format!(
            "-rw-r--r-- 1 deploy deploy {:>6} Mar {:02} {:02}:{:02} wal-{:08x}.log",
            r.range(1_000, 999_999),
            r.range(1, 28),
            r.range(0, 23),
            r.range(0, 59),
            r.next_u64() as u32
        );
        size += line.len() + 1;
        lines.push(line);
    }
    lines
}

/// A status JSON of about `chars` chars holding `version`.
fn status_json(r: &mut Rng, chars: usize, version: &str) -> String {
    let mut checks = Vec::new();
    let mut size = 0;
    while size < chars {
        let check = json!({"check": format!("probe_{}", checks.len()), "ok": true, "latency_ms": r.range(1, 400)});
        size += check.to_string().len() + 4;
        checks.push(check);
    }
    let at = checks.len() / 2;
    let mut text = String::from("{\n  \"checks\": [\n");
    for (i, c) in checks.iter().enumerate() {
        if i == at {
            text.push_str(&format!(
                "    {{\"version\": \"{version}\", \"uptime_h\": {}}},\n",
                r.range(1, 900)
            ));
        }
        text.push_str(&format!("    {c},\n"));
    }
    text.push_str("    {}\n  ]\n}");
    text
}

/// The conversation: system, task, old work with the plan's messages in
/// the first half, recent short turns, the question.
fn lay_out(
    r: &mut Rng,
    kind: Kind,
    plan: Plan,
    count: usize,
    average: usize,
    ids: &mut Ids,
) -> Case {
    let mut messages = vec![
        Msg::System("You are an operations assistant for a logistics company.".into()),
        Msg::User("Help me keep track of our sites, services and numbers today.".into()),
    ];
    let tail = 4 + plan.recent.len();
    let body = count.saturating_sub(messages.len() + tail);
    let half = body / 2;
    // Old slots for the plan's groups: needed and distractors, in the
    // first half (needed ones first, then shuffled by their positions).
    let mut groups: Vec<(Vec<Msg>, bool)> = plan
        .needed
        .into_iter()
        .map(|g| (g, true))
        .chain(plan.distractors.into_iter().map(|g| (g, false)))
        .collect();
    let mut slots: Vec<usize> = (0..groups.len()).map(|_| r.range(2, half.max(3))).collect();
    slots.sort_unstable();
    if !plan.ordered {
        // Shuffle which group takes which slot.
        for i in (1..groups.len()).rev() {
            let j = r.range(0, i);
            groups.swap(i, j);
        }
    } else {
        // An update comes after its first value: the needed (latest)
        // group goes last.
        groups.rotate_left(1);
    }
    let mut needed = vec![0];
    let mut next_group = 0;
    let mut k = 0;
    while k < body {
        while next_group < groups.len() && slots[next_group] <= k {
            let (group, is_needed) = &groups[next_group];
            for m in group {
                if *is_needed {
                    needed.push(messages.len());
                }
                messages.push(m.clone());
            }
            k += group.len();
            next_group += 1;
        }
        // Filler: a third are tool calls with their results.
        if r.range(0, 2) == 0 {
            let service = r.pick(SERVICES);
            let size = r.range(average / 2, average * 3 / 2);
            let lines = log_lines(r, size, service);
            let mut pair = call(
                ids,
                "tail_log",
                json!({"service": service, "lines": 100}),
                lines.join("\n"),
            );
            messages.append(&mut pair);
            k += 2;
        } else {
            let size = r.range(average / 2, average * 3 / 2);
            messages.push(if k % 2 == 0 {
                Msg::User(prose(r, size.min(1_200)))
            } else {
                Msg::Assistant(prose(r, size))
            });
            k += 1;
        }
    }
    // Recent short turns, then the plan's own, then the question.
    for _ in 0..2 {
        messages.push(Msg::User(prose(r, 120)));
        messages.push(Msg::Assistant(prose(r, 160)));
    }
    messages.extend(plan.recent);
    needed.push(messages.len());
    messages.push(Msg::User(plan.question));
    let _ = kind;
    Case {
        kind,
        messages,
        needed,
        needles: plan.needles,
    }
}

/// Share of `cases` of `kind` (all kinds: `None`) that `policy` keeps at
/// `share`.
pub fn retention(cases: &[Case], kind: Option<Kind>, policy: &CompiledPolicy, share: f64) -> f64 {
    let chosen: Vec<&Case> = cases
        .iter()
        .filter(|c| kind.map_or(true, |k| c.kind == k))
        .collect();
    let kept = chosen.iter().filter(|c| c.kept(policy, share)).count();
    kept as f64 / chosen.len().max(1) as f64
}

/// The shipped default policy: `[policies.default]` of the embedded
/// configuration, as the binary runs it with no file.
pub fn default_policy() -> CompiledPolicy {
    let runtime = compaction_proxy::policy::Runtime::load_text(
        None,
        std::iter::empty(),
        &compaction_proxy::config::Overrides::default(),
    )
    .expect("the embedded configuration loads");
    (*runtime.policy("default").expect("a default policy")).clone()
}

/// `policy` with `scoring = "relevance"` at its default knobs (unchanged
/// when it scores by relevance already).
pub fn with_relevance(policy: &CompiledPolicy) -> CompiledPolicy {
    use compaction_proxy::engine::{RelevancePolicy, ScoringMethod};
    let mut policy = policy.clone();
    if policy.engine.scoring == ScoringMethod::Seed {
        policy.engine.scoring = ScoringMethod::Relevance(RelevancePolicy::default());
    }
    policy
}

/// The budget shares the set is reported at.
pub const SHARES: [f64; 3] = [0.50, 0.25, 0.10];

/// The per-kind table of `policy` on `cases`, as markdown rows: one per
/// kind, then the overall share.
pub fn table(cases: &[Case], policy: &CompiledPolicy) -> Vec<(String, [f64; 3])> {
    let mut rows = Vec::new();
    for kind in Kind::ALL.map(Some).into_iter().chain([None]) {
        let cells = SHARES.map(|share| retention(cases, kind, policy, share));
        rows.push((kind.map_or("overall", Kind::name).to_owned(), cells));
    }
    rows
}

/// `rows` as a markdown table.
pub fn markdown(rows: &[(String, [f64; 3])]) -> String {
    let mut out = String::from("| kind | 50% | 25% | 10% |\n|---|---|---|---|\n");
    for (name, cells) in rows {
        out.push_str(&format!(
            "| {name} | {:.2} | {:.2} | {:.2} |\n",
            cells[0], cells[1], cells[2]
        ));
    }
    out
}
