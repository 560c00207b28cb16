//! Static checks of the deployment files: the Helm chart in
//! `charts/compaction-proxy/` and its Grafana dashboard.
//!
//! No helm binary and no network: the chart's YAML and the dashboard's JSON
//! are parsed, and the templates are scanned as text for what a render would
//! trip over (a `.Values` path that values.yaml does not define, unbalanced
//! `{{`/`}}`), and the dashboard's queries for metric names the proxy does
//! not export.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use serde_yaml::Value as Yaml;

/// The metric families the proxy registers. Counters end in `_total` (the
/// naming rule of INTERFACE.md) and are queried by name; the others are
/// histograms, queried through their `_bucket`, `_sum` and `_count` series.
use compaction_proxy::metrics::FAMILIES;

const HISTOGRAM_SUFFIXES: &[&str] = &["_bucket", "_sum", "_count"];

const METRIC_PREFIX: &str = "compaction_proxy_";

/// Dashboard JSON keys whose string values are PromQL (panel targets and
/// template-variable queries).
const QUERY_KEYS: &[&str] = &["expr", "query", "definition"];

fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/compaction-proxy")
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}

fn parse_yaml(path: &Path) -> Yaml {
    serde_yaml::from_str(&read(path))
        .unwrap_or_else(|e| panic!("{} is not valid YAML: {e}", path.display()))
}

fn values() -> Yaml {
    parse_yaml(&chart_dir().join("values.yaml"))
}

fn dashboard() -> Json {
    let path = chart_dir().join("dashboards/compaction-proxy.json");
    serde_json::from_str(&read(&path))
        .unwrap_or_else(|e| panic!("{} is not valid JSON: {e}", path.display()))
}

/// Every file under templates/ as (file name, text), sorted by name.
fn templates() -> Vec<(String, String)> {
    let dir = chart_dir().join("templates");
    let mut files: Vec<(String, String)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_file())
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, read(&path))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no templates in {}", dir.display());
    files
}

fn line_of(text: &str, byte_offset: usize) -> usize {
    text[..byte_offset].matches('\n').count() + 1
}

/// The `.Values.a.b.c` paths in a template's text, as (line, ["a","b","c"]).
fn values_paths(text: &str) -> Vec<(usize, Vec<String>)> {
    const NEEDLE: &str = ".Values.";
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(pos) = text[from..].find(NEEDLE) {
        let start = from + pos + NEEDLE.len();
        let len = text[start..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(text.len() - start);
        let path: Vec<String> = text[start..start + len]
            .split('.')
            .filter(|part| !part.is_empty())
            .map(str::to_owned)
            .collect();
        if !path.is_empty() {
            found.push((line_of(text, start), path));
        }
        from = start + len;
    }
    found
}

/// Walks `path` down the values mapping. A key may be missing only below an
/// explicitly empty map (`podAnnotations: {}` lets a template read
/// `.Values.podAnnotations.foo`); anything else missing, or a path that runs
/// through a non-mapping, is an error.
fn check_values_path(values: &Yaml, path: &[String]) -> Result<(), String> {
    let mut current = values;
    for (depth, key) in path.iter().enumerate() {
        let here = if depth == 0 {
            ".Values".to_owned()
        } else {
            format!(".Values.{}", path[..depth].join("."))
        };
        match current {
            Yaml::Mapping(map) => match map.get(key.as_str()) {
                Some(next) => current = next,
                None if depth > 0 && map.is_empty() => return Ok(()),
                None => return Err(format!("{here} has no key `{key}`")),
            },
            _ => return Err(format!("{here} is not a mapping, so it has no key `{key}`")),
        }
    }
    Ok(())
}

/// Problems with `{{`/`}}` pairing in a template: a close without an open,
/// an open inside an open action, an action left open at the end.
fn delimiter_problems(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut problems = Vec::new();
    let mut open_at: Option<usize> = None;
    let mut i = 0;
    while i + 1 < bytes.len() {
        match &bytes[i..i + 2] {
            b"{{" => {
                if let Some(prev) = open_at {
                    problems.push(format!(
                        "line {}: `{{{{` while the action opened on line {} is still open",
                        line_of(text, i),
                        line_of(text, prev)
                    ));
                }
                open_at = Some(i);
                i += 2;
            }
            b"}}" => {
                if open_at.take().is_none() {
                    problems.push(format!(
                        "line {}: `}}}}` without a matching `{{{{`",
                        line_of(text, i)
                    ));
                }
                i += 2;
            }
            _ => i += 1,
        }
    }
    if let Some(prev) = open_at {
        problems.push(format!("line {}: `{{{{` never closed", line_of(text, prev)));
    }
    problems
}

/// Every string under one of `QUERY_KEYS`, anywhere in the dashboard.
fn collect_queries<'a>(json: &'a Json, out: &mut Vec<&'a str>) {
    match json {
        Json::Object(map) => {
            for (key, value) in map {
                if let (true, Json::String(s)) = (QUERY_KEYS.contains(&key.as_str()), value) {
                    out.push(s);
                }
                collect_queries(value, out);
            }
        }
        Json::Array(items) => items.iter().for_each(|item| collect_queries(item, out)),
        _ => {}
    }
}

