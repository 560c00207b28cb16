//! One request side by side: each input message beside what was forwarded
//! for it, marked with what became of it, its stage and the reason. Pure:
//! built from the per-message report ([`crate::explain`]) and the plan the
//! proxy forwards, off the request path.

use serde::Serialize;

use crate::compaction::agent::{CallDecision, UnitDecision};
use crate::engine::Role;
use crate::explain::{Explained, Fate, MessageFate};
use crate::format::{Item, Plan};

/// The mark a row carries, the inspector's vocabulary: the report's fate,
/// refined by its stage and by what was forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mark {
    /// Forwarded as it came.
    Kept,
    /// Cut to `max_message_chars`.
    Trimmed,
    /// Forwarded shortened by the agent passes (a tool result pruned,
    /// tool-call arguments clipped, a repeated tool result replaced).
    Pruned,
    /// Removed as a near-duplicate of an earlier message.
    Deduplicated,
    /// Removed to meet the budget.
    Dropped,
    /// Replaced by a summary (stage `summarize`).
    Summarized,
    /// A message the proxy put in (a marker where messages were removed).
    Marker,
    /// Brought back from an earlier turn (stage `recall`).
    Recalled,
}

/// One side of a row: a message as it came, or as it was forwarded.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub role: Role,
    pub text: String,
    pub chars: usize,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCallView>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCallView {
    pub name: String,
    pub arguments: String,
}

/// One row of the side-by-side view.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// The input message's index; `None` for a message the proxy put in.
    pub index: Option<usize>,
    /// Its position in the forwarded conversation; `None` when removed.
    pub position: Option<usize>,
    pub mark: Mark,
    /// The report's fate for the message, as `/v1/compaction-reports/<id>`
    /// says it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fate: Option<Fate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stage: Option<&'static str>,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub original: Option<Side>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forwarded: Option<Side>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decision: Option<UnitDecision>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<CallDecision>,
    /// `recall = true`: the recall id of the marker that stands for this
    /// message's cut content, or that this marker row is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub recall_id: Option<String>,
    /// The model recalled that id while answering this request.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub recalled: bool,
    /// A marker row: the input messages it stands for, first and last.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stands_for: Option<[usize; 2]>,
}

/// The stable-mode prefix: the leading forwarded messages the previous
/// turn forwarded too (what a provider's prompt cache can serve).
#[derive(Debug, Clone, Copy, Serialize)]
pub struct StableView {
    pub stable_messages: usize,
    /// Rows above the boundary.
    pub boundary_row: usize,
    pub rebased: bool,
    pub recompactions: usize,
}

/// A request's side-by-side view.
#[derive(Debug, Clone, Serialize, Default)]
pub struct Detail {
    pub rows: Vec<Row>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stable: Option<StableView>,
    /// The texts of the summaries forwarded in place of removed messages.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub summaries: Vec<String>,
    /// Why there is no view (a body the formats cannot read, one too large).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<String>,
}

impl Detail {
    pub fn unavailable(reason: impl Into<String>) -> Self {
        Detail {
            unavailable: Some(reason.into()),
            ..Detail::default()
        }
    }

    /// Bytes this view holds, about: its texts and a fixed cost per row.
    pub fn bytes(&self) -> usize {
        let side = |s: &Option<Side>| {
            s.as_ref().map_or(0, |s| {
                s.text.len()
                    + s.tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len() + 48)
                        .sum::<usize>()
            })
        };
        self.rows
            .iter()
            .map(|r| {
                std::mem::size_of::<Row>() + r.reason.len() + side(&r.original) + side(&r.forwarded)
            })
            .sum::<usize>()
            + self.summaries.iter().map(String::len).sum::<usize>()
    }

    /// Marks the rows whose recall id the model recalled (`recalled`: the
    /// ids answered, a long original's `…@start-end` rest counting as its
    /// id): an input message's row becomes `recalled`; a marker row keeps
    /// its mark and says it was recalled.
    pub fn mark_recalled(&mut self, recalled: &[String]) {
        let base = |id: &str| id.split_once('@').map_or(id, |(b, _)| b).to_owned();
        let recalled: std::collections::BTreeSet<String> =
            recalled.iter().map(|id| base(id)).collect();
        for row in &mut self.rows {
            if !row
                .recall_id
                .as_ref()
                .is_some_and(|id| recalled.contains(id))
            {
                continue;
            }
            row.recalled = true;
            if row.index.is_some() {
                row.mark = Mark::Recalled;
            }
        }
    }

    #[cfg(test)]
    pub fn for_test(text: &str) -> Self {
        let side = Side {
            role: Role::User,
            text: text.into(),
            chars: text.len(),
            tool_calls: Vec::new(),
        };
        Detail {
            rows: vec![Row {
                index: Some(0),
                position: Some(0),
                mark: Mark::Kept,
                fate: Some(Fate::Kept),
                stage: None,
                reason: String::new(),
                original: Some(side.clone()),
                forwarded: Some(side),
                decision: None,
                tool_calls: Vec::new(),
                recall_id: None,
                recalled: false,
                stands_for: None,
            }],
            ..Detail::default()
        }
    }
}

