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

/// Serves until `shutdown` completes, then drains for up to `grace`.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    shutdown: impl Future<Output = ()>,
    grace: Duration,
) {
    let builder = auto::Builder::new(TokioExecutor::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(pair) => pair,
                    Err(e) => {
                        // Out of descriptors and the like: back off, don't spin.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
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
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    state.begin_shutdown();
    tracing::info!(
        grace_secs = grace.as_secs_f64(),
        "shutting down: draining in-flight requests"
    );
    if tokio::time::timeout(grace, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("grace period over; closing the remaining connections");
    }
}
