//! The prefix cache's contract: a parse resumed from a snapshot is the
//! whole parse, whatever the client did to its history, and an appending
//! turn does resume.

use proptest::prelude::*;
use serde_json::{json, Value};

use super::*;
use crate::config::Mode;
use crate::engine::{Policy, Role};
use crate::policy::CompiledPolicy;

/// Below the first item alone: every body is compacted, so every turn
/// splices and keeps its splice for the next turn to reuse.
const COMPACTS: usize = 20_000;
/// Above any session's bodies: every body is forwarded as it came.
const FITS: usize = 10_000_000;

fn policy(mode: Mode) -> CompiledPolicy {
    policy_within(mode, COMPACTS)
}

/// [`policy`] with the agent passes on and a protected window smaller
/// than one large tool result: the newest result, alone past it, is cut
/// to head and tail (in stable mode, a cut carried across turns).
fn agent_policy(mode: Mode) -> CompiledPolicy {
    let mut p = policy(mode);
    p.agent = crate::compaction::agent::AgentPolicy {
        max_tool_result_chars: 1000,
        protect_tool_chars: 2000,
        prune_minimum_chars: 0,
        ..crate::compaction::agent::AgentPolicy::DEFAULT
    };
    p
}

fn policy_within(mode: Mode, budget: usize) -> CompiledPolicy {
    let mut engine = Policy::with_budget(budget);
    engine.keep_roles = vec![Role::System];
    engine.max_message_chars = 4000;
    // Few kept whole: the session's first, long item goes from its third
    // turn on.
    engine.keep_last_n = 2;
    let mut p = CompiledPolicy::plain("prefix", engine);
    p.mode = mode;
    p.pin_first_user = false;
    p
}

/// Text of `n` chars with escapes (newlines, quotes) now and then.
fn text(n: usize, seed: u64) -> String {
    let mut out = String::with_capacity(n + 16);
    let mut x = seed | 1;
    while out.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        match x % 11 {
            0 => out.push('\n'),
            1 => out.push_str("\"q\""),
            2 => out.push('é'),
            _ => out.push_str("word "),
        }
    }
    out
}

/// Turn `t`'s items: the model's call and the tool's result.
fn turn_items(format: Format, t: usize, size: usize) -> Vec<Value> {
    let id = format!("call_{t}");
    let out = text(size, t as u64 + 7);
    match format {
        Format::Chat => vec![
            json!({"role": "assistant", "content": "ok", "tool_calls": [{"id": id, "type": "function",
                   "function": {"name": "read", "arguments": "{\"p\":1}"}}]}),
            json!({"role": "tool", "tool_call_id": id, "content": out}),
        ],
        Format::Anthropic => {
            let mut result = json!({"type": "tool_result", "tool_use_id": id, "content": out});
            // A client's cache breakpoint now and then: where its item goes,
            // the marker moves to another (the splice of what the previous
            // turn forwarded is not reused then).
            if t % 3 == 0 {
                result["cache_control"] = json!({"type": "ephemeral"});
            }
            vec![
                json!({"role": "assistant", "content": [{"type": "text", "text": "ok"},
                       {"type": "tool_use", "id": id, "name": "read", "input": {"p": 1}}]}),
                json!({"role": "user", "content": [result]}),
            ]
        }
        Format::Responses => vec![
            json!({"type": "function_call", "call_id": id, "name": "read", "arguments": "{\"p\":1}"}),
            json!({"type": "function_call_output", "call_id": id, "output": out}),
        ],
    }
}

fn first_items(format: Format, task: &str) -> Vec<Value> {
    // Large enough that every body is snapshotted.
    let big = text(MIN_SNAPSHOT_BYTES, 3);
    match format {
        Format::Chat => vec![
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": format!("{task} {big}")}),
        ],
        Format::Anthropic | Format::Responses => {
            vec![json!({"role": "user", "content": format!("{task} {big}")})]
        }
    }
}

