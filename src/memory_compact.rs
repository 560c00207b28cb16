//! `POST /v1/memory-compact`: the engine as an API, with the seed's request
//! schema. Validation is written out rather than driven by a JSON Schema
//! crate: the schema is small, and this way every violation is reported at
//! once with its JSON pointer and a message a person can act on.

use serde::Serialize;
use serde_json::{Map, Value};

use crate::engine::{self, text::char_count, Message, Policy, Report, Role};

const MIN_MESSAGES: usize = 2;
const MAX_MESSAGES: usize = 200;
// Every request the API accepts gets the engine's exhaustive dedupe.
const _: () = assert!(MAX_MESSAGES <= crate::engine::dedupe::EXACT_SEARCH_MESSAGES);
const MAX_CONTENT_CHARS: usize = 8000;
const MAX_ID_CHARS: usize = 128;
const BUDGET_CHARS: (u64, u64) = (100, 400_000);
const KEEP_LAST_N: (u64, u64) = (0, 50);
const MAX_KEEP_ROLES: usize = 4;
const DUPLICATE_THRESHOLD: (f64, f64) = (0.5, 1.0);
const MAX_MESSAGE_CHARS: (u64, u64) = (80, 4000);
/// The largest body a valid request can be when written as plain UTF-8
/// (up to 4 bytes a char), with room for each message's keys, quoting and
/// indentation: about 6.4 MiB. Anything larger is refused unread (413).
pub const MAX_BODY_BYTES: usize =
    MAX_MESSAGES * (MAX_CONTENT_CHARS * 4 + MAX_ID_CHARS * 4 + 1024) + 4096;
/// The roles this API accepts (the proxy accepts more).
const API_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// One schema violation: where, and what is wrong there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// JSON pointer into the request (`""` is the whole body).
    pub path: String,
    pub message: String,
}

/// Every violation of one request, in document order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{} problem(s) in the request: {}", .0.len(), summary(.0))]
pub struct InvalidRequest(pub Vec<Violation>);

