//! Excerpts: what a relevant message keeps when it must be cut. Not its
//! head: the lines (or sentences) holding the most of the query's weight,
//! each table row with its table's header row, then their neighbours while
//! they fit, the cut parts standing as `[… N chars omitted …]` markers.

use super::terms::{for_each_term, normalize, term_id};
use crate::engine::text::char_count;

/// The query an excerpt looks for: each term's id and weight (its query
/// weight times its idf over the history).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct QueryTerms {
    pub ids: Vec<u64>,
    pub weights: Vec<f64>,
}

/// The marker that stands for `omitted` cut chars (the agent passes'
/// wording).
pub fn omission_marker(omitted: usize) -> String {
    let digits = omitted.to_string();
    let mut n = String::with_capacity(digits.len() + digits.len() / 3);
    for (k, c) in digits.chars().enumerate() {
        if k > 0 && (digits.len() - k) % 3 == 0 {
            n.push(',');
        }
        n.push(c);
    }
    format!("[… {n} chars omitted …]")
}

/// The smallest excerpt worth making: a marker and a few words.
const MIN_EXCERPT_CHARS: usize = 60;

/// How many tries the greedy choice makes before it settles.
const MAX_TRIES: usize = 64;

/// `text` cut to at most `max_chars` chars around where `query` matches
/// it; `None` when no query term is in it, `max_chars` is too small, or
/// the text fits already.
pub fn excerpt(text: &str, query: &QueryTerms, max_chars: usize) -> Option<String> {
    if query.ids.is_empty() || max_chars < MIN_EXCERPT_CHARS || char_count(text) <= max_chars {
        return None;
    }
    let by_lines = text.contains('\n');
    let segments = split(text, by_lines);
    // Each segment's matched query terms (a bit each, the first 64) and
    // weight, and where its first match starts.
    let mut matched = vec![0u64; segments.len()];
    let mut score = vec![0.0f64; segments.len()];
    let mut first_match = vec![usize::MAX; segments.len()];
    let base = text.as_ptr() as usize;
    let mut buf = String::new();
    for_each_term(text, |raw, kind| {
        let Some(term) = normalize(raw, kind, &mut buf) else {
            return;
        };
        let id = term_id(&term);
        buf = term;
        let Some(t) = query.ids.iter().position(|&q| q == id) else {
            return;
        };
        let at = raw.as_ptr() as usize - base;
        let s = segments.partition_point(|&(start, _)| start <= at) - 1;
        let bit = 1u64 << (t % 64);
        if matched[s] & bit == 0 {
            matched[s] |= bit;
            score[s] += query.weights.get(t).copied().unwrap_or(1.0);
        }
        first_match[s] = first_match[s].min(at);
    });
    let mut order: Vec<usize> = (0..segments.len()).filter(|&s| score[s] > 0.0).collect();
    if order.is_empty() {
        return None;
    }
    order.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));

    let render = |chosen: &[bool]| render(text, &segments, chosen, by_lines);
    let mut chosen = vec![false; segments.len()];
    let mut any = false;
    for &s in order.iter().take(MAX_TRIES) {
        let unit = unit_of(text, &segments, s, by_lines);
        let before = chosen.clone();
        for &u in &unit {
            chosen[u] = true;
        }
        if char_count(&render(&chosen)) > max_chars {
            chosen = before;
        } else {
            any = true;
        }
    }
    if !any {
        // The best segment alone is too long: a window around its match.
        let best = order[0];
        return window(text, first_match[best], max_chars);
    }
    // Neighbours of the best segment while they fit: context to read it by.
    let best = order[0];
    let (mut lo, mut hi) = (best, best);
    for _ in 0..MAX_TRIES {
        let mut grew = false;
        for next in [hi + 1, lo.wrapping_sub(1)] {
            if next >= segments.len() || chosen[next] {
                continue;
            }
            chosen[next] = true;
            if char_count(&render(&chosen)) > max_chars {
                chosen[next] = false;
            } else {
                grew = true;
                lo = lo.min(next);
                hi = hi.max(next);
            }
        }
        if !grew {
            break;
        }
    }
    Some(render(&chosen))
}

/// Byte ranges of `text`'s lines (without their newline) or sentences
/// (each with the whitespace after it), covering it in order.
fn split(text: &str, by_lines: bool) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    if by_lines {
        let mut start = 0;
        for (i, b) in text.bytes().enumerate() {
            if b == b'\n' {
                out.push((start, i));
                start = i + 1;
            }
        }
        out.push((start, text.len()));
        return out;
    }
    let bytes = text.as_bytes();
    let mut start = 0;
    let mut i = 0;
    while i < bytes.len() {
        if matches!(bytes[i], b'.' | b'!' | b'?')
            && bytes.get(i + 1).is_some_and(|b| b.is_ascii_whitespace())
        {
            let mut end = i + 1;
            while end < bytes.len() && bytes[end].is_ascii_whitespace() {
                end += 1;
            }
            out.push((start, end));
            start = end;
            i = end;
            continue;
        }
        i += 1;
    }
    if start < bytes.len() {
        out.push((start, bytes.len()));
    }
    out
}

/// Whether line `s` is a markdown table row.
fn is_row(text: &str, segments: &[(usize, usize)], s: usize) -> bool {
    let (a, b) = segments[s];
    text[a..b].trim_start().starts_with('|')
}

