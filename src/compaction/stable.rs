//! Stable mode: compaction that keeps the forwarded prefix the same from
//! one turn to the next, so the provider's prompt cache keeps serving it.
//!
//! The forwarded form is a pure function of the request and the policy: the
//! conversation is **replayed** unit by unit (a unit is a tool group, or one
//! item). Each unit is appended verbatim (once the form was re-compacted,
//! a tool result above its share of the room is cut on arrival, head +
//! marker + tail); when that pushes the running form over the budget, the
//! form is re-compacted once, down to `stable_target_ratio` of the room the
//! protected items leave (lower, to leave room for several turns), keeping
//! its head (the leading items within `stable_head_ratio` of the budget)
//! exactly as it was. Every
//! earlier turn's request is a prefix of this one, so its replay passed
//! through the same states: what was forwarded then is a prefix of what is
//! forwarded now, until the next re-compaction.
//!
//! Replaying from the start costs a few engine runs; [`Checkpoints`] lets a
//! turn resume from the state at the end of an earlier request with the same
//! prefix (keyed by a 128-bit hash of the policy, format and the prefix's
//! bytes). Under seed scoring the checkpoint store is only an accelerator:
//! with it or without it, the result is the same. Under `scoring =
//! "relevance"` with a store that keeps checkpoints, a request that finds
//! none is compacted once around its own question (as exact mode chooses)
//! and that choice, frozen in its checkpoint, is what later turns extend.

use std::sync::Arc;

use xxhash_rust::xxh3::Xxh3;

use std::borrow::Cow;

use super::agent::{self, AgentEdits, TextEdit};
use super::tokens::Encoding;
use crate::analysis_store::AnalysisStore;
use crate::compaction::policy::CompiledPolicy;
use crate::engine::word_lists::WithTextWords;
use crate::engine::{self, text::char_count, text::char_prefix, Message};
use crate::format::{Conversation, Parsed, Plan, Planned, Reasoning};
pub use crate::outcome::StableInfo;

/// One item of the running form: which item, what the agent passes made
/// of it, and how many chars of that text are kept (a prefix).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Entry {
    pub index: u32,
    pub kept: u32,
    pub edit: Edit,
    /// Tool calls (by position, the first 32) whose arguments are clipped
    /// to the policy's `max_arg_chars`.
    pub clipped: u32,
    /// What becomes of its reasoning blocks once a re-compaction changed
    /// what lies before it ([`super::thinking`]).
    pub thinking: Reasoning,
}

/// An agent pass's rewrite of an entry's text. Either is a pure function
/// of the item (and the policy), so a state holds only which one applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Edit {
    #[default]
    None,
    /// Head + marker + tail at `max_tool_result_chars`.
    Pruned,
    /// A marker naming the call that item (an index) answers.
    Deduped(u32),
    /// Head + marker + tail at this many chars: a tool result larger than
    /// its share of the room when it arrived ([`Replay::arrival_cap`]).
    Capped(u32),
    /// Cut around what the request of its re-compaction asked about
    /// (`scoring = "relevance"`): by the engine's trim (`Excerpt`) or the
    /// prune pass (`PrunedAround`). Not a function of the item alone, so
    /// the text itself is frozen in the state ([`ReplayState::texts`], by
    /// position) and every later turn forwards it as it was.
    Excerpt(u32),
    PrunedAround(u32),
}

impl Edit {
    /// The frozen text this edit names, if any.
    fn frozen(self) -> Option<usize> {
        match self {
            Edit::Excerpt(k) | Edit::PrunedAround(k) => Some(k as usize),
            _ => None,
        }
    }
}

/// The running form after some prefix of the conversation.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReplayState {
    pub entries: Vec<Entry>,
    /// Items of the conversation replayed so far.
    pub replayed: usize,
    /// What the request that ended here reported (stable messages,
    /// rebased), so a retry of it reports the same.
    pub turn: Option<(usize, bool)>,
    /// The form has been re-compacted: new tool results are capped on
    /// arrival from here on ([`Replay::arrival_cap`]). (Before, every
    /// prefix fit and went as it came.)
    pub recompacted: bool,
    /// The texts of [`Edit::Excerpt`] and [`Edit::PrunedAround`] entries.
    pub texts: Vec<Arc<str>>,
}

impl ReplayState {
    /// Approximate bytes held, for the checkpoint store's weigher.
    pub fn weight(&self) -> u32 {
        let texts: usize = self.texts.iter().map(|t| 16 + t.len()).sum();
        u32::try_from(64 + self.entries.len() * std::mem::size_of::<Entry>() + texts)
            .unwrap_or(u32::MAX)
    }
}

/// Where replay states of earlier turns are kept between requests.
pub trait Checkpoints {
    fn get(&self, key: u128) -> Option<Arc<ReplayState>>;
    fn put(&self, key: u128, state: Arc<ReplayState>);
    /// Whether what is put can be got back later. Without it, a request
    /// that finds no checkpoint is replayed from the start (a pure function
    /// of the request); with it, under `scoring = "relevance"`, such a cold
    /// request is compacted around its own question and that choice is
    /// kept for the following turns ([`replay`]).
    fn keeps(&self) -> bool {
        true
    }
}

/// No store: every turn replays from the start.
pub struct NoCheckpoints;

