//! The engine's report: the survivors, one record per stage, the loss and
//! budget summaries, and the scoring inputs. Field order is the order of the
//! seed's `outputExample`, which serde keeps.

use serde::{Serialize, Serializer};

use super::Role;

/// Writes whole floats as integers (`1`, not `1.0`) as the seed's example
/// does; other values as the shortest round-trip decimal.
pub(crate) fn number<S: Serializer>(value: &f64, s: S) -> Result<S::Ok, S::Error> {
    if value.fract() == 0.0 && value.abs() < 9.0e15 {
        s.serialize_i64(*value as i64)
    } else {
        s.serialize_f64(*value)
    }
}

/// Rounds half away from zero to `decimals` places, as reports print them.
pub fn round_to(value: f64, decimals: i32) -> f64 {
    let scale = 10f64.powi(decimals);
    (value * scale).round() / scale
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub messages: Vec<OutputMessage>,
    pub stages: Stages,
    pub loss: Loss,
    pub budget: Budget,
    pub scoring: Scoring,
    pub limits: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kept {
    Verbatim,
    Trimmed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ProtectedBecause {
    /// The caller pinned it (`pin: true`, or a proxy pin rule).
    Pin,
    /// Its role is in `keep_roles`.
    Role,
    /// It is among the last `keep_last_n` messages.
    Recent,
    /// Proxy only: it belongs to a tool-call group with a protected member,
    /// and a group is kept or dropped whole.
    ToolGroup,
    /// `scoring = "relevance"` only: among the messages most relevant to
    /// the latest request (`pin_relevant_above`, within `relevant_pin_share`).
    Relevant,
}

#[derive(Debug, Clone, Serialize)]
pub struct OutputMessage {
    pub index: usize,
    pub role: Role,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub kept: Kept,
    pub protected: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protected_because: Option<Vec<ProtectedBecause>>,
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "opt_number")]
    pub score: Option<f64>,
    pub original_chars: usize,
    pub chars: usize,
}

fn opt_number<S: Serializer>(value: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
    match value {
        Some(v) => number(v, s),
        None => s.serialize_none(),
    }
}

/// The four stage records, serialised as the seed's `stages` array.
#[derive(Debug, Clone)]
pub struct Stages {
    pub pin: PinStage,
    pub dedupe: DedupeStage,
    pub trim: TrimStage,
    pub drop: DropStage,
}

