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
use super::claim::{ClaimAsk, ClaimError};
use super::inventory::{Usage, node_inventory};
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
    allocate(&ask, &inv, &Usage::of_claims(held, None), p, &Env::new())
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
        let usage = Usage::of_claims(&held, None);
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
