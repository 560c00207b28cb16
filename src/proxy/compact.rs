//! Step 5 of the pipeline: decide what to forward for a collected body on a
//! matched route. Decoding, hashing for the cache and the engine all cost
//! CPU in proportion to the body. A small body is decided right on the
//! connection's worker: handing it to another thread costs more than the work. A
//! large one runs on the blocking pool, at most one per core at a time, so
//! a burst of large bodies queues instead of multiplying the proxy's memory
//! or starving the small requests beside it.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;

use super::body::{self, Coding, Received};
use super::AppState;
use crate::cache::{CompactionCache, PrefixCache};
use crate::compaction::stable::Checkpoints;
use crate::compaction::status::{refuse_agent_compaction, status_of};
use crate::error::ProxyError;
use crate::format::{Format, Skip};
use crate::outcome::{Outcome, Status};
use crate::policy::{CompiledPolicy, Resolution, Runtime};

/// Bodies up to this size are decided on the connection's worker: below it, the
/// hand-off to the blocking pool (two thread wake-ups) costs more than
/// parsing and compacting.
pub const INLINE_BODY_BYTES: usize = 64 * 1024;
/// A body no longer than its budget in bytes fits it for sure (a char is
/// at least one byte), so only a parse and count is left: done on the async
/// worker up to this size.
pub const INLINE_FITTING_BODY_BYTES: usize = 1024 * 1024;

/// Whether deciding this body is cheap enough for the connection's worker.
fn decide_inline(raw: &[u8], coding: Coding, policy: &CompiledPolicy) -> bool {
    coding == Coding::Identity
        && (raw.len() <= INLINE_BODY_BYTES
            || (raw.len() <= INLINE_FITTING_BODY_BYTES && raw.len() <= policy.engine.budget_chars))
}

/// What to forward, and what the loss report says.
pub(super) struct Decided {
    pub status: Status,
    /// The engine's (or the cache's) outcome, when the body was compactable.
    pub outcome: Option<Arc<Outcome>>,
    /// Time spent deciding, queueing excluded.
    pub seconds: Option<f64>,
    /// Whether the cache answered (`None`: not looked up).
    pub cache_hit: Option<bool>,
    /// A skip's detail: the message and what is wrong with it
    /// ([`Skip::detail`]), for the status header and the log line.
    pub detail: Option<String>,
    /// What the bill's estimate knows of the original body, measured
    /// against the recent ones (only when prices are configured: nothing
    /// else needs it).
    pub baseline: Option<crate::usage::Baseline>,
}

impl Decided {
    fn skipped(reason: &'static str) -> Self {
        Decided {
            status: Status::Skipped(reason),
            outcome: None,
            seconds: None,
            cache_hit: None,
            detail: None,
            baseline: None,
        }
    }
}

