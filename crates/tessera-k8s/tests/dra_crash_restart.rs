//! Crash and restart with `--dra`: Tessera (in-process, `run::run`, standalone
//! mode) allocates pods' ResourceClaims against the API-server double while
//! it is killed after a seeded number of its own API writes (before or after
//! the write lands) and restarted with fresh process state; half the
//! processes also get one write committed but answered `504 Timeout`, and
//! every process one write refused with a `500` that did not commit (a client
//! cannot tell the two apart: a claim write of either kind must keep its
//! devices taken, and must not be taken as landed). The loop is
//! [`apiserver::crash`], shared with `crash_restart.rs`.
//!
//! Per seed: DRA nodes whose GPUs are published as slices (no `GpuNode`),
//! the chart's device classes, and pods using claims. The seed draws a mix
//! of nodes ([`Mix`]): whole GPUs only; whole GPUs and shareable ones
//! (`allowMultipleAllocations`, consumable `memory` and `compute`); GPUs in
//! MIG mode only (a counter set per GPU, a device per placement); or all
//! three kinds. Each pod asks one kind that some node has: whole GPUs (one
//! claim of one or two, two one-GPU claims, a claim from a template
//! `one-gpu`/`two-gpu`, or one one-GPU claim shared by two pods), a share
//! (one claim of memory 10–40Gi and compute 125–500 of 1000, from the
//! template `share-20gi`, or shared by two pods), or a MIG placement (one
//! claim of a profile from `1g.10gb` to `7g.80gb`, from the template
//! `mig-1g`, or shared by two pods). A whole-GPU claim may land on a
//! shareable GPU, taking all of it. The demand is drawn between 0.6 and 2
//! times the GPUs (in milli-GPU: a share the larger of its fractions, a
//! placement its compute slices of 7), so in many seeds pods must wait. The
//! policy (`tessera`, `binpack`, `spread`) is drawn too. Pods are deleted now
//! and then, most of them bound (to make room), some not (perhaps while their
//! claims are being written).
//!
//! The double does not run the resourceclaim controller; this test does its
//! job ([`Controller`]): it makes a template's claim for its pod and names it
//! in the pod's `status.resourceClaimStatuses`; it takes deleted pods out of
//! claims' `reservedFor` and, when that empties it, clears the allocation in
//! the same write (the controller's `syncClaim`, with the claim's
//! resourceVersion as precondition); and it deletes claims nobody will use
//! again once they are free (garbage collection of template claims, users
//! deleting theirs).
//!
//! A run is over when every pod has arrived, the deletions are done, the
//! controller has nothing left to do, and no unbound pod fits (by the stored
//! objects). Then the stored objects alone are audited
//! ([`apiserver::dra_check`]): no whole (not shareable) device in two
//! allocated claims; no shareable device with more memory or compute
//! consumed than it has, nor taken whole and shared; no counter set
//! consumed beyond its counters (two MIG placements overlapping); every
//! bound pod's claims allocated on its node and reserved for it, no claim
//! allocated on another node than its pods', no allocation held by nobody.
//! A run that makes no progress for [`QUIET`] while a pod fits has stalled,
//! which fails it too (longer than the scheduler's longest retry backoff,
//! 60 s, and its assumed claims' deadline, 30 s).
//!
//! A run takes a second or two (a MIG-only one up to ten: its pods are
//! many and small); one in ten or so takes 30 s more, where a
//! write failed with its outcome unknown and the scheduler holds what it may
//! have taken until its deadline (an unanswered Binding in the binder, a
//! claim write of a pod deleted before it was retried).
//!
//! Knobs (environment): `TESSERA_DRA_CRASH_RUNS` (seeds, default 24),
//! `TESSERA_DRA_CRASH_SEED` (first seed, default 1), `TESSERA_DRA_CRASH_NODES`
//! (default 4), `TESSERA_DRA_CRASH_GPUS` (per node, default 4),
//! `TESSERA_DRA_CRASH_MAX` (crashes per run at most, default 6; 0 gives runs
//! without crashes), `TESSERA_DRA_CRASH_JOBS` (seeds run at once, default 6),
//! `TESSERA_DRA_CRASH_LATENCY_MS` (`lo-hi`, default `0-2`),
//! `TESSERA_DRA_CRASH_LIST_US` (LIST time per item returned, default 100 µs),
//! `TESSERA_DRA_CRASH_MIX` (`whole`, `shares`, `mig` or `all` for every seed;
//! default drawn per seed).
//! A failure names the seed; rerun it with
//! `TESSERA_DRA_CRASH_SEED=<seed> TESSERA_DRA_CRASH_RUNS=1`.

mod apiserver;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use apiserver::cluster::{bound, node_of, ready_node};
use apiserver::crash::{Look, Plan, env, fail_on, latency, over_seeds, restarts};
use apiserver::dra::{
    claim, classes, mig_claim, mig_slices, pod_with_claims, share_claim, shared_slice, slice,
    standalone_config,
};
use apiserver::dra_check::{DraAudit, audit, fitting, pod_claim_names, reserved_uids};
use apiserver::{ApiServer, Config, Fault, Resource};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use rand::rngs::SmallRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tessera_k8s::dra::write::DELETE_PROTECTION;

const KEY: &[u8] = b"dra-crash-restart-signing-key!!!";
const NAMESPACE: &str = "work";
/// A run in which a pod fits but nothing moved for this long has stalled.
const QUIET: Duration = Duration::from_secs(90);
/// The templates the workload's pods name (the controller makes their
/// claims, [`template_claim`]): whole GPUs, a share, a MIG placement.
const WHOLE_TEMPLATES: [&str; 2] = ["one-gpu", "two-gpu"];
const SHARE_TEMPLATE: (&str, OneDevice) = ("share-20gi", OneDevice::Share("20Gi", 250));
const MIG_TEMPLATE: (&str, OneDevice) = ("mig-1g", OneDevice::Mig("1g.10gb", 1));
/// Shares the workload asks: memory, and compute of 1000.
const SHARES: [(&str, u32); 4] = [("10Gi", 125), ("20Gi", 250), ("40Gi", 500), ("20Gi", 500)];
/// MIG profiles the workload asks (the small one more often), and their
/// compute slices of the A100's 7.
const PROFILES: [(&str, u64); 6] = [
    ("1g.10gb", 1),
    ("1g.10gb", 1),
    ("2g.20gb", 2),
    ("3g.40gb", 3),
    ("4g.40gb", 4),
    ("7g.80gb", 7),
];

