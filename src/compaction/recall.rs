//! Recoverable compaction (`recall = true`), the pure half: the markers a
//! plan leaves where it cut, their recall ids, and the originals an id
//! stands for, read back from the request's own body. The proxy's half
//! (adding the `compaction_recall` tool, answering the model's call and
//! sending the follow-up) is [`crate::proxy::recall`].
//!
//! - A **cut text** (a pruned or deduplicated tool result, a trimmed
//!   message) ends with a marker line naming its id.
//! - A **clipped argument**'s omission marker names the id of the call's
//!   whole arguments.
//! - A **run of dropped items** becomes one short user message naming the
//!   id of the run, placed before the survivor that follows it. A run at
//!   the very end of the conversation gets none: a marker there would be
//!   the last turn the model answers.
//!
//! An id is `rc_<source>_<hash>`: the source names the item (and call, or
//! run) it stands for, the hash is xxh3 over that source's original
//! content and its position. The same request gives the same ids on every
//! replica and every turn (stable mode's prefix stays byte-stable), and an
//! id says nothing of content one does not have. Answers are read from the
//! current request only, and only for ids present in its forwarded markers
//! ([`forwarded_ids`]), so no id reaches another conversation.
//!
//! Markers go only where the plan already cut, so they change no item the
//! plan left as it came: the preserved-thinking rule ([`super::thinking`])
//! that judged the cuts holds for the markers unchanged.

use std::collections::BTreeSet;

use crate::engine::text::{char_count, thousands};
use crate::format::{Format, Parsed, Plan};

/// The name of the tool the proxy adds and answers itself.
pub use crate::format::recall::TOOL_NAME;

/// A policy's recall limits (`recall_max_chars`, `recall_max_rounds`,
/// `recall_max_added_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecallLimits {
    /// The most chars one id answers with; a longer original comes back as
    /// head and tail, with an id for the middle.
    pub max_chars: usize,
    /// The most follow-up requests for one client request.
    pub max_rounds: usize,
    /// The most bytes the answers add over all follow-ups of one request.
    pub max_added_bytes: usize,
}

impl RecallLimits {
    pub const DEFAULT: RecallLimits = RecallLimits {
        max_chars: 20_000,
        max_rounds: 2,
        max_added_bytes: 262_144,
    };
}

/// What recall did for one request, once its answer went out: what the
/// live report (`recall`) and the inspector say of it.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Recalled {
    /// Follow-up requests the proxy sent upstream.
    pub rounds: usize,
    /// The ids answered, in the order the model asked for them.
    pub recalled_ids: Vec<String>,
    /// Ids refused (not in this request's markers, changed, out of range,
    /// over the size limit).
    pub refused_ids: usize,
}

/// What every marker says before the id, so [`forwarded_ids`] finds them.
const ID_LEAD: &str = "compaction_recall id: ";

/// What an id stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The whole text of item `item`.
    Text { item: usize },
    /// The arguments of call `call` of item `item`.
    Arguments { item: usize, call: usize },
    /// Items `first..=last`, dropped, as their original JSON elements.
    Dropped { first: usize, last: usize },
}

/// A parsed recall id: its source, hash and, for the rest of a long
/// original, the char range it stands for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecallId {
    pub source: Source,
    pub hash: u64,
    pub range: Option<(usize, usize)>,
}

impl RecallId {
    /// The id without its range: what a marker names.
    pub fn base(&self) -> String {
        let source = match self.source {
            Source::Text { item } => format!("t{item}"),
            Source::Arguments { item, call } => format!("a{item}.{call}"),
            Source::Dropped { first, last } => format!("d{first}-{last}"),
        };
        format!("rc_{source}_{:016x}", self.hash)
    }

