//! The per-message view of one compaction: what happened to each input
//! message (kept, trimmed or dropped), by which stage and why. The engine's
//! report lists survivors and per-stage records; this folds them into one
//! line per input message, the answer to "why did my instruction vanish?".

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use moka::sync::Cache;
use serde::Serialize;

use crate::compaction::agent::{CallDecision, UnitDecision};
use crate::compaction::policy::CompiledPolicy;
use crate::engine::{Cut, ProtectedBecause, Report, Role};
use crate::format::{Format, Skip};

/// What became of one input message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Fate {
    Kept,
    Trimmed,
    Dropped,
    /// Not an input message: one the proxy put in (a recall marker).
    Inserted,
}

/// One input message's line of the report.
#[derive(Debug, Clone, Serialize)]
pub struct MessageFate {
    /// The input message's index; `None` for a message the proxy put in
    /// (stage `marker`).
    pub index: Option<usize>,
    pub role: Role,
    pub fate: Fate,
    /// The stage that acted on it: `dedupe`, `trim` or `drop`; `pin` for a
    /// protected message; absent for one kept because the budget was met.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<&'static str>,
    /// Why, in words.
    pub reason: String,
    pub original_chars: usize,
    /// Chars forwarded (0 when dropped).
    pub chars: usize,
    /// A tool result: ReMe's decision for the call it answers (`keep`,
    /// `drop_result`, `drop_call`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<UnitDecision>,
    /// A message making tool calls: each call's decision.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<CallDecision>,
    /// `recall = true`: the recall id of the marker that stands for what
    /// was cut from this message, or for the dropped run it is part of.
    /// Kept last: a live report marks the ids the model recalled after it
    /// (`"recalled": true`, [`mark_recalled`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recall_id: Option<String>,
    /// A marker message (stage `marker`): the input messages it stands
    /// for, first and last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stands_for: Option<[usize; 2]>,
}

/// What `compaction-proxy compact --report` prints for a chat body.
#[derive(Debug, Clone, Serialize)]
pub struct RequestReport<'a> {
    pub policy: &'a str,
    /// As `x-compaction-status` would say.
    pub status: String,
    pub loss: crate::outcome::LossSummary,
    pub messages: Vec<MessageFate>,
}

