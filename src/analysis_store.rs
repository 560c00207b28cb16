//! Relevance scoring's analyses and each history's words, kept between
//! turns so a new turn reads only its new messages. Apart from the
//! compaction cache and stable mode's checkpoints ([`crate::cache`]): a
//! compiled policy holds this store, and the checkpoints hold stable
//! mode's states, which read the policy.

use std::sync::{Arc, Mutex};

use moka::sync::Cache;
use rustc_hash::FxHashSet;

use crate::engine::relevance::{self, AnalysisCache, CachedAnalysis};
use crate::engine::word_lists::{HistoryWords, WordListCache};

/// Relevance scoring's per-message analyses (`scoring = "relevance"`) and
/// each history's words (what the drop score read, any scoring), keyed
/// by hashes of the message texts, shared by every policy of one
/// configuration: a new turn of a conversation analyses and reads only its
/// new messages. Each kind bounded in bytes by moka
/// (`cache.relevance_max_bytes`, `cache.word_lists_max_bytes`); emptied on
/// reload with the configuration that holds it. Only an accelerator: a
/// miss costs the analysis, never a different result.
///
/// A conversation's first turn is scored without analyses (counting from
/// the text is faster than analysing it) and its analyses are made after
/// the request, on tokio's blocking pool, at most one history per core at
/// a time: past that, a history goes uncached, as if evicted. Outside a
/// tokio runtime (benches, library use) they are made during the request.
/// Clones share the same entries.
#[derive(Clone)]
pub struct AnalysisStore {
    /// Keys are 128-bit hashes already: foldhash folds them in one
    /// multiply, where the default SipHash would hash them again. It is
    /// keyed at random, as the keys are hashes of client text: an unkeyed
    /// fold would let a client search out texts whose keys share a place.
    analyses: HistoryCache<CachedAnalysis>,
    /// What reading each history's words gave, for the drop score (every
    /// scoring), keyed by the chain of its messages' hashes
    /// (`cache.word_lists_max_bytes`).
    word_lists: HistoryCache<Arc<HistoryWords>>,
    /// The histories (by their last prefix key) being analysed after
    /// their request: one request scores its history several times (the
    /// agent passes, each token-budget round), and a history is filled
    /// once.
    filling: Arc<Mutex<FxHashSet<u128>>>,
}

/// Histories analysed after their request at once: one per core.
fn max_fills() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// Gives back a fill's slot however the fill ends.
struct FillSlot {
    filling: Arc<Mutex<FxHashSet<u128>>>,
    history: u128,
}

impl Drop for FillSlot {
    fn drop(&mut self) {
        lock(&self.filling).remove(&self.history);
    }
}

/// The set behind `filling`; a panic elsewhere cannot leave it unusable.
fn lock(filling: &Mutex<FxHashSet<u128>>) -> std::sync::MutexGuard<'_, FxHashSet<u128>> {
    filling
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A cache of entries about histories, keyed by their 128-bit keys, in
/// at most `max_bytes` (0: none).
type HistoryCache<V> = Option<Cache<u128, V, foldhash::fast::RandomState>>;

fn history_cache<V: Clone + Send + Sync + 'static>(
    max_bytes: u64,
    weigh: fn(&V) -> u32,
) -> HistoryCache<V> {
    (max_bytes > 0).then(|| {
        Cache::builder()
            .max_capacity(max_bytes)
            .weigher(move |_, v: &V| weigh(v))
            // An entry is read by its conversation's next turn, mostly
            // once: frequency-based admission would turn most away.
            .eviction_policy(moka::policy::EvictionPolicy::lru())
            .build_with_hasher(foldhash::fast::RandomState::default())
    })
}

/// Bytes a history cache holds now (after pending evictions run).
fn held<V: Clone + Send + Sync + 'static>(cache: &HistoryCache<V>) -> u64 {
    cache.as_ref().map_or(0, |c| {
        c.run_pending_tasks();
        c.weighted_size()
    })
}

