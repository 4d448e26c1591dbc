//! Node choice for partitionable MIG claims: nodes rank by the MIG layout
//! their best placement leaves, as GPUs inside a node do, instead of by name.
//!
//! Every node here is one A100-80GB in MIG mode (7 compute, 8 memory slices)
//! published as the node agent does with `partitionable-mig`: a counter set
//! and a device per placement (`tessera-node`'s `dra::slice`).

use std::cmp::Reverse;
use std::collections::BTreeMap;

use serde_json::{Value, json};
use tessera_core::fit::mig_layout::TIER_SCORE;
use tessera_core::model::Catalog;
use tessera_core::policy::{self, PolicyArgs};

use super::{Rank, score};
use crate::convert::NodeFacts;
use crate::dra::cel::Env;
use crate::dra::claim::ClaimAsk;
use crate::dra::inventory::{claims_holdings, node_inventory};
use crate::dra::place::{Plan, devices, place};
use crate::dra::pod::{PodClaim, Step};
use crate::dra::types::{DeviceClass, ResourceClaim, ResourceSlice};

fn a100() -> tessera_core::model::MigGeometry {
    let c = Catalog::default();
    c.spec(c.find("A100-80GB").unwrap()).mig.clone().unwrap()
}

/// Device name of `profile` at `start` on GPU 0 (`gpu-0-mig-3g40gb-4`).
fn name(profile: &str, start: u8) -> String {
    let label: String = profile
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    format!("gpu-0-mig-{label}-{start}")
}

/// `node`'s slice: one A100-80GB in MIG mode, every placement a device; the
/// placements named in `existing` are instances that exist (they have a UUID).
fn slice(node: &str, existing: &[String]) -> ResourceSlice {
    crate::dra::tests::mig_slice_with(node, 1, existing)
}

/// `s` with a second GPU, not in MIG mode: the whole device `gpu-1`.
fn with_whole_gpu(mut s: ResourceSlice) -> ResourceSlice {
    let node = s.spec.node_name.clone().unwrap();
    s.spec.devices.push(
        serde_json::from_value(
            json!({"name": "gpu-1", "attributes": {"type": {"string": "gpu"},
            "uuid": {"string": format!("GPU-{node}-1")}, "index": {"int": 1},
            "model": {"string": "A100-80GB"}}, "capacity": {"memory": {"value": "81920Mi"}}}),
        )
        .unwrap(),
    );
    s
}

fn classes() -> Vec<DeviceClass> {
    serde_json::from_value(json!([
        {"metadata": {"name": "mig.tessera.io"}, "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.tessera.io' && device.attributes['gpu.tessera.io'].type == 'mig'"}}]}},
        {"metadata": {"name": "gpu.tessera.io"}, "spec": {"selectors": [{"cel": {"expression":
            "device.driver == 'gpu.tessera.io' && device.attributes['gpu.tessera.io'].type == 'gpu'"}}]}}
    ]))
    .unwrap()
}

fn claim(uid: &str, spec: Value, status: Option<Value>) -> ResourceClaim {
    let mut c = json!({"metadata": {"name": uid, "namespace": "ml", "uid": uid, "resourceVersion": "1"},
        "spec": {"devices": spec}});
    if let Some(s) = status {
        c["status"] = s;
    }
    serde_json::from_value(c).unwrap()
}

fn to_allocate(uid: &str, spec: Value) -> PodClaim {
    let c = claim(uid, spec, None);
    PodClaim {
        key: format!("ml/{uid}"),
        step: Step::Allocate(ClaimAsk::resolve(&c, &classes()).unwrap()),
        claim: c,
    }
}

/// A claim still to allocate: one placement of `profile`.
fn asking(profile: &str) -> PodClaim {
    to_allocate(
        "ask",
        json!({"requests": [{"name": "m", "exactly": {"deviceClassName": "mig.tessera.io",
            "selectors": [{"cel": {"expression":
                format!("device.attributes['gpu.tessera.io'].profile == '{profile}'")}}]}}]}),
    )
}