/// Folds `report` into one line per input message; `roles` are the input
/// messages' roles in order (the report names only the survivors').
pub fn fates(report: &Report, roles: &[Role]) -> Vec<MessageFate> {
    let mut lines: Vec<Option<MessageFate>> = vec![None; roles.len()];
    for kept in &report.messages {
        let Some(slot) = lines.get_mut(kept.index) else {
            continue;
        };
        let (fate, stage, reason) = match (&kept.protected_because, kept.kept) {
            (Some(because), _) => (
                Fate::Kept,
                Some("pin"),
                format!("protected ({})", protection_words(because)),
            ),
            (None, crate::engine::Kept::Trimmed) => {
                let cut = report
                    .stages
                    .trim
                    .trimmed
                    .iter()
                    .find(|t| t.index == kept.index)
                    .map_or("", |t| match t.cut {
                        Cut::Sentence => " at a sentence boundary",
                        Cut::Hard => " (hard cut, no sentence boundary near)",
                        Cut::Match => " around what the request asks about",
                    });
                (
                    Fate::Trimmed,
                    Some("trim"),
                    format!(
                        "longer than max_message_chars ({}); cut{cut}",
                        report.stages.trim.rule.max_message_chars
                    ),
                )
            }
            (None, crate::engine::Kept::Verbatim) => (
                Fate::Kept,
                None,
                match kept.score {
                    Some(score) => format!("budget met before its turn to drop (score {score})"),
                    None => "budget met".to_owned(),
                },
            ),
        };
        *slot = Some(MessageFate {
            index: Some(kept.index),
            role: kept.role,
            fate,
            stage,
            reason,
            original_chars: kept.original_chars,
            chars: kept.chars,
            decision: None,
            tool_calls: Vec::new(),
            recall_id: None,
            stands_for: None,
        });
    }
    for dup in &report.stages.dedupe.removed {
        if let Some(slot) = lines.get_mut(dup.index) {
            *slot = Some(MessageFate {
                index: Some(dup.index),
                role: roles[dup.index],
                fate: Fate::Dropped,
                stage: Some("dedupe"),
                reason: format!(
                    "duplicate of message {} (similarity {} >= {})",
                    dup.duplicate_of, dup.similarity, report.stages.dedupe.rule.duplicate_threshold
                ),
                original_chars: dup.chars,
                chars: 0,
                decision: None,
                tool_calls: Vec::new(),
                recall_id: None,
                stands_for: None,
            });
        }
    }
    for dropped in &report.stages.drop.dropped {
        if let Some(slot) = lines.get_mut(dropped.index) {
            // A trimmed-then-dropped message's original size is in the
            // trim record; `dropped.chars` is its size when dropped.
            let original = report
                .stages
                .trim
                .trimmed
                .iter()
                .find(|t| t.index == dropped.index)
                .map_or(dropped.chars, |t| t.original_chars);
            *slot = Some(MessageFate {
                index: Some(dropped.index),
                role: roles[dropped.index],
                fate: Fate::Dropped,
                stage: Some("drop"),
                reason: format!(
                    "lowest score first until the budget was met (score {})",
                    dropped.score
                ),
                original_chars: original,
                chars: 0,
                decision: None,
                tool_calls: Vec::new(),
                recall_id: None,
                stands_for: None,
            });
        }
    }
    lines.into_iter().flatten().collect()
}

/// The per-message report of one API body under `policy`, as
/// `compact --report` prints it and the live report keeps it. The status
/// and loss are the proxy's own; the lines come from the engine run over
/// the whole conversation, which runs here even under budget so that the
/// report says why every message was kept.
pub fn report_for<'a>(
    input: &[u8],
    name: &'a str,
    policy: &CompiledPolicy,
    format: Format,
    max_messages: usize,
) -> Result<RequestReport<'a>, Skip> {
    explain(input, name, policy, format, max_messages).map(|explained| explained.report)
}

/// A report with what it was made from: the parsed body and the plan the
/// proxy forwards (the inspector shows both sides of it).
pub struct Explained<'a, 'b> {
    pub report: RequestReport<'a>,
    pub parsed: crate::format::Parsed<'b>,
    /// What is forwarded when the body is compacted (`None`: as it came),
    /// with its recall markers when the policy has `recall = true`.
    pub plan: Option<crate::format::Plan>,
    /// The marker messages put in before the plan's items, as
    /// [`crate::compaction::recall::Marked::inserts`] (empty without recall).
    pub inserts: Vec<(usize, String)>,
    pub stable: Option<crate::compaction::stable::StableInfo>,
}

/// [`report_for`], keeping the parsed body and the plan.
pub fn explain<'a, 'b>(
    input: &'b [u8],
    name: &'a str,
    policy: &CompiledPolicy,
    format: Format,
    max_messages: usize,
) -> Result<Explained<'a, 'b>, Skip> {
    explain_decided(input, name, policy, format, max_messages, None)
}

