//! The library's modules form layers that only look down, and no import closes a cycle.
//!
//! Reads `src/` as text: every `use crate::...`, `use super::...` and inline `crate::...`
//! path outside comments and test modules is an import of the file it resolves to. A file
//! may import from its own top-level module or from a module of a lower layer (the table
//! below); and the imports between files, inside a module as across modules, must never
//! lead back to where they started. A new top-level module must be given a layer here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first. A module may import only from modules in the layers before its own; the
/// modules of one layer stay independent of each other.
const LAYERS: &[&[&str]] = &[
    &["error", "descriptors"],
    &["http", "pem"],
    &["provider"],
    &["config"],
    &["telemetry"],
    &["budget", "auth", "upstream"],
    &["admission", "runs"],
    &["stream"],
    &["gateway"],
    &["server"],
];

/// Files that are not part of the layered library: the crate root (which declares every
/// module) and the binary (which may use all of it).
const OUTSIDE: &[&str] = &["lib.rs", "main.rs"];

fn layer_of(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// One source file: its path under `src/` and its module path (`["gateway", "retry"]`).
struct File {
    rel: PathBuf,
    module: Vec<String>,
    text: String,
}

fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts
}

fn collect(dir: &Path, root: &Path, out: &mut Vec<File>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("src/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, root, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let rel = path.strip_prefix(root).expect("under src/").to_path_buf();
            let is_test = rel.file_name().is_some_and(|n| n == "tests.rs")
                || rel.iter().any(|p| p == "tests");
            if is_test || OUTSIDE.iter().any(|o| rel == Path::new(o)) {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a readable source file");
            out.push(File {
                module: module_path(&rel),
                rel,
                text: production_code(&text),
            });
        }
    }
}

/// The text without comments and without the inline test module, which may reach anywhere.
fn production_code(text: &str) -> String {
    let mut out = String::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if trimmed.starts_with("#[cfg(test)]") {
            // An attribute on the next item: skip that item (a `mod` declaration of a test
            // file, or an inline test module, which runs to the end of the file).
            match lines.peek() {
                Some(next) if next.trim_start().starts_with("mod ") && next.ends_with(';') => {
                    lines.next();
                    continue;
                }
                Some(next) if next.trim_start().starts_with("mod ") => break,
                _ => continue,
            }
        }
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        out.push_str(code);
        out.push('\n');
    }
    out
}

/// Expands a `use` tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree: String = tree.split_whitespace().collect();
    let Some(open) = tree.find('{') else {
        return vec![tree];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.is_empty())
        .flat_map(expand)
        .map(|p| format!("{prefix}{p}"))
        .collect()
}

/// Every path the file imports, made absolute (`crate::a::b::C` as `["a", "b", "C"]`).
fn imports(file: &File) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let text = &file.text;
    // `use` statements, which may be grouped and relative.
    let mut rest = text.as_str();
    while let Some(at) = rest.find("use ") {
        let before = rest[..at].chars().last();
        let stmt_start = at + 4;
        rest = &rest[stmt_start..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let Some(end) = rest.find(';') else { break };
        let tree = &rest[..end];
        for path in expand(tree) {
            let path = path.trim_end_matches("::self").to_owned();
            let path = path.split(" as ").next().unwrap_or(&path).to_owned();
            let segs: Vec<&str> = path.split("::").collect();
            let absolute = match segs.first() {
                Some(&"crate") => segs[1..].iter().map(|s| s.to_string()).collect(),
                Some(&"super") | Some(&"self") => {
                    let mut base = file.module.clone();
                    let mut i = 0;
                    while let Some(&s) = segs.get(i) {
                        match s {
                            "super" => {
                                base.pop();
                            }
                            "self" => {}
                            _ => break,
                        }
                        i += 1;
                    }
                    base.extend(segs[i..].iter().map(|s| s.to_string()));
                    base
                }
                _ => continue,
            };
            out.push((absolute, format!("use {}", path)));
        }
    }
    // Paths written inline.
    let mut rest = text.as_str();
    while let Some(at) = rest.find("crate::") {
        let tail = &rest[at + 7..];
        // `use crate::...` was read above, as a tree.
        if rest[..at].trim_end().ends_with("use") {
            rest = tail;
            continue;
        }
        let path: String = tail
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':')
            .collect();
        let segs: Vec<String> = path
            .split("::")
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect();
        if !segs.is_empty() {
            out.push((segs, format!("crate::{}", path.trim_end_matches(':'))));
        }
        rest = &rest[at + 7..];
    }
    out
}

