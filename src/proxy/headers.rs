//! Header rules: hop-by-hop headers are stripped in both directions, and
//! the loss report is written onto responses of matched routes.

use std::fmt::Write;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::compaction::stable::StableInfo;
use crate::outcome::{LossSummary, Status};

/// Hop-by-hop headers (RFC 9110 7.6.1) plus the legacy ones proxies see;
/// `Connection` first ([`strip_hop_by_hop`] reads its tokens).
pub static HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("proxy-connection"),
];

/// Whether `name` has the length of one of [`HOP_BY_HOP`]: spares comparing
/// the common names (`host`, `content-type`, `authorization`) with all nine.
fn may_be_hop_by_hop(name: &HeaderName) -> bool {
    matches!(name.as_str().len(), 2 | 7 | 10 | 16 | 17 | 18 | 19)
}

/// The comma-separated tokens of every `Connection` header, trimmed.
fn connection_tokens(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
}

/// Removes hop-by-hop headers and every header named in `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the names finds the few present (usually `Connection`
    // alone, or none): cheaper than a lookup per listed name.
    let mut present = 0u16; // bit i: HOP_BY_HOP[i] is in `headers`
    for name in headers.keys().filter(|name| may_be_hop_by_hop(name)) {
        if let Some(i) = HOP_BY_HOP.iter().position(|hop| hop == name) {
            present |= 1 << i;
        }
    }
    let connection_present = present & 1 != 0;
    // `Connection: keep-alive`, by far the most common, names a listed
    // header: told apart before parsing a name. `close` is parsed: a field
    // named `Close` is a connection option too (RFC 9110, 7.6.1).
    let listed = |token: &str| {
        HOP_BY_HOP
            .iter()
            .any(|hop| token.eq_ignore_ascii_case(hop.as_str()))
    };
    let named: Vec<HeaderName> = if connection_present {
        connection_tokens(headers)
            .filter(|token| !listed(token))
            .filter_map(|name| HeaderName::try_from(name).ok())
            .collect()
    } else {
        Vec::new()
    };
    let present_names = HOP_BY_HOP
        .iter()
        .enumerate()
        .filter(|(i, _)| present & 1 << i != 0)
        .map(|(_, name)| name);
    for name in present_names.chain(&named) {
        headers.remove(name);
    }
}

/// The protocol asked for (request) or agreed to (response) when the
/// message is a protocol upgrade: `Connection: upgrade` and `Upgrade` set.
pub fn upgrade_protocol(headers: &HeaderMap) -> Option<HeaderValue> {
    connection_tokens(headers)
        .any(|token| token.eq_ignore_ascii_case("upgrade"))
        .then(|| headers.get(header::UPGRADE).cloned())
        .flatten()
}

/// [`strip_hop_by_hop`], except that a protocol upgrade keeps its two
/// headers: the one hop-by-hop exchange a proxy carries on. Returns the
/// protocol when the message is an upgrade.
pub fn strip_hop_by_hop_keeping_upgrade(headers: &mut HeaderMap) -> Option<HeaderValue> {
    let protocol = upgrade_protocol(headers);
    strip_hop_by_hop(headers);
    if let Some(protocol) = &protocol {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        headers.insert(header::UPGRADE, protocol.clone());
    }
    protocol
}

pub const STATUS: &str = "x-compaction-status";
pub const POLICY: &str = "x-compaction-policy";
pub const BYPASS: &str = "x-compaction-bypass";

