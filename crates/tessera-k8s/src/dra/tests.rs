//! Allocator tests on slices shaped as the node agent publishes them
//! (`tessera-node`'s `dra::slice`: `gpu-<index>`, attributes `type`, `uuid`,
//! `index`, `model`, `numa`, `nvlinkDomain`, capacity `memory`, and with
//! consumable capacity `compute` and the whole-GPU request policies).

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use tessera_core::policy::{self, Policy, PolicyArgs};

use super::allocate::{NodeAllocation, Unfit, allocate};
use super::cel::Env;
use super::choose::Host;
use super::claim::{ClaimAsk, ClaimError};
use super::inventory::{Holdings, claims_holdings, node_inventory};
use super::quantity::Quantity;
use super::types::{DeviceClass, ResourceClaim, ResourceSlice};
use super::write::allocation_result;

fn classes() -> Vec<DeviceClass> {
    serde_json::from_value(json!([
        {"metadata": {"name": "gpu.tessera.io"}, "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.tessera.io' && device.attributes['gpu.tessera.io'].type == 'gpu'"}}]}},
        {"metadata": {"name": "mig.tessera.io"}, "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.tessera.io' && device.attributes['gpu.tessera.io'].type == 'mig'"}}]}}
    ]))
    .unwrap()
}

struct Gpu {
    model: &'static str,
    memory_mib: u64,
    domain: Option<i64>,
    shared: bool,
}

fn gpu(model: &'static str, shared: bool) -> Gpu {
    Gpu {
        model,
        memory_mib: 81_920,
        domain: None,
        shared,
    }
}

fn device(i: usize, g: &Gpu) -> Value {
    let mut attrs = json!({
        "type": {"string": "gpu"}, "uuid": {"string": format!("GPU-{i}")},
        "index": {"int": i}, "model": {"string": g.model}, "numa": {"int": i / 2}
    });
    if let Some(d) = g.domain {
        attrs["nvlinkDomain"] = json!({"int": d});
    }
    let m = format!("{}Mi", g.memory_mib);
    let mut d = json!({"name": format!("gpu-{i}"), "attributes": attrs,
        "capacity": {"memory": {"value": m}}});
    if g.shared {
        d["allowMultipleAllocations"] = json!(true);
        d["capacity"] = json!({
            "memory": {"value": m, "requestPolicy": {"default": m,
                "validRange": {"min": "1Mi", "max": m, "step": "1Mi"}}},
            "compute": {"value": "1000", "requestPolicy": {"default": "1000",
                "validRange": {"min": "1", "max": "1000", "step": "1"}}}
        });
    }
    d
}

fn slice(node: &str, gpus: &[Gpu]) -> ResourceSlice {
    let devices: Vec<Value> = gpus.iter().enumerate().map(|(i, g)| device(i, g)).collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu.tessera.io-0")},
        "spec": {"driver": "gpu.tessera.io", "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "nodeName": node, "devices": devices}
    }))
    .unwrap()
}

fn claim(uid: &str, requests: Value, constraints: Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": "1"},
        "spec": {"devices": {"requests": requests, "constraints": constraints}}
    }))
    .unwrap()
}

fn gpus(n: u32) -> Value {
    json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io", "count": n}}])
}

fn share(memory: &str, compute: &str) -> Value {
    json!([{"name": "s", "exactly": {"deviceClassName": "gpu.tessera.io",
        "capacity": {"requests": {"memory": memory, "compute": compute}}}}])
}

fn tessera() -> Box<dyn Policy> {
    policy::by_name("tessera", &PolicyArgs::default()).unwrap()
}

/// Allocates `c` on `node`'s slice, given the allocated claims `held`.
fn run(
    c: &ResourceClaim,
    s: &ResourceSlice,
    held: &[ResourceClaim],
    p: &dyn Policy,
) -> Result<Result<NodeAllocation, Unfit>, ClaimError> {
    let ask = ClaimAsk::resolve(c, &classes())?;
    let node = s.spec.node_name.clone().unwrap();
    let inv = node_inventory(&node, std::slice::from_ref(s));
    assert!(inv.skipped.is_empty(), "{:?}", inv.skipped);
    allocate(
        &ask,
        &inv,
        &claims_holdings(held, None),
        p,
        &Env::new(),
        Host::PLENTY,
    )
}

/// `c` with `alloc` recorded, as the API server would then serve it.
fn allocated(mut c: ResourceClaim, alloc: &NodeAllocation) -> ResourceClaim {
    let uid = c.metadata.uid.clone().unwrap();
    c.status = Some(super::types::ClaimStatus {
        allocation: Some(allocation_result(alloc, &uid)),
        ..Default::default()
    });
    c
}

