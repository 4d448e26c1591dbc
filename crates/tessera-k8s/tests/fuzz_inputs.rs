//! Fuzzing what Tessera's Kubernetes side reads from outside (issue 9): the
//! extender's request bodies (decoded, and through the real router) and the
//! admission webhook's AdmissionReview.
//!
//! A seeded mutational fuzzer: it starts from the bodies a real kube-scheduler
//! v1.28 sent (`../shared/fixtures/kube-scheduler-v1.28-extender/`) and from
//! reviews built from the grammar of a pod, flips and splices bytes and
//! rewrites JSON values. Every input must come back as an answer or as a
//! refusal that says what is wrong, never a panic; the webhook's answers are
//! also held to the rules it exists for (who may touch the allocation, which
//! pods get our scheduler, which variables a Tessera pod may not set).
//!
//! `TESSERA_FUZZ_CASES` is the number of inputs per target (default 20,000;
//! the router gets a tenth), `TESSERA_FUZZ_SEED` the seed. At the volume:
//! `TESSERA_FUZZ_CASES=1000000 cargo test --release -p tessera-k8s --test fuzz_inputs -- --nocapture`

mod common;

use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::time::Instant;

use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tessera_k8s::extender::wire::{ExtenderArgs, ExtenderBindingArgs, ExtenderPreemptionArgs};
use tessera_k8s::webhook::{self, AdmissionReview, Hook, WebhookConfig};

fn cases() -> u64 {
    std::env::var("TESSERA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000)
}

fn seed() -> u64 {
    std::env::var("TESSERA_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7e55_e7a9)
}

fn rng_for(target: &str) -> SmallRng {
    // Each target its own stream, so adding one does not change the others.
    let salt = target.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    SmallRng::seed_from_u64(seed() ^ salt)
}

/// How often each kind of outcome came up, so a run shows it reached both
/// answers and refusals.
type Tally = BTreeMap<&'static str, u64>;

/// Runs `check` on `n` inputs from `generate`; a failure prints the case, the
/// seed and the input before it propagates.
fn fuzz<I: std::fmt::Debug>(
    target: &str,
    n: u64,
    mut generate: impl FnMut(&mut SmallRng) -> I,
    mut check: impl FnMut(&I) -> &'static str,
) -> Tally {
    let mut rng = rng_for(target);
    let mut tally = Tally::new();
    let started = Instant::now();
    for case in 0..n {
        let input = generate(&mut rng);
        match catch_unwind(AssertUnwindSafe(|| check(&input))) {
            Ok(outcome) => *tally.entry(outcome).or_default() += 1,
            Err(panic) => {
                eprintln!(
                    "{target}: case {case} of seed {} failed on input:\n{input:?}",
                    seed()
                );
                resume_unwind(panic);
            }
        }
    }
    eprintln!(
        "fuzz {target}: {n} inputs {tally:?}, {:.2?}",
        started.elapsed()
    );
    tally
}

/// With enough inputs, every outcome in `want` must have come up.
fn assert_reached(tally: &Tally, n: u64, want: &[&str]) {
    if n >= 1_000 {
        for w in want {
            assert!(tally.contains_key(w), "no input reached {w:?}: {tally:?}");
        }
    }
}

// ---- mutations ----

/// Fragments that break parsers: JSON syntax, numeric edges, escapes, units.
const TOKENS: &[&str] = &[
    "\"",
    "\\",
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "null",
    "true",
    "false",
    "0",
    "-1",
    "1e999",
    "1.5",
    "18446744073709551616",
    "4294967296",
    "\\u0000",
    "\\ud800",
    "é",
    "😀",
    "\u{0}",
    " ",
    "m",
    "Mi",
    "Gi",
    "Ei",
    "tessera.io/",
    "nvidia.com/",
    "NVIDIA_",
    "CUDA_MPS_",
];

fn mutate_bytes(rng: &mut SmallRng, input: &[u8]) -> Vec<u8> {
    let mut b = input.to_vec();
    for _ in 0..rng.random_range(1..=4) {
        let len = b.len();
        match rng.random_range(0..7) {
            0 if len > 0 => {
                let i = rng.random_range(0..len);
                b[i] ^= 1 << rng.random_range(0..8);
            }
            1 if len > 0 => {
                let i = rng.random_range(0..len);
                b[i] = rng.random();
            }
            2 if len > 0 => {
                let i = rng.random_range(0..len);
                let n = rng.random_range(1..=16).min(len - i);
                b.drain(i..i + n);
            }
            3 => {
                let i = rng.random_range(0..=len);
                let t = TOKENS.choose(rng).copied().unwrap_or("");
                b.splice(i..i, t.bytes());
            }
            4 if len > 0 => {
                let i = rng.random_range(0..len);
                let n = rng.random_range(1..=32).min(len - i);
                let chunk = b[i..i + n].to_vec();
                let at = rng.random_range(0..=len);
                b.splice(at..at, chunk);
            }
            5 if len > 0 => b.truncate(rng.random_range(0..len)),
            _ => {
                let i = rng.random_range(0..=len);
                b.insert(i, *b"0123456789.-\"{}[]:,".choose(rng).unwrap_or(&b'0'));
            }
        }
    }
    b
}

fn mutate_text(rng: &mut SmallRng, input: &str) -> String {
    String::from_utf8_lossy(&mutate_bytes(rng, input.as_bytes())).into_owned()
}

fn random_value(rng: &mut SmallRng, depth: u32, strings: &[&str]) -> Value {
    match rng.random_range(0..if depth == 0 { 6 } else { 8 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.random()),
        2 => json!(
            *[0i64, -1, 1, i64::MIN, i64::MAX, 4_294_967_296]
                .choose(rng)
                .unwrap_or(&0)
        ),
        3 => json!(*[u64::MAX, 1000].choose(rng).unwrap_or(&0)),
        4 => json!(*[0.5f64, -0.0, 1e300].choose(rng).unwrap_or(&0.5)),
        5 => {
            let s = strings.choose(rng).copied().unwrap_or("");
            Value::String(if rng.random_ratio(1, 3) {
                mutate_text(rng, s)
            } else {
                s.to_string()
            })
        }
        6 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| random_value(rng, depth - 1, strings))
                .collect(),
        ),
        _ => Value::Object(
            (0..rng.random_range(0..4))
                .map(|_| {
                    let k = strings.choose(rng).copied().unwrap_or("k").to_string();
                    (k, random_value(rng, depth - 1, strings))
                })
                .collect(),
        ),
    }
}