fn side_of(item: &Item) -> Side {
    Side {
        role: item.role,
        text: item.text.clone(),
        chars: item.chars(),
        tool_calls: item
            .tool_calls
            .iter()
            .map(|c| ToolCallView {
                name: c.name.clone(),
                arguments: c.arguments.clone(),
            })
            .collect(),
    }
}

/// What was forwarded, each with the input index it stands for (`None`:
/// put in by the proxy): the plan's survivors as the forwarded body reads.
fn forwarded_items(explained: &Explained<'_, '_>) -> Vec<(Option<usize>, Side)> {
    let parsed = &explained.parsed;
    let items = &parsed.conversation.items;
    let Some(plan) = &explained.plan else {
        return items
            .iter()
            .enumerate()
            .map(|(i, item)| (Some(i), side_of(item)))
            .collect();
    };
    // The forwarded body, read back by its format: exactly what the model
    // sees of each survivor and of each marker message put in.
    let inserts = &explained.inserts;
    let spliced = parsed.splice_inserting_all(plan, inserts);
    // Input index of each forwarded element, in order.
    let mut order: Vec<Option<usize>> = Vec::with_capacity(plan.items.len() + inserts.len());
    let mut put_in = inserts.iter().peekable();
    for (at, p) in plan.items.iter().enumerate() {
        while put_in.next_if(|(before, _)| *before <= at).is_some() {
            order.push(None);
        }
        order.push(Some(p.index));
    }
    order.extend(put_in.map(|_| None));
    if let Ok(forwarded) = parsed.format.parse(spliced.as_bytes(), usize::MAX) {
        if forwarded.conversation.items.len() == order.len() {
            return order
                .into_iter()
                .zip(&forwarded.conversation.items)
                .map(|(index, item)| (index, side_of(item)))
                .collect();
        }
    }
    from_plan(plan, inserts, items)
}

/// The forwarded items as the plan says (when the forwarded body cannot
/// be read back item for item).
fn from_plan(
    plan: &Plan,
    inserts: &[(usize, String)],
    items: &[Item],
) -> Vec<(Option<usize>, Side)> {
    let marker = |element: &str| {
        let text = crate::compaction::recall::forwarded_ids(element.as_bytes())
            .into_iter()
            .next()
            .map_or_else(String::new, |id| format!("[marker {id}]"));
        (
            None,
            Side {
                role: Role::User,
                chars: text.chars().count(),
                text,
                tool_calls: Vec::new(),
            },
        )
    };
    let mut out = Vec::new();
    let mut put_in = inserts.iter().peekable();
    for (at, p) in plan.items.iter().enumerate() {
        while let Some((_, element)) = put_in.next_if(|(before, _)| *before <= at) {
            out.push(marker(element));
        }
        let Some(item) = items.get(p.index) else {
            continue;
        };
        let mut side = side_of(item);
        if let Some(text) = &p.text {
            side.text = text.clone();
            side.chars = text.chars().count();
        }
        out.push((Some(p.index), side));
    }
    out.extend(put_in.map(|(_, element)| marker(element)));
    out
}

