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
//! Everything is computed in input order over sorted or index-keyed
//! structures: the same messages and goal give the same numbers, bit for
//! bit. Pure: no I/O.

use rustc_hash::FxHashMap;

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

    // One pass over the documents: each one's length and query-term counts.
    let terms = query.terms.len();
    let mut tf = vec![0u32; messages.len() * terms];
    let mut length = vec![0u32; messages.len()];
    let mut df = vec![0u32; terms];
    let mut documents = 0usize;
    for (i, m) in messages.iter().enumerate() {
        if Some(i) == query_index {
            continue;
        }
        documents += 1;
        let counts = &mut tf[i * terms..(i + 1) * terms];
        let mut len = 0u32;
        query.count_in(&m.content, counts, &mut len);
        length[i] = len;
        for (d, &c) in df.iter_mut().zip(counts.iter()) {
            *d += u32::from(c > 0);
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

/// Whether a term is a joined identifier (kept whole, never stemmed) or a
/// plain run of letters and digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Joined,
    Plain,
}

/// The query terms, interned in first-seen order (the report sorts them).
struct Query {
    ids: FxHashMap<String, usize>,
    terms: Vec<(String, Kind)>,
    /// A prefilter on a document term's first three bytes, so most terms
    /// skip folding, stemming and the lookup. Folding keeps ASCII bytes in
    /// place, and [`stem`] keeps the first three letters of a word of three
    /// or more, except `xxies` -> `xxy` (and `sses` -> `ss`). So a query
    /// term of three or more bytes sets the bit of its first three
    /// ([`prefix_bit`]), plus `xxi` for a three-letter `xxy`; a two-byte
    /// query term sets `short_pairs`, checked for document terms of up to
    /// four bytes. A document term with a non-ASCII byte among its first
    /// three always takes the full path.
    prefixes: [u64; PREFIX_WORDS],
    short_pairs: [u128; 128],
}

const PREFIX_WORDS: usize = 128;

/// The bit of `prefixes` for three lowercase ASCII bytes (a hash: a
/// collision only lets a term through to the exact lookup).
#[inline(always)]
fn prefix_bit(a: u8, b: u8, c: u8) -> (usize, u64) {
    let h = (a as usize * 961 + b as usize * 31 + c as usize) % (PREFIX_WORDS * 64);
    (h / 64, 1 << (h % 64))
}

impl Default for Query {
    fn default() -> Self {
        Query {
            ids: FxHashMap::default(),
            terms: Vec::new(),
            prefixes: [0; PREFIX_WORDS],
            short_pairs: [0; 128],
        }
    }
}

impl Query {
    fn add(&mut self, raw: &str, kind: Kind) {
        let Some(term) = normalize(raw, kind, &mut String::new()) else {
            return;
        };
        if !self.ids.contains_key(&term) {
            match *term.as_bytes() {
                [a, b] if a.is_ascii() && b.is_ascii() => self.short_pairs[a as usize] |= 1 << b,
                [a, b, c, ..] if a.is_ascii() && b.is_ascii() && c.is_ascii() => {
                    let (word, bit) = prefix_bit(a, b, c);
                    self.prefixes[word] |= bit;
                    if term.len() == 3 && c == b'y' {
                        let (word, bit) = prefix_bit(a, b, b'i');
                        self.prefixes[word] |= bit;
                    }
                }
                _ => {} // not ASCII: documents take the full path
            }
            self.ids.insert(term.clone(), self.terms.len());
            self.terms.push((term, kind));
        }
    }

    /// Adds the count of each query term in `text` to `counts`, and the
    /// number of its terms to `length`.
    fn count_in(&self, text: &str, counts: &mut [u32], length: &mut u32) {
        let mut buf = String::new();
        for_each_term(text, |raw, kind| {
            *length += 1;
            match *raw.as_bytes() {
                [_] => return, // one char: never a query term
                [a, b] if a.is_ascii() && b.is_ascii() => {
                    let (a, b) = (a.to_ascii_lowercase(), b.to_ascii_lowercase());
                    if self.short_pairs[a as usize] & (1 << b) == 0 {
                        return;
                    }
                }
                [a, b, c, ..] if a.is_ascii() && b.is_ascii() && c.is_ascii() => {
                    let (a, b, c) = (
                        a.to_ascii_lowercase(),
                        b.to_ascii_lowercase(),
                        c.to_ascii_lowercase(),
                    );
                    let (word, bit) = prefix_bit(a, b, c);
                    let short = raw.len() <= 4 && self.short_pairs[a as usize] & (1 << b) != 0;
                    if self.prefixes[word] & bit == 0 && !short {
                        return;
                    }
                }
                _ => {} // not ASCII: fold and look up
            }
            self.count_term(raw, kind, counts, &mut buf);
        });
    }

    /// The exact match of one term that passed the prefilter; out of line
    /// so the prefilter inlines into the scan.
    #[inline(never)]
    fn count_term(&self, raw: &str, kind: Kind, counts: &mut [u32], buf: &mut String) {
        if let Some(term) = normalize(raw, kind, buf) {
            if let Some(&t) = self.ids.get(&term) {
                counts[t] += 1;
            }
            *buf = term;
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
/// `char::is_alphanumeric`. This scan is most of relevance's cost.
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
            while i < n && CLASS[bytes[i] as usize] == ALNUM {
                i += 1;
            }
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

/// Whether a case-folded word is one of [`STOPWORDS`].
pub fn is_stopword(word: &str) -> bool {
    STOPWORDS.binary_search(&word).is_ok()
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
    fn the_first_pair_filter_never_hides_a_match() {
        let text = "Kestrel KESTRELS kestrel-7 \u{212a}estrel Ärger ärgerlich naïve Naïve x y \
                    src/main.rs main deliveries Delivered 4410 4410-EUR tries try TRY \
                    sses SS flies fly ab AB abs";
        let mut query = Query::default();
        for_each_term(text, |raw, kind| query.add(raw, kind));
        let mut fast = vec![0u32; query.terms.len()];
        let mut length = 0;
        query.count_in(text, &mut fast, &mut length);
        let mut slow = vec![0u32; query.terms.len()];
        for term in terms(text) {
            slow[query.ids[&term]] += 1;
        }
        assert_eq!(fast, slow);
        assert!(fast.iter().all(|&c| c > 0));
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
