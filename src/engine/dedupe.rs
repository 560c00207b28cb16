//! Stage 2, dedupe: remove unprotected messages whose word set is at least
//! `duplicate_threshold` similar (Jaccard) to an earlier present message of
//! the same role; the earliest such message is the one reported.
//!
//! The spec's pairwise scan is quadratic; this finds the same pairs with
//! prefix filtering: with tokens in one global order, two sets whose
//! Jaccard reaches t share a token among the first `|x| - ceil(t * |x|) + 1`
//! of each. Only messages sharing such a token are compared, and each
//! comparison stops as soon as the threshold is out of reach. On varied text
//! few pairs share a prefix token; on a narrow vocabulary (every message
//! using the same few words) every earlier message is a candidate, but each
//! costs only a few steps.

use rustc_hash::FxHashMap;

use super::score::Scores;
use super::text::MarkedSet;
use super::{round_to, DedupeRule, DedupeStage, Duplicate, Policy, Role, Working, DEDUPE_METHOD};

/// Conversations of up to this many messages (all that the memory-compact
/// API accepts) get the exhaustive search, whatever their words: each
/// message's candidates are at most its prefix times the earlier messages,
/// which stays in the tens of millions.
pub const EXACT_SEARCH_MESSAGES: usize = 200;

/// Past [`EXACT_SEARCH_MESSAGES`], the candidate entries one run may visit
/// per entry of the messages' word sets, so the search costs at most a
/// constant times the input's words. Only tens of thousands of messages
/// that all share their few words (which a client could send to burn CPU:
/// a search quadratic in the messages) reach it; the stage then stops
/// looking for further duplicates, and trim and drop meet the budget as
/// usual.
pub const CANDIDATE_VISITS_PER_WORD: usize = 16;

/// The least bound: a conversation of a few hundred messages is searched
/// in full however repetitive its words.
pub const MIN_CANDIDATE_VISITS: usize = 1 << 20;

/// How many candidate entries a run over `messages` messages whose word
/// sets hold `words` entries in all may visit.
pub fn candidate_visit_limit(messages: usize, words: usize) -> usize {
    if messages <= EXACT_SEARCH_MESSAGES {
        usize::MAX
    } else {
        words
            .saturating_mul(CANDIDATE_VISITS_PER_WORD)
            .max(MIN_CANDIDATE_VISITS)
    }
}

pub(super) fn run(work: &mut Working, scores: &Scores, policy: &Policy) -> DedupeStage {
    search(work, scores, policy).0
}

/// The stage, and how many candidate entries it visited.
fn search(work: &mut Working, scores: &Scores, policy: &Policy) -> (DedupeStage, usize) {
    let threshold = policy.duplicate_threshold.max(f64::MIN_POSITIVE);
    let mut removed = Vec::new();
    let mut visits = 0usize;
    if !work.fits() {
        let index = PrefixIndex::new(scores, threshold);
        let words = scores.word_sets.iter().map(Vec::len).sum();
        let limit = candidate_visit_limit(work.messages.len(), words);
        let mut seen = Postings::with_capacity(index.len());
        let mut candidates = Vec::new();
        let mut marked = MarkedSet::new();
        for j in 0..work.messages.len() {
            if work.fits() {
                break;
            }
            let message = &work.messages[j];
            if !work.present[j] {
                continue;
            }
            let prefix = index.prefix(j);
            // A grouped message is never removed (that would orphan its
            // group), but it is an earlier message others can duplicate.
            if !work.protected[j] && message.group.is_none() {
                candidates.clear();
                for &token in prefix {
                    candidates.extend(seen.messages((message.role, token)));
                }
                visits += candidates.len();
                if visits > limit {
                    break;
                }
                candidates.sort_unstable();
                candidates.dedup();
                if !candidates.is_empty() {
                    marked.mark(&scores.word_sets[j], scores.vocabulary_len());
                }
                let first = candidates.iter().find_map(|&i| {
                    Some((i, marked.jaccard_at_least(&scores.word_sets[i], threshold)?))
                });
                if let Some((i, similarity)) = first {
                    removed.push(Duplicate {
                        index: j,
                        duplicate_of: i,
                        similarity: round_to(similarity, 6),
                        chars: work.chars(j),
                    });
                    work.remove(j);
                    continue;
                }
            }
            for &token in prefix {
                seen.add((message.role, token), j);
            }
        }
    }
    let stage = DedupeStage {
        stage: "dedupe",
        order: 2,
        removed_messages: removed.len(),
        removed,
        rule: DedupeRule {
            duplicate_threshold: policy.duplicate_threshold,
            method: DEDUPE_METHOD,
        },
    };
    (stage, visits)
}

