//! Bodies in flight: the request body as it is forwarded (its progress,
//! which tells a silent upstream from a client still sending) and the
//! response body as it streams back, watched for idleness and for how it
//! ends.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::time::{Instant, Sleep};

use super::body::{BoxError, ProxyBody};
use super::stream_end::StreamEnd;

/// When a request body last moved, shared between the body (which hyper's
/// client polls) and the deadline waiting for the upstream's answer.
#[derive(Clone)]
pub struct Progress(Arc<ProgressState>);

struct ProgressState {
    origin: Instant,
    /// Nanoseconds after `origin` of the last frame read, or of the start.
    last: AtomicU64,
    ended: AtomicBool,
    /// The last poll found the client had sent nothing more: the wait is
    /// the client's, not an upstream that stopped reading.
    waiting_on_client: AtomicBool,
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

    /// Whether the body is stuck on the client (see `waiting_on_client`).
    pub fn waiting_on_client(&self) -> bool {
        self.0.waiting_on_client.load(Ordering::Relaxed)
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
    // A body empty from the start (a GET) may never be polled: it has
    // ended, so a silent upstream is not blamed on it.
    let progress = Progress(Arc::new(ProgressState {
        origin: Instant::now(),
        last: AtomicU64::new(0),
        ended: AtomicBool::new(body.is_end_stream()),
        waiting_on_client: AtomicBool::new(false),
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
            Poll::Pending => {
                self.progress
                    .0
                    .waiting_on_client
                    .store(true, Ordering::Relaxed);
                return Poll::Pending;
            }
            Poll::Ready(frame) => frame,
        };
        self.progress
            .0
            .waiting_on_client
            .store(false, Ordering::Relaxed);
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
    /// The upstream failed mid-body: reset, or silent past the idle timeout.
    Failed(String, crate::error::UpstreamCause),
    /// The client went away before the end.
    Abandoned,
}

/// The upstream went silent for longer than the idle timeout.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?}")]
pub struct IdleTimeout(Duration);

/// Passes a response body through frame by frame, cutting it off after
/// `idle` without a frame, and calling `on_end` exactly once with how it
/// ended (when the body finishes, fails, or is dropped by a departing
/// client) and, when it was given a usage reader ([`Watched::reading`]),
/// what that read.
pub struct Watched<B: Body, F: FnOnce(BodyEnd, Option<crate::usage::Read>)> {
    inner: B,
    idle: Duration,
    /// Armed the first time the body has nothing to give: most responses
    /// arrive whole with their headers and never need it.
    timer: Option<Pin<Box<Sleep>>>,
    /// A frame went out since the timer was last set.
    moved: bool,
    on_end: Option<F>,
    /// Whether the stream's terminal event went out: a client that leaves
    /// after it (SDKs close right after `data: [DONE]`) read everything
    /// there was.
    stream_end: StreamEnd,
    /// Reads the provider's `usage` from the frames as they pass.
    usage: Option<crate::usage::Reader>,
}

impl<B: Body, F: FnOnce(BodyEnd, Option<crate::usage::Read>)> Watched<B, F> {
    pub fn new(inner: B, idle: Duration, on_end: F) -> Self {
        Watched {
            inner,
            idle,
            timer: None,
            moved: false,
            on_end: Some(on_end),
            stream_end: StreamEnd::default(),
            usage: None,
        }
    }

    /// Reads the body's usage with `reader` on the way; `on_end` gets it.
    pub fn reading(mut self, reader: Option<crate::usage::Reader>) -> Self {
        self.usage = reader;
        self
    }

    fn finish(&mut self, end: BodyEnd) {
        if let Some(f) = self.on_end.take() {
            f(end, self.usage.take().map(crate::usage::Reader::finish));
        }
    }

    /// Polls the idle timer, counting `idle` from now when a frame went out
    /// since it was set: the window opens when the body next waits, at most
    /// one poll after the frame.
    fn poll_idle(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let idle = self.idle;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(idle)));
        if std::mem::take(&mut self.moved) {
            timer.as_mut().reset(Instant::now() + idle);
        }
        timer.as_mut().poll(cx)
    }
}

impl<B, F> Body for Watched<B, F>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
    F: FnOnce(BodyEnd, Option<crate::usage::Read>) + Unpin,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                // Only a body of unknown length is a stream whose client may
                // leave right after its terminal event.
                if let Some(data) = frame.data_ref() {
                    if this.inner.size_hint().exact().is_none() {
                        this.stream_end.feed(data);
                    }
                    if let Some(reader) = &mut this.usage {
                        reader.feed(data);
                    }
                }
                this.moved = true;
                // hyper stops polling a body of known length after its last
                // frame, so its end is seen here rather than as `None`.
                if this.inner.is_end_stream() {
                    this.finish(BodyEnd::Complete);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => {
                let e: BoxError = e.into();
                this.finish(BodyEnd::Failed(
                    e.to_string(),
                    crate::error::UpstreamCause::Reset,
                ));
                Poll::Ready(Some(Err(e)))
            }
            Poll::Ready(None) => {
                this.finish(BodyEnd::Complete);
                Poll::Ready(None)
            }
            Poll::Pending => match this.poll_idle(cx) {
                Poll::Ready(()) => {
                    let e = IdleTimeout(this.idle);
                    this.finish(BodyEnd::Failed(
                        e.to_string(),
                        crate::error::UpstreamCause::Timeout,
                    ));
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

impl<B: Body, F: FnOnce(BodyEnd, Option<crate::usage::Read>)> Drop for Watched<B, F> {
    fn drop(&mut self) {
        let end = if self.on_end.is_some() && (self.stream_end.seen() || self.inner.is_end_stream())
        {
            BodyEnd::Complete // e.g. empty from the start, never polled
        } else {
            BodyEnd::Abandoned
        };
        self.finish(end);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A body of unknown length whose frames a test sends by hand.
    struct Fed(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

    impl Body for Fed {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            self.0
                .poll_recv(cx)
                .map(|data| data.map(|d| Ok(Frame::data(d))))
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_idle_window_restarts_with_every_frame() {
        // On a paused clock, which moves only when every task waits: the
        // window is exact however loaded the machine is.
        let idle = Duration::from_millis(300);
        let (feed, frames) = tokio::sync::mpsc::unbounded_channel();
        let (ended_tx, ended) = std::sync::mpsc::channel();
        let mut watched =
            Watched::new(Fed(frames), idle, move |end, _| ended_tx.send(end).unwrap());
        // Six frames a third of the window apart: twice the window in all.
        tokio::spawn(async move {
            for i in 0..6 {
                tokio::time::sleep(idle / 3).await;
                let _ = feed.send(Bytes::from(format!("data: {i}\n\n")));
            }
            // Then silence, the sender kept open.
            tokio::time::sleep(Duration::from_secs(5)).await;
            drop(feed);
        });
        for i in 0..6 {
            let frame = watched.frame().await.expect("a frame").expect("not cut");
            assert_eq!(frame.into_data().unwrap(), format!("data: {i}\n\n"));
        }
        let started = Instant::now();
        let cut = watched.frame().await.expect("cut, not ended");
        assert!(cut.is_err(), "silence past the window cuts the body");
        assert_eq!(started.elapsed(), idle);
        assert!(matches!(ended.try_recv(), Ok(BodyEnd::Failed(..))));
    }

    #[tokio::test]
    async fn a_stream_left_after_its_terminal_event_is_complete() {
        for (last, want) in [
            ("data: [DONE]\n\n", BodyEnd::Complete),
            ("data: {}\n\n", BodyEnd::Abandoned),
        ] {
            let (feed, frames) = tokio::sync::mpsc::unbounded_channel();
            let (ended_tx, ended) = std::sync::mpsc::channel();
            let mut watched = Watched::new(Fed(frames), Duration::from_secs(5), move |end, _| {
                ended_tx.send(end).unwrap()
            });
            feed.send(Bytes::from(last)).unwrap();
            watched.frame().await.unwrap().unwrap();
            drop(watched);
            assert_eq!(ended.try_recv().unwrap(), want, "after {last:?}");
        }
    }
}
