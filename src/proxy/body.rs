//! Request bodies. Only a compacted route's request body is ever collected
//! (with a byte cap, decoded bytes included); a body forwarded and the
//! response streamed back are [`super::in_flight`]'s.

use std::io::Read;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::Instant;

use crate::error::ProxyError;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type ProxyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    http_body_util::Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

/// Request bytes held in memory across all requests: bodies being
/// collected and collected bodies until they are forwarded. Each body
/// holds a [`Reservation`] for the capacity of its buffer; the bytes come
/// back when it is dropped (the request finished, or the client left).
#[derive(Debug, Default)]
pub struct BufferBudget {
    held: AtomicUsize,
    /// The most ever held at once (for tests and for operators' sizing).
    peak: AtomicUsize,
}

impl BufferBudget {
    pub fn new() -> Arc<Self> {
        Arc::new(BufferBudget::default())
    }

    /// Bytes held right now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The most bytes ever held at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
    }

    /// Takes `bytes` more if the total stays within `max`.
    fn take(&self, bytes: usize, max: usize) -> bool {
        let mut held = self.held.load(Ordering::Acquire);
        loop {
            let Some(next) = held.checked_add(bytes).filter(|&n| n <= max) else {
                return false;
            };
            match self
                .held
                .compare_exchange_weak(held, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::AcqRel);
                    return true;
                }
                Err(now) => held = now,
            }
        }
    }
}

/// One body's share of the [`BufferBudget`], given back on drop.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BufferBudget>,
    bytes: usize,
    max: usize,
}

impl Reservation {
    pub fn empty(budget: &Arc<BufferBudget>, max: usize) -> Self {
        Reservation {
            budget: budget.clone(),
            bytes: 0,
            max,
        }
    }

    /// Grows the share to `bytes`; false (and unchanged) past the budget.
    fn grow_to(&mut self, bytes: usize) -> bool {
        if bytes <= self.bytes {
            return true;
        }
        if !self.budget.take(bytes - self.bytes, self.max) {
            return false;
        }
        self.bytes = bytes;
        true
    }

