//! `GET /metrics` scraped after real requests through the in-process proxy:
//! the counters move by exactly what the loss headers reported, labels stay
//! bounded, the exposition is valid Prometheus text, and the exported
//! families are the ones the library and the dashboard name.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::support::*;
use bytes::Bytes;
use compaction_proxy::metrics::FAMILIES;
use http::Request;
use http_body_util::Full;
use serde_json::json;

const ROUTE: &str = "/v1/chat/completions";

const CONFIG: &str = r#"
[policies.default]
mode = "exact"
budget_chars = 400
keep_last_n = 1
pin_first_user = false
max_message_chars = 100

[policies.small]
mode = "exact"
budget_chars = 100
budget_tokens = 50              # exercises the token families
keep_last_n = 1
pin_first_user = false

[policies.steady]
budget_chars = 400
keep_last_n = 1
pin_first_user = false
mode = "stable"                 # exercises the checkpoint and rebase families

[tenants.policies]
acme = "small"
steady = "steady"

[prices."gpt-4o"]               # exercises the cost and estimate families
uncached = 2.5
cache_read = 1.25
output = 10
"#;

// ---------------------------------------------------------------------------
// A strict reader of the Prometheus text exposition format (0.0.4).
// ---------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

#[derive(Debug, Default)]
struct Exposition {
    samples: Vec<Sample>,
    /// Family name -> declared type.
    types: BTreeMap<String, String>,
}

impl Exposition {
    /// The value of the sample with exactly this name and label set.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.samples
            .iter()
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// Like [`Self::get`], a series never touched counting as 0.
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).unwrap_or(0.0)
    }

    fn label_values(&self, label: &str) -> BTreeSet<String> {
        self.samples
            .iter()
            .filter_map(|s| s.labels.get(label).cloned())
            .collect()
    }
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn parse_value(text: &str) -> Result<f64, String> {
    match text {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => text
            .parse::<f64>()
            .map_err(|e| format!("bad value {text:?}: {e}")),
    }
}

/// Parses `name{l="v",...} value [timestamp]`.
fn parse_sample(line: &str) -> Result<Sample, String> {
    let name_end = line.find(['{', ' ']).ok_or("no value")?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err(format!("bad metric name {name:?}"));
    }
    let mut labels = BTreeMap::new();
    let mut rest = &line[name_end..];
    if let Some(after) = rest.strip_prefix('{') {
        let mut chars = after.char_indices().peekable();
        loop {
            // label name or the closing brace
            let start = match chars.peek() {
                Some(&(_, '}')) => {
                    let (i, _) = chars.next().unwrap();
                    rest = &after[i + 1..];
                    break;
                }
                Some(&(i, _)) => i,
                None => return Err("unterminated label set".into()),
            };
            let eq = after[start..].find('=').ok_or("label without =")? + start;
            let label = &after[start..eq];
            if !is_label_name(label) {
                return Err(format!("bad label name {label:?}"));
            }
            while chars.peek().is_some_and(|&(i, _)| i < eq) {
                chars.next();
            }
            chars.next(); // '='
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err(format!("label {label} value is not quoted"));
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '"')) => break,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, '\\')) => value.push('\\'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, 'n')) => value.push('\n'),
                        other => return Err(format!("bad escape {other:?}")),
                    },
                    Some((_, '\n')) => return Err("raw newline in label value".into()),
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated label value".into()),
                }
            }
            if labels.insert(label.to_owned(), value).is_some() {
                return Err(format!("label {label} repeated"));
            }
            match chars.next() {
                Some((_, ',')) => {}
                Some((i, '}')) => {
                    rest = &after[i + 1..];
                    break;
                }
                other => return Err(format!("expected , or }} after a label, got {other:?}")),
            }
        }
    }
    let rest = rest.strip_prefix(' ').ok_or("no space before the value")?;
    let mut fields = rest.split(' ');
    let value = parse_value(fields.next().ok_or("no value")?)?;
    if let Some(ts) = fields.next() {
        ts.parse::<i64>()
            .map_err(|e| format!("bad timestamp {ts:?}: {e}"))?;
    }
    if fields.next().is_some() {
        return Err("trailing fields".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

/// The family a sample belongs to, given the declared types.
fn family_of<'a>(name: &'a str, types: &BTreeMap<String, String>) -> &'a str {
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if types
                .get(base)
                .is_some_and(|t| t == "histogram" || t == "summary")
            {
                return base;
            }
        }
    }
    name
}

