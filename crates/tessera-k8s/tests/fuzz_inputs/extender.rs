//! (a) The extender's request bodies: decoded as `ExtenderArgs`,
//! `ExtenderBindingArgs` and `ExtenderPreemptionArgs` (every input as each),
//! and posted to the real router through `tower::ServiceExt::oneshot`.

use rand::Rng;
use rand::seq::IndexedRandom;
use serde_json::json;
use tessera_k8s::extender::wire::{ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs};

use crate::common;
use crate::fuzz::{assert_reached, cases, fuzz, mutated_body};

const EXTENDER_STRINGS: &[&str] = &[
    "Pod",
    "pod",
    "Nodes",
    "nodes",
    "NodeNames",
    "nodenames",
    "items",
    "metadata",
    "name",
    "uid",
    "spec",
    "containers",
    "resources",
    "requests",
    "limits",
    "tessera.io/gpu",
    "nvidia.com/gpu",
    "tessera.io/gpu-memory",
    "cpu",
    "PodName",
    "PodNamespace",
    "PodUID",
    "Node",
    "NodeNameToVictims",
    "NodeNameToMetaVictims",
    "Pods",
    "UID",
    "NumPDBViolations",
    "fake-gpu-node-1",
    "fake-gpu-node-2",
    "unknown-node",
    "1",
    "500m",
    "4Gi",
    "-1",
    "",
];

/// Extender bodies: the captured ones where present, plus one of each verb built here.
fn extender_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = [
        "filter-request-ExtenderArgs-nodenames.json",
        "filter-request-ExtenderArgs-nodes.json",
        "prioritize-request-ExtenderArgs-nodes.json",
        "bind-request-ExtenderBindingArgs.json",
    ]
    .iter()
    .filter_map(|f| common::fixture(f))
    .collect();
    let pod = json!({"metadata": {"name": "p", "namespace": "ml", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "resources": {"requests": {"tessera.io/gpu": "1", "tessera.io/gpu-memory": "4Gi"}}}]}});
    for body in [
        json!({"Pod": pod, "NodeNames": ["fake-gpu-node-1", "fake-gpu-node-2"], "Nodes": null}),
        json!({"PodName": "p", "PodNamespace": "ml", "PodUID": "u1", "Node": "fake-gpu-node-1"}),
        json!({"Pod": pod, "NodeNameToMetaVictims": {"fake-gpu-node-1": {"Pods": [{"UID": "v1"}], "NumPDBViolations": 0}}}),
        json!({"Pod": pod, "NodeNameToVictims": {"fake-gpu-node-2": {"Pods": [{"metadata": {"uid": "v2"}}], "NumPDBViolations": 1}}, "NodeNameToMetaVictims": null}),
    ] {
        seeds.push(serde_json::to_vec(&body).expect("JSON"));
    }
    seeds
}

/// Decodes `body` as `$ty`; what a decoded message encodes to must decode
/// again and encode the same. (Not equality with the first value: Kubernetes
/// times are encoded to the second, so `08:02:41.56Z` comes back as `08:02:41Z`.
/// A macro: `ExtenderArgs` borrows from the text it is decoded from.)
macro_rules! decode_round_trip {
    ($ty:ty, $body:expr) => {{
        let body: &str = $body;
        match serde_json::from_str::<$ty>(body) {
            Err(e) => {
                assert!(
                    !e.to_string().trim().is_empty(),
                    "an empty error for {body:?}"
                );
                "refused"
            }
            Ok(v) => {
                let once = serde_json::to_string(&v).expect("a decoded message encodes");
                let back: $ty = serde_json::from_str(&once)
                    .unwrap_or_else(|e| panic!("{once:?} does not decode back: {e}"));
                let twice = serde_json::to_string(&back).expect("encodes again");
                assert_eq!(once, twice, "round trip of {body:?}");
                "decoded"
            }
        }
    }};
}

#[test]
fn fuzz_extender_wire() {
    let seeds = extender_seeds();
    let n = cases();
    // Every input is decoded as each of the three request messages.
    let tally = fuzz(
        "extender wire",
        n,
        |rng| mutated_body(rng, &seeds, EXTENDER_STRINGS),
        |body| {
            // The routes refuse a body that is not UTF-8 before decoding it;
            // the decoders must survive one all the same.
            let Ok(text) = std::str::from_utf8(&body.0) else {
                let _ = serde_json::from_slice::<ExtenderArgs<'_>>(&body.0);
                let _ = serde_json::from_slice::<ExtenderBindingArgs>(&body.0);
                let _ = serde_json::from_slice::<ExtenderPreemptionArgs>(&body.0);
                return "not UTF-8";
            };
            let args = decode_round_trip!(ExtenderArgs<'_>, text);
            if let Ok(a) = serde_json::from_str::<ExtenderArgs<'_>>(text) {
                let _ = a.candidate_names();
            }
            let bind = decode_round_trip!(ExtenderBindingArgs, text);
            let preempt = decode_round_trip!(ExtenderPreemptionArgs, text);
            if let Ok(p) = serde_json::from_str::<ExtenderPreemptionArgs>(text) {
                let _ = p.meta_victims();
            }
            match (args, bind, preempt) {
                ("decoded", _, _) => "filter/prioritize body",
                (_, "decoded", _) => "bind body",
                (_, _, "decoded") => "preempt body",
                _ => "refused",
            }
        },
    );
    assert_reached(
        &tally,
        n,
        &["filter/prioritize body", "bind body", "refused"],
    );
}

#[test]
fn fuzz_extender_router() {
    use tessera_k8s::extender::router;
    let seeds = extender_seeds();
    let (nodes, inventory) = common::fixture_cluster();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let n = (cases() / 10).max(1);
    let mut app = None;
    let mut served = 0u64;
    const VERBS: [&str; 4] = ["filter", "prioritize", "bind", "preempt"];
    let tally = fuzz(
        "extender router",
        n,
        |rng| {
            let verb = *VERBS.choose(rng).unwrap_or(&"filter");
            let prefix = if rng.random() { "/scheduler" } else { "" };
            (verb, prefix, mutated_body(rng, &seeds, EXTENDER_STRINGS))
        },
        |(verb, prefix, body)| {
            // A fresh mirror now and then: `filter` with full Nodes adds nodes to it.
            if served.is_multiple_of(500) {
                let m = common::mirror("tessera", nodes.clone(), inventory.clone(), vec![]);
                app = Some(router(common::state(m, None)));
            }
            served += 1;
            let app = app.clone().expect("router built above");
            let path = format!("{prefix}/{verb}");
            let (status, answer) = runtime.block_on(common::call(app, &path, body.0.clone()));
            match status.as_u16() {
                200 => {
                    assert!(
                        !answer.is_string(),
                        "{path}: a 200 that is not JSON: {answer}"
                    );
                    if let Some(error) = answer.get("Error") {
                        assert!(error.is_string(), "{path}: {answer}");
                    }
                    "answered"
                }
                400 | 503 => {
                    let text = answer.as_str().unwrap_or_default();
                    assert!(
                        text.starts_with(&format!("{verb}: "))
                            && text.trim().len() > verb.len() + 2,
                        "{path}: {status} without a clear message: {answer}"
                    );
                    "refused"
                }
                other => panic!("{path}: status {other}: {answer}"),
            }
        },
    );
    assert_reached(&tally, n, &["answered", "refused"]);
}
