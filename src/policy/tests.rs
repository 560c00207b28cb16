use super::*;
use crate::config::{self, ConfigErrors, Mode, Overrides};

fn runtime(toml: &str) -> Result<Runtime, ConfigErrors> {
    let value: serde_json::Value =
        figment::Figment::from(figment::providers::Serialized::defaults(
            serde_json::to_value(config::load(None, Vec::new(), &Overrides::default()).unwrap())
                .unwrap(),
        ))
        .merge(<figment::providers::Toml as figment::providers::Format>::string(toml))
        .extract()
        .unwrap();
    Runtime::new(config::from_value(&value)?)
}

#[test]
fn tenant_policy_overrides_the_route_policy() {
    let rt = runtime("[policies.small]\nbudget_chars = 10\n[tenants.policies]\nacme = \"small\"")
        .unwrap();
    let mut headers = HeaderMap::new();
    let r = rt.resolve("/v1/chat/completions", &headers).unwrap();
    assert_eq!((&*r.policy.name, &*r.tenant), ("default", OTHER_TENANT));
    headers.insert("x-tenant-id", "acme".parse().unwrap());
    let r = rt.resolve("/v1/chat/completions", &headers).unwrap();
    assert_eq!((&*r.policy.name, &*r.tenant), ("small", "acme"));
    headers.insert("x-tenant-id", "unknown-co".parse().unwrap());
    let r = rt.resolve("/v1/chat/completions", &headers).unwrap();
    assert_eq!((&*r.policy.name, &*r.tenant), ("default", OTHER_TENANT));
}

#[test]
fn tenant_values_match_exactly_and_case_sensitively() {
    // Tenant ids are opaque keys (often from an auth layer): folding
    // case could merge two tenants, so `Acme` is not `acme`. The header
    // name, like every HTTP header name, matches in any case.
    let rt = runtime("[policies.small]\nbudget_chars = 10\n[tenants.policies]\nacme = \"small\"")
        .unwrap();
    let tenant_of = |value: &str| {
        let mut headers = HeaderMap::new();
        headers.insert("X-Tenant-Id", value.parse().unwrap());
        rt.resolve("/v1/chat/completions", &headers)
            .unwrap()
            .tenant
            .to_string()
    };
    assert_eq!(tenant_of("acme"), "acme");
    assert_eq!(tenant_of("ACME"), OTHER_TENANT);
    assert_eq!(tenant_of("Acme"), OTHER_TENANT);
}

#[test]
fn unmatched_paths_resolve_to_nothing() {
    let rt = runtime("").unwrap();
    assert!(rt.resolve("/v1/models", &HeaderMap::new()).is_none());
    assert!(rt
        .resolve("/v1/chat/completions/x", &HeaderMap::new())
        .is_none());
}

#[test]
fn first_matching_route_wins_and_prefixes_match() {
    let rt = runtime(
        "[policies.a]\nbudget_chars = 1\n[[routes]]\npath = \"/v1/chat/completions\"\npolicy = \"a\"\n[[routes]]\npath = \"/v1/*\"\npolicy = \"default\"",
    )
    .unwrap();
    assert_eq!(
        &*rt.resolve("/v1/chat/completions", &HeaderMap::new())
            .unwrap()
            .policy
            .name,
        "a"
    );
    let r = rt.resolve("/v1/other", &HeaderMap::new()).unwrap();
    assert_eq!((&*r.policy.name, &*r.route), ("default", "/v1/*"));
}

#[test]
fn every_semantic_problem_is_reported() {
    let err = runtime(
        "[server]\nlisten = \"nowhere\"\n[upstream]\nurl = \"ftp://x\"\n[policies.bad]\nbudget_chars = 0\nduplicate_threshold = 1.5\npin_patterns = [\"(\"]\n[[routes]]\npath = \"v1\"\npolicy = \"missing\"\n[tenants.policies]\nacme = \"ghost\"",
    )
    .unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "server.listen",
            "upstream.url",
            "policies.bad.budget_chars",
            "policies.bad.duplicate_threshold",
            "policies.bad.pin_patterns[0]",
            "routes[0].path",
            "routes[0].policy",
            "tenants.policies.acme",
        ],
        "{err}"
    );
}

#[test]
fn a_worker_count_beyond_any_machine_is_a_problem() {
    assert!(runtime("[server]\nworkers = 4").is_ok());
    let err = runtime("[server]\nworkers = 100000").unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(paths, ["server.workers"], "{err}");
}