/// [`explain`] of a request whose tool calls a model decided
/// (`tool_decisions = "model"`): the report follows what was forwarded,
/// and each call the model judged says so (`decided_by: "model"`).
pub fn explain_decided<'a, 'b>(
    input: &'b [u8],
    name: &'a str,
    policy: &CompiledPolicy,
    format: Format,
    max_messages: usize,
    decided: Option<&crate::compaction::decisions::Applied>,
) -> Result<Explained<'a, 'b>, Skip> {
    let checkpoints = crate::compaction::stable::NoCheckpoints;
    let parsed = format.parse(input, max_messages)?;
    crate::compaction::status::refuse_agent_compaction(&parsed, policy)?;
    // The proxy's own compaction (crate::proxy::compact::outcome_of).
    let compacted = crate::compaction::compact_decided(&parsed, policy, &checkpoints, decided);
    let conversation = &parsed.conversation;
    let mut decisions =
        crate::compaction::agent::call_decisions(conversation, compacted.plan.as_ref());
    if let Some(decided) = decided {
        for d in &mut decisions {
            if decided.applied.iter().any(|(id, _)| *id == d.id) {
                d.decided_by = Some("model");
            }
        }
    }
    let outcome = crate::outcome::Outcome {
        loss: compacted.loss,
        rewritten: compacted
            .plan
            .as_ref()
            .map(|plan| Bytes::from(parsed.splice(plan))),
        stable: compacted.stable,
        beta: None,
    };
    let messages = crate::compaction::engine_messages(conversation, policy);
    let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
    // The engine's report over what the agent passes left, as the proxy ran
    // it: at the char budget its last round used (a token budget scales it).
    let mut at_budget = policy.clone();
    at_budget.engine.budget_chars = compacted.budget_chars;
    let (_, _, report) = crate::compaction::run_passes_decided(&parsed, &at_budget, decided);
    let mut lines = fates(&report, &roles);
    for line in &mut lines {
        // The format's own reason to keep it whole says more than "pinned".
        if let Some(why) = line.index.and_then(|i| conversation.items[i].why_fixed) {
            line.reason = format!("kept whole: {why}");
        }
    }
    if policy.mode == crate::config::Mode::Stable {
        follow_the_replay(&mut lines, conversation, compacted.plan.as_ref());
    }
    attach_decisions(&mut lines, decisions);
    let mut loss = outcome.loss;
    let mut plan = compacted.plan;
    let mut inserts = Vec::new();
    if let (Some(_), Some(plan)) = (policy.recall, plan.as_mut()) {
        // The markers as the proxy forwards them (proxy::compact).
        let marked = crate::compaction::recall::mark(&parsed, plan);
        if !marked.ids.is_empty() {
            marked.add_to(&mut loss);
        }
        attach_recall_ids(&mut lines, &marked.ids);
        lines = with_marker_lines(lines, &marked.runs);
        inserts = marked.inserts;
    }
    let report = RequestReport {
        policy: name,
        status: crate::compaction::status::status_of(policy, &outcome).header(),
        loss,
        messages: lines,
    };
    Ok(Explained {
        report,
        parsed,
        plan,
        inserts,
        stable: compacted.stable,
    })
}

/// Names on each line the recall id of the marker that stands for it
/// (`recall = true`), as the forwarded body carries them.
fn attach_recall_ids(lines: &mut [MessageFate], ids: &[String]) {
    use crate::compaction::recall::{RecallId, Source};
    for id in ids {
        let Some(recall) = RecallId::parse(id) else {
            continue;
        };
        let (first, last) = match recall.source {
            Source::Text { item } | Source::Arguments { item, .. } => (item, item),
            Source::Dropped { first, last } => (first, last),
        };
        for line in lines
            .iter_mut()
            .filter(|l| l.index.is_some_and(|i| (first..=last).contains(&i)))
        {
            line.recall_id.get_or_insert_with(|| id.clone());
        }
    }
}