fn is_metric_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The `compaction_proxy_*` metric names in a PromQL string.
fn metric_names(query: &str) -> Vec<&str> {
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(pos) = query[from..].find(METRIC_PREFIX) {
        let start = from + pos;
        let len = query[start..]
            .find(|c: char| !is_metric_char(c))
            .unwrap_or(query.len() - start);
        let preceded_by_name = query[..start]
            .chars()
            .next_back()
            .is_some_and(is_metric_char);
        if !preceded_by_name {
            names.push(&query[start..start + len]);
        }
        from = start + len;
    }
    names
}

/// Whether a series name belongs to an exported family: a counter by its own
/// name, a histogram by one of its three series.
fn is_exported_series(name: &str) -> bool {
    FAMILIES.iter().any(|&family| {
        if family.ends_with("_total") {
            name == family
        } else {
            HISTOGRAM_SUFFIXES
                .iter()
                .any(|suffix| name.strip_suffix(suffix) == Some(family))
        }
    })
}

#[test]
fn chart_yaml_parses_and_names_the_chart() {
    let chart = parse_yaml(&chart_dir().join("Chart.yaml"));
    assert_eq!(chart["apiVersion"].as_str(), Some("v2"));
    assert_eq!(chart["name"].as_str(), Some("compaction-proxy"));
    assert!(
        chart["version"].as_str().is_some(),
        "Chart.yaml needs a string version"
    );
}

#[test]
fn chart_app_version_matches_the_crate_version() {
    let chart = parse_yaml(&chart_dir().join("Chart.yaml"));
    assert_eq!(
        chart["appVersion"].as_str(),
        Some(env!("CARGO_PKG_VERSION")),
        "Chart.yaml appVersion is the default image tag and must follow Cargo.toml's version"
    );
}

#[test]
fn values_yaml_parses_as_a_mapping() {
    assert!(values().is_mapping(), "values.yaml must be a YAML mapping");
}

/// `.Values.config` as the chart's `compaction-proxy.toml` helper renders
/// it: scalars and lists of scalars as JSON (valid TOML for those), maps as
/// `[tables]`, lists of maps as `[[arrays of tables]]`, nulls left out.
fn toml_of(config: &Yaml) -> String {
    fn table(out: &mut String, path: &[String], value: &Yaml, array_item: bool) {
        let map = value.as_mapping().expect("a table");
        let is_table_array = |v: &Yaml| {
            v.as_sequence()
                .is_some_and(|s| s.first().is_some_and(Yaml::is_mapping))
        };
        let scalars: Vec<_> = map
            .iter()
            .filter(|(_, v)| !v.is_mapping() && !v.is_null() && !is_table_array(v))
            .collect();
        if !path.is_empty() && (array_item || !scalars.is_empty() || map.is_empty()) {
            let (open, close) = if array_item { ("[[", "]]") } else { ("[", "]") };
            out.push_str(&format!("{open}{}{close}\n", path.join(".")));
        }
        for (k, v) in scalars {
            let json = serde_json::to_string(&serde_json::to_value(v).unwrap()).unwrap();
            out.push_str(&format!("{} = {json}\n", k.as_str().unwrap()));
        }
        for (k, v) in map {
            let mut sub = path.to_vec();
            sub.push(k.as_str().unwrap().to_owned());
            if v.is_mapping() {
                table(out, &sub, v, false);
            } else if is_table_array(v) {
                for item in v.as_sequence().unwrap() {
                    table(out, &sub, item, true);
                }
            }
        }
    }
    let mut out = String::new();
    table(&mut out, &[], config, false);
    out
}

/// The configuration a pod runs: the rendered values (or nothing) over the
/// embedded default, with the listen address the Deployment sets.
fn effective(file: Option<&str>) -> compaction_proxy::policy::Runtime {
    let env = vec![(
        "COMPACTION_PROXY_SERVER__LISTEN".to_owned(),
        "0.0.0.0:8080".to_owned(),
    )];
    compaction_proxy::policy::Runtime::load_text(file, env, &Default::default())
        .unwrap_or_else(|e| panic!("{e}\n{}", file.unwrap_or("")))
}

