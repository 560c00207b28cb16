//! The format-neutral compaction pipeline: from a parsed body's
//! [`Conversation`] to a [`Plan`] of what survives, under a policy.
//!
//! Order, the same for every format:
//! 1. **pins** ([`engine_messages`]): the policy's pin rules
//!    (`pin_first_user`, `pin_patterns`) and the format's fixed items
//!    become engine pins; roles are the engine's own (`keep_roles`).
//! 2. **triggers**: below every set trigger (`trigger_chars`,
//!    `trigger_messages`) the body goes as it came, even over its budget.
//! 3. **mode**: `exact` runs the agent passes ([`agent`]: tool dedupe,
//!    prune, clip) and then the engine on the whole conversation, each
//!    stopping once it fits; `stable` replays it so each turn extends the
//!    previous one ([`stable`]; the agent passes run only when the form is
//!    re-compacted, never on a turn that only appends).
//! 4. **format rules** ([`crate::format::Format::repair`]): what the API
//!    requires of the survivors (a Messages conversation starts with a user
//!    turn).
//! 5. **loss** ([`loss_of`]): what the plan removed, for headers and metrics.
//!
//! Pure: no I/O and no async, like the engine it drives.

pub mod agent;
pub mod budget;
pub mod decisions;
pub mod policy;
pub mod recall;
pub mod relevant;
pub mod stable;
pub mod status;
pub mod summary;
pub mod thinking;
pub mod tokens;

use std::borrow::Cow;

use crate::engine::{self, Kept, Message, Report};
use crate::format::{Conversation, Parsed, Plan, Planned, Reasoning};
use crate::outcome::LossSummary;
use policy::{CompiledPolicy, Mode};

/// Which items `policy` protects from every pass: the engine's pins and
/// the roles it keeps.
pub fn protected_items(conversation: &Conversation, policy: &CompiledPolicy) -> Vec<bool> {
    pins(conversation, policy)
        .into_iter()
        .zip(&conversation.items)
        .map(|(pin, m)| pin || policy.engine.keep_roles.contains(&m.role))
        .collect()
}

/// Which items `policy`'s pin rules (and the format's fixed items) pin.
pub fn pins(conversation: &Conversation, policy: &CompiledPolicy) -> Vec<bool> {
    let items = &conversation.items;
    let first_user = items.iter().position(|m| m.role == engine::Role::User);
    items
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.fixed
                || (policy.pin_first_user && first_user == Some(i))
                || (!policy.pin_patterns.is_empty() && policy.pin_patterns.is_match(&m.text))
        })
        .collect()
}

/// `scoring = "relevance"`: marks in `protected` the items whose relevance
/// to the latest request (`messages` are the items' engine view) is at
/// least `pin_relevant_above`, with the items of the same tool calls (a
/// relevant result protects its call, a relevant call its results), so
/// the agent passes neither prune, dedupe nor clip them. Unlike the
/// engine's relevance pins, no budget share caps these: they only keep the
/// passes off, the engine still decides what fits. Returns what relevance
/// found (`None` under seed scoring, which marks nothing).
pub fn protect_relevant(
    conversation: &Conversation,
    messages: &[Message],
    policy: &CompiledPolicy,
    protected: &mut [bool],
) -> Option<engine::relevance::Relevance> {
    protect_relevant_keyed(conversation, messages, policy, protected).map(|(found, _)| found)
}

