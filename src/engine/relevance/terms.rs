//! Terms: finding them in a text (a byte-class table, or bit masks of an
//! ASCII text's bytes read eight at a time), folding case, stemming and
//! stopwords, and remembering what each raw term normalises to.

use std::collections::HashMap;
use std::hash::BuildHasher;

use foldhash::fast::RandomState;
use xxhash_rust::xxh3::xxh3_64;

use crate::engine::text::{ascii_alphanumeric, gather_high_bits, in_range, HIGH_BITS};

/// The id of a normalised term: a 64-bit hash, the same in every process.
pub fn term_id(term: &str) -> u64 {
    xxh3_64(term.as_bytes())
}

/// What each raw term (as written) normalises to, remembered across the
/// texts of one request: a history repeats its words, so most terms cost
/// one lookup instead of folding, a stopword search and stemming.
#[derive(Default)]
pub(super) struct TermMemo {
    /// Terms of up to 15 bytes, nearly all, keyed by their bytes packed in
    /// a `u128` ([`packed`]): comparing keys is then one integer compare,
    /// not a call to compare strings.
    short: ShortTerms,
    /// Longer raw terms (the set is the history's vocabulary, not its text).
    long: HashMap<Box<str>, u32, RandomState>,
}

impl TermMemo {
    /// What `raw` (whose [`packed`] key is `key`) was mapped to, or what
    /// `learn` maps it to the first time.
    #[inline(always)]
    pub(super) fn value(
        &mut self,
        raw: &str,
        key: Option<u128>,
        learn: impl FnOnce() -> u32,
    ) -> u32 {
        let known = match key {
            Some(key) => self.short.get(key),
            None => self.long.get(raw),
        };
        match known {
            Some(&value) => value,
            None => self.remember(raw, key, learn()),
        }
    }

    #[cold]
    #[inline(never)]
    fn remember(&mut self, raw: &str, key: Option<u128>, value: u32) -> u32 {
        match key {
            Some(key) => self.short.insert(key, value),
            None => self.long.insert(raw.into(), value),
        };
        value
    }
}

/// A map from [`packed`] terms to slots: open addressing with linear
/// probing over a power-of-two table, at most a quarter full. Lighter than a
/// general hash map for the one lookup every term of a history makes; a
/// key and its slot share a place, so a lookup reads one cache line.
///
/// Terms come from clients: a key is placed by a hash keyed at random, so
/// no client can build terms that crowd one run of places.
#[derive(Default)]
pub(super) struct ShortTerms {
    places: Vec<Place>,
    len: usize,
    hasher: RandomState,
}

/// A packed key in two halves, and its slot. An empty place has key 0: a
/// packed key holds its length, never 0.
#[derive(Clone, Copy, Default)]
struct Place {
    low: u64,
    high: u64,
    slot: u32,
}

impl Place {
    #[inline(always)]
    fn holds(&self, key: u128) -> bool {
        self.low == key as u64 && self.high == (key >> 64) as u64
    }

    #[inline(always)]
    fn is_empty(&self) -> bool {
        self.low == 0 && self.high == 0
    }
}

impl ShortTerms {
    /// The top bits of the key's hash (as many as the table's size has).
    #[inline(always)]
    fn place(&self, key: u128, mask: usize) -> usize {
        // `leading_zeros` of a power of two less one: one instruction.
        (self.hasher.hash_one(key) >> (mask as u64).leading_zeros()) as usize & mask
    }

