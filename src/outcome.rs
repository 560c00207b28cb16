//! What compacting one body produced, as the proxy, the caches and the
//! `compact` command share it.

use bytes::Bytes;

use crate::compaction::stable::StableInfo;
pub use crate::metrics::{LossSummary, Status};

/// The outcome of one body under one policy.
#[derive(Debug)]
pub struct Outcome {
    pub loss: LossSummary,
    /// The body to forward, or `None` when it is the input unchanged.
    pub rewritten: Option<Bytes>,
    /// Stable mode's prefix report.
    pub stable: Option<StableInfo>,
}