impl Checkpoints for NoCheckpoints {
    fn get(&self, _: u128) -> Option<Arc<ReplayState>> {
        None
    }
    fn put(&self, _: u128, _: Arc<ReplayState>) {}
    fn keeps(&self) -> bool {
        false
    }
}

/// The outcome of a replay.
#[derive(Debug, Clone)]
pub struct Replayed {
    pub plan: Plan,
    pub info: StableInfo,
    /// What the agent passes did to the forwarded items, for the loss.
    pub edits: AgentEdits,
}

/// A token budget beside the char budget: the form must fit both.
#[derive(Debug, Clone, Copy)]
pub struct TokenBudget {
    pub encoding: Encoding,
    pub tokens: usize,
    /// The char budget beside it, or `usize::MAX` when the token budget
    /// is the whole budget (`budget = "auto"`).
    pub chars: usize,
}

/// Replays `parsed`'s conversation under `policy` (stable mode), within
/// `tokens` as well when the policy counts tokens.
pub fn replay(
    parsed: &Parsed,
    policy: &CompiledPolicy,
    tokens: Option<TokenBudget>,
    checkpoints: &dyn Checkpoints,
) -> Replayed {
    let conversation = &parsed.conversation;
    let units = unit_ends(conversation);
    let prev_turn = previous_turn_end(conversation);

    // Prefix hashes at every unit end.
    let mut hasher = Xxh3::new();
    hasher.update(&policy.id.to_le_bytes());
    hasher.update(parsed.format.as_str().as_bytes());
    // A request's relevance goal changes what a re-compaction keeps.
    if let engine::ScoringMethod::Relevance(r) = &policy.engine.scoring {
        let goal = r.goal.as_deref().unwrap_or_default();
        hasher.update(&(goal.len() as u64).to_le_bytes());
        hasher.update(goal.as_bytes());
    }
    // A budget derived from the request (`budget = "auto"`) is part of
    // what the replay ran under.
    if let Some(budget) = tokens {
        hasher.update(&(budget.tokens as u64).to_le_bytes());
        hasher.update(&(budget.chars as u64).to_le_bytes());
        hasher.update(budget.encoding.as_str().as_bytes());
    }
    // The items' bytes come in through their chained hash, which a parse
    // resumed from the previous turn's carries for the items it shares.
    let seed = hasher.digest128().to_le_bytes();
    let chain = parsed.item_chain();
    let keys: Vec<u128> = units
        .iter()
        .map(|&end| {
            let mut key = [0u8; 32];
            key[..16].copy_from_slice(&seed);
            key[16..].copy_from_slice(&chain[end - 1].to_le_bytes());
            xxhash_rust::xxh3::xxh3_128(&key)
        })
        .collect();

    let mut replay = Replay::new(parsed, policy, tokens);
    // Resume from the latest unit end an earlier request stopped at.
    let mut state = ReplayState::default();
    let mut resumed = false;
    for (u, key) in keys.iter().enumerate().rev() {
        if let Some(found) = checkpoints.get(*key) {
            // A state no request ended at (kept where a replay passed its
            // previous turn) has no report of its own: it serves a replay
            // that passes its own previous turn after it.
            if replay.valid(&found, units[u]) && (found.turn.is_some() || units[u] <= prev_turn) {
                state = (*found).clone();
                resumed = true;
                break;
            }
        }
    }
    replay.texts.replace(std::mem::take(&mut state.texts));
    let mut recompactions = 0;
    let mut rebased = false;
    // A cold request under relevance scoring (no checkpoint, but a store
    // that keeps what this one chooses) is one re-compaction of the whole
    // conversation around its own question, the way exact mode chooses;
    // the following turns resume from it and extend it. (Replaying from
    // the start would have decided each old message before the question
    // existed.)
    if !resumed && checkpoints.keeps() && replay.scores_relevance() {
        state.entries = (0..conversation.items.len())
            .map(|i| Entry {
                index: i as u32,
                kept: replay.text_chars[i] as u32,
                ..Entry::default()
            })
            .collect();
        state.replayed = conversation.items.len();
        let (chars, tokens) = (
            replay.total(&state.entries),
            replay.total_tokens(&state.entries),
        );
        if replay.over_budget(chars, tokens) {
            // No head to keep: nothing was forwarded before. The last
            // unit is the newest, as a turn's would be.
            replay.head = 0;
            let fresh = units.iter().rev().nth(1).copied().unwrap_or(0);
            let protected_chars = replay.protected_chars(0..conversation.items.len());
            state.entries = replay.recompact(&state.entries, fresh, protected_chars);
            state.recompacted = true;
            recompactions = 1;
            rebased = true;
        }
    }

    let mut at_prev_turn: Option<Vec<Entry>> =
        (state.replayed == prev_turn).then(|| state.entries.clone());
    let mut total = replay.total(&state.entries);
    let mut total_tokens = replay.total_tokens(&state.entries);
    let resume_at = state.replayed;
    let mut protected_chars = replay.protected_chars(0..resume_at);
    for &end in units.iter().filter(|&&e| e > resume_at) {
        if state.replayed == prev_turn && at_prev_turn.is_none() {
            at_prev_turn = Some(state.entries.clone());
            // The state at the previous turn is kept too: a retry, or a
            // last message edited, resumes from it instead of replaying
            // from the start (only the final state is kept otherwise).
            if let Ok(u) = units.binary_search(&prev_turn) {
                checkpoints.put(
                    keys[u],
                    Arc::new(ReplayState {
                        entries: state.entries.clone(),
                        replayed: state.replayed,
                        turn: None,
                        recompacted: state.recompacted,
                        texts: replay.texts.borrow().clone(),
                    }),
                );
            }
        }
        let fresh = state.entries.len();
        protected_chars += replay.protected_chars(state.replayed..end);
        for i in state.replayed..end {
            let entry = if state.recompacted {
                replay.arrival(i, protected_chars)
            } else {
                replay.whole(i)
            };
            total += replay.chars(&entry);
            total_tokens += replay.tokens(&entry);
            state.entries.push(entry);
        }
        state.replayed = end;
        if replay.over_budget(total, total_tokens) {
            // The new unit is cut as an arrival would be, and then kept
            // as it is: the model has not seen it yet.
            for e in &mut state.entries[fresh..] {
                if e.edit == Edit::None {
                    *e = replay.arrival(e.index as usize, protected_chars);
                }
            }
            state.entries = replay.recompact(&state.entries, fresh, protected_chars);
            total = replay.total(&state.entries);
            total_tokens = replay.total_tokens(&state.entries);
            recompactions += 1;
            state.recompacted = true;
            if end > prev_turn {
                rebased = true;
            }
        }
    }
    if at_prev_turn.is_none() && state.replayed == prev_turn {
        at_prev_turn = Some(state.entries.clone());
    }
    let (stable_messages, rebased) = match (&at_prev_turn, state.turn) {
        (Some(before), _) => (
            before
                .iter()
                .zip(&state.entries)
                .take_while(|(a, b)| a == b)
                .count(),
            rebased,
        ),
        // Resumed past the previous turn (a retry): what that replay said.
        (None, Some(turn)) if resumed && recompactions == 0 => turn,
        (None, _) => (0, rebased),
    };
    state.turn = Some((stable_messages, rebased));
    state.texts = replay.texts.take();
    collect_texts(&mut state);
    replay.texts.replace(state.texts.clone());
    if let Some(key) = keys.last() {
        checkpoints.put(*key, Arc::new(state.clone()));
    }
    let mut edits = AgentEdits::default();
    // One edit per entry the replay cut: made room for at once, not grown.
    let cut = state
        .entries
        .iter()
        .filter(|e| !matches!(e.edit, Edit::None | Edit::Excerpt(_)));
    edits.texts.reserve(cut.count());
    let plan = Plan {
        items: state
            .entries
            .iter()
            .map(|e| {
                let index = e.index as usize;
                let item = &conversation.items[index];
                let edited = replay.text_of(e);
                let full = match e.edit {
                    Edit::None => replay.text_chars[index],
                    _ => char_count(&edited),
                } as u32;
                match e.edit {
                    Edit::None | Edit::Excerpt(_) => {}
                    Edit::Pruned | Edit::Capped(_) | Edit::PrunedAround(_) => {
                        edits
                            .texts
                            .insert(index, TextEdit::Pruned(edited.to_string()));
                    }
                    Edit::Deduped(of) => {
                        let of = conversation.items[of as usize]
                            .answers
                            .clone()
                            .unwrap_or_default();
                        edits.texts.insert(
                            index,
                            TextEdit::Deduped {
                                text: edited.to_string(),
                                of,
                            },
                        );
                    }
                }
                let arguments = replay.arguments_of(e);
                if !arguments.is_empty() {
                    edits.arguments.insert(index, arguments.clone());
                }
                let changed = e.edit != Edit::None || e.kept < full;
                Planned {
                    index,
                    text: changed
                        .then(|| char_prefix(&edited, e.kept as usize).to_owned())
                        .filter(|t| *t != item.text),
                    arguments,
                    // Stable mode spreads a pruned text as one text.
                    pieces: None,
                    thinking: e.thinking,
                }
            })
            .collect(),
    };
    Replayed {
        plan,
        edits,
        info: StableInfo {
            stable_messages,
            rebased,
            recompactions,
            resumed: Some(resumed),
        },
    }
}

