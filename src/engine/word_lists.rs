//! Each message's words, kept across requests.
//!
//! Every turn of a conversation sends its whole history again, and the
//! drop score reads every message's words on every request: for a 200 KB
//! history, finding and interning its words is two fifths of a compaction.
//! A message's [`WordList`] (its distinct words in the order first seen,
//! each with its count) is all that reading gives, so lists kept from an
//! earlier turn stand in for reading the texts again; only interning the
//! distinct words into the run's [`Vocabulary`] is left.
//!
//! Lists are kept per history, not per message: one cache entry holds the
//! lists of a request's messages ([`HistoryWords`]), keyed by the chain of
//! its messages' hashes, and the next turn finds it with a lookup or two
//! (its history is the earlier one plus a few messages). A request whose
//! history nothing holds pays one insert, not one per message.
//!
//! A cache is only an accelerator: interning a list's words in its order
//! gives every word the id that reading the text would (ids go to words in
//! the order first seen), so the report is the same with a cache or none.

use std::sync::Arc;

use xxhash_rust::xxh3::xxh3_128;

use super::text::{Vocabulary, WordSets};

/// How far back from a history's end its earlier turn is looked for: a
/// turn adds a user message, the answer and, in an agent loop, a few tool
/// calls and results.
const HISTORY_PROBES: usize = 8;

/// Bumped when what a list holds changes, so no stale list is ever read.
const WORD_LIST_VERSION: u64 = 1;

/// One message's words: each distinct word in the order first seen, with
/// how often it occurs. 20 bytes a word (a 1 KB message has about 100
/// distinct words), plus the text of words too long to pack.
#[derive(Debug, PartialEq, Eq)]
pub struct WordList {
    /// Each word packed ([`Vocabulary::packed`]), or 0 for the next of
    /// `long` (no word packs to 0: words are not empty).
    keys: Box<[u128]>,
    counts: Box<[u32]>,
    long: Box<[Box<str>]>,
}

impl WordList {
    /// The list of a message whose word ids (in order, repeats included)
    /// are `ids`, with `set` their distinct ids in the order first seen.
    fn of(ids: &[u32], set: &[u32], vocab: &Vocabulary, tally: &mut Vec<u32>) -> Self {
        if tally.len() < vocab.len() {
            tally.resize(vocab.len(), 0);
        }
        for &id in ids {
            tally[id as usize] += 1;
        }
        let keys: Box<[u128]> = set.iter().map(|&id| vocab.packed(id)).collect();
        let counts = set
            .iter()
            .map(|&id| std::mem::take(&mut tally[id as usize]))
            .collect();
        let long = set
            .iter()
            .zip(&keys)
            .filter(|(_, &key)| key == 0)
            .map(|(&id, _)| vocab.word(id).into())
            .collect();
        WordList { keys, counts, long }
    }