fn devices(a: &NodeAllocation) -> Vec<&str> {
    a.results.iter().map(|r| r.device.device.as_str()).collect()
}

/// Where the policy matters: gpu-1 holds half-GPU share; a second half-GPU
/// share arrives. First fit (kube-scheduler's allocator: the first device in
/// slice order with room) puts it on idle gpu-0, leaving two half-used GPUs
/// and no whole one. Tessera's policy packs it onto gpu-1, so a later
/// whole-GPU claim still fits.
#[test]
fn the_policy_packs_a_share_where_first_fit_fragments() {
    let s = slice("n1", &[gpu("H100-80GB", true), gpu("H100-80GB", true)]);
    // Put the first share on gpu-1 (a selector pins it there).
    let pinned = claim(
        "a",
        json!([{"name": "s", "exactly": {"deviceClassName": "gpu.tessera.io",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.io'].index == 1"}}],
            "capacity": {"requests": {"memory": "40Gi", "compute": "500"}}}}]),
        json!([]),
    );
    let a = run(&pinned, &s, &[], &*tessera()).unwrap().unwrap();
    assert_eq!(devices(&a), ["gpu-1"]);
    let held = [allocated(pinned, &a)];

    let second = claim("b", share("40Gi", "500"), json!([]));
    // `k8s-default` takes the lowest-index usable GPUs: kube's first fit.
    let ff = run(
        &second,
        &s,
        &held,
        &*policy::by_name("k8s-default", &PolicyArgs::default()).unwrap(),
    );
    let b = run(&second, &s, &held, &*tessera()).unwrap().unwrap();
    assert_eq!(devices(&b), ["gpu-1"], "tessera packs onto the used GPU");
    // The first-fit choice differs (the lowest-index device with room).
    let ff_pick = ff.unwrap().unwrap();
    assert_eq!(devices(&ff_pick), ["gpu-0"], "first fit spreads");
    // After Tessera's pick a whole GPU is still free; after first fit none is.
    let whole = claim("c", gpus(1), json!([]));
    let held_t = [held[0].clone(), allocated(second.clone(), &b)];
    assert_eq!(
        devices(&run(&whole, &s, &held_t, &*tessera()).unwrap().unwrap()),
        ["gpu-0"]
    );
    let held_ff = [held[0].clone(), allocated(second, &ff_pick)];
    assert!(matches!(
        run(&whole, &s, &held_ff, &*tessera()).unwrap(),
        Err(Unfit::NotEnoughDevices { .. })
    ));
}

/// Random claims (whole GPUs, shares of random size) allocated one after the
/// other until the node is full: no dedicated device is ever given twice, and
/// no capacity is ever consumed beyond its value.
#[test]
fn never_allocates_a_device_beyond_its_capacity() {
    for seed in 0..12u64 {
        let mut rng = SmallRng::seed_from_u64(seed);
        let shared = seed % 2 == 0;
        let s = slice(
            "n1",
            &(0..4).map(|_| gpu("A100-80GB", shared)).collect::<Vec<_>>(),
        );
        let mut held: Vec<ResourceClaim> = Vec::new();
        for k in 0..40 {
            let uid = format!("c{k}");
            let requests = if rng.random_bool(0.3) {
                gpus(rng.random_range(1..=2))
            } else {
                share(
                    &format!("{}Gi", rng.random_range(1..=60)),
                    &rng.random_range(1..=1000).to_string(),
                )
            };
            let c = claim(&uid, requests, json!([]));
            if let Ok(a) = run(&c, &s, &held, &*tessera()).unwrap() {
                held.push(allocated(c, &a));
            }
        }
        let usage = claims_holdings(&held, None);
        let inv = node_inventory("n1", std::slice::from_ref(&s));
        for d in &inv.devices {
            let Some(u) = usage.devices.get(&d.key) else {
                continue;
            };
            if d.shared {
                for (k, used) in &u.consumed {
                    assert!(
                        *used <= d.capacity[k].value,
                        "seed {seed}: {} {k} over",
                        d.key
                    );
                }
            } else {
                assert_eq!(u.allocations, 1, "seed {seed}: {} given twice", d.key);
            }
        }
        // 4 GPUs and at most 2 per claim: at least two claims always fit.
        assert!(
            held.len() >= 2,
            "seed {seed}: the node took only {}",
            held.len()
        );
    }
}

