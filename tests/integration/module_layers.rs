//! The crate's layout as a checked rule: the top-level modules depend on
//! each other without a cycle, and the pure core (engine, formats,
//! compaction pipeline, outcome) names no I/O. Read from the source, so a
//! change that adds a cycle or an I/O dependency fails here, not in review.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The modules that never wait on a network, a file or a runtime.
const PURE: [&str; 4] = ["engine", "format", "compaction", "outcome"];

/// Names whose presence in a pure module means I/O or a runtime.
const IO_NAMES: [&str; 11] = [
    "tokio",
    "hyper",
    "redis",
    "std::fs",
    "std::net",
    "std::thread",
    "crate::proxy",
    "crate::store",
    "crate::summarizer",
    "crate::cache",
    "crate::metrics",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// A file's code outside tests and comments, line by line.
fn code_lines(path: &Path) -> Vec<String> {
    let name = path.file_name().unwrap().to_string_lossy();
    if name == "tests.rs" || name.ends_with("_tests.rs") {
        return Vec::new();
    }
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        // Unit tests sit at the end of their file, after `#[cfg(test)]`.
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .map(|l| l.split("//").next().unwrap_or("").to_owned())
        .collect()
}

/// Each top-level module of `src/` and its code lines.
fn modules() -> BTreeMap<String, Vec<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut modules: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for file in files {
        let relative = file.strip_prefix(&src).unwrap();
        let first = relative.components().next().unwrap().as_os_str();
        let module = first.to_string_lossy().trim_end_matches(".rs").to_owned();
        if module == "lib" || module == "main" {
            continue;
        }
        modules.entry(module).or_default().extend(code_lines(&file));
    }
    modules
}

/// The top-level modules each module names through `crate::`.
fn dependencies(modules: &BTreeMap<String, Vec<String>>) -> BTreeMap<String, BTreeSet<String>> {
    modules
        .iter()
        .map(|(module, lines)| {
            let used = lines
                .iter()
                .flat_map(|line| {
                    line.match_indices("crate::")
                        .map(move |(i, _)| &line[i + 7..])
                })
                .map(|rest| {
                    rest.chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect::<String>()
                })
                .filter(|used| used != module && modules.contains_key(used))
                .collect();
            (module.clone(), used)
        })
        .collect()
}

/// One cycle of `graph`, if it has any (depth-first search).
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

#[test]
fn the_cycle_finder_finds_a_cycle_and_passes_a_layered_graph() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    let layered = graph(&[
        ("proxy", "policy"),
        ("policy", "compaction"),
        ("proxy", "compaction"),
    ]);
    assert_eq!(find_cycle(&layered), None);
    let cyclic = graph(&[("policy", "compaction"), ("compaction", "policy")]);
    assert_eq!(
        find_cycle(&cyclic),
        Some(vec![
            "compaction".into(),
            "policy".into(),
            "compaction".into()
        ])
    );
}

#[test]
fn top_level_modules_depend_on_each_other_without_a_cycle() {
    let modules = modules();
    let graph = dependencies(&modules);
    // The reading itself works: the proxy names the modules below it.
    assert!(graph["proxy"].contains("compaction") && graph["proxy"].contains("policy"));
    assert!(
        graph["policy"].contains("compaction"),
        "{:?}",
        graph["policy"]
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "an import cycle between top-level modules: {}",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn the_pure_core_names_no_io() {
    let modules = modules();
    for module in PURE {
        let lines = &modules[module];
        assert!(!lines.is_empty(), "{module} has no code read");
        for line in lines {
            for name in IO_NAMES {
                assert!(
                    !line.contains(name),
                    "{module} is pure, yet names {name}: {}",
                    line.trim()
                );
            }
        }
    }
}
