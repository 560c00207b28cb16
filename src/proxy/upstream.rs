//! The upstream client: a pool of connections per worker
//! ([`super::workers`]) over rustls (HTTP/1.1, and HTTP/2 where the
//! upstream offers it by ALPN), with a deadline for the response headers
//! only: streamed bodies have no total limit. A socket whose writes stall
//! for twice that deadline is closed: hyper would wait for ever to flush a
//! request body to an upstream that stopped reading it, holding the
//! client's connection and the upstream's.
//!
//! The pool is a plain list per worker rather than hyper-util's pooled
//! client: there is one upstream, and a worker's connections serve only
//! that worker's requests, so the shared pool keyed by scheme and
//! authority, with its hashing, locking and URI rewriting on every request,
//! bought nothing (about 8,000 instructions of a 1 KB request's 72,000).

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::uri::PathAndQuery;
use http::{HeaderValue, Request, Response, Uri};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_rustls::HttpsConnector;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls_pki_types::CertificateDer;
use tower_service::Service;

use super::body::{BoxError, ProxyBody};
use crate::error::{ProxyError, UpstreamCause};

type Connector = HttpsConnector<TimeoutConnector<HttpConnector>>;

/// How long an unused connection stays pooled (hyper-util's default).
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Unused connections kept per worker; past it the oldest is closed.
const MAX_IDLE_PER_WORKER: usize = 256;

/// Sends requests to the one configured upstream.
pub struct Upstream {
    /// Offers HTTP/2 and HTTP/1.1 by ALPN.
    connector: Connector,
    /// HTTP/1.1 only: protocol upgrades (WebSocket) exist only there.
    http1_connector: Connector,
    /// Scheme and authority of the upstream: where connections go.
    destination: Uri,
    /// One per worker: a connection is driven by the runtime that opened
    /// it, so a request on another worker using it would wake that
    /// worker's thread twice.
    pools: Vec<Arc<Pool>>,
    /// The Host header every request carries upstream, made once.
    host: Option<HeaderValue>,
}

/// A worker's upstream connections.
#[derive(Default)]
struct Pool {
    /// HTTP/1.1 connections waiting for a request, oldest first.
    idle: Mutex<VecDeque<Idle>>,
    /// Whether the task closing expired idle connections runs (started on
    /// the worker's runtime by the first connection pooled).
    reaping: AtomicBool,
    /// The HTTP/2 connection, when the upstream chose HTTP/2: one carries
    /// all the worker's requests. With when it was last handed out: unused
    /// for [`IDLE_TIMEOUT`], it is not used again.
    http2: Mutex<Option<(http2::SendRequest<ProxyBody>, Instant)>>,
}

struct Idle {
    sender: http1::SendRequest<ProxyBody>,
    since: Instant,
}

enum Sender {
    Http1(http1::SendRequest<ProxyBody>),
    Http2(http2::SendRequest<ProxyBody>),
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

impl Pool {
    /// A pooled connection ready for a request: the HTTP/2 one, or the
    /// most recently used HTTP/1.1 one. Closed and expired ones met on the
    /// way are dropped.
    fn checkout(&self) -> Option<Sender> {
        let now = Instant::now();
        {
            let mut http2 = lock(&self.http2);
            if let Some((sender, last_used)) = http2.as_mut() {
                if sender.is_ready() && !expired(*last_used, now) {
                    *last_used = now;
                    return Some(Sender::Http2(sender.clone()));
                }
                *http2 = None;
            }
        }
        let mut idle = lock(&self.idle);
        while let Some(Idle { sender, since }) = idle.pop_back() {
            if sender.is_ready() && !expired(since, now) {
                return Some(Sender::Http1(sender));
            }
        }
        None
    }

