//! What the provider billed: the `usage` the upstream reports in its
//! answer, read as the response passes through (plain JSON or a stream,
//! never held back or buffered: see [`scan`]), priced with the
//! configuration's `[prices]` ([`prices`]), and set against an estimate of
//! what the original request would have cost without the proxy
//! ([`estimate`]).
//!
//! One file per wire format turns that format's usage object into the
//! neutral [`Usage`]: [`chat`], [`anthropic`], [`responses`]. A response
//! whose usage is missing or unreadable has none: unknown, never zero.
//!
//! Compressed responses (gzip, deflate) are decoded as they pass, in a
//! window of the decoder's own (32 KB) and at most [`MAX_DECODED_BYTES`];
//! other codings (br, zstd) are not read and their usage is unknown.

pub mod anthropic;
pub mod chat;
pub mod estimate;
pub mod prices;
pub mod responses;
pub mod scan;

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode};

use crate::format::Format;
pub use estimate::{Baseline, Estimate, PrefixMemory, Print};
pub use prices::{Price, Prices};
use scan::{Framing, Scanner};

/// The tokens of one response, by how they are billed. Input tokens are
/// split so that the three kinds add up to all input: `uncached_input`
/// billed at the full price, `cache_read` served from the prompt cache,
/// `cache_write` written to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Usage {
    pub uncached_input: u64,
    pub cache_read: u64,
    pub cache_write: u64,
    /// Of `cache_write`, the tokens written with a one-hour time to live
    /// (Anthropic; the rest live five minutes).
    pub cache_write_1h: u64,
    pub output: u64,
    /// Of the above, the input and output of the provider's own
    /// compaction passes (Anthropic's `usage.iterations`).
    pub compaction_input: u64,
    pub compaction_output: u64,
}

impl Usage {
    /// Every input token, however billed.
    pub fn input(&self) -> u64 {
        self.uncached_input + self.cache_read + self.cache_write
    }
}

/// The most decoded bytes of a compressed response read for its usage.
pub const MAX_DECODED_BYTES: u64 = 64 * 1024 * 1024;

/// A format's usage so far.
#[derive(Debug)]
enum Acc {
    Chat(chat::Acc),
    Anthropic(anthropic::Acc),
    Responses(responses::Acc),
}

impl Acc {
    fn read(&mut self, block: &[u8]) {
        match self {
            Acc::Chat(a) => a.read(block),
            Acc::Anthropic(a) => a.read(block),
            Acc::Responses(a) => a.read(block),
        }
    }

    fn usage(&self) -> Option<Usage> {
        match self {
            Acc::Chat(a) => a.usage(),
            Acc::Anthropic(a) => a.usage(),
            Acc::Responses(a) => a.usage(),
        }
    }
}

/// Where decoded bytes go: the scanner and the format's reading.
#[derive(Debug)]
struct Sink {
    scanner: Scanner,
    acc: Acc,
    decoded: u64,
}

impl Sink {
    fn take(&mut self, data: &[u8]) {
        let Sink { scanner, acc, .. } = self;
        scanner.feed(data, &mut |block| acc.read(block));
    }
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.decoded += data.len() as u64;
        if self.decoded > MAX_DECODED_BYTES {
            return Err(std::io::Error::other("decoded past the bound"));
        }
        self.take(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

// The plain response, by far the usual one, keeps its sink inline (no
// allocation); a decoder's window is large and boxed.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Decoding {
    Plain(Sink),
    Gzip(Box<flate2::write::MultiGzDecoder<Sink>>),
    Deflate(Box<flate2::write::ZlibDecoder<Sink>>),
}

/// What reading a response gave.
#[derive(Debug, Clone, PartialEq)]
pub struct Read {
    pub usage: Option<Usage>,
    /// The model the response named, as it spelled it.
    pub model: Option<String>,
}

/// Reads one response body's usage, frame by frame ([`Reader::feed`]),
/// without holding any frame.
#[derive(Debug)]
pub struct Reader {
    decoding: Decoding,
    /// The decoder failed or passed its bound: nothing more is read.
    stopped: bool,
}

impl Reader {
    /// A reader for a response of a route of `format`, or `None` when its
    /// usage cannot be read: not a success, not JSON or a stream, or
    /// compressed other than by gzip or deflate.
    pub fn for_response(format: Format, status: StatusCode, headers: &HeaderMap) -> Option<Self> {
        if !status.is_success() {
            return None;
        }
        let header = |name| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(|v| v.trim().to_ascii_lowercase())
        };
        let framing = match header(http::header::CONTENT_TYPE) {
            Some(t) if t.starts_with("text/event-stream") => Framing::Sse,
            Some(t) if t.contains("json") => Framing::Json,
            _ => return None,
        };
        let sink = Sink {
            scanner: Scanner::new(framing),
            acc: match format {
                Format::Chat => Acc::Chat(chat::Acc::default()),
                Format::Anthropic => Acc::Anthropic(anthropic::Acc::default()),
                Format::Responses => Acc::Responses(responses::Acc::default()),
            },
            decoded: 0,
        };
        let decoding = match header(http::header::CONTENT_ENCODING).as_deref() {
            None | Some("") | Some("identity") => Decoding::Plain(sink),
            Some("gzip") | Some("x-gzip") => {
                Decoding::Gzip(Box::new(flate2::write::MultiGzDecoder::new(sink)))
            }
            Some("deflate") => Decoding::Deflate(Box::new(flate2::write::ZlibDecoder::new(sink))),
            Some(_) => return None,
        };
        Some(Reader {
            decoding,
            stopped: false,
        })
    }