const STATUS_NAME: HeaderName = HeaderName::from_static(STATUS);
const POLICY_NAME: HeaderName = HeaderName::from_static(POLICY);
const INPUT_CHARS: HeaderName = HeaderName::from_static("x-compaction-input-chars");
const OUTPUT_CHARS: HeaderName = HeaderName::from_static("x-compaction-output-chars");
const INPUT_MESSAGES: HeaderName = HeaderName::from_static("x-compaction-input-messages");
const OUTPUT_MESSAGES: HeaderName = HeaderName::from_static("x-compaction-output-messages");
const DROPPED_MESSAGES: HeaderName = HeaderName::from_static("x-compaction-dropped-messages");
const DEDUPED_MESSAGES: HeaderName = HeaderName::from_static("x-compaction-deduped-messages");
const TRIMMED_MESSAGES: HeaderName = HeaderName::from_static("x-compaction-trimmed-messages");
const PRUNED_CHARS: HeaderName = HeaderName::from_static("x-compaction-pruned-chars");
const CLIPPED_CHARS: HeaderName = HeaderName::from_static("x-compaction-clipped-chars");
const DEDUPED_TOOL_CHARS: HeaderName = HeaderName::from_static("x-compaction-deduped-tool-chars");
const STRIPPED_THINKING: HeaderName = HeaderName::from_static("x-compaction-stripped-thinking");
const INPUT_TOKENS: HeaderName = HeaderName::from_static("x-compaction-input-tokens");
const OUTPUT_TOKENS: HeaderName = HeaderName::from_static("x-compaction-output-tokens");
const BUDGET_TOKENS: HeaderName = HeaderName::from_static("x-compaction-budget-tokens");
const RETAINED_RATIO: HeaderName = HeaderName::from_static("x-compaction-retained-ratio");
const BUDGET_MET: HeaderName = HeaderName::from_static("x-compaction-budget-met");

/// Writes the loss report headers of INTERFACE.md. This runs on every
/// response, so the names are constants and the figures are written into
/// one buffer that every value shares, instead of an allocation each.
/// The summary a request forwarded: its id, chunks, passes and the
/// summarizer tokens spent on this request.
pub fn write_summary(headers: &mut HeaderMap, summary: &crate::outcome::SummaryReport) {
    if let Ok(id) = HeaderValue::try_from(summary.id.as_str()) {
        headers.insert(HeaderName::from_static("x-compaction-summary-id"), id);
    }
    let numbers = [
        ("x-compaction-summary-chunks", Some(summary.chunks as u64)),
        ("x-compaction-summary-passes", Some(summary.passes as u64)),
        (
            "x-compaction-summary-replaced",
            Some(summary.replaced as u64),
        ),
        (
            "x-compaction-summarizer-prompt-tokens",
            summary.prompt_tokens,
        ),
        (
            "x-compaction-summarizer-completion-tokens",
            summary.completion_tokens,
        ),
    ];
    for (name, value) in numbers {
        if let Some(value) = value {
            headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
        }
    }
    headers.insert(
        HeaderName::from_static("x-compaction-summary-source"),
        HeaderValue::from_static(summary.source),
    );
}

/// The model's tool-call decisions a request applied: their counts, where
/// they came from, and the decision model's tokens spent on this request.
pub(crate) fn write_tool_decisions(
    headers: &mut HeaderMap,
    decided: &crate::outcome::DecisionCounts,
) {
    if let Ok(counts) = HeaderValue::try_from(decided.header()) {
        headers.insert(
            HeaderName::from_static("x-compaction-tool-decisions"),
            counts,
        );
    }
    headers.insert(
        HeaderName::from_static("x-compaction-tool-decisions-source"),
        HeaderValue::from_static(decided.source),
    );
    let numbers = [
        (
            "x-compaction-tool-decisions-prompt-tokens",
            decided.prompt_tokens,
        ),
        (
            "x-compaction-tool-decisions-completion-tokens",
            decided.completion_tokens,
        ),
    ];
    for (name, value) in numbers {
        if let Some(value) = value {
            headers.insert(HeaderName::from_static(name), HeaderValue::from(value));
        }
    }
}