/// What a claim of one device asks.
#[derive(Debug, Clone, Copy)]
enum OneDevice {
    Whole,
    /// Memory (`20Gi`) and compute (of 1000).
    Share(&'static str, u32),
    /// Profile, and its compute slices of 7.
    Mig(&'static str, u64),
}

impl OneDevice {
    fn claim(self, name: &str) -> Value {
        match self {
            OneDevice::Whole => claim(NAMESPACE, name, "gpu.tessera.io", 1),
            OneDevice::Share(memory, compute) => share_claim(NAMESPACE, name, memory, compute),
            OneDevice::Mig(profile, _) => mig_claim(NAMESPACE, name, profile),
        }
    }

    /// In milli-GPU: a share the larger of its memory (of 80Gi) and compute
    /// fractions, a placement its compute slices of 7.
    fn demand(self) -> u64 {
        match self {
            OneDevice::Whole => 1000,
            OneDevice::Share(memory, compute) => {
                let gi: u64 = memory.trim_end_matches("Gi").parse().unwrap_or(80);
                (gi * 1000 / 80).max(u64::from(compute))
            }
            OneDevice::Mig(_, slices) => slices * 1000 / 7,
        }
    }
}

/// The claim `name` the controller makes from `template`.
fn template_claim(name: &str, template: &str) -> Value {
    match template {
        t if t == SHARE_TEMPLATE.0 => SHARE_TEMPLATE.1.claim(name),
        t if t == MIG_TEMPLATE.0 => MIG_TEMPLATE.1.claim(name),
        "two-gpu" => claim(NAMESPACE, name, "gpu.tessera.io", 2),
        _ => OneDevice::Whole.claim(name),
    }
}

/// How a node publishes its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NodeKind {
    /// Whole GPUs, one claim each ([`slice`]).
    Dedicated,
    /// Shareable GPUs, consumable memory and compute ([`shared_slice`]).
    Shared,
    /// GPUs in MIG mode, a device per placement ([`mig_slices`]).
    Mig,
}

/// Which kinds of node a seed has (and so which claims its pods make).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mix {
    Whole = 0,
    Shares = 1,
    Mig = 2,
    All = 3,
}

impl Mix {
    fn kinds(self) -> &'static [NodeKind] {
        match self {
            Mix::Whole => &[NodeKind::Dedicated],
            Mix::Shares => &[NodeKind::Dedicated, NodeKind::Shared],
            Mix::Mig => &[NodeKind::Mig],
            Mix::All => &[NodeKind::Dedicated, NodeKind::Shared, NodeKind::Mig],
        }
    }
}

/// The seed's nodes' kinds: each of `mix`'s once (as far as there are
/// nodes), the rest drawn.
fn node_kinds(rng: &mut SmallRng, mix: Mix, nodes: usize) -> Vec<NodeKind> {
    let kinds = mix.kinds();
    (0..nodes)
        .map(|i| match kinds.get(i) {
            Some(k) => *k,
            None => *kinds.choose(rng).unwrap_or(&NodeKind::Dedicated),
        })
        .collect()
}

/// One pod of the workload and the claims created just before it.
struct Item {
    pod: Value,
    claims: Vec<Value>,
}

/// What a pod's claims ask.
#[derive(Debug, Clone, Copy)]
enum PodKind {
    Whole,
    Share,
    Mig,
}

