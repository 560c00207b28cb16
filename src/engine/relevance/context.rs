//! The question in context: what a request refers back to, the other names
//! of what it asks about, and which of several statements of one value is
//! the current one.
//!
//! - **References**: a request with a referring word ("it", "its", "that
//!   one", "there", "the same") adds the entities of the turns it refers
//!   back to: the previous user turn and the answers after it (and the
//!   turn before when that one refers back too, three at most). Entities
//!   are joined terms, terms with a digit and capitalised words inside a
//!   sentence; the previous user turn's other words join at half weight.
//! - **Aliases**: a message defining one name as another ("Halden, also
//!   known as the northern depot", "the yard (aka Norrby)") links them both
//!   ways: a query holding one side gains the other's terms.
//! - **Latest values**: of two messages with digits that match at least
//!   two query terms and half of them,
//!   the earlier whose matched query terms the later one also matches is a
//!   superseded statement of the same subject and attribute: it keeps 0.4
//!   of its relevance (under the default pin threshold when it was the
//!   most relevant), the later one takes the more of the two.

use std::sync::LazyLock;

use regex::bytes::Regex;

use super::query::Query;
use super::terms::{for_each_term, normalize, Kind};
use crate::engine::{Message, Role};

/// Words by which a request points back at an earlier turn.
const REFERRING: &[&str] = &[
    "it", "its", "it's", "that", "this", "there", "they", "them", "their", "those", "these",
    "same", "he", "she", "his", "her", "him", "former", "latter",
];

/// At most this many earlier user turns are followed back.
const MAX_TURNS: usize = 3;

/// Of each message followed, only this many chars are read for entities.
const MAX_CONTEXT_CHARS: usize = 4_000;

/// The weight of a previous user turn's words that are not entities.
const CONTEXT_WORD_WEIGHT: f64 = 0.5;

/// Whether `text` holds a word that points back at an earlier turn.
pub(super) fn refers_back(text: &str) -> bool {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .any(|w| w.len() <= 6 && REFERRING.iter().any(|r| r.eq_ignore_ascii_case(w)))
}

/// Adds to `query` the entities of the turns the request at `q` refers
/// back to, when it refers back and names no entity of its own; returns
/// the messages followed (part of the question, like the request).
pub(super) fn add_references(messages: &[Message], q: usize, query: &mut Query) -> Vec<usize> {
    let mut followed = Vec::new();
    let request = &messages[q].content;
    if !refers_back(request) || has_entity(request) || content_words(request) > MAX_OWN_WORDS {
        return followed;
    }
    let mut turns = 0;
    for (i, m) in messages[..q].iter().enumerate().rev() {
        match m.role {
            Role::User => {
                add_entities(&m.content, query, turns == 0);
                followed.push(i);
                turns += 1;
                // A turn naming an entity is what the request points at.
                if turns >= MAX_TURNS || has_entity(&m.content) || !refers_back(&m.content) {
                    break;
                }
            }
            Role::Assistant if !m.content.is_empty() => {
                add_entities(&m.content, query, false);
                followed.push(i);
            }
            _ => {}
        }
    }
    followed
}

/// A request with more words of its own than this says what it asks
/// about ("its" then points inside the request).
const MAX_OWN_WORDS: usize = 3;

/// How many words of `text` are neither stopwords nor referring words.
fn content_words(text: &str) -> usize {
    let mut n = 0;
    let mut buf = String::new();
    for_each_term(text, |raw, kind| {
        if !REFERRING.iter().any(|r| r.eq_ignore_ascii_case(raw))
            && normalize(raw, kind, &mut buf).is_some()
        {
            n += 1;
        }
    });
    n
}

/// Whether `text` names an entity (see [`is_entity`]).
fn has_entity(text: &str) -> bool {
    let text = crate::engine::text::char_prefix(text, MAX_CONTEXT_CHARS);
    let base = text.as_ptr() as usize;
    let mut found = false;
    for_each_term(text, |raw, kind| {
        found = found || is_entity(text, raw.as_ptr() as usize - base, raw, kind);
    });
    found
}