    /// Takes back an HTTP/1.1 connection whose response has been read.
    fn checkin(self: &Arc<Self>, mut sender: http1::SendRequest<ProxyBody>) {
        // Outside a runtime (it is shutting down) nothing is pooled.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if sender.is_closed() {
            return;
        }
        if !sender.is_ready() {
            // The connection (its own task) has not yet seen the response
            // end: pooled once it has.
            let pool = self.clone();
            runtime.spawn(async move {
                if std::future::poll_fn(|cx| sender.poll_ready(cx))
                    .await
                    .is_ok()
                {
                    pool.checkin(sender);
                }
            });
            return;
        }
        if !self.reaping.swap(true, Ordering::Relaxed) {
            runtime.spawn(reap(Arc::downgrade(self)));
        }
        let now = Instant::now();
        let mut idle = lock(&self.idle);
        expire(&mut idle, now);
        if idle.len() >= MAX_IDLE_PER_WORKER {
            idle.pop_front();
        }
        idle.push_back(Idle { sender, since: now });
    }
}

/// Whether a connection last used at `since` has been unused for
/// [`IDLE_TIMEOUT`] by `now`: it is not used again.
fn expired(since: Instant, now: Instant) -> bool {
    now.duration_since(since) >= IDLE_TIMEOUT
}

/// Drops the expired connections (the oldest are first).
fn expire(idle: &mut VecDeque<Idle>, now: Instant) {
    while idle
        .front()
        .is_some_and(|oldest| expired(oldest.since, now))
    {
        idle.pop_front();
    }
}

/// Closes expired idle connections even when no request comes to find
/// them, so a burst's connections do not stay open for ever.
async fn reap(pool: std::sync::Weak<Pool>) {
    loop {
        tokio::time::sleep(IDLE_TIMEOUT / 3).await;
        let Some(pool) = pool.upgrade() else { return };
        let now = Instant::now();
        expire(&mut lock(&pool.idle), now);
        let mut http2 = lock(&pool.http2);
        if http2
            .as_ref()
            .is_some_and(|&(_, last_used)| expired(last_used, now))
        {
            *http2 = None;
        }
    }
}

