//! What reading a history's words gave, kept for its next turn.
//!
//! Every turn of a conversation sends its whole history again, and the
//! drop score reads every message's words on every request: for a 200 KB
//! history, finding and interning its words is two fifths of a compaction.
//! What that reading leaves is small: the vocabulary (a few thousand
//! words, in the order first seen), each word's count, and each message's
//! word set as ids. A [`HistoryWords`] keeps it for a history's messages
//! but the last (the one a new turn or a retry changes), keyed by the chain
//! of their hashes; the next turn finds it with a lookup or two, interns the
//! vocabulary in order, copies the rest, and reads only its new messages.
//! Its own entry then replaces the earlier one.
//!
//! A cache is only an accelerator: interning the vocabulary in its order
//! gives every word the id that reading the texts would (ids go to words in
//! the order first seen), so the report is the same with a cache or none.

use std::sync::Arc;

use super::relevance::{history_keys, message_key};
use super::text::{Vocabulary, WordSets};

/// How far back from a history's end its earlier turn is looked for: a
/// turn adds a user message, the answer and, in an agent loop, a few tool
/// calls and results.
const HISTORY_PROBES: usize = 8;

/// What reading the words of a history's first [`HistoryWords::len`]
/// messages gave: about 130 KB for a 200 KB history.
#[derive(Debug)]
pub struct HistoryWords {
    /// The vocabulary in id order, each word packed
    /// ([`Vocabulary::packed`]), or 0 for the next of the long words.
    words: Box<[u128]>,
    /// The words too long to pack, end to end, and where each ends.
    long: Box<str>,
    long_ends: Box<[u32]>,
    /// Each word's occurrences in these messages, by id.
    counts: Box<[u32]>,
    /// The messages' word sets, end to end, and where each ends.
    sets: Box<[u32]>,
    set_ends: Box<[u32]>,
}

impl HistoryWords {
    /// What reading gave so far: `vocab`, `counts` and `sets`.
    fn of(vocab: &Vocabulary, counts: &[u32], sets: &[Vec<u32>]) -> Self {
        let words: Box<[u128]> = (0..vocab.len() as u32).map(|id| vocab.packed(id)).collect();
        let mut long = String::new();
        let mut long_ends = Vec::new();
        for (id, _) in words.iter().enumerate().filter(|(_, &key)| key == 0) {
            long.push_str(vocab.word(id as u32));
            long_ends.push(long.len() as u32);
        }
        let mut flat = Vec::with_capacity(sets.iter().map(Vec::len).sum());
        let mut set_ends = Vec::with_capacity(sets.len());
        for set in sets {
            flat.extend_from_slice(set);
            set_ends.push(flat.len() as u32);
        }
        HistoryWords {
            words,
            long: long.into(),
            long_ends: long_ends.into(),
            // As long as the vocabulary (it always is: never a panic).
            counts: (0..vocab.len())
                .map(|id| counts.get(id).copied().unwrap_or(0))
                .collect(),
            sets: flat.into(),
            set_ends: set_ends.into(),
        }
    }

    /// Puts what reading gave back into an empty `vocab`, `counts` and
    /// `sets`.
    fn restore(&self, vocab: &mut Vocabulary, counts: &mut Vec<u32>, sets: &mut Vec<Vec<u32>>) {
        let mut long_start = 0;
        let mut long_ends = self.long_ends.iter();
        for &key in self.words.iter() {
            match key {
                0 => {
                    let end = long_ends.next().map_or(self.long.len(), |&e| e as usize);
                    vocab.intern_long(self.long.get(long_start..end).unwrap_or_default());
                    long_start = end;
                }
                key => {
                    vocab.intern_packed(key);
                }
            }
        }
        counts.clear();
        counts.extend_from_slice(&self.counts);
        let mut start = 0;
        for &end in self.set_ends.iter() {
            sets.push(
                self.sets
                    .get(start..end as usize)
                    .unwrap_or_default()
                    .to_vec(),
            );
            start = end as usize;
        }
    }

    /// The messages it covers.
    pub fn len(&self) -> usize {
        self.set_ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.set_ends.is_empty()
    }

    /// Whether it is what reading the words of `len` messages leaves:
    /// every id of a set is a word, and there are as many long words as
    /// words that need one. A hash collision must not panic.
    fn fits(&self, len: usize) -> bool {
        let long_words = self.words.iter().filter(|&&key| key == 0).count();
        self.len() == len
            && self.counts.len() == self.words.len()
            && long_words == self.long_ends.len()
            && self.sets.iter().all(|&id| (id as usize) < self.words.len())
    }