/// Class and request selectors both hold; a node without a match says so.
#[test]
fn selectors_are_respected() {
    let s = slice(
        "n1",
        &[
            gpu("A100-80GB", false),
            gpu("H100-80GB", false),
            gpu("A100-80GB", false),
        ],
    );
    let h100 = claim(
        "a",
        json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.io'].model == 'H100-80GB'"}}]}}]),
        json!([]),
    );
    assert_eq!(
        devices(&run(&h100, &s, &[], &*tessera()).unwrap().unwrap()),
        ["gpu-1"]
    );
    let big = claim(
        "b",
        json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io",
            "selectors": [{"cel": {"expression": "device.capacity['gpu.tessera.io'].memory.compareTo(quantity('100Gi')) >= 0"}}]}}]),
        json!([]),
    );
    assert_eq!(
        run(&big, &s, &[], &*tessera()).unwrap(),
        Err(Unfit::NoMatchingDevice {
            request: "g".into()
        })
    );
    // The MIG class matches none of these whole GPUs.
    let mig = claim(
        "m",
        json!([{"name": "m", "exactly": {"deviceClassName": "mig.tessera.io"}}]),
        json!([]),
    );
    assert!(matches!(
        run(&mig, &s, &[], &*tessera()).unwrap(),
        Err(Unfit::NoMatchingDevice { .. })
    ));
    // A selector that fails on a device is the claim's error, naming it.
    let bad = claim(
        "x",
        json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.io'].nope == 1"}}]}}]),
        json!([]),
    );
    let e = run(&bad, &s, &[], &*tessera()).unwrap_err();
    assert!(e.to_string().contains("nope"), "{e}");
}

/// `firstAvailable`: the first subrequest that can be satisfied, in order.
#[test]
fn first_available_takes_the_first_satisfiable_subrequest() {
    let s = slice("n1", &[gpu("H100-80GB", false), gpu("H100-80GB", false)]);
    let c = claim(
        "a",
        json!([{"name": "r", "firstAvailable": [
            {"name": "four", "deviceClassName": "gpu.tessera.io", "count": 4},
            {"name": "two", "deviceClassName": "gpu.tessera.io", "count": 2},
            {"name": "one", "deviceClassName": "gpu.tessera.io", "count": 1}]}]),
        json!([]),
    );
    let a = run(&c, &s, &[], &*tessera()).unwrap().unwrap();
    let names: Vec<&str> = a.results.iter().map(|r| r.request.as_str()).collect();
    assert_eq!(names, ["r/two", "r/two"]);
}

/// matchAttribute keeps a claim on one NVLink island; distinctAttribute keeps
/// two requests off the same device.
#[test]
fn constraints_hold_across_results() {
    let mut g: Vec<Gpu> = (0..4).map(|_| gpu("H100-80GB", false)).collect();
    for (i, x) in g.iter_mut().enumerate() {
        x.domain = Some(if i < 2 { 0 } else { 2 });
    }
    let s = slice("n1", &g);
    let one = claim(
        "h",
        json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io",
            "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.io'].index == 0"}}]}}]),
        json!([]),
    );
    let a = run(&one, &s, &[], &*tessera()).unwrap().unwrap();
    let held = [allocated(one, &a)];
    let pair = claim(
        "p",
        gpus(2),
        json!([{"matchAttribute": "gpu.tessera.io/nvlinkDomain"}]),
    );
    let b = run(&pair, &s, &held, &*tessera()).unwrap().unwrap();
    assert_eq!(
        devices(&b),
        ["gpu-2", "gpu-3"],
        "the only whole island left"
    );
    let three = claim(
        "t",
        gpus(3),
        json!([{"matchAttribute": "gpu.tessera.io/nvlinkDomain"}]),
    );
    assert!(run(&three, &s, &held, &*tessera()).unwrap().is_err());

    let shared = slice("n2", &[gpu("H100-80GB", true), gpu("H100-80GB", true)]);
    let two = claim(
        "d",
        json!([
            {"name": "a", "exactly": {"deviceClassName": "gpu.tessera.io", "capacity": {"requests": {"memory": "1Gi", "compute": "10"}}}},
            {"name": "b", "exactly": {"deviceClassName": "gpu.tessera.io", "capacity": {"requests": {"memory": "1Gi", "compute": "10"}}}}]),
        json!([{"distinctAttribute": "gpu.tessera.io/uuid"}]),
    );
    let d = run(&two, &shared, &[], &*tessera()).unwrap().unwrap();
    let mut ds = devices(&d);
    ds.sort();
    assert_eq!(ds, ["gpu-0", "gpu-1"]);
}