/// [`protect_relevant`], giving back the messages' keys when it hashed
/// them (for the engine's lookups) and what it counted of them (for the
/// engine's scoring of the texts the passes leave).
fn protect_relevant_keyed(
    conversation: &Conversation,
    messages: &[Message],
    policy: &CompiledPolicy,
    protected: &mut [bool],
) -> Option<(engine::relevance::Relevance, engine::Known)> {
    let engine::ScoringMethod::Relevance(knobs) = &policy.engine.scoring else {
        return None;
    };
    let (found, keys, counted) = engine::relevance::analyze_counted(
        messages,
        knobs.goal.as_deref(),
        &*policy.analyses,
        None,
        None,
    );
    let relevant: Vec<bool> = found
        .relevance
        .iter()
        .enumerate()
        .map(|(i, &r)| Some(i) != found.query_index && r > 0.0 && r >= knobs.pin_relevant_above)
        .collect();
    relevant::protect_units(conversation, &relevant, protected);
    let known = engine::Known {
        relevance: None,
        keys,
        counted,
    };
    Some((found, known))
}

/// The engine's view of the items under `policy`'s pin rules, their texts
/// borrowed from `conversation`.
pub fn engine_messages<'a>(
    conversation: &'a Conversation,
    policy: &CompiledPolicy,
) -> Vec<Message<'a>> {
    let subjects = relevant::subjects(conversation, policy);
    conversation
        .items
        .iter()
        .zip(pins(conversation, policy))
        .zip(subjects)
        .map(|((m, pin), subject)| Message {
            role: m.role,
            content: Cow::Borrowed(&m.text),
            id: None,
            pin,
            fixed_chars: m.fixed_chars,
            group: m.group,
            subject,
        })
        .collect()
}

/// The engine's policy for the items alone: chars outside the compacted
/// array (a system prompt, instructions) are spent before the items get any.
pub fn item_policy(conversation: &Conversation, policy: &CompiledPolicy) -> engine::Policy {
    let mut engine = policy.engine.clone();
    engine.budget_chars = engine
        .budget_chars
        .saturating_sub(conversation.outside_chars);
    engine
}

/// The plan a report describes: its survivors, trimmed ones with their text.
pub fn plan_of(report: &Report) -> Plan {
    Plan {
        items: report
            .messages
            .iter()
            .map(|m| Planned {
                index: m.index,
                text: (m.kept == Kept::Trimmed).then(|| m.content.clone()),
                arguments: Vec::new(),
                pieces: None,
                thinking: Default::default(),
            })
            .collect(),
    }
}

/// Whether a plan forwards anything other than every item as it came.
pub fn changes(plan: &Plan, items: usize) -> bool {
    plan.items.len() != items
        || plan.items.iter().any(|p| {
            p.text.is_some() || !p.arguments.is_empty() || p.thinking != Reasoning::AsTheyCame
        })
}

/// Exact mode: the engine over the whole conversation. The plan is `None`
/// when nothing changed.
pub fn run_engine(conversation: &Conversation, policy: &CompiledPolicy) -> (Report, Option<Plan>) {
    let messages = engine_messages(conversation, policy);
    let report = engine::compact_cached(
        &messages,
        &item_policy(conversation, policy),
        &*policy.analyses,
    );
    let plan = plan_of(&report);
    let changed = changes(&plan, conversation.items.len());
    (report, changed.then_some(plan))
}

/// What compacting a parsed body gives: the plan to forward (`None` when
/// the body goes as it came) and the loss it reports.
#[derive(Debug, Clone)]
pub struct Compacted {
    pub plan: Option<Plan>,
    pub loss: LossSummary,
    /// Stable mode: leading forwarded items unchanged since the last
    /// re-compaction, and whether this turn's new items caused one.
    pub stable: Option<stable::StableInfo>,
    /// The char budget the passes ran at: the policy's, or under a token
    /// budget the last round's (the report re-runs the engine at it).
    pub budget_chars: usize,
}

/// Compacts a parsed body under `policy`, in the policy's mode.
/// `checkpoints` lets stable mode resume from an earlier turn's replay.
pub fn compact(
    parsed: &Parsed,
    policy: &CompiledPolicy,
    checkpoints: &dyn stable::Checkpoints,
) -> Compacted {
    compact_decided(parsed, policy, checkpoints, None)
}

