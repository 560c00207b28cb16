//! The deterministic compaction engine of `COMPACTION.md`: pure Rust, no I/O,
//! no async, usable as a library on its own.
//!
//! [`compact`] runs the four stages in order over one working state, each in
//! its own module named as in the spec: [`pin`] -> [`dedupe`] -> [`trim`] ->
//! [`drop`]. Every stage stops as soon as the total fits the budget, so a
//! conversation that already fits comes back untouched.
//!
//! Dedupe searches exhaustively up to [`dedupe::EXACT_SEARCH_MESSAGES`]
//! messages (all the memory-compact API accepts); past it, its candidate
//! visits are bounded linearly in the input's words
//! ([`dedupe::candidate_visit_limit`]), so only a hostile or absurd input
//! (tens of thousands of messages sharing their words) gets a bounded, not
//! exhaustive, duplicate search.
//!
//! Two extensions serve the proxy and leave the spec's results unchanged for
//! plain text conversations (both are zero/`None` there):
//! - `fixed_chars`: chars that count toward the budget but are never cut
//!   (the name and arguments of tool calls).
//! - `group`: messages sharing a group are kept or dropped together (an
//!   assistant message with `tool_calls` and the tool messages answering it).
//!   If one member is protected, all are (reason `tool_group`); grouped
//!   messages are never removed as duplicates, because removing one alone
//!   would orphan the others (they still count as the earlier message a
//!   later ungrouped one duplicates).

pub mod dedupe;
mod drop;
mod pin;
pub mod relevance;
mod report;
mod score;
pub mod text;
mod trim;
pub mod word_lists;

use std::borrow::Cow;

use serde::{Deserialize, Serialize};

pub use report::*;

/// Who spoke a message. `developer` weighs as `system`, `function` as `tool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Function,
}

impl Role {
    pub const ALL: [Role; 6] = [
        Role::System,
        Role::Developer,
        Role::User,
        Role::Assistant,
        Role::Tool,
        Role::Function,
    ];

    pub fn weight(self) -> f64 {
        match self {
            Role::System | Role::Developer | Role::User => 1.0,
            Role::Assistant => 0.7,
            Role::Tool | Role::Function => 0.5,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// One message as the engine sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Message<'a> {
    pub role: Role,
    /// The trimmable text; its chars count toward the budget. Borrowed
    /// where the caller holds it already (stable mode's replay runs the
    /// engine several times over the same texts).
    pub content: Cow<'a, str>,
    /// Echoed unchanged in the report.
    pub id: Option<String>,
    /// Protected by the caller.
    pub pin: bool,
    /// Chars that count toward the budget but are never trimmed.
    pub fixed_chars: usize,
    /// Messages with the same group are kept or dropped together.
    pub group: Option<u32>,
    /// Text that counts for relevance only, never kept nor counted toward
    /// the budget: a tool call's name and arguments, on the call and on
    /// the results answering it.
    pub subject: String,
}

impl<'a> Message<'a> {
    /// A message holding its own copy of `content`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Self::borrowed(role, Cow::Owned(content.into()))
    }

    /// A message of `content` as it is given, borrowed or owned.
    pub fn borrowed(role: Role, content: impl Into<Cow<'a, str>>) -> Self {
        Message {
            role,
            content: content.into(),
            id: None,
            pin: false,
            fixed_chars: 0,
            group: None,
            subject: String::new(),
        }
    }

    /// This message with a copy of its content of its own.
    pub fn into_owned(self) -> Message<'static> {
        Message {
            role: self.role,
            content: Cow::Owned(self.content.into_owned()),
            id: self.id,
            pin: self.pin,
            fixed_chars: self.fixed_chars,
            group: self.group,
            subject: self.subject,
        }
    }
}

/// The knobs of one compaction, with the spec's defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub budget_chars: usize,
    pub keep_last_n: usize,
    pub keep_roles: Vec<Role>,
    /// In (0, 1]; values at or below zero act as the smallest positive
    /// threshold, so messages sharing no word are never duplicates.
    pub duplicate_threshold: f64,
    pub max_message_chars: usize,
    /// How drop candidates are scored; [`ScoringMethod::Seed`] is the spec's.
    pub scoring: ScoringMethod,
}

/// How the engine scores drop candidates.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ScoringMethod {
    /// The score of `COMPACTION.md`: recency, role and topic overlap.
    #[default]
    Seed,
    /// The seed score plus [`RELEVANCE_WEIGHT`] times the candidate's
    /// relevance to the latest user message (see [`relevance`]), and pins
    /// for the most relevant candidates.
    Relevance(RelevancePolicy),
}

