//! Loading a configuration: the layers merged with figment, then read
//! section by section so every unknown key and type error is reported at
//! once, each with its path.

use std::path::Path;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::{Config, ConfigErrors, ConfigProblem, DEFAULT_TOML, ENV_PREFIX, SECTIONS};

/// Values given on the command line, the last layer.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub listen: Option<String>,
    pub upstream: Option<String>,
}

/// Loads the layered configuration. `env` is the process environment
/// (passed in so tests need not mutate the real one).
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &Overrides,
) -> Result<Config, ConfigErrors> {
    let text = file.map(read_file).transpose()?;
    load_text(text.as_deref(), env, overrides)
}

/// The text of a configuration file.
pub fn read_file(path: &Path) -> Result<String, ConfigErrors> {
    std::fs::read_to_string(path)
        .map_err(|e| ConfigErrors::one("", format!("cannot read {}: {e}", path.display())))
}

/// Whether a configuration file's text sets nothing (blank, or comments
/// only): what a truncated file or a rewrite caught halfway looks like.
pub fn is_blank(text: &str) -> bool {
    text.lines().all(|line| {
        let line = line.trim();
        line.is_empty() || line.starts_with('#')
    })
}

/// The layers merged and read leniently: the configuration as far as it
/// could be read, and every problem found. `Err` only when the layers do
/// not merge into a tree at all.
pub fn read_layers(
    file_text: Option<&str>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &Overrides,
) -> Result<(Config, Vec<ConfigProblem>), ConfigErrors> {
    let mut figment = Figment::new().merge(Toml::string(DEFAULT_TOML));
    if let Some(text) = file_text {
        figment = figment.merge(Toml::string(text));
    }
    let (env_layer, mut problems, env_keys) = env_provider(env);
    figment = figment.merge(env_layer);
    if let Some(listen) = &overrides.listen {
        figment = figment.merge(("server.listen", listen));
    }
    if let Some(url) = &overrides.upstream {
        figment = figment.merge(("upstream.url", url));
    }
    let mut merged: Value = match figment.extract() {
        Ok(merged) => merged,
        Err(e) => {
            problems.extend(e.into_iter().map(|e| ConfigProblem {
                path: e.path.join("."),
                message: e.kind.to_string(),
            }));
            return Err(ConfigErrors(problems));
        }
    };
    merge_builtin_routes(&mut merged);
    let (config, more) = read_value(&merged);
    problems.extend(more);
    // A problem at a key an environment variable set names the variable,
    // which is what the user has to fix.
    for problem in &mut problems {
        if let Some((_, var)) = env_keys.iter().find(|(path, _)| *path == problem.path) {
            problem.path = format!("{var} (sets {})", problem.path);
        }
    }
    Ok((config, problems))
}

/// A file's `[[routes]]` come first, then every built-in route (those of
/// the embedded default) whose path none of them has: a file that adds a
/// route for one API keeps the others compacted, and a route with a
/// built-in's path replaces it. (Figment replaces arrays whole, which
/// silently dropped the built-in routes.)
fn merge_builtin_routes(merged: &mut Value) {
    static BUILTIN: std::sync::OnceLock<Vec<Value>> = std::sync::OnceLock::new();
    let builtin = BUILTIN.get_or_init(|| {
        Figment::from(Toml::string(DEFAULT_TOML))
            .extract::<Value>()
            .ok()
            .and_then(|v| v.get("routes")?.as_array().cloned())
            .unwrap_or_default()
    });
    let Some(routes) = merged.get_mut("routes").and_then(Value::as_array_mut) else {
        return;
    };
    let path = |route: &Value| route.get("path").cloned();
    let missing: Vec<Value> = builtin
        .iter()
        .filter(|b| !routes.iter().any(|r| path(r) == path(b)))
        .cloned()
        .collect();
    routes.extend(missing);
}

/// [`load`] with the file's text already read (a reload checks the text
/// it then loads, not a second read of a file that may have changed).
pub fn load_text(
    file_text: Option<&str>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &Overrides,
) -> Result<Config, ConfigErrors> {
    match read_layers(file_text, env, overrides)? {
        (config, problems) if problems.is_empty() => Ok(config),
        (_, problems) => Err(ConfigErrors(problems)),
    }
}