/// [`compact`], with a model's tool-call decisions ([`decisions`]) applied
/// before the agent passes (exact mode; stable mode ignores them).
pub fn compact_decided(
    parsed: &Parsed,
    policy: &CompiledPolicy,
    checkpoints: &dyn stable::Checkpoints,
    decided: Option<&decisions::Applied>,
) -> Compacted {
    let conversation = &parsed.conversation;
    let budget = policy.engine.budget_chars;
    let total = parsed.total_chars();
    let needs_tokens = policy.budget_tokens.is_some()
        || policy.agent.trigger_tokens > 0
        || policy.auto_budget.is_some();
    let (model, max_output) = if needs_tokens {
        parsed.request_limits()
    } else {
        (None, None)
    };
    let encoding = needs_tokens
        .then(|| tokens::Encoding::for_model(model.as_deref(), policy.tokenizer_fallback));
    let input_tokens = std::cell::OnceCell::new();
    let count_input =
        || *input_tokens.get_or_init(|| encoding.map_or(0, |e| e.conversation(conversation)));
    let triggered = policy.agent.triggered(conversation, count_input);
    // `budget = "auto"`: the model's window is the budget, in tokens alone.
    // A model no table knows falls back to the fixed budgets.
    let derived = policy
        .auto_budget
        .as_ref()
        .and_then(|auto| auto.budget_tokens(model.as_deref(), max_output));
    let token_budget = match derived {
        Some(tokens) => Some((tokens, usize::MAX)),
        None => policy.budget_tokens.map(|tokens| (tokens, budget)),
    };
    if let (Some((budget_tokens, budget_chars)), Some(encoding), Mode::Exact) =
        (token_budget, encoding, policy.mode)
    {
        let budgets = Budgets {
            tokens: budget_tokens,
            chars: budget_chars,
        };
        return compact_to_tokens(parsed, policy, encoding, budgets, triggered, decided);
    }
    // Stable mode replays within the token budget as well.
    let stable_tokens = token_budget
        .zip(encoding)
        .map(|((tokens, chars), encoding)| stable::TokenBudget {
            encoding,
            tokens,
            chars,
        });
    let budget = stable_tokens.map_or(budget, |t| t.chars);
    let fits_tokens = || stable_tokens.map_or(true, |t| count_input() <= t.tokens);
    let mut edits = agent::AgentEdits::default();
    // Items the dedupe stage removed (exact mode; stable mode's replay
    // reports its removals as drops).
    let mut deduped = 0;
    let (plan, stable) = match policy.mode {
        Mode::Exact => {
            if total <= budget || !triggered {
                (None, None)
            } else {
                let (plan, done, report) = run_passes_decided(parsed, policy, decided);
                edits = done;
                deduped = report.stages.dedupe.removed_messages;
                (plan, None)
            }
        }
        Mode::Stable if !triggered => (None, None),
        Mode::Stable if total <= budget && fits_tokens() => {
            // Every prefix fits too: the replay would only have appended.
            let prev = stable::previous_turn_end(conversation);
            let info = stable::StableInfo {
                stable_messages: prev,
                rebased: false,
                recompactions: 0,
                resumed: None,
            };
            (None, Some(info))
        }
        Mode::Stable => {
            let replayed = stable::replay(parsed, policy, stable_tokens, checkpoints);
            edits = replayed.edits;
            let plan = changes(&replayed.plan, conversation.items.len()).then_some(replayed.plan);
            (plan, Some(replayed.info))
        }
    };
    let plan = plan.map(|mut plan| {
        parsed.format.repair(conversation, &mut plan);
        if policy.mode == Mode::Exact {
            thinking::strip_stale_exact(conversation, &mut plan, budget);
        }
        plan
    });
    let over_budget = triggered && total > budget;
    let plan = match plan {
        None if policy.mode == Mode::Exact && over_budget => {
            thinking::stale_only(conversation, budget)
        }
        plan => plan,
    };
    let loss = match &plan {
        Some(plan) => LossSummary {
            deduped_messages: deduped,
            ..loss_counted(conversation, parsed.text_chars(), plan, budget, &edits)
        },
        None => LossSummary::unchanged_within(total, conversation.items.len(), budget),
    };
    // A replay that re-compacted to the request as it came changed
    // nothing the client or the cache can see.
    let stable = stable.map(|info| stable::StableInfo {
        rebased: info.rebased && plan.is_some(),
        ..info
    });
    let loss = match stable_tokens {
        Some(t) => {
            let input = count_input();
            let output = plan
                .as_ref()
                .map_or(input, |p| t.encoding.plan(conversation, p));
            LossSummary {
                budget_met: loss.budget_met && output <= t.tokens,
                input_tokens: Some(input),
                output_tokens: Some(output),
                budget_tokens: Some(t.tokens),
                ..loss
            }
        }
        None => loss,
    };
    Compacted {
        plan,
        loss: within_triggers(loss, triggered),
        stable,
        budget_chars: budget,
    }
}

