//! Relevance scoring (`scoring = "relevance"`): how much each message is
//! about what the latest request asks, by BM25 with the request as the query.
//!
//! - **Query**: the terms of the last `user` message of the input, plus the
//!   terms of the policy's goal text when a caller passes one. Each distinct
//!   term counts once; the request and the goal weigh the same.
//! - **Documents**: every other message, whatever its role (tool results
//!   included). The request message itself is not a document: it would add
//!   one to the document frequency of every query term alike. It is given
//!   relevance 1, the most any message has: it is the request.
//! - **Terms**: runs of letters and digits, case-folded. A run joined by
//!   `- _ . / : # @ +` to another run (`7731-KAPPA`, `src/main.rs`,
//!   `v1.2.3`) is kept whole as one term, and each of its parts is a term
//!   too, so `main.rs` in a question still finds `src/main.rs`. Terms with a
//!   digit and joined terms are never stemmed; letter-only terms go through
//!   [`stem`], a small suffix stripper (plurals, `-ing`, `-ed`, `-ation`,
//!   `-ment`, `-ness`, a final `-y` or `-e`). Common English words
//!   ([`is_stopword`]) and one-letter words are never query terms.
//! - **BM25**: `k1` = [`K1`], `b` = [`B`], `idf = ln(1 + (N - df + 0.5) /
//!   (df + 0.5))` over the N documents; a document's length is the number of
//!   its terms (stopwords included: only the ratio to the average matters).
//! - **Relevance** of a message is its BM25 score divided by the highest
//!   score of any document, so it lies in [0, 1] and the most relevant
//!   message has 1. No query term in any document: every relevance is 0.
//!
//! - **Analyses**: each message is first reduced to an [`Analysis`], its
//!   length and the count of each distinct term (by a 64-bit [`term_id`]),
//!   whatever the query; BM25 then reads the query's terms from those. An
//!   [`AnalysisCache`] the caller passes keeps analyses between requests, by
//!   a hash of each message's text and of each history, so a new turn of a
//!   conversation analyses only its new messages. Without a cache nothing
//!   is kept, so no analysis is built: a [`QueryCounter`] counts the
//!   query's terms straight from each text, the same integers.
//! - **Scanning**: an ASCII text, nearly every one, is read from bit masks
//!   of its bytes ([`TermMasks`](terms::TermMasks)), so terms are found by counting zeros,
//!   not by a branch per byte; any other text by [`for_each_term`].
//!
//! Everything is computed in input order over sorted or index-keyed
//! structures: the same messages and goal give the same numbers, bit for
//! bit, with any cache or none. Pure: no I/O; a cache is the caller's.

mod analysis;
mod context;
mod excerpt;
mod query;
#[cfg(test)]
mod rule_tests;
mod terms;
#[cfg(test)]
mod tests;

pub use analysis::{
    fill, history_keys, message_key, Analysis, AnalysisCache, CachedAnalysis, History,
};
pub use context::Alias;
pub use excerpt::{excerpt, excerpt_cached, omission_marker, QueryTerms, SegmentTerms};
pub use terms::{is_stopword, stem, term_id, terms};

use analysis::HistoryLookup;
use query::{Query, QueryCounter};
use rustc_hash::FxHashMap;
use terms::for_each_term;

use super::{Message, Role};

/// BM25 term-frequency saturation.
pub const K1: f64 = 1.2;

/// BM25 length normalisation.
pub const B: f64 = 0.75;

/// What [`analyze`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Relevance {
    /// The distinct query terms, in code-point order.
    pub query_terms: Vec<String>,
    /// The index of the latest user message, the request, if any.
    pub query_index: Option<usize>,
    /// Normalised relevance of each input message, in [0, 1].
    pub relevance: Vec<f64>,
    /// The query's terms with their weights, for [`excerpt`].
    pub query: QueryTerms,
}

/// Scores each message of `messages` against the latest user message and
/// the optional `goal`.
pub fn analyze(messages: &[Message], goal: Option<&str>) -> Relevance {
    analyze_cached(messages, goal, &super::NoCaches)
}

/// [`analyze`], with each message's [`Analysis`] looked up in (and added
/// to) `cache` by a hash of its text, so a turn that adds a message to a
/// history analyses only the new one. The result is the same with any
/// cache or none, bit for bit: an analysis is a pure function of the text.
pub fn analyze_cached(
    messages: &[Message],
    goal: Option<&str>,
    cache: &dyn AnalysisCache,
) -> Relevance {
    analyze_keyed(messages, goal, cache, None).0
}