/// Drops the frozen texts no entry names any more (a re-compaction dropped
/// or re-cut their entries), once they are at least half of them.
fn collect_texts(state: &mut ReplayState) {
    let mut used = vec![false; state.texts.len()];
    for e in &state.entries {
        if let Some(k) = e.edit.frozen() {
            used[k] = true;
        }
    }
    let live = used.iter().filter(|&&u| u).count();
    if live * 2 > state.texts.len() {
        return;
    }
    let mut at = vec![0u32; state.texts.len()];
    let mut texts = Vec::with_capacity(live);
    for (k, text) in std::mem::take(&mut state.texts).into_iter().enumerate() {
        if used[k] {
            at[k] = texts.len() as u32;
            texts.push(text);
        }
    }
    for e in &mut state.entries {
        e.edit = match e.edit {
            Edit::Excerpt(k) => Edit::Excerpt(at[k as usize]),
            Edit::PrunedAround(k) => Edit::PrunedAround(at[k as usize]),
            other => other,
        };
    }
    state.texts = texts;
}

/// The end (exclusive) of each replay unit: the shortest run of items that
/// holds every member of each tool group it touches, or a single item.
fn unit_ends(conversation: &Conversation) -> Vec<usize> {
    let items = &conversation.items;
    let mut last_of: rustc_hash::FxHashMap<u32, usize> = Default::default();
    for (i, item) in items.iter().enumerate() {
        if let Some(g) = item.group {
            last_of.insert(g, i);
        }
    }
    let mut ends = Vec::with_capacity(items.len());
    let mut i = 0;
    while i < items.len() {
        let mut end = i + 1;
        let mut k = i;
        while k < end {
            if let Some(g) = items[k].group {
                end = end.max(last_of[&g] + 1);
            }
            k += 1;
        }
        ends.push(end);
        i = end;
    }
    ends
}

