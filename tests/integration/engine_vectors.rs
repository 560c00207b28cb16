//! Golden tests: the seed's worked example and the 19 vectors of
//! `COMPACTION.md` (copied into `tests/data`), run through the API's request
//! parser and the engine.

use std::path::{Path, PathBuf};

use compaction_proxy::memory_compact;
use serde_json::Value;

fn data(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(path)
}

fn run(request: &Value) -> Value {
    let req = memory_compact::validate(request).expect("valid request");
    serde_json::to_value(req.compact()).unwrap()
}

/// Numbers compare by value (`1` equals `1.0`); everything else exactly.
fn same_number(a: &Value, b: &Value) -> bool {
    a.as_f64() == b.as_f64()
}

/// Checks every key of `expected` is in `actual` with an equal value. With
/// `exact`, objects must also have no extra keys.
fn assert_matches(expected: &Value, actual: &Value, path: &str, exact: bool) {
    match (expected, actual) {
        (Value::Object(e), Value::Object(a)) => {
            for (k, v) in e {
                let Some(av) = a.get(k) else {
                    panic!("{path}/{k}: missing in actual");
                };
                assert_matches(v, av, &format!("{path}/{k}"), exact);
            }
            if exact {
                let extra: Vec<_> = a.keys().filter(|k| !e.contains_key(*k)).collect();
                assert!(extra.is_empty(), "{path}: unexpected keys {extra:?}");
            }
        }
        (Value::Array(e), Value::Array(a)) => {
            assert_eq!(e.len(), a.len(), "{path}: array length");
            for (i, (ev, av)) in e.iter().zip(a).enumerate() {
                assert_matches(ev, av, &format!("{path}/{i}"), exact);
            }
        }
        (Value::Number(_), Value::Number(_)) => {
            assert!(
                same_number(expected, actual),
                "{path}: expected {expected}, got {actual}"
            );
        }
        _ => assert_eq!(expected, actual, "{path}"),
    }
}

#[test]
fn seed_request_example_gives_its_output_example() {
    let seed: Value =
        serde_json::from_str(&std::fs::read_to_string(data("memory-compact-seed.json")).unwrap())
            .unwrap();
    let actual = run(&seed["requestExample"]);
    assert_matches(&seed["outputExample"], &actual, "", true);
}

#[test]
fn seed_output_example_serialises_with_the_same_spelling() {
    // Key order, integers as integers (`"similarity":1`) and float digits as
    // the seed prints them: compare with the seed's own text.
    let raw = std::fs::read_to_string(data("memory-compact-seed.json")).unwrap();
    let seed: Value = serde_json::from_str(&raw).unwrap();
    let start = raw.find("\"outputExample\":").unwrap() + "\"outputExample\":".len();
    let printed = &raw[start..raw.trim_end().len() - 1];
    let req = memory_compact::validate(&seed["requestExample"]).unwrap();
    assert_eq!(serde_json::to_string(&req.compact()).unwrap(), printed);
}

#[test]
fn all_spec_vectors_give_their_expected_reports() {
    let mut dir: Vec<_> = std::fs::read_dir(data("vectors"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    dir.sort();
    assert_eq!(dir.len(), 19, "the spec ships 19 vectors");
    for path in dir {
        let vector: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let actual = run(&vector["request"]);
        let name = path.file_name().unwrap().to_string_lossy();
        // Vectors leave out the descriptive strings, so compare what they hold;
        // the survivors must match exactly.
        assert_matches(&vector["expected"], &actual, &name, false);
        assert_matches(
            &vector["expected"]["messages"],
            &actual["messages"],
            &name,
            true,
        );
    }
}
