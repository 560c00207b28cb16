//! Text primitives of the engine: chars, words, word sets and Jaccard.
//!
//! Chars are Unicode scalar values (`str::chars`), never bytes. Words are the
//! maximal runs of `char::is_alphanumeric()` characters, lowercased with
//! `char::to_lowercase()`. Words are interned to dense ids per run so word
//! sets are sorted `u32` vectors and set operations are linear merges.

use std::hash::Hasher;

use hashbrown::HashTable;
use rustc_hash::{FxHashMap, FxHasher};

/// Number of Unicode scalar values in `text`.
pub fn char_count(text: &str) -> usize {
    // Counting UTF-8 leading bytes is what `chars().count()` does, but the
    // std implementation is already vectorised; keep it for clarity.
    text.chars().count()
}

/// The first `n` chars of `text` (all of it when shorter).
pub fn char_prefix(text: &str, n: usize) -> &str {
    match text.char_indices().nth(n) {
        Some((byte, _)) => &text[..byte],
        None => text,
    }
}

/// Interns lowercased words to dense ids for one engine run. The words are
/// kept once, end to end in one string, and found through a table of ids
/// hashed by their text: one allocation per growth, not two per new word.
#[derive(Default)]
pub struct Vocabulary {
    /// Words of up to 8 bytes (most words), by their bytes packed in a
    /// u64: alphanumeric text has no NUL, so the zero padding is
    /// unambiguous and a lookup is one integer compare.
    short: FxHashMap<u64, u32>,
    /// Longer words, by the hash of their text.
    table: HashTable<u32>,
    /// Every word, end to end.
    text: String,
    /// Where each word lies in `text`.
    spans: Vec<(u32, u32)>,
    /// Chars of each word, cached because topic terms filter on it.
    word_chars: Vec<u32>,
}

fn hash_word(word: &str) -> u64 {
    let mut hasher = FxHasher::default();
    hasher.write(word.as_bytes());
    hasher.finish()
}

impl Vocabulary {
    pub fn word(&self, id: u32) -> &str {
        let (start, end) = self.spans[id as usize];
        &self.text[start as usize..end as usize]
    }