/// Why a body is not compacted.
enum Decline {
    /// Forward it as it came, marked `skipped; <reason>`.
    Skip(&'static str),
    /// The same, for a body that was read: its [`Skip`] says why.
    Read(Skip),
    /// Refuse it (only a body that decodes past the size limit).
    Refuse(ProxyError),
}

/// Decides for one body; `Err` only when it must be refused (413). `goal`
/// is the request's relevance goal (`CompiledPolicy::relevance_goal`).
pub(super) async fn decide(
    state: &Arc<AppState>,
    runtime: &Runtime,
    resolution: &Resolution,
    raw: Received,
    coding: Coding,
    goal: Option<String>,
) -> Result<Decided, ProxyError> {
    if coding == Coding::Unsupported {
        return Ok(Decided::skipped("unsupported-encoding"));
    }
    let limits = Limits {
        body_bytes: runtime.config.server.max_body_bytes,
        messages: runtime.config.server.max_messages,
        billing: (!runtime.prices.is_empty()).then(|| resolution.tenant.clone()),
    };
    let format = resolution.format;
    let computed = if decide_inline(&raw, coding, &resolution.policy) {
        let started = Instant::now();
        // As on the blocking pool, a bug must not fail the request: a panic
        // here forwards the body as it came instead of dropping the
        // connection.
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            compute(
                state,
                &resolution.policy,
                format,
                &raw,
                coding,
                limits,
                goal,
            )
        }))
        .unwrap_or_else(|_| {
            tracing::error!("compaction panicked; forwarding the original");
            Err(Decline::Skip("internal-error"))
        });
        Ok((result, started.elapsed().as_secs_f64()))
    } else {
        let permit = state
            .compactions
            .clone()
            .acquire_owned()
            .await
            .expect("the compaction semaphore is never closed");
        let (task_state, policy) = (state.clone(), resolution.policy.clone());
        tokio::task::spawn_blocking(move || {
            let _permit = permit;
            let started = Instant::now();
            let result = compute(&task_state, &policy, format, &raw, coding, limits, goal);
            (result, started.elapsed().as_secs_f64())
        })
        .await
    };

    let policy = &resolution.policy;
    let ((outcome, hit, baseline), seconds) = match computed {
        Ok((Ok(computed), seconds)) => (computed, seconds),
        Ok((Err(Decline::Skip(reason)), _)) => return Ok(Decided::skipped(reason)),
        Ok((Err(Decline::Read(skip)), _)) => {
            return Ok(Decided {
                detail: skip.detail(),
                ..Decided::skipped(skip.reason())
            })
        }
        Ok((Err(Decline::Refuse(e)), _)) => return Err(e),
        Err(e) => {
            // A bug in the engine must not fail the request: forward it as it came.
            tracing::error!(error = %e, "compaction failed; forwarding the original");
            return Ok(Decided::skipped("internal-error"));
        }
    };
    Ok(Decided {
        status: status_of(policy, &outcome),
        outcome: Some(outcome),
        seconds: Some(seconds),
        cache_hit: Some(hit),
        detail: None,
        baseline,
    })
}

#[derive(Clone)]
struct Limits {
    body_bytes: usize,
    messages: usize,
    /// With prices configured: the tenant whose recent originals the
    /// bill's estimate measures this body against.
    billing: Option<Arc<str>>,
}

/// An outcome, whether the cache answered, and the bill's baseline.
type Computed = (Arc<Outcome>, bool, Option<crate::usage::Baseline>);

/// Measures the decoded original against `tenant`'s recent ones for the
/// bill's estimate, given what is forwarded.
fn baseline(
    state: &AppState,
    tenant: Option<&str>,
    decoded: &[u8],
    policy: &CompiledPolicy,
    outcome: &Outcome,
) -> Option<crate::usage::Baseline> {
    let tenant = tenant?;
    let rewritten = outcome.rewritten.as_ref().filter(|_| !policy.dry_run);
    let forwarded = rewritten.map_or(decoded.len(), Bytes::len);
    Some(
        state
            .prints
            .observe(tenant, decoded, forwarded, rewritten.is_none()),
    )
}

/// Decodes, looks up the cache, and compacts on a miss; the bool says
/// whether the outcome came from the cache. Runs on the blocking pool.
fn compute(
    state: &AppState,
    policy: &CompiledPolicy,
    format: Format,
    raw: &Received,
    coding: Coding,
    limits: Limits,
    goal: Option<String>,
) -> Result<Computed, Decline> {
    let billing = limits.billing.as_deref();
    let decoded = match body::decode_received(raw, coding, limits.body_bytes) {
        Ok(decoded) => decoded,
        Err(e @ ProxyError::BodyTooLarge { .. }) => return Err(Decline::Refuse(e)),
        // Not ours to judge: the upstream may read what we cannot.
        Err(_) => return Err(Decline::Skip("undecodable-body")),
    };
    if let Some(goal) = goal {
        // The goal is not part of the cache key: compute, never cache.
        let policy = policy.with_goal(goal);
        let outcome = outcome_of(
            &decoded,
            &policy,
            format,
            limits.messages,
            &state.checkpoints,
        )
        .map_err(Decline::Read)?;
        let measured = baseline(state, billing, &decoded, &policy, &outcome);
        return Ok((Arc::new(outcome), false, measured));
    }
    let (outcome, hit) = decide_decoded(
        &state.cache,
        &state.checkpoints,
        &state.prefixes,
        policy,
        format,
        &decoded,
        limits.messages,
    )
    .map_err(Decline::Read)?;
    let measured = baseline(state, billing, &decoded, policy, &outcome);
    Ok((outcome, hit, measured))
}

