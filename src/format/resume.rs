//! Resuming a parse (issue 29): an agent resends its whole history every
//! turn, so a turn's body is usually the previous one's with new items
//! appended to the compacted array, or with its last item replaced (a new
//! question on the same history: the snapshot is cut back to before its
//! last item, [`Snapshot::before_last`]). A [`Snapshot`] of a parse holds what
//! the format's read loop had made of the body's items (the neutral items,
//! their spans, the loop's state: open tool calls, a model turn's group),
//! with the bytes it read them from. [`Format::parse_after`] reads a body
//! that begins with those bytes by reading only the items after them.
//!
//! The result is the one [`Format::parse`] gives, by construction: the
//! prefix is compared byte for byte (never trusted to a hash), each item is
//! read by the same loop from the same state, the fields outside the array
//! are read again from this body, and anything unexpected (the array not
//! continuing after the known prefix, an item the loop refuses) gives
//! `None`, for the caller to parse the whole body. A snapshot is only made
//! of a parse whose after-passes changed nothing (no provider compaction,
//! no Responses reasoning left waiting), so that its items are what the
//! loop left.
//!
//! A snapshot carries too what the previous turn computed over its items
//! that depends on those items alone ([`Carried`]: their char counts, their
//! chained hash, tool results cut to head and tail, the splice it wrote),
//! so that a turn that appends computes these for what it appends.
//!
//! Pure: no I/O, no cache (the cache is [`crate::cache::PrefixCache`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;

use super::splice::{ArgumentsForm, ElementRef, Marker, TextSpan, WireItem};
use super::{Format, Item, Parsed, Planned, Skip};

/// A value per item of a parse, computed on first use for the items after
/// those a previous turn computed it for (`seed`).
#[derive(Default)]
struct PerItem<T> {
    seed: Mutex<Vec<T>>,
    all: OnceLock<Vec<T>>,
}

impl<T> PerItem<T> {
    fn seeded(seed: Vec<T>) -> Self {
        PerItem {
            seed: Mutex::new(seed),
            all: OnceLock::new(),
        }
    }

    /// The values of the first `n` items, `next` computing each one not
    /// known yet from those before it.
    fn get(&self, n: usize, mut next: impl FnMut(&[T], usize) -> T) -> &[T] {
        self.all.get_or_init(|| {
            let mut seed = self.seed.lock().unwrap_or_else(|e| e.into_inner());
            let mut values = std::mem::take(&mut *seed);
            values.truncate(n);
            values.reserve(n - values.len());
            for i in values.len()..n {
                let value = next(&values, i);
                values.push(value);
            }
            values
        })
    }

    /// What is known, for the next turn.
    fn into_known(self) -> Vec<T> {
        match self.all.into_inner() {
            Some(all) => all,
            None => self.seed.into_inner().unwrap_or_else(|e| e.into_inner()),
        }
    }

    fn weight(values: &[T]) -> usize {
        std::mem::size_of_val(values)
    }
}

/// A splice's output and the plan it wrote, for the next turn's splice to
/// reuse where its plan begins with the same items.
#[derive(Debug, Clone)]
pub(crate) struct Spliced {
    /// The plan's items.
    pub items: Vec<Planned>,
    /// The forwarded body: the splice's output, the bytes of a `String`
    /// (made only by [`Parsed::keep_splice`]).
    out: Bytes,
    /// Where in `out` the plan's last item ends.
    items_end: usize,
}

impl Spliced {
    /// The output up to the end of the plan's last item, as text, without
    /// reading it again (it was a `String`'s); `None` if `items_end` is not
    /// on a char boundary of it.
    pub(crate) fn written_before(&self) -> Option<&str> {
        let before = self.out.get(..self.items_end)?;
        // A char boundary: the end, or a byte that does not continue a char.
        if self
            .out
            .get(self.items_end)
            .is_some_and(|&b| b & 0xC0 == 0x80)
        {
            return None;
        }
        // SAFETY: `out` holds the bytes of a `String` (it is private to this
        // module, and set only by `keep_splice` from one), so it is UTF-8;
        // `before` ends on a char boundary of it (checked above), so it is
        // UTF-8 too.
        Some(unsafe { std::str::from_utf8_unchecked(before) })
    }
}

/// What a splice that can be reused said of its output: its length and
/// where its last item ends (see [`Parsed::keep_splice`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SpliceMade {
    pub len: usize,
    pub items_end: usize,
}