    #[inline(always)]
    pub(super) fn get(&self, key: u128) -> Option<&u32> {
        if self.places.is_empty() {
            return None;
        }
        let mask = self.places.len() - 1;
        let mut i = self.place(key, mask);
        loop {
            let place = &self.places[i];
            if place.holds(key) {
                return Some(&place.slot);
            }
            if place.is_empty() {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    pub(super) fn insert(&mut self, key: u128, slot: u32) -> Option<u32> {
        // At most a quarter full: nearly every lookup reads one place.
        if (self.len + 1) * 4 > self.places.len() {
            self.grow();
        }
        let mask = self.places.len() - 1;
        let mut i = self.place(key, mask);
        while !self.places[i].is_empty() && !self.places[i].holds(key) {
            i = (i + 1) & mask;
        }
        let place = &mut self.places[i];
        if place.holds(key) {
            return Some(std::mem::replace(&mut place.slot, slot));
        }
        *place = Place {
            low: key as u64,
            high: (key >> 64) as u64,
            slot,
        };
        self.len += 1;
        None
    }

    #[cold]
    fn grow(&mut self) {
        let size = (self.places.len() * 2).max(1024);
        let old = std::mem::replace(
            self,
            ShortTerms {
                places: vec![Place::default(); size],
                len: 0,
                hasher: self.hasher.clone(),
            },
        );
        for place in old.places {
            if !place.is_empty() {
                self.insert(
                    u128::from(place.low) | u128::from(place.high) << 64,
                    place.slot,
                );
            }
        }
    }
}

/// The bytes of a term of up to 15 bytes and its length, in one integer:
/// two terms have the same key exactly when they are the same. Built from
/// loads, not by copying into a buffer: reading a buffer back right after
/// writing it byte by byte stalls the CPU.
#[inline(always)]
pub(super) fn packed(raw: &str) -> Option<u128> {
    let bytes = raw.as_bytes();
    let len = bytes.len();
    if len > 15 {
        return None;
    }
    let (lo, hi) = if len > 8 {
        (le_bytes(&bytes[..8]), le_bytes(&bytes[8..]))
    } else {
        (le_bytes(bytes), 0)
    };
    Some(u128::from(lo) | u128::from(hi) << 64 | (len as u128) << 120)
}

/// Up to 8 bytes as a little-endian integer, in at most two loads that may
/// overlap (the overlapping bytes are the same, so OR keeps them).
#[inline(always)]
fn le_bytes(b: &[u8]) -> u64 {
    let n = b.len();
    if n >= 8 {
        u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    } else if n >= 4 {
        let head = u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let tail = u64::from(u32::from_le_bytes([b[n - 4], b[n - 3], b[n - 2], b[n - 1]]));
        head | tail << (8 * (n - 4))
    } else if n >= 2 {
        let head = u64::from(u16::from_le_bytes([b[0], b[1]]));
        let tail = u64::from(u16::from_le_bytes([b[n - 2], b[n - 1]]));
        head | tail << (8 * (n - 2))
    } else if n == 1 {
        u64::from(b[0])
    } else {
        0
    }
}

/// Whether a term is a joined identifier (kept whole, never stemmed) or a
/// plain run of letters and digits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Joined,
    Plain,
}

/// Folds case and stems a term as both the query and the documents see it;
/// `None` for stopwords and one-letter words. `buf` is reused storage.
pub(super) fn normalize(raw: &str, kind: Kind, buf: &mut String) -> Option<String> {
    let mut term = std::mem::take(buf);
    term.clear();
    if raw.is_ascii() {
        term.extend(raw.bytes().map(|b| b.to_ascii_lowercase() as char));
    } else {
        term.push_str(&raw.to_lowercase());
    }
    if kind == Kind::Plain {
        if term.chars().nth(1).is_none() || is_stopword(&term) {
            *buf = term;
            return None;
        }
        if term.bytes().all(|b| b.is_ascii_lowercase()) {
            stem(&mut term);
        }
    }
    Some(term)
}

const fn is_joiner(b: u8) -> bool {
    matches!(b, b'-' | b'_' | b'.' | b'/' | b':' | b'#' | b'@' | b'+')
}

/// Byte classes for the scanner.
const OTHER: u8 = 0;

pub(super) const ALNUM: u8 = 1;

const JOINER: u8 = 2;

const NOT_ASCII: u8 = 3;

pub(super) static CLASS: [u8; 256] = {
    let mut table = [OTHER; 256];
    let mut b = 0;
    while b < 256 {
        let byte = b as u8;
        table[b] = if !byte.is_ascii() {
            NOT_ASCII
        } else if byte.is_ascii_alphanumeric() {
            ALNUM
        } else if is_joiner(byte) {
            JOINER
        } else {
            OTHER
        };
        b += 1;
    }
    table
};

/// Calls `f` with each term of `text`: every joined run whole (kind
/// `Joined`) followed by its parts, and every lone run (kind `Plain`).
///
/// Walks bytes by a class table: ASCII, nearly all of a chat, is classified
/// by byte, and only a non-ASCII character is decoded to ask
/// `char::is_alphanumeric`. This scan is most of a cold analysis's cost.
pub(super) fn for_each_term(text: &str, mut f: impl FnMut(&str, Kind)) {
    let bytes = text.as_bytes();
    let n = bytes.len();
    // Whether the char at byte `i` is alphanumeric, and its length.
    let alnum_at = |i: usize| -> (bool, usize) {
        let b = bytes[i];
        if b.is_ascii() {
            (b.is_ascii_alphanumeric(), 1)
        } else {
            let c = text[i..].chars().next().unwrap_or(' ');
            (c.is_alphanumeric(), c.len_utf8())
        }
    };
    let mut i = 0;
    while i < n {
        match CLASS[bytes[i] as usize] {
            ALNUM => {}
            NOT_ASCII => {
                let (alnum, len) = alnum_at(i);
                if !alnum {
                    i += len;
                    continue;
                }
            }
            _ => {
                i += 1;
                continue;
            }
        }
        let start = i;
        let mut joined = false;
        loop {
            i = alnum_run_end(bytes, i);
            if i >= n {
                break;
            }
            match CLASS[bytes[i] as usize] {
                // A joiner counts only between two letters or digits.
                JOINER if i + 1 < n && alnum_at(i + 1).0 => {
                    joined = true;
                    i += 1;
                }
                NOT_ASCII => match alnum_at(i) {
                    (true, len) => i += len,
                    (false, _) => break,
                },
                _ => break,
            }
        }
        let run = &text[start..i];
        if joined {
            joined_run(run, &mut f);
        } else {
            f(run, Kind::Plain);
        }
    }
}

/// The end of the run of ASCII letters and digits starting at `i`: eight
/// bytes at a time (SWAR), then byte by byte near the end or at a byte
/// that is not ASCII.
#[inline(always)]
pub(super) fn alnum_run_end(bytes: &[u8], mut i: usize) -> usize {
    while let Some(chunk) = bytes.get(i..i + 8) {
        let x = u64::from_le_bytes([
            chunk[0], chunk[1], chunk[2], chunk[3], chunk[4], chunk[5], chunk[6], chunk[7],
        ]);
        if x & HIGH_BITS != 0 {
            break;
        }
        let alnum = ascii_alphanumeric(x);
        if alnum == HIGH_BITS {
            i += 8;
            continue;
        }
        // The first byte that is not alphanumeric (little-endian: lowest).
        return i + ((!alnum & HIGH_BITS).trailing_zeros() / 8) as usize;
    }
    while i < bytes.len() && CLASS[bytes[i] as usize] == ALNUM {
        i += 1;
    }
    i
}

/// A joined run whole, then its parts: rare, so kept out of the scan loop
/// where it would stop the per-term callback from being inlined.
#[cold]
#[inline(never)]
fn joined_run(run: &str, f: &mut dyn FnMut(&str, Kind)) {
    f(run, Kind::Joined);
    for part in run.split(|c: char| !c.is_alphanumeric()) {
        f(part, Kind::Plain);
    }
}

/// One bit per byte of an ASCII text (bit `i % 64` of word `i / 64`), for
/// [`for_each_keyed_term`]; kept across texts so their buffers are reused.
/// Every bit from the text's length on is clear, and there is always a word
/// past the last byte.
#[derive(Default)]
pub(super) struct TermMasks {
    /// The byte is a letter or digit.
    pub(super) alnum: Vec<u64>,
    /// The byte is a joiner between two letters or digits.
    pub(super) joints: Vec<u64>,
}

impl TermMasks {
    /// Fills the masks for `bytes`; false, with the masks unusable, when
    /// they are not all ASCII.
    pub(super) fn fill(&mut self, bytes: &[u8]) -> bool {
        let words = bytes.len() / 64 + 1;
        self.alnum.clear();
        self.alnum.reserve(words);
        // Punctuation bits first, joints once the letters around are known.
        self.joints.clear();
        self.joints.reserve(words);
        let mut blocks = bytes.chunks_exact(64);
        for block in &mut blocks {
            let Some((alnum, punct)) = block_bits(block) else {
                return false;
            };
            self.alnum.push(alnum);
            self.joints.push(punct);
        }
        let mut last = [0u8; 64];
        last[..blocks.remainder().len()].copy_from_slice(blocks.remainder());
        let Some((alnum, punct)) = block_bits(&last) else {
            return false;
        };
        self.alnum.push(alnum);
        self.joints.push(punct);

        // A joiner counts only between two letters or digits: look at the
        // punctuation with a letter or digit on both sides (spaces never
        // join, and they are most of what separates words).
        let alnum = &self.alnum;
        for (w, joints) in self.joints.iter_mut().enumerate() {
            let here = alnum[w];
            let before = here << 1 | w.checked_sub(1).map_or(0, |v| alnum[v] >> 63);
            let after = here >> 1 | alnum.get(w + 1).map_or(0, |&next| next << 63);
            let mut gaps = *joints & before & after;
            *joints = 0;
            while gaps != 0 {
                let bit = gaps.trailing_zeros() as usize;
                // A gap has a letter after it, so it lies within `bytes`.
                let byte = bytes.get(w * 64 + bit).copied().unwrap_or(0);
                *joints |= u64::from(CLASS[byte as usize] == JOINER) << bit;
                gaps &= gaps - 1;
            }
        }
        true
    }
}

/// The letter-or-digit bits of 64 bytes and their punctuation bits (the
/// other visible bytes, where a joiner can be), or `None` when one is not
/// ASCII.
#[inline(always)]
fn block_bits(block: &[u8]) -> Option<(u64, u64)> {
    let mut alnum = 0u64;
    let mut punct = 0u64;
    let mut any = 0u64;
    for (k, chunk) in block.chunks_exact(8).enumerate() {
        let x = u64::from_le_bytes(chunk.try_into().unwrap_or([0x80; 8]));
        any |= x;
        let x = x & !HIGH_BITS;
        let letters = ascii_alphanumeric(x);
        let visible = in_range(x, 0x21, 0x7e);
        alnum |= gather_high_bits(letters) << (8 * k);
        punct |= gather_high_bits(visible & !letters) << (8 * k);
    }
    (any & HIGH_BITS == 0).then_some((alnum, punct))
}

/// The first bit of `words` at or after `from` that is set (or clear, if
/// `clear`), or `end` if none.
#[inline(always)]
pub(super) fn next_set(words: &[u64], from: usize, end: usize, clear: bool) -> usize {
    let flip = if clear { !0u64 } else { 0 };
    let mut w = from / 64;
    let Some(&first) = words.get(w) else {
        return end;
    };
    let mut word = (first ^ flip) & (!0u64 << (from % 64));
    while word == 0 {
        w += 1;
        match words.get(w) {
            Some(&next) => word = next ^ flip,
            None => return end,
        }
    }
    w * 64 + word.trailing_zeros() as usize
}

/// The start of the run (letters, digits and joints) that holds `at`.
pub(super) fn run_start(masks: &TermMasks, at: usize) -> usize {
    let in_run = |w: usize| match (masks.alnum.get(w), masks.joints.get(w)) {
        (Some(a), Some(j)) => a | j,
        _ => 0,
    };
    let mut w = at / 64;
    // The bytes before `at` in its word that are outside any run.
    let mut outside = !in_run(w) & ((1u64 << (at % 64)) - 1);
    while outside == 0 {
        if w == 0 {
            return 0;
        }
        w -= 1;
        outside = !in_run(w);
    }
    w * 64 + 64 - outside.leading_zeros() as usize
}

/// The [`packed`] key of `bytes[start..end]`, from one 16-byte load when
/// the text goes on that far, all but the term's bytes masked off.
#[inline(always)]
pub(super) fn window_key(bytes: &[u8], start: usize, end: usize) -> Option<u128> {
    let len = end.checked_sub(start).filter(|&len| len <= 15)?;
    let term = match bytes.get(start..start + 16) {
        Some(window) => {
            u128::from_le_bytes(window.try_into().unwrap_or([0; 16])) & ((1u128 << (8 * len)) - 1)
        }
        // Near the end of the text: the term's bytes only.
        None => {
            let mut padded = [0u8; 16];
            padded[..len].copy_from_slice(bytes.get(start..end)?);
            u128::from_le_bytes(padded)
        }
    };
    Some(term | (len as u128) << 120)
}

/// The first byte at or after `from` that is neither a letter or digit nor
/// a joint: the end of the run there. `end` if none (never, by the word
/// past the last byte).
#[inline(always)]
pub(super) fn run_end(masks: &TermMasks, from: usize, end: usize) -> usize {
    let mut w = from / 64;
    let in_run = |w: usize| match (masks.alnum.get(w), masks.joints.get(w)) {
        (Some(a), Some(j)) => Some(a | j),
        _ => None,
    };
    let Some(first) = in_run(w) else {
        return end;
    };
    let mut outside = !first & (!0u64 << (from % 64));
    while outside == 0 {
        w += 1;
        match in_run(w) {
            Some(next) => outside = !next,
            None => return end,
        }
    }
    w * 64 + outside.trailing_zeros() as usize
}

/// [`for_each_term`], giving each term its [`packed`] key too. An ASCII
/// text, nearly every one, is scanned by bit masks of its bytes: the start
/// and end of each term are found by counting zeros, with no branch per
/// byte. Any other text goes through [`for_each_term`].
#[inline(always)]
pub(super) fn for_each_keyed_term(
    text: &str,
    masks: &mut TermMasks,
    mut f: impl FnMut(&str, Kind, Option<u128>),
) {
    if !masks.fill(text.as_bytes()) {
        for_each_term(text, |raw, kind| f(raw, kind, packed(raw)));
        return;
    }
    let bytes = text.as_bytes();
    let n = bytes.len();
    let alnum = &masks.alnum;
    // Joints are rare: where the next one is (past any run if none),
    // found again once passed.
    let mut next_joint = next_set(&masks.joints, 0, usize::MAX, false);
    // The end of the joined run whose parts are being given.
    let mut joined_end = 0;
    // The last bit of the word before: whether a run crosses into this.
    let mut carry = 0u64;
    for (w, &here) in alnum.iter().enumerate() {
        let mut starts = here & !(here << 1 | carry);
        carry = here >> 63;
        while starts != 0 {
            let start = w * 64 + starts.trailing_zeros() as usize;
            starts &= starts - 1;
            let end = next_set(alnum, start, n, true);
            if start >= joined_end {
                if next_joint < start {
                    next_joint = next_set(&masks.joints, start, usize::MAX, false);
                }
                // A joint right after the letters: a joined run, given whole
                // before its parts (the letters here are the first).
                if next_joint == end {
                    joined_end = run_end(masks, start, n);
                    let run = &text[start..joined_end];
                    f(run, Kind::Joined, packed(run));
                }
            }
            f(
                &text[start..end],
                Kind::Plain,
                window_key(bytes, start, end),
            );
        }
    }
}

/// The terms of `text` as relevance sees them, in order (stopwords left
/// out): for tests and for callers that want to show them.
pub fn terms(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for_each_term(text, |raw, kind| {
        out.extend(normalize(raw, kind, &mut String::new()));
    });
    out
}

/// A light English suffix stripper for lowercase ASCII words. Not Porter:
/// it only has to map a word and its common inflections to one stem, the
/// same way for the question and the history. The stem always keeps the
/// word's first three letters.
pub fn stem(word: &mut String) {
    fn strip(word: &mut String, suffix: &str, min_left: usize) -> bool {
        if word.len() >= suffix.len() + min_left && word.ends_with(suffix) {
            word.truncate(word.len() - suffix.len());
            true
        } else {
            false
        }
    }
    fn has_vowel(s: &str) -> bool {
        s.bytes()
            .any(|b| matches!(b, b'a' | b'e' | b'i' | b'o' | b'u' | b'y'))
    }
    fn undouble(word: &mut String) {
        let b = word.as_bytes();
        let n = b.len();
        if n >= 4
            && b[n - 1] == b[n - 2]
            && matches!(
                b[n - 1],
                b'b' | b'd' | b'f' | b'g' | b'm' | b'n' | b'p' | b'r' | b't'
            )
        {
            word.truncate(n - 1);
        }
    }

    // Plurals and third persons.
    if word.ends_with("sses") {
        word.truncate(word.len() - 2);
    } else if word.len() > 4 && word.ends_with("ies") {
        word.truncate(word.len() - 3);
        word.push('y');
    } else if word.len() > 3
        && word.ends_with('s')
        && !word.ends_with("ss")
        && !word.ends_with("us")
        && !word.ends_with("is")
    {
        word.truncate(word.len() - 1);
    }
    // Tenses and gerunds.
    if word.len() > 5 && word.ends_with("ied") {
        word.truncate(word.len() - 3);
        word.push('y');
    } else if (word.ends_with("ing") && has_vowel(&word[..word.len() - 3]) && strip(word, "ing", 3))
        || (word.ends_with("ed") && has_vowel(&word[..word.len() - 2]) && strip(word, "ed", 3))
    {
        undouble(word);
    }
    // Nouns made from verbs.
    let _ = strip(word, "ation", 3) || strip(word, "ment", 4) || strip(word, "ness", 3);
    // A final consonant-y (delivery, deliveries) and a final e (code, coded).
    let n = word.len();
    let consonant_y = word.ends_with('y')
        && n > 1
        && !matches!(word.as_bytes()[n - 2], b'a' | b'e' | b'i' | b'o' | b'u');
    if n > 3 && (consonant_y || word.ends_with('e')) {
        word.truncate(n - 1);
    }
}

/// Common English words that say nothing about a topic, question words and
/// the fillers of a request ("please tell me again") included. Sorted, for
/// a binary search.
pub(super) const STOPWORDS: &[&str] = &[
    "about", "above", "after", "again", "all", "also", "am", "an", "and", "any", "are", "as", "at",
    "be", "because", "been", "before", "being", "below", "between", "both", "but", "by", "can",
    "could", "did", "do", "does", "doing", "done", "down", "during", "each", "else", "ever", "few",
    "for", "from", "further", "get", "give", "got", "had", "has", "have", "having", "he", "her",
    "here", "hers", "him", "his", "how", "i", "if", "in", "into", "is", "it", "its", "itself",
    "just", "know", "let", "ll", "me", "might", "more", "most", "must", "my", "no", "nor", "not",
    "now", "of", "off", "ok", "okay", "on", "once", "one", "only", "or", "other", "our", "ours",
    "out", "over", "own", "please", "re", "recall", "remind", "said", "same", "say", "shall",
    "she", "should", "so", "some", "such", "tell", "than", "thank", "thanks", "that", "the",
    "their", "theirs", "them", "then", "there", "these", "they", "this", "those", "through", "to",
    "too", "under", "until", "up", "us", "ve", "very", "was", "we", "were", "what", "whats",
    "when", "where", "which", "while", "who", "whom", "why", "will", "with", "would", "you",
    "your", "yours",
];

/// [`STOPWORDS`] as integers (each word's bytes, little-endian: none is
/// longer than 8), sorted for a binary search of integer compares.
static STOPWORD_KEYS: [u64; STOPWORDS.len()] = {
    let mut keys = [0u64; STOPWORDS.len()];
    let mut i = 0;
    while i < keys.len() {
        let word = STOPWORDS[i].as_bytes();
        assert!(word.len() <= 8, "a stopword fits in a u64");
        let mut b = 0;
        while b < word.len() {
            keys[i] |= (word[b] as u64) << (8 * b);
            b += 1;
        }
        // Insertion sort: a few thousand steps, once, at compile time.
        let mut j = i;
        while j > 0 && keys[j - 1] > keys[j] {
            let earlier = keys[j - 1];
            keys[j - 1] = keys[j];
            keys[j] = earlier;
            j -= 1;
        }
        i += 1;
    }
    keys
};

/// Whether a case-folded word is one of [`STOPWORDS`]. A word is never
/// NUL, so its bytes padded with zeros are its own.
pub fn is_stopword(word: &str) -> bool {
    word.len() <= 8
        && STOPWORD_KEYS
            .binary_search(&le_bytes(word.as_bytes()))
            .is_ok()
}
