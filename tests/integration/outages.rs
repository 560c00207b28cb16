//! An outage shows in `/metrics`: `requests_total` carries the class of
//! the status code the client was sent, and `upstream_failures_total`
//! counts what went wrong upstream by cause (connect, timeout, reset, tls),
//! as Envoy's `upstream_rq_5xx` and `upstream_cx_connect_fail` do.

use serde_json::json;

use crate::support::*;

/// The value of the one sample of `name` with every one of `labels`
/// (`key="value"`), summed over the label sets that have them.
pub(crate) fn metric(proxy: &TestProxy, name: &str, labels: &[&str]) -> f64 {
    proxy
        .state
        .metrics
        .render()
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|kv| l.contains(kv)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn chat() -> String {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).to_string()
}

#[tokio::test]
async fn a_closed_upstream_port_is_counted_as_5xx_and_connect_failures() {
    let closed = unused_addr().await;
    let proxy = TestProxy::start("", &format!("http://{closed}")).await;
    for _ in 0..3 {
        let answer = send(post_json(&proxy.url("/v1/chat/completions"), chat())).await;
        assert_eq!(answer.status, 502);
    }
    let route = "route=\"/v1/chat/completions\"";
    assert_eq!(
        metric(
            &proxy,
            "compaction_proxy_requests_total",
            &[route, "code_class=\"5xx\""]
        ),
        3.0,
        "{}",
        proxy.state.metrics.render()
    );
    assert_eq!(
        metric(
            &proxy,
            "compaction_proxy_requests_total",
            &["code_class=\"2xx\""]
        ),
        0.0
    );
    assert_eq!(
        metric(
            &proxy,
            "compaction_proxy_upstream_failures_total",
            &[route, "cause=\"connect\""]
        ),
        3.0,
        "{}",
        proxy.state.metrics.render()
    );
    // An unmatched path's failure is counted too, under `unmatched`.
    let get = http::Request::get(proxy.url("/v1/models"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    assert_eq!(send(get).await.status, 502);
    assert_eq!(
        metric(
            &proxy,
            "compaction_proxy_upstream_failures_total",
            &["route=\"unmatched\"", "cause=\"connect\""]
        ),
        1.0
    );
}

#[tokio::test]
async fn silent_and_resetting_upstreams_are_counted_by_cause() {
    let upstream = MockUpstream::start(Behavior::Stall).await;
    let proxy = TestProxy::start(
        "[upstream]\nresponse_header_timeout_secs = 0.3\nidle_timeout_secs = 0.3",
        &upstream.url(),
    )
    .await;
    let url = proxy.url("/v1/chat/completions");
    assert_eq!(send(post_json(&url, chat())).await.status, 504);
    upstream.set_behavior(Behavior::FailStream);
    assert_eq!(send(post_json(&url, chat())).await.status, 502);
    // A body that goes silent after its headers: cut off, a timeout.
    upstream.set_behavior(Behavior::SilentBody);
    let response = client().request(post_json(&url, chat())).await.unwrap();
    assert_eq!(response.status(), 200);
    use http_body_util::BodyExt;
    assert!(response.into_body().collect().await.is_err());
    let failures = |cause: &str| {
        metric(
            &proxy,
            "compaction_proxy_upstream_failures_total",
            &[&format!("cause=\"{cause}\"")],
        )
    };
    assert!(
        wait_until(std::time::Duration::from_secs(2), || failures("timeout")
            == 2.0)
        .await,
        "{}",
        proxy.state.metrics.render()
    );
    assert_eq!(failures("reset"), 1.0);
    assert_eq!(failures("connect"), 0.0);
    let class = |class: &str| {
        metric(
            &proxy,
            "compaction_proxy_requests_total",
            &[&format!("code_class=\"{class}\"")],
        )
    };
    assert_eq!((class("5xx"), class("2xx")), (2.0, 1.0));
}

#[tokio::test]
async fn an_untrusted_upstream_certificate_is_a_tls_failure() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let (front, _ca) = crate::proxy_tls::tls_front(upstream.addr, &[b"http/1.1"]).await;
    let proxy = TestProxy::start("", &format!("https://localhost:{}", front.port())).await;
    let answer = send(post_json(&proxy.url("/v1/chat/completions"), chat())).await;
    assert_eq!(answer.status, 502);
    assert_eq!(
        metric(
            &proxy,
            "compaction_proxy_upstream_failures_total",
            &["cause=\"tls\""]
        ),
        1.0,
        "{}\n{}",
        proxy.state.metrics.render(),
        String::from_utf8_lossy(&answer.body)
    );
}
