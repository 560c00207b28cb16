//! The spans-and-splice machinery every body format shares: a parsed body
//! remembers where each item, each text string and each content element sits
//! in the original bytes, and the forwarded body is the original with edits
//! applied at those spans. Nothing outside an edit is re-encoded.

use std::borrow::Cow;
use std::ops::Range;

use serde_json::value::RawValue;

use super::{Parsed, Plan};
use crate::engine::text::{char_count, char_prefix};

/// Byte range of `inner` within `outer`; `inner` must borrow from `outer`.
pub(crate) fn span(outer: &str, inner: &str) -> Range<usize> {
    let start = inner.as_ptr() as usize - outer.as_ptr() as usize;
    debug_assert!(start + inner.len() <= outer.len());
    start..start + inner.len()
}

/// The elements of a JSON array, as raw spans borrowed from it.
pub(crate) fn elements(array: &str) -> Option<Vec<&RawValue>> {
    serde_json::from_str(array).ok()
}

/// A JSON string's span in `body` and its decoded text; `None` when `raw`
/// is not a string.
pub(crate) fn string_at<'a>(
    body: &'a str,
    raw: &'a RawValue,
) -> Option<(Range<usize>, Cow<'a, str>)> {
    let text = raw.get();
    if !text.starts_with('"') {
        return None;
    }
    // `raw` was read as valid JSON: without a backslash, the string's text
    // is what lies between its quotes. (`memchr` reads 32 bytes a step
    // where `slice::contains` reads 8: this runs over all the text.)
    let inner = &text[1..text.len() - 1];
    if memchr::memchr(b'\\', inner.as_bytes()).is_none() {
        return Some((span(body, text), Cow::Borrowed(inner)));
    }
    Some((span(body, text), serde_json::from_str(text).ok()?))
}

/// A JSON string literal of `text`.
pub(crate) fn json_string(text: &str) -> String {
    // Most text has nothing to escape; finding that out over every byte,
    // without stopping early, compiles to a vector loop, while the encoder
    // looks each byte up in a table.
    let plain = !text.bytes().fold(false, |escape, b| {
        escape | (b < 0x20) | (b == b'"') | (b == b'\\')
    });
    if plain {
        let mut literal = String::with_capacity(text.len() + 2);
        literal.push('"');
        literal.push_str(text);
        literal.push('"');
        return literal;
    }
    serde_json::to_string(text).expect("strings always encode")
}

/// The text that stands for a piece `text` whose every char went: the
/// APIs refuse an empty text block or tool result.
pub(crate) fn omitted(text: &str) -> String {
    crate::engine::text::omission_marker(char_count(text))
}

/// One piece of an item's trimmable text: a JSON string in the body.
#[derive(Debug)]
pub(crate) struct TextSpan<'a> {
    /// The JSON string literal's bytes in the body.
    pub span: Range<usize>,
    pub text: Cow<'a, str>,
    /// The content element holding this text, removed when the text empties
    /// (unless its array would be left empty).
    pub element: Option<ElementRef>,
}

/// An element of one of an item's content arrays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ElementRef {
    /// Index into [`WireItem::arrays`].
    pub array: usize,
    pub index: usize,
}

/// Where a `cache_control`-like marker sits, so it survives its block.
#[derive(Debug)]
pub(crate) struct Marker<'a> {
    /// The marker's raw value (`{"type":"ephemeral"}`).
    pub value: &'a str,
    /// The element carrying it.
    pub element: ElementRef,
}

/// One item of the compacted array as it sits in the body.
#[derive(Debug, Default)]
pub(crate) struct WireItem<'a> {
    /// The item's bytes in the body.
    pub span: Range<usize>,
    pub texts: Vec<TextSpan<'a>>,
    /// Element spans of the item's content arrays, in body offsets.
    pub arrays: Vec<Vec<Range<usize>>>,
    /// Breakpoint markers on the item's elements.
    pub markers: Vec<Marker<'a>>,
    /// Elements a moved marker must not land on, because the API refuses
    /// them there or their bytes must stay as they came (thinking blocks).
    pub unmarkable: Vec<ElementRef>,
    /// Prefix-bound reasoning blocks, which a plan may strip.
    pub thinking: Vec<ElementRef>,
    /// Tool-call argument strings, one per tool call of the item, in order
    /// (`None` for a call whose arguments cannot be replaced, such as a
    /// custom tool's free-form input), so a plan's call position finds its
    /// call: the JSON string's span and whether it is a JSON string holding
    /// JSON (chat, responses) or the JSON object itself (anthropic).
    pub arguments: Vec<Option<(Range<usize>, ArgumentsForm)>>,
    /// The item's bytes go as they came: no moved marker lands on it (a
    /// fixed item: a provider's compaction, an unknown block).
    pub sealed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ArgumentsForm {
    /// A JSON string whose content is JSON text.
    Encoded,
    /// The JSON value itself.
    Inline,
}

