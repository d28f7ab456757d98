//! The shape of the Rust code, held: no source file over 800 lines (tests
//! aside), and no circle in the import graph of either crate.
//!
//! - Lines: every `.rs` file under `src/` and `core/src/`, counted up to its
//!   inline `#[cfg(test)] mod tests`; a file that is all tests (`tests.rs`)
//!   is aside.
//! - Imports: a node per module file. A file imports the modules it declares
//!   (`mod x;`) and those its `crate::`, `super::` and `self::` paths name
//!   (`use` groups included), resolved to the deepest module that exists. A
//!   reference to an ancestor (a child reading the items of its folder's
//!   `mod.rs`, or of the crate root) is the tree itself, not an import; a
//!   test module (`tests`, compiled for tests only) may import anything. Any
//!   circle fails: once, eviction imported the store, whose compact form
//!   imported eviction.
//! - The checkers are pure, and their own tests feed them a circle and an
//!   oversized file.
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

const MAX_LINES: usize = 800;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `dir`, as (path relative to `dir`, text).
fn sources(dir: &Path) -> Vec<(String, String)> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let relative = path.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
                found.push((relative, std::fs::read_to_string(&path).unwrap()));
            }
        }
    }
    found.sort();
    found
}

/// The lines of `text` before its inline test module.
fn code_lines(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    lines
        .windows(2)
        .position(|w| w[0].trim() == "#[cfg(test)]" && w[1].trim_start().starts_with("mod tests"))
        .unwrap_or(lines.len())
}

