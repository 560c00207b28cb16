use std::path::Path;

use super::*;

#[test]
fn a_file_of_blanks_and_comments_sets_nothing() {
    assert!(is_blank(""));
    assert!(is_blank("\n   \n# upstream moved\n  # nothing else\n"));
    assert!(!is_blank("[server]\n"));
    assert!(!is_blank("# comment\nx = 1"));
}

fn load_str(toml: &str, env: &[(&str, &str)]) -> Result<Config, ConfigErrors> {
    let dir = std::env::temp_dir().join(format!(
        "cp-config-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::write(&dir, toml).unwrap();
    let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
    let result = load(Some(&dir), env, &Overrides::default());
    std::fs::remove_file(&dir).ok();
    result
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[test]
fn embedded_default_loads() {
    let config = load(None, Vec::new(), &Overrides::default()).unwrap();
    assert_eq!(config.server.listen, "127.0.0.1:8080");
    assert_eq!(config.policies["default"].budget_chars, 200_000);
    assert_eq!(config.routes[0].path, "/v1/chat/completions");
}

#[test]
fn later_layers_win_key_by_key() {
    let config = load_str(
        "[policies.default]\nbudget_chars = 1000\n[server]\nlisten = \"127.0.0.1:9000\"",
        &[
            ("COMPACTION_PROXY_SERVER__LISTEN", "127.0.0.1:9100"),
            ("COMPACTION_PROXY_POLICIES__DEFAULT__KEEP_LAST_N", "2"),
        ],
    )
    .unwrap();
    let p = &config.policies["default"];
    assert_eq!(p.budget_chars, 1000, "file beats embedded");
    assert_eq!(p.keep_last_n, 2, "env beats file");
    assert_eq!(
        p.max_message_chars, 4000,
        "untouched keys keep the embedded value"
    );
    assert_eq!(config.server.listen, "127.0.0.1:9100");
}

#[test]
fn flags_beat_environment() {
    let env = vec![(
        "COMPACTION_PROXY_UPSTREAM__URL".to_string(),
        "http://env:1".to_string(),
    )];
    let overrides = Overrides {
        listen: Some("127.0.0.1:1".into()),
        upstream: Some("http://flag:2".into()),
    };
    let config = load(None, env, &overrides).unwrap();
    assert_eq!(config.upstream.url, "http://flag:2");
    assert_eq!(config.server.listen, "127.0.0.1:1");
}

#[test]
fn a_policy_key_left_out_takes_one_default_whatever_the_name() {
    let config = load_str(
        "[policies.default]\nbudget_chars = 150000\n[policies.small]\nbudget_chars = 150000",
        &[],
    )
    .unwrap();
    let (default, small) = (&config.policies["default"], &config.policies["small"]);
    assert_eq!(default, small, "the name changes nothing");
    assert_eq!(small.keep_roles, [Role::System, Role::Developer]);
    assert_eq!(small.max_message_chars, 4000);
    assert!(small.pin_first_user && small.allow_bypass && !small.dry_run);
    let empty = load_str("[policies.bare]\n", &[]).unwrap();
    assert_eq!(empty.policies["bare"], PolicyConfig::default());
}

#[test]
fn the_shipped_default_policy_is_the_documented_default() {
    let shipped = load(None, Vec::new(), &Overrides::default()).unwrap();
    assert_eq!(shipped.policies["default"], PolicyConfig::default());
}

#[test]
fn every_unknown_key_and_type_error_is_reported_with_its_path() {
    let err = load_str(
        "colour = 1\n[server]\nlistn = \"x\"\n[policies.a]\nbudget_chars = \"lots\"\nkeep_last_n = -1\n[policies.b]\nbudget_chars = 1\nkeep_roles = [\"robot\"]\n[[routes]]\npath = \"/x\"\npolicy = \"a\"\nweight = 2",
        &[],
    )
    .unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "colour",
            "server.listn",
            "policies.a.budget_chars",
            "policies.a.keep_last_n",
            "policies.b.keep_roles[0]",
            "routes[0].weight"
        ],
        "{err}"
    );
}

#[test]
fn unknown_keys_suggest_the_nearest_known_one() {
    let err = load_str(
        "[policies.small]\nkeep_lst_n = 3\nzzz = 1\n[servr]\nlisten = \"x\"",
        &[],
    )
    .unwrap_err();
    let messages: Vec<String> = err.0.iter().map(|p| p.to_string()).collect();
    assert!(
        messages.contains(&"servr: unknown key; did you mean `server`?".to_owned()),
        "{err}"
    );
    assert!(
        messages.contains(
            &"policies.small.keep_lst_n: unknown key; did you mean `keep_last_n`?".to_owned()
        ),
        "{err}"
    );
    let zzz = err
        .0
        .iter()
        .find(|p| p.path == "policies.small.zzz")
        .unwrap();
    assert!(
        zzz.message
            .contains("expected one of budget_chars, keep_last_n"),
        "{err}"
    );
}

#[test]
fn environment_variables_that_name_no_setting_are_reported_by_name() {
    let env = [
        ("COMPACTION_PROXY_SERVR__LISTEN", "x"),
        ("COMPACTION_PROXY_SERVER__LISTN", "x"),
        ("OTHER_VAR", "1"),
    ];
    let err = load_str("", &env).unwrap_err();
    let paths: Vec<&str> = err.0.iter().map(|p| p.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "COMPACTION_PROXY_SERVR__LISTEN",
            "COMPACTION_PROXY_SERVER__LISTN (sets server.listn)"
        ],
        "{err}"
    );
}

#[test]
fn kubernetes_service_link_variables_are_ignored() {
    let env = [
        ("COMPACTION_PROXY_SERVICE_HOST", "10.0.0.1"),
        ("COMPACTION_PROXY_SERVICE_PORT", "8080"),
        ("COMPACTION_PROXY_SERVICE_PORT_HTTP", "8080"),
        ("COMPACTION_PROXY_PORT", "tcp://10.0.0.1:8080"),
        ("COMPACTION_PROXY_PORT_8080_TCP", "tcp://10.0.0.1:8080"),
        ("COMPACTION_PROXY_PORT_8080_TCP_ADDR", "10.0.0.1"),
        ("COMPACTION_PROXY_METRICS_SERVICE_HOST", "10.0.0.2"),
    ];
    assert!(load_str("", &env).is_ok());
}

#[test]
fn a_single_underscore_typo_is_reported_not_ignored() {
    let env = [("COMPACTION_PROXY_UPSTREAM_URL", "http://vllm:8000")];
    let err = load_str("", &env).unwrap_err();
    assert_eq!(err.0[0].path, "COMPACTION_PROXY_UPSTREAM_URL", "{err}");
    assert!(err.0[0].message.contains("<SECTION>__<KEY>"), "{err}");
}

#[test]
fn environment_problems_survive_a_file_that_does_not_parse() {
    let err = load_str("[server\n", &[("COMPACTION_PROXY_NOPE__X", "1")]).unwrap_err();
    assert_eq!(err.0[0].path, "COMPACTION_PROXY_NOPE__X", "{err}");
    assert!(err.0.len() >= 2, "the syntax error is reported too: {err}");
}

#[test]
fn a_missing_file_is_an_error() {
    let err = load(
        Some(Path::new("/nonexistent/compaction.toml")),
        Vec::new(),
        &Overrides::default(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("cannot read"), "{err}");
}
