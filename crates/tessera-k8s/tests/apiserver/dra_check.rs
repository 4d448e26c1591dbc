//! What must hold of DRA claims after any run, judged from the stored pods,
//! ResourceClaims and ResourceSlices alone (never from a scheduler's view,
//! and read as JSON here, not through the scheduler's own types):
//!
//! - a device of driver `gpu.tessera.io` that its slice does not publish with
//!   `allowMultipleAllocations` is in at most one allocated claim; one that it
//!   does (a shareable GPU, KEP-5075) never has more of a capacity consumed,
//!   summed over the allocations' `consumedCapacity`, than its `value`, and a
//!   result that records no `consumedCapacity` (taken whole) is its only
//!   allocation;
//! - the devices allocated (each once, however many shares it has) never
//!   consume more of a counter set than it holds (KEP-4815: two MIG
//!   placements of one GPU never cover one memory slice, and their compute
//!   slices fit);
//! - every allocated device is one a slice publishes, on the node the claim's
//!   node selector names;
//! - every bound pod's claims exist, are allocated on the pod's node and are
//!   reserved for the pod's UID;
//! - every allocated claim is reserved for some pod (an allocation nobody
//!   holds is orphaned: no one would ever release it), and every existing
//!   pod it is reserved for uses it.
//!
//! Quantities are read by a parser of their own ([`nano`]), not the
//! scheduler's. [`fitting`] says which unbound pods could be placed now, for
//! liveness.

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

/// One result of an allocated claim.
struct Held {
    driver: String,
    pool: String,
    device: String,
    admin: bool,
    /// `consumedCapacity` as recorded (`None`: none recorded, taken whole).
    consumed: Option<BTreeMap<String, String>>,
}