/// [`analyze_cached`], given each message's [`message_key`] when the
/// caller has them (`keys`), and giving them back when it hashed the
/// texts (a cache on, a query to score): a request's later stages look
/// up its messages by the same keys without hashing them again.
pub fn analyze_keyed(
    messages: &[Message],
    goal: Option<&str>,
    cache: &dyn AnalysisCache,
    keys: Option<Vec<u128>>,
) -> (Relevance, Option<Vec<u128>>) {
    let (found, keys, _) = analyze_counted(messages, goal, cache, keys, None);
    (found, keys)
}

/// What [`analyze_counted`] counted of each message for its query: kept by
/// a caller that scores the same messages again after changing some of
/// their texts (the agent passes' cuts, before the engine), so that only
/// the changed texts are counted again.
#[derive(Debug, Clone)]
pub struct Counted {
    /// [`message_key`] of each message's text as counted.
    keys: Vec<u128>,
    query_index: Option<usize>,
    /// The query counted: its term ids and weights, aliases linked.
    query_ids: Vec<u64>,
    query_weights: Vec<f64>,
    /// The alias definitions of each message that makes any.
    aliases: Vec<(usize, Vec<Alias>)>,
    /// Whether the counts came from analyses (the cache held the history):
    /// a changed text is then analysed into the cache as well.
    analysed: bool,
    counts: Counts,
}

/// Each message's length and query-term counts, and its subject's.
#[derive(Debug, Clone)]
struct Counts {
    /// `messages × terms` counts, row by message.
    tf: Vec<u32>,
    length: Vec<u32>,
    /// The messages with a subject, and each one's counts and length.
    subjects: Vec<usize>,
    subject_tf: Vec<u32>,
    subject_length: Vec<u32>,
}

/// [`analyze_keyed`], also giving back what it counted ([`Counted`], when
/// the query has terms). `prior`, when given with `keys`, is what an
/// earlier call counted of these messages (the same roles and subjects)
/// when only the texts whose keys differ have changed since: only those
/// are counted again, unless the query changed too (an alias defined or
/// lost), which counts everything anew. The same result either way.
pub fn analyze_counted(
    messages: &[Message],
    goal: Option<&str>,
    cache: &dyn AnalysisCache,
    keys: Option<Vec<u128>>,
    prior: Option<&Counted>,
) -> (Relevance, Option<Vec<u128>>, Option<Counted>) {
    let query_index = messages.iter().rposition(|m| m.role == Role::User);
    let mut query = Query::default();
    // The turns the request refers back to: part of the question.
    let mut followed = Vec::new();
    if let Some(q) = query_index {
        for_each_term(&messages[q].content, |term, kind| query.add(term, kind));
        followed = context::add_references(messages, q, &mut query);
    }
    if let Some(goal) = goal {
        for_each_term(goal, |term, kind| query.add(term, kind));
    }
    if let (Some(prior), Some(keys), false) = (prior, &keys, query.terms.is_empty()) {
        if let Some((query, counted)) =
            recount(messages, query_index, query.clone(), prior, keys, cache)
        {
            let found = score(messages, query_index, query, &followed, &counted.counts);
            return (found, Some(counted.keys.clone()), Some(counted));
        }
    }
    let mut relevance = vec![0.0; messages.len()];

    // A history whose earlier turn the cache holds reuses its analyses
    // and adds its new messages'. Without one (no cache, or the first
    // turn the cache sees), analysing every message would double this
    // request's cost: the query's terms are counted straight from the
    // text, and a cache that can builds the analyses after the request.
    let texts: Vec<&str> = messages.iter().map(|m| &*m.content).collect();
    let mut keys = keys;
    let found = (!query.terms.is_empty() && cache.enabled())
        .then(|| HistoryLookup::new(&texts, keys.take(), cache));
    if let Some(lookup) = &found {
        keys = Some(lookup.keys().to_vec());
    }
    let count_directly = match &found {
        None => true,
        Some(lookup) => {
            lookup.earlier.is_none()
                && lookup
                    .prefixes
                    .last()
                    .is_some_and(|&history| cache.fill_later(history, &texts))
        }
    };
    let analyses = match (found, count_directly) {
        (Some(lookup), false) => Some(lookup.analyses(&texts, cache)),
        _ => None,
    };
    // Aliases link the query's names to their other names.
    let mut aliases: Vec<(usize, Vec<Alias>)> = Vec::new();
    if !query.terms.is_empty() {
        match &analyses {
            Some(analyses) => analyses.for_each(|i, a| {
                if !a.aliases.is_empty() {
                    aliases.push((i, a.aliases.clone()));
                }
            }),
            None => {
                for (i, text) in texts.iter().enumerate() {
                    let mut found = Vec::new();
                    context::find_aliases(text, &mut found);
                    if !found.is_empty() {
                        aliases.push((i, found));
                    }
                }
            }
        }
        link_aliases(&aliases, &mut query);
    }
    if query.terms.is_empty() {
        if let Some(q) = query_index {
            relevance[q] = 1.0;
        }
        let found = Relevance {
            query_terms: Vec::new(),
            query_index,
            relevance,
            query: QueryTerms::default(),
        };
        return (found, keys, None);
    }

    // Each document's length and query-term counts, from its analysis.
    let terms = query.terms.len();
    let mut tf = vec![0u32; messages.len() * terms];
    let mut length = vec![0u32; messages.len()];
    if let Some(analyses) = &analyses {
        analyses.for_each(|i, analysis| {
            if Some(i) == query_index {
                return;
            }
            length[i] = analysis.length;
            query.count_in(analysis, &mut tf[i * terms..(i + 1) * terms]);
        });
    } else {
        // The same integers as counting the terms in analyses.
        let mut counter = QueryCounter::new(&query);
        for (i, text) in texts.iter().enumerate() {
            if Some(i) != query_index {
                length[i] = counter.count(text, &mut tf[i * terms..(i + 1) * terms]);
            }
        }
    }
    // Subjects (a tool result's call) are a second, short field of their
    // message, counted from their text: a few dozen bytes each.
    let subjects: Vec<usize> = (0..messages.len())
        .filter(|&i| Some(i) != query_index && !messages[i].subject.is_empty())
        .collect();
    let mut subject_tf = vec![0u32; subjects.len() * terms];
    let mut subject_length = vec![0u32; subjects.len()];
    if analyses.is_some() {
        // A warm turn: the subjects in order are a history of texts like
        // the messages (an analysis is the same function of any text), so
        // the previous turn's are found with one lookup and only the new
        // calls' arguments are read.
        let texts: Vec<&str> = subjects
            .iter()
            .map(|&i| messages[i].subject.as_str())
            .collect();
        HistoryLookup::new(&texts, None, cache)
            .analyses(&texts, cache)
            .for_each(|k, analysis| {
                subject_length[k] = analysis.length;
                query.count_in(analysis, &mut subject_tf[k * terms..(k + 1) * terms]);
            });
    } else if !subjects.is_empty() {
        let mut counter = QueryCounter::new(&query);
        for (k, &i) in subjects.iter().enumerate() {
            let counts = &mut subject_tf[k * terms..(k + 1) * terms];
            subject_length[k] = counter.count(&messages[i].subject, counts);
        }
    }
    let counts = Counts {
        tf,
        length,
        subjects,
        subject_tf,
        subject_length,
    };
    let analysed = analyses.is_some();
    let (query_ids, query_weights) = (query.ids.clone(), query.weights.clone());
    let found = score(messages, query_index, query, &followed, &counts);
    // Without keys (no cache) there is nothing to tell changed texts by.
    let counted = keys.as_ref().map(|keys| Counted {
        keys: keys.clone(),
        query_index,
        query_ids,
        query_weights,
        aliases,
        analysed,
        counts,
    });
    (found, keys, counted)
}

