//! The HTTP summarizer: one hyper client (its own pool, rustls) shared by
//! every summarizer, a call per [`SummaryRequest`], the key the
//! summarizer's `credentials` name. Keys go into request headers only:
//! never into errors, logs or metrics.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::{
    anthropic, chat, responses, Credentials, Settings, Summarize, SummarizeError, Summary,
    SummaryFuture, SummaryRequest,
};
use crate::format::Format;

/// The most bytes of a summarizer answer read.
const MAX_ANSWER_BYTES: usize = 4 * 1024 * 1024;

/// The connection pool every summarizer call goes through.
#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    pub fn new() -> Self {
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(std::time::Duration::from_secs(10)));
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("ring supports the default protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(tcp);
        HttpClient {
            client: Client::builder(TokioExecutor::new()).build(connector),
        }
    }
}

/// The caller's key headers, copied from the request being compacted.
#[derive(Clone, Default)]
pub struct CallerKey {
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl std::fmt::Debug for CallerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the values.
        f.debug_struct("CallerKey")
            .field("headers", &self.headers.len())
            .finish()
    }
}

impl CallerKey {
    /// The key headers of a request: `authorization`, `x-api-key`,
    /// `api-key`.
    pub fn from_headers(headers: &HeaderMap) -> CallerKey {
        const KEYS: [&str; 3] = ["authorization", "x-api-key", "api-key"];
        CallerKey {
            headers: KEYS
                .iter()
                .filter_map(|name| {
                    let value = headers.get(*name)?;
                    let mut value = value.clone();
                    value.set_sensitive(true);
                    Some((HeaderName::from_static(name), value))
                })
                .collect(),
        }
    }
}

/// One summarizer as a [`Summarize`].
pub struct HttpSummarizer {
    pub client: HttpClient,
    pub settings: Arc<Settings>,
    /// Used only when the settings say `credentials = "caller"`.
    pub caller: CallerKey,
}

impl HttpSummarizer {
    /// The headers that carry the key.
    fn key_headers(&self) -> Result<Vec<(HeaderName, HeaderValue)>, SummarizeError> {
        match &self.settings.credentials {
            Credentials::Caller => Ok(self.caller.headers.clone()),
            Credentials::Env(name) => {
                let key = std::env::var(name).map_err(|_| {
                    SummarizeError::Credentials(format!("environment variable {name} is not set"))
                })?;
                let (header, value) = match self.settings.format {
                    Format::Anthropic => ("x-api-key", key),
                    Format::Chat | Format::Responses => ("authorization", format!("Bearer {key}")),
                };
                let mut value = HeaderValue::try_from(value).map_err(|_| {
                    SummarizeError::Credentials(format!(
                        "environment variable {name} is not a valid header value"
                    ))
                })?;
                value.set_sensitive(true);
                Ok(vec![(HeaderName::from_static(header), value)])
            }
        }
    }

    async fn call(&self, request: &SummaryRequest) -> Result<Summary, SummarizeError> {
        let settings = &self.settings;
        let body = match settings.format {
            Format::Chat => chat::body(&settings.model, request),
            Format::Anthropic => anthropic::body(&settings.model, request),
            Format::Responses => responses::body(&settings.model, request),
        };
        let bytes = serde_json::to_vec(&body).expect("JSON values encode");
        let mut builder = Request::post(settings.endpoint.clone())
            .header(http::header::CONTENT_TYPE, "application/json")
            .header(http::header::ACCEPT, "application/json");
        if settings.format == Format::Anthropic {
            builder = builder.header("anthropic-version", anthropic::VERSION);
        }
        for (name, value) in self.key_headers()? {
            builder = builder.header(name, value);
        }
        let http_request = builder
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| SummarizeError::Transport(e.to_string()))?;
        let response = self
            .client
            .client
            .request(http_request)
            .await
            .map_err(|e| SummarizeError::Transport(transport_message(&e)))?;
        let status = response.status();
        let answer = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|_| SummarizeError::Transport("the answer could not be read".into()))?
            .to_bytes();
        if !status.is_success() {
            return Err(SummarizeError::Status(status.as_u16()));
        }
        match settings.format {
            Format::Chat => chat::read(&answer),
            Format::Anthropic => anthropic::read(&answer),
            Format::Responses => responses::read(&answer),
        }
    }
}

/// A transport error's message without anything from the request.
fn transport_message(e: &hyper_util::client::legacy::Error) -> String {
    if e.is_connect() {
        "connection failed".into()
    } else {
        "the request failed".into()
    }
}

impl Summarize for HttpSummarizer {
    fn summarize<'a>(&'a self, request: &'a SummaryRequest) -> SummaryFuture<'a> {
        Box::pin(self.call(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caller_key_copies_the_key_headers_and_never_prints_them() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "authorization",
            HeaderValue::from_static("Bearer sk-secret"),
        );
        headers.insert("x-other", HeaderValue::from_static("v"));
        let key = CallerKey::from_headers(&headers);
        assert_eq!(key.headers.len(), 1);
        assert!(key.headers[0].1.is_sensitive());
        assert!(!format!("{key:?}").contains("sk-secret"));
    }
}