/// A claim still to allocate: one whole GPU.
fn asking_whole_gpu() -> PodClaim {
    to_allocate(
        "whole",
        json!({"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu.tessera.io"}}]}),
    )
}

/// Another claim's allocation of `profile` at `start` on `node`.
fn holding(node: &str, profile: &str, start: u8) -> ResourceClaim {
    claim(
        &format!("held-{node}-{start}"),
        json!({"requests": [{"name": "m", "exactly": {"deviceClassName": "mig.tessera.io"}}]}),
        Some(
            json!({"allocation": {"devices": {"results": [{"request": "m",
            "driver": "gpu.tessera.io", "pool": node, "device": name(profile, start)}]}}}),
        ),
    )
}

/// Places a pod with the claims `asks` on the nodes of `slices` (one each),
/// given the allocations `held`.
fn plan_all(asks: &[PodClaim], slices: &[ResourceSlice], held: &[ResourceClaim]) -> Plan {
    let mut nodes = Vec::new();
    let mut inventories = BTreeMap::new();
    for s in slices {
        let node = s.spec.node_name.clone().unwrap();
        let inv = node_inventory(&node, std::slice::from_ref(s));
        assert!(inv.skipped.is_empty(), "{:?}", inv.skipped);
        inventories.insert(node.clone(), inv);
        nodes.push(NodeFacts {
            name: node,
            ready: true,
            ..NodeFacts::default()
        });
    }
    let policy = policy::by_name("tessera", &PolicyArgs::default()).unwrap();
    place(
        asks,
        &nodes,
        &inventories,
        &claims_holdings(held, None),
        &*policy,
        &Env::new(),
        &|_, _| true,
        &BTreeMap::new(),
    )
    .unwrap()
}

fn plan(ask: &PodClaim, slices: &[ResourceSlice], held: &[ResourceClaim]) -> Plan {
    plan_all(std::slice::from_ref(ask), slices, held)
}

fn chosen(p: &Plan) -> (&str, Vec<&str>) {
    (
        p.node.as_str(),
        devices(p).iter().map(|d| d.device.as_str()).collect(),
    )
}

/// node-a's GPU is untouched; node-b's holds a 4g.40gb at slices 0-3, so a
/// 3g.40gb at 4 fills it exactly (0 free, 0 stranded). On node-a the best
/// 3g.40gb is also at 4 (4 free, none stranded): it opens a fresh GPU. By the
/// layout node-b is better; by name (first fit over nodes) node-a would win.
#[test]
fn a_mig_claim_fills_the_partly_used_gpu_of_another_node() {
    let s = [slice("node-a", &[]), slice("node-b", &[])];
    let held = [holding("node-b", "4g.40gb", 0)];
    let p = plan(&asking("3g.40gb"), &s, &held);
    assert_eq!(chosen(&p), ("node-b", vec!["gpu-0-mig-3g40gb-4"]));
}

/// node-a has the best place to create a 3g.40gb (at 4, beside a held
/// 4g.40gb: the GPU is then full); node-b's untouched GPU has a free 3g.40gb
/// instance at 0 that exists. Taking it needs no re-partition, as on the
/// device-plugin path, so node-b wins though a creation there would open a GPU.
#[test]
fn an_existing_free_instance_beats_creating_one() {
    let s = [slice("node-a", &[]), slice("node-b", &[name("3g.40gb", 0)])];
    let held = [holding("node-a", "4g.40gb", 0)];
    let p = plan(&asking("3g.40gb"), &s, &held);
    assert_eq!(chosen(&p), ("node-b", vec!["gpu-0-mig-3g40gb-0"]));
    // The instance's own layout costs nothing: the node scores 0, a creation
    // one tier below.
    assert_eq!(p.score, 0.0);
}

