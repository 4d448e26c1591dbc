//! What devices given through DRA claims count against queue quotas, in the
//! quotas' unit (milli GPU-equivalents), so a tenant cannot take GPUs through
//! claims past its queue's quota, and the GPUs its claims hold count in its
//! queue's usage as grants do. Pure.
//!
//! A device counts by the core's one rule for any holding
//! ([`GpuEquivalents::fraction_milli`], [`GpuEquivalents::held_milli`], which
//! count grants too): a whole GPU 1000 per-mille; a
//! share the larger of the fractions of its GPU's `memory` and `compute` it
//! consumes; a MIG placement the larger of the fractions of its GPU's compute
//! and memory slices it covers (its counters against its counter set's) — each
//! times the factor of the GPU's model (`model`, else `productName`; a model
//! the catalog does not know counts 1.0). Only our driver's devices count:
//! other drivers' devices are not GPUs.

use std::collections::BTreeMap;

use tessera_core::model::Catalog;
use tessera_core::queue::GpuEquivalents;

use super::DRIVER;
use super::cel::AttrValue;
use super::inventory::{DeviceKey, NodeDevice, NodeInventory, held_results};
use super::quantity::Quantity;
use super::types::ResourceClaim;

fn string_attr<'a>(d: &'a NodeDevice, name: &str) -> Option<&'a str> {
    match d.attributes.get(name) {
        Some(AttrValue::String(s)) => Some(s),
        _ => None,
    }
}

/// The parts of its GPU device `d` of `inv` takes, consuming `consumed`
/// (empty when taken whole), as `(part, whole)` for the core's
/// [`GpuEquivalents::fraction_milli`]: a MIG device its compute and memory
/// slices against its counter set's; a share the capacities it consumes
/// against the device's. `None`: the whole GPU.
fn parts(
    inv: &NodeInventory,
    d: &NodeDevice,
    consumed: &BTreeMap<String, Quantity>,
) -> Option<Vec<(i128, i128)>> {
    if string_attr(d, "type") == Some("mig") {
        let slices = |c: &BTreeMap<String, Quantity>| {
            c.keys().filter(|k| k.starts_with("memory-slice-")).count() as i128
        };
        let compute = |c: &BTreeMap<String, Quantity>| {
            c.get("compute-slices")
                .copied()
                .unwrap_or(Quantity::ZERO)
                .nano()
        };
        let mut parts = Vec::new();
        for (set, used) in &d.consumes {
            let whole = inv
                .counters
                .get(&(d.key.driver.clone(), d.key.pool.clone(), set.clone()))
                .cloned()
                .unwrap_or_default();
            parts.push((compute(used), compute(&whole)));
            parts.push((slices(used), slices(&whole)));
        }
        return Some(parts);
    }
    Some(
        consumed
            .iter()
            .filter_map(|(name, q)| d.capacity.get(name).map(|c| (q.nano(), c.value.nano())))
            .collect(),
    )
}

/// Milli GPU-equivalents of device `d` of `inv`, consuming `consumed`.
pub fn device_milli(
    catalog: &Catalog,
    ge: &GpuEquivalents,
    inv: &NodeInventory,
    d: &NodeDevice,
    consumed: &BTreeMap<String, Quantity>,
) -> u64 {
    if d.key.driver != DRIVER {
        return 0;
    }
    let model = string_attr(d, "model")
        .and_then(|m| catalog.find(m))
        .or_else(|| string_attr(d, "productName").and_then(|p| catalog.find(p)));
    let fraction = GpuEquivalents::fraction_milli(parts(inv, d, consumed).as_deref());
    ge.held_milli(model, fraction)
}

/// Milli GPU-equivalents of the devices `results` (key and consumed
/// capacities) on node `node`'s inventory; devices not in it count nothing.
pub fn devices_milli<'a>(
    catalog: &Catalog,
    ge: &GpuEquivalents,
    inventories: &BTreeMap<String, NodeInventory>,
    node: &str,
    results: impl IntoIterator<Item = (&'a DeviceKey, &'a BTreeMap<String, Quantity>)>,
) -> u64 {
    let Some(inv) = inventories.get(node) else {
        return 0;
    };
    results
        .into_iter()
        .filter_map(|(k, consumed)| {
            let d = inv.devices.iter().find(|d| &d.key == k)?;
            Some(device_milli(catalog, ge, inv, d, consumed))
        })
        .sum()
}

