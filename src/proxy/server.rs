//! Accepting connections: HTTP/1.1 and HTTP/2 on one listener, Nagle off so
//! stream events leave as they arrive, and a graceful stop that lets
//! in-flight requests and streams finish within the grace period.

use std::future::Future;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use http::{header, Method, Request};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify, Semaphore};
use tokio::time::Instant;

use super::body::ProxyBody;
use super::workers::Workers;
use super::AppState;
use crate::error::ProxyError;

/// Refuses what a reverse proxy must not pass on, before anything else
/// looks at the request:
/// - `CONNECT` asks for a tunnel to an address of the client's choosing;
/// - a request target that is neither an absolute path (origin-form) nor an
///   absolute URI has no path to forward (`GET x` is not `GET /`);
/// - a transfer coding other than `chunked` (`gzip, chunked`): hyper
///   removes the chunking only, and forwarding the still-coded bytes
///   without the header that says so would corrupt the body. RFC 9112
///   6.1 answers 501, as nginx does; the client can send
///   `Content-Encoding: gzip`, which the proxy reads.
pub fn check_request<B>(request: &Request<B>) -> Result<(), ProxyError> {
    if request.method() == Method::CONNECT {
        return Err(ProxyError::ConnectNotSupported);
    }
    let uri = request.uri();
    if uri.scheme().is_none() && !uri.path().starts_with('/') {
        return Err(ProxyError::BadRequestTarget);
    }
    let codings = request
        .headers()
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .flat_map(|v| v.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .filter(|c| !c.is_empty());
    for coding in codings {
        if !coding.eq_ignore_ascii_case("chunked") {
            let all = request
                .headers()
                .get_all(header::TRANSFER_ENCODING)
                .iter()
                .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .collect::<Vec<_>>()
                .join(", ");
            return Err(ProxyError::UnsupportedTransferCoding(all));
        }
    }
    Ok(())
}

/// The connection limits read once at start (restart to change them).
struct ConnectionLimits {
    header_read: Duration,
    keep_alive: Duration,
    max_connections: usize,
}

/// Serves until `shutdown` completes, then stops in three steps, timed by
/// the configuration in force at that moment:
/// 1. `/readyz` answers 503 while new connections are still accepted for
///    `server.shutdown_delay_secs`, so load balancers stop sending before
///    the door closes;
/// 2. the listener closes;
/// 3. requests, streams and upgraded (WebSocket) connections in flight get
///    `server.shutdown_grace_secs` to end.
///
/// At most `server.max_connections` connections are served at once: past
/// it the loop stops accepting and new clients wait in the kernel's
/// backlog. A failed accept (out of descriptors) is logged and retried
/// after a pause, so the proxy accepts again once descriptors free up.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) {
    serve_on(listener, state, shutdown, &Workers::Current).await
}

/// Descriptors a served connection may hold: the client's socket and,
/// while it forwards, a pooled upstream socket.
const DESCRIPTORS_PER_CONNECTION: u64 = 2;
/// Descriptors for everything else: listener, runtimes, files, spares.
const SPARE_DESCRIPTORS: u64 = 64;

/// Raises this process's soft descriptor limit (up to its hard limit) to
/// what `max_connections` connections need; returns the limit in force.
/// Many systems start a process at 1,024, which the default cap of 1,024
/// connections would exhaust at about 500.
pub fn raise_descriptor_limit(max_connections: usize) -> std::io::Result<u64> {
    let needed = (max_connections as u64)
        .saturating_mul(DESCRIPTORS_PER_CONNECTION)
        .saturating_add(SPARE_DESCRIPTORS);
    let limit = rlimit::increase_nofile_limit(needed)?;
    if limit < needed {
        tracing::warn!(
            max_connections,
            descriptors = limit,
            "the descriptor limit is below what max_connections needs ({needed}): past about {} connections, new ones wait until descriptors free up",
            limit.saturating_sub(SPARE_DESCRIPTORS) / DESCRIPTORS_PER_CONNECTION
        );
    }
    Ok(limit)
}