/// allocationMode All: every matching device, or nothing when one is held;
/// adminAccess takes held devices and holds nothing itself.
#[test]
fn all_mode_and_admin_access() {
    let s = slice("n1", &[gpu("H100-80GB", false), gpu("H100-80GB", false)]);
    let all = claim(
        "a",
        json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io", "allocationMode": "All"}}]),
        json!([]),
    );
    let a = run(&all, &s, &[], &*tessera()).unwrap().unwrap();
    assert_eq!(devices(&a), ["gpu-0", "gpu-1"]);
    let one = claim("o", gpus(1), json!([]));
    let o = run(&one, &s, &[], &*tessera()).unwrap().unwrap();
    let held = [allocated(one, &o)];
    assert_eq!(
        run(&all, &s, &held, &*tessera()).unwrap(),
        Err(Unfit::AllBusy {
            request: "g".into(),
            busy: 1
        })
    );
    let admin = claim(
        "m",
        json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io", "allocationMode": "All", "adminAccess": true}}]),
        json!([]),
    );
    let m = run(&admin, &s, &held, &*tessera()).unwrap().unwrap();
    assert_eq!(devices(&m), ["gpu-0", "gpu-1"]);
    assert!(m.results.iter().all(|r| r.admin_access));
    // The admin claim holds nothing: the other GPU is still free for a user.
    let held2 = [held[0].clone(), allocated(admin, &m)];
    assert!(
        run(&claim("u", gpus(1), json!([])), &s, &held2, &*tessera())
            .unwrap()
            .is_ok()
    );
}

/// A share's consumed capacity is rounded up to the policy's step and lists
/// every capacity (an unasked one at its default: the whole of it).
#[test]
fn shares_record_every_capacity_rounded_to_the_policy() {
    let s = slice("n1", &[gpu("H100-80GB", true)]);
    let c = claim(
        "a",
        json!([{"name": "s", "exactly": {"deviceClassName": "gpu.tessera.io",
            "capacity": {"requests": {"memory": "1500Ki"}}}}]),
        json!([]),
    );
    let a = run(&c, &s, &[], &*tessera()).unwrap().unwrap();
    let consumed = &a.results[0].consumed;
    // 1500Ki = 1.46Mi, step 1Mi from min 1Mi: 2Mi. compute unasked: default 1000.
    assert_eq!(consumed["memory"], Quantity::parse("2Mi").unwrap());
    assert_eq!(consumed["compute"], Quantity::parse("1000").unwrap());
    let r = allocation_result(&a, "a");
    assert_eq!(r.devices.results[0].consumed_capacity["memory"], "2Mi");
    assert!(r.devices.results[0].share_id.is_some());
}

/// A node of A100-80GBs in MIG mode as the node agent publishes them with
/// `partitionable-mig`: per GPU a counter set `gpu-<i>-counter-set`
/// (`compute-slices`, `memory-slice-<k>`) and a device per placement the
/// model's table allows, consuming the profile's compute slices and the
/// memory slices it covers.
fn mig_slice(node: &str, gpus: usize) -> ResourceSlice {
    mig_slice_with(node, gpus, &[])
}

/// [`mig_slice`], where the placements named in `existing` are instances that
/// exist (they have a UUID, `MIG-<node>-<device>`).
pub(super) fn mig_slice_with(node: &str, gpus: usize, existing: &[String]) -> ResourceSlice {
    let catalog = tessera_core::model::Catalog::default();
    let a100 = catalog.find("A100-80GB").unwrap();
    let geo = catalog.spec(a100).mig.clone().unwrap();
    let mut sets = Vec::new();
    let mut devices = Vec::new();
    for g in 0..gpus {
        let set = format!("gpu-{g}-counter-set");
        let mut all = json!({"compute-slices": {"value": geo.compute_slices.to_string()}});
        for k in 0..geo.memory_slices {
            all[format!("memory-slice-{k}")] = json!({"value": "1"});
        }
        sets.push(json!({"name": set, "counters": all}));
        for p in &geo.profiles {
            for &start in &p.starts {
                let Some(mask) = geo.placement_mask(p, start) else {
                    continue;
                };
                let mut used = json!({"compute-slices": {"value": p.compute_slices.to_string()}});
                for k in (0..8).filter(|k| mask & (1 << k) != 0) {
                    used[format!("memory-slice-{k}")] = json!({"value": "1"});
                }
                let label: String = p.name.chars().filter(char::is_ascii_alphanumeric).collect();
                let name = format!("gpu-{g}-mig-{label}-{start}");
                let mut attrs = json!({"type": {"string": "mig"}, "profile": {"string": p.name},
                    "parentIndex": {"int": g}, "parentUUID": {"string": format!("GPU-{g}")},
                    "model": {"string": "A100-80GB"},
                    "productName": {"string": "NVIDIA A100-SXM4-80GB"}});
                if existing.contains(&name) {
                    attrs["uuid"] = json!({"string": format!("MIG-{node}-{name}")});
                }
                devices.push(json!({
                    "name": name,
                    "attributes": attrs,
                    "capacity": {"memory": {"value": format!("{}Mi", p.memory_mib)}},
                    "consumesCounters": [{"counterSet": set, "counters": used}]
                }));
            }
        }
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu.tessera.io-0")},
        "spec": {"driver": "gpu.tessera.io", "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "nodeName": node, "sharedCounters": sets, "devices": devices}
    }))
    .unwrap()
}

