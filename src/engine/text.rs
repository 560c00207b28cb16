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
    pub fn words_of(&mut self, text: &str, out: &mut Vec<u32>) {
        let mut buf = String::new();
        for c in text.chars() {
            if c.is_alphanumeric() {
                if c.is_ascii() {
                    buf.push(c.to_ascii_lowercase());
                } else {
                    buf.extend(c.to_lowercase());
                }
            } else if !buf.is_empty() {
                out.push(self.intern(&buf));
                buf.clear();
            }
        }
        if !buf.is_empty() {
            out.push(self.intern(&buf));
        }
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
pub fn word_set(mut ids: Vec<u32>) -> Vec<u32> {
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
    fn jaccard_of_empty_sets_is_zero() {
        assert_eq!(jaccard(&[], &[]), 0.0);
        assert_eq!(jaccard(&[1, 2], &[2, 3]), 1.0 / 3.0);
    }
}
