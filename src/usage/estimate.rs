//! What the original request would have cost without the proxy.
//!
//! The provider billed the forwarded request; the original was never
//! sent, so its bill is estimated from three things the proxy knows:
//!
//! - **its size**: the original body's bytes, in the provider's own
//!   tokens by the density the provider reported for the forwarded body
//!   (its input tokens per forwarded byte). This counts what lies outside
//!   the messages too (tools, system prompt, JSON), in whatever tokenizer
//!   the provider uses;
//! - **the prefix the provider would have had cached**: providers cache
//!   the prefix a request shares with recent ones. Without the proxy the
//!   recent ones would have been the conversation's earlier *original*
//!   requests, so the proxy remembers a print of each original body
//!   ([`Print`]: a chained hash per 512-byte block) and measures how many
//!   leading blocks this original shares with the best of them
//!   ([`PrefixMemory`], per tenant, five minutes like the providers'
//!   default cache);
//! - **how the provider bills what it does not read from cache**: the
//!   forwarded request's own split between cache writes and uncached
//!   input (all writes under Anthropic with a breakpoint on the last
//!   message, none under OpenAI), applied to the original's uncached part.
//!
//! Output is taken to be what it was. A request forwarded unchanged, in a
//! conversation whose earlier turns were forwarded unchanged too, cost
//! exactly what it would have: its estimate is its bill.

use std::sync::Arc;
use std::time::Duration;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::{Price, Usage};

/// The block a print hashes: a provider caches in blocks of about this
/// size (OpenAI: 128 tokens), and a prefix shorter than one is never cached.
pub const BLOCK: usize = 512;
/// Prints kept per conversation start (conversations that open alike).
const PRINTS_PER_KEY: usize = 8;
/// How long an unused print is remembered: the providers' default cache life.
pub const PRINT_TTL: Duration = Duration::from_secs(300);

/// A body's prefix hashes: `blocks[i]` covers its first `(i + 1) * BLOCK`
/// bytes, chained so that equal hashes mean equal prefixes; and the bytes
/// after its last whole block, so that a later body that extends this one
/// is measured to the byte.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Print {
    pub blocks: Vec<u64>,
    pub tail: Box<[u8]>,
    pub bytes: usize,
}

impl Print {
    pub fn of(body: &[u8]) -> Print {
        let mut hash = 0u64;
        let chunks = body.chunks_exact(BLOCK);
        let tail = chunks.remainder().into();
        let blocks = chunks
            .map(|block| {
                hash = xxh3_64_with_seed(block, hash);
                hash
            })
            .collect();
        Print {
            blocks,
            tail,
            bytes: body.len(),
        }
    }

    /// Leading blocks shared with `other`.
    fn common(&self, other: &Print) -> usize {
        self.blocks
            .iter()
            .zip(&other.blocks)
            .take_while(|(a, b)| a == b)
            .count()
    }

    /// Leading bytes `body` (whose print is `print`) shares with the body
    /// this is the print of.
    fn common_bytes(&self, print: &Print, body: &[u8]) -> usize {
        let blocks = self.common(print);
        let start = blocks * BLOCK;
        if blocks < self.blocks.len() {
            return start;
        }
        // Every whole block of this one matched: on into its tail.
        let rest = body.get(start..).unwrap_or_default();
        start
            + self
                .tail
                .iter()
                .zip(rest)
                .take_while(|(a, b)| a == b)
                .count()
    }
}

#[derive(Debug)]
struct Entry {
    print: Print,
    /// This request went upstream as it came, and so had every earlier
    /// one of its conversation.
    as_is: bool,
}

/// What the estimate needs to know of a request besides its bill.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Baseline {
    /// The original (decoded) body's bytes.
    pub original_bytes: usize,
    /// The forwarded body's bytes.
    pub forwarded_bytes: usize,
    /// Bytes of the original that the provider would have had cached: its
    /// prefix shared with a recent original request.
    pub cached_bytes: usize,
    /// The request and all earlier ones of its conversation went upstream
    /// as they came: the provider saw the originals.
    pub as_is: bool,
}

/// The recent original requests' prints, by tenant and first block.
pub struct PrefixMemory {
    prints: moka::sync::Cache<u64, Arc<Vec<Entry>>>,
}