/// The knobs of `scoring = "relevance"`.
#[derive(Debug, Clone, PartialEq)]
pub struct RelevancePolicy {
    /// Candidates whose normalised relevance (in [0, 1], the most relevant
    /// message has 1) is at least this are protected with reason
    /// `relevant`, most relevant first, while they fit the pin share.
    pub pin_relevant_above: f64,
    /// The share of the budget relevance pins may take, in [0, 1]. They
    /// never take chars the already protected messages (the recent tail,
    /// kept roles, explicit pins) need: the cap is the smaller of this
    /// share of the budget and what the budget has left after those.
    pub relevant_pin_share: f64,
    /// A per-request goal whose terms join the query (the proxy reads it
    /// from the header the policy names).
    pub goal: Option<String>,
}

impl RelevancePolicy {
    /// Pins the top candidate and any within half of its relevance: on
    /// generated fact-retention chats, a lower threshold spends the pin
    /// share on distractors, a higher one misses a fact the question
    /// paraphrases (see `benches/relevance.rs`).
    pub const DEFAULT_PIN_RELEVANT_ABOVE: f64 = 0.5;
    /// Leaves most of the budget to the score order and the recent tail.
    pub const DEFAULT_RELEVANT_PIN_SHARE: f64 = 0.3;
}

impl Default for RelevancePolicy {
    fn default() -> Self {
        RelevancePolicy {
            pin_relevant_above: Self::DEFAULT_PIN_RELEVANT_ABOVE,
            relevant_pin_share: Self::DEFAULT_RELEVANT_PIN_SHARE,
            goal: None,
        }
    }
}

/// What the relevance of a candidate adds to its drop score. The seed score
/// lies in [0.15, 1], so a message with relevance 1 outranks every
/// irrelevant one whatever its age, and one with relevance 0.5 outranks
/// irrelevant messages up to half the history younger.
pub const RELEVANCE_WEIGHT: f64 = 1.0;

impl Policy {
    pub const DEFAULT_KEEP_LAST_N: usize = 5;
    pub const DEFAULT_DUPLICATE_THRESHOLD: f64 = 0.9;
    pub const DEFAULT_MAX_MESSAGE_CHARS: usize = 400;

    /// A policy with the spec's defaults for everything but the budget.
    pub fn with_budget(budget_chars: usize) -> Self {
        Policy {
            budget_chars,
            keep_last_n: Self::DEFAULT_KEEP_LAST_N,
            keep_roles: vec![Role::System],
            duplicate_threshold: Self::DEFAULT_DUPLICATE_THRESHOLD,
            max_message_chars: Self::DEFAULT_MAX_MESSAGE_CHARS,
            scoring: ScoringMethod::Seed,
        }
    }

    /// This policy with `goal` as the relevance goal of one request; a seed
    /// policy has no use for a goal and is returned as it is.
    pub fn with_goal(&self, goal: Option<String>) -> Policy {
        let mut policy = self.clone();
        if let ScoringMethod::Relevance(r) = &mut policy.scoring {
            r.goal = goal;
        }
        policy
    }
}

pub const WEIGHTS: Weights = Weights {
    recency: 0.5,
    role: 0.3,
    topic_overlap: 0.2,
};

/// What the stages share: which messages are present, how many chars of
/// each content are kept, and the running total.
struct Working<'a> {
    messages: &'a [Message<'a>],
    present: Vec<bool>,
    /// Chars of each content still kept (a prefix of the content).
    kept_chars: Vec<usize>,
    content_chars: Vec<usize>,
    protected: Vec<bool>,
    /// Relevant messages cut around their match, not to a prefix: their
    /// kept text (`kept_chars` chars).
    excerpts: Vec<Option<String>>,
    /// The excerpts made while pinning, for the trim stage's record.
    pinned_excerpts: Vec<Trimmed>,
    total: usize,
    budget: usize,
}

