//! Countable node resources the core does not model: the pod count, ephemeral
//! storage, and extended resources a device plugin advertises — above all the
//! node agent's `tessera.io/gpu` slots (GPUs × `--slots`).
//!
//! The kubelet admits a pod only if every such resource it asks fits the node's
//! `status.allocatable`; a scheduler that ignores them binds pods the kubelet
//! then refuses (seen on a real cluster: twenty `tessera.io/gpu: 1` shares on a
//! node advertising 16 slots, the last four refused). Tessera's GPU-share
//! resources that no device plugin advertises (`tessera.io/gpu-memory`, …) are
//! accounted by the core ledger and skipped here; a resource the node does not
//! list at all is not judged here either (its GPUs are judged from the GpuNode).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use tessera_core::request;

/// What a pod takes of the countable resources, resource name → amount
/// (`ephemeral-storage` in MiB, everything else in units).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct HostAsk(pub BTreeMap<String, u64>);

/// Tessera's share resources: accounted by the ledger, advertised by no one.
fn ledger_only(name: &str) -> bool {
    matches!(
        name,
        request::RES_GPU_MEMORY
            | request::RES_GPU_MEMORY_PERCENT
            | request::RES_GPU_CORES
            | request::RES_GPU_MILLI
    )
}

fn counted(name: &str) -> bool {
    (name == "ephemeral-storage" || name.contains('/')) && !ledger_only(name)
}

fn amount(name: &str, value: &str) -> Result<u64, String> {
    if name == "ephemeral-storage" {
        return request::parse_memory_mib(name, value).map_err(|e| e.to_string());
    }
    value
        .trim()
        .parse::<u64>()
        .map_err(|_| format!("{name}: {value:?} is not a whole number"))
}

/// The pod's effective asks of the countable resources, by Kubernetes' rule
/// (the larger of the app containers and sidecars together and the peak of
/// the init sequence, sidecars included) as [`crate::convert::pod_resources`]
/// computes it for the core, plus one `pods` slot.
pub fn host_ask(pod: &Pod) -> Result<HostAsk, String> {
    host_ask_from(&crate::convert::pod_resources(pod).map_err(|e| e.to_string())?)
}

/// [`host_ask`] from the pod's effective request, already computed.
pub fn host_ask_from(resources: &[(String, String)]) -> Result<HostAsk, String> {
    let mut total: BTreeMap<String, u64> = resources
        .iter()
        .filter(|(k, _)| counted(k))
        .map(|(k, v)| amount(k, v).map(|n| (k.clone(), n)))
        .collect::<Result<_, _>>()?;
    total.insert("pods".to_string(), 1);
    Ok(HostAsk(total))
}

/// The countable resources a node offers (`status.allocatable`).
pub fn allocatable(node: &KubeNode) -> BTreeMap<String, u64> {
    node.status
        .as_ref()
        .and_then(|s| s.allocatable.as_ref())
        .into_iter()
        .flatten()
        .filter(|(k, _)| counted(k) || k.as_str() == "pods")
        .filter_map(|(k, Quantity(v))| amount(k, v).ok().map(|n| (k.clone(), n)))
        .collect()
}

/// Adds (or, with `sign` false, removes) `ask` to a node's use.
pub fn account(used: &mut BTreeMap<String, u64>, ask: &HostAsk, add: bool) {
    for (k, v) in &ask.0 {
        let slot = used.entry(k.clone()).or_default();
        *slot = if add {
            slot.saturating_add(*v)
        } else {
            slot.saturating_sub(*v)
        };
    }
}

/// Whether `ask` fits beside `used` on a node offering `allocatable`; the
/// rejection names the resource and the numbers.
pub fn check(
    allocatable: &BTreeMap<String, u64>,
    used: Option<&BTreeMap<String, u64>>,
    ask: &HostAsk,
) -> Result<(), String> {
    for (k, want) in &ask.0 {
        let Some(cap) = allocatable.get(k) else {
            continue;
        };
        let have = used.and_then(|u| u.get(k)).copied().unwrap_or(0);
        if have.saturating_add(*want) > *cap {
            return Err(format!(
                "too little {k}: asks {want}, {} of {cap} free",
                cap.saturating_sub(have)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{Container, NodeStatus, PodSpec, ResourceRequirements};

    fn container(res: &[(&str, &str)]) -> Container {
        Container {
            name: "c".into(),
            resources: Some(ResourceRequirements {
                requests: Some(
                    res.iter()
                        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn asks_follow_kubernetes_effective_request_and_skip_ledger_resources() {
        let share = [("tessera.io/gpu", "1"), ("tessera.io/gpu-memory", "4000")];
        let sidecar = |res: &[(&str, &str)]| Container {
            restart_policy: Some("Always".into()),
            ..container(res)
        };
        let pod = Pod {
            spec: Some(PodSpec {
                containers: vec![
                    container(&share),
                    container(&[("ephemeral-storage", "1Gi"), ("example.com/nic", "1")]),
                ],
                init_containers: Some(vec![
                    sidecar(&[("example.com/nic", "2")]),
                    container(&[("example.com/nic", "4")]),
                ]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let a = host_ask(&pod).unwrap();
        // nic: max(sidecar 2 + app 1, sidecar 2 + init 4) = 6; the sidecar
        // runs beside the init container after it. gpu-memory is the ledger's;
        // ephemeral 1 GiB = 1024 MiB.
        assert_eq!(
            a.0,
            [
                ("ephemeral-storage".to_string(), 1024),
                ("example.com/nic".to_string(), 6),
                ("pods".to_string(), 1),
                ("tessera.io/gpu".to_string(), 1)
            ]
            .into()
        );
        let bad = Pod {
            spec: Some(PodSpec {
                containers: vec![
                    container(&[("example.com/x", "18446744073709551615")]),
                    container(&[("example.com/x", "1")]),
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        let e = host_ask(&bad).unwrap_err();
        assert!(
            e.contains("example.com/x") && e.contains("overflows"),
            "{e}"
        );
    }

    #[test]
    fn slots_are_checked_against_allocatable() {
        // 16 slots (one GPU × 16); 15 used: one more fits, two do not.
        let node = KubeNode {
            status: Some(NodeStatus {
                allocatable: Some(
                    [
                        ("tessera.io/gpu".to_string(), Quantity("16".into())),
                        ("pods".to_string(), Quantity("110".into())),
                        ("cpu".to_string(), Quantity("8".into())),
                    ]
                    .into(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let cap = allocatable(&node);
        assert_eq!(cap.len(), 2, "cpu is the core's: {cap:?}");
        let one = HostAsk([("tessera.io/gpu".to_string(), 1), ("pods".to_string(), 1)].into());
        let mut used = BTreeMap::new();
        for _ in 0..15 {
            account(&mut used, &one, true);
        }
        assert!(check(&cap, Some(&used), &one).is_ok());
        account(&mut used, &one, true);
        assert_eq!(
            check(&cap, Some(&used), &one).unwrap_err(),
            "too little tessera.io/gpu: asks 1, 0 of 16 free"
        );
        account(&mut used, &one, false);
        assert!(check(&cap, Some(&used), &one).is_ok());
        // A resource the node does not list is not judged here.
        let other = HostAsk([("example.com/fpga".to_string(), 1)].into());
        assert!(check(&cap, Some(&used), &other).is_ok());
    }
}