impl Upstream {
    /// A client for `workers` workers sending to `base`, trusting the
    /// bundled public roots plus `extra_roots`; a socket whose writes stall
    /// for `write_stall` is closed.
    pub fn new(
        base: &Uri,
        connect_timeout: Duration,
        write_stall: Duration,
        extra_roots: &[CertificateDer<'static>],
        workers: usize,
    ) -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(connect_timeout));
        let mut http = TimeoutConnector::new(tcp);
        http.set_write_timeout(Some(write_stall));
        let mut roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        roots.add_parsable_certificates(extra_roots.iter().cloned());
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let builder = || {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
        };
        let mut destination = http::uri::Parts::default();
        destination.scheme = base.scheme().cloned();
        destination.authority = base.authority().cloned();
        destination.path_and_query = Some(PathAndQuery::from_static("/"));
        Upstream {
            connector: builder().enable_all_versions().wrap_connector(http.clone()),
            http1_connector: builder().enable_http1().wrap_connector(http),
            destination: Uri::from_parts(destination).unwrap_or_else(|_| base.clone()),
            pools: (0..workers.max(1)).map(|_| Arc::default()).collect(),
            host: host_header(base),
        }
    }

    /// The Host header for the upstream, if its URI has a host.
    pub fn host(&self) -> Option<&HeaderValue> {
        self.host.as_ref()
    }

    /// Sends `request` (its URI absolute: [`target`]); 502 when the
    /// upstream cannot be reached or fails before answering, 504 when
    /// nothing moves (no request body progress, no response headers) for
    /// `header_timeout`, and 408 when the client sends no body bytes for
    /// `body_idle`. Dropping the returned future (a client that left)
    /// cancels the request.
    pub async fn send(
        &self,
        request: Request<ProxyBody>,
        upgrade: bool,
        header_timeout: Duration,
        body_idle: Duration,
    ) -> Result<Response<UpstreamBody>, ProxyError> {
        // The deadline counts from the last movement of the request body, so
        // a slow upload (a file, audio) is not a silent upstream, while a
        // body that stops moving (a stalled client, an upstream no longer
        // reading) cannot hold the request forever.
        let (parts, body) = request.into_parts();
        let (body, progress) = super::in_flight::track_progress(body);
        let response = self.dispatch(Request::from_parts(parts, body), upgrade);
        let watch = progress.clone();
        let body_idle = body_idle.min(header_timeout);
        let deadline = async move {
            loop {
                let stalled_client = !watch.ended() && watch.waiting_on_client();
                let allowed = if stalled_client {
                    body_idle
                } else {
                    header_timeout
                };
                let now = tokio::time::Instant::now();
                let due = watch.last() + allowed;
                if now >= due {
                    return;
                }
                // Woken at least every `body_idle`: who is waiting may change.
                tokio::time::sleep_until(due.min(now + body_idle)).await;
            }
        };
        let seconds = header_timeout.as_secs_f64();
        tokio::select! {
            answered = response => answered.map_err(|e| match client_body_error(&*e) {
                Some(client) => ProxyError::ClientBody(client),
                None => ProxyError::UpstreamUnreachable(cause_of(&*e), describe(&*e)),
            }),
            () = deadline => Err(if progress.ended() {
                ProxyError::UpstreamTimeout(seconds)
            } else if progress.waiting_on_client() {
                ProxyError::BodyTimeout(body_idle.as_secs_f64())
            } else {
                ProxyError::TransferStalled(seconds)
            }),
        }
    }

    /// Sends `request` on a pooled connection, or on a new one (a protocol
    /// `upgrade` always on a new HTTP/1.1 one). A request that a reused
    /// connection gave back unsent (the upstream closed the idle connection
    /// meanwhile) goes again on another.
    async fn dispatch(
        &self,
        mut request: Request<ProxyBody>,
        upgrade: bool,
    ) -> Result<Response<UpstreamBody>, BoxError> {
        let pool = &self.pools[super::workers::current_index() % self.pools.len()];
        loop {
            let pooled = if upgrade { None } else { pool.checkout() };
            let reused = pooled.is_some();
            let sender = match pooled {
                Some(sender) => sender,
                // Boxed: opening a connection (TCP, TLS, handshake) is a
                // 6 KB future that most requests never run, and unboxed it
                // made every request's future that much larger to move.
                None => Box::pin(self.connect(pool, upgrade))
                    .await
                    .map_err(ConnectFailed)?,
            };
            let mut failed = match sender {
                Sender::Http2(mut sender) => {
                    // HTTP/2 carries the authority in `:authority`, from the URI.
                    request.headers_mut().remove(http::header::HOST);
                    // A failed stream leaves the connection in the pool; a
                    // closed one (after a GOAWAY) is replaced at checkout.
                    match sender.try_send_request(request).await {
                        Ok(response) => return Ok(response.map(UpstreamBody::unpooled)),
                        Err(failed) => failed,
                    }
                }
                Sender::Http1(mut sender) => {
                    *request.uri_mut() = origin_form(request.uri());
                    match sender.try_send_request(request).await {
                        Ok(response) if upgrade => return Ok(response.map(UpstreamBody::unpooled)),
                        Ok(response) => {
                            let reuse = (sender, pool.clone());
                            return Ok(response.map(|body| UpstreamBody::pooled(body, reuse)));
                        }
                        Err(failed) => failed,
                    }
                }
            };
            match failed.take_message() {
                Some(unsent) if reused => {
                    request = unsent;
                    // Absolute again and with its Host, whichever protocol
                    // the next connection speaks.
                    *request.uri_mut() = target(&self.destination, request.uri());
                    if let Some(host) = &self.host {
                        request
                            .headers_mut()
                            .insert(http::header::HOST, host.clone());
                    }
                }
                _ => return Err(failed.into_error().into()),
            }
        }
    }

    /// Opens a connection, driven by a task on this worker's runtime.
    async fn connect(&self, pool: &Pool, upgrade: bool) -> Result<Sender, BoxError> {
        let mut connector = if upgrade {
            self.http1_connector.clone()
        } else {
            self.connector.clone()
        };
        std::future::poll_fn(|cx| connector.poll_ready(cx)).await?;
        let stream = connector.call(self.destination.clone()).await?;
        if stream.connected().is_negotiated_h2() {
            let (sender, connection) = http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake(stream)
                .await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "upstream HTTP/2 connection ended");
                }
            });
            *lock(&pool.http2) = Some((sender.clone(), Instant::now()));
            return Ok(Sender::Http2(sender));
        }
        let (sender, connection) = http1::handshake(stream).await?;
        if upgrade {
            tokio::spawn(async move {
                if let Err(e) = connection.with_upgrades().await {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
            });
        } else {
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::debug!(error = %e, "upstream connection ended");
                }
            });
        }
        Ok(Sender::Http1(sender))
    }
}