/// A node of `v` chosen by a random walk from the root.
fn random_node<'a>(rng: &mut SmallRng, v: &'a mut Value) -> &'a mut Value {
    let n = match v {
        Value::Object(m) => m.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    };
    if n == 0 || rng.random_ratio(1, 4) {
        return v;
    }
    let i = rng.random_range(0..n);
    match v {
        Value::Object(m) => random_node(rng, m.values_mut().nth(i).expect("index below len")),
        Value::Array(a) => random_node(rng, &mut a[i]),
        _ => v,
    }
}

/// Rewrites one to three values of `v`: replaced, removed, added, renamed.
fn mutate_json(rng: &mut SmallRng, v: &mut Value, strings: &[&str]) {
    for _ in 0..rng.random_range(1..=3) {
        let node = random_node(rng, v);
        match (rng.random_range(0..5), &mut *node) {
            (0, Value::Object(m)) if !m.is_empty() => {
                let k = m.keys().nth(rng.random_range(0..m.len())).cloned();
                if let Some(k) = k {
                    let old = m.remove(&k);
                    if rng.random() {
                        // The same value under another spelling of the key.
                        let renamed = if rng.random() {
                            k.to_ascii_lowercase()
                        } else {
                            mutate_text(rng, &k)
                        };
                        m.insert(renamed, old.unwrap_or(Value::Null));
                    }
                }
            }
            (1, Value::Object(m)) => {
                let k = strings.choose(rng).copied().unwrap_or("k").to_string();
                m.insert(k, random_value(rng, 2, strings));
            }
            (1, Value::Array(a)) if !a.is_empty() => {
                let i = rng.random_range(0..a.len());
                let copy = a[i].clone();
                a.push(copy);
            }
            (2, Value::String(s)) => *s = mutate_text(rng, s),
            _ => *node = random_value(rng, 2, strings),
        }
    }
}