impl Serialize for Stages {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(Some(4))?;
        seq.serialize_element(&self.pin)?;
        seq.serialize_element(&self.dedupe)?;
        seq.serialize_element(&self.trim)?;
        seq.serialize_element(&self.drop)?;
        seq.end()
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct PinStage {
    pub stage: &'static str,
    pub order: u8,
    pub protected_messages: usize,
    pub protected_indices: Vec<usize>,
    pub rule: PinRule,
}

#[derive(Debug, Clone, Serialize)]
pub struct PinRule {
    pub keep_roles: Vec<Role>,
    pub keep_last_n: usize,
    pub explicit_pins: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct DedupeStage {
    pub stage: &'static str,
    pub order: u8,
    pub removed_messages: usize,
    pub removed: Vec<Duplicate>,
    pub rule: DedupeRule,
}

#[derive(Debug, Clone, Serialize)]
pub struct Duplicate {
    pub index: usize,
    pub duplicate_of: usize,
    #[serde(serialize_with = "number")]
    pub similarity: f64,
    pub chars: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct DedupeRule {
    #[serde(serialize_with = "number")]
    pub duplicate_threshold: f64,
    pub method: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cut {
    Sentence,
    Hard,
    /// `scoring = "relevance"`: a relevant message cut to the lines or
    /// sentences around where the query matches it (each table row with
    /// its header row), the rest as omission markers.
    Match,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrimStage {
    pub stage: &'static str,
    pub order: u8,
    pub trimmed_messages: usize,
    pub trimmed: Vec<Trimmed>,
    pub rule: TrimRule,
}

#[derive(Debug, Clone, Serialize)]
pub struct Trimmed {
    pub index: usize,
    pub original_chars: usize,
    pub chars: usize,
    pub cut: Cut,
}

#[derive(Debug, Clone, Serialize)]
pub struct TrimRule {
    pub max_message_chars: usize,
    pub cut_at: &'static str,
}

#[derive(Debug, Clone, Serialize)]
pub struct DropStage {
    pub stage: &'static str,
    pub order: u8,
    pub dropped_messages: usize,
    pub dropped: Vec<Dropped>,
    pub rule: DropRule,
}

#[derive(Debug, Clone, Serialize)]
pub struct Dropped {
    pub index: usize,
    #[serde(serialize_with = "number")]
    pub score: f64,
    pub chars: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct DropRule {
    pub weights: Weights,
    pub order: &'static str,
    pub protected_never_dropped: bool,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct Weights {
    #[serde(serialize_with = "number")]
    pub recency: f64,
    #[serde(serialize_with = "number")]
    pub role: f64,
    #[serde(serialize_with = "number")]
    pub topic_overlap: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Loss {
    pub input_messages: usize,
    pub output_messages: usize,
    pub input_chars: usize,
    pub output_chars: usize,
    pub dropped_messages: usize,
    pub dropped_chars: usize,
    pub trimmed_messages: usize,
    pub truncated_chars: usize,
    pub verbatim_messages: usize,
    #[serde(serialize_with = "number")]
    pub retained_char_ratio: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Budget {
    pub budget_chars: usize,
    pub output_chars: usize,
    pub budget_met: bool,
    pub shortfall_chars: usize,
    pub protected_chars: usize,
    pub protected_exceeds_budget: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Scoring {
    pub weights: Weights,
    pub role_weights: RoleWeights,
    pub topic_terms_used: Vec<String>,
    pub note: &'static str,
    /// `scoring = "relevance"` only; absent for the seed's scoring, whose
    /// report stays as the spec prints it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relevance: Option<RelevanceReport>,
}

/// What relevance scoring added to each score, and why.
#[derive(Debug, Clone, Serialize)]
pub struct RelevanceReport {
    /// What a relevance of 1 adds to a message's score.
    #[serde(serialize_with = "number")]
    pub weight: f64,
    pub method: &'static str,
    /// The latest user message, the request the query comes from.
    pub query_index: Option<usize>,
    /// The query's terms as matched: case-folded and stemmed, sorted.
    pub query_terms: Vec<String>,
    #[serde(serialize_with = "number")]
    pub pin_relevant_above: f64,
    #[serde(serialize_with = "number")]
    pub relevant_pin_share: f64,
    /// The messages protected with reason `relevant`, ascending.
    pub pinned: Vec<usize>,
    /// Each input message's relevance, by index, rounded to 6 decimals.
    #[serde(serialize_with = "numbers")]
    pub messages: Vec<f64>,
}

fn numbers<S: Serializer>(values: &[f64], s: S) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeSeq;
    let mut seq = s.serialize_seq(Some(values.len()))?;
    for v in values {
        seq.serialize_element(&Number(*v))?;
    }
    seq.end()
}

struct Number(f64);

impl Serialize for Number {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        number(&self.0, s)
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct RoleWeights {
    #[serde(serialize_with = "number")]
    pub system: f64,
    #[serde(serialize_with = "number")]
    pub user: f64,
    #[serde(serialize_with = "number")]
    pub assistant: f64,
    #[serde(serialize_with = "number")]
    pub tool: f64,
}

pub(crate) const DEDUPE_METHOD: &str = "Jaccard word overlap, same role only, earlier message wins";
pub(crate) const TRIM_CUT_AT: &str =
    "last sentence boundary before the limit, hard cut if none in the last 60 percent";
pub(crate) const DROP_ORDER: &str = "lowest score first, older first on a tie";
pub(crate) const SCORING_NOTE: &str = "Recency is the position in the history from 0 to 1. Topic overlap is the share of a message word set that appears in topic_terms_used, the 25 most frequent terms longer than three characters across the whole history.";
pub(crate) const RELEVANCE_METHOD: &str = "BM25 (k1 1.2, b 0.75) of each message against the terms of the latest user message and the goal, case-folded and stemmed, identifiers and numbers whole; divided by the highest score so the most relevant message has 1. The request itself has 1. score = seed score + weight * relevance.";
pub(crate) const LIMITS: &str = "No language model. Nothing is summarised, paraphrased or rewritten: every character of every returned content appears verbatim in the input, and nothing is appended. Duplicate detection is word overlap, which measures shared vocabulary and not meaning — the same fact in different words is not recognised as a duplicate. Trimming cuts at a sentence boundary and can remove the point of a long message. Protected messages are never dropped, so a budget below protected_chars cannot be met and budget_met is then false.";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_floats_serialise_as_integers() {
        let w = Weights {
            recency: 0.5,
            role: 1.0,
            topic_overlap: 0.25,
        };
        assert_eq!(
            serde_json::to_string(&w).unwrap(),
            r#"{"recency":0.5,"role":1,"topic_overlap":0.25}"#
        );
    }

    #[test]
    fn rounding_is_half_away_from_zero() {
        assert_eq!(round_to(0.1234566, 6), 0.123457);
        assert_eq!(round_to(0.79613, 4), 0.7961);
    }
}
