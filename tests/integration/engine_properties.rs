//! Property tests of the compaction engine (`COMPACTION.md`) over random
//! conversations.
//!
//! Contents are built from a small vocabulary (so exact and near duplicates
//! are frequent), with sentence ends (`.`, `!`, `?`) and non-ASCII text: CJK
//! (`配送状態`), emoji (`🚚`), a combining mark (`e\u{301}cole`) and `ß`
//! (`Größe`). Policies are random too: budget 0..=1.2 x total, keep_last_n
//! 0..6, a random subset of keep_roles, duplicate_threshold 0.5..=1.0 and
//! max_message_chars 10..300.
//!
//! Besides the invariants, `engine_matches_a_naive_model_of_the_spec` checks
//! every decision against a direct, quadratic transcription of the spec's
//! stages, which covers the engine's prefix-filtered dedupe and its scores.

use std::collections::{HashMap, HashSet};

use compaction_proxy::analysis_store::AnalysisStore;
use compaction_proxy::engine::{
    compact, compact_cached, Cut, Kept, Message, Policy, ProtectedBecause, Report, Role,
};
use proptest::collection::SizeRange;
use proptest::prelude::*;

// ---------------------------------------------------------------- helpers

fn chars(text: &str) -> usize {
    text.chars().count()
}

fn total_chars(messages: &[Message]) -> usize {
    messages.iter().map(|m| chars(&m.content)).sum()
}

/// Protection as the spec defines it (pin, role, recent), ignoring groups.
fn spec_protected(messages: &[Message], policy: &Policy, i: usize) -> bool {
    messages[i].pin
        || policy.keep_roles.contains(&messages[i].role)
        || i >= messages.len().saturating_sub(policy.keep_last_n)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        // Keep failing seeds out of the source tree; the shrunk input is
        // printed in the failure message.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

// ------------------------------------------------------------- generators

const WORDS: &[&str] = &[
    "order",
    "Order",
    "DE-4471",
    "shipment",
    "status",
    "delayed",
    "配送状態",
    "🚚",
    "e\u{301}cole",
    "Größe",
    "GRÖSSE",
    "the",
    "is",
    "at",
    "03:10",
    "refund",
    "customer",
    "warehouse",
    "please",
    "check",
    "ok",
];

/// Follows a word: mostly nothing, often a sentence end.
const PUNCT: &[&str] = &["", "", "", ".", "!", "?", ",", "...", "。"];

/// Between words: mostly a space, sometimes a newline or nothing.
const SEPS: &[&str] = &[" ", " ", " ", " ", "\n", ""];

/// A token is (word, punctuation, separator), each an index into the tables.
type Token = (usize, usize, usize);

fn token() -> impl Strategy<Value = Token> {
    (0..WORDS.len(), 0..PUNCT.len(), 0..SEPS.len())
}

fn render(tokens: &[Token]) -> String {
    let mut out = String::new();
    for &(w, p, s) in tokens {
        out.push_str(WORDS[w]);
        out.push_str(PUNCT[p]);
        out.push_str(SEPS[s]);
    }
    out
}

#[derive(Debug, Clone)]
enum Draft {
    /// New text.
    Fresh(Vec<Token>),
    /// The text of an earlier message (`of` modulo its index), optionally
    /// with a few more tokens: an exact or near duplicate.
    Copy { of: usize, extra: Vec<Token> },
}

fn draft() -> impl Strategy<Value = Draft> {
    prop_oneof![
        3 => proptest::collection::vec(token(), 0..60).prop_map(Draft::Fresh),
        2 => (any::<usize>(), proptest::collection::vec(token(), 0..3))
            .prop_map(|(of, extra)| Draft::Copy { of, extra }),
    ]
}

const ROLES: [Role; 4] = [Role::System, Role::User, Role::Assistant, Role::Tool];

fn role() -> impl Strategy<Value = Role> {
    prop_oneof![
        1 => Just(Role::System),
        3 => Just(Role::User),
        3 => Just(Role::Assistant),
        2 => Just(Role::Tool),
    ]
}

fn messages(len: impl Into<SizeRange>) -> impl Strategy<Value = Vec<Message<'static>>> {
    proptest::collection::vec((role(), proptest::bool::weighted(0.15), draft()), len).prop_map(
        |drafts| {
            let mut out: Vec<Message> = Vec::with_capacity(drafts.len());
            for (i, (role, pin, draft)) in drafts.into_iter().enumerate() {
                let content = match draft {
                    Draft::Fresh(tokens) => render(&tokens),
                    Draft::Copy { of, extra } if i > 0 => {
                        out[of % i].content.to_string() + &render(&extra)
                    }
                    Draft::Copy { extra, .. } => render(&extra),
                };
                let mut m = Message::new(role, content);
                m.pin = pin;
                out.push(m);
            }
            out
        },
    )
}