/// The results of an allocated claim (none of an unallocated one).
fn results(claim: &Value) -> Vec<Held> {
    allocation(claim)
        .and_then(|a| a.pointer("/devices/results"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| Held {
            driver: str_at(r, "/driver").to_string(),
            pool: str_at(r, "/pool").to_string(),
            device: str_at(r, "/device").to_string(),
            admin: r.get("adminAccess").and_then(Value::as_bool) == Some(true),
            consumed: r
                .get("consumedCapacity")
                .and_then(Value::as_object)
                .filter(|m| !m.is_empty())
                .map(|m| {
                    m.iter()
                        .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                        .collect()
                }),
        })
        .collect()
}

/// A quantity (`80Gi`, `250`, `1500m`, `2.5G`) in billionths of its unit;
/// `None` when it does not read.
pub fn nano(q: &str) -> Option<i128> {
    let split = q
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(q.len());
    let (number, suffix) = q.split_at(split);
    let factor: i128 = match suffix {
        "" => 1_000_000_000,
        "n" => 1,
        "u" => 1_000,
        "m" => 1_000_000,
        "k" => 1_000_000_000_000,
        "M" => 1_000_000_000_000_000,
        "G" => 1_000_000_000_000_000_000,
        "T" => 1_000_000_000_000_000_000_000,
        "Ki" => 1_000_000_000 << 10,
        "Mi" => 1_000_000_000 << 20,
        "Gi" => 1_000_000_000 << 30,
        "Ti" => 1_000_000_000 << 40,
        "Pi" => 1_000_000_000 << 50,
        _ => return None,
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let mut n: i128 = whole.parse::<i128>().ok()?.checked_mul(factor)?;
    let mut scale = factor;
    for d in fraction.chars() {
        scale /= 10;
        n = n.checked_add(i128::from(d.to_digit(10)?) * scale)?;
    }
    Some(n)
}

/// `n` billionths as a quantity (`3`, `80Gi`, `2.5`).
fn show(n: i128) -> String {
    if n % 1_000_000_000 != 0 {
        return format!("{}", n as f64 / 1e9);
    }
    let units = n / 1_000_000_000;
    match units {
        0 => "0".into(),
        u if u % (1 << 30) == 0 => format!("{}Gi", u >> 30),
        u if u % (1 << 20) == 0 => format!("{}Mi", u >> 20),
        u => u.to_string(),
    }
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

/// A device our slices publish.
#[derive(Debug, Clone, Default)]
struct Device {
    /// `allowMultipleAllocations`.
    shared: bool,
    /// `type` (`gpu`, `mig`) and `profile` (of a MIG placement).
    kind: String,
    profile: String,
    /// Capacity name → (`value`, what an allocation not asking it consumes:
    /// the policy's `default`, else the whole value), in billionths.
    capacity: BTreeMap<String, (i128, i128)>,
    /// Counter set → counter → amount consumed, in billionths.
    consumes: BTreeMap<String, BTreeMap<String, i128>>,
}

/// What our slices publish: devices by `(pool, device)`, counter sets by
/// `(pool, set)` (the test slices' pool is their node).
#[derive(Debug, Default)]
struct Published {
    devices: BTreeMap<(String, String), Device>,
    counters: BTreeMap<(String, String), BTreeMap<String, i128>>,
}

fn amounts(counters: &Value) -> BTreeMap<String, i128> {
    counters
        .as_object()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| Some((k.clone(), nano(v.get("value")?.as_str()?)?)))
        .collect()
}

fn published(slices: &[Value]) -> Published {
    let mut out = Published::default();
    for s in slices
        .iter()
        .filter(|s| str_at(s, "/spec/driver") == DRIVER)
    {
        let pool = str_at(s, "/spec/pool/name").to_string();
        for set in s
            .pointer("/spec/sharedCounters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let name = str_at(set, "/name").to_string();
            let counters = amounts(set.get("counters").unwrap_or(&Value::Null));
            out.counters.insert((pool.clone(), name), counters);
        }
        for d in s
            .pointer("/spec/devices")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let capacity = d
                .get("capacity")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, c)| {
                    let value = nano(c.get("value")?.as_str()?)?;
                    let default = c
                        .pointer("/requestPolicy/default")
                        .and_then(Value::as_str)
                        .and_then(nano)
                        .unwrap_or(value);
                    Some((k.clone(), (value, default)))
                })
                .collect();
            let consumes = d
                .get("consumesCounters")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| {
                    (
                        str_at(c, "/counterSet").to_string(),
                        amounts(c.get("counters").unwrap_or(&Value::Null)),
                    )
                })
                .collect();
            let device = Device {
                shared: d.get("allowMultipleAllocations").and_then(Value::as_bool) == Some(true),
                kind: str_at(d, "/attributes/type/string").to_string(),
                profile: str_at(d, "/attributes/profile/string").to_string(),
                capacity,
                consumes,
            };
            out.devices
                .insert((pool.clone(), str_at(d, "/name").to_string()), device);
        }
    }
    out
}

fn claims_by_key(claims: &[Value]) -> HashMap<String, &Value> {
    claims.iter().map(|c| (key(c), c)).collect()
}

/// What allocated devices consume of one counter set, and who holds them.
#[derive(Debug, Default)]
struct SetUse {
    counters: BTreeMap<String, i128>,
    /// `namespace/claim (device)`.
    by: Vec<String>,
}

