//! One node's devices, read from its `ResourceSlice`s, and what claims hold of
//! them, read into the core's holdings model ([`tessera_core::holdings`]). Pure.
//!
//! Only the newest generation of each pool counts (protocols.md §3.3); a pool
//! with fewer slices than it announces is marked incomplete, which only
//! `allocationMode: All` cares about. A device whose attributes or capacities do
//! not read is left out and named in [`NodeInventory::skipped`]: one bad device
//! must not hide the rest of the node.

use std::collections::BTreeMap;

use super::cel::{AttrValue, DeviceValue};
use super::quantity::Quantity;
use super::types::{
    CapacityRequestPolicy, DeviceRequestAllocationResult, DeviceTaint, ResourceClaim, ResourceSlice,
};
pub use tessera_core::holdings::{DeviceKey, DeviceUse, GpuHold, Hold, Holdings};
use tessera_core::ledger::AllocId;
use tessera_core::model::Cluster;
use tessera_core::placement::Placement;

/// How a consumable capacity rounds what is asked of it (KEP-5075).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestPolicy {
    Values(Vec<Quantity>),
    Range {
        min: Quantity,
        max: Option<Quantity>,
        step: Option<Quantity>,
    },
    DefaultOnly,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capacity {
    pub value: Quantity,
    pub default: Option<Quantity>,
    pub policy: Option<RequestPolicy>,
}

impl Capacity {
    /// What a share asking `asked` (or nothing) consumes of it, rounded up to
    /// what the policy allows; `None` when the ask exceeds what it allows.
    pub fn consumed_by(&self, asked: Option<Quantity>) -> Option<Quantity> {
        let Some(asked) = asked else {
            return Some(self.default.unwrap_or(self.value));
        };
        match &self.policy {
            None | Some(RequestPolicy::DefaultOnly) => Some(asked),
            Some(RequestPolicy::Values(vs)) => vs.iter().copied().find(|v| *v >= asked),
            Some(RequestPolicy::Range { min, max, step }) => {
                let mut v = asked.max(*min);
                if let Some(step) = step.filter(|s| s.nano() > 0) {
                    let over = (v.nano() - min.nano()).rem_euclid(step.nano());
                    if over != 0 {
                        v = v.checked_add(Quantity::from_nano(step.nano() - over))?;
                    }
                }
                max.is_none_or(|m| v <= m).then_some(v)
            }
        }
    }
}

/// One allocatable device of the node.
#[derive(Debug, Clone)]
pub struct NodeDevice {
    pub key: DeviceKey,
    /// As published (names of the driver's own domain unqualified).
    pub attributes: BTreeMap<String, AttrValue>,
    pub capacity: BTreeMap<String, Capacity>,
    /// Counter set → counter → amount.
    pub consumes: BTreeMap<String, BTreeMap<String, Quantity>>,
    pub taints: Vec<DeviceTaint>,
    /// `allowMultipleAllocations`: shares of it may be given to several claims.
    pub shared: bool,
    pub pool_complete: bool,
    /// The `device` variable its selectors see.
    pub cel: DeviceValue,
}

impl NodeDevice {
    /// The attribute of fully qualified name `name` (`gpu.tessera.io/numa`).
    pub fn attribute(&self, name: &str) -> Option<&AttrValue> {
        match name.rsplit_once('/') {
            Some((domain, id)) if domain == self.key.driver => self
                .attributes
                .get(id)
                .or_else(|| self.attributes.get(name)),
            _ => self.attributes.get(name),
        }
    }
}

/// The devices of one node and the counters of their pools.
#[derive(Debug, Clone, Default)]
pub struct NodeInventory {
    pub node: String,
    pub devices: Vec<NodeDevice>,
    /// (driver, pool, counter set) → counter → value.
    pub counters: BTreeMap<(String, String, String), BTreeMap<String, Quantity>>,
    /// Devices or slices left out, and why.
    pub skipped: Vec<String>,
}

fn attr(v: &super::types::DeviceAttribute) -> Result<AttrValue, &'static str> {
    if !v.extra.is_empty() {
        return Err("list-typed or unknown attribute values are not supported");
    }
    match (v.int, v.bool, &v.string, &v.version) {
        (Some(i), None, None, None) => Ok(AttrValue::Int(i)),
        (None, Some(b), None, None) => Ok(AttrValue::Bool(b)),
        (None, None, Some(s), None) => Ok(AttrValue::String(s.clone())),
        (None, None, None, Some(s)) => Ok(AttrValue::Version(s.clone())),
        _ => Err("an attribute must have exactly one value"),
    }
}

