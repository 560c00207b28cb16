//! Excerpts: what a relevant message keeps when it must be cut. Not its
//! head: the lines (or sentences) holding the most of the query's weight,
//! each table row with its table's header row, then their neighbours while
//! they fit, the cut parts standing as `[… N chars omitted …]` markers.

use std::sync::Arc;

use super::analysis::{message_key, AnalysisCache, CachedAnalysis};
use super::terms::{for_each_keyed_term, normalize, term_id, TermMasks, TermMemo};
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
    excerpt_cached(text, query, max_chars, &crate::engine::NoCaches)
}

/// [`excerpt`], with where each term of `text` stands ([`SegmentTerms`],
/// whatever the query) looked up in and added to `cache`: a long message
/// cut on one turn is cut on the next without scanning it again. The
/// same excerpt with any cache or none.
pub fn excerpt_cached(
    text: &str,
    query: &QueryTerms,
    max_chars: usize,
    cache: &dyn AnalysisCache,
) -> Option<String> {
    if query.ids.is_empty() || max_chars < MIN_EXCERPT_CHARS || char_count(text) <= max_chars {
        return None;
    }
    let terms = if cache.enabled() {
        let key = message_key(text) ^ SEGMENT_TERMS_KEY;
        match cache.get(key) {
            Some(CachedAnalysis::Segments(found)) => found,
            _ => {
                let fresh = Arc::new(SegmentTerms::of(text));
                cache.put(key, CachedAnalysis::Segments(fresh.clone()));
                fresh
            }
        }
    } else {
        Arc::new(SegmentTerms::of(text))
    };
    // The hits come in scan order within each segment, so the weights add
    // up in the order a scan of the text meets them.
    let hits = terms
        .hits
        .iter()
        .map(|hit| (hit.id, hit.segment as usize, hit.at as usize));
    let segments = &terms.segments;
    let (order, first_match) = score_segments(query, segments.len(), hits)?;
    // Each try is measured by counting the chosen segments' layout, not
    // rendering: the excerpt is rendered once, when chosen.
    choose(
        text,
        segments,
        terms.layout.by_lines,
        &order,
        &first_match,
        max_chars,
        &mut LayoutCount::new(&terms.layout),
    )
}

/// The segments holding a query term, best first (by the weight of the
/// distinct query terms each holds, then by position), and where each
/// segment's first match starts; `None` when no segment matches. `hits`:
/// (term id, segment, byte offset), in scan order.
fn score_segments(
    query: &QueryTerms,
    segments: usize,
    hits: impl Iterator<Item = (u64, usize, usize)>,
) -> Option<(Vec<usize>, Vec<usize>)> {
    // Each segment's matched query terms (a bit each, the first 64) and
    // weight.
    let mut matched = vec![0u64; segments];
    let mut score = vec![0.0f64; segments];
    let mut first_match = vec![usize::MAX; segments];
    // Most of a text's terms are no query term: one bit test each.
    let mut mask = [0u64; 4];
    for &id in &query.ids {
        mask[(id >> 6) as usize & 3] |= 1 << (id & 63);
    }
    for (id, s, at) in hits {
        if mask[(id >> 6) as usize & 3] & (1 << (id & 63)) == 0 {
            continue;
        }
        let Some(t) = query.ids.iter().position(|&q| q == id) else {
            continue;
        };
        let bit = 1u64 << (t % 64);
        if matched[s] & bit == 0 {
            matched[s] |= bit;
            score[s] += query.weights.get(t).copied().unwrap_or(1.0);
        }
        first_match[s] = first_match[s].min(at);
    }
    let mut order: Vec<usize> = (0..segments).filter(|&s| score[s] > 0.0).collect();
    if order.is_empty() {
        return None;
    }
    order.sort_by(|&a, &b| score[b].total_cmp(&score[a]).then(a.cmp(&b)));
    Some((order, first_match))
}

