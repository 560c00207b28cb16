//! https upstreams over rustls: a TLS front with a test CA (made here with
//! rcgen) sits before the recording mock; the proxy trusts the CA through
//! `upstream.ca_file` and speaks HTTP/2 when ALPN offers it.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::support::*;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

/// A TLS terminator for `localhost` in front of `target`; returns its
/// address and the PEM of the CA that signed its certificate.
pub(crate) async fn tls_front(target: SocketAddr, alpn: &[&[u8]]) -> (SocketAddr, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();

    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![CertificateDer::from(cert.der().to_vec())],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
    .unwrap();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut plain) = TcpStream::connect(target).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    (addr, ca.pem())
}

fn over_budget_body() -> String {
    json!({"model": "m", "messages": [
        {"role": "user", "content": "old ".repeat(50)},
        {"role": "user", "content": "new question"},
    ]})
    .to_string()
}

const POLICY: &str =
    "[policies.default]\nbudget_chars = 50\nkeep_last_n = 1\npin_first_user = false\n";

/// The proxy (with [`POLICY`]) in front of a TLS front for `upstream`
/// offering `alpn`, trusting the front's CA through `upstream.ca_file`.
async fn proxy_trusting_front(upstream: &MockUpstream, alpn: &[&[u8]]) -> (TestProxy, SocketAddr) {
    let (front, ca_pem) = tls_front(upstream.addr, alpn).await;
    let ca_file = temp_file("ca.pem", ca_pem.as_bytes());
    let config = format!(
        "{POLICY}[upstream]\nca_file = {:?}\n",
        ca_file.to_str().unwrap()
    );
    let proxy = TestProxy::start(&config, &format!("https://localhost:{}", front.port())).await;
    (proxy, front)
}

#[tokio::test]
async fn https_upstream_trusted_by_ca_file_gets_the_compacted_request_over_http2() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let (proxy, front) = proxy_trusting_front(&upstream, &[b"h2", b"http/1.1"]).await;

    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        over_budget_body(),
    ))
    .await;
    assert_eq!(
        answer.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    let received = upstream.last();
    assert_eq!(received.version, http::Version::HTTP_2, "ALPN chose h2");
    assert_eq!(
        received.json()["messages"],
        json!([{"role": "user", "content": "new question"}])
    );
    assert_eq!(
        received.uri.authority().map(|a| a.as_str()),
        Some(format!("localhost:{}", front.port()).as_str())
    );
    assert_eq!(
        received.headers.get("host"),
        None,
        "HTTP/2 names the authority once, in :authority"
    );
}

#[tokio::test]
async fn https_upstream_speaks_http1_when_alpn_offers_only_that() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let (proxy, front) = proxy_trusting_front(&upstream, &[b"http/1.1"]).await;

    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        over_budget_body(),
    ))
    .await;
    assert_eq!(answer.status, 200);
    let received = upstream.last();
    assert_eq!(received.version, http::Version::HTTP_11);
    assert_eq!(
        received.headers["host"],
        format!("localhost:{}", front.port()).as_str()
    );
}

#[tokio::test]
async fn an_untrusted_upstream_certificate_is_a_502_and_nothing_is_sent() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let (front, _ca_pem) = tls_front(upstream.addr, &[b"http/1.1"]).await;
    let proxy = TestProxy::start(POLICY, &format!("https://localhost:{}", front.port())).await;

    let answer = send(post_json(
        &proxy.url("/v1/chat/completions"),
        over_budget_body(),
    ))
    .await;
    assert_eq!(answer.status, 502);
    let error = answer.json();
    assert_eq!(error["error"]["code"], "upstream_unreachable");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("certificate"),
        "{error}"
    );
    assert!(upstream.received().is_empty());
}

#[tokio::test]
async fn a_failed_http2_stream_keeps_the_shared_connection() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let (proxy, _front) = proxy_trusting_front(&upstream, &[b"h2"]).await;
    for _ in 0..5 {
        upstream.set_behavior(Behavior::FailStream);
        let failed = send(post_json(
            &proxy.url("/v1/chat/completions"),
            over_budget_body(),
        ))
        .await;
        assert_eq!(failed.status, 502);
        upstream.set_behavior(Behavior::Json(200, json!({"ok": true})));
        let answered = send(post_json(
            &proxy.url("/v1/chat/completions"),
            over_budget_body(),
        ))
        .await;
        assert_eq!(answered.status, 200);
    }
    assert_eq!(
        upstream.connections(),
        1,
        "a reset stream is not a closed connection"
    );
}