/// A body of `items`, its top-level fields in one of two orders.
fn body(format: Format, items: &[Value], model: &str, array_first: bool) -> Vec<u8> {
    let array = serde_json::to_string(items).unwrap();
    let field = match format {
        Format::Responses => "input",
        _ => "messages",
    };
    let others = match format {
        Format::Chat => format!("\"model\":{model:?},\"stream\":true"),
        Format::Anthropic => {
            format!("\"model\":{model:?},\"max_tokens\":100,\"system\":\"s\",\"stream\":true")
        }
        Format::Responses => format!("\"model\":{model:?},\"instructions\":\"i\",\"stream\":true"),
    };
    let text = if array_first {
        format!("{{\"{field}\": {array}, {others}}}")
    } else {
        format!("{{{others}, \"{field}\":{array}}}")
    };
    text.into_bytes()
}

#[derive(Debug, Clone)]
enum Edit {
    /// A new turn appended.
    Append(usize),
    /// A model's call appended alone: its result comes with the next
    /// turn, so the call is open across the snapshot.
    Call(usize),
    /// An earlier item's text changed (by index among the items).
    Earlier(usize),
    /// Another model (a top-level field).
    Model,
    /// The top-level keys in the other order.
    Reorder,
    /// The body cut mid-message (a broken client), once.
    Cut(f64),
    /// The last item replaced (a new question on the same history).
    Last(Replace),
    /// The last item dropped.
    DropLast,
    /// The body cut just after the item before the last, once.
    CutBeforeLast,
}

/// What replaces the last item.
#[derive(Debug, Clone, Copy)]
enum Replace {
    /// A user message of about this many chars.
    Question(usize),
    /// An assistant message of about this many chars (another role).
    Answer(usize),
    /// The same item, as many bytes, one char changed in its longest text.
    SameLength,
    /// A model's call, its result to come with the next turn.
    Call,
    /// A tool result of about this many chars, for the latest call.
    Result(usize),
}

fn replace() -> impl Strategy<Value = Replace> {
    prop_oneof![
        (10usize..3000).prop_map(Replace::Question),
        (10usize..3000).prop_map(Replace::Answer),
        Just(Replace::SameLength),
        Just(Replace::Call),
        // Past `max_message_chars` too: cut to head and tail.
        (10usize..9000).prop_map(Replace::Result),
    ]
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        6 => (200usize..3000).prop_map(Edit::Append),
        2 => (200usize..3000).prop_map(Edit::Call),
        1 => (0usize..64).prop_map(Edit::Earlier),
        1 => Just(Edit::Model),
        1 => Just(Edit::Reorder),
        1 => (0.05f64..0.999).prop_map(Edit::Cut),
        5 => replace().prop_map(Edit::Last),
        1 => Just(Edit::DropLast),
        1 => Just(Edit::CutBeforeLast),
    ]
}

/// A message of `role` (user or assistant) with `text`.
fn message(format: Format, role: &str, text: String) -> Value {
    match format {
        Format::Chat | Format::Anthropic => json!({"role": role, "content": text}),
        Format::Responses => json!({"type": "message", "role": role, "content": text}),
    }
}

/// A tool result of `text` for call `id`.
fn tool_result(format: Format, id: &str, text: String) -> Value {
    match format {
        Format::Chat => json!({"role": "tool", "tool_call_id": id, "content": text}),
        Format::Anthropic => json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": text}]}),
        Format::Responses => json!({"type": "function_call_output", "call_id": id, "output": text}),
    }
}

/// `value` with one ASCII letter of its longest string changed (as many
/// bytes as before).
fn flip_longest_string(value: &mut Value) {
    fn longest(v: &mut Value) -> Option<&mut String> {
        match v {
            Value::String(s) => Some(s),
            Value::Array(a) => a.iter_mut().filter_map(longest).max_by_key(|s| s.len()),
            Value::Object(o) => o.values_mut().filter_map(longest).max_by_key(|s| s.len()),
            _ => None,
        }
    }
    let Some(s) = longest(value) else { return };
    if let Some(at) = s.find(|c: char| c.is_ascii_lowercase()) {
        let c = s.as_bytes()[at];
        let other = if c == b'z' { 'a' } else { (c + 1) as char };
        s.replace_range(at..at + 1, other.encode_utf8(&mut [0; 4]));
    }
}