pub fn write_loss_report(
    headers: &mut HeaderMap,
    status: Status,
    policy: &str,
    loss: Option<&LossSummary>,
) {
    headers.reserve(if loss.is_some() { 17 } else { 2 });
    let status = match status {
        Status::Skipped(_)
        | Status::Refused(_)
        | Status::SummarizeFallback
        | Status::DecisionsFallback => HeaderValue::try_from(status.header()),
        other => Ok(HeaderValue::from_static(other.label())),
    };
    if let Ok(status) = status {
        headers.insert(STATUS_NAME, status);
    }
    if let Ok(policy) = HeaderValue::try_from(policy) {
        headers.insert(POLICY_NAME, policy);
    }
    let Some(loss) = loss else { return };
    let tokens = loss.input_tokens.zip(loss.output_tokens);
    let (input_tokens, output_tokens) = tokens.unzip();
    let counts: [(HeaderName, Option<usize>); 14] = [
        (INPUT_CHARS, Some(loss.input_chars)),
        (OUTPUT_CHARS, Some(loss.output_chars)),
        (INPUT_MESSAGES, Some(loss.input_messages)),
        (OUTPUT_MESSAGES, Some(loss.output_messages)),
        (DROPPED_MESSAGES, Some(loss.dropped_messages)),
        (DEDUPED_MESSAGES, Some(loss.deduped_messages)),
        (TRIMMED_MESSAGES, Some(loss.trimmed_messages)),
        (PRUNED_CHARS, Some(loss.pruned_chars)),
        (CLIPPED_CHARS, Some(loss.clipped_chars)),
        (DEDUPED_TOOL_CHARS, Some(loss.deduped_tool_chars)),
        // Only where preserved thinking made the proxy strip reasoning.
        (
            STRIPPED_THINKING,
            (loss.stripped_thinking > 0).then_some(loss.stripped_thinking),
        ),
        (INPUT_TOKENS, input_tokens),
        (OUTPUT_TOKENS, output_tokens),
        (BUDGET_TOKENS, loss.budget_tokens),
    ];
    // Zeros (most of the figures of a body that fits its budget) and a
    // ratio of exactly 1 are static values; the other figures share one
    // buffer.
    let mut text = bytes::BytesMut::with_capacity(128);
    let mut spans: [Option<(usize, usize)>; 14] = [None; 14];
    let mut digits = itoa::Buffer::new();
    for (span, (_, count)) in spans.iter_mut().zip(&counts) {
        if let Some(count) = count.filter(|&count| count != 0) {
            let start = text.len();
            text.extend_from_slice(digits.format(count).as_bytes());
            *span = Some((start, text.len()));
        }
    }
    let ratio = (loss.retained_ratio != 1.0).then(|| {
        let start = text.len();
        let _ = write!(text, "{}", loss.retained_ratio);
        (start, text.len())
    });
    let text = text.freeze();
    let value = |span: Option<(usize, usize)>, otherwise: &'static str| match span {
        Some((start, end)) => HeaderValue::from_maybe_shared(text.slice(start..end)).ok(),
        None => Some(HeaderValue::from_static(otherwise)),
    };
    for ((name, count), span) in counts.into_iter().zip(spans) {
        if let Some(value) = count.and(value(span, "0")) {
            headers.insert(name, value);
        }
    }
    if let Some(ratio) = value(ratio, "1") {
        headers.insert(RETAINED_RATIO, ratio);
    }
    headers.insert(
        BUDGET_MET,
        HeaderValue::from_static(if loss.budget_met { "true" } else { "false" }),
    );
}

/// Adds a skip's detail after its reason in `x-compaction-status`
/// (`skipped; unsupported-message; message 3: content is not a string or
/// array`), so the client learns which message and why.
pub fn append_status_detail(headers: &mut HeaderMap, detail: &str) {
    let status = headers
        .get(STATUS)
        .and_then(|v| v.to_str().ok())
        .map(|v| format!("{v}; {detail}"));
    if let Some(v) = status.and_then(|v| HeaderValue::try_from(v).ok()) {
        headers.insert(STATUS, v);
    }
}

