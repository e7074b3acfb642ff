//! The layers of the source tree, read from the code's own `crate::` paths: nothing under
//! `backend/` reaches the collectives or MoE, and no two top-level modules depend on each other
//! in a loop (a module's files may name another module by any `crate::` path).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).expect("read source dir") {
        let p = e.expect("dir entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Top-level module of a file under `src/` (`lib` for lib.rs).
fn module_of(src: &Path, file: &Path) -> String {
    let rel = file.strip_prefix(src).expect("under src");
    let first = rel.components().next().expect("a component");
    let name = first.as_os_str().to_string_lossy();
    name.trim_end_matches(".rs").to_string()
}

/// Names lib.rs re-exports at the crate root (`pub use module::{A, b}`), by the module they
/// come from: `crate::Pe` names `pe`.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let flat = lib.replace('\n', " ");
    for stmt in flat.split(';') {
        let Some(rest) = stmt.trim().strip_prefix("pub use ") else {
            continue;
        };
        let Some((module, names)) = rest.split_once("::") else {
            continue;
        };
        let names = names.trim().trim_start_matches('{').trim_end_matches('}');
        for n in names.split(',') {
            let n = n.trim().rsplit("::").next().unwrap_or("").trim();
            if !n.is_empty() {
                out.insert(n.to_string(), module.trim().to_string());
            }
        }
    }
    out
}

/// Top-level modules a file's code names through `crate::` (comments skipped).
fn deps(
    text: &str,
    modules: &BTreeSet<String>,
    roots: &BTreeMap<String, String>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let code = line.split("//").next().unwrap_or("");
        let code = code.replace("use crate::{", "use crate::");
        for (i, _) in code.match_indices("crate::") {
            let rest = &code[i + "crate::".len()..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if modules.contains(&name) {
                out.insert(name);
            } else if let Some(m) = roots.get(&name) {
                out.insert(m.clone());
            }
        }
    }
    out
}

fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| module_of(&src, f)).collect();
    let lib = std::fs::read_to_string(src.join("lib.rs")).expect("read lib.rs");
    let roots = reexports(&lib);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for f in &files {
        let m = module_of(&src, f);
        let text = std::fs::read_to_string(f).expect("read source");
        let d = deps(&text, &modules, &roots);
        let e = g.entry(m.clone()).or_default();
        e.extend(d.into_iter().filter(|x| *x != m));
    }
    g
}

#[test]
fn backend_names_neither_collectives_nor_moe() {
    let g = graph();
    let backend = &g["backend"];
    assert!(
        !backend.contains("coll") && !backend.contains("ep"),
        "backend/ names {backend:?}"
    );
}

#[test]
fn top_level_modules_form_no_loop() {
    let g = graph();
    // lib.rs and the facade gather everything; the loom models stand apart.
    let skip = ["lib", "cuda", "models"];
    let nodes: Vec<&String> = g.keys().filter(|k| !skip.contains(&k.as_str())).collect();
    // Depth-first search for a back edge.
    fn visit<'a>(
        n: &'a str,
        g: &'a BTreeMap<String, BTreeSet<String>>,
        skip: &[&str],
        state: &mut BTreeMap<&'a str, u8>,
        path: &mut Vec<&'a str>,
    ) {
        state.insert(n, 1);
        path.push(n);
        for d in g.get(n).into_iter().flatten() {
            if skip.contains(&d.as_str()) {
                continue;
            }
            match state.get(d.as_str()).copied().unwrap_or(0) {
                1 => panic!("import loop: {} -> {d}", path.join(" -> ")),
                0 => visit(d, g, skip, state, path),
                _ => {}
            }
        }
        path.pop();
        state.insert(n, 2);
    }
    let mut state = BTreeMap::new();
    for n in nodes {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0 {
            visit(n, &g, &skip, &mut state, &mut Vec::new());
        }
    }
}