/// Policy knobs; the budget is a per-mille share of the total, resolved once
/// the conversation is known.
#[derive(Debug, Clone)]
struct Knobs {
    budget_permille: usize,
    keep_last_n: usize,
    keep_roles: [bool; 4],
    duplicate_threshold: f64,
    max_message_chars: usize,
}

fn knobs() -> impl Strategy<Value = Knobs> {
    (
        prop_oneof![4 => 0..=1200usize, 1 => Just(1000usize), 1 => Just(0usize)],
        0..6usize,
        any::<[bool; 4]>(),
        prop_oneof![6 => 0.5..=1.0f64, 2 => Just(1.0), 1 => Just(0.9), 1 => Just(0.5), 1 => Just(0.75), 1 => Just(2.0 / 3.0)],
        10..300usize,
    )
        .prop_map(
            |(budget_permille, keep_last_n, keep_roles, duplicate_threshold, max_message_chars)| {
                Knobs {
                    budget_permille,
                    keep_last_n,
                    keep_roles,
                    duplicate_threshold,
                    max_message_chars,
                }
            },
        )
}

fn policy_for(messages: &[Message], knobs: &Knobs) -> Policy {
    Policy {
        budget_chars: total_chars(messages) * knobs.budget_permille / 1000,
        keep_last_n: knobs.keep_last_n,
        keep_roles: ROLES
            .iter()
            .zip(knobs.keep_roles)
            .filter(|(_, keep)| *keep)
            .map(|(r, _)| *r)
            .collect(),
        duplicate_threshold: knobs.duplicate_threshold,
        max_message_chars: knobs.max_message_chars,
        scoring: compaction_proxy::engine::ScoringMethod::Seed,
    }
}

/// A random conversation of 2..60 messages with a random policy.
fn conversation() -> impl Strategy<Value = (Vec<Message<'static>>, Policy)> {
    (messages(2..60), knobs()).prop_map(|(messages, knobs)| {
        let policy = policy_for(&messages, &knobs);
        (messages, policy)
    })
}

/// A conversation with tool-call groups: an assistant message and the 1..=3
/// tool messages right after it share a group id.
fn grouped_conversation() -> impl Strategy<Value = (Vec<Message<'static>>, Policy)> {
    (
        messages(2..60),
        knobs(),
        proptest::collection::vec((any::<usize>(), 1..=3usize), 1..10),
    )
        .prop_map(|(mut messages, knobs, groups)| {
            let n = messages.len();
            for (g, (start, tools)) in groups.into_iter().enumerate() {
                let start = start % n;
                let end = (start + tools).min(n - 1);
                if end == start || messages[start..=end].iter().any(|m| m.group.is_some()) {
                    continue;
                }
                messages[start].role = Role::Assistant;
                messages[start].group = Some(g as u32);
                for m in &mut messages[start + 1..=end] {
                    m.role = Role::Tool;
                    m.group = Some(g as u32);
                }
            }
            let policy = policy_for(&messages, &knobs);
            (messages, policy)
        })
}

// ------------------------------------------------------ shared assertions

