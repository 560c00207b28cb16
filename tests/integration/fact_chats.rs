//! A generated fact-retention set: chats with facts planted early and a
//! final question about one of them, to measure whether a compaction
//! strategy still forwards the asked fact. Shared by the retention test
//! (`relevance_retention.rs`) and `benches/relevance.rs` (which includes
//! this file by path), so it uses nothing but the library.
//!
//! Each chat: a system message, then 79 user/assistant/tool messages of
//! 60..650 chars from a bank of sentences about everyday project work
//! (which shares words like "code", "server", "file", "room" with the
//! facts). Five facts are planted in the first half, each inside an
//! ordinary message at its start, middle or end. Facts of the same kind
//! about different entities, and messages about the asked fact's entity or
//! attribute that do not hold it, are the distractors. The question is
//! either direct (the fact's own words) or a paraphrase that shares only the
//! entity and one or two words with the fact. Everything comes from one
//! seeded SplitMix64: the same seed gives the same chats.

use compaction_proxy::engine::{compact, Message, Policy, RelevancePolicy, Role, ScoringMethod};

/// SplitMix64: small, fast and fixed, so the set never changes under us.
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

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    pub fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// One kind of fact: how it is stated, asked and paraphrased. `{e}` is the
/// entity, `{v}` the value.
struct Kind {
    statements: &'static [&'static str],
    direct: &'static [&'static str],
    paraphrases: &'static [&'static str],
    /// Sentences about the entity or the attribute that do not hold the value.
    distractors: &'static [&'static str],
    value: fn(&mut Rng, &str) -> String,
}

const GREEK: &[&str] = &[
    "ALPHA", "BETA", "GAMMA", "DELTA", "KAPPA", "SIGMA", "OMEGA", "THETA", "ZETA", "LAMBDA",
];

fn code_value(r: &mut Rng, _: &str) -> String {
    format!("{}-{}", 1000 + r.below(9000), r.pick(GREEK))
}
fn password_value(r: &mut Rng, _: &str) -> String {
    format!(
        "{}{}!{}",
        r.pick(&["Blue", "Quiet", "Amber", "Salt", "Iron"]),
        r.pick(&["Fox", "Harbor", "Maple", "Comet"]),
        10 + r.below(90)
    )
}
fn invoice_value(r: &mut Rng, _: &str) -> String {
    format!("INV-{}-{:05}", 2019 + r.below(6), r.below(100_000))
}
fn ip_value(r: &mut Rng, _: &str) -> String {
    format!("10.{}.{}.{}", r.below(256), r.below(256), 1 + r.below(254))
}
fn room_value(r: &mut Rng, _: &str) -> String {
    format!("{}-{}", r.pick(&["B", "C", "D", "N"]), 100 + r.below(400))
}
fn tracking_value(r: &mut Rng, _: &str) -> String {
    format!("1Z{:08}{}", r.below(100_000_000), r.pick(GREEK))
}
fn variable_value(r: &mut Rng, e: &str) -> String {
    format!("{}_TOKEN_{}", e.to_uppercase(), 10 + r.below(90))
}
fn path_value(r: &mut Rng, e: &str) -> String {
    format!(
        "config/{}/{}.toml",
        e.to_lowercase(),
        r.pick(&["retry", "limits", "net", "policy"])
    )
}

