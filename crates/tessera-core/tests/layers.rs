//! The core's modules form layers, not circles (issue 41): data (model,
//! request, placement) under the ledger, the fit filter over it, the policies
//! over the fit, the judge over the policies and the scheduler on top. Walks the
//! sources and fails naming the modules of any import cycle. The DRA adapter's
//! modules (`tessera-k8s` `src/dra`) are held to the same rule.
//!
//! What counts as an import: a `crate::…` or `super::…` path in code outside
//! `#[cfg(test)]` modules (comments, so intra-doc links, do not count), resolved
//! to the longest module it names. The crate root (which declares every module
//! and re-exports their items) imports nothing; a module's use of its own submodules is part
//! of the module and does not count; a submodule's use of its parent does.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Module path (`fit::mig_layout`, "" for the root) → its code outside tests.
fn modules(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("a source folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let rel = path.strip_prefix(root).expect("under the root");
            let mut parts: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if matches!(parts.last().map(String::as_str), Some("mod" | "lib")) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            let code: String = code
                .lines()
                .map(|l| l.split("//").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n");
            out.insert(parts.join("::"), code);
        }
    }
    out
}

/// Paths in `body` of a `use …::{body}` group, each prefixed with `prefix`.
fn expand(prefix: &str, body: &str, out: &mut Vec<String>) {
    let (mut depth, mut cur, mut items) = (0, String::new(), Vec::new());
    for ch in body.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ => {}
        }
        if ch == ',' && depth == 0 {
            items.push(std::mem::take(&mut cur));
        } else {
            cur.push(ch);
        }
    }
    items.push(cur);
    for item in items {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        match item.split_once('{') {
            Some((base, inner)) => {
                let inner = &inner[..inner.rfind('}').unwrap_or(inner.len())];
                let base = base.trim().trim_end_matches("::");
                expand(&format!("{prefix}{base}::"), inner, out);
            }
            None => out.push(format!(
                "{prefix}{}",
                item.split(" as ").next().unwrap_or(item)
            )),
        }
    }
}

/// Every `kw::…` path in `code`, groups expanded (without the `kw::`).
fn paths(code: &str, kw: &str) -> Vec<String> {
    let mut out = Vec::new();
    let needle = format!("{kw}::");
    let mut rest = code;
    while let Some(i) = rest.find(&needle) {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + needle.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 1;
            let end = group
                .char_indices()
                .find(|&(_, c)| {
                    match c {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                    depth == 0
                })
                .map_or(group.len(), |(i, _)| i);
            expand("", &group[..end], &mut out);
            continue;
        }
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .unwrap_or(rest.len());
        let path = rest[..end].trim_end_matches(':');
        let path = path.split("::{").next().unwrap_or(path);
        if let Some(group) = rest[..]
            .strip_prefix(path)
            .and_then(|r| r.strip_prefix("::{"))
        {
            let end = group.find('}').unwrap_or(group.len());
            expand(&format!("{path}::"), &group[..end], &mut out);
        } else {
            out.push(path.to_string());
        }
    }
    out
}

/// The longest module `path` names, if any.
fn resolve<'a>(mods: &'a BTreeMap<String, String>, path: &str) -> Option<&'a str> {
    let segs: Vec<&str> = path.split("::").collect();
    (1..=segs.len())
        .rev()
        .map(|k| segs[..k].join("::"))
        .find_map(|c| mods.get_key_value(&c).map(|(k, _)| k.as_str()))
}

/// Module → modules it imports.
fn graph(root: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mods = modules(root);
    let mut g: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, code) in &mods {
        let parent = m.rsplit_once("::").map_or("", |(p, _)| p);
        let mut to: Vec<String> = paths(code, "crate");
        to.extend(paths(code, "super").into_iter().map(|p| {
            if parent.is_empty() {
                p
            } else {
                format!("{parent}::{p}")
            }
        }));
        let e = g.entry(m.clone()).or_default();
        for p in to {
            if let Some(t) = resolve(&mods, &p)
                && t != m
                && !t.starts_with(&format!("{m}::"))
                && !m.is_empty()
            {
                e.insert(t.to_string());
            }
        }
    }
    g
}

/// Strongly connected components of more than one module (Tarjan).
fn cycles(g: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        let n = t.index.len();
        t.index.insert(v, n);
        t.low.insert(v, n);
        t.stack.push(v);
        t.on.insert(v);
        let g = t.g;
        for w in g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

fn root(rel: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

#[test]
fn the_core_has_no_import_cycles() {
    let g = graph(&root("src"));
    assert!(g.len() > 40, "the walk found {} modules", g.len());
    assert!(
        g.get("scheduler").is_some_and(|e| e.contains("judge")),
        "the walk must see the scheduler import the judge: {:?}",
        g.get("scheduler")
    );
    assert_eq!(cycles(&g), Vec::<Vec<String>>::new());
}

#[test]
fn the_dra_adapter_has_no_import_cycles() {
    let g = graph(&root("../tessera-k8s/src/dra"));
    assert!(
        g.get("allocate").is_some_and(|e| e.contains("choose")),
        "the walk must see allocate import choose: {:?}",
        g.get("allocate")
    );
    assert_eq!(cycles(&g), Vec::<Vec<String>>::new());
}

/// The walk finds a cycle where there is one (so the two tests above can fail).
#[test]
fn a_cycle_is_found() {
    let dir = std::env::temp_dir().join(format!("tessera-layers-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("b")).expect("a temp folder");
    let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).expect("a temp file");
    write("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n");
    write("a.rs", "use crate::b::{self, x::Y};\n");
    write("b/mod.rs", "pub mod x;\n");
    write("b/x.rs", "use crate::{c::Z};\n// use crate::a;\n");
    write(
        "c.rs",
        "fn f() { super::a::g(); }\n#[cfg(test)]\nmod t { use crate::b; }\n",
    );
    let g = graph(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        cycles(&g),
        vec![vec!["a".to_string(), "b::x".to_string(), "c".to_string()]]
    );
}