/// An entity: a joined term, a term with a digit, or a capitalised word
/// inside a sentence.
fn is_entity(text: &str, start: usize, raw: &str, kind: Kind) -> bool {
    kind == Kind::Joined
        || raw.bytes().any(|b| b.is_ascii_digit())
        || (raw.chars().next().is_some_and(char::is_uppercase) && !starts_sentence(text, start))
}

/// Adds the entities of `text` to `query` (and, for the turn right before
/// the request, its other words at [`CONTEXT_WORD_WEIGHT`]).
fn add_entities(text: &str, query: &mut Query, all_words: bool) {
    let text = crate::engine::text::char_prefix(text, MAX_CONTEXT_CHARS);
    let base = text.as_ptr() as usize;
    for_each_term(text, |raw, kind| {
        if is_entity(text, raw.as_ptr() as usize - base, raw, kind) {
            query.add_weighted(raw, kind, 1.0);
        } else if all_words {
            query.add_weighted(raw, kind, CONTEXT_WORD_WEIGHT);
        }
    });
}

/// Whether the word at byte `start` of `text` opens a sentence.
fn starts_sentence(text: &str, start: usize) -> bool {
    match text[..start].trim_end().chars().next_back() {
        None => true,
        Some(c) => matches!(c, '.' | '!' | '?' | ':' | '\n' | '"'),
    }
}

/// One alias definition: two names, each as its normalised terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Alias {
    pub names: [Vec<String>; 2],
}

/// The phrases that define a second name.
static MARKERS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\b(?:aka|a\.k\.a\.|also known as|known as|also called|referred to as|nicknamed)\b")
        .expect("a valid pattern")
});

/// Words passed over between a name and its marker.
const LINKING: &[&str] = &[
    "is", "are", "was", "were", "be", "been", "also", "the", "a", "an",
];

/// The most terms one name of an alias takes.
const MAX_NAME_TERMS: usize = 3;

/// How far either side of a marker a name is looked for.
const NAME_WINDOW: usize = 80;

/// Appends the alias definitions of `text` to `out`.
pub(super) fn find_aliases(text: &str, out: &mut Vec<Alias>) {
    for found in MARKERS.find_iter(text.as_bytes()) {
        let before = floor_char(text, found.start().saturating_sub(NAME_WINDOW));
        let after = ceil_char(text, (found.end() + NAME_WINDOW).min(text.len()));
        let left = name_terms(tokens(&text[before..found.start()]).into_iter().rev());
        let right = name_terms(tokens(&text[found.end()..after]).into_iter());
        if !left.is_empty() && !right.is_empty() && left != right {
            out.push(Alias {
                names: [left, right],
            });
        }
    }
}

