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

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use super::relevance::{history_keys, message_key, AnalysisCache, CachedAnalysis};
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
    fn of(vocab: &RunWords, counts: &[u32], sets: &[Vec<u32>]) -> Self {
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
        self.intern_words(vocab, |_, _| {});
        self.restore_lists(counts, sets);
    }

    /// Interns the words it holds into `vocab`, in their order; `each` is
    /// given every word's id there as it comes.
    fn intern_words(&self, vocab: &mut Vocabulary, mut each: impl FnMut(&Vocabulary, u32)) {
        let mut long_start = 0;
        let mut long_ends = self.long_ends.iter();
        for &key in self.words.iter() {
            let id = match key {
                0 => {
                    let end = long_ends.next().map_or(self.long.len(), |&e| e as usize);
                    let word = self.long.get(long_start..end).unwrap_or_default();
                    long_start = end;
                    vocab.intern_long(word)
                }
                key => vocab.intern_packed(key),
            };
            each(vocab, id);
        }
    }

    /// Puts the counts and sets back (into empty ones), their ids those
    /// of the restored vocabulary.
    fn restore_lists(&self, counts: &mut Vec<u32>, sets: &mut Vec<Vec<u32>>) {
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
    /// The words of texts earlier engine runs of this compaction read
    /// ([`TextWords`]), when it keeps them; `None`: every run reads its
    /// texts.
    fn text_words(&self) -> Option<&RefCell<TextWords>> {
        None
    }
}

/// What reading each text gave, kept for one compaction's later engine
/// runs: stable mode's replay runs the engine on form after form (each
/// re-compaction, each of its tries), and every form holds most of the
/// texts of the one before. The texts' words are interned once, in a
/// vocabulary of its own; a text's entry is its distinct words (ids there)
/// in the order first seen, with their occurrences. A run's own vocabulary
/// takes each word from it the first time the run meets it, by id (an
/// array read, no hashing and no scan), in the order its texts name them:
/// which gives every word the id, and every count, that reading the texts
/// would.
#[derive(Default)]
pub struct TextWords {
    /// Every word of the texts read.
    vocab: Vocabulary,
    /// By [`message_key`] of the text: its words' range in `ids` and
    /// `counts`.
    texts: HashMap<u128, (u32, u32), foldhash::fast::RandomState>,
    /// Each text's distinct words, end to end, by id in `vocab`.
    ids: Vec<u32>,
    /// Each word's occurrences in its text.
    counts: Vec<u32>,
    /// The run's id of each word of `vocab`, valid when stamped with the
    /// current run.
    run_ids: Vec<(u32, u32)>,
    run: u32,
    /// Reads new texts into `vocab`.
    reader: Reader,
    /// Each word's occurrences in the text being read, by id (zeros
    /// between texts).
    occurrences: Vec<u32>,
}

/// Words of texts a [`TextWords`] holds at most, 8 bytes each: past it,
/// new texts are read every run (a body of several megabytes).
const TEXT_WORDS_MAX: usize = 1 << 21;

impl TextWords {
    /// Starts a run: its vocabulary is empty.
    fn begin(&mut self) {
        self.run = self.run.wrapping_add(1);
        if self.run == 0 {
            // After 2^32 runs, stale stamps could match again.
            self.run_ids.fill((0, 0));
            self.run = 1;
        }
    }

    /// The word set of `text` (keyed `key`) in the run's `vocab`, its
    /// words' occurrences added to `counts` (grown to at least the
    /// vocabulary's length); read and kept unless kept already.
    fn read(
        &mut self,
        text: &str,
        key: u128,
        vocab: &mut Vec<u32>,
        counts: &mut Vec<u32>,
    ) -> Vec<u32> {
        let (start, end) = match self.texts.get(&key) {
            Some(&(start, end)) => (start as usize, end as usize),
            None => self.keep(text, key),
        };
        let words = self.ids.get(start..end).unwrap_or_default();
        let occurrences = self.counts.get(start..end).unwrap_or_default();
        // Room for every word to be new to the run: no check per word.
        if counts.len() < vocab.len() + words.len() {
            counts.resize(vocab.len() + words.len(), 0);
        }
        self.run_ids.resize(self.vocab.len(), (0, 0));
        let mut set = Vec::with_capacity(words.len());
        for (&word, &n) in words.iter().zip(occurrences) {
            let id = run_id(&mut self.run_ids, self.run, word, vocab);
            counts[id as usize] += n;
            set.push(id);
        }
        // Past the bound, what was read is not kept.
        if self.ids.len() > TEXT_WORDS_MAX {
            self.ids.truncate(start);
            self.counts.truncate(start);
            self.texts.remove(&key);
        }
        set
    }

