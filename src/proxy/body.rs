//! Request and response bodies. Only a compacted route's request body is
//! ever collected (with a byte cap, decoded bytes included); responses pass
//! through frame by frame, watched for idleness and for how they end.

use std::io::Read;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Limited};
use tokio::time::{Instant, Sleep};

use crate::error::ProxyError;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

/// Reads a whole request body of at most `limit` bytes.
pub async fn collect_limited<B>(body: B, limit: usize) -> Result<Bytes, ProxyError>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ProxyError::BodyTooLarge { limit })
        }
        Err(e) => Err(ProxyError::ClientBody(e.to_string())),
    }
}

/// A request body's content coding, as far as the proxy can read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
    Deflate,
    /// Something else (br, zstd, stacked codings): forwarded untouched.
    Unsupported,
}

pub fn request_coding(headers: &HeaderMap) -> Coding {
    let Some(value) = headers.get(http::header::CONTENT_ENCODING) else {
        return Coding::Identity;
    };
    match value.to_str().map(|v| v.trim().to_ascii_lowercase()) {
        Ok(v) if v.is_empty() || v == "identity" => Coding::Identity,
        Ok(v) if v == "gzip" || v == "x-gzip" => Coding::Gzip,
        Ok(v) if v == "deflate" => Coding::Deflate,
        _ => Coding::Unsupported,
    }
}

/// Decodes a gzip or deflate body, failing with 413 once the decoded bytes
/// pass `limit` (a small compressed body can expand enormously).
pub fn decode(body: &[u8], coding: Coding, limit: usize) -> Result<Bytes, ProxyError> {
    let reader: Box<dyn Read + '_> = match coding {
        Coding::Identity | Coding::Unsupported => return Ok(Bytes::copy_from_slice(body)),
        Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(body)),
        // HTTP's "deflate" is zlib-wrapped (RFC 9110 8.4.1.2).
        Coding::Deflate => Box::new(flate2::read::ZlibDecoder::new(body)),
    };
    let encoding = if coding == Coding::Gzip {
        "gzip"
    } else {
        "deflate"
    };
    let mut out = Vec::with_capacity(body.len().saturating_mul(4).min(limit + 1));
    reader
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| ProxyError::BadEncoding {
            encoding,
            reason: e.to_string(),
        })?;
    if out.len() > limit {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    Ok(out.into())
}

/// When a request body last moved, shared between the body (which hyper's
/// client polls) and the deadline waiting for the upstream's answer.
#[derive(Clone)]
pub struct Progress(Arc<ProgressState>);

struct ProgressState {
    origin: Instant,
    /// Nanoseconds after `origin` of the last frame read, or of the start.
    last: AtomicU64,
    ended: AtomicBool,
}

impl Progress {
    fn touch(&self) {
        let nanos = self.0.origin.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        self.0.last.store(nanos, Ordering::Relaxed);
    }

    /// When the body last moved.
    pub fn last(&self) -> Instant {
        self.0.origin + Duration::from_nanos(self.0.last.load(Ordering::Relaxed))
    }

    /// Whether the whole body has been read.
    pub fn ended(&self) -> bool {
        self.0.ended.load(Ordering::Relaxed)
    }
}

/// The client's request body failed (it went away mid-upload): told apart
/// from upstream failures in the client's error chain.
#[derive(Debug, thiserror::Error)]
#[error("the client's request body failed: {0}")]
pub struct ClientBodyError(BoxError);

/// Wraps a request body to record its progress and mark its errors as the
/// client's.
pub fn track_progress(body: ProxyBody) -> (ProxyBody, Progress) {
    let progress = Progress(Arc::new(ProgressState {
        origin: Instant::now(),
        last: AtomicU64::new(0),
        ended: AtomicBool::new(false),
    }));
    let tracked = Tracked {
        inner: body,
        progress: progress.clone(),
    };
    (tracked.boxed_unsync(), progress)
}