#[test]
fn auto_budget_keys_are_checked_and_compiled() {
    let rt = runtime(
        "[policies.default]\nbudget = \"auto\"\nreserve_tokens = 1000\n[policies.default.context_windows]\n\"my-model\" = 32768",
    )
    .unwrap();
    let policy = rt.policy("default").unwrap();
    let auto = policy.auto_budget.as_ref().expect("auto budget compiled");
    assert_eq!(auto.reserve_tokens, 1000);
    assert_eq!(
        auto.budget_tokens(Some("my-model-v2"), Some(768)),
        Some(31_000)
    );
    assert!(runtime("")
        .unwrap()
        .policy("default")
        .unwrap()
        .auto_budget
        .is_none());

    let err = runtime(
        "[policies.a]\nbudget = \"auto\"\nmode = \"stable\"\ncontext_windows = { \"m\" = 0, \"\" = 5 }\n[policies.b]\ncontext_windows = { \"m\" = 5 }",
    )
    .unwrap_err();
    let problems: Vec<(&str, &str)> = err
        .0
        .iter()
        .map(|p| (p.path.as_str(), p.message.as_str()))
        .collect();
    let has = |path: &str, words: &str| {
        problems
            .iter()
            .any(|(p, m)| *p == path && m.contains(words))
    };
    // Stable mode takes a token budget as exact mode does.
    assert!(
        !problems.iter().any(|(p, _)| *p == "policies.a.budget"),
        "{err}"
    );
    assert!(
        has("policies.a.context_windows.\"m\"", "at least 1"),
        "{err}"
    );
    assert!(
        has("policies.a.context_windows", "must not be empty"),
        "{err}"
    );
    assert!(
        has("policies.b.context_windows", "unless budget = \"auto\""),
        "{err}"
    );
    // Type errors: an unknown mode, a window that is not a number.
    let err = runtime(
        "[policies.c]\nbudget = \"dynamic\"\n[policies.d]\nbudget = \"auto\"\ncontext_windows = { \"m\" = \"big\" }",
    )
    .unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        ["policies.c.budget", "policies.d.context_windows.m"],
        "{err}"
    );
}

#[test]
fn an_unreadable_or_empty_ca_file_is_a_problem() {
    let err = runtime("[upstream]\nca_file = \"/nonexistent/ca.pem\"").unwrap_err();
    assert_eq!(err.0[0].path, "upstream.ca_file");
    let empty = std::env::temp_dir().join(format!("cp-empty-ca-{}.pem", std::process::id()));
    std::fs::write(&empty, "not a certificate").unwrap();
    let err = runtime(&format!(
        "[upstream]\nca_file = {:?}",
        empty.to_str().unwrap()
    ))
    .unwrap_err();
    std::fs::remove_file(&empty).ok();
    assert!(err.0[0].message.contains("no PEM certificate"), "{err}");
}

#[test]
fn upstream_credentials_are_refused_without_echoing_them() {
    for url in [
        "https://user:s3cret@gw.example/openai",
        "https://user:s3cret@gw.example/?x=1",
        "ftp://user:s3cret@gw.example/",
        "https://gw.example/?api_key=s3cret",
    ] {
        let err = runtime(&format!("[upstream]\nurl = {url:?}")).unwrap_err();
        assert_eq!(err.0[0].path, "upstream.url");
        assert!(!err.to_string().contains("s3cret"), "{err}");
    }
}

#[test]
fn a_policy_must_keep_the_latest_message() {
    let err = runtime("[policies.default]\nkeep_last_n = 0").unwrap_err();
    assert_eq!(err.0[0].path, "policies.default.keep_last_n");
}

#[test]
fn stable_mode_is_accepted_and_its_ratios_checked() {
    let rt = runtime("[policies.default]\nmode = \"stable\"").unwrap();
    let p = rt.policy("default").unwrap();
    assert_eq!(p.mode, Mode::Stable);
    assert_eq!((p.stable_target_ratio, p.stable_head_ratio), (0.7, 0.4));
    let err = runtime(
        "[policies.default]\nmode = \"stable\"\nstable_target_ratio = 1.5\nstable_head_ratio = -1",
    )
    .unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert!(
        paths.contains(&"policies.default.stable_target_ratio"),
        "{paths:?}"
    );
    assert!(
        paths.contains(&"policies.default.stable_head_ratio"),
        "{paths:?}"
    );
}