/// Edits to one base string, applied in order of position.
#[derive(Default)]
struct Edits {
    /// Non-overlapping (range, replacement).
    list: Vec<(Range<usize>, String)>,
}

impl Edits {
    fn replace(&mut self, range: Range<usize>, with: String) {
        self.list.push((range, with));
    }

    fn apply(mut self, base: &str, range: Range<usize>, out: &mut String) {
        self.list.sort_by_key(|(r, _)| (r.start, r.end));
        let mut at = range.start;
        for (r, with) in self.list {
            if r.start < at {
                continue; // inside an element already removed
            }
            out.push_str(&base[at..r.start]);
            out.push_str(&with);
            at = r.end;
        }
        out.push_str(&base[at..range.end]);
    }
}

/// The ranges that remove `removed` elements from an array whose element
/// spans are `spans`, commas included, so the array stays valid JSON.
fn removal_ranges(spans: &[Range<usize>], removed: &[bool]) -> Vec<Range<usize>> {
    let n = spans.len();
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        if !removed[i] {
            i += 1;
            continue;
        }
        let a = i;
        while i + 1 < n && removed[i + 1] {
            i += 1;
        }
        let b = i;
        if a > 0 {
            out.push(spans[a - 1].end..spans[b].end);
        } else if b + 1 < n {
            out.push(spans[a].start..spans[b + 1].start);
        } else {
            out.push(spans[a].start..spans[b].end);
        }
        i += 1;
    }
    out
}

impl<'a> WireItem<'a> {
    /// Adds the JSON string `raw` as one of the item's text pieces, held by
    /// `element` (or by nothing that could be removed); `None` when `raw`
    /// is not a string.
    pub(crate) fn push_text(
        &mut self,
        body: &'a str,
        raw: &'a RawValue,
        element: Option<ElementRef>,
    ) -> Option<()> {
        let (span, text) = string_at(body, raw)?;
        self.texts.push(TextSpan {
            span,
            text,
            element,
        });
        Some(())
    }

    /// Opens the JSON array `raw` as one of the item's content arrays and
    /// returns its elements, every one an object, with their references.
    pub(crate) fn open_array(
        &mut self,
        body: &'a str,
        raw: &'a str,
        not_array: &'static str,
        not_object: &'static str,
    ) -> Result<Vec<(ElementRef, &'a str)>, &'static str> {
        let items = elements(raw).ok_or(not_array)?;
        let array = self.arrays.len();
        self.arrays.push(Vec::with_capacity(items.len()));
        let mut out = Vec::with_capacity(items.len());
        for (index, item) in items.into_iter().enumerate() {
            let raw = item.get();
            self.arrays[array].push(span(body, raw));
            if !raw.starts_with('{') {
                return Err(not_object);
            }
            out.push((ElementRef { array, index }, raw));
        }
        Ok(out)
    }
}

impl WireItem<'_> {
    /// Where element `e` starts in the body.
    fn start_of(&self, e: ElementRef) -> usize {
        self.arrays[e.array][e.index].start
    }

    /// The item's text as the engine sees it: its text pieces joined.
    pub fn text(&self) -> String {
        self.texts.iter().map(|t| t.text.as_ref()).collect()
    }

    /// The new text of each piece when the item's text becomes `new`: a
    /// prefix of the original is cut where it falls; any other text goes
    /// whole into the first piece and empties the rest.
    fn distribute(&self, new: &str) -> Vec<Option<String>> {
        let original = self.text();
        let mut out = Vec::with_capacity(self.texts.len());
        if original.starts_with(new) {
            let mut left = char_count(new);
            for t in &self.texts {
                let chars = char_count(&t.text);
                if left >= chars {
                    left -= chars;
                    out.push(None);
                } else {
                    out.push(Some(char_prefix(&t.text, left).to_owned()));
                    left = 0;
                }
            }
        } else {
            for (i, _) in self.texts.iter().enumerate() {
                out.push(Some(if i == 0 {
                    new.to_owned()
                } else {
                    String::new()
                }));
            }
        }
        out
    }
}