/// The lines with a line of its own for each marker message the proxy
/// put in for a run of dropped messages (stage `marker`), right after the
/// run's last line: where the forwarded body has it, before the survivor
/// that follows the run.
fn with_marker_lines(
    lines: Vec<MessageFate>,
    runs: &[crate::compaction::recall::DroppedRun],
) -> Vec<MessageFate> {
    let mut out = Vec::with_capacity(lines.len() + runs.len());
    let mut runs = runs.iter().peekable();
    let marker = |run: &crate::compaction::recall::DroppedRun| {
        let what = if run.first == run.last {
            format!("message {}", run.first)
        } else {
            format!("messages {}-{}", run.first, run.last)
        };
        MessageFate {
            index: None,
            role: Role::User,
            fate: Fate::Inserted,
            stage: Some("marker"),
            reason: format!(
                "put in by the proxy for {what}, dropped ({} chars); the model can bring them back with compaction_recall",
                crate::engine::text::thousands(run.chars)
            ),
            original_chars: 0,
            chars: run.marker_chars,
            decision: None,
            tool_calls: Vec::new(),
            recall_id: Some(run.id.clone()),
            stands_for: Some([run.first, run.last]),
        }
    };
    for line in lines {
        let index = line.index;
        out.push(line);
        while let Some(run) = runs.next_if(|r| index.is_some_and(|i| i >= r.last)) {
            out.push(marker(run));
        }
    }
    out.extend(runs.map(marker));
    out
}

/// A live report with `"recalled": true` on every line whose recall id
/// the model recalled (`recalled`: the ids answered, a long original's
/// `…@start-end` rest counting as its id). The report is serialised JSON
/// whose lines end with their `recall_id` ([`MessageFate`]), and an id
/// is plain ASCII that no JSON string's escaped contents can spell with
/// its quotes, so the field is spliced in after each `"recall_id":"<id>"`.
pub fn mark_recalled(report: &[u8], recalled: &[String]) -> Vec<u8> {
    let mut ids: Vec<&str> = recalled
        .iter()
        .map(|id| id.split_once('@').map_or(id.as_str(), |(base, _)| base))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut out = report.to_vec();
    for id in ids {
        let needle = format!("\"recall_id\":\"{id}\"");
        let mut from = 0;
        while let Some(at) = memchr::memmem::find(&out[from..], needle.as_bytes()) {
            let end = from + at + needle.len();
            out.splice(end..end, b",\"recalled\":true".iter().copied());
            from = end;
        }
    }
    out
}

/// Stable mode forwards what its replay kept, not what one engine run over
/// the whole conversation keeps: each line's fate is made the plan's. A
/// message the plan leaves out was dropped by a re-compaction (stage
/// `stable`); one the engine run dropped but the replay kept is kept.
fn follow_the_replay(
    lines: &mut [MessageFate],
    conversation: &crate::format::Conversation,
    plan: Option<&crate::format::Plan>,
) {
    let Some(plan) = plan else {
        // Forwarded as it came: every message kept whole.
        for line in lines.iter_mut().filter(|l| l.fate != Fate::Kept) {
            line.fate = Fate::Kept;
            line.stage = None;
            line.reason = "budget met".to_owned();
            line.chars = line.original_chars;
        }
        return;
    };
    let mut planned: Vec<Option<&crate::format::Planned>> = vec![None; lines.len()];
    for p in &plan.items {
        if let Some(slot) = planned.get_mut(p.index) {
            *slot = Some(p);
        }
    }
    for line in lines.iter_mut() {
        let Some(index) = line.index else { continue };
        let item = &conversation.items[index];
        match planned.get(index).copied().flatten() {
            None => {
                if line.fate != Fate::Dropped {
                    line.fate = Fate::Dropped;
                    line.stage = Some("stable");
                    line.reason = "left out when stable mode re-compacted the conversation".into();
                }
                line.chars = 0;
            }
            Some(p) => {
                let changed = p.text.is_some() || !p.arguments.is_empty();
                if changed && line.fate != Fate::Trimmed {
                    line.fate = Fate::Trimmed;
                    line.stage = Some("stable");
                    line.reason = "cut when stable mode re-compacted the conversation".into();
                } else if !changed && line.fate != Fate::Kept {
                    line.fate = Fate::Kept;
                    line.stage = None;
                    line.reason = "kept by stable mode's replay".into();
                }
                let text = p
                    .text
                    .as_deref()
                    .map_or(item.text.chars().count(), |t| t.chars().count());
                line.chars = item.chars() - item.text.chars().count() + text;
            }
        }
    }
}

