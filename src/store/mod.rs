//! The summary store: summaries keyed by a hash of what they were made
//! from (the summarized transcript, the prompt settings, the summarizer
//! and its model), written once and read before any model is called.
//!
//! One small trait, [`Store`], so the proxy reads and writes without
//! knowing where entries live; [`LocalStore`] is the embedded default
//! (moka, in this process), [`redis::RedisStore`] puts Redis behind it
//! when `[store] redis_url` is set, shared by every replica. A store never
//! fails a request: what it cannot answer is a miss.

pub mod redis;

use std::future::Future;
use std::pin::Pin;

use moka::sync::Cache;
use serde::{Deserialize, Serialize};

use crate::summarizer::Usage;

/// A Redis URL without its password, for messages.
pub fn redacted_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_owned(),
    }
}

/// A key: the 128-bit hash of what an entry was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Key(pub u128);

impl Key {
    /// The key of `parts`, each hashed with its length so that no two
    /// different lists of parts meet.
    pub fn of<'a>(parts: impl IntoIterator<Item = &'a [u8]>) -> Key {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        for part in parts {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Key(hasher.digest128())
    }

    /// The key as 32 hex digits (Redis keys, summary ids).
    pub fn hex(self) -> String {
        format!("{:032x}", self.0)
    }
}

/// A summary as kept: its text and what making it took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSummary {
    /// Short id the summary message and the report carry.
    pub id: String,
    pub text: String,
    pub chunks: usize,
    pub passes: usize,
    pub usage: Usage,
}

pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Where summaries are kept.
pub trait Store: Send + Sync {
    /// The entry under `key`, if any (a store that cannot answer: `None`).
    fn get(&self, key: Key) -> StoreFuture<'_, Option<StoredSummary>>;
    /// Keeps `value` under `key` unless an entry is there already, and
    /// returns the entry the store holds afterwards: the first writer's
    /// summary wins, so every reader forwards the same bytes.
    fn put_if_absent(&self, key: Key, value: StoredSummary) -> StoreFuture<'_, StoredSummary>;
    /// Whether `key` is held in this process (no round trip).
    fn get_local(&self, key: Key) -> Option<StoredSummary>;
    /// Whether the store serves from this process alone for now because
    /// what is behind it fails (a readiness note, not a failure).
    fn degraded(&self) -> bool {
        false
    }
}

/// The embedded store: a size-bounded moka cache.
pub struct LocalStore {
    entries: Cache<Key, StoredSummary>,
}

impl LocalStore {
    /// Holds about `max_bytes` of summaries (least recently used go first).
    pub fn new(max_bytes: u64) -> Self {
        LocalStore {
            entries: Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, v: &StoredSummary| {
                    u32::try_from(v.text.len() + v.id.len() + 96).unwrap_or(u32::MAX)
                })
                .build(),
        }
    }

    pub fn insert_if_absent(&self, key: Key, value: StoredSummary) -> StoredSummary {
        self.entries.entry(key).or_insert(value).into_value()
    }
}

impl Store for LocalStore {
    fn get(&self, key: Key) -> StoreFuture<'_, Option<StoredSummary>> {
        let found = self.entries.get(&key);
        Box::pin(async move { found })
    }

    fn put_if_absent(&self, key: Key, value: StoredSummary) -> StoreFuture<'_, StoredSummary> {
        let held = self.insert_if_absent(key, value);
        Box::pin(async move { held })
    }

    fn get_local(&self, key: Key) -> Option<StoredSummary> {
        self.entries.get(&key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(text: &str) -> StoredSummary {
        StoredSummary {
            id: "s".into(),
            text: text.into(),
            chunks: 1,
            passes: 1,
            usage: Usage::default(),
        }
    }

    #[test]
    fn keys_tell_apart_lists_that_join_alike() {
        let a = Key::of([b"ab".as_slice(), b"c".as_slice()]);
        let b = Key::of([b"a".as_slice(), b"bc".as_slice()]);
        assert_ne!(a, b);
        assert_eq!(a, Key::of([b"ab".as_slice(), b"c".as_slice()]));
        assert_eq!(a.hex().len(), 32);
    }

    #[tokio::test]
    async fn the_first_writer_wins() {
        let store = LocalStore::new(1 << 20);
        let key = Key(7);
        assert_eq!(store.get(key).await, None);
        assert_eq!(store.put_if_absent(key, summary("one")).await.text, "one");
        assert_eq!(store.put_if_absent(key, summary("two")).await.text, "one");
        assert_eq!(store.get(key).await.unwrap().text, "one");
    }
}
