//! The manifests in `deploy/examples/` say what the code understands.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::Pod;
use tessera_core::model::Catalog;
use tessera_k8s::convert::pod_request;

fn read(name: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy/examples")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn docs<T: serde::de::DeserializeOwned>(name: &str) -> Vec<T> {
    serde_saphyr::from_multiple(&read(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn example_pods_parse_into_requests() {
    let catalog = Catalog::default();
    for (file, gpus) in [
        ("fractional-pod.yaml", 1),
        ("whole-gpu-pod.yaml", 2),
        ("mig-pod.yaml", 1),
    ] {
        let pods: Vec<Pod> = docs(file);
        assert!(!pods.is_empty(), "{file}");
        for p in pods {
            let req = pod_request(&p, &catalog).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(req.gpu.gpu_count(), gpus, "{file}");
            assert_eq!(
                p.spec.as_ref().unwrap().scheduler_name.as_deref(),
                Some("tessera")
            );
        }
    }
}

#[test]
fn example_scheduler_config_wires_every_verb() {
    let cfg: Vec<serde_json::Value> = docs("kube-scheduler-config.yaml");
    let ext = &cfg[0]["extenders"][0];
    for (k, v) in [
        ("filterVerb", "filter"),
        ("prioritizeVerb", "prioritize"),
        ("bindVerb", "bind"),
        ("preemptVerb", "preempt"),
    ] {
        assert_eq!(ext[k], v);
    }
    assert_eq!(ext["nodeCacheCapable"], true);
    let names: Vec<&str> = ext["managedResources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"tessera.io/gpu") && names.contains(&"tessera.io/gpu-memory-percent"));
    // Every MIG profile of every built-in model is managed, or kube-scheduler would
    // look for it in node allocatable and never send the pod to the extender.
    // The chart's list (values.yaml `migProfiles`) likewise.
    let values_path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/tessera/values.yaml");
    let values: serde_json::Value =
        serde_saphyr::from_str(&std::fs::read_to_string(&values_path).unwrap()).unwrap();
    let chart: Vec<&str> = values["migProfiles"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let catalog = Catalog::default();
    for spec in catalog.specs() {
        for p in spec.mig.iter().flat_map(|m| &m.profiles) {
            let short = p.name.replace('+', ".");
            let name = format!("tessera.io/mig-{short}");
            assert!(
                names.contains(&name.as_str()),
                "{name} ({}) is not managed",
                spec.name
            );
            // The same instance under the stock "mixed" strategy name, which the
            // node agent also serves.
            let stock = format!("nvidia.com/mig-{short}");
            assert!(
                names.contains(&stock.as_str()),
                "{stock} ({}) is not managed",
                spec.name
            );
            assert!(
                chart.contains(&short.as_str()),
                "{short} ({}) missing from the chart's migProfiles",
                spec.name
            );
        }
    }
}