/// The path and query of an absolute `uri` alone, as an HTTP/1.1 request
/// line to an origin server carries it.
fn origin_form(uri: &Uri) -> Uri {
    match uri.path_and_query() {
        Some(path) if uri.scheme().is_some() => Uri::from(path.clone()),
        _ => uri.clone(),
    }
}

/// An upstream response body. Read to its end, its HTTP/1.1 connection
/// goes back to the worker's pool; abandoned midway, the connection closes
/// with it.
pub struct UpstreamBody {
    inner: Incoming,
    reuse: Option<(http1::SendRequest<ProxyBody>, Arc<Pool>)>,
}

impl UpstreamBody {
    fn pooled(inner: Incoming, reuse: (http1::SendRequest<ProxyBody>, Arc<Pool>)) -> Self {
        UpstreamBody {
            inner,
            reuse: Some(reuse),
        }
    }

    fn unpooled(inner: Incoming) -> Self {
        UpstreamBody { inner, reuse: None }
    }

    fn release(&mut self) {
        if let Some((sender, pool)) = self.reuse.take() {
            pool.checkin(sender);
        }
    }
}

impl Body for UpstreamBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        // Trailers are the last frame: hyper stops polling after them.
        let ended = match &polled {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(frame))) => frame.is_trailers() || self.inner.is_end_stream(),
            _ => false,
        };
        if ended {
            self.release();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for UpstreamBody {
    fn drop(&mut self) {
        // Empty from the start (a 204, a HEAD): complete though never polled.
        if self.inner.is_end_stream() {
            self.release();
        }
    }
}

/// The Host header for requests to `base`, as hyper-util writes it: the
/// host, and the port unless it is the scheme's default.
fn host_header(base: &Uri) -> Option<HeaderValue> {
    let host = base.host()?;
    let default_port = match base.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    let value = match base.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::try_from(value).ok()
}

/// The client's own body failure, if that is what failed the request.
fn client_body_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(client) = err.downcast_ref::<super::in_flight::ClientBodyError>() {
            return Some(client.to_string());
        }
        source = err.source();
    }
    None
}

/// A connection to the upstream could not be opened (TCP, TLS or the
/// HTTP handshake): what [`cause_of`] tells from a failure after it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct ConnectFailed(#[source] BoxError);

/// What an upstream failure before the response headers was: a TLS
/// failure, a timeout, a connection never made, or one lost after it was.
fn cause_of(e: &(dyn std::error::Error + 'static)) -> UpstreamCause {
    let mut connecting = false;
    let mut timed_out = false;
    let mut source = Some(e);
    while let Some(err) = source {
        connecting |= err.is::<ConnectFailed>();
        if is_tls(err) {
            return UpstreamCause::Tls;
        }
        timed_out |= err
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::TimedOut);
        source = err.source();
    }
    match (timed_out, connecting) {
        (true, _) => UpstreamCause::Timeout,
        (false, true) => UpstreamCause::Connect,
        (false, false) => UpstreamCause::Reset,
    }
}