/// Survivors come in input order, each a char prefix of its input, trimmed
/// exactly when shorter, with `chars`/`original_chars` counted in scalar
/// values.
fn check_prefixes(input: &[Message], report: &Report) -> Result<(), TestCaseError> {
    let mut last = None;
    for out in &report.messages {
        prop_assert!(last < Some(out.index), "indices must increase");
        last = Some(out.index);
        let original = &input[out.index].content;
        prop_assert!(
            original.starts_with(&out.content),
            "message {} is not a prefix of its input",
            out.index
        );
        prop_assert_eq!(out.role, input[out.index].role);
        prop_assert_eq!(out.chars, chars(&out.content));
        prop_assert_eq!(out.original_chars, chars(original));
        let shorter = out.content.len() < original.len();
        prop_assert_eq!(out.kept == Kept::Trimmed, shorter, "message {}", out.index);
    }
    Ok(())
}

fn check_accounting(input: &[Message], report: &Report) -> Result<(), TestCaseError> {
    let loss = &report.loss;
    prop_assert_eq!(
        loss.input_chars,
        loss.output_chars + loss.dropped_chars + loss.truncated_chars
    );
    prop_assert_eq!(
        loss.output_chars,
        report.messages.iter().map(|m| m.chars).sum::<usize>()
    );
    prop_assert_eq!(loss.input_chars, total_chars(input));
    prop_assert_eq!(loss.input_messages, input.len());
    prop_assert_eq!(loss.output_messages, report.messages.len());
    prop_assert_eq!(
        loss.dropped_messages,
        input.len() - report.messages.len(),
        "dropped_messages counts every message not returned"
    );
    prop_assert_eq!(
        loss.dropped_messages,
        report.stages.dedupe.removed.len() + report.stages.drop.dropped.len()
    );
    prop_assert_eq!(
        loss.trimmed_messages + loss.verbatim_messages,
        report.messages.len()
    );
    prop_assert_eq!(report.budget.output_chars, loss.output_chars);
    Ok(())
}

// ------------------------------------------------------------- properties