/// The workload: pods until what they ask reaches `load` times `capacity`
/// (both in milli-GPU: a whole GPU 1000, a share the larger of its memory
/// and compute fractions, a MIG placement its compute slices of 7), and who
/// uses each direct claim (for collecting it once they are all gone). Pods
/// ask what `kinds` of node there are: whole GPUs where some node is not in
/// MIG mode, shares where some is shareable, placements where some is in
/// MIG mode; each pod one kind.
fn workload(
    rng: &mut SmallRng,
    kinds: &[NodeKind],
    capacity: u64,
    load: f64,
) -> (Vec<Item>, HashMap<String, Vec<String>>) {
    let mut pod_kinds = Vec::new();
    if kinds.iter().any(|k| *k != NodeKind::Mig) {
        pod_kinds.push(PodKind::Whole);
    }
    if kinds.contains(&NodeKind::Shared) {
        pod_kinds.push(PodKind::Share);
    }
    if kinds.contains(&NodeKind::Mig) {
        pod_kinds.push(PodKind::Mig);
    }
    let mut items = Vec::new();
    let mut users: HashMap<String, Vec<String>> = HashMap::new();
    let mut demand = 0u64;
    let mut i = 0;
    while (demand as f64) < load * capacity as f64 {
        let name = format!("pod-{i:03}");
        i += 1;
        let roll: f64 = rng.random();
        let kind = *pod_kinds.choose(rng).unwrap_or(&PodKind::Whole);
        // A pod using `claims` directly, one entry each.
        let direct = |claims: Vec<Value>| {
            let entries: Vec<(String, String)> = claims
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    let claim = c["metadata"]["name"].as_str().unwrap_or_default();
                    (format!("gpu{k}"), claim.to_string())
                })
                .collect();
            let refs: Vec<(&str, Result<&str, &str>)> = entries
                .iter()
                .map(|(e, c)| (e.as_str(), Ok(c.as_str())))
                .collect();
            Item {
                pod: pod_with_claims(NAMESPACE, &name, &refs),
                claims,
            }
        };
        let templated = |template: &str| Item {
            pod: pod_with_claims(NAMESPACE, &name, &[("gpu", Err(template))]),
            claims: Vec::new(),
        };
        let claim_name = |k: usize| format!("{name}-c{k}");
        let shared = format!("{name}-shared");
        // The claim of one device this pod may use (alone, or with a partner).
        let one = match kind {
            PodKind::Whole => OneDevice::Whole,
            PodKind::Share => {
                let (memory, compute) = *SHARES.choose(rng).unwrap_or(&SHARES[0]);
                OneDevice::Share(memory, compute)
            }
            PodKind::Mig => {
                let (profile, slices) = *PROFILES.choose(rng).unwrap_or(&PROFILES[0]);
                OneDevice::Mig(profile, slices)
            }
        };
        let item = match kind {
            PodKind::Whole if roll < 0.40 => {
                demand += 1000;
                direct(vec![claim(NAMESPACE, &claim_name(0), "gpu.tessera.io", 1)])
            }
            PodKind::Whole if roll < 0.60 => {
                demand += 2000;
                direct(vec![claim(NAMESPACE, &claim_name(0), "gpu.tessera.io", 2)])
            }
            PodKind::Whole if roll < 0.75 => {
                demand += 2000;
                direct(vec![
                    claim(NAMESPACE, &claim_name(0), "gpu.tessera.io", 1),
                    claim(NAMESPACE, &claim_name(1), "gpu.tessera.io", 1),
                ])
            }
            PodKind::Whole if roll < 0.90 => {
                let two = rng.random_bool(0.3);
                demand += if two { 2000 } else { 1000 };
                templated(WHOLE_TEMPLATES[usize::from(two)])
            }
            PodKind::Share | PodKind::Mig if roll < 0.70 => {
                demand += one.demand();
                direct(vec![one.claim(&claim_name(0))])
            }
            PodKind::Share if roll < 0.85 => {
                demand += SHARE_TEMPLATE.1.demand();
                templated(SHARE_TEMPLATE.0)
            }
            PodKind::Mig if roll < 0.85 => {
                demand += MIG_TEMPLATE.1.demand();
                templated(MIG_TEMPLATE.0)
            }
            _ => {
                // Two pods sharing one claim of one device (a whole GPU, a
                // share or a placement).
                demand += one.demand();
                let partner = format!("pod-{i:03}");
                i += 1;
                users.insert(
                    format!("{NAMESPACE}/{shared}"),
                    vec![name.clone(), partner.clone()],
                );
                items.push(Item {
                    pod: pod_with_claims(NAMESPACE, &name, &[("gpu", Ok(&shared))]),
                    claims: vec![one.claim(&shared)],
                });
                Item {
                    pod: pod_with_claims(NAMESPACE, &partner, &[("gpu", Ok(&shared))]),
                    claims: Vec::new(),
                }
            }
        };
        for c in &item.claims {
            let key = format!(
                "{NAMESPACE}/{}",
                c["metadata"]["name"].as_str().unwrap_or_default()
            );
            users.entry(key).or_insert_with(|| {
                vec![
                    item.pod["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                ]
            });
        }
        items.push(item);
    }
    (items, users)
}

// ---- the resourceclaim controller's job, and the pods' owners' -------------------------

/// One thing the resourceclaim controller (or a user, or the garbage
/// collector) has to do, judged from stored objects.
#[derive(Debug, Clone)]
enum Chore {
    /// Make the claim of template entry `entry` for pod `pod` and name it in the pod's status.
    Make {
        pod: String,
        uid: String,
        entry: String,
        template: String,
    },
    /// Take deleted pods out of `reservedFor`, and the allocation with the
    /// last of them (`syncClaim`), at resourceVersion `rv`. As the real
    /// controller: the allocation only of a claim carrying
    /// `resource.kubernetes.io/delete-protection` (`protected`), which is then
    /// removed; an unprotected claim keeps its allocation (issue 41, defect 3).
    Release {
        claim: String,
        rv: String,
        keep: Vec<Value>,
        protected: bool,
    },
    /// Delete a free claim nobody will use again.
    Collect { claim: String },
    /// Remove `resource.kubernetes.io/delete-protection` from a claim being
    /// deleted that holds no allocation, at resourceVersion `rv`, as the real
    /// controller's `syncClaim` does ("remove the finalizer to unblock
    /// removal"): the API server holds a deleted claim while a finalizer is on it.
    Unprotect { claim: String, rv: String },
}