/// A body below every trigger is within what its policy allows: it is
/// forwarded as it came, and not counted as a budget miss.
fn within_triggers(loss: LossSummary, triggered: bool) -> LossSummary {
    LossSummary {
        budget_met: loss.budget_met || !triggered,
        ..loss
    }
}

/// The budgets of a request compacted to tokens.
#[derive(Debug, Clone, Copy)]
struct Budgets {
    tokens: usize,
    /// `budget_chars`, or no limit (`usize::MAX`) when the token budget was
    /// derived from the model's window and is the whole budget.
    chars: usize,
}

/// Exact mode under a token budget (beside the char budget, or alone): the
/// char pipeline runs at a char budget scaled by the conversation's chars
/// per token, tightened until the forwarded tokens fit too (a few rounds).
fn compact_to_tokens(
    parsed: &Parsed,
    policy: &CompiledPolicy,
    encoding: tokens::Encoding,
    budgets: Budgets,
    triggered: bool,
    decided: Option<&decisions::Applied>,
) -> Compacted {
    let conversation = &parsed.conversation;
    let total = conversation.total_chars();
    let budget = budgets.chars;
    let budget_tokens = budgets.tokens;
    let input_tokens = encoding.conversation(conversation);
    let with_tokens = |mut loss: LossSummary, output_tokens: usize| {
        loss.budget_met = loss.budget_met && output_tokens <= budget_tokens;
        loss.input_tokens = Some(input_tokens);
        loss.output_tokens = Some(output_tokens);
        loss.budget_tokens = Some(budget_tokens);
        loss
    };
    if (total <= budget && input_tokens <= budget_tokens) || !triggered {
        let loss = LossSummary::unchanged_within(total, conversation.items.len(), budget);
        return Compacted {
            plan: None,
            loss: within_triggers(with_tokens(loss, input_tokens), triggered),
            stable: None,
            budget_chars: budget,
        };
    }
    let scaled = |chars: usize, tokens: usize| {
        (chars as u128 * budget_tokens as u128 / tokens.max(1) as u128) as usize
    };
    let mut chars_budget = if input_tokens > budget_tokens {
        budget.min(scaled(total, input_tokens))
    } else {
        budget
    };
    let mut round = policy.clone();
    let mut best = None;
    for _ in 0..6 {
        round.engine.budget_chars = chars_budget;
        let (plan, edits, deduped) = if total <= chars_budget {
            (None, agent::AgentEdits::default(), 0)
        } else {
            let (plan, edits, report) = run_passes_decided(parsed, &round, decided);
            (plan, edits, report.stages.dedupe.removed_messages)
        };
        let plan = plan.map(|mut plan| {
            parsed.format.repair(conversation, &mut plan);
            thinking::strip_stale_exact(conversation, &mut plan, chars_budget);
            plan
        });
        let plan = match plan {
            None if triggered && total > chars_budget => {
                thinking::stale_only(conversation, chars_budget)
            }
            plan => plan,
        };
        let output_tokens = plan
            .as_ref()
            .map_or(input_tokens, |p| encoding.plan(conversation, p));
        let loss = match &plan {
            Some(plan) => LossSummary {
                deduped_messages: deduped,
                ..loss_with_passes(conversation, plan, budget, &edits)
            },
            None => LossSummary::unchanged_within(total, conversation.items.len(), budget),
        };
        let done = output_tokens <= budget_tokens || chars_budget == 0;
        best = Some(Compacted {
            plan,
            loss: with_tokens(loss, output_tokens),
            stable: None,
            budget_chars: chars_budget,
        });
        if done {
            break;
        }
        // Aim a little under: the chars per token of what is left differ.
        let next = scaled(chars_budget, output_tokens) * 97 / 100;
        chars_budget = next.min(chars_budget.saturating_sub(1));
    }
    best.expect("at least one round")
}