/// The excerpt of the segments in `order` (non-empty) that fit in
/// `max_chars` as `count` counts a choice, then their neighbours while
/// they fit; a window around the best one's first match when none fits.
fn choose(
    text: &str,
    segments: &[(usize, usize)],
    by_lines: bool,
    order: &[usize],
    first_match: &[usize],
    max_chars: usize,
    count: &mut impl Count,
) -> Option<String> {
    let mut chosen = vec![false; segments.len()];
    let mut any = false;
    let mut added = Vec::new();
    for &s in order.iter().take(MAX_TRIES) {
        added.clear();
        for u in unit_of(text, segments, s, by_lines) {
            if !chosen[u] {
                chosen[u] = true;
                count.pick(u);
                added.push(u);
            }
        }
        if count.chars() > max_chars {
            for &u in &added {
                chosen[u] = false;
                count.unpick(u);
            }
        } else {
            any = true;
        }
    }
    let best = order[0];
    if !any {
        // The best segment alone is too long: a window around its match.
        return window(text, first_match[best], max_chars);
    }
    // Neighbours of the best segment while they fit: context to read it by.
    let (mut lo, mut hi) = (best, best);
    for _ in 0..MAX_TRIES {
        let mut grew = false;
        for next in [hi + 1, lo.wrapping_sub(1)] {
            if next >= segments.len() || chosen[next] {
                continue;
            }
            chosen[next] = true;
            count.pick(next);
            if count.chars() > max_chars {
                chosen[next] = false;
                count.unpick(next);
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
    Some(render(text, segments, &chosen, by_lines, |s| {
        count.segment_chars(s)
    }))
}

/// What [`render`] makes of each segment, to count an excerpt's chars
/// without making it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Layout {
    /// Chars of the segments before each one as rendered (a line with its
    /// newline), and of all of them last: a run's chars by one subtraction.
    before: Vec<usize>,
    /// Whether a segment's rendered text is not empty, and whether it
    /// ends with a newline.
    nonempty: Vec<bool>,
    ends_with_newline: Vec<bool>,
    by_lines: bool,
}

impl Layout {
    fn new(text: &str, segments: &[(usize, usize)], by_lines: bool) -> Self {
        let pieces = segments.iter().map(|&(a, b)| {
            let end = if by_lines && b < text.len() { b + 1 } else { b };
            &text[a..end]
        });
        let mut layout = Layout {
            before: Vec::with_capacity(segments.len() + 1),
            nonempty: Vec::with_capacity(segments.len()),
            ends_with_newline: Vec::with_capacity(segments.len()),
            by_lines,
        };
        let mut total = 0;
        for piece in pieces {
            layout.before.push(total);
            total += char_count(piece);
            layout.nonempty.push(!piece.is_empty());
            layout.ends_with_newline.push(piece.ends_with('\n'));
        }
        layout.before.push(total);
        layout
    }

    /// Chars of segments `a..b` as rendered.
    fn between(&self, a: usize, b: usize) -> usize {
        self.before[b] - self.before[a]
    }

    /// What the omitted segments `a..b` render as: a marker and the
    /// newline (or space) after it, or nothing.
    fn gap(&self, a: usize, b: usize) -> usize {
        match self.between(a, b) {
            0 => 0,
            omitted => marker_chars(omitted) + 1,
        }
    }
}

/// How [`choose`] counts the excerpt it is making, segment by segment.
trait Count {
    /// Segment `s` is chosen (it was not).
    fn pick(&mut self, s: usize);
    /// Segment `s` is no longer chosen (it was).
    fn unpick(&mut self, s: usize);
    /// `char_count(&render(..))` of the chosen segments.
    fn chars(&self) -> usize;
    /// Chars of segment `s` as rendered.
    fn segment_chars(&self, s: usize) -> usize;
}

/// [`Count`] from a [`Layout`], kept as segments come and go: a try costs
/// the chosen segments next to it, not the text's.
struct LayoutCount<'l> {
    layout: &'l Layout,
    /// The chosen segments, in order.
    picked: Vec<usize>,
    /// Chars of the chosen segments and of the markers before each.
    inner: usize,
}

impl<'l> LayoutCount<'l> {
    fn new(layout: &'l Layout) -> Self {
        LayoutCount {
            layout,
            picked: Vec::new(),
            inner: 0,
        }
    }

    /// The first segment after the chosen one before place `at`.
    fn end_before(&self, at: usize) -> usize {
        at.checked_sub(1).map_or(0, |p| self.picked[p] + 1)
    }

    /// What the chosen segment at place `at` adds with the marker before
    /// it.
    fn with_gap(&self, at: usize) -> usize {
        let s = self.picked[at];
        self.layout.gap(self.end_before(at), s) + self.layout.between(s, s + 1)
    }
}

impl Count for LayoutCount<'_> {
    fn pick(&mut self, s: usize) {
        let at = self.picked.partition_point(|&p| p < s);
        if at < self.picked.len() {
            self.inner -= self.with_gap(at);
        }
        self.picked.insert(at, s);
        self.inner += self.with_gap(at);
        if at + 1 < self.picked.len() {
            self.inner += self.with_gap(at + 1);
        }
    }

    fn unpick(&mut self, s: usize) {
        let Ok(at) = self.picked.binary_search(&s) else {
            return;
        };
        if at + 1 < self.picked.len() {
            self.inner -= self.with_gap(at + 1);
        }
        self.inner -= self.with_gap(at);
        self.picked.remove(at);
        if at < self.picked.len() {
            self.inner += self.with_gap(at);
        }
    }

    fn chars(&self) -> usize {
        let layout = self.layout;
        let end = self.end_before(self.picked.len());
        let omitted = layout.between(end, layout.nonempty.len());
        if omitted == 0 {
            return self.inner;
        }
        // What the text rendered so far ends with: the last chosen
        // segment's, or the marker before it when it renders empty.
        let (mut nonempty, mut ends_with_newline) = (false, false);
        for at in (0..self.picked.len()).rev() {
            let s = self.picked[at];
            if layout.nonempty[s] {
                (nonempty, ends_with_newline) = (true, layout.ends_with_newline[s]);
                break;
            }
            if layout.between(self.end_before(at), s) > 0 {
                (nonempty, ends_with_newline) = (true, layout.by_lines);
                break;
            }
        }
        let newline = usize::from(layout.by_lines && !ends_with_newline && nonempty);
        self.inner + newline + marker_chars(omitted)
    }

    fn segment_chars(&self, s: usize) -> usize {
        self.layout.between(s, s + 1)
    }
}