/// What a parse is, as two paths must agree on it: its items and spans,
/// and the values carried across turns for its items (each item's chars
/// and chained hash), which its `Debug` leaves out.
fn seen(parsed: &Parsed<'_>) -> String {
    format!(
        "{parsed:?} chars {:?} chain {:?}",
        parsed.text_chars(),
        parsed.item_chain()
    )
}

/// What a path makes of a body: the parse (all of it, spans included) and
/// the bytes forwarded, or why it was skipped.
fn whole(
    format: Format,
    body: &[u8],
    policy: &CompiledPolicy,
    checkpoints: &CheckpointStore,
) -> Result<(String, Vec<u8>), Skip> {
    let parsed = format.parse(body, 10_000)?;
    let outcome = crate::proxy::compact::outcome_of_parsed(&parsed, policy, checkpoints, None);
    let forwarded = outcome.rewritten.map_or(body.to_vec(), |b| b.to_vec());
    Ok((seen(&parsed), forwarded))
}

fn resumed(
    prefixes: &PrefixCache,
    format: Format,
    body: &[u8],
    policy: &CompiledPolicy,
    checkpoints: &CheckpointStore,
) -> Result<(String, Vec<u8>), Skip> {
    let (parsed, lease) = prefixes.parse(policy.id, format, body, 10_000)?;
    let outcome = crate::proxy::compact::outcome_of_parsed(&parsed, policy, checkpoints, None);
    let seen = seen(&parsed);
    prefixes.keep(lease, parsed);
    let forwarded = outcome.rewritten.map_or(body.to_vec(), |b| b.to_vec());
    Ok((seen, forwarded))
}

#[derive(Clone)]
struct Session {
    items: Vec<Value>,
    /// The result of a call appended alone, for the next turn.
    pending: Option<Value>,
    model: String,
    array_first: bool,
    turns: usize,
}

impl Session {
    fn new(format: Format, task: &str) -> Self {
        Session {
            items: first_items(format, task),
            pending: None,
            model: "m-1".into(),
            array_first: true,
            turns: 0,
        }
    }

    /// The next request's body after `edit` (a cut is not kept).
    fn apply(&mut self, format: Format, edit: &Edit) -> Vec<u8> {
        match edit {
            Edit::Append(size) | Edit::Call(size) => {
                self.items.extend(self.pending.take());
                self.turns += 1;
                let mut new = turn_items(format, self.turns, *size);
                if matches!(edit, Edit::Call(_)) {
                    self.pending = new.pop();
                }
                self.items.extend(new);
            }
            Edit::Earlier(k) => {
                let k = k % self.items.len();
                let item = &mut self.items[k];
                let note = Value::String(format!("edited {k}"));
                match format {
                    Format::Responses if item.get("output").is_some() => item["output"] = note,
                    Format::Responses if item.get("arguments").is_some() => {
                        item["arguments"] = Value::String("{\"p\":2}".into())
                    }
                    _ if item.get("content").is_some() => item["content"] = note,
                    _ => item["edited"] = note,
                }
            }
            Edit::Model => self.model.push('x'),
            Edit::Reorder => self.array_first = !self.array_first,
            Edit::Cut(at) => {
                let whole = body(format, &self.items, &self.model, self.array_first);
                let mut cut = ((whole.len() as f64) * at) as usize;
                while std::str::from_utf8(&whole[..cut]).is_err() {
                    cut -= 1;
                }
                return whole[..cut].to_vec();
            }
            Edit::Last(what) => {
                let seed = self.items.len() as u64 * 31 + 5;
                let new = match *what {
                    Replace::Question(size) => message(format, "user", text(size, seed)),
                    Replace::Answer(size) => message(format, "assistant", text(size, seed)),
                    Replace::SameLength => {
                        let mut last = self.items.last().cloned().unwrap_or_default();
                        flip_longest_string(&mut last);
                        last
                    }
                    Replace::Call => {
                        self.turns += 1;
                        let mut turn = turn_items(format, self.turns, 300);
                        self.pending = turn.pop();
                        turn.remove(0)
                    }
                    Replace::Result(size) => {
                        let id = format!("call_{}", self.turns);
                        tool_result(format, &id, text(size, seed))
                    }
                };
                if !matches!(what, Replace::Call) {
                    self.pending = None;
                }
                match self.items.last_mut() {
                    Some(last) => *last = new,
                    None => self.items.push(new),
                }
            }
            Edit::DropLast => {
                if self.items.len() > 1 {
                    self.items.pop();
                }
                self.pending = None;
            }
            Edit::CutBeforeLast => {
                let whole = body(format, &self.items, &self.model, self.array_first);
                let last = serde_json::to_string(self.items.last().unwrap()).unwrap();
                // Before the comma that goes before the last item.
                let at = find_last(&whole, last.as_bytes()).map_or(whole.len(), |at| at - 1);
                return whole[..at].to_vec();
            }
        }
        body(format, &self.items, &self.model, self.array_first)
    }
}

