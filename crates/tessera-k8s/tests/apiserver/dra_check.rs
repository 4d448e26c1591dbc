//! What must hold of DRA claims after any run, judged from the stored pods,
//! ResourceClaims and ResourceSlices alone (never from a scheduler's view,
//! and read as JSON here, not through the scheduler's own types):
//!
//! - no device of driver `gpu.tessera.io` is in two allocated claims (the
//!   test slices publish no consumable capacity, so no device may be shared),
//!   and every allocated device is one a slice publishes, on the node the
//!   claim's node selector names;
//! - every bound pod's claims exist, are allocated on the pod's node and are
//!   reserved for the pod's UID;
//! - every allocated claim is reserved for some pod (an allocation nobody
//!   holds is orphaned: no one would ever release it), and every existing
//!   pod it is reserved for uses it.
//!
//! [`fitting`] says which unbound pods could be placed now, for liveness.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::Value;

use super::cluster::node_of;
use super::{ApiServer, Resource};

/// The driver whose devices are audited.
pub const DRIVER: &str = "gpu.tessera.io";

/// The outcome of an audit.
#[derive(Debug, Default)]
pub struct DraAudit {
    pub pods: usize,
    pub bound: usize,
    pub claims: usize,
    pub allocated: usize,
    /// One line per broken rule.
    pub violations: Vec<String>,
    /// Devices (`pool/device`) in more than one allocated claim, and those claims.
    pub doubles: Vec<(String, Vec<String>)>,
    /// Claims (`namespace/name`) some violation is about, and the pods it names.
    pub suspects: BTreeMap<String, BTreeSet<String>>,
}

impl DraAudit {
    fn broken(&mut self, claim: &str, pod: Option<&str>, line: String) {
        let pods = self.suspects.entry(claim.to_string()).or_default();
        pods.extend(pod.map(str::to_string));
        self.violations.push(line);
    }
}

fn str_at<'a>(v: &'a Value, pointer: &str) -> &'a str {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .unwrap_or_default()
}

fn key(v: &Value) -> String {
    format!(
        "{}/{}",
        str_at(v, "/metadata/namespace"),
        str_at(v, "/metadata/name")
    )
}

fn allocation(claim: &Value) -> Option<&Value> {
    claim.pointer("/status/allocation").filter(|a| !a.is_null())
}

/// `(driver, pool, device)` of each of an allocated claim's results.
fn results(claim: &Value) -> Vec<(String, String, String)> {
    allocation(claim)
        .and_then(|a| a.pointer("/devices/results"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            (
                str_at(r, "/driver").to_string(),
                str_at(r, "/pool").to_string(),
                str_at(r, "/device").to_string(),
            )
        })
        .collect()
}

/// The node an allocation's node selector names (`metadata.name In [node]`).
pub fn claim_node(claim: &Value) -> Option<String> {
    let terms = allocation(claim)?
        .pointer("/nodeSelector/nodeSelectorTerms")?
        .as_array()?;
    let mut nodes = terms.iter().flat_map(|t| {
        t.get("matchFields")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|f| str_at(f, "/key") == "metadata.name" && str_at(f, "/operator") == "In")
            .flat_map(|f| {
                f.get("values")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
            })
            .filter_map(Value::as_str)
    });
    let first = nodes.next()?.to_string();
    nodes.all(|n| n == first).then_some(first)
}

/// UIDs in a claim's `status.reservedFor`.
pub fn reserved_uids(claim: &Value) -> Vec<String> {
    claim
        .pointer("/status/reservedFor")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r.get("uid").and_then(Value::as_str).map(str::to_string))
        .collect()
}