/// The earlier messages that hold each (role, prefix token), as linked
/// lists in one vector: a conversation has thousands of distinct prefix
/// tokens, and a vector per token would be as many allocations.
#[derive(Default)]
struct Postings {
    /// Where each key's list starts in `entries`.
    heads: FxHashMap<(Role, u32), u32>,
    /// (message, the entry after it or [`Postings::END`]).
    entries: Vec<(u32, u32)>,
}

impl Postings {
    const END: u32 = u32::MAX;

    fn with_capacity(entries: usize) -> Self {
        Postings {
            heads: FxHashMap::with_capacity_and_hasher(entries, Default::default()),
            entries: Vec::with_capacity(entries),
        }
    }

    fn add(&mut self, key: (Role, u32), message: usize) {
        let entry = self.entries.len() as u32;
        let next = self.heads.insert(key, entry).unwrap_or(Self::END);
        self.entries.push((message as u32, next));
    }

    /// The messages added under `key`, latest first.
    fn messages(&self, key: (Role, u32)) -> impl Iterator<Item = usize> + '_ {
        let mut at = self.heads.get(&key).copied().unwrap_or(Self::END);
        std::iter::from_fn(move || {
            let &(message, next) = self.entries.get(at as usize)?;
            at = next;
            Some(message as usize)
        })
    }
}

/// Each message's prefix tokens under one global token order (rarest
/// first, so prefixes are selective). Tokens are stored as their rank in
/// that order.
struct PrefixIndex {
    prefixes: Vec<Vec<u32>>,
}

impl PrefixIndex {
    /// Lists the messages holding each token by the token's rank (a
    /// counting sort), then walks the ranks from the rarest: each message
    /// takes the tokens it meets until its prefix is full. Each step is
    /// one linear pass over the entries, cheaper than a selection per
    /// message.
    fn new(scores: &Scores, threshold: f64) -> Self {
        let sets = &scores.word_sets;
        let mut document_frequency = vec![0u32; scores.vocabulary_len()];
        for set in sets {
            for &id in set {
                document_frequency[id as usize] += 1;
            }
        }
        let rank = ranks_by_rarity(&document_frequency);
        // Where each rank's holders start in `holders`.
        let mut starts = vec![0u32; rank.len() + 1];
        for (id, &df) in document_frequency.iter().enumerate() {
            starts[rank[id] as usize + 1] = df;
        }
        for r in 1..starts.len() {
            starts[r] += starts[r - 1];
        }
        let mut fill = starts.clone();
        let mut holders = vec![0u32; starts[rank.len()] as usize];
        for (message, set) in sets.iter().enumerate() {
            for &id in set {
                let at = &mut fill[rank[id as usize] as usize];
                holders[*at as usize] = message as u32;
                *at += 1;
            }
        }
        let wanted: Vec<usize> = sets
            .iter()
            .map(|set| prefix_len(set.len(), threshold))
            .collect();
        let mut prefixes: Vec<Vec<u32>> =
            wanted.iter().map(|&len| Vec::with_capacity(len)).collect();
        let mut unfilled = wanted.iter().filter(|&&len| len > 0).count();
        for (r, span) in starts.windows(2).enumerate() {
            if unfilled == 0 {
                break;
            }
            for &message in &holders[span[0] as usize..span[1] as usize] {
                let prefix = &mut prefixes[message as usize];
                if prefix.len() < wanted[message as usize] {
                    prefix.push(r as u32);
                    unfilled -= usize::from(prefix.len() == wanted[message as usize]);
                }
            }
        }
        PrefixIndex { prefixes }
    }

    /// Prefix tokens over all messages.
    fn len(&self) -> usize {
        self.prefixes.iter().map(Vec::len).sum()
    }

    fn prefix(&self, i: usize) -> &[u32] {
        &self.prefixes[i]
    }
}

/// `len - ceil(t * len) + 1`, one longer to absorb float error in the
/// product: a longer prefix only adds candidates, never loses a pair.
fn prefix_len(len: usize, threshold: f64) -> usize {
    if len == 0 {
        return 0;
    }
    let overlap = (threshold * len as f64).ceil() as usize;
    (len + 2).saturating_sub(overlap).clamp(1, len)
}

/// Each token's rank in the order (document frequency, id): rarest first.
/// A counting sort: frequencies are at most the message count, and ids
/// taken in increasing order stay in that order within a frequency.
fn ranks_by_rarity(document_frequency: &[u32]) -> Vec<u32> {
    let most = document_frequency.iter().copied().max().unwrap_or(0) as usize;
    let mut next_rank = vec![0u32; most + 2];
    for &df in document_frequency {
        next_rank[df as usize + 1] += 1;
    }
    for f in 1..next_rank.len() {
        next_rank[f] += next_rank[f - 1];
    }
    let mut rank = vec![0u32; document_frequency.len()];
    for (id, &df) in document_frequency.iter().enumerate() {
        let next = &mut next_rank[df as usize];
        rank[id] = *next;
        *next += 1;
    }
    rank
}