proptest! {
    #![proptest_config(config())]

    /// Word lists kept from earlier requests change nothing: every turn of
    /// a conversation compacted through one store (its history's lists
    /// kept by the turns before) reports exactly what it reports alone.
    #[test]
    fn word_lists_kept_from_earlier_turns_change_nothing(
        (input, policy) in conversation(),
        new_messages in 1usize..4,
    ) {
        let store = AnalysisStore::new(0).with_word_lists(1 << 20);
        let earlier = &input[..input.len().saturating_sub(new_messages).max(1)];
        for turn in [earlier, &input[..], earlier] {
            let alone = serde_json::to_string(&compact(turn, &policy)).unwrap();
            let cached = serde_json::to_string(&compact_cached(turn, &policy, &store)).unwrap();
            prop_assert_eq!(cached, alone);
        }
    }

    /// Every returned content is a prefix of the input content at its index,
    /// and `kept == Trimmed` exactly when it is shorter.
    #[test]
    fn returned_contents_are_prefixes_and_trimmed_iff_shorter(
        (input, policy) in conversation()
    ) {
        let report = compact(&input, &policy);
        check_prefixes(&input, &report)?;
    }

    /// input = output + dropped + truncated, with output the sum of the
    /// returned `chars` and input the sum of the input's scalar values.
    #[test]
    fn chars_are_conserved(
        (input, policy) in conversation()
    ) {
        let report = compact(&input, &policy);
        check_accounting(&input, &report)?;
    }

    /// Pinned messages, messages of a kept role and the last keep_last_n are
    /// always returned verbatim, with their reasons in the order pin, role,
    /// recent; no other message is marked protected.
    #[test]
    fn protected_messages_are_returned_verbatim(
        (input, policy) in conversation()
    ) {
        let report = compact(&input, &policy);
        let by_index: HashMap<usize, _> =
            report.messages.iter().map(|m| (m.index, m)).collect();
        let n = input.len();
        for (i, m) in input.iter().enumerate() {
            let protected = spec_protected(&input, &policy, i);
            let Some(out) = by_index.get(&i) else {
                prop_assert!(!protected, "protected message {} was removed", i);
                continue;
            };
            prop_assert_eq!(out.protected, protected, "message {}", i);
            if protected {
                prop_assert_eq!(&out.content, &m.content, "message {}", i);
                prop_assert_eq!(out.kept, Kept::Verbatim);
                prop_assert!(out.score.is_none());
                let mut why = Vec::new();
                if m.pin {
                    why.push(ProtectedBecause::Pin);
                }
                if policy.keep_roles.contains(&m.role) {
                    why.push(ProtectedBecause::Role);
                }
                if i >= n.saturating_sub(policy.keep_last_n) {
                    why.push(ProtectedBecause::Recent);
                }
                prop_assert_eq!(out.protected_because.as_ref(), Some(&why));
            } else {
                prop_assert!(out.protected_because.is_none());
                prop_assert!(out.score.is_some());
            }
        }
        let protected_chars: usize = (0..n)
            .filter(|&i| spec_protected(&input, &policy, i))
            .map(|i| chars(&input[i].content))
            .sum();
        prop_assert_eq!(report.budget.protected_chars, protected_chars);
        prop_assert_eq!(
            report.budget.protected_exceeds_budget,
            protected_chars > policy.budget_chars
        );
    }

    /// Unless the protected messages alone exceed the budget, the budget is
    /// met. When it is not met, everything unprotected was removed.
    #[test]
    fn budget_is_met_unless_protected_exceeds_it(
        (input, policy) in conversation()
    ) {
        let report = compact(&input, &policy);
        let budget = &report.budget;
        prop_assert_eq!(budget.budget_chars, policy.budget_chars);
        prop_assert_eq!(budget.budget_met, report.loss.output_chars <= policy.budget_chars);
        prop_assert_eq!(
            budget.shortfall_chars,
            report.loss.output_chars.saturating_sub(policy.budget_chars)
        );
        if !budget.protected_exceeds_budget {
            prop_assert!(budget.budget_met);
            prop_assert!(report.loss.output_chars <= policy.budget_chars);
        } else {
            // Protected chars alone are over budget: the budget cannot be met.
            prop_assert!(!budget.budget_met);
        }
        if !budget.budget_met {
            prop_assert!(report.messages.iter().all(|m| m.protected));
            prop_assert_eq!(report.loss.output_chars, budget.protected_chars);
        }
    }

    /// A conversation within budget comes back untouched: every message,
    /// verbatim, no stage removing or trimming anything; unprotected
    /// messages still carry their score.
    #[test]
    fn conversation_within_budget_is_untouched(
        (input, policy) in conversation(),
        slack in 0..50usize,
    ) {
        let policy = Policy { budget_chars: total_chars(&input) + slack, ..policy };
        let report = compact(&input, &policy);
        prop_assert_eq!(report.messages.len(), input.len());
        for (i, (out, m)) in report.messages.iter().zip(&input).enumerate() {
            prop_assert_eq!(out.index, i);
            prop_assert_eq!(&out.content, &m.content);
            prop_assert_eq!(out.kept, Kept::Verbatim);
            prop_assert_eq!(out.score.is_some(), !out.protected);
        }
        prop_assert!(report.stages.dedupe.removed.is_empty());
        prop_assert!(report.stages.trim.trimmed.is_empty());
        prop_assert!(report.stages.drop.dropped.is_empty());
        prop_assert_eq!(report.loss.dropped_chars + report.loss.truncated_chars, 0);
        prop_assert!(report.budget.budget_met);
    }

    /// Compacting the output again with the same policy (and the same pins)
    /// changes nothing.
    ///
    /// Why this holds for every input under the spec's rules:
    /// - Protection only grows. Pins and roles carry over. The last
    ///   keep_last_n inputs are protected, hence all returned, hence still
    ///   the last keep_last_n of the output. An unprotected survivor may now
    ///   fall within the last keep_last_n of the shorter output, which only
    ///   protects more.
    /// - If the first run met the budget, the second input already fits and
    ///   comes back untouched (every stage stops before doing anything).
    /// - If it did not, the drop stage ran to the end: every unprotected
    ///   message was removed, so the second input is all protected and no
    ///   stage may touch it. (A survivor trimmed by the first run would not
    ///   be trimmed again anyway: it is at most max_message_chars long.)
    ///
    /// So no restriction is needed.
    #[test]
    fn compaction_is_idempotent(
        (input, policy) in conversation()
    ) {
        let first = compact(&input, &policy);
        let again: Vec<Message> = first
            .messages
            .iter()
            .map(|out| {
                let mut m = Message::new(out.role, out.content.clone());
                m.pin = input[out.index].pin;
                m
            })
            .collect();
        let second = compact(&again, &policy);
        prop_assert_eq!(second.messages.len(), again.len(), "second run removed messages");
        for (out, m) in second.messages.iter().zip(&again) {
            prop_assert_eq!(&out.content, &m.content);
            prop_assert_eq!(out.kept, Kept::Verbatim);
        }
        prop_assert!(second.stages.dedupe.removed.is_empty());
        prop_assert!(second.stages.trim.trimmed.is_empty());
        prop_assert!(second.stages.drop.dropped.is_empty());
        prop_assert_eq!(second.loss.output_chars, first.loss.output_chars);
        prop_assert_eq!(second.budget.budget_met, first.budget.budget_met);
    }

    /// Messages sharing a group are all returned or all removed, and the
    /// other invariants still hold with groups present.
    #[test]
    fn tool_groups_are_kept_or_dropped_whole(
        (input, policy) in grouped_conversation()
    ) {
        let report = compact(&input, &policy);
        let returned: HashSet<usize> = report.messages.iter().map(|m| m.index).collect();
        let mut groups: HashMap<u32, Vec<usize>> = HashMap::new();
        for (i, m) in input.iter().enumerate() {
            if let Some(g) = m.group {
                groups.entry(g).or_default().push(i);
            }
        }
        for (g, members) in &groups {
            let kept = members.iter().filter(|i| returned.contains(i)).count();
            prop_assert!(
                kept == 0 || kept == members.len(),
                "group {} split: members {:?}, returned {:?}",
                g,
                members,
                members.iter().filter(|i| returned.contains(i)).collect::<Vec<_>>()
            );
            // A group with one spec-protected member is protected whole.
            if members.iter().any(|&i| spec_protected(&input, &policy, i)) {
                prop_assert_eq!(kept, members.len(), "protected group {} lost members", g);
                for out in report.messages.iter().filter(|m| members.contains(&m.index)) {
                    prop_assert!(out.protected);
                    prop_assert_eq!(out.kept, Kept::Verbatim);
                }
            }
        }
        // Grouped messages are never removed as duplicates.
        for d in &report.stages.dedupe.removed {
            prop_assert!(input[d.index].group.is_none());
        }
        check_prefixes(&input, &report)?;
        check_accounting(&input, &report)?;
        if !report.budget.protected_exceeds_budget {
            prop_assert!(report.budget.budget_met);
        }
    }

    /// Every decision (duplicates and their originals, trims and their cuts,
    /// the drop order, scores) equals that of a direct transcription of the
    /// spec's stages.
    #[test]
    fn engine_matches_a_naive_model_of_the_spec(
        (input, policy) in conversation()
    ) {
        let report = compact(&input, &policy);
        let model = naive::compact(&input, &policy);
        let removed: Vec<(usize, usize)> = report
            .stages
            .dedupe
            .removed
            .iter()
            .map(|d| (d.index, d.duplicate_of))
            .collect();
        prop_assert_eq!(removed, model.duplicates);
        let trimmed: Vec<(usize, usize, Cut)> = report
            .stages
            .trim
            .trimmed
            .iter()
            .map(|t| (t.index, t.chars, t.cut))
            .collect();
        prop_assert_eq!(trimmed, model.trims);
        let dropped: Vec<usize> = report.stages.drop.dropped.iter().map(|d| d.index).collect();
        prop_assert_eq!(dropped, model.drops);
        let out: Vec<(usize, &str)> = report
            .messages
            .iter()
            .map(|m| (m.index, m.content.as_str()))
            .collect();
        let expected: Vec<(usize, &str)> =
            model.output.iter().map(|(i, s)| (*i, s.as_str())).collect();
        prop_assert_eq!(out, expected);
        for m in &report.messages {
            if let Some(score) = m.score {
                prop_assert_eq!(score, (model.scores[m.index] * 1e6).round() / 1e6);
            }
        }
    }
}