fn summary(violations: &[Violation]) -> String {
    violations
        .iter()
        .map(|v| {
            format!(
                "{}: {}",
                if v.path.is_empty() { "/" } else { &v.path },
                v.message
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A validated request: the engine's input.
#[derive(Debug, Clone, PartialEq)]
pub struct CompactRequest {
    pub messages: Vec<Message<'static>>,
    pub policy: Policy,
}

impl CompactRequest {
    pub fn compact(&self) -> Report {
        engine::compact(&self.messages, &self.policy)
    }
}

/// Parses and validates a request body.
pub fn parse(body: &[u8]) -> Result<CompactRequest, InvalidRequest> {
    let value: Value = serde_json::from_slice(body).map_err(|e| {
        InvalidRequest(vec![Violation {
            path: String::new(),
            message: format!("body is not valid JSON: {e}"),
        }])
    })?;
    validate(&value)
}

/// Validates a parsed request against the seed's `inputSchema`.
pub fn validate(value: &Value) -> Result<CompactRequest, InvalidRequest> {
    let mut errors = Errors::default();
    let Some(root) = value.as_object() else {
        errors.add("", "must be a JSON object");
        return Err(InvalidRequest(errors.0));
    };
    errors.unknown_fields(
        root,
        "",
        &[
            "messages",
            "budget_chars",
            "keep_last_n",
            "keep_roles",
            "duplicate_threshold",
            "max_message_chars",
        ],
    );

    let messages = match root.get("messages") {
        None => {
            errors.add("/messages", "is required");
            Vec::new()
        }
        Some(v) => messages(v, &mut errors),
    };
    let budget_chars = match root.get("budget_chars") {
        None => {
            errors.add("/budget_chars", "is required");
            0
        }
        Some(v) => errors
            .integer(v, "/budget_chars", BUDGET_CHARS)
            .unwrap_or(0),
    };
    let mut policy = Policy::with_budget(budget_chars as usize);
    if let Some(v) = root.get("keep_last_n") {
        policy.keep_last_n = errors.integer(v, "/keep_last_n", KEEP_LAST_N).unwrap_or(0) as usize;
    }
    if let Some(v) = root.get("keep_roles") {
        policy.keep_roles = keep_roles(v, &mut errors);
    }
    if let Some(v) = root.get("duplicate_threshold") {
        policy.duplicate_threshold = errors
            .number(v, "/duplicate_threshold", DUPLICATE_THRESHOLD)
            .unwrap_or(DUPLICATE_THRESHOLD.1);
    }
    if let Some(v) = root.get("max_message_chars") {
        policy.max_message_chars = errors
            .integer(v, "/max_message_chars", MAX_MESSAGE_CHARS)
            .unwrap_or(0) as usize;
    }

    if errors.0.is_empty() {
        Ok(CompactRequest { messages, policy })
    } else {
        Err(InvalidRequest(errors.0))
    }
}

fn messages(value: &Value, errors: &mut Errors) -> Vec<Message<'static>> {
    let Some(items) = value.as_array() else {
        errors.add("/messages", "must be an array");
        return Vec::new();
    };
    if !(MIN_MESSAGES..=MAX_MESSAGES).contains(&items.len()) {
        errors.add(
            "/messages",
            format!(
                "must hold {MIN_MESSAGES} to {MAX_MESSAGES} messages, has {}",
                items.len()
            ),
        );
    }
    items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| message(item, &format!("/messages/{i}"), errors))
        .collect()
}

fn message(value: &Value, path: &str, errors: &mut Errors) -> Option<Message<'static>> {
    let Some(fields) = value.as_object() else {
        errors.add(path, "must be an object");
        return None;
    };
    errors.unknown_fields(fields, path, &["role", "content", "id", "pin"]);
    let role = match fields.get("role") {
        None => {
            errors.add(format!("{path}/role"), "is required");
            None
        }
        Some(v) => errors.role(v, &format!("{path}/role")),
    };
    let content = match fields.get("content") {
        None => {
            errors.add(format!("{path}/content"), "is required");
            None
        }
        Some(Value::String(s)) => {
            let chars = char_count(s);
            if chars == 0 || chars > MAX_CONTENT_CHARS {
                errors.add(
                    format!("{path}/content"),
                    format!("must be 1 to {MAX_CONTENT_CHARS} characters, has {chars}"),
                );
            }
            Some(s.clone())
        }
        Some(_) => {
            errors.add(format!("{path}/content"), "must be a string");
            None
        }
    };
    let id = match fields.get("id") {
        None => None,
        Some(Value::String(s)) => {
            if char_count(s) > MAX_ID_CHARS {
                errors.add(
                    format!("{path}/id"),
                    format!("must be at most {MAX_ID_CHARS} characters"),
                );
            }
            Some(s.clone())
        }
        Some(_) => {
            errors.add(format!("{path}/id"), "must be a string");
            None
        }
    };
    let pin = match fields.get("pin") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            errors.add(format!("{path}/pin"), "must be a boolean");
            false
        }
    };
    let mut message = Message::new(role?, content?);
    message.id = id;
    message.pin = pin;
    Some(message)
}

fn keep_roles(value: &Value, errors: &mut Errors) -> Vec<Role> {
    let Some(items) = value.as_array() else {
        errors.add("/keep_roles", "must be an array");
        return Vec::new();
    };
    if items.len() > MAX_KEEP_ROLES {
        errors.add(
            "/keep_roles",
            format!("must hold at most {MAX_KEEP_ROLES} roles"),
        );
    }
    items
        .iter()
        .enumerate()
        .filter_map(|(i, v)| errors.role(v, &format!("/keep_roles/{i}")))
        .collect()
}

#[derive(Default)]
struct Errors(Vec<Violation>);

impl Errors {
    fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(Violation {
            path: path.into(),
            message: message.into(),
        });
    }

    fn unknown_fields(&mut self, object: &Map<String, Value>, path: &str, known: &[&str]) {
        for key in object.keys().filter(|k| !known.contains(&k.as_str())) {
            self.add(
                format!("{path}/{}", escape_pointer(key)),
                format!("unknown field; allowed: {}", known.join(", ")),
            );
        }
    }

    fn role(&mut self, value: &Value, path: &str) -> Option<Role> {
        match value.as_str() {
            Some(s) if API_ROLES.contains(&s) => Role::parse(s),
            _ => {
                self.add(path, format!("must be one of {}", API_ROLES.join(", ")));
                None
            }
        }
    }

    /// A JSON Schema integer (`3` or `3.0`) within `[min, max]`.
    fn integer(&mut self, value: &Value, path: &str, (min, max): (u64, u64)) -> Option<u64> {
        let whole = value.as_u64().or_else(|| {
            value
                .as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        });
        match whole {
            Some(n) if (min..=max).contains(&n) => Some(n),
            _ if value.is_number() && value.as_f64().is_some_and(|f| f.fract() == 0.0) => {
                self.add(path, format!("must be between {min} and {max}"));
                None
            }
            _ => {
                self.add(path, format!("must be an integer between {min} and {max}"));
                None
            }
        }
    }

    fn number(&mut self, value: &Value, path: &str, (min, max): (f64, f64)) -> Option<f64> {
        match value.as_f64() {
            Some(n) if n >= min && n <= max => Some(n),
            _ => {
                self.add(path, format!("must be a number between {min} and {max}"));
                None
            }
        }
    }
}