/// [`serve`], with each connection served on one of `workers`.
pub async fn serve_on(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
    workers: &Workers,
) {
    let limits = {
        let runtime = state.runtime();
        ConnectionLimits {
            header_read: runtime.timeouts.header_read,
            keep_alive: runtime.timeouts.keep_alive,
            max_connections: runtime.config.server.max_connections,
        }
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read);
    builder.http2().timer(TokioTimer::new());
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let (closing_tx, closing) = watch::channel(false);
    tokio::pin!(shutdown);
    let accept = |stream: tokio::net::TcpStream,
                  peer: std::net::SocketAddr,
                  slot: tokio::sync::OwnedSemaphorePermit| {
        let _ = stream.set_nodelay(true);
        // Handed over unregistered: the worker's own runtime polls it.
        let stream = match stream.into_std() {
            Ok(stream) => stream,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "connection lost before it was served");
                return;
            }
        };
        let (state, builder, closing) = (state.clone(), builder.clone(), closing.clone());
        let keep_alive = limits.keep_alive;
        workers.spawn(move || async move {
            let _slot = slot;
            let stream = match tokio::net::TcpStream::from_std(stream) {
                Ok(stream) => stream,
                Err(e) => {
                    tracing::debug!(%peer, error = %e, "connection lost before it was served");
                    return;
                }
            };
            serve_connection(stream, peer, state, builder, closing, keep_alive).await;
        });
    };

    // Serving; then, once shutdown begins, serving unready for the delay.
    let mut stop_accepting: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        let next = async {
            let slot = slots
                .clone()
                .acquire_owned()
                .await
                .expect("the connection semaphore is never closed");
            (slot, listener.accept().await)
        };
        tokio::select! {
            (slot, accepted) = next => match accepted {
                Ok((stream, peer)) => accept(stream, peer, slot),
                Err(e) => {
                    // Out of descriptors and the like: back off, don't spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown, if stop_accepting.is_none() => {
                state.begin_shutdown();
                let delay = state.runtime().timeouts.shutdown_delay;
                tracing::info!(delay_secs = delay.as_secs_f64(), "shutting down: readiness off, still accepting");
                stop_accepting = Some(Box::pin(tokio::time::sleep(delay)));
            }
            () = async { stop_accepting.as_mut().expect("guarded").await }, if stop_accepting.is_some() => break,
        }
    }
    drop(listener);
    let grace = state.runtime().timeouts.shutdown_grace;
    tracing::info!(
        grace_secs = grace.as_secs_f64(),
        "listener closed: draining in-flight requests"
    );
    let _ = closing_tx.send(true);
    let all = u32::try_from(limits.max_connections).unwrap_or(u32::MAX);
    let drained = async {
        // Every connection gives its slot back when it ends.
        let _ = slots.acquire_many(all).await;
        state.tunnels_closed().await;
    };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!("grace period over; closing the remaining connections");
    }
}

