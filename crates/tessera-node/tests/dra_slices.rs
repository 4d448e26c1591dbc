//! The node's `ResourceSlice`s as JSON (`resource.k8s.io/v1`), checked against
//! the API's shapes and limits in protocols.md §3.2 / §3.3 / §3.8 / §3.9.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};
use tessera_node::backend::GpuBackend;
use tessera_node::backend::fake::Fake;
use tessera_node::deviceplugin::NodeView;
use tessera_node::dra::slice::{
    DriverVersions, SliceOptions, is_dns_label, is_qualified_name, pci_bus_id, resource_slices,
    semver,
};
use tessera_node::health::GpuHealth;

fn node(yaml: &str) -> (NodeView, DriverVersions) {
    let fake = Fake::from_yaml(yaml, "t").expect("a valid fake node");
    let versions = DriverVersions {
        driver: fake.driver_version(),
        cuda: fake.cuda_version(),
    };
    (
        NodeView {
            settings: Default::default(),
            gpus: fake.discover().unwrap(),
            health: BTreeMap::new(),
        },
        versions,
    )
}

fn slices_json(view: &NodeView, versions: &DriverVersions, options: SliceOptions) -> Vec<Value> {
    resource_slices("node-a", view, versions, 7, options)
        .iter()
        .map(|s| serde_json::to_value(s).unwrap())
        .collect()
}

fn devices(slices: &[Value]) -> Vec<&Value> {
    slices
        .iter()
        .flat_map(|s| s["spec"]["devices"].as_array().into_iter().flatten())
        .collect()
}

const TWO_A100: &str = r#"
driverVersion: "535.104.05"
cudaVersion: "12.2"
gpus:
  - { uuid: GPU-aaaa, product: NVIDIA A100-SXM4-80GB, numaNode: 0, pciBusId: "00000000:07:00.0", computeCapability: "8.0", nvlinks: { GPU-bbbb: 12 } }
  - { uuid: GPU-bbbb, product: NVIDIA A100-SXM4-80GB, numaNode: 1, pciBusId: "00000000:0F:00.0", computeCapability: "8.0" }
"#;