/// Adds to `query` the other names of the aliases (each message's, in
/// message order) whose one name it holds.
fn link_aliases(aliases: &[(usize, Vec<Alias>)], query: &mut Query) {
    let all: Vec<Alias> = aliases
        .iter()
        .flat_map(|(_, a)| a.iter().cloned())
        .collect();
    context::link_aliases(&all, query);
}

/// `prior`'s counts brought up to `messages`, whose texts differ from
/// those `prior` counted where `keys` differ from its keys: the changed
/// texts counted again, for `query` (aliases not yet linked). `None` when
/// `prior` is of other messages, or the changed texts change the query.
fn recount(
    messages: &[Message],
    query_index: Option<usize>,
    mut query: Query,
    prior: &Counted,
    keys: &[u128],
    cache: &dyn AnalysisCache,
) -> Option<(Query, Counted)> {
    if prior.keys.len() != messages.len()
        || keys.len() != messages.len()
        || prior.query_index != query_index
    {
        return None;
    }
    let changed: Vec<usize> = (0..messages.len())
        .filter(|&i| keys[i] != prior.keys[i])
        .collect();
    let analysed = prior.analysed && cache.enabled();
    let fresh: Vec<Option<std::sync::Arc<Analysis>>> = changed
        .iter()
        .map(|&i| analysed.then(|| analysis::cached_keyed(&messages[i].content, keys[i], cache)))
        .collect();
    // The aliases of the unchanged texts, then of the changed, in message
    // order.
    let mut aliases: Vec<(usize, Vec<Alias>)> = prior
        .aliases
        .iter()
        .filter(|(i, _)| changed.binary_search(i).is_err())
        .cloned()
        .collect();
    for (&i, analysis) in changed.iter().zip(&fresh) {
        let mut found = Vec::new();
        match analysis {
            Some(a) => found.extend(a.aliases.iter().cloned()),
            None => context::find_aliases(&messages[i].content, &mut found),
        }
        if !found.is_empty() {
            aliases.push((i, found));
        }
    }
    aliases.sort_by_key(|(i, _)| *i);
    link_aliases(&aliases, &mut query);
    if query.ids != prior.query_ids || query.weights != prior.query_weights {
        return None;
    }
    let terms = query.terms.len();
    let mut counts = prior.counts.clone();
    let mut counter = None;
    for (&i, analysis) in changed.iter().zip(&fresh) {
        if Some(i) == query_index {
            continue;
        }
        let row = &mut counts.tf[i * terms..(i + 1) * terms];
        row.fill(0);
        counts.length[i] = match analysis {
            Some(a) => {
                query.count_in(a, row);
                a.length
            }
            None => counter
                .get_or_insert_with(|| QueryCounter::new(&query))
                .count(&messages[i].content, row),
        };
    }
    drop(counter);
    let counted = Counted {
        keys: keys.to_vec(),
        query_index,
        query_ids: prior.query_ids.clone(),
        query_weights: prior.query_weights.clone(),
        aliases,
        analysed: prior.analysed,
        counts,
    };
    Some((query, counted))
}

