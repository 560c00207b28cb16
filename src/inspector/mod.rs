//! The inspector: a web page of recent requests on the admin endpoints'
//! listener (`/inspector`), off by default. One self-contained page (HTML,
//! CSS and JS embedded in the binary, no CDN) reads two JSON endpoints:
//!
//! - `GET /inspector/api/requests?tenant=&policy=&status=&limit=`: the
//!   recent requests of policies with `allow_report`, newest first;
//! - `GET /inspector/api/requests/<id>`: one request side by side.
//!
//! Report contents are user data. The data endpoints require the bearer
//! token of `[inspector] token_env` when one is configured (compared in
//! constant time); the page and its two assets hold no data and are served
//! without it, so a browser can open the page, which asks for the token.
//! Every answer carries a strict Content-Security-Policy (no inline script
//! runs at all), and the page inserts every text with `textContent`.

pub mod store;
pub mod view;

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use serde::Serialize;

pub use store::{BilledUsage, EstimatedSaving, Filter, RecentRequests, Summary};

/// The page's path; everything under `/inspector/` is the inspector's too.
pub const PAGE: &str = "/inspector";
const API_REQUESTS: &str = "/inspector/api/requests";

const INDEX_HTML: &str = include_str!("assets/index.html");
const STYLE_CSS: &str = include_str!("assets/inspector.css");
const SCRIPT_JS: &str = include_str!("assets/inspector.js");
const FAVICON_SVG: &str = include_str!("assets/favicon.svg");

/// Scripts and styles from the proxy's own files only: nothing inline,
/// nothing from elsewhere, no frames, no forms posting away.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Lines a list answers at most.
const MAX_LIST: usize = 1000;

/// `[inspector]` as in force: whether it is on, and its token, read from
/// the environment when the configuration was loaded.
#[derive(Clone, Default)]
pub struct Settings {
    pub enabled: bool,
    token: Option<Arc<str>>,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token itself.
        f.debug_struct("Settings")
            .field("enabled", &self.enabled)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish()
    }
}

impl Settings {
    /// Reads the token `config.token_env` names with `env`; a named
    /// variable that is unset or empty is a configuration problem.
    pub fn resolve(
        config: &crate::config::InspectorConfig,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, String> {
        let token = match config.token_env.as_deref() {
            None => None,
            Some("") => return Err("must name an environment variable".into()),
            Some(name) => match env(name) {
                Some(value) if !value.trim().is_empty() => Some(Arc::from(value.trim())),
                Some(_) => return Err(format!("the variable {name} is empty")),
                None => return Err(format!("the variable {name} is not set")),
            },
        };
        Ok(Settings {
            enabled: config.enabled,
            token,
        })
    }

    /// Whether `headers` carry the token (always, when none is configured).
    fn authorizes(&self, headers: &HeaderMap) -> bool {
        let Some(token) = &self.token else {
            return true;
        };
        let Some(given) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
        else {
            return false;
        };
        constant_time_eq(given.trim().as_bytes(), token.as_bytes())
    }
}

/// Equal bytes, in a time that depends on the lengths alone.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut differ = u8::from(a.len() != b.len());
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        differ |= std::hint::black_box(x ^ y);
    }
    differ == 0
}

/// What the inspector's endpoints use of the shared state.
pub struct Handles<'a> {
    pub settings: Settings,
    pub requests: &'a RecentRequests,
}