struct Tracked {
    inner: ProxyBody,
    progress: Progress,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                return Poll::Ready(Some(Err(Box::new(ClientBodyError(e)))))
            }
            Poll::Pending => return Poll::Pending,
            Poll::Ready(frame) => frame,
        };
        self.progress.touch();
        if polled.is_none() || self.inner.is_end_stream() {
            self.progress.0.ended.store(true, Ordering::Relaxed);
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How a watched response body ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodyEnd {
    Complete,
    Failed(String),
    /// The client went away before the end.
    Abandoned,
}

/// The upstream went silent for longer than the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?}")]
pub struct IdleTimeout(Duration);

/// Passes a response body through frame by frame, cutting it off after
/// `idle` without a frame, and calling `on_end` exactly once with how it
/// ended (when the body finishes, fails, or is dropped by a departing client).
pub struct Watched<B: Body, F: FnOnce(BodyEnd)> {
    inner: Pin<Box<B>>,
    idle: Duration,
    timer: Pin<Box<Sleep>>,
    on_end: Option<F>,
    /// The stream's terminal event went out: a client that leaves now (SDKs
    /// close right after `data: [DONE]`) read everything there was.
    terminal_sent: bool,
}

impl<B: Body, F: FnOnce(BodyEnd)> Watched<B, F> {
    pub fn new(inner: B, idle: Duration, on_end: F) -> Self {
        Watched {
            inner: Box::pin(inner),
            idle,
            timer: Box::pin(tokio::time::sleep(idle)),
            on_end: Some(on_end),
            terminal_sent: false,
        }
    }

    fn finish(&mut self, end: BodyEnd) {
        if let Some(f) = self.on_end.take() {
            f(end);
        }
    }
}

impl<B, F> Body for Watched<B, F>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
    F: FnOnce(BodyEnd) + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.terminal_sent |= ends_a_stream(data);
                }
                let deadline = Instant::now() + this.idle;
                this.timer.as_mut().reset(deadline);
                // hyper stops polling a body of known length after its last
                // frame, so its end is seen here rather than as `None`.
                if this.inner.is_end_stream() {
                    this.finish(BodyEnd::Complete);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                this.finish(BodyEnd::Failed(e.to_string()));
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.finish(BodyEnd::Complete);
                Poll::Ready(None)
            }
            Poll::Pending => match this.timer.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let e = IdleTimeout(this.idle);
                    this.finish(BodyEnd::Failed(e.to_string()));
                    Poll::Ready(Some(Err(Box::new(e))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Body, F: FnOnce(BodyEnd)> Drop for Watched<B, F> {
    fn drop(&mut self) {
        let end = if self.on_end.is_some() && (self.terminal_sent || self.inner.is_end_stream()) {
            BodyEnd::Complete // e.g. empty from the start, never polled
        } else {
            BodyEnd::Abandoned
        };
        self.finish(end);
    }
}

use std::future::Future;

/// Whether a response frame carries a stream's terminal event: chat's
/// `data: [DONE]`, Anthropic's `message_stop`, Responses'
/// `response.completed`. Only the frame's tail is searched: the terminal
/// event is the last thing a stream sends.
fn ends_a_stream(data: &[u8]) -> bool {
    const TAIL: usize = 512;
    const MARKERS: [&[u8]; 3] = [
        b"data: [DONE]",
        b"event: message_stop",
        b"response.completed",
    ];
    let tail = &data[data.len().saturating_sub(TAIL)..];
    MARKERS
        .iter()
        .any(|m| tail.windows(m.len()).any(|w| w == *m))
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::{GzEncoder, ZlibEncoder};
    use std::io::Write;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn terminal_events_of_each_stream_format_are_recognised() {
        assert!(ends_a_stream(b"data: {\"x\":1}\n\ndata: [DONE]\n\n"));
        assert!(ends_a_stream(
            b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"
        ));
        assert!(ends_a_stream(
            b"event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n"
        ));
        assert!(!ends_a_stream(b"data: {\"choices\":[]}\n\n"));
        let mut long = vec![b'x'; 4096];
        long.extend_from_slice(b"\ndata: [DONE]\n\n");
        assert!(ends_a_stream(&long));
    }

    #[test]
    fn gzip_and_deflate_decode() {
        assert_eq!(decode(&gzip(b"hello"), Coding::Gzip, 100).unwrap(), "hello");
        let mut z = ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(b"hi").unwrap();
        assert_eq!(
            decode(&z.finish().unwrap(), Coding::Deflate, 100).unwrap(),
            "hi"
        );
    }

    #[test]
    fn the_limit_applies_to_decoded_bytes() {
        let bomb = gzip(&vec![b'a'; 10_000]);
        assert!(bomb.len() < 200);
        assert!(matches!(
            decode(&bomb, Coding::Gzip, 9_999),
            Err(ProxyError::BodyTooLarge { limit: 9_999 })
        ));
        assert_eq!(decode(&bomb, Coding::Gzip, 10_000).unwrap().len(), 10_000);
    }

    #[test]
    fn corrupt_gzip_is_a_client_error() {
        let err = decode(b"not gzip", Coding::Gzip, 100).unwrap_err();
        assert!(err.is_client_error(), "{err}");
    }

    #[test]
    fn codings_are_read_case_insensitively() {
        let mut h = HeaderMap::new();
        assert_eq!(request_coding(&h), Coding::Identity);
        h.insert(http::header::CONTENT_ENCODING, "GZIP".parse().unwrap());
        assert_eq!(request_coding(&h), Coding::Gzip);
        h.insert(http::header::CONTENT_ENCODING, "br".parse().unwrap());
        assert_eq!(request_coding(&h), Coding::Unsupported);
    }
}