/// A request body, shown as text when a case fails.
#[derive(Clone)]
struct Body(Vec<u8>);

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// A body: a seed mutated byte-wise or value-wise, or (rarely) tokens.
fn mutated_body(rng: &mut SmallRng, seeds: &[Vec<u8>], strings: &[&str]) -> Body {
    let seed = seeds.choose(rng).cloned().unwrap_or_default();
    Body(match rng.random_range(0..10) {
        0..=4 => mutate_bytes(rng, &seed),
        5..=8 => {
            let mut v: Value = serde_json::from_slice(&seed).unwrap_or(Value::Null);
            mutate_json(rng, &mut v, strings);
            serde_json::to_vec(&v).unwrap_or_default()
        }
        _ => (0..rng.random_range(0..12))
            .flat_map(|_| TOKENS.choose(rng).copied().unwrap_or("").bytes())
            .collect(),
    })
}

// ---- (a) the extender's bodies ----

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

/// Decodes `body` as `$ty`; a value must encode and decode back to itself.
/// (A macro: `ExtenderArgs` borrows from the text it is decoded from.)
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
                let again = serde_json::to_string(&v).expect("a decoded message encodes");
                let back: $ty = serde_json::from_str(&again)
                    .unwrap_or_else(|e| panic!("{again:?} does not decode back: {e}"));
                assert_eq!(back, v, "round trip of {body:?}");
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
            // The routes check UTF-8 once before decoding; so do we.
            let Ok(text) = std::str::from_utf8(&body.0) else {
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

// ---- (b) the webhook's AdmissionReview ----

const SA: &str = "system:serviceaccount:tessera-system:tessera-scheduler";
const ALLOCATION: &str = "tessera.io/allocation";
const REQUEST_ANNOTATIONS: [&str; 5] = [
    "tessera.io/gpu-model",
    "tessera.io/gpu-uuids",
    "tessera.io/isolation",
    "tessera.io/topology",
    "tessera.io/single-architecture",
];

const REVIEW_STRINGS: &[&str] = &[
    "request",
    "uid",
    "operation",
    "userInfo",
    "username",
    "object",
    "oldObject",
    "metadata",
    "name",
    "namespace",
    "annotations",
    "labels",
    "spec",
    "containers",
    "initContainers",
    "ephemeralContainers",
    "env",
    "envFrom",
    "prefix",
    "configMapRef",
    "value",
    "resources",
    "requests",
    "limits",
    "schedulerName",
    "volumeMounts",
    "mountPath",
    "CREATE",
    "UPDATE",
    "tessera",
    ALLOCATION,
    "tessera.io/schedule",
    "tessera.io/gpu",
    "nvidia.com/gpu",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_MPS_PIPE_DIRECTORY",
    SA,
    "alice",
    "true",
    "1",
    "",
];

/// Quantities a pod may ask. Values whose sum over a few containers passes
/// u64::MAX are left out until `convert::pod_resources` checks its sums
/// (issue 9 finding 18; see `quantity_sums_that_overflow_are_refused`).
const RESOURCES: &[(&str, &str)] = &[
    ("cpu", "1"),
    ("cpu", "1152921504606846975m"),
    ("memory", "4Gi"),
    ("memory", "16Ei"),
    ("tessera.io/gpu", "1"),
    ("tessera.io/gpu", "one"),
    ("tessera.io/gpu", "99999999999999999999"),
    ("tessera.io/gpu-memory", "4Gi"),
    ("tessera.io/gpu-memory", "-1Gi"),
    ("tessera.io/gpu-milli", "250"),
    ("tessera.io/gpu-cores", "150"),
    ("tessera.io/mig-1g.10gb", "1"),
    ("nvidia.com/gpu", "2"),
    ("nvidia.com/gpu", "4294967296"),
    ("nvidia.com/mig-1g.10gb", "1"),
    ("example.com/foo", "1152921504606846975"),
];

const ENV_NAMES: &[&str] = &[
    "HOME",
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "NVIDIA_MIG_CONFIG_DEVICES",
    "TESSERA_ISOLATION",
    "NVIDIA_DRIVER_CAPABILITIES",
];

/// The variables a Tessera pod may not set, written out again here as the oracle.
fn reserved(name: &str) -> bool {
    [
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_MIG_CONFIG_DEVICES",
        "NVIDIA_MIG_MONITOR_DEVICES",
        "NVIDIA_IMEX_CHANNELS",
    ]
    .contains(&name)
        || name.starts_with("CUDA_MPS_")
        || name.starts_with("TESSERA_")
}

fn random_container(rng: &mut SmallRng, name: &str) -> Value {
    let requests: serde_json::Map<String, Value> = (0..rng.random_range(0..3))
        .filter_map(|_| RESOURCES.choose(rng))
        .map(|(k, v)| (k.to_string(), json!(v)))
        .collect();
    let env: Vec<Value> = (0..rng.random_range(0..3))
        .filter_map(|_| ENV_NAMES.choose(rng))
        .map(|n| json!({"name": n, "value": "x"}))
        .collect();
    let mut c =
        json!({"name": name, "image": "x", "resources": {"requests": requests}, "env": env});
    if rng.random_ratio(1, 4) {
        let prefix = [
            None,
            Some(""),
            Some("APP_"),
            Some("CUDA_"),
            Some("T"),
            Some("X_"),
        ]
        .choose(rng)
        .copied()
        .flatten();
        c["envFrom"] = json!([{"prefix": prefix, "configMapRef": {"name": "cfg"}}]);
    }
    c
}

fn random_pod(rng: &mut SmallRng) -> Value {
    let mut spec = json!({"containers": (0..rng.random_range(1..3))
        .map(|i| random_container(rng, &format!("c{i}"))).collect::<Vec<_>>()});
    if rng.random_ratio(1, 4) {
        spec["initContainers"] = json!([random_container(rng, "init")]);
    }
    if let Some(name) = [
        None,
        Some(""),
        Some("default-scheduler"),
        Some("tessera"),
        Some("volcano"),
    ]
    .choose(rng)
    .copied()
    .flatten()
    {
        spec["schedulerName"] = json!(name);
    }
    let mut annotations = serde_json::Map::new();
    if rng.random_ratio(1, 3) {
        annotations.insert(
            ALLOCATION.into(),
            json!(["{\"gpus\":[0]}", "{}", ""][rng.random_range(0..3)]),
        );
    }
    if rng.random_ratio(1, 4) {
        let k = REQUEST_ANNOTATIONS.choose(rng).copied().unwrap_or("");
        annotations.insert(
            k.into(),
            json!(["A100-80GB", "mps", "x", "GPU-1"][rng.random_range(0..4)]),
        );
    }
    let mut labels = serde_json::Map::new();
    if rng.random_ratio(1, 3) {
        labels.insert(
            "tessera.io/schedule".into(),
            json!(["true", "false"][rng.random_range(0..2)]),
        );
    }
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": annotations, "labels": labels},
        "spec": spec})
}