/// The names of the claims a pod uses, per `spec.resourceClaims` entry: the
/// claim's name, or `Err(entry)` for a template entry whose claim
/// `status.resourceClaimStatuses` does not name yet. An entry the
/// controller said needs no claim is left out.
pub fn pod_claim_names(pod: &Value) -> Vec<Result<String, String>> {
    let statuses = pod
        .pointer("/status/resourceClaimStatuses")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    pod.pointer("/spec/resourceClaims")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|e| {
            let entry = str_at(e, "/name");
            if let Some(n) = e.get("resourceClaimName").and_then(Value::as_str) {
                return Some(Ok(n.to_string()));
            }
            match statuses.iter().find(|s| str_at(s, "/name") == entry) {
                None => Some(Err(entry.to_string())),
                Some(s) => s
                    .get("resourceClaimName")
                    .and_then(Value::as_str)
                    .map(|n| Ok(n.to_string())),
            }
        })
        .collect()
}

/// Devices our slices publish, per node: `node → {device}` (the test slices'
/// pool is their node).
fn published(slices: &[Value]) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in slices
        .iter()
        .filter(|s| str_at(s, "/spec/driver") == DRIVER)
    {
        let pool = str_at(s, "/spec/pool/name").to_string();
        let devices = s
            .pointer("/spec/devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|d| str_at(d, "/name").to_string());
        out.entry(pool).or_default().extend(devices);
    }
    out
}

fn claims_by_key(claims: &[Value]) -> HashMap<String, &Value> {
    claims.iter().map(|c| (key(c), c)).collect()
}

/// Checks the stored claims against the stored pods and slices.
pub fn audit(server: &ApiServer) -> DraAudit {
    let pods: Vec<Value> = server.objects(Resource::Pods);
    let claims: Vec<Value> = server.objects(Resource::Claims);
    let slices: Vec<Value> = server.objects(Resource::Slices);
    let devices = published(&slices);
    let by_key = claims_by_key(&claims);
    let mut a = DraAudit {
        pods: pods.len(),
        bound: pods.iter().filter(|p| node_of(p).is_some()).count(),
        claims: claims.len(),
        allocated: claims.iter().filter(|c| allocation(c).is_some()).count(),
        ..DraAudit::default()
    };
    // Devices: who holds each, and whether it exists on the claim's node.
    let mut holders: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for c in claims.iter().filter(|c| allocation(c).is_some()) {
        let name = key(c);
        let node = claim_node(c);
        for (driver, pool, device) in results(c) {
            if driver != DRIVER {
                continue;
            }
            if node.as_deref() != Some(pool.as_str()) {
                a.broken(&name, None, format!(
                    "claim {name}: device {pool}/{device} is not on the node its selector names ({node:?})"
                ));
            }
            if !devices.get(&pool).is_some_and(|d| d.contains(&device)) {
                a.broken(
                    &name,
                    None,
                    format!("claim {name}: device {pool}/{device} is published by no slice"),
                );
            }
            holders
                .entry(format!("{pool}/{device}"))
                .or_default()
                .push(name.clone());
        }
    }
    for (device, held) in holders.into_iter().filter(|(_, h)| h.len() > 1) {
        for c in &held {
            a.suspects.entry(c.clone()).or_default();
        }
        a.violations.push(format!(
            "device {DRIVER}/{device} is in {} allocated claims: {}",
            held.len(),
            held.join(", ")
        ));
        a.doubles.push((device, held));
    }
    // Bound pods: each claim allocated on the pod's node and reserved for it.
    let mut uses: HashMap<String, BTreeSet<String>> = HashMap::new();
    for p in &pods {
        let pod = key(p);
        let uid = str_at(p, "/metadata/uid");
        let ns = str_at(p, "/metadata/namespace");
        for name in pod_claim_names(p) {
            let Ok(name) = name else {
                if let (Some(node), Err(entry)) = (node_of(p), name) {
                    a.violations.push(format!(
                        "pod {pod} bound to {node} before its claim for entry {entry:?} exists"
                    ));
                }
                continue;
            };
            let claim = format!("{ns}/{name}");
            uses.entry(uid.to_string())
                .or_default()
                .insert(claim.clone());
            let Some(node) = node_of(p) else { continue };
            let Some(c) = by_key.get(&claim) else {
                a.broken(
                    &claim,
                    Some(&pod),
                    format!("pod {pod} bound to {node}, but its claim {claim} does not exist"),
                );
                continue;
            };
            match claim_node(c) {
                None => a.broken(
                    &claim,
                    Some(&pod),
                    format!("pod {pod} bound to {node}, but its claim {claim} is not allocated"),
                ),
                Some(n) if n != node => a.broken(
                    &claim,
                    Some(&pod),
                    format!("pod {pod} bound to {node}, but its claim {claim} is allocated on {n}"),
                ),
                Some(_) => {}
            }
            if !reserved_uids(c).iter().any(|u| u == uid) {
                a.broken(
                    &claim,
                    Some(&pod),
                    format!(
                        "pod {pod} bound to {node}, but its claim {claim} is not reserved for it"
                    ),
                );
            }
        }
    }
    // Allocated claims: held by someone, and only by pods that use them.
    let live: HashMap<&str, &Value> = pods
        .iter()
        .map(|p| (str_at(p, "/metadata/uid"), p))
        .collect();
    for c in claims.iter().filter(|c| allocation(c).is_some()) {
        let name = key(c);
        let reserved = reserved_uids(c);
        if reserved.is_empty() {
            let line = format!(
                "claim {name} is allocated ({:?}) but reserved for no pod: orphaned",
                claim_node(c)
            );
            a.broken(&name, None, line);
        }
        for uid in &reserved {
            let Some(p) = live.get(uid.as_str()) else {
                continue;
            };
            if !uses.get(uid).is_some_and(|u| u.contains(&name)) {
                let pod = key(p);
                let line = format!("claim {name} is reserved for pod {pod}, which does not use it");
                a.broken(&name, Some(&pod), line);
            }
        }
    }
    a
}