/// Checks every rule of the API that a slice of ours could break; returns the
/// number of devices. (protocols.md §3.2 limits, §3.3 field rules.)
fn check_valid(slices: &[Value]) -> usize {
    assert!(!slices.is_empty());
    let count = slices.len() as i64;
    let mut names = BTreeSet::new();
    let mut sets: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for s in slices {
        assert_eq!(s["apiVersion"], "resource.k8s.io/v1");
        assert_eq!(s["kind"], "ResourceSlice");
        let spec = &s["spec"];
        assert_eq!(spec["driver"], "gpu.tessera.io");
        assert_eq!(spec["nodeName"], "node-a");
        assert_eq!(spec["pool"]["name"], "node-a");
        assert_eq!(
            spec["pool"]["generation"], 7,
            "one generation for the whole pool"
        );
        assert_eq!(spec["pool"]["resourceSliceCount"], count);
        let devs = spec["devices"].as_array();
        let counters = spec["sharedCounters"].as_array();
        assert!(
            devs.is_none() || counters.is_none(),
            "a slice holds devices or sharedCounters, not both"
        );
        for set in counters.into_iter().flatten() {
            let name = set["name"].as_str().unwrap();
            assert!(is_dns_label(name), "{name}");
            let c = set["counters"].as_object().unwrap();
            assert!(c.len() <= 32);
            assert!(c.keys().all(|k| is_dns_label(k)), "{c:?}");
            sets.insert(name.into(), c.keys().cloned().collect());
        }
        assert!(counters.map_or(0, Vec::len) <= 8);
        let Some(devs) = devs else { continue };
        let advanced = devs
            .iter()
            .any(|d| d.get("taints").is_some() || d.get("consumesCounters").is_some());
        assert!(
            devs.len() <= if advanced { 64 } else { 128 },
            "{} devices",
            devs.len()
        );
        for d in devs {
            let name = d["name"].as_str().unwrap();
            assert!(
                is_dns_label(name),
                "device name {name:?} is not a DNS label"
            );
            assert!(names.insert(name.to_string()), "{name} twice in the pool");
            let attrs = d["attributes"].as_object().unwrap();
            let caps = d["capacity"].as_object().unwrap();
            assert!(attrs.len() + caps.len() <= 32);
            for (k, v) in attrs {
                assert!(is_qualified_name(k), "attribute {k:?}");
                let obj = v.as_object().unwrap();
                assert_eq!(obj.len(), 1, "exactly one value type: {v}");
                let (kind, val) = obj.iter().next().unwrap();
                assert!(["int", "bool", "string", "version"].contains(&kind.as_str()));
                if kind == "string" || kind == "version" {
                    assert!(val.as_str().unwrap().len() <= 64);
                }
                if kind == "version" {
                    assert!(
                        semver(val.as_str().unwrap()).as_deref() == val.as_str(),
                        "{val}"
                    );
                }
            }
            assert!(caps.keys().all(|k| is_qualified_name(k)), "{caps:?}");
            let consumes = d["consumesCounters"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            assert!(consumes.len() <= 2);
            for c in consumes {
                let set = &sets[c["counterSet"].as_str().unwrap()];
                for k in c["counters"].as_object().unwrap().keys() {
                    assert!(set.contains(k), "{k} is not in its counter set");
                }
            }
        }
    }
    names.len()
}

#[test]
fn a_gpu_is_one_device_with_its_attributes_and_capacity() {
    let (view, versions) = node(TWO_A100);
    let slices = slices_json(&view, &versions, SliceOptions::default());
    assert_eq!(check_valid(&slices), 2);
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0]["metadata"]["name"], "node-a-gpu.tessera.io-0");
    assert_eq!(
        devices(&slices)[0],
        &json!({
            "name": "gpu-0",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": "GPU-aaaa"},
                "index": {"int": 0},
                "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                "model": {"string": "A100-80GB"},
                "numa": {"int": 0},
                "smCount": {"int": 108},
                "nvlinkDomain": {"int": 0},
                "nvlinkPeers": {"string": "gpu-1"},
                // 535.104.05 is not semver (leading zero); 12.2 lacks a patch.
                "driverVersion": {"version": "535.104.5"},
                "cudaDriverVersion": {"version": "12.2.0"},
                "cudaComputeCapability": {"version": "8.0.0"},
                "resource.kubernetes.io/pciBusID": {"string": "0000:07:00.0"}
            },
            "capacity": {"memory": {"value": "81920Mi"}}
        })
    );
    // The peer is on the same NVLink island.
    assert_eq!(
        devices(&slices)[1]["attributes"]["nvlinkDomain"],
        json!({"int": 0})
    );
    assert_eq!(
        devices(&slices)[1]["attributes"]["nvlinkPeers"],
        json!({"string": "gpu-0"})
    );
}

#[test]
fn shares_are_consumable_capacity_that_defaults_to_the_whole_gpu() {
    let (view, versions) = node(TWO_A100);
    let options = SliceOptions {
        consumable_capacity: true,
        ..Default::default()
    };
    let slices = slices_json(&view, &versions, options);
    check_valid(&slices);
    let d = devices(&slices)[0];
    assert_eq!(d["allowMultipleAllocations"], true);
    assert_eq!(
        d["capacity"],
        json!({
            "memory": {"value": "81920Mi", "requestPolicy": {
                "default": "81920Mi",
                "validRange": {"min": "1Mi", "max": "81920Mi", "step": "1Mi"}}},
            "compute": {"value": "1000", "requestPolicy": {
                "default": "1000",
                "validRange": {"min": "1", "max": "1000", "step": "1"}}}
        })
    );
}