/// Says in `x-compaction-status` that the request asked for a bypass its
/// policy refuses (`compacted; bypass-not-allowed`), so the client learns
/// why its bypass header had no effect.
pub fn note_bypass_refused(headers: &mut HeaderMap) {
    append_status_detail(headers, "bypass-not-allowed");
}

/// Writes stable mode's prefix report: how many leading forwarded messages
/// the previous turn forwarded too, and whether this turn re-compacted.
pub fn write_stable_report(headers: &mut HeaderMap, info: &StableInfo) {
    headers.insert(
        HeaderName::from_static("x-compaction-stable-messages"),
        HeaderValue::from(info.stable_messages),
    );
    headers.insert(
        HeaderName::from_static("x-compaction-rebased"),
        HeaderValue::from_static(if info.rebased { "true" } else { "false" }),
    );
}

/// Adds `beta` to the request's `anthropic-beta` values (comma-separated,
/// in one header as the SDKs send them), unless it is there already.
pub fn add_anthropic_beta(headers: &mut HeaderMap, beta: &str) {
    const NAME: HeaderName = HeaderName::from_static("anthropic-beta");
    let present: Vec<&str> = headers
        .get_all(&NAME)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    if present.contains(&beta) {
        return;
    }
    let joined = present
        .into_iter()
        .chain(std::iter::once(beta))
        .collect::<Vec<_>>()
        .join(",");
    if let Ok(value) = HeaderValue::try_from(joined) {
        headers.insert(NAME, value);
    }
}

pub const REPORT: &str = "x-compaction-report";
pub const REPORT_ID: &str = "x-compaction-report-id";

/// Names the id under which the request's per-message report is kept.
pub fn write_report_id(headers: &mut HeaderMap, id: &str) {
    if let Ok(v) = HeaderValue::try_from(id) {
        headers.insert(REPORT_ID, v);
    }
}

/// True when the request asks for its per-message report to be kept.
pub fn wants_report(headers: &HeaderMap) -> bool {
    is_true(headers.get(REPORT))
}

/// True when the request asks to skip compaction.
pub fn wants_bypass(headers: &HeaderMap) -> bool {
    is_true(headers.get(BYPASS))
}

/// The request id header, as Envoy and nginx name it.
pub const REQUEST_ID: &str = "x-request-id";

/// The request's id: the client's `x-request-id` when it is one (visible
/// ASCII, at most 128 bytes), else a new one put in its place, so the
/// upstream, the log line and the client all see the same id.
pub fn request_id(headers: &mut HeaderMap) -> HeaderValue {
    if let Some(given) = headers.get(REQUEST_ID) {
        let ok = given.len() <= 128
            && !given.is_empty()
            && given.as_bytes().iter().all(|b| b.is_ascii_graphic());
        if ok {
            return given.clone();
        }
    }
    let id = HeaderValue::try_from(new_request_id()).expect("hex is a header value");
    headers.insert(REQUEST_ID, id.clone());
    id
}

/// 32 hex digits: a per-process random key hashed with a counter, so ids
/// differ across requests, replicas and restarts.
fn new_request_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static KEY: std::sync::LazyLock<std::collections::hash_map::RandomState> =
        std::sync::LazyLock::new(Default::default);
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    let mut a = KEY.build_hasher();
    a.write_u64(n);
    let mut b = KEY.build_hasher();
    b.write_u64(!n);
    format!("{:016x}{:016x}", a.finish(), b.finish())
}

/// Removes the headers meant for the proxy alone before a request goes
/// upstream: `x-compaction-bypass`, `x-compaction-report`, and the tenant
/// header when it is the proxy's own.
pub fn strip_control(headers: &mut HeaderMap, tenant: Option<&HeaderName>) {
    headers.remove(BYPASS);
    headers.remove(REPORT);
    if let Some(tenant) = tenant {
        headers.remove(tenant);
    }
}

