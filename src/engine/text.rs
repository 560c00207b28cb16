//! Text primitives of the engine: chars, words, word sets and Jaccard.
//!
//! Chars are Unicode scalar values (`str::chars`), never bytes. Words are the
//! maximal runs of `char::is_alphanumeric()` characters, lowercased with
//! `char::to_lowercase()`. Words are interned to dense ids per run so word
//! sets are `u32` vectors of distinct ids, compared through a [`MarkedSet`].

use std::hash::BuildHasher;
use std::ops::Range;

use foldhash::fast::RandomState;
use hashbrown::HashTable;

/// The marker that stands for `omitted` cut chars (a pruned tool result,
/// a clipped argument, a text block whose every char went).
pub fn omission_marker(omitted: usize) -> String {
    format!("[… {} chars omitted …]", thousands(omitted))
}

/// `18204` as `18,204`.
pub(crate) fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Number of Unicode scalar values in `text`.
pub fn char_count(text: &str) -> usize {
    // Checking for ASCII reads three times faster than counting leading
    // bytes, and most text is ASCII; other text stops the check early.
    if text.is_ascii() {
        text.len()
    } else {
        text.chars().count()
    }
}

/// The first `n` chars of `text` (all of it when shorter).
pub fn char_prefix(text: &str, n: usize) -> &str {
    if let Some(head) = text.as_bytes().get(..n).filter(|h| h.is_ascii()) {
        return &text[..head.len()];
    }
    match text.char_indices().nth(n) {
        Some((byte, _)) => &text[..byte],
        None => text,
    }
}

/// Interns lowercased words to dense ids for one engine run. The words are
/// kept once, end to end in one string, and found through a table of ids
/// hashed by their text: one allocation per growth, not two per new word.
///
/// The words come from clients, so the tables hash them with a key chosen
/// at random ([`foldhash`]): with an unkeyed hash a client could send words
/// built to share one hash, and every lookup would walk all of them. Ids do
/// not depend on the hash, so the output stays a function of the input.
#[derive(Default)]
pub struct Vocabulary {
    hasher: RandomState,
    /// Words of up to [`SHORT_WORD_BYTES`] bytes (nearly all words), by
    /// their bytes packed in a u128: alphanumeric text has no NUL, so the
    /// zero padding is unambiguous and a lookup is one integer compare.
    short: HashTable<(u128, u32)>,
    /// Longer words, by the hash of their text.
    table: HashTable<u32>,
    /// Every word, end to end.
    text: String,
    /// Where each word lies in `text`.
    spans: Vec<(u32, u32)>,
    /// Chars of each word, cached because topic terms filter on it.
    word_chars: Vec<u32>,
    /// Each word packed ([`pack`]) when short, 0 when long.
    packed: Vec<u128>,
}

impl Vocabulary {
    /// A vocabulary with room for about `words` distinct words, so that a
    /// run over a long history does not rehash its table again and again.
    pub fn with_capacity(words: usize) -> Self {
        Vocabulary {
            hasher: RandomState::default(),
            short: HashTable::with_capacity(words),
            table: HashTable::new(),
            text: String::with_capacity(words * 8),
            spans: Vec::with_capacity(words),
            word_chars: Vec::with_capacity(words),
            packed: Vec::with_capacity(words),
        }
    }

    pub fn word(&self, id: u32) -> &str {
        let (start, end) = self.spans[id as usize];
        &self.text[start as usize..end as usize]
    }

    pub fn word_chars(&self, id: u32) -> usize {
        self.word_chars[id as usize] as usize
    }