impl AnalysisStore {
    pub fn new(max_bytes: u64) -> Self {
        AnalysisStore {
            analyses: history_cache(max_bytes, CachedAnalysis::weight),
            word_lists: None,
            filling: Arc::default(),
        }
    }

    /// Keeps histories' words too, in at most `max_bytes` (0: none).
    pub fn with_word_lists(mut self, max_bytes: u64) -> Self {
        self.word_lists = history_cache(max_bytes, |words: &Arc<HistoryWords>| words.weight());
        self
    }

    pub fn clear(&self) {
        if let Some(analyses) = &self.analyses {
            analyses.invalidate_all();
        }
        if let Some(lists) = &self.word_lists {
            lists.invalidate_all();
        }
    }

    /// Bytes the relevance analyses hold now (after pending evictions run).
    pub fn weighted_size(&self) -> u64 {
        held(&self.analyses)
    }

    /// Bytes the histories' words hold now (after pending evictions run).
    pub fn word_lists_weighted_size(&self) -> u64 {
        held(&self.word_lists)
    }
}

impl std::fmt::Debug for AnalysisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnalysisStore")
            .field("enabled", &self.analyses.is_some())
            .field("word_lists", &self.word_lists.is_some())
            .finish()
    }
}

impl WordListCache for AnalysisStore {
    fn word_lists_enabled(&self) -> bool {
        self.word_lists.is_some()
    }

    fn history_words(&self, key: u128) -> Option<Arc<HistoryWords>> {
        self.word_lists.as_ref()?.get(&key)
    }

    fn put_history_words(&self, key: u128, words: Arc<HistoryWords>) {
        if let Some(lists) = &self.word_lists {
            lists.insert(key, words);
        }
    }

    fn remove_history_words(&self, key: u128) {
        if let Some(lists) = &self.word_lists {
            lists.invalidate(&key);
        }
    }
}

impl AnalysisCache for AnalysisStore {
    fn enabled(&self) -> bool {
        self.analyses.is_some()
    }

    fn get(&self, key: u128) -> Option<CachedAnalysis> {
        self.analyses.as_ref()?.get(&key)
    }

    fn put(&self, key: u128, value: CachedAnalysis) {
        if let Some(analyses) = &self.analyses {
            analyses.insert(key, value);
        }
    }

    fn remove(&self, key: u128) {
        if let Some(analyses) = &self.analyses {
            analyses.invalidate(&key);
        }
    }

    fn fill_later(&self, history: u128, texts: &[&str]) -> bool {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return false;
        };
        if self.analyses.is_none() {
            return false;
        }
        {
            let mut filling = lock(&self.filling);
            // Already being filled, or every slot taken: nothing to spawn.
            if filling.contains(&history) || filling.len() >= max_fills() {
                return true;
            }
            filling.insert(history);
        }
        let slot = FillSlot {
            filling: self.filling.clone(),
            history,
        };
        let store = self.clone();
        let texts: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
        runtime.spawn_blocking(move || {
            let _slot = slot;
            let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
            relevance::fill(&texts, &store);
        });
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::relevance::Analysis;
    use crate::engine::{Message, Role};