#[test]
fn the_chart_renders_the_same_policies_routes_and_tenants_as_the_binary() {
    let rendered = toml_of(&values()["config"]);
    let chart = effective(Some(&rendered));
    let binary = effective(None);
    assert_eq!(
        chart.config.policies, binary.config.policies,
        "values.yaml's policies differ from the binary's:\n{rendered}"
    );
    let routes =
        |rt: &compaction_proxy::policy::Runtime| serde_json::to_value(&rt.config.routes).unwrap();
    assert_eq!(routes(&chart), routes(&binary), "{rendered}");
    assert_eq!(
        chart.config.tenants.header, binary.config.tenants.header,
        "{rendered}"
    );
    assert_eq!(chart.config.upstream.url, binary.config.upstream.url);
    // The comparison means something: the binary routes all three APIs.
    let formats: std::collections::BTreeSet<String> = binary
        .config
        .routes
        .iter()
        .map(|r| {
            r.format
                .unwrap_or_else(|| compaction_proxy::format::Format::for_path(&r.path))
                .as_str()
                .to_owned()
        })
        .collect();
    assert_eq!(formats.len(), 3, "{formats:?}");
}

#[test]
fn the_rendering_used_for_the_comparison_is_the_helpers() {
    let values: Yaml = serde_yaml::from_str(
        "server: {listen: '127.0.0.1:1'}\npolicies: {p: {budget_chars: 5, keep_roles: [system]}}\nroutes: [{path: /a, policy: p}]\ntenants: {policies: {}}",
    )
    .unwrap();
    let toml = toml_of(&values);
    assert!(
        toml.contains("[server]\nlisten = \"127.0.0.1:1\"\n"),
        "{toml}"
    );
    assert!(
        toml.contains("[policies.p]\nbudget_chars = 5\nkeep_roles = [\"system\"]\n"),
        "{toml}"
    );
    assert!(
        toml.contains("[[routes]]\npath = \"/a\"\npolicy = \"p\"\n"),
        "{toml}"
    );
    assert!(toml.contains("[tenants.policies]\n"), "{toml}");
    let rt = effective(Some(&toml));
    assert_eq!(rt.config.policies["p"].budget_chars, 5);
}

#[test]
fn the_chart_says_stable_mode_runs_and_what_left_out_keys_take() {
    for file in ["values.yaml", "README.md"] {
        let text = read(&chart_dir().join(file));
        for stale in [
            "reserved",
            "the engine's default",
            "OpenAI-style chat-completions",
        ] {
            assert!(!text.contains(stale), "{file} still says {stale:?}");
        }
    }
}

#[test]
fn chart_has_the_expected_templates() {
    let names: Vec<String> = templates().into_iter().map(|(name, _)| name).collect();
    for expected in [
        "_helpers.tpl",
        "deployment.yaml",
        "service.yaml",
        "configmap.yaml",
        "servicemonitor.yaml",
        "dashboard-configmap.yaml",
        "NOTES.txt",
    ] {
        assert!(
            names.iter().any(|n| n == expected),
            "templates/{expected} is missing (have {names:?})"
        );
    }
}

#[test]
fn every_values_path_used_in_templates_exists_in_values_yaml() {
    let values = values();
    let mut checked = 0;
    let mut problems = Vec::new();
    for (file, text) in templates() {
        for (line, path) in values_paths(&text) {
            checked += 1;
            if let Err(why) = check_values_path(&values, &path) {
                problems.push(format!(
                    "templates/{file}:{line}: .Values.{}: {why}",
                    path.join(".")
                ));
            }
        }
    }
    assert!(
        checked > 0,
        "found no .Values references at all; is the scanner broken?"
    );
    assert!(
        problems.is_empty(),
        "values missing from values.yaml:\n{}",
        problems.join("\n")
    );
}

#[test]
fn values_path_check_is_strict_except_below_empty_maps() {
    let values: Yaml =
        serde_yaml::from_str("image: {tag: \"\"}\npodAnnotations: {}\nextraEnv: []\nnothing:\n")
            .unwrap();
    let path = |s: &str| s.split('.').map(str::to_owned).collect::<Vec<_>>();
    assert!(check_values_path(&values, &path("image.tag")).is_ok());
    assert!(check_values_path(&values, &path("podAnnotations")).is_ok());
    assert!(check_values_path(&values, &path("podAnnotations.a.b")).is_ok());
    assert!(check_values_path(&values, &path("nope")).is_err());
    assert!(check_values_path(&values, &path("image.nope")).is_err());
    assert!(check_values_path(&values, &path("image.tag.x")).is_err());
    assert!(check_values_path(&values, &path("extraEnv.x")).is_err());
    assert!(check_values_path(&values, &path("nothing.x")).is_err());

    let found = values_paths("{{ .Values.a.b_c }} {{ $.Values.d }}\n{{ toYaml .Values.e. }}");
    assert_eq!(
        found,
        vec![(1, path("a.b_c")), (1, path("d")), (2, path("e")),]
    );
}