/// Exact mode: the agent passes, then the engine on what they left, each
/// stopping once the conversation fits. The plan is `None` when nothing
/// changed.
/// Also returns the engine's report over what the passes left.
pub fn run_passes(
    parsed: &Parsed,
    policy: &CompiledPolicy,
) -> (Option<Plan>, agent::AgentEdits, Report) {
    run_passes_decided(parsed, policy, None)
}

/// [`run_passes`] after a model's tool-call decisions: their cuts come
/// first, the passes leave the calls they cover alone, and the units they
/// drop go whatever the engine keeps.
pub fn run_passes_decided(
    parsed: &Parsed,
    policy: &CompiledPolicy,
    decided: Option<&decisions::Applied>,
) -> (Option<Plan>, agent::AgentEdits, Report) {
    let conversation = &parsed.conversation;
    let mut messages = engine_messages(conversation, policy);
    let mut protected = protected_items(conversation, policy);
    let mut found = None;
    let mut known = engine::Known::default();
    if policy.agent.any_pass() && conversation.total_chars() > policy.engine.budget_chars {
        if let Some((relevance, counted)) =
            protect_relevant_keyed(conversation, &messages, policy, &mut protected)
        {
            found = Some(relevance);
            known = counted;
        }
    }
    let decided = decided.filter(|d| d.dropped.len() == conversation.items.len());
    let with_decisions;
    let seen_by_passes = match decided {
        Some(d) => {
            let mut seen = d.edits.apply(conversation);
            for (item, &dropped) in seen.items.iter_mut().zip(&d.dropped) {
                if dropped {
                    item.text.clear();
                    item.fixed_chars = 0;
                }
            }
            for (p, &covered) in protected.iter_mut().zip(&d.decided) {
                *p = *p || covered;
            }
            with_decisions = seen;
            &with_decisions
        }
        None => conversation,
    };
    let mut edits = agent::run(
        seen_by_passes,
        &protected,
        policy.engine.budget_chars,
        &policy.agent,
        &|item, call| parsed.can_replace_arguments(item, call),
    );
    if let Some(d) = decided {
        for (&i, edit) in &d.edits.texts {
            edits.texts.insert(i, edit.clone());
        }
    }
    if let Some(found) = &found {
        relevant::prune_around_matches_cached(conversation, found, &mut edits, &*policy.analyses);
    }
    // A chat without tools (most bodies) has no edits: the conversation
    // and the messages already made from it are what the engine sees.
    let applied;
    let edited = if edits.is_empty() {
        conversation
    } else {
        applied = edits.apply(conversation);
        &applied
    };
    // Excluded tools' units reach the engine as fixed chars: it may drop
    // them whole but never cut them.
    let excluded = agent::excluded_items(conversation, &policy.agent);
    // Pins come from the items as they came, not from the edited text.
    let mut texts_changed = false;
    for (i, (m, item)) in messages.iter_mut().zip(&edited.items).enumerate() {
        let text_before = m.content.len();
        let mut changed = false;
        if decided.is_some_and(|d| d.dropped[i]) {
            changed = text_before > 0;
            m.content = Cow::Borrowed("");
            m.fixed_chars = 0;
        } else if excluded[i] {
            changed = text_before > 0;
            m.content = Cow::Borrowed("");
            m.fixed_chars = item.chars();
        } else {
            if edits.texts.contains_key(&i) && m.content != item.text {
                changed = true;
                m.content = Cow::Owned(item.text.clone());
            }
            m.fixed_chars = item.fixed_chars;
        }
        if changed {
            texts_changed = true;
            if let Some(keys) = &mut known.keys {
                keys[i] = engine::relevance::message_key(&m.content);
            }
        }
    }
    // What the passes' relevance found holds for the engine's messages
    // when no text changed (a chat without tools: most bodies).
    known.relevance = found.filter(|_| !texts_changed);
    if known.relevance.is_some() {
        known.counted = None;
    }
    let report = engine::compact_scored(
        &messages,
        &item_policy(edited, policy),
        &*policy.analyses,
        known,
    );
    let mut plan = plan_of(&report);
    if let Some(d) = decided {
        plan.items.retain(|p| !d.dropped[p.index]);
    }
    for p in &mut plan.items {
        if excluded[p.index] {
            p.text = None;
        } else if p.text.is_none() {
            p.text = edits.texts.get(&p.index).map(|e| e.text().to_owned());
            p.pieces = edits.pieces.get(&p.index).cloned();
        } else if let (Some(pieces), Some(text)) = (edits.pieces.get(&p.index), &p.text) {
            // The engine cut a text pruned result by result further.
            p.pieces = agent::cut_pieces(pieces, text);
        }
        if let Some(args) = edits.arguments.get(&p.index) {
            p.arguments = args.clone();
        }
    }
    if !changes(&plan, conversation.items.len()) {
        return (None, edits, report);
    }
    (Some(plan), edits, report)
}