    /// Reads the next frame's bytes.
    pub fn feed(&mut self, data: &[u8]) {
        if self.stopped {
            return;
        }
        self.stopped = match &mut self.decoding {
            Decoding::Plain(sink) => {
                sink.take(data);
                false
            }
            Decoding::Gzip(d) => d.write_all(data).is_err(),
            Decoding::Deflate(d) => d.write_all(data).is_err(),
        };
    }

    /// The usage read, once the body has ended (or been cut).
    pub fn finish(mut self) -> Read {
        let stopped = self.stopped;
        let sink = match &mut self.decoding {
            Decoding::Plain(s) => &*s,
            Decoding::Gzip(d) => {
                if !stopped {
                    let _ = d.try_finish();
                }
                d.get_ref()
            }
            Decoding::Deflate(d) => {
                if !stopped {
                    let _ = d.try_finish();
                }
                d.get_ref()
            }
        };
        Read {
            usage: sink.acc.usage(),
            model: sink.scanner.model().map(str::to_owned),
        }
    }
}

/// What one request cost: the provider's figures, priced, and the
/// estimate of what the original request would have cost. The per-request
/// record the log line, the metrics and the inspector share.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Bill {
    /// The model the response named (at most 128 bytes of it).
    pub model: Option<String>,
    /// Its bounded family: the longest configured or built-in prefix, else `other`.
    #[serde(serialize_with = "as_str")]
    pub family: Arc<str>,
    pub usage: Usage,
    /// `usage` priced (`None` when no `[prices]` entry matches the model).
    pub cost: Option<f64>,
    /// The original request's estimated cost, and the saving (`None`
    /// without a price, or when the original's size is not known).
    pub estimate: Option<Estimate>,
}

fn as_str<S: serde::Serializer>(value: &Arc<str>, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(value)
}

impl Bill {
    /// The bill of a response whose reading gave `read`; `None` when it
    /// reported no usage. `baseline` is what the proxy knows of the
    /// original request (none when its body was not read).
    pub fn of(
        read: Read,
        prices: &Prices,
        baseline: Option<&Baseline>,
        format: Format,
    ) -> Option<Bill> {
        let usage = read.usage?;
        let model = read.model.as_deref();
        let price = prices.price(model);
        // OpenAI caches every long prompt by itself; Anthropic only what
        // the request marks, which its counts then show.
        let caching = format != Format::Anthropic || usage.cache_read + usage.cache_write > 0;
        let estimate = price
            .zip(baseline)
            .map(|(price, baseline)| estimate::estimate(&usage, price, baseline, caching));
        Some(Bill {
            family: prices.family(model),
            cost: price.map(|p| p.cost(&usage)),
            estimate,
            usage,
            model: read.model,
        })
    }
}

/// How long a request's bill is kept for the inspector (as its report).
pub const BILL_TTL: Duration = Duration::from_secs(300);

/// Recent bills by report id, for the inspector: a request whose report
/// was kept (`x-compaction-report`) has its bill here once its response
/// has ended. Bounded in entries and time.
pub struct BillStore {
    bills: moka::sync::Cache<String, Arc<Bill>>,
}

impl Default for BillStore {
    fn default() -> Self {
        BillStore {
            bills: moka::sync::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(BILL_TTL)
                .build(),
        }
    }
}

impl BillStore {
    pub fn insert(&self, report_id: String, bill: Bill) {
        self.bills.insert(report_id, Arc::new(bill));
    }

    /// The bill of the request whose report has this id, once its response ended.
    pub fn get(&self, report_id: &str) -> Option<Arc<Bill>> {
        self.bills.get(report_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    http::HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    v.parse().unwrap(),
                )
            })
            .collect()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn a_gzip_response_is_read_as_it_passes_in_any_cut() {
        let body = br#"{"model":"gpt-4o","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}"#;
        let zipped = gzip(body);
        let h = headers(&[
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ]);
        for cut in [1, 7, zipped.len() / 2, zipped.len()] {
            let mut reader = Reader::for_response(Format::Chat, StatusCode::OK, &h).unwrap();
            for piece in zipped.chunks(cut) {
                reader.feed(piece);
            }
            let read = reader.finish();
            assert_eq!(read.model.as_deref(), Some("gpt-4o"));
            let u = read.usage.unwrap();
            assert_eq!((u.uncached_input, u.cache_read, u.output), (6, 4, 2));
        }
    }

    #[test]
    fn unreadable_responses_get_no_reader_and_corrupt_gzip_no_usage() {
        let json = headers(&[("content-type", "application/json")]);
        assert!(Reader::for_response(Format::Chat, StatusCode::BAD_REQUEST, &json).is_none());
        let br = headers(&[
            ("content-type", "application/json"),
            ("content-encoding", "br"),
        ]);
        assert!(Reader::for_response(Format::Chat, StatusCode::OK, &br).is_none());
        let html = headers(&[("content-type", "text/html")]);
        assert!(Reader::for_response(Format::Chat, StatusCode::OK, &html).is_none());
        let gz = headers(&[
            ("content-type", "application/json"),
            ("content-encoding", "gzip"),
        ]);
        let mut reader = Reader::for_response(Format::Chat, StatusCode::OK, &gz).unwrap();
        reader.feed(b"definitely not gzip");
        assert_eq!(reader.finish().usage, None);
    }
}