/// Whether `err` is a rustls error, or an io::Error wrapping one (the TLS
/// connector wraps it twice; io::Error's `source` skips what it wraps).
fn is_tls(err: &(dyn std::error::Error + 'static)) -> bool {
    if err.is::<rustls::Error>() {
        return true;
    }
    match err
        .downcast_ref::<std::io::Error>()
        .and_then(std::io::Error::get_ref)
    {
        Some(inner) => is_tls(inner),
        None => false,
    }
}

/// The error chain as one line (the client's top error says little).
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}

/// The upstream URI for a request: the configured base (scheme, authority
/// and any path prefix) joined with the request's path and query.
///
/// The rule for a base with a path prefix (`http://vllm:8000/v1`, the form
/// vLLM, Ollama and the OpenAI SDKs document): when the request path
/// already starts with the prefix, whole segments only, it is sent as it
/// is; otherwise the prefix goes in front. So with a base of `http://h/v1`,
/// `/v1/chat/completions` and `/chat/completions` both reach
/// `http://h/v1/chat/completions`, and with `http://h` the request path is
/// sent unchanged.
pub fn target(base: &Uri, request: &Uri) -> Uri {
    let prefix = base.path().trim_end_matches('/');
    let path = request.path();
    let has_prefix = path
        .strip_prefix(prefix)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'));
    let path_and_query = match request.path_and_query() {
        // Most requests: the request's own, shared, not parsed again.
        Some(own) if has_prefix => own.clone(),
        own => {
            let prefix = if has_prefix { "" } else { prefix };
            format!("{prefix}{}", own.map_or("/", |p| p.as_str()))
                .parse()
                .unwrap_or_else(|_| PathAndQuery::from_static("/"))
        }
    };
    let mut parts = http::uri::Parts::default();
    parts.scheme = base.scheme().cloned();
    parts.authority = base.authority().cloned();
    parts.path_and_query = Some(path_and_query);
    Uri::from_parts(parts).unwrap_or_else(|_| base.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper_util::rt::TokioIo;

    /// A connection to an in-memory peer that never answers, ready for a
    /// request; the peer's end is returned to keep it open.
    async fn connection() -> (http1::SendRequest<ProxyBody>, tokio::io::DuplexStream) {
        let (ours, theirs) = tokio::io::duplex(1024);
        let (sender, connection) = http1::handshake(TokioIo::new(ours)).await.unwrap();
        tokio::spawn(connection);
        tokio::task::yield_now().await;
        assert!(sender.is_ready());
        (sender, theirs)
    }

    #[tokio::test]
    async fn the_pool_hands_out_the_most_recent_connection_and_keeps_at_most_its_cap() {
        let pool = Arc::new(Pool::default());
        let mut peers = Vec::new();
        for _ in 0..MAX_IDLE_PER_WORKER + 3 {
            let (sender, peer) = connection().await;
            pool.checkin(sender);
            peers.push(peer);
        }
        assert_eq!(
            lock(&pool.idle).len(),
            MAX_IDLE_PER_WORKER,
            "the oldest went"
        );
        let newest = lock(&pool.idle).back().unwrap().since;
        assert!(matches!(pool.checkout(), Some(Sender::Http1(_))));
        assert_eq!(lock(&pool.idle).len(), MAX_IDLE_PER_WORKER - 1);
        assert!(lock(&pool.idle).iter().all(|idle| idle.since <= newest));
    }

    #[tokio::test]
    async fn closed_and_expired_connections_are_never_handed_out() {
        let pool = Arc::new(Pool::default());
        // Closed by its peer before it comes back.
        let (sender, peer) = connection().await;
        drop(peer);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        pool.checkin(sender);
        assert!(lock(&pool.idle).is_empty());

        // Unused for longer than the idle timeout.
        let Some(long_ago) = Instant::now().checked_sub(IDLE_TIMEOUT) else {
            return; // a machine up for less than 90 s
        };
        let (sender, _peer) = connection().await;
        lock(&pool.idle).push_back(Idle {
            sender,
            since: long_ago,
        });
        assert!(pool.checkout().is_none());
        assert!(lock(&pool.idle).is_empty());
        let (sender, _peer) = connection().await;
        lock(&pool.idle).push_back(Idle {
            sender,
            since: long_ago,
        });
        expire(&mut lock(&pool.idle), Instant::now());
        assert!(
            lock(&pool.idle).is_empty(),
            "the reaper's pass drops it too"
        );
    }

    #[tokio::test]
    async fn an_http2_connection_unused_for_the_idle_timeout_is_not_used_again() {
        let (ours, theirs) = tokio::io::duplex(64 * 1024);
        tokio::spawn(
            hyper::server::conn::http2::Builder::new(TokioExecutor::new()).serve_connection(
                TokioIo::new(theirs),
                hyper::service::service_fn(|_| async {
                    Ok::<_, std::convert::Infallible>(Response::new(
                        http_body_util::Empty::<Bytes>::new(),
                    ))
                }),
            ),
        );
        let (sender, connection) = http2::Builder::new(TokioExecutor::new())
            .handshake(TokioIo::new(ours))
            .await
            .unwrap();
        tokio::spawn(connection);
        let pool = Arc::new(Pool::default());
        *lock(&pool.http2) = Some((sender.clone(), Instant::now()));
        assert!(matches!(pool.checkout(), Some(Sender::Http2(_))));
        let Some(long_ago) = Instant::now().checked_sub(IDLE_TIMEOUT) else {
            return; // a machine up for less than 90 s
        };
        *lock(&pool.http2) = Some((sender, long_ago));
        assert!(pool.checkout().is_none());
        assert!(lock(&pool.http2).is_none());
    }

    fn target(base: &Uri, request: &str) -> Uri {
        super::target(base, &request.parse().unwrap())
    }

    #[test]
    fn host_header_names_the_port_only_when_it_is_not_the_default() {
        let host = |base: &str| host_header(&base.parse().unwrap()).unwrap();
        assert_eq!(host("http://127.0.0.1:9/v1"), "127.0.0.1:9");
        assert_eq!(host("http://api.example:80"), "api.example");
        assert_eq!(host("https://api.example:443/v1"), "api.example");
        assert_eq!(host("https://api.example:80"), "api.example:80");
        assert_eq!(host("http://user:secret@[::1]:8080/"), "[::1]:8080");
    }

    #[test]
    fn joins_base_prefix_with_path_and_query() {
        let base: Uri = "http://127.0.0.1:9/".parse().unwrap();
        assert_eq!(
            target(&base, "/v1/chat/completions?x=1").to_string(),
            "http://127.0.0.1:9/v1/chat/completions?x=1"
        );
        let base: Uri = "https://gw.example/openai/".parse().unwrap();
        assert_eq!(
            target(&base, "/v1/models").to_string(),
            "https://gw.example/openai/v1/models"
        );
    }

    #[test]
    fn a_prefix_the_request_already_has_is_not_added_again() {
        for base in [
            "http://h:8000",
            "http://h:8000/",
            "http://h:8000/v1",
            "http://h:8000/v1/",
        ] {
            let base: Uri = base.parse().unwrap();
            assert_eq!(
                target(&base, "/v1/chat/completions?stream=1").to_string(),
                "http://h:8000/v1/chat/completions?stream=1",
                "base {base}"
            );
        }
        let base: Uri = "http://h/v1".parse().unwrap();
        assert_eq!(
            target(&base, "/chat/completions").to_string(),
            "http://h/v1/chat/completions",
            "a path without the prefix gets it"
        );
        assert_eq!(
            target(&base, "/v1beta/models").to_string(),
            "http://h/v1/v1beta/models",
            "whole segments only: /v1beta does not start with /v1"
        );
        assert_eq!(target(&base, "/v1").to_string(), "http://h/v1");
    }
}