/// Puts each call's decision on the line of the message making it, and on
/// the lines of its results.
fn attach_decisions(lines: &mut [MessageFate], decisions: Vec<CallDecision>) {
    let mut by_index: Vec<Option<usize>> = Vec::new();
    for (pos, line) in lines.iter().enumerate() {
        let Some(index) = line.index else { continue };
        if by_index.len() <= index {
            by_index.resize(index + 1, None);
        }
        by_index[index] = Some(pos);
    }
    let line_of = |i: usize| by_index.get(i).copied().flatten();
    for call in decisions {
        for &r in &call.results {
            if let Some(pos) = line_of(r) {
                lines[pos].decision = Some(call.decision);
            }
        }
        if let Some(pos) = line_of(call.item) {
            lines[pos].tool_calls.push(call);
        }
    }
}

/// How long a live report stays fetchable.
pub const REPORT_TTL: Duration = Duration::from_secs(300);
/// Bytes of reports kept at most; the oldest go first past it.
pub const REPORT_MAX_BYTES: u64 = 16 * 1024 * 1024;

/// Live reports (`x-compaction-report: true` on a policy with
/// `allow_report`), by id, for [`REPORT_TTL`], bounded in bytes.
pub struct ReportStore {
    reports: Cache<String, Bytes>,
    /// Per-process random keys: ids are not guessable from one another.
    keys: RandomState,
    next: AtomicU64,
}

impl Default for ReportStore {
    fn default() -> Self {
        Self::new(REPORT_TTL, REPORT_MAX_BYTES)
    }
}

impl ReportStore {
    pub fn new(ttl: Duration, max_bytes: u64) -> Self {
        ReportStore {
            reports: Cache::builder()
                .time_to_live(ttl)
                .weigher(|id: &String, report: &Bytes| {
                    u32::try_from(id.len() + report.len()).unwrap_or(u32::MAX)
                })
                .max_capacity(max_bytes)
                .build(),
            keys: RandomState::new(),
            next: AtomicU64::new(0),
        }
    }

    /// A fresh id: 128 bits from two keyed hashes of a counter.
    pub fn new_id(&self) -> String {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let half = |salt: u64| self.keys.hash_one((n, salt));
        format!("{:016x}{:016x}", half(1), half(2))
    }

    pub fn insert(&self, id: String, report: Bytes) {
        self.reports.insert(id, report);
    }

    pub fn get(&self, id: &str) -> Option<Bytes> {
        self.reports.get(id)
    }
}

/// What recall did for requests whose report is kept, by report id, for
/// as long as reports are: filled when the answer goes out, joined to the
/// report when it is read (the report is made before the answer).
pub struct RecalledStore {
    done: Cache<String, std::sync::Arc<crate::compaction::recall::Recalled>>,
}

impl Default for RecalledStore {
    fn default() -> Self {
        RecalledStore {
            done: Cache::builder()
                .max_capacity(100_000)
                .time_to_live(REPORT_TTL)
                .build(),
        }
    }
}

impl RecalledStore {
    pub fn insert(&self, report_id: String, done: crate::compaction::recall::Recalled) {
        self.done.insert(report_id, std::sync::Arc::new(done));
    }

    pub fn get(
        &self,
        report_id: &str,
    ) -> Option<std::sync::Arc<crate::compaction::recall::Recalled>> {
        self.done.get(report_id)
    }
}

