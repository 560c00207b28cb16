//! The upstream client: hyper-util's pooled client over rustls (HTTP/1.1,
//! and HTTP/2 where the upstream offers it by ALPN), with a deadline for
//! the response headers only: streamed bodies have no total limit. A socket
//! whose writes stall for twice that deadline is closed: hyper would wait
//! for ever to flush a request body to an upstream that stopped reading it,
//! holding the client's connection and the upstream's.

use std::sync::Arc;
use std::time::Duration;

use http::uri::PathAndQuery;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_timeout::TimeoutConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustls_pki_types::CertificateDer;

use super::body::ProxyBody;
use crate::error::ProxyError;

type HttpsClient = Client<HttpsConnector<TimeoutConnector<HttpConnector>>, ProxyBody>;

/// One pooled client per worker ([`super::workers`]): a pooled upstream
/// connection is driven by the runtime that opened it, so a request on
/// another worker using it would wake that worker's thread twice.
pub struct Upstream {
    clients: Vec<Clients>,
}

struct Clients {
    any: HttpsClient,
    /// HTTP/1.1 only: protocol upgrades (WebSocket) exist only there, and a
    /// pooled HTTP/2 connection could not carry one.
    http1: HttpsClient,
}

impl Upstream {
    /// Clients for `workers` workers, trusting the bundled public roots plus
    /// `extra_roots`; a socket whose writes stall for `write_stall` is
    /// closed.
    pub fn new(
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
        let executor = || Client::builder(TokioExecutor::new());
        let builder = || {
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_tls_config(tls.clone())
                .https_or_http()
        };
        let clients = (0..workers.max(1))
            .map(|_| Clients {
                any: executor().build(builder().enable_all_versions().wrap_connector(http.clone())),
                http1: executor().build(builder().enable_http1().wrap_connector(http.clone())),
            })
            .collect();
        Upstream { clients }
    }

    /// Sends `request`; 502 when the upstream cannot be reached or fails
    /// before answering, 504 when nothing moves (no request body progress,
    /// no response headers) for `header_timeout`, and 408 when the client
    /// sends no body bytes for `body_idle`.
    /// Dropping the returned future (a client that left) cancels the request.
    pub async fn send(
        &self,
        request: Request<ProxyBody>,
        header_timeout: Duration,
        body_idle: Duration,
    ) -> Result<Response<Incoming>, ProxyError> {
        let clients = &self.clients[super::workers::current_index() % self.clients.len()];
        let client = if super::headers::is_upgrade(request.headers()) {
            &clients.http1
        } else {
            &clients.any
        };
        // The deadline counts from the last movement of the request body, so
        // a slow upload (a file, audio) is not a silent upstream, while a
        // body that stops moving (a stalled client, an upstream no longer
        // reading) cannot hold the request forever.
        let (parts, body) = request.into_parts();
        let (body, progress) = super::body::track_progress(body);
        let response = client.request(Request::from_parts(parts, body));
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
            answered = response => answered.map_err(|e| match client_body_error(&e) {
                Some(client) => ProxyError::ClientBody(client),
                None => ProxyError::UpstreamUnreachable(describe(&e)),
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
}

/// The client's own body failure, if that is what failed the request.
fn client_body_error(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(client) = err.downcast_ref::<super::body::ClientBodyError>() {
            return Some(client.to_string());
        }
        source = err.source();
    }
    None
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

    fn target(base: &Uri, request: &str) -> Uri {
        super::target(base, &request.parse().unwrap())
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