/// A header value spelling yes: `true`, `1`, `yes` or `on`, in any case
/// (the spellings environment variables and other proxies accept).
fn is_true(value: Option<&HeaderValue>) -> bool {
    value
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .is_some_and(|v| {
            ["true", "1", "yes", "on"]
                .iter()
                .any(|yes| v.eq_ignore_ascii_case(yes))
        })
}

/// Appends `; report-not-allowed` to the status: the request asked for a
/// report (`x-compaction-report`) and its policy has `allow_report = false`.
pub fn note_report_refused(headers: &mut HeaderMap) {
    let status = headers
        .get(STATUS)
        .and_then(|v| v.to_str().ok())
        .map(|v| format!("{v}; report-not-allowed"));
    if let Some(v) = status.and_then(|v| HeaderValue::try_from(v).ok()) {
        headers.insert(STATUS, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_length_filter_lets_every_hop_by_hop_name_through() {
        assert!(HOP_BY_HOP.iter().all(may_be_hop_by_hop));
        assert!(!may_be_hop_by_hop(&header::CONTENT_TYPE));
    }

    #[test]
    fn removes_the_static_hop_by_hop_list() {
        let mut h = HeaderMap::new();
        for name in HOP_BY_HOP.iter() {
            h.insert(name.clone(), HeaderValue::from_static("x"));
        }
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer k"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(
            h.contains_key(header::AUTHORIZATION),
            "end-to-end headers stay"
        );
    }

    #[test]
    fn each_hop_by_hop_header_alone_is_removed() {
        for name in HOP_BY_HOP.iter() {
            let mut h = HeaderMap::new();
            h.insert(name.clone(), HeaderValue::from_static("x"));
            h.insert("x-other", HeaderValue::from_static("1"));
            strip_hop_by_hop(&mut h);
            assert_eq!(h.keys().collect::<Vec<_>>(), ["x-other"], "{name}");
        }
    }

    #[test]
    fn removes_headers_named_in_connection() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, X-Internal-Hop"),
        );
        h.insert("x-internal-hop", HeaderValue::from_static("1"));
        h.insert("x-other", HeaderValue::from_static("1"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key("x-internal-hop"));
        assert!(h.contains_key("x-other"));
    }

    #[test]
    fn every_connection_line_and_token_is_a_header_to_remove() {
        let mut h = HeaderMap::new();
        h.append(header::CONNECTION, HeaderValue::from_static("Close ,  X-A"));
        h.append(
            header::CONNECTION,
            HeaderValue::from_static(",x-b,,Keep-Alive"),
        );
        for name in ["close", "x-a", "x-b", "keep-alive", "x-kept"] {
            h.insert(name, HeaderValue::from_static("1"));
        }
        strip_hop_by_hop(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-kept"]);
    }

    #[test]
    fn an_upgrade_needs_both_connection_and_upgrade() {
        let mut h = HeaderMap::new();
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        assert_eq!(
            upgrade_protocol(&h),
            None,
            "Upgrade alone is not an upgrade request"
        );
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("keep-alive, Upgrade"),
        );
        assert_eq!(
            upgrade_protocol(&h),
            Some(HeaderValue::from_static("websocket"))
        );
        strip_hop_by_hop(&mut h);
        assert!(h.is_empty());
    }

    #[test]
    fn an_upgrade_keeps_only_its_own_two_hop_by_hop_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, x-hop"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-hop", HeaderValue::from_static("1"));
        h.insert(header::TE, HeaderValue::from_static("trailers"));
        let protocol = strip_hop_by_hop_keeping_upgrade(&mut h);
        assert_eq!(protocol, Some(HeaderValue::from_static("websocket")));
        assert_eq!(h.len(), 2, "{h:?}");
        assert_eq!(h[header::CONNECTION], "upgrade");
        assert_eq!(h[header::UPGRADE], "websocket");

        let mut plain = HeaderMap::new();
        plain.insert(header::CONNECTION, HeaderValue::from_static("close"));
        assert_eq!(strip_hop_by_hop_keeping_upgrade(&mut plain), None);
        assert!(plain.is_empty());
    }

    #[test]
    fn a_refused_bypass_is_noted_after_the_status() {
        let mut h = HeaderMap::new();
        write_loss_report(&mut h, Status::Compacted, "p", None);
        note_bypass_refused(&mut h);
        assert_eq!(h[STATUS], "compacted; bypass-not-allowed");
        write_loss_report(&mut h, Status::Skipped("invalid-json"), "p", None);
        note_bypass_refused(&mut h);
        assert_eq!(h[STATUS], "skipped; invalid-json; bypass-not-allowed");
    }

    #[test]
    fn the_loss_report_names_each_figure() {
        let loss = LossSummary {
            input_chars: 1000,
            output_chars: 400,
            input_messages: 12,
            output_messages: 5,
            dropped_messages: 7,
            deduped_messages: 2,
            trimmed_messages: 1,
            retained_ratio: 0.4,
            budget_met: true,
            pruned_chars: 30,
            clipped_chars: 0,
            deduped_tool_chars: 18446744073709551615,
            stripped_thinking: 0,
            input_tokens: None,
            output_tokens: None,
            budget_tokens: Some(250),
        };
        let mut h = HeaderMap::new();
        // An upstream's own header of the same name is replaced, not joined.
        h.insert("x-compaction-input-chars", HeaderValue::from_static("1"));
        write_loss_report(&mut h, Status::Compacted, "agents", Some(&loss));
        let header = |name: &str| {
            h.get_all(name)
                .iter()
                .map(|v| v.to_str().unwrap())
                .collect::<Vec<_>>()
        };
        for (name, want) in [
            ("x-compaction-status", "compacted"),
            ("x-compaction-policy", "agents"),
            ("x-compaction-input-chars", "1000"),
            ("x-compaction-output-chars", "400"),
            ("x-compaction-input-messages", "12"),
            ("x-compaction-output-messages", "5"),
            ("x-compaction-dropped-messages", "7"),
            ("x-compaction-deduped-messages", "2"),
            ("x-compaction-trimmed-messages", "1"),
            ("x-compaction-pruned-chars", "30"),
            ("x-compaction-clipped-chars", "0"),
            ("x-compaction-deduped-tool-chars", "18446744073709551615"),
            ("x-compaction-budget-tokens", "250"),
            ("x-compaction-retained-ratio", "0.4"),
            ("x-compaction-budget-met", "true"),
        ] {
            assert_eq!(header(name), [want], "{name}");
        }
        assert!(!h.contains_key("x-compaction-input-tokens"));
        assert!(!h.contains_key("x-compaction-output-tokens"));
        assert_eq!(h.len(), 15);
    }

    #[test]
    fn bypass_needs_an_explicit_yes() {
        let mut h = HeaderMap::new();
        assert!(!wants_bypass(&h));
        for yes in ["TRUE", "1", "yes", " On "] {
            h.insert(BYPASS, HeaderValue::from_static(yes));
            assert!(wants_bypass(&h), "{yes}");
        }
        for no in ["false", "0", "no", "", "y"] {
            h.insert(BYPASS, HeaderValue::from_static(no));
            assert!(!wants_bypass(&h), "{no:?}");
        }
    }

    #[test]
    fn a_beta_joins_the_clients_values_once() {
        let mut h = HeaderMap::new();
        add_anthropic_beta(&mut h, "b2");
        assert_eq!(h["anthropic-beta"], "b2");
        h.insert("anthropic-beta", HeaderValue::from_static("a1, c3"));
        add_anthropic_beta(&mut h, "b2");
        assert_eq!(h["anthropic-beta"], "a1,c3,b2");
        add_anthropic_beta(&mut h, "c3");
        assert_eq!(h["anthropic-beta"], "a1,c3,b2");
    }
}