impl Parsed<'_> {
    /// Whether a plan can replace the arguments of item `index`'s call at
    /// `call` (its arguments sit in the body as JSON).
    pub fn can_replace_arguments(&self, index: usize, call: usize) -> bool {
        matches!(
            self.wire.get(index).and_then(|w| w.arguments.get(call)),
            Some(Some(_))
        )
    }

    /// The body with the compacted array replaced by the plan's items.
    pub fn splice(&self, plan: &Plan) -> String {
        self.splice_inserting(plan, None)
    }

    /// [`Parsed::splice`], with `insert`'s element (JSON text) placed
    /// before the plan's item at that position (at the end when it equals
    /// the plan's length): a summary message in place of what it replaces.
    pub fn splice_inserting(&self, plan: &Plan, insert: Option<(usize, &str)>) -> String {
        let inserts: Vec<(usize, &str)> = insert.into_iter().collect();
        self.splice_inserting_each(plan, &inserts)
    }

    /// [`Parsed::splice_inserting`] with any number of elements, each
    /// `(position, JSON text)`, in order of position: recall's marker
    /// messages ([`crate::compaction::recall`]).
    pub fn splice_inserting_all(&self, plan: &Plan, inserts: &[(usize, String)]) -> String {
        let inserts: Vec<(usize, &str)> = inserts.iter().map(|(at, e)| (*at, e.as_str())).collect();
        self.splice_inserting_each(plan, &inserts)
    }

    fn splice_inserting_each(&self, plan: &Plan, inserts: &[(usize, &str)]) -> String {
        if inserts.is_empty() {
            if let Some(out) = self.splice_after_previous(plan) {
                return out;
            }
        }
        let body = self.body;
        let mut written: Vec<Written> = Vec::with_capacity(plan.items.len());
        // Markers whose element goes away, with where that element sat.
        let mut displaced: Vec<(usize, &str)> = Vec::new();
        let mut planned = plan.items.iter().peekable();
        for (index, wire) in self.wire.iter().enumerate() {
            if !matches!(planned.peek(), Some(p) if p.index == index) {
                displaced.extend(
                    wire.markers
                        .iter()
                        .map(|m| (wire.start_of(m.element), m.value)),
                );
                continue;
            }
            let p = planned.next().expect("peeked");
            let item = Written::of(index, wire, p);
            displaced.extend(
                wire.markers
                    .iter()
                    .filter(|m| item.removed[m.element.array][m.element.index])
                    .map(|m| (wire.start_of(m.element), m.value)),
            );
            written.push(item);
        }
        let reusable = inserts.is_empty() && displaced.is_empty() && !written.is_empty();
        self.place_markers(&mut written, displaced);

        let mut out = String::with_capacity(body.len());
        out.push_str(&body[..self.array_span.start]);
        out.push('[');
        let count = written.len();
        for (n, item) in written.into_iter().enumerate() {
            if n > 0 {
                out.push(',');
            }
            for &(at, element) in inserts {
                if at == n {
                    out.push_str(element);
                    out.push(',');
                }
            }
            let wire = &self.wire[item.index];
            item.finish(wire).apply(body, wire.span.clone(), &mut out);
        }
        let items_end = out.len();
        let mut wrote = count > 0;
        for &(at, element) in inserts {
            if at >= count {
                if wrote {
                    out.push(',');
                }
                out.push_str(element);
                wrote = true;
            }
        }
        out.push(']');
        out.push_str(&body[self.array_span.end..]);
        if reusable {
            self.made_splice(out.len(), items_end);
        }
        out
    }

    /// Notes that the last splice's output (`len` bytes, its last item
    /// ending at `items_end`) can be reused by the next turn's.
    fn made_splice(&self, len: usize, items_end: usize) {
        *self.carried.made.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(super::resume::SpliceMade { len, items_end });
    }

    /// The splice of `plan` made from the previous turn's, when `plan`
    /// begins with that one's items and no marker moves: those items' bytes
    /// are what it wrote for them (the same bytes, the same edits), and
    /// only the items after them are written. `None`: splice it whole.
    fn splice_after_previous(&self, plan: &Plan) -> Option<String> {
        let prev = self.carried.spliced.as_ref()?;
        let k = prev.items.len();
        let last = prev.items.last()?.index;
        if plan.items.get(..k)? != prev.items.as_slice() {
            return None;
        }
        let written_before = prev.written_before()?;
        let body = self.body;
        let mut written = Vec::with_capacity(plan.items.len() - k);
        let mut planned = plan.items[k..].iter().peekable();
        for (index, wire) in self.wire.iter().enumerate().skip(last + 1) {
            let kept = matches!(planned.peek(), Some(p) if p.index == index);
            if !kept {
                if !wire.markers.is_empty() {
                    return None;
                }
                continue;
            }
            let item = Written::of(index, wire, planned.next().expect("peeked"));
            if wire
                .markers
                .iter()
                .any(|m| item.removed[m.element.array][m.element.index])
            {
                return None;
            }
            written.push(item);
        }
        if planned.next().is_some() {
            return None;
        }
        let after = body.len().saturating_sub(self.wire[last].span.end);
        let mut out = String::with_capacity(written_before.len() + after);
        out.push_str(written_before);
        for item in written {
            out.push(',');
            let wire = &self.wire[item.index];
            item.finish(wire).apply(body, wire.span.clone(), &mut out);
        }
        let items_end = out.len();
        out.push(']');
        out.push_str(&body[self.array_span.end..]);
        self.made_splice(out.len(), items_end);
        Some(out)
    }

    /// Moves each displaced marker to the nearest kept element before where
    /// it sat that has none (or, with none before, the nearest after), so
    /// the client's cache breakpoints keep working and keep their number;
    /// a marker is lost only when every element left already has one.
    fn place_markers<'a>(&self, written: &mut [Written<'a>], mut displaced: Vec<(usize, &'a str)>) {
        if displaced.is_empty() {
            return;
        }
        // Kept elements free to take a marker, in body order.
        let mut free: Vec<(usize, usize, ElementRef)> = Vec::new();
        for (w, item) in written.iter().enumerate() {
            let wire = &self.wire[item.index];
            for e in item.kept_elements(wire) {
                if !wire.markers.iter().any(|m| m.element == e) {
                    free.push((wire.start_of(e), w, e));
                }
            }
        }
        free.sort_by_key(|(start, ..)| *start);
        displaced.sort_by_key(|(start, _)| *start);
        for (start, value) in displaced {
            let before = free.iter().rposition(|(s, ..)| *s < start);
            let Some(at) = before.or_else(|| free.iter().position(|(s, ..)| *s > start)) else {
                return; // every element left carries one
            };
            let (_, w, e) = free.remove(at);
            written[w].pending_markers.push((e, value));
        }
    }
}

