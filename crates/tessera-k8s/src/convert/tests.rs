//! Conversions checked against real objects and edge cases.
use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};

use super::*;

pub(crate) fn pod_with(resources: &[(&str, &str)], annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ml".into()),
            uid: Some("uid-p".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "c".into(),
                resources: Some(ResourceRequirements {
                    requests: Some(
                        resources
                            .iter()
                            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                            .collect(),
                    ),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}

#[test]
fn requests_sum_over_containers_and_parse() {
    let mut pod = pod_with(
        &[("cpu", "500m"), ("memory", "1Gi"), ("tessera.io/gpu", "1")],
        &[],
    );
    let spec = pod.spec.as_mut().unwrap();
    let mut second = spec.containers[0].clone();
    second.name = "d".into();
    spec.containers.push(second);
    let req = pod_request(&pod, &Catalog::default()).unwrap();
    // 500m + 500m, 1024 + 1024 MiB, 1 + 1 GPUs.
    assert_eq!(
        (req.cpu_milli, req.memory_mib, req.gpu.gpu_count()),
        (1000, 2048, 2)
    );
    assert!(wants_gpu(&pod));
}

/// A pod from `(name, kind, resources)`: kind `init`, `sidecar` (init with
/// `restartPolicy: Always`) or `app`, in spec order.
/// `(name, kind, resources)`.
type ContainerSpec<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)]);