    pub fn len(&self) -> usize {
        self.spans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// The id of `word` (already lowercased), interned if new.
    fn intern(&mut self, word: &str) -> u32 {
        if word.len() <= SHORT_WORD_BYTES {
            return self.intern_short(pack(word.as_bytes()), word, 0..word.len());
        }
        self.intern_long(word)
    }

    /// The id of a short word, given packed by [`pack`] from
    /// `text[at]` lowercased (`text[at]` may still have ASCII capitals).
    #[inline]
    fn intern_short(&mut self, key: u128, text: &str, at: Range<usize>) -> u32 {
        // Computed once per word, for the lookup and, when the word is
        // new, for its insert.
        let hash = self.hasher.hash_one(key);
        match self.short.find(hash, |&(k, _)| k == key) {
            Some(&(_, id)) => id,
            // Cut only here: slicing a str checks char boundaries.
            None => self.insert_short(key, hash, &text[at]),
        }
    }

    /// Keeps a new short word. Out of line: each word is new only once, and
    /// the lookup above is inlined into the scan.
    #[cold]
    #[inline(never)]
    fn insert_short(&mut self, key: u128, hash: u64, word: &str) -> u32 {
        let start = self.text.len();
        self.text.push_str(word);
        self.text[start..].make_ascii_lowercase();
        let id = self.push_span(start, char_count(word), key);
        let hasher = &self.hasher;
        self.short
            .insert_unique(hash, (key, id), |&(k, _)| hasher.hash_one(k));
        id
    }

    /// The id of a word longer than [`SHORT_WORD_BYTES`], interned if new.
    pub(super) fn intern_long(&mut self, word: &str) -> u32 {
        let hash = self.hasher.hash_one(word);
        let Vocabulary {
            table, text, spans, ..
        } = self;
        let at = |id: u32| {
            let (start, end) = spans[id as usize];
            &text[start as usize..end as usize]
        };
        if let Some(&id) = table.find(hash, |&id| at(id) == word) {
            return id;
        }
        let id = self.push(word);
        let Vocabulary {
            hasher,
            table,
            text,
            spans,
            ..
        } = self;
        let (text, spans) = (&*text, &*spans);
        table.insert_unique(hash, id, |&id| {
            let (start, end) = spans[id as usize];
            hasher.hash_one(&text[start as usize..end as usize])
        });
        id
    }

    /// Keeps a new word; returns its id.
    fn push(&mut self, word: &str) -> u32 {
        let start = self.text.len();
        self.text.push_str(word);
        self.push_span(start, char_count(word), 0)
    }

    /// Records the word that ends `text`, from `start`, packed in `packed`
    /// (0: too long to pack); returns its id.
    fn push_span(&mut self, start: usize, chars: usize, packed: u128) -> u32 {
        let id = self.spans.len() as u32;
        // Bodies are capped far below 4 GiB, so spans fit in u32.
        self.spans.push((start as u32, self.text.len() as u32));
        self.word_chars.push(chars as u32);
        self.packed.push(packed);
        id
    }

    /// Word `id` packed by [`pack`], or 0 when it is too long to pack: word
    /// lists keep words by it (see [`super::word_lists`]).
    pub(super) fn packed(&self, id: u32) -> u128 {
        self.packed[id as usize]
    }

    /// The id of the short word packed in `key` (by [`pack`]), interned if
    /// new.
    pub(super) fn intern_packed(&mut self, key: u128) -> u32 {
        let hash = self.hasher.hash_one(key);
        if let Some(&(_, id)) = self.short.find(hash, |&(k, _)| k == key) {
            return id;
        }
        // Unpacked only when new. Words have no NUL: the padding starts at
        // the first zero.
        let len = SHORT_WORD_BYTES - key.leading_zeros() as usize / 8;
        let bytes = key.to_le_bytes();
        let word = std::str::from_utf8(&bytes[..len]).unwrap_or_default();
        self.insert_short(key, hash, word)
    }

    /// Appends the ids of the words of `text`, in order, to `out`.
    pub fn words_of(&mut self, text: &str, out: &mut Vec<u32>) {
        // Checking costs a read of the text at ~70 bytes a nanosecond.
        if text.is_ascii() {
            self.ascii_words_of(text.as_bytes(), text, out)
        } else {
            self.mixed_words_of(text, out)
        }
    }

    /// The words of ASCII text, from bit masks: each 64-byte block becomes
    /// one bit per byte (set for a letter or digit), so a word starts at
    /// each set bit after a clear one and ends at the next clear bit. Each
    /// word is then found in a few instructions, and no word waits for the
    /// scan of the one before it, as a byte-by-byte scan would.
    fn ascii_words_of(&mut self, bytes: &[u8], text: &str, out: &mut Vec<u32>) {
        let mut long = String::new();
        let mut block_start = 0;
        let mut current = alphanumeric_bits(bytes, 0);
        // Whether the byte before this block is in a word.
        let mut carry = 0;
        while block_start < bytes.len() {
            let next = alphanumeric_bits(bytes, block_start + 64);
            let run = u128::from(current) | u128::from(next) << 64;
            let mut starts = current & !(current << 1 | carry);
            while starts != 0 {
                let bit = starts.trailing_zeros();
                starts &= starts - 1;
                let start = block_start + bit as usize;
                // At most 128 - bit: the shift brings in clear bits, which
                // the negation sets.
                let mut len = (!(run >> bit)).trailing_zeros() as usize;
                if len == 128 - bit as usize {
                    // A word running past the next block (rare): byte-wise.
                    len += bytes[start + len..]
                        .iter()
                        .take_while(|b| b.is_ascii_alphanumeric())
                        .count();
                }
                let id = if len <= SHORT_WORD_BYTES {
                    let window = sixteen_at(bytes, start);
                    // `| 0x20` lowercases a letter and keeps a digit; the
                    // mask keeps the word's own bytes (len >= 1 here).
                    let keep = KEEP_BYTES[len];
                    self.intern_short((window | LOWERCASE_BITS) & keep, text, start..start + len)
                } else {
                    long.clear();
                    long.push_str(&text[start..start + len]);
                    long.make_ascii_lowercase();
                    self.intern_long(&long)
                };
                out.push(id);
            }
            carry = current >> 63;
            current = next;
            block_start += 64;
        }
    }

    /// The words of text with non-ASCII chars. ASCII is read eight bytes at
    /// a time (see [`ascii_alphanumeric`]): the end of a word and the start
    /// of the next are found without a branch per byte, and a short word is
    /// lowercased and packed into its lookup key from the bytes already
    /// loaded. A word with a non-ASCII char is lowercased whole with
    /// `str::to_lowercase`, which knows context (a word-final `Σ` becomes
    /// `ς`).
    fn mixed_words_of(&mut self, text: &str, out: &mut Vec<u32>) {
        let bytes = text.as_bytes();
        let mut long = String::new();
        let mut at = 0;
        loop {
            // To the next ASCII alphanumeric or non-ASCII byte. Past the end
            // `eight_at` reads zeros, which are separators.
            loop {
                if at >= bytes.len() {
                    return;
                }
                let v = eight_at(bytes, at);
                let stop = ascii_alphanumeric(v) | (v & HIGH_BITS);
                if stop != 0 {
                    at += (stop.trailing_zeros() / 8) as usize;
                    break;
                }
                at += 8;
            }
            // Sixteen bytes are read at once, so a word shorter than that
            // (nearly all) is found and keyed without a branch on its
            // length, which prose makes unpredictable.
            let start = at;
            let window =
                u128::from(eight_at(bytes, at)) | u128::from(eight_at(bytes, at + 8)) << 64;
            let ends = u128::from(!ascii_alphanumeric(window as u64) & HIGH_BITS)
                | u128::from(!ascii_alphanumeric((window >> 64) as u64) & HIGH_BITS) << 64;
            if ends != 0 {
                at += (ends.trailing_zeros() / 8) as usize;
            } else {
                at += 16;
                loop {
                    let rest = !ascii_alphanumeric(eight_at(bytes, at)) & HIGH_BITS;
                    if rest != 0 {
                        at += (rest.trailing_zeros() / 8) as usize;
                        break;
                    }
                    at += 8;
                }
            }
            if at < bytes.len() && !bytes[at].is_ascii() {
                let run: usize = text[at..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric())
                    .map(char::len_utf8)
                    .sum();
                if run > 0 {
                    out.push(self.intern(&text[start..at + run].to_lowercase()));
                    at += run;
                    continue;
                }
                if start == at {
                    // A non-alphanumeric char outside a word.
                    at += text[at..].chars().next().map_or(1, char::len_utf8);
                    continue;
                }
            }
            let len = at - start;
            let id = if len <= SHORT_WORD_BYTES {
                // `| 0x20` lowercases a letter and keeps a digit; the mask
                // keeps the word's own bytes (len >= 1 here).
                let keep = u128::MAX >> (128 - 8 * len);
                self.intern_short((window | LOWERCASE_BITS) & keep, text, start..at)
            } else {
                long.clear();
                long.push_str(&text[start..at]);
                long.make_ascii_lowercase();
                self.intern_long(&long)
            };
            out.push(id);
        }
    }
}

/// Eight bytes at a time (SWAR): each byte of a `u64` repeated.
pub(super) const ONES: u64 = 0x0101_0101_0101_0101;
/// The high bit of each byte: set for a byte that is not ASCII.
pub(super) const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The eight bytes of `bytes` from `at`, little-endian, zeros past the end.
#[inline]
fn eight_at(bytes: &[u8], at: usize) -> u64 {
    match bytes.get(at..at + 8) {
        Some(eight) => u64::from_le_bytes(eight.try_into().unwrap_or_default()),
        None => {
            let mut padded = [0u8; 8];
            let rest = bytes.get(at..).unwrap_or_default();
            padded[..rest.len()].copy_from_slice(rest);
            u64::from_le_bytes(padded)
        }
    }
}

/// The sixteen bytes of `bytes` from `at`, little-endian, zeros past the end.
#[inline]
fn sixteen_at(bytes: &[u8], at: usize) -> u128 {
    match bytes.get(at..at + 16) {
        Some(sixteen) => u128::from_le_bytes(sixteen.try_into().unwrap_or_default()),
        None => u128::from(eight_at(bytes, at)) | u128::from(eight_at(bytes, at + 8)) << 64,
    }
}

/// One bit per byte of the 64 from `at` (bit i for byte `at + i`), set
/// for an ASCII letter or digit; clear past the end. `bytes` must be ASCII.
#[inline]
fn alphanumeric_bits(bytes: &[u8], at: usize) -> u64 {
    let mut padded = [0u8; 64];
    let block: &[u8] = match bytes.get(at..at + 64) {
        Some(block) => block,
        None => {
            let rest = bytes.get(at..).unwrap_or_default();
            padded[..rest.len()].copy_from_slice(rest);
            &padded
        }
    };
    let mut bits = 0;
    for (k, sixteen) in block.chunks_exact(16).enumerate() {
        #[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
        // SAFETY: the function needs SSE2 only, which this build's target
        // has (every x86-64 does).
        let sixteen = unsafe { alphanumeric_bits_16(sixteen) };
        #[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
        let sixteen = alphanumeric_bits_16(sixteen);
        bits |= u64::from(sixteen) << (16 * k);
    }
    bits
}

/// One bit per byte of `sixteen` (16 ASCII bytes), set for a letter or
/// digit: with SSE2 (every x86-64), a byte is a digit when `b - '0'` is at
/// most 9 unsigned and a letter when `(b | 0x20) - 'a'` is at most 25, for
/// all sixteen at once.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[target_feature(enable = "sse2")]
#[inline]
fn alphanumeric_bits_16(sixteen: &[u8]) -> u16 {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
        _mm_set_epi64x, _mm_sub_epi8,
    };
    let half = |at: usize| {
        let eight = sixteen.get(at..at + 8).unwrap_or_default();
        u64::from_le_bytes(eight.try_into().unwrap_or_default()) as i64
    };
    let v = _mm_set_epi64x(half(8), half(0));
    let digit = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
    let digit = _mm_cmpeq_epi8(_mm_min_epu8(digit, _mm_set1_epi8(9)), digit);
    let letter = _mm_sub_epi8(
        _mm_or_si128(v, _mm_set1_epi8(0x20)),
        _mm_set1_epi8(b'a' as i8),
    );
    let letter = _mm_cmpeq_epi8(_mm_min_epu8(letter, _mm_set1_epi8(25)), letter);
    _mm_movemask_epi8(_mm_or_si128(digit, letter)) as u16
}