fn policy(p: &CapacityRequestPolicy) -> Result<(Option<Quantity>, RequestPolicy), String> {
    let q = |s: &str| Quantity::parse(s).map_err(|e| e.to_string());
    let default = p.default.as_deref().map(q).transpose()?;
    let policy = match (&p.valid_values[..], &p.valid_range) {
        ([], None) => RequestPolicy::DefaultOnly,
        (vs, None) => RequestPolicy::Values(vs.iter().map(|v| q(v)).collect::<Result<_, _>>()?),
        ([], Some(r)) => RequestPolicy::Range {
            min: q(&r.min)?,
            max: r.max.as_deref().map(q).transpose()?,
            step: r.step.as_deref().map(q).transpose()?,
        },
        _ => return Err("validValues and validRange are both set".into()),
    };
    Ok((default, policy))
}

/// The devices `slices` publish for `node` (slices of other nodes, and those
/// selecting nodes by selector or `allNodes`, are not read in this version).
pub fn node_inventory(node: &str, slices: &[ResourceSlice]) -> NodeInventory {
    let mut inv = NodeInventory {
        node: node.to_string(),
        ..NodeInventory::default()
    };
    let mine: Vec<&ResourceSlice> = slices
        .iter()
        .filter(|s| s.spec.node_name.as_deref() == Some(node))
        .collect();
    // The newest generation of each pool, and how many of its slices are here.
    let mut newest: BTreeMap<(&str, &str), (i64, i64, i64)> = BTreeMap::new();
    for s in &mine {
        let k = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
        let e = newest.entry(k).or_insert((i64::MIN, 0, 0));
        if s.spec.pool.generation > e.0 {
            *e = (s.spec.pool.generation, 0, s.spec.pool.resource_slice_count);
        }
        if s.spec.pool.generation == e.0 {
            e.1 += 1;
        }
    }
    for s in &mine {
        let (driver, pool) = (s.spec.driver.as_str(), s.spec.pool.name.as_str());
        let Some(&(generation, seen, count)) = newest.get(&(driver, pool)) else {
            continue;
        };
        if s.spec.pool.generation != generation {
            continue;
        }
        let complete = seen >= count;
        for set in &s.spec.shared_counters {
            let mut counters = BTreeMap::new();
            for (name, c) in &set.counters {
                match Quantity::parse(&c.value) {
                    Ok(v) => {
                        counters.insert(name.clone(), v);
                    }
                    Err(e) => inv
                        .skipped
                        .push(format!("{driver}/{pool} counter set {}: {e}", set.name)),
                }
            }
            inv.counters
                .insert((driver.into(), pool.into(), set.name.clone()), counters);
        }
        for d in &s.spec.devices {
            let key = DeviceKey {
                driver: driver.into(),
                pool: pool.into(),
                device: d.name.clone(),
            };
            match device(&key, d, complete) {
                Ok(nd) if inv.devices.iter().all(|x| x.key != nd.key) => inv.devices.push(nd),
                Ok(_) => inv.skipped.push(format!("{key}: published twice")),
                Err(e) => inv.skipped.push(format!("{key}: {e}")),
            }
        }
    }
    inv
}

fn device(key: &DeviceKey, d: &super::types::Device, complete: bool) -> Result<NodeDevice, String> {
    let mut attributes = BTreeMap::new();
    for (name, v) in &d.attributes {
        attributes.insert(
            name.clone(),
            attr(v).map_err(|e| format!("attribute {name}: {e}"))?,
        );
    }
    let mut capacity = BTreeMap::new();
    for (name, c) in &d.capacity {
        let value = Quantity::parse(&c.value).map_err(|e| format!("capacity {name}: {e}"))?;
        let (default, policy) = match &c.request_policy {
            Some(p) => {
                let (d, p) = policy(p).map_err(|e| format!("capacity {name}: {e}"))?;
                (d, Some(p))
            }
            None => (None, None),
        };
        capacity.insert(
            name.clone(),
            Capacity {
                value,
                default,
                policy,
            },
        );
    }
    let mut consumes: BTreeMap<String, BTreeMap<String, Quantity>> = BTreeMap::new();
    for c in &d.consumes_counters {
        let e = consumes.entry(c.counter_set.clone()).or_default();
        for (name, v) in &c.counters {
            let q = Quantity::parse(&v.value).map_err(|e| format!("counter {name}: {e}"))?;
            e.insert(name.clone(), q);
        }
    }
    let shared = d.allow_multiple_allocations == Some(true);
    let caps: BTreeMap<String, Quantity> =
        capacity.iter().map(|(k, c)| (k.clone(), c.value)).collect();
    Ok(NodeDevice {
        cel: DeviceValue::new(&key.driver, &attributes, &caps, shared),
        key: key.clone(),
        attributes,
        capacity,
        consumes,
        taints: d.taints.clone(),
        shared,
        pool_complete: complete,
    })
}

