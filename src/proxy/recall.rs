//! Recall on the response path (`recall = true`): when the model calls
//! `compaction_recall`, the proxy answers it from the current request's
//! own body and sends the follow-up upstream itself, for at most
//! `recall_max_rounds` rounds; the client gets only the final answer.
//!
//! Design, for streamed requests too: while recall is active for a request
//! (its forwarded body carries markers and the proxy's tool), each
//! upstream round is read whole before anything goes to the client, since
//! a call to recall may come at any point of a round. A round that calls
//! no recall goes to the client as it came (its usage summed with the
//! earlier rounds'); a round that calls it is not shown at all, text
//! before the call included: that text is in the follow-up's assistant
//! turn, and the model goes on from it. So the client of a streamed
//! request receives its stream in one piece once the last round is read.
//! Requests without markers stream as always.
//!
//! Which ids are answered, and with what, is the pure
//! [`crate::compaction::recall`]; the shapes are
//! [`crate::format::recall`]. Here: reading rounds, the follow-ups, the
//! limits, the headers and the counters.

use std::collections::BTreeSet;
use std::time::Duration;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderName, HeaderValue, Response};
use http_body_util::BodyExt;
use serde_json::Value;

use super::body::{self, BoxError, Coding};
use super::AppState;
use crate::compaction::recall::{self as ids, RecallLimits};
use crate::error::{ProxyError, UpstreamCause};
use crate::format::recall::{self as shapes, Turn};
use crate::format::Format;
use crate::policy::CompiledPolicy;

/// The most bytes of one upstream round recall reads.
const MAX_ROUND_BYTES: usize = 64 * 1024 * 1024;
/// The most recalled ids the header names.
const MAX_HEADER_IDS: usize = 16;

/// A request recall is active for: what the follow-ups need.
#[derive(Clone)]
pub(super) struct Active {
    format: Format,
    limits: RecallLimits,
    policy: std::sync::Arc<str>,
    /// The body forwarded in the first round.
    forwarded: Bytes,
    /// The request's own body as the client sent it, for the originals.
    original: Bytes,
    coding: Coding,
    max_body_bytes: usize,
    max_messages: usize,
    /// The ids of the forwarded markers: the only ones answered.
    allowed: std::sync::Arc<BTreeSet<String>>,
    streaming: bool,
}

/// What recall says of a request on its response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Note {
    /// Markers were forwarded but the tool was not added, with the reason.
    Off(&'static str),
}

impl Note {
    pub fn write_to(&self, headers: &mut HeaderMap) {
        let Note::Off(reason) = self;
        headers.insert(
            HeaderName::from_static("x-compaction-recall"),
            HeaderValue::from_static(reason),
        );
    }
}

/// Whether recall is active for a request whose `forwarded` body went
/// out under `policy`: `Ok` when its markers and the proxy's tool are in
/// it, `Err` with a note when markers went without the tool, neither when
/// recall is off or nothing was cut.
#[allow(clippy::too_many_arguments)]
pub(super) fn activate(
    policy: &CompiledPolicy,
    format: Format,
    original: &Bytes,
    coding: Coding,
    forwarded: &Bytes,
    max_body_bytes: usize,
    max_messages: usize,
) -> Option<Result<Active, Note>> {
    let limits = policy.recall?;
    let allowed = ids::forwarded_ids(forwarded);
    if allowed.is_empty() {
        return None;
    }
    // The tool went out unless the client's own body kept it out.
    let decoded = body::decode(original, coding, max_body_bytes).ok()?;
    let text = std::str::from_utf8(&decoded).ok()?;
    if let Err(why) = shapes::add_tool(format, text) {
        return Some(Err(Note::Off(why.reason())));
    }
    let streaming = matches!(
        crate::format::read_top(std::str::from_utf8(forwarded).ok()?, ["stream"]),
        Ok([Some(s)]) if s.get() == "true"
    );
    Some(Ok(Active {
        format,
        limits,
        policy: policy.name.clone(),
        forwarded: forwarded.clone(),
        original: original.clone(),
        coding,
        max_body_bytes,
        max_messages,
        allowed: std::sync::Arc::new(allowed),
        streaming,
    }))
}

/// How to send a follow-up: the first request's method, target and headers.
pub(super) struct Template {
    pub method: http::Method,
    pub uri: http::Uri,
    pub headers: HeaderMap,
}

