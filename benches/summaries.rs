//! Summaries in stable mode: a 300-turn coding agent sent turn by turn
//! through the real proxy (in-process, loopback) in front of a mock
//! upstream and a mock summarizer that answers after a fixed delay, under
//! drop-only stable mode and stable mode with summaries, inline and
//! background. Prints the billed input (the repeated prefix at 10%, the
//! summarizer's input and output counted whole), the summarizer calls, and
//! each turn's latency against drop-only's, and where the extra bill
//! goes. Fails when summaries, summarizer included, bill more than 1.1x
//! drop-only stable mode.
//!
//! Run: `cargo bench --bench summaries` (`SUMMARY_DELAY_MS`, default 40:
//! the mock summarizer's answer time).

#[path = "support/conversation_sim.rs"]
mod sim;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use compaction_proxy::config::Overrides;
use compaction_proxy::policy::Runtime;
use compaction_proxy::proxy::{self, AppState};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use tokio::net::TcpListener;

/// A loopback server recording request bodies and answering `answer`
/// after `delay`.
async fn mock(delay: Duration, answer: Value) -> (SocketAddr, Arc<Mutex<Vec<Bytes>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received: Arc<Mutex<Vec<Bytes>>> = Arc::default();
    let record = received.clone();
    let answer = Bytes::from(answer.to_string());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (record, answer) = (record.clone(), answer.clone());
            tokio::spawn(async move {
                let service = service_fn(move |req: Request<Incoming>| {
                    let (record, answer) = (record.clone(), answer.clone());
                    async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        record.lock().unwrap().push(body);
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .header("content-type", "application/json")
                                .body(Full::new(answer))
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
    (addr, received)
}

struct Run {
    billed_forwarded: f64,
    summarizer_chars: f64,
    /// Of `summarizer_chars`: the system prompts, the transcripts (user
    /// messages), the answers.
    summarizer_parts: [f64; 3],
    calls: usize,
    seconds: Vec<f64>,
    summarized_turns: usize,
}

async fn run(requests: &[Vec<u8>], extra: &str, delay: Duration) -> Run {
    let summary = "## Task\\nFix the dispatch routing. ".repeat(30);
    let answer = json!({"choices": [{"message": {"role": "assistant", "content": summary}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1}});
    let (summarizer, asked) = mock(delay, answer).await;
    let (upstream, forwarded) = mock(Duration::ZERO, json!({"ok": true})).await;
    let toml = format!(
        "[summarizers.bench]\nurl = \"http://{summarizer}\"\nmodel = \"mini\"\ntimeout_secs = 30\nwindow_tokens = 128000\n\
         [policies.default]\nbudget_chars = 280000\nmode = \"stable\"\n{extra}\n"
    );
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        upstream: Some(format!("http://{upstream}")),
    };
    let runtime = Runtime::load_text(Some(&toml), Vec::new(), &overrides).expect("bench config");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let state = AppState::new(runtime);
    tokio::spawn(proxy::server::serve(
        listener,
        state,
        std::future::pending(),
    ));
    let client: hyper_util::client::legacy::Client<_, Full<Bytes>> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    let mut seconds = Vec::new();
    let mut summarized_turns = 0;
    for body in requests {
        let request = Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.clone())))
            .unwrap();
        let started = Instant::now();
        let response = client.request(request).await.unwrap();
        if response.headers().contains_key("x-compaction-summary-id") {
            summarized_turns += 1;
        }
        response.into_body().collect().await.unwrap();
        seconds.push(started.elapsed().as_secs_f64());
    }
    // Background summaries still being written count once they land.
    tokio::time::sleep(delay * 3).await;
    let forwarded: Vec<Vec<u8>> = forwarded
        .lock()
        .unwrap()
        .iter()
        .map(|b| b.to_vec())
        .collect();
    let asked = asked.lock().unwrap().clone();
    let mut summarizer_parts = [0.0; 3];
    for b in &asked {
        let v: Value = serde_json::from_slice(b).unwrap();
        for m in v["messages"].as_array().unwrap() {
            let part = if m["role"] == "system" { 0 } else { 1 };
            summarizer_parts[part] += sim::message_chars(m);
        }
        summarizer_parts[2] += summary.chars().count() as f64;
    }
    Run {
        billed_forwarded: sim::billed_of(&forwarded),
        summarizer_chars: summarizer_parts.iter().sum(),
        summarizer_parts,
        calls: asked.len(),
        seconds,
        summarized_turns,
    }
}

fn ms(s: f64) -> String {
    format!("{:.1} ms", s * 1e3)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let delay = Duration::from_millis(
        std::env::var("SUMMARY_DELAY_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(40),
    );
    let (history, ends) = sim::coding_agent(300, 11, 100);
    let requests = sim::requests(&history, &ends);
    let drop = run(&requests, "", delay).await;
    let inline = run(
        &requests,
        "strategy = \"summarize\"\nsummarizer = \"bench\"",
        delay,
    )
    .await;
    let background = run(
        &requests,
        "strategy = \"summarize\"\nsummarizer = \"bench\"\nsummary_timing = \"background\"",
        delay,
    )
    .await;
    println!(
        "\ncoding agent: {} turns, stable mode, budget 280000 chars, summarizer answering in {} ms",
        requests.len(),
        delay.as_millis()
    );
    println!("| policy | billed input (chars) | × drop-only | summarizer calls | turns with a summary | latency p50 | p99 | max | added per turn (mean) |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len().max(1) as f64;
    let base = drop.billed_forwarded + drop.summarizer_chars;
    for (label, r) in [
        ("drop", &drop),
        ("summarize, inline", &inline),
        ("summarize, background", &background),
    ] {
        let billed = r.billed_forwarded + r.summarizer_chars;
        println!(
            "| {label} | {billed:.0} | {:.3} | {} | {} | {} | {} | {} | {} |",
            billed / base,
            r.calls,
            r.summarized_turns,
            ms(sim::percentile(&r.seconds, 50.0)),
            ms(sim::percentile(&r.seconds, 99.0)),
            ms(r.seconds.iter().cloned().fold(0.0, f64::max)),
            ms(mean(&r.seconds) - mean(&drop.seconds)),
        );
    }
    // The target of issue 26: summaries, summarizer included, bill at most
    // 1.1x drop-only stable mode.
    for (label, r) in [("inline", &inline), ("background", &background)] {
        let ratio = (r.billed_forwarded + r.summarizer_chars) / base;
        assert!(
            ratio <= 1.1,
            "summaries ({label}) bill {ratio:.3}x drop-only's, over 1.1x"
        );
    }
    println!("\nwhere the extra goes (chars, against drop-only):");
    println!("| policy | forwarded, billed | summarizer system prompts | summarizer transcripts | summaries written |");
    println!("|---|---|---|---|---|");
    for (label, r) in [
        ("summarize, inline", &inline),
        ("summarize, background", &background),
    ] {
        let [system, transcript, answers] = r.summarizer_parts;
        println!(
            "| {label} | {:+.0} | {system:.0} | {transcript:.0} | {answers:.0} |",
            r.billed_forwarded - drop.billed_forwarded
        );
    }
}