/// A review built from the grammar of a pod; an UPDATE's old pod is the new
/// one before a small change (annotation, ephemeral container) or another pod.
fn random_review(rng: &mut SmallRng) -> Value {
    let op = ["CREATE", "CREATE", "UPDATE", "UPDATE", "DELETE", ""][rng.random_range(0..6)];
    let user = [SA, "alice", ""][rng.random_range(0..3)];
    let object = random_pod(rng);
    let mut request = json!({"uid": format!("u{}", rng.random::<u16>()), "operation": op,
        "userInfo": {"username": user}, "object": object});
    if op == "UPDATE" {
        let mut old = if rng.random_ratio(1, 4) {
            random_pod(rng)
        } else {
            object.clone()
        };
        match rng.random_range(0..3) {
            0 => old["metadata"]["annotations"] = json!({ALLOCATION: "{\"gpus\":[1]}"}),
            1 => old["spec"]["ephemeralContainers"] = Value::Null,
            _ => {
                request["object"]["spec"]["ephemeralContainers"] = json!([{"name": "dbg",
                    "env": [{"name": ENV_NAMES.choose(rng).copied().unwrap_or(""), "value": "all"}]}]);
            }
        }
        request["oldObject"] = old;
    }
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// What the rules say about one pod, worked out from its JSON independently of the webhook.
struct Facts {
    allocation: Option<String>,
    default_scheduler: bool,
    tessera_resource: bool,
    stock_resource: bool,
    claims: bool,
    ours: bool,
    reserved_env: bool,
}

fn facts(pod: &Pod) -> Facts {
    let spec = pod.spec.clone().unwrap_or_default();
    let keys: Vec<String> = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.clone())
        .flat_map(|r| {
            r.requests
                .into_iter()
                .flatten()
                .chain(r.limits.into_iter().flatten())
        })
        .map(|(k, _)| k)
        .collect();
    let tessera_resource = keys.iter().any(|k| k.starts_with("tessera.io/"));
    let stock_resource = keys
        .iter()
        .any(|k| k == "nvidia.com/gpu" || k.starts_with("nvidia.com/mig-"));
    let annotations = pod.metadata.annotations.clone().unwrap_or_default();
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    let opted = labels
        .get("tessera.io/schedule")
        .is_some_and(|v| v == "true")
        || REQUEST_ANNOTATIONS
            .iter()
            .any(|a| annotations.contains_key(*a));
    let scheduler = spec.scheduler_name.clone().unwrap_or_default();
    let mut env_names: Vec<String> = Vec::new();
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        env_names.extend(c.env.iter().flatten().map(|e| e.name.clone()));
    }
    for c in spec.ephemeral_containers.iter().flatten() {
        env_names.extend(c.env.iter().flatten().map(|e| e.name.clone()));
    }
    let claims = tessera_resource || (stock_resource && opted);
    Facts {
        allocation: annotations.get(ALLOCATION).cloned(),
        default_scheduler: matches!(scheduler.as_str(), "" | "default-scheduler"),
        tessera_resource,
        stock_resource,
        claims,
        ours: claims || scheduler == "tessera",
        reserved_env: env_names.iter().any(|n| reserved(n)),
    }
}