/// The file a module path lives in: the longest prefix of it that is a file of `src/`.
fn resolve(path: &[String], files: &BTreeMap<Vec<String>, usize>) -> Option<usize> {
    (1..=path.len())
        .rev()
        .find_map(|n| files.get(&path[..n]).copied())
}

#[test]
fn modules_only_import_from_lower_layers_and_never_in_a_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    collect(&root, &root, &mut files);
    let by_module: BTreeMap<Vec<String>, usize> = files
        .iter()
        .enumerate()
        .map(|(i, f)| (f.module.clone(), i))
        .collect();

    let mut problems = Vec::new();
    let mut edges: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); files.len()];
    for (i, file) in files.iter().enumerate() {
        let own = &file.module[0];
        let Some(own_layer) = layer_of(own) else {
            problems.push(format!(
                "src/{}: module `{own}` has no layer in tests/layers.rs",
                file.rel.display()
            ));
            continue;
        };
        for (path, written) in imports(file) {
            let target = &path[0];
            if target != own {
                match layer_of(target) {
                    Some(l) if l < own_layer => {}
                    Some(l) if l == own_layer => problems.push(format!(
                        "src/{}: `{written}`: `{own}` and `{target}` are in one layer and must not import each other",
                        file.rel.display()
                    )),
                    Some(_) => problems.push(format!(
                        "src/{}: `{written}` imports from `{target}`, a layer above `{own}`",
                        file.rel.display()
                    )),
                    None => {}
                }
            }
            if let Some(j) = resolve(&path, &by_module) {
                if j != i {
                    edges[i].insert(j);
                }
            }
        }
    }

    // Depth-first search for a path that returns to a file on it.
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    fn visit(
        i: usize,
        edges: &[BTreeSet<usize>],
        marks: &mut [Mark],
        path: &mut Vec<usize>,
        cycles: &mut Vec<Vec<usize>>,
    ) {
        marks[i] = Mark::OnPath;
        path.push(i);
        for &j in &edges[i] {
            match marks[j] {
                Mark::New => visit(j, edges, marks, path, cycles),
                Mark::OnPath => {
                    let from = path.iter().position(|&p| p == j).expect("on the path");
                    cycles.push(path[from..].to_vec());
                }
                Mark::Done => {}
            }
        }
        path.pop();
        marks[i] = Mark::Done;
    }
    let mut marks = vec![Mark::New; files.len()];
    let mut cycles = Vec::new();
    for i in 0..files.len() {
        if marks[i] == Mark::New {
            visit(i, &edges, &mut marks, &mut Vec::new(), &mut cycles);
        }
    }
    for cycle in cycles {
        let names: Vec<String> = cycle
            .iter()
            .chain(cycle.first())
            .map(|&i| format!("src/{}", files[i].rel.display()))
            .collect();
        problems.push(format!("import cycle: {}", names.join(" -> ")));
    }
    assert!(
        problems.is_empty(),
        "{} layering problem(s):\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_reader_sees_grouped_relative_and_inline_imports() {
    let file = File {
        rel: PathBuf::from("gateway/retry.rs"),
        module: vec!["gateway".into(), "retry".into()],
        text: production_code(
            "use crate::{error::{BoxError, GatewayError}, http::sse};\n\
             use super::attempt::Attempt;\n\
             // use crate::server::Nothing;\n\
             fn f() { crate::telemetry::metrics::touch(); }\n\
             #[cfg(test)]\nmod tests {\n use crate::server::Running;\n}\n",
        ),
    };
    let got: Vec<String> = imports(&file)
        .into_iter()
        .map(|(p, _)| p.join("::"))
        .collect();
    assert_eq!(
        got,
        [
            "error::BoxError",
            "error::GatewayError",
            "http::sse",
            "gateway::attempt::Attempt",
            "telemetry::metrics::touch",
        ]
    );
}