/// The spec's stages transcribed literally (quadratic, no groups, no
/// fixed chars), to compare decisions with the engine's.
mod naive {
    use super::*;

    pub struct Outcome {
        pub duplicates: Vec<(usize, usize)>,
        pub trims: Vec<(usize, usize, Cut)>,
        pub drops: Vec<usize>,
        pub output: Vec<(usize, String)>,
        pub scores: Vec<f64>,
    }

    fn words(text: &str) -> Vec<String> {
        let mut out = Vec::new();
        let mut word = String::new();
        for c in text.chars() {
            if c.is_alphanumeric() {
                word.extend(c.to_lowercase());
            } else if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
        }
        if !word.is_empty() {
            out.push(word);
        }
        out
    }

    fn jaccard(a: &HashSet<String>, b: &HashSet<String>) -> f64 {
        let inter = a.intersection(b).count();
        let union = a.union(b).count();
        if union == 0 {
            0.0
        } else {
            inter as f64 / union as f64
        }
    }

    fn scores(messages: &[Message], sets: &[HashSet<String>]) -> Vec<f64> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for m in messages {
            for w in words(&m.content) {
                if w.chars().count() > 3 {
                    *counts.entry(w).or_default() += 1;
                }
            }
        }
        let mut terms: Vec<(String, usize)> = counts.into_iter().collect();
        terms.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let topic: HashSet<String> = terms.into_iter().take(25).map(|(w, _)| w).collect();
        let n = messages.len();
        messages
            .iter()
            .zip(sets)
            .enumerate()
            .map(|(i, (m, set))| {
                let recency = i as f64 / (n - 1) as f64;
                let overlap = if set.is_empty() {
                    0.0
                } else {
                    set.intersection(&topic).count() as f64 / set.len() as f64
                };
                let weight = match m.role {
                    Role::System | Role::Developer | Role::User => 1.0,
                    Role::Assistant => 0.7,
                    Role::Tool | Role::Function => 0.5,
                };
                0.5 * recency + 0.3 * weight + 0.2 * overlap
            })
            .collect()
    }

    /// The spec's trim cut: the largest sentence boundary p <= limit if
    /// p >= 0.4 * limit, else a hard cut at the limit.
    pub fn cut(text: &str, limit: usize) -> (usize, Cut) {
        let cs: Vec<char> = text.chars().collect();
        let boundary = (1..=limit.min(cs.len()))
            .rev()
            .find(|&p| {
                matches!(cs[p - 1], '.' | '!' | '?') && (p == cs.len() || cs[p].is_whitespace())
            })
            .unwrap_or(0);
        if boundary as f64 >= 0.4 * limit as f64 {
            (boundary, Cut::Sentence)
        } else {
            (limit, Cut::Hard)
        }
    }

    pub fn compact(messages: &[Message], policy: &Policy) -> Outcome {
        let n = messages.len();
        let sets: Vec<HashSet<String>> = messages
            .iter()
            .map(|m| words(&m.content).into_iter().collect())
            .collect();
        let scores = scores(messages, &sets);
        let protected: Vec<bool> = (0..n)
            .map(|i| spec_protected(messages, policy, i))
            .collect();
        let mut present = vec![true; n];
        let mut kept: Vec<usize> = messages.iter().map(|m| chars(&m.content)).collect();
        let mut total: usize = kept.iter().sum();
        let budget = policy.budget_chars;
        let mut outcome = Outcome {
            duplicates: Vec::new(),
            trims: Vec::new(),
            drops: Vec::new(),
            output: Vec::new(),
            scores: scores.clone(),
        };

        for j in 0..n {
            if total <= budget {
                break;
            }
            if protected[j] {
                continue;
            }
            let original = (0..j).find(|&i| {
                present[i]
                    && messages[i].role == messages[j].role
                    && jaccard(&sets[i], &sets[j]) >= policy.duplicate_threshold
            });
            if let Some(i) = original {
                present[j] = false;
                total -= kept[j];
                outcome.duplicates.push((j, i));
            }
        }

        for j in 0..n {
            if total <= budget {
                break;
            }
            if protected[j] || !present[j] || kept[j] <= policy.max_message_chars {
                continue;
            }
            let (to, how) = cut(&messages[j].content, policy.max_message_chars);
            total -= kept[j] - to;
            kept[j] = to;
            outcome.trims.push((j, to, how));
        }

        let mut order: Vec<usize> = (0..n).filter(|&i| present[i] && !protected[i]).collect();
        order.sort_by(|&a, &b| scores[a].total_cmp(&scores[b]).then(a.cmp(&b)));
        for i in order {
            if total <= budget {
                break;
            }
            present[i] = false;
            total -= kept[i];
            outcome.drops.push(i);
        }

        outcome.output = (0..n)
            .filter(|&i| present[i])
            .map(|i| (i, messages[i].content.chars().take(kept[i]).collect()))
            .collect();
        outcome
    }
}