    /// Counts exactly `bytes`, whatever the budget: memory already
    /// allocated, more or less than was reserved for it.
    fn settle_at(&mut self, bytes: usize) {
        if bytes > self.bytes {
            let more = bytes - self.bytes;
            let now = self.budget.held.fetch_add(more, Ordering::AcqRel) + more;
            self.budget.peak.fetch_max(now, Ordering::AcqRel);
        } else {
            self.budget
                .held
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
        }
        self.bytes = bytes;
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.held.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// A collected request body and its share of the buffer budget.
#[derive(Debug)]
pub struct Collected {
    /// The body's bytes, and whether they are a buffer of their own (the
    /// body was assembled from several frames) or a slice of the
    /// connection's read buffer.
    pub received: Received,
    pub hold: Reservation,
}

/// A request body's bytes, and whether a store that outlives the request
/// (the compaction cache, the prefix cache's snapshot) may keep them as
/// they are. A store weighs what it keeps by its length, so it must never
/// hold a slice of a larger buffer: hyper's read buffer, which a body that
/// came in one frame is a slice of, would stay held, unaccounted. Bytes
/// that are a whole allocation of exactly their length are kept as they
/// are (a megabyte history, received in many frames, is not copied again);
/// any other bytes are copied.
#[derive(Debug, Clone)]
pub struct Received {
    bytes: Bytes,
    own_buffer: bool,
}

impl Received {
    /// Bytes that may be a slice of a larger buffer: kept as a copy.
    pub fn borrowed(bytes: Bytes) -> Self {
        Received {
            bytes,
            own_buffer: false,
        }
    }

    /// A buffer made for these bytes: kept as it is when it is exactly
    /// their length, as a copy when it has room to spare.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        let own_buffer = bytes.len() == bytes.capacity();
        Received {
            bytes: Bytes::from(bytes),
            own_buffer,
        }
    }

    pub fn bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Whether [`Self::to_keep`] shares these bytes rather than copying them.
    pub fn owns_its_buffer(&self) -> bool {
        self.own_buffer
    }

    /// The bytes for a store that outlives the request: these, shared,
    /// when they are a buffer of their own; a copy otherwise.
    pub fn to_keep(&self) -> Bytes {
        match self.own_buffer {
            true => self.bytes.clone(),
            false => Bytes::copy_from_slice(&self.bytes),
        }
    }
}

impl std::ops::Deref for Received {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

/// The bounds on collecting one request body.
#[derive(Debug, Clone, Copy)]
pub struct CollectLimits {
    /// The most bytes the body may have (413 past it).
    pub max_bytes: usize,
    /// The longest the client may send nothing (408 past it).
    pub idle: Duration,
    /// The budget's bound across all requests (503 past it).
    pub max_buffered: usize,
}

/// What a request body's frames are slices of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameSource {
    /// Its connection's own read buffer (HTTP/1): a body that comes in one
    /// frame is kept as it came, holding only what the connection holds
    /// anyway.
    OwnBuffer,
    /// A buffer shared with other streams (HTTP/2), which a small body kept
    /// for long would hold on to, unaccounted: every frame is copied.
    SharedBuffer,
}

/// The first allocation for a body of unknown length; it doubles from there.
const INITIAL_CAPACITY: usize = 8 * 1024;

/// Reads a whole request body into one buffer that grows by doubling (never
/// one allocation per frame: a client sending one-byte chunks costs what it
/// sends, not a frame header per byte), counting its capacity against
/// `budget`. A body that comes in one frame from its connection's own
/// buffer is kept as it came; a body declaring its length is reserved at
/// once.
pub async fn collect_limited<B>(
    body: &mut B,
    limits: CollectLimits,
    budget: &Arc<BufferBudget>,
    source: FrameSource,
) -> Result<Collected, ProxyError>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let limit = limits.max_bytes;
    let mut hold = Reservation::empty(budget, limits.max_buffered);
    let hint = body.size_hint();
    if hint.lower() > limit as u64 {
        return Err(ProxyError::BodyTooLarge { limit });
    }
    let declared = hint.exact().map(|n| n as usize);
    let first = declared.unwrap_or(INITIAL_CAPACITY).min(limit);
    if !hold.grow_to(first) {
        return Err(ProxyError::Overloaded);
    }
    // The usual body comes in one frame, a slice of hyper's read buffer:
    // kept as it came, with no copy. A second frame starts the buffer.
    let mut only_frame: Option<Bytes> = None;
    let mut buffer: Vec<u8> = Vec::new();
    // One timer for the whole body, moved on only when it fires: a timer
    // per frame would cost more than the frame for small chunks.
    let mut last_frame = Instant::now();
    let mut idle = std::pin::pin!(tokio::time::sleep(limits.idle));
    loop {
        let frame = tokio::select! {
            biased;
            frame = body.frame() => frame,
            () = &mut idle => {
                if last_frame.elapsed() >= limits.idle {
                    return Err(ProxyError::BodyTimeout(limits.idle.as_secs_f64()));
                }
                idle.as_mut().reset(last_frame + limits.idle);
                continue;
            }
        };
        last_frame = Instant::now();
        let frame = match frame {
            None => break,
            Some(Err(e)) => return Err(ProxyError::ClientBody(e.into().to_string())),
            Some(Ok(frame)) => frame,
        };
        let Ok(data) = frame.into_data() else {
            continue; // trailers: not part of the body
        };
        if data.is_empty() {
            continue;
        }
        let held = only_frame.as_ref().map_or(buffer.len(), Bytes::len);
        let needed = held + data.len();
        if needed > limit {
            return Err(ProxyError::BodyTooLarge { limit });
        }
        if held == 0 && source == FrameSource::OwnBuffer {
            only_frame = Some(data);
            continue;
        }
        if needed > buffer.capacity() {
            // At once the declared length (or the first block), then doubling.
            let grown = needed.max(buffer.capacity() * 2).max(first).min(limit);
            if !hold.grow_to(grown) {
                return Err(ProxyError::Overloaded);
            }
            buffer.reserve_exact(grown - buffer.len());
        }
        if let Some(earlier) = only_frame.take() {
            buffer.extend_from_slice(&earlier);
        }
        buffer.extend_from_slice(&data);
    }
    if let Some(bytes) = only_frame {
        hold.settle_at(bytes.len());
        return Ok(Collected {
            received: Received::borrowed(bytes),
            hold,
        });
    }
    // A body that came without a length may leave up to half its buffer
    // unused, and the buffer outlives the request when the cache keeps it,
    // weighed by its length: shrinking a large block is done in place.
    if buffer.capacity() > buffer.len() {
        buffer.shrink_to_fit();
    }
    // What the allocator gave may differ from what was reserved.
    hold.settle_at(buffer.capacity());
    Ok(Collected {
        received: Received::from_vec(buffer),
        hold,
    })
}