/// Where the previous turn's request ended: before the last assistant
/// item's unit (what came after it is this turn's).
pub(crate) fn previous_turn_end(conversation: &Conversation) -> usize {
    let items = &conversation.items;
    let Some(last) = items
        .iter()
        .rposition(|m| m.role == engine::Role::Assistant)
    else {
        return 0;
    };
    // The start of the assistant's unit (a reasoning item may open it),
    // and of the assistant items right before it: one model turn can be
    // several items (a Responses turn: reasoning, a message, then calls).
    let mut start = last;
    loop {
        if let Some(g) = items[start].group {
            while start > 0 && items[start - 1].group == Some(g) {
                start -= 1;
            }
        }
        if start > 0 && items[start - 1].role == engine::Role::Assistant {
            start -= 1;
        } else {
            return start;
        }
    }
}

/// The fixed parts of one replay.
struct Replay<'a> {
    parsed: &'a Parsed<'a>,
    conversation: &'a Conversation,
    policy: &'a CompiledPolicy,
    /// Pins of each item under the policy's rules.
    pins: Vec<bool>,
    /// What relevance reads of each item beside its text (tool calls).
    subjects: Vec<String>,
    /// Pins and kept roles: what the agent passes never touch.
    protected: Vec<bool>,
    /// Excluded tools' units: the engine may drop them but never cut them.
    excluded: Vec<bool>,
    /// Tool results the passes may cut, and an arrival cap too.
    prunable: Vec<bool>,
    /// The budget of the items (outside chars already spent).
    budget: usize,
    head: usize,
    /// The token budget of the items (the outside already spent).
    tokens: Option<(Encoding, usize)>,
    /// The frozen texts of the state being replayed ([`ReplayState::texts`]).
    texts: std::cell::RefCell<Vec<Arc<str>>>,
    /// Chars of each item's text ([`Parsed::text_chars`]).
    text_chars: &'a [usize],
    /// The policy's caches, and the words of every text an engine run of
    /// this replay read: the next re-compaction's form holds most of them.
    caches: WithTextWords<'a, AnalysisStore>,
    /// [`engine::relevance::message_key`] of the texts borrowed from the
    /// conversation that earlier engine runs of this replay read, by
    /// address and length: the conversation lives, unchanged, as long as
    /// the replay, so an address names one text.
    keys: std::cell::RefCell<rustc_hash::FxHashMap<(usize, usize), u128>>,
}

/// A re-compaction frees room for this many units like the recent ones.
/// (6 billed Codex 0.59x instead of 0.64x the no-proxy bill on the
/// coding-agent harness, docs/agents.md, but then a re-compaction drops
/// the masked tool results it made: the passes' test fails.)
const TURNS_OF_ROOM: usize = 4;
/// Once the form was re-compacted, a new tool result takes at most this
/// fraction (1/n) of the room beside the protected items. Measured on the
/// coding-agent harness (docs/agents.md, budget 60,000 chars): at 1/5,
/// Claude Code extended the previous request on 0.78 of its turns and
/// Codex billed 0.64x no proxy; at 1/8, 0.82-0.85 and 0.62x; at 1/12,
/// 0.85-0.88 and 0.58x, the fact-retention and agent-fixture checks held.
const ARRIVAL_SHARES: usize = 12;
/// How many of the form's last units tell the size of the next ones.
const RECENT_UNITS: usize = 8;

impl<'a> Replay<'a> {
    fn new(
        parsed: &'a Parsed<'a>,
        policy: &'a CompiledPolicy,
        tokens: Option<TokenBudget>,
    ) -> Self {
        let conversation = &parsed.conversation;
        let pins = super::pins(conversation, policy);
        let protected = super::protected_items(conversation, policy);
        let chars = tokens.map_or(policy.engine.budget_chars, |t| t.chars);
        let budget = chars.saturating_sub(conversation.outside_chars);
        // What lies outside the array counts as the tokenizer counts it.
        let outside_tokens = conversation.outside_chars.div_ceil(4);
        let tokens = tokens.map(|t| (t.encoding, t.tokens.saturating_sub(outside_tokens)));
        Replay {
            parsed,
            conversation,
            policy,
            pins,
            subjects: super::relevant::subjects(conversation, policy),
            protected,
            excluded: agent::excluded_items(conversation, &policy.agent),
            prunable: agent::prunable_results(conversation, &policy.agent),
            budget,
            head: (budget.min(policy.engine.budget_chars) as f64 * policy.stable_head_ratio)
                as usize,
            tokens,
            texts: Default::default(),
            text_chars: parsed.text_chars(),
            caches: WithTextWords::new(&policy.analyses),
            keys: Default::default(),
        }
    }