/// The mark of a message the report describes as `line` (when it has a
/// line), forwarded or not, changed on the way or not.
fn mark_of(
    line: Option<&MessageFate>,
    forwarded: bool,
    changed: bool,
) -> (Mark, Option<&'static str>, Option<String>) {
    let stage = line.and_then(|l| l.stage);
    match stage {
        Some("summarize") => return (Mark::Summarized, stage, None),
        Some("marker") => return (Mark::Marker, stage, None),
        Some("recall") => return (Mark::Recalled, stage, None),
        _ => {}
    }
    let fate = line.map(|l| l.fate);
    match (fate, forwarded) {
        (Some(Fate::Dropped), false) if stage == Some("dedupe") => (Mark::Deduplicated, stage, None),
        (Some(Fate::Dropped), false) => (Mark::Dropped, stage, None),
        (Some(Fate::Trimmed), true) => (Mark::Trimmed, stage, None),
        (_, false) => (
            // The report's engine run and the forwarded plan disagree only
            // when the plan is not exact mode's: stable mode's replay.
            Mark::Dropped,
            Some("stable"),
            Some("removed by stable mode's replay of earlier turns".into()),
        ),
        (_, true) if changed => (
            Mark::Pruned,
            stage.or(Some("agent")),
            Some("shortened by the agent passes (tool output pruned, arguments clipped or a repeat replaced)".into()),
        ),
        (_, true) => (Mark::Kept, stage, None),
    }
}

