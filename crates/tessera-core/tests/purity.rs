//! The core and the simulator stay pure: no async runtime, no Kubernetes, gRPC,
//! HTTP or NVML crates anywhere below them. Walks the dependency graph recorded in
//! the workspace's Cargo.lock (the CI script also checks `cargo tree`).

use std::collections::{BTreeMap, BTreeSet};

const FORBIDDEN: &[&str] = &[
    "tokio",
    "kube",
    "kube-client",
    "kube-runtime",
    "k8s-openapi",
    "tonic",
    "hyper",
    "axum",
    "nvml-wrapper",
    "prost",
    "prometheus-client",
];

/// package name -> dependency names, from Cargo.lock.
fn lock_graph() -> BTreeMap<String, Vec<String>> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock");
    let text = std::fs::read_to_string(path).expect("the workspace Cargo.lock");
    let mut graph: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    let mut in_deps = false;
    for line in text.lines() {
        let line = line.trim();
        if line == "[[package]]" {
            current = None;
            in_deps = false;
        } else if let Some(name) = line.strip_prefix("name = ") {
            let name = name.trim_matches('"').to_string();
            graph.entry(name.clone()).or_default();
            current = Some(name);
        } else if line.starts_with("dependencies = [") {
            in_deps = true;
        } else if in_deps && line == "]" {
            in_deps = false;
        } else if in_deps && let Some(cur) = &current {
            // Entries look like "serde", or "rand 0.9.5" when several versions exist.
            let dep = line
                .trim_matches(|c| c == '"' || c == ',')
                .split(' ')
                .next()
                .unwrap_or("")
                .to_string();
            graph.entry(cur.clone()).or_default().push(dep);
        }
    }
    graph
}

fn closure(graph: &BTreeMap<String, Vec<String>>, root: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut stack = vec![root.to_string()];
    while let Some(p) = stack.pop() {
        if seen.insert(p.clone()) {
            stack.extend(graph.get(&p).into_iter().flatten().cloned());
        }
    }
    seen
}

#[test]
fn core_and_simulator_pull_in_no_adapter_crates() {
    let graph = lock_graph();
    for root in ["tessera-core", "tessera-sim"] {
        assert!(graph.contains_key(root), "{root} missing from Cargo.lock");
        let deps = closure(&graph, root);
        let bad: Vec<&&str> = FORBIDDEN.iter().filter(|f| deps.contains(**f)).collect();
        assert!(bad.is_empty(), "{root} depends on {bad:?}");
    }
    // The check can fail: the node agent does pull these in.
    let node = closure(&graph, "tessera-node");
    assert!(node.contains("tonic") && node.contains("tokio"));
}