/// What the chooser ([`super::choose`], [`super::mig`]) needs to know of the
/// allocator's state.
pub trait UseOf {
    /// What claims (other ones, and this one's picks so far) hold of device `i`.
    fn use_of(&self, i: usize) -> DeviceUse;
    /// Whether any counter device `i` consumes is already partly used.
    fn counters_touched(&self, i: usize) -> bool;
    /// What is left of the counter sets device `i` consumes, summed (for packing).
    fn counters_left(&self, i: usize) -> i128;
}

/// The results of `claim`'s allocation that hold a device, each with its
/// device's key (none when it is not allocated; admin access holds nothing).
pub fn held_results(
    claim: &ResourceClaim,
) -> impl Iterator<Item = (DeviceKey, &DeviceRequestAllocationResult)> {
    claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .into_iter()
        .flat_map(|a| &a.devices.results)
        .filter(|r| r.admin_access != Some(true))
        .map(|r| {
            let key = DeviceKey {
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            };
            (key, r)
        })
}

/// The consumer a claim's holdings are kept under in [`Holdings`]: its UID
/// (`namespace/name` for an object without one, which the API never serves).
pub fn claim_consumer(c: &ResourceClaim) -> String {
    match c.metadata.uid.as_deref() {
        Some(uid) if !uid.is_empty() => uid.to_string(),
        _ => format!(
            "{}/{}",
            c.metadata.namespace.as_deref().unwrap_or(""),
            c.metadata.name.as_deref().unwrap_or("")
        ),
    }
}

/// The consumer a `tessera.io` grant's holdings are kept under: its
/// allocation in the ledger (no claim UID looks like it).
pub fn grant_consumer(id: AllocId) -> String {
    format!("tessera.io grant {}", id.0)
}

/// What every allocated claim but `except_uid` holds, by device, in the
/// core's one holdings model: a result with `consumedCapacity` is a share of
/// those amounts, one without it takes the device whole (another allocator's
/// whole allocation of a shareable device, issue 41 defect 7), one whose
/// amounts do not read is unverifiable and takes it whole too (defect 6).
/// Admin access holds nothing.
pub fn claims_holdings<'a>(
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
    except_uid: Option<&str>,
) -> Holdings {
    let mut h = Holdings::default();
    for c in claims {
        if except_uid.is_some() && c.metadata.uid.as_deref() == except_uid {
            continue;
        }
        let consumer = claim_consumer(c);
        for (key, r) in held_results(c) {
            if r.consumed_capacity.is_empty() {
                h.hold(&consumer, key, Hold::Whole);
                continue;
            }
            let amounts: Result<BTreeMap<String, Quantity>, String> = r
                .consumed_capacity
                .iter()
                .map(|(name, v)| Ok((name.clone(), Quantity::parse(v).map_err(|e| e.to_string())?)))
                .collect();
            match amounts {
                Ok(a) => h.hold(&consumer, key, Hold::Share(a)),
                Err(err) => h.hold_unverifiable(
                    &consumer,
                    key,
                    format!(
                        "claim {}: {}: {err}",
                        c.metadata.name.as_deref().unwrap_or("?"),
                        r.device
                    ),
                ),
            }
        }
    }
    h
}