impl<'a> Working<'a> {
    fn new(messages: &'a [Message<'a>], budget: usize) -> Self {
        let content_chars: Vec<usize> = messages
            .iter()
            .map(|m| text::char_count(&m.content))
            .collect();
        let total = messages
            .iter()
            .zip(&content_chars)
            .map(|(m, c)| c + m.fixed_chars)
            .sum();
        Working {
            messages,
            present: vec![true; messages.len()],
            kept_chars: content_chars.clone(),
            content_chars,
            protected: vec![false; messages.len()],
            excerpts: vec![None; messages.len()],
            pinned_excerpts: Vec::new(),
            total,
            budget,
        }
    }

    fn fits(&self) -> bool {
        self.total <= self.budget
    }

    /// Current chars of message `i`.
    fn chars(&self, i: usize) -> usize {
        self.kept_chars[i] + self.messages[i].fixed_chars
    }

    fn original_chars(&self, i: usize) -> usize {
        self.content_chars[i] + self.messages[i].fixed_chars
    }

    fn remove(&mut self, i: usize) {
        debug_assert!(self.present[i] && !self.protected[i]);
        self.present[i] = false;
        self.total -= self.chars(i);
    }

    fn set_kept(&mut self, i: usize, kept: usize) {
        self.total -= self.kept_chars[i] - kept;
        self.kept_chars[i] = kept;
    }

    /// Keeps `excerpt` (shorter than the content) of message `i`.
    fn set_excerpt(&mut self, i: usize, excerpt: String) {
        self.set_kept(i, text::char_count(&excerpt));
        self.excerpts[i] = Some(excerpt);
    }

    /// Unprotected messages still present, in index order.
    fn candidates(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.messages.len()).filter(|&i| self.present[i] && !self.protected[i])
    }
}

/// The caches of earlier requests' work the engine reads through: each
/// message's relevance analysis ([`relevance::AnalysisCache`]) and what
/// reading each history's words gave ([`word_lists::WordListCache`]). Only
/// accelerators: the report is the same with any caches or none.
pub trait Caches: relevance::AnalysisCache + word_lists::WordListCache {}

impl<T: relevance::AnalysisCache + word_lists::WordListCache + ?Sized> Caches for T {}

/// No caches: every request reads and analyses all its messages.
pub struct NoCaches;

impl relevance::AnalysisCache for NoCaches {
    fn enabled(&self) -> bool {
        false
    }
    fn get(&self, _: u128) -> Option<relevance::CachedAnalysis> {
        None
    }
    fn put(&self, _: u128, _: relevance::CachedAnalysis) {}
}

impl word_lists::WordListCache for NoCaches {
    fn word_lists_enabled(&self) -> bool {
        false
    }
    fn history_words(&self, _: u128) -> Option<std::sync::Arc<word_lists::HistoryWords>> {
        None
    }
    fn put_history_words(&self, _: u128, _: std::sync::Arc<word_lists::HistoryWords>) {}
    fn remove_history_words(&self, _: u128) {}
}

/// Compacts `messages` to `policy.budget_chars` and reports every decision.
pub fn compact(messages: &[Message], policy: &Policy) -> Report {
    compact_cached(messages, policy, &NoCaches)
}

/// [`compact`], with earlier requests' work looked up in and added to
/// `caches`: relevance scoring's per-message analyses (see
/// [`relevance::analyze_cached`]) and what reading a history's words gave
/// (see [`word_lists`]); the report is the same with any caches or none.
pub fn compact_cached(messages: &[Message], policy: &Policy, caches: &dyn Caches) -> Report {
    compact_scored(messages, policy, caches, Known::default())
}

/// What a caller computed of the engine's messages before the engine, so
/// that it is not computed twice.
#[derive(Debug, Default)]
pub struct Known {
    /// [`relevance::analyze_cached`] of these messages (their roles,
    /// contents and subjects) and the policy's goal.
    pub relevance: Option<relevance::Relevance>,
    /// [`relevance::message_key`] of each message's content.
    pub keys: Option<Vec<u128>>,
    /// What scoring counted of these messages before some of their texts
    /// changed (those whose `keys` differ): only those are counted again.
    pub counted: Option<relevance::Counted>,
}

