//! Stage 3, trim: cut unprotected survivors longer than `max_message_chars`
//! at the last sentence boundary, or hard at the limit when that boundary
//! would keep less than 40 percent of it.

use super::relevance::{excerpt_cached, Relevance};
use super::{Cut, Policy, TrimRule, TrimStage, Trimmed, Working, TRIM_CUT_AT};

/// Share of the limit a sentence cut must keep; below it the cut is hard.
const MIN_SENTENCE_SHARE: f64 = 0.4;

pub(super) fn run(
    work: &mut Working,
    policy: &Policy,
    found: Option<&Relevance>,
    caches: &dyn super::Caches,
) -> TrimStage {
    let limit = policy.max_message_chars;
    let mut trimmed = std::mem::take(&mut work.pinned_excerpts);
    let candidates: Vec<usize> = work.candidates().collect();
    for j in candidates {
        if work.fits() {
            break;
        }
        if work.content_chars[j] <= limit {
            continue;
        }
        let original_chars = work.chars(j);
        // A relevant message keeps its part around the match.
        let around = found
            .filter(|f| f.relevance[j] > 0.0)
            .and_then(|f| excerpt_cached(&work.messages[j].content, &f.query, limit, caches));
        let cut = match around {
            Some(text) => {
                work.set_excerpt(j, text);
                Cut::Match
            }
            None => {
                let (kept, cut) = cut_point(&work.messages[j].content, limit);
                work.set_kept(j, kept);
                cut
            }
        };
        trimmed.push(Trimmed {
            index: j,
            original_chars,
            chars: work.chars(j),
            cut,
        });
    }
    TrimStage {
        stage: "trim",
        order: 3,
        trimmed_messages: trimmed.len(),
        trimmed,
        rule: TrimRule {
            max_message_chars: limit,
            cut_at: TRIM_CUT_AT,
        },
    }
}

/// Chars to keep of a text longer than `limit`, and how it was cut.
///
/// A sentence boundary is a count p of kept chars where char p-1 is `.`, `!`
/// or `?` and char p is whitespace (or p is the end, which cannot happen
/// here since the text is longer than the limit).
pub(super) fn cut_point(content: &str, limit: usize) -> (usize, Cut) {
    // Chars are bytes in ASCII text: look back from the limit, down to the
    // shortest sentence cut allowed, for the last boundary.
    if let Some(head) = content.as_bytes().get(..=limit).filter(|h| h.is_ascii()) {
        let shortest = (MIN_SENTENCE_SHARE * limit as f64).ceil() as usize;
        let boundary = (shortest.max(1)..=limit).rev().find(|&p| {
            matches!(head[p - 1], b'.' | b'!' | b'?') && matches!(head[p], b'\t'..=b'\r' | b' ')
        });
        return match boundary {
            Some(p) => (p, Cut::Sentence),
            None => (limit, Cut::Hard),
        };
    }
    let mut best = 0;
    let mut prev_ends_sentence = false;
    // Positions p = 1..=limit: look at char p-1 (prev) and char p.
    for (p, c) in content.chars().take(limit + 1).enumerate() {
        if p > 0 && prev_ends_sentence && c.is_whitespace() {
            best = p;
        }
        prev_ends_sentence = matches!(c, '.' | '!' | '?');
    }
    if best as f64 >= MIN_SENTENCE_SHARE * limit as f64 {
        (best, Cut::Sentence)
    } else {
        (limit, Cut::Hard)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_after_the_last_sentence_end_within_the_limit() {
        // "One. Two! Three? four" with limit 12: boundaries at 4 and 9.
        assert_eq!(cut_point("One. Two! Three? four", 12), (9, Cut::Sentence));
    }

    #[test]
    fn cuts_hard_when_the_boundary_keeps_under_forty_percent() {
        // Boundary at 2 of limit 10 is 20 percent.
        assert_eq!(cut_point("A. bcdefghijklmnop", 10), (10, Cut::Hard));
        // Boundary at exactly 40 percent counts as a sentence cut.
        assert_eq!(cut_point("abc. efghijklmnop", 10), (4, Cut::Sentence));
    }

    #[test]
    fn a_boundary_needs_whitespace_after_the_mark() {
        assert_eq!(cut_point("v1.2.3 is out and more", 10), (10, Cut::Hard));
    }

    #[test]
    fn a_boundary_exactly_at_the_limit_counts() {
        // char 9 is '.', char 10 is ' ': p = 10 = limit.
        assert_eq!(cut_point("abcdefghi. tail", 10), (10, Cut::Sentence));
    }

    #[test]
    fn the_ascii_path_agrees_with_the_char_by_char_rule() {
        // The char-by-char rule, as the spec words it.
        let by_chars = |content: &str, limit: usize| {
            let chars: Vec<char> = content.chars().collect();
            let best = (1..=limit)
                .filter(|&p| matches!(chars[p - 1], '.' | '!' | '?') && chars[p].is_whitespace())
                .max()
                .unwrap_or(0);
            if best as f64 >= MIN_SENTENCE_SHARE * limit as f64 {
                (best, Cut::Sentence)
            } else {
                (limit, Cut::Hard)
            }
        };
        let texts = [
            "One. Two! Three? four five six seven",
            "a.\tb?\nc!\rd.\x0be.\x0cf. g.h",
            "No boundary at all in this text whatsoever",
            "x. yyyyyyyyyyyyyyyyyyyyyyyyyyy",
            "Ends. ",
        ];
        for text in texts {
            for limit in 1..text.len() {
                assert_eq!(
                    cut_point(text, limit),
                    by_chars(text, limit),
                    "{text:?} {limit}"
                );
            }
        }
    }

    #[test]
    fn limits_count_scalar_values_not_bytes() {
        let text = "配送状態。 配送! 配送状態の更新です";
        // '!' is char 8, whitespace char 9: p = 9 >= 0.4 * 12.
        assert_eq!(cut_point(text, 12), (9, Cut::Sentence));
    }
}