// ------------------------------------------------------- fixed examples

/// One unprotected message, trimmed at scalar-value positions.
///
/// `text` by char (0-based), 52 chars in 70 bytes:
///   0 🚚 | 1-6 配送状態です | 7 '.' | 8 ' ' | 9 'e' | 10 U+0301 | 11-14 "cole"
///   | 15 '!' | 16 ' ' | 17-51 "Größe und mehr Text hier, ohne Ende"
/// Sentence boundaries (p = chars kept, char p-1 in `.!?`, char p blank):
/// p = 8 and p = 16, no others. In bytes the first 16 chars are
/// 4 + 18 + 1 + 1 + 1 + 2 + 5 = 32, so a byte-counting engine would cut
/// elsewhere.
#[test]
fn trims_unicode_at_scalar_value_positions() {
    let text = "🚚配送状態です. e\u{301}cole! Größe und mehr Text hier, ohne Ende";
    assert_eq!(chars(text), 52);
    assert_eq!(text.len(), 70);
    let policy = |budget, limit| Policy {
        budget_chars: budget,
        keep_last_n: 0,
        keep_roles: vec![],
        duplicate_threshold: 0.9,
        max_message_chars: limit,
        scoring: compaction_proxy::engine::ScoringMethod::Seed,
    };
    let run = |budget, limit| compact(&[Message::new(Role::User, text)], &policy(budget, limit));

    // L = 20: largest boundary <= 20 is 16 >= 0.4 * 20 = 8 -> sentence cut
    // after "!", keeping the combining mark with its base.
    let report = run(20, 20);
    let out = &report.messages[0];
    assert_eq!(out.content, "🚚配送状態です. e\u{301}cole!");
    assert_eq!((out.chars, out.original_chars), (16, 52));
    assert_eq!(out.content.len(), 32, "bytes differ from chars");
    assert_eq!(out.kept, Kept::Trimmed);
    assert_eq!(report.stages.trim.trimmed[0].cut, Cut::Sentence);
    assert_eq!(report.loss.truncated_chars, 36);
    assert!(report.budget.budget_met);

    // L = 15: largest boundary <= 15 is 8 >= 6 -> keep "🚚配送状態です.".
    let report = run(15, 15);
    assert_eq!(report.messages[0].content, "🚚配送状態です.");
    assert_eq!(report.messages[0].chars, 8);
    assert_eq!(report.stages.trim.trimmed[0].cut, Cut::Sentence);

    // L = 10: largest boundary is 8 >= 4 -> still a sentence cut at 8.
    assert_eq!(run(10, 10).messages[0].content, "🚚配送状態です.");

    // L = 40: largest boundary is 16 >= 16 (exactly 40 percent) -> sentence.
    let report = run(40, 40);
    assert_eq!(report.messages[0].chars, 16);
    assert_eq!(report.stages.trim.trimmed[0].cut, Cut::Sentence);

    // L = 41: 16 < 16.4 -> hard cut after 41 scalar values.
    let report = run(41, 41);
    assert_eq!(report.stages.trim.trimmed[0].cut, Cut::Hard);
    assert_eq!(report.messages[0].chars, 41);
    assert_eq!(
        report.messages[0].content,
        text.chars().take(41).collect::<String>()
    );

    // L = 3: no boundary <= 3 (p = 0 < 1.2) -> hard cut after 3 chars,
    // 10 bytes.
    let report = run(3, 3);
    assert_eq!(report.messages[0].content, "🚚配送");
    assert_eq!(report.messages[0].chars, 3);
    assert_eq!(report.stages.trim.trimmed[0].cut, Cut::Hard);

    // Chars are scalar values, not graphemes: a hard cut may separate "e"
    // from its combining mark. `plain` has no sentence end; by char:
    // 0 🚚 | 1-6 配送状態です | 7 ' ' | 8 'e' | 9 U+0301 | ... so L = 9 keeps
    // "e" without U+0301.
    let plain = "🚚配送状態です e\u{301}cole Größe";
    let report = compact(&[Message::new(Role::User, plain)], &policy(9, 9));
    assert_eq!(report.messages[0].content, "🚚配送状態です e");
    assert_eq!(report.messages[0].chars, 9);
    assert_eq!(report.stages.trim.trimmed[0].cut, Cut::Hard);
}

