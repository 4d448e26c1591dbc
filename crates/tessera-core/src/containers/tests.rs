//! Table tests of the effective request and the GPU rules.

use super::ContainerKind::{App, Init, Sidecar};
use super::*;

fn effective(containers: &[Container]) -> Result<BTreeMap<String, String>, String> {
    effective_request(containers)
        .map(|v| v.into_iter().collect())
        .map_err(|e| e.to_string())
}

fn c(name: &str, kind: ContainerKind, resources: &[(&str, &str)]) -> Container {
    Container::new(name, kind, resources)
}

#[test]
fn effective_request_table() {
    // (case, containers, resource, expected)
    let cases: Vec<(&str, Vec<Container>, &str, &str)> = vec![
        (
            "apps add up: 1 + 2 = 3",
            vec![
                c("a", App, &[(RES_GPU, "1")]),
                c("b", App, &[(RES_GPU, "2")]),
            ],
            RES_GPU,
            "3",
        ),
        (
            "init larger than apps: max(4, 1) = 4",
            vec![
                c("i", Init, &[(RES_GPU, "4")]),
                c("a", App, &[(RES_GPU, "1")]),
            ],
            RES_GPU,
            "4",
        ),
        (
            "init containers do not add up: max(2, 3, 1) = 3",
            vec![
                c("i1", Init, &[("cpu", "2")]),
                c("i2", Init, &[("cpu", "3")]),
                c("a", App, &[("cpu", "1")]),
            ],
            "cpu",
            "3000m",
        ),
        (
            "sidecar runs beside the apps: 1 + 1 = 2",
            vec![
                c("s", Sidecar, &[(RES_GPU, "1")]),
                c("a", App, &[(RES_GPU, "1")]),
            ],
            RES_GPU,
            "2",
        ),
        (
            "init after a sidecar runs beside it: max(2 + 1, 1 + 0) = 3",
            vec![
                c("s", Sidecar, &[(RES_GPU, "1")]),
                c("i", Init, &[(RES_GPU, "2")]),
                c("a", App, &[]),
            ],
            RES_GPU,
            "3",
        ),
        (
            "init before a sidecar does not: max(2, 1 + 0) = 2",
            vec![
                c("i", Init, &[(RES_GPU, "2")]),
                c("s", Sidecar, &[(RES_GPU, "1")]),
                c("a", App, &[]),
            ],
            RES_GPU,
            "2",
        ),
        (
            "memory in MiB: 512Mi + 1Gi = 1536Mi",
            vec![
                c("a", App, &[("memory", "512Mi")]),
                c("b", App, &[("memory", "1Gi")]),
            ],
            "memory",
            "1536Mi",
        ),
        (
            "ephemeral storage in MiB: max(2Gi, 1Gi) = 2048Mi",
            vec![
                c("i", Init, &[("ephemeral-storage", "2Gi")]),
                c("a", App, &[("ephemeral-storage", "1Gi")]),
            ],
            "ephemeral-storage",
            "2048Mi",
        ),
        (
            "one share per GPU, two GPUs: gpu-milli stays 300",
            vec![
                c("a", App, &[(RES_GPU, "1"), (RES_GPU_MILLI, "300")]),
                c("b", App, &[(RES_GPU, "1"), (RES_GPU_MILLI, "300")]),
            ],
            RES_GPU_MILLI,
            "300",
        ),
        (
            "20Gi and 20480 MiB are the same share",
            vec![
                c("a", App, &[(RES_GPU, "1"), (RES_GPU_MEMORY, "20Gi")]),
                c("b", App, &[(RES_GPU, "1"), (RES_GPU_MEMORY, "20480")]),
            ],
            RES_GPU,
            "2",
        ),
        (
            "a value that is not a number passes as written, for the parser to name",
            vec![c("a", App, &[(RES_GPU_MEMORY, "-4Gi")])],
            RES_GPU_MEMORY,
            "-4Gi",
        ),
        (
            "MIG: the init container's instance is reused by the app: max(1, 1) = 1",
            vec![
                c("i", Init, &[("tessera.io/mig-1g.10gb", "1")]),
                c("a", App, &[("tessera.io/mig-1g.10gb", "1")]),
            ],
            "tessera.io/mig-1g.10gb",
            "1",
        ),
    ];
    for (case, containers, resource, expected) in cases {
        let got = effective(&containers).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(
            got.get(resource).map(String::as_str),
            Some(expected),
            "{case}"
        );
    }
}

