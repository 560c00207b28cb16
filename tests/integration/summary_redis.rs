//! The summary store shared through a real Redis (`redis-server`, started
//! by each test on a loopback port): two proxies, each with its own
//! memory, reuse one summary and forward the same bytes; Redis stopped
//! mid-run costs no request. Without `redis-server` the tests print
//! `skipped`, and fail when `REQUIRE_REDIS` is set (CI sets it).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::json;

use crate::summaries::{MockSummarizer, Mode};
use crate::support::{send, unused_addr, wait_until, Behavior, MockUpstream, TestProxy};

/// A redis-server of its own, stopped when dropped.
struct Redis {
    child: Child,
    port: u16,
}

impl Redis {
    /// `None` (after saying so) when redis-server is not installed.
    async fn start(test: &str) -> Option<Redis> {
        let port = unused_addr().await.port();
        let spawned = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) => {
                assert!(
                    std::env::var_os("REQUIRE_REDIS").is_none(),
                    "REQUIRE_REDIS is set but redis-server cannot run: {e}"
                );
                eprintln!("skipped {test}: redis-server is not installed ({e})");
                return None;
            }
        };
        let up = wait_until(Duration::from_secs(10), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        assert!(up, "redis-server listens");
        Some(Redis { child, port })
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.stop();
    }
}

fn config(summarizer: &str, redis: &str) -> String {
    format!(
        r#"
[store]
redis_url = "{redis}"

[summarizers.mock]
url = "{summarizer}"
format = "chat"
model = "mini"
timeout_secs = 3

[policies.default]
budget_chars = 3000
keep_last_n = 3
strategy = "summarize"
summarizer = "mock"
"#
    )
}

/// `config` for the tests that prove sharing: a command deadline long
/// enough that a loaded machine never turns a slow answer from the local
/// Redis into a local-only write (the 250 ms default did once, with about
/// six builds at once). What a slow or silent Redis costs is proven with a
/// short deadline in `a_silent_redis_costs_a_request_its_configured_deadline`.
fn sharing_config(summarizer: &str, redis: &str) -> String {
    config(summarizer, redis).replace("[store]\n", "[store]\nredis_timeout_ms = 10000\n")
}

fn body(tag: &str) -> String {
    let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
    for i in 0..20 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(json!({"role": role, "content": format!("{tag} turn {i}: {}", "words of the session ".repeat(12))}));
    }
    json!({"model": "gpt-4o", "messages": messages}).to_string()
}

fn post(url: String, body: &str) -> Request<Full<Bytes>> {
    Request::post(url)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap()
}

async fn text(proxy: &TestProxy, path: &str) -> String {
    let answer = send(
        Request::get(proxy.url(path))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    String::from_utf8(answer.body.to_vec()).unwrap()
}

#[tokio::test]
async fn a_summary_made_by_one_proxy_is_used_by_another_with_the_same_bytes() {
    let Some(redis) = Redis::start("a_summary_made_by_one_proxy_is_used_by_another").await else {
        return;
    };
    let summarizer = MockSummarizer::start("chat", Mode::Canned).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let toml = sharing_config(&summarizer.url(), &redis.url());
    assert!(toml.contains("redis_timeout_ms = 10000"));
    let one = TestProxy::start(&toml, &upstream.url()).await;
    let two = TestProxy::start(&toml, &upstream.url()).await;
    let body = body("shared");
    let first = send(post(one.url("/v1/chat/completions"), &body)).await;
    assert_eq!(first.header("x-compaction-summary-source"), Some("model"));
    let second = send(post(two.url("/v1/chat/completions"), &body)).await;
    assert_eq!(second.header("x-compaction-summary-source"), Some("store"));
    assert_eq!(
        second.header("x-compaction-summary-id"),
        first.header("x-compaction-summary-id")
    );
    assert_eq!(
        summarizer.calls(),
        1,
        "the second proxy read Redis, not the model"
    );
    let received = upstream.received();
    assert_eq!(received.len(), 2);
    assert_eq!(
        received[0].body, received[1].body,
        "identical forwarded bytes"
    );
    assert!(text(&two, "/readyz").await.starts_with("ready\n"));
    assert!(!text(&two, "/readyz").await.contains("note"));
}

#[tokio::test]
async fn requests_still_succeed_when_redis_stops_and_the_metric_shows_it() {
    let Some(mut redis) = Redis::start("requests_still_succeed_when_redis_stops").await else {
        return;
    };
    let summarizer = MockSummarizer::start("chat", Mode::Canned).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(&config(&summarizer.url(), &redis.url()), &upstream.url()).await;
    let before = send(post(proxy.url("/v1/chat/completions"), &body("before"))).await;
    assert_eq!(before.header("x-compaction-summary-source"), Some("model"));
    redis.stop();
    for tag in ["after-1", "after-2"] {
        let answer = send(post(proxy.url("/v1/chat/completions"), &body(tag))).await;
        assert_eq!(answer.status, 200, "{tag}");
        assert_eq!(
            answer.header("x-compaction-status"),
            Some("compacted"),
            "{tag}"
        );
        assert_eq!(
            answer.header("x-compaction-summary-source"),
            Some("model"),
            "{tag}"
        );
    }
    // Kept in this process meanwhile: a repeat needs no model.
    let again = send(post(proxy.url("/v1/chat/completions"), &body("after-1"))).await;
    assert_eq!(again.header("x-compaction-summary-source"), Some("store"));
    assert_eq!(summarizer.calls(), 3);
    let metrics = text(&proxy, "/metrics").await;
    let errors: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("compaction_proxy_summary_store_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(errors >= 1, "{metrics}");
    let ready = text(&proxy, "/readyz").await;
    assert!(
        ready.starts_with("ready\n") && ready.contains("kept in this process only"),
        "{ready}"
    );
}

#[tokio::test]
async fn a_silent_redis_costs_a_request_its_configured_deadline() {
    // A "Redis" that accepts connections and never answers.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = silent.local_addr().unwrap().port();
    let held: std::sync::Arc<std::sync::Mutex<Vec<tokio::net::TcpStream>>> = Default::default();
    let keep = held.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = silent.accept().await {
            keep.lock().unwrap().push(stream);
        }
    });
    let summarizer = MockSummarizer::start("chat", Mode::Canned).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let waited = |deadline_ms: u64| {
        let toml = config(&summarizer.url(), &format!("redis://127.0.0.1:{port}/0")).replace(
            "[store]\n",
            &format!("[store]\nredis_timeout_ms = {deadline_ms}\n"),
        );
        let upstream = upstream.url();
        async move {
            let proxy = TestProxy::start(&toml, &upstream).await;
            let started = std::time::Instant::now();
            let answer = send(post(proxy.url("/v1/chat/completions"), &body("silent"))).await;
            let waited = started.elapsed();
            assert_eq!(answer.status, 200);
            assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
            assert_eq!(answer.header("x-compaction-summary-source"), Some("model"));
            let metrics = text(&proxy, "/metrics").await;
            assert!(
                metrics.lines().any(|l| l
                    .starts_with("compaction_proxy_summary_store_errors_total{")
                    && !l.ends_with(" 0")),
                "{metrics}"
            );
            let ready = text(&proxy, "/readyz").await;
            assert!(ready.contains("kept in this process only"), "{ready}");
            waited
        }
    };
    // The configured deadline is what a request waits for Redis (connecting
    // waits twice it, then Redis is left alone for a while): a long one is
    // waited out (a floor, which load cannot break; 3.0 s measured), a
    // short one ends the wait well within the summarizer's own deadline
    // (0.21 s measured).
    let long = waited(1500).await;
    assert!(long >= Duration::from_millis(1500), "{long:?}");
    let short = waited(100).await;
    assert!(short < Duration::from_secs(5), "{short:?}");
    assert!(
        !held.lock().unwrap().is_empty(),
        "the proxy tried the silent Redis"
    );
}