/// Where `needle` last starts in `haystack`.
fn find_last(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// For random sessions with random edits, the resumed parse forwards
    /// exactly what the whole parse forwards (and parses the same, spans
    /// included); on an appending turn after a kept parse it does resume.
    /// With every body filed under one slot (a forced collision), two
    /// sessions interleaved still get their own parses.
    #[test]
    fn a_resumed_parse_forwards_what_the_whole_parse_forwards(
        format in prop_oneof![Just(Format::Chat), Just(Format::Anthropic), Just(Format::Responses)],
        stable in any::<bool>(),
        collide in any::<bool>(),
        fits in any::<bool>(),
        edits in proptest::collection::vec((edit(), any::<bool>()), 1..14),
    ) {
        let mode = if stable { Mode::Stable } else { Mode::Exact };
        let policy = policy_within(mode, if fits { FITS } else { COMPACTS });
        let prefixes = if collide {
            PrefixCache::colliding(64 << 20)
        } else {
            PrefixCache::new(64 << 20)
        };
        let (full_ck, resumed_ck) = (CheckpointStore::new(1 << 20), CheckpointStore::new(1 << 20));
        let mut sessions = [Session::new(format, "task one"), Session::new(format, "task two")];
        // Whether each session's last request left a snapshot to extend.
        let mut kept = [false, false];
        let mut expected_hits = 0;
        for (edit, second) in &edits {
            let s = usize::from(*second && collide);
            let request = sessions[s].apply(format, edit);
            let before = prefixes.hits();
            let want = whole(format, &request, &policy, &full_ck);
            let got = resumed(&prefixes, format, &request, &policy, &resumed_ck);
            prop_assert_eq!(&got, &want, "{:?} on session {}", edit, s);
            let hit = prefixes.hits() - before;
            // (Interleaved sessions in one slot may push each other's
            // snapshots out: only the lone session is held to resuming.)
            if matches!(edit, Edit::Append(_) | Edit::Call(_)) && kept[s] && !collide {
                prop_assert_eq!(hit, 1, "an appending turn resumes");
                expected_hits += 1;
            }
            // A cut body may take the session's snapshot with it.
            kept[s] = !matches!(edit, Edit::Cut(_) | Edit::CutBeforeLast)
                && want.is_ok()
                && request.len() >= MIN_SNAPSHOT_BYTES;
        }
        prop_assert!(prefixes.hits() >= expected_hits);
    }
}