/// Parses the whole exposition, failing on anything the format forbids.
fn parse_exposition(text: &str) -> Result<Exposition, String> {
    let mut exp = Exposition::default();
    let mut helped = BTreeSet::new();
    // The family whose block is open, those closed, and those with samples.
    let mut current: Option<String> = None;
    let mut closed = BTreeSet::new();
    let mut sampled = BTreeSet::new();
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the exposition does not end with a newline".into());
    }
    for (n, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut parts = comment.trim_start().splitn(3, ' ');
            let (keyword, name, rest) = (parts.next(), parts.next(), parts.next());
            if !matches!(keyword, Some("HELP" | "TYPE")) {
                continue; // a plain comment
            }
            let name = name
                .filter(|n| is_metric_name(n))
                .ok_or_else(|| at("bad metric name".into()))?;
            if closed.contains(name) || sampled.contains(name) {
                return Err(at("HELP/TYPE after the family's samples".into()));
            }
            if current.as_deref() != Some(name) {
                if let Some(done) = current.replace(name.to_owned()) {
                    closed.insert(done);
                }
            }
            if keyword == Some("HELP") {
                if !helped.insert(name.to_owned()) {
                    return Err(at("second HELP for the family".into()));
                }
            } else {
                let kind = rest.ok_or_else(|| at("TYPE without a type".into()))?;
                if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                    return Err(at(format!("unknown type {kind}")));
                }
                if exp.types.insert(name.to_owned(), kind.to_owned()).is_some() {
                    return Err(at("second TYPE for the family".into()));
                }
            }
            continue;
        }
        let sample = parse_sample(line).map_err(at)?;
        let family = family_of(&sample.name, &exp.types).to_owned();
        if !exp.types.contains_key(&family) || !helped.contains(&family) {
            return Err(at(format!("sample of {family} before its HELP and TYPE")));
        }
        if current.as_deref() != Some(family.as_str()) {
            return Err(at(format!("sample of {family} outside its family's block")));
        }
        if exp.types[&family] == "counter" && !(sample.value >= 0.0 && sample.value.is_finite()) {
            return Err(at("a counter must be finite and non-negative".into()));
        }
        if exp
            .samples
            .iter()
            .any(|s| s.name == sample.name && s.labels == sample.labels)
        {
            return Err(at("duplicate series".into()));
        }
        sampled.insert(family);
        exp.samples.push(sample);
    }
    check_histograms(&exp)?;
    Ok(exp)
}