#[test]
fn existing_mig_instances_are_devices_of_their_own() {
    let (view, versions) = node(
        r#"
gpus:
  - uuid: GPU-m
    product: NVIDIA A100-SXM4-80GB
    mig: { enabled: true, instances: [ { uuid: MIG-1, profile: 1g.10gb+me, start: 0 }, { uuid: MIG-2, profile: 3g.40gb, start: 4 } ] }
"#,
    );
    let slices = slices_json(&view, &versions, SliceOptions::default());
    assert_eq!(check_valid(&slices), 2, "no whole-GPU device in MIG mode");
    let names: Vec<&str> = devices(&slices)
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0-mig-1g10gbme-0", "gpu-0-mig-3g40gb-4"]);
    let d = devices(&slices)[1];
    assert_eq!(d["attributes"]["type"], json!({"string": "mig"}));
    assert_eq!(d["attributes"]["uuid"], json!({"string": "MIG-2"}));
    assert_eq!(d["attributes"]["parentUUID"], json!({"string": "GPU-m"}));
    assert_eq!(d["attributes"]["profile"], json!({"string": "3g.40gb"}));
    // The catalog's (NVML's) size of a 3g.40gb instance.
    assert_eq!(d["capacity"]["memory"]["value"], "40192Mi");
}

#[test]
fn partitionable_mig_puts_counters_in_their_own_slice_and_placements_consume_them() {
    let (view, versions) = node(
        r#"
gpus:
  - { uuid: GPU-p, product: NVIDIA A100-SXM4-80GB, mig: { enabled: true } }
  - { uuid: GPU-q, product: NVIDIA A100-SXM4-80GB }
"#,
    );
    let options = SliceOptions {
        partitionable_mig: true,
        consumable_capacity: true,
        ..Default::default()
    };
    let slices = slices_json(&view, &versions, options);
    let n = check_valid(&slices);
    assert_eq!(slices.len(), 2);
    let sets = slices[0]["spec"]["sharedCounters"].as_array().unwrap();
    assert_eq!(sets.len(), 1, "only the GPU in MIG mode is partitioned");
    let set = &sets[0];
    assert_eq!(set["name"], "gpu-0-counter-set");
    assert_eq!(set["counters"]["compute-slices"]["value"], "7");
    assert_eq!(set["counters"]["memory-slice-7"]["value"], "1");
    let devs = devices(&slices);
    assert!(n > 10, "every placement is a device: {n}");
    // The GPU in MIG mode is its placements only (the driver creates an allocated
    // placement's instance at prepare); the GPU out of MIG mode is a whole GPU only,
    // shareable, with no placement: the driver never switches MIG mode.
    assert!(!devs.iter().any(|d| d["name"] == "gpu-0"));
    let whole = devs.iter().find(|d| d["name"] == "gpu-1").unwrap();
    assert!(whole.get("consumesCounters").is_none(), "{whole}");
    assert_eq!(whole["allowMultipleAllocations"], true);
    assert!(
        !devs
            .iter()
            .any(|d| d["name"].as_str().unwrap().starts_with("gpu-1-mig-")),
        "no placement on a GPU out of MIG mode"
    );
    // 3g.40gb at 4 takes compute 3 and memory slices 4..8.
    let p = devs
        .iter()
        .find(|d| d["name"] == "gpu-0-mig-3g40gb-4")
        .unwrap();
    let used: BTreeMap<String, String> = p["consumesCounters"][0]["counters"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v["value"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(
        used,
        BTreeMap::from([
            ("compute-slices".to_string(), "3".to_string()),
            ("memory-slice-4".to_string(), "1".to_string()),
            ("memory-slice-5".to_string(), "1".to_string()),
            ("memory-slice-6".to_string(), "1".to_string()),
            ("memory-slice-7".to_string(), "1".to_string()),
        ])
    );
    assert!(
        p["attributes"].get("uuid").is_none(),
        "no instance exists yet"
    );
}

#[test]
fn many_devices_are_split_at_the_limit_keeping_each_gpu_together() {
    let gpus: String = (0..12)
        .map(|i| {
            format!(
                "  - {{ uuid: GPU-{i}, product: NVIDIA A100-SXM4-80GB, mig: {{ enabled: true }} }}\n"
            )
        })
        .collect();
    let (view, versions) = node(&format!("gpus:\n{gpus}"));
    let options = SliceOptions {
        partitionable_mig: true,
        ..Default::default()
    };
    let slices = slices_json(&view, &versions, options);
    let n = check_valid(&slices);
    assert!(n > 128, "{n} devices need several slices");
    // 12 counter sets: at most 8 per slice.
    let counter_slices = slices
        .iter()
        .filter(|s| s["spec"].get("sharedCounters").is_some());
    assert_eq!(counter_slices.count(), 2);
    for s in slices.iter().filter(|s| s["spec"].get("devices").is_some()) {
        let parents: BTreeSet<&str> = s["spec"]["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["name"].as_str().unwrap().split('-').nth(1).unwrap())
            .collect();
        for p in parents {
            let elsewhere = slices
                .iter()
                .filter(|o| *o != s)
                .flat_map(|o| o["spec"]["devices"].as_array().into_iter().flatten())
                .any(|d| d["name"].as_str().unwrap().split('-').nth(1) == Some(p));
            assert!(!elsewhere, "GPU {p}'s devices are split over slices");
        }
    }
    // Plain GPUs: 200 of them fill one slice of 128 and one of 72.
    let gpus: String = (0..200)
        .map(|i| format!("  - {{ uuid: GPU-{i}, product: NVIDIA A100-SXM4-80GB }}\n"))
        .collect();
    let (view, versions) = node(&format!("gpus:\n{gpus}"));
    let slices = slices_json(&view, &versions, SliceOptions::default());
    assert_eq!(check_valid(&slices), 200);
    let sizes: Vec<usize> = slices
        .iter()
        .map(|s| s["spec"]["devices"].as_array().unwrap().len())
        .collect();
    assert_eq!(sizes, [128, 72]);
}

#[test]
fn an_unhealthy_gpu_is_tainted_or_left_out() {
    let (mut view, versions) = node(TWO_A100);
    view.health.insert(
        "GPU-bbbb".into(),
        GpuHealth::Unhealthy {
            reason: "XID 79".into(),
            xid: Some(79),
        },
    );
    let tainted = slices_json(
        &view,
        &versions,
        SliceOptions {
            device_taints: true,
            ..Default::default()
        },
    );
    check_valid(&tainted);
    let devs = devices(&tainted);
    assert!(devs[0].get("taints").is_none());
    assert_eq!(
        devs[1]["taints"],
        json!([{"key": "gpu.tessera.io/xid", "value": "79", "effect": "NoSchedule"}])
    );
    // Without taints the server would drop them and allocate the GPU: leave it out.
    let plain = slices_json(&view, &versions, SliceOptions::default());
    let names: Vec<&str> = devices(&plain)
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["gpu-0"]);
}

#[test]
fn a_node_without_gpus_publishes_one_empty_slice() {
    let view = NodeView::default();
    let slices = slices_json(&view, &DriverVersions::default(), SliceOptions::default());
    assert_eq!(slices.len(), 1);
    assert_eq!(slices[0]["spec"]["pool"]["resourceSliceCount"], 1);
    assert!(slices[0]["spec"].get("devices").is_none());
}

#[test]
fn names_versions_and_bus_ids() {
    assert!(is_dns_label("gpu-0-mig-1g10gb-0"));
    for bad in ["", "GPU-0", "gpu.0", "-gpu", "gpu-", &"a".repeat(64)] {
        assert!(!is_dns_label(bad), "{bad:?}");
    }
    assert!(is_qualified_name("memory"));
    assert!(is_qualified_name("resource.kubernetes.io/pciBusID"));
    for bad in [
        "",
        "1gpu",
        "a-b",
        "x/",
        "/x",
        "Bad_Domain/x",
        &"a".repeat(33),
    ] {
        assert!(!is_qualified_name(bad), "{bad:?}");
    }
    assert_eq!(semver("550.54.15").as_deref(), Some("550.54.15"));
    assert_eq!(semver("12.4").as_deref(), Some("12.4.0"));
    assert_eq!(semver("535.104.05").as_deref(), Some("535.104.5"));
    assert_eq!(semver("1.2.3.4"), None);
    assert_eq!(semver("r550"), None);
    assert_eq!(
        pci_bus_id("00000000:07:00.0").as_deref(),
        Some("0000:07:00.0")
    );
    assert_eq!(pci_bus_id("0000:AF:00.1").as_deref(), Some("0000:af:00.1"));
    assert_eq!(pci_bus_id("00010000:07:00.0"), None);
    assert_eq!(pci_bus_id("garbage"), None);
}