    /// The chars of the protected items (pins, kept roles) in `range`.
    fn protected_chars(&self, range: std::ops::Range<usize>) -> usize {
        range
            .filter(|&i| self.protected[i])
            .map(|i| self.item_chars(i))
            .sum()
    }

    /// The room the protected items so far (`protected_chars`) leave in
    /// the budget: what re-compactions can free.
    fn room(&self, protected_chars: usize) -> usize {
        self.budget.saturating_sub(protected_chars)
    }

    /// The largest tool result a turn appends whole once the form was
    /// re-compacted: a [`ARRIVAL_SHARES`]th of the room (at most
    /// `protect_tool_chars`, never below `max_tool_result_chars`), so that
    /// the room holds several turns like it. A result larger than the
    /// room's share fills it, and the form is re-compacted on nearly every
    /// turn. 0: no cap (the prune pass is off).
    fn arrival_cap(&self, protected_chars: usize) -> usize {
        let agent = &self.policy.agent;
        if agent.max_tool_result_chars == 0 {
            return 0;
        }
        (self.room(protected_chars) / ARRIVAL_SHARES)
            .min(agent.protect_tool_chars)
            .max(agent.max_tool_result_chars)
    }

    /// Item `i` as it came.
    fn whole(&self, i: usize) -> Entry {
        Entry {
            index: i as u32,
            kept: self.text_chars[i] as u32,
            ..Entry::default()
        }
    }

    /// Chars of item `i`, its text and its fixed chars.
    fn item_chars(&self, i: usize) -> usize {
        self.text_chars[i] + self.conversation.items[i].fixed_chars
    }

    /// Chars of an entry's whole text after its agent edit.
    fn full_chars(&self, e: &Entry) -> usize {
        match e.edit {
            Edit::None => self.text_chars[e.index as usize],
            _ => char_count(&self.text_of(e)),
        }
    }

    /// Item `i` as a turn appends it once the form was re-compacted: whole,
    /// or a prunable tool result above [`Self::arrival_cap`] cut to it
    /// (head + marker + tail), a pure function of the prefix.
    fn arrival(&self, i: usize, protected_chars: usize) -> Entry {
        let mut entry = self.whole(i);
        let cap = self.arrival_cap(protected_chars);
        if cap > 0
            && self.prunable[i]
            && !self.protected[i]
            && !self.excluded[i]
            && entry.kept as usize > cap
        {
            if let Cow::Owned(cut) = self.cut(i as u32, cap) {
                entry.edit = Edit::Capped(cap as u32);
                entry.kept = char_count(&cut) as u32;
            }
        }
        entry
    }

    fn scores_relevance(&self) -> bool {
        matches!(
            self.policy.engine.scoring,
            engine::ScoringMethod::Relevance(_)
        )
    }

    /// The engine's key of `text`, remembered when it is borrowed from the
    /// conversation (an owned text is made anew each time it is asked for).
    #[allow(clippy::ptr_arg)] // Borrowed or owned is what it asks.
    fn key_of(&self, text: &Cow<'a, str>) -> u128 {
        match text {
            Cow::Borrowed(text) => *self
                .keys
                .borrow_mut()
                .entry((text.as_ptr() as usize, text.len()))
                .or_insert_with(|| engine::relevance::message_key(text)),
            Cow::Owned(text) => engine::relevance::message_key(text),
        }
    }

    /// Freezes `text` for an entry's edit; its position in the texts.
    fn freeze(&self, text: String) -> u32 {
        let mut texts = self.texts.borrow_mut();
        texts.push(Arc::from(text));
        (texts.len() - 1) as u32
    }

    fn over_budget(&self, chars: usize, tokens: usize) -> bool {
        chars > self.budget || self.tokens.is_some_and(|(_, budget)| tokens > budget)
    }

    /// An entry's tokens under the token budget's encoding (0 without one):
    /// its kept text, its calls, and a quarter of its other fixed chars.
    fn tokens(&self, e: &Entry) -> usize {
        let Some((encoding, _)) = self.tokens else {
            return 0;
        };
        let item = &self.conversation.items[e.index as usize];
        let text = self.text_of(e);
        let mut n = encoding.count_cached(char_prefix(&text, e.kept as usize));
        let clipped = self.arguments_of(e);
        let mut call_chars = 0;
        for (pos, call) in item.tool_calls.iter().enumerate() {
            let arguments = clipped
                .iter()
                .find(|(p, _)| *p == pos)
                .map_or(call.arguments.as_str(), |(_, a)| a.as_str());
            n += encoding.count_cached(&call.name) + encoding.count_cached(arguments);
            call_chars += char_count(&call.name) + char_count(arguments);
        }
        n + self.fixed_of(e).saturating_sub(call_chars).div_ceil(4)
    }

    fn total_tokens(&self, entries: &[Entry]) -> usize {
        if self.tokens.is_none() {
            return 0;
        }
        entries.iter().map(|e| self.tokens(e)).sum()
    }