/// The files over the limit, as "path: N lines".
fn oversized(files: &[(String, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(path, _)| !path.ends_with("tests.rs"))
        .filter_map(|(path, text)| {
            let n = code_lines(text);
            (n > MAX_LINES).then(|| format!("{path}: {n} lines"))
        })
        .collect()
}

/// The module path of a file relative to its crate's `src/`: `lib.rs` is
/// `[]`, `store/mod.rs` and `store.rs` are `["store"]`.
fn module_of(path: &str) -> Vec<String> {
    let path = path.strip_suffix(".rs").unwrap();
    let mut parts: Vec<String> = path.split('/').map(str::to_owned).collect();
    if matches!(parts.last().map(String::as_str), Some("mod" | "lib" | "main")) {
        parts.pop();
    }
    parts
}

/// The code of `text`: each line without its `//` comment (doc comments and
/// their intra-doc links included). Good enough for this code base, which
/// writes no `//` inside a string that also holds a path.
fn code(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a `use` tree starting at `rest` spells, each as its segments,
/// `prefix` before each: `a::{b, c::d}` gives `prefix::a::b`, `prefix::a::c::d`.
fn paths_at(rest: &str, prefix: Vec<String>, out: &mut Vec<Vec<String>>) {
    let mut segments = prefix;
    let mut rest = rest;
    loop {
        let ident: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if !ident.is_empty() {
            rest = &rest[ident.len()..];
            segments.push(ident);
            match rest.strip_prefix("::") {
                Some(after) => rest = after,
                None => break,
            }
        } else if let Some(group) = rest.strip_prefix('{') {
            // The group's items at depth 0, each a tree of its own.
            let (mut depth, mut start) = (0usize, 0usize);
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        paths_at(group[start..i].trim(), segments.clone(), out);
                        return;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        paths_at(group[start..i].trim(), segments.clone(), out);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            return;
        } else {
            break;
        }
    }
    out.push(segments);
}

/// Import edges between the module files of one crate (`files`: path
/// relative to `src/`, text), without the tree's own edges (see the module
/// doc).
fn imports(files: &[(String, String)]) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(p, _)| module_of(p)).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (path, text) in files {
        let from = module_of(path);
        if from.last().is_some_and(|m| m == "tests") {
            continue;
        }
        let code = code(text);
        let mut paths = Vec::new();
        for (i, _) in code.match_indices("::") {
            // The first `::` of a path that starts with crate, super or self.
            let head: String = code[..i].chars().rev().take_while(|&c| is_ident(c)).collect();
            let head: String = head.chars().rev().collect();
            let before = code[..i - head.len()].chars().last();
            if before.is_some_and(|c| is_ident(c) || c == ':') {
                continue;
            }
            let base = match head.as_str() {
                "crate" => Vec::new(),
                "self" => from.clone(),
                "super" => from[..from.len().saturating_sub(1)].to_vec(),
                _ => continue,
            };
            let mut rest = &code[i + 2..];
            let mut base = base;
            // super::super::...
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            paths_at(rest, base, &mut paths);
        }
        for segments in paths {
            // The deepest module the path names.
            let Some(to) = (0..=segments.len())
                .rev()
                .map(|n| segments[..n].to_vec())
                .find(|m| modules.contains(m))
            else {
                continue;
            };
            if !from.starts_with(&to) {
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
        for line in code.lines() {
            let line = line.trim().trim_start_matches("pub(crate) ").trim_start_matches("pub ");
            let declared = line.strip_prefix("mod ").and_then(|l| l.strip_suffix(';'));
            if let Some(child) = declared.filter(|&c| c != "tests") {
                let mut to = from.clone();
                to.push(child.trim().to_owned());
                edges.entry(from.clone()).or_default().insert(to);
            }
        }
    }
    edges
}

/// Every circle of `edges`, each once, as "a -> b -> a".
fn circles(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    let name = |m: &Vec<String>| if m.is_empty() { "crate".to_owned() } else { m.join("::") };
    let mut found = BTreeSet::new();
    // A depth-first walk from each node, the path on a stack: an edge back into
    // the stack closes a circle, written from its smallest node.
    fn walk(
        at: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
        found: &mut BTreeSet<Vec<Vec<String>>>,
    ) {
        if let Some(i) = stack.iter().position(|m| m == at) {
            let mut circle = stack[i..].to_vec();
            let smallest = (0..circle.len()).min_by_key(|&k| circle[k].clone()).unwrap();
            circle.rotate_left(smallest);
            found.insert(circle);
            return;
        }
        if done.contains(at) {
            return;
        }
        stack.push(at.clone());
        for next in edges.get(at).into_iter().flatten() {
            walk(next, edges, stack, done, found);
        }
        stack.pop();
        done.insert(at.clone());
    }
    for start in edges.keys() {
        walk(start, edges, &mut Vec::new(), &mut BTreeSet::new(), &mut found);
    }
    found
        .into_iter()
        .map(|c| {
            let mut names: Vec<String> = c.iter().map(name).collect();
            names.push(name(&c[0]));
            names.join(" -> ")
        })
        .collect()
}

fn crates() -> [(&'static str, Vec<(String, String)>); 2] {
    [
        ("src", sources(&repo().join("src"))),
        ("core/src", sources(&repo().join("core/src"))),
    ]
}

#[test]
fn no_source_file_is_over_800_lines_tests_aside() {
    for (dir, files) in crates() {
        assert!(files.len() >= 5, "{dir}: {} files", files.len());
        assert_eq!(oversized(&files), Vec::<String>::new(), "in {dir}/");
    }
}

#[test]
fn the_import_graphs_have_no_circle() {
    for (dir, files) in crates() {
        let edges = imports(&files);
        // The walk sees the real graph: the commands import the store, the
        // window imports the arguments.
        let some_edge = |from: &str, to: &str| {
            edges
                .get(&vec![from.to_owned()])
                .is_some_and(|t| t.contains(&vec![to.to_owned()]))
        };
        assert!(
            some_edge("commands", "store") || some_edge("window", "args"),
            "{dir}: no edge found: {edges:?}"
        );
        assert_eq!(circles(&edges), Vec::<String>::new(), "in {dir}/");
    }
}

#[test]
fn the_checkers_find_a_circle_and_an_oversized_file() {
    let file = |path: &str, text: &str| (path.to_owned(), text.to_owned());
    let tree = [
        file(
            "lib.rs",
            "mod eviction;\nmod store;\nuse crate::{eviction, store::zset};",
        ),
        file("eviction.rs", "use crate::store::{self, Key};\n"),
        file(
            "store/mod.rs",
            "pub mod compact;\npub mod zset;\npub use self::zset::Log;\n",
        ),
        // Through a group and a nested path, after a comment naming ffi.
        file(
            "store/compact.rs",
            "use super::Log; // crate::ffi\nuse crate::{ffi, eviction::counted};\n",
        ),
        file("store/zset.rs", "use super::super::ffi::Key;\n"),
        file("ffi.rs", "pub struct Key;\n"),
        // A test module imports what it tests: no circle.
        file("store/zset/tests.rs", "use crate::store;\n"),
    ];
    let edges = imports(&tree);
    assert_eq!(
        circles(&edges),
        vec!["eviction -> store -> store::compact -> eviction".to_owned()]
    );
    // A child reading its folder's items is no edge; declaring a child is.
    assert_eq!(
        edges[&vec!["store".to_owned()]],
        BTreeSet::from([
            vec!["store".to_owned(), "compact".to_owned()],
            vec!["store".to_owned(), "zset".to_owned()]
        ])
    );
    assert_eq!(
        edges[&vec!["store".to_owned(), "zset".to_owned()]],
        BTreeSet::from([vec!["ffi".to_owned()]])
    );
    let without = [tree[0].clone(), tree[1].clone(), tree[2].clone(), tree[5].clone()];
    assert_eq!(circles(&imports(&without)), Vec::<String>::new());

    let long = "fn f() {}\n".repeat(MAX_LINES + 1);
    let tested = format!(
        "{}#[cfg(test)]\nmod tests {{\n{long}}}\n",
        "fn g() {}\n".repeat(MAX_LINES)
    );
    let files = [file("a.rs", &long), file("b.rs", &tested), file("log/tests.rs", &long)];
    assert_eq!(oversized(&files), vec![format!("a.rs: {} lines", MAX_LINES + 1)]);
}
