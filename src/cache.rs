//! The compaction cache: a repeated request body under the same policy
//! (client retries, parallel samples, replays) is answered without running
//! the engine again. Bounded in bytes by moka; emptied on config reload.
//! Keys carry the compiled policy's id, not its name, so a request still
//! running under the old configuration cannot leave an outcome that a
//! request under the new one would pick up.
//!
//! Entries are keyed by a hash but hold the input too, and a hit is only
//! used when the input is byte-equal: a hash collision must never forward
//! another conversation's messages.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use moka::sync::Cache;
use rustc_hash::FxHashSet;

use crate::compaction::stable::{Checkpoints, ReplayState};
use crate::engine::relevance::{self, AnalysisCache, CachedAnalysis};
use crate::engine::word_lists::{HistoryWords, WordListCache};
use crate::format::Format;
pub use crate::outcome::Outcome;

#[derive(Debug)]
struct Entry {
    input: Bytes,
    outcome: Arc<Outcome>,
}

/// A body's place in the [`CompactionCache`], computed once per request
/// for both the lookup and the insert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheKey(u64);

/// How much of each end of a long body its cache key reads.
pub const KEY_EDGE_BYTES: usize = 4 * 1024;

/// Slots of the table of bodies seen once ([`CompactionCache::insert`]).
const SEEN_ONCE_SLOTS: usize = 4096;

pub struct CompactionCache {
    entries: Option<Cache<u64, Arc<Entry>>>,
    /// Keys of bodies forwarded as they came but not kept, one per slot
    /// (the key's low bits): a later body with the same key replaces one.
    seen_once: Box<[AtomicU64]>,
}

impl CompactionCache {
    pub fn new(max_bytes: u64) -> Self {
        let entries = (max_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, e: &Arc<Entry>| {
                    let bytes = e.input.len() + e.outcome.rewritten.as_ref().map_or(0, Bytes::len);
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .build()
        });
        CompactionCache {
            entries,
            seen_once: (0..SEEN_ONCE_SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The key of `input` in `format` under the policy with id `policy`.
    /// The key only locates an entry: [`Self::get`] compares the whole
    /// input, so a collision costs a miss, never another body's outcome.
    /// A long body is keyed by its length and its first and last
    /// [`KEY_EDGE_BYTES`], where the turns of a conversation differ (new
    /// messages at the end, other settings at the start): a hit then reads
    /// the body once (the compare), not twice. xxh3: SipHash reads at a
    /// tenth of its speed.
    pub fn key(policy: u64, format: Format, input: &[u8]) -> CacheKey {
        let seed = policy.rotate_left(8) ^ format as u64;
        if input.len() <= 2 * KEY_EDGE_BYTES {
            return CacheKey(xxhash_rust::xxh3::xxh3_64_with_seed(input, seed));
        }
        let mut hasher = xxhash_rust::xxh3::Xxh3::with_seed(seed);
        hasher.update(&(input.len() as u64).to_le_bytes());
        hasher.update(&input[..KEY_EDGE_BYTES]);
        hasher.update(&input[input.len() - KEY_EDGE_BYTES..]);
        CacheKey(hasher.digest())
    }

    /// The outcome cached for `input` under `key` (from [`Self::key`]).
    pub fn get(&self, key: CacheKey, input: &[u8]) -> Option<Arc<Outcome>> {
        let entry = self.entries.as_ref()?.get(&key.0)?;
        (entry.input.as_ref() == input).then(|| entry.outcome.clone())
    }

    /// Keeps `outcome` for `input`. A compaction is kept at once. A body
    /// forwarded as it came (it fit) is kept only when seen a second time:
    /// deciding it again costs just a parse, most such bodies never come
    /// back (each turn of a conversation is a new body), and keeping every
    /// one cost a copy and an eviction per request, a fifth of the CPU of
    /// a new 20 KB request. Keeps its own copy of `input`: a request body
    /// is often a slice of a larger buffer (hyper's read buffer), which an
    /// entry weighed by the body's length must not hold on to.
    pub fn insert(&self, key: CacheKey, input: &[u8], outcome: Arc<Outcome>) {
        let Some(entries) = &self.entries else { return };
        if outcome.rewritten.is_none() {
            let slot = &self.seen_once[key.0 as usize % SEEN_ONCE_SLOTS];
            if slot.swap(key.0, Ordering::Relaxed) != key.0 {
                return;
            }
        }
        let input = Bytes::copy_from_slice(input);
        entries.insert(key.0, Arc::new(Entry { input, outcome }));
    }

    pub fn clear(&self) {
        if let Some(entries) = &self.entries {
            entries.invalidate_all();
        }
    }
}

/// Stable mode's replay checkpoints: the state at the end of each recent
/// request, so the next turn of the same conversation only replays its new
/// items. Bounded in bytes by moka; an evicted checkpoint only costs a
/// longer replay, never a different result.
pub struct CheckpointStore {
    states: Option<Cache<u128, Arc<ReplayState>>>,
}

impl CheckpointStore {
    pub fn new(max_bytes: u64) -> Self {
        let states = (max_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, s: &Arc<ReplayState>| s.weight())
                .build()
        });
        CheckpointStore { states }
    }

    pub fn clear(&self) {
        if let Some(states) = &self.states {
            states.invalidate_all();
        }
    }

    /// Bytes held now (after pending evictions run).
    pub fn weighted_size(&self) -> u64 {
        self.states.as_ref().map_or(0, |s| {
            s.run_pending_tasks();
            s.weighted_size()
        })
    }
}

impl Checkpoints for CheckpointStore {
    fn get(&self, key: u128) -> Option<Arc<ReplayState>> {
        self.states.as_ref()?.get(&key)
    }