/// Whether `path` is the inspector's (cheap: checked on every request).
pub fn is_inspector_path(path: &str) -> bool {
    path.strip_prefix(PAGE)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// Answers an inspector path: 404 while it is off.
pub fn handle<B>(handles: Handles<'_>, request: &Request<B>) -> Response<Bytes> {
    let mut response = answer(&handles, request);
    secure(response.headers_mut());
    response
}

fn answer<B>(handles: &Handles<'_>, request: &Request<B>) -> Response<Bytes> {
    if !handles.settings.enabled {
        return plain(StatusCode::NOT_FOUND, "not found\n");
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        let mut r = plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n");
        r.headers_mut()
            .insert(header::ALLOW, HeaderValue::from_static("GET, HEAD"));
        return r;
    }
    let path = request.uri().path();
    match path {
        "/inspector" | "/inspector/" => asset(INDEX_HTML, "text/html; charset=utf-8"),
        "/inspector/inspector.css" => asset(STYLE_CSS, "text/css; charset=utf-8"),
        "/inspector/inspector.js" => asset(SCRIPT_JS, "text/javascript; charset=utf-8"),
        "/inspector/favicon.svg" => asset(FAVICON_SVG, "image/svg+xml"),
        _ if path == API_REQUESTS || path.starts_with("/inspector/api/") => {
            if !handles.settings.authorizes(request.headers()) {
                let mut r = json(
                    StatusCode::UNAUTHORIZED,
                    &serde_json::json!({"error": "the inspector requires its bearer token"}),
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"inspector\""),
                );
                return r;
            }
            api(handles, path, request.uri().query().unwrap_or(""))
        }
        _ => plain(StatusCode::NOT_FOUND, "not found\n"),
    }
}

/// The data endpoints, the token checked.
fn api(handles: &Handles<'_>, path: &str, query: &str) -> Response<Bytes> {
    if path == API_REQUESTS {
        let mut filter = Filter::default();
        let mut limit = 200;
        for (key, value) in query_pairs(query) {
            let value = (!value.is_empty()).then_some(value);
            match key.as_str() {
                "tenant" => filter.tenant = value,
                "policy" => filter.policy = value,
                "status" => filter.status = value,
                "limit" => {
                    limit = value
                        .and_then(|v| v.parse().ok())
                        .unwrap_or(limit)
                        .min(MAX_LIST)
                }
                _ => {}
            }
        }
        #[derive(Serialize)]
        struct List<'a> {
            requests: Vec<Summary>,
            tenants: Vec<&'a str>,
            policies: Vec<&'a str>,
        }
        let (tenants, policies) = handles.requests.facets();
        return json(
            StatusCode::OK,
            &List {
                requests: handles.requests.list(&filter, limit),
                tenants: tenants.iter().map(|t| &**t).collect(),
                policies: policies.iter().map(|p| &**p).collect(),
            },
        );
    }
    let id = path
        .strip_prefix(API_REQUESTS)
        .and_then(|rest| rest.strip_prefix('/'))
        .filter(|id| !id.is_empty() && !id.contains('/'));
    match id.and_then(|id| handles.requests.get(id)) {
        Some((summary, detail)) => {
            #[derive(Serialize)]
            struct One<'a> {
                request: Summary,
                view: Option<&'a view::Detail>,
            }
            json(
                StatusCode::OK,
                &One {
                    request: summary,
                    view: detail.as_deref(),
                },
            )
        }
        None => json(
            StatusCode::NOT_FOUND,
            &serde_json::json!({"error": "no such request (or no longer kept)"}),
        ),
    }
}

/// `a=1&b=x%20y` as decoded pairs.
fn query_pairs(query: &str) -> impl Iterator<Item = (String, String)> + '_ {
    query.split('&').filter(|p| !p.is_empty()).map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (percent_decode(k), percent_decode(v))
    })
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3])
                    .ok()
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                match hex {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The headers every inspector answer carries.
fn secure(headers: &mut HeaderMap) {
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
}

fn asset(body: &'static str, content_type: &'static str) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from_static(body.as_bytes()));
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

fn plain(status: StatusCode, body: &'static str) -> Response<Bytes> {
    let mut r = asset(body, "text/plain; charset=utf-8");
    *r.status_mut() = status;
    r
}

