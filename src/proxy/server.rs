//! Accepting connections: HTTP/1.1 and HTTP/2 on one listener, Nagle off so
//! stream events leave as they arrive, and a graceful stop that lets
//! in-flight requests and streams finish within the grace period.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;

use super::AppState;

/// Serves until `shutdown` completes, then stops in three steps, timed by
/// the configuration in force at that moment:
/// 1. `/readyz` answers 503 while new connections are still accepted for
///    `server.shutdown_delay_secs`, so load balancers stop sending before
///    the door closes;
/// 2. the listener closes;
/// 3. requests, streams and upgraded (WebSocket) connections in flight get
///    `server.shutdown_grace_secs` to end.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    let accept = |stream: tokio::net::TcpStream, peer: std::net::SocketAddr| {
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        let service = service_fn(move |request| {
            let state = state.clone();
            async move { Ok::<_, std::convert::Infallible>(super::handle(state, request).await) }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    };

    // Serving; then, once shutdown begins, serving unready for the delay.
    let mut stop_accepting: Option<std::pin::Pin<Box<tokio::time::Sleep>>> = None;
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => accept(stream, peer),
                Err(e) => {
                    // Out of descriptors and the like: back off, don't spin.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            () = &mut shutdown, if stop_accepting.is_none() => {
                state.begin_shutdown();
                let delay = Duration::from_secs_f64(state.runtime().config.server.shutdown_delay_secs);
                tracing::info!(delay_secs = delay.as_secs_f64(), "shutting down: readiness off, still accepting");
                stop_accepting = Some(Box::pin(tokio::time::sleep(delay)));
            }
            () = async { stop_accepting.as_mut().expect("guarded").await }, if stop_accepting.is_some() => break,
        }
    }
    drop(listener);
    let grace = Duration::from_secs_f64(state.runtime().config.server.shutdown_grace_secs);
    tracing::info!(
        grace_secs = grace.as_secs_f64(),
        "listener closed: draining in-flight requests"
    );
    let drained = async {
        graceful.shutdown().await;
        state.tunnels_closed().await;
    };
    if tokio::time::timeout(grace, drained).await.is_err() {
        tracing::warn!("grace period over; closing the remaining connections");
    }
}