fn pod_of(containers: &[ContainerSpec<'_>]) -> Pod {
    let mut pod = pod_with(&[], &[]);
    let spec = pod.spec.as_mut().unwrap();
    spec.containers.clear();
    for (name, kind, resources) in containers {
        let c = Container {
            name: name.to_string(),
            restart_policy: (*kind == "sidecar").then(|| "Always".to_string()),
            resources: Some(ResourceRequirements {
                limits: Some(
                    resources
                        .iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        if *kind == "app" {
            spec.containers.push(c);
        } else {
            spec.init_containers.get_or_insert_with(Vec::new).push(c);
        }
    }
    pod
}

fn resources_of(pod: &Pod) -> BTreeMap<String, String> {
    pod_resources(pod).unwrap().into_iter().collect()
}

#[test]
fn init_and_sidecar_containers_count_as_kubernetes_counts_them() {
    // Init asks 2 GPUs, the app 1: the pod needs max(2, 1) = 2.
    let pod = pod_of(&[
        ("warmup", "init", &[("tessera.io/gpu", "2"), ("cpu", "4")]),
        ("main", "app", &[("tessera.io/gpu", "1"), ("cpu", "1")]),
    ]);
    let r = resources_of(&pod);
    assert_eq!(r["tessera.io/gpu"], "2");
    assert_eq!(r["cpu"], "4000m");
    let req = pod_request(&pod, &Catalog::default()).unwrap();
    assert_eq!(req.gpu.gpu_count(), 2);
    // A sidecar (1) runs beside the app (1): 1 + 1 = 2; the init container
    // after the sidecar (1) runs beside it too: 1 + 1 = 2.
    let pod = pod_of(&[
        ("proxy", "sidecar", &[("tessera.io/gpu", "1")]),
        ("load", "init", &[("tessera.io/gpu", "1")]),
        ("main", "app", &[("tessera.io/gpu", "1")]),
    ]);
    assert_eq!(resources_of(&pod)["tessera.io/gpu"], "2");
}

#[test]
fn per_gpu_shares_are_not_summed_over_containers() {
    // Two containers, one 30 % share each: two GPUs at 300, not one at 600.
    let share: &[(&str, &str)] = &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "300")];
    let pod = pod_of(&[("a", "app", share), ("b", "app", share)]);
    let r = resources_of(&pod);
    assert_eq!(
        (
            r["tessera.io/gpu"].as_str(),
            r["tessera.io/gpu-milli"].as_str()
        ),
        ("2", "300")
    );
    // Different shares cannot be one request: refused, naming both containers.
    let pod = pod_of(&[
        ("a", "app", share),
        (
            "b",
            "app",
            &[("tessera.io/gpu", "1"), ("tessera.io/gpu-milli", "500")],
        ),
    ]);
    let e = pod_resources(&pod).unwrap_err().to_string();
    assert!(
        e.contains("tessera.io/gpu-milli") && e.contains("a") && e.contains("b"),
        "{e}"
    );
}

#[test]
fn overflowing_sums_are_refused() {
    let huge: &[(&str, &str)] = &[("tessera.io/gpu", "18446744073709551615")];
    let pod = pod_of(&[("a", "app", huge), ("b", "app", huge)]);
    let e = pod_resources(&pod).unwrap_err().to_string();
    assert!(e.contains("tessera.io/gpu"), "{e}");
    let cpu: &[(&str, &str)] = &[("cpu", "18446744073709551615m")];
    let pod = pod_of(&[("a", "app", cpu), ("b", "app", cpu)]);
    assert!(pod_resources(&pod).is_err());
}

#[test]
fn allocation_names_each_containers_gpus() {
    let catalog = Catalog::default();
    let model = catalog.find("A100-80GB").unwrap();
    let cluster = Cluster::new(
        catalog,
        vec![Node::uniform("n1", 64_000, 512_000, model, 4)],
    )
    .unwrap();
    let whole = |gpu: u8| tessera_core::placement::GpuGrant {
        gpu,
        memory_mib: 81_920,
        cores_milli: 1000,
        exclusive: true,
        mig: None,
    };
    let placement = |grants: &[u8]| Placement {
        node: cluster.ids().next().unwrap(),
        grants: grants.iter().map(|g| whole(*g)).collect(),
        cpu_milli: 0,
        memory_mib: 0,
        class: 0,
        score: 0.0,
        terms: Vec::new(),
    };
    let one: &[(&str, &str)] = &[("tessera.io/gpu", "1")];
    // An init container and two app containers, one GPU each: the pod needs 2.
    let pod = pod_of(&[("init", "init", one), ("a", "app", one), ("b", "app", one)]);
    let req = pod_request(&pod, &cluster.catalog).unwrap();
    let alloc = allocation_of(&placement(&[1, 3]), &cluster, &pod, &req, "tessera");
    let grants: Vec<(&str, &[u32])> = alloc
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.gpus.as_slice()))
        .collect();
    // The init container reuses a GPU the app containers get later.
    assert_eq!(
        grants,
        [("init", &[0][..]), ("a", &[0][..]), ("b", &[1][..])]
    );
    // One GPU container: no list, it gets every GPU (the format before the list).
    let pod = pod_of(&[("main", "app", &[("tessera.io/gpu", "2")])]);
    let req = pod_request(&pod, &cluster.catalog).unwrap();
    let alloc = allocation_of(&placement(&[0, 1]), &cluster, &pod, &req, "tessera");
    assert!(alloc.containers.is_empty());
}

#[test]
fn parser_errors_name_the_field() {
    let pod = pod_with(
        &[("tessera.io/gpu", "1"), ("tessera.io/gpu-memory", "-5")],
        &[],
    );
    let e = pod_request(&pod, &Catalog::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("tessera.io/gpu-memory"), "{e}");
    let pod = pod_with(&[("tessera.io/mig-9g.999gb", "1")], &[]);
    let e = pod_request(&pod, &Catalog::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("unknown MIG profile"), "{e}");
}

#[test]
fn toleration_matching() {
    let taint = Taint {
        key: "gpu".into(),
        value: Some("true".into()),
        effect: "NoSchedule".into(),
        ..Default::default()
    };
    let tol = |key: Option<&str>, op: &str, value: Option<&str>, effect: Option<&str>| Toleration {
        key: key.map(str::to_string),
        operator: Some(op.into()),
        value: value.map(str::to_string),
        effect: effect.map(str::to_string),
        ..Default::default()
    };
    assert!(tolerates(
        &tol(Some("gpu"), "Equal", Some("true"), None),
        &taint
    ));
    assert!(tolerates(
        &tol(Some("gpu"), "Exists", None, Some("NoSchedule")),
        &taint
    ));
    assert!(tolerates(&tol(None, "Exists", None, None), &taint));
    assert!(!tolerates(
        &tol(Some("gpu"), "Equal", Some("false"), None),
        &taint
    ));
    assert!(!tolerates(
        &tol(Some("gpu"), "Exists", None, Some("NoExecute")),
        &taint
    ));
    assert!(!tolerates(
        &tol(Some("other"), "Exists", None, None),
        &taint
    ));
}