/// Segment `s` with what it cannot be read without: a table row takes its
/// table's header row and the separator under it.
fn unit_of(text: &str, segments: &[(usize, usize)], s: usize, by_lines: bool) -> Vec<usize> {
    let mut unit = vec![s];
    if by_lines && is_row(text, segments, s) {
        let mut header = s;
        while header > 0 && is_row(text, segments, header - 1) {
            header -= 1;
        }
        if header != s {
            unit.push(header);
            let separator = header + 1;
            let (a, b) = segments[separator];
            if separator != s
                && text[a..b]
                    .trim()
                    .bytes()
                    .all(|c| matches!(c, b'|' | b'-' | b':' | b' '))
            {
                unit.push(separator);
            }
        }
    }
    unit
}

/// The chosen segments in order, each run of the others as one marker.
fn render(text: &str, segments: &[(usize, usize)], chosen: &[bool], by_lines: bool) -> String {
    let mut out = String::new();
    let mut omitted = 0usize;
    let flush = |out: &mut String, omitted: &mut usize| {
        if *omitted > 0 {
            out.push_str(&omission_marker(*omitted));
            out.push(if by_lines { '\n' } else { ' ' });
            *omitted = 0;
        }
    };
    for (s, &(a, b)) in segments.iter().enumerate() {
        // A line's newline goes with it.
        let end = if by_lines && b < text.len() { b + 1 } else { b };
        if chosen[s] {
            flush(&mut out, &mut omitted);
            out.push_str(&text[a..end]);
        } else {
            omitted += char_count(&text[a..end]);
        }
    }
    if omitted > 0 {
        if by_lines && !out.ends_with('\n') && !out.is_empty() {
            out.push('\n');
        }
        out.push_str(&omission_marker(omitted));
    }
    out
}

/// The fewest chars of text a window keeps: fewer say nothing.
const MIN_WINDOW_CHARS: usize = 40;

/// `max_chars` chars of `text` around byte `at`, with markers for the
/// rest; `None` when the markers leave too little.
fn window(text: &str, at: usize, max_chars: usize) -> Option<String> {
    let chars: Vec<(usize, char)> = text.char_indices().collect();
    let total = chars.len();
    let at_char = chars.partition_point(|&(i, _)| i < at);
    // Room for two markers of the largest count.
    let marker = char_count(&omission_marker(total)) + 1;
    let keep = max_chars.saturating_sub(2 * marker);
    if keep < MIN_WINDOW_CHARS {
        return None;
    }
    let start = at_char
        .saturating_sub(keep / 3)
        .min(total.saturating_sub(keep));
    let end = (start + keep).min(total);
    let byte = |c: usize| chars.get(c).map_or(text.len(), |&(i, _)| i);
    let mut out = String::new();
    if start > 0 {
        out.push_str(&omission_marker(start));
        out.push(' ');
    }
    out.push_str(&text[byte(start)..byte(end)]);
    if end < total {
        out.push(' ');
        out.push_str(&omission_marker(total - end));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(words: &[&str]) -> QueryTerms {
        QueryTerms {
            ids: words.iter().map(|w| term_id(w)).collect(),
            weights: vec![1.0; words.len()],
        }
    }

    #[test]
    fn an_excerpt_keeps_the_matching_line_not_the_head() {
        let mut lines: Vec<String> = (0..200).map(|i| format!("line {i} of the log")).collect();
        lines[120] = "ERROR upstream refused the batch, code E4471".into();
        let text = lines.join("\n");
        let cut = excerpt(&text, &query(&["e4471", "error"]), 300).unwrap();
        assert!(char_count(&cut) <= 300, "{}", char_count(&cut));
        assert!(cut.contains("code E4471"), "{cut}");
        assert!(!cut.starts_with("line 0 "), "{cut}");
        assert!(cut.contains("chars omitted"));
    }

    #[test]
    fn a_table_row_comes_with_its_header() {
        let mut text = String::from("Counts per site:\n\n| Site | Q1 | Q2 |\n|---|---|---|\n");
        for i in 0..100 {
            text.push_str(&format!("| Place{i} | {i}1 | {i}2 |\n"));
        }
        text.push_str("| Halden | 417 | 981 |\n\nDone.");
        let cut = excerpt(&text, &query(&["halden"]), 200).unwrap();
        assert!(cut.contains("| Site | Q1 | Q2 |\n|---|---|---|\n"), "{cut}");
        assert!(cut.contains("| Halden | 417 | 981 |"), "{cut}");
        assert!(char_count(&cut) <= 200);
    }

    #[test]
    fn prose_is_cut_by_sentences_and_a_long_one_by_a_window() {
        let text = format!(
            "{} The gate code for Halden is 7731-KAPPA. {}",
            "Filler words here. ".repeat(40),
            "More filler. ".repeat(40)
        );
        let cut = excerpt(&text, &query(&["halden"]), 120).unwrap();
        assert!(
            cut.contains("The gate code for Halden is 7731-KAPPA."),
            "{cut}"
        );
        let long = format!("{}halden{}", "x ".repeat(500), " y".repeat(500));
        let cut = excerpt(&long, &query(&["halden"]), 100).unwrap();
        assert!(cut.contains("halden") && char_count(&cut) <= 100, "{cut}");
        assert_eq!(excerpt(&text, &query(&["nowhere"]), 120), None);
    }
}