    /// Bytes it holds, for a cache's weigher.
    pub fn weight(&self) -> u32 {
        let bytes = std::mem::size_of::<Self>()
            + self.words.len() * (16 + 4)
            + self.long.len()
            + self.long_ends.len() * 4
            + self.sets.len() * 4
            + self.set_ends.len() * 4;
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// Where what reading earlier requests' histories gave is kept, by the key
/// of the history ([`history_keys`] over its messages'
/// hashes).
pub trait WordListCache {
    /// Whether lookups can hit: without a cache, texts are not hashed.
    fn word_lists_enabled(&self) -> bool;
    fn history_words(&self, key: u128) -> Option<Arc<HistoryWords>>;
    fn put_history_words(&self, key: u128, words: Arc<HistoryWords>);
    /// Drops an entry: the previous turn's, once the new turn's holds all
    /// it held.
    fn remove_history_words(&self, key: u128);
}

/// The word set of each of `texts` (its distinct ids in the order first
/// seen), read into the empty `vocab` through `cache`, with each word's
/// occurrences in `counts` (as long as the vocabulary).
pub(super) fn read_words(
    texts: &[&str],
    vocab: &mut Vocabulary,
    counts: &mut Vec<u32>,
    cache: &dyn WordListCache,
    keys: Option<&[u128]>,
) -> Vec<Vec<u32>> {
    let mut sets: Vec<Vec<u32>> = Vec::with_capacity(texts.len());
    let mut reader = Reader::default();
    if !cache.word_lists_enabled() || texts.len() < 2 {
        for text in texts {
            sets.push(reader.read(text, vocab, counts));
        }
        counts.resize(vocab.len(), 0);
        return sets;
    }
    // An entry holds a history's messages but the last, the one a client
    // most often changes (a new question, a retry): the next turn extends
    // the rest, and a retry changes only the last.
    let stem = texts.len() - 1;
    // The keys relevance's analyses use: this cache is another, so the
    // same key names each history's words here and its analyses there.
    // (Given by the caller when it hashed the texts already.)
    let keys: Vec<u128> = match keys {
        Some(keys) => keys[..stem].to_vec(),
        None => texts[..stem].iter().map(|t| message_key(t)).collect(),
    };
    let prefixes = history_keys(&keys);
    let earlier = (stem.saturating_sub(HISTORY_PROBES)..stem)
        .rev()
        .find_map(|k| {
            let found = cache.history_words(prefixes[k])?;
            found.fits(k + 1).then_some((found, k))
        });
    if let Some((found, _)) = &earlier {
        found.restore(vocab, counts, &mut sets);
    }
    for text in &texts[sets.len()..stem] {
        sets.push(reader.read(text, vocab, counts));
    }
    match earlier {
        // The same stem again (a retry, another pass of this request, or a
        // new last message): its entry is there.
        Some((_, k)) if k + 1 == stem => {}
        found => {
            cache.put_history_words(
                prefixes[stem - 1],
                Arc::new(HistoryWords::of(vocab, counts, &sets)),
            );
            if let Some((_, k)) = found {
                cache.remove_history_words(prefixes[k]);
            }
        }
    }
    sets.push(reader.read(texts[stem], vocab, counts));
    counts.resize(vocab.len(), 0);
    sets
}

/// Reads texts' words, reusing its buffers from one text to the next.
#[derive(Default)]
struct Reader {
    ids: Vec<u32>,
    sets: WordSets,
}

impl Reader {
    /// The word set of `text`, with its occurrences added to `counts`
    /// (grown to the vocabulary's length).
    fn read(&mut self, text: &str, vocab: &mut Vocabulary, counts: &mut Vec<u32>) -> Vec<u32> {
        self.ids.clear();
        vocab.words_of(text, &mut self.ids);
        counts.resize(vocab.len(), 0);
        for &id in &self.ids {
            counts[id as usize] += 1;
        }
        self.sets.of(&self.ids, vocab.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::HashMap;

    /// A cache that keeps everything and counts its hits and inserts.
    #[derive(Default)]
    struct Kept {
        entries: RefCell<HashMap<u128, Arc<HistoryWords>>>,
        hits: RefCell<usize>,
        inserts: RefCell<usize>,
    }

    impl WordListCache for Kept {
        fn word_lists_enabled(&self) -> bool {
            true
        }
        fn history_words(&self, key: u128) -> Option<Arc<HistoryWords>> {
            let found = self.entries.borrow().get(&key).cloned();
            *self.hits.borrow_mut() += usize::from(found.is_some());
            found
        }
        fn put_history_words(&self, key: u128, words: Arc<HistoryWords>) {
            *self.inserts.borrow_mut() += 1;
            self.entries.borrow_mut().insert(key, words);
        }
        fn remove_history_words(&self, key: u128) {
            self.entries.borrow_mut().remove(&key);
        }
    }

    /// Every text's set, the counts, and each id's word, read through `cache`.
    fn read_all(
        texts: &[&str],
        cache: &dyn WordListCache,
    ) -> (Vec<Vec<u32>>, Vec<u32>, Vec<String>) {
        let mut vocab = Vocabulary::default();
        let mut counts = Vec::new();
        let sets = read_words(texts, &mut vocab, &mut counts, cache, None);
        let words = (0..vocab.len() as u32)
            .map(|id| vocab.word(id).to_owned())
            .collect();
        (sets, counts, words)
    }

    #[test]
    fn lists_from_the_previous_turn_give_what_reading_gives() {
        let turn = [
            "Alpha beta ALPHA, Größe GRÖSSE alpha-beta 42 ΣΊΣΥΦΟΣ",
            "",
            "a-very-long-word-indeed: antidisestablishmentarianism Antidisestablishmentarianism beta",
            "Beta gamma delta 42 größe",
        ];
        let cache = Kept::default();
        assert_eq!(
            read_all(&turn, &cache),
            read_all(&turn, &crate::engine::NoCaches)
        );
        assert_eq!((*cache.hits.borrow(), *cache.inserts.borrow()), (0, 1));
        // The same history again finds its entry and adds none.
        assert_eq!(
            read_all(&turn, &cache),
            read_all(&turn, &crate::engine::NoCaches)
        );
        assert_eq!((*cache.hits.borrow(), *cache.inserts.borrow()), (1, 1));
        // The next turn: the history from the cache, then its own messages;
        // its entry replaces the earlier one.
        let next = [&turn[..], &["Delta epsilon, a new turn", "beta Alpha"]].concat();
        assert_eq!(
            read_all(&next, &cache),
            read_all(&next, &crate::engine::NoCaches)
        );
        assert_eq!((*cache.hits.borrow(), *cache.inserts.borrow()), (2, 2));
        assert_eq!(cache.entries.borrow().len(), 1);
        assert_eq!(cache.entries.borrow().values().next().unwrap().len(), 5);
        // A history that differs early (an edited message) shares nothing.
        let edited = [&["Alpha"][..], &next[1..]].concat();
        assert_eq!(
            read_all(&edited, &cache),
            read_all(&edited, &crate::engine::NoCaches)
        );
        assert_eq!(*cache.hits.borrow(), 2);
    }

    #[test]
    fn a_long_conversation_keeps_one_entry_that_grows_with_it() {
        let cache = Kept::default();
        let texts: Vec<String> = (0..40)
            .map(|i| {
                format!(
                    "turn {i} says Größe {} and a-very-long-word-number-{}",
                    i % 7,
                    i % 3
                )
            })
            .collect();
        for turn in 2..texts.len() {
            let history: Vec<&str> = texts[..turn].iter().map(String::as_str).collect();
            assert_eq!(
                read_all(&history, &cache),
                read_all(&history, &crate::engine::NoCaches)
            );
            let entries = cache.entries.borrow();
            assert_eq!(
                (entries.len(), entries.values().next().unwrap().len()),
                (1, turn - 1)
            );
        }
        // Each turn after the first found the one before.
        assert_eq!(*cache.hits.borrow(), texts.len() - 3);
    }

    #[test]
    fn an_entry_that_does_not_fit_its_history_is_not_read() {
        let cache = Kept::default();
        let turn = ["alpha beta", "gamma", "delta"];
        read_all(&turn, &cache);
        let (&key, entry) = cache
            .entries
            .borrow()
            .iter()
            .next()
            .map(|(k, v)| (k, v.clone()))
            .unwrap();
        assert!(entry.fits(2) && !entry.fits(3));
        // Another history whose key collided would find an entry of
        // another length, or sets naming words it does not have.
        let mut broken = HistoryWords::of(&Vocabulary::default(), &[], &[vec![], vec![]]);
        broken.sets = vec![7].into();
        assert!(!broken.fits(2));
        cache.entries.borrow_mut().insert(key, Arc::new(broken));
        assert_eq!(
            read_all(&turn, &cache),
            read_all(&turn, &crate::engine::NoCaches)
        );
    }
}