/// What there is to do now. Claims are read before pods: a pod in a claim's
/// `reservedFor` existed before the claim was written, so if it is missing
/// from the later read it was deleted (read the other way round, a pod made
/// and reserved for in between would look deleted).
fn chores(
    server: &ApiServer,
    gone: &BTreeSet<String>,
    users: &HashMap<String, Vec<String>>,
) -> Vec<Chore> {
    let claims: Vec<Value> = server.objects(Resource::Claims);
    let pods: Vec<Value> = server.objects(Resource::Pods);
    let live: BTreeSet<&str> = pods
        .iter()
        .filter_map(|p| p.pointer("/metadata/uid").and_then(Value::as_str))
        .collect();
    let mut out = Vec::new();
    for p in &pods {
        let name = p["metadata"]["name"].as_str().unwrap_or_default();
        let uid = p["metadata"]["uid"].as_str().unwrap_or_default();
        let templates: BTreeMap<&str, &str> = p
            .pointer("/spec/resourceClaims")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?,
                    e["resourceClaimTemplateName"].as_str()?,
                ))
            })
            .collect();
        for entry in pod_claim_names(p).into_iter().filter_map(Result::err) {
            if let Some(t) = templates.get(entry.as_str()) {
                out.push(Chore::Make {
                    pod: name.to_string(),
                    uid: uid.to_string(),
                    entry,
                    template: t.to_string(),
                });
            }
        }
    }
    for c in &claims {
        let name = c["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let reserved: Vec<Value> = c
            .pointer("/status/reservedFor")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let keep: Vec<Value> = reserved
            .iter()
            .filter(|r| r["uid"].as_str().is_some_and(|u| live.contains(u)))
            .cloned()
            .collect();
        if keep.len() < reserved.len() {
            out.push(Chore::Release {
                claim: name,
                rv: c["metadata"]["resourceVersion"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
                keep,
                protected: c
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .is_some_and(|f| f.iter().any(|x| x == DELETE_PROTECTION)),
            });
            continue;
        }
        let allocated = c
            .pointer("/status/allocation")
            .is_some_and(|a| !a.is_null());
        if c.pointer("/metadata/deletionTimestamp")
            .is_some_and(|t| !t.is_null())
        {
            let protected = c
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .is_some_and(|f| f.iter().any(|x| x == DELETE_PROTECTION));
            if protected && !allocated {
                out.push(Chore::Unprotect {
                    claim: name,
                    rv: c["metadata"]["resourceVersion"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                });
            }
            continue;
        }
        let owners: Vec<&str> = c
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|o| o["uid"].as_str())
            .collect();
        let unused = if owners.is_empty() {
            users
                .get(&format!("{NAMESPACE}/{name}"))
                .is_some_and(|u| u.iter().all(|p| gone.contains(p)))
        } else {
            owners.iter().all(|o| !live.contains(o))
        };
        if unused && !allocated && reserved_uids(c).is_empty() {
            out.push(Chore::Collect { claim: name });
        }
    }
    out
}

/// What the world outside the scheduler has done so far.
#[derive(Debug, Default)]
struct Churn {
    arrived: usize,
    deletions_left: usize,
    /// Deleted pods, by name.
    gone: BTreeSet<String>,
    /// Of them, bound when deleted.
    deleted_bound: u64,
}

/// Arrivals, deletions and the resourceclaim controller, on one task.
struct Controller {
    task: tokio::task::JoinHandle<()>,
    /// Its session's id (its writes are not the scheduler's).
    session: u64,
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn claims_api(client: kube::Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client,
        NAMESPACE,
        &ApiResource {
            group: "resource.k8s.io".into(),
            version: "v1".into(),
            api_version: "resource.k8s.io/v1".into(),
            kind: "ResourceClaim".into(),
            plural: "resourceclaims".into(),
        },
    )
}

async fn perform(server: &ApiServer, client: &kube::Client, chore: Chore) {
    let claims = claims_api(client.clone());
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), NAMESPACE);
    // Failures (a 409 among them) are left for the next sweep, as the controller's requeue.
    match chore {
        Chore::Make {
            pod,
            uid,
            entry,
            template,
        } => {
            let name = format!("{pod}-{entry}");
            let mut c = template_claim(&name, &template);
            c["metadata"]["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Pod",
                "name": pod, "uid": uid, "controller": true, "blockOwnerDeletion": true}]);
            c["metadata"]["annotations"] = json!({"resource.kubernetes.io/pod-claim-name": entry});
            if server.get(Resource::Claims, NAMESPACE, &name).is_none() {
                let Ok(obj) = serde_json::from_value::<DynamicObject>(c) else {
                    return;
                };
                if claims.create(&PostParams::default(), &obj).await.is_err() {
                    return;
                }
            }
            let _ = pods
                .patch_status(
                    &pod,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"uid": uid},
                        "status": {"resourceClaimStatuses": [
                        {"name": entry, "resourceClaimName": name}]}})),
                )
                .await;
        }
        Chore::Release {
            claim,
            rv,
            keep,
            protected,
        } => {
            let status = if keep.is_empty() && protected {
                json!({"reservedFor": null, "allocation": null})
            } else if keep.is_empty() {
                json!({"reservedFor": null})
            } else {
                json!({"reservedFor": keep})
            };
            let Ok(after) = claims
                .patch_status(
                    &claim,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"resourceVersion": rv}, "status": status})),
                )
                .await
            else {
                return;
            };
            if keep.is_empty() && protected {
                let after = serde_json::to_value(after).unwrap_or_default();
                let rest: Vec<Value> = after
                    .pointer("/metadata/finalizers")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter(|f| *f != DELETE_PROTECTION)
                    .cloned()
                    .collect();
                let _ = claims
                    .patch(
                        &claim,
                        &PatchParams::default(),
                        &Patch::Merge(json!({"metadata": {
                            "resourceVersion": after["metadata"]["resourceVersion"],
                            "finalizers": rest}})),
                    )
                    .await;
            }
        }
        Chore::Collect { claim } => {
            let _ = claims.delete(&claim, &DeleteParams::default()).await;
        }
        Chore::Unprotect { claim, rv } => {
            let Ok(c) = claims.get(&claim).await else {
                return;
            };
            let c = serde_json::to_value(c).unwrap_or_default();
            let rest: Vec<Value> = c
                .pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter(|f| *f != DELETE_PROTECTION)
                .cloned()
                .collect();
            let _ = claims
                .patch(
                    &claim,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"metadata": {"resourceVersion": rv, "finalizers": rest}})),
                )
                .await;
        }
    }
}