const KINDS: &[Kind] = &[
    Kind {
        statements: &[
            "The gate code for depot {e} is {v}.",
            "For depot {e} the gate code is now {v}, drivers need it after six.",
        ],
        direct: &["What is the gate code for depot {e}?"],
        paraphrases: &[
            "Remind me, which code opens the {e} entrance?",
            "I am standing outside {e}, what code do I type?",
        ],
        distractors: &[
            "Depot {e} closes at six on Fridays and the yard lights switch off early.",
            "The gate at the depot was repainted and the code panel got a new cover.",
        ],
        value: code_value,
    },
    Kind {
        statements: &[
            "The wifi password at the {e} office is {v}.",
            "Guests at the {e} office can use the wifi password {v}.",
        ],
        direct: &["What is the wifi password at the {e} office?"],
        paraphrases: &[
            "What's the password for the wireless network in {e}?",
            "How do visitors get online at {e}, which password?",
        ],
        distractors: &[
            "The {e} office moved to the third floor and the printer is by the window.",
            "Password rotation for the office wifi happens every quarter.",
        ],
        value: password_value,
    },
    Kind {
        statements: &[
            "Invoice {v} for the {e} account was paid on March 3.",
            "We paid the {e} account with invoice {v} last week.",
        ],
        direct: &["Which invoice number belongs to the {e} account?"],
        paraphrases: &[
            "What was the number on the bill we paid for {e}?",
            "Which reference did {e} get for their payment?",
        ],
        distractors: &[
            "The {e} account manager asked for a copy of the contract.",
            "Invoices are numbered by year and paid within thirty days.",
        ],
        value: invoice_value,
    },
    Kind {
        statements: &[
            "The staging server for project {e} runs at {v}.",
            "Project {e} staging lives on {v} behind the VPN.",
        ],
        direct: &["Where does the staging server for project {e} run?"],
        paraphrases: &[
            "What address should I use to reach {e} staging?",
            "Which host is the {e} test environment on?",
        ],
        distractors: &[
            "Project {e} had its demo postponed to next sprint.",
            "The staging server was rebooted overnight after the kernel update.",
        ],
        value: ip_value,
    },
    Kind {
        statements: &[
            "The kickoff with {e} is scheduled in room {v}.",
            "We booked room {v} for the {e} kickoff on Tuesday.",
        ],
        direct: &["Which room is the kickoff with {e} in?"],
        paraphrases: &[
            "Where is our {e} kickoff meeting?",
            "Where do I go for the {e} session on Tuesday?",
        ],
        distractors: &[
            "{e} sent the agenda and asked for a projector.",
            "Room bookings for the kickoff week are almost full.",
        ],
        value: room_value,
    },
    Kind {
        statements: &[
            "The parcel for {e} ships with tracking number {v}.",
            "{e}'s parcel left the warehouse, tracking number {v}.",
        ],
        direct: &["What is the tracking number of the {e} parcel?"],
        paraphrases: &[
            "How can I follow the {e} shipment?",
            "Has the {e} package shipped, and how do I track it?",
        ],
        distractors: &[
            "{e} asked whether we can ship faster next time.",
            "Parcels leave the warehouse at four, tracking numbers come by mail.",
        ],
        value: tracking_value,
    },
    Kind {
        statements: &[
            "Project {e} reads its API token from the variable {v}.",
            "Set {v} before starting {e}, that is where it reads its token.",
        ],
        direct: &["Which variable holds the API token for project {e}?"],
        paraphrases: &[
            "Where does {e} get its token from?",
            "What do I export so {e} finds its credentials token?",
        ],
        distractors: &[
            "Project {e} switched its logging to JSON lines.",
            "API tokens expire after ninety days and must be rotated.",
        ],
        value: variable_value,
    },
    Kind {
        statements: &[
            "The retry limit for {e} is set in {v}.",
            "{e} takes its retry limit from {v}, not from the environment.",
        ],
        direct: &["Where is the retry limit for {e} set?"],
        paraphrases: &[
            "Which file controls how often {e} retries?",
            "How do I change the number of retries {e} does?",
        ],
        distractors: &[
            "{e} timed out twice yesterday during the load test.",
            "A retry limit that is too high hides real outages.",
        ],
        value: path_value,
    },
];

const ENTITIES: &[&str] = &[
    "Norrby",
    "Sundby",
    "Kestrel",
    "Halden",
    "Mistral",
    "Orchid",
    "Tamsin",
    "Brevik",
    "Caldera",
    "Dunmore",
    "Elkhorn",
    "Falster",
    "Granby",
    "Harrow",
    "Ivybridge",
    "Juniper",
    "Kilbride",
    "Larkspur",
    "Marlow",
    "Nettle",
    "Oakhurst",
    "Pembrey",
    "Quarry",
    "Redwing",
    "Selkirk",
    "Thornbury",
    "Umber",
    "Vantor",
    "Westmere",
    "Yarrow",
];