/// The CPU-bound core of one request's decision, for a decoded body with
/// no relevance goal: the compaction cache, then the pipeline on a miss
/// (with stable mode's checkpoints, and the parse resumed from a known
/// prefix when `prefixes` holds one). The bool says whether the cache
/// answered. Public so that benches drive what the proxy runs.
pub fn decide_decoded(
    cache: &CompactionCache,
    checkpoints: &dyn Checkpoints,
    prefixes: &PrefixCache,
    policy: &CompiledPolicy,
    format: Format,
    received: &Received,
    max_messages: usize,
) -> Result<(Arc<Outcome>, bool), Skip> {
    let decoded: &[u8] = received;
    let key = CompactionCache::key(policy.id, format, decoded);
    if let Some(hit) = cache.get(key, decoded) {
        return Ok((hit, true));
    }
    let (parsed, lease) = prefixes.parse(policy.id, format, decoded, max_messages)?;
    refuse_agent_compaction(&parsed, policy)?;
    let outcome = Arc::new(outcome_of_parsed(&parsed, policy, checkpoints, None));
    // A body the prefix cache keeps is kept once, for both caches: shared
    // when it is a buffer of its own, else copied.
    let shared = lease.may_keep().then(|| received.to_keep());
    prefixes.keep_sharing(lease, parsed, shared.as_ref());
    // Inserted here, not after the await: work a departed client paid for
    // still serves its retry.
    cache.insert(key, outcome.clone(), || {
        shared.unwrap_or_else(|| received.to_keep())
    });
    Ok((outcome, false))
}

/// What compacting a decoded body under `policy` gives: the pure core of
/// this step, which the offline `compact` command shares.
pub fn outcome_of(
    decoded: &[u8],
    policy: &CompiledPolicy,
    format: Format,
    max_messages: usize,
    checkpoints: &dyn Checkpoints,
) -> Result<Outcome, Skip> {
    let parsed = format.parse(decoded, max_messages)?;
    refuse_agent_compaction(&parsed, policy)?;
    Ok(outcome_of_parsed(&parsed, policy, checkpoints, None))
}