/// The `COMPACTION_PROXY_<SECTION>__<KEY>` layer. Figment's own `Env` reads
/// the live process environment; taking the pairs as an argument lets tests
/// (and reloads) pass a snapshot instead of mutating global state.
/// Variables that name no setting are problems reported by their own name,
/// so the user sees where they came from, except the ones Kubernetes
/// injects for a Service whose name starts with `compaction-proxy`
/// ([`is_service_link`]): those are not ours and are ignored.
fn env_provider(
    env: impl IntoIterator<Item = (String, String)>,
) -> (Serialized<Value>, Vec<ConfigProblem>, Vec<(String, String)>) {
    let mut root = serde_json::Map::new();
    let mut problems = Vec::new();
    // (key path, variable) of every variable read.
    let mut keys = Vec::new();
    for (key, raw) in env {
        let Some(rest) = key.strip_prefix(ENV_PREFIX) else {
            continue;
        };
        if is_service_link(rest) {
            continue;
        }
        let parts: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
        if parts.len() < 2
            || parts.iter().any(|p| p.is_empty())
            || !SECTIONS.contains(&parts[0].as_str())
        {
            problems.push(ConfigProblem {
                path: key,
                message: format!(
                    "environment variable does not name a setting; expected {ENV_PREFIX}<SECTION>__<KEY> with a section of {}",
                    SECTIONS.join(", ")
                ),
            });
            continue;
        }
        insert_path(&mut root, &parts, env_value(&raw));
        keys.push((parts.join("."), key));
    }
    (Serialized::defaults(Value::Object(root)), problems, keys)
}

/// Kubernetes' service-link variables, after the prefix: `SERVICE_HOST`,
/// `SERVICE_PORT[_<NAME>]`, `PORT` and `PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR]`,
/// possibly behind the rest of a longer Service name (`METRICS_SERVICE_HOST`).
fn is_service_link(rest: &str) -> bool {
    static SHAPE: std::sync::OnceLock<regex::Regex> = std::sync::OnceLock::new();
    SHAPE
        .get_or_init(|| {
            regex::Regex::new(
                r"^([A-Z0-9_]+_)?(SERVICE_HOST|SERVICE_PORT(_[A-Z0-9_]+)?|PORT(_[0-9]+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$",
            )
            .expect("a valid pattern")
        })
        .is_match(rest)
}

/// Environment values are strings; read them as TOML scalars or arrays when
/// they parse as such (`1000`, `true`, `["a"]`), else as plain strings.
fn env_value(raw: &str) -> Value {
    toml_value(raw).unwrap_or_else(|| Value::String(raw.to_owned()))
}

fn toml_value(raw: &str) -> Option<Value> {
    #[derive(Deserialize)]
    struct Holder {
        v: Value,
    }
    let figment = Figment::from(Toml::string(&format!("v = {raw}")));
    figment.extract::<Holder>().ok().map(|h| h.v)
}

fn insert_path(root: &mut serde_json::Map<String, Value>, parts: &[String], value: Value) {
    let (last, parents) = parts.split_last().expect("non-empty path");
    let mut node = root;
    for part in parents {
        let entry = node
            .entry(part.clone())
            .or_insert_with(|| Value::Object(Default::default()));
        if !entry.is_object() {
            *entry = Value::Object(Default::default());
        }
        node = entry.as_object_mut().expect("object");
    }
    node.insert(last.clone(), value);
}

/// Reads a merged configuration tree leniently, collecting every problem:
/// every unknown key (with the nearest known key suggested) and every bad
/// value, each with its full path. What could not be read takes its
/// default, so the semantic checks of policy compilation
/// ([`crate::policy::Runtime::load`]) still see everything else.
pub fn read_value(merged: &Value) -> (Config, Vec<ConfigProblem>) {
    let mut problems = Vec::new();
    let mut config = Config::default();
    let Some(root) = merged.as_object() else {
        problems.push(ConfigProblem {
            path: String::new(),
            message: "configuration must be a table".into(),
        });
        return (config, problems);
    };
    for key in root.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            problems.push(unknown_key("", key, &SECTIONS));
        }
    }
    if let Some(v) = root.get("server") {
        config.server = section(v, "server", &mut problems);
    }
    if let Some(v) = root.get("upstream") {
        config.upstream = section(v, "upstream", &mut problems);
    }
    if let Some(v) = root.get("cache") {
        config.cache = section(v, "cache", &mut problems);
    }
    if let Some(v) = root.get("tenants") {
        config.tenants = section(v, "tenants", &mut problems);
    }
    if let Some(v) = root.get("inspector") {
        config.inspector = section(v, "inspector", &mut problems);
    }
    if let Some(v) = root.get("store") {
        config.store = section(v, "store", &mut problems);
    }
    match root.get("summarizers") {
        None => {}
        Some(Value::Object(named)) => {
            for (name, v) in named {
                let summarizer = section(v, &format!("summarizers.{name}"), &mut problems);
                config.summarizers.insert(name.clone(), summarizer);
            }
        }
        Some(_) => problems.push(ConfigProblem {
            path: "summarizers".into(),
            message: "must be a table of named summarizers".into(),
        }),
    }
    match root.get("policies") {
        None => {}
        Some(Value::Object(policies)) => {
            for (name, v) in policies {
                // A policy with bad keys still exists by name (the bad keys
                // take their defaults), so routes using it are not also
                // reported as pointing nowhere, and its other keys (regexes,
                // bounds) are still checked.
                let policy = section(v, &format!("policies.{name}"), &mut problems);
                config.policies.insert(name.clone(), policy);
            }
        }
        Some(_) => problems.push(ConfigProblem {
            path: "policies".into(),
            message: "must be a table of named policies".into(),
        }),
    }
    match root.get("prices") {
        None => {}
        Some(Value::Object(prices)) => {
            for (prefix, v) in prices {
                let price = section(v, &format!("prices.{prefix:?}"), &mut problems);
                config.prices.insert(prefix.clone(), price);
            }
        }
        Some(_) => problems.push(ConfigProblem {
            path: "prices".into(),
            message: "must be a table of model prefixes ([prices.\"gpt-4o\"])".into(),
        }),
    }
    match root.get("routes") {
        None => {}
        Some(Value::Array(routes)) => {
            for (i, v) in routes.iter().enumerate() {
                // Every route is kept, so the checks that follow name the
                // right index.
                config
                    .routes
                    .push(section(v, &format!("routes[{i}]"), &mut problems));
            }
        }
        Some(_) => problems.push(ConfigProblem {
            path: "routes".into(),
            message: "must be an array of tables ([[routes]])".into(),
        }),
    }
    (config, problems)
}