/// `char_count(&omission_marker(omitted))`: `[… `, the digits with a
/// comma every three, ` chars omitted …]`.
fn marker_chars(omitted: usize) -> usize {
    let digits = omitted.checked_ilog10().map_or(1, |d| d as usize + 1);
    20 + digits + (digits - 1) / 3
}

/// Mixed into a text's [`message_key`] for its [`SegmentTerms`] entry.
const SEGMENT_TERMS_KEY: u128 = 0x5E67_3E47_7E25_0000_A5A5_0001_0000_0001;

/// Where each term of a text stands, whatever the query: for each of its
/// segments (lines, or sentences), each distinct term, in the order the
/// terms first occur in it, with the byte where it first occurs. What
/// [`excerpt`] reads of a text; a pure function of it, so cacheable.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SegmentTerms {
    hits: Vec<SegmentHit>,
    /// The text's segments ([`split`]): lines when it has a newline.
    segments: Vec<(usize, usize)>,
    /// How each segment renders.
    layout: Layout,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SegmentHit {
    id: u64,
    segment: u32,
    /// Byte offset in the text of the term's first occurrence in the
    /// segment.
    at: u32,
}

impl SegmentTerms {
    fn of(text: &str) -> Self {
        let by_lines = text.contains('\n');
        let segments = split(text, by_lines);
        let layout = Layout::new(text, &segments, by_lines);
        let base = text.as_ptr() as usize;
        let mut buf = String::new();
        // A text repeats its words (a log, a listing): each raw word is
        // normalised once; stopwords map to no term.
        let mut slot_of_raw = TermMemo::default();
        let mut ids: Vec<u64> = Vec::new();
        // The scan meets segments in order (a term never spans two: no
        // joiner is whitespace), so a term's hit in the segment being read
        // is the last one it made, if any.
        let mut hits: Vec<SegmentHit> = Vec::new();
        // Per slot: (segment + 1, hit index) of its last hit; 0: none yet.
        let mut last: Vec<(u32, u32)> = Vec::new();
        let mut segment = 0usize;
        // The terms in the order `for_each_term` gives them, an ASCII text
        // read from bit masks of its bytes.
        let mut masks = TermMasks::default();
        for_each_keyed_term(text, &mut masks, |raw, kind, key| {
            let slot = slot_of_raw.value(raw, key, || match normalize(raw, kind, &mut buf) {
                None => NO_TERM,
                Some(term) => {
                    ids.push(term_id(&term));
                    buf = term;
                    (ids.len() - 1) as u32
                }
            });
            if slot == NO_TERM {
                return;
            }
            let at = raw.as_ptr() as usize - base;
            while segment + 1 < segments.len() && segments[segment + 1].0 <= at {
                segment += 1;
            }
            let slot = slot as usize;
            if last.len() <= slot {
                last.resize(slot + 1, (0, 0));
            }
            let (seen_in, hit) = last[slot];
            if seen_in == segment as u32 + 1 {
                let hit = &mut hits[hit as usize];
                hit.at = hit.at.min(at as u32);
            } else {
                last[slot] = (segment as u32 + 1, hits.len() as u32);
                hits.push(SegmentHit {
                    id: ids[slot],
                    segment: segment as u32,
                    at: at as u32,
                });
            }
        });
        SegmentTerms {
            hits,
            segments,
            layout,
        }
    }

