//! The documentation matches the code: every file a doc names exists,
//! every metric the proxy registers is documented, and every skip and
//! refusal reason the code can write is listed (and nothing else). The
//! reasons are read from the source, so a reason added to the code (a new
//! `Skip` variant, say) fails this test until the docs list it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The user-facing docs: README.md, docs/*.md, the chart's README.
fn docs() -> Vec<PathBuf> {
    let mut files = vec![
        root().join("README.md"),
        root().join("charts/compaction-proxy/README.md"),
    ];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            files.push(path);
        }
    }
    files.sort();
    files
}

/// Every `.rs` file under `dir`.
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

const TOP_DIRS: [&str; 8] = [
    "docs", "src", "examples", "charts", "scripts", "config", "tests", "benches",
];

/// The repository paths a doc names: in backticks or as a link target,
/// starting with one of the repository's top directories, or a bare
/// `NAME.md` in capitals (a lower-case one names a command's output file).
fn named_paths(text: &str) -> Vec<String> {
    let re = regex::Regex::new(r"[`(\[]((?:\.\./)*[A-Za-z0-9_./-]+)[`)\]]").unwrap();
    let mut paths = Vec::new();
    for c in re.captures_iter(text) {
        let path = c[1].trim_start_matches("../").trim_start_matches("./");
        let top = path.split('/').next().unwrap_or("");
        let is_repo_path = (TOP_DIRS.contains(&top) && path.contains('/'))
            || path.strip_suffix(".md").is_some_and(|name| {
                !name.contains('/') && name.chars().all(|c| c.is_ascii_uppercase())
            });
        if is_repo_path && !path.contains("...") {
            paths.push(path.to_owned());
        }
    }
    paths
}

#[test]
fn every_file_a_doc_names_exists() {
    let mut missing = Vec::new();
    let mut checked = 0;
    for doc in docs() {
        let dir = doc.parent().unwrap().to_path_buf();
        for path in named_paths(&read(&doc)) {
            checked += 1;
            // A link is relative to its doc; a mention to the repository.
            if !root().join(&path).exists() && !dir.join(&path).exists() {
                missing.push(format!("{}: {path}", doc.display()));
            }
        }
    }
    assert!(checked > 20, "the scan found almost nothing ({checked})");
    assert!(
        missing.is_empty(),
        "named but missing:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_path_scan_sees_mentions_and_links() {
    let found =
        named_paths("see `docs/a.md`, [b](../src/b.rs) and `COMPACTION.md`, not `x/y` or `pin.rs`");
    assert_eq!(found, ["docs/a.md", "src/b.rs", "COMPACTION.md"]);
}

#[test]
fn every_metric_the_proxy_registers_is_documented() {
    let doc = read(&root().join("docs/headers-and-metrics.md"));
    let metrics = compaction_proxy::metrics::Metrics::new();
    let exposition = metrics.render();
    let mut registered: BTreeSet<String> = compaction_proxy::metrics::FAMILIES
        .iter()
        .map(|s| s.to_string())
        .collect();
    // The process collector's families, as this machine exports them.
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            registered.insert(rest.split(' ').next().unwrap().to_owned());
        }
    }
    assert!(
        registered.len() > compaction_proxy::metrics::FAMILIES.len() || !cfg!(target_os = "linux")
    );
    let undocumented: Vec<&String> = registered
        .iter()
        .filter(|name| {
            let short = name
                .strip_prefix("compaction_proxy")
                .map(|s| format!("`{s}`"));
            !doc.contains(&format!("`{name}`"))
                && !doc.contains(&format!("`{name}{{"))
                && !short.is_some_and(|s| doc.contains(&s))
        })
        .collect();
    assert!(
        undocumented.is_empty(),
        "not in docs/headers-and-metrics.md: {undocumented:?}"
    );
}