    /// An entry's whole text after its agent edit (before the kept prefix).
    fn text_of(&self, e: &Entry) -> Cow<'a, str> {
        let text = &self.conversation.items[e.index as usize].text;
        match e.edit {
            Edit::None => Cow::Borrowed(text),
            Edit::Pruned => self.cut(e.index, self.policy.agent.max_tool_result_chars),
            Edit::Capped(keep) => self.cut(e.index, keep as usize),
            Edit::Deduped(of) => Cow::Owned(agent::duplicate_marker(
                self.conversation.items[of as usize]
                    .answers
                    .as_deref()
                    .unwrap_or_default(),
            )),
            Edit::Excerpt(k) | Edit::PrunedAround(k) => self
                .texts
                .borrow()
                .get(k as usize)
                .map_or(Cow::Borrowed(text), |t| Cow::Owned(t.to_string())),
        }
    }

    /// An entry's kept text (its kept prefix after its agent edit), borrowed
    /// from the conversation when unedited: each engine run reads the form's
    /// texts without copying them.
    fn kept_text(&self, e: &Entry) -> Cow<'a, str> {
        match self.text_of(e) {
            Cow::Borrowed(text) => Cow::Borrowed(char_prefix(text, e.kept as usize)),
            Cow::Owned(mut text) => {
                text.truncate(char_prefix(&text, e.kept as usize).len());
                Cow::Owned(text)
            }
        }
    }

    /// Item `index`'s text cut to `keep` chars, head and tail (made once
    /// across turns: [`Parsed::cut_of`]); the text itself when that is
    /// not shorter.
    fn cut(&self, index: u32, keep: usize) -> Cow<'a, str> {
        let text = &self.conversation.items[index as usize].text;
        let cut = match u32::try_from(keep) {
            Ok(what) => self.parsed.cut_of(index as usize, what, |text| {
                agent::head_and_tail(text, keep).map(Arc::from)
            }),
            Err(_) => agent::head_and_tail(text, keep).map(Arc::from),
        };
        cut.map_or(Cow::Borrowed(text), |cut| Cow::Owned(cut.to_string()))
    }

    /// An entry's clipped arguments, by call position.
    fn arguments_of(&self, e: &Entry) -> Vec<(usize, String)> {
        if e.clipped == 0 {
            return Vec::new();
        }
        let item = &self.conversation.items[e.index as usize];
        item.tool_calls
            .iter()
            .enumerate()
            .take(32)
            .filter(|(pos, _)| e.clipped & (1 << pos) != 0)
            .filter_map(|(pos, call)| {
                agent::clip_arguments(&call.arguments, self.policy.agent.max_arg_chars)
                    .map(|args| (pos, args))
            })
            .collect()
    }

    /// An entry's fixed chars, with its clipped arguments and without its
    /// stripped reasoning.
    fn fixed_of(&self, e: &Entry) -> usize {
        let item = &self.conversation.items[e.index as usize];
        let fixed = if e.thinking == Reasoning::Stripped {
            item.fixed_chars - item.thinking.unwrap_or(0)
        } else {
            item.fixed_chars
        };
        self.arguments_of(e)
            .iter()
            .fold(fixed, |fixed, (pos, args)| {
                fixed - char_count(&item.tool_calls[*pos].arguments) + char_count(args)
            })
    }

    fn chars(&self, e: &Entry) -> usize {
        e.kept as usize + self.fixed_of(e)
    }

    fn total(&self, entries: &[Entry]) -> usize {
        entries.iter().map(|e| self.chars(e)).sum()
    }

    /// A checkpoint fits this conversation (a hash collision must not panic).
    fn valid(&self, state: &ReplayState, end: usize) -> bool {
        state.replayed == end
            && state.entries.iter().all(|e| {
                (e.index as usize) < end
                    && match e.edit {
                        Edit::Deduped(of) => of < e.index,
                        Edit::Excerpt(k) | Edit::PrunedAround(k) => state
                            .texts
                            .get(k as usize)
                            .is_some_and(|t| e.kept as usize <= char_count(t)),
                        _ => true,
                    }
                    && (e.edit.frozen().is_some() || e.kept as usize <= self.full_chars(e))
            })
    }

    /// The form compacted to the target, its head kept as it is. If the head
    /// must go for the form to fit the budget, it goes.
    /// The entries from `fresh` on are the unit that overflowed: the
    /// passes leave them as they are (they were cut on arrival).
    fn recompact(&self, entries: &[Entry], fresh: usize, protected_chars: usize) -> Vec<Entry> {
        let mut head_len = 0;
        let mut head_chars = 0;
        for e in entries {
            head_chars += self.chars(e);
            if head_chars > self.head {
                break;
            }
            head_len += 1;
        }
        // A head never splits a tool group.
        while head_len > 0 && head_len < entries.len() {
            let g = self.conversation.items[entries[head_len].index as usize].group;
            if g.is_some()
                && g == self.conversation.items[entries[head_len - 1].index as usize].group
            {
                head_len -= 1;
            } else {
                break;
            }
        }
        let target = self.target_for(entries, protected_chars);
        let mut kept = self.compact_to(entries, head_len, fresh, target);
        // The target is a wish, the budget a must: a target the passes
        // cannot reach (pruning saves less than the whole excess, the
        // last `keep_last_n` are kept) falls back to the whole budget.
        if self.over_budget(self.total(&kept), self.total_tokens(&kept)) {
            let within = self.compact_to(entries, head_len, fresh, self.budget);
            if self.total(&within) < self.total(&kept) {
                kept = within;
            }
        }
        self.strip_stale_thinking(entries, &mut kept);
        kept
    }

    /// The form compacted to the char target `target`, its first
    /// `head_len` entries kept (unless the budget needs them).
    fn compact_to(
        &self,
        entries: &[Entry],
        head_len: usize,
        fresh: usize,
        mut target: usize,
    ) -> Vec<Entry> {
        let mut kept = Vec::new();
        // Under a token budget the engine still counts chars: its char
        // target is the token target at the form's own chars per token,
        // tightened while the result's tokens miss it (a pure function of
        // the form, so every replica and every later turn agrees).
        for _ in 0..4 {
            kept = self.compact(entries, head_len, fresh, target);
            if head_len > 0 && self.over_budget(self.total(&kept), self.total_tokens(&kept)) {
                kept = self.compact(entries, 0, fresh, target);
            }
            let Some((_, budget_tokens)) = self.tokens else {
                break;
            };
            let tokens = self.total_tokens(&kept);
            if tokens <= budget_tokens || target == 0 {
                break;
            }
            let scaled = (target as u128 * budget_tokens as u128 / tokens.max(1) as u128) as usize;
            target = (scaled * 95 / 100).min(target - 1);
        }
        kept
    }

    /// The reasoning blocks of every entry from the first position where
    /// the re-compacted form differs from the form before it: what each of
    /// them saw has changed. (Entries before that position are as the
    /// model saw them; the stripping is itself part of the form, so the
    /// turns after this one see it too.)
    fn strip_stale_thinking(&self, before: &[Entry], after: &mut [Entry]) {
        let first_change = before
            .iter()
            .zip(after.iter())
            .take_while(|(a, b)| a == b)
            .count();
        let open = super::thinking::open_loop_turn(
            after
                .iter()
                .map(|e| &self.conversation.items[e.index as usize]),
        );
        for (k, e) in after.iter_mut().enumerate().skip(first_change) {
            if self.conversation.items[e.index as usize].thinking.is_some() {
                e.thinking = if Some(k) == open {
                    Reasoning::Stale
                } else {
                    Reasoning::Stripped
                };
            }
        }
    }

    /// What a re-compaction of `entries` aims at: `stable_target_ratio` of
    /// the budget, never below the protected items (pins, kept roles), and
    /// lower when the recent units are large, so that the room freed holds
    /// [`TURNS_OF_ROOM`] of them, down to the protected items alone. A
    /// target on the whole budget leaves little room beside a large fixed
    /// part (a coding agent's first message), and each re-compaction bills
    /// its changed tail in full. What the engine keeps anyway (the last
    /// `keep_last_n`) may keep the form above it; `recompact` falls back to
    /// the budget when the passes cannot reach it.
    fn target_for(&self, entries: &[Entry], protected_chars: usize) -> usize {
        let by_chars = self.target_within(
            self.budget,
            protected_chars,
            self.recent_unit(entries, |e| self.chars(e)),
        );
        let Some((_, budget_tokens)) = self.tokens else {
            return by_chars;
        };
        let tokens_of = |e: &Entry| self.tokens(e);
        let fixed_tokens: usize = entries
            .iter()
            .filter(|e| self.protected[e.index as usize])
            .map(tokens_of)
            .sum();
        let by_tokens = self.target_within(
            budget_tokens,
            fixed_tokens,
            self.recent_unit(entries, tokens_of),
        );
        // In chars, at the form's own chars per token.
        let (chars, tokens) = (self.total(entries), self.total_tokens(entries).max(1));
        let by_tokens_in_chars = (by_tokens as u128 * chars as u128 / tokens as u128) as usize;
        by_chars.min(by_tokens_in_chars)
    }

    /// A target within `budget` beside `fixed`, in whatever `fixed` and
    /// `unit` measure.
    fn target_within(&self, budget: usize, fixed: usize, unit: usize) -> usize {
        if fixed >= budget {
            return budget;
        }
        let by_ratio = ((budget as f64 * self.policy.stable_target_ratio) as usize).max(fixed);
        // The turns' room is what lies beyond the fixed part.
        let by_turns = budget.saturating_sub(TURNS_OF_ROOM * unit);
        by_ratio.min(by_turns).max(fixed)
    }

    /// The mean size, by `measure`, of the form's last [`RECENT_UNITS`]
    /// units (a tool group, or one item): what the next turns will likely add.
    fn recent_unit(&self, entries: &[Entry], measure: impl Fn(&Entry) -> usize) -> usize {
        let mut units = 0;
        let mut chars = 0;
        let mut k = entries.len();
        while k > 0 && units < RECENT_UNITS {
            let group = self.conversation.items[entries[k - 1].index as usize].group;
            loop {
                k -= 1;
                chars += measure(&entries[k]);
                let before = k
                    .checked_sub(1)
                    .map(|j| self.conversation.items[entries[j].index as usize].group);
                if group.is_none() || before != Some(group) {
                    break;
                }
            }
            units += 1;
        }
        chars / units.max(1)
    }

    fn compact(
        &self,
        entries: &[Entry],
        head_len: usize,
        fresh: usize,
        target: usize,
    ) -> Vec<Entry> {
        let entries = self.agent_passes(entries, head_len, fresh, target);
        let messages: Vec<Message> = entries
            .iter()
            .enumerate()
            .map(|(k, e)| {
                let item = &self.conversation.items[e.index as usize];
                let (content, fixed_chars) = if self.excluded[e.index as usize] {
                    (Cow::Borrowed(""), self.chars(e))
                } else {
                    (self.kept_text(e), self.fixed_of(e))
                };
                Message {
                    role: item.role,
                    content,
                    id: None,
                    pin: k < head_len || self.pins[e.index as usize],
                    fixed_chars,
                    group: item.group,
                    subject: self.subjects[e.index as usize].clone(),
                }
            })
            .collect();
        let mut policy = self.policy.engine.clone();
        policy.budget_chars = target;
        // Each text's key, hashed once per replay where it is the
        // conversation's own text (most are, form after form).
        let keys = messages.iter().map(|m| self.key_of(&m.content)).collect();
        let known = engine::Known {
            keys: Some(keys),
            ..engine::Known::default()
        };
        let report = engine::compact_scored(&messages, &policy, &self.caches, known);
        report
            .messages
            .iter()
            .map(|m| {
                let e = entries[m.index];
                if self.excluded[e.index as usize] {
                    return e;
                }
                let kept = (m.chars - self.fixed_of(&e)) as u32;
                // The engine cut a relevant message around its match (an
                // excerpt, not a prefix of what it was given): frozen.
                if kept < e.kept && !messages[m.index].content.starts_with(&m.content) {
                    return Entry {
                        kept,
                        edit: Edit::Excerpt(self.freeze(m.content.clone())),
                        ..e
                    };
                }
                Entry { kept, ..e }
            })
            .collect()
    }

    /// The agent passes over the running form, down to the target: only
    /// entries outside the head that no pass or trim has touched yet are
    /// candidates, so each edit stays a pure function of its item.
    fn agent_passes(
        &self,
        entries: &[Entry],
        head_len: usize,
        fresh: usize,
        target: usize,
    ) -> Vec<Entry> {
        let form = Conversation {
            items: entries
                .iter()
                .map(|e| {
                    let mut item = self.conversation.items[e.index as usize]
                        .with_text(self.kept_text(e).into_owned());
                    item.fixed_chars = self.fixed_of(e);
                    for (pos, args) in self.arguments_of(e) {
                        item.tool_calls[pos].arguments = args;
                    }
                    item
                })
                .collect(),
            outside_chars: 0,
        };
        let mut untouchable: Vec<bool> = entries
            .iter()
            .enumerate()
            .map(|(k, e)| {
                k < head_len
                    || k >= fresh
                    || self.protected[e.index as usize]
                    || !matches!(e.edit, Edit::None | Edit::Capped(_))
                    || e.clipped != 0
                    || e.kept as usize != self.full_chars(e)
            })
            .collect();
        // Relevance to the form's latest request, like the engine's below
        // (seed scoring has none: its messages are not built).
        let mut found = None;
        if self.scores_relevance() && self.policy.agent.any_pass() && form.total_chars() > target {
            // A tool result is scored with its call, as in exact mode.
            let messages: Vec<Message> = form
                .items
                .iter()
                .zip(entries)
                .map(|(item, e)| Message {
                    subject: self.subjects[e.index as usize].clone(),
                    ..Message::borrowed(item.role, item.text.as_str())
                })
                .collect();
            found = super::protect_relevant(&form, &messages, self.policy, &mut untouchable);
        }
        let mut edits = agent::run(
            &form,
            &untouchable,
            target,
            &self.policy.agent,
            &|k, call| {
                call < 32
                    && self
                        .parsed
                        .can_replace_arguments(entries[k].index as usize, call)
            },
        );
        if edits.is_empty() {
            return entries.to_vec();
        }
        // A relevant result is pruned around its match, not to head and
        // tail; that cut is frozen.
        let mut around = std::collections::HashSet::new();
        if let Some(found) = &found {
            let cuts: Vec<(usize, String)> = edits
                .texts
                .iter()
                .filter_map(|(&k, edit)| match edit {
                    TextEdit::Pruned(cut) => Some((k, cut.clone())),
                    _ => None,
                })
                .collect();
            super::relevant::prune_around_matches(&form, found, &mut edits);
            for (k, cut) in cuts {
                if matches!(edits.texts.get(&k), Some(TextEdit::Pruned(now)) if *now != cut) {
                    around.insert(k);
                }
            }
        }
        let mut out = entries.to_vec();
        for (&k, edit) in &edits.texts {
            let e = &mut out[k];
            e.edit = match edit {
                TextEdit::Pruned(cut) if around.contains(&k) => {
                    Edit::PrunedAround(self.freeze(cut.clone()))
                }
                TextEdit::Pruned(_) => Edit::Pruned,
                TextEdit::Deduped { .. } => {
                    // The earlier result the marker names, by item index.
                    let of = form
                        .items
                        .iter()
                        .take(k)
                        .rposition(|item| {
                            matches!(edit, TextEdit::Deduped { of, .. } if item.answers.as_deref() == Some(of.as_str()))
                        })
                        .map(|j| entries[j].index);
                    match of {
                        Some(of) => Edit::Deduped(of),
                        None => continue,
                    }
                }
            };
            e.kept = char_count(&self.text_of(e)) as u32;
        }
        for (&k, args) in &edits.arguments {
            for (pos, _) in args {
                out[k].clipped |= 1 << pos;
            }
        }
        out
    }
}