    /// Reads an id as [`RecallId::base`] writes it, with an optional
    /// `@start-end` range.
    pub fn parse(id: &str) -> Option<RecallId> {
        let (base, range) = match id.split_once('@') {
            Some((base, range)) => {
                let (a, b) = range.split_once('-')?;
                let (a, b) = (a.parse().ok()?, b.parse().ok()?);
                (base, (a < b).then_some((a, b)).map(Some)?)
            }
            None => (id, None),
        };
        let rest = base.strip_prefix("rc_")?;
        let (source, hash) = rest.rsplit_once('_')?;
        if hash.len() != 16 {
            return None;
        }
        let hash = u64::from_str_radix(hash, 16).ok()?;
        let number = |s: &str| s.parse::<usize>().ok();
        let source = match source.split_at_checked(1)? {
            ("t", item) => Source::Text {
                item: number(item)?,
            },
            ("a", rest) => {
                let (item, call) = rest.split_once('.')?;
                Source::Arguments {
                    item: number(item)?,
                    call: number(call)?,
                }
            }
            ("d", rest) => {
                let (first, last) = rest.split_once('-')?;
                let (first, last) = (number(first)?, number(last)?);
                if first > last {
                    return None;
                }
                Source::Dropped { first, last }
            }
            _ => return None,
        };
        let parsed = RecallId {
            source,
            hash,
            range,
        };
        // One spelling per id: `rc_t01_…` is not `rc_t1_…`.
        (parsed.base() == base).then_some(parsed)
    }
}

/// The hash of a source's original content at its position.
fn hash_of(source: Source, content: &[u8]) -> u64 {
    let mut key = Vec::with_capacity(content.len() + 32);
    key.extend_from_slice(b"compaction-recall\0");
    let (kind, a, b) = match source {
        Source::Text { item } => (b't', item, 0),
        Source::Arguments { item, call } => (b'a', item, call),
        Source::Dropped { first, last } => (b'd', first, last),
    };
    key.push(kind);
    key.extend_from_slice(&(a as u64).to_le_bytes());
    key.extend_from_slice(&(b as u64).to_le_bytes());
    key.extend_from_slice(content);
    xxhash_rust::xxh3::xxh3_64(&key)
}

/// The original content `source` stands for in `parsed`, when it is there.
pub fn original(parsed: &Parsed, source: Source) -> Option<String> {
    let items = &parsed.conversation.items;
    match source {
        Source::Text { item } => items.get(item).map(|m| m.text.clone()),
        Source::Arguments { item, call } => items
            .get(item)
            .and_then(|m| m.tool_calls.get(call))
            .map(|c| c.arguments.clone()),
        Source::Dropped { first, last } => {
            if last >= items.len() {
                return None;
            }
            let elements: Vec<&str> = (first..=last)
                .map(|i| std::str::from_utf8(parsed.item_bytes(i)).unwrap_or_default())
                .collect();
            Some(elements.join("\n"))
        }
    }
}

fn id_of(parsed: &Parsed, source: Source) -> Option<RecallId> {
    let content = original(parsed, source)?;
    Some(RecallId {
        source,
        hash: hash_of(source, content.as_bytes()),
        range: None,
    })
}

/// The marker line that ends a cut text.
pub fn text_marker(id: &str, cut_chars: usize) -> String {
    format!(
        "[compaction-proxy cut {} chars here; {ID_LEAD}{id}]",
        thousands(cut_chars)
    )
}

/// The text of the message that stands for a run of dropped items.
pub fn dropped_marker(id: &str, messages: usize, chars: usize) -> String {
    let what = if messages == 1 { "message" } else { "messages" };
    format!(
        "[compaction-proxy dropped {messages} earlier {what} ({} chars) here; {ID_LEAD}{id}]",
        thousands(chars)
    )
}

/// The marker message as an element of the format's compacted array.
pub fn marker_item(format: Format, text: &str) -> String {
    let value = match format {
        Format::Chat => serde_json::json!({"role": "user", "content": text}),
        Format::Anthropic => serde_json::json!({
            "role": "user",
            "content": [{"type": "text", "text": text}],
        }),
        Format::Responses => serde_json::json!({
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        }),
    };
    serde_json::to_string(&value).expect("JSON values encode")
}