/// The loss a plan reports against the conversation it came from.
pub fn loss_of(conversation: &Conversation, plan: &Plan, budget: usize) -> LossSummary {
    loss_with_passes(conversation, plan, budget, &agent::AgentEdits::default())
}

/// The loss of a plan made by the agent passes' `edits` and the engine:
/// chars the passes removed from surviving items count per pass; an item
/// counts as trimmed only when the engine cut it further.
pub fn loss_with_passes(
    conversation: &Conversation,
    plan: &Plan,
    budget: usize,
    edits: &agent::AgentEdits,
) -> LossSummary {
    let text_chars: Vec<usize> = conversation
        .items
        .iter()
        .map(|m| engine::text::char_count(&m.text))
        .collect();
    loss_counted(conversation, &text_chars, plan, budget, edits)
}

/// [`loss_with_passes`], given the chars of each item's text.
fn loss_counted(
    conversation: &Conversation,
    text_chars: &[usize],
    plan: &Plan,
    budget: usize,
    edits: &agent::AgentEdits,
) -> LossSummary {
    use engine::text::char_count;
    let item_chars = |i: usize| text_chars[i] + conversation.items[i].fixed_chars;
    let input_chars = conversation.total_chars_of(text_chars);
    let mut output_chars = conversation.outside_chars;
    let mut trimmed = 0;
    let mut stripped_thinking = 0;
    let (mut pruned, mut deduped, mut clipped) = (0, 0, 0);
    for p in &plan.items {
        let item = &conversation.items[p.index];
        let mut chars = item_chars(p.index);
        if p.thinking == Reasoning::Stripped {
            chars -= item.thinking.unwrap_or(0);
            stripped_thinking += 1;
        }
        if let Some(text) = &p.text {
            chars = chars - text_chars[p.index] + char_count(text);
            let by_pass = edits.texts.get(&p.index).map(|e| e.text());
            if by_pass != Some(text.as_str()) {
                trimmed += 1;
            }
        }
        for (call, args) in &p.arguments {
            if let Some(old) = item.tool_calls.get(*call) {
                chars = chars - char_count(&old.arguments) + char_count(args);
            }
        }
        let (p_chars, d_chars) = edits.text_saving(text_chars[p.index], p.index);
        pruned += p_chars;
        deduped += d_chars;
        clipped += edits.clip_saving(conversation, p.index);
        output_chars += chars;
    }
    LossSummary {
        input_chars,
        output_chars,
        input_messages: conversation.items.len(),
        output_messages: plan.items.len(),
        dropped_messages: conversation.items.len() - plan.items.len(),
        deduped_messages: 0,
        trimmed_messages: trimmed,
        retained_ratio: if input_chars == 0 {
            1.0
        } else {
            engine::round_to(output_chars as f64 / input_chars as f64, 4)
        },
        budget_met: output_chars <= budget,
        pruned_chars: pruned,
        clipped_chars: clipped,
        deduped_tool_chars: deduped,
        stripped_thinking,
        input_tokens: None,
        output_tokens: None,
        budget_tokens: None,
    }
}