/// Every histogram series: `le` on each bucket, bounds increasing, counts
/// cumulative, a `+Inf` bucket equal to `_count`, and a `_sum`.
fn check_histograms(exp: &Exposition) -> Result<(), String> {
    for (family, kind) in &exp.types {
        if kind != "histogram" {
            continue;
        }
        let mut series: BTreeMap<BTreeMap<String, String>, Vec<(f64, f64)>> = BTreeMap::new();
        for s in exp
            .samples
            .iter()
            .filter(|s| s.name == format!("{family}_bucket"))
        {
            let le = s
                .labels
                .get("le")
                .ok_or_else(|| format!("{family}_bucket without le: {s:?}"))?;
            let le = parse_value(le)?;
            let mut rest = s.labels.clone();
            rest.remove("le");
            series.entry(rest).or_default().push((le, s.value));
        }
        if exp.samples.iter().any(|s| s.name == *family) {
            return Err(format!("histogram {family} has a bare sample"));
        }
        for (labels, buckets) in &series {
            for pair in buckets.windows(2) {
                if pair[0].0.partial_cmp(&pair[1].0) != Some(std::cmp::Ordering::Less) {
                    return Err(format!(
                        "{family}{labels:?}: le bounds not increasing: {buckets:?}"
                    ));
                }
                if pair[0].1 > pair[1].1 {
                    return Err(format!(
                        "{family}{labels:?}: buckets not cumulative: {buckets:?}"
                    ));
                }
            }
            let last = buckets.last().unwrap();
            if last.0 != f64::INFINITY {
                return Err(format!("{family}{labels:?}: no +Inf bucket"));
            }
            let find = |suffix: &str| {
                exp.samples
                    .iter()
                    .find(|s| s.name == format!("{family}{suffix}") && s.labels == *labels)
                    .map(|s| s.value)
            };
            let count = find("_count").ok_or_else(|| format!("{family}{labels:?}: no _count"))?;
            if count != last.1 {
                return Err(format!(
                    "{family}{labels:?}: +Inf bucket {} != _count {count}",
                    last.1
                ));
            }
            find("_sum").ok_or_else(|| format!("{family}{labels:?}: no _sum"))?;
        }
        // Every _count/_sum series has buckets.
        for s in exp
            .samples
            .iter()
            .filter(|s| s.name == format!("{family}_count"))
        {
            if !series.contains_key(&s.labels) {
                return Err(format!("{family}_count{:?} has no buckets", s.labels));
            }
        }
    }
    Ok(())
}

#[test]
fn the_parser_itself_rejects_what_the_format_forbids() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n";
    assert!(parse_exposition(ok).is_ok());
    for bad in [
        "a_total 1\n",                                                              // no HELP/TYPE
        "# HELP a_total A.\n# TYPE a_total counter\n1a 2\n",                        // bad name
        "# HELP a_total A.\n# TYPE a_total counter\na_total{x=1} 2\n",              // unquoted
        "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"}\n",            // no value
        "# HELP h A.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "# HELP h A.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", // no +Inf
        "# HELP h A.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 2\n",
        "# HELP h A.\n# TYPE h histogram\nh_bucket{x=\"1\"} 1\nh_sum 1\nh_count 1\n", // no le
    ] {
        assert!(parse_exposition(bad).is_err(), "accepted: {bad}");
    }
}

// ---------------------------------------------------------------------------
// Requests and scraping.
// ---------------------------------------------------------------------------