/// Texts cut from one item's text, by item and what cut them (`None`:
/// nothing shorter).
type Cuts = HashMap<(u32, u32), Option<Arc<str>>>;

/// What work over a parse's items computed from those items alone, kept
/// across turns with its [`Snapshot`]: the next body holds the same items
/// at the same places, byte for byte, read from the same state.
#[derive(Default)]
pub(crate) struct Carried {
    /// Chars of each item's text.
    chars: PerItem<usize>,
    /// A 128-bit hash of each item's bytes chained with those before it.
    chain: PerItem<u128>,
    /// Texts made of one item's text alone (a tool result cut to head and
    /// tail), by item and what made them.
    cuts: Mutex<Cuts>,
    /// The previous turn's splice.
    pub(crate) spliced: Option<Spliced>,
    /// The last splice of this parse that can be reused.
    pub(crate) made: Mutex<Option<SpliceMade>>,
    /// This parse's splice, kept for the next turn.
    kept: Mutex<Option<Spliced>>,
}

impl std::fmt::Debug for Carried {
    // Not part of what a parse is: a whole parse and a resumed one print
    // alike.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Carried")
    }
}

/// [`Carried`] as a snapshot holds it.
#[derive(Debug, Clone, Default)]
struct CarriedState {
    chars: Vec<usize>,
    chain: Vec<u128>,
    cuts: Cuts,
    spliced: Option<Spliced>,
}

impl Carried {
    fn into_state(self) -> CarriedState {
        CarriedState {
            chars: self.chars.into_known(),
            chain: self.chain.into_known(),
            cuts: self.cuts.into_inner().unwrap_or_else(|e| e.into_inner()),
            spliced: self.kept.into_inner().unwrap_or_else(|e| e.into_inner()),
        }
    }

    fn of(state: CarriedState) -> Self {
        Carried {
            chars: PerItem::seeded(state.chars),
            chain: PerItem::seeded(state.chain),
            cuts: Mutex::new(state.cuts),
            spliced: state.spliced,
            made: Mutex::new(None),
            kept: Mutex::new(None),
        }
    }
}

impl CarriedState {
    /// What is carried for the first `kept` items alone. The previous
    /// splice goes: its plan names items by index, not by their bytes, so
    /// a replaced item planned alike would be forwarded as it was.
    fn cut_to(&mut self, kept: usize) {
        self.chars.truncate(kept);
        self.chain.truncate(kept);
        self.cuts.retain(|&(index, _), _| (index as usize) < kept);
        self.spliced = None;
    }

    fn weight(&self) -> usize {
        PerItem::weight(&self.chars)
            + PerItem::weight(&self.chain)
            + self
                .cuts
                .values()
                .map(|t| 48 + t.as_ref().map_or(0, |t| t.len()))
                .sum::<usize>()
            + self.spliced.as_ref().map_or(0, |s| {
                // The forwarded body is shared with the compaction cache's
                // outcome, but may outlive it: counted here too.
                s.out.len()
                    + s.items
                        .iter()
                        .map(|p| {
                            std::mem::size_of::<Planned>()
                                + p.text.as_ref().map_or(0, String::capacity)
                                + p.arguments
                                    .iter()
                                    .map(|(_, a)| 32 + a.capacity())
                                    .sum::<usize>()
                        })
                        .sum::<usize>()
            })
    }
}