#[test]
fn an_appending_turn_resumes_and_parses_only_what_it_appends() {
    for format in Format::ALL {
        let policy = policy(Mode::Stable);
        let prefixes = PrefixCache::new(64 << 20);
        let ck = CheckpointStore::new(1 << 20);
        let mut session = Session::new(format, "t");
        let first = session.apply(format, &Edit::Append(500));
        resumed(&prefixes, format, &first, &policy, &ck).unwrap();
        assert_eq!((prefixes.hits(), prefixes.misses()), (0, 1), "{format}");
        for turn in 0..5 {
            let next = session.apply(format, &Edit::Append(700 + turn));
            let want = whole(format, &next, &policy, &CheckpointStore::new(0));
            assert_eq!(resumed(&prefixes, format, &next, &policy, &ck), want);
        }
        assert_eq!((prefixes.hits(), prefixes.misses()), (5, 1), "{format}");
        // An edited earlier message: a miss, and the same parse.
        let edited = session.apply(format, &Edit::Earlier(3));
        let want = whole(format, &edited, &policy, &CheckpointStore::new(0));
        assert_eq!(resumed(&prefixes, format, &edited, &policy, &ck), want);
        assert_eq!((prefixes.hits(), prefixes.misses()), (5, 2), "{format}");
    }
}

/// A turn whose last item replaces the previous turn's (a new question on
/// the same history, another role, a call or a result, as long as before
/// or not) resumes before that item, and forwards what the whole parse
/// forwards.
#[test]
fn a_turn_that_replaces_its_last_item_resumes_before_it() {
    let turns = [
        Edit::Last(Replace::Question(400)),
        // The same body again (a retry): the next replacement still
        // resumes.
        Edit::Last(Replace::Question(400)),
        Edit::Last(Replace::SameLength),
        Edit::Last(Replace::Answer(90)),
        Edit::Last(Replace::Result(2500)),
        Edit::Last(Replace::Call),
        Edit::Append(600),
        Edit::Last(Replace::Question(5)),
        Edit::DropLast,
        Edit::Append(300),
    ];
    for format in Format::ALL {
        for mode in [Mode::Stable, Mode::Exact] {
            let policy = policy(mode);
            let prefixes = PrefixCache::new(64 << 20);
            let ck = CheckpointStore::new(1 << 20);
            let mut session = Session::new(format, "t");
            for edit in [Edit::Append(500), Edit::Append(500)] {
                let body = session.apply(format, &edit);
                resumed(&prefixes, format, &body, &policy, &ck).unwrap();
            }
            assert_eq!((prefixes.hits(), prefixes.misses()), (1, 1), "{format}");
            for (n, edit) in turns.iter().enumerate() {
                let next = session.apply(format, edit);
                let want = whole(format, &next, &policy, &CheckpointStore::new(0));
                let got = resumed(&prefixes, format, &next, &policy, &ck);
                assert_eq!(got, want, "{format} {mode:?} {edit:?}");
                assert_eq!(
                    (prefixes.hits(), prefixes.misses()),
                    (n as u64 + 2, 1),
                    "{format} {mode:?} {edit:?} resumes"
                );
            }
        }
    }
}

/// After a compacted turn (its splice kept for the next turn to reuse), a
/// turn whose last item replaces that turn's forwards the new item, not
/// what the previous splice wrote in its place, and carries the new item's
/// values (chars, chained hash, text cut to head and tail), not the old
/// one's: the replaced item sits at the same index, planned alike.
#[test]
fn a_replaced_last_item_is_forwarded_as_it_now_is_not_as_the_previous_splice_wrote_it() {
    let turns = [
        Edit::Append(500),
        Edit::Last(Replace::SameLength),
        // Past `max_message_chars`: cut to head and tail.
        Edit::Last(Replace::Result(6000)),
        Edit::Last(Replace::Result(7000)),
        Edit::Last(Replace::SameLength),
    ];
    for format in Format::ALL {
        for (mode, agent) in [Mode::Stable, Mode::Exact]
            .into_iter()
            .flat_map(|m| [(m, false), (m, true)])
        {
            let policy = match agent {
                true => agent_policy(mode),
                false => policy(mode),
            };
            let prefixes = PrefixCache::new(64 << 20);
            let ck = CheckpointStore::new(1 << 20);
            let mut session = Session::new(format, "t");
            let mut forwarded = (Vec::new(), Vec::new());
            for edit in [
                Edit::Append(500),
                Edit::Last(Replace::Question(300)),
                Edit::Append(500),
            ] {
                let body = session.apply(format, &edit);
                forwarded = (
                    resumed(&prefixes, format, &body, &policy, &ck).unwrap().1,
                    body,
                );
            }
            assert_ne!(forwarded.0, forwarded.1, "{format} {mode:?}: compacted");
            for edit in &turns {
                let next = session.apply(format, edit);
                let want = whole(format, &next, &policy, &CheckpointStore::new(0));
                let hits = prefixes.hits();
                let got = resumed(&prefixes, format, &next, &policy, &ck);
                assert_eq!(got, want, "{format} {mode:?} agent {agent} {edit:?}");
                assert_eq!(
                    prefixes.hits(),
                    hits + 1,
                    "{format} {mode:?} agent {agent} {edit:?}"
                );
            }
        }
    }
}