/// Serves one client connection until it ends, closing it gracefully when
/// the proxy stops or it has been idle for `keep_alive`. A connection still
/// open and idle `keep_alive` after that is dropped: an HTTP/2 client that
/// never acknowledges the closing GOAWAY's PING would otherwise hold it
/// (and its place under `max_connections`) for ever.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    peer: std::net::SocketAddr,
    state: Arc<AppState>,
    builder: auto::Builder<TokioExecutor>,
    mut closing: watch::Receiver<bool>,
    keep_alive: Duration,
) {
    let activity = Activity::new();
    let in_service = activity.clone();
    let service = service_fn(move |request| {
        let state = state.clone();
        let busy = in_service.begin();
        async move {
            let response = super::handle(state, request).await;
            Ok::<_, std::convert::Infallible>(response.map(|body| busy.hold(body)))
        }
    });
    let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut asked_to_close = false;
    loop {
        tokio::select! {
            ended = connection.as_mut() => {
                if let Err(e) = ended {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = closing.wait_for(|&closing| closing), if !asked_to_close => {
                connection.as_mut().graceful_shutdown();
                asked_to_close = true;
            }
            () = activity.idle_for(keep_alive), if !asked_to_close => {
                connection.as_mut().graceful_shutdown();
                asked_to_close = true;
            }
            () = activity.idle_for(keep_alive * 2), if asked_to_close => {
                tracing::debug!(%peer, "dropping a connection that did not close when asked");
                return;
            }
        }
    }
}

/// Whether a connection has requests in flight, and since when it has none:
/// what its keep-alive timeout is measured on.
struct Activity {
    origin: Instant,
    in_flight: AtomicUsize,
    /// Nanoseconds after `origin` when the last request finished.
    idle_since: AtomicU64,
    became_idle: Notify,
}

impl Activity {
    fn new() -> Arc<Self> {
        Arc::new(Activity {
            origin: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            became_idle: Notify::new(),
        })
    }

    fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Resolves once no request has been in flight for `limit`.
    async fn idle_for(&self, limit: Duration) {
        loop {
            let became_idle = self.became_idle.notified();
            if self.in_flight.load(Ordering::Acquire) == 0 {
                let since = Duration::from_nanos(self.idle_since.load(Ordering::Acquire));
                let due = self.origin + since + limit;
                if Instant::now() >= due {
                    return;
                }
                // A request may begin meanwhile: look again when due.
                tokio::time::sleep_until(due).await;
            } else {
                became_idle.await;
            }
        }
    }
}

/// One request in flight on a connection, until its response body is done.
struct Busy(Arc<Activity>);

impl Busy {
    /// `body`, keeping the connection counted busy while it streams.
    fn hold(self, body: ProxyBody) -> ProxyBody {
        super::body::guarded(body, self)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let activity = &self.0;
        let nanos = activity.origin.elapsed().as_nanos().min(u64::MAX as u128) as u64;
        activity.idle_since.store(nanos, Ordering::Release);
        if activity.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            activity.became_idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_limit_is_raised_to_what_the_connections_need() {
        let (_, hard) = rlimit::Resource::NOFILE.get().unwrap();
        let needed = 300 * DESCRIPTORS_PER_CONNECTION + SPARE_DESCRIPTORS;
        // Start below the need (still ample for the tests running beside).
        rlimit::Resource::NOFILE.set(needed / 2, hard).unwrap();
        let limit = raise_descriptor_limit(300).unwrap();
        assert!(limit >= needed.min(hard), "{limit} < {needed}");
        let (soft, _) = rlimit::Resource::NOFILE.get().unwrap();
        assert_eq!(soft, limit, "the limit returned is the one in force");
    }

    fn request(method: &str, target: &str, te: Option<&str>) -> Request<()> {
        let mut builder = Request::builder().method(method).uri(target);
        if let Some(te) = te {
            builder = builder.header(header::TRANSFER_ENCODING, te);
        }
        builder.body(()).unwrap()
    }

    #[test]
    fn origin_and_absolute_form_targets_pass() {
        for target in [
            "/v1/chat/completions?x=1",
            "http://gw.example/v1/models",
            "/",
        ] {
            assert!(
                check_request(&request("GET", target, None)).is_ok(),
                "{target}"
            );
        }
        assert!(check_request(&request("POST", "/v1/files", Some("chunked"))).is_ok());
        assert!(check_request(&request("POST", "/v1/files", Some("Chunked"))).is_ok());
    }

    #[test]
    fn what_a_reverse_proxy_must_not_pass_on_is_refused() {
        let refused = |r: Request<()>| check_request(&r).unwrap_err().code();
        assert_eq!(
            refused(request("CONNECT", "internal.example:443", None)),
            "method_not_allowed"
        );
        assert_eq!(refused(request("GET", "x", None)), "invalid_request_target");
        assert_eq!(
            refused(request("OPTIONS", "*", None)),
            "invalid_request_target"
        );
        assert_eq!(
            refused(request("POST", "/v1/files", Some("gzip, chunked"))),
            "unsupported_transfer_coding"
        );
    }
}