/// Checks the stored claims against the stored pods and slices.
pub fn audit(server: &ApiServer) -> DraAudit {
    let pods: Vec<Value> = server.objects(Resource::Pods);
    let claims: Vec<Value> = server.objects(Resource::Claims);
    let slices: Vec<Value> = server.objects(Resource::Slices);
    let published = published(&slices);
    let by_key = claims_by_key(&claims);
    let mut a = DraAudit {
        pods: pods.len(),
        bound: pods.iter().filter(|p| node_of(p).is_some()).count(),
        claims: claims.len(),
        allocated: claims.iter().filter(|c| allocation(c).is_some()).count(),
        ..DraAudit::default()
    };
    // Devices: who holds each, and whether it exists on the claim's node.
    let mut holders: BTreeMap<(String, String), Vec<(String, Held)>> = BTreeMap::new();
    for c in claims.iter().filter(|c| allocation(c).is_some()) {
        let name = key(c);
        let node = claim_node(c);
        for h in results(c) {
            if h.driver != DRIVER {
                continue;
            }
            let (pool, device) = (&h.pool, &h.device);
            if node.as_deref() != Some(pool.as_str()) {
                a.broken(&name, None, format!(
                    "claim {name}: device {pool}/{device} is not on the node its selector names ({node:?})"
                ));
            }
            if !published
                .devices
                .contains_key(&(pool.clone(), device.clone()))
            {
                a.broken(
                    &name,
                    None,
                    format!("claim {name}: device {pool}/{device} is published by no slice"),
                );
            }
            if !h.admin {
                holders
                    .entry((pool.clone(), device.clone()))
                    .or_default()
                    .push((name.clone(), h));
            }
        }
    }
    for ((pool, device), held) in &holders {
        let names: Vec<String> = held.iter().map(|(c, _)| c.clone()).collect();
        let at = format!("{DRIVER}/{pool}/{device}");
        let suspect = |a: &mut DraAudit| {
            for c in &names {
                a.suspects.entry(c.clone()).or_default();
            }
        };
        let Some(d) = published
            .devices
            .get(&(pool.clone(), device.clone()))
            .filter(|d| d.shared)
        else {
            if held.len() > 1 {
                suspect(&mut a);
                a.violations.push(format!(
                    "device {at} is in {} allocated claims: {}",
                    held.len(),
                    names.join(", ")
                ));
                a.doubles.push((format!("{pool}/{device}"), names.clone()));
            }
            continue;
        };
        // Shareable: a whole allocation alone, and no capacity over its value.
        if held.len() > 1
            && let Some((whole, _)) = held.iter().find(|(_, h)| h.consumed.is_none())
        {
            suspect(&mut a);
            a.violations.push(format!(
                "device {at} is taken whole by {whole} but is in {} allocations: {}",
                held.len(),
                names.join(", ")
            ));
        }
        for (capacity, (value, _)) in &d.capacity {
            let mut sum = 0i128;
            let mut parts = Vec::new();
            for (c, h) in held {
                let recorded = h.consumed.as_ref().and_then(|m| m.get(capacity));
                let amount = match recorded {
                    // Not recorded: the whole of it, as the audit cannot know less.
                    None => *value,
                    Some(q) => match nano(q) {
                        Some(n) => n,
                        None => {
                            a.broken(c, None, format!(
                                "claim {c}: device {pool}/{device} consumedCapacity {capacity} {q:?} does not read"
                            ));
                            *value
                        }
                    },
                };
                sum += amount;
                parts.push(format!(
                    "{c} {}",
                    recorded.cloned().unwrap_or_else(|| "(whole)".into())
                ));
            }
            if sum > *value {
                suspect(&mut a);
                a.violations.push(format!(
                    "device {at}: {capacity} consumed {} of {} ({})",
                    show(sum),
                    show(*value),
                    parts.join(" + ")
                ));
            }
        }
    }
    // Counter sets: each allocated device pays its counters once.
    // (pool, set) → counter → amount, and who consumes it (`claim (device)`).
    let mut spent: BTreeMap<(String, String), SetUse> = BTreeMap::new();
    for ((pool, device), held) in &holders {
        let Some(d) = published.devices.get(&(pool.clone(), device.clone())) else {
            continue;
        };
        for (set, counters) in &d.consumes {
            let e = spent.entry((pool.clone(), set.clone())).or_default();
            for (counter, n) in counters {
                *e.counters.entry(counter.clone()).or_default() += n;
            }
            for (c, _) in held {
                e.by.push(format!("{c} ({device})"));
            }
        }
    }
    for ((pool, set), SetUse { counters: used, by }) in &spent {
        let total = published.counters.get(&(pool.clone(), set.clone()));
        let over: Vec<String> = used
            .iter()
            .filter_map(|(counter, n)| {
                let have = total.and_then(|t| t.get(counter)).copied().unwrap_or(0);
                (*n > have).then(|| format!("{counter} {} of {}", show(*n), show(have)))
            })
            .collect();
        if !over.is_empty() {
            for c in by {
                let claim = c.split_once(' ').map_or(c.as_str(), |(k, _)| k);
                a.suspects.entry(claim.to_string()).or_default();
            }
            a.violations.push(format!(
                "counter set {DRIVER}/{pool}/{set} is over: {} (by {})",
                over.join(", "),
                by.join(", ")
            ));
        }
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

/// What one device of a claim's request asks.
#[derive(Debug, Clone)]
enum Ask {
    /// A whole GPU (class `gpu.tessera.io`, no capacity asked).
    Whole,
    /// A share of a GPU: capacity name → amount, in billionths.
    Share(BTreeMap<String, i128>),
    /// A MIG placement of a profile (class `mig.tessera.io`, a selector
    /// `…profile == '<profile>'`).
    Mig(String),
}

/// What an unallocated claim asks, one entry per device (our claims:
/// `exactly` requests, `count` default 1).
fn asks(claim: &Value) -> Vec<Ask> {
    let mut out = Vec::new();
    for r in claim
        .pointer("/spec/devices/requests")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let count = r
            .pointer("/exactly/count")
            .and_then(Value::as_u64)
            .unwrap_or(1);
        let ask = if str_at(r, "/exactly/deviceClassName") == "mig.tessera.io" {
            let profile = r
                .pointer("/exactly/selectors")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find_map(|s| {
                    let e = str_at(s, "/cel/expression");
                    let (_, rest) = e.split_once("profile == '")?;
                    Some(rest.split_once('\'')?.0.to_string())
                })
                .unwrap_or_default();
            Ask::Mig(profile)
        } else {
            let capacity: BTreeMap<String, i128> = r
                .pointer("/exactly/capacity/requests")
                .and_then(Value::as_object)
                .into_iter()
                .flatten()
                .filter_map(|(k, v)| Some((k.clone(), nano(v.as_str()?)?)))
                .collect();
            if capacity.is_empty() {
                Ask::Whole
            } else {
                Ask::Share(capacity)
            }
        };
        out.extend((0..count).map(|_| ask.clone()));
    }
    out
}

/// What the allocated claims hold: per device, allocations and capacity
/// consumed; per counter set, counters consumed.
#[derive(Debug, Clone, Default)]
struct Taken {
    devices: BTreeMap<(String, String), (u32, BTreeMap<String, i128>)>,
    counters: BTreeMap<(String, String), BTreeMap<String, i128>>,
}

impl Taken {
    /// Records `device` of `pool` taken, consuming `consumed` (its recorded
    /// `consumedCapacity`; `None`: the whole of every capacity).
    fn take(
        &mut self,
        published: &Published,
        pool: &str,
        device: &str,
        consumed: Option<&BTreeMap<String, i128>>,
    ) {
        let k = (pool.to_string(), device.to_string());
        let Some(d) = published.devices.get(&k) else {
            return;
        };
        let e = self.devices.entry(k).or_default();
        e.0 += 1;
        for (name, (value, _)) in &d.capacity {
            let n = consumed
                .and_then(|m| m.get(name))
                .copied()
                .unwrap_or(*value);
            *e.1.entry(name.clone()).or_default() += n;
        }
        // Counters are paid once, by the first allocation.
        if e.0 == 1 {
            for (set, counters) in &d.consumes {
                let c = self
                    .counters
                    .entry((pool.to_string(), set.clone()))
                    .or_default();
                for (name, n) in counters {
                    *c.entry(name.clone()).or_default() += n;
                }
            }
        }
    }

    /// A device of `pool` that `ask` could take now, and what it would
    /// consume of it (`None`: taken whole).
    fn room(
        &self,
        published: &Published,
        pool: &str,
        ask: &Ask,
    ) -> Option<(String, Option<BTreeMap<String, i128>>)> {
        for ((p, name), d) in &published.devices {
            if p != pool {
                continue;
            }
            let (allocations, used) = self
                .devices
                .get(&(p.clone(), name.clone()))
                .cloned()
                .unwrap_or_default();
            let counters_fit = d.consumes.iter().all(|(set, counters)| {
                let total = published.counters.get(&(p.clone(), set.clone()));
                let spent = self.counters.get(&(p.clone(), set.clone()));
                allocations > 0
                    || counters.iter().all(|(c, n)| {
                        let have = total.and_then(|t| t.get(c)).copied().unwrap_or(0);
                        let gone = spent.and_then(|s| s.get(c)).copied().unwrap_or(0);
                        gone + n <= have
                    })
            });
            let fits = match ask {
                Ask::Whole => d.kind == "gpu" && allocations == 0,
                Ask::Mig(profile) => {
                    d.kind == "mig" && d.profile == *profile && allocations == 0 && counters_fit
                }
                Ask::Share(want) => {
                    d.kind == "gpu"
                        && d.shared
                        && want.keys().all(|k| d.capacity.contains_key(k))
                        && counters_fit
                        && d.capacity.iter().all(|(k, (value, default))| {
                            let n = want.get(k).copied().unwrap_or(*default);
                            used.get(k).copied().unwrap_or(0) + n <= *value
                        })
                }
            };
            if fits {
                let consumed = match ask {
                    Ask::Share(want) => Some(
                        d.capacity
                            .iter()
                            .map(|(k, (_, default))| {
                                (k.clone(), want.get(k).copied().unwrap_or(*default))
                            })
                            .collect(),
                    ),
                    _ => None,
                };
                return Some((name.clone(), consumed));
            }
        }
        None
    }
}

/// Unbound pods that could be placed now, from the stored objects: each of
/// its claims exists; those allocated are all on one node, and that node (or,
/// if none is, some node) has room for the rest: a free whole GPU per GPU
/// asked (a shareable one only if nothing of it is taken), a shareable GPU
/// with the capacity a share asks left (an amount not asked at the policy's
/// default), a MIG placement of the profile asked whose counters are free.
/// The asks of one pod are taken one after the other, first fit (MIG and
/// shares before whole GPUs): exact for the workloads' pods, which ask one
/// kind, and at most one share or placement. (The workloads ask amounts the
/// policies need not round. Host resources are not judged: the tests' nodes
/// have far more CPU and memory than their pods ask.)
pub fn fitting(server: &ApiServer) -> Vec<String> {
    let claims: Vec<Value> = server.objects(Resource::Claims);
    let pods: Vec<Value> = server.objects(Resource::Pods);
    let slices: Vec<Value> = server.objects(Resource::Slices);
    let by_key = claims_by_key(&claims);
    let published = published(&slices);
    let mut taken = Taken::default();
    for c in &claims {
        for h in results(c) {
            if h.driver == DRIVER && !h.admin {
                let consumed = h.consumed.as_ref().map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), nano(v)?)))
                        .collect()
                });
                taken.take(&published, &h.pool, &h.device, consumed.as_ref());
            }
        }
    }
    let nodes: BTreeSet<&String> = published.devices.keys().map(|(p, _)| p).collect();
    let mut out = Vec::new();
    'pods: for p in pods.iter().filter(|p| node_of(p).is_none()) {
        let ns = str_at(p, "/metadata/namespace");
        let mut pinned: BTreeSet<String> = BTreeSet::new();
        let mut need = Vec::new();
        for name in pod_claim_names(p) {
            let Ok(name) = name else { continue 'pods };
            let Some(c) = by_key.get(&format!("{ns}/{name}")) else {
                continue 'pods;
            };
            match claim_node(c) {
                Some(n) => {
                    pinned.insert(n);
                }
                None => need.extend(asks(c)),
            }
        }
        need.sort_by_key(|a| matches!(a, Ask::Whole));
        let room = |node: &String| {
            let mut t = taken.clone();
            need.iter().all(|ask| {
                let Some((device, consumed)) = t.room(&published, node, ask) else {
                    return false;
                };
                t.take(&published, node, &device, consumed.as_ref());
                true
            })
        };
        let fits = match pinned.len() {
            0 => nodes.iter().any(|n| room(n)),
            1 => pinned.iter().all(room),
            _ => false,
        };
        if fits {
            out.push(key(p));
        }
    }
    out
}
