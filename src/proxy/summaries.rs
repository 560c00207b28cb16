//! Step 5b of the pipeline, for policies with `strategy = "summarize"`:
//! once the engine has compacted a body (its outcome is the fallback), the
//! pure core says what a summary would replace
//! ([`crate::compaction::summary`]), the summary is looked up in the store
//! and, on a miss, written by the policy's summarizer, and the core splices
//! it in place of what it replaces.
//!
//! - **inline** timing: the request waits for the summarizer, at most its
//!   `timeout_secs`; any failure forwards the engine's body, marked
//!   `compacted; summarize-fallback` and counted by reason.
//! - **background** timing: a request never waits for a model. A missing
//!   summary is written off the request path; the request goes with the
//!   engine's body. In exact mode the next request with the same prefix
//!   uses the summary once it is ready. In stable mode a summary is taken
//!   up only at a re-compaction (so the forwarded prefix still changes only
//!   then): the newest summary ready for a leading part of what leaves the
//!   window stands for it; the turns until the next re-compaction keep that
//!   choice, and the summary of the whole part, written meanwhile, is used
//!   from the next re-compaction on.
//!
//! Stable mode extends summaries: a re-compaction's part starts with the
//! previous one's, so the newest summary of a leading part of it is given
//! to the summarizer in place of that part, with what follows.

use std::sync::Arc;
use std::time::Instant;

use super::compact::Decided;
use super::model_input::ModelInput;
use super::AppState;
use crate::compaction::summary::{self, Removal};
use crate::config::{Mode, SummaryTiming};
use crate::format::Parsed;
use crate::outcome::{Outcome, Status, SummaryReport};
use crate::policy::{Resolution, SummaryPolicy};
use crate::store::{Key, StoredSummary};
use crate::summarizer::client::CallerKey;
use crate::summarizer::{prompt, SummarizeError};

/// Applies a summarizing policy to a decided body; anything else passes
/// as it came. Never fails: what cannot be summarized stays the engine's.
pub(super) async fn apply(
    state: &Arc<AppState>,
    input: &ModelInput<'_>,
    decided: Decided,
) -> (Decided, Option<SummaryReport>) {
    let (resolution, headers, goal) = (input.resolution, input.headers, input.goal);
    let policy = &resolution.policy;
    let Some(summary_policy) = resolution.models.summary.clone() else {
        return (decided, None);
    };
    if decided.status != Status::Compacted || policy.dry_run {
        return (decided, None);
    }
    let Some(outcome) = decided.outcome.clone() else {
        return (decided, None);
    };
    let started = Instant::now();
    let parsed = &input.parsed;
    let format = resolution.format;
    let Some(job) = Job::new(parsed, state, &summary_policy, resolution, goal) else {
        return (decided, None);
    };
    let rebased = outcome.stable.is_some_and(|s| s.rebased);
    let stable = policy.mode == Mode::Stable;
    let caller = CallerKey::from_headers(headers);
    let chosen = match summary_policy.timing {
        SummaryTiming::Inline => match job.inline(state, &caller).await {
            Ok(found) => {
                if found.1 == Source::Model {
                    state.metrics.summarizer_tokens(
                        &policy.name,
                        &summary_policy.summarizer.name,
                        found.0.usage,
                    );
                }
                Some(found)
            }
            Err(e) => {
                fallback(state, resolution, &summary_policy, &e);
                return (
                    Decided {
                        status: Status::SummarizeFallback,
                        ..decided
                    },
                    None,
                );
            }
        },
        SummaryTiming::Background => {
            let found = job.ready(state, stable, rebased).await;
            let own_ready = matches!(&found, Some((_, _, true)))
                || state.summary_store.get_local(job.key()).is_some();
            if !own_ready {
                job.clone().spawn(state.clone(), resolution.clone(), caller);
            }
            found.map(|(s, source, _)| (s, source))
        }
    };
    let Some((stored, source)) = chosen else {
        return (decided, None);
    };
    let item = summary::summary_item(format, summary_policy.role, &stored.id, &stored.text);
    let rewritten = summary::splice(parsed, &job.removal, &item);
    // The last turn of an open tool loop after the summary keeps its stale
    // reasoning (the API requires it there): ask the API to drop it.
    let asked = (job.removal.plan.has_stale_thinking() && policy.thinking_drop_block)
        .then(|| crate::format::anthropic::ask_to_drop_stale_thinking(&rewritten))
        .flatten();
    let beta = asked
        .is_some()
        .then_some(crate::format::anthropic::THINKING_BINDING_BETA);
    let rewritten = asked.unwrap_or(rewritten);
    let loss = summary::loss(
        &parsed.conversation,
        &job.removal,
        summary::summary_chars(&stored.id, &stored.text),
        policy.engine.budget_chars,
    );
    let report = SummaryReport {
        id: stored.id.clone(),
        chunks: stored.chunks,
        passes: stored.passes,
        prompt_tokens: match source {
            Source::Model => stored.usage.prompt_tokens,
            Source::Store => Some(0),
        },
        completion_tokens: match source {
            Source::Model => stored.usage.completion_tokens,
            Source::Store => Some(0),
        },
        source: source.label(),
        replaced: job.removal.removed.len(),
    };
    let outcome = Outcome {
        loss,
        rewritten: Some(bytes::Bytes::from(rewritten)),
        stable: outcome.stable,
        beta,
    };
    let seconds = decided.seconds.map(|s| s + started.elapsed().as_secs_f64());
    (
        Decided {
            status: Status::Compacted,
            outcome: Some(Arc::new(outcome)),
            seconds,
            cache_hit: decided.cache_hit,
            detail: None,
            baseline: decided.baseline,
        },
        Some(report),
    )
}