fn json(status: StatusCode, value: &impl Serialize) -> Response<Bytes> {
    let body = serde_json::to_vec(value).expect("inspector answers serialise");
    let mut r = Response::new(Bytes::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::InspectorConfig;

    fn settings(token: Option<&str>) -> Settings {
        let config = InspectorConfig {
            enabled: true,
            token_env: token.map(|_| "TOKEN".into()),
            ..InspectorConfig::default()
        };
        let token = token.map(String::from);
        Settings::resolve(&config, &move |_| token.clone()).unwrap()
    }

    fn get(path: &str, auth: Option<&str>) -> Request<()> {
        let mut r = Request::get(path);
        if let Some(auth) = auth {
            r = r.header("authorization", auth);
        }
        r.body(()).unwrap()
    }

    #[test]
    fn the_token_env_must_name_a_set_non_empty_variable() {
        let config = InspectorConfig {
            token_env: Some("INSPECTOR_TOKEN".into()),
            ..InspectorConfig::default()
        };
        let unset = Settings::resolve(&config, &|_| None).unwrap_err();
        assert!(unset.contains("INSPECTOR_TOKEN is not set"), "{unset}");
        let empty = Settings::resolve(&config, &|_| Some("  ".into())).unwrap_err();
        assert!(empty.contains("empty"), "{empty}");
        let blank_name = InspectorConfig {
            token_env: Some(String::new()),
            ..InspectorConfig::default()
        };
        assert!(Settings::resolve(&blank_name, &|_| Some("x".into())).is_err());
        let set = Settings::resolve(&config, &|n| {
            (n == "INSPECTOR_TOKEN").then(|| "s3cret".into())
        })
        .unwrap();
        assert!(!format!("{set:?}").contains("s3cret"), "Debug hides it");
    }

    #[test]
    fn the_data_needs_the_token_the_page_does_not() {
        let store = RecentRequests::new(10, 1 << 20);
        let handles = || Handles {
            settings: settings(Some("s3cret")),
            requests: &store,
        };
        let status = |path: &str, auth: Option<&str>| handle(handles(), &get(path, auth)).status();
        assert_eq!(
            status("/inspector/api/requests", None),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status("/inspector/api/requests", Some("Bearer wrong")),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status("/inspector/api/requests", Some("Bearer s3cre")),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status("/inspector/api/requests", Some("Basic s3cret")),
            StatusCode::UNAUTHORIZED
        );
        assert_eq!(
            status("/inspector/api/requests", Some("Bearer s3cret")),
            StatusCode::OK
        );
        assert_eq!(
            status("/inspector/api/requests/nope", Some("Bearer s3cret")),
            StatusCode::NOT_FOUND
        );
        assert_eq!(status("/inspector", None), StatusCode::OK);
        assert_eq!(status("/inspector/inspector.js", None), StatusCode::OK);
        assert_eq!(status("/inspector/elsewhere", None), StatusCode::NOT_FOUND);
    }

    #[test]
    fn every_answer_is_locked_down_and_off_means_not_found() {
        let store = RecentRequests::new(10, 1 << 20);
        let off = Handles {
            settings: Settings::default(),
            requests: &store,
        };
        let r = handle(off, &get("/inspector", None));
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(
            r.headers()[header::CONTENT_SECURITY_POLICY],
            CONTENT_SECURITY_POLICY
        );
        let on = Handles {
            settings: settings(None),
            requests: &store,
        };
        let r = handle(on, &get("/inspector", None));
        for (name, value) in [
            ("x-content-type-options", "nosniff"),
            ("referrer-policy", "no-referrer"),
            ("cache-control", "no-store"),
        ] {
            assert_eq!(r.headers()[name], value);
        }
        assert!(CONTENT_SECURITY_POLICY.starts_with(
            "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'"
        ));
    }

    #[test]
    fn the_page_runs_no_inline_script_and_inserts_no_markup() {
        assert!(INDEX_HTML.contains("<script src=\"/inspector/inspector.js\""));
        let inline = INDEX_HTML.matches("<script").count();
        assert_eq!(inline, 1, "one script tag, and it has a src");
        assert!(!INDEX_HTML.contains("style="), "no inline style");
        assert!(!INDEX_HTML.contains("<style"), "no inline style sheet");
        for markup in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "eval(",
        ] {
            assert!(!SCRIPT_JS.contains(markup), "the script uses {markup}");
        }
    }

    #[test]
    fn query_values_are_decoded() {
        let pairs: Vec<_> =
            query_pairs("tenant=acme%20corp&status=skipped%3B+x&limit=5&bad=%zz").collect();
        assert_eq!(pairs[0], ("tenant".into(), "acme corp".into()));
        assert_eq!(pairs[1], ("status".into(), "skipped; x".into()));
        assert_eq!(pairs[3], ("bad".into(), "%zz".into()));
    }

    #[test]
    fn equal_tokens_only() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
        assert!(!constant_time_eq(b"", b"a"));
    }
}