/// [`compact_cached`], with what the caller `known`s of `messages` already
/// (as the agent passes do, which score the items before the engine): the
/// same report, sooner.
pub fn compact_scored(
    messages: &[Message],
    policy: &Policy,
    caches: &dyn Caches,
    known: Known,
) -> Report {
    let Known {
        relevance: found,
        mut keys,
        counted,
    } = known;
    debug_assert!(keys
        .as_ref()
        .map_or(true, |keys| keys.len() == messages.len()
            && keys
                .iter()
                .zip(messages)
                .all(|(&k, m)| k == relevance::message_key(&m.content))));
    let relevance = match &policy.scoring {
        ScoringMethod::Seed => None,
        ScoringMethod::Relevance(r) => Some((
            match found {
                Some(found) => {
                    debug_assert_eq!(found, relevance::analyze(messages, r.goal.as_deref()));
                    found
                }
                None => {
                    let (found, hashed, _) = relevance::analyze_counted(
                        messages,
                        r.goal.as_deref(),
                        caches,
                        keys.take(),
                        counted.as_ref(),
                    );
                    debug_assert!(
                        counted.is_none()
                            || found == relevance::analyze(messages, r.goal.as_deref())
                    );
                    keys = hashed;
                    found
                }
            },
            r,
        )),
    };
    let mut scores = score::Scores::new_keyed(messages, caches, keys.as_deref());
    if let Some((found, _)) = &relevance {
        scores.add(RELEVANCE_WEIGHT, &found.relevance);
    }
    let mut work = Working::new(messages, policy.budget_chars);
    let input_chars = work.total;

    let relevant = relevance.as_ref().map(|(found, knobs)| (found, *knobs));
    let (pin, reasons, relevant_pins) = pin::run(&mut work, policy, relevant, caches);
    let dedupe = dedupe::run(&mut work, &scores, policy);
    let trim = trim::run(
        &mut work,
        policy,
        relevance.as_ref().map(|(found, _)| found),
        caches,
    );
    let drop = drop::run(&mut work, &scores);

    let mut out = Vec::with_capacity(messages.len());
    let mut loss = Loss {
        input_messages: messages.len(),
        output_messages: 0,
        input_chars,
        output_chars: work.total,
        dropped_messages: 0,
        dropped_chars: 0,
        trimmed_messages: 0,
        truncated_chars: 0,
        verbatim_messages: 0,
        retained_char_ratio: if input_chars == 0 {
            1.0
        } else {
            round_to(work.total as f64 / input_chars as f64, 4)
        },
    };
    let mut protected_chars = 0;
    for (i, (m, because)) in messages.iter().zip(reasons).enumerate() {
        if work.protected[i] {
            protected_chars += work.chars(i);
        }
        if !work.present[i] {
            loss.dropped_messages += 1;
            loss.dropped_chars += work.original_chars(i);
            continue;
        }
        let kept = work.kept_chars[i];
        let trimmed = kept < work.content_chars[i];
        if trimmed {
            loss.trimmed_messages += 1;
            loss.truncated_chars += work.content_chars[i] - kept;
        } else {
            loss.verbatim_messages += 1;
        }
        out.push(OutputMessage {
            index: i,
            role: m.role,
            content: if let Some(excerpt) = &work.excerpts[i] {
                excerpt.clone()
            } else if trimmed {
                text::char_prefix(&m.content, kept).to_owned()
            } else {
                m.content.to_string()
            },
            id: m.id.clone(),
            kept: if trimmed {
                Kept::Trimmed
            } else {
                Kept::Verbatim
            },
            protected: work.protected[i],
            score: (!work.protected[i]).then(|| round_to(scores.score(i), 6)),
            protected_because: work.protected[i].then_some(because),
            original_chars: work.original_chars(i),
            chars: work.chars(i),
        });
    }
    loss.output_messages = out.len();

    Report {
        messages: out,
        stages: Stages {
            pin,
            dedupe,
            trim,
            drop,
        },
        budget: Budget {
            budget_chars: policy.budget_chars,
            output_chars: work.total,
            budget_met: work.fits(),
            shortfall_chars: work.total.saturating_sub(policy.budget_chars),
            protected_chars,
            protected_exceeds_budget: protected_chars > policy.budget_chars,
        },
        loss,
        scoring: Scoring {
            weights: WEIGHTS,
            role_weights: RoleWeights {
                system: Role::System.weight(),
                user: Role::User.weight(),
                assistant: Role::Assistant.weight(),
                tool: Role::Tool.weight(),
            },
            topic_terms_used: scores.topic_terms(),
            note: SCORING_NOTE,
            relevance: relevance.map(|(found, knobs)| RelevanceReport {
                weight: RELEVANCE_WEIGHT,
                method: RELEVANCE_METHOD,
                query_index: found.query_index,
                query_terms: found.query_terms,
                pin_relevant_above: knobs.pin_relevant_above,
                relevant_pin_share: knobs.relevant_pin_share,
                pinned: relevant_pins,
                messages: found.relevance.iter().map(|&r| round_to(r, 6)).collect(),
            }),
        },
        limits: LIMITS,
    }
}
