//! The estimate of what the original requests would have cost, checked on
//! the bench conversations against a mock provider that bills like one:
//! a prompt cache over the prefix shared with the previous request (whole
//! messages), read at 0.1 of the input price, the rest written to the
//! cache at 1.25 (a cache breakpoint on the last message), with a
//! tokenizer of its own (not the proxy's, and not bytes / 4).
//!
//! The true saving is what the mock billed for the original requests
//! (sent turn by turn, uncompacted) less what it billed for the forwarded
//! ones; the proxy's estimate (`estimated_saved_cost_total` less
//! `estimated_extra_cost_total`) must agree within 5%.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

use crate::stable_mode::sim;
use crate::support::*;

const UNCACHED: f64 = 1.0;
const READ: f64 = 0.1;
const WRITE: f64 = 1.25;
const OUTPUT: f64 = 5.0;
const ANSWER_TOKENS: u64 = 20;
/// Tokens of a request's framing (model, roles' wrapper), before its messages.
const FRAMING_TOKENS: u64 = 10;

/// The mock provider's tokenizer: a token per punctuation mark and per
/// five letters or digits of each word.
fn tokens(text: &str) -> u64 {
    let mut count = 0u64;
    let mut run = 0u64;
    for c in text.chars() {
        if c.is_alphanumeric() {
            run += 1;
            continue;
        }
        count += run.div_ceil(5);
        run = 0;
        if !c.is_whitespace() {
            count += 1;
        }
    }
    count + run.div_ceil(5)
}

/// A provider's prompt cache over one conversation: what a request is billed.
#[derive(Default)]
struct Provider {
    previous: Vec<Value>,
}

impl Provider {
    /// (cache read, cache write) input tokens of `body`.
    fn bill(&mut self, body: &[u8]) -> (u64, u64) {
        let request: Value = serde_json::from_slice(body).expect("a JSON request");
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        let per: Vec<u64> = messages
            .iter()
            .map(|m| tokens(&m.to_string()) + 3)
            .collect();
        let common = self
            .previous
            .iter()
            .zip(&messages)
            .take_while(|(a, b)| a == b)
            .count();
        let total = FRAMING_TOKENS + per.iter().sum::<u64>();
        let read = if common > 0 {
            FRAMING_TOKENS + per[..common].iter().sum::<u64>()
        } else {
            0
        };
        self.previous = messages;
        (read, total - read)
    }
}

fn cost(read: u64, write: u64) -> f64 {
    (read as f64 * READ + write as f64 * WRITE + ANSWER_TOKENS as f64 * OUTPUT) / 1e6
}

/// Starts the billing mock; returns its URL and the sum it billed.
async fn billing_upstream() -> (String, Arc<Mutex<f64>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let provider = Arc::new(Mutex::new(Provider::default()));
    let billed = Arc::new(Mutex::new(0.0));
    let total = billed.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (provider, billed) = (provider.clone(), billed.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let (provider, billed) = (provider.clone(), billed.clone());
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let (read, write) = provider.lock().unwrap().bill(&body);
                        *billed.lock().unwrap() += cost(read, write);
                        let answer = json!({
                            "id": "chatcmpl-bill", "object": "chat.completion", "model": "gpt-4o",
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                            "usage": {"prompt_tokens": read + write, "completion_tokens": ANSWER_TOKENS,
                                      "prompt_tokens_details": {"cached_tokens": read},
                                      "cache_creation_input_tokens": write},
                        });
                        Ok::<_, Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(Bytes::from(answer.to_string())))
                                .unwrap(),
                        )
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (url, total)
}

/// The sum of every sample of `name`.
fn total(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Sends a conversation's requests through a proxy in `mode` at `budget`
/// and checks the estimated saving against the true one.
async fn check(name: &str, requests: &[Vec<u8>], budget: usize, mode: &str) {
    let (url, billed) = billing_upstream().await;
    let config = format!(
        "[prices.\"gpt-4o\"]\nuncached = {UNCACHED}\ncache_read = {READ}\ncache_write = {WRITE}\noutput = {OUTPUT}\n\
         [policies.default]\nbudget_chars = {budget}\nmode = \"{mode}\"\n"
    );
    let proxy = TestProxy::start(&config, &url).await;
    let mut compacted = 0;
    for body in requests {
        let answer = send(post_json(&proxy.url("/v1/chat/completions"), body.clone())).await;
        assert_eq!(answer.status, 200);
        compacted += usize::from(answer.header("x-compaction-status") == Some("compacted"));
    }
    assert!(
        compacted > requests.len() / 4,
        "{name}: compacted {compacted}"
    );
    let mut original = Provider::default();
    let original_cost: f64 = requests
        .iter()
        .map(|body| {
            let (read, write) = original.bill(body);
            cost(read, write)
        })
        .sum();
    let actual = *billed.lock().unwrap();
    let state = proxy.state.clone();
    let counted = |text: &str| total(text, "compaction_proxy_requests_total");
    assert!(
        wait_until(Duration::from_secs(10), || counted(&state.metrics.render())
            >= requests.len() as f64)
        .await
    );
    let text = proxy.state.metrics.render();
    let billed_cost = total(&text, "compaction_proxy_billed_cost_total");
    assert!(
        (billed_cost - actual).abs() <= 1e-9 * actual.max(1.0),
        "{name} {mode}: the proxy's billed cost {billed_cost} is not the mock's {actual}"
    );
    let saved = total(&text, "compaction_proxy_estimated_saved_cost_total");
    let extra = total(&text, "compaction_proxy_estimated_extra_cost_total");
    let estimated = saved - extra;
    let truth = original_cost - actual;
    let figures = format!(
        "{name} {mode}: original {original_cost:.6}, billed {actual:.6}, true saving {truth:.6}, estimated {estimated:.6} (saved {saved:.6}, extra {extra:.6}), error {:.2}%",
        100.0 * (estimated - truth).abs() / truth.abs()
    );
    eprintln!("{figures}");
    assert!((estimated - truth).abs() <= 0.05 * truth.abs(), "{figures}");
}

#[tokio::test]
async fn the_estimated_saving_matches_the_bill_on_the_dispatcher_chat() {
    let (history, ends) = sim::dispatcher_chat(120, 7);
    let requests = sim::requests(&history, &ends);
    check("dispatcher", &requests, 30_000, "exact").await;
    check("dispatcher", &requests, 30_000, "stable").await;
}

#[tokio::test]
async fn the_estimated_saving_matches_the_bill_on_the_coding_agent() {
    let (history, ends) = sim::coding_agent(120, 11, 25);
    let requests = sim::requests(&history, &ends);
    check("agent", &requests, 70_000, "exact").await;
    check("agent", &requests, 70_000, "stable").await;
}
