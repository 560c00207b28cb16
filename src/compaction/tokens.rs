//! Token counts with the providers' BPE tokenizers: `o200k_base` for the
//! gpt-4o, 4.1, 4.5, 5 and o-series families, `cl100k_base` for older
//! models, the policy's fallback for the rest.
//!
//! Counting uses `bpe-openai` (GitHub's `bpe` crates): the same tokens as
//! tiktoken (the tests compare both on tiktoken's examples, the fixtures
//! and random text), several times faster, because its pre-tokenizer is a
//! DFA (`regex-automata`) instead of tiktoken's backtracking `fancy_regex`,
//! and counting allocates no token vector.
//!
//! Short pre-tokenizer pieces' counts are remembered per thread (see
//! [`Encoding::count`]).
//!
//! Counts are cached per item and per text (a 64-bit hash of the encoding
//! and the text is the key), so a new turn counts only its new messages.

use std::sync::atomic::{AtomicU64, Ordering};

use xxhash_rust::xxh3::{xxh3_64_with_seed, Xxh3};

use crate::format::{Conversation, Item, Plan};

/// Slots of the count cache (a power of two).
const CACHE_SLOTS: usize = 1 << 16;

/// The process-wide count cache: direct-mapped, lock-free, fixed size
/// (512 KiB). A warm turn costs one hash and one atomic load per message,
/// where a general-purpose cache (moka) spent more on its bookkeeping than
/// the hash. Each slot packs the key's upper 32 bits (a tag; the lower 16
/// bits choose the slot) with a count below 2^32, in one word, so a reader
/// never sees one text's tag with another's count. A collision evicts: the
/// next lookup counts again. Zero is "empty" (a stored word has a count+1).
static COUNTS: [AtomicU64; CACHE_SLOTS] = [const { AtomicU64::new(0) }; CACHE_SLOTS];

/// A count from the cache, or `count` stored there.
fn cached(key: u64, count: impl FnOnce() -> usize) -> usize {
    let slot = &COUNTS[(key as usize) & (CACHE_SLOTS - 1)];
    let tag = key >> 32;
    let word = slot.load(Ordering::Relaxed);
    if word != 0 && word >> 32 == tag {
        return ((word & u64::from(u32::MAX)) - 1) as usize;
    }
    let n = count();
    // Counts that do not fit the word are not cached (a 16 GiB text).
    if let Ok(stored) = u32::try_from(n + 1) {
        slot.store((tag << 32) | u64::from(stored), Ordering::Relaxed);
    }
    n
}

/// Pieces longer than this are counted each time (a long piece is rare
/// and would crowd the table).
const MAX_CACHED_PIECE: usize = 32;
/// Pieces a thread remembers per encoding before it starts over: at most
/// about 300 KiB per thread, however many blocking-pool threads count.
const MAX_PIECES: usize = 1 << 12;

type PieceCounts = std::collections::HashMap<Box<str>, u32, foldhash::fast::RandomState>;

thread_local! {
    /// Per encoding, the token counts of pre-tokenizer pieces counted on
    /// this thread.
    /// Pieces come from clients: hashed with a key chosen at random, so no
    /// client can send pieces built to share one hash.
    static PIECES: std::cell::RefCell<[PieceCounts; 2]> =
        std::cell::RefCell::new([PieceCounts::default(), PieceCounts::default()]);
}

