//! Analyses: what relevance needs of one message whatever the query (its
//! terms' ids and counts, its length), and how a caller's
//! [`AnalysisCache`] keeps them between requests by a hash of each
//! message's text and of each history.

use std::collections::HashMap;
use std::sync::Arc;

use foldhash::fast::RandomState;
use xxhash_rust::xxh3::{xxh3_128, xxh3_128_with_seed};

use super::context::{find_aliases, Alias};
use super::terms::{for_each_keyed_term, normalize, term_id, Kind, TermMasks, TermMemo};

/// What relevance needs of one message, whatever the query: each distinct
/// term (by [`term_id`]) with its count, and the message's length in terms
/// (stopwords and one-letter words included: BM25 only uses its ratio to
/// the average). A pure function of the text, so it can be cached across
/// requests by a hash of the text.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Analysis {
    /// `(term id, count)`, in the order the terms first occur.
    pub terms: Vec<(u64, u32)>,
    pub length: u32,
    /// The alias definitions the text makes (nearly always none).
    pub aliases: Vec<Alias>,
}

impl Analysis {
    /// The analysis of `text` on its own (callers with many texts share an
    /// analyzer through [`analyze_cached`](super::analyze_cached)).
    pub fn of(text: &str) -> Analysis {
        Analyzer::default().analyze(text)
    }

