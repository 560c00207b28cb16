//! Text primitives of the engine: chars, words, word sets and Jaccard.
//!
//! Chars are Unicode scalar values (`str::chars`), never bytes. Words are the
//! maximal runs of `char::is_alphanumeric()` characters, lowercased with
//! `char::to_lowercase()`. Words are interned to dense ids per run so word
//! sets are sorted `u32` vectors and set operations are linear merges.

use rustc_hash::FxHashMap;

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

/// Interns lowercased words to dense ids for one engine run.
#[derive(Default)]
pub struct Vocabulary {
    ids: FxHashMap<String, u32>,
    words: Vec<String>,
    /// Chars of each word, cached because topic terms filter on it.
    word_chars: Vec<usize>,
}

impl Vocabulary {
    pub fn word(&self, id: u32) -> &str {
        &self.words[id as usize]
    }

    pub fn word_chars(&self, id: u32) -> usize {
        self.word_chars[id as usize]
    }

    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    fn intern(&mut self, word: &str) -> u32 {
        if let Some(&id) = self.ids.get(word) {
            return id;
        }
        let id = self.words.len() as u32;
        self.ids.insert(word.to_owned(), id);
        self.words.push(word.to_owned());
        self.word_chars.push(char_count(word));
        id
    }

    /// Appends the ids of the words of `text`, in order, to `out`.
    ///
    /// Each word is lowercased whole with `str::to_lowercase`, which knows
    /// context (a word-final `Σ` becomes `ς`); ASCII words, the common case,
    /// take a byte-wise path.
    pub fn words_of(&mut self, text: &str, out: &mut Vec<u32>) {
        let mut buf = String::new();
        let mut start = None;
        for (at, c) in text.char_indices() {
            match (c.is_alphanumeric(), start) {
                (true, None) => start = Some(at),
                (false, Some(from)) => {
                    out.push(self.intern_lowercase(&text[from..at], &mut buf));
                    start = None;
                }
                _ => {}
            }
        }
        if let Some(from) = start {
            out.push(self.intern_lowercase(&text[from..], &mut buf));
        }
    }

    fn intern_lowercase(&mut self, word: &str, buf: &mut String) -> u32 {
        if word.bytes().all(|b| !b.is_ascii_uppercase()) && word.is_ascii() {
            return self.intern(word);
        }
        buf.clear();
        if word.is_ascii() {
            buf.extend(word.bytes().map(|b| b.to_ascii_lowercase() as char));
        } else {
            buf.push_str(&word.to_lowercase());
        }
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

/// Sorted, deduplicated ids: the word set of a message.
pub fn word_set(ids: &[u32]) -> Vec<u32> {
    let mut ids = ids.to_vec();
    ids.sort_unstable();
    ids.dedup();
    ids
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
    fn jaccard_of_empty_sets_is_zero() {
        assert_eq!(jaccard(&[], &[]), 0.0);
        assert_eq!(jaccard(&[1, 2], &[2, 3]), 1.0 / 3.0);
    }
}