/// Counts and logs a fallback; the error never carries a key.
fn fallback(
    state: &AppState,
    resolution: &Resolution,
    summary_policy: &SummaryPolicy,
    e: &SummarizeError,
) {
    state
        .metrics
        .summarize_fallback(&resolution.policy.name, e.reason());
    tracing::warn!(
        policy = %resolution.policy.name,
        summarizer = %summary_policy.summarizer.name,
        reason = e.reason(),
        error = %e,
        "summary failed; the engine's compaction is forwarded"
    );
}

/// Where a forwarded summary came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Source {
    Model,
    Store,
}

impl Source {
    fn label(self) -> &'static str {
        match self {
            Source::Model => "model",
            Source::Store => "store",
        }
    }
}

/// One summary to have: what it replaces, its transcript and its keys.
#[derive(Clone)]
struct Job {
    removal: Removal,
    /// Transcript entries of the replaced items, oldest first.
    entries: Arc<Vec<String>>,
    /// `prefix_keys[k]`: the key of a summary of `entries[..=k]`; the last
    /// is this summary's.
    prefix_keys: Arc<Vec<Key>>,
    policy: Arc<SummaryPolicy>,
}

impl Job {
    fn new(
        parsed: &Parsed,
        state: &AppState,
        summary_policy: &Arc<SummaryPolicy>,
        resolution: &Resolution,
        goal: Option<&str>,
    ) -> Option<Job> {
        let policy = &resolution.policy;
        // The engine compacted under the request's goal: so does the
        // replay that finds what it removed.
        let with_goal = goal.map(|g| policy.with_goal(g.to_owned()));
        let policy = with_goal.as_ref().unwrap_or(policy);
        let conversation = &parsed.conversation;
        let removal = match policy.mode {
            Mode::Exact => summary::exact_removal(conversation, policy, parsed.format)?,
            Mode::Stable => {
                // The replay is pure and its checkpoints make it cheap: the
                // same plan the engine's outcome was spliced from.
                let compacted = crate::compaction::compact(parsed, policy, &state.checkpoints);
                summary::stable_removal(conversation, compacted.plan.as_ref()?, parsed.format)?
            }
        };
        let items: Vec<&crate::format::Item> = removal
            .removed
            .iter()
            .map(|&i| &conversation.items[i])
            .collect();
        let entries: Vec<String> = prompt::render(&items)
            .into_iter()
            .zip(&items)
            .map(|(entry, item)| match summary::summary_id(&item.text) {
                // An earlier summary of ours, handed back: extended, not
                // summarized as a message.
                Some(_) => prompt::previous_summary(
                    item.text.split_once('\n').map_or("", |(_, rest)| rest),
                ),
                None => entry,
            })
            .collect();
        let prefix_keys = prefix_keys(summary_policy, &entries);
        Some(Job {
            removal,
            entries: Arc::new(entries),
            prefix_keys: Arc::new(prefix_keys),
            policy: summary_policy.clone(),
        })
    }

    fn key(&self) -> Key {
        *self.prefix_keys.last().expect("a job has entries")
    }

    /// The summary written now (or found in the store), within the
    /// summarizer's deadline.
    async fn inline(
        &self,
        state: &AppState,
        caller: &CallerKey,
    ) -> Result<(StoredSummary, Source), SummarizeError> {
        if let Some(found) = state.summary_store.get(self.key()).await {
            return Ok((found, Source::Store));
        }
        let (written, fresh) = self.write(state, caller.clone()).await?;
        Ok((written, if fresh { Source::Model } else { Source::Store }))
    }

