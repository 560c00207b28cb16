//! Token counts with the providers' BPE tokenizers (`tiktoken-rs`):
//! `o200k_base` for the gpt-4o, 4.1, 4.5, 5 and o-series families,
//! `cl100k_base` for older models, the policy's fallback for the rest.
//!
//! Counting is cached per text (a 64-bit hash of the encoding and the text
//! is the key), so a new turn counts only its new messages.

use std::sync::OnceLock;

use moka::sync::Cache;
use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

use crate::format::{Conversation, Item, Plan};

/// A count from the process-wide cache, or `count` stored there.
fn cached(key: u64, count: impl FnOnce() -> usize) -> usize {
    static CACHE: OnceLock<Cache<u64, u32>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Cache::new(1 << 16));
    if let Some(n) = cache.get(&key) {
        return n as usize;
    }
    let n = count();
    cache.insert(key, u32::try_from(n).unwrap_or(u32::MAX));
    n
}

/// A BPE encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    O200kBase,
    Cl100kBase,
}

impl Encoding {
    pub fn as_str(self) -> &'static str {
        match self {
            Encoding::O200kBase => "o200k_base",
            Encoding::Cl100kBase => "cl100k_base",
        }
    }

    pub fn parse(name: &str) -> Option<Encoding> {
        [Encoding::O200kBase, Encoding::Cl100kBase]
            .into_iter()
            .find(|e| e.as_str() == name)
    }

    /// The encoding of a request's `model`, or `fallback` for a model this
    /// table does not know.
    pub fn for_model(model: Option<&str>, fallback: Encoding) -> Encoding {
        let Some(model) = model else { return fallback };
        // Fine-tunes spell the base model after `ft:`.
        let model = model.strip_prefix("ft:").unwrap_or(model);
        const O200K: [&str; 8] = [
            "gpt-4o",
            "gpt-4.1",
            "gpt-4.5",
            "gpt-5",
            "chatgpt-4o",
            "o1",
            "o3",
            "o4",
        ];
        const CL100K: [&str; 4] = ["gpt-4", "gpt-3.5", "text-embedding-3", "text-embedding-ada"];
        if O200K.iter().any(|p| model.starts_with(p)) {
            Encoding::O200kBase
        } else if CL100K.iter().any(|p| model.starts_with(p)) {
            Encoding::Cl100kBase
        } else {
            fallback
        }
    }

    fn bpe(self) -> &'static tiktoken_rs::CoreBPE {
        match self {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }

    /// Tokens of `text`, uncached (special tokens count as text).
    pub fn count(self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        self.bpe().encode_ordinary(text).len()
    }

    /// Tokens of `text`, from the process-wide cache when counted before.
    pub fn count_cached(self, text: &str) -> usize {
        // Short texts cost less to count than to look up.
        if text.len() < 64 {
            return self.count(text);
        }
        let key = xxh3_64_with_seed(text.as_bytes(), self as u64);
        cached(key, || self.count(text))
    }

    /// Tokens of an item: its text, tool-call names and arguments. One
    /// cache entry per item (keyed by the hash of all its parts), so a warm
    /// turn costs a hash and a lookup per message.
    pub fn item(self, item: &Item) -> usize {
        let count = || {
            self.count(&item.text)
                + item
                    .tool_calls
                    .iter()
                    .map(|c| self.count(&c.name) + self.count(&c.arguments))
                    .sum::<usize>()
        };
        if item.text.len() < 64 && item.tool_calls.is_empty() {
            return count();
        }
        let mut hasher = Xxh3::with_seed(self as u64 + 1);
        for part in std::iter::once(item.text.as_str()).chain(
            item.tool_calls
                .iter()
                .flat_map(|c| [c.name.as_str(), c.arguments.as_str()]),
        ) {
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        cached(hasher.digest(), count)
    }

    /// Tokens of a conversation. Text outside the compacted array is known
    /// only by its chars: it counts at 4 chars per token.
    pub fn conversation(self, conversation: &Conversation) -> usize {
        conversation.outside_chars.div_ceil(4)
            + conversation
                .items
                .iter()
                .map(|i| self.item(i))
                .sum::<usize>()
    }

    /// Tokens of what `plan` forwards of `conversation`.
    pub fn plan(self, conversation: &Conversation, plan: &Plan) -> usize {
        conversation.outside_chars.div_ceil(4)
            + plan
                .items
                .iter()
                .map(|p| {
                    let item = &conversation.items[p.index];
                    let text = p.text.as_deref().unwrap_or(&item.text);
                    let mut n = self.count_cached(text);
                    for (pos, call) in item.tool_calls.iter().enumerate() {
                        let args = p
                            .arguments
                            .iter()
                            .find(|(c, _)| *c == pos)
                            .map_or(call.arguments.as_str(), |(_, a)| a.as_str());
                        n += self.count_cached(&call.name) + self.count_cached(args);
                    }
                    n
                })
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_match_tiktoken_on_its_own_examples() {
        // tiktoken's tests: "hello world" is [15339, 1917] in cl100k_base
        // and [24912, 2375] in o200k_base.
        assert_eq!(
            Encoding::Cl100kBase.bpe().encode_ordinary("hello world"),
            vec![15339, 1917]
        );
        assert_eq!(
            Encoding::O200kBase.bpe().encode_ordinary("hello world"),
            vec![24912, 2375]
        );
        assert_eq!(Encoding::Cl100kBase.count(""), 0);
        let long = "The quick brown fox jumps over the lazy dog. ".repeat(10);
        assert_eq!(
            Encoding::O200kBase.count_cached(&long),
            Encoding::O200kBase.count(&long)
        );
        assert_eq!(
            Encoding::O200kBase.count_cached(&long),
            Encoding::O200kBase.count(&long),
            "a cached count is the count"
        );
    }

    #[test]
    fn models_choose_their_encoding() {
        let f = Encoding::Cl100kBase;
        for m in [
            "gpt-4o-mini",
            "gpt-4.1",
            "gpt-5",
            "o3-mini",
            "ft:gpt-4o:acme",
        ] {
            assert_eq!(Encoding::for_model(Some(m), f), Encoding::O200kBase, "{m}");
        }
        for m in ["gpt-4-turbo", "gpt-3.5-turbo"] {
            assert_eq!(
                Encoding::for_model(Some(m), Encoding::O200kBase),
                Encoding::Cl100kBase,
                "{m}"
            );
        }
        assert_eq!(Encoding::for_model(Some("llama-3"), f), f);
        assert_eq!(Encoding::for_model(None, f), f);
        assert_eq!(Encoding::parse("o200k_base"), Some(Encoding::O200kBase));
        assert_eq!(Encoding::parse("p50k"), None);
    }
}
