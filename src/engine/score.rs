//! Word analysis shared by dedupe and drop: each message's word set, the
//! topic terms of the whole history, and each message's score.

use std::cell::RefCell;
use std::cmp::Reverse;

use super::word_lists::{read_words, WordListCache};
use super::{Message, WEIGHTS};

/// How many of the most frequent long words are topic terms.
const TOPIC_TERMS: usize = 25;
/// Words must be longer than this many chars to be topic terms.
const TOPIC_MIN_CHARS: usize = 3;

pub(super) struct Scores {
    /// Words in the run's vocabulary (ids are below it).
    vocabulary_len: usize,
    /// Each message's word set: its distinct word ids, in first-seen order.
    pub word_sets: Vec<Vec<u32>>,
    /// Topic terms, most frequent first.
    topic: Vec<String>,
    scores: Vec<f64>,
}

impl Scores {
    /// The scores of `messages`, their words read through `lists` (what
    /// reading an earlier turn's history gave: the same scores, sooner).
    #[cfg(test)]
    pub fn new(messages: &[Message], lists: &dyn WordListCache) -> Self {
        Self::new_keyed(messages, lists, None)
    }

    /// [`Scores::new`], given each message's
    /// [`message_key`](super::relevance::message_key) when the caller has
    /// them.
    pub fn new_keyed(
        messages: &[Message],
        lists: &dyn WordListCache,
        keys: Option<&[u128]>,
    ) -> Self {
        let mut counts: Vec<u32> = Vec::new();
        let texts: Vec<&str> = messages.iter().map(|m| &*m.content).collect();
        let (run_vocabulary, word_sets) = read_words(&texts, &mut counts, lists, keys);
        // A run beside a replay's kept words names them there: read them
        // while the run is built (no later run reads while this one lives).
        let memo = lists.text_words().map(RefCell::borrow);
        let vocab = run_vocabulary.words(memo.as_deref());

        let mut topic: Vec<u32> = (0..vocab.len() as u32)
            .filter(|&id| vocab.word_chars(id) > TOPIC_MIN_CHARS)
            .collect();
        // Count descending, then the word in code-point order (UTF-8 byte
        // order is code-point order). Only the first 25 matter: the 25th
        // count is found by count alone (an integer compare; most words
        // tie on a few counts, and each tie would compare two words), and
        // only the words of at least that count are ordered in full.
        let order = |&a: &u32, &b: &u32| {
            counts[b as usize]
                .cmp(&counts[a as usize])
                .then_with(|| vocab.word(a).cmp(vocab.word(b)))
        };
        if topic.len() > TOPIC_TERMS {
            let (_, &mut last, _) = topic
                .select_nth_unstable_by_key(TOPIC_TERMS - 1, |&id| Reverse(counts[id as usize]));
            let least = counts[last as usize];
            topic.retain(|&id| counts[id as usize] >= least);
            if topic.len() > TOPIC_TERMS {
                topic.select_nth_unstable_by(TOPIC_TERMS - 1, order);
                topic.truncate(TOPIC_TERMS);
            }
        }
        topic.sort_unstable_by(order);

        let mut is_topic = vec![false; vocab.len()];
        for &id in &topic {
            is_topic[id as usize] = true;
        }
        let n = messages.len();
        let scores = messages
            .iter()
            .zip(&word_sets)
            .enumerate()
            .map(|(i, (m, set))| {
                // A lone message is the most recent one.
                let recency = if n < 2 {
                    1.0
                } else {
                    i as f64 / (n - 1) as f64
                };
                let overlap = if set.is_empty() {
                    0.0
                } else {
                    set.iter().filter(|&&id| is_topic[id as usize]).count() as f64
                        / set.len() as f64
                };
                WEIGHTS.recency * recency
                    + WEIGHTS.role * m.role.weight()
                    + WEIGHTS.topic_overlap * overlap
            })
            .collect();

        Scores {
            vocabulary_len: vocab.len(),
            word_sets,
            topic: topic.iter().map(|&id| vocab.word(id).to_owned()).collect(),
            scores,
        }
    }

    /// Adds `weight * extra[i]` to each message's score (relevance).
    pub fn add(&mut self, weight: f64, extra: &[f64]) {
        for (score, e) in self.scores.iter_mut().zip(extra) {
            *score += weight * e;
        }
    }

    /// The unrounded score of message `i`.
    pub fn score(&self, i: usize) -> f64 {
        self.scores[i]
    }

    pub fn topic_terms(&self) -> Vec<String> {
        self.topic.clone()
    }

    pub fn vocabulary_len(&self) -> usize {
        self.vocabulary_len
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use proptest::strategy::Strategy;

    use super::*;
    use crate::engine::text::words;
    use crate::engine::{NoCaches, Role};

    /// The spec's topic terms, by a full sort of every long word.
    fn topic_by_full_sort(texts: &[String]) -> Vec<String> {
        let mut counts: HashMap<String, u32> = HashMap::new();
        for text in texts {
            for word in words(text) {
                *counts.entry(word).or_default() += 1;
            }
        }
        let mut long: Vec<(String, u32)> = counts
            .into_iter()
            .filter(|(word, _)| word.chars().count() > TOPIC_MIN_CHARS)
            .collect();
        long.sort_by(|(a, m), (b, n)| n.cmp(m).then_with(|| a.cmp(b)));
        long.into_iter()
            .take(TOPIC_TERMS)
            .map(|(word, _)| word)
            .collect()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]
        /// Few counts shared by many words: the 25th place falls inside a
        /// tie, which only the words decide.
        #[test]
        fn topic_terms_are_the_most_frequent_long_words_then_the_first_in_order(
            texts in proptest::collection::vec(
                proptest::collection::vec("[a-f]{3,5}|Größe|ΣΊΣΥΦΟΣ", 0..30).prop_map(|w| w.join(" ")),
                1..12,
            ),
        ) {
            let messages: Vec<Message> = texts.iter().map(|t| Message::new(Role::User, t.as_str())).collect();
            let scores = Scores::new(&messages, &NoCaches);
            proptest::prop_assert_eq!(scores.topic_terms(), topic_by_full_sort(&texts));
        }
    }
}