/// GPUs a claim asks (our claims: `exactly` requests, `count` default 1).
fn asked(claim: &Value) -> u64 {
    claim
        .pointer("/spec/devices/requests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| {
            r.pointer("/exactly/count")
                .and_then(Value::as_u64)
                .unwrap_or(1)
        })
        .sum()
}

/// Unbound pods that could be placed now, from the stored objects: each of
/// its claims exists; those allocated are all on one node, and that node (or,
/// if none is, some node) has free devices for the rest. Free: published by
/// a slice and in no allocated claim. (Host resources are not judged: the
/// tests' nodes have far more CPU and memory than their pods ask.)
pub fn fitting(server: &ApiServer) -> Vec<String> {
    let claims: Vec<Value> = server.objects(Resource::Claims);
    let pods: Vec<Value> = server.objects(Resource::Pods);
    let slices: Vec<Value> = server.objects(Resource::Slices);
    let by_key = claims_by_key(&claims);
    let mut free: BTreeMap<String, u64> = BTreeMap::new();
    let mut taken: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for c in &claims {
        for (driver, pool, device) in results(c) {
            if driver == DRIVER {
                taken.entry(pool).or_default().insert(device);
            }
        }
    }
    for (node, devices) in published(&slices) {
        let used = taken
            .get(&node)
            .map_or(0, |t| devices.intersection(t).count());
        free.insert(node, (devices.len() - used) as u64);
    }
    let mut out = Vec::new();
    'pods: for p in pods.iter().filter(|p| node_of(p).is_none()) {
        let ns = str_at(p, "/metadata/namespace");
        let mut pinned: BTreeSet<String> = BTreeSet::new();
        let mut need = 0;
        for name in pod_claim_names(p) {
            let Ok(name) = name else { continue 'pods };
            let Some(c) = by_key.get(&format!("{ns}/{name}")) else {
                continue 'pods;
            };
            match claim_node(c) {
                Some(n) => {
                    pinned.insert(n);
                }
                None => need += asked(c),
            }
        }
        let room = |n: &String| free.get(n).is_some_and(|f| *f >= need);
        let fits = match pinned.len() {
            0 => free.keys().any(room),
            1 => pinned.iter().all(room),
            _ => false,
        };
        if fits {
            out.push(key(p));
        }
    }
    out
}