    fn put(&self, key: u128, state: Arc<ReplayState>) {
        if let Some(states) = &self.states {
            states.insert(key, state);
        }
    }

    fn keeps(&self) -> bool {
        self.states.is_some()
    }
}

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
    use crate::outcome::LossSummary;

    fn history() -> Vec<Message> {
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

    fn outcome() -> Arc<Outcome> {
        Arc::new(Outcome {
            loss: LossSummary {
                input_chars: 2,
                output_chars: 1,
                input_messages: 2,
                output_messages: 1,
                dropped_messages: 1,
                trimmed_messages: 0,
                deduped_messages: 0,
                retained_ratio: 0.5,
                budget_met: true,
                pruned_chars: 0,
                clipped_chars: 0,
                deduped_tool_chars: 0,
                stripped_thinking: 0,
                input_tokens: None,
                budget_tokens: None,
                output_tokens: None,
            },
            rewritten: Some(Bytes::from_static(b"{}")),
            stable: None,
            beta: None,
        })
    }

    fn key(policy: u64, format: Format, input: &[u8]) -> CacheKey {
        CompactionCache::key(policy, format, input)
    }

    fn get(
        cache: &CompactionCache,
        policy: u64,
        format: Format,
        input: &[u8],
    ) -> Option<Arc<Outcome>> {
        cache.get(key(policy, format, input), input)
    }

    #[test]
    fn a_body_forwarded_as_it_came_is_kept_from_its_second_sighting() {
        let cache = CompactionCache::new(1 << 20);
        let unchanged = Arc::new(Outcome {
            loss: outcome().loss,
            rewritten: None,
            stable: None,
            beta: None,
        });
        let (a, b) = (key(1, Format::Chat, b"a"), key(1, Format::Chat, b"b"));
        cache.insert(a, b"a", unchanged.clone());
        assert!(cache.get(a, b"a").is_none(), "seen once: not kept");
        cache.insert(a, b"a", unchanged.clone());
        assert!(cache.get(a, b"a").is_some(), "seen twice: kept");
        // A compaction is kept at once.
        cache.insert(b, b"b", outcome());
        assert!(cache.get(b, b"b").is_some());
    }

    #[test]
    fn a_key_hit_with_other_bytes_is_a_miss() {
        let cache = CompactionCache::new(1 << 20);
        let shared = key(1, Format::Chat, b"body");
        cache.insert(shared, b"body", outcome());
        assert!(cache.get(shared, b"body").is_some());
        assert!(cache.get(shared, b"another body, same key").is_none());
    }

    #[test]
    fn long_bodies_differing_anywhere_are_told_apart() {
        let cache = CompactionCache::new(1 << 20);
        let body = |at: usize| {
            let mut body = vec![b'a'; 10 * KEY_EDGE_BYTES];
            body[at] = b'b';
            body
        };
        let (start, middle, end) = (
            body(0),
            body(5 * KEY_EDGE_BYTES),
            body(10 * KEY_EDGE_BYTES - 1),
        );
        let longer = vec![b'a'; 10 * KEY_EDGE_BYTES + 1];
        // The key reads the ends and the length...
        let keys: Vec<_> = [&start, &end, &longer, &body(1)]
            .iter()
            .map(|b| key(1, Format::Chat, b))
            .collect();
        assert!(keys
            .iter()
            .all(|k| keys.iter().filter(|o| *o == k).count() == 1));
        // ...and the compare the rest: bodies differing in the middle share
        // a key, and each is answered only for its own bytes.
        let plain = vec![b'a'; 10 * KEY_EDGE_BYTES];
        assert_eq!(key(1, Format::Chat, &middle), key(1, Format::Chat, &plain));
        cache.insert(key(1, Format::Chat, &middle), &middle, outcome());
        assert!(get(&cache, 1, Format::Chat, &middle).is_some());
        assert!(get(&cache, 1, Format::Chat, &plain).is_none());
    }

    #[test]
    fn hits_only_for_the_same_policy_and_bytes() {
        let cache = CompactionCache::new(1 << 20);
        cache.insert(key(1, Format::Chat, b"body"), b"body", outcome());
        assert!(get(&cache, 1, Format::Chat, b"body").is_some());
        assert!(get(&cache, 1, Format::Anthropic, b"body").is_none());
        assert!(get(&cache, 2, Format::Chat, b"body").is_none());
        assert!(get(&cache, 1, Format::Chat, b"body2").is_none());
        cache.clear();
        assert!(get(&cache, 1, Format::Chat, b"body").is_none());
    }

    #[test]
    fn size_zero_turns_the_cache_off() {
        let cache = CompactionCache::new(0);
        cache.insert(key(1, Format::Chat, b"body"), b"body", outcome());
        assert!(get(&cache, 1, Format::Chat, b"body").is_none());
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
    fn checkpoints_stay_within_their_bytes() {
        let store = CheckpointStore::new(64 * 1024);
        for key in 0..100_000u128 {
            let state = ReplayState {
                entries: vec![
                    crate::compaction::stable::Entry {
                        index: 0,
                        kept: 1,
                        ..Default::default()
                    };
                    32
                ],
                replayed: 32,
                turn: None,
                ..Default::default()
            };
            store.put(key, Arc::new(state));
        }
        assert!(
            store.weighted_size() <= 64 * 1024,
            "{}",
            store.weighted_size()
        );
        assert!(store.weighted_size() > 0);
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