/// A stable-mode policy, and a prefix cache and checkpoints that have seen
/// the first two turns of a `format` session.
fn after_two_turns(format: Format) -> (CompiledPolicy, PrefixCache, CheckpointStore, Session) {
    let policy = policy(Mode::Stable);
    let prefixes = PrefixCache::new(64 << 20);
    let ck = CheckpointStore::new(1 << 20);
    let mut session = Session::new(format, "t");
    for edit in [Edit::Append(500), Edit::Append(500)] {
        let body = session.apply(format, &edit);
        resumed(&prefixes, format, &body, &policy, &ck).unwrap();
    }
    (policy, prefixes, ck, session)
}

/// Responses reasoning joins the group of the item after it: a snapshot
/// whose last item took reasoning read before it holds that reasoning as
/// grouped, not as the loop had it before the last item. A body that
/// replaces that item (here with more reasoning, which joins nothing) is
/// parsed whole.
#[test]
fn a_replaced_item_that_reasoning_waited_for_is_parsed_whole() {
    let format = Format::Responses;
    let (policy, prefixes, ck, mut session) = after_two_turns(format);
    let reasoning = |id: &str| json!({"type": "reasoning", "id": id, "summary": []});
    session.items.push(reasoning("r1"));
    session
        .items
        .push(message(format, "assistant", "done".into()));
    let answered = body(format, &session.items, "m-1", true);
    resumed(&prefixes, format, &answered, &policy, &ck).unwrap();
    let hits = prefixes.hits();
    *session.items.last_mut().unwrap() = reasoning("r2");
    let next = body(format, &session.items, "m-1", true);
    let want = whole(format, &next, &policy, &CheckpointStore::new(0));
    assert_eq!(resumed(&prefixes, format, &next, &policy, &ck), want);
    assert_eq!(prefixes.hits(), hits, "not resumed");
}

/// A Chat legacy `function` result joins the group of the `function_call`
/// before it. Replacing that result resumes from the state before it,
/// where the call's group is still open, so the new result joins the call
/// as the whole parse has it; after a result has taken the group, a
/// replaced result resumes with it still open as well.
#[test]
fn a_replaced_legacy_function_result_joins_the_call_before_it() {
    let format = Format::Chat;
    let (policy, prefixes, ck, mut session) = after_two_turns(format);
    let result = |text: &str| json!({"role": "function", "name": "read", "content": text});
    session
        .items
        .push(json!({"role": "assistant", "content": null,
        "function_call": {"name": "read", "arguments": "{\"p\":1}"}}));
    session.items.push(result("first result"));
    let answered = body(format, &session.items, "m-1", true);
    resumed(&prefixes, format, &answered, &policy, &ck).unwrap();
    for text in ["second result", "a third, longer result than before"] {
        *session.items.last_mut().unwrap() = result(text);
        let next = body(format, &session.items, "m-1", true);
        let want = whole(format, &next, &policy, &CheckpointStore::new(0));
        let items = format.parse(&next, 10_000).unwrap().conversation.items;
        let [.., call, answer] = &items[..] else {
            unreachable!()
        };
        assert_eq!(
            (answer.group, call.group.is_some()),
            (call.group, true),
            "the result is grouped with its call"
        );
        let hits = prefixes.hits();
        assert_eq!(
            resumed(&prefixes, format, &next, &policy, &ck),
            want,
            "{text}"
        );
        assert_eq!(prefixes.hits(), hits + 1, "{text}: resumed");
    }
}