/// What the `tessera.io` grants (a ledger's allocations, less those that
/// count claims: [`crate::mirror::Mirror::grants`]) hold of the devices in
/// `inventories`, in the same holdings model as claims: a grant on a GPU holds
/// every device published for that GPU (the whole GPU, by `uuid`; its MIG
/// placements, by `parentUUID`). A share of a shareable whole GPU holds its
/// memory and compute; anything else holds the device whole. So a node whose
/// slices appear while device-plugin pods still hold its GPUs (moved to DRA
/// without draining, issue 41 defect 9) gives no claim that room a second time.
pub fn grant_holdings<'a>(
    cluster: &Cluster,
    grants: impl IntoIterator<Item = (AllocId, &'a Placement)>,
    inventories: &BTreeMap<String, NodeInventory>,
) -> Holdings {
    let mut h = Holdings::default();
    let string = |d: &NodeDevice, name: &str| match d.attributes.get(name) {
        Some(AttrValue::String(s)) => Some(s.clone()),
        _ => None,
    };
    for (id, p) in grants {
        let consumer = grant_consumer(id);
        let node = cluster.node(p.node);
        let Some(inv) = inventories.get(&node.name) else {
            continue;
        };
        for g in &p.grants {
            let Some(gpu) = node.gpus.get(usize::from(g.gpu)) else {
                continue;
            };
            let of_gpu = inv.devices.iter().filter(|d| {
                string(d, "uuid").as_deref() == Some(gpu.uuid.as_str())
                    || string(d, "parentUUID").as_deref() == Some(gpu.uuid.as_str())
            });
            for d in of_gpu {
                let share = d.shared && !g.exclusive && g.mig.is_none();
                let hold = match (share, d.capacity.contains_key("memory")) {
                    (true, true) => {
                        let mib = i64::try_from(g.memory_mib).unwrap_or(i64::MAX >> 20);
                        let mut amounts = BTreeMap::from([(
                            "memory".to_string(),
                            Quantity::from_units(mib.saturating_mul(1 << 20)),
                        )]);
                        if d.capacity.contains_key("compute") {
                            amounts.insert(
                                "compute".to_string(),
                                Quantity::from_units(i64::from(g.cores_milli)),
                            );
                        }
                        Hold::Share(amounts)
                    }
                    _ => Hold::Whole,
                };
                h.hold(&consumer, d.key.clone(), hold);
            }
        }
    }
    h
}

/// What `usage` holds of GPUs, by their UUIDs: the other way round from
/// [`grant_holdings`], so the ledger of a node whose `GpuNode` still lists
/// its GPUs counts what claims hold there
/// ([`crate::mirror::Mirror::set_claims_on_gpus`]). A device published for a
/// whole GPU is that GPU (`uuid`), a MIG device holds its GPU whole
/// (`parentUUID`); a share of a whole GPU holds its memory (rounded up to MiB)
/// and compute (per mille, the whole of it when the share does not say), and
/// a share that names no memory, a whole holding or an unverifiable one holds
/// the GPU whole. Devices no inventory lists, or that carry no UUID, hold
/// nothing here.
pub fn gpu_holds(usage: &Holdings, inventories: &BTreeMap<String, NodeInventory>) -> Vec<GpuHold> {
    let devices: BTreeMap<&DeviceKey, (&str, &NodeDevice)> = inventories
        .iter()
        .flat_map(|(node, inv)| {
            inv.devices
                .iter()
                .map(move |d| (&d.key, (node.as_str(), d)))
        })
        .collect();
    let string = |d: &NodeDevice, name: &str| match d.attributes.get(name) {
        Some(AttrValue::String(s)) if !s.is_empty() => Some(s.clone()),
        _ => None,
    };
    let mut out = Vec::new();
    for consumer in usage.consumers() {
        for (key, hold) in usage.held_by(consumer) {
            let Some((node, d)) = devices.get(key) else {
                continue;
            };
            let (uuid, mig) = match (string(d, "uuid"), string(d, "parentUUID")) {
                (_, Some(parent)) => (parent, true),
                (Some(uuid), None) => (uuid, false),
                (None, None) => continue,
            };
            let share = match hold {
                Hold::Share(amounts) if !mig => amounts.get("memory").map(|m| {
                    let bytes = u64::try_from(m.ceil_units().max(0)).unwrap_or(u64::MAX);
                    let mib = bytes.div_ceil(1 << 20);
                    let milli = amounts
                        .get("compute")
                        .map_or(1000, |c| c.ceil_units().clamp(1, 1000));
                    (mib, milli as u32)
                }),
                _ => None,
            };
            out.push(GpuHold {
                node: node.to_string(),
                uuid,
                consumer: consumer.to_string(),
                share,
            });
        }
    }
    out
}