/// The collection bounds in force under `runtime`.
pub fn limits(runtime: &crate::policy::Runtime) -> CollectLimits {
    let server = &runtime.config.server;
    CollectLimits {
        max_bytes: server.max_body_bytes,
        idle: runtime.timeouts.body_idle,
        max_buffered: server.max_buffered_bytes,
    }
}

/// Collects a request's body under `limits`, refusing one that declares
/// more than `max_bytes` before reading it. A body refused for its size, or
/// for want of buffer space, is read and discarded in the background for a
/// while ([`linger`]) so that the client can read the refusal.
pub async fn collect_request<B>(
    parts: &http::request::Parts,
    mut body: B,
    limits: CollectLimits,
    budget: &Arc<BufferBudget>,
) -> Result<Collected, ProxyError>
where
    B: Body<Data = Bytes> + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
{
    let limit = limits.max_bytes;
    let declared_too_large = parts
        .headers
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok())
        .is_some_and(|n| n > limit as u64);
    let source = if parts.version <= http::Version::HTTP_11 {
        FrameSource::OwnBuffer
    } else {
        FrameSource::SharedBuffer
    };
    let collected = if declared_too_large {
        Err(ProxyError::BodyTooLarge { limit })
    } else {
        collect_limited(&mut body, limits, budget, source).await
    };
    if let Err(ProxyError::BodyTooLarge { .. } | ProxyError::Overloaded) = &collected {
        // HTTP/2 resets just the stream; only HTTP/1 needs the rest read.
        if parts.version <= http::Version::HTTP_11 {
            linger(body);
        }
    }
    collected
}

/// How long and how much of a refused body is still read and thrown away
/// before the connection closes (nginx's lingering close): a client that
/// writes its whole body before reading (Python's urllib and most simple
/// clients) would otherwise get a reset instead of the answer.
pub const LINGER_TIME: Duration = Duration::from_secs(5);
pub const LINGER_BYTES: u64 = 64 * 1024 * 1024;

/// Reads and discards the rest of a refused request body in the
/// background, for at most [`LINGER_TIME`] and [`LINGER_BYTES`]; then drops
/// it, which lets hyper close the connection.
pub fn linger<B>(body: B)
where
    B: Body<Data = Bytes> + Send + 'static,
{
    if body.is_end_stream() {
        return;
    }
    tokio::spawn(async move {
        let mut body = std::pin::pin!(body);
        let mut discarded = 0u64;
        let drain = async {
            while let Some(Ok(frame)) = body.frame().await {
                if let Ok(data) = frame.into_data() {
                    discarded += data.len() as u64;
                    if discarded > LINGER_BYTES {
                        return;
                    }
                }
            }
        };
        let _ = tokio::time::timeout(LINGER_TIME, drain).await;
    });
}

/// A request body forwarded from memory, holding its share of the buffer
/// budget until hyper's client drops it (sent, or the request abandoned).
pub fn full_holding(bytes: Bytes, hold: Reservation) -> ProxyBody {
    guarded(http_body_util::Full::new(bytes), hold)
}

/// `body`, keeping `guard` alive for as long as the body is (a buffer
/// reservation, a connection's busy mark): dropped with it, whether it was
/// read to the end or abandoned.
pub fn guarded<B, G>(body: B, guard: G) -> ProxyBody
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
    G: Send + Unpin + 'static,
{
    Guarded {
        inner: body,
        _guard: guard,
    }
    .boxed_unsync()
}

struct Guarded<B, G> {
    inner: B,
    _guard: G,
}

impl<B, G> Body for Guarded<B, G>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    G: Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.inner).poll_frame(cx).map_err(Into::into)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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
/// pass `limit` (a small compressed body can expand enormously). A body
/// without a coding is shared, not copied.
pub fn decode(body: &Bytes, coding: Coding, limit: usize) -> Result<Bytes, ProxyError> {
    decode_received(&Received::borrowed(body.clone()), coding, limit).map(|r| r.bytes)
}

