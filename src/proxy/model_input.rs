//! What the model-backed steps of the pipeline (step 5: [`super::decisions`],
//! then [`super::summaries`]) read of one request, made once for both: its
//! route and policy, its body decoded and parsed, its headers (the caller's
//! key, for `credentials = "caller"`) and its relevance goal.

use std::time::Instant;

use bytes::Bytes;
use http::HeaderMap;

use super::body::{self, Coding};
use super::compact::Decided;
use crate::format::Parsed;
use crate::outcome::Status;
use crate::policy::{Resolution, Runtime};

/// One request as the model-backed steps see it.
pub(super) struct ModelInput<'a> {
    pub resolution: &'a Resolution,
    /// The body as the client sent it, decoded and parsed.
    pub parsed: Parsed<'a>,
    pub headers: &'a HeaderMap,
    /// The request's relevance goal
    /// ([`crate::policy::CompiledPolicy::relevance_goal`]).
    pub goal: Option<&'a str>,
}

/// Whether a model-backed step may apply to a decided body: the policy has
/// one, and the engine compacted the body (not a dry run).
pub(super) fn wanted(resolution: &Resolution, decided: &Decided) -> bool {
    let (policy, models) = (&resolution.policy, &resolution.models);
    (models.decisions.is_some() || models.summary.is_some())
        && decided.status == Status::Compacted
        && !policy.dry_run
        && decided.outcome.is_some()
}

/// The decoded body the input is parsed from, with the seconds decoding
/// took; `None` when it does not decode (the steps then leave the body as
/// the engine made it).
pub(super) fn decode(runtime: &Runtime, raw: &Bytes, coding: Coding) -> Option<(Bytes, f64)> {
    let started = Instant::now();
    let decoded = body::decode(raw, coding, runtime.config.server.max_body_bytes).ok()?;
    Some((decoded, started.elapsed().as_secs_f64()))
}

impl<'a> ModelInput<'a> {
    /// The input over a decoded body, with the seconds parsing took; `None`
    /// when it does not parse.
    pub fn parse(
        runtime: &Runtime,
        resolution: &'a Resolution,
        decoded: &'a Bytes,
        headers: &'a HeaderMap,
        goal: Option<&'a str>,
    ) -> Option<(ModelInput<'a>, f64)> {
        let started = Instant::now();
        let parsed = resolution
            .format
            .parse(decoded, runtime.config.server.max_messages)
            .ok()?;
        let input = ModelInput {
            resolution,
            parsed,
            headers,
            goal,
        };
        Some((input, started.elapsed().as_secs_f64()))
    }
}