#[test]
fn template_delimiters_are_balanced() {
    let mut problems = Vec::new();
    for (file, text) in templates() {
        problems.extend(
            delimiter_problems(&text)
                .into_iter()
                .map(|p| format!("templates/{file}: {p}")),
        );
    }
    assert!(
        problems.is_empty(),
        "unbalanced template delimiters:\n{}",
        problems.join("\n")
    );
}

#[test]
fn delimiter_check_catches_stray_and_unclosed_actions() {
    assert!(delimiter_problems("a {{ x }} b {{- y -}}\n{{/* c */}}").is_empty());
    assert_eq!(delimiter_problems("{{ x }").len(), 1);
    assert_eq!(delimiter_problems("x }}").len(), 1);
    assert_eq!(delimiter_problems("{{ x {{ y }}").len(), 1);
}

#[test]
fn files_read_by_templates_exist_in_the_chart() {
    const NEEDLE: &str = ".Files.Get \"";
    let mut problems = Vec::new();
    for (file, text) in templates() {
        let mut rest = text.as_str();
        while let Some(pos) = rest.find(NEEDLE) {
            rest = &rest[pos + NEEDLE.len()..];
            let target = &rest[..rest.find('"').expect("closing quote")];
            if !chart_dir().join(target).is_file() {
                problems.push(format!("templates/{file} reads missing file {target}"));
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn dashboard_parses_as_json() {
    let dashboard = dashboard();
    assert_eq!(dashboard["schemaVersion"], 39);
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| !p.is_empty()),
        "dashboard has no panels"
    );
    let variables: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating.list")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for name in ["DS_PROMETHEUS", "route", "policy", "tenant"] {
        assert!(
            variables.contains(&name),
            "dashboard lacks template variable `{name}`"
        );
    }
}

#[test]
fn dashboard_queries_use_only_exported_metric_families() {
    let dashboard = dashboard();
    let mut queries = Vec::new();
    collect_queries(&dashboard, &mut queries);
    let mut seen = 0;
    let mut problems = Vec::new();
    for query in &queries {
        for name in metric_names(query) {
            seen += 1;
            if !is_exported_series(name) {
                problems.push(format!("`{name}` in `{query}`"));
            }
        }
    }
    assert!(
        seen > 0,
        "no compaction_proxy_ metric referenced by the dashboard; is the scanner broken?"
    );
    assert!(
        problems.is_empty(),
        "dashboard queries metrics the proxy does not export:\n{}",
        problems.join("\n")
    );
}

#[test]
fn metric_name_check_knows_histogram_series_from_counters() {
    assert_eq!(
        metric_names(
            "sum(rate(compaction_proxy_retained_ratio_bucket{a=\"b\"}[5m])) / x_compaction_proxy_y"
        ),
        vec!["compaction_proxy_retained_ratio_bucket"]
    );
    assert!(is_exported_series("compaction_proxy_requests_total"));
    assert!(is_exported_series("compaction_proxy_retained_ratio_sum"));
    assert!(!is_exported_series("compaction_proxy_retained_ratio"));
    assert!(!is_exported_series("compaction_proxy_requests_total_count"));
    assert!(!is_exported_series("compaction_proxy_requests"));
}

#[test]
fn dashboard_has_a_bill_row_over_every_billing_metric() {
    let dashboard = dashboard();
    let panels = dashboard["panels"].as_array().expect("panels");
    let row = panels
        .iter()
        .position(|p| p["type"] == "row" && p["title"] == "Bill")
        .expect("a row titled Bill");
    // The row's panels: those after it, up to the next row.
    let in_row: Vec<&Json> = panels[row + 1..]
        .iter()
        .take_while(|p| p["type"] != "row")
        .collect();
    let mut queries = Vec::new();
    for panel in &in_row {
        collect_queries(panel, &mut queries);
    }
    let names: Vec<&str> = queries.iter().flat_map(|q| metric_names(q)).collect();
    for family in [
        "compaction_proxy_billed_input_tokens_total",
        "compaction_proxy_billed_output_tokens_total",
        "compaction_proxy_billed_cost_total",
        "compaction_proxy_estimated_saved_cost_total",
        "compaction_proxy_estimated_extra_cost_total",
    ] {
        assert!(FAMILIES.contains(&family), "{family} is not exported");
        assert!(
            names.contains(&family),
            "the Bill row never queries {family}"
        );
    }
    let by = |label: &str| queries.iter().any(|q| q.contains(&format!("by ({label})")));
    assert!(by("kind") && by("policy") && by("tenant"), "{queries:#?}");
    assert!(
        queries
            .iter()
            .any(|q| q.contains("kind=\"cache_read\"") && q.contains(" / ")),
        "no cache hit ratio: {queries:#?}"
    );
}