/// Holds one answer to the webhook's rules; returns the outcome's name.
fn judge(hook: Hook, body: &[u8], out: &AdmissionReview) -> &'static str {
    let review: AdmissionReview = serde_json::from_slice(body).expect("answered, so it decoded");
    let req = review.request.expect("answered, so it had a request");
    let resp = out.response.as_ref().expect("an answer has a response");
    assert_eq!(resp.uid, req.uid, "the answer names the request");
    assert_eq!(out.kind, "AdmissionReview");
    let pod = |v: &Option<Value>| {
        v.clone()
            .and_then(|v| serde_json::from_value::<Pod>(v).ok())
    };
    let (new, old) = (pod(&req.object), pod(&req.old_object));
    if !resp.allowed {
        let m = resp.message().expect("a denial carries a message");
        assert!(
            m.starts_with("Tessera: ") && m.len() > 30,
            "unclear denial {m:?}"
        );
        // It names the pod, or the part of the request that is not one.
        let named = match &new {
            Some(p) => {
                let key = format!(
                    "{}/{}",
                    p.metadata.namespace.as_deref().unwrap_or("default"),
                    p.metadata.name.as_deref().unwrap_or("")
                );
                m.contains(&key) || m.contains("oldObject")
            }
            None => m.contains("object"),
        };
        assert!(named, "a denial that names neither pod nor object: {m:?}");
    }
    let patch = resp.patch.as_ref().map(|p| {
        assert_eq!(resp.patch_type.as_deref(), Some("JSONPatch"));
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(p)
            .expect("base64");
        serde_json::from_slice::<Value>(&bytes).expect("a JSON patch")
    });
    match hook {
        Hook::Validate => {
            assert!(patch.is_none(), "validation never patches");
            if let Some(new) = &new {
                let f = facts(new);
                let old_alloc = old.as_ref().and_then(|o| facts(o).allocation);
                let writes = match req.operation.as_str() {
                    "CREATE" => f.allocation.is_some(),
                    "UPDATE" => old.is_some() && f.allocation != old_alloc,
                    _ => false,
                };
                if writes && req.user_info.username != SA {
                    assert!(
                        !resp.allowed,
                        "finding 2: a user wrote the allocation: {req:?}"
                    );
                }
                let old_env = old.as_ref().is_some_and(|o| facts(o).reserved_env);
                let checked = req.operation == "CREATE" || (req.operation == "UPDATE" && !old_env);
                if resp.allowed && checked && f.ours {
                    assert!(
                        !f.reserved_env,
                        "finding 15: a Tessera pod set a GPU variable: {req:?}"
                    );
                }
            }
        }
        Hook::Mutate | Hook::MutateAllGpuPods => {
            let wanted = new.as_ref().is_some_and(|p| {
                let f = facts(p);
                let takes = f.claims || (hook == Hook::MutateAllGpuPods && f.stock_resource);
                req.operation == "CREATE" && f.default_scheduler && takes
            });
            if let Some(p) = &patch {
                assert_eq!(
                    p,
                    &json!([{"op": "add", "path": "/spec/schedulerName", "value": "tessera"}])
                );
            }
            if new.is_some() {
                assert_eq!(patch.is_some(), wanted, "finding 3: {req:?}");
            }
            if new.as_ref().is_some_and(|p| facts(p).tessera_resource) && patch.is_some() {
                return "patched";
            }
        }
    }
    if resp.allowed { "allowed" } else { "denied" }
}