impl Template {
    /// Recall reads the rounds: they must come unencoded.
    pub fn prepare(headers: &mut HeaderMap) {
        headers.remove(header::ACCEPT_ENCODING);
    }
}

/// What recall did for a request.
#[derive(Debug, Default, Clone)]
pub(super) struct Done {
    pub rounds: usize,
    pub recalled: Vec<String>,
    pub refused: usize,
}

impl Done {
    /// What the report and the inspector keep of it.
    pub fn record(&self) -> crate::compaction::recall::Recalled {
        crate::compaction::recall::Recalled {
            rounds: self.rounds,
            recalled_ids: self.recalled.clone(),
            refused_ids: self.refused,
        }
    }
}

/// Reads an upstream body whole, each frame within `idle`.
async fn read_all<B>(mut body: B, idle: Duration) -> Result<Bytes, ProxyError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let mut out = bytes::BytesMut::new();
    loop {
        match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => return Err(ProxyError::UpstreamTimeout(idle.as_secs_f64())),
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(e))) => {
                let e: BoxError = e.into();
                return Err(ProxyError::UpstreamUnreachable(
                    UpstreamCause::Reset,
                    e.to_string(),
                ));
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    if out.len() + data.len() > MAX_ROUND_BYTES {
                        return Err(ProxyError::Internal(
                            "an upstream round too large for recall".into(),
                        ));
                    }
                    out.extend_from_slice(&data);
                }
            }
        }
    }
}

fn read_turn(active: &Active, body: &[u8]) -> Option<Turn> {
    if active.streaming {
        shapes::read_stream(active.format, body)
    } else {
        shapes::read_json(active.format, body)
    }
}

/// The tool's answer to each recall call of `turn`, `(call id, text)`;
/// `spent` counts the bytes answered so far against the limit.
fn answers(
    active: &Active,
    turn: &Turn,
    spent: &mut usize,
    done: &mut Done,
) -> Vec<(String, String)> {
    let decoded = body::decode(&active.original, active.coding, active.max_body_bytes).ok();
    let parsed = decoded
        .as_deref()
        .and_then(|d| active.format.parse(d, active.max_messages).ok());
    let mut out = Vec::new();
    for call in turn.recall_calls() {
        let mut text = String::new();
        let asked = call.ids();
        if asked.is_empty() {
            text.push_str("[compaction_recall: no ids given; pass the ids the markers name]");
        }
        for id in asked {
            let answered = match &parsed {
                Some(parsed) => ids::answer(parsed, &active.allowed, &id, active.limits.max_chars)
                    .map_err(|e| e.to_string()),
                None => Err("the request's body could not be read again".to_owned()),
            };
            let answered = answered.and_then(|original| {
                if *spent + original.len() > active.limits.max_added_bytes {
                    Err("recall's size limit for this request is reached".to_owned())
                } else {
                    Ok(original)
                }
            });
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            match answered {
                Ok(original) => {
                    *spent += original.len();
                    text.push_str(&format!("[compaction_recall {id}]\n{original}"));
                    done.recalled.push(id);
                }
                Err(why) => {
                    done.refused += 1;
                    text.push_str(&format!("[compaction_recall {id}: refused, {why}]"));
                }
            }
        }
        out.push((call.id.clone(), text));
    }
    out
}

