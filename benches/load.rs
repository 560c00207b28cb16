//! Load run for the whole proxy: a mock upstream and the real server run
//! in-process, and a bounded closed-loop load (fixed concurrency, fixed
//! duration) goes straight to the mock and then through the proxy, so the
//! difference is the proxy's overhead. Run: `cargo bench --bench load`.
//! Each scenario stops by itself after `SECONDS`; traffic stays on loopback.

#[path = "../tests/integration/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use support::{Behavior, MockUpstream, TestProxy};

const CONCURRENCY: usize = 16;
const SECONDS: f64 = 4.0;

struct Scenario {
    name: &'static str,
    url: String,
    body: Bytes,
}

async fn run(s: &Scenario) {
    let client = support::client();
    let deadline = Instant::now() + Duration::from_secs_f64(SECONDS);
    let mut workers = Vec::new();
    for _ in 0..CONCURRENCY {
        let client = client.clone();
        let url = s.url.clone();
        let body = s.body.clone();
        workers.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let request = http::Request::post(&url)
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let started = Instant::now();
                let response = client.request(request).await.expect("request succeeds");
                assert!(
                    response.status().is_success(),
                    "status {}",
                    response.status()
                );
                response
                    .into_body()
                    .collect()
                    .await
                    .expect("body completes");
                latencies.push(started.elapsed());
            }
            latencies
        }));
    }
    let mut latencies: Vec<Duration> = Vec::new();
    for w in workers {
        latencies.extend(w.await.unwrap());
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p) as usize].as_secs_f64() * 1e3;
    println!(
        "{:<44} {:>8.0} req/s   p50 {:>7.3} ms   p99 {:>7.3} ms   ({} requests, body {} KB)",
        s.name,
        latencies.len() as f64 / SECONDS,
        pct(0.50),
        pct(0.99),
        latencies.len(),
        s.body.len() / 1024,
    );
}

fn fixture(name: &str) -> Bytes {
    support::fixture(name)
}

#[tokio::main]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing
    // and must not spend seconds here.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let completion = serde_json::json!({"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}]});
    let upstream = MockUpstream::start(Behavior::Json(200, completion)).await;
    let config = "[cache]\nmax_bytes = 0\n[policies.small]\nbudget_chars = 20000\nkeep_roles = [\"system\"]\n[[routes]]\npath = \"/small/v1/chat/completions\"\npolicy = \"small\"\n[[routes]]\npath = \"/v1/chat/completions\"\npolicy = \"default\"";
    let proxy = TestProxy::start(config, &upstream.url()).await;
    let cached = TestProxy::start(
        &config.replace("max_bytes = 0", "max_bytes = 67108864"),
        &upstream.url(),
    )
    .await;
    let small = Bytes::from(serde_json::json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(1000)}]}).to_string());
    let agent = fixture("agent-150-turns.json");
    let chat = fixture("chat-200-messages.json");
    let scenarios = [
        Scenario {
            name: "direct to mock, 1 KB",
            url: format!("{}/v1/chat/completions", upstream.url()),
            body: small.clone(),
        },
        Scenario {
            name: "proxy, unmatched path, 1 KB",
            url: proxy.url("/v1/other"),
            body: small.clone(),
        },
        Scenario {
            name: "proxy, within budget, 1 KB",
            url: proxy.url("/v1/chat/completions"),
            body: small,
        },
        Scenario {
            name: "direct to mock, agent fixture",
            url: format!("{}/v1/chat/completions", upstream.url()),
            body: agent.clone(),
        },
        Scenario {
            name: "proxy, agent fixture compacted (no cache)",
            url: proxy.url("/small/v1/chat/completions"),
            body: agent.clone(),
        },
        Scenario {
            name: "proxy, agent fixture compacted (cache hit)",
            url: cached.url("/small/v1/chat/completions"),
            body: agent,
        },
        Scenario {
            name: "proxy, chat fixture within budget",
            url: proxy.url("/v1/chat/completions"),
            body: chat,
        },
    ];
    println!("closed loop, {CONCURRENCY} concurrent requests, {SECONDS} s per scenario");
    for s in &scenarios {
        run(s).await;
    }
    drop((proxy, cached));
}
