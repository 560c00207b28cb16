//! Resuming a parse (issue 29): an agent resends its whole history every
//! turn, so a turn's body is usually the previous one's with new items
//! appended to the compacted array. A [`Snapshot`] of a parse holds what
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
//! Pure: no I/O, no cache (the cache is [`crate::cache::PrefixCache`]).

use std::borrow::Cow;
use std::collections::HashMap;
use std::ops::Range;

use bytes::Bytes;

use super::splice::{ArgumentsForm, ElementRef, Marker, TextSpan, WireItem};
use super::{Format, Item, Parsed, Skip};

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
}

/// Where a read loop starts: the items read so far and the loop's state.
#[derive(Default)]
pub(crate) struct Start<'a> {
    pub items: Vec<Item>,
    pub wire: Vec<WireItem<'a>>,
    pub state: ReadState,
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
}

/// Bodies shorter than this are parsed whole and never snapshotted: the
/// parse costs less than keeping it.
pub const MIN_SNAPSHOT_BYTES: usize = 32 * 1024;

impl Snapshot {
    /// The snapshot of a parse (by move: nothing is copied but the
    /// prefix's bytes), `None` when the parse's after-passes may have
    /// changed its items, or it holds no items.
    pub(crate) fn of(parsed: Parsed<'_>, state: ReadState) -> Option<Snapshot> {
        let items = &parsed.conversation.items;
        let last = parsed.wire.last()?;
        if items.iter().any(|m| m.provider_compaction) || !state.reasoning.is_empty() {
            return None;
        }
        let end = last.span.end;
        let prefix = Bytes::copy_from_slice(parsed.body.get(..end)?.as_bytes());
        let body = parsed.body;
        Some(Snapshot {
            format: parsed.format,
            prefix,
            array_start: parsed.array_span.start,
            wire: parsed
                .wire
                .into_iter()
                .map(|w| OwnedWire::of(w, body))
                .collect(),
            items: parsed.conversation.items,
            state,
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
        let split = match self {
            Format::Chat => super::chat::parse_split_from(text, max_items, None),
            Format::Anthropic => super::anthropic::parse_split_from(text, max_items, None),
            Format::Responses => super::responses::parse_split_from(text, max_items, None),
        };
        match split {
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
        let resumed = Some((start, from));
        match self {
            Format::Chat => super::chat::parse_split_from(text, max_items, resumed),
            Format::Anthropic => super::anthropic::parse_split_from(text, max_items, resumed),
            Format::Responses => super::responses::parse_split_from(text, max_items, resumed),
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