    /// Approximate bytes held, for a cache's weigher.
    pub fn weight(&self) -> u32 {
        let aliases: usize = self
            .aliases
            .iter()
            .flat_map(|a| a.names.iter().flatten())
            .map(|t| 24 + t.len())
            .sum();
        let bytes = 64 + self.terms.len() * std::mem::size_of::<(u64, u32)>() + aliases;
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// What an [`AnalysisCache`] holds under a key.
#[derive(Debug, Clone, PartialEq)]
pub enum CachedAnalysis {
    /// One message's analysis, keyed by [`message_key`] of its text.
    Message(Arc<Analysis>),
    /// The analyses of a history's first messages, keyed by
    /// [`history_keys`]: a new turn of a conversation finds its previous
    /// turn's with one lookup instead of one per message.
    History(Arc<History>),
    /// Where each term of a long text stands, for its excerpts, keyed by
    /// its [`message_key`] and a constant of its own.
    Segments(Arc<super::excerpt::SegmentTerms>),
}

/// The analyses of a history's first [`History::len`] messages: the
/// previous turn's history and this turn's own analyses, so a turn adds
/// its few messages without copying the list.
#[derive(Debug, PartialEq)]
pub struct History {
    earlier: Option<Arc<History>>,
    own: Vec<Arc<Analysis>>,
    len: usize,
    /// Links to the first node: capped at [`MAX_HISTORY_DEPTH`], so
    /// walking and dropping a chain stay short.
    pub(super) depth: usize,
    /// What the whole chain holds, for a cache's weigher.
    weight: u32,
}

/// How long a chain of histories grows before a turn copies it flat.
pub(super) const MAX_HISTORY_DEPTH: usize = 32;

impl History {
    /// `earlier` followed by `own`.
    pub fn new(earlier: Option<Arc<History>>, own: Vec<Arc<Analysis>>) -> History {
        match earlier {
            Some(e) if e.depth >= MAX_HISTORY_DEPTH => {
                let mut all: Vec<Arc<Analysis>> = Vec::with_capacity(e.len + own.len());
                e.for_each(|a| all.push(a.clone()));
                all.extend(own);
                History::new(None, all)
            }
            earlier => {
                let own_weight = own.iter().fold(
                    u32::try_from(64 + 8 * own.len()).unwrap_or(u32::MAX),
                    |w, a| w.saturating_add(a.weight()),
                );
                History {
                    len: earlier.as_ref().map_or(0, |e| e.len) + own.len(),
                    depth: earlier.as_ref().map_or(0, |e| e.depth + 1),
                    weight: earlier
                        .as_ref()
                        .map_or(own_weight, |e| e.weight.saturating_add(own_weight)),
                    earlier,
                    own,
                }
            }
        }
    }

    /// How many messages' analyses it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Calls `f` with each analysis, in message order.
    pub fn for_each<'a>(&'a self, mut f: impl FnMut(&'a Arc<Analysis>)) {
        let mut nodes: Vec<&History> = Vec::with_capacity(self.depth + 1);
        let mut node = Some(self);
        while let Some(n) = node {
            nodes.push(n);
            node = n.earlier.as_deref();
        }
        for n in nodes.into_iter().rev() {
            n.own.iter().for_each(&mut f);
        }
    }
}

impl CachedAnalysis {
    /// Approximate bytes held, for a cache's weigher. A history counts the
    /// analyses it shares with message entries too, so a bound on the sum
    /// bounds what is really held.
    pub fn weight(&self) -> u32 {
        match self {
            CachedAnalysis::Message(a) => a.weight(),
            CachedAnalysis::History(h) => h.weight,
            CachedAnalysis::Segments(s) => s.weight(),
        }
    }
}

/// Where analyses of earlier requests' messages are kept. Only an
/// accelerator: a miss costs the analysis, never a different result.
pub trait AnalysisCache {
    /// Whether lookups can hit: without a cache, texts are not hashed.
    fn enabled(&self) -> bool {
        true
    }
    fn get(&self, key: u128) -> Option<CachedAnalysis>;
    fn put(&self, key: u128, value: CachedAnalysis);
    /// Drops an entry: the previous turn's history, once the new turn's
    /// links to it, so the bound does not count it twice.
    fn remove(&self, _key: u128) {}
    /// Takes on [`fill`]ing the analyses of the history `texts` (whose
    /// [`history_keys`] end in `history`) later, off the request's path,
    /// when it can: `false` has them made now. Only asked for a history
    /// with no earlier turn cached.
    fn fill_later(&self, _history: u128, _texts: &[&str]) -> bool {
        false
    }
}

/// Bumped when what an analysis holds changes, so that entries made under
/// an older term definition are never reused.
const ANALYSIS_VERSION: u64 = 2;

/// The cache key of a message text: a 128-bit hash, so distinct texts do
/// not meet in practice.
pub fn message_key(text: &str) -> u128 {
    // Unseeded: with a seed, xxh3 derives its secret anew on every call,
    // a tenth of the time on ~400-byte messages. The version is mixed in
    // after, which changes every key as surely.
    xxh3_128(text.as_bytes())
        ^ u128::from(ANALYSIS_VERSION).wrapping_mul(0x9E37_79B9_7F4A_7C15_F39C_C060_5CED_C835)
}

/// The cache key of each prefix of a history whose messages have
/// `message_keys`: element `k` is the key of the first `k + 1` messages.
pub fn history_keys(message_keys: &[u128]) -> Vec<u128> {
    let mut chained = [0u8; 32];
    let mut prefix = 0u128;
    message_keys
        .iter()
        .map(|key| {
            chained[..16].copy_from_slice(&prefix.to_le_bytes());
            chained[16..].copy_from_slice(&key.to_le_bytes());
            // Another seed than messages': a history never meets a message.
            prefix = xxh3_128_with_seed(&chained, !ANALYSIS_VERSION);
            prefix
        })
        .collect()
}

/// How far back from its end a history is looked up: the previous turn
/// ends a few messages before this one (an answer, tool calls and their
/// results, the new question).
const HISTORY_PROBES: usize = 16;

/// The analyses of a request's messages: an earlier turn's history from
/// the cache, then the rest.
pub(super) struct Analyses {
    earlier: Option<Arc<History>>,
    rest: Vec<Arc<Analysis>>,
}

impl Analyses {
    /// Calls `f` with each message's index and analysis, in order.
    pub(super) fn for_each(&self, mut f: impl FnMut(usize, &Analysis)) {
        let mut i = 0;
        if let Some(earlier) = &self.earlier {
            earlier.for_each(|a| {
                f(i, a);
                i += 1;
            });
        }
        for a in &self.rest {
            f(i, a);
            i += 1;
        }
    }
}

/// Where a history's analyses stand in a cache: each message's key, each
/// prefix's key, and the longest earlier turn the cache holds.
pub(super) struct HistoryLookup {
    keys: Vec<u128>,
    pub(super) prefixes: Vec<u128>,
    pub(super) earlier: Option<(Arc<History>, u128)>,
}

impl HistoryLookup {
    /// `keys`, when given, are [`message_key`] of each of `texts`.
    pub(super) fn new(texts: &[&str], keys: Option<Vec<u128>>, cache: &dyn AnalysisCache) -> Self {
        let keys: Vec<u128> =
            keys.unwrap_or_else(|| texts.iter().map(|text| message_key(text)).collect());
        debug_assert_eq!(keys.len(), texts.len());
        let prefixes = history_keys(&keys);
        let mut earlier = None;
        for k in (texts.len().saturating_sub(HISTORY_PROBES)..texts.len()).rev() {
            if let Some(CachedAnalysis::History(found)) = cache.get(prefixes[k]) {
                // A hash collision must not panic: the length must fit.
                if found.len() == k + 1 {
                    earlier = Some((found, prefixes[k]));
                    break;
                }
            }
        }
        HistoryLookup {
            keys,
            prefixes,
            earlier,
        }
    }

    /// Each message's [`message_key`].
    pub(super) fn keys(&self) -> &[u128] {
        &self.keys
    }

    /// The analysis of each text, from the cache where it has them; what
    /// it lacks is made and added, with the history's own entry.
    pub(super) fn analyses(self, texts: &[&str], cache: &dyn AnalysisCache) -> Analyses {
        let mut analyzer = Analyzer::default();
        let (earlier, earlier_key) = match self.earlier {
            Some((history, key)) => (Some(history), Some(key)),
            None => (None, None),
        };
        let done = earlier.as_ref().map_or(0, |e| e.len());
        let mut rest = Vec::with_capacity(texts.len() - done);
        for (text, &key) in texts.iter().zip(&self.keys).skip(done) {
            let analysis = match cache.get(key) {
                Some(CachedAnalysis::Message(found)) => found,
                _ => {
                    let fresh = Arc::new(analyzer.analyze(text));
                    cache.put(key, CachedAnalysis::Message(fresh.clone()));
                    fresh
                }
            };
            rest.push(analysis);
        }
        if let (Some(&last), false) = (self.prefixes.last(), rest.is_empty()) {
            let history = History::new(earlier.clone(), rest.clone());
            cache.put(last, CachedAnalysis::History(Arc::new(history)));
            // The new history holds the earlier one and weighs it too. A
            // retry of that earlier turn still finds every message's
            // analysis.
            if let Some(key) = earlier_key {
                cache.remove(key);
            }
        }
        Analyses { earlier, rest }
    }
}

/// The analysis of `text`, whose [`message_key`] is `key`, from `cache`,
/// made and added when it lacks it.
pub(super) fn cached_keyed(text: &str, key: u128, cache: &dyn AnalysisCache) -> Arc<Analysis> {
    match cache.get(key) {
        Some(CachedAnalysis::Message(found)) => found,
        _ => {
            let fresh = Arc::new(Analysis::of(text));
            cache.put(key, CachedAnalysis::Message(fresh.clone()));
            fresh
        }
    }
}

/// Adds to `cache` the analyses of a history's `texts` it lacks, and the
/// history's entry, as [`analyze_cached`](super::analyze_cached) would: what a cache that
/// [`AnalysisCache::fill_later`] runs after the request.
pub fn fill(texts: &[&str], cache: &dyn AnalysisCache) {
    if cache.enabled() {
        HistoryLookup::new(texts, None, cache).analyses(texts, cache);
    }
}

/// Analyses texts one after another, sharing what it learnt of each raw
/// term ([`TermMemo`]) and its scan buffers.
struct Analyzer {
    /// Raw term -> its slot; [`NO_TERM_SLOT`] for stopwords and one-letter
    /// words.
    slot_of_raw: TermMemo,
    /// Normalised term id -> slot.
    slot_of_id: HashMap<u64, u32, RandomState>,
    /// The term id of each slot.
    ids: Vec<u64>,
    /// The count of each slot in the text being analysed.
    counts: Vec<u32>,
    /// The slots counted in the text being analysed, in the order first
    /// seen: one place longer than `counts`, so that the place after the
    /// last slot kept is always there to be written.
    touched: Vec<u32>,
    buf: String,
    masks: TermMasks,
}

/// The slot that stopwords and one-letter words count in, so that counting
/// a term takes no branch; it is left out of the analysis.
const NO_TERM_SLOT: u32 = 0;

impl Default for Analyzer {
    fn default() -> Self {
        Analyzer {
            slot_of_raw: TermMemo::default(),
            slot_of_id: HashMap::default(),
            ids: vec![0],
            counts: vec![0],
            touched: vec![0; 2],
            buf: String::new(),
            masks: TermMasks::default(),
        }
    }
}

impl Analyzer {
    fn analyze(&mut self, text: &str) -> Analysis {
        let Analyzer {
            slot_of_raw,
            slot_of_id,
            ids,
            counts,
            touched,
            buf,
            masks,
        } = self;
        let mut length = 0u32;
        let mut touched_len = 0usize;
        // Inlined into the scan: this runs for every term of the history.
        // Branch-free past the lookup: stopwords count in their own slot,
        // and a slot is always written to `touched` but kept there only
        // the first time.
        for_each_keyed_term(
            text,
            masks,
            #[inline(always)]
            |raw, kind, key| {
                length += 1;
                let slot = slot_of_raw.value(raw, key, || {
                    learn_slot(raw, kind, buf, slot_of_id, ids, counts, touched)
                }) as usize;
                if let (Some(count), Some(place)) =
                    (counts.get_mut(slot), touched.get_mut(touched_len))
                {
                    *place = slot as u32;
                    touched_len += usize::from(*count == 0);
                    *count += 1;
                }
            },
        );
        let mut terms = Vec::with_capacity(touched_len);
        for &slot in &touched[..touched_len] {
            let count = std::mem::take(&mut counts[slot as usize]);
            if slot != NO_TERM_SLOT {
                terms.push((ids[slot as usize], count));
            }
        }
        let mut aliases = Vec::new();
        find_aliases(text, &mut aliases);
        Analysis {
            terms,
            length,
            aliases,
        }
    }
}

/// The slot of a raw term seen for the first time: its normalised term's,
/// new if that is new too.
#[cold]
#[inline(never)]
fn learn_slot(
    raw: &str,
    kind: Kind,
    buf: &mut String,
    slot_of_id: &mut HashMap<u64, u32, RandomState>,
    ids: &mut Vec<u64>,
    counts: &mut Vec<u32>,
    touched: &mut Vec<u32>,
) -> u32 {
    let Some(term) = normalize(raw, kind, buf) else {
        return NO_TERM_SLOT;
    };
    let id = term_id(&term);
    *buf = term;
    *slot_of_id.entry(id).or_insert_with(|| {
        ids.push(id);
        counts.push(0);
        touched.push(0);
        (ids.len() - 1) as u32
    })
}