/// [`alphanumeric_bits_16`] eight bytes at a time (SWAR), elsewhere.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
#[inline(always)]
fn alphanumeric_bits_16(sixteen: &[u8]) -> u16 {
    let mut bits = 0;
    for (k, eight) in sixteen.chunks_exact(8).enumerate() {
        let v = u64::from_le_bytes(eight.try_into().unwrap_or_default());
        bits |= (gather_high_bits(ascii_alphanumeric(v)) as u16) << (8 * k);
    }
    bits
}

/// Gathers the high bit of each byte into one byte, byte k to bit k: the
/// multiplier's partial products never overlap, so nothing carries.
#[inline(always)]
pub(super) const fn gather_high_bits(high: u64) -> u64 {
    ((high >> 7).wrapping_mul(0x0102_0408_1020_4080)) >> 56
}

/// The high bit of each byte of `x` within `lo..=hi`, all eight at once;
/// every byte of `x` must be ASCII. For a 7-bit byte, `x + (0x80 - lo)`
/// has its high bit set exactly when x >= lo, and `x + (0x7f - hi)` has it
/// clear exactly when x <= hi; no sum carries into the next byte.
#[inline(always)]
pub(super) const fn in_range(x: u64, lo: u8, hi: u8) -> u64 {
    (x + ONES * (0x80 - lo as u64)) & !(x + ONES * (0x7f - hi as u64)) & HIGH_BITS
}