/// The side-by-side view of an explained request.
pub fn detail(explained: &Explained<'_, '_>) -> Detail {
    let items = &explained.parsed.conversation.items;
    let lines = &explained.report.messages;
    let line_of = |i: usize| lines.iter().find(|l| l.index == Some(i));
    // The report's marker lines, in the order their messages are forwarded.
    let mut marker_lines = lines.iter().filter(|l| l.index.is_none());
    let forwarded = forwarded_items(explained);
    let mut at: Vec<Option<(usize, &Side)>> = vec![None; items.len()];
    for (pos, (index, side)) in forwarded.iter().enumerate() {
        if let Some(slot) = index.and_then(|i| at.get_mut(i)) {
            *slot = Some((pos, side));
        }
    }
    let mut rows = Vec::with_capacity(items.len());
    let mut next_forwarded = 0;
    let mut put_in_until = |rows: &mut Vec<Row>, end: usize, next: &mut usize| {
        // Messages the proxy put in, before forwarded position `end`.
        while *next < end {
            let (index, side) = &forwarded[*next];
            if index.is_none() {
                let line = marker_lines.next();
                rows.push(Row {
                    index: None,
                    position: Some(*next),
                    mark: Mark::Marker,
                    fate: line.map(|l| l.fate),
                    stage: line.and_then(|l| l.stage),
                    reason: line.map_or_else(|| "put in by the proxy".into(), |l| l.reason.clone()),
                    original: None,
                    forwarded: Some(side.clone()),
                    decision: None,
                    tool_calls: Vec::new(),
                    recall_id: line.and_then(|l| l.recall_id.clone()),
                    recalled: false,
                    stands_for: line.and_then(|l| l.stands_for),
                });
            }
            *next += 1;
        }
    };
    for (i, item) in items.iter().enumerate() {
        let line = line_of(i);
        let sent = at[i];
        if let Some((pos, _)) = sent {
            put_in_until(&mut rows, pos, &mut next_forwarded);
            next_forwarded = next_forwarded.max(pos + 1);
        }
        let original = side_of(item);
        let changed = sent
            .is_some_and(|(_, s)| s.text != original.text || s.tool_calls != original.tool_calls);
        let (mark, stage, reason) = mark_of(line, sent.is_some(), changed);
        rows.push(Row {
            index: Some(i),
            position: sent.map(|(pos, _)| pos),
            mark,
            fate: line.map(|l| l.fate),
            stage,
            reason: reason.unwrap_or_else(|| line.map_or_else(String::new, |l| l.reason.clone())),
            original: Some(original),
            forwarded: sent.map(|(_, s)| s.clone()),
            decision: line.and_then(|l| l.decision),
            tool_calls: line.map_or_else(Vec::new, |l| l.tool_calls.clone()),
            recall_id: line.and_then(|l| l.recall_id.clone()),
            recalled: false,
            stands_for: None,
        });
    }
    put_in_until(&mut rows, forwarded.len(), &mut next_forwarded);
    let summaries = rows
        .iter()
        .filter(|r| r.mark == Mark::Summarized)
        .filter_map(|r| r.forwarded.as_ref().map(|s| s.text.clone()))
        .collect();
    let stable = explained.stable.map(|info| StableView {
        stable_messages: info.stable_messages,
        boundary_row: rows
            .iter()
            .position(|r| r.position.is_some_and(|p| p + 1 == info.stable_messages))
            .map_or(0, |row| row + 1),
        rebased: info.rebased,
        recompactions: info.recompactions,
    });
    Detail {
        rows,
        stable,
        summaries,
        unavailable: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::Format;
    use crate::policy::Runtime;

    fn policy(toml: &str) -> std::sync::Arc<crate::policy::CompiledPolicy> {
        let config = crate::config::load_text(Some(toml), Vec::new(), &Default::default()).unwrap();
        let runtime = Runtime::new(config).unwrap();
        runtime
            .resolve("/v1/chat/completions", &http::HeaderMap::new())
            .unwrap()
            .policy
    }

    fn chat(messages: &[(&str, String)]) -> Vec<u8> {
        let messages: Vec<_> = messages
            .iter()
            .map(|(role, text)| serde_json::json!({"role": role, "content": text}))
            .collect();
        serde_json::to_vec(&serde_json::json!({"model": "gpt-4o", "messages": messages})).unwrap()
    }

    #[test]
    fn each_input_message_gets_a_row_beside_what_was_forwarded() {
        let policy = policy(
            "[policies.default]\nmode = \"exact\"\nbudget_chars = 900\nkeep_last_n = 1\nmax_message_chars = 300\n",
        );
        let long = "A sentence that goes on. ".repeat(30);
        let body = chat(&[
            ("system", "Be terse.".into()),
            ("user", "the task statement".into()),
            ("assistant", long.clone()),
            ("user", "old words nobody needs ".repeat(10)),
            ("user", "old words nobody needs ".repeat(10)),
            ("assistant", "filler filler ".repeat(20)),
            ("user", "the latest question".into()),
        ]);
        let explained =
            crate::explain::explain(&body, "default", &policy, Format::Chat, 1000).unwrap();
        let view = detail(&explained);
        assert_eq!(view.rows.len(), 7, "{view:#?}");
        let mark = |i: usize| view.rows.iter().find(|r| r.index == Some(i)).unwrap();
        assert_eq!(mark(0).mark, Mark::Kept);
        assert_eq!(mark(0).stage, Some("pin"));
        assert_eq!(mark(2).mark, Mark::Trimmed);
        let trimmed = mark(2).forwarded.as_ref().unwrap();
        assert!(trimmed.chars < long.len() && long.starts_with(trimmed.text.trim_end()));
        assert_eq!(mark(4).mark, Mark::Deduplicated);
        assert!(mark(4).forwarded.is_none());
        assert_eq!(mark(6).mark, Mark::Kept);
        // Every row agrees with the report's line for its message.
        for row in &view.rows {
            let line = &explained.report.messages[row.index.unwrap()];
            assert_eq!(line.index, row.index);
            assert_eq!(row.fate, Some(line.fate));
            assert_eq!(row.forwarded.is_none(), line.fate == Fate::Dropped);
        }
        // Forwarded positions run 0.. in order.
        let positions: Vec<usize> = view.rows.iter().filter_map(|r| r.position).collect();
        assert_eq!(positions, (0..positions.len()).collect::<Vec<_>>());
    }

    #[test]
    fn a_body_under_budget_is_kept_whole_on_both_sides() {
        let policy = policy("");
        let body = chat(&[("user", "hello".into()), ("assistant", "hi".into())]);
        let explained =
            crate::explain::explain(&body, "default", &policy, Format::Chat, 1000).unwrap();
        let view = detail(&explained);
        assert!(view.rows.iter().all(|r| r.mark == Mark::Kept));
        assert_eq!(view.rows[1].forwarded.as_ref().unwrap().text, "hi");
    }

    #[test]
    fn stable_mode_shows_where_the_unchanged_prefix_ends() {
        let policy = policy("[policies.default]\nbudget_chars = 100000\nmode = \"stable\"\n");
        let body = chat(&[
            ("user", "first".into()),
            ("assistant", "answer".into()),
            ("user", "second".into()),
        ]);
        let explained =
            crate::explain::explain(&body, "default", &policy, Format::Chat, 1000).unwrap();
        let view = detail(&explained);
        let stable = view.stable.unwrap();
        // The previous turn's request was the first message (the one the
        // assistant answered): that much is unchanged.
        assert_eq!(stable.stable_messages, 1);
        assert_eq!(stable.boundary_row, 1);
    }

    #[test]
    fn marker_messages_get_rows_of_their_own_and_recalled_rows_are_marked() {
        let policy = policy(
            "[policies.default]\nmode = \"exact\"\nbudget_chars = 400\nkeep_last_n = 1\nrecall = true\n",
        );
        let body = chat(&[
            ("user", "the task statement".into()),
            ("assistant", "old words nobody needs ".repeat(10)),
            ("user", "more filler nobody needs ".repeat(10)),
            ("assistant", "filler filler ".repeat(20)),
            ("user", "the latest question".into()),
        ]);
        let explained =
            crate::explain::explain(&body, "default", &policy, Format::Chat, 1000).unwrap();
        let lines = &explained.report.messages;
        let marker_line = lines.iter().find(|l| l.stage == Some("marker")).unwrap();
        let id = marker_line.recall_id.clone().unwrap();
        let [first, last] = marker_line.stands_for.unwrap();
        let mut view = detail(&explained);
        assert_eq!(view.rows.len(), lines.len(), "{view:#?}");
        for (row, line) in view.rows.iter().zip(lines) {
            assert_eq!(row.index, line.index);
            assert_eq!(row.recall_id, line.recall_id);
        }
        let marker = view.rows.iter().find(|r| r.mark == Mark::Marker).unwrap();
        assert_eq!(marker.index, None);
        assert_eq!(marker.recall_id.as_deref(), Some(id.as_str()));
        let forwarded = marker.forwarded.as_ref().unwrap();
        assert!(forwarded.text.contains(&id), "{forwarded:?}");
        assert_eq!(forwarded.chars, marker_line.chars);
        // The right side is what was forwarded, marker included.
        let spliced = explained
            .parsed
            .splice_inserting_all(explained.plan.as_ref().unwrap(), &explained.inserts);
        let sent = Format::Chat.parse(spliced.as_bytes(), 1000).unwrap();
        let shown: Vec<&str> = view
            .rows
            .iter()
            .filter_map(|r| r.forwarded.as_ref().map(|s| s.text.as_str()))
            .collect();
        let sent: Vec<&str> = sent
            .conversation
            .items
            .iter()
            .map(|i| i.text.as_str())
            .collect();
        assert_eq!(shown, sent);

        view.mark_recalled(&[format!("{id}@3-9")]);
        for row in &view.rows {
            let in_run = row.index.is_some_and(|i| (first..=last).contains(&i));
            assert_eq!(row.recalled, in_run || row.index.is_none(), "{row:?}");
            assert_eq!(row.mark == Mark::Recalled, in_run, "{row:?}");
        }
        assert_eq!(
            view.rows.iter().filter(|r| r.mark == Mark::Marker).count(),
            1
        );
    }

    #[test]
    fn marks_follow_the_stage_for_summaries_markers_and_recall() {
        let line = |stage: &'static str| MessageFate {
            index: Some(0),
            role: Role::User,
            fate: Fate::Kept,
            stage: Some(stage),
            reason: String::new(),
            original_chars: 1,
            chars: 1,
            decision: None,
            tool_calls: Vec::new(),
            recall_id: None,
            stands_for: None,
        };
        assert_eq!(
            mark_of(Some(&line("summarize")), false, false).0,
            Mark::Summarized
        );
        assert_eq!(mark_of(Some(&line("marker")), true, false).0, Mark::Marker);
        assert_eq!(
            mark_of(Some(&line("recall")), true, false).0,
            Mark::Recalled
        );
        assert_eq!(mark_of(Some(&line("pin")), true, true).0, Mark::Pruned);
        assert_eq!(mark_of(None, false, false).0, Mark::Dropped);
    }
}