impl Parsed<'_> {
    /// Chars of each item's text.
    pub fn text_chars(&self) -> &[usize] {
        let items = &self.conversation.items;
        self.carried.chars.get(items.len(), |_, i| {
            crate::engine::text::char_count(&items[i].text)
        })
    }

    /// Chars of everything that counts toward the budget
    /// ([`super::Conversation::total_chars`], from the counts kept).
    pub fn total_chars(&self) -> usize {
        self.conversation.total_chars_of(self.text_chars())
    }

    /// Per item, a 128-bit hash of its bytes and of every item's before
    /// it: equal values, equal leading items.
    pub fn item_chain(&self) -> &[u128] {
        self.carried.chain.get(self.wire.len(), |before, i| {
            let raw = self.item_bytes(i);
            let mut h = xxhash_rust::xxh3::Xxh3::new();
            h.update(&before.last().copied().unwrap_or_default().to_le_bytes());
            h.update(&(raw.len() as u64).to_le_bytes());
            h.update(raw);
            h.digest128()
        })
    }

    /// A text made of item `index`'s text alone by `make` (what `what`
    /// names: the same `what` must always make the same text of an item),
    /// made once across turns.
    pub fn cut_of(
        &self,
        index: usize,
        what: u32,
        make: impl FnOnce(&str) -> Option<Arc<str>>,
    ) -> Option<Arc<str>> {
        let key = (index as u32, what);
        let mut cuts = self.carried.cuts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = cuts.get(&key) {
            return found.clone();
        }
        let made = make(&self.conversation.items.get(index)?.text);
        cuts.insert(key, made.clone());
        made
    }

    /// The body to forward for `plan`, made of `out`; kept (when `out` is
    /// its last splice, nothing changed after it) for the next turn's
    /// splice to reuse. Takes the `String` so that the next turn need not
    /// read the kept bytes again to know they are text.
    pub fn keep_splice(&self, plan: super::Plan, out: String) -> Bytes {
        let out = Bytes::from(out);
        let made = self
            .carried
            .made
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(made) = made.filter(|m| m.len == out.len()) else {
            return out;
        };
        *self.carried.kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(Spliced {
            items: plan.items,
            out: out.clone(),
            items_end: made.items_end,
        });
        out
    }
}

/// A format's read loop state between two items.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ReadState {
    /// Call id -> the group of the item that made the call.
    pub open_calls: HashMap<String, u32>,
    /// Chat: the group of a legacy `function_call` awaiting its result.
    pub function_group: Option<u32>,
    /// Responses: the group of the model turn being read.
    pub turn_group: Option<u32>,
    /// Responses: reasoning items waiting for the item they go with.
    pub reasoning: Vec<usize>,
    /// At a loop's end: its state before the last item it read (`None`
    /// when it read none), for a body that replaces that item. The loop's
    /// state cannot be wound back from its end (an assistant message with
    /// calls forgets the calls before it), so it is kept as it was.
    pub before_last: Option<Box<ReadState>>,
}

/// Where a read loop starts: the items read so far and the loop's state.
#[derive(Default)]
pub(crate) struct Start<'a> {
    pub items: Vec<Item>,
    pub wire: Vec<WireItem<'a>>,
    pub state: ReadState,
}

/// Where a format's split read begins: at the array's first item (the
/// default: a whole parse), or after the items of a snapshot whose bytes
/// the body begins with.
#[derive(Default)]
pub(crate) struct Resume<'a> {
    /// The items read so far and the loop's state.
    pub start: Start<'a>,
    /// Where the array opens and where the items of `start` end; `None`:
    /// the array is found and read from its start.
    pub at: Option<(usize, usize)>,
}

/// A text piece of a snapshot: its span, and its decoded text when that is
/// not the literal's own bytes (it held an escape).
#[derive(Debug, Clone)]
struct OwnedText {
    span: Range<usize>,
    decoded: Option<String>,
    element: Option<ElementRef>,
}

/// A [`WireItem`] that borrows nothing: what borrowed from the body is a
/// span into it, which the next body (the same bytes there) lends again.
#[derive(Debug, Clone)]
struct OwnedWire {
    span: Range<usize>,
    texts: Vec<OwnedText>,
    arrays: Vec<Vec<Range<usize>>>,
    markers: Vec<(Range<usize>, ElementRef)>,
    unmarkable: Vec<ElementRef>,
    thinking: Vec<ElementRef>,
    arguments: Vec<Option<(Range<usize>, ArgumentsForm)>>,
    sealed: bool,
}

impl OwnedWire {
    fn of(w: WireItem<'_>, body: &str) -> Self {
        OwnedWire {
            span: w.span,
            texts: w
                .texts
                .into_iter()
                .map(|t| OwnedText {
                    decoded: match t.text {
                        Cow::Borrowed(_) => None,
                        Cow::Owned(s) => Some(s),
                    },
                    span: t.span,
                    element: t.element,
                })
                .collect(),
            arrays: w.arrays,
            markers: w
                .markers
                .into_iter()
                .map(|m| (super::splice::span(body, m.value), m.element))
                .collect(),
            unmarkable: w.unmarkable,
            thinking: w.thinking,
            arguments: w.arguments,
            sealed: w.sealed,
        }
    }