    /// Reads `text` into the kept vocabulary and keeps its words under
    /// `key`; their range in `ids` and `counts`.
    #[cold]
    fn keep(&mut self, text: &str, key: u128) -> (usize, usize) {
        let set = self
            .reader
            .read(text, &mut self.vocab, &mut self.occurrences);
        let start = self.ids.len();
        for &id in &set {
            self.ids.push(id);
            self.counts
                .push(std::mem::take(&mut self.occurrences[id as usize]));
        }
        self.texts
            .insert(key, (start as u32, self.ids.len() as u32));
        (start, self.ids.len())
    }

    /// [`HistoryWords::restore`] into the run's empty `vocab`, its words
    /// found in (or added to) the kept vocabulary; `false` (and nothing
    /// restored) when `found` names a word twice, as only a broken entry
    /// could.
    fn restore(
        &mut self,
        found: &HistoryWords,
        vocab: &mut Vec<u32>,
        counts: &mut Vec<u32>,
        sets: &mut Vec<Vec<u32>>,
    ) -> bool {
        let TextWords {
            vocab: kept,
            run_ids,
            run,
            ..
        } = self;
        found.intern_words(kept, |kept, id| {
            run_ids.resize(kept.len(), (0, 0));
            run_id(run_ids, *run, id, vocab);
        });
        if vocab.len() != found.words.len() {
            return false;
        }
        found.restore_lists(counts, sets);
        true
    }
}

/// The run's id of word `id` of the kept vocabulary, appended to the
/// run's `vocab` (the kept ids of its words, by run id) the first time the
/// run meets it (`run_ids` stamps each word with the run that took it).
fn run_id(run_ids: &mut [(u32, u32)], run: u32, id: u32, vocab: &mut Vec<u32>) -> u32 {
    let slot = &mut run_ids[id as usize];
    if slot.0 != run {
        *slot = (run, vocab.len() as u32);
        vocab.push(id);
    }
    slot.1
}

/// A run's vocabulary, by the run's ids (given in the order the run first
/// meets each word, whichever way it reads): words of its own, or, beside
/// a [`TextWords`], each word's id in the kept vocabulary, so that no run
/// copies a word the replay's earlier runs read.
pub(super) enum RunVocabulary {
    Own(Vocabulary),
    Kept(Vec<u32>),
}

impl RunVocabulary {
    /// Its words, a [`RunVocabulary::Kept`] one's read in `memo` (the
    /// [`TextWords`] the run read through).
    pub fn words<'a>(&'a self, memo: Option<&'a TextWords>) -> RunWords<'a> {
        match self {
            RunVocabulary::Own(vocab) => RunWords::Own(vocab),
            RunVocabulary::Kept(ids) => RunWords::Kept(ids, memo.map(|m| &m.vocab)),
        }
    }
}

/// A run's words by its ids ([`RunVocabulary::words`]).
pub(super) enum RunWords<'a> {
    Own(&'a Vocabulary),
    /// The kept ids by run id, and the vocabulary they name (always there:
    /// without it, no word).
    Kept(&'a [u32], Option<&'a Vocabulary>),
}

impl RunWords<'_> {
    pub fn len(&self) -> usize {
        match self {
            RunWords::Own(vocab) => vocab.len(),
            RunWords::Kept(ids, _) => ids.len(),
        }
    }

    /// Where run id `id` lies in the vocabulary that holds it.
    fn at(&self, id: u32) -> Option<(&Vocabulary, u32)> {
        match *self {
            RunWords::Own(vocab) => Some((vocab, id)),
            RunWords::Kept(ids, kept) => Some((kept?, *ids.get(id as usize)?)),
        }
    }

    pub fn word(&self, id: u32) -> &str {
        self.at(id).map_or("", |(vocab, id)| vocab.word(id))
    }

    pub fn word_chars(&self, id: u32) -> usize {
        self.at(id).map_or(0, |(vocab, id)| vocab.word_chars(id))
    }

    fn packed(&self, id: u32) -> u128 {
        self.at(id).map_or(0, |(vocab, id)| vocab.packed(id))
    }
}

/// Caches with a [`TextWords`] of one compaction beside them: what the
/// engine runs of one request share.
pub struct WithTextWords<'a, C: ?Sized> {
    caches: &'a C,
    words: RefCell<TextWords>,
}

impl<'a, C: ?Sized> WithTextWords<'a, C> {
    pub fn new(caches: &'a C) -> Self {
        WithTextWords {
            caches,
            words: RefCell::default(),
        }
    }
}

impl<C: WordListCache + ?Sized> WordListCache for WithTextWords<'_, C> {
    fn word_lists_enabled(&self) -> bool {
        self.caches.word_lists_enabled()
    }
    fn history_words(&self, key: u128) -> Option<Arc<HistoryWords>> {
        self.caches.history_words(key)
    }
    fn put_history_words(&self, key: u128, words: Arc<HistoryWords>) {
        self.caches.put_history_words(key, words)
    }
    fn remove_history_words(&self, key: u128) {
        self.caches.remove_history_words(key)
    }
    fn text_words(&self) -> Option<&RefCell<TextWords>> {
        Some(&self.words)
    }
}

