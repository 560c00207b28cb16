//! The proxy's own failures, each with one HTTP status and an OpenAI-style
//! JSON body: `{"error": {"message", "type", "code"}}`. A client's mistake
//! is a 4xx logged at WARN; our or the upstream's failure a 5xx at ERROR.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;

use crate::memory_compact::InvalidRequest;

#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    #[error("request body is larger than the {limit} bytes allowed")]
    BodyTooLarge { limit: usize },
    #[error("request body could not be read: {0}")]
    ClientBody(String),
    #[error("request body could not be decoded as {encoding}: {reason}")]
    BadEncoding {
        encoding: &'static str,
        reason: String,
    },
    #[error("method {0} is not allowed here; {1} is")]
    MethodNotAllowed(http::Method, &'static str),
    #[error("content type must be application/json")]
    UnsupportedMediaType,
    #[error("no compaction report with this id (reports are kept for a few minutes)")]
    ReportNotFound,
    #[error("{0}")]
    InvalidRequest(#[from] InvalidRequest),
    #[error("upstream could not be reached: {1}")]
    UpstreamUnreachable(UpstreamCause, String),
    #[error("upstream sent no response headers within {}", Seconds(*.0))]
    UpstreamTimeout(f64),
    #[error("the request body stopped moving for {} (an upstream no longer reading)", Seconds(*.0))]
    TransferStalled(f64),
    #[error("the client sent no request body bytes for {}", Seconds(*.0))]
    BodyTimeout(f64),
    #[error("the proxy holds too many request bodies right now; retry shortly")]
    Overloaded,
    #[error("CONNECT is not supported: this is a reverse proxy, not a forward proxy")]
    ConnectNotSupported,
    #[error("the request target must be an absolute path (origin-form) or an absolute URI")]
    BadRequestTarget,
    #[error("transfer coding {0:?} is not supported; only chunked is")]
    UnsupportedTransferCoding(String),
    #[error("internal error: {0}")]
    Internal(String),
}

/// A duration in words: `1 second`, `2.5 seconds`.
pub struct Seconds(pub f64);

impl std::fmt::Display for Seconds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let unit = if self.0 == 1.0 { "second" } else { "seconds" };
        write!(f, "{} {unit}", self.0)
    }
}

/// Why an upstream failed a request: the `cause` label of
/// `upstream_failures_total`, as Envoy counts `upstream_cx_connect_fail`,
/// `upstream_rq_timeout` and resets apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamCause {
    /// No connection: refused, unresolvable, unreachable.
    Connect,
    /// Connecting, the response headers or the response body took too long.
    Timeout,
    /// The connection was closed or reset after it was made.
    Reset,
    /// The TLS handshake failed (an untrusted certificate, a protocol error).
    Tls,
}

impl UpstreamCause {
    pub const ALL: [UpstreamCause; 4] = [
        UpstreamCause::Connect,
        UpstreamCause::Timeout,
        UpstreamCause::Reset,
        UpstreamCause::Tls,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            UpstreamCause::Connect => "connect",
            UpstreamCause::Timeout => "timeout",
            UpstreamCause::Reset => "reset",
            UpstreamCause::Tls => "tls",
        }
    }
}

impl ProxyError {
    /// The upstream failure this error reports, if it is one.
    pub fn upstream_cause(&self) -> Option<UpstreamCause> {
        match self {
            ProxyError::UpstreamUnreachable(cause, _) => Some(*cause),
            ProxyError::UpstreamTimeout(_) | ProxyError::TransferStalled(_) => {
                Some(UpstreamCause::Timeout)
            }
            _ => None,
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ProxyError::BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ProxyError::ClientBody(_)
            | ProxyError::BadEncoding { .. }
            | ProxyError::InvalidRequest(_)
            | ProxyError::BadRequestTarget => StatusCode::BAD_REQUEST,
            ProxyError::MethodNotAllowed(..) | ProxyError::ConnectNotSupported => {
                StatusCode::METHOD_NOT_ALLOWED
            }
            ProxyError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ProxyError::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            ProxyError::UnsupportedTransferCoding(_) => StatusCode::NOT_IMPLEMENTED,
            ProxyError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            ProxyError::UnsupportedMediaType => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ProxyError::ReportNotFound => StatusCode::NOT_FOUND,
            ProxyError::UpstreamUnreachable(..) => StatusCode::BAD_GATEWAY,
            ProxyError::UpstreamTimeout(_) | ProxyError::TransferStalled(_) => {
                StatusCode::GATEWAY_TIMEOUT
            }
        }
    }