/// node-a's GPU is full (4g.40gb + 3g.40gb held). node-b's holds a 1g.10gb at
/// slice 4, so a 3g.40gb fits only at 0, and badly: 3 compute slices stay
/// free, one of them stranded (slices 5-7 take a 1g.10gb and a 1g.20gb at
/// most). The score ranks that low, but never refuses it: node-b is the only
/// node with room, so the claim goes there.
#[test]
fn a_claim_that_fits_on_one_node_only_goes_there() {
    let s = [slice("node-a", &[]), slice("node-b", &[])];
    let held = [
        holding("node-a", "4g.40gb", 0),
        holding("node-a", "3g.40gb", 4),
        holding("node-b", "1g.10gb", 4),
    ];
    let p = plan(&asking("3g.40gb"), &s, &held);
    assert_eq!(chosen(&p), ("node-b", vec!["gpu-0-mig-3g40gb-0"]));
    // One creation, 1 slice stranded and 3 free of 7:
    // −(1e9 + (1 + 3/8) · 1000/7) = −(1e9 + 196.43).
    assert!(
        (p.score + TIER_SCORE + 1375.0 / 7.0).abs() < 1e-6,
        "{}",
        p.score
    );
}

/// A pod with a whole-GPU claim and a MIG claim: each node has an idle whole
/// GPU (the policy scores it alike on both) and a MIG GPU as in
/// [`an_existing_free_instance_beats_creating_one`]. The node's score is the
/// sum: the policy's for the whole GPU, plus 0 for node-b's existing 3g.40gb,
/// or one tier below for the instance node-a would create, so node-b wins.
#[test]
fn a_pod_mixing_whole_gpu_and_mig_claims_sums_both_scores() {
    let s = [
        with_whole_gpu(slice("node-a", &[])),
        with_whole_gpu(slice("node-b", &[name("3g.40gb", 0)])),
    ];
    let held = [holding("node-a", "4g.40gb", 0)];
    let asks = [asking_whole_gpu(), asking("3g.40gb")];
    let p = plan_all(&asks, &s, &held);
    assert_eq!(chosen(&p), ("node-b", vec!["gpu-1", "gpu-0-mig-3g40gb-0"]));
    // The whole GPU's policy score alone: far above a creation's tier.
    let whole = plan_all(&asks[..1], &s[1..], &[]).score;
    assert_eq!(p.score, whole);
    assert!(whole > -TIER_SCORE / 2.0, "{whole}");
}

/// The score orders picks as the rank does and keeps within a tier's width:
/// a creation stays below every reuse, its layout under 1000 milli-GPU (a
/// creation leaves at most 6 of the 7 compute slices free).
#[test]
fn the_score_follows_the_rank() {
    let geo = a100();
    let r = |tier: u8, stranded: u8, free: u8| -> Rank { (tier, stranded, free, Reverse(0), 0, 0) };
    let reuse = score(&geo, &r(0, 0, 0));
    // Beside a held 4g: the GPU fills (0 free).
    let fills = score(&geo, &r(1, 0, 0));
    // On an untouched GPU: 4 free, 4/8 of a slice: 1000/7 · 1/2 = 71.43.
    let opens = score(&geo, &r(1, 0, 4));
    // One slice stranded with nothing else free, worse than any free compute.
    let strands = score(&geo, &r(1, 1, 0));
    // All 6 left free and stranded: (6 + 6/8) · 1000/7 = 964.29.
    let worst = score(&geo, &r(1, 6, 6));
    assert_eq!(reuse, 0.0);
    assert_eq!(fills, -TIER_SCORE);
    assert!((opens + TIER_SCORE + 500.0 / 7.0).abs() < 1e-6, "{opens}");
    assert!(reuse > fills && fills > opens && opens > strands && strands > worst);
    assert!(worst > -TIER_SCORE - 1000.0, "{worst}");
}