/// RFC 6901: `~` and `/` in a key are escaped in a pointer.
fn escape_pointer(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn paths(value: Value) -> Vec<String> {
        validate(&value)
            .unwrap_err()
            .0
            .into_iter()
            .map(|v| v.path)
            .collect()
    }

    fn two_messages() -> Value {
        json!([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    }

    #[test]
    fn defaults_fill_what_the_request_leaves_out() {
        let req = validate(&json!({"messages": two_messages(), "budget_chars": 100})).unwrap();
        assert_eq!(req.policy, Policy::with_budget(100));
        assert_eq!(req.messages.len(), 2);
    }

    #[test]
    fn every_violation_is_reported_with_its_path() {
        let got = paths(json!({
            "messages": [
                {"role": "robot", "content": ""},
                {"role": "user", "content": 5, "extra": true, "pin": "yes"},
            ],
            "budget_chars": 99,
            "keep_last_n": 51,
            "keep_roles": ["system", "admin"],
            "duplicate_threshold": 0.4,
            "max_message_chars": 79.5,
            "temperature": 1,
        }));
        assert_eq!(
            got,
            [
                "/temperature",
                "/messages/0/role",
                "/messages/0/content",
                "/messages/1/extra",
                "/messages/1/content",
                "/messages/1/pin",
                "/budget_chars",
                "/keep_last_n",
                "/keep_roles/1",
                "/duplicate_threshold",
                "/max_message_chars",
            ]
        );
    }

    #[test]
    fn missing_required_fields_are_named() {
        assert_eq!(paths(json!({})), ["/messages", "/budget_chars"]);
        assert_eq!(
            paths(json!({"messages": [{}, {"role": "user"}], "budget_chars": 100})),
            [
                "/messages/0/role",
                "/messages/0/content",
                "/messages/1/content"
            ]
        );
    }

    #[test]
    fn array_bounds_are_enforced() {
        assert_eq!(
            paths(json!({"messages": [{"role": "user", "content": "x"}], "budget_chars": 100})),
            ["/messages"]
        );
        let many: Vec<Value> = (0..201)
            .map(|_| json!({"role": "user", "content": "x"}))
            .collect();
        assert_eq!(
            paths(json!({"messages": many, "budget_chars": 100})),
            ["/messages"]
        );
        assert_eq!(
            paths(
                json!({"messages": two_messages(), "budget_chars": 100, "keep_roles": ["user", "user", "user", "user", "user"]})
            ),
            ["/keep_roles"]
        );
    }

    #[test]
    fn lengths_count_characters_not_bytes() {
        let ok = "é".repeat(8000);
        let long = "é".repeat(8001);
        assert!(validate(&json!({"messages": [{"role": "user", "content": ok}, {"role": "user", "content": "x"}], "budget_chars": 100})).is_ok());
        assert_eq!(
            paths(
                json!({"messages": [{"role": "user", "content": long}, {"role": "user", "content": "x"}], "budget_chars": 100})
            ),
            ["/messages/0/content"]
        );
    }

    #[test]
    fn integers_may_be_written_with_a_zero_fraction() {
        let req = validate(&json!({"messages": two_messages(), "budget_chars": 150.0})).unwrap();
        assert_eq!(req.policy.budget_chars, 150);
    }

    #[test]
    fn non_json_and_non_objects_are_rejected_not_panicked_on() {
        assert_eq!(parse(b"{").unwrap_err().0[0].path, "");
        assert_eq!(paths(json!([1, 2])), [""]);
        assert_eq!(
            paths(json!({"messages": "x", "budget_chars": "100"})),
            ["/messages", "/budget_chars"]
        );
    }

    #[test]
    fn pointer_escapes_slashes_in_unknown_keys() {
        assert_eq!(
            paths(json!({"messages": two_messages(), "budget_chars": 100, "a/b~c": 1})),
            ["/a~1b~0c"]
        );
    }
}