    /// Interns the words in order into `vocab`, calling `each` with each
    /// one's id and count.
    fn intern(&self, vocab: &mut Vocabulary, mut each: impl FnMut(u32, u32)) {
        let mut long = self.long.iter();
        for (&key, &count) in self.keys.iter().zip(self.counts.iter()) {
            let id = match key {
                0 => vocab.intern_long(long.next().map_or("", |w| w)),
                key => vocab.intern_packed(key),
            };
            each(id, count);
        }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Bytes the list holds, for a cache's weigher.
    pub fn weight(&self) -> u32 {
        let long: usize = self
            .long
            .iter()
            .map(|w| std::mem::size_of::<Box<str>>() + w.len())
            .sum();
        let bytes = std::mem::size_of::<Self>() + self.keys.len() * (16 + 4) + long;
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// The hash of a message's text, chained into its history's key.
fn message_key(text: &str) -> u128 {
    xxh3_128(text.as_bytes()) ^ u128::from(WORD_LIST_VERSION) << 64
}

/// The word lists of a history's messages, in order.
#[derive(Debug)]
pub struct HistoryWords {
    lists: Box<[Arc<WordList>]>,
    weight: u32,
}

impl HistoryWords {
    fn new(lists: Vec<Arc<WordList>>) -> Self {
        let weight = lists
            .iter()
            .map(|l| u64::from(l.weight()) + std::mem::size_of::<Arc<WordList>>() as u64)
            .sum::<u64>()
            + std::mem::size_of::<Self>() as u64;
        HistoryWords {
            lists: lists.into(),
            weight: u32::try_from(weight).unwrap_or(u32::MAX),
        }
    }

    pub fn len(&self) -> usize {
        self.lists.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lists.is_empty()
    }

    /// Bytes the entry holds, for a cache's weigher (a list shared with
    /// another history counts in both).
    pub fn weight(&self) -> u32 {
        self.weight
    }
}

/// Where word lists of earlier requests' histories are kept, by the key of
/// the history ([`super::relevance::history_keys`] over its messages'
/// hashes).
pub trait WordListCache {
    /// Whether lookups can hit: without a cache, texts are not hashed.
    fn word_lists_enabled(&self) -> bool;
    fn history_words(&self, key: u128) -> Option<Arc<HistoryWords>>;
    fn put_history_words(&self, key: u128, words: Arc<HistoryWords>);
    /// Drops an entry: the previous turn's, once the new turn's holds its
    /// lists, so the bound does not count them twice.
    fn remove_history_words(&self, key: u128);
}

/// No cache: every message is read on every request.
pub struct NoWordLists;

impl WordListCache for NoWordLists {
    fn word_lists_enabled(&self) -> bool {
        false
    }
    fn history_words(&self, _: u128) -> Option<Arc<HistoryWords>> {
        None
    }
    fn put_history_words(&self, _: u128, _: Arc<HistoryWords>) {}
    fn remove_history_words(&self, _: u128) {}
}

/// The word set of each of `texts` (its distinct ids in the order first
/// seen), read into `vocab` through `cache`, with each word's occurrences
/// in `counts` (as long as the vocabulary).
pub(super) fn read_words(
    texts: &[&str],
    vocab: &mut Vocabulary,
    counts: &mut Vec<u32>,
    cache: &dyn WordListCache,
) -> Vec<Vec<u32>> {
    let mut sets = Vec::with_capacity(texts.len());
    if !cache.word_lists_enabled() || texts.is_empty() {
        let mut reader = Reader::default();
        for text in texts {
            sets.push(reader.read(text, vocab, counts, false).0);
        }
        counts.resize(vocab.len(), 0);
        return sets;
    }
    // The entry of a history holds all its messages but the last, the
    // one a client most often changes (a new question, a retry): the next
    // turn extends the rest, and a retry changes only the last.
    let stem = texts.len() - 1;
    let keys: Vec<u128> = texts[..stem].iter().map(|t| message_key(t)).collect();
    let prefixes = super::relevance::history_keys(&keys);
    let earlier = (stem.saturating_sub(HISTORY_PROBES)..stem)
        .rev()
        .find_map(|k| {
            let found = cache.history_words(prefixes[k])?;
            // A hash collision must not panic: the length must fit.
            (found.len() == k + 1).then_some((found, k))
        });
    let mut lists = Vec::with_capacity(stem);
    if let Some((found, _)) = &earlier {
        for list in found.lists.iter() {
            let mut set = Vec::with_capacity(list.len());
            list.intern(vocab, |id, count| {
                if counts.len() <= id as usize {
                    counts.resize(id as usize + 1, 0);
                }
                counts[id as usize] += count;
                set.push(id);
            });
            sets.push(set);
            lists.push(list.clone());
        }
    }
    let mut reader = Reader::default();
    for (i, text) in texts.iter().enumerate().skip(lists.len()) {
        let (set, list) = reader.read(text, vocab, counts, i < stem);
        sets.push(set);
        lists.extend(list.map(Arc::new));
    }
    counts.resize(vocab.len(), 0);
    match earlier {
        // The same stem again (a retry, another pass of this request, or a
        // new last message): its entry is there.
        Some((_, k)) if k + 1 == stem => {}
        _ if stem == 0 => {}
        found => {
            cache.put_history_words(prefixes[stem - 1], Arc::new(HistoryWords::new(lists)));
            if let Some((_, k)) = found {
                cache.remove_history_words(prefixes[k]);
            }
        }
    }
    sets
}

/// Reads texts' words, reusing its buffers from one text to the next.
#[derive(Default)]
struct Reader {
    ids: Vec<u32>,
    sets: WordSets,
    /// Per-word counts of one text, zero between texts.
    tally: Vec<u32>,
}

impl Reader {
    /// The word set of `text` with its occurrences added to `counts`, and
    /// its word list when `keep`.
    fn read(
        &mut self,
        text: &str,
        vocab: &mut Vocabulary,
        counts: &mut Vec<u32>,
        keep: bool,
    ) -> (Vec<u32>, Option<WordList>) {
        self.ids.clear();
        vocab.words_of(text, &mut self.ids);
        counts.resize(vocab.len(), 0);
        for &id in &self.ids {
            counts[id as usize] += 1;
        }
        let set = self.sets.of(&self.ids, vocab.len());
        let list = keep.then(|| WordList::of(&self.ids, &set, vocab, &mut self.tally));
        (set, list)
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
        let sets = read_words(texts, &mut vocab, &mut counts, cache);
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
        assert_eq!(read_all(&turn, &cache), read_all(&turn, &NoWordLists));
        assert_eq!((*cache.hits.borrow(), *cache.inserts.borrow()), (0, 1));
        // The same history again finds its entry and adds none.
        assert_eq!(read_all(&turn, &cache), read_all(&turn, &NoWordLists));
        assert_eq!((*cache.hits.borrow(), *cache.inserts.borrow()), (1, 1));
        // The next turn: the history from the cache, then its own messages;
        // its entry replaces the earlier one.
        let next = [&turn[..], &["Delta epsilon, a new turn", "beta Alpha"]].concat();
        assert_eq!(read_all(&next, &cache), read_all(&next, &NoWordLists));
        assert_eq!((*cache.hits.borrow(), *cache.inserts.borrow()), (2, 2));
        assert_eq!(cache.entries.borrow().len(), 1);
        assert_eq!(cache.entries.borrow().values().next().unwrap().len(), 5);
        // A history that differs early (an edited message) shares nothing.
        let edited = [&["Alpha"][..], &next[1..]].concat();
        assert_eq!(read_all(&edited, &cache), read_all(&edited, &NoWordLists));
        assert_eq!(*cache.hits.borrow(), 2);
    }

    #[test]
    fn a_list_weighs_its_entries_and_long_words() {
        let mut vocab = Vocabulary::default();
        let mut ids = Vec::new();
        vocab.words_of("tiny tiny supercalifragilisticexpialidocious", &mut ids);
        let set = WordSets::new().of(&ids, vocab.len());
        let list = WordList::of(&ids, &set, &vocab, &mut Vec::new());
        let long = "supercalifragilisticexpialidocious";
        let mut fresh = Vocabulary::default();
        let mut read = Vec::new();
        list.intern(&mut fresh, |id, count| read.push((id, count)));
        assert_eq!(read, [(0, 2), (1, 1)]);
        assert_eq!((fresh.word(0), fresh.word(1)), ("tiny", long));
        assert_eq!(
            list.weight() as usize,
            std::mem::size_of::<WordList>() + 2 * 20 + std::mem::size_of::<Box<str>>() + long.len()
        );
    }
}