/// Seeds the hash of a whole item (text and tool calls), so its key never
/// meets a text's (seeded by the encoding alone).
const ITEM_SEED: u64 = 0x100;

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

    fn tokenizer(self) -> &'static bpe_openai::Tokenizer {
        match self {
            Encoding::O200kBase => bpe_openai::o200k_base(),
            Encoding::Cl100kBase => bpe_openai::cl100k_base(),
        }
    }

    /// Tokens of `text`, not from the per-text cache (special tokens count
    /// as text, as tiktoken's `encode_ordinary` counts them).
    ///
    /// The pre-tokenizer's pieces are counted one by one; short pieces
    /// (words, numbers, punctuation runs) repeat across a conversation, and
    /// their counts come from a per-thread table: the BPE encoder allocates
    /// twice per piece, which cost as much as the search itself.
    pub fn count(self, text: &str) -> usize {
        if text.is_empty() {
            return 0;
        }
        let tokenizer = self.tokenizer();
        PIECES.with(|pieces| {
            let mut pieces = pieces.borrow_mut();
            let table = &mut pieces[self as usize];
            tokenizer
                .split(text)
                .map(|piece| {
                    if piece.len() > MAX_CACHED_PIECE {
                        return tokenizer.bpe.count(piece.as_bytes());
                    }
                    if let Some(&n) = table.get(piece) {
                        return n as usize;
                    }
                    let n = tokenizer.bpe.count(piece.as_bytes());
                    if table.len() >= MAX_PIECES {
                        table.clear();
                    }
                    // A piece of at most MAX_CACHED_PIECE bytes has fewer tokens.
                    table.insert(piece.into(), n as u32);
                    n
                })
                .sum()
        })
    }

    /// Empties this thread's piece table, so a benchmark measures counting
    /// text whose pieces were never seen.
    #[doc(hidden)]
    pub fn forget_pieces() {
        PIECES.with(|pieces| pieces.borrow_mut().iter_mut().for_each(|t| t.clear()));
    }

    /// The tokens of `text` (for the tests that compare them with
    /// tiktoken's).
    pub fn encode(self, text: &str) -> Vec<u32> {
        self.tokenizer().encode(text)
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
        if item.tool_calls.is_empty() {
            // The text alone: the same entry `plan` reads for a kept item.
            return self.count_cached(&item.text);
        }
        let mut hasher = Xxh3::with_seed(ITEM_SEED + self as u64);
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

    fn tiktoken(encoding: Encoding) -> &'static tiktoken_rs::CoreBPE {
        match encoding {
            Encoding::O200kBase => tiktoken_rs::o200k_base_singleton(),
            Encoding::Cl100kBase => tiktoken_rs::cl100k_base_singleton(),
        }
    }

    /// The tokens and the count equal tiktoken's, in both encodings.
    #[track_caller]
    fn assert_same_as_tiktoken(text: &str) {
        for encoding in [Encoding::O200kBase, Encoding::Cl100kBase] {
            let expected = tiktoken(encoding).encode_ordinary(text);
            assert_eq!(encoding.encode(text), expected, "{encoding:?} {text:?}");
            assert_eq!(
                encoding.count(text),
                expected.len(),
                "{encoding:?} {text:?}"
            );
        }
    }

    #[test]
    fn counts_match_tiktoken_on_its_own_examples() {
        // tiktoken's tests: "hello world" is [15339, 1917] in cl100k_base
        // and [24912, 2375] in o200k_base.
        assert_eq!(
            Encoding::Cl100kBase.encode("hello world"),
            vec![15339, 1917]
        );
        assert_eq!(Encoding::O200kBase.encode("hello world"), vec![24912, 2375]);
        assert_eq!(Encoding::Cl100kBase.count(""), 0);
        // tiktoken's tests/test_encoding.py strings, and the pre-tokenizer's
        // edge cases: contractions, digit runs, trailing and inner
        // whitespace (its `\s+(?!\S)` look-ahead), newlines, punctuation
        // runs, non-Latin scripts, emoji, and special tokens as text.
        for text in [
            "hello world",
            "hello <|endoftext|>",
            "<|endoftext|><|fim_prefix|>",
            " \u{0085}0",
            &"0".repeat(200),
            "rer",
            "'rer",
            "today\n ",
            "today\n \n",
            "today\n  \n",
            "we need to   go  \n\n\n  now\t\t!",
            "I'm they're we've you'll he'd IT'S DON'T",
            "1234567 12 3.14159 0x1F 1,000,000",
            "fn main() {\n    println!(\"hi\");\n}\n",
            "   leading and trailing   ",
            "\r\n\r\nwindows\r\nlines\r\n",
            "请使用中文回答这个问题。日本語のテキスト。한국어 문장.",
            "Привет, мир! Ελληνικά. עברית. العربية",
            "👍🏽 emoji 🎉🎉 and ZWJ 👨‍👩‍👧",
            "CamelCaseWordsAndALLCAPSWords mixedCASE",
            "a/b/c//d path/to/file.rs:12:5 https://example.com/x?y=1",
            "\u{200b}\u{feff}\u{00a0}nbsp and zero width",
            "tabs\tand\u{000b}vertical\u{000c}feeds",
            "ǅ titlecase ǈ letters and combining e\u{0301}",
        ] {
            assert_same_as_tiktoken(text);
        }
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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// Random text from pieces that stress the pre-tokenizer equals
        /// tiktoken's tokens.
        #[test]
        fn random_text_matches_tiktoken(pieces in proptest::collection::vec(
            proptest::prop_oneof![
                proptest::string::string_regex("[a-zA-Z]{1,12}").unwrap(),
                proptest::string::string_regex("[0-9]{1,7}").unwrap(),
                proptest::string::string_regex("[ \t\r\n]{1,4}").unwrap(),
                proptest::string::string_regex("[.,;:!?'\"(){}<>/\\_=+*&^%$#@~`|-]{1,4}").unwrap(),
                proptest::string::string_regex("'(s|t|re|ve|m|ll|d|S|T|RE)").unwrap(),
                proptest::string::string_regex("\\PC{1,6}").unwrap(),
                proptest::string::string_regex("[éüßØçñ中文字日本한국😀👍🏽\u{0301}\u{00a0}]{1,4}").unwrap(),
            ],
            0..40,
        )) {
            assert_same_as_tiktoken(&pieces.concat());
        }
    }

    #[test]
    fn the_cache_gives_each_text_its_own_count() {
        // Many distinct texts through the fixed-size cache: every count,
        // warm or evicted, is the text's own.
        let texts: Vec<String> = (0..5_000)
            .map(|i| format!("message number {i} with some words {}", "x ".repeat(i % 50)))
            .collect();
        for _ in 0..2 {
            for text in &texts {
                assert_eq!(
                    Encoding::Cl100kBase.count_cached(text),
                    Encoding::Cl100kBase.count(text)
                );
            }
        }
        // The same text under two encodings has two entries.
        let text = "tokenization differs between encodings: 🤖🤖🤖 ".repeat(4);
        let (o, c) = (
            Encoding::O200kBase.count_cached(&text),
            Encoding::Cl100kBase.count_cached(&text),
        );
        assert_eq!(
            o,
            tiktoken(Encoding::O200kBase).encode_ordinary(&text).len()
        );
        assert_eq!(
            c,
            tiktoken(Encoding::Cl100kBase).encode_ordinary(&text).len()
        );
        assert_ne!(o, c, "the test text must tell the encodings apart");
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