impl Controller {
    /// Starts creating `items` (half at once, the rest three every 20 ms),
    /// deleting pods (`churn.deletions_left` of them, one every 20–250 ms once
    /// some are bound: four in five bound ones, else any) and doing the chores.
    fn spawn(
        server: &ApiServer,
        mut items: Vec<Item>,
        users: Arc<HashMap<String, Vec<String>>>,
        churn: Arc<Mutex<Churn>>,
        seed: u64,
    ) -> Controller {
        let (client, session) = server.client();
        let server = server.clone();
        let create = |server: &ApiServer, churn: &Mutex<Churn>, item: Item| {
            for c in &item.claims {
                server.create(Resource::Claims, c).expect("claim");
            }
            server.create(Resource::Pods, &item.pod).expect("pod");
            churn.lock().unwrap().arrived += 1;
        };
        let later = items.split_off(items.len() / 2);
        for item in items {
            create(&server, &churn, item);
        }
        let task = tokio::spawn(async move {
            let mut rng = SmallRng::seed_from_u64(seed ^ 0xd1a5_c0de);
            let mut later = later.into_iter();
            let mut next_arrival = Instant::now();
            let mut next_deletion = Instant::now();
            let pods: Api<k8s_openapi::api::core::v1::Pod> =
                Api::namespaced(client.clone(), NAMESPACE);
            loop {
                let now = Instant::now();
                if now >= next_arrival {
                    for item in later.by_ref().take(3) {
                        create(&server, &churn, item);
                    }
                    next_arrival = now + Duration::from_millis(20);
                }
                let left = churn.lock().unwrap().deletions_left;
                if left > 0 && now >= next_deletion {
                    let all: Vec<Value> = server.objects(Resource::Pods);
                    let bound: Vec<&Value> = all.iter().filter(|p| node_of(p).is_some()).collect();
                    let victim = if rng.random_bool(0.8) {
                        bound.choose(&mut rng).copied()
                    } else {
                        all.choose(&mut rng)
                    };
                    if let Some(p) = victim {
                        let name = p["metadata"]["name"]
                            .as_str()
                            .unwrap_or_default()
                            .to_string();
                        let was_bound = node_of(p).is_some();
                        if pods
                            .delete(&name, &DeleteParams::default().grace_period(0))
                            .await
                            .is_ok()
                        {
                            let mut c = churn.lock().unwrap();
                            c.deletions_left -= 1;
                            c.deleted_bound += u64::from(was_bound);
                            c.gone.insert(name);
                        }
                    }
                    next_deletion = now + Duration::from_millis(rng.random_range(20..250));
                }
                let gone = churn.lock().unwrap().gone.clone();
                for chore in chores(&server, &gone, &users) {
                    perform(&server, &client, chore).await;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Controller {
            task,
            session: session.id,
        }
    }
}

// ---- one seed ---------------------------------------------------------------------------

/// What happened in one seeded run.
struct Run {
    seed: u64,
    policy: &'static str,
    mix: Mix,
    kinds: Vec<NodeKind>,
    /// Allocated claims at the end: whole GPUs, shares, MIG placements.
    held: (usize, usize, usize),
    crashes: Vec<(u64, Fault, u64)>,
    stalled: bool,
    exits: Vec<String>,
    audit: DraAudit,
    /// Unbound pods that fit at the end (a stalled run's).
    fitting: Vec<String>,
    deleted: usize,
    /// The scheduler's writes: all, claim status writes, of them answered
    /// 500 or 504 (the faults), Bindings answered 201.
    writes: (usize, usize, usize, usize),
    /// How the doubly allocated devices came about.
    evidence: Vec<String>,
    elapsed: Duration,
}

async fn run_seed(seed: u64, nodes: usize, gpus: u32, key_file: &std::path::Path) -> Run {
    let max_crashes: usize = env("TESSERA_DRA_CRASH_MAX", 6);
    let started = Instant::now();
    let mut rng = SmallRng::seed_from_u64(seed);
    let server = ApiServer::new(Config {
        latency: latency("TESSERA_DRA_CRASH_LATENCY_MS", "0-2"),
        seed,
        watch_window: 20_000,
        // Watches end every few seconds, so restarts of watches happen too.
        watch_timeout_cap: Some(Duration::from_millis(rng.random_range(1_000..5_000))),
        list_latency_per_item: Duration::from_micros(env("TESSERA_DRA_CRASH_LIST_US", 100)),
    });
    let drawn = *[Mix::Whole, Mix::Shares, Mix::Mig, Mix::All]
        .choose(&mut rng)
        .unwrap_or(&Mix::Whole);
    let mix = match std::env::var("TESSERA_DRA_CRASH_MIX").as_deref() {
        Ok("whole") => Mix::Whole,
        Ok("shares") => Mix::Shares,
        Ok("mig") => Mix::Mig,
        Ok("all") => Mix::All,
        _ => drawn,
    };
    let kinds = node_kinds(&mut rng, mix, nodes);
    for (i, kind) in kinds.iter().enumerate() {
        let name = format!("dra-node-{i}");
        server
            .create(Resource::Nodes, &ready_node(&name))
            .expect("node");
        let published = match kind {
            NodeKind::Dedicated => vec![slice(&name, gpus)],
            NodeKind::Shared => vec![shared_slice(&name, gpus)],
            NodeKind::Mig => mig_slices(&name, gpus),
        };
        for s in &published {
            server.create(Resource::Slices, s).expect("slice");
        }
    }
    for c in classes() {
        server.create(Resource::DeviceClasses, &c).expect("class");
    }
    let capacity = nodes as u64 * u64::from(gpus) * 1000;
    let load = rng.random_range(0.6..2.0);
    let (items, users) = workload(&mut rng, &kinds, capacity, load);
    let total = items.len();
    let policy = *["tessera", "binpack", "spread"]
        .choose(&mut rng)
        .unwrap_or(&"tessera");
    let churn = Arc::new(Mutex::new(Churn {
        deletions_left: rng.random_range(0..=total / 2),
        ..Churn::default()
    }));
    let users = Arc::new(users);
    let controller = Controller::spawn(&server, items, users.clone(), churn.clone(), seed);
    let base = standalone_config(key_file, policy);
    // A pod takes one or two claim writes, a Binding and an event or more.
    let plan = Plan {
        max_crashes,
        span: (total as u64).max(5),
        quiet: QUIET,
        uncommitted: true,
    };
    let run = restarts(
        &server,
        &base,
        &mut rng,
        &plan,
        |_| {},
        || {
            let c = churn.lock().unwrap();
            let progress = bound(&server) as u64 + c.deleted_bound;
            let settled = c.arrived == total && c.deletions_left == 0;
            let gone = c.gone.clone();
            drop(c);
            let done =
                settled && chores(&server, &gone, &users).is_empty() && fitting(&server).is_empty();
            Look { progress, done }
        },
    )
    .await;
    let controller_session = controller.session;
    drop(controller);
    let audit = audit(&server);
    let fitting = fitting(&server);
    let all = server.writes();
    let ours: Vec<_> = all
        .iter()
        .filter(|w| w.session != controller_session)
        .collect();
    let claim_writes = ours
        .iter()
        .filter(|w| w.resource == "resourceclaims" && w.subresource == "status")
        .count();
    let claim_faults = ours
        .iter()
        .filter(|w| w.resource == "resourceclaims" && w.subresource == "status")
        .filter(|w| w.status == 500 || w.status == 504)
        .count();
    let binds = ours
        .iter()
        .filter(|w| w.subresource == "binding" && w.status == 201)
        .count();
    let evidence = explain(&server, &audit, controller_session);
    let deleted = churn.lock().unwrap().gone.len();
    let held = held_by_kind(&server);
    Run {
        seed,
        policy,
        mix,
        kinds,
        held,
        crashes: run.crashes,
        stalled: run.stalled,
        exits: run.exits,
        audit,
        fitting,
        deleted,
        writes: (ours.len(), claim_writes, claim_faults, binds),
        evidence,
        elapsed: started.elapsed(),
    }
}

/// Allocated claims by what they ask: whole GPUs, shares, MIG placements.
fn held_by_kind(server: &ApiServer) -> (usize, usize, usize) {
    let mut held = (0, 0, 0);
    for c in server.objects::<Value>(Resource::Claims) {
        if c.pointer("/status/allocation").is_none_or(Value::is_null) {
            continue;
        }
        let request = c.pointer("/spec/devices/requests/0/exactly");
        let class = request.and_then(|r| r["deviceClassName"].as_str());
        if class == Some("mig.tessera.io") {
            held.2 += 1;
        } else if request.is_some_and(|r| r.pointer("/capacity/requests").is_some()) {
            held.1 += 1;
        } else {
            held.0 += 1;
        }
    }
    held
}

/// How the claims a violation is about came to be: every write of each,
/// and of the pods the violation names, in order, by which process (how long
/// after it started, and when its LIST of claims had been answered).
fn explain(server: &ApiServer, audit: &DraAudit, controller: u64) -> Vec<String> {
    let writes = server.writes();
    let mut lines = Vec::new();
    for (claim, pods) in &audit.suspects {
        let is = |resource: &str, key: &str, w: &apiserver::WriteRecord| {
            let (ns, name) = key.split_once('/').unwrap_or(("", key));
            w.resource == resource && w.namespace == ns && w.name == name
        };
        lines.push(format!("{claim}, pods {pods:?}:"));
        for w in writes
            .iter()
            .filter(|w| is("resourceclaims", claim, w) || pods.iter().any(|p| is("pods", p, w)))
        {
            let who = if w.session == controller {
                "the controller".to_string()
            } else {
                format!("process {}", w.session)
            };
            let times = server.session_times(w.session);
            let since = |t: Instant| {
                times.as_ref().map_or_else(String::new, |(s, _)| {
                    format!("+{} ms", t.saturating_duration_since(*s).as_millis())
                })
            };
            let listed = times
                .as_ref()
                .and_then(|(_, l)| l.get("resourceclaims").copied())
                .map_or_else(|| "never".into(), since);
            lines.push(format!(
                "  {} {}/{}{} by {who} at {} (claims listed at {listed}): {}, rv {}",
                w.method,
                w.resource,
                w.name,
                if w.subresource.is_empty() {
                    String::new()
                } else {
                    format!("/{}", w.subresource)
                },
                since(w.at),
                w.status,
                w.rv
            ));
        }
    }
    lines
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_claims_survive_crashes_at_random_writes() {
    let runs: u64 = env("TESSERA_DRA_CRASH_RUNS", 24);
    let nodes: usize = env("TESSERA_DRA_CRASH_NODES", 4);
    let gpus: u32 = env("TESSERA_DRA_CRASH_GPUS", 4);
    let first: u64 = env("TESSERA_DRA_CRASH_SEED", 1);
    let jobs: usize = env("TESSERA_DRA_CRASH_JOBS", 6);
    let dir = tempfile::tempdir().expect("temp dir");
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, KEY).expect("key file");
    let key_file = &key_file;
    let started = Instant::now();
    let mut totals = (0, 0, 0, 0, 0, 0, 0, 0);
    // Seeds by mix (whole only, whole and shares, MIG only, all three), and
    // the claims allocated at their ends: whole GPUs, shares, placements.
    let mut mixes = [0usize; 4];
    let mut held = (0, 0, 0);
    let failures = over_seeds(
        first..first + runs,
        jobs,
        |seed| run_seed(seed, nodes, gpus, key_file),
        |run: Run| {
            let mut problems = run.audit.violations.clone();
            problems.extend(run.exits.iter().cloned());
            if run.stalled {
                problems.push(format!(
                    "stalled: nothing moved for {QUIET:?} while these pods fit: {:?}",
                    run.fitting
                ));
            }
            totals.0 += run.crashes.len();
            totals.1 += run.writes.0;
            totals.2 += run.writes.1;
            totals.3 += run.writes.2;
            totals.4 += run.writes.3;
            totals.5 += run.audit.pods + run.deleted;
            totals.6 += run.audit.bound;
            totals.7 += problems.len();
            mixes[run.mix as usize] += 1;
            held.0 += run.held.0;
            held.1 += run.held.1;
            held.2 += run.held.2;
            eprintln!(
                "seed {}: {:?}, nodes {:?}, {} pods ({} deleted), policy {}, {} crashes (write k, kind, progress then) {:?}; {} writes ({} claim, {} of them 500/504; {} binds); {} of {} bound, {} of {} claims allocated ({} whole, {} shares, {} MIG); {} problems; {:.1?}",
                run.seed,
                run.mix,
                run.kinds,
                run.audit.pods + run.deleted,
                run.deleted,
                run.policy,
                run.crashes.len(),
                run.crashes,
                run.writes.0,
                run.writes.1,
                run.writes.2,
                run.writes.3,
                run.audit.bound,
                run.audit.pods,
                run.audit.allocated,
                run.audit.claims,
                run.held.0,
                run.held.1,
                run.held.2,
                problems.len(),
                run.elapsed
            );
            for p in &problems {
                eprintln!("  ! {p}");
            }
            for line in &run.evidence {
                eprintln!("  {line}");
            }
            (run.seed, problems)
        },
    )
    .await;
    let (crashes, writes, claim_writes, claim_faults, binds, pods, bound_end, violations) = totals;
    eprintln!(
        "DRA: {runs} runs on {nodes} nodes × {gpus} GPUs ({} whole only, {} whole and shares, {} MIG only, {} all three), {pods} pods, {crashes} crashes, {writes} scheduler writes ({claim_writes} claim writes, {claim_faults} of them answered 500/504; {binds} binds), {bound_end} pods bound at the end ({} whole-GPU, {} share, {} MIG claims allocated), {violations} violations, {} failed runs, {:.1?}",
        mixes[0],
        mixes[1],
        mixes[2],
        mixes[3],
        held.0,
        held.1,
        held.2,
        failures.len(),
        started.elapsed()
    );
    fail_on(
        "DRA",
        runs,
        &failures,
        "TESSERA_DRA_CRASH_SEED=<seed> TESSERA_DRA_CRASH_RUNS=1",
    );
}

/// `c` allocated `device` of `node` (as a share consuming `consumed`, or
/// whole), reserved for `pods`, as the API server would serve it.
fn allocated(c: &mut Value, node: &str, device: &str, consumed: Option<Value>, pods: &[&Value]) {
    let reserved: Vec<Value> = pods
        .iter()
        .map(|p| json!({"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]}))
        .collect();
    let mut result =
        json!({"request": "gpu", "driver": "gpu.tessera.io", "pool": node, "device": device});
    if let Some(consumed) = consumed {
        result["consumedCapacity"] = consumed;
        result["shareID"] = json!(format!(
            "share-{}",
            c["metadata"]["name"].as_str().unwrap_or_default()
        ));
    }
    c["status"] = json!({"allocation": {"devices": {"results": [result]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": reserved});
}

/// A pod using claim `claim`, bound to `node` (or unbound).
fn pod_on(server: &ApiServer, name: &str, claim: &str, node: Option<&str>) -> Value {
    let mut p = pod_with_claims(NAMESPACE, name, &[("gpu", Ok(claim))]);
    if let Some(node) = node {
        p["spec"]["nodeName"] = json!(node);
    }
    server.create(Resource::Pods, &p).expect("pod")
}

/// Stores claim `c`, allocated `device` of `node` (a share if `consumed`)
/// for a new pod `pod` bound there.
fn hold(
    server: &ApiServer,
    mut c: Value,
    pod: &str,
    node: &str,
    device: &str,
    consumed: Option<Value>,
) {
    let name = c["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let p = pod_on(server, pod, &name, Some(node));
    allocated(&mut c, node, device, consumed, &[&p]);
    server.create(Resource::Claims, &c).expect("claim");
}

/// The audit itself: each broken rule, set up by hand in the stored objects,
/// is named (and a sound state passes), so the crash test cannot pass by
/// auditing nothing.
#[tokio::test]
async fn the_audit_names_each_broken_rule() {
    let server = ApiServer::new(Config::default());
    for (n, s) in [
        ("a", vec![slice("a", 2)]),
        ("b", vec![slice("b", 2)]),
        ("s", vec![shared_slice("s", 2)]),
        ("m", mig_slices("m", 1)),
    ] {
        server
            .create(Resource::Nodes, &ready_node(n))
            .expect("node");
        for s in &s {
            server.create(Resource::Slices, s).expect("slice");
        }
    }
    let share = |memory: &str, compute: &str| Some(json!({"memory": memory, "compute": compute}));
    // Sound: p1 on a with c1 = a/gpu-0, reserved for it; two shares filling
    // s/gpu-0 exactly (40Gi + 40Gi of 80Gi, 500 + 500 of 1000); MIG
    // placements 4g.40gb at memory slice 0 and 3g.40gb at 4 filling m/gpu-0
    // (slices 0-3 and 4-7, 4 + 3 of 7 compute slices).
    let p1 = pod_on(&server, "p1", "c1", Some("a"));
    let mut c1 = claim(NAMESPACE, "c1", "gpu.tessera.io", 1);
    allocated(&mut c1, "a", "gpu-0", None, &[&p1]);
    server.create(Resource::Claims, &c1).expect("claim");
    for (c, p) in [("cs1", "ps1"), ("cs2", "ps2")] {
        let sc = share_claim(NAMESPACE, c, "40Gi", 500);
        hold(&server, sc, p, "s", "gpu-0", share("40Gi", "500"));
    }
    for (c, p, d, profile) in [
        ("cm1", "pm1", "gpu-0-mig-4g40gb-0", "4g.40gb"),
        ("cm2", "pm2", "gpu-0-mig-3g40gb-4", "3g.40gb"),
    ] {
        hold(&server, mig_claim(NAMESPACE, c, profile), p, "m", d, None);
    }
    let sound = audit(&server);
    assert!(sound.violations.is_empty(), "{:?}", sound.violations);
    assert_eq!((sound.pods, sound.bound, sound.allocated), (5, 5, 5));
    // p2 on b, but its c2 holds a/gpu-0 too (given twice, and on another node).
    let p2 = pod_on(&server, "p2", "c2", Some("b"));
    let mut c2 = claim(NAMESPACE, "c2", "gpu.tessera.io", 1);
    allocated(&mut c2, "a", "gpu-0", None, &[&p2]);
    server.create(Resource::Claims, &c2).expect("claim");
    // p3 bound with its claim unallocated; c4 allocated for nobody; c5 for p1, which does not use it.
    pod_on(&server, "p3", "c3", Some("b"));
    server
        .create(
            Resource::Claims,
            &claim(NAMESPACE, "c3", "gpu.tessera.io", 1),
        )
        .expect("claim");
    let mut c4 = claim(NAMESPACE, "c4", "gpu.tessera.io", 1);
    allocated(&mut c4, "b", "gpu-1", None, &[]);
    server.create(Resource::Claims, &c4).expect("claim");
    let mut c5 = claim(NAMESPACE, "c5", "gpu.tessera.io", 1);
    allocated(&mut c5, "b", "gpu-7", None, &[&p1]);
    server.create(Resource::Claims, &c5).expect("claim");
    // A third share on the full s/gpu-0: 90Gi of memory, 1100 of compute.
    let c7 = share_claim(NAMESPACE, "c7", "10Gi", 100);
    hold(&server, c7, "p7", "s", "gpu-0", share("10Gi", "100"));
    // s/gpu-1 taken whole (no consumedCapacity) by c8, and shared with c9 too.
    let c8 = claim(NAMESPACE, "c8", "gpu.tessera.io", 1);
    hold(&server, c8, "p8", "s", "gpu-1", None);
    let c9 = share_claim(NAMESPACE, "c9", "1Gi", 1);
    hold(&server, c9, "p9", "s", "gpu-1", share("1Gi", "1"));
    // A 1g.10gb at memory slice 0 on the full m/gpu-0: slice 0 twice, 8 of 7 compute slices.
    let c10 = mig_claim(NAMESPACE, "c10", "1g.10gb");
    hold(&server, c10, "p10", "m", "gpu-0-mig-1g10gb-0", None);
    let broken = audit(&server);
    let want = [
        "device gpu.tessera.io/a/gpu-0 is in 2 allocated claims: work/c1, work/c2",
        "device gpu.tessera.io/s/gpu-0: compute consumed 1100 of 1000 (work/c7 100 + work/cs1 500 + work/cs2 500)",
        "device gpu.tessera.io/s/gpu-0: memory consumed 90Gi of 80Gi (work/c7 10Gi + work/cs1 40Gi + work/cs2 40Gi)",
        "device gpu.tessera.io/s/gpu-1 is taken whole by work/c8 but is in 2 allocations: work/c8, work/c9",
        "device gpu.tessera.io/s/gpu-1: compute consumed 1001 of 1000 (work/c8 (whole) + work/c9 1)",
        "device gpu.tessera.io/s/gpu-1: memory consumed 81Gi of 80Gi (work/c8 (whole) + work/c9 1Gi)",
        "counter set gpu.tessera.io/m/gpu-0-counter-set is over: compute-slices 8 of 7, memory-slice-0 2 of 1 (by work/c10 (gpu-0-mig-1g10gb-0), work/cm2 (gpu-0-mig-3g40gb-4), work/cm1 (gpu-0-mig-4g40gb-0))",
        "pod work/p2 bound to b, but its claim work/c2 is allocated on a",
        "pod work/p3 bound to b, but its claim work/c3 is not allocated",
        "pod work/p3 bound to b, but its claim work/c3 is not reserved for it",
        "claim work/c4 is allocated (Some(\"b\")) but reserved for no pod: orphaned",
        "claim work/c5 is reserved for pod work/p1, which does not use it",
        "claim work/c5: device b/gpu-7 is published by no slice",
    ];
    for w in want {
        assert!(
            broken.violations.iter().any(|v| v == w),
            "missing {w:?} in {:#?}",
            broken.violations
        );
    }
    assert_eq!(
        broken.violations.len(),
        want.len(),
        "{:#?}",
        broken.violations
    );
    assert_eq!(broken.doubles.len(), 1);
    for c in ["work/c7", "work/c8", "work/c9", "work/c10", "work/cm1"] {
        assert!(broken.suspects.contains_key(c), "{c} not suspected");
    }
    // Liveness: nothing unbound; an unbound pod asking one GPU fits (b/gpu-0 is free).
    assert!(fitting(&server).is_empty());
    server
        .create(
            Resource::Claims,
            &claim(NAMESPACE, "c6", "gpu.tessera.io", 1),
        )
        .expect("claim");
    pod_on(&server, "p6", "c6", None);
    assert_eq!(fitting(&server), ["work/p6"]);
}

/// Liveness with shares and MIG placements: an unbound pod fits where a
/// shareable GPU has the capacity it asks left, or a placement of its
/// profile has its counters free; a whole GPU only where nothing of it is
/// taken.
#[tokio::test]
async fn fitting_judges_shares_and_placements() {
    let server = ApiServer::new(Config::default());
    for (n, s) in [("s", vec![shared_slice("s", 1)]), ("m", mig_slices("m", 1))] {
        server
            .create(Resource::Nodes, &ready_node(n))
            .expect("node");
        for s in &s {
            server.create(Resource::Slices, s).expect("slice");
        }
    }
    // s/gpu-0: 60Gi and 500 taken. m/gpu-0: a 3g.40gb at memory slice 4.
    let c = share_claim(NAMESPACE, "held-share", "60Gi", 500);
    hold(
        &server,
        c,
        "p0",
        "s",
        "gpu-0",
        Some(json!({"memory": "60Gi", "compute": "500"})),
    );
    let c = mig_claim(NAMESPACE, "held-mig", "3g.40gb");
    hold(&server, c, "p1", "m", "gpu-0-mig-3g40gb-4", None);
    let asks: [(&str, Value); 7] = [
        // 20Gi + 60Gi = 80Gi, 500 + 500 = 1000: just fits.
        (
            "fits-share",
            share_claim(NAMESPACE, "fits-share", "20Gi", 500),
        ),
        // 21Gi + 60Gi > 80Gi.
        ("big-share", share_claim(NAMESPACE, "big-share", "21Gi", 10)),
        // 501 + 500 > 1000.
        (
            "busy-share",
            share_claim(NAMESPACE, "busy-share", "1Gi", 501),
        ),
        // s/gpu-0 is partly taken; m has no whole GPU.
        ("whole", claim(NAMESPACE, "whole", "gpu.tessera.io", 1)),
        // Slices 0-3 and 4 compute slices are free.
        ("fits-4g", mig_claim(NAMESPACE, "fits-4g", "4g.40gb")),
        ("fits-3g", mig_claim(NAMESPACE, "fits-3g", "3g.40gb")),
        // Needs slices 0-7.
        ("full-7g", mig_claim(NAMESPACE, "full-7g", "7g.80gb")),
    ];
    for (name, c) in &asks {
        server.create(Resource::Claims, c).expect("claim");
        pod_on(&server, &format!("pod-{name}"), name, None);
    }
    assert_eq!(
        fitting(&server),
        [
            "work/pod-fits-3g",
            "work/pod-fits-4g",
            "work/pod-fits-share"
        ]
    );
    // With the 4g.40gb held too, all 7 compute slices are taken: not even a 1g.10gb fits.
    let c = mig_claim(NAMESPACE, "held-4g", "4g.40gb");
    hold(&server, c, "p2", "m", "gpu-0-mig-4g40gb-0", None);
    server
        .create(Resource::Claims, &mig_claim(NAMESPACE, "small", "1g.10gb"))
        .expect("claim");
    pod_on(&server, "pod-small", "small", None);
    assert_eq!(fitting(&server), ["work/pod-fits-share"]);
}