impl PrefixMemory {
    /// A memory holding at most about `max_bytes` of prints.
    pub fn new(max_bytes: u64) -> Self {
        PrefixMemory {
            prints: moka::sync::Cache::builder()
                .max_capacity(max_bytes)
                .weigher(|_, entries: &Arc<Vec<Entry>>| {
                    let bytes: usize = entries
                        .iter()
                        .map(|e| 64 + e.print.blocks.len() * 8 + e.print.tail.len())
                        .sum();
                    u32::try_from(bytes).unwrap_or(u32::MAX)
                })
                .time_to_idle(PRINT_TTL)
                .build(),
        }
    }

    /// Measures the `original` (decoded) body against the recent
    /// originals of `tenant`, and remembers it. `forwarded_as_is`: the
    /// proxy sent it upstream unchanged.
    pub fn observe(
        &self,
        tenant: &str,
        body: &[u8],
        forwarded_bytes: usize,
        forwarded_as_is: bool,
    ) -> Baseline {
        let original = Print::of(body);
        let original_bytes = original.bytes;
        let Some(&first) = original.blocks.first() else {
            // Shorter than a block: nothing a provider would cache.
            return Baseline {
                original_bytes,
                forwarded_bytes,
                cached_bytes: 0,
                as_is: forwarded_as_is,
            };
        };
        let key = xxh3_64_with_seed(tenant.as_bytes(), first);
        let earlier = self.prints.get(&key);
        let best = earlier
            .iter()
            .flat_map(|e| e.iter())
            .map(|e| (e.print.common_bytes(&original, body), e))
            .max_by_key(|(common, _)| *common);
        let (common, history_as_is) = best.map_or((0, true), |(c, e)| (c, e.as_is));
        let as_is = forwarded_as_is && history_as_is;
        let mut entries = vec![Entry {
            print: original,
            as_is,
        }];
        let newest = &entries[0].print;
        // An earlier turn of this conversation is a prefix of this one:
        // this print replaces it.
        let kept: Vec<Entry> = earlier
            .iter()
            .flat_map(|e| e.iter())
            .filter(|e| newest.common(&e.print) < e.print.blocks.len())
            .take(PRINTS_PER_KEY - 1)
            .map(|e| Entry {
                print: e.print.clone(),
                as_is: e.as_is,
            })
            .collect();
        entries.extend(kept);
        self.prints.insert(key, Arc::new(entries));
        Baseline {
            original_bytes,
            forwarded_bytes,
            cached_bytes: common.min(original_bytes),
            as_is,
        }
    }
}

/// The estimate for one request.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Estimate {
    /// What the original request would have been billed, by kind.
    pub original: Usage,
    pub original_cost: f64,
    /// `original_cost` less the actual cost, when positive...
    pub saved: f64,
    /// ...and the actual cost less `original_cost`, when that is positive.
    pub extra: f64,
}

/// Estimates the original request's bill from the forwarded one's
/// (`actual`) and what the proxy knows of both (`baseline`). `caching`:
/// the provider caches prompts for this request (OpenAI does for every
/// request; Anthropic when it reported cache reads or writes).
pub fn estimate(actual: &Usage, price: &Price, baseline: &Baseline, caching: bool) -> Estimate {
    let actual_cost = price.cost(actual);
    let original = if baseline.as_is || baseline.forwarded_bytes == 0 {
        *actual
    } else {
        counterfactual(actual, baseline, caching)
    };
    let original_cost = price.cost(&original);
    let difference = original_cost - actual_cost;
    Estimate {
        original,
        original_cost,
        saved: difference.max(0.0),
        extra: (-difference).max(0.0),
    }
}