/// What marking a plan added.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Marked {
    /// Marker messages, each with the position in the plan's items it goes
    /// before, in order.
    pub inserts: Vec<(usize, String)>,
    /// Every id the markers name, in order.
    pub ids: Vec<String>,
    /// Chars the markers added.
    pub added_chars: usize,
    /// What each marker message of `inserts` stands for, in the same order.
    pub runs: Vec<DroppedRun>,
}

impl Marked {
    /// Counts what the markers add to the forwarded body in its loss.
    pub fn add_to(&self, loss: &mut crate::outcome::LossSummary) {
        loss.output_chars += self.added_chars;
        loss.output_messages += self.inserts.len();
        if loss.input_chars > 0 {
            loss.retained_ratio =
                crate::engine::round_to(loss.output_chars as f64 / loss.input_chars as f64, 4);
        }
    }
}

/// A run of dropped items one marker message stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedRun {
    /// The marker message's recall id.
    pub id: String,
    /// The first and last dropped item, inclusive.
    pub first: usize,
    pub last: usize,
    /// The dropped items' chars.
    pub chars: usize,
    /// The marker message's own chars.
    pub marker_chars: usize,
}

/// Puts a marker with its recall id wherever `plan` cut `parsed`'s items.
pub fn mark(parsed: &Parsed, plan: &mut Plan) -> Marked {
    let items = &parsed.conversation.items;
    let mut marked = Marked::default();
    for p in &mut plan.items {
        let item = &items[p.index];
        if let Some(text) = p.text.as_mut().filter(|t| **t != item.text) {
            let Some(id) = id_of(parsed, Source::Text { item: p.index }) else {
                continue;
            };
            let id = id.base();
            let cut = char_count(&item.text).saturating_sub(char_count(text));
            let line = text_marker(&id, cut);
            // Several results in one item: the marker joins the last piece
            // that kept anything, so every result keeps its own text.
            let pieces = p.pieces.clone().or_else(|| {
                let whole = super::agent::split_pieces(&item.text, &item.piece_chars)?;
                let whole: Vec<String> = whole.into_iter().map(str::to_owned).collect();
                super::agent::cut_pieces(&whole, text)
            });
            match pieces {
                Some(mut pieces) if !pieces.is_empty() => {
                    let at = pieces.iter().rposition(|s| !s.is_empty()).unwrap_or(0);
                    append_line(&mut pieces[at], &line);
                    *text = pieces.concat();
                    p.pieces = Some(pieces);
                }
                _ => append_line(text, &line),
            }
            marked.added_chars += char_count(&line) + 1;
            marked.ids.push(id);
        }
        for (call, args) in &mut p.arguments {
            let Some(old) = item.tool_calls.get(*call) else {
                continue;
            };
            if *args == old.arguments {
                continue;
            }
            let Some(id) = id_of(
                parsed,
                Source::Arguments {
                    item: p.index,
                    call: *call,
                },
            ) else {
                continue;
            };
            let id = id.base();
            let tag = format!(" chars omitted; {ID_LEAD}{id} …]");
            let tagged = args.replace(" chars omitted …]", &tag);
            if tagged != *args {
                marked.added_chars += char_count(&tagged) - char_count(args);
                *args = tagged;
                marked.ids.push(id);
            }
        }
    }
    // Runs of dropped items, each before the survivor that follows it.
    let mut next = 0;
    for (at, p) in plan.items.iter().enumerate() {
        if p.index > next {
            let (first, last) = (next, p.index - 1);
            if let Some(id) = id_of(parsed, Source::Dropped { first, last }) {
                let id = id.base();
                let chars: usize = items[first..=last].iter().map(|m| m.chars()).sum();
                let text = dropped_marker(&id, last - first + 1, chars);
                marked.added_chars += char_count(&text);
                marked.inserts.push((at, marker_item(parsed.format, &text)));
                marked.runs.push(DroppedRun {
                    id: id.clone(),
                    first,
                    last,
                    chars,
                    marker_chars: char_count(&text),
                });
                marked.ids.push(id);
            }
        }
        next = p.index + 1;
    }
    marked
}

fn append_line(text: &mut String, line: &str) {
    if !text.is_empty() {
        text.push('\n');
    }
    text.push_str(line);
}

