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

use crate::compaction::stable::{Checkpoints, ReplayState};
use crate::format::resume::{Continuation, ReadState, Snapshot, MIN_SNAPSHOT_BYTES};
use crate::format::{Format, Parsed, Skip};
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

    /// Keeps `outcome` for the body `input` gives. A compaction is kept at
    /// once. A body forwarded as it came (it fit) is kept only when seen a
    /// second time: deciding it again costs just a parse, most such bodies
    /// never come back (each turn of a conversation is a new body), and
    /// keeping every one cost a copy and an eviction per request, a fifth
    /// of the CPU of a new 20 KB request. So `input` is asked for only when
    /// the entry is kept; it must give bytes the entry may hold (a copy, or
    /// a buffer of its own): a request body is often a slice of a larger
    /// buffer (hyper's read buffer), which an entry weighed by the body's
    /// length must not hold on to.
    pub fn insert(&self, key: CacheKey, outcome: Arc<Outcome>, input: impl FnOnce() -> Bytes) {
        let Some(entries) = &self.entries else { return };
        if outcome.rewritten.is_none() {
            let slot = &self.seen_once[key.0 as usize % SEEN_ONCE_SLOTS];
            if slot.swap(key.0, Ordering::Relaxed) != key.0 {
                return;
            }
        }
        let input = input();
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

/// Parses of recent large bodies ([`Snapshot`]), so that the next turn of
/// the same conversation, which resends them with new items appended (or
/// its last item replaced), parses only the new items
/// ([`Format::parse_after`]). A body is filed
/// under a hash of the policy, the format and its bytes up to the end of
/// the compacted array's first [`SLOT_ELEMENTS`] items (where two
/// conversations of one agent begin to differ); a slot holds the newest
/// [`SLOT_SNAPSHOTS`] snapshots, each used only when the body begins with
/// its bytes, compared byte for byte. A snapshot is taken out when used and
/// the request's own put back when it is done, so a miss, an eviction or a
/// collision only costs a whole parse, never a different one. Bounded in
/// bytes by moka.
pub struct PrefixCache {
    slots: Option<Cache<u64, Arc<Slot>>>,
    /// Test hook: every body files under one slot, as if every hash collided.
    collide: bool,
    hits: AtomicU64,
    misses: AtomicU64,
}

/// Snapshots filed under one slot, oldest first.
struct Slot {
    snapshots: Vec<Arc<Held>>,
}

/// A snapshot as a slot holds it: taken out (by move, not copied) by the
/// request that resumes from it. Its weight is the one it had when put:
/// once taken, the slot weighs more than it holds until it is replaced.
struct Held {
    weight: usize,
    snapshot: Mutex<Option<Snapshot>>,
}

impl Held {
    fn new(snapshot: Snapshot) -> Arc<Held> {
        Arc::new(Held {
            weight: snapshot.weight(),
            snapshot: Mutex::new(Some(snapshot)),
        })
    }

    /// Whether it still holds a snapshot and `test` holds of it.
    fn holds(&self, test: impl FnOnce(&Snapshot) -> bool) -> bool {
        let held = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().is_some_and(test)
    }

    /// What `read` says of the snapshot it still holds.
    fn read<T>(&self, read: impl FnOnce(&Snapshot) -> Option<T>) -> Option<T> {
        let held = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        held.as_ref().and_then(read)
    }

    fn take(&self) -> Option<Snapshot> {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }
}

/// Snapshots one slot holds (conversations that begin alike).
pub const SLOT_SNAPSHOTS: usize = 4;
/// The leading items of the compacted array a slot's key reads.
pub const SLOT_ELEMENTS: usize = 3;

/// What [`PrefixCache::parse`] lends to [`PrefixCache::keep`]: where the
/// body files and the read loop's state at its end.
pub struct Lease {
    slot: Option<u64>,
    state: Option<ReadState>,
}

impl Lease {
    /// Whether [`PrefixCache::keep`] may keep a snapshot of this parse
    /// (and so a copy of its body's bytes).
    pub fn may_keep(&self) -> bool {
        self.slot.is_some() && self.state.is_some()
    }

    fn none() -> Self {
        Lease {
            slot: None,
            state: None,
        }
    }
}

impl PrefixCache {
    pub fn new(max_bytes: u64) -> Self {
        let slots = (max_bytes > 0).then(|| {
            Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, slot: &Arc<Slot>| {
                    let bytes: usize =
                        64 + slot.snapshots.iter().map(|h| 64 + h.weight).sum::<usize>();
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .build()
        });
        PrefixCache {
            slots,
            collide: false,
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
        }
    }

    /// A cache whose every body files under the same slot: what a hash
    /// collision of every key would do (for tests).
    pub fn colliding(max_bytes: u64) -> Self {
        PrefixCache {
            collide: true,
            ..PrefixCache::new(max_bytes)
        }
    }

    /// Parses that resumed from a snapshot.
    pub fn hits(&self) -> u64 {
        self.hits.load(Ordering::Relaxed)
    }

    /// Parses of a body large enough for a snapshot that found none to
    /// resume from.
    pub fn misses(&self) -> u64 {
        self.misses.load(Ordering::Relaxed)
    }

    /// Bytes held, as the weigher counts them (pending work done first).
    pub fn weighted_size(&self) -> u64 {
        self.slots.as_ref().map_or(0, |slots| {
            slots.run_pending_tasks();
            slots.weighted_size()
        })
    }

    pub fn clear(&self) {
        if let Some(slots) = &self.slots {
            slots.invalidate_all();
        }
    }

    /// The slots `body` may find its snapshot in: the one of its first
    /// [`SLOT_ELEMENTS`] items (where it files its own), then those of
    /// fewer, where an earlier turn with fewer items filed its own.
    fn slots_of(&self, policy: u64, format: Format, body: &[u8]) -> Vec<u64> {
        let field = match format {
            Format::Responses => "input",
            Format::Chat | Format::Anthropic => "messages",
        };
        let ends = crate::format::split::leading_elements::<SLOT_ELEMENTS>(body, field);
        let seed = policy.rotate_left(8) ^ format as u64;
        ends.iter()
            .rev()
            .map(|&end| match self.collide {
                true => 0,
                false => xxhash_rust::xxh3::xxh3_64_with_seed(&body[..end], seed),
            })
            .collect()
    }

    /// Parses `body` in `format`, from a snapshot of an earlier body it
    /// begins with when there is one: the result is [`Format::parse`]'s.
    /// Give the parse back to [`Self::keep`] once done with it.
    pub fn parse<'b>(
        &self,
        policy: u64,
        format: Format,
        body: &'b [u8],
        max_items: usize,
    ) -> Result<(Parsed<'b>, Lease), Skip> {
        let keys = match &self.slots {
            Some(_) if body.len() >= MIN_SNAPSHOT_BYTES => self.slots_of(policy, format, body),
            _ => Vec::new(),
        };
        let (Some(slots), Some(&slot)) = (&self.slots, keys.first()) else {
            return format.parse(body, max_items).map(|p| (p, Lease::none()));
        };
        let found = keys
            .iter()
            .find_map(|&key| self.take(slots, key, format, body));
        if let Some(snapshot) = found {
            if let Some((parsed, state)) = format.parse_after(body, max_items, snapshot) {
                self.hits.fetch_add(1, Ordering::Relaxed);
                let lease = Lease {
                    slot: Some(slot),
                    state: Some(state),
                };
                return Ok((parsed, lease));
            }
        }
        self.misses.fetch_add(1, Ordering::Relaxed);
        let (parsed, state) = format.parse_resumable(body, max_items)?;
        Ok((
            parsed,
            Lease {
                slot: Some(slot),
                state,
            },
        ))
    }

    /// Takes out of `slot` the newest snapshot `body` begins with; failing
    /// that, the newest whose bytes up to its last item `body` begins with
    /// (a new last message), cut back to before that item.
    fn take(
        &self,
        slots: &Cache<u64, Arc<Slot>>,
        slot: u64,
        format: Format,
        body: &[u8],
    ) -> Option<Snapshot> {
        let held = slots.get(&slot)?;
        // A body that extends a snapshot, else one that replaces its last
        // item (resumed from before that item); newest first, each
        // snapshot's bytes read once, none after one the body extends.
        // Once one is found, only one the body extends would be chosen
        // instead: the others are ruled out first by a few bytes where the
        // body differs from that one (siblings differ there too), not
        // compared whole.
        let mut chosen = None;
        let mut differs_at = None;
        for (at, h) in held.snapshots.iter().enumerate().rev() {
            let how = h.read(|s| {
                let worth =
                    s.format() == format && differs_at.map_or(true, |d| s.may_extend(body, d));
                worth.then(|| s.continuation(body))
            });
            match how {
                Some((Some(Continuation::Extends), _)) => {
                    chosen = Some((at, Continuation::Extends));
                    break;
                }
                Some((Some(Continuation::ReplacesLast), shared)) if chosen.is_none() => {
                    chosen = Some((at, Continuation::ReplacesLast));
                    differs_at = Some(shared);
                }
                _ => {}
            }
        }
        let (at, how) = chosen?;
        // Taken under its lock: of two requests racing for it, one gets it
        // (the other parses whole).
        let found = held.snapshots[at].take();
        let rest: Vec<_> = held
            .snapshots
            .iter()
            .filter(|h| h.holds(|_| true))
            .cloned()
            .collect();
        drop(held);
        if rest.is_empty() {
            slots.invalidate(&slot);
        } else {
            slots.insert(slot, Arc::new(Slot { snapshots: rest }));
        }
        match how {
            Continuation::ReplacesLast => found?.before_last(),
            Continuation::Extends => found,
        }
    }

    /// Keeps what parsing a body gave, for the next turn to resume from:
    /// it replaces the slot's snapshots that it extends.
    pub fn keep(&self, lease: Lease, parsed: Parsed<'_>) {
        self.keep_sharing(lease, parsed, None)
    }

    /// [`Self::keep`], the snapshot's bytes a slice of `body` (a copy of
    /// the parsed body's bytes, shared with the compaction cache) when
    /// given.
    pub fn keep_sharing(&self, lease: Lease, parsed: Parsed<'_>, body: Option<&Bytes>) {
        let (Some(slots), Some(slot), Some(state)) = (&self.slots, lease.slot, lease.state) else {
            return;
        };
        let Some(snapshot) = Snapshot::of(parsed, state, body) else {
            return;
        };
        let mut snapshots = slots
            .get(&slot)
            .map(|held| held.snapshots.clone())
            .unwrap_or_default();
        // Those it extends (earlier turns of its conversation) and those
        // taken go.
        snapshots.retain(|h| h.holds(|s| !snapshot.prefix().starts_with(s.prefix())));
        snapshots.push(Held::new(snapshot));
        if snapshots.len() > SLOT_SNAPSHOTS {
            snapshots.remove(0);
        }
        slots.insert(slot, Arc::new(Slot { snapshots }));
    }
}

#[cfg(test)]
#[path = "prefix_cache_tests.rs"]
mod prefix_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outcome::LossSummary;

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
        cache.insert(a, unchanged.clone(), || Bytes::from_static(b"a"));
        assert!(cache.get(a, b"a").is_none(), "seen once: not kept");
        cache.insert(a, unchanged.clone(), || Bytes::from_static(b"a"));
        assert!(cache.get(a, b"a").is_some(), "seen twice: kept");
        // A compaction is kept at once.
        cache.insert(b, outcome(), || Bytes::from_static(b"b"));
        assert!(cache.get(b, b"b").is_some());
    }

    #[test]
    fn a_key_hit_with_other_bytes_is_a_miss() {
        let cache = CompactionCache::new(1 << 20);
        let shared = key(1, Format::Chat, b"body");
        cache.insert(shared, outcome(), || Bytes::from_static(b"body"));
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
        cache.insert(key(1, Format::Chat, &middle), outcome(), || {
            Bytes::copy_from_slice(&middle)
        });
        assert!(get(&cache, 1, Format::Chat, &middle).is_some());
        assert!(get(&cache, 1, Format::Chat, &plain).is_none());
    }

    #[test]
    fn hits_only_for_the_same_policy_and_bytes() {
        let cache = CompactionCache::new(1 << 20);
        cache.insert(key(1, Format::Chat, b"body"), outcome(), || {
            Bytes::from_static(b"body")
        });
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
        cache.insert(key(1, Format::Chat, b"body"), outcome(), || {
            Bytes::from_static(b"body")
        });
        assert!(get(&cache, 1, Format::Chat, b"body").is_none());
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
}