/// With every body filed under one slot (a forced collision), a turn
/// that replaces its last item resumes from its own conversation's
/// snapshot only: another conversation's, whose items but the last
/// differ, is never cut back and used.
#[test]
fn a_replaced_last_item_resumes_only_from_its_own_conversation_when_slots_collide() {
    for format in Format::ALL {
        let policy = policy(Mode::Stable);
        let prefixes = PrefixCache::colliding(64 << 20);
        let ck = CheckpointStore::new(1 << 20);
        let mut sessions = [
            Session::new(format, "task one"),
            Session::new(format, "task two"),
        ];
        for session in &mut sessions {
            for edit in [Edit::Append(500), Edit::Append(700)] {
                let body = session.apply(format, &edit);
                resumed(&prefixes, format, &body, &policy, &ck).unwrap();
            }
        }
        let hits = prefixes.hits();
        for (s, edit) in [
            (0, Edit::Last(Replace::Question(300))),
            (1, Edit::Last(Replace::SameLength)),
            (0, Edit::Last(Replace::Answer(300))),
            (1, Edit::Last(Replace::Result(900))),
        ] {
            let next = sessions[s].apply(format, &edit);
            let want = whole(format, &next, &policy, &CheckpointStore::new(0));
            assert_eq!(resumed(&prefixes, format, &next, &policy, &ck), want);
        }
        assert_eq!(prefixes.hits(), hits + 4, "{format}");
    }
}

#[test]
fn small_bodies_and_a_cache_of_zero_bytes_parse_whole_and_keep_nothing() {
    let policy = policy(Mode::Stable);
    let ck = CheckpointStore::new(0);
    let small = br#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let on = PrefixCache::new(1 << 20);
    resumed(&on, Format::Chat, small, &policy, &ck).unwrap();
    assert_eq!((on.hits(), on.misses(), on.weighted_size()), (0, 0, 0));
    let off = PrefixCache::new(0);
    let mut session = Session::new(Format::Chat, "t");
    for _ in 0..3 {
        let body = session.apply(Format::Chat, &Edit::Append(100));
        resumed(&off, Format::Chat, &body, &policy, &ck).unwrap();
    }
    assert_eq!((off.hits(), off.misses(), off.weighted_size()), (0, 0, 0));
}

#[test]
fn a_snapshot_weighs_at_least_what_it_holds() {
    let mut session = Session::new(Format::Chat, "t");
    let body = session.apply(Format::Chat, &Edit::Append(20_000));
    let (parsed, state) = Format::Chat.parse_resumable(&body, 100).unwrap();
    let texts: usize = parsed.conversation.items.iter().map(|m| m.text.len()).sum();
    let snapshot = Snapshot::of(parsed, state.unwrap(), None).unwrap();
    // The prefix, the items' texts and the escaped texts' decoded copies.
    assert!(
        snapshot.weight() >= snapshot.prefix().len() + 2 * texts,
        "{} < {} + 2 * {texts}",
        snapshot.weight(),
        snapshot.prefix().len()
    );
    assert!(snapshot.weight() <= 4 * body.len(), "{}", snapshot.weight());
}

/// Memory stays bounded by `prefix_max_bytes` with 100,000 distinct
/// sessions (each body just over the snapshot threshold).
#[test]
fn memory_stays_bounded_with_100000_sessions() {
    let max = 8u64 << 20;
    let prefixes = PrefixCache::new(max);
    let filler = "x".repeat(MIN_SNAPSHOT_BYTES);
    let head = r#"{"model":"m","messages":[{"role":"user","content":"session "#;
    for n in 0..100_000u32 {
        let body = format!(
            r#"{head}{n} {filler}"}},{{"role":"assistant","content":"ok"}}],"stream":true}}"#
        );
        let (parsed, lease) = prefixes
            .parse(1, Format::Chat, body.as_bytes(), 10)
            .unwrap();
        prefixes.keep(lease, parsed);
    }
    let held = prefixes.weighted_size();
    assert!(held <= max, "{held} > {max}");
    assert!(held >= max / 2, "the cache is used: {held}");
    assert_eq!(prefixes.misses(), 100_000);
}