/// Everyday project chatter, sharing some words with the facts.
const FILLER: &[&str] = &[
    "I pushed the refactor to the branch and the build is green again.",
    "Can you review the code in the parser module before lunch?",
    "The server logs show a spike of timeouts around noon.",
    "We should move the meeting to the small room, the big one is taken.",
    "The file upload limit is still ten megabytes on production.",
    "Customer support reported two tickets about slow page loads.",
    "Let's keep the numbers in the quarterly report as they are.",
    "The new laptop arrived, I am setting it up this afternoon.",
    "The test suite takes eleven minutes now, mostly integration tests.",
    "Marketing wants the release notes by Thursday morning.",
    "I added a retry around the flaky network call in the importer.",
    "The design team shared new icons for the settings page.",
    "Please double check the time zone handling in the scheduler.",
    "The database migration ran cleanly on the staging copy.",
    "Our cloud bill went down after we removed the idle instances.",
    "The onboarding doc needs a section about access requests.",
    "I could not reproduce the crash on my machine.",
    "The vendor sent a new price list with a small increase.",
    "We agreed to freeze features two days before the release.",
    "The dashboard now shows latency per region.",
    "Someone left the coffee machine on all weekend again.",
    "The security scan flagged an old version of the XML library.",
    "Let's pair on the caching bug tomorrow at ten.",
    "The office will be closed on the public holiday next Monday.",
    "I renamed the config option to make its meaning clearer.",
    "Our error budget for the month is nearly used up.",
    "The interns finished the accessibility audit of the forms.",
    "The API returns a 429 when the client sends too many requests.",
    "We need a decision on the logo colours by Friday.",
    "The backup job finished at three with no warnings.",
    "Traffic from the mobile app doubled after the campaign.",
    "The contract renewal is waiting on legal review.",
    "I wrote a small script to clean up stale branches.",
    "The printer on the second floor is out of toner.",
    "Memory use of the worker grows slowly over a day.",
    "The code freeze starts on the fifteenth.",
    "The translation files are missing a few German strings.",
    "The load balancer health check interval is thirty seconds.",
    "We should write down who owns each alert.",
    "The team lunch is booked for Wednesday at noon.",
];

const TOOL_FILLER: &[&str] = &[
    "exit code 0; 214 tests passed, 0 failed, 3 skipped",
    "GET /api/v2/orders?page=3 -> 200 OK in 412 ms",
    "disk usage: /var 71%, /home 38%, /tmp 4%",
    "build #5521 finished: artifacts uploaded to the bucket",
    "grep: 17 matches in src/handlers across 6 files",
    "cron: nightly report generated, 3 warnings about missing rows",
];

/// One generated chat and the two ways of asking about its fact.
pub struct FactChat {
    /// The history before the question (the question is appended per run).
    pub history: Vec<Message<'static>>,
    pub direct: String,
    pub paraphrase: String,
    /// The asked fact's value: forwarded iff some output content holds it.
    pub answer: String,
}

impl FactChat {
    /// The full chat: the history and then `question` as the last message.
    pub fn with_question(&self, question: &str) -> Vec<Message<'static>> {
        let mut messages = self.history.clone();
        messages.push(Message::new(Role::User, question));
        messages
    }
}

fn fill(template: &str, entity: &str, value: &str) -> String {
    template.replace("{e}", entity).replace("{v}", value)
}

/// `count` chats of 80 messages (81 with the question) from `seed`.
pub fn generate(seed: u64, count: usize) -> Vec<FactChat> {
    let mut rng = Rng::new(seed);
    (0..count).map(|_| one_chat(&mut rng)).collect()
}

fn filler_text(rng: &mut Rng, role: Role, target_chars: usize) -> String {
    let bank = if role == Role::Tool {
        TOOL_FILLER
    } else {
        FILLER
    };
    let mut text = String::new();
    while text.chars().count() < target_chars {
        if !text.is_empty() {
            text.push(if role == Role::Tool { '\n' } else { ' ' });
        }
        text.push_str(rng.pick(bank));
    }
    text
}