    /// The item as `body` (which holds the same bytes at its spans) lends it.
    fn lent(self, body: &str) -> Option<WireItem<'_>> {
        let mut texts = Vec::with_capacity(self.texts.len());
        for t in self.texts {
            let text = match t.decoded {
                Some(s) => Cow::Owned(s),
                None => Cow::Borrowed(body.get(t.span.start + 1..t.span.end.checked_sub(1)?)?),
            };
            texts.push(TextSpan {
                span: t.span,
                text,
                element: t.element,
            });
        }
        let mut markers = Vec::with_capacity(self.markers.len());
        for (span, element) in self.markers {
            markers.push(Marker {
                value: body.get(span)?,
                element,
            });
        }
        Some(WireItem {
            span: self.span,
            texts,
            arrays: self.arrays,
            markers,
            unmarkable: self.unmarkable,
            thinking: self.thinking,
            arguments: self.arguments,
            sealed: self.sealed,
        })
    }

    fn weight(&self) -> usize {
        use std::mem::size_of;
        size_of::<Self>()
            + self
                .texts
                .iter()
                .map(|t| size_of::<OwnedText>() + t.decoded.as_ref().map_or(0, String::capacity))
                .sum::<usize>()
            + self
                .arrays
                .iter()
                .map(|a| size_of::<Vec<Range<usize>>>() + a.capacity() * size_of::<Range<usize>>())
                .sum::<usize>()
            + self.markers.capacity() * size_of::<(Range<usize>, ElementRef)>()
            + (self.unmarkable.capacity() + self.thinking.capacity()) * size_of::<ElementRef>()
            + self.arguments.capacity() * size_of::<Option<(Range<usize>, ArgumentsForm)>>()
    }
}

/// What a parse of a body made of its items, with the bytes it read them
/// from: the body up to the end of its last item.
#[derive(Debug, Clone)]
pub struct Snapshot {
    format: Format,
    /// The body's bytes up to the end of the array's last element.
    prefix: Bytes,
    /// Where the array opens.
    array_start: usize,
    items: Vec<Item>,
    wire: Vec<OwnedWire>,
    state: ReadState,
    /// The loop's state before the last item, when a body that replaces
    /// that item may resume there (see [`Continuation::ReplacesLast`]).
    before_last: Option<ReadState>,
    carried: CarriedState,
}

/// How a body goes on from a snapshot ([`Snapshot::continuation`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Continuation {
    /// New items appended: it resumes after the snapshot's last item.
    Extends,
    /// The last item replaced (a new question on the same history): it
    /// resumes before it, from [`Snapshot::before_last`].
    ReplacesLast,
}

/// How many leading bytes `a` and `b` share: compared a block at a time
/// (at memcmp's speed), then in smaller blocks within the first block
/// that differs.
fn shared_prefix_len(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut at = 0;
    for block in [4096, 64, 1] {
        while at + block <= n && a[at..at + block] == b[at..at + block] {
            at += block;
        }
    }
    at
}

/// The bytes [`Snapshot::may_extend`] reads at each place it looks.
const PROBE_BYTES: usize = 64;

/// Bodies shorter than this are parsed whole and never snapshotted: the
/// parse costs less than keeping it.
pub const MIN_SNAPSHOT_BYTES: usize = 32 * 1024;

