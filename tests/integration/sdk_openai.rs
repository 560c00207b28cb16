//! The official OpenAI SDKs (Python and Node) work through the proxy
//! unchanged: only the base URL differs, streaming included. CI installs
//! both and sets `REQUIRE_OPENAI_SDKS=1`; elsewhere a missing SDK
//! makes its test say it was skipped.

use crate::support::*;

const DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk");

/// Whether `program args` runs; fails instead of skipping when CI requires the SDKs.
pub(crate) fn sdk_available(what: &str, program: &str, args: &[&str]) -> bool {
    sdk_available_unless(what, program, args, "REQUIRE_OPENAI_SDKS")
}

/// The credential headers of `forwarded` are those of `original`, as they
/// came, and one of them carries `key`: the proxy passes the key through
/// whatever header the SDK put it in.
pub(crate) fn assert_key_passed_through(
    original: &http::HeaderMap,
    forwarded: &http::HeaderMap,
    key: &str,
) {
    let credentials = ["authorization", "x-api-key", "api-key"];
    for name in credentials {
        assert_eq!(forwarded.get(name), original.get(name), "{name}");
    }
    assert!(
        credentials.iter().any(|name| forwarded
            .get(*name)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == key || v == format!("Bearer {key}"))),
        "the key reached the upstream in no credential header: {forwarded:?}"
    );
}

/// Whether `program args` runs; fails instead of skipping when the
/// environment variable `required_by` is set (CI sets it). A skip is
/// written straight to the test binary's stderr, past libtest's capture,
/// so it shows among the results: `skipped: ...`.
pub(crate) fn sdk_available_unless(
    what: &str,
    program: &str,
    args: &[&str],
    required_by: &str,
) -> bool {
    let found = std::process::Command::new(program)
        .args(args)
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        assert!(
            std::env::var_os(required_by).is_none(),
            "{what} is required here (see .ci/run for how it is installed)"
        );
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipped: {what} is not installed (see .ci/run; {required_by}=1 makes this a failure)"
        );
    }
    found
}

/// Runs an SDK script against a proxy in front of an OpenAI-like mock and
/// checks what the SDK saw against what the upstream received.
async fn drive(program: &'static str, script: String) {
    let upstream = MockUpstream::start(Behavior::OpenAiChat).await;
    let proxy = TestProxy::start("[policies.default]\nbudget_chars = 3000", &upstream.url()).await;
    let base_url = proxy.url("/v1");
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(program)
            .args([script.as_str(), &base_url])
            .output()
            .expect("the SDK script runs")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "SDK script failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let seen: serde_json::Value =
        serde_json::from_slice(&output.stdout).expect("script prints JSON");

    let forwarded = upstream.received();
    assert_eq!(forwarded.len(), 2, "one plain and one streaming request");
    let kept = forwarded[0].json()["messages"].as_array().unwrap().len();
    assert!(
        kept < seen["sent_messages"].as_u64().unwrap() as usize,
        "the history was compacted"
    );
    for request in &forwarded {
        assert_key_passed_through(&request.headers, &request.headers, "sk-sdk-test-key");
    }
    assert_eq!(seen["status_header"], "compacted");
    assert_eq!(seen["output_messages_header"], kept.to_string());
    let expected = format!("received {kept} messages");
    assert_eq!(seen["text"], expected.as_str());
    assert_eq!(
        seen["streamed_text"],
        expected.as_str(),
        "the stream arrived whole through the proxy"
    );
    assert_eq!(forwarded[1].json()["stream"], true);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_sdk_works_unchanged_streaming_included() {
    if sdk_available(
        "the openai Python package",
        "python3",
        &["-c", "import openai"],
    ) {
        drive("python3", format!("{DIR}/openai_python.py")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_sdk_works_unchanged_streaming_included() {
    let probe = format!("{DIR}/node/node_modules/openai/package.json");
    if sdk_available(
        "the openai Node package in tests/sdk/node",
        "node",
        &["-e", &format!("require('{probe}')")],
    ) {
        drive("node", format!("{DIR}/node/openai_node.mjs")).await;
    }
}

/// The README's Python snippet, as written, against a proxy in front of an
/// OpenAI-like mock, with no `OPENAI_API_KEY` in the environment (what a
/// newcomer's shell has): it prints the status and the ratio the README
/// shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_python_snippet_runs_as_written() {
    if !sdk_available(
        "the openai Python package",
        "python3",
        &["-c", "import openai"],
    ) {
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let start = readme.find("```python\n").expect("a Python snippet") + "```python\n".len();
    let snippet = &readme[start..start + readme[start..].find("```").unwrap()];
    assert!(snippet.contains("http://127.0.0.1:8080/v1"), "{snippet}");
    let upstream = MockUpstream::start(Behavior::OpenAiChat).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let script = snippet.replace("http://127.0.0.1:8080", &proxy.url(""));
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .args(["-c", &script])
            .current_dir(root)
            .env_remove("OPENAI_API_KEY")
            .env_remove("OPENAI_BASE_URL")
            .output()
            .expect("python3 runs")
    })
    .await
    .unwrap();
    assert!(
        output.status.success(),
        "the README snippet failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.starts_with("compacted 0."), "{stdout}");
    assert!(readme.contains(&format!(
        "x-compaction-retained-ratio: {}",
        stdout.trim().rsplit(' ').next().unwrap()
    )));
}