/// The high bit of each byte of `v` that is an ASCII letter or digit
/// (`| 0x20` folds the capitals onto the small letters); a byte that is
/// not ASCII is neither.
#[inline(always)]
pub(super) const fn ascii_alphanumeric(v: u64) -> u64 {
    let y = v & !HIGH_BITS;
    (in_range(y, b'0', b'9') | in_range(y | (ONES * 0x20), b'a', b'z')) & !v
}

/// `| 0x20` on each of sixteen bytes.
const LOWERCASE_BITS: u128 = (ONES as u128 * 0x20) * (1 | 1 << 64);

/// The mask of the first `len` bytes of a u128, by `len`: a load, where
/// a shift by a variable count of a u128 is a branch and two shifts.
const KEEP_BYTES: [u128; SHORT_WORD_BYTES + 1] = {
    let mut masks = [0; SHORT_WORD_BYTES + 1];
    let mut len = 1;
    while len <= SHORT_WORD_BYTES {
        masks[len] = u128::MAX >> (128 - 8 * len);
        len += 1;
    }
    masks
};

/// Words up to this many bytes are keyed by their packed bytes.
const SHORT_WORD_BYTES: usize = 16;

/// The bytes of a short word in one integer, little-endian: alphanumeric
/// text has no NUL, so the zero padding is unambiguous.
fn pack(word: &[u8]) -> u128 {
    let mut packed = [0u8; SHORT_WORD_BYTES];
    packed[..word.len()].copy_from_slice(word);
    u128::from_le_bytes(packed)
}