fn counterfactual(actual: &Usage, baseline: &Baseline, caching: bool) -> Usage {
    let density = actual.input() as f64 / baseline.forwarded_bytes as f64;
    let input = baseline.original_bytes as f64 * density;
    let read = if caching {
        (baseline.cached_bytes as f64 * density).min(input)
    } else {
        0.0
    };
    let rest = input - read;
    let not_read = actual.uncached_input + actual.cache_write;
    let write_share = if not_read > 0 {
        actual.cache_write as f64 / not_read as f64
    } else {
        0.0
    };
    let write = rest * write_share;
    let one_hour_share = if actual.cache_write > 0 {
        actual.cache_write_1h as f64 / actual.cache_write as f64
    } else {
        0.0
    };
    Usage {
        uncached_input: (rest - write).round() as u64,
        cache_read: read.round() as u64,
        cache_write: write.round() as u64,
        cache_write_1h: (write * one_hour_share).round() as u64,
        output: actual.output,
        compaction_input: actual.compaction_input,
        compaction_output: actual.compaction_output,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRICE: Price = Price {
        uncached: 1.0,
        cache_read: 0.1,
        cache_write: 1.25,
        cache_write_1h: 2.0,
        output: 5.0,
    };

    fn body(blocks: usize, fill: u8) -> Vec<u8> {
        vec![fill; blocks * BLOCK]
    }

    #[test]
    fn the_previous_original_is_the_cached_prefix() {
        let memory = PrefixMemory::new(1 << 20);
        let first = body(4, b'a');
        let mut second = first.clone();
        second.extend(body(2, b'b'));
        memory.observe("t", &first, 1000, false);
        let baseline = memory.observe("t", &second, 1000, false);
        assert_eq!(baseline.cached_bytes, 4 * BLOCK);
        assert_eq!(baseline.original_bytes, 6 * BLOCK);
        // Another tenant shares nothing.
        let other = memory.observe("u", &second, 1000, false);
        assert_eq!(other.cached_bytes, 0);
        // A body that extends the last one within a block is measured to the byte.
        let mut third = second.clone();
        third.extend(b"0123456789");
        let mut fourth = third.clone();
        fourth.truncate(third.len() - 3);
        fourth.extend(b"xyz and more");
        memory.observe("t", &third, 1000, false);
        let b = memory.observe("t", &fourth, 1000, false);
        assert_eq!(b.cached_bytes, 6 * BLOCK + 7);
    }

    #[test]
    fn an_untouched_conversation_costs_what_it_was_billed() {
        let memory = PrefixMemory::new(1 << 20);
        let first = body(3, b'a');
        let b = memory.observe("t", &first, first.len(), true);
        assert!(b.as_is);
        let actual = Usage {
            uncached_input: 700,
            cache_read: 300,
            output: 10,
            ..Usage::default()
        };
        let e = estimate(&actual, &PRICE, &b, true);
        assert_eq!((e.saved, e.extra), (0.0, 0.0));
        assert_eq!(e.original, actual);
    }

    #[test]
    fn a_compacted_request_is_scaled_by_size_and_credited_its_cache() {
        // The original is 4000 bytes, half of it cached before; the
        // forwarded one 1000 bytes, 250 tokens, all written to cache.
        let baseline = Baseline {
            original_bytes: 4000,
            forwarded_bytes: 1000,
            cached_bytes: 2000,
            as_is: false,
        };
        let actual = Usage {
            cache_write: 250,
            output: 0,
            ..Usage::default()
        };
        let e = estimate(&actual, &PRICE, &baseline, true);
        assert_eq!(e.original.input(), 1000);
        assert_eq!((e.original.cache_read, e.original.cache_write), (500, 500));
        let want = (500.0 * 0.1 + 500.0 * 1.25 - 250.0 * 1.25) / 1e6;
        assert!((e.saved - want).abs() < 1e-12, "{e:?}");
        assert_eq!(e.extra, 0.0);
        // A provider that caches nothing credits no cache.
        let e = estimate(&actual, &PRICE, &baseline, false);
        assert_eq!(e.original.cache_read, 0);
    }

    #[test]
    fn breaking_the_cache_shows_as_extra_cost() {
        // Compaction removed a little but the provider served nothing from
        // cache, where the original would have been read almost whole.
        let baseline = Baseline {
            original_bytes: 10_000,
            forwarded_bytes: 9_000,
            cached_bytes: 9_000,
            as_is: false,
        };
        let actual = Usage {
            cache_write: 2250,
            ..Usage::default()
        };
        let e = estimate(&actual, &PRICE, &baseline, true);
        assert_eq!(e.saved, 0.0);
        assert!(e.extra > 0.0, "{e:?}");
    }

    #[test]
    fn memory_keeps_distinct_conversations_apart() {
        let memory = PrefixMemory::new(1 << 20);
        let head = body(2, b'h');
        let with = |tail: u8| {
            let mut b = head.clone();
            b.extend(body(3, tail));
            b
        };
        memory.observe("t", &with(b'x'), 1, false);
        memory.observe("t", &with(b'y'), 1, false);
        let mut longer = with(b'x');
        longer.extend(body(1, b'z'));
        let b = memory.observe("t", &longer, 1, false);
        assert_eq!(b.cached_bytes, 5 * BLOCK, "x's conversation is still known");
    }
}