/// [`outcome_of`] for a parsed body, with a model's tool-call decisions
/// applied first when there are some.
pub fn outcome_of_parsed(
    parsed: &crate::format::Parsed,
    policy: &CompiledPolicy,
    checkpoints: &dyn Checkpoints,
    decided: Option<&crate::compaction::decisions::Applied>,
) -> Outcome {
    let format = parsed.format;
    let mut compacted = crate::compaction::compact_decided(parsed, policy, checkpoints, decided);
    let mut beta = None;
    let mut marked = None;
    let rewritten = compacted.plan.map(|mut plan| {
        // The proxy's recall tool goes with this body (it has markers).
        let mut with_tool = false;
        let body = match policy.recall {
            Some(_) => {
                // `recall = true`: a marker with its id wherever the plan cut.
                let m = crate::compaction::recall::mark(parsed, &mut plan);
                if !m.ids.is_empty() && parsed.takes_recall_tool() {
                    // The tool goes with the markers: reasoning made
                    // without it is stale.
                    crate::compaction::thinking::strip_made_without_the_tool(
                        &parsed.conversation,
                        &mut plan,
                        &m.inserts,
                    );
                    with_tool = true;
                }
                let body = parsed.splice_inserting_all(&plan, &m.inserts);
                marked = Some(m);
                body
            }
            None => parsed.splice(&plan),
        };
        // The last turn of an open tool loop keeps reasoning whose prefix
        // changed (the API requires it there): ask the API to drop it. With
        // the recall tool, any kept reasoning may be: a turn the proxy
        // answered after recall rounds was made with those rounds in its
        // prefix, which the client's history lacks, and nothing in the
        // history says which turn that was. Asking drops only blocks that
        // fail the check.
        let recalled_maybe = with_tool
            && format == Format::Anthropic
            && plan.items.iter().any(|p| {
                p.thinking != crate::format::Reasoning::Stripped
                    && parsed.conversation.items[p.index].thinking.is_some()
            });
        let asked = ((plan.has_stale_thinking() || recalled_maybe) && policy.thinking_drop_block)
            .then(|| crate::format::anthropic::ask_to_drop_stale_thinking(&body))
            .flatten();
        // What the splice wrote goes as it is: the next turn may reuse it.
        let spliced_as_is = asked.is_none() && marked.as_ref().map_or(true, |m| m.ids.is_empty());
        let body = match asked {
            Some(asked) => {
                beta = Some(crate::format::anthropic::THINKING_BINDING_BETA);
                asked
            }
            None => body,
        };
        // The tool goes only with markers: a body without them is as the
        // policy would forward it without recall.
        let body = match &marked {
            Some(m) if !m.ids.is_empty() => {
                crate::format::recall::add_tool(format, &body).unwrap_or(body)
            }
            _ => body,
        };
        match spliced_as_is {
            true => parsed.keep_splice(plan, body),
            false => Bytes::from(body),
        }
    });
    if let Some(m) = marked.filter(|m| !m.ids.is_empty()) {
        m.add_to(&mut compacted.loss);
    }
    Outcome {
        loss: compacted.loss,
        rewritten,
        stable: compacted.stable,
        beta,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CheckpointStore;
    use crate::config::Mode;
    use crate::engine::Policy;

    /// A chat body past the prefix cache's smallest (so both caches keep
    /// it) and past its budget (so it is compacted).
    fn large_body() -> Vec<u8> {
        let mut messages = vec![serde_json::json!({"role": "user", "content": "begin"})];
        for i in 0..40 {
            messages.push(serde_json::json!({"role": "assistant", "content": format!("step {i}")}));
            messages.push(serde_json::json!({"role": "user", "content": "word ".repeat(400)}));
        }
        serde_json::to_vec(&serde_json::json!({"model": "m", "messages": messages})).unwrap()
    }

    /// The proxy's stores, as long as a test holds them.
    type Stores = (CompactionCache, CheckpointStore, PrefixCache);

    fn decide(received: &Received) -> Stores {
        let mut policy = CompiledPolicy::plain("keep", Policy::with_budget(10_000));
        policy.mode = Mode::Stable;
        let (cache, checkpoints, prefixes) = (
            CompactionCache::new(64 << 20),
            CheckpointStore::new(16 << 20),
            PrefixCache::new(64 << 20),
        );
        let (outcome, hit) = decide_decoded(
            &cache,
            &checkpoints,
            &prefixes,
            &policy,
            Format::Chat,
            received,
            10_000,
        )
        .unwrap();
        assert!(!hit);
        assert!(outcome.rewritten.is_some(), "compacted");
        (cache, checkpoints, prefixes)
    }

    #[test]
    fn a_body_sliced_from_a_larger_buffer_is_kept_as_a_copy() {
        let body = large_body();
        assert!(body.len() >= crate::format::resume::MIN_SNAPSHOT_BYTES);
        let mut read_buffer = body.clone();
        read_buffer.extend_from_slice(&[b' '; 100_000]);
        let read_buffer = Bytes::from(read_buffer);
        let _stores = decide(&Received::borrowed(read_buffer.slice(..body.len())));
        assert!(
            read_buffer.is_unique(),
            "no store holds on to the larger buffer"
        );
    }

    #[test]
    fn a_body_of_its_own_buffer_is_kept_as_it_is() {
        let received = Received::from_vec(large_body().into_boxed_slice().into_vec());
        assert!(received.owns_its_buffer());
        let _stores = decide(&received);
        assert!(
            !received.bytes().is_unique(),
            "the stores share the received bytes"
        );
    }
}