    pub fn word_chars(&self, id: u32) -> usize {
        self.word_chars[id as usize] as usize
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    fn intern(&mut self, word: &str) -> u32 {
        if word.len() <= 8 {
            let mut packed = [0u8; 8];
            packed[..word.len()].copy_from_slice(word.as_bytes());
            let key = u64::from_le_bytes(packed);
            if let Some(&id) = self.short.get(&key) {
                return id;
            }
            let id = self.push(word);
            self.short.insert(key, id);
            return id;
        }
        let hash = hash_word(word);
        let Vocabulary {
            table, text, spans, ..
        } = self;
        let at = |id: u32| {
            let (start, end) = spans[id as usize];
            &text[start as usize..end as usize]
        };
        if let Some(&id) = table.find(hash, |&id| at(id) == word) {
            return id;
        }
        let id = self.push(word);
        let Vocabulary {
            table, text, spans, ..
        } = self;
        let (text, spans) = (&*text, &*spans);
        table.insert_unique(hash, id, |&id| {
            let (start, end) = spans[id as usize];
            hash_word(&text[start as usize..end as usize])
        });
        id
    }

    /// Keeps a new word; returns its id.
    fn push(&mut self, word: &str) -> u32 {
        let id = self.spans.len() as u32;
        let start = self.text.len();
        self.text.push_str(word);
        // Bodies are capped far below 4 GiB, so spans fit in u32.
        self.spans.push((start as u32, self.text.len() as u32));
        self.word_chars.push(char_count(word) as u32);
        id
    }

    /// Appends the ids of the words of `text`, in order, to `out`.
    ///
    /// Each word is lowercased whole with `str::to_lowercase`, which knows
    /// context (a word-final `Σ` becomes `ς`). ASCII, the common case, is
    /// read byte by byte (an ASCII char is alphanumeric exactly when
    /// `is_ascii_alphanumeric`), and an ASCII word without capitals is
    /// interned as it stands.
    pub fn words_of(&mut self, text: &str, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        let mut buf = String::new();
        // The current word: where it starts, and whether it needs lowering.
        let mut start: Option<usize> = None;
        let (mut upper, mut non_ascii) = (false, false);
        let mut at = 0;
        while at < bytes.len() {
            let b = bytes[at];
            let (alphanumeric, width) = if b.is_ascii() {
                (b.is_ascii_alphanumeric(), 1)
            } else {
                let c = text[at..].chars().next().unwrap_or(' ');
                (c.is_alphanumeric(), c.len_utf8())
            };
            if alphanumeric {
                if start.is_none() {
                    start = Some(at);
                    (upper, non_ascii) = (false, false);
                }
                upper |= b.is_ascii_uppercase();
                non_ascii |= !b.is_ascii();
            } else if let Some(from) = start.take() {
                out.push(self.intern_lowercase(&text[from..at], upper, non_ascii, &mut buf));
            }
            at += width;
        }
        if let Some(from) = start {
            out.push(self.intern_lowercase(&text[from..], upper, non_ascii, &mut buf));
        }
    }

    fn intern_lowercase(
        &mut self,
        word: &str,
        upper: bool,
        non_ascii: bool,
        buf: &mut String,
    ) -> u32 {
        if non_ascii {
            let lowered = word.to_lowercase();
            return self.intern(&lowered);
        }
        if !upper {
            return self.intern(word);
        }
        buf.clear();
        buf.extend(word.bytes().map(|b| b.to_ascii_lowercase() as char));
        self.intern(buf)
    }
}

/// The words of `text` as owned strings (for callers outside a run).
pub fn words(text: &str) -> Vec<String> {
    let mut vocab = Vocabulary::default();
    let mut ids = Vec::new();
    vocab.words_of(text, &mut ids);
    ids.into_iter()
        .map(|id| vocab.word(id).to_owned())
        .collect()
}

/// Word sets (sorted, deduplicated ids) of many messages over one
/// vocabulary of `vocabulary_len` words: repeats are dropped with a
/// per-word mark before sorting, so each sort sees a message's distinct
/// words only.
pub struct WordSets {
    /// The message (plus one) that last saw each word.
    seen_in: Vec<u32>,
    message: u32,
}

impl WordSets {
    pub fn new() -> Self {
        WordSets {
            seen_in: Vec::new(),
            message: 0,
        }
    }

    pub fn of(&mut self, ids: &[u32], vocabulary_len: usize) -> Vec<u32> {
        self.message += 1;
        if self.seen_in.len() < vocabulary_len {
            self.seen_in.resize(vocabulary_len, 0);
        }
        let mut set = Vec::with_capacity(ids.len());
        for &id in ids {
            let seen = &mut self.seen_in[id as usize];
            if *seen != self.message {
                *seen = self.message;
                set.push(id);
            }
        }
        set.sort_unstable();
        set
    }
}

impl Default for WordSets {
    fn default() -> Self {
        Self::new()
    }
}

/// Size of the intersection of two sorted id sets.
pub fn intersection_len(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

/// The Jaccard similarity of two sorted id sets when it is at least
/// `threshold`, else `None`. Gives up early, as soon as the overlap still
/// reachable cannot make the threshold: `|a ∩ b| / |a ∪ b| >= t` needs
/// `|a ∩ b| >= t / (1 + t) * (|a| + |b|)`. Most compared pairs are far from
/// duplicates, so this reads a few elements instead of both sets.
pub fn jaccard_at_least(a: &[u32], b: &[u32], threshold: f64) -> Option<f64> {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    // Jaccard <= |short| / |long|.
    if (short.len() as f64) < threshold * long.len() as f64 {
        return None;
    }
    // One less than the bound, so float error can only keep a pair longer.
    let needed = (threshold / (1.0 + threshold) * (a.len() + b.len()) as f64).ceil() as usize;
    let needed = needed.saturating_sub(1);
    let (mut i, mut j, mut inter) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        if inter + (a.len() - i).min(b.len() - j) < needed {
            return None;
        }
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                inter += 1;
                i += 1;
                j += 1;
            }
        }
    }
    let union = a.len() + b.len() - inter;
    let similarity = if union == 0 {
        0.0
    } else {
        inter as f64 / union as f64
    };
    (similarity >= threshold).then_some(similarity)
}

