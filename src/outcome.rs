//! What compacting one body produced, as the proxy, the caches, the
//! metrics and the `compact` command share it: the outcome, its loss
//! summary and the status the loss report names.

use bytes::Bytes;

/// The outcome of one body under one policy.
#[derive(Debug)]
pub struct Outcome {
    pub loss: LossSummary,
    /// The body to forward, or `None` when it is the input unchanged.
    pub rewritten: Option<Bytes>,
    /// Stable mode's prefix report.
    pub stable: Option<StableInfo>,
    /// An `anthropic-beta` value the rewritten body needs (it asks the API
    /// to drop stale reasoning: [`crate::compaction::thinking`]).
    pub beta: Option<&'static str>,
}

/// What the proxy did with a request's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Compacted,
    /// Compacted by the engine because the policy's summary could not be
    /// had (`compacted; summarize-fallback`).
    SummarizeFallback,
    /// Compacted by the deterministic passes because the policy's model
    /// decisions could not be had (`compacted; decisions-fallback`).
    DecisionsFallback,
    /// Forwarded as received: it fit the budget (or stayed below every trigger).
    Unchanged,
    Skipped(&'static str),
    Bypassed,
    DryRun,
    /// Not forwarded: the proxy answered with an error of its own (a body
    /// too large or too slow, full buffers), with the reason.
    Refused(&'static str),
}

impl Status {
    /// The metric label (no skip reason, to keep it bounded).
    pub fn label(self) -> &'static str {
        match self {
            Status::Compacted | Status::SummarizeFallback | Status::DecisionsFallback => {
                "compacted"
            }
            Status::Unchanged => "unchanged",
            Status::Skipped(_) => "skipped",
            Status::Bypassed => "bypassed",
            Status::DryRun => "dry-run",
            Status::Refused(_) => "refused",
        }
    }

    /// The `x-compaction-status` header value.
    pub fn header(self) -> String {
        self.to_string()
    }

    /// Position in a per-status array of series.
    pub(crate) fn index(self) -> usize {
        match self {
            Status::Compacted | Status::SummarizeFallback | Status::DecisionsFallback => 0,
            Status::Unchanged => 1,
            Status::Skipped(_) => 2,
            Status::Bypassed => 3,
            Status::DryRun => 4,
            Status::Refused(_) => 5,
        }
    }
}

impl std::fmt::Display for Status {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Status::Skipped(reason) => write!(f, "skipped; {reason}"),
            Status::Refused(reason) => write!(f, "refused; {reason}"),
            Status::SummarizeFallback => f.write_str("compacted; summarize-fallback"),
            Status::DecisionsFallback => f.write_str("compacted; decisions-fallback"),
            other => f.write_str(other.label()),
        }
    }
}

impl Status {
    /// Whether the rewritten body is forwarded.
    pub fn is_compacted(self) -> bool {
        matches!(
            self,
            Status::Compacted | Status::SummarizeFallback | Status::DecisionsFallback
        )
    }
}

/// What a request's summary was and cost, for the report, the headers
/// and the log line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct SummaryReport {
    pub id: String,
    /// Chunks of its map pass and rounds of calls (as it was made).
    pub chunks: usize,
    pub passes: usize,
    /// Summarizer tokens spent for this request (0 when it came from the
    /// store; `None`: the provider reported none).
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// `"model"`: written for this request; `"store"`: reused.
    pub source: &'static str,
    /// Messages it replaced.
    pub replaced: usize,
}

/// What a request's model decisions on its tool calls were and cost
/// (`tool_decisions = "model"`), for its headers, the metrics and the log
/// line alike.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecisionCounts {
    /// Calls the decisions kept, cut to a head, and removed.
    pub keep: usize,
    pub drop_result: usize,
    pub drop_call: usize,
    /// `"model"`: asked for this request; `"store"`: reused.
    pub source: &'static str,
    /// Decision-model tokens spent on this request (0 when reused; `None`:
    /// the provider reported none).
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