#[test]
fn check_config_refuses_a_zero_redis_deadline() {
    let toml = config("http://127.0.0.1:9", "redis://127.0.0.1:6379/0")
        .replace("[store]\n", "[store]\nredis_timeout_ms = 0\n");
    let problems: Vec<String> = match compaction_proxy::policy::Runtime::load_text(
        Some(&toml),
        Vec::new(),
        &compaction_proxy::config::Overrides::default(),
    ) {
        Ok(_) => Vec::new(),
        Err(errors) => errors.0.into_iter().map(|p| p.path).collect(),
    };
    assert_eq!(problems, ["store.redis_timeout_ms"]);
}

/// A `compaction-proxy serve` process of the real binary, killed on drop.
struct ProxyProcess {
    child: Child,
    port: u16,
}

impl ProxyProcess {
    async fn start(toml: &str) -> ProxyProcess {
        let config = crate::support::temp_file("config.toml", toml.as_bytes());
        let port = unused_addr().await.port();
        let child = Command::new(env!("CARGO_BIN_EXE_compaction-proxy"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(["--config", config.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the binary starts");
        let up = wait_until(Duration::from_secs(20), || {
            std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
        })
        .await;
        assert!(up, "the proxy listens");
        ProxyProcess { child, port }
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    async fn text(&self, path: &str) -> String {
        let answer = send(
            Request::get(self.url(path))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
        String::from_utf8(answer.body.to_vec()).unwrap()
    }
}

impl Drop for ProxyProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_proxy_processes_share_summaries_through_redis_and_survive_its_stop() {
    let Some(mut redis) = Redis::start("two_proxy_processes_share_summaries").await else {
        return;
    };
    let summarizer = MockSummarizer::start("chat", Mode::Canned).await;
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let toml = format!(
        "[upstream]\nurl = \"{}\"\n{}",
        upstream.url(),
        sharing_config(&summarizer.url(), &redis.url())
    );
    let one = ProxyProcess::start(&toml).await;
    let two = ProxyProcess::start(&toml).await;
    let shared = body("processes");
    let first = send(post(one.url("/v1/chat/completions"), &shared)).await;
    assert_eq!(first.header("x-compaction-summary-source"), Some("model"));
    let second = send(post(two.url("/v1/chat/completions"), &shared)).await;
    assert_eq!(second.header("x-compaction-summary-source"), Some("store"));
    assert_eq!(
        second.header("x-compaction-summary-id"),
        first.header("x-compaction-summary-id")
    );
    assert_eq!(summarizer.calls(), 1, "the second process read Redis");
    let received = upstream.received();
    assert_eq!(received.len(), 2);
    assert_eq!(
        received[0].body, received[1].body,
        "identical forwarded bytes"
    );

    redis.stop();
    let answer = send(post(two.url("/v1/chat/completions"), &body("after-stop"))).await;
    assert_eq!(answer.status, 200);
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(answer.header("x-compaction-summary-source"), Some("model"));
    let metrics = two.text("/metrics").await;
    let errors: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("compaction_proxy_summary_store_errors_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert!(errors >= 1, "{metrics}");
    let ready = two.text("/readyz").await;
    assert!(ready.contains("kept in this process only"), "{ready}");
}