/// One kept item being rewritten.
struct Written<'a> {
    index: usize,
    edits: Edits,
    /// Per content array, which elements go.
    removed: Vec<Vec<bool>>,
    /// Markers moved onto this item's elements.
    pending_markers: Vec<(ElementRef, &'a str)>,
}

impl<'a> Written<'a> {
    fn new(index: usize, wire: &WireItem) -> Self {
        Written {
            index,
            edits: Edits::default(),
            removed: wire.arrays.iter().map(|a| vec![false; a.len()]).collect(),
            pending_markers: Vec::new(),
        }
    }

    /// Item `index` (`wire`) as `p` plans it, before markers move.
    fn of(index: usize, wire: &WireItem, p: &super::Planned) -> Self {
        let mut item = Written::new(index, wire);
        if let Some(new) = &p.text {
            item.set_text(wire, new, p.pieces.as_deref());
        }
        if p.thinking == super::Reasoning::Stripped {
            item.strip_thinking(wire);
        }
        for (call, args) in &p.arguments {
            if let Some(Some((span, form))) = wire.arguments.get(*call) {
                let value = match form {
                    ArgumentsForm::Encoded => json_string(args),
                    ArgumentsForm::Inline => args.clone(),
                };
                item.edits.replace(span.clone(), value);
            }
        }
        item
    }

    /// Removes the item's reasoning blocks, unless that would empty their
    /// content array (an item of reasoning alone keeps it: the API refuses
    /// an empty content).
    fn strip_thinking(&mut self, wire: &WireItem) {
        for e in &wire.thinking {
            self.removed[e.array][e.index] = true;
        }
        for (flags, a) in self.removed.iter_mut().zip(0..) {
            if !flags.is_empty() && flags.iter().all(|&r| r) {
                for e in wire.thinking.iter().filter(|e| e.array == a) {
                    flags[e.index] = false;
                }
            }
        }
    }

