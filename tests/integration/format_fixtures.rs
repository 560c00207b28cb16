//! The 150-turn agent fixture in the Anthropic Messages and OpenAI
//! Responses forms (`tests/data/fixtures/agent-150-turns.{anthropic,
//! responses}.json`, written by `tests/data/convert_agent_fixture.py`):
//! `compact --format X` (the real binary) fits each within the budget, and
//! what it prints passes the API's checker.

use compaction_proxy::format::Format;

use crate::binary::run_cli;
use crate::format_rules::{check_anthropic, check_responses, Verdict};
use crate::support::{fixture, temp_file};

const BUDGET: usize = 40_000;

/// Runs `compact --format <format>` on the fixture and checks its output.
fn compacts_within_budget(format: Format, rules: fn(&[u8], &[u8]) -> Verdict) {
    let name = format!("agent-150-turns.{format}.json");
    let body = fixture(&name);
    let input = format.parse(&body, usize::MAX).expect("the fixture parses");
    assert!(
        input.total_chars() > 5 * BUDGET,
        "the fixture needs compacting"
    );
    let config = temp_file(
        "config.toml",
        format!("[policies.default]\nbudget_chars = {BUDGET}\n").as_bytes(),
    );
    let config = config.to_str().unwrap();
    let out = run_cli(
        &["compact", "--format", format.as_str(), "--config", config],
        &body,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    rules(&body, &out.stdout).unwrap_or_else(|why| panic!("{name}: {why}"));

    let forwarded = format
        .parse(&out.stdout, usize::MAX)
        .expect("the printed body parses");
    assert!(forwarded.len() < input.len(), "{name}: items were dropped");
    assert!(
        forwarded.total_chars() <= BUDGET,
        "{name}: {} chars over a budget of {BUDGET}",
        forwarded.total_chars()
    );
    let summary = format!(
        "{} -> {} chars, {} -> {} messages",
        input.total_chars(),
        forwarded.total_chars(),
        input.len(),
        forwarded.len()
    );
    assert!(stderr.contains(&summary), "{stderr} lacks {summary}");
    assert!(stderr.contains("budget met"), "{stderr}");
}

#[test]
fn compact_fits_the_anthropic_agent_fixture_in_its_budget() {
    compacts_within_budget(Format::Anthropic, check_anthropic);
}

#[test]
fn compact_fits_the_responses_agent_fixture_in_its_budget() {
    compacts_within_budget(Format::Responses, check_responses);
}

/// The committed fixtures are what the converter writes (when Python is
/// here to run it).
#[test]
fn the_format_fixtures_are_the_converters_output() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
    let out = temp_file("placeholder", b"");
    let dir = out.parent().unwrap();
    let run = std::process::Command::new("python3")
        .arg(format!("{data}/convert_agent_fixture.py"))
        .arg(dir)
        .output();
    let Ok(run) = run else {
        eprintln!("skipped: python3 is not installed");
        return;
    };
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    for format in ["anthropic", "responses"] {
        let name = format!("agent-150-turns.{format}.json");
        let written = std::fs::read(dir.join(&name)).unwrap();
        assert!(
            written == fixture(&name),
            "{name} differs from the converter's output"
        );
    }
}
