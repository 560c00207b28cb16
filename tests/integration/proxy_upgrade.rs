//! Protocol upgrades (WebSocket, as the OpenAI Realtime API uses) pass
//! through: the proxy forwards the handshake and then joins the two
//! connections byte for byte.

use std::time::Duration;

use crate::support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Reads until the end of a response head; returns it.
async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            stream.read(&mut byte).await.unwrap(),
            1,
            "connection closed in the head"
        );
        head.push(byte[0]);
    }
    String::from_utf8(head).unwrap()
}

#[tokio::test]
async fn a_websocket_upgrade_is_tunnelled_both_ways() {
    let upstream = MockUpstream::start(Behavior::UpgradeEcho).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(
            b"GET /v1/realtime?model=m HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer sk-x\r\n\r\n",
        )
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("upgrade: websocket"), "{head}");
    assert!(lower.contains("connection: upgrade"), "{head}");

    let received = upstream.last();
    assert_eq!(
        received.uri.path_and_query().unwrap().as_str(),
        "/v1/realtime?model=m"
    );
    assert_eq!(received.headers["upgrade"], "websocket");
    assert_eq!(
        received.headers["sec-websocket-key"],
        "dGhlIHNhbXBsZSBub25jZQ=="
    );
    assert_eq!(received.headers["authorization"], "Bearer sk-x");

    for message in ["hello", "realtime frames"] {
        stream.write_all(message.as_bytes()).await.unwrap();
        let mut echoed = vec![0u8; message.len()];
        tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut echoed))
            .await
            .expect("the echo comes back through the tunnel")
            .unwrap();
        assert_eq!(echoed, message.to_ascii_uppercase().as_bytes());
    }
}

#[tokio::test]
async fn a_refused_upgrade_is_an_ordinary_response() {
    let upstream = MockUpstream::start(Behavior::Json(
        426,
        serde_json::json!({"error": "upgrade required"}),
    ))
    .await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let mut stream = TcpStream::connect(proxy.addr).await.unwrap();
    stream
        .write_all(b"GET /v1/realtime HTTP/1.1\r\nHost: proxy\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        .await
        .unwrap();
    let head = read_head(&mut stream).await;
    assert!(head.starts_with("HTTP/1.1 426"), "{head}");
    assert!(
        !head.to_ascii_lowercase().contains("upgrade: websocket"),
        "{head}"
    );
}
