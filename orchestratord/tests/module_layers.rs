//! PLACE-7 (issue 52): the server's modules form layers. No two files of `orchestratord/src`
//! import each other, directly or around a loop (a file naming its own parent module, as a
//! submodule does, aside), and the lifecycle names nothing above it: not the composition root,
//! the cluster, remote workers, the models folder, routes or adapters. Read from the sources'
//! `crate::` and `super::` paths (test modules left out).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

/// Every `.rs` file of `src` by its module path (`lifecycle/mod.rs` is `lifecycle`).
fn modules(src: &Path) -> BTreeMap<Module, PathBuf> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("src readable") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            // main.rs is the binary's crate, which names this one as `orchestratord::`
            if path.extension().is_none_or(|e| e != "rs") || path == src.join("main.rs") {
                continue;
            }
            let rel = path
                .strip_prefix(src)
                .expect("under src")
                .with_extension("");
            let mut module: Module = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib")) {
                module.pop();
            }
            out.insert(module, path);
        }
    }
    out
}

/// The source of a file without its test module and its line comments.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("source readable");
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => &text[..],
    };
    text.lines()
        .map(|l| match l.find("//") {
            Some(i) => &l[..i],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The paths after each `prefix` (`crate::`, `super::`) in `code`: `a::b::C` as `[a, b, C]`.
fn paths_after<'a>(code: &'a str, prefix: &str) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before = rest[..i].chars().last();
        rest = &rest[i + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let path: Vec<&str> = rest[..end].split("::").filter(|s| !s.is_empty()).collect();
        out.push(path);
    }
    out
}

/// The longest module that `path` (from the crate root) names.
fn resolve(all: &BTreeMap<Module, PathBuf>, path: &[String]) -> Option<Module> {
    (1..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|m| all.contains_key(m))
}

/// What each file imports, by module, a file's own ancestors left out.
fn imports(all: &BTreeMap<Module, PathBuf>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for (module, path) in all {
        let code = code(path);
        let parent: Module = module[..module.len().saturating_sub(1)].to_vec();
        let mut named: Vec<Module> = Vec::new();
        for p in paths_after(&code, "crate::") {
            let p: Module = p.iter().map(|s| s.to_string()).collect();
            named.extend(resolve(all, &p));
        }
        for p in paths_after(&code, "super::") {
            let p: Module = parent
                .iter()
                .cloned()
                .chain(p.iter().map(|s| s.to_string()))
                .collect();
            named.push(resolve(all, &p).unwrap_or_else(|| parent.clone()));
        }
        let mine = edges.entry(module.clone()).or_default();
        for to in named {
            if &to != module && !module.starts_with(&to) {
                mine.insert(to);
            }
        }
    }
    edges
}

/// A loop of imports, if there is one.
fn a_loop(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Option<Vec<Module>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        m: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        marks: &mut BTreeMap<Module, Mark>,
        stack: &mut Vec<Module>,
    ) -> Option<Vec<Module>> {
        match marks.get(m) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let from = stack.iter().position(|s| s == m).unwrap_or(0);
                let mut found = stack[from..].to_vec();
                found.push(m.clone());
                return Some(found);
            }
            None => {}
        }
        marks.insert(m.clone(), Mark::Open);
        stack.push(m.clone());
        for to in edges.get(m).into_iter().flatten() {
            if let Some(found) = visit(to, edges, marks, stack) {
                return Some(found);
            }
        }
        stack.pop();
        marks.insert(m.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for m in edges.keys() {
        if let Some(found) = visit(m, edges, &mut marks, &mut Vec::new()) {
            return Some(found);
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn show(m: &Module) -> String {
    m.join("::")
}

#[test]
fn no_two_files_import_each_other_around_a_loop() {
    let all = modules(&src());
    assert!(
        all.len() > 100,
        "the sources were found: {} files",
        all.len()
    );
    let edges = imports(&all);
    // the check sees imports: the server's state names the lifecycle's
    assert!(
        edges[&vec!["app_state".to_string()]]
            .contains(&vec!["lifecycle".to_string(), "state".to_string()]),
        "app_state imports lifecycle::state"
    );
    if let Some(found) = a_loop(&edges) {
        panic!(
            "an import loop: {}",
            found.iter().map(show).collect::<Vec<_>>().join(" -> ")
        );
    }
}

#[test]
fn a_loop_is_found_where_there_is_one() {
    let m = |s: &str| -> Module { s.split("::").map(str::to_string).collect() };
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    edges.entry(m("a")).or_default().insert(m("b"));
    edges.entry(m("b")).or_default().insert(m("c::d"));
    edges.entry(m("c::d")).or_default().insert(m("e"));
    assert_eq!(a_loop(&edges), None);
    edges.entry(m("c::d")).or_default().insert(m("a"));
    let found = a_loop(&edges).expect("a -> b -> c::d -> a");
    assert_eq!(found.first(), found.last());
    assert_eq!(found.len(), 4);
}

#[test]
fn the_lifecycle_names_nothing_above_it() {
    let above = [
        "app_state",
        "server",
        "cluster",
        "remote_workers",
        "models_folder",
        "routes",
        "adapters",
        "worker",
        "openapi",
    ];
    let all = modules(&src());
    let edges = imports(&all);
    let mut named = Vec::new();
    for (from, tos) in &edges {
        if from.first().map(String::as_str) != Some("lifecycle") {
            continue;
        }
        for to in tos {
            if to.first().is_some_and(|t| above.contains(&t.as_str())) {
                named.push(format!("{} -> {}", show(from), show(to)));
            }
        }
    }
    assert!(
        named.is_empty(),
        "the lifecycle names what is above it: {named:?}"
    );
    // and the check would see it if it did: the lifecycle's files name each other
    assert!(edges
        .iter()
        .any(|(from, tos)| from.first().is_some_and(|f| f == "lifecycle")
            && tos
                .iter()
                .any(|t| t.first().is_some_and(|t| t == "lifecycle"))));
}