/// BM25 of each message from its `counts` for `query`, normalised, with
/// the latest of several values preferred and the request and the turns
/// it `followed` at 1.
fn score(
    messages: &[Message],
    query_index: Option<usize>,
    query: Query,
    followed: &[usize],
    counts: &Counts,
) -> Relevance {
    let Counts {
        tf,
        length,
        subjects,
        subject_tf,
        subject_length,
    } = counts;
    let terms = query.terms.len();
    let mut relevance = vec![0.0; messages.len()];
    let subject_of: FxHashMap<usize, usize> =
        subjects.iter().enumerate().map(|(k, &i)| (i, k)).collect();
    let mut df = vec![0u32; terms];
    let mut documents = 0usize;
    for i in 0..messages.len() {
        if Some(i) == query_index {
            continue;
        }
        documents += 1;
        let subject = subject_of
            .get(&i)
            .map(|&k| &subject_tf[k * terms..(k + 1) * terms]);
        for (t, d) in df.iter_mut().enumerate() {
            let in_subject = subject.is_some_and(|s| s[t] > 0);
            *d += u32::from(tf[i * terms + t] > 0 || in_subject);
        }
    }
    let total_length: u64 = length.iter().map(|&l| u64::from(l)).sum();
    let average_length = if documents == 0 {
        1.0
    } else {
        (total_length as f64 / documents as f64).max(1.0)
    };
    let n = documents as f64;
    let idf: Vec<f64> = df
        .iter()
        .map(|&d| (1.0 + (n - d as f64 + 0.5) / (d as f64 + 0.5)).ln())
        .collect();

    let average_subject = if subjects.is_empty() {
        1.0
    } else {
        (subject_length.iter().map(|&l| f64::from(l)).sum::<f64>() / subjects.len() as f64).max(1.0)
    };
    let mut best = 0.0f64;
    let mut matched = vec![0u64; messages.len()];
    for (i, r) in relevance.iter_mut().enumerate() {
        if Some(i) == query_index {
            continue;
        }
        let norm = K1 * (1.0 - B + B * length[i] as f64 / average_length);
        let mut score = 0.0;
        for (t, &count) in tf[i * terms..(i + 1) * terms].iter().enumerate() {
            if count > 0 {
                let f = count as f64;
                score += query.weights[t] * idf[t] * f * (K1 + 1.0) / (f + norm);
                matched[i] |= 1u64 << (t % 64);
            }
        }
        if let Some(&k) = subject_of.get(&i) {
            let norm = K1 * (1.0 - B + B * subject_length[k] as f64 / average_subject);
            for (t, &count) in subject_tf[k * terms..(k + 1) * terms].iter().enumerate() {
                if count > 0 {
                    let f = count as f64;
                    score += query.weights[t] * idf[t] * f * (K1 + 1.0) / (f + norm);
                    matched[i] |= 1u64 << (t % 64);
                }
            }
        }
        *r = score;
        if !followed.contains(&i) {
            best = best.max(score);
        }
    }
    if best > 0.0 {
        for r in &mut relevance {
            *r /= best;
        }
    }
    context::prefer_latest(messages, &matched, terms, &mut relevance);
    for &i in followed.iter().chain(&query_index) {
        relevance[i] = 1.0;
    }

    let weights = query.weights.iter().zip(&idf).map(|(w, i)| w * i).collect();
    let ids = query.ids.clone();
    let mut query_terms: Vec<String> = query.terms.into_iter().map(|(t, _)| t).collect();
    query_terms.sort_unstable();
    Relevance {
        query_terms,
        query_index,
        relevance,
        query: QueryTerms { ids, weights },
    }
}