#[test]
fn routes_name_or_imply_their_format_and_match_star_segments() {
    let rt = runtime(
        "[[routes]]\npath = \"/openai/deployments/*/chat/completions\"\npolicy = \"default\"\n\
         [[routes]]\npath = \"/v1/messages\"\npolicy = \"default\"\n\
         [[routes]]\npath = \"/custom\"\npolicy = \"default\"\nformat = \"responses\"",
    )
    .unwrap();
    let h = HeaderMap::new();
    let azure = rt
        .resolve("/openai/deployments/gpt4o/chat/completions", &h)
        .unwrap();
    assert_eq!(azure.format, Format::Chat);
    assert_eq!(&*azure.route, "/openai/deployments/*/chat/completions");
    assert!(rt
        .resolve("/openai/deployments/a/b/chat/completions", &h)
        .is_none());
    assert_eq!(
        rt.resolve("/v1/messages", &h).unwrap().format,
        Format::Anthropic
    );
    assert_eq!(Format::for_path("/v1/responses"), Format::Responses);
    assert_eq!(rt.resolve("/custom", &h).unwrap().format, Format::Responses);
    assert!(rt.resolve("/v1/messages/count_tokens", &h).is_none());
}

#[test]
fn syntax_and_semantic_problems_are_reported_together() {
    let err = Runtime::load_text(
        Some(
        "colour = 1\n[policies.a]\nbudget_chars = \"lots\"\nduplicate_threshold = 2.0\nmax_message_chars = 0\npin_patterns = [\"ok\", \"(\"]\n[policies.b]\nbudget_chars = 5\nkeep_lst_n = 2\npin_patterns = [\"(\"]\n[[routes]]\npath = \"/x\"\npolicy = \"a\"\n[[routes]]\npath = \"/y\"\npolicy = \"ghost\"\n[[routes]]\npolicy = \"b\"",
        ),
        Vec::new(),
        &Overrides::default(),
    )
    .unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "colour",
            "policies.a.budget_chars",
            "policies.b.keep_lst_n",
            "policies.a.duplicate_threshold",
            "policies.a.max_message_chars",
            "policies.a.pin_patterns[1]",
            "policies.b.pin_patterns[0]",
            "routes[1].policy",
            "routes[2].path",
        ],
        "{err}"
    );
}

#[test]
fn price_tables_are_read_and_checked_with_their_paths() {
    let rt = Runtime::load_text(
        Some("[prices.\"gpt-4o\"]\nuncached = 2.5\ncache_read = 1.25\noutput = 10\ncurrency = \"USD\""),
        Vec::new(),
        &Overrides::default(),
    )
    .unwrap();
    let price = rt.prices.price(Some("gpt-4o-2024-08-06")).unwrap();
    assert_eq!(
        (price.uncached, price.cache_read, price.cache_write),
        (2.5, 1.25, 2.5)
    );
    assert_eq!(rt.prices.currency, "USD");
    let err = Runtime::load_text(
        Some("[prices.\"gpt-4o\"]\nuncached = -1\noutput = 10\ncach_read = 1\n[prices.claude]\nuncached = 3\noutput = 15\ncurrency = \"EUR\""),
        Vec::new(),
        &Overrides::default(),
    )
    .unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "prices.\"gpt-4o\".cach_read",
            "prices.\"gpt-4o\".uncached",
            // Tables are read in name order: claude's currency first.
            "prices.\"gpt-4o\".currency",
        ],
        "{err}"
    );
}

#[test]
fn durations_are_typed_once_and_absurd_ones_are_problems_not_panics() {
    let rt = Runtime::load_text(
        Some("[upstream]\nconnect_timeout_secs = 2.5"),
        Vec::new(),
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(rt.timeouts.connect, Duration::from_millis(2500));
    assert_eq!(rt.timeouts.shutdown_delay, Duration::ZERO);
    let err = Runtime::load_text(
        Some("[upstream]\nidle_timeout_secs = 1e300\n[server]\nshutdown_grace_secs = -1"),
        Vec::new(),
        &Overrides::default(),
    )
    .unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert!(paths.contains(&"upstream.idle_timeout_secs"), "{paths:?}");
    assert!(paths.contains(&"server.shutdown_grace_secs"), "{paths:?}");
}