#[cfg(test)]
mod tests {
    use super::{candidate_visit_limit, prefix_len, ranks_by_rarity, EXACT_SEARCH_MESSAGES};
    use super::{search, Scores};
    use crate::engine::{compact, Message, Policy, Role, Working};

    #[test]
    fn a_message_exactly_at_the_threshold_is_a_duplicate() {
        // Jaccard 55 / 100 = 0.55, the threshold: the spec's `>=` holds.
        let words = |n: usize| {
            (0..n)
                .map(|i| format!("w{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        let mut messages = vec![
            Message::new(Role::User, words(100)),
            Message::new(Role::User, words(55)),
        ];
        messages.extend((0..5).map(|_| Message::new(Role::Assistant, "ok")));
        let policy = Policy {
            duplicate_threshold: 0.55,
            ..Policy::with_budget(10)
        };
        let removed = compact(&messages, &policy).stages.dedupe.removed;
        assert_eq!(removed.len(), 1);
        assert_eq!((removed[0].index, removed[0].duplicate_of), (1, 0));
        assert_eq!(removed[0].similarity, 0.55);
    }

    #[test]
    fn ranks_follow_frequency_then_id() {
        let cases: [&[u32]; 4] = [&[], &[0], &[3, 1, 3, 0, 1, 7, 1], &[2, 2, 2, 2]];
        for df in cases {
            let mut order: Vec<u32> = (0..df.len() as u32).collect();
            order.sort_unstable_by_key(|&id| (df[id as usize], id));
            let mut expected = vec![0u32; df.len()];
            for (r, &id) in order.iter().enumerate() {
                expected[id as usize] = r as u32;
            }
            assert_eq!(ranks_by_rarity(df), expected, "{df:?}");
        }
    }

    #[test]
    fn a_narrow_vocabulary_cannot_buy_a_quadratic_search() {
        // 20,000 messages of 8 to 13 words drawn from 30: every earlier
        // message of the same role is a candidate, so the exhaustive search
        // would visit about n^2 / 2 = 2 * 10^8 candidates.
        let vocabulary: Vec<String> = (0..30).map(|i| format!("word{i}")).collect();
        let mut state = 7u64;
        let mut next = |n: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1);
            ((state >> 33) % n) as usize
        };
        let messages: Vec<Message> = (0..20_000)
            .map(|i| {
                let len = 8 + next(6);
                let text: Vec<&str> = (0..len).map(|_| vocabulary[next(30)].as_str()).collect();
                let role = if i % 2 == 0 {
                    Role::User
                } else {
                    Role::Assistant
                };
                Message::new(role, text.join(" "))
            })
            .collect();
        let scores = Scores::new(&messages, &crate::engine::NoCaches);
        let words: usize = scores.word_sets.iter().map(Vec::len).sum();
        let limit = candidate_visit_limit(messages.len(), words);
        assert!(limit <= 16 * 13 * 20_000, "linear in the words: {limit}");
        let policy = Policy::with_budget(100_000);
        let mut work = Working::new(&messages, policy.budget_chars);
        let (_, visits) = search(&mut work, &scores, &policy);
        // Stopped at the limit, past it by at most one message's candidates
        // (at most its prefix, 3 tokens here, times the earlier messages).
        assert!(visits > limit, "the search reached the limit: {visits}");
        assert!(visits <= limit + 3 * 20_000, "{visits} > {limit}");
        // The whole engine still meets the budget, through drop.
        let report = compact(&messages, &policy);
        assert!(report.loss.output_chars <= 100_000);
    }

    #[test]
    fn api_sized_conversations_get_the_exhaustive_search() {
        assert_eq!(candidate_visit_limit(EXACT_SEARCH_MESSAGES, 1), usize::MAX);
        assert!(candidate_visit_limit(EXACT_SEARCH_MESSAGES + 1, 1) < usize::MAX);
        // Each message of the API holds at most 8,000 chars, so at most
        // 4,000 distinct words; threshold 0.5 gives the longest prefixes:
        // the exhaustive search stays bounded.
        let longest_prefix = prefix_len(4000, 0.5);
        let worst: usize = (0..EXACT_SEARCH_MESSAGES).map(|j| longest_prefix * j).sum();
        assert!(worst < 50_000_000, "{worst}");
    }

    #[test]
    fn prefix_covers_every_pair_at_the_threshold() {
        // t = 0.5 over 10 tokens: sets sharing 5 of 10 must meet in 6 + 1.
        assert_eq!(prefix_len(10, 0.5), 7);
        assert_eq!(prefix_len(10, 1.0), 2);
        assert_eq!(prefix_len(1, 1.0), 1);
        assert_eq!(prefix_len(0, 0.9), 0);
    }
}