/// The string literals in the body of the function `signature` in `text`.
fn literals_in_fn(text: &str, signature: &str) -> Vec<String> {
    let start = text
        .find(signature)
        .unwrap_or_else(|| panic!("no {signature}"));
    let body = &text[start..];
    let end = body.find("\n    }\n").unwrap_or(body.len());
    let re = regex::Regex::new(r#"=> "([a-z-]+)""#).unwrap();
    re.captures_iter(&body[..end])
        .map(|c| c[1].to_owned())
        .collect()
}

/// Every skip reason the code can write: the format's `Skip::reason`, and
/// the reasons the proxy writes itself.
fn skip_reasons_in_code() -> BTreeSet<String> {
    let mut reasons: BTreeSet<String> = literals_in_fn(
        &read(&root().join("src/format/mod.rs")),
        "pub fn reason(&self)",
    )
    .into_iter()
    .collect();
    let mut files = Vec::new();
    sources(&root().join("src"), &mut files);
    let re = regex::Regex::new(r#"(?:Skipped|Skip|skipped)\("([a-z-]+)"\)"#).unwrap();
    for file in files {
        let text = read(&file);
        // Unit tests make up reasons of their own.
        let code = text.split("#[cfg(test)]").next().unwrap();
        reasons.extend(re.captures_iter(code).map(|c| c[1].to_owned()));
    }
    reasons
}

/// The backticked words of the paragraph of `doc` that starts with `lead`.
fn listed(doc: &str, lead: &str) -> BTreeSet<String> {
    let start = doc
        .find(lead)
        .unwrap_or_else(|| panic!("no {lead:?} paragraph"));
    let paragraph = &doc[start..];
    let paragraph = &paragraph[..paragraph.find("\n\n").unwrap_or(paragraph.len())];
    let re = regex::Regex::new(r"`([a-z-]+)`").unwrap();
    re.captures_iter(paragraph)
        .map(|c| c[1].to_owned())
        .filter(|w| w != "previous_response_id")
        .collect()
}

#[test]
fn every_skip_reason_is_listed_and_only_those() {
    let doc = read(&root().join("docs/headers-and-metrics.md"));
    let code = skip_reasons_in_code();
    assert!(
        code.contains("invalid-json") && code.contains("not-post"),
        "{code:?}"
    );
    assert_eq!(listed(&doc, "Skip reasons ("), code);
}

#[test]
fn every_refusal_reason_is_listed_and_only_those() {
    let doc = read(&root().join("docs/headers-and-metrics.md"));
    let code: BTreeSet<String> = literals_in_fn(
        &read(&root().join("src/error.rs")),
        "pub fn refusal_reason(&self)",
    )
    .into_iter()
    .collect();
    assert!(code.contains("body-too-large"), "{code:?}");
    assert_eq!(listed(&doc, "Refusal reasons ("), code);
}

#[test]
fn docs_speak_to_users() {
    // Words that point at the project's own history rather than at what a
    // user can read: issue numbers, seed numbers, "as filed".
    let stale = regex::Regex::new(r"(?i)\bissue \d|\bseed \d{3}\b|\bas filed\b").unwrap();
    let mut found = Vec::new();
    for doc in docs() {
        for (n, line) in read(&doc).lines().enumerate() {
            if let Some(m) = stale.find(line) {
                found.push(format!("{}:{}: {}", doc.display(), n + 1, m.as_str()));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_documented_error_type_is_the_one_the_api_sends() {
    let doc = read(&root().join("docs/compaction.md"));
    let invalid = compaction_proxy::error::ProxyError::BodyTooLarge { limit: 1 }.kind();
    assert!(
        doc.contains(&format!("\"type\": \"{invalid}\"")),
        "docs/compaction.md"
    );
    assert!(!doc.contains("\"type\": \"invalid_request\""));
}

#[test]
fn the_license_tls_and_troubleshooting_are_where_users_look() {
    let license = read(&root().join("LICENSE"));
    assert!(license.contains("Apache License") && license.contains("Version 2.0"));
    let cargo = read(&root().join("Cargo.toml"));
    assert!(cargo.contains("license = \"Apache-2.0\""));
    let config = read(&root().join("docs/configuration.md"));
    assert!(config.contains("## TLS: the listener speaks plain HTTP"));
    let readme = read(&root().join("README.md"));
    assert!(readme.contains("## No `x-compaction-*` headers?"));
}
