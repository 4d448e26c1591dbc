//! A node moves from the device plugin to the DRA driver only once drained
//! (issue 41, defect 9).
//!
//! Labelling a node for DRA without draining it starts the driver while pods
//! the device plugin served still run on its GPUs: the slices would offer those
//! GPUs again and a claim could be given one that a running pod uses. So the
//! driver asks the kubelet's PodResources API which pods hold device-plugin GPU
//! devices (`nvidia.com/*`, `tessera.io/*`) and publishes no ResourceSlice while
//! any does, nor while the API cannot be read: `/readyz` names the pods (or the
//! error), a Warning event on the Node says it once per change, and the check
//! is repeated until the node is drained. With `--pod-resources-socket off` the
//! check is skipped (the operator vouches for the drain).

use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::{Api, PostParams};

use crate::podresources::{KubeletPod, KubeletPods, is_gpu_resource};

/// How many pods a reason names before "and N more".
const NAMED: usize = 5;

/// The pods holding GPU devices a device plugin served, as `namespace/name`.
pub fn device_plugin_pods(pods: &[KubeletPod]) -> Vec<String> {
    let mut out: Vec<String> = pods
        .iter()
        .filter(|p| {
            p.containers.iter().any(|c| {
                c.devices
                    .iter()
                    .any(|(r, ids)| is_gpu_resource(r) && !ids.is_empty())
            })
        })
        .map(KubeletPod::key)
        .collect();
    out.sort();
    out
}

/// `Ok` when the node holds no device-plugin GPU pod, else why no slice is published.
pub async fn check(kubelet: &dyn KubeletPods) -> Result<(), String> {
    let pods = kubelet.list().await.map_err(|e| {
        format!("not publishing ResourceSlices: cannot tell whether device-plugin pods still hold this node's GPUs ({e})")
    })?;
    let holders = device_plugin_pods(&pods);
    if holders.is_empty() {
        return Ok(());
    }
    let mut named = holders[..holders.len().min(NAMED)].join(", ");
    if holders.len() > NAMED {
        named.push_str(&format!(" and {} more", holders.len() - NAMED));
    }
    Err(format!(
        "not publishing ResourceSlices: {} pod(s) hold GPUs through the device plugin ({named}); drain the node before it is served through DRA",
        holders.len()
    ))
}

/// A Warning event on the Node saying why no slice is published.
pub async fn report(client: &kube::Client, node: &str, reason: &str) -> Result<(), kube::Error> {
    node_warning(
        client,
        node,
        "DevicePluginPodsRunning",
        reason,
        "tessera-node-agent-dra",
    )
    .await
}

/// A Warning event on the Node `node`: `reason` (CamelCase), `message`, from
/// `component`. Shared by the DRA driver and the device-plugin agent, each of
/// which says with it why it does not serve the node's GPUs yet.
pub async fn node_warning(
    client: &kube::Client,
    node: &str,
    reason: &str,
    message: &str,
    component: &str,
) -> Result<(), kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{node}.handover.")),
            namespace: Some("default".into()),
            ..ObjectMeta::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Node".into()),
            name: Some(node.into()),
            ..ObjectReference::default()
        },
        reason: Some(reason.into()),
        message: Some(message.into()),
        type_: Some("Warning".into()),
        source: Some(EventSource {
            component: Some(component.into()),
            host: Some(node.into()),
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: None::<MicroTime>,
        count: Some(1),
        ..Event::default()
    };
    Api::<Event>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &event)
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::podresources::{KubeletContainer, StaticKubeletPods};

    fn pod(name: &str, devices: Vec<(&str, Vec<&str>)>) -> KubeletPod {
        KubeletPod {
            namespace: "ml".into(),
            name: name.into(),
            containers: vec![KubeletContainer {
                name: "c".into(),
                devices: devices
                    .into_iter()
                    .map(|(r, ids)| (r.into(), ids.into_iter().map(String::from).collect()))
                    .collect(),
            }],
        }
    }

    #[tokio::test]
    async fn no_slice_while_device_plugin_pods_hold_gpus() {
        let kubelet = StaticKubeletPods::default();
        kubelet.set(vec![
            pod("cpu", vec![]),
            pod("nic", vec![("example.com/nic", vec!["eth1"])]),
            pod("empty", vec![("tessera.io/gpu", vec![])]),
        ]);
        assert_eq!(check(&kubelet).await, Ok(()));
        kubelet.set(vec![
            pod("train", vec![("tessera.io/gpu", vec!["slot-3"])]),
            pod("stock", vec![("nvidia.com/gpu", vec!["GPU-1"])]),
            pod("cpu", vec![]),
        ]);
        let why = check(&kubelet).await.unwrap_err();
        assert!(
            why.contains("2 pod(s) hold GPUs through the device plugin (ml/stock, ml/train)"),
            "{why}"
        );
        let many: Vec<KubeletPod> = (0..7)
            .map(|i| pod(&format!("p{i}"), vec![("nvidia.com/gpu", vec!["GPU-0"])]))
            .collect();
        kubelet.set(many);
        let why = check(&kubelet).await.unwrap_err();
        assert!(why.contains("ml/p4 and 2 more"), "{why}");
    }

    struct Broken;
    impl KubeletPods for Broken {
        fn list(
            &self,
        ) -> futures::future::BoxFuture<
            '_,
            Result<Vec<KubeletPod>, crate::podresources::PodResourcesError>,
        > {
            Box::pin(async {
                Err(crate::podresources::PodResourcesError::List(
                    "unavailable".into(),
                ))
            })
        }
    }

    #[tokio::test]
    async fn an_unreadable_kubelet_publishes_nothing() {
        let why = check(&Broken).await.unwrap_err();
        assert!(
            why.contains("cannot tell whether device-plugin pods"),
            "{why}"
        );
    }
}