#[test]
fn fuzz_admission_review() {
    let config = WebhookConfig {
        scheduler_name: Some("tessera".into()),
        allocation_writers: vec![SA.into()],
        ..WebhookConfig::default()
    };
    let n = cases();
    let mut seeds_rng = rng_for("admission seeds");
    let seeds: Vec<Vec<u8>> = (0..64)
        .map(|_| serde_json::to_vec(&random_review(&mut seeds_rng)).expect("JSON"))
        .collect();
    const HOOKS: [Hook; 3] = [Hook::Validate, Hook::Mutate, Hook::MutateAllGpuPods];
    let tally = fuzz(
        "admission review",
        n,
        |rng| {
            let hook = *HOOKS.choose(rng).unwrap_or(&Hook::Validate);
            let body = if rng.random_ratio(1, 2) {
                Body(serde_json::to_vec(&random_review(rng)).expect("JSON"))
            } else {
                mutated_body(rng, &seeds, REVIEW_STRINGS)
            };
            (hook, body)
        },
        |(hook, body)| match webhook::answer(&config, *hook, &body.0) {
            Ok(out) => judge(*hook, &body.0, &out),
            Err(e) => {
                let m = e.to_string();
                assert!(
                    (m.starts_with("not an AdmissionReview: ") && m.len() > 30)
                        || m == "AdmissionReview has no request",
                    "unclear refusal {m:?}"
                );
                "bad request"
            }
        },
    );
    assert_reached(&tally, n, &["allowed", "denied", "patched", "bad request"]);
}

/// Found by `fuzz_admission_review`: two containers whose CPU (or other
/// integer resource) adds up past u64::MAX make `convert::pod_resources`
/// overflow — a panic at convert.rs:105 (`cpu += …`) in a debug build, a
/// wrapped, wrong request in a release one. Issue 9 finding 18 asks for such
/// sums to be refused; this test passes once they are.
#[test]
#[ignore = "convert::pod_resources does not check its sums yet (issue 9 finding 18)"]
fn quantity_sums_that_overflow_are_refused() {
    let config = WebhookConfig::default();
    let container = |name: &str, cpu: &str, other: &str| {
        json!({"name": name, "resources": {"requests": {
            "tessera.io/gpu": "1", "cpu": cpu, "example.com/foo": other}}})
    };
    for (cpu, other) in [
        ("18446744073709551615m", "1"),
        ("1", "18446744073709551615"),
    ] {
        let review = json!({"request": {"uid": "u", "operation": "CREATE", "object": {
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [container("a", cpu, other), container("b", cpu, other)]}}}});
        let body = serde_json::to_vec(&review).expect("JSON");
        let out = webhook::answer(&config, Hook::Validate, &body).expect("a review");
        let resp = out.response.expect("a response");
        assert!(
            !resp.allowed,
            "{cpu} {other}: a sum past u64::MAX was allowed"
        );
        let m = resp.message().unwrap_or_default();
        assert!(
            m.contains("ml/p") && (m.contains("cpu") || m.contains("example.com/foo")),
            "{m}"
        );
    }
}