    fn set_text(&mut self, wire: &WireItem, new: &str, cut: Option<&[String]>) {
        let pieces = match cut {
            // Cut one by one: each piece takes its own new text.
            Some(cut) if cut.len() == wire.texts.len() => wire
                .texts
                .iter()
                .zip(cut)
                .map(|(t, c)| (t.text.as_ref() != c.as_str()).then(|| c.clone()))
                .collect(),
            _ => wire.distribute(new),
        };
        for (t, piece) in wire.texts.iter().zip(pieces) {
            let Some(piece) = piece else { continue };
            match t.element {
                Some(e) if piece.is_empty() => self.removed[e.array][e.index] = true,
                // A string with nothing left (a tool result's content): the
                // API refuses empty text, a marker says what went.
                None if piece.is_empty() => self
                    .edits
                    .replace(t.span.clone(), json_string(&omitted(&t.text))),
                _ => self.edits.replace(t.span.clone(), json_string(&piece)),
            }
        }
        // An array is never emptied: its first emptied text stays, as a
        // marker of what went (never as "", which the API refuses).
        for (a, flags) in self.removed.iter_mut().enumerate() {
            if flags.is_empty() || !flags.iter().all(|&r| r) {
                continue;
            }
            if let Some(t) = wire
                .texts
                .iter()
                .find(|t| t.element.is_some_and(|e| e.array == a))
            {
                flags[t.element.expect("found by it").index] = false;
                self.edits
                    .replace(t.span.clone(), json_string(&omitted(&t.text)));
            }
        }
    }

    /// The kept elements a moved marker may land on, in body order.
    fn kept_elements(&self, wire: &WireItem) -> Vec<ElementRef> {
        if wire.sealed {
            return Vec::new();
        }
        let mut kept: Vec<ElementRef> = wire
            .arrays
            .iter()
            .enumerate()
            .flat_map(|(a, spans)| {
                (0..spans.len()).map(move |index| ElementRef { array: a, index })
            })
            .filter(|e| !self.removed[e.array][e.index] && !wire.unmarkable.contains(e))
            .collect();
        kept.sort_by_key(|e| wire.arrays[e.array][e.index].start);
        kept
    }

    /// All edits: text, removals and moved markers (at most one per element,
    /// and none on an element that already carries one).
    fn finish(mut self, wire: &WireItem) -> Edits {
        for (a, flags) in self.removed.iter().enumerate() {
            for r in removal_ranges(&wire.arrays[a], flags) {
                self.edits.replace(r, String::new());
            }
        }
        let mut marked: Vec<ElementRef> = wire
            .markers
            .iter()
            .map(|m| m.element)
            .filter(|e| !self.removed[e.array][e.index])
            .collect();
        for (e, value) in self.pending_markers {
            if marked.contains(&e) {
                continue;
            }
            marked.push(e);
            let close = wire.arrays[e.array][e.index].end - 1;
            self.edits
                .replace(close..close, format!(",\"cache_control\":{value}"));
        }
        self.edits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_read_with_and_without_escapes_decode_as_json_does() {
        let body = r#"["plain text", "tab\there \"quoted\" \u00e9", "", "ünïcode"]"#;
        let raws = elements(body).unwrap();
        for raw in raws {
            let (at, text) = string_at(body, raw).unwrap();
            let decoded: String = serde_json::from_str(raw.get()).unwrap();
            assert_eq!(text, decoded);
            assert_eq!(&body[at], raw.get());
        }
        let number: &RawValue = serde_json::from_str("5").unwrap();
        assert!(string_at("5", number).is_none());
    }

    #[test]
    fn string_literals_encode_as_serde_json_does() {
        for text in [
            "plain",
            "",
            "quote \" back \\ slash",
            "tab\tnew\nline\u{1}",
            "ünï 🚚",
            "\u{7f}\u{2028}",
        ] {
            assert_eq!(
                json_string(text),
                serde_json::to_string(text).unwrap(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn removal_keeps_arrays_valid_json() {
        let base = "[1,2, 3 ,4]";
        let spans = vec![1..2, 3..4, 6..7, 9..10];
        for mask in 0u8..16 {
            let removed: Vec<bool> = (0..4).map(|i| mask & (1 << i) != 0).collect();
            let mut edits = Edits::default();
            for r in removal_ranges(&spans, &removed) {
                edits.replace(r, String::new());
            }
            let mut out = String::new();
            edits.apply(base, 0..base.len(), &mut out);
            let parsed: Vec<u32> =
                serde_json::from_str(&out).unwrap_or_else(|e| panic!("{out}: {e}"));
            let expected: Vec<u32> = (1..=4).filter(|i| !removed[*i as usize - 1]).collect();
            assert_eq!(parsed, expected, "{out}");
        }
    }
}