fn protection_words(because: &[ProtectedBecause]) -> String {
    because
        .iter()
        .map(|b| match b {
            ProtectedBecause::Pin => "pinned by rule: first user message or pin_patterns",
            ProtectedBecause::Role => "role in keep_roles",
            ProtectedBecause::Recent => "among the last keep_last_n",
            ProtectedBecause::ToolGroup => "tool-call group with a protected member",
            ProtectedBecause::Relevant => "relevant to the latest request (pin_relevant_above)",
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{compact, Message, Policy};

    #[test]
    fn report_ids_are_distinct_and_reports_expire() {
        let store = ReportStore::new(Duration::from_millis(50), 1024);
        let (a, b) = (store.new_id(), store.new_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
        store.insert(a.clone(), Bytes::from_static(b"{}"));
        assert_eq!(store.get(&a), Some(Bytes::from_static(b"{}")));
        assert_eq!(store.get(&b), None);
        std::thread::sleep(Duration::from_millis(120));
        assert_eq!(store.get(&a), None, "gone after its time to live");
    }

    #[test]
    fn the_store_holds_a_bounded_number_of_bytes() {
        let store = ReportStore::new(Duration::from_secs(60), 10_000);
        for _ in 0..100 {
            store.insert(store.new_id(), Bytes::from(vec![b'x'; 1_000]));
        }
        store.reports.run_pending_tasks();
        assert!(
            store.reports.weighted_size() <= 10_000,
            "{}",
            store.reports.weighted_size()
        );
    }

    #[test]
    fn a_message_kept_whole_by_its_format_says_why() {
        let body = br#"{"messages":[{"role":"user","content":"task"},{"role":"assistant","content":[{"type":"server_tool_use","id":"s","name":"web_search","input":{}}]},{"role":"user","content":"next"}]}"#;
        let policy = CompiledPolicy::plain("p", Policy::with_budget(10));
        let report = report_for(body, "p", &policy, Format::Anthropic, 100).unwrap();
        assert_eq!(
            report.messages[1].reason,
            "kept whole: unknown block type kept whole"
        );
        assert_eq!(report.messages[1].fate, Fate::Kept);
        // The agent's own compaction request is not compacted: no report.
        let summary = br#"{"messages":[{"role":"user","content":[{"type":"text","text":"CRITICAL: Respond with TEXT ONLY. Your task is to create a detailed summary of the conversation so far."}]}]}"#;
        assert_eq!(
            report_for(summary, "p", &policy, Format::Anthropic, 100)
                .unwrap_err()
                .reason(),
            "agent-compaction"
        );
    }

    #[test]
    fn every_input_message_gets_one_line_with_its_stage() {
        let long = "First sentence here. ".repeat(40);
        let messages = vec![
            Message::new(Role::System, "You are terse."),
            Message::new(Role::User, "alpha beta gamma delta"),
            Message::new(Role::User, "alpha beta gamma delta"),
            Message::new(Role::Assistant, long.clone()),
            Message::new(Role::Assistant, "old filler words nobody needs at all"),
            Message::new(Role::User, "latest question"),
        ];
        let policy = Policy {
            keep_last_n: 1,
            max_message_chars: 100,
            ..Policy::with_budget(150)
        };
        let report = compact(&messages, &policy);
        let roles: Vec<Role> = messages.iter().map(|m| m.role).collect();
        let lines = fates(&report, &roles);
        assert_eq!(lines.len(), messages.len(), "{lines:#?}");
        let by_index = |i: usize| lines.iter().find(|l| l.index == Some(i)).unwrap();
        assert_eq!(
            (by_index(0).fate, by_index(0).stage),
            (Fate::Kept, Some("pin"))
        );
        assert_eq!(
            (by_index(2).fate, by_index(2).stage),
            (Fate::Dropped, Some("dedupe"))
        );
        assert!(by_index(2).reason.contains("duplicate of message 1"));
        assert_eq!(by_index(5).stage, Some("pin"));
        let removed = lines.iter().filter(|l| l.fate == Fate::Dropped).count();
        assert_eq!(
            removed, report.loss.dropped_messages,
            "dropped lines match the loss"
        );
        let forwarded: usize = lines.iter().map(|l| l.chars).sum();
        assert_eq!(forwarded, report.loss.output_chars);
        assert_eq!(by_index(3).original_chars, long.chars().count());
    }
}