impl DecisionCounts {
    /// `keep=N, drop_result=N, drop_call=N`.
    pub fn header(&self) -> String {
        format!(
            "keep={}, drop_result={}, drop_call={}",
            self.keep, self.drop_result, self.drop_call
        )
    }

    /// Each action's name with its count, in a fixed order.
    pub fn by_action(&self) -> [(&'static str, usize); 3] {
        [
            ("keep", self.keep),
            ("drop_result", self.drop_result),
            ("drop_call", self.drop_call),
        ]
    }
}

/// The loss figures reported in headers and metrics.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LossSummary {
    pub input_chars: usize,
    pub output_chars: usize,
    pub input_messages: usize,
    pub output_messages: usize,
    /// Messages removed (dedupe and drop), as the report's `loss` counts.
    pub dropped_messages: usize,
    /// Of `dropped_messages`, those the dedupe stage removed.
    pub deduped_messages: usize,
    pub trimmed_messages: usize,
    pub retained_ratio: f64,
    pub budget_met: bool,
    /// Chars the agent passes removed from messages that survive: pruned
    /// tool results, clipped tool-call arguments, repeated tool results.
    pub pruned_chars: usize,
    pub clipped_chars: usize,
    pub deduped_tool_chars: usize,
    /// Kept messages forwarded without their reasoning blocks, because
    /// something before them changed (preserved thinking).
    pub stripped_thinking: usize,
    /// Tokens in and out, when the policy has a token budget.
    pub input_tokens: Option<usize>,
    pub output_tokens: Option<usize>,
    /// The token budget the request was compacted to, when it had one
    /// (`budget_tokens`, or derived by `budget = "auto"`).
    pub budget_tokens: Option<usize>,
}

impl LossSummary {
    /// A conversation forwarded as it came: nothing lost, budget met.
    pub fn unchanged(chars: usize, messages: usize) -> Self {
        LossSummary {
            input_chars: chars,
            output_chars: chars,
            input_messages: messages,
            output_messages: messages,
            dropped_messages: 0,
            deduped_messages: 0,
            trimmed_messages: 0,
            retained_ratio: 1.0,
            budget_met: true,
            pruned_chars: 0,
            clipped_chars: 0,
            deduped_tool_chars: 0,
            stripped_thinking: 0,
            input_tokens: None,
            output_tokens: None,
            budget_tokens: None,
        }
    }

    /// A conversation forwarded as it came, measured against `budget`.
    pub fn unchanged_within(chars: usize, messages: usize, budget: usize) -> Self {
        LossSummary {
            budget_met: chars <= budget,
            ..Self::unchanged(chars, messages)
        }
    }

    pub fn from_report(report: &crate::engine::Report) -> Self {
        LossSummary {
            input_chars: report.loss.input_chars,
            output_chars: report.loss.output_chars,
            input_messages: report.loss.input_messages,
            output_messages: report.loss.output_messages,
            dropped_messages: report.loss.dropped_messages,
            deduped_messages: report.stages.dedupe.removed_messages,
            trimmed_messages: report.loss.trimmed_messages,
            retained_ratio: report.loss.retained_char_ratio,
            budget_met: report.budget.budget_met,
            pruned_chars: 0,
            clipped_chars: 0,
            deduped_tool_chars: 0,
            stripped_thinking: 0,
            input_tokens: None,
            output_tokens: None,
            budget_tokens: None,
        }
    }
}

/// What stable mode reports besides the loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StableInfo {
    /// Leading forwarded items that the previous turn forwarded too.
    pub stable_messages: usize,
    /// This turn's new items (after the last assistant item) caused a
    /// re-compaction.
    pub rebased: bool,
    /// Re-compactions this request's replay ran (0 when resumed warm and
    /// only appended).
    pub recompactions: usize,
    /// Whether the replay resumed from a checkpoint; `None` when no replay
    /// ran (the conversation fits its budget).
    pub resumed: Option<bool>,
}