/// Jaccard similarity of two sorted id sets; 0 when both are empty.
pub fn jaccard(a: &[u32], b: &[u32]) -> f64 {
    let inter = intersection_len(a, b);
    let union = a.len() + b.len() - inter;
    if union == 0 {
        0.0
    } else {
        inter as f64 / union as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_on_non_alphanumerics_and_lowercase() {
        assert_eq!(words("DE-4471 at 03:10"), ["de", "4471", "at", "03", "10"]);
        assert_eq!(words("Größe STRASSE"), ["größe", "strasse"]);
    }

    #[test]
    fn words_keep_cjk_runs_and_drop_emoji() {
        // CJK ideographs are alphabetic; emoji and punctuation separate words.
        assert_eq!(words("配送🚚状態 ok"), ["配送", "状態", "ok"]);
    }

    #[test]
    fn combining_marks_split_words_and_count_as_chars() {
        // U+0301 COMBINING ACUTE is not alphanumeric, so "e\u{301}cole" is two words.
        assert_eq!(words("e\u{301}cole"), ["e", "cole"]);
        assert_eq!(char_count("e\u{301}cole"), 6);
        assert_eq!(char_count("🚚配送"), 3);
    }

    #[test]
    fn char_prefix_cuts_on_scalar_values() {
        assert_eq!(char_prefix("a🚚b", 2), "a🚚");
        assert_eq!(char_prefix("ab", 5), "ab");
        assert_eq!(char_prefix("ab", 0), "");
    }

    #[test]
    fn words_lowercase_whole_words_with_final_sigma() {
        assert_eq!(words("ΟΔΟΣ ΣΑ"), ["οδος", "σα"]);
    }

    #[test]
    fn early_exit_jaccard_agrees_with_the_full_one() {
        let sets: Vec<Vec<u32>> = vec![
            vec![],
            vec![1],
            vec![1, 2],
            vec![1, 2, 3],
            vec![2, 3, 4, 5],
            (0..20).collect(),
            (1..21).collect(),
            (0..19).collect(),
        ];
        for a in &sets {
            for b in &sets {
                for t in [0.5, 0.6, 2.0 / 3.0, 0.75, 0.9, 0.95, 1.0] {
                    let full = jaccard(a, b);
                    let expected = (full >= t).then_some(full);
                    assert_eq!(jaccard_at_least(a, b, t), expected, "{a:?} {b:?} {t}");
                }
            }
        }
    }

    #[test]
    fn word_sets_equal_sorting_and_deduplicating() {
        let word_set = |ids: &[u32]| {
            let mut ids = ids.to_vec();
            ids.sort_unstable();
            ids.dedup();
            ids
        };
        let mut sets = WordSets::new();
        for ids in [vec![3, 1, 3, 2, 1], vec![], vec![7, 7, 7], vec![2, 9, 0, 9]] {
            assert_eq!(sets.of(&ids, 10), word_set(&ids), "{ids:?}");
        }
    }

    #[test]
    fn interning_gives_one_id_per_lowercased_word_and_keeps_the_words() {
        let mut vocab = Vocabulary::default();
        let mut ids = Vec::new();
        vocab.words_of("Alpha beta ALPHA, Größe GRÖSSE alpha-beta 42", &mut ids);
        let words: Vec<&str> = ids.iter().map(|&id| vocab.word(id)).collect();
        assert_eq!(
            words,
            ["alpha", "beta", "alpha", "größe", "grösse", "alpha", "beta", "42"]
        );
        assert_eq!(ids[0], ids[2]);
        assert_eq!(vocab.len(), 5);
        assert_eq!(vocab.word_chars(ids[3]), 5);
        // Many words: the table grows and rehashes from the kept text.
        let text: String = (0..5000).map(|i| format!("w{i} ")).collect();
        let mut many = Vec::new();
        vocab.words_of(&text, &mut many);
        vocab.words_of(&text, &mut many);
        assert_eq!(vocab.len(), 5 + 5000);
        assert_eq!(many[..5000], many[5000..]);
        assert_eq!(vocab.word(many[4999]), "w4999");
    }

    #[test]
    fn jaccard_of_empty_sets_is_zero() {
        assert_eq!(jaccard(&[], &[]), 0.0);
        assert_eq!(jaccard(&[1, 2], &[2, 3]), 1.0 / 3.0);
    }
}