/// Adds to `query` the other name of every alias one of whose names it
/// holds (all its terms, or two of them).
pub(super) fn link_aliases(aliases: &[Alias], query: &mut Query) {
    let mut added = Vec::new();
    for alias in aliases {
        for side in 0..2 {
            let name = &alias.names[side];
            let held = name.iter().filter(|t| query.holds(t)).count();
            if held == name.len() || held >= 2 {
                added.push(&alias.names[1 - side]);
            }
        }
    }
    for name in added {
        for term in name {
            query.add_term(term.clone(), 1.0);
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Token<'t> {
    Word(&'t str),
    Mark,
}

/// Words and the punctuation between them that ends a name.
fn tokens(text: &str) -> Vec<Token<'_>> {
    let mut out = Vec::new();
    let mut word_start = None;
    for (i, c) in text.char_indices() {
        if c.is_alphanumeric() || c == '-' || c == '\'' {
            word_start.get_or_insert(i);
            continue;
        }
        if let Some(s) = word_start.take() {
            out.push(Token::Word(&text[s..i]));
        }
        if !c.is_whitespace() {
            out.push(Token::Mark);
        }
    }
    if let Some(s) = word_start {
        out.push(Token::Word(&text[s..]));
    }
    out
}

/// The terms of a name read from the marker outwards: linking words and
/// one mark right at the marker are passed over, then words are taken up
/// to a stopword or a mark.
fn name_terms<'t>(tokens: impl Iterator<Item = Token<'t>>) -> Vec<String> {
    let mut out = Vec::new();
    let mut started = false;
    let mut marks_passed = 0;
    let mut buf = String::new();
    for token in tokens {
        match token {
            Token::Mark if !started && marks_passed == 0 => marks_passed += 1,
            Token::Mark => break,
            Token::Word(w) if !started && LINKING.iter().any(|l| l.eq_ignore_ascii_case(w)) => {}
            Token::Word(w) => {
                let kind = if w.contains('-') {
                    Kind::Joined
                } else {
                    Kind::Plain
                };
                match normalize(w, kind, &mut buf) {
                    Some(term) => {
                        started = true;
                        out.push(term);
                        if out.len() >= MAX_NAME_TERMS {
                            break;
                        }
                    }
                    None if started => break,
                    None => {}
                }
            }
        }
    }
    out
}

fn floor_char(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    at
}

fn ceil_char(text: &str, mut at: usize) -> usize {
    while !text.is_char_boundary(at) {
        at += 1;
    }
    at
}

/// What a superseded statement keeps of its relevance.
const SUPERSEDED_SHARE: f64 = 0.4;

/// Values that change: of the messages with a digit matching at least two
/// query terms and half of them (`matched[i]`, a bit per query term), an
/// earlier one whose
/// matched terms a later one all matches too gives way to it: it keeps
/// [`SUPERSEDED_SHARE`] of its relevance, and the later one takes the
/// higher of the two relevances.
pub(super) fn prefer_latest(
    messages: &[Message],
    matched: &[u64],
    query_terms: usize,
    relevance: &mut [f64],
) {
    // At least two terms and half the query's: a paraphrase sharing one
    // word and the entity with many messages supersedes nothing.
    let least = 2.max(query_terms.min(64).div_ceil(2)) as u32;
    // Later candidates' (matched terms, index), distinct by terms.
    let mut later: Vec<(u64, usize)> = Vec::new();
    for i in (0..messages.len()).rev() {
        let mask = matched[i];
        if mask.count_ones() < least
            || relevance[i] <= 0.0
            || !messages[i].content.bytes().any(|b| b.is_ascii_digit())
        {
            continue;
        }
        // The nearest later statement covering the same terms.
        if let Some(&(_, j)) = later.iter().rev().find(|(m, _)| mask & !m == 0) {
            relevance[j] = relevance[j].max(relevance[i]);
            relevance[i] *= SUPERSEDED_SHARE;
        }
        match later.iter_mut().find(|(m, _)| *m == mask) {
            Some(slot) => slot.1 = i,
            None => later.push((mask, i)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aliases_are_read_on_both_sides_of_their_marker() {
        let mut found = Vec::new();
        find_aliases(
            "Halden, also known as the northern depot, takes the late deliveries.",
            &mut found,
        );
        find_aliases("Everyone knows the yard (aka Norrby) is full.", &mut found);
        find_aliases(
            "Note that Kestrel is known as the blue hub among drivers.",
            &mut found,
        );
        let names: Vec<[Vec<String>; 2]> = found.into_iter().map(|a| a.names).collect();
        let s = |t: &[&str]| t.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            names,
            [
                [s(&["halden"]), s(&["northern", "depot"])],
                [s(&["yard"]), s(&["norrb"])],
                [s(&["kestrel"]), s(&["blu", "hub", "among"])],
            ]
        );
    }

    #[test]
    fn referring_words_are_whole_words() {
        assert!(refers_back("And what was its locker pin?"));
        assert!(refers_back("Which code does that one use?"));
        assert!(!refers_back("What is the gate code for Halden?"));
    }
}