/// `chars` counts Unicode scalar values, never bytes, in every field.
#[test]
fn chars_count_scalar_values_not_bytes() {
    let input = vec![
        Message::new(Role::System, "Größe 🚚"), // 7 chars, 10 bytes
        Message::new(Role::User, "配送状態"),   // 4 chars, 12 bytes
        Message::new(Role::Assistant, "e\u{301}cole"), // 6 chars, 7 bytes
    ];
    let report = compact(&input, &Policy::with_budget(1000));
    let counts: Vec<(usize, usize)> = report
        .messages
        .iter()
        .map(|m| (m.chars, m.original_chars))
        .collect();
    assert_eq!(counts, [(7, 7), (4, 4), (6, 6)]);
    assert_eq!(report.loss.input_chars, 17);
    assert_eq!(report.loss.output_chars, 17);
    assert_eq!(report.budget.protected_chars, 17);

    // A budget of 17 fits by chars (29 bytes would not).
    let report = compact(
        &input,
        &Policy {
            keep_last_n: 0,
            keep_roles: vec![],
            ..Policy::with_budget(17)
        },
    );
    assert_eq!(report.messages.len(), 3);
    assert!(report.stages.drop.dropped.is_empty());
}

/// The naive model's cut agrees with hand-computed examples, so that the
/// model test checks the engine against the spec and not against itself.
#[test]
fn naive_cut_follows_the_spec() {
    assert_eq!(naive::cut("One. Two! Three? four", 12), (9, Cut::Sentence));
    assert_eq!(naive::cut("A. bcdefghijklmnop", 10), (10, Cut::Hard));
    assert_eq!(naive::cut("abc. efghijklmnop", 10), (4, Cut::Sentence));
    assert_eq!(naive::cut("abcdefghi. tail", 10), (10, Cut::Sentence));
    assert_eq!(naive::cut("v1.2.3 is out and more", 10), (10, Cut::Hard));
}