/// The ids the markers of a forwarded body name.
pub fn forwarded_ids(body: &[u8]) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    let lead = ID_LEAD.as_bytes();
    let mut rest = body;
    while let Some(at) = memchr::memmem::find(rest, lead) {
        rest = &rest[at + lead.len()..];
        let end = rest
            .iter()
            .position(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')))
            .unwrap_or(rest.len());
        if let Ok(id) = std::str::from_utf8(&rest[..end]) {
            if RecallId::parse(id).is_some_and(|r| r.range.is_none()) {
                ids.insert(id.to_owned());
            }
        }
    }
    ids
}

/// Why an id is not answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("not a recall id")]
    Malformed,
    #[error("not an id of this request's markers")]
    NotInRequest,
    #[error("the content it names is not in this request")]
    Changed,
    #[error("its range is outside the original")]
    OutOfRange,
}

/// The original `id` stands for, at most `max_chars` chars of it: a longer
/// one comes back as head and tail around a marker whose id stands for
/// the middle. Only ids whose base is in `allowed` (the forwarded
/// markers' ids) are answered.
pub fn answer(
    parsed: &Parsed,
    allowed: &BTreeSet<String>,
    id: &str,
    max_chars: usize,
) -> Result<String, Refusal> {
    let recall = RecallId::parse(id).ok_or(Refusal::Malformed)?;
    let base = recall.base();
    if !allowed.contains(&base) {
        return Err(Refusal::NotInRequest);
    }
    let original = original(parsed, recall.source).ok_or(Refusal::Changed)?;
    if hash_of(recall.source, original.as_bytes()) != recall.hash {
        return Err(Refusal::Changed);
    }
    let total = char_count(&original);
    let (start, end) = recall.range.unwrap_or((0, total));
    if end > total {
        return Err(Refusal::OutOfRange);
    }
    let chars = |from: usize, to: usize| -> String {
        original.chars().skip(from).take(to - from).collect()
    };
    let len = end - start;
    let max = max_chars.max(2);
    if len <= max {
        return Ok(chars(start, end));
    }
    let head = max / 2;
    let tail = max - head;
    let middle = RecallId {
        range: Some((start + head, end - tail)),
        ..recall
    };
    let rest = format!("{base}@{}-{}", start + head, end - tail);
    debug_assert_eq!(RecallId::parse(&rest), Some(middle));
    Ok(format!(
        "{}\n[… {} chars omitted; {ID_LEAD}{rest} …]\n{}",
        chars(start, start + head),
        thousands(len - max),
        chars(end - tail, end)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(messages: &str) -> String {
        format!(r#"{{"model":"m","messages":{messages}}}"#)
    }

    #[test]
    fn ids_round_trip_and_refuse_other_spellings() {
        for source in [
            Source::Text { item: 3 },
            Source::Arguments { item: 4, call: 1 },
            Source::Dropped { first: 1, last: 7 },
        ] {
            let id = RecallId {
                source,
                hash: 0xabcdef0123456789,
                range: None,
            };
            assert_eq!(RecallId::parse(&id.base()), Some(id));
        }
        assert_eq!(RecallId::parse("rc_t01_abcdef0123456789"), None);
        assert_eq!(RecallId::parse("rc_d7-1_abcdef0123456789"), None);
        assert_eq!(RecallId::parse("rc_t1_abc"), None);
        assert_eq!(RecallId::parse("rc_t1_abcdef0123456789@9-3"), None);
        assert!(RecallId::parse("rc_t1_abcdef0123456789@3-9").is_some());
    }

    #[test]
    fn a_plan_is_marked_where_it_cut_and_dropped() {
        let body = chat(
            r#"[{"role":"user","content":"task"},{"role":"assistant","content":"old answer one"},{"role":"user","content":"old question"},{"role":"assistant","content":"a long answer that was trimmed"},{"role":"user","content":"latest"}]"#,
        );
        let parsed = Format::Chat.parse(body.as_bytes(), 100).unwrap();
        let mut plan = Plan {
            items: vec![
                crate::format::Planned::verbatim(0),
                crate::format::Planned {
                    text: Some("a long answer".into()),
                    ..crate::format::Planned::verbatim(3)
                },
                crate::format::Planned::verbatim(4),
            ],
        };
        let marked = mark(&parsed, &mut plan);
        assert_eq!(marked.ids.len(), 2, "{marked:?}");
        assert!(marked.ids[0].starts_with("rc_t3_"));
        assert!(marked.ids[1].starts_with("rc_d1-2_"));
        assert_eq!(marked.inserts.len(), 1);
        assert_eq!(marked.inserts[0].0, 1, "before the trimmed survivor");
        assert_eq!(
            (
                marked.runs[0].id.as_str(),
                marked.runs[0].first,
                marked.runs[0].last
            ),
            (marked.ids[1].as_str(), 1, 2)
        );
        let text = plan.items[1].text.as_deref().unwrap();
        assert!(text.starts_with(
            "a long answer\n[compaction-proxy cut 17 chars here; compaction_recall id: rc_t3_"
        ));
        let forwarded = parsed.splice_inserting_all(&plan, &marked.inserts);
        let value: serde_json::Value = serde_json::from_str(&forwarded).unwrap();
        assert_eq!(value["messages"].as_array().unwrap().len(), 4);
        let allowed = forwarded_ids(forwarded.as_bytes());
        assert_eq!(allowed.len(), 2);
        assert_eq!(
            answer(&parsed, &allowed, &marked.ids[0], 1000).unwrap(),
            "a long answer that was trimmed"
        );
        let dropped = answer(&parsed, &allowed, &marked.ids[1], 1000).unwrap();
        assert_eq!(
            dropped,
            "{\"role\":\"assistant\",\"content\":\"old answer one\"}\n{\"role\":\"user\",\"content\":\"old question\"}"
        );
    }

    #[test]
    fn ids_outside_the_markers_or_with_another_hash_are_refused() {
        let body = chat(r#"[{"role":"user","content":"secret text"}]"#);
        let parsed = Format::Chat.parse(body.as_bytes(), 100).unwrap();
        let real = id_of(&parsed, Source::Text { item: 0 }).unwrap().base();
        let none = BTreeSet::new();
        assert_eq!(
            answer(&parsed, &none, &real, 100),
            Err(Refusal::NotInRequest)
        );
        let forged = "rc_t0_0000000000000000".to_owned();
        let allowed: BTreeSet<String> = [forged.clone()].into();
        assert_eq!(
            answer(&parsed, &allowed, &forged, 100),
            Err(Refusal::Changed)
        );
        assert_eq!(
            answer(&parsed, &allowed, "junk", 100),
            Err(Refusal::Malformed)
        );
    }

    #[test]
    fn a_long_original_comes_back_head_and_tail_with_an_id_for_the_middle() {
        let text = "0123456789".repeat(10);
        let body = chat(&format!(r#"[{{"role":"user","content":"{text}"}}]"#));
        let parsed = Format::Chat.parse(body.as_bytes(), 100).unwrap();
        let id = id_of(&parsed, Source::Text { item: 0 }).unwrap().base();
        let allowed: BTreeSet<String> = [id.clone()].into();
        let first = answer(&parsed, &allowed, &id, 20).unwrap();
        assert!(first.starts_with("0123456789\n[… 80 chars omitted; compaction_recall id: "));
        assert!(first.ends_with("…]\n0123456789"));
        let rest = format!("{id}@10-90");
        assert!(first.contains(&rest));
        let middle = answer(&parsed, &allowed, &rest, 1000).unwrap();
        assert_eq!(middle, text[10..90]);
        assert_eq!(
            answer(&parsed, &allowed, &format!("{id}@10-900"), 1000),
            Err(Refusal::OutOfRange)
        );
    }

    #[test]
    fn marker_items_are_valid_in_every_format() {
        for format in Format::ALL {
            let item = marker_item(format, "x");
            let value: serde_json::Value = serde_json::from_str(&item).unwrap();
            assert_eq!(value["role"], "user");
        }
    }
}