/// Answers the model's recall calls in `first` (the first round's
/// response) and returns the response the client gets.
pub(super) async fn answer<B>(
    state: &AppState,
    active: Active,
    template: Template,
    first: Response<B>,
    timeouts: (Duration, Duration, Duration),
) -> Result<(Response<Bytes>, Done), ProxyError>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let (header_timeout, idle, body_idle) = timeouts;
    let (mut parts, body) = first.into_parts();
    let mut bytes = read_all(body, idle).await?;
    let mut done = Done::default();
    if !parts.status.is_success() {
        return Ok((Response::from_parts(parts, bytes), done));
    }
    let counters = state.metrics.recall();
    let policy = [active.policy.as_ref()];
    let mut forwarded = String::from_utf8_lossy(&active.forwarded).into_owned();
    let mut earlier: Option<Value> = None;
    let mut spent = 0;
    while let Some(turn) = read_turn(&active, &bytes) {
        if !turn.calls_recall() || done.rounds >= active.limits.max_rounds {
            if turn.calls_recall() {
                bytes = strip_recall(&active, &bytes);
            }
            break;
        }
        counters
            .calls
            .with_label_values(&policy)
            .inc_by(turn.recall_calls().count() as u64);
        let (recalled, refused) = (done.recalled.len(), done.refused);
        let answered = answers(&active, &turn, &mut spent, &mut done);
        counters
            .ids
            .with_label_values(&policy)
            .inc_by((done.recalled.len() - recalled) as u64);
        counters
            .refused_ids
            .with_label_values(&policy)
            .inc_by((done.refused - refused) as u64);
        let chars: usize = answered.iter().map(|(_, t)| t.chars().count()).sum();
        counters
            .answer_chars
            .with_label_values(&policy)
            .inc_by(chars as u64);
        let mut elements: Vec<String> = turn.assistant.iter().map(Value::to_string).collect();
        elements.extend(
            shapes::results(active.format, &answered)
                .iter()
                .map(Value::to_string),
        );
        let Some(next) = shapes::append(active.format, &forwarded, &elements) else {
            break;
        };
        forwarded = next;
        if let Some(usage) = &turn.usage {
            match &mut earlier {
                Some(total) => shapes::add_usage(total, usage),
                None => earlier = Some(usage.clone()),
            }
        }
        let mut request = http::Request::builder()
            .method(template.method.clone())
            .uri(template.uri.clone())
            .body(body::full(forwarded.clone()))
            .map_err(|e| ProxyError::Internal(e.to_string()))?;
        *request.headers_mut() = template.headers.clone();
        request
            .headers_mut()
            .insert(header::CONTENT_LENGTH, HeaderValue::from(forwarded.len()));
        done.rounds += 1;
        counters.rounds.with_label_values(&policy).inc();
        let response = state
            .upstream
            .send(request, false, header_timeout, body_idle)
            .await?;
        let (next_parts, next_body) = response.into_parts();
        bytes = read_all(next_body, idle).await?;
        parts = next_parts;
        if !parts.status.is_success() {
            // The follow-up failed: the client gets that answer as it came.
            earlier = None;
            break;
        }
    }
    if let Some(earlier) = &earlier {
        let summed = if active.streaming {
            shapes::with_usage_stream(active.format, &bytes, earlier)
        } else {
            shapes::with_usage_json(&bytes, earlier)
        };
        if let Some(summed) = summed {
            bytes = summed.into();
        }
    }
    parts.headers.remove(header::CONTENT_ENCODING);
    parts.headers.remove(header::TRANSFER_ENCODING);
    parts
        .headers
        .insert(header::CONTENT_LENGTH, HeaderValue::from(bytes.len()));
    write_headers(&mut parts.headers, &done);
    Ok((Response::from_parts(parts, bytes), done))
}

/// The final round still calls recall (the rounds are spent): its recall
/// calls are taken out, so the client sees only its own.
fn strip_recall(active: &Active, body: &Bytes) -> Bytes {
    let stripped = if active.streaming {
        shapes::strip_recall_stream(active.format, body)
    } else {
        shapes::strip_recall_json(active.format, body)
    };
    stripped.map_or_else(|| body.clone(), Bytes::from)
}

/// `x-compaction-recall-rounds` and `x-compaction-recalled-ids`.
fn write_headers(headers: &mut HeaderMap, done: &Done) {
    headers.insert(
        HeaderName::from_static("x-compaction-recall-rounds"),
        HeaderValue::from(done.rounds),
    );
    if !done.recalled.is_empty() {
        let mut list: Vec<&str> = done.recalled.iter().map(String::as_str).collect();
        list.dedup();
        let more = list.len().saturating_sub(MAX_HEADER_IDS);
        let mut value = list[..list.len().min(MAX_HEADER_IDS)].join(", ");
        if more > 0 {
            value.push_str(&format!(", +{more}"));
        }
        if let Ok(value) = HeaderValue::try_from(value) {
            headers.insert(HeaderName::from_static("x-compaction-recalled-ids"), value);
        }
    }
    if done.refused > 0 {
        headers.insert(
            HeaderName::from_static("x-compaction-recall-refused-ids"),
            HeaderValue::from(done.refused),
        );
    }
}