impl<C: AnalysisCache + ?Sized> AnalysisCache for WithTextWords<'_, C> {
    fn enabled(&self) -> bool {
        self.caches.enabled()
    }
    fn get(&self, key: u128) -> Option<CachedAnalysis> {
        self.caches.get(key)
    }
    fn put(&self, key: u128, value: CachedAnalysis) {
        self.caches.put(key, value)
    }
    fn remove(&self, key: u128) {
        self.caches.remove(key)
    }
    fn fill_later(&self, history: u128, texts: &[&str]) -> bool {
        self.caches.fill_later(history, texts)
    }
}

/// The word set of each of `texts` (its distinct ids in the order first
/// seen), read through `cache`, the run's vocabulary, and each word's
/// occurrences in `counts` (as long as the vocabulary).
pub(super) fn read_words(
    texts: &[&str],
    counts: &mut Vec<u32>,
    cache: &dyn WordListCache,
    keys: Option<&[u128]>,
) -> (RunVocabulary, Vec<Vec<u32>>) {
    let mut sets: Vec<Vec<u32>> = Vec::with_capacity(texts.len());
    let mut memo = cache.text_words().map(RefCell::borrow_mut);
    let lists = cache.word_lists_enabled() && texts.len() >= 2;
    // Each text's key, when a cache reads by it: the keys relevance's
    // analyses use (given by the caller when it hashed the texts already),
    // so the same key names a history's words here and its analyses there.
    let keys: Vec<u128> = match keys {
        _ if !lists && memo.is_none() => Vec::new(),
        Some(keys) => keys.to_vec(),
        None => texts.iter().map(|t| message_key(t)).collect(),
    };
    // Varied English text brings a new word every 60 to 100 bytes.
    let bytes: usize = texts.iter().map(|t| t.len()).sum();
    let mut run = match memo.as_deref_mut() {
        Some(memo) => {
            if memo.vocab.is_empty() {
                // The first run reads most of the texts' words: no rehash
                // while they come in.
                memo.vocab = Vocabulary::with_capacity(bytes / 32);
                memo.ids.reserve(bytes / 8);
                memo.counts.reserve(bytes / 8);
                memo.texts.reserve(texts.len());
            }
            memo.begin();
            Run::Kept(memo, Vec::with_capacity(bytes / 64))
        }
        None => Run::Own(Reader::default(), Vocabulary::with_capacity(bytes / 64)),
    };
    if !lists {
        for (i, text) in texts.iter().enumerate() {
            sets.push(run.read(text, keys.get(i), counts));
        }
        counts.resize(run.len(), 0);
        return (run.into_vocabulary(), sets);
    }
    // An entry holds a history's messages but the last, the one a client
    // most often changes (a new question, a retry): the next turn extends
    // the rest, and a retry changes only the last.
    let stem = texts.len() - 1;
    let prefixes = history_keys(&keys[..stem]);
    let earlier = (stem.saturating_sub(HISTORY_PROBES)..stem)
        .rev()
        .find_map(|k| {
            let found = cache.history_words(prefixes[k])?;
            found.fits(k + 1).then_some((found, k))
        });
    if let Some((found, _)) = &earlier {
        run.restore(found, counts, &mut sets);
    }
    for (i, text) in texts.iter().enumerate().take(stem).skip(sets.len()) {
        sets.push(run.read(text, keys.get(i), counts));
    }
    match earlier {
        // The same stem again (a retry, another pass of this request, or a
        // new last message): its entry is there.
        Some((_, k)) if k + 1 == stem => {}
        found => {
            cache.put_history_words(
                prefixes[stem - 1],
                Arc::new(HistoryWords::of(&run.words(), counts, &sets)),
            );
            if let Some((_, k)) = found {
                cache.remove_history_words(prefixes[k]);
            }
        }
    }
    sets.push(run.read(texts[stem], keys.get(stem), counts));
    counts.resize(run.len(), 0);
    (run.into_vocabulary(), sets)
}

/// How one run reads: through the replay's [`TextWords`] into the kept ids
/// of its words, or alone into a vocabulary of its own.
enum Run<'m> {
    Kept(&'m mut TextWords, Vec<u32>),
    Own(Reader, Vocabulary),
}