/// [`decode`] for a received body: a body without a coding keeps what it
/// is; a decoded one is a buffer of its own.
pub fn decode_received(
    body: &Received,
    coding: Coding,
    limit: usize,
) -> Result<Received, ProxyError> {
    let reader: Box<dyn Read + '_> = match coding {
        Coding::Identity | Coding::Unsupported => return Ok(body.clone()),
        Coding::Gzip => Box::new(flate2::read::MultiGzDecoder::new(&body[..])),
        // HTTP's "deflate" is zlib-wrapped (RFC 9110 8.4.1.2).
        Coding::Deflate => Box::new(flate2::read::ZlibDecoder::new(&body[..])),
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
    Ok(Received::from_vec(out))
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
    fn gzip_and_deflate_decode() {
        assert_eq!(
            decode(&gzip(b"hello").into(), Coding::Gzip, 100).unwrap(),
            "hello"
        );
        let mut z = ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(b"hi").unwrap();
        assert_eq!(
            decode(&z.finish().unwrap().into(), Coding::Deflate, 100).unwrap(),
            "hi"
        );
    }

    #[test]
    fn the_limit_applies_to_decoded_bytes() {
        let bomb = gzip(&vec![b'a'; 10_000]);
        assert!(bomb.len() < 200);
        assert!(matches!(
            decode(&bomb.clone().into(), Coding::Gzip, 9_999),
            Err(ProxyError::BodyTooLarge { limit: 9_999 })
        ));
        assert_eq!(
            decode(&bomb.into(), Coding::Gzip, 10_000).unwrap().len(),
            10_000
        );
    }

    #[test]
    fn corrupt_gzip_is_a_client_error() {
        let err = decode(&Bytes::from_static(b"not gzip"), Coding::Gzip, 100).unwrap_err();
        assert!(err.is_client_error(), "{err}");
    }

    /// A body of the given frames, in order, with no declared length.
    struct Frames(std::collections::VecDeque<&'static [u8]>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            let frame = self.0.pop_front();
            Poll::Ready(frame.map(|f| Ok(Frame::data(Bytes::from_static(f)))))
        }
    }

    fn frames(frames: &[&'static [u8]]) -> Frames {
        Frames(frames.iter().copied().collect())
    }

    fn one_byte_frames(n: usize) -> Frames {
        Frames(std::iter::repeat_n(&b"x"[..], n).collect())
    }

    /// [`collect_limited`] for an HTTP/1 body, read from its connection's
    /// own buffer.
    async fn collect<B>(
        body: &mut B,
        limits: CollectLimits,
        budget: &Arc<BufferBudget>,
    ) -> Result<Collected, ProxyError>
    where
        B: Body<Data = Bytes> + Unpin,
        B::Error: Into<BoxError>,
    {
        collect_limited(body, limits, budget, FrameSource::OwnBuffer).await
    }

    fn limits(max_bytes: usize, max_buffered: usize) -> CollectLimits {
        CollectLimits {
            max_bytes,
            idle: Duration::from_secs(5),
            max_buffered,
        }
    }

    #[tokio::test]
    async fn one_byte_frames_end_in_one_buffer_the_size_of_the_body() {
        let budget = BufferBudget::new();
        let mut body = one_byte_frames(100_000);
        let collected = collect(&mut body, limits(1 << 20, 1 << 30), &budget)
            .await
            .unwrap();
        assert_eq!(collected.received.bytes().len(), 100_000);
        // Grown by doubling, then shrunk: the cache weighs a kept body by
        // its length, so nothing more may stay held.
        assert_eq!(collected.hold.bytes(), 100_000);
        assert_eq!(budget.held(), collected.hold.bytes());
        drop(collected);
        assert_eq!(budget.held(), 0, "given back on drop");
    }

    #[tokio::test]
    async fn the_limit_counts_what_is_held_and_the_budget_what_all_hold() {
        let budget = BufferBudget::new();
        let mut body = one_byte_frames(1001);
        let err = collect(&mut body, limits(1000, 1 << 30), &budget)
            .await
            .unwrap_err();
        assert!(matches!(err, ProxyError::BodyTooLarge { limit: 1000 }));
        assert_eq!(budget.held(), 0);

        let first = collect(&mut one_byte_frames(600), limits(1000, 1000), &budget)
            .await
            .unwrap();
        let err = collect(&mut one_byte_frames(600), limits(1000, 1000), &budget)
            .await
            .unwrap_err();
        assert!(matches!(err, ProxyError::Overloaded), "{err}");
        drop(first);
        assert!(
            collect(&mut one_byte_frames(600), limits(1000, 1000), &budget)
                .await
                .is_ok()
        );
    }

    #[tokio::test]
    async fn a_body_in_one_frame_of_its_own_buffer_is_kept_as_it_came() {
        let budget = BufferBudget::new();
        let frame = Bytes::from(vec![b'a'; 5000]);
        let mut body = http_body_util::Full::new(frame.clone());
        let collected = collect(&mut body, limits(10_000, 1 << 30), &budget)
            .await
            .unwrap();
        assert_eq!(
            collected.received.bytes().as_ptr(),
            frame.as_ptr(),
            "no copy"
        );
        assert_eq!(collected.hold.bytes(), 5000);
        assert_eq!(budget.held(), 5000);
        drop(collected);
        // A frame of a buffer other streams share is copied out of it.
        let mut body = http_body_util::Full::new(frame.clone());
        let collected = collect_limited(
            &mut body,
            limits(10_000, 1 << 30),
            &budget,
            FrameSource::SharedBuffer,
        )
        .await
        .unwrap();
        assert_ne!(
            collected.received.bytes().as_ptr(),
            frame.as_ptr(),
            "a copy"
        );
        assert_eq!(*collected.received.bytes(), frame);
        assert_eq!(collected.hold.bytes(), 5000);
    }

    #[tokio::test]
    async fn only_a_body_gathered_into_its_own_buffer_is_kept_without_a_copy() {
        let budget = BufferBudget::new();
        // One frame: a slice of the connection's read buffer, copied to keep.
        let read_buffer = Bytes::from(vec![b'a'; 5000]);
        let frame = read_buffer.slice(..1000);
        let mut body = http_body_util::Full::new(frame.clone());
        let collected = collect(&mut body, limits(10_000, 1 << 30), &budget)
            .await
            .unwrap();
        assert!(!collected.received.owns_its_buffer());
        let kept = collected.received.to_keep();
        assert_eq!(kept, frame);
        assert_ne!(kept.as_ptr(), frame.as_ptr(), "a copy");
        // Several frames: gathered into a buffer of exactly the body's
        // length, kept as it is.
        let mut body = frames(&[b"first ", b"second"]);
        let collected = collect(&mut body, limits(12, 1 << 30), &budget)
            .await
            .unwrap();
        assert!(collected.received.owns_its_buffer());
        let kept = collected.received.to_keep();
        assert_eq!(kept.as_ptr(), collected.received.bytes().as_ptr(), "shared");
        // A buffer with room to spare would keep the room: copied.
        let mut spare = Vec::with_capacity(64);
        spare.extend_from_slice(b"decoded");
        let received = Received::from_vec(spare);
        assert!(!received.owns_its_buffer());
        assert_ne!(received.to_keep().as_ptr(), received.bytes().as_ptr());
    }

    #[tokio::test]
    async fn a_second_frame_joins_the_first_in_one_buffer() {
        let budget = BufferBudget::new();
        let mut body = frames(&[b"first ", b"", b"second"]);
        let collected = collect(&mut body, limits(12, 1 << 30), &budget)
            .await
            .unwrap();
        assert_eq!(&collected.received.bytes()[..], b"first second");
        assert_eq!(collected.hold.bytes(), 12);
        assert_eq!(budget.held(), 12);
        let mut body = frames(&[b"first ", b"second!"]);
        let err = collect(&mut body, limits(12, 1 << 30), &budget)
            .await
            .unwrap_err();
        assert!(matches!(err, ProxyError::BodyTooLarge { limit: 12 }));
    }

    #[tokio::test]
    async fn a_silent_body_times_out() {
        struct Silent;
        impl http_body::Body for Silent {
            type Data = Bytes;
            type Error = std::convert::Infallible;
            fn poll_frame(
                self: Pin<&mut Self>,
                _: &mut Context<'_>,
            ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
                Poll::Pending
            }
        }
        let mut limits = limits(10, 10);
        limits.idle = Duration::from_millis(20);
        let err = collect(&mut Silent, limits, &BufferBudget::new())
            .await
            .unwrap_err();
        assert_eq!(err.code(), "body_timeout");
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