    /// The OpenAI error `type`.
    pub fn kind(&self) -> &'static str {
        match self {
            // One spelling for every client error, as OpenAI's API uses.
            e if e.status().is_client_error() => "invalid_request_error",
            _ => "proxy_error",
        }
    }

    /// A stable machine-readable `code`.
    pub fn code(&self) -> &'static str {
        match self {
            ProxyError::BodyTooLarge { .. } => "body_too_large",
            ProxyError::ClientBody(_) => "body_unreadable",
            ProxyError::BadEncoding { .. } => "bad_content_encoding",
            ProxyError::MethodNotAllowed(..) => "method_not_allowed",
            ProxyError::UnsupportedMediaType => "unsupported_media_type",
            ProxyError::ReportNotFound => "report_not_found",
            ProxyError::InvalidRequest(_) => "validation_failed",
            ProxyError::UpstreamUnreachable(..) => "upstream_unreachable",
            ProxyError::UpstreamTimeout(_) => "upstream_timeout",
            ProxyError::TransferStalled(_) => "transfer_stalled",
            ProxyError::BodyTimeout(_) => "body_timeout",
            ProxyError::Overloaded => "proxy_overloaded",
            ProxyError::ConnectNotSupported => "method_not_allowed",
            ProxyError::BadRequestTarget => "invalid_request_target",
            ProxyError::UnsupportedTransferCoding(_) => "unsupported_transfer_coding",
            ProxyError::Internal(_) => "internal_error",
        }
    }

    /// The reason in `x-compaction-status: refused; <reason>` when this
    /// error refuses a request on a matched route before anything is
    /// forwarded.
    pub fn refusal_reason(&self) -> &'static str {
        match self {
            ProxyError::BodyTooLarge { .. } => "body-too-large",
            ProxyError::ClientBody(_) => "body-unreadable",
            ProxyError::BadEncoding { .. } => "bad-content-encoding",
            ProxyError::BodyTimeout(_) => "body-timeout",
            ProxyError::Overloaded => "overloaded",
            _ => "other",
        }
    }

    pub fn is_client_error(&self) -> bool {
        self.status().is_client_error()
    }

    pub fn to_response(&self) -> Response<Bytes> {
        let mut error = json!({
            "message": self.to_string(),
            "type": self.kind(),
            "code": self.code(),
        });
        if let ProxyError::InvalidRequest(invalid) = self {
            error["details"] = serde_json::to_value(&invalid.0).expect("violations serialise");
        }
        let body = serde_json::to_vec(&json!({ "error": error })).expect("json serialises");
        let mut response = Response::new(Bytes::from(body));
        *response.status_mut() = self.status();
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let headers = response.headers_mut();
        match self {
            ProxyError::MethodNotAllowed(_, allow) => {
                headers.insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            ProxyError::ConnectNotSupported => {
                headers.insert(
                    header::ALLOW,
                    HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"),
                );
            }
            // Buffers free up as requests in flight finish.
            ProxyError::Overloaded => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        // After these the connection's remaining input cannot be trusted
        // (a stalled or unframed body): close it rather than keep it alive.
        if matches!(
            self,
            ProxyError::BodyTimeout(_)
                | ProxyError::UnsupportedTransferCoding(_)
                | ProxyError::BadRequestTarget
        ) {
            headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        response
    }
}

/// Anthropic's error type for a status, as its API spells them.
fn anthropic_error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        // Ours is a 503 (full buffers); Anthropic's own overload is a 529.
        503 | 529 => "overloaded_error",
        s if (400..500).contains(&s) => "invalid_request_error",
        _ => "api_error",
    }
}