/// A claim for one MIG placement of `profile`.
fn mig_claim(uid: &str, profile: &str) -> ResourceClaim {
    claim(
        uid,
        json!([{"name": "m", "exactly": {"deviceClassName": "mig.tessera.io",
            "selectors": [{"cel": {"expression":
                format!("device.attributes['gpu.tessera.io'].profile == '{profile}'")}}]}}]),
        json!([]),
    )
}

/// A claim of `node`'s pool holding `device`, as the API server serves it.
fn holding(uid: &str, node: &str, device: &str) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": "1"},
        "spec": {"devices": {"requests": [{"name": "m", "exactly": {"deviceClassName": "mig.tessera.io"}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "m", "driver": "gpu.tessera.io", "pool": node, "device": device}]}}}
    }))
    .unwrap()
}

/// Where counter packing and the core's MIG layout differ. On an empty
/// A100-80GB (7 compute, 8 memory slices) a `3g.40gb` may start at memory
/// slice 0 or 4. Packing takes the first in publication order, 0 (slices
/// 0-3): the only `4g.40gb` placement (slices 0-3) is gone, 4 free compute
/// slices are left and at most 3 usable (another `3g.40gb` at 4). The core's
/// `best_start` takes 4: all 4 free compute slices stay usable, by the
/// `4g.40gb` at 0. So a later `4g.40gb` claim fits after our choice and not
/// after packing's.
#[test]
fn mig_placements_follow_the_core_layout_not_counter_packing() {
    let s = mig_slice("n1", 1);
    let first = mig_claim("a", "3g.40gb");
    let a = run(&first, &s, &[], &*tessera()).unwrap().unwrap();
    assert_eq!(devices(&a), ["gpu-0-mig-3g40gb-4"]);
    let later = mig_claim("b", "4g.40gb");
    let b = run(&later, &s, &[allocated(first, &a)], &*tessera())
        .unwrap()
        .unwrap();
    assert_eq!(devices(&b), ["gpu-0-mig-4g40gb-0"]);
    // Where packing put the 3g.40gb, the 4g.40gb has no room.
    let packed = holding("p", "n1", "gpu-0-mig-3g40gb-0");
    assert!(run(&later, &s, &[packed], &*tessera()).unwrap().is_err());
}

/// Across GPUs the core's rank: a GPU already partly used before an untouched
/// one (gpu-1 holds a 1g.10gb, so a second 1g.10gb goes there, even though
/// gpu-0 comes first), and on it the start that keeps the largest instance
/// possible. With gpu-1's 1g.10gb at slice 6, slices 0-5 are free: a 1g.10gb
/// at 4 or 5 keeps the 4g.40gb at 0 (4 of the 5 free compute slices in one
/// instance) where one at 0 would not; 4 is the lower of the two.
#[test]
fn mig_placements_prefer_the_partly_used_gpu() {
    let s = mig_slice("n1", 2);
    let held = holding("h", "n1", "gpu-1-mig-1g10gb-6");
    let c = mig_claim("a", "1g.10gb");
    let a = run(&c, &s, std::slice::from_ref(&held), &*tessera())
        .unwrap()
        .unwrap();
    assert_eq!(devices(&a), ["gpu-1-mig-1g10gb-4"]);
    // Two at once: the second placement is ranked with the first one held.
    let two = claim(
        "t",
        json!([{"name": "m", "exactly": {"deviceClassName": "mig.tessera.io", "count": 2,
            "selectors": [{"cel": {"expression": "device.attributes['gpu.tessera.io'].profile == '1g.10gb'"}}]}}]),
        json!([]),
    );
    let t = run(&two, &s, &[held], &*tessera()).unwrap().unwrap();
    assert_eq!(devices(&t), ["gpu-1-mig-1g10gb-4", "gpu-1-mig-1g10gb-5"]);
}