impl Snapshot {
    /// The snapshot of a parse (by move: nothing is copied but the
    /// prefix's bytes), `None` when the parse's after-passes may have
    /// changed its items, or it holds no items. Its bytes are a slice of
    /// `body` when given: a copy of the parsed body's bytes (the caller's
    /// word, checked in debug builds), shared with another store.
    pub(crate) fn of(
        parsed: Parsed<'_>,
        mut state: ReadState,
        body: Option<&Bytes>,
    ) -> Option<Snapshot> {
        let items = &parsed.conversation.items;
        let last = parsed.wire.last()?;
        if items.iter().any(|m| m.provider_compaction) || !state.reasoning.is_empty() {
            return None;
        }
        // Responses reasoning waiting before the last item took its group
        // from that item: the items before it are not what the loop left
        // there.
        let before_last = state
            .before_last
            .take()
            .map(|b| *b)
            .filter(|b| b.reasoning.is_empty() && parsed.wire.len() >= 2);
        let end = last.span.end;
        debug_assert!(body.map_or(true, |b| b.as_ref() == parsed.body.as_bytes()));
        let prefix = match body.filter(|b| b.len() == parsed.body.len()) {
            Some(shared) => shared.slice(..end),
            None => Bytes::copy_from_slice(parsed.body.get(..end)?.as_bytes()),
        };
        let body = parsed.body;
        Some(Snapshot {
            format: parsed.format,
            prefix,
            array_start: parsed.array_span.start,
            carried: parsed.carried.into_state(),
            wire: parsed
                .wire
                .into_iter()
                .map(|w| OwnedWire::of(w, body))
                .collect(),
            items: parsed.conversation.items,
            state,
            before_last,
        })
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// The bytes a body must begin with for [`Format::parse_after`].
    pub fn prefix(&self) -> &[u8] {
        &self.prefix
    }

    /// Whether `body` begins with this snapshot's bytes and goes on.
    pub fn continues(&self, body: &[u8]) -> bool {
        body.len() > self.prefix.len() && body[..self.prefix.len()] == self.prefix[..]
    }

    /// Whether `body` can begin with all of this snapshot's bytes, judged
    /// by a few of them: those from `at` (where the body differs from a
    /// sibling snapshot, see [`Self::continuation`]) and the
    /// last ones. `false` means it does not (so it cannot be
    /// [`Continuation::Extends`]); `true` leaves [`Self::continuation`] to
    /// say. Siblings (other questions on the same history) differ from the
    /// body near where it differs from one of them: ruled out here on a
    /// few bytes, not after reading the whole history they share.
    pub fn may_extend(&self, body: &[u8], at: usize) -> bool {
        let end = self.prefix.len();
        if body.len() <= end {
            return false;
        }
        let near = at.min(end)..(at.saturating_add(PROBE_BYTES)).min(end);
        let last = end.saturating_sub(PROBE_BYTES)..end;
        body[near.clone()] == self.prefix[near] && body[last.clone()] == self.prefix[last]
    }

    /// Where the item before the last ends, when the loop's state there
    /// is known.
    fn before_last_end(&self) -> Option<usize> {
        self.before_last.as_ref()?;
        let before = self.wire.len().checked_sub(2)?;
        Some(self.wire[before].span.end)
    }

    /// How `body` goes on from this snapshot's bytes, if it does: it
    /// begins with all of them ([`Continuation::Extends`]), or with those
    /// up to the end of the item before the last
    /// ([`Continuation::ReplacesLast`]), and goes on. One pass over the
    /// bytes they share answers both (a replaced last item differs only
    /// near the end: two compares read the body twice). With it, how many
    /// leading bytes `body` shares with this snapshot's (where
    /// [`Self::may_extend`] looks at its siblings).
    pub fn continuation(&self, body: &[u8]) -> (Option<Continuation>, usize) {
        let shared = shared_prefix_len(body, &self.prefix);
        if shared == self.prefix.len() && body.len() > shared {
            return (Some(Continuation::Extends), shared);
        }
        let replaces = self
            .before_last_end()
            .filter(|&end| shared >= end && body.len() > end)
            .map(|_| Continuation::ReplacesLast);
        (replaces, shared)
    }

    /// The snapshot as it was before its last item (which a body that
    /// [`Continuation::ReplacesLast`] replaces): the last item, its
    /// carried values and the previous splice (which holds that item's
    /// bytes) cut off, the loop's state the one before it. `None` when
    /// that state is not known.
    pub(crate) fn before_last(mut self) -> Option<Snapshot> {
        let end = self.before_last_end()?;
        let state = self.before_last.take()?;
        let kept = self.wire.len() - 1;
        self.prefix = self.prefix.slice(..end);
        self.items.truncate(kept);
        self.wire.truncate(kept);
        self.state = state;
        self.carried.cut_to(kept);
        Some(self)
    }

    /// Approximate bytes held, for the cache's weigher: the prefix, every
    /// item's text and calls, the spans.
    pub fn weight(&self) -> usize {
        use std::mem::size_of;
        let items: usize = self
            .items
            .iter()
            .map(|m| {
                size_of::<Item>()
                    + m.text.capacity()
                    + m.tool_calls
                        .iter()
                        .map(|c| {
                            size_of::<super::ToolCall>()
                                + c.id.capacity()
                                + c.name.capacity()
                                + c.arguments.capacity()
                        })
                        .sum::<usize>()
                    + m.answers.as_ref().map_or(0, String::capacity)
                    + m.piece_chars.capacity() * size_of::<usize>()
                    + m.piece_answers
                        .iter()
                        .map(|a| size_of::<String>() + a.capacity())
                        .sum::<usize>()
            })
            .sum();
        let calls: usize = self
            .state
            .open_calls
            .keys()
            .map(|k| 32 + k.capacity())
            .sum();
        size_of::<Self>()
            + self.prefix.len()
            + items
            + self.wire.iter().map(OwnedWire::weight).sum::<usize>()
            + calls
            + self.state.reasoning.capacity() * size_of::<usize>()
            + self.carried.weight()
    }
}

impl Format {
    /// [`Format::parse`], and the read loop's state at its end when the
    /// body was read the split way (the only way [`Format::parse_after`]
    /// resumes), for [`Snapshot::of`].
    pub(crate) fn parse_resumable(
        self,
        body: &[u8],
        max_items: usize,
    ) -> Result<(Parsed<'_>, Option<ReadState>), Skip> {
        let text = std::str::from_utf8(body).map_err(|_| Skip::InvalidJson)?;
        match self.parse_split(text, max_items, Resume::default()) {
            Some((parsed, state)) => Ok((parsed, Some(state))),
            None => self.parse(body, max_items).map(|p| (p, None)),
        }
    }