fn words(seed: &str, n: usize) -> String {
    (0..n)
        .map(|i| format!("{seed}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A conversation well over the default policy's 400-char budget.
fn big_chat() -> String {
    json!({"model": "m", "temperature": 0.5, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": words("alpha", 30)},
        {"role": "assistant", "content": words("bravo", 30)},
        {"role": "user", "content": words("charlie", 30)},
        {"role": "assistant", "content": words("delta", 30)},
        {"role": "user", "content": "What now?"},
    ]})
    .to_string()
}

fn request(path: &str, tenant: Option<&str>, body: impl Into<Bytes>) -> Request<Full<Bytes>> {
    let mut r = post_json(path, body);
    if let Some(t) = tenant {
        r.headers_mut().insert("x-tenant-id", t.parse().unwrap());
    }
    r
}

async fn scrape(proxy: &TestProxy) -> (String, Exposition) {
    let answer = send(
        Request::get(proxy.url("/metrics"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    assert_eq!(answer.status, 200);
    let content_type = answer.header("content-type").unwrap_or_default().to_owned();
    assert!(content_type.starts_with("text/plain"), "{content_type}");
    let text = String::from_utf8(answer.body.to_vec()).expect("UTF-8 exposition");
    let exp = parse_exposition(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    (text, exp)
}

fn header_num(answer: &Answer, name: &str) -> f64 {
    answer
        .header(name)
        .unwrap_or_else(|| panic!("missing {name}"))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Sums of the loss headers for one (route, policy, tenant) label set.
#[derive(Debug, Default)]
struct Expected {
    input_chars: f64,
    output_chars: f64,
    dropped: f64,
    trimmed: f64,
    budget_missed: f64,
    ratio_count: f64,
    ratio_sum: f64,
    statuses: HashMap<String, f64>,
}

#[tokio::test]
async fn counters_move_by_exactly_what_the_loss_headers_reported() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(CONFIG, &upstream.url()).await;
    let url = proxy.url(ROUTE);

    let small_chat = json!({"model": "m", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]})
    .to_string();
    let tenant_chat = json!({"model": "m", "messages": [
        {"role": "user", "content": words("echo", 20)},
        {"role": "assistant", "content": words("foxtrot", 20)},
        {"role": "user", "content": words("golf", 25)},
    ]})
    .to_string();

    let cases: Vec<(Option<&str>, String, &str)> = vec![
        (None, big_chat(), "compacted"),
        (None, small_chat, "unchanged"),
        (
            None,
            "{\"model\": \"m\", \"messages\": [".to_owned(),
            "skipped",
        ),
        (Some("acme"), tenant_chat, "compacted"),
        (None, big_chat(), "compacted"), // identical to the first: a cache hit
    ];
    let mut expected: BTreeMap<(String, String), Expected> = BTreeMap::new();
    for (tenant, body, status) in &cases {
        let answer = send(request(&url, *tenant, body.clone())).await; // reads the body to its end
        assert_eq!(answer.status, 200);
        let header_status = answer.header("x-compaction-status").unwrap().to_owned();
        assert_eq!(
            header_status.split(';').next().unwrap(),
            *status,
            "{header_status}"
        );
        let policy = answer.header("x-compaction-policy").unwrap().to_owned();
        let tenant_label = tenant.unwrap_or("other").to_owned();
        assert_eq!(policy, if tenant.is_some() { "small" } else { "default" });
        let e = expected.entry((policy, tenant_label)).or_default();
        *e.statuses.entry(status.to_string()).or_default() += 1.0;
        if *status == "skipped" {
            assert!(answer.header("x-compaction-input-chars").is_none());
            continue;
        }
        e.input_chars += header_num(&answer, "x-compaction-input-chars");
        e.output_chars += header_num(&answer, "x-compaction-output-chars");
        e.dropped += header_num(&answer, "x-compaction-dropped-messages");
        e.trimmed += header_num(&answer, "x-compaction-trimmed-messages");
        // The ratio histogram observes compacted requests only.
        if *status == "compacted" {
            e.ratio_count += 1.0;
            e.ratio_sum += header_num(&answer, "x-compaction-retained-ratio");
        }
        match answer.header("x-compaction-budget-met") {
            Some("true") => {}
            Some("false") => e.budget_missed += 1.0,
            other => panic!("x-compaction-budget-met: {other:?}"),
        }
    }
    // The cases exercise every counter.
    let total = |f: fn(&Expected) -> f64| expected.values().map(f).sum::<f64>();
    assert!(
        total(|e| e.dropped) > 0.0 && total(|e| e.trimmed) > 0.0,
        "{expected:?}"
    );
    assert_eq!(
        total(|e| e.budget_missed),
        1.0,
        "the tenant's last message exceeds its budget: {expected:?}"
    );

    let (text, exp) = scrape(&proxy).await;
    for ((policy, tenant), e) in &expected {
        let labels = [
            ("route", ROUTE),
            ("policy", policy.as_str()),
            ("tenant", tenant.as_str()),
        ];
        let check = |name: &str, want: f64| {
            let got = exp.value(&format!("compaction_proxy_{name}"), &labels);
            assert_eq!(got, want, "{name}{labels:?}\n{text}");
        };
        check("input_chars_total", e.input_chars);
        check("output_chars_total", e.output_chars);
        check("dropped_messages_total", e.dropped);
        check("trimmed_messages_total", e.trimmed);
        check("budget_missed_total", e.budget_missed);
        check("retained_ratio_count", e.ratio_count);
        let sum = exp.value("compaction_proxy_retained_ratio_sum", &labels);
        assert!(
            (sum - e.ratio_sum).abs() < 1e-9,
            "retained_ratio_sum {sum} != {}",
            e.ratio_sum
        );
        for status in ["compacted", "unchanged", "skipped", "bypassed", "dry-run"] {
            let want = e.statuses.get(status).copied().unwrap_or(0.0);
            let mut with_status = labels.to_vec();
            with_status.push(("status", status));
            // The route is chat completions' own.
            with_status.push(("format", "chat"));
            // The mock answers 200, passed on to the client.
            with_status.push(("code_class", "2xx"));
            let got = exp.value("compaction_proxy_requests_total", &with_status);
            assert_eq!(got, want, "requests_total{with_status:?}\n{text}");
        }
    }
    // Label sets no request had stay untouched.
    let no_series = exp
        .samples
        .iter()
        .filter(|s| s.name == "compaction_proxy_input_chars_total")
        .count();
    assert_eq!(no_series, expected.len(), "{text}");

    let code = [("route", ROUTE), ("code", "200")];
    assert_eq!(
        exp.value("compaction_proxy_upstream_responses_total", &code),
        cases.len() as f64,
        "{text}"
    );
    assert_eq!(
        exp.value(
            "compaction_proxy_upstream_duration_seconds_count",
            &[("route", ROUTE)]
        ),
        cases.len() as f64
    );
    // The engine ran (or was answered from the cache) for every parsable body.
    let durations = |policy| {
        exp.value(
            "compaction_proxy_compaction_duration_seconds_count",
            &[("route", ROUTE), ("policy", policy)],
        )
    };
    assert_eq!(
        (durations("default"), durations("small")),
        (3.0, 1.0),
        "{text}"
    );
    let cache = |name: &str, policy: &str| {
        exp.value(
            &format!("compaction_proxy_cache_{name}_total"),
            &[("policy", policy)],
        )
    };
    assert_eq!(
        cache("hits", "default"),
        1.0,
        "the repeated body is a cache hit\n{text}"
    );
    assert_eq!(cache("misses", "default"), 2.0, "{text}");
    assert_eq!(
        (cache("hits", "small"), cache("misses", "small")),
        (0.0, 1.0),
        "{text}"
    );

    // One more identical request: exactly one more hit, nothing else recomputed.
    send(request(&url, None, big_chat())).await;
    let (text, exp) = scrape(&proxy).await;
    assert_eq!(
        exp.value(
            "compaction_proxy_cache_hits_total",
            &[("policy", "default")]
        ),
        2.0,
        "{text}"
    );
    assert_eq!(
        exp.value(
            "compaction_proxy_cache_misses_total",
            &[("policy", "default")]
        ),
        2.0,
        "{text}"
    );
}

#[tokio::test]
async fn labels_are_bounded_unknown_tenants_are_other_and_queries_never_appear() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start(CONFIG, &upstream.url()).await;
    let raw_tenant = "some-random-id-123";
    let secret_query = "api_key=sk-query-secret-4242&user=bob";

    let answer = send(request(
        &proxy.url(&format!("{ROUTE}?{secret_query}")),
        Some(raw_tenant),
        big_chat(),
    ))
    .await;
    assert_eq!(answer.status, 200);
    assert_eq!(
        answer.header("x-compaction-policy"),
        Some("default"),
        "an unknown tenant gets the route's policy"
    );
    assert_eq!(
        upstream.last().uri.query(),
        Some(secret_query),
        "the query is still forwarded"
    );
    // An unmatched path with a query, and a tenant header.
    let mut unmatched = Request::get(proxy.url(&format!("/v1/models/{raw_tenant}?{secret_query}")))
        .body(Full::new(Bytes::new()))
        .unwrap();
    unmatched
        .headers_mut()
        .insert("x-tenant-id", raw_tenant.parse().unwrap());
    assert_eq!(send(unmatched).await.status, 200);

    let (text, exp) = scrape(&proxy).await;
    let labels = [
        ("route", ROUTE),
        ("policy", "default"),
        ("tenant", "other"),
        ("status", "compacted"),
        ("format", "chat"),
        ("code_class", "2xx"),
    ];
    assert_eq!(
        exp.value("compaction_proxy_requests_total", &labels),
        1.0,
        "{text}"
    );
    assert_eq!(
        exp.value(
            "compaction_proxy_upstream_responses_total",
            &[("route", "unmatched"), ("code", "200")]
        ),
        1.0,
        "{text}"
    );
    for line in text.lines() {
        assert!(!line.contains(raw_tenant), "raw tenant value in: {line}");
        assert!(!line.contains("sk-query-secret"), "query value in: {line}");
        assert!(
            !line.contains("api_key") && !line.contains('?'),
            "query string in: {line}"
        );
        assert!(
            !line.contains("/v1/models"),
            "unmatched path as a label in: {line}"
        );
    }
    let tenants = exp.label_values("tenant");
    assert!(
        tenants.iter().all(|t| t == "other" || t == "acme"),
        "{tenants:?}"
    );
    let routes = exp.label_values("route");
    assert!(
        routes.iter().all(|r| r == ROUTE || r == "unmatched"),
        "{routes:?}"
    );
    let policies = exp.label_values("policy");
    assert!(
        policies.iter().all(|p| p == "default" || p == "small"),
        "{policies:?}"
    );
}

/// Requests that touch every family: compaction (miss and hit), upstream
/// answers, a tenant, an unmatched path.
async fn exercise_every_family() -> (TestProxy, MockUpstream) {
    // An answer that reports usage, for the billing families.
    let answer = json!({
        "id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-2024-08-06",
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok"}}],
        "usage": {"prompt_tokens": 120, "completion_tokens": 5, "total_tokens": 125,
                  "prompt_tokens_details": {"cached_tokens": 20}},
    });
    let upstream = MockUpstream::start(Behavior::Json(200, answer)).await;
    let proxy = TestProxy::start(CONFIG, &upstream.url()).await;
    let url = proxy.url(ROUTE);
    send(request(&url, None, big_chat())).await;
    send(request(&url, None, big_chat())).await;
    send(request(&url, Some("acme"), big_chat())).await;
    // Two turns of one conversation in stable mode: a checkpoint miss, then
    // a hit whose new messages re-compact.
    let mut chat: serde_json::Value = serde_json::from_str(&big_chat()).unwrap();
    send(request(&url, Some("steady"), chat.to_string())).await;
    let messages = chat["messages"].as_array_mut().unwrap();
    messages.push(json!({"role": "assistant", "content": words("echo", 30)}));
    messages.push(json!({"role": "user", "content": words("foxtrot", 30)}));
    let answer = send(request(&url, Some("steady"), chat.to_string())).await;
    assert_eq!(answer.header("x-compaction-rebased"), Some("true"));
    send(request(&url, None, "not json")).await;
    upstream.set_behavior(Behavior::Json(429, json!({"error": "slow down"})));
    send(request(&url, None, big_chat())).await;
    // A body declared past max_body_bytes, refused unread (refused_total).
    {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        tcp.write_all(
            format!("POST {ROUTE} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 999999999\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut head = [0u8; 12];
        tcp.read_exact(&mut head).await.unwrap();
        assert_eq!(&head, b"HTTP/1.1 413");
    }
    // An upstream that fails before answering (upstream_failures_total).
    upstream.set_behavior(Behavior::FailStream);
    send(request(&url, None, big_chat())).await;
    upstream.set_behavior(Behavior::Json(429, json!({"error": "slow down"})));
    send(
        Request::get(proxy.url("/v1/models"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await;
    (proxy, upstream)
}

#[tokio::test]
async fn the_exposition_is_valid_prometheus_text() {
    let (proxy, _upstream) = exercise_every_family().await;
    let (text, exp) = scrape(&proxy).await;
    assert!(!exp.samples.is_empty());
    let histograms: Vec<_> = exp
        .types
        .iter()
        .filter(|(_, t)| *t == "histogram")
        .collect();
    assert_eq!(histograms.len(), 4, "{:?}", exp.types);
    for (name, kind) in &exp.types {
        if name.starts_with("process_") {
            continue; // the process collector's families
        }
        assert!(name.starts_with("compaction_proxy_"), "{name}");
        if kind == "counter" {
            assert!(
                name.ends_with("_total"),
                "counter {name} must end in _total"
            );
        }
    }
    promtool_check(&text);
}

/// `promtool check metrics` on the exposition, when promtool is installed
/// (CI installs it and sets `REQUIRE_PROMTOOL=1`).
fn promtool_check(text: &str) {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let Ok(mut child) = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    else {
        assert!(
            std::env::var_os("REQUIRE_PROMTOOL").is_none(),
            "promtool is required here (Debian package prometheus)"
        );
        // Past libtest's capture, so the skip shows among the results.
        let _ = writeln!(
            std::io::stderr(),
            "skipped: promtool is not installed: the exposition was checked with the parser only (REQUIRE_PROMTOOL=1 makes this a failure)"
        );
        return;
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}\n{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn exposed_families_are_exactly_the_library_families() {
    let (proxy, _upstream) = exercise_every_family().await;
    let (text, exp) = scrape(&proxy).await;
    let exposed: BTreeSet<&str> = exp
        .types
        .keys()
        .map(String::as_str)
        .filter(|name| !name.starts_with("process_"))
        .collect();
    let declared: BTreeSet<&str> = FAMILIES.iter().copied().collect();
    assert_eq!(declared.len(), FAMILIES.len(), "FAMILIES has duplicates");
    assert_eq!(exposed, declared, "\n{text}");
    // Every sample belongs to a declared family.
    for s in exp
        .samples
        .iter()
        .filter(|s| !s.name.starts_with("process_"))
    {
        assert!(
            declared.contains(family_of(&s.name, &exp.types)),
            "{}",
            s.name
        );
    }
}

/// `compaction_proxy_*` names in a string, not preceded by a name character.
fn metric_names(text: &str) -> Vec<String> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut names = Vec::new();
    let mut from = 0;
    while let Some(pos) = text[from..].find("compaction_proxy_") {
        let start = from + pos;
        let len = text[start..]
            .find(|c: char| !is_name(c))
            .unwrap_or(text.len() - start);
        if !text[..start].chars().next_back().is_some_and(is_name) {
            names.push(text[start..start + len].to_owned());
        }
        from = start + len;
    }
    names
}

fn strings(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::String(s) => out.push(s.clone()),
        serde_json::Value::Array(items) => items.iter().for_each(|v| strings(v, out)),
        serde_json::Value::Object(map) => map.values().for_each(|v| strings(v, out)),
        _ => {}
    }
}

#[tokio::test]
async fn the_dashboard_references_only_exported_families() {
    let (proxy, _upstream) = exercise_every_family().await;
    let (_, exp) = scrape(&proxy).await;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("charts/compaction-proxy/dashboards/compaction-proxy.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut all = Vec::new();
    strings(&dashboard, &mut all);
    let referenced: BTreeSet<String> = all.iter().flat_map(|s| metric_names(s)).collect();
    assert!(
        referenced.len() >= 5,
        "the scan found almost nothing: {referenced:?}"
    );
    let exported = |name: &str| {
        FAMILIES.contains(&name)
            || ["_bucket", "_sum", "_count"].iter().any(|suffix| {
                name.strip_suffix(suffix).is_some_and(|base| {
                    FAMILIES.contains(&base)
                        && exp.types.get(base).is_some_and(|t| t == "histogram")
                })
            })
    };
    let unknown: Vec<&String> = referenced.iter().filter(|n| !exported(n)).collect();
    assert!(
        unknown.is_empty(),
        "the dashboard queries metrics the proxy does not export: {unknown:?}"
    );
    // A histogram is only queried through its series, never by its bare name.
    for name in &referenced {
        if exp
            .types
            .get(name.as_str())
            .is_some_and(|t| t == "histogram")
        {
            panic!("the dashboard queries histogram {name} by its bare name");
        }
    }
}

/// With the shipped defaults the prefix cache is on, and its counters say
/// what it did: the first large turn of a conversation parses whole (a
/// miss), the next, which appends to it, resumes (a hit); a small body is
/// neither.
#[tokio::test]
async fn the_prefix_cache_counts_its_hits_and_misses_with_the_shipped_defaults() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let url = proxy.url(ROUTE);
    let counts = |exp: &Exposition| {
        (
            exp.get("compaction_proxy_prefix_cache_hits_total", &[]),
            exp.get("compaction_proxy_prefix_cache_misses_total", &[]),
        )
    };
    assert_eq!(counts(&scrape(&proxy).await.1), (Some(0.0), Some(0.0)));
    send(request(&url, None, big_chat())).await;
    assert_eq!(
        counts(&scrape(&proxy).await.1),
        (Some(0.0), Some(0.0)),
        "small: not counted"
    );
    // Over the 32 KiB a parse is kept from.
    let mut messages = vec![
        json!({"role": "system", "content": "Be brief."}),
        json!({"role": "user", "content": words("alpha", 8000)}),
    ];
    for turn in 0..2 {
        messages.push(json!({"role": "assistant", "content": words("bravo", 20 + turn)}));
        messages.push(json!({"role": "user", "content": words("charlie", 20 + turn)}));
        let body = json!({"model": "m", "messages": messages}).to_string();
        assert!(body.len() > 32 * 1024);
        let answer = send(request(&url, None, body)).await;
        assert_eq!(answer.status, 200);
    }
    assert_eq!(counts(&scrape(&proxy).await.1), (Some(1.0), Some(1.0)));
}

/// With the shipped defaults, a turn that replaces the previous turn's
/// last user message (a new question on the same history) resumes the
/// previous turn's parse from before that message (a hit), and forwards
/// what a fresh proxy, which parses it whole, forwards: the new question,
/// not the bytes the previous turn's splice wrote in its place.
#[tokio::test]
async fn a_replaced_last_question_resumes_and_forwards_what_a_fresh_proxy_forwards() {
    let upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let proxy = TestProxy::start("", &upstream.url()).await;
    let hits = |exp: &Exposition| exp.get("compaction_proxy_prefix_cache_hits_total", &[]);
    // Past the default budget of 200,000 chars: compacted, and the splice
    // kept for the next turn.
    let mut messages = vec![json!({"role": "system", "content": "Be brief."})];
    for turn in 0..12 {
        messages.push(json!({"role": "user", "content": words(&format!("ask{turn}-"), 3000)}));
        messages.push(json!({"role": "assistant", "content": words(&format!("say{turn}-"), 1000)}));
    }
    let turn = |question: &str| {
        let mut messages = messages.clone();
        messages.push(json!({"role": "user", "content": question}));
        json!({"model": "m", "messages": messages}).to_string()
    };
    let first = turn("What is the first step?");
    let answer = send(request(&proxy.url(ROUTE), None, first.clone())).await;
    assert_eq!(answer.header("x-compaction-status"), Some("compacted"));
    assert_eq!(hits(&scrape(&proxy).await.1), Some(0.0));
    // The same length as the first question, one word changed.
    let second = turn("What is the other step?");
    let answer = send(request(&proxy.url(ROUTE), None, second.clone())).await;
    assert_eq!(answer.status, 200);
    assert_eq!(hits(&scrape(&proxy).await.1), Some(1.0), "resumed");
    let forwarded = upstream.last().body;
    assert!(String::from_utf8_lossy(&forwarded).contains("the other step"));

    let fresh_upstream = MockUpstream::start(Behavior::Json(200, json!({"ok": true}))).await;
    let fresh = TestProxy::start("", &fresh_upstream.url()).await;
    send(request(&fresh.url(ROUTE), None, second)).await;
    assert_eq!(hits(&scrape(&fresh).await.1), Some(0.0));
    assert_eq!(forwarded, fresh_upstream.last().body);
}