/// The words of `text` as owned strings (for callers outside a run).
pub fn words(text: &str) -> Vec<String> {
    let mut vocab = Vocabulary::default();
    let mut ids = Vec::new();
    vocab.words_of(text, &mut ids);
    ids.into_iter()
        .map(|id| vocab.word(id).to_owned())
        .collect()
}

/// Word sets (distinct ids, in the order first seen) of many messages over
/// one vocabulary of `vocabulary_len` words: repeats are dropped with a
/// per-word mark, so building a set is one pass and no sort.
pub struct WordSets {
    /// The message (plus one) that last saw each word.
    seen_in: Vec<u32>,
    message: u32,
}

impl WordSets {
    pub fn new() -> Self {
        WordSets {
            seen_in: Vec::new(),
            message: 0,
        }
    }

    pub fn of(&mut self, ids: &[u32], vocabulary_len: usize) -> Vec<u32> {
        self.message += 1;
        if self.seen_in.len() < vocabulary_len {
            self.seen_in.resize(vocabulary_len, 0);
        }
        // Every id is written at the set's end, which moves on only past a
        // new one: no branch on whether an id repeats, which is as likely
        // as not in prose and would be mispredicted half the time.
        let mut set = vec![0; ids.len()];
        let mut len = 0;
        for &id in ids {
            let seen = &mut self.seen_in[id as usize];
            let new = *seen != self.message;
            *seen = self.message;
            set[len] = id;
            len += usize::from(new);
        }
        set.truncate(len);
        set
    }
}