    /// Parses `body` from `snapshot` on: only the items after its prefix
    /// are read. `None` when the snapshot is another format's, the body
    /// does not begin with its prefix, or anything after it is not as the
    /// split way reads it: the caller then parses the whole body, which
    /// gives the same result when this one is `Some`.
    pub(crate) fn parse_after(
        self,
        body: &[u8],
        max_items: usize,
        snapshot: Snapshot,
    ) -> Option<(Parsed<'_>, ReadState)> {
        if snapshot.format != self || !snapshot.continues(body) {
            return None;
        }
        let text = utf8_after(body, snapshot.prefix.len())?;
        let from = (snapshot.array_start, snapshot.prefix.len());
        let mut wire = Vec::with_capacity(snapshot.wire.len() + 8);
        for w in snapshot.wire {
            wire.push(w.lent(text)?);
        }
        let start = Start {
            items: snapshot.items,
            wire,
            state: snapshot.state,
        };
        let resume = Resume {
            start,
            at: Some(from),
        };
        let read_before = resume.start.wire.len();
        let (mut parsed, mut state) = self.parse_split(text, max_items, resume)?;
        if parsed.wire.len() == read_before {
            // No item read (the same items again: a retry): the state
            // before the last item is still the snapshot's.
            state.before_last = snapshot.before_last.map(Box::new);
        }
        parsed.carried = Carried::of(snapshot.carried);
        Some((parsed, state))
    }

    /// The format's split read of `text` from `from`, and the loop's
    /// state at its end.
    fn parse_split<'a>(
        self,
        text: &'a str,
        max_items: usize,
        from: Resume<'a>,
    ) -> Option<(Parsed<'a>, ReadState)> {
        match self {
            Format::Chat => super::chat::parse_split_from(text, max_items, from),
            Format::Anthropic => super::anthropic::parse_split_from(text, max_items, from),
            Format::Responses => super::responses::parse_split_from(text, max_items, from),
        }
    }
}

/// `body` as text, when its first `known` bytes are known to be text (a
/// snapshot's prefix, read as a `&str` when it was made, ending in an
/// ASCII byte): only the rest is checked.
fn utf8_after(body: &[u8], known: usize) -> Option<&str> {
    std::str::from_utf8(body.get(known..)?).ok()?;
    // A snapshot's prefix ends at the end of an array element, `}`.
    if known > 0 && !body[known - 1].is_ascii() {
        return None;
    }
    // SAFETY: `body[..known]` equals a snapshot's prefix (compared by
    // `Snapshot::continues`), which was the bytes of a `&str`; it ends in
    // an ASCII byte, so it ends on a char boundary; `body[known..]` was
    // just checked. Two valid UTF-8 sequences joined are valid UTF-8.
    Some(unsafe { std::str::from_utf8_unchecked(body) })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    proptest! {
        /// The blockwise count is the bytewise one, wherever the bytes
        /// differ (within a block, at a block's edge, past either end).
        #[test]
        fn shared_prefix_len_counts_the_bytes_two_slices_begin_with(
            len in 0usize..10_000,
            other_len in 0usize..10_000,
            differ_at in proptest::option::of(0usize..10_000),
        ) {
            let a: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut b: Vec<u8> = (0..other_len).map(|i| (i % 251) as u8).collect();
            if let Some(at) = differ_at.filter(|&at| at < b.len()) {
                b[at] ^= 0x55;
            }
            let bytewise = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            prop_assert_eq!(super::shared_prefix_len(&a, &b), bytewise);
        }
    }
}