/// A splice that reuses the previous turn's output moves a dropped item's
/// cache breakpoint as the whole splice does (by not reusing it then).
#[test]
fn a_reused_splice_moves_a_dropped_items_marker_as_the_whole_splice_does() {
    use crate::format::{Plan, Planned};
    let format = Format::Anthropic;
    let mut session = Session::new(format, "t");
    let first = session.apply(format, &Edit::Append(300));
    // Turn 3's result carries a marker (every third turn's does).
    let second = [Edit::Append(300), Edit::Append(300)]
        .iter()
        .map(|e| session.apply(format, e))
        .last()
        .unwrap();
    let prefixes = PrefixCache::new(64 << 20);
    let (parsed, lease) = prefixes.parse(1, format, &first, 100).unwrap();
    // The first item cut short: the body is rewritten.
    let mut head = Planned::verbatim(0);
    head.text = Some("t".into());
    let plan = |n: usize, drop: Option<usize>| Plan {
        items: std::iter::once(head.clone())
            .chain((1..n).filter(|&i| Some(i) != drop).map(Planned::verbatim))
            .collect(),
    };
    let out = parsed.splice(&plan(parsed.len(), None));
    let kept = parsed.len();
    parsed.keep_splice(plan(kept, None), out);
    prefixes.keep(lease, parsed);
    let (resumed, _) = prefixes.parse(1, format, &second, 100).unwrap();
    assert_eq!(prefixes.hits(), 1);
    let n = resumed.len();
    let marked = n - 1;
    assert!(String::from_utf8_lossy(resumed.item_bytes(marked)).contains("cache_control"));
    let whole = format.parse(&second, 100).unwrap();
    for plan in [plan(n, None), plan(n, Some(marked))] {
        assert_eq!(resumed.splice(&plan), whole.splice(&plan));
    }
}

/// `Snapshot::may_extend` rules out a sibling (another last item on the
/// same history) by the bytes where the body differs from another
/// sibling, and never a snapshot the body extends, wherever it looks.
#[test]
fn a_sibling_is_ruled_out_where_the_body_leaves_another_and_an_extension_never_is() {
    for format in Format::ALL {
        let mut session = Session::new(format, "t");
        session.apply(format, &Edit::Append(20_000));
        let history = session.apply(format, &Edit::Append(20_000));
        let snapshot = |body: &[u8]| {
            let (parsed, state) = format.parse_resumable(body, 100).unwrap();
            Snapshot::of(parsed, state.unwrap(), None).unwrap()
        };
        let last =
            |session: &Session, what: Replace| session.clone().apply(format, &Edit::Last(what));
        let first = snapshot(&last(&session, Replace::Question(900)));
        let second = snapshot(&last(&session, Replace::Answer(900)));
        let body = last(&session, Replace::SameLength);
        let (how, shared) = first.continuation(&body);
        assert_eq!(how, Some(Continuation::ReplacesLast), "{format}");
        assert_eq!(
            second.continuation(&body).0,
            Some(Continuation::ReplacesLast),
            "{format}"
        );
        assert!(!second.may_extend(&body, shared), "{format}");
        // The history itself, which the body extends: never ruled out.
        let extended = snapshot(&history);
        let next = session.apply(format, &Edit::Append(700));
        assert_eq!(
            extended.continuation(&next).0,
            Some(Continuation::Extends),
            "{format}"
        );
        for at in [0, 1, shared, history.len() - 1, history.len(), usize::MAX] {
            assert!(extended.may_extend(&next, at), "{format} at {at}");
        }
        // Its own bytes and no more do not go on from it.
        assert!(!extended.may_extend(extended.prefix(), 0), "{format}");
    }
}
