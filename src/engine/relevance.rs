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
//!   of its bytes ([`TermMasks`]), so terms are found by counting zeros,
//!   not by a branch per byte; any other text by [`for_each_term`].
//!
//! Everything is computed in input order over sorted or index-keyed
//! structures: the same messages and goal give the same numbers, bit for
//! bit, with any cache or none. Pure: no I/O; a cache is the caller's.

use std::sync::Arc;

use rustc_hash::FxHashMap;
use xxhash_rust::xxh3::{xxh3_128, xxh3_128_with_seed, xxh3_64};

use super::text::{ascii_alphanumeric, in_range, HIGH_BITS};
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
}

/// Scores each message of `messages` against the latest user message and
/// the optional `goal`.
pub fn analyze(messages: &[Message], goal: Option<&str>) -> Relevance {
    analyze_cached(messages, goal, &NoAnalyses)
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
    let query_index = messages.iter().rposition(|m| m.role == Role::User);
    let mut query = Query::default();
    if let Some(q) = query_index {
        for_each_term(&messages[q].content, |term, kind| query.add(term, kind));
    }
    if let Some(goal) = goal {
        for_each_term(goal, |term, kind| query.add(term, kind));
    }
    let mut relevance = vec![0.0; messages.len()];
    if query.terms.is_empty() {
        if let Some(q) = query_index {
            relevance[q] = 1.0;
        }
        return Relevance {
            query_terms: Vec::new(),
            query_index,
            relevance,
        };
    }

    // Each document's length and query-term counts, from its analysis.
    let terms = query.terms.len();
    let mut tf = vec![0u32; messages.len() * terms];
    let mut length = vec![0u32; messages.len()];
    let mut df = vec![0u32; terms];
    let mut documents = 0usize;
    let mut add_document = |counts: &[u32]| {
        documents += 1;
        for (d, &c) in df.iter_mut().zip(counts) {
            *d += u32::from(c > 0);
        }
    };
    // A history whose earlier turn the cache holds reuses its analyses
    // and adds its new messages'. Without one (no cache, or the first
    // turn the cache sees), analysing every message would double this
    // request's cost: the query's terms are counted straight from the
    // text, and a cache that can builds the analyses after the request.
    let texts: Vec<&str> = messages.iter().map(|m| m.content.as_str()).collect();
    let found = cache.enabled().then(|| HistoryLookup::new(&texts, cache));
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
    if let (Some(lookup), false) = (found, count_directly) {
        lookup.analyses(&texts, cache).for_each(|i, analysis| {
            if Some(i) == query_index {
                return;
            }
            let counts = &mut tf[i * terms..(i + 1) * terms];
            length[i] = analysis.length;
            query.count_in(analysis, counts);
            add_document(counts);
        });
    } else {
        // The same integers as counting the terms in analyses.
        let mut counter = QueryCounter::new(&query);
        for (i, m) in messages.iter().enumerate() {
            if Some(i) == query_index {
                continue;
            }
            let counts = &mut tf[i * terms..(i + 1) * terms];
            length[i] = counter.count(&m.content, counts);
            add_document(counts);
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

    let mut best = 0.0f64;
    for (i, r) in relevance.iter_mut().enumerate() {
        if Some(i) == query_index {
            continue;
        }
        let norm = K1 * (1.0 - B + B * length[i] as f64 / average_length);
        let mut score = 0.0;
        for (t, &count) in tf[i * terms..(i + 1) * terms].iter().enumerate() {
            if count > 0 {
                let f = count as f64;
                score += idf[t] * f * (K1 + 1.0) / (f + norm);
            }
        }
        *r = score;
        best = best.max(score);
    }
    if best > 0.0 {
        for r in &mut relevance {
            *r /= best;
        }
    }
    if let Some(q) = query_index {
        relevance[q] = 1.0;
    }

    let mut query_terms: Vec<String> = query.terms.into_iter().map(|(t, _)| t).collect();
    query_terms.sort_unstable();
    Relevance {
        query_terms,
        query_index,
        relevance,
    }
}

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
}

impl Analysis {
    /// The analysis of `text` on its own (callers with many texts share an
    /// analyzer through [`analyze_cached`]).
    pub fn of(text: &str) -> Analysis {
        Analyzer::default().analyze(text)
    }

    /// Approximate bytes held, for a cache's weigher.
    pub fn weight(&self) -> u32 {
        let bytes = 64 + self.terms.len() * std::mem::size_of::<(u64, u32)>();
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
    depth: usize,
    /// What the whole chain holds, for a cache's weigher.
    weight: u32,
}

/// How long a chain of histories grows before a turn copies it flat.
const MAX_HISTORY_DEPTH: usize = 32;

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

/// No cache: every message is analysed on every request.
pub struct NoAnalyses;

impl AnalysisCache for NoAnalyses {
    fn enabled(&self) -> bool {
        false
    }
    fn get(&self, _: u128) -> Option<CachedAnalysis> {
        None
    }
    fn put(&self, _: u128, _: CachedAnalysis) {}
}

/// Bumped when what an analysis holds changes, so that entries made under
/// an older term definition are never reused.
const ANALYSIS_VERSION: u64 = 1;

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

/// The id of a normalised term: a 64-bit hash, the same in every process.
pub fn term_id(term: &str) -> u64 {
    xxh3_64(term.as_bytes())
}

/// How far back from its end a history is looked up: the previous turn
/// ends a few messages before this one (an answer, tool calls and their
/// results, the new question).
const HISTORY_PROBES: usize = 16;

/// The analyses of a request's messages: an earlier turn's history from
/// the cache, then the rest.
struct Analyses {
    earlier: Option<Arc<History>>,
    rest: Vec<Arc<Analysis>>,
}

impl Analyses {
    /// Calls `f` with each message's index and analysis, in order.
    fn for_each(&self, mut f: impl FnMut(usize, &Analysis)) {
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
struct HistoryLookup {
    keys: Vec<u128>,
    prefixes: Vec<u128>,
    earlier: Option<(Arc<History>, u128)>,
}

impl HistoryLookup {
    fn new(texts: &[&str], cache: &dyn AnalysisCache) -> Self {
        let keys: Vec<u128> = texts.iter().map(|text| message_key(text)).collect();
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

    /// The analysis of each text, from the cache where it has them; what
    /// it lacks is made and added, with the history's own entry.
    fn analyses(self, texts: &[&str], cache: &dyn AnalysisCache) -> Analyses {
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

/// Adds to `cache` the analyses of a history's `texts` it lacks, and the
/// history's entry, as [`analyze_cached`] would: what a cache that
/// [`AnalysisCache::fill_later`] runs after the request.
pub fn fill(texts: &[&str], cache: &dyn AnalysisCache) {
    if cache.enabled() {
        HistoryLookup::new(texts, cache).analyses(texts, cache);
    }
}

/// What each raw term (as written) normalises to, remembered across the
/// texts of one request: a history repeats its words, so most terms cost
/// one lookup instead of folding, a stopword search and stemming.
#[derive(Default)]
struct TermMemo {
    /// Terms of up to 15 bytes, nearly all, keyed by their bytes packed in
    /// a `u128` ([`packed`]): comparing keys is then one integer compare,
    /// not a call to compare strings.
    short: ShortTerms,
    /// Longer raw terms (the set is the history's vocabulary, not its text).
    long: FxHashMap<Box<str>, u32>,
}

impl TermMemo {
    /// What `raw` (whose [`packed`] key is `key`) was mapped to, or what
    /// `learn` maps it to the first time.
    #[inline(always)]
    fn value(&mut self, raw: &str, key: Option<u128>, learn: impl FnOnce() -> u32) -> u32 {
        let known = match key {
            Some(key) => self.short.get(key),
            None => self.long.get(raw),
        };
        match known {
            Some(&value) => value,
            None => self.remember(raw, key, learn()),
        }
    }

    #[cold]
    #[inline(never)]
    fn remember(&mut self, raw: &str, key: Option<u128>, value: u32) -> u32 {
        match key {
            Some(key) => self.short.insert(key, value),
            None => self.long.insert(raw.into(), value),
        };
        value
    }
}

/// Analyses texts one after another, sharing what it learnt of each raw
/// term ([`TermMemo`]) and its scan buffers.
struct Analyzer {
    /// Raw term -> its slot; [`NO_TERM_SLOT`] for stopwords and one-letter
    /// words.
    slot_of_raw: TermMemo,
    /// Normalised term id -> slot.
    slot_of_id: FxHashMap<u64, u32>,
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
            slot_of_id: FxHashMap::default(),
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
        Analysis { terms, length }
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
    slot_of_id: &mut FxHashMap<u64, u32>,
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

/// Counts the query's terms in texts, one after another, without building
/// their [`Analysis`]: what BM25 needs when no analysis is kept for later.
struct QueryCounter<'q> {
    query: &'q Query,
    /// Bit `p` is set when some query term's first two bytes, read as a
    /// little-endian `u16`, are `p`: most words of a history start
    /// otherwise, and are passed over with one bit test.
    prefixes: Vec<u64>,
    /// Raw term -> the index of its query term, or [`NOT_A_QUERY_TERM`].
    query_term_of_raw: TermMemo,
    buf: String,
    masks: TermMasks,
}

/// What [`QueryCounter`] maps a raw term that is no query term to.
const NOT_A_QUERY_TERM: u32 = u32::MAX;

impl<'q> QueryCounter<'q> {
    fn new(query: &'q Query) -> Self {
        let mut prefixes = vec![0u64; (1 << 16) / 64];
        for (term, _) in &query.terms {
            if let [a, b, ..] = *term.as_bytes() {
                let p = usize::from(u16::from_le_bytes([a, b]));
                prefixes[p / 64] |= 1 << (p % 64);
            }
        }
        QueryCounter {
            query,
            prefixes,
            query_term_of_raw: TermMemo::default(),
            buf: String::new(),
            masks: TermMasks::default(),
        }
    }

    /// Adds the count of each query term in `text` to `counts`; returns the
    /// text's length in terms, as its [`Analysis`] has it.
    ///
    /// An ASCII text is read from its bit masks, not term by term: its
    /// length is counted from the run starts, and only the words whose
    /// first two bytes start a query term are looked at. A plain term is
    /// a run of letters and digits (a lone one, or a part of a joined
    /// run); a joined run, rare, is one more term.
    fn count(&mut self, text: &str, counts: &mut [u32]) -> u32 {
        if !self.masks.fill(text.as_bytes()) {
            return self.count_term_by_term(text, counts);
        }
        let QueryCounter {
            query,
            prefixes,
            query_term_of_raw,
            buf,
            masks,
        } = self;
        let bytes = text.as_bytes();
        let alnum = &masks.alnum;
        let mut add = |raw: &str, kind: Kind, key: Option<u128>| {
            let t = query_term_of_raw.value(raw, key, || query.index_of(raw, kind, buf));
            if let Some(count) = counts.get_mut(t as usize) {
                *count += 1;
            }
        };
        let mut length = 0u32;
        // The last bit of the word before: whether a run crosses into this.
        let mut carry = 0u64;
        for (w, &here) in alnum.iter().enumerate() {
            let starts = here & !(here << 1 | carry);
            carry = here >> 63;
            length += starts.count_ones();
            // A one-letter word is never a term: only runs of two or more.
            let after = here >> 1 | alnum.get(w + 1).map_or(0, |&next| next << 63);
            let mut words = starts & after;
            while words != 0 {
                let start = w * 64 + words.trailing_zeros() as usize;
                words &= words - 1;
                let Some(&[a, b]) = bytes.get(start..start + 2) else {
                    continue;
                };
                if !starts_a_term_of(a, b, prefixes) {
                    continue;
                }
                let end = next_set(alnum, start, bytes.len(), true);
                add(
                    &text[start..end],
                    Kind::Plain,
                    window_key(bytes, start, end),
                );
            }
        }
        // Each joined run whole, found from its first joint.
        let mut joined_end = 0;
        let mut joint = next_set(&masks.joints, 0, bytes.len(), false);
        while joint < bytes.len() {
            if joint >= joined_end {
                let start = run_start(masks, joint);
                joined_end = run_end(masks, start, bytes.len());
                length += 1;
                let run = &text[start..joined_end];
                add(run, Kind::Joined, packed(run));
            }
            joint = next_set(&masks.joints, joint + 1, bytes.len(), false);
        }
        length
    }

    /// [`Self::count`] for a text that is not all ASCII, by the generic scan.
    fn count_term_by_term(&mut self, text: &str, counts: &mut [u32]) -> u32 {
        let QueryCounter {
            query,
            prefixes,
            query_term_of_raw,
            buf,
            ..
        } = self;
        let mut length = 0u32;
        for_each_term(text, |raw, kind| {
            length += 1;
            if kind == Kind::Plain && !may_start_a_term_of(raw, prefixes) {
                return;
            }
            let t = query_term_of_raw.value(raw, packed(raw), || query.index_of(raw, kind, buf));
            if let Some(count) = counts.get_mut(t as usize) {
                *count += 1;
            }
        });
        length
    }
}

/// Whether the plain raw term `raw` can normalise to a term whose first
/// two bytes are in `prefixes` (a [`QueryCounter`]'s). A one-char word is
/// never a term. A word starting with two ASCII letters or digits keeps
/// them, case-folded, through [`normalize`]: folding maps ASCII to ASCII,
/// and [`stem`] never cuts into a word's first two letters (not even
/// `tries` -> `try`). Any other word may.
#[inline(always)]
fn may_start_a_term_of(raw: &str, prefixes: &[u64]) -> bool {
    match *raw.as_bytes() {
        [] | [_] => false,
        [a, b, ..] if a.is_ascii() && b.is_ascii() => starts_a_term_of(a, b, prefixes),
        _ => true,
    }
}

/// Whether a word starting with the ASCII letters or digits `a` and `b`
/// can normalise to a term whose first two bytes are in `prefixes`.
#[inline(always)]
fn starts_a_term_of(a: u8, b: u8, prefixes: &[u64]) -> bool {
    // Letters and digits only: `| 0x20` folds a letter and keeps a digit.
    let p = usize::from(u16::from_le_bytes([a | 0x20, b | 0x20]));
    prefixes
        .get(p / 64)
        .is_some_and(|w| w & (1 << (p % 64)) != 0)
}

/// A map from [`packed`] terms to slots: open addressing with linear
/// probing over a power-of-two table, at most a quarter full. Lighter than a
/// general hash map for the one lookup every term of a history makes; a
/// key and its slot share a place, so a lookup reads one cache line.
#[derive(Default)]
struct ShortTerms {
    places: Vec<Place>,
    len: usize,
}

/// A packed key in two halves, and its slot. An empty place has key 0: a
/// packed key holds its length, never 0.
#[derive(Clone, Copy, Default)]
struct Place {
    low: u64,
    high: u64,
    slot: u32,
}

impl Place {
    #[inline(always)]
    fn holds(&self, key: u128) -> bool {
        self.low == key as u64 && self.high == (key >> 64) as u64
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.low == 0 && self.high == 0
    }
}

impl ShortTerms {
    /// Fibonacci hashing: the top bits of the product (as many as the
    /// table's size has), which every bit of the key moves.
    #[inline(always)]
    fn place(key: u128, mask: usize) -> usize {
        let folded = (key as u64) ^ ((key >> 64) as u64).rotate_left(29);
        // `leading_zeros` of a power of two less one: one instruction.
        (folded.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (mask as u64).leading_zeros()) as usize
            & mask
    }

    #[inline(always)]
    fn get(&self, key: u128) -> Option<&u32> {
        if self.places.is_empty() {
            return None;
        }
        let mask = self.places.len() - 1;
        let mut i = Self::place(key, mask);
        loop {
            let place = &self.places[i];
            if place.holds(key) {
                return Some(&place.slot);
            }
            if place.is_empty() {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    fn insert(&mut self, key: u128, slot: u32) -> Option<u32> {
        // At most a quarter full: nearly every lookup reads one place.
        if (self.len + 1) * 4 > self.places.len() {
            self.grow();
        }
        let mask = self.places.len() - 1;
        let mut i = Self::place(key, mask);
        while !self.places[i].is_empty() && !self.places[i].holds(key) {
            i = (i + 1) & mask;
        }
        let place = &mut self.places[i];
        if place.holds(key) {
            return Some(std::mem::replace(&mut place.slot, slot));
        }
        *place = Place {
            low: key as u64,
            high: (key >> 64) as u64,
            slot,
        };
        self.len += 1;
        None
    }

    #[cold]
    fn grow(&mut self) {
        let size = (self.places.len() * 2).max(1024);
        let old = std::mem::replace(
            self,
            ShortTerms {
                places: vec![Place::default(); size],
                len: 0,
            },
        );
        for place in old.places {
            if !place.is_empty() {
                self.insert(
                    u128::from(place.low) | u128::from(place.high) << 64,
                    place.slot,
                );
            }
        }
    }
}

/// The bytes of a term of up to 15 bytes and its length, in one integer:
/// two terms have the same key exactly when they are the same. Built from
/// loads, not by copying into a buffer: reading a buffer back right after
/// writing it byte by byte stalls the CPU.
#[inline(always)]
fn packed(raw: &str) -> Option<u128> {
    let bytes = raw.as_bytes();
    let len = bytes.len();
    if len > 15 {
        return None;
    }
    let (lo, hi) = if len > 8 {
        (le_bytes(&bytes[..8]), le_bytes(&bytes[8..]))
    } else {
        (le_bytes(bytes), 0)
    };
    Some(u128::from(lo) | u128::from(hi) << 64 | (len as u128) << 120)
}

/// Up to 8 bytes as a little-endian integer, in at most two loads that may
/// overlap (the overlapping bytes are the same, so OR keeps them).
#[inline(always)]
fn le_bytes(b: &[u8]) -> u64 {
    let n = b.len();
    if n >= 8 {
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    } else if n >= 4 {
        let head = u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let tail = u64::from(u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]));
        head | tail << (8 * (n - 4))
    } else if n >= 2 {
        let head = u64::from(u16::from_le_bytes([b[0], b[1]]));
        let tail = u64::from(u16::from_le_bytes([b[n - 2], b[n - 1]]));
        head | tail << (8 * (n - 2))
    } else if n == 1 {
        u64::from(b[0])
    } else {
        0
    }
}

/// Whether a term is a joined identifier (kept whole, never stemmed) or a
/// plain run of letters and digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Joined,
    Plain,
}

/// The query terms, interned in first-seen order (the report sorts them).
#[derive(Default)]
struct Query {
    terms: Vec<(String, Kind)>,
    /// [`term_id`] of each term, by position.
    ids: Vec<u64>,
    /// A 256-bit Bloom filter on the ids: most document terms are not
    /// query terms and stop at one bit test (a warm turn tests every term
    /// of the history, ~40 per message).
    mask: [u64; 4],
}

impl Query {
    fn add(&mut self, raw: &str, kind: Kind) {
        let Some(term) = normalize(raw, kind, &mut String::new()) else {
            return;
        };
        let id = term_id(&term);
        if !self.ids.contains(&id) {
            self.mask[(id >> 6) as usize & 3] |= 1 << (id & 63);
            self.ids.push(id);
            self.terms.push((term, kind));
        }
    }

    /// The index of the query term `raw` normalises to, or [`NOT_A_QUERY_TERM`].
    #[cold]
    #[inline(never)]
    fn index_of(&self, raw: &str, kind: Kind, buf: &mut String) -> u32 {
        let Some(term) = normalize(raw, kind, buf) else {
            return NOT_A_QUERY_TERM;
        };
        let id = term_id(&term);
        *buf = term;
        self.ids
            .iter()
            .position(|&q| q == id)
            .map_or(NOT_A_QUERY_TERM, |t| t as u32)
    }

    /// Adds the count of each query term in `analysis` to `counts`.
    fn count_in(&self, analysis: &Analysis, counts: &mut [u32]) {
        for &(id, count) in &analysis.terms {
            if self.mask[(id >> 6) as usize & 3] & (1 << (id & 63)) == 0 {
                continue;
            }
            if let Some(t) = self.ids.iter().position(|&q| q == id) {
                counts[t] += count;
            }
        }
    }
}

/// Folds case and stems a term as both the query and the documents see it;
/// `None` for stopwords and one-letter words. `buf` is reused storage.
fn normalize(raw: &str, kind: Kind, buf: &mut String) -> Option<String> {
    let mut term = std::mem::take(buf);
    term.clear();
    if raw.is_ascii() {
        term.extend(raw.bytes().map(|b| b.to_ascii_lowercase() as char));
    } else {
        term.push_str(&raw.to_lowercase());
    }
    if kind == Kind::Plain {
        if term.chars().nth(1).is_none() || is_stopword(&term) {
            *buf = term;
            return None;
        }
        if term.bytes().all(|b| b.is_ascii_lowercase()) {
            stem(&mut term);
        }
    }
    Some(term)
}

const fn is_joiner(b: u8) -> bool {
    matches!(b, b'-' | b'_' | b'.' | b'/' | b':' | b'#' | b'@' | b'+')
}

/// Byte classes for the scanner.
const OTHER: u8 = 0;
const ALNUM: u8 = 1;
const JOINER: u8 = 2;
const NOT_ASCII: u8 = 3;

static CLASS: [u8; 256] = {
    let mut table = [OTHER; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = if !byte.is_ascii() {
            NOT_ASCII
        } else if byte.is_ascii_alphanumeric() {
            ALNUM
        } else if is_joiner(byte) {
            JOINER
        } else {
            OTHER
        };
        b += 1;
    }
    table
};

/// Calls `f` with each term of `text`: every joined run whole (kind
/// `Joined`) followed by its parts, and every lone run (kind `Plain`).
///
/// Walks bytes by a class table: ASCII, nearly all of a chat, is classified
/// by byte, and only a non-ASCII character is decoded to ask
/// `char::is_alphanumeric`. This scan is most of a cold analysis's cost.
fn for_each_term(text: &str, mut f: impl FnMut(&str, Kind)) {
    let bytes = text.as_bytes();
    let n = bytes.len();
    // Whether the char at byte `i` is alphanumeric, and its length.
    let alnum_at = |i: usize| -> (bool, usize) {
        let b = bytes[i];
        if b.is_ascii() {
            (b.is_ascii_alphanumeric(), 1)
        } else {
            let c = text[i..].chars().next().unwrap_or(' ');
            (c.is_alphanumeric(), c.len_utf8())
        }
    };
    let mut i = 0;
    while i < n {
        match CLASS[bytes[i] as usize] {
            ALNUM => {}
            NOT_ASCII => {
                let (alnum, len) = alnum_at(i);
                if !alnum {
                    i += len;
                    continue;
                }
            }
            _ => {
                i += 1;
                continue;
            }
        }
        let start = i;
        let mut joined = false;
        loop {
            i = alnum_run_end(bytes, i);
            if i >= n {
                break;
            }
            match CLASS[bytes[i] as usize] {
                // A joiner counts only between two letters or digits.
                JOINER if i + 1 < n && alnum_at(i + 1).0 => {
                    joined = true;
                    i += 1;
                }
                NOT_ASCII => match alnum_at(i) {
                    (true, len) => i += len,
                    (false, _) => break,
                },
                _ => break,
            }
        }
        let run = &text[start..i];
        if joined {
            joined_run(run, &mut f);
        } else {
            f(run, Kind::Plain);
        }
    }
}

/// The end of the run of ASCII letters and digits starting at `i`: eight
/// bytes at a time (SWAR), then byte by byte near the end or at a byte
/// that is not ASCII.
#[inline(always)]
fn alnum_run_end(bytes: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = bytes.get(i..i + 8) {
        let x = u64::from_le_bytes([
            chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7],
        ]);
        if x & HIGH_BITS != 0 {
            break;
        }
        let alnum = ascii_alphanumeric(x);
        if alnum == HIGH_BITS {
            i += 8;
            continue;
        }
        // The first byte that is not alphanumeric (little-endian: lowest).
        return i + ((!alnum & HIGH_BITS).trailing_zeros() / 8) as usize;
    }
    while i < bytes.len() && CLASS[bytes[i] as usize] == ALNUM {
        i += 1;
    }
    i
}

/// A joined run whole, then its parts: rare, so kept out of the scan loop
/// where it would stop the per-term callback from being inlined.
#[cold]
#[inline(never)]
fn joined_run(run: &str, f: &mut dyn FnMut(&str, Kind)) {
    f(run, Kind::Joined);
    for part in run.split(|c: char| !c.is_alphanumeric()) {
        f(part, Kind::Plain);
    }
}

/// One bit per byte of an ASCII text (bit `i % 64` of word `i / 64`), for
/// [`for_each_keyed_term`]; kept across texts so their buffers are reused.
/// Every bit from the text's length on is clear, and there is always a word
/// past the last byte.
#[derive(Default)]
struct TermMasks {
    /// The byte is a letter or digit.
    alnum: Vec<u64>,
    /// The byte is a joiner between two letters or digits.
    joints: Vec<u64>,
}

impl TermMasks {
    /// Fills the masks for `bytes`; false, with the masks unusable, when
    /// they are not all ASCII.
    fn fill(&mut self, bytes: &[u8]) -> bool {
        let words = bytes.len() / 64 + 1;
        self.alnum.clear();
        self.alnum.reserve(words);
        // Punctuation bits first, joints once the letters around are known.
        self.joints.clear();
        self.joints.reserve(words);
        let mut blocks = bytes.chunks_exact(64);
        for block in &mut blocks {
            let Some((alnum, punct)) = block_bits(block) else {
                return false;
            };
            self.alnum.push(alnum);
            self.joints.push(punct);
        }
        let mut last = [0u8; 64];
        last[..blocks.remainder().len()].copy_from_slice(blocks.remainder());
        let Some((alnum, punct)) = block_bits(&last) else {
            return false;
        };
        self.alnum.push(alnum);
        self.joints.push(punct);

        // A joiner counts only between two letters or digits: look at the
        // punctuation with a letter or digit on both sides (spaces never
        // join, and they are most of what separates words).
        let alnum = &self.alnum;
        for (w, joints) in self.joints.iter_mut().enumerate() {
            let here = alnum[w];
            let before = here << 1 | w.checked_sub(1).map_or(0, |v| alnum[v] >> 63);
            let after = here >> 1 | alnum.get(w + 1).map_or(0, |&next| next << 63);
            let mut gaps = *joints & before & after;
            *joints = 0;
            while gaps != 0 {
                let bit = gaps.trailing_zeros() as usize;
                // A gap has a letter after it, so it lies within `bytes`.
                let byte = bytes.get(w * 64 + bit).copied().unwrap_or(0);
                *joints |= u64::from(CLASS[byte as usize] == JOINER) << bit;
                gaps &= gaps - 1;
            }
        }
        true
    }
}

/// The letter-or-digit bits of 64 bytes and their punctuation bits (the
/// other visible bytes, where a joiner can be), or `None` when one is not
/// ASCII.
#[inline(always)]
fn block_bits(block: &[u8]) -> Option<(u64, u64)> {
    let mut alnum = 0u64;
    let mut punct = 0u64;
    let mut any = 0u64;
    for (k, chunk) in block.chunks_exact(8).enumerate() {
        let x = u64::from_le_bytes(chunk.try_into().unwrap_or([0x80; 8]));
        any |= x;
        let x = x & !HIGH_BITS;
        let letters = ascii_alphanumeric(x);
        let visible = in_range(x, 0x21, 0x7e);
        alnum |= gather_high_bits(letters) << (8 * k);
        punct |= gather_high_bits(visible & !letters) << (8 * k);
    }
    (any & HIGH_BITS == 0).then_some((alnum, punct))
}

/// Gathers the high bit of each byte into one byte, byte k to bit k: the
/// multiplier's partial products never overlap, so nothing carries.
#[inline(always)]
const fn gather_high_bits(high: u64) -> u64 {
    ((high >> 7).wrapping_mul(0x0102_0408_1020_4080)) >> 56
}

/// The first bit of `words` at or after `from` that is set (or clear, if
/// `clear`), or `end` if none.
#[inline(always)]
fn next_set(words: &[u64], from: usize, end: usize, clear: bool) -> usize {
    let flip = if clear { !0u64 } else { 0 };
    let mut w = from / 64;
    let Some(&first) = words.get(w) else {
        return end;
    };
    let mut word = (first ^ flip) & (!0u64 << (from % 64));
    while word == 0 {
        w += 1;
        match words.get(w) {
            Some(&next) => word = next ^ flip,
            None => return end,
        }
    }
    w * 64 + word.trailing_zeros() as usize
}

/// The start of the run (letters, digits and joints) that holds `at`.
fn run_start(masks: &TermMasks, at: usize) -> usize {
    let in_run = |w: usize| match (masks.alnum.get(w), masks.joints.get(w)) {
        (Some(a), Some(j)) => a | j,
        _ => 0,
    };
    let mut w = at / 64;
    // The bytes before `at` in its word that are outside any run.
    let mut outside = !in_run(w) & ((1u64 << (at % 64)) - 1);
    while outside == 0 {
        if w == 0 {
            return 0;
        }
        w -= 1;
        outside = !in_run(w);
    }
    w * 64 + 64 - outside.leading_zeros() as usize
}

/// The [`packed`] key of `bytes[start..end]`, from one 16-byte load when
/// the text goes on that far, all but the term's bytes masked off.
#[inline(always)]
fn window_key(bytes: &[u8], start: usize, end: usize) -> Option<u128> {
    let len = end.checked_sub(start).filter(|&len| len <= 15)?;
    let term = match bytes.get(start..start + 16) {
        Some(window) => {
            u128::from_le_bytes(window.try_into().unwrap_or([0; 16])) & ((1u128 << (8 * len)) - 1)
        }
        // Near the end of the text: the term's bytes only.
        None => {
            let mut padded = [0u8; 16];
            padded[..len].copy_from_slice(bytes.get(start..end)?);
            u128::from_le_bytes(padded)
        }
    };
    Some(term | (len as u128) << 120)
}

/// The first byte at or after `from` that is neither a letter or digit nor
/// a joint: the end of the run there. `end` if none (never, by the word
/// past the last byte).
#[inline(always)]
fn run_end(masks: &TermMasks, from: usize, end: usize) -> usize {
    let mut w = from / 64;
    let in_run = |w: usize| match (masks.alnum.get(w), masks.joints.get(w)) {
        (Some(a), Some(j)) => Some(a | j),
        _ => None,
    };
    let Some(first) = in_run(w) else {
        return end;
    };
    let mut outside = !first & (!0u64 << (from % 64));
    while outside == 0 {
        w += 1;
        match in_run(w) {
            Some(next) => outside = !next,
            None => return end,
        }
    }
    w * 64 + outside.trailing_zeros() as usize
}

/// [`for_each_term`], giving each term its [`packed`] key too. An ASCII
/// text, nearly every one, is scanned by bit masks of its bytes: the start
/// and end of each term are found by counting zeros, with no branch per
/// byte. Any other text goes through [`for_each_term`].
#[inline(always)]
fn for_each_keyed_term(
    text: &str,
    masks: &mut TermMasks,
    mut f: impl FnMut(&str, Kind, Option<u128>),
) {
    if !masks.fill(text.as_bytes()) {
        for_each_term(text, |raw, kind| f(raw, kind, packed(raw)));
        return;
    }
    let bytes = text.as_bytes();
    let n = bytes.len();
    let alnum = &masks.alnum;
    // Joints are rare: where the next one is (past any run if none),
    // found again once passed.
    let mut next_joint = next_set(&masks.joints, 0, usize::MAX, false);
    // The end of the joined run whose parts are being given.
    let mut joined_end = 0;
    // The last bit of the word before: whether a run crosses into this.
    let mut carry = 0u64;
    for (w, &here) in alnum.iter().enumerate() {
        let mut starts = here & !(here << 1 | carry);
        carry = here >> 63;
        while starts != 0 {
            let start = w * 64 + starts.trailing_zeros() as usize;
            starts &= starts - 1;
            let end = next_set(alnum, start, n, true);
            if start >= joined_end {
                if next_joint < start {
                    next_joint = next_set(&masks.joints, start, usize::MAX, false);
                }
                // A joint right after the letters: a joined run, given whole
                // before its parts (the letters here are the first).
                if next_joint == end {
                    joined_end = run_end(masks, start, n);
                    let run = &text[start..joined_end];
                    f(run, Kind::Joined, packed(run));
                }
            }
            f(
                &text[start..end],
                Kind::Plain,
                window_key(bytes, start, end),
            );
        }
    }
}

/// The terms of `text` as relevance sees them, in order (stopwords left
/// out): for tests and for callers that want to show them.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_term(text, |raw, kind| {
        out.extend(normalize(raw, kind, &mut String::new()));
    });
    out
}

/// A light English suffix stripper for lowercase ASCII words. Not Porter:
/// it only has to map a word and its common inflections to one stem, the
/// same way for the question and the history. The stem always keeps the
/// word's first three letters.
pub fn stem(word: &mut String) {
    fn strip(word: &mut String, suffix: &str, min_left: usize) -> bool {
        if word.len() >= suffix.len() + min_left && word.ends_with(suffix) {
            word.truncate(word.len() - suffix.len());
            true
        } else {
            false
        }
    }
    fn has_vowel(s: &str) -> bool {
        s.bytes()
            .any(|b| matches!(b, b'a' | b'e' | b'i' | b'o' | b'u' | b'y'))
    }
    fn undouble(word: &mut String) {
        let b = word.as_bytes();
        let n = b.len();
        if n >= 4
            && b[n - 1] == b[n - 2]
            && matches!(
                b[n - 1],
                b'b' | b'd' | b'f' | b'g' | b'm' | b'n' | b'p' | b'r' | b't'
            )
        {
            word.truncate(n - 1);
        }
    }

    // Plurals and third persons.
    if word.ends_with("sses") {
        word.truncate(word.len() - 2);
    } else if word.len() > 4 && word.ends_with("ies") {
        word.truncate(word.len() - 3);
        word.push('y');
    } else if word.len() > 3
        && word.ends_with('s')
        && !word.ends_with("ss")
        && !word.ends_with("us")
        && !word.ends_with("is")
    {
        word.truncate(word.len() - 1);
    }
    // Tenses and gerunds.
    if word.len() > 5 && word.ends_with("ied") {
        word.truncate(word.len() - 3);
        word.push('y');
    } else if (word.ends_with("ing") && has_vowel(&word[..word.len() - 3]) && strip(word, "ing", 3))
        || (word.ends_with("ed") && has_vowel(&word[..word.len() - 2]) && strip(word, "ed", 3))
    {
        undouble(word);
    }
    // Nouns made from verbs.
    let _ = strip(word, "ation", 3) || strip(word, "ment", 4) || strip(word, "ness", 3);
    // A final consonant-y (delivery, deliveries) and a final e (code, coded).
    let n = word.len();
    let consonant_y = word.ends_with('y')
        && n > 1
        && !matches!(word.as_bytes()[n - 2], b'a' | b'e' | b'i' | b'o' | b'u');
    if n > 3 && (consonant_y || word.ends_with('e')) {
        word.truncate(n - 1);
    }
}

/// Common English words that say nothing about a topic, question words and
/// the fillers of a request ("please tell me again") included. Sorted, for
/// a binary search.
const STOPWORDS: &[&str] = &[
    "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can",
    "could", "did", "do", "does", "doing", "done", "down", "during", "each", "else", "ever", "few",
    "for", "from", "further", "get", "give", "got", "had", "has", "have", "having", "he", "her",
    "here", "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself",
    "just", "know", "let", "ll", "me", "might", "more", "most", "must", "my", "no", "nor", "not",
    "now", "of", "off", "ok", "okay", "on", "once", "one", "only", "or", "other", "our", "ours",
    "out", "over", "own", "please", "re", "recall", "remind", "said", "same", "say", "shall",
    "she", "should", "so", "some", "such", "tell", "than", "thank", "thanks", "that", "the",
    "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "to",
    "too", "under", "until", "up", "us", "ve", "very", "was", "we", "were", "what", "whats",
    "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you",
    "your", "yours",
];

/// [`STOPWORDS`] as integers (each word's bytes, little-endian: none is
/// longer than 8), sorted for a binary search of integer compares.
static STOPWORD_KEYS: [u64; STOPWORDS.len()] = {
    let mut keys = [0u64; STOPWORDS.len()];
    let mut i = 0;
    while i < keys.len() {
        let word = STOPWORDS[i].as_bytes();
        assert!(word.len() <= 8, "a stopword fits in a u64");
        let mut b = 0;
        while b < word.len() {
            keys[i] |= (word[b] as u64) << (8 * b);
            b += 1;
        }
        // Insertion sort: a few thousand steps, once, at compile time.
        let mut j = i;
        while j > 0 && keys[j - 1] > keys[j] {
            let earlier = keys[j - 1];
            keys[j - 1] = keys[j];
            keys[j] = earlier;
            j -= 1;
        }
        i += 1;
    }
    keys
};

/// Whether a case-folded word is one of [`STOPWORDS`]. A word is never
/// NUL, so its bytes padded with zeros are its own.
pub fn is_stopword(word: &str) -> bool {
    word.len() <= 8
        && STOPWORD_KEYS
            .binary_search(&le_bytes(word.as_bytes()))
            .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stemmed(w: &str) -> String {
        let mut s = w.to_owned();
        stem(&mut s);
        s
    }

    #[test]
    fn stopwords_are_sorted_for_binary_search() {
        assert!(STOPWORDS.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_stopword_keys_find_exactly_the_stopwords() {
        let mut words: Vec<String> = vec![
            String::new(),
            "a".into(),
            "abou".into(),
            "abouts".into(),
            "toe".into(),
            "t".into(),
            "yourselves".into(),
            "\u{e5}r".into(),
        ];
        for w in STOPWORDS {
            words.push((*w).into());
            words.push(format!("{w}s"));
            words.push(w[..w.len() - 1].into());
            words.push(w[1..].into());
        }
        for w in &words {
            assert_eq!(
                is_stopword(w),
                STOPWORDS.binary_search(&w.as_str()).is_ok(),
                "{w:?}"
            );
        }
    }

    /// A scan's terms, each with its kind and key.
    type Scanned = Vec<(String, Kind, Option<u128>)>;

    /// Each term of `text` with its kind and key, as the generic scan gives
    /// them and as [`for_each_keyed_term`] does.
    fn both_scans(text: &str) -> (Scanned, Scanned) {
        let mut generic = Vec::new();
        for_each_term(text, |raw, kind| {
            generic.push((raw.to_owned(), kind, packed(raw)))
        });
        let mut keyed = Vec::new();
        let mut masks = TermMasks::default();
        // Twice with the same buffers: what one text leaves must not leak.
        for _ in 0..2 {
            keyed.clear();
            for_each_keyed_term(text, &mut masks, |raw, kind, key| {
                keyed.push((raw.to_owned(), kind, key))
            });
        }
        (generic, keyed)
    }

    #[test]
    fn the_mask_scan_gives_the_generic_scans_terms() {
        let long: String = (0..40).map(|i| format!("w{i}-x{i}.y z_{i} ")).collect();
        for text in [
            "",
            "a",
            "-",
            "The gate code for depot Norrby is 7731-KAPPA.",
            "see src/main.rs:42 and v1.2.3, a--b a-_b -a- x@y.z #1 c++ a+b",
            "v2. Deploy- end-",
            "abcdefghijklmnopqrstuvwxyz0123456789 ABCDEFGHIJKLMNOPQRSTUVWXYZ",
            "exactly-sixty-four-bytes-long-text-to-test-the-block-boundary!!",
            "exactly sixty four bytes long text to test the block boundary ab",
            "sixty-three bytes then a joiner over the block boundary: abcdef-g",
            "Ärger über naïve code", // not ASCII: the generic scan itself
            &long,
        ] {
            let (generic, keyed) = both_scans(text);
            assert_eq!(keyed, generic, "{text:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
        /// Random ASCII text, rich in joiners, runs of every length and
        /// block boundaries, scans to the same terms and keys either way.
        #[test]
        fn random_ascii_scans_the_same_either_way(pieces in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::string::string_regex("[a-zA-Z]{1,20}").unwrap(),
                proptest::string::string_regex("[0-9]{1,7}").unwrap(),
                proptest::string::string_regex("[ \t\n]{1,3}").unwrap(),
                proptest::string::string_regex("[-_./:#@+,;!?'()]{1,2}").unwrap(),
            ],
            0..60,
        )) {
            let text = pieces.concat();
            let (generic, keyed) = both_scans(&text);
            proptest::prop_assert_eq!(keyed, generic);

            // Asked about the words of its first half, the query counter
            // counts what the analysis holds.
            let mut query = Query::default();
            for_each_term(&pieces[..pieces.len() / 2].concat(), |t, k| query.add(t, k));
            let analysis = Analysis::of(&text);
            let mut expected = vec![0u32; query.terms.len()];
            query.count_in(&analysis, &mut expected);
            let mut counted = vec![0u32; query.terms.len()];
            let length = QueryCounter::new(&query).count(&text, &mut counted);
            proptest::prop_assert_eq!((length, counted), (analysis.length, expected));
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2000))]
        /// What the query counter's prefix filter relies on: a plain word
        /// of ASCII letters and digits normalises to nothing or to a term
        /// that starts with its first two bytes, case-folded.
        #[test]
        fn normalising_keeps_a_words_first_two_bytes(
            word in "[a-zA-Z0-9]{1,6}(ies|ied|sses|ss|us|is|s|ing|ed|ation|ment|ness|y|e|bb|dd|tt|)(s|ed|ing|)"
        ) {
            let folded = word.to_ascii_lowercase();
            if let Some(term) = normalize(&word, Kind::Plain, &mut String::new()) {
                proptest::prop_assert_eq!(&term.as_bytes()[..2], &folded.as_bytes()[..2]);
            }
        }
    }

    #[test]
    fn counting_query_terms_in_text_equals_counting_them_in_analyses() {
        let mut query = Query::default();
        let asked = "Which gate codes open depot-7 at Norrby? src/main.rs tries copies \
                     \u{212a}elvin a-b ab ärger";
        for_each_term(asked, |t, k| query.add(t, k));
        let mut counter = QueryCounter::new(&query);
        for text in [
            "The gate code for depot Norrby is 7731-KAPPA; gates coded.",
            "depot-7 and depot 7 and DEPOT-7, see src/main.rs and main.rs",
            "nothing here",
            "Ärger: the gate at Norrby, naïve codes",
            "",
            "try TRIED tries Copy copied; kelvin KELVIN \u{212a}elvin, A-B a-b AB ab Ab ärger ÄRGER",
            "ab-cd a-bc 1-2 a_b A@B",
        ] {
            let analysis = Analysis::of(text);
            let mut expected = vec![0u32; query.terms.len()];
            query.count_in(&analysis, &mut expected);
            let mut counted = vec![0u32; query.terms.len()];
            assert_eq!(
                counter.count(text, &mut counted),
                analysis.length,
                "{text:?}"
            );
            assert_eq!(counted, expected, "{text:?}");
        }
    }

    #[test]
    fn inflections_share_a_stem() {
        for group in [
            &[
                "deliver",
                "delivers",
                "delivered",
                "delivering",
                "delivery",
                "deliveries",
            ][..],
            &["code", "codes", "coded", "coding"],
            &["plan", "plans", "planned", "planning"],
            &["configure", "configured", "configuration", "configurations"],
            &["copy", "copies", "copied"],
            &["deploy", "deployed", "deployment", "deployments"],
            &["password", "passwords"],
        ] {
            let stems: Vec<String> = group.iter().map(|w| stemmed(w)).collect();
            assert!(
                stems.iter().all(|s| s == &stems[0]),
                "{group:?} -> {stems:?}"
            );
        }
        // Words that merely end like a suffix keep their meaning apart.
        assert_ne!(stemmed("bus"), stemmed("bu"));
        assert_eq!(stemmed("class"), "class");
        assert_eq!(stemmed("this"), "this");
        assert_eq!(stemmed("sing"), "sing");
    }

    #[test]
    fn identifiers_and_numbers_stay_whole_and_give_their_parts() {
        assert_eq!(
            terms("The gate code for depot Norrby is 7731-KAPPA."),
            [
                "gat",
                "cod",
                "depot",
                "norrb",
                "7731-kappa",
                "7731",
                "kappa"
            ]
        );
        assert_eq!(
            terms("see src/main.rs:42"),
            ["see", "src/main.rs:42", "src", "main", "rs", "42"]
        );
        // A joiner must be followed by a letter or digit: sentence ends are not joins.
        assert_eq!(terms("v2. Deploy-"), ["v2", "deploy"]);
    }

    #[test]
    fn an_analysis_counts_every_term_it_normalises() {
        let text = "Kestrel KESTRELS kestrel-7 \u{212a}estrel Ärger ärgerlich naïve Naïve x y \
                    src/main.rs main deliveries Delivered 4410 4410-EUR tries try TRY \
                    sses SS flies fly ab AB abs the The";
        let analysis = Analysis::of(text);
        let mut expected: Vec<(u64, u32)> = Vec::new();
        for term in terms(text) {
            let id = term_id(&term);
            match expected.iter_mut().find(|(e, _)| *e == id) {
                Some((_, count)) => *count += 1,
                None => expected.push((id, 1)),
            }
        }
        assert_eq!(analysis.terms, expected);
        let mut all = 0;
        for_each_term(text, |_, _| all += 1);
        assert_eq!(analysis.length, all);
        assert!(analysis.terms.iter().any(|&(_, c)| c > 1));
    }

    /// A cache that counts the analyses it is given.
    #[derive(Default)]
    struct Recording {
        entries: std::sync::Mutex<FxHashMap<u128, CachedAnalysis>>,
        analysed: std::sync::atomic::AtomicUsize,
    }

    impl AnalysisCache for Recording {
        fn get(&self, key: u128) -> Option<CachedAnalysis> {
            self.entries.lock().unwrap().get(&key).cloned()
        }
        fn put(&self, key: u128, value: CachedAnalysis) {
            if matches!(value, CachedAnalysis::Message(_)) {
                self.analysed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            self.entries.lock().unwrap().insert(key, value);
        }
        fn remove(&self, key: u128) {
            self.entries.lock().unwrap().remove(&key);
        }
    }

    fn history(turns: usize) -> Vec<Message> {
        (0..turns)
            .map(|i| {
                assistant(&format!(
                    "step {i}: deployed build-{} to host {} after fixing the parser",
                    i % 5,
                    i * 7
                ))
            })
            .chain([user("which host got build-3?")])
            .collect()
    }

    #[test]
    fn a_cache_changes_no_bit_and_a_new_turn_analyses_only_its_messages() {
        use std::sync::atomic::Ordering::Relaxed;
        let mut messages = history(30);
        let cache = Recording::default();
        let cold = analyze_cached(&messages, Some("parser"), &cache);
        assert_eq!(cold, analyze(&messages, Some("parser")));
        assert_eq!(cache.analysed.load(Relaxed), messages.len());

        // The next turn: an answer and a new question.
        messages.push(assistant("host 21 got build-3."));
        messages.push(user("and which step fixed the parser for host 14?"));
        let warm = analyze_cached(&messages, None, &cache);
        assert_eq!(warm, analyze(&messages, None));
        assert_eq!(
            cache.analysed.load(Relaxed),
            messages.len(),
            "only the two new messages are analysed"
        );
        assert_ne!(warm.relevance[..31], cold.relevance[..31]);
        let histories = |cache: &Recording| {
            let entries = cache.entries.lock().unwrap();
            entries
                .values()
                .filter(|e| matches!(e, CachedAnalysis::History(_)))
                .count()
        };
        assert_eq!(histories(&cache), 1, "the earlier turn's history went");

        // A history edited in its middle still finds its unchanged messages.
        messages[3].content.push_str(" (rolled back)");
        let edited = analyze_cached(&messages, None, &cache);
        assert_eq!(edited, analyze(&messages, None));
        assert_eq!(cache.analysed.load(Relaxed), messages.len() + 1);
    }

    #[test]
    fn a_long_conversation_chains_then_flattens_its_histories() {
        let cache = Recording::default();
        let mut messages = history(3);
        for turn in 0..(MAX_HISTORY_DEPTH * 2 + 3) {
            messages.push(assistant(&format!("answer {turn}: host {}", turn * 3)));
            messages.push(user(&format!("and host {turn}?")));
            assert_eq!(
                analyze_cached(&messages, None, &cache),
                analyze(&messages, None)
            );
        }
        let keys: Vec<u128> = messages.iter().map(|m| message_key(&m.content)).collect();
        let last = *history_keys(&keys).last().unwrap();
        let Some(CachedAnalysis::History(h)) = cache.get(last) else {
            panic!("the last turn's history is cached");
        };
        assert_eq!(h.len(), messages.len());
        assert!(h.depth <= MAX_HISTORY_DEPTH);
        let mut seen = Vec::new();
        h.for_each(|a| seen.push((**a).clone()));
        let expected: Vec<Analysis> = messages.iter().map(|m| Analysis::of(&m.content)).collect();
        assert_eq!(seen, expected);
        // Each turn analysed only its two new messages.
        assert_eq!(
            cache.analysed.load(std::sync::atomic::Ordering::Relaxed),
            messages.len()
        );
    }

    #[test]
    fn a_colliding_history_entry_is_not_trusted() {
        let messages = history(5);
        let keys: Vec<u128> = messages.iter().map(|m| message_key(&m.content)).collect();
        let cache = Recording::default();
        // A history of the wrong length under the full history's key.
        let wrong = History::new(None, vec![Arc::new(Analysis::of("unrelated"))]);
        cache.put(
            *history_keys(&keys).last().unwrap(),
            CachedAnalysis::History(Arc::new(wrong)),
        );
        assert_eq!(
            analyze_cached(&messages, None, &cache),
            analyze(&messages, None)
        );
    }

    #[test]
    fn the_short_term_table_finds_what_it_holds() {
        let mut table = ShortTerms::default();
        let words: Vec<String> = (0..5000).map(|i| format!("w{i}")).collect();
        for (i, w) in words.iter().enumerate() {
            assert_eq!(table.insert(packed(w).unwrap(), i as u32), None);
        }
        assert_eq!(table.insert(packed("w7").unwrap(), 99), Some(7));
        for (i, w) in words.iter().enumerate() {
            let expected = if i == 7 { 99 } else { i as u32 };
            assert_eq!(table.get(packed(w).unwrap()), Some(&expected));
        }
        assert_eq!(table.get(packed("x1").unwrap()), None);
        assert_eq!(ShortTerms::default().get(packed("a").unwrap()), None);
    }

    #[test]
    fn the_eight_byte_scan_agrees_with_the_class_table() {
        let text: Vec<u8> = (0u8..=255)
            .chain(
                b"abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                    .iter()
                    .copied(),
            )
            .chain((0u8..=127).rev())
            .collect();
        for start in 0..text.len() {
            let mut slow = start;
            while slow < text.len() && CLASS[text[slow] as usize] == ALNUM {
                slow += 1;
            }
            let fast = alnum_run_end(&text, start);
            // The scan stops early only at a byte that is not ASCII, where
            // the caller decodes the char.
            assert!(
                fast == slow || (fast < slow && text[fast..fast + 8].iter().any(|b| !b.is_ascii())),
                "{start}: {fast} vs {slow}"
            );
        }
    }

    #[test]
    fn packed_keys_are_exact() {
        let words = [
            "",
            "a",
            "ab",
            "abc",
            "abcd",
            "abcde",
            "abcdefg",
            "abcdefgh",
            "abcdefghi",
            "abcdefghijklmno",
            "b",
            "ba",
            "abce",
            "abcdefgi",
            "abcdefghijklmnp",
            "\u{e5}r",
        ];
        let keys: Vec<u128> = words.iter().map(|w| packed(w).unwrap()).collect();
        for (i, a) in keys.iter().enumerate() {
            for (j, b) in keys.iter().enumerate() {
                assert_eq!(a == b, i == j, "{:?} {:?}", words[i], words[j]);
            }
        }
        for w in words {
            let bytes = w.as_bytes();
            let mut expected = [0u8; 16];
            expected[..bytes.len()].copy_from_slice(bytes);
            expected[15] = bytes.len() as u8;
            assert_eq!(packed(w), Some(u128::from_le_bytes(expected)), "{w:?}");
        }
        assert_eq!(packed("abcdefghijklmnop"), None);
    }

    #[test]
    fn case_folds_beyond_ascii() {
        assert_eq!(terms("ÅRHUS Århus"), ["århus", "århus"]);
    }

    fn user(s: &str) -> Message {
        Message::new(Role::User, s)
    }
    fn assistant(s: &str) -> Message {
        Message::new(Role::Assistant, s)
    }

    #[test]
    fn the_message_holding_the_asked_fact_ranks_first() {
        let messages = [
            user("The gate code for depot Norrby is 7731-KAPPA."),
            assistant("Noted. The depot at Sundby has a new gate."),
            Message::new(Role::Tool, "weather: sunny, 21 degrees"),
            user("Which code opens the gate at Norrby?"),
        ];
        let r = analyze(&messages, None);
        assert_eq!(r.query_index, Some(3));
        assert_eq!(r.query_terms, ["cod", "gat", "norrb", "open"]);
        assert_eq!(r.relevance[0], 1.0);
        assert!(
            r.relevance[1] > 0.0 && r.relevance[1] < 0.5,
            "{:?}",
            r.relevance
        );
        assert_eq!(r.relevance[2], 0.0);
        assert_eq!(r.relevance[3], 1.0, "the request itself");
    }

    #[test]
    fn the_goal_adds_query_terms() {
        let messages = [
            assistant("The invoice total was 4410 EUR."),
            assistant("Shipping is by rail."),
            user("continue"),
        ];
        let without = analyze(&messages, None);
        assert_eq!(without.relevance[..2], [0.0, 0.0]);
        let with = analyze(&messages, Some("invoice totals"));
        assert_eq!(with.query_terms, ["continu", "invoic", "total"]);
        assert_eq!(with.relevance[..2], [1.0, 0.0]);
    }

    #[test]
    fn no_user_message_and_no_goal_means_no_relevance() {
        let r = analyze(
            &[assistant("a b c"), Message::new(Role::System, "sys")],
            None,
        );
        assert_eq!((r.query_index, r.query_terms.len()), (None, 0));
        assert_eq!(r.relevance, [0.0, 0.0]);
    }

    #[test]
    fn the_same_input_gives_the_same_bits() {
        let messages: Vec<Message> = (0..50)
            .map(|i| {
                assistant(&format!(
                    "note {i}: alpha beta gamma-{} delta {}",
                    i % 7,
                    i * 13
                ))
            })
            .chain([user("what about gamma-3 and delta 39?")])
            .collect();
        let a = analyze(&messages, Some("alpha"));
        let b = analyze(&messages, Some("alpha"));
        assert_eq!(a, b);
        assert!(a.relevance.iter().all(|r| (0.0..=1.0).contains(r)));
    }
}
