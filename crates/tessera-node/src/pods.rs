//! The pods on this node, from the Kubernetes API (the production [`PodSource`]).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::deviceplugin::allocate::{Container, ContainerKind, PodInfo, PodSource, PodSourceError};

/// Lists pods with `spec.nodeName=<node>`.
#[derive(Clone)]
pub struct KubePods {
    client: kube::Client,
}

impl std::fmt::Debug for KubePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePods").finish_non_exhaustive()
    }
}

impl KubePods {
    pub fn new(client: kube::Client) -> Self {
        KubePods { client }
    }
}

/// Converts an API pod; `None` for a pod without a UID (never from a real API server).
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let meta = &pod.metadata;
    let convert = |c: &k8s_openapi::api::core::v1::Container, kind| {
        let mut resources = BTreeMap::new();
        if let Some(r) = &c.resources {
            // Requests win; extended resources must have equal requests and limits anyway.
            for (k, v) in r.limits.iter().flatten().chain(r.requests.iter().flatten()) {
                resources.insert(k.clone(), v.0.clone());
            }
        }
        Container {
            name: c.name.clone(),
            kind,
            resources,
        }
    };
    // The order the kubelet admits containers in: init containers, then app containers.
    let containers = pod
        .spec
        .as_ref()
        .map(|s| {
            let init = s.init_containers.iter().flatten().map(|c| {
                let kind = if c.restart_policy.as_deref() == Some("Always") {
                    ContainerKind::Sidecar
                } else {
                    ContainerKind::Init
                };
                convert(c, kind)
            });
            init.chain(s.containers.iter().map(|c| convert(c, ContainerKind::App)))
                .collect()
        })
        .unwrap_or_default();
    Some(PodInfo {
        uid: meta.uid.clone()?,
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        phase: pod
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default(),
        created_unix: meta
            .creation_timestamp
            .as_ref()
            .map(|t| t.0.as_second())
            .unwrap_or(0),
        annotations: meta.annotations.clone().unwrap_or_default(),
        containers,
    })
}

impl PodSource for KubePods {
    fn pods_on_node<'a>(
        &'a self,
        node: &'a str,
    ) -> BoxFuture<'a, Result<Vec<PodInfo>, PodSourceError>> {
        Box::pin(async move {
            let api: Api<Pod> = Api::all(self.client.clone());
            let list = api
                .list(&ListParams::default().fields(&format!("spec.nodeName={node}")))
                .await
                .map_err(|e| PodSourceError(e.to_string()))?;
            Ok(list.items.iter().filter_map(pod_info).collect())
        })
    }
}