    /// Approximate bytes held, for a cache's weigher.
    pub fn weight(&self) -> u32 {
        let per_segment = std::mem::size_of::<(usize, usize)>() + std::mem::size_of::<usize>() + 2;
        let bytes = 64
            + self.hits.len() * std::mem::size_of::<SegmentHit>()
            + self.segments.len() * per_segment;
        u32::try_from(bytes).unwrap_or(u32::MAX)
    }
}

/// What [`SegmentTerms::of`]'s memo maps a stopword to.
const NO_TERM: u32 = u32::MAX;

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

/// The chosen segments in order, each run of the others as one marker
/// (of the chars `chars` counts in each segment as rendered).
fn render(
    text: &str,
    segments: &[(usize, usize)],
    chosen: &[bool],
    by_lines: bool,
    chars: impl Fn(usize) -> usize,
) -> String {
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
            omitted += chars(s);
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
    use super::super::terms::for_each_term;
    use super::*;
    use proptest::prelude::Strategy;

    fn query(words: &[&str]) -> QueryTerms {
        QueryTerms {
            ids: words.iter().map(|w| term_id(w)).collect(),
            weights: vec![1.0; words.len()],
        }
    }

    #[test]
    fn marker_chars_counts_the_marker() {
        for n in (0..20_000).chain([99_999, 100_000, 999_999, 1_000_000, 12_345_678]) {
            assert_eq!(marker_chars(n), char_count(&omission_marker(n)), "{n}");
        }
    }

    #[test]
    fn a_layout_counts_what_render_makes() {
        let texts = [
            "one\ntwo three\n\nfour\n",
            "a\n\n\nb",
            "\n",
            "First. Second one!  Third?\tfourth",
            "配送状態。\n配送! 配送\n状態の更新です",
            "x",
        ];
        for text in texts {
            for by_lines in [true, false] {
                let segments = split(text, by_lines);
                let layout = Layout::new(text, &segments, by_lines);
                for bits in 0..1u32 << segments.len().min(12) {
                    let chosen: Vec<bool> =
                        (0..segments.len()).map(|s| bits & (1 << s) != 0).collect();
                    // Picked in turn, and unpicked again to the same choice.
                    let mut count = LayoutCount::new(&layout);
                    for s in (0..segments.len()).rev().filter(|&s| chosen[s]) {
                        count.pick(s);
                    }
                    let mut again = LayoutCount::new(&layout);
                    for s in 0..segments.len() {
                        again.pick(s);
                    }
                    for s in (0..segments.len()).filter(|&s| !chosen[s]) {
                        again.unpick(s);
                    }
                    assert_eq!(count.chars(), again.chars());
                    assert_eq!(
                        render(text, &segments, &chosen, by_lines, |s| count
                            .segment_chars(s)),
                        render(text, &segments, &chosen, by_lines, |s| {
                            piece_chars(text, &segments, by_lines, s)
                        }),
                    );
                    assert_eq!(
                        count.chars(),
                        char_count(&render(text, &segments, &chosen, by_lines, |s| {
                            piece_chars(text, &segments, by_lines, s)
                        })),
                        "{text:?} {by_lines} {chosen:?}"
                    );
                }
            }
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

    /// The excerpt as it was first written: every occurrence of every
    /// term found by scanning the text, and each try rendered and counted.
    /// What counting the layout and reading cached [`SegmentTerms`] must
    /// match.
    fn excerpt_by_rendering(text: &str, query: &QueryTerms, max_chars: usize) -> Option<String> {
        if query.ids.is_empty() || max_chars < MIN_EXCERPT_CHARS || char_count(text) <= max_chars {
            return None;
        }
        let by_lines = text.contains('\n');
        let segments = split(text, by_lines);
        let base = text.as_ptr() as usize;
        let mut buf = String::new();
        let mut hits = Vec::new();
        for_each_term(text, |raw, kind| {
            let Some(term) = normalize(raw, kind, &mut buf) else {
                return;
            };
            let id = term_id(&term);
            buf = term;
            let at = raw.as_ptr() as usize - base;
            let s = segments.partition_point(|&(start, _)| start <= at) - 1;
            hits.push((id, s, at));
        });
        let (order, first_match) = score_segments(query, segments.len(), hits.into_iter())?;
        choose(
            text,
            &segments,
            by_lines,
            &order,
            &first_match,
            max_chars,
            &mut Rendered {
                text,
                segments: &segments,
                by_lines,
                chosen: vec![false; segments.len()],
            },
        )
    }

    /// [`Count`] by rendering.
    struct Rendered<'t> {
        text: &'t str,
        segments: &'t [(usize, usize)],
        by_lines: bool,
        chosen: Vec<bool>,
    }

    impl Count for Rendered<'_> {
        fn pick(&mut self, s: usize) {
            self.chosen[s] = true;
        }
        fn unpick(&mut self, s: usize) {
            self.chosen[s] = false;
        }
        fn chars(&self) -> usize {
            char_count(&render(
                self.text,
                self.segments,
                &self.chosen,
                self.by_lines,
                |s| self.segment_chars(s),
            ))
        }
        fn segment_chars(&self, s: usize) -> usize {
            piece_chars(self.text, self.segments, self.by_lines, s)
        }
    }

    /// Chars of segment `s` as rendered, counted in the text.
    fn piece_chars(text: &str, segments: &[(usize, usize)], by_lines: bool, s: usize) -> usize {
        let (a, b) = segments[s];
        let end = if by_lines && b < text.len() { b + 1 } else { b };
        char_count(&text[a..end])
    }

    /// An in-memory cache, for the warm path.
    #[derive(Default)]
    struct Map(std::sync::Mutex<std::collections::HashMap<u128, CachedAnalysis>>);

    impl AnalysisCache for Map {
        fn get(&self, key: u128) -> Option<CachedAnalysis> {
            self.0.lock().unwrap().get(&key).cloned()
        }
        fn put(&self, key: u128, value: CachedAnalysis) {
            self.0.lock().unwrap().insert(key, value);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(400))]
        /// Lines, sentences, table rows and repeated words: the excerpt is
        /// the one rendering every try makes, without a cache, cold and
        /// warm.
        #[test]
        fn counting_and_caching_cut_what_rendering_cut(
            pieces in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::sample::select(vec![
                        "halden", "gate", "code", "7731-KAPPA", "the", "is", "log",
                        "Halden's", "src/main.rs", "depot", "ERROR", "配送", "a",
                    ]).prop_map(str::to_owned),
                    proptest::string::string_regex("[a-z]{1,9}").unwrap(),
                    proptest::sample::select(vec![
                        " ", " ", " ", "\n", ". ", "! ", "\n| ", " | ", " |\n", "\n|---|---|\n", "\n\n",
                    ]).prop_map(str::to_owned),
                ],
                0..300,
            ),
            asked in proptest::collection::vec(
                proptest::sample::select(vec!["halden", "gate", "code", "7731-kappa", "log", "depot", "error", "main.rs"]),
                1..4,
            ),
            weights in proptest::collection::vec(0.1f64..3.0, 4),
            max_chars in 40usize..700,
        ) {
            let text = pieces.concat();
            let query = QueryTerms {
                ids: asked.iter().map(|w| term_id(w)).collect(),
                weights: weights[..asked.len()].to_vec(),
            };
            let expected = excerpt_by_rendering(&text, &query, max_chars);
            proptest::prop_assert_eq!(&excerpt(&text, &query, max_chars), &expected);
            let cache = Map::default();
            for _ in 0..2 {
                proptest::prop_assert_eq!(&excerpt_cached(&text, &query, max_chars, &cache), &expected);
            }
        }
    }
}
