//! The query: its terms, and counting them in a message, either from the
//! message's [`Analysis`](super::Analysis) or, when no analysis is kept,
//! straight from its text ([`QueryCounter`]).

use super::analysis::Analysis;
use super::terms::{
    for_each_term, next_set, normalize, packed, run_end, run_start, term_id, window_key, Kind,
    TermMasks, TermMemo,
};

/// Counts the query's terms in texts, one after another, without building
/// their [`Analysis`]: what BM25 needs when no analysis is kept for later.
pub(super) struct QueryCounter<'q> {
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
    pub(super) fn new(query: &'q Query) -> Self {
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
    pub(super) fn count(&mut self, text: &str, counts: &mut [u32]) -> u32 {
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
/// and [`stem`](super::stem) never cuts into a word's first two letters (not even
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

/// The query terms, interned in first-seen order (the report sorts them).
#[derive(Default, Clone)]
pub(super) struct Query {
    pub(super) terms: Vec<(String, Kind)>,
    /// [`term_id`] of each term, by position.
    pub(super) ids: Vec<u64>,
    /// The weight of each term, by position: 1 for the request's and the
    /// goal's own, less for words of the turns it refers back to.
    pub(super) weights: Vec<f64>,
    /// A 256-bit Bloom filter on the ids: most document terms are not
    /// query terms and stop at one bit test (a warm turn tests every term
    /// of the history, ~40 per message).
    mask: [u64; 4],
}

impl Query {
    pub(super) fn add(&mut self, raw: &str, kind: Kind) {
        self.add_weighted(raw, kind, 1.0);
    }

    /// Adds the term `raw` normalises to at `weight`; a term already in
    /// the query keeps the higher of its weights.
    pub(super) fn add_weighted(&mut self, raw: &str, kind: Kind, weight: f64) {
        let Some(term) = normalize(raw, kind, &mut String::new()) else {
            return;
        };
        self.add_normalized(term, kind, weight);
    }

    /// Adds an already normalised term at `weight`.
    pub(super) fn add_term(&mut self, term: String, weight: f64) {
        let kind = if term.bytes().all(|b| b.is_ascii_alphanumeric()) {
            Kind::Plain
        } else {
            Kind::Joined
        };
        self.add_normalized(term, kind, weight);
    }

    fn add_normalized(&mut self, term: String, kind: Kind, weight: f64) {
        let id = term_id(&term);
        match self.ids.iter().position(|&q| q == id) {
            Some(t) => self.weights[t] = self.weights[t].max(weight),
            None => {
                self.mask[(id >> 6) as usize & 3] |= 1 << (id & 63);
                self.ids.push(id);
                self.weights.push(weight);
                self.terms.push((term, kind));
            }
        }
    }

    /// Whether the normalised term `term` is a query term.
    pub(super) fn holds(&self, term: &str) -> bool {
        self.ids.contains(&term_id(term))
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
    pub(super) fn count_in(&self, analysis: &Analysis, counts: &mut [u32]) {
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