fn one_chat(rng: &mut Rng) -> FactChat {
    const LENGTH: usize = 80;
    let mut history = vec![Message::new(
        Role::System,
        "You are a helpful assistant for an operations team. Answer briefly.",
    )];
    let roles: Vec<Role> = (1..LENGTH)
        .map(|i| match (i % 2, rng.below(6)) {
            (1, _) => Role::User,
            (_, 0) => Role::Tool,
            _ => Role::Assistant,
        })
        .collect();
    for &role in &roles {
        let target = 60 + rng.below(590);
        history.push(Message::new(role, filler_text(rng, role, target)));
    }

    // Five facts at distinct positions in the first half (never the system
    // message, never a tool message), with distinct entities; kinds may
    // repeat, which makes the same-kind facts each other's distractors.
    let mut entities: Vec<&str> = Vec::new();
    while entities.len() < 5 {
        let e = rng.pick(ENTITIES);
        if !entities.contains(&e) {
            entities.push(e);
        }
    }
    let mut positions: Vec<usize> = Vec::new();
    while positions.len() < 5 {
        let p = 1 + rng.below(LENGTH / 2 - 1);
        if !positions.contains(&p) && history[p].role != Role::Tool {
            positions.push(p);
        }
    }
    let mut facts = Vec::new();
    for (&entity, &at) in entities.iter().zip(&positions) {
        let kind = &KINDS[rng.below(KINDS.len())];
        let value = (kind.value)(rng, entity);
        let statement = fill(rng.pick(kind.statements), entity, &value);
        embed(rng, history[at].content.to_mut(), &statement);
        facts.push((kind, entity, value));
    }
    let (kind, entity, answer) = &facts[rng.below(facts.len())];

    // Distractors about the asked fact, anywhere in the history after the
    // system message (tool messages included).
    for template in kind.distractors {
        let at = 1 + rng.below(LENGTH - 1);
        embed(
            rng,
            history[at].content.to_mut(),
            &fill(template, entity, ""),
        );
    }

    FactChat {
        history,
        direct: fill(rng.pick(kind.direct), entity, answer),
        paraphrase: fill(rng.pick(kind.paraphrases), entity, answer),
        answer: answer.clone(),
    }
}

/// Puts `sentence` at the start, middle (between sentences) or end of `text`.
fn embed(rng: &mut Rng, text: &mut String, sentence: &str) {
    let boundaries: Vec<usize> = text.match_indices(". ").map(|(i, _)| i + 2).collect();
    let at = match rng.below(3) {
        0 => 0,
        1 if !boundaries.is_empty() => boundaries[boundaries.len() / 2],
        _ => text.len(),
    };
    let mut insert = sentence.to_owned();
    if at == 0 {
        insert.push(' ');
    } else if at == text.len() {
        insert.insert(0, ' ');
    } else {
        insert.push(' ');
    }
    text.insert_str(at, &insert);
}

/// How a history is compacted in the comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    /// The engine with the spec's scoring and defaults.
    Seed,
    /// The engine with `scoring = "relevance"` and every other key default.
    Relevance,
    /// What most gateways do: the system message and the longest tail of
    /// messages that fits.
    KeepLast,
}

impl Strategy {
    pub const ALL: [Strategy; 3] = [Strategy::Seed, Strategy::Relevance, Strategy::KeepLast];

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Seed => "seed engine",
            Strategy::Relevance => "relevance (defaults)",
            Strategy::KeepLast => "keep-last truncation",
        }
    }
}

fn chars(m: &Message) -> usize {
    m.content.chars().count()
}

/// The engine policy of a strategy for a budget.
pub fn policy(strategy: Strategy, budget_chars: usize) -> Policy {
    let mut policy = Policy::with_budget(budget_chars);
    if strategy == Strategy::Relevance {
        policy.scoring = ScoringMethod::Relevance(RelevancePolicy::default());
    }
    policy
}

/// Whether compacting `messages` to `share` of their chars under `strategy`
/// still forwards `answer`.
pub fn forwards(messages: &[Message], share: f64, strategy: Strategy, answer: &str) -> bool {
    let total: usize = messages.iter().map(chars).sum();
    let budget = (total as f64 * share) as usize;
    match strategy {
        Strategy::KeepLast => {
            let mut room = budget.saturating_sub(chars(&messages[0]));
            messages[1..]
                .iter()
                .rev()
                .take_while(|m| {
                    let fits = chars(m) <= room;
                    room = room.saturating_sub(chars(m));
                    fits
                })
                .any(|m| m.content.contains(answer))
        }
        Strategy::Seed | Strategy::Relevance => compact(messages, &policy(strategy, budget))
            .messages
            .iter()
            .any(|m| m.content.contains(answer)),
    }
}

/// The share of `chats` whose asked fact is forwarded, asking directly or by
/// paraphrase.
pub fn retention(chats: &[FactChat], share: f64, strategy: Strategy, paraphrased: bool) -> f64 {
    let kept = chats
        .iter()
        .filter(|c| {
            let question = if paraphrased {
                &c.paraphrase
            } else {
                &c.direct
            };
            forwards(&c.with_question(question), share, strategy, &c.answer)
        })
        .count();
    kept as f64 / chats.len() as f64
}