/// Placements of a model the catalog does not know cannot be mapped to a
/// layout: they are packed, the first in publication order (the 3g.40gb at
/// slice 0), not placed as the core would place an A100's.
#[test]
fn unknown_mig_models_fall_back_to_packing() {
    let mut s = mig_slice("n1", 1);
    for d in &mut s.spec.devices {
        for name in ["model", "productName"] {
            if let Some(a) = d.attributes.get_mut(name) {
                a.string = Some("Mystery-GPU".into());
            }
        }
    }
    let a = run(&mig_claim("a", "3g.40gb"), &s, &[], &*tessera())
        .unwrap()
        .unwrap();
    assert_eq!(devices(&a), ["gpu-0-mig-3g40gb-0"]);
}

/// Issue 41, defect 10: the API server stores at most 32 results in a claim's
/// allocation (`AllocationResultsMaxSize`); a larger allocation was written,
/// refused with 422 and retried forever. A claim whose requests need more is
/// refused as malformed, naming why; allocationMode All on a node with more
/// matching devices does not fit there; 32 still do.
#[test]
fn allocations_stay_within_the_api_servers_results_limit() {
    let many: Vec<Gpu> = (0..33).map(|_| gpu("H100-80GB", false)).collect();
    let s = slice("n1", &many);
    let err = run(&claim("c", gpus(33), json!([])), &s, &[], &*tessera()).unwrap_err();
    assert!(
        err.to_string().contains("at least 33 devices")
            && err.to_string().contains("at most 32 results"),
        "{err}"
    );
    let two = json!([
        {"name": "a", "exactly": {"deviceClassName": "gpu.tessera.io", "count": 20}},
        {"name": "b", "exactly": {"deviceClassName": "gpu.tessera.io", "count": 13}}
    ]);
    assert!(run(&claim("t", two, json!([])), &s, &[], &*tessera()).is_err());
    let all = claim(
        "a",
        json!([{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io", "allocationMode": "All"}}]),
        json!([]),
    );
    assert_eq!(
        run(&all, &s, &[], &*tessera()).unwrap(),
        Err(Unfit::TooManyResults { results: 33 })
    );
    let a = run(&claim("ok", gpus(32), json!([])), &s, &[], &*tessera())
        .unwrap()
        .unwrap();
    assert_eq!(a.results.len(), 32);
}

/// Issue 41, defect 7: another allocator's whole allocation of a shareable
/// device (a result without `consumedCapacity`) did not block shares. And
/// defect 6: a consumed capacity that does not read counted as nothing. Both
/// now hold the device whole: no share and no whole GPU gets it.
#[test]
fn a_whole_or_unreadable_holding_of_a_shareable_gpu_blocks_shares() {
    let s = slice("n1", &[gpu("H100-80GB", true)]);
    let small = claim("s", share("1Gi", "100"), json!([]));
    let whole = holding("w", "n1", "gpu-0");
    assert_eq!(
        run(&small, &s, std::slice::from_ref(&whole), &*tessera())
            .unwrap()
            .err(),
        Some(Unfit::NotEnoughDevices {
            request: "s".into(),
            want: 1,
            free: 0
        }),
        "a share beside a whole allocation"
    );
    let mut bad = holding("b", "n1", "gpu-0");
    bad.status
        .as_mut()
        .unwrap()
        .allocation
        .as_mut()
        .unwrap()
        .devices
        .results[0]
        .consumed_capacity = [("memory".to_string(), "lots".to_string())].into();
    let u = claims_holdings([&bad], None);
    assert_eq!(u.unreadable().count(), 1, "{u:?}");
    assert!(run(&small, &s, &[bad], &*tessera()).unwrap().is_err());
    assert!(
        run(&claim("g", gpus(1), json!([])), &s, &[whole], &*tessera())
            .unwrap()
            .is_err()
    );
    // A share holding with its consumed capacity leaves room for another.
    let first = run(&small, &s, &[], &*tessera()).unwrap().unwrap();
    let held = [allocated(
        claim("s", share("1Gi", "100"), json!([])),
        &first,
    )];
    assert!(
        run(
            &claim("t", share("1Gi", "100"), json!([])),
            &s,
            &held,
            &*tessera()
        )
        .unwrap()
        .is_ok()
    );
}

/// The policy sees each node's CPU: with the same two free GPUs on `a` and
/// `b`, a one-GPU pod asking 8 CPUs goes to `b`, because on `a` (8 CPUs
/// left) it would leave the second GPU without CPU for any pod; told nothing
/// of host resources, the nodes tie and the name decides (`a`).
#[test]
fn the_node_whose_cpu_would_strand_a_gpu_loses() {
    use super::choose::Host;
    use super::place::place;
    use super::pod::{PodClaim, Step};
    use crate::convert::NodeFacts;
    let c = claim("c", gpus(1), json!([]));
    let pod_claim = PodClaim {
        key: "ml/c".into(),
        step: Step::Allocate(ClaimAsk::resolve(&c, &classes()).unwrap()),
        claim: c,
    };
    let mut inventories = std::collections::BTreeMap::new();
    let mut nodes = Vec::new();
    for n in ["a", "b"] {
        let s = slice(n, &[gpu("A100-80GB", false), gpu("A100-80GB", false)]);
        inventories.insert(n.to_string(), node_inventory(n, std::slice::from_ref(&s)));
        nodes.push(NodeFacts {
            name: n.into(),
            ready: true,
            ..NodeFacts::default()
        });
    }
    let host = |free_cpu_milli| Host {
        cpu_milli: 96_000,
        memory_mib: 1 << 20,
        free_cpu_milli,
        free_memory_mib: 1 << 19,
        ask_cpu_milli: 8_000,
        ask_memory_mib: 1024,
    };
    let policy = tessera();
    let plan = |hosts| {
        place(
            std::slice::from_ref(&pod_claim),
            &nodes,
            &inventories,
            &Holdings::default(),
            &*policy,
            &Env::new(),
            &|_, _| true,
            hosts,
        )
        .unwrap()
        .node
    };
    let hosts = [
        ("a".to_string(), host(8_000)),
        ("b".to_string(), host(64_000)),
    ]
    .into();
    assert_eq!(plan(&hosts), "b");
    assert_eq!(plan(&Default::default()), "a");
}

/// What a pod's claims ask, as the core's GPU ask the policy learns.
#[test]
fn claims_are_learned_as_whole_gpus_or_one_share() {
    use super::pod::{PodClaim, Step, learned_ask};
    use tessera_core::request::{GpuAsk, GpuMemory};
    let to_allocate = |requests: Value| {
        let c = claim("c", requests, json!([]));
        PodClaim {
            key: "ml/c".into(),
            step: Step::Allocate(ClaimAsk::resolve(&c, &classes()).unwrap()),
            claim: c,
        }
    };
    assert_eq!(
        learned_ask(&[to_allocate(gpus(2)), to_allocate(gpus(1))]),
        GpuAsk::Whole { count: 3 }
    );
    assert_eq!(
        learned_ask(&[to_allocate(share("20Gi", "300"))]),
        GpuAsk::Shared {
            count: 1,
            memory: GpuMemory::Mib(20 * 1024),
            cores_milli: 300
        }
    );
    // A share beside more GPUs, or a MIG profile: not modelled, not learned.
    assert_eq!(
        learned_ask(&[to_allocate(share("20Gi", "300")), to_allocate(gpus(1))]),
        GpuAsk::None
    );
    let mig = json!([{"name": "m", "exactly": {"deviceClassName": "mig.tessera.io"}}]);
    assert_eq!(learned_ask(&[to_allocate(mig)]), GpuAsk::None);
    assert_eq!(learned_ask(&[]), GpuAsk::None);
}

/// Issue 41, one holdings model: `tessera.io` grants hold the DRA devices of
/// the GPUs they are on, so a claim is not given a GPU a device-plugin pod
/// still holds (a node whose slices appeared before it was drained). A share
/// of a shareable GPU leaves the rest of it to shares; a whole grant, or any
/// grant on a GPU that is not shareable, leaves nothing.
#[test]
fn grants_hold_the_devices_of_their_gpus() {
    use super::inventory::grant_holdings;
    use tessera_core::Ledger;
    use tessera_core::model::{Catalog, Cluster, Node};
    use tessera_core::placement::{GpuGrant, Placement};

    let catalog = Catalog::default();
    let h100 = catalog.find("H100-80GB").unwrap();
    let whole_mib = catalog.spec(h100).memory_mib;
    let mut node = Node::uniform("n1", 64_000, 512_000, h100, 2);
    for (i, g) in node.gpus.iter_mut().enumerate() {
        g.uuid = format!("GPU-{i}");
    }
    let cluster = Cluster::new(catalog, vec![node]).unwrap();
    let s = slice("n1", &[gpu("H100-80GB", true), gpu("H100-80GB", false)]);
    let inventories = std::collections::BTreeMap::from([(
        "n1".to_string(),
        node_inventory("n1", std::slice::from_ref(&s)),
    )]);
    let id = cluster.node_id("n1").unwrap();
    let place = |grants: Vec<GpuGrant>| Placement {
        node: id,
        grants: grants.into_iter().collect(),
        ..Placement::default()
    };

    // A 60 GiB, 600 ‰ share of gpu-0 and nothing of gpu-1.
    let mut ledger = Ledger::new(&cluster);
    ledger
        .apply(&cluster, &place(vec![GpuGrant::shared(0, 61_440, 600)]))
        .unwrap();
    let held = grant_holdings(&cluster, ledger.allocations(), &inventories);
    let ask = ClaimAsk::resolve(&claim("c", share("30Gi", "300"), json!([])), &classes()).unwrap();
    let inv = &inventories["n1"];
    let alloc = |h: &Holdings| allocate(&ask, inv, h, &*tessera(), &Env::new(), Host::PLENTY);
    // 30 GiB more does not fit beside 60 GiB on gpu-0 (80 GiB), and gpu-1 is
    // not shareable: it takes no share.
    assert!(alloc(&held).unwrap().is_err(), "{held:?}");
    // Without the grant it fits on gpu-0.
    let a = alloc(&Holdings::default()).unwrap().unwrap();
    assert_eq!(devices(&a), ["gpu-0"]);
    // A 10 GiB share still fits beside the grant.
    let small =
        ClaimAsk::resolve(&claim("d", share("10Gi", "300"), json!([])), &classes()).unwrap();
    let b = allocate(&small, inv, &held, &*tessera(), &Env::new(), Host::PLENTY)
        .unwrap()
        .unwrap();
    assert_eq!(devices(&b), ["gpu-0"]);

    // A whole grant of gpu-1: a claim for two whole GPUs finds only gpu-0 free.
    let mut ledger = Ledger::new(&cluster);
    ledger
        .apply(&cluster, &place(vec![GpuGrant::whole(1, whole_mib)]))
        .unwrap();
    let held = grant_holdings(&cluster, ledger.allocations(), &inventories);
    assert_eq!(held.of(&inv.devices[1].key).exclusive, 1);
    let two = ClaimAsk::resolve(&claim("e", gpus(2), json!([])), &classes()).unwrap();
    assert!(
        allocate(&two, inv, &held, &*tessera(), &Env::new(), Host::PLENTY)
            .unwrap()
            .is_err()
    );
    // A node without slices, or a grant on another node, holds nothing here.
    assert!(
        grant_holdings(&cluster, ledger.allocations(), &Default::default())
            .devices
            .is_empty()
    );
}

/// What claims hold, by GPU UUID, for the ledger of a node in both worlds: a
/// whole device is its GPU whole, a share its memory (MiB, rounded up) and
/// compute, a MIG device its parent GPU whole; a device without UUID or no
/// inventory lists holds nothing there.
#[test]
fn claims_hold_gpus_by_uuid_whole_shared_or_through_mig() {
    use crate::dra::inventory::{GpuHold, gpu_holds};

    let shared = slice("n1", &[gpu("H100-80GB", true), gpu("H100-80GB", false)]);
    let inventories = std::collections::BTreeMap::from([
        ("n1".to_string(), node_inventory("n1", &[shared])),
        (
            "n2".to_string(),
            node_inventory("n2", &[mig_slice("n2", 1)]),
        ),
    ]);
    let result = |pool: &str, device: &str, consumed: Value| {
        json!({"request": "g", "driver": "gpu.tessera.io", "pool": pool, "device": device,
            "consumedCapacity": consumed})
    };
    let with = |uid: &str, results: Vec<Value>| -> ResourceClaim {
        let mut c = claim(uid, gpus(1), json!([]));
        c.status = Some(
            serde_json::from_value(json!({"allocation": {"devices": {"results": results}}}))
                .unwrap(),
        );
        c
    };
    let claims = [
        // 30 GiB + 1 byte and 300 ‰ of gpu-0.
        with(
            "share",
            vec![result(
                "n1",
                "gpu-0",
                json!({"memory": "32212254721", "compute": "300"}),
            )],
        ),
        // gpu-1 whole.
        with("whole", vec![result("n1", "gpu-1", json!({}))]),
        // A MIG placement of n2's gpu-0.
        with("mig", vec![result("n2", "gpu-0-mig-1g10gb-0", json!({}))]),
        // A device no inventory lists.
        with("gone", vec![result("n3", "gpu-0", json!({}))]),
    ];
    let usage = claims_holdings(claims.iter(), None);
    let mut got = gpu_holds(&usage, &inventories);
    got.sort();
    let hold = |node: &str, uuid: &str, consumer: &str, share| GpuHold {
        node: node.into(),
        uuid: uuid.into(),
        consumer: consumer.into(),
        share,
    };
    assert_eq!(
        got,
        [
            hold("n1", "GPU-0", "share", Some((30 * 1024 + 1, 300))),
            hold("n1", "GPU-1", "whole", None),
            hold("n2", "GPU-0", "mig", None),
        ]
    );
}