/// [`read_value`], refusing any problem.
pub fn from_value(merged: &Value) -> Result<Config, ConfigErrors> {
    match read_value(merged) {
        (config, problems) if problems.is_empty() => Ok(config),
        (_, problems) => Err(ConfigErrors(problems)),
    }
}

/// Reads one table leniently. Each key is read on its own, so one bad
/// value cannot hide another; unknown keys and bad values become problems
/// at their full path, and the keys that read well are kept (the others
/// take their defaults) so later checks still see them.
fn section<T: DeserializeOwned + Default>(
    value: &Value,
    path: &str,
    problems: &mut Vec<ConfigProblem>,
) -> T {
    let Some(table) = value.as_object() else {
        problems.push(ConfigProblem {
            path: path.to_owned(),
            message: "must be a table".into(),
        });
        return T::default();
    };
    let known = struct_fields::<T>();
    let mut good = serde_json::Map::new();
    for (key, v) in table {
        if !known.contains(&key.as_str()) {
            problems.push(unknown_key(path, key, known));
            continue;
        }
        let single = Value::Object(std::iter::once((key.clone(), v.clone())).collect());
        match serde_path_to_error::deserialize::<_, T>(single) {
            Ok(_) => {
                good.insert(key.clone(), v.clone());
            }
            Err(e) => problems.push(ConfigProblem {
                path: format!("{}{}", prefix(path), e.path()),
                message: e.into_inner().to_string(),
            }),
        }
    }
    serde_json::from_value(Value::Object(good)).unwrap_or_default()
}

/// The keys a section accepts: the field names its derived `Deserialize`
/// hands to `deserialize_struct`, caught by a deserializer that reads
/// nothing else.
fn struct_fields<T: DeserializeOwned>() -> &'static [&'static str] {
    use serde::de::{Error, Visitor};
    struct Probe<'a>(&'a mut &'static [&'static str]);
    impl<'de> serde::Deserializer<'de> for Probe<'_> {
        type Error = serde::de::value::Error;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(Error::custom("not a struct"))
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(Error::custom("fields read"))
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
            bytes byte_buf option unit unit_struct newtype_struct seq tuple
            tuple_struct map enum identifier ignored_any
        }
    }
    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(Probe(&mut fields));
    fields
}

fn prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}.")
    }
}

/// An unknown key, with the nearest known one when it looks like a typo.
fn unknown_key(path: &str, key: &str, known: &[&str]) -> ConfigProblem {
    let message = match nearest(key, known) {
        Some(near) => format!("unknown key; did you mean `{near}`?"),
        None => format!("unknown key; expected one of {}", known.join(", ")),
    };
    ConfigProblem {
        path: format!("{}{key}", prefix(path)),
        message,
    }
}

/// The known key most similar to `key`, if similar enough to be a typo
/// (Jaro-Winkler at least 0.8, the threshold clap's own suggestions use
/// in spirit: transpositions, a dropped or doubled letter).
pub fn nearest<'a>(key: &str, known: &[&'a str]) -> Option<&'a str> {
    known
        .iter()
        .map(|k| (strsim::jaro_winkler(key, k), *k))
        .filter(|(score, _)| *score >= 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, k)| k)
}