impl Parsed<'_> {
    /// The engine's view of the items under `policy`'s pin rules, with
    /// texts of their own (kept past the parse).
    pub fn engine_messages(&self, policy: &CompiledPolicy) -> Vec<Message<'static>> {
        engine_messages(&self.conversation, policy)
            .into_iter()
            .map(Message::into_owned)
            .collect()
    }

    /// Runs the agent passes and the engine (exact mode) and, when anything
    /// changed, the body to forward.
    pub fn compact(&self, policy: &CompiledPolicy) -> (Report, Option<String>) {
        let (plan, _, report) = run_passes(self, policy);
        let body = plan.map(|mut plan| {
            self.format.repair(&self.conversation, &mut plan);
            self.splice(&plan)
        });
        (report, body)
    }
}

#[cfg(test)]
mod tests {
    use super::agent::tests::{call, numbered, result};
    use super::*;
    use crate::engine::{RelevancePolicy, Role, ScoringMethod};
    use crate::format::Item;

    /// Two long tool results, the older holding the fact the latest
    /// request asks about.
    fn conversation() -> Conversation {
        let args = |path: &str| format!(r#"{{"path": "{path}", "pad": "{}"}}"#, "y".repeat(200));
        let fact = format!(
            "{}The gate code for depot Norrby is 7731-KAPPA. {}",
            numbered(60, "line"),
            numbered(60, "line")
        );
        Conversation {
            items: vec![
                Item::new(Role::User, "Task: check the sites."),
                call("call_1", "read_file", &args("a.txt")),
                result("call_1", &fact),
                call("call_2", "read_file", &args("b.txt")),
                result("call_2", &numbered(120, "row")),
                Item::new(Role::User, "What is the gate code for depot Norrby?"),
            ],
            outside_chars: 0,
        }
    }

    fn policy(scoring: ScoringMethod) -> CompiledPolicy {
        let mut engine = engine::Policy::with_budget(0);
        engine.scoring = scoring;
        let mut policy = CompiledPolicy::plain("t", engine);
        policy.agent = agent::AgentPolicy {
            max_tool_result_chars: 100,
            protect_tool_chars: 0,
            prune_minimum_chars: 0,
            max_arg_chars: 40,
            ..agent::AgentPolicy::DEFAULT
        };
        policy
    }

    fn passes(policy: &CompiledPolicy) -> agent::AgentEdits {
        let conversation = conversation();
        let messages = engine_messages(&conversation, policy);
        let mut protected = protected_items(&conversation, policy);
        protect_relevant(&conversation, &messages, policy, &mut protected);
        agent::run(&conversation, &protected, 10, &policy.agent, &|_, _| true)
    }

    #[test]
    fn a_tool_result_relevant_to_the_request_is_neither_pruned_nor_clipped() {
        let relevance = passes(&policy(
            ScoringMethod::Relevance(RelevancePolicy::default()),
        ));
        assert!(
            !relevance.texts.contains_key(&2),
            "the fact's result is whole"
        );
        assert!(
            !relevance.arguments.contains_key(&1),
            "its call is not clipped"
        );
        assert!(
            relevance.texts.contains_key(&4),
            "the other result is pruned"
        );
        assert!(relevance.arguments.contains_key(&3), "its call is clipped");

        // Seed scoring knows no relevance: both are cut.
        let seed = passes(&policy(ScoringMethod::Seed));
        assert!(seed.texts.contains_key(&2) && seed.texts.contains_key(&4));
        assert!(seed.arguments.contains_key(&1) && seed.arguments.contains_key(&3));
    }

    #[test]
    fn a_threshold_above_every_relevance_protects_nothing() {
        let knobs = RelevancePolicy {
            pin_relevant_above: 1.01,
            ..RelevancePolicy::default()
        };
        let edits = passes(&policy(ScoringMethod::Relevance(knobs)));
        assert!(edits.texts.contains_key(&2));
    }

    /// Checkpoints in a map: what the proxy's store keeps.
    #[derive(Default)]
    struct MapCheckpoints(
        std::sync::Mutex<std::collections::HashMap<u128, std::sync::Arc<stable::ReplayState>>>,
    );

    impl stable::Checkpoints for MapCheckpoints {
        fn get(&self, key: u128) -> Option<std::sync::Arc<stable::ReplayState>> {
            self.0.lock().unwrap().get(&key).cloned()
        }
        fn put(&self, key: u128, state: std::sync::Arc<stable::ReplayState>) {
            self.0.lock().unwrap().insert(key, state);
        }
    }

    #[test]
    fn a_retried_last_message_resumes_from_the_previous_turn() {
        // Forty turns that re-compact several times on the way, then a
        // question; the retry asks it again in other words.
        let body = |question: &str| {
            let mut messages: Vec<serde_json::Value> = (0..40)
                .map(|i| {
                    let role = if i % 2 == 0 { "user" } else { "assistant" };
                    let text = format!("turn {i}: {}", numbered(12, &format!("word{}", i % 7)));
                    serde_json::json!({"role": role, "content": text})
                })
                .collect();
            messages.push(serde_json::json!({"role": "user", "content": question}));
            serde_json::json!({"model": "m", "messages": messages}).to_string()
        };
        let mut policy = CompiledPolicy::plain("t", engine::Policy::with_budget(1_500));
        policy.mode = Mode::Stable;
        let kept = MapCheckpoints::default();
        let first = body("What did turn 3 say?");
        let first = crate::format::Format::Chat
            .parse(first.as_bytes(), usize::MAX)
            .unwrap();
        let info = compact(&first, &policy, &kept).stable.unwrap();
        assert_eq!(info.resumed, Some(false));
        assert!(info.recompactions > 1, "{info:?}");

        let retry = body("Which words did the third turn use?");
        let retry = crate::format::Format::Chat
            .parse(retry.as_bytes(), usize::MAX)
            .unwrap();
        let warm = compact(&retry, &policy, &kept);
        let cold = compact(&retry, &policy, &stable::NoCheckpoints);
        let (warm_info, cold_info) = (warm.stable.unwrap(), cold.stable.unwrap());
        assert_eq!(warm_info.resumed, Some(true), "{warm_info:?}");
        assert_eq!(
            (warm_info.stable_messages, warm_info.rebased),
            (cold_info.stable_messages, cold_info.rebased)
        );
        assert_eq!(
            retry.splice(warm.plan.as_ref().unwrap()),
            retry.splice(cold.plan.as_ref().unwrap())
        );
    }
}