/// Every device of `inventories`, by key.
pub struct Devices<'a>(BTreeMap<&'a DeviceKey, (&'a NodeInventory, &'a NodeDevice)>);

impl<'a> Devices<'a> {
    pub fn new(inventories: &'a BTreeMap<String, NodeInventory>) -> Devices<'a> {
        let mut by_key = BTreeMap::new();
        for inv in inventories.values() {
            for d in &inv.devices {
                by_key.insert(&d.key, (inv, d));
            }
        }
        Devices(by_key)
    }

    /// Milli GPU-equivalents of what `claim` has allocated (nothing when it is
    /// not allocated); devices with admin access take nothing from others.
    pub fn claim_milli(
        &self,
        catalog: &Catalog,
        ge: &GpuEquivalents,
        claim: &ResourceClaim,
    ) -> u64 {
        let mut milli = 0;
        for (key, r) in held_results(claim) {
            let Some((inv, d)) = self.0.get(&key) else {
                continue;
            };
            let consumed: BTreeMap<String, Quantity> = r
                .consumed_capacity
                .iter()
                .filter_map(|(n, v)| Quantity::parse(v).ok().map(|q| (n.clone(), q)))
                .collect();
            milli += device_milli(catalog, ge, inv, d, &consumed);
        }
        milli
    }
}

/// What the allocated claims hold, per pod uid: each claim's devices count
/// once, against the first pod it is reserved for (a claim reserved for no
/// pod is held by no pod's queue).
pub fn pod_holdings<'a>(
    catalog: &Catalog,
    ge: &GpuEquivalents,
    inventories: &BTreeMap<String, NodeInventory>,
    claims: impl IntoIterator<Item = &'a ResourceClaim>,
) -> BTreeMap<String, u64> {
    let devices = Devices::new(inventories);
    let mut held = BTreeMap::new();
    for c in claims {
        let Some(pod) = c
            .status
            .as_ref()
            .and_then(|s| s.reserved_for.iter().find(|r| r.resource == "pods"))
        else {
            continue;
        };
        let milli = devices.claim_milli(catalog, ge, c);
        if milli > 0 {
            *held.entry(pod.uid.clone()).or_default() += milli;
        }
    }
    held
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::dra::inventory::node_inventory;
    use crate::dra::types::ResourceSlice;

    /// One node as the node agent publishes it: `gpu-0` whole, `gpu-1` shared
    /// (80 GiB, compute 1000), and on GPU 2 in MIG mode (7 compute slices, 8
    /// memory slices) the `3g.40gb` placement at slice 0; plus a device of
    /// another driver's name in our pool (never a GPU of ours).
    fn inventory() -> NodeInventory {
        let mut all = json!({"compute-slices": {"value": "7"}});
        let mut used = json!({"compute-slices": {"value": "3"}});
        for k in 0..8 {
            all[format!("memory-slice-{k}")] = json!({"value": "1"});
            if k < 4 {
                used[format!("memory-slice-{k}")] = json!({"value": "1"});
            }
        }
        let slice: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": "n-gpu.tessera.io-0"},
            "spec": {"driver": "gpu.tessera.io", "pool": {"name": "n", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "n", "sharedCounters": [{"name": "gpu-2-counter-set", "counters": all}],
                "devices": [
                    {"name": "gpu-0", "attributes": {"type": {"string": "gpu"}, "model": {"string": "A100-80GB"}},
                     "capacity": {"memory": {"value": "80Gi"}}},
                    {"name": "gpu-1", "allowMultipleAllocations": true,
                     "attributes": {"type": {"string": "gpu"}, "model": {"string": "A100-80GB"}},
                     "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "1000"}}},
                    {"name": "gpu-2-mig-3g40gb-0",
                     "attributes": {"type": {"string": "mig"}, "profile": {"string": "3g.40gb"},
                        "model": {"string": "A100-80GB"}},
                     "capacity": {"memory": {"value": "40Gi"}},
                     "consumesCounters": [{"counterSet": "gpu-2-counter-set", "counters": used}]}
                ]}
        }))
        .unwrap();
        let inv = node_inventory("n", &[slice]);
        assert!(inv.skipped.is_empty(), "{:?}", inv.skipped);
        inv
    }

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn devices_count_as_the_core_counts_grants() {
        let catalog = Catalog::default();
        let uniform = GpuEquivalents::uniform();
        let double = GpuEquivalents::from_factors(&catalog, [("A100-80GB", 2.0)], 1.0).unwrap();
        let inv = inventory();
        let none = BTreeMap::new();
        let share = |mem: &str, compute: &str| {
            BTreeMap::from([
                ("memory".to_string(), q(mem)),
                ("compute".to_string(), q(compute)),
            ])
        };
        let cases: [(&str, BTreeMap<String, Quantity>, &GpuEquivalents, u64); 7] = [
            // A whole GPU: 1000 per-mille × 1.0.
            ("gpu-0", none.clone(), &uniform, 1000),
            // × the model's factor 2.0.
            ("gpu-0", none.clone(), &double, 2000),
            // A share: max(20/80 memory, 250/1000 compute) = 250.
            ("gpu-1", share("20Gi", "250"), &uniform, 250),
            // The larger fraction counts: max(40/80, 100/1000) = 500.
            ("gpu-1", share("40Gi", "100"), &uniform, 500),
            // A shared device taken with no capacity asked: the whole GPU.
            ("gpu-1", none.clone(), &uniform, 1000),
            // 3g.40gb: max(3/7 compute ↑ 429, 4/8 memory slices = 500) = 500.
            ("gpu-2-mig-3g40gb-0", none.clone(), &uniform, 500),
            ("gpu-2-mig-3g40gb-0", none.clone(), &double, 1000),
        ];
        for (name, consumed, ge, want) in cases {
            let d = inv.devices.iter().find(|d| d.key.device == name).unwrap();
            assert_eq!(
                device_milli(&catalog, ge, &inv, d, &consumed),
                want,
                "{name} {consumed:?}"
            );
        }
        let mut other = inv.devices[0].clone();
        other.key.driver = "other.example.com".into();
        assert_eq!(device_milli(&catalog, &uniform, &inv, &other, &none), 0);
    }

    #[test]
    fn holdings_count_each_allocated_claim_once_against_its_first_pod() {
        let catalog = Catalog::default();
        let inventories = BTreeMap::from([("n".to_string(), inventory())]);
        let claim = |name: &str, devices: &[&str], pods: &[&str]| -> ResourceClaim {
            let results: Vec<_> = devices
                .iter()
                .map(|d| json!({"request": "g", "driver": "gpu.tessera.io", "pool": "n", "device": d}))
                .collect();
            let reserved: Vec<_> = pods
                .iter()
                .map(|u| json!({"resource": "pods", "name": u, "uid": u}))
                .collect();
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "ml", "uid": name},
                "spec": {"devices": {"requests": []}},
                "status": {"allocation": {"devices": {"results": results}}, "reservedFor": reserved}
            }))
            .unwrap()
        };
        let claims = [
            // Two devices for pod a: 1000 + 500.
            claim("c1", &["gpu-0", "gpu-2-mig-3g40gb-0"], &["a"]),
            // Shared by b and c: counted once, against b.
            claim("c2", &["gpu-1"], &["b", "c"]),
            // Allocated, reserved for no pod: nobody's.
            claim("c3", &["gpu-0"], &[]),
        ];
        let held = pod_holdings(&catalog, &GpuEquivalents::uniform(), &inventories, &claims);
        assert_eq!(
            held,
            BTreeMap::from([("a".to_string(), 1500), ("b".to_string(), 1000)])
        );
    }
}
