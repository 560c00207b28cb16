//! Step 5a of the pipeline, for policies with `tool_decisions = "model"`
//! (seed 004): once the engine has compacted a body with the deterministic
//! passes (its outcome is the fallback), the guards pick the tool calls a
//! model may judge ([`crate::compaction::decisions::candidates`]), the
//! decisions for that observation are looked up in the store (the one
//! summaries use, moka and Redis) and, on a miss, asked of the policy's
//! summarizer model within its `timeout_secs`; the body is then compacted
//! again with them applied before the passes.
//!
//! Any failure (no answer in time, an error, a refusal, an answer that is
//! not the decision JSON or does not decide each candidate once, an
//! observation too large for the model's window) forwards the passes'
//! compaction, status `compacted; decisions-fallback`, counted by reason.
//! A body with no candidate goes as the engine made it, without a call.

use std::sync::Arc;
use std::time::Instant;

use super::compact::Decided;
use super::model_input::ModelInput;
use super::AppState;
use crate::compaction::decisions::{self, Action, Applied, Candidate, Decisions};
use crate::outcome::{DecisionCounts, Status};
use crate::store::{Key, StoredSummary};
use crate::summarizer::client::{CallerKey, HttpSummarizer};
use crate::summarizer::{Settings, SummarizeError, Usage};

/// What a request's model decisions were, for its headers, report, metrics
/// and log line.
#[derive(Debug, Clone)]
pub(crate) struct DecisionReport {
    /// What was applied, with the edits (the report re-runs the pipeline
    /// with them).
    pub applied: Arc<Applied>,
    /// Its counts by action, where it came from and its tokens: what the
    /// headers say and the request's event records.
    pub counts: DecisionCounts,
}

impl DecisionReport {
    fn new(applied: Arc<Applied>, source: &'static str, usage: Usage) -> Self {
        let count = |a: Action| applied.applied.iter().filter(|(_, x)| *x == a).count();
        let counts = DecisionCounts {
            keep: count(Action::Keep),
            drop_result: count(Action::DropResult),
            drop_call: count(Action::DropCall),
            source,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
        };
        DecisionReport { applied, counts }
    }
}

/// Applies a deciding policy to a decided body; anything else passes as
/// it came. Never fails: what the model cannot decide stays the passes'.
pub(super) async fn apply(
    state: &Arc<AppState>,
    input: &ModelInput<'_>,
    decided: Decided,
) -> (Decided, Option<DecisionReport>) {
    let (resolution, headers, goal) = (input.resolution, input.headers, input.goal);
    let policy = &resolution.policy;
    let Some(model) = resolution.models.decisions.clone() else {
        return (decided, None);
    };
    if decided.status != Status::Compacted || policy.dry_run || decided.outcome.is_none() {
        return (decided, None);
    }
    let started = Instant::now();
    let parsed = &input.parsed;
    let candidates = decisions::candidates(parsed, policy);
    if candidates.is_empty() {
        return (decided, None);
    }
    let caller = CallerKey::from_headers(headers);
    let found = decisions_for(
        state,
        &model,
        &parsed.conversation,
        &candidates,
        goal,
        caller,
    )
    .await;
    let (chosen, source, usage) = match found {
        Ok(found) => found,
        Err(e) => {
            state
                .metrics
                .tool_decision_fallback(&policy.name, e.reason());
            tracing::warn!(
                policy = %policy.name,
                summarizer = %model.name,
                reason = e.reason(),
                error = %e,
                "tool-call decisions failed; the passes' compaction is forwarded"
            );
            return (
                Decided {
                    status: Status::DecisionsFallback,
                    ..decided
                },
                None,
            );
        }
    };
    if source == "model" {
        state
            .metrics
            .summarizer_tokens(&policy.name, &model.name, usage);
    }
    let applied = Arc::new(decisions::apply(&parsed.conversation, &candidates, &chosen));
    // The re-compaction scores with the request's goal, as the engine's
    // first compaction did.
    let with_goal = goal.map(|g| policy.with_goal(g.to_owned()));
    let outcome = super::compact::outcome_of_parsed(
        parsed,
        with_goal.as_ref().unwrap_or(policy),
        &crate::compaction::stable::NoCheckpoints,
        Some(&applied),
    );
    let seconds = decided.seconds.map(|s| s + started.elapsed().as_secs_f64());
    let status = crate::compaction::status::status_of(policy, &outcome);
    let spent = if source == "model" {
        usage
    } else {
        Usage {
            prompt_tokens: Some(0),
            completion_tokens: Some(0),
        }
    };
    let report = DecisionReport::new(applied, source, spent);
    (
        Decided {
            status,
            outcome: Some(Arc::new(outcome)),
            seconds,
            ..decided
        },
        Some(report),
    )
}

/// The decisions for this observation: from the store, or asked of the
/// model (and kept, first writer wins), with where they came from and
/// what the model reported it used.
async fn decisions_for(
    state: &AppState,
    model: &Arc<Settings>,
    conversation: &crate::format::Conversation,
    candidates: &[Candidate],
    goal: Option<&str>,
    caller: CallerKey,
) -> Result<(Decisions, &'static str, Usage), SummarizeError> {
    // The observation must fit the model's window, less its answer and the
    // frame, with a tenth as margin (four chars a token).
    let room = (model.window_tokens.saturating_sub(model.max_output_tokens) * 4 * 9 / 10)
        .saturating_sub(crate::summarizer::decisions::FRAME.len());
    let observation =
        decisions::observation(conversation, candidates, room, goal).map_err(|e| {
            SummarizeError::ObservationTooLarge {
                needed: e.needed,
                room: e.room,
            }
        })?;
    let key = key_of(model, &observation);
    if let Some(found) = state.summary_store.get(key).await {
        if let Ok(stored) = crate::summarizer::decisions::parse(&found.text, candidates) {
            return Ok((stored, "store", found.usage));
        }
    }
    let summarizer = HttpSummarizer {
        client: state.summarizer_client.clone(),
        settings: model.clone(),
        caller,
    };
    let (chosen, usage) = crate::summarizer::within(
        model.timeout,
        crate::summarizer::decisions::decide(
            &summarizer,
            &observation,
            candidates,
            model.max_output_tokens,
        ),
    )
    .await?;
    let stored = StoredSummary {
        id: key.hex()[..12].to_owned(),
        text: crate::summarizer::decisions::stored_text(&chosen),
        chunks: 1,
        passes: 1,
        usage,
    };
    let held = state.summary_store.put_if_absent(key, stored).await;
    // Another replica's decisions for the same observation win.
    let chosen = crate::summarizer::decisions::parse(&held.text, candidates).unwrap_or(chosen);
    Ok((chosen, "model", usage))
}

/// The store key of the decisions for `observation` by `model`: its name,
/// format, model and endpoint, the frame, then the observation (which
/// holds the candidates' ids, tools, inputs and sizes).
fn key_of(model: &Settings, observation: &str) -> Key {
    let endpoint = model.endpoint.to_string();
    Key::of([
        b"tool-decisions-v1".as_slice(),
        model.name.as_bytes(),
        model.format.as_str().as_bytes(),
        model.model.as_bytes(),
        endpoint.as_bytes(),
        crate::summarizer::decisions::FRAME.as_bytes(),
        observation.as_bytes(),
    ])
}