    fn history() -> Vec<Message<'static>> {
        vec![
            Message::new(Role::User, "The gate code for depot Norrby is 7731-KAPPA."),
            Message::new(Role::Assistant, "Noted, the Norrby gate code."),
            Message::new(Role::User, "Which code opens the Norrby gate?"),
        ]
    }

    /// The history entry of all of `messages`, if the store holds it.
    fn history_entry(store: &AnalysisStore, messages: &[Message]) -> Option<usize> {
        let keys: Vec<u128> = messages
            .iter()
            .map(|m| relevance::message_key(&m.content))
            .collect();
        match store.get(*relevance::history_keys(&keys).last()?) {
            Some(CachedAnalysis::History(h)) => Some(h.len()),
            _ => None,
        }
    }

    #[test]
    fn a_first_turn_is_scored_from_the_text_and_analysed_after_it() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let _inside = runtime.enter();
        let store = AnalysisStore::new(1 << 20);
        let messages = history();
        let scored = relevance::analyze_cached(&messages, None, &store);
        assert_eq!(scored, relevance::analyze(&messages, None));
        // The fill runs on the blocking pool; wait for its slot to free.
        for _ in 0..10_000 {
            if lock(&store.filling).is_empty() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(history_entry(&store, &messages), Some(messages.len()));
        // The next turn finds it, and scores the same as without a store.
        let mut next = messages.clone();
        next.push(Message::new(Role::Assistant, "It is 7731-KAPPA."));
        next.push(Message::new(Role::User, "And the depot's name?"));
        assert_eq!(
            relevance::analyze_cached(&next, None, &store),
            relevance::analyze(&next, None)
        );
        assert_eq!(history_entry(&store, &next), Some(next.len()));
    }

    #[test]
    fn with_every_fill_slot_taken_a_first_turn_goes_uncached() {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        let _inside = runtime.enter();
        let store = AnalysisStore::new(1 << 20);
        lock(&store.filling).extend(0..max_fills() as u128);
        let messages = history();
        assert_eq!(
            relevance::analyze_cached(&messages, None, &store),
            relevance::analyze(&messages, None)
        );
        assert_eq!(lock(&store.filling).len(), max_fills());
        assert_eq!(store.weighted_size(), 0);
    }

    #[test]
    fn a_history_being_filled_is_not_filled_twice() {
        // One blocking thread, held busy: the first fill waits in the queue.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .max_blocking_threads(1)
            .build()
            .unwrap();
        let _inside = runtime.enter();
        let (release, held) = std::sync::mpsc::channel::<()>();
        runtime.spawn_blocking(move || held.recv());
        let store = AnalysisStore::new(1 << 20);
        let messages = history();
        // A request scores its history more than once.
        relevance::analyze_cached(&messages, None, &store);
        relevance::analyze_cached(&messages, None, &store);
        assert_eq!(lock(&store.filling).len(), 1);
        release.send(()).unwrap();
    }

    #[test]
    fn outside_a_runtime_a_first_turn_is_analysed_at_once() {
        let store = AnalysisStore::new(1 << 20);
        let messages = history();
        relevance::analyze_cached(&messages, None, &store);
        assert_eq!(history_entry(&store, &messages), Some(messages.len()));
    }
    #[test]
    fn analyses_stay_within_their_bytes_and_go_on_clear() {
        let store = AnalysisStore::new(64 * 1024);
        let analysis = CachedAnalysis::Message(Arc::new(Analysis::of(
            "the gate code for depot Norrby is 7731-KAPPA",
        )));
        for key in 0..20_000u128 {
            store.put(key, analysis.clone());
        }
        let held = store.weighted_size();
        assert!(held <= 64 * 1024 && held > 0, "{held}");
        store.put(u128::MAX, analysis.clone());
        assert_eq!(store.get(u128::MAX), Some(analysis));
        store.clear();
        assert_eq!(store.get(u128::MAX), None);
        assert!(!AnalysisStore::new(0).enabled());
    }

    #[test]
    fn word_lists_stay_within_their_bound_and_apart_from_analyses() {
        use crate::engine::{compact_cached, Policy};
        let store = AnalysisStore::new(1 << 20).with_word_lists(64 * 1024);
        assert!(!AnalysisStore::new(1 << 20).word_lists_enabled());
        for turn in 0..200 {
            let messages: Vec<Message> = (0..4)
                .map(|i| {
                    let words: String = (0..60).map(|w| format!("w{turn}x{i}x{w} ")).collect();
                    Message::new(Role::User, words)
                })
                .collect();
            compact_cached(&messages, &Policy::with_budget(100), &store);
        }
        let held = store.word_lists_weighted_size();
        assert!(held > 0 && held <= 64 * 1024, "{held}");
        // Seed scoring reads words, never relevance analyses.
        assert_eq!(store.weighted_size(), 0);
    }
}