#[test]
fn gpu_rules_refuse_with_the_containers_named() {
    // (case, containers, words the message must hold)
    let cases: Vec<(&str, Vec<Container>, Vec<&str>)> = vec![
        (
            "different shares",
            vec![
                c("a", App, &[(RES_GPU, "1"), (RES_GPU_MILLI, "300")]),
                c("b", App, &[(RES_GPU, "1"), (RES_GPU_MILLI, "500")]),
            ],
            vec![
                "container b",
                "container a",
                "gpu-milli=500",
                "same per-GPU share",
            ],
        ),
        (
            "a share beside whole GPUs",
            vec![
                c("i", Init, &[(RES_GPU, "1")]),
                c("a", App, &[(RES_GPU, "1"), (RES_GPU_CORES, "40")]),
            ],
            vec!["container a", "container i asks whole GPUs", "gpu-cores"],
        ),
        (
            "memory in per cent beside memory in MiB",
            vec![
                c("a", App, &[(RES_GPU, "1"), (RES_GPU_MEMORY, "10Gi")]),
                c("b", App, &[(RES_GPU, "1"), (RES_GPU_MEMORY_PERCENT, "10")]),
            ],
            vec!["container b", "container a", "gpu-memory"],
        ),
        (
            "a share without a count beside another GPU container",
            vec![
                c("a", App, &[(RES_GPU_MILLI, "300")]),
                c("b", App, &[(RES_GPU, "1"), (RES_GPU_MILLI, "300")]),
            ],
            vec!["container a", "without tessera.io/gpu"],
        ),
        (
            "two names for GPU counts",
            vec![
                c("a", App, &[(RES_GPU, "1")]),
                c("b", App, &[(RES_NVIDIA_GPU, "1")]),
            ],
            vec![
                "container b asks nvidia.com/gpu",
                "container a asks tessera.io/gpu",
            ],
        ),
        (
            "a share of nvidia.com/gpu",
            vec![c(
                "a",
                App,
                &[(RES_NVIDIA_GPU, "1"), (RES_GPU_MILLI, "300")],
            )],
            vec!["container a", "nvidia.com/gpu", "whole GPUs"],
        ),
        (
            "both names in one container",
            vec![c("a", App, &[(RES_GPU, "1"), (RES_NVIDIA_GPU, "1")])],
            vec!["container a asks both"],
        ),
        (
            "GPU count overflows",
            vec![
                c("a", App, &[(RES_GPU, "18446744073709551615")]),
                c("b", App, &[(RES_GPU, "1")]),
            ],
            vec!["tessera.io/gpu", "overflows"],
        ),
        (
            "CPU overflows with a sidecar",
            vec![
                c("s", Sidecar, &[("cpu", "18446744073709551615m")]),
                c("i", Init, &[("cpu", "1m")]),
            ],
            vec!["cpu", "overflows"],
        ),
        (
            "integer extended resource overflows",
            vec![
                c("a", App, &[("example.com/nic", "18446744073709551615")]),
                c("b", App, &[("example.com/nic", "1")]),
            ],
            vec!["example.com/nic", "overflows"],
        ),
    ];
    for (case, containers, words) in cases {
        let e = effective(&containers).expect_err(case);
        for w in words {
            assert!(e.contains(w), "{case}: {w:?} not in {e}");
        }
    }
}

#[test]
fn demands_follow_the_kubelet_order() {
    let pod = [
        c("main", App, &[(RES_GPU, "1")]),
        c("load", Init, &[(RES_GPU, "2")]),
        c("cpu-only", App, &[("cpu", "1")]),
        c("proxy", Sidecar, &[(RES_GPU, "1")]),
        c("zero", App, &[(RES_GPU, "0")]),
    ];
    let d = gpu_demands(&pod).unwrap();
    let got: Vec<(&str, u32)> = d.iter().map(|d| (d.name.as_str(), d.gpus)).collect();
    assert_eq!(got, [("load", 2), ("proxy", 1), ("main", 1)]);
    assert_eq!(
        askers(&pod, RES_GPU),
        [("load", 2), ("proxy", 1), ("main", 1)]
    );
    // A lone share without a count is one GPU, as the parser reads it.
    let d = gpu_demands(&[c("a", App, &[(RES_GPU_MILLI, "300")])]).unwrap();
    assert_eq!(d[0].gpus, 1);
}