impl ProxyError {
    /// [`ProxyError::to_response`] in the error shape of the route's API:
    /// Anthropic clients read `{"type":"error","error":{"type","message"}}`.
    pub fn to_response_in(&self, format: crate::format::Format) -> Response<Bytes> {
        let response = self.to_response();
        if format != crate::format::Format::Anthropic {
            return response;
        }
        let (parts, _) = response.into_parts();
        let body = json!({
            "type": "error",
            "error": {
                "type": anthropic_error_type(parts.status),
                "message": self.to_string(),
            }
        });
        Response::from_parts(
            parts,
            Bytes::from(serde_json::to_vec(&body).expect("json serialises")),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_routes_get_anthropic_shaped_errors() {
        let r = ProxyError::UpstreamTimeout(2.0).to_response_in(crate::format::Format::Anthropic);
        assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["error"]["type"], "timeout_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("2 seconds"));
        let r = ProxyError::BodyTooLarge { limit: 1 }.to_response_in(crate::format::Format::Chat);
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["error"]["code"], "body_too_large");
    }

    #[test]
    fn full_buffers_tell_every_client_to_retry() {
        for format in [
            crate::format::Format::Chat,
            crate::format::Format::Anthropic,
        ] {
            let r = ProxyError::Overloaded.to_response_in(format);
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
            assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        }
        let r = ProxyError::Overloaded.to_response_in(crate::format::Format::Anthropic);
        let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
        assert_eq!(v["error"]["type"], "overloaded_error");
    }

    #[test]
    fn every_error_has_an_openai_shaped_body() {
        let errors = [
            ProxyError::BodyTooLarge { limit: 10 },
            ProxyError::UpstreamUnreachable(UpstreamCause::Connect, "connection refused".into()),
            ProxyError::UpstreamTimeout(1.5),
            ProxyError::MethodNotAllowed(http::Method::GET, "POST"),
            ProxyError::BodyTimeout(30.0),
            ProxyError::Overloaded,
            ProxyError::ConnectNotSupported,
            ProxyError::BadRequestTarget,
            ProxyError::UnsupportedTransferCoding("gzip, chunked".into()),
        ];
        for e in errors {
            let r = e.to_response();
            let v: serde_json::Value = serde_json::from_slice(r.body()).unwrap();
            assert_eq!(v["error"]["code"], e.code());
            assert!(v["error"]["message"].as_str().unwrap().len() > 5);
            assert_eq!(r.status(), e.status());
        }
    }

    #[test]
    fn durations_read_as_words() {
        assert_eq!(
            ProxyError::UpstreamTimeout(1.0).to_string(),
            "upstream sent no response headers within 1 second"
        );
        assert!(ProxyError::BodyTimeout(2.5)
            .to_string()
            .ends_with("for 2.5 seconds"));
        assert_eq!(
            ProxyError::UpstreamTimeout(1.0).upstream_cause(),
            Some(UpstreamCause::Timeout)
        );
    }

    #[test]
    fn client_mistakes_are_4xx_and_upstream_failures_5xx() {
        assert!(ProxyError::BodyTooLarge { limit: 1 }.is_client_error());
        assert_eq!(
            ProxyError::UpstreamUnreachable(UpstreamCause::Reset, String::new()).status(),
            StatusCode::BAD_GATEWAY
        );
        assert_eq!(
            ProxyError::UpstreamTimeout(1.0).status(),
            StatusCode::GATEWAY_TIMEOUT
        );
    }
}