impl Run<'_> {
    /// The word set of `text` (keyed `key`, when the run reads by key), its
    /// occurrences added to `counts`.
    fn read(&mut self, text: &str, key: Option<&u128>, counts: &mut Vec<u32>) -> Vec<u32> {
        match self {
            Run::Kept(memo, ids) => memo.read(text, key.copied().unwrap_or_default(), ids, counts),
            Run::Own(reader, vocab) => reader.read(text, vocab, counts),
        }
    }

    /// Puts `found` back into the run's empty vocabulary, `counts` and
    /// `sets`; a broken entry leaves them empty.
    fn restore(&mut self, found: &HistoryWords, counts: &mut Vec<u32>, sets: &mut Vec<Vec<u32>>) {
        match self {
            Run::Kept(memo, ids) => {
                if !memo.restore(found, ids, counts, sets) {
                    // A broken entry: the texts are read instead, in a run
                    // of their own.
                    ids.clear();
                    memo.begin();
                }
            }
            Run::Own(_, vocab) => found.restore(vocab, counts, sets),
        }
    }

    fn len(&self) -> usize {
        match self {
            Run::Kept(_, ids) => ids.len(),
            Run::Own(_, vocab) => vocab.len(),
        }
    }

    fn words(&self) -> RunWords<'_> {
        match self {
            Run::Kept(memo, ids) => RunWords::Kept(ids, Some(&memo.vocab)),
            Run::Own(_, vocab) => RunWords::Own(vocab),
        }
    }

    fn into_vocabulary(self) -> RunVocabulary {
        match self {
            Run::Kept(_, ids) => RunVocabulary::Kept(ids),
            Run::Own(_, vocab) => RunVocabulary::Own(vocab),
        }
    }
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
        let mut counts = Vec::new();
        let (vocab, sets) = read_words(texts, &mut counts, cache, None);
        let memo = cache.text_words().map(RefCell::borrow);
        let vocab = vocab.words(memo.as_deref());
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

    /// Runs over forms that share texts, as a replay's re-compactions do:
    /// each run reads through one kept [`TextWords`] what it reads alone.
    fn runs_agree(texts: &[String], forms: &[Vec<usize>]) {
        for history in [false, true] {
            let lists = Kept::default();
            let nothing = crate::engine::NoCaches;
            let inner: &dyn WordListCache = if history { &lists } else { &nothing };
            let kept = WithTextWords::new(inner);
            for form in forms {
                let form: Vec<&str> = form.iter().map(|&i| texts[i].as_str()).collect();
                assert_eq!(
                    read_all(&form, &kept),
                    read_all(&form, &crate::engine::NoCaches),
                    "{form:?}"
                );
            }
            let memo = kept.words.borrow();
            assert!(memo.texts.len() <= texts.len());
        }
    }

    #[test]
    fn texts_kept_from_an_earlier_run_give_what_reading_gives() {
        let texts: Vec<String> = [
            "Alpha beta ALPHA, Größe GRÖSSE alpha-beta 42 ΣΊΣΥΦΟΣ",
            "",
            "a-very-long-word-indeed: antidisestablishmentarianism Antidisestablishmentarianism beta",
            "Beta gamma delta 42 größe supercalifragilisticexpialidocious",
            "delta delta delta 日本語テキスト abc日本",
            "gamma",
        ]
        .map(String::from)
        .to_vec();
        // A form, the next with some dropped and new ones, a retry, one
        // in another order (new words first), and a lone text.
        let forms = [
            vec![0, 1, 2, 3],
            vec![0, 2, 3, 4, 5],
            vec![0, 2, 3, 4, 5],
            vec![5, 4, 3, 2, 1, 0],
            vec![2],
        ];
        runs_agree(&texts, &forms);
        // The runs after the first read no text twice.
        let kept = WithTextWords::new(&crate::engine::NoCaches);
        for form in &forms {
            let form: Vec<&str> = form.iter().map(|&i| texts[i].as_str()).collect();
            read_all(&form, &kept);
        }
        assert_eq!(kept.words.borrow().texts.len(), texts.len());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        #[test]
        fn runs_through_kept_texts_read_what_reading_reads(
            texts in proptest::collection::vec("[a-cA-C0-9 ,é日Σ]{0,12}|[a-z]{15,20}( [a-z]{1,3}){0,3}", 1..8),
            forms in proptest::collection::vec(proptest::collection::vec(0usize..8, 0..10), 1..5),
        ) {
            let forms: Vec<Vec<usize>> = forms
                .into_iter()
                .map(|f| f.into_iter().map(|i| i % texts.len()).collect())
                .collect();
            runs_agree(&texts, &forms);
        }
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
        let mut broken = HistoryWords::of(
            &RunWords::Own(&Vocabulary::default()),
            &[],
            &[vec![], vec![]],
        );
        broken.sets = vec![7].into();
        assert!(!broken.fits(2));
        cache.entries.borrow_mut().insert(key, Arc::new(broken));
        assert_eq!(
            read_all(&turn, &cache),
            read_all(&turn, &crate::engine::NoCaches)
        );
    }
}