impl Default for WordSets {
    fn default() -> Self {
        Self::new()
    }
}

/// One word set marked out in a per-word array, so its Jaccard similarity
/// with many others costs one array read per word of each other set, in any
/// order: word sets need no sorting.
#[derive(Default)]
pub struct MarkedSet {
    /// The stamp of the set that holds each word.
    holds: Vec<u32>,
    stamp: u32,
    len: usize,
}

impl MarkedSet {
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes `set` (distinct ids below `vocabulary_len`) the set later calls
    /// compare with.
    pub fn mark(&mut self, set: &[u32], vocabulary_len: usize) {
        if self.holds.len() < vocabulary_len {
            self.holds.resize(vocabulary_len, 0);
        }
        self.stamp = self.stamp.wrapping_add(1);
        if self.stamp == 0 {
            // After 2^32 marks, stale stamps could match again: clear them.
            self.holds.fill(0);
            self.stamp = 1;
        }
        for &id in set {
            self.holds[id as usize] = self.stamp;
        }
        self.len = set.len();
    }

    /// The Jaccard similarity of the marked set and `other` when it is at
    /// least `threshold`, else `None`. Gives up early, as soon as the
    /// overlap still reachable cannot make the threshold: `|a ∩ b| / |a ∪
    /// b| >= t` needs `|a ∩ b| >= t / (1 + t) * (|a| + |b|)`. Most compared
    /// pairs are far from duplicates, so this reads a few words of `other`
    /// instead of all of them.
    pub fn jaccard_at_least(&self, other: &[u32], threshold: f64) -> Option<f64> {
        let (short, long) = if self.len <= other.len() {
            (self.len, other.len())
        } else {
            (other.len(), self.len)
        };
        // Jaccard <= |short| / |long|, and rounding keeps that order; the
        // product `threshold * long` could round up past an exact tie.
        if (short as f64 / long as f64) < threshold {
            return None;
        }
        // One less than the bound, so float error can only keep a pair longer.
        let needed = (threshold / (1.0 + threshold) * (self.len + other.len()) as f64).ceil();
        let needed = (needed as usize).saturating_sub(1);
        let mut inter = 0;
        for (read, &id) in other.iter().enumerate() {
            if inter + (other.len() - read) < needed {
                return None;
            }
            // Ids of `other` beyond the marked vocabulary are not in the set.
            if self.holds.get(id as usize) == Some(&self.stamp) {
                inter += 1;
            }
        }
        let union = self.len + other.len() - inter;
        let similarity = if union == 0 {
            0.0
        } else {
            inter as f64 / union as f64
        };
        (similarity >= threshold).then_some(similarity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Jaccard similarity of two word sets, as the spec defines it; 0 when
    /// both are empty.
    fn jaccard(a: &[u32], b: &[u32]) -> f64 {
        let inter = b.iter().filter(|id| a.contains(id)).count();
        let union = a.len() + b.len() - inter;
        if union == 0 {
            0.0
        } else {
            inter as f64 / union as f64
        }
    }

    #[test]
    fn words_split_on_non_alphanumerics_and_lowercase() {
        assert_eq!(words("DE-4471 at 03:10"), ["de", "4471", "at", "03", "10"]);
        assert_eq!(words("Größe STRASSE"), ["größe", "strasse"]);
    }

    #[test]
    fn words_keep_cjk_runs_and_drop_emoji() {
        // CJK ideographs are alphabetic; emoji and punctuation separate words.
        assert_eq!(words("配送🚚状態 ok"), ["配送", "状態", "ok"]);
    }

    #[test]
    fn combining_marks_split_words_and_count_as_chars() {
        // U+0301 COMBINING ACUTE is not alphanumeric, so "e\u{301}cole" is two words.
        assert_eq!(words("e\u{301}cole"), ["e", "cole"]);
        assert_eq!(char_count("e\u{301}cole"), 6);
        assert_eq!(char_count("🚚配送"), 3);
    }

    #[test]
    fn char_prefix_cuts_on_scalar_values() {
        assert_eq!(char_prefix("a🚚b", 2), "a🚚");
        assert_eq!(char_prefix("ab", 5), "ab");
        assert_eq!(char_prefix("ab", 0), "");
    }

    #[test]
    fn words_lowercase_whole_words_with_final_sigma() {
        assert_eq!(words("ΟΔΟΣ ΣΑ"), ["οδος", "σα"]);
    }

    #[test]
    fn a_pair_exactly_at_the_threshold_is_similar_enough() {
        // 55 / 100 is 0.55 in f64, but 0.55 * 100 rounds above 55.
        let mut marked = MarkedSet::new();
        let hundred: Vec<u32> = (0..100).collect();
        marked.mark(&hundred, 100);
        let fifty_five: Vec<u32> = (0..55).collect();
        assert_eq!(marked.jaccard_at_least(&fifty_five, 0.55), Some(0.55));
    }

    #[test]
    fn early_exit_jaccard_agrees_with_the_full_one() {
        let sets: Vec<Vec<u32>> = vec![
            vec![],
            vec![1],
            vec![2, 1],
            vec![1, 2, 3],
            vec![5, 3, 4, 2],
            (0..20).collect(),
            (1..21).rev().collect(),
            (0..19).collect(),
            vec![40, 1, 2],
        ];
        let mut marked = MarkedSet::new();
        for a in &sets {
            marked.mark(a, 50);
            for b in &sets {
                for t in [0.5, 0.6, 2.0 / 3.0, 0.75, 0.9, 0.95, 1.0] {
                    let full = jaccard(a, b);
                    let expected = (full >= t).then_some(full);
                    assert_eq!(marked.jaccard_at_least(b, t), expected, "{a:?} {b:?} {t}");
                }
            }
        }
    }

    #[test]
    fn word_sets_keep_the_first_of_each_id() {
        let word_set = |ids: &[u32]| {
            let mut set: Vec<u32> = Vec::new();
            for &id in ids {
                if !set.contains(&id) {
                    set.push(id);
                }
            }
            set
        };
        let mut sets = WordSets::new();
        for ids in [vec![3, 1, 3, 2, 1], vec![], vec![7, 7, 7], vec![2, 9, 0, 9]] {
            assert_eq!(sets.of(&ids, 10), word_set(&ids), "{ids:?}");
        }
    }

    #[test]
    fn interning_gives_one_id_per_lowercased_word_and_keeps_the_words() {
        let mut vocab = Vocabulary::default();
        let mut ids = Vec::new();
        vocab.words_of("Alpha beta ALPHA, Größe GRÖSSE alpha-beta 42", &mut ids);
        let words: Vec<&str> = ids.iter().map(|&id| vocab.word(id)).collect();
        assert_eq!(
            words,
            ["alpha", "beta", "alpha", "größe", "grösse", "alpha", "beta", "42"]
        );
        assert_eq!(ids[0], ids[2]);
        assert_eq!(vocab.len(), 5);
        assert_eq!(vocab.word_chars(ids[3]), 5);
        // Many words: the table grows and rehashes from the kept text.
        let text: String = (0..5000).map(|i| format!("w{i} ")).collect();
        let mut many = Vec::new();
        vocab.words_of(&text, &mut many);
        vocab.words_of(&text, &mut many);
        assert_eq!(vocab.len(), 5 + 5000);
        assert_eq!(many[..5000], many[5000..]);
        assert_eq!(vocab.word(many[4999]), "w4999");
    }

    /// The spec's definition, word by word.
    fn spec_words(text: &str) -> Vec<String> {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    }

    #[test]
    fn words_at_the_edges_of_the_ascii_fast_path() {
        for text in [
            "abcdefgh abcdefghi ABCDEFGHI abcdefgh",
            "ABCDEFGHIJKLMNOP abcdefghijklmnop ABCDEFGHIJKLMNOPQ abcdefghijklmnopq",
            "Z@[`{/:09 \x10\x19az AZ",
            "abcé ÉCOLE écolE x9Σ ΣΑΣ",
            "…a…b… ‘quoted’ end",
            "日本語テキスト abc日本 日本abc",
            "ENDS_WITH_WORD",
            "",
            "   ",
        ] {
            assert_eq!(words(text), spec_words(text), "{text:?}");
        }
        // Every word length around the 8- and 16-byte windows, at the end
        // of the text and before what may follow a word.
        for len in 1..=40 {
            let word: String = "aB3".chars().cycle().take(len).collect();
            for text in [
                word.clone(),
                format!("{word} x"),
                format!("{word}é"),
                format!("{word}-{word}"),
                format!("  {word}…"),
            ] {
                assert_eq!(words(&text), spec_words(&text), "{text:?}");
            }
        }
    }

    #[test]
    fn words_built_to_share_an_unkeyed_hash_spread_over_the_table() {
        // 16-byte words `lo | hi << 64` with `lo * K + hi` the same for all
        // (K the multiplier of rustc-hash's FxHasher), found by search:
        // FxHasher gives every one of them one hash, so a table keyed by it
        // walks all of them on each lookup.
        let words: Vec<&str> = include_str!("../../tests/data/fxhash-colliding-words.txt")
            .lines()
            .collect();
        assert_eq!(words.len(), 200);
        let keys: Vec<u128> = words.iter().map(|w| pack(w.as_bytes())).collect();
        let unkeyed = |key: u128| {
            let mut hasher = rustc_hash::FxHasher::default();
            std::hash::Hasher::write_u128(&mut hasher, key);
            std::hash::Hasher::finish(&hasher)
        };
        assert!(keys.iter().all(|&key| unkeyed(key) == unkeyed(keys[0])));

        let mut vocab = Vocabulary::default();
        let distinct = |bits: fn(u64) -> u64| {
            let hashes = keys.iter().map(|&key| bits(vocab.hasher.hash_one(key)));
            hashes.collect::<std::collections::HashSet<_>>().len()
        };
        // hashbrown places a key by its hash's low bits and tells keys in a
        // group apart by its top seven; 200 random hashes take ~182 of 1,024
        // places and ~101 of 128 tags.
        assert!(distinct(|hash| hash & 1023) > 150);
        assert!(distinct(|hash| hash >> 57) > 64);
        let mut ids = Vec::new();
        vocab.words_of(&words.join(" "), &mut ids);
        assert_eq!(ids, (0..200).collect::<Vec<u32>>());
    }

    #[test]
    fn every_ascii_byte_is_classed_as_the_spec_classes_it() {
        for b in 0u8..0x80 {
            for at in 0..64 {
                let mut block = [b' '; 64];
                block[at] = b;
                let want = u64::from(b.is_ascii_alphanumeric()) << at;
                assert_eq!(alphanumeric_bits(&block, 0), want, "{b:#x} at {at}");
            }
        }
    }

    #[test]
    fn ascii_words_across_the_64_byte_blocks() {
        // Words of every length from every offset around one and two block
        // edges, including words longer than two blocks.
        for offset in [0, 1, 47, 62, 63, 64, 65, 126, 127, 128] {
            for len in (1..=70).chain([127, 128, 129, 200, 300]) {
                let word: String = "aB3".chars().cycle().take(len).collect();
                let text = format!("{}{word} q{word}", "-".repeat(offset));
                assert_eq!(words(&text), spec_words(&text), "{offset} {len}");
                // And a text that is nothing but the word, or ends with it.
                assert_eq!(words(&word), spec_words(&word), "{len}");
                let tail = format!("{}{word}", " ".repeat(offset));
                assert_eq!(words(&tail), spec_words(&tail), "{offset} {len}");
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
        #[test]
        fn ascii_words_follow_the_spec(text in "[\\x00-\\x7fa-zA-Z0-9 ]{0,400}") {
            proptest::prop_assert_eq!(words(&text), spec_words(&text));
        }

        #[test]
        fn words_follow_the_spec_on_any_text(text in "[\\x00-\\x7fa-zA-Z0-9 ÀÉéßΣσςİ日本🚚\u{301}]{0,60}") {
            proptest::prop_assert_eq!(words(&text), spec_words(&text));
        }
    }

    #[test]
    fn jaccard_of_empty_sets_is_zero() {
        assert_eq!(jaccard(&[], &[]), 0.0);
        assert_eq!(jaccard(&[2, 1], &[2, 3]), 1.0 / 3.0);
    }
}