    /// Background timing: the summary to forward now, if one is ready,
    /// and whether it is this job's own (the whole part).
    async fn ready(
        &self,
        state: &AppState,
        stable: bool,
        rebased: bool,
    ) -> Option<(StoredSummary, Source, bool)> {
        let own = self.key();
        if !stable {
            return state
                .summary_store
                .get(own)
                .await
                .map(|s| (s, Source::Store, true));
        }
        if !rebased {
            // Between re-compactions: the choice the re-compaction made.
            let chosen = state.summary_choices.get(&own.0)?;
            let found = state.summary_store.get(Key(chosen)).await?;
            return Some((found, Source::Store, chosen == own.0));
        }
        let found = match state.summary_store.get(own).await {
            Some(found) => Some((found, own)),
            None => self.longest_ready_prefix(state),
        };
        let (found, key) = found?;
        state.summary_choices.insert(own.0, key.0);
        Some((found, Source::Store, key == own))
    }

    /// The summary of the longest leading part of this job's entries that
    /// this process holds.
    fn longest_ready_prefix(&self, state: &AppState) -> Option<(StoredSummary, Key)> {
        self.prefix_keys
            .iter()
            .rev()
            .skip(1)
            .find_map(|&k| state.summary_store.get_local(k).map(|s| (s, k)))
    }

    /// Writes this job's summary with the model (extending the newest
    /// summary of a leading part, when one is held), keeps it in the store
    /// and returns what the store holds, and whether the model wrote it
    /// (a summary the store has by now is not written again).
    async fn write(
        &self,
        state: &AppState,
        caller: CallerKey,
    ) -> Result<(StoredSummary, bool), SummarizeError> {
        if let Some(found) = state.summary_store.get(self.key()).await {
            return Ok((found, false));
        }
        let entries: Vec<String> = match self.longest_ready_prefix(state) {
            Some((previous, key)) => {
                let covered = self.prefix_keys.iter().position(|&k| k == key).unwrap_or(0) + 1;
                std::iter::once(prompt::previous_summary(&previous.text))
                    .chain(self.entries[covered..].iter().cloned())
                    .collect()
            }
            None => self.entries.to_vec(),
        };
        let written = crate::summarizer::summarize_within(
            &state.summarizer_client,
            self.policy.summarizer.clone(),
            caller,
            &entries,
            &self.policy.prompt,
        )
        .await?;
        let stored = StoredSummary {
            id: self.key().hex()[..12].to_owned(),
            text: written.text,
            chunks: written.chunks,
            passes: written.passes,
            usage: written.usage,
        };
        Ok((
            state.summary_store.put_if_absent(self.key(), stored).await,
            true,
        ))
    }

    /// Writes the summary off the request path, once per key at a time.
    fn spawn(self, state: Arc<AppState>, resolution: Resolution, caller: CallerKey) {
        let key = self.key();
        {
            let mut in_flight = state
                .summaries_in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            if !in_flight.insert(key.0) {
                return;
            }
        }
        tokio::spawn(async move {
            let result = self.write(&state, caller).await;
            state
                .summaries_in_flight
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .remove(&key.0);
            match result {
                Ok((stored, true)) => state.metrics.summarizer_tokens(
                    &resolution.policy.name,
                    &self.policy.summarizer.name,
                    stored.usage,
                ),
                Ok((_, false)) => {}
                Err(e) => fallback(&state, &resolution, &self.policy, &e),
            }
        });
    }
}

/// The key of a summary of each leading part of `entries`: the summarizer
/// (name, format, model, endpoint), the prompt settings, then the entries.
pub(super) fn prefix_keys(policy: &SummaryPolicy, entries: &[String]) -> Vec<Key> {
    let s = &policy.summarizer;
    let p = &policy.prompt;
    let mut hasher = xxhash_rust::xxh3::Xxh3::new();
    let endpoint = s.endpoint.to_string();
    let target = p.target_tokens.to_le_bytes();
    let header: [&[u8]; 7] = [
        b"summary-v1",
        s.name.as_bytes(),
        s.format.as_str().as_bytes(),
        s.model.as_bytes(),
        endpoint.as_bytes(),
        p.frame
            .as_deref()
            .unwrap_or(prompt::DEFAULT_FRAME)
            .as_bytes(),
        p.instructions.as_bytes(),
    ];
    for part in header.into_iter().chain([target.as_slice()]) {
        hasher.update(&(part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
    entries
        .iter()
        .map(|entry| {
            hasher.update(&(entry.len() as u64).to_le_bytes());
            hasher.update(entry.as_bytes());
            Key(hasher.digest128())
        })
        .collect()
}
