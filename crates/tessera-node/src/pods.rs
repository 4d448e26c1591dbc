//! The pods on this node, from the Kubernetes API (the production [`PodSource`]).

use std::collections::BTreeMap;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::deviceplugin::allocate::{ContainerInfo, PodInfo, PodSource, PodSourceError};

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

/// Whole-number resource quantities (extended resources are integers).
fn count(q: &k8s_openapi::apimachinery::pkg::api::resource::Quantity) -> Option<u64> {
    q.0.trim().parse().ok()
}

/// Converts an API pod; `None` for a pod without a UID (never from a real API server).
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let meta = &pod.metadata;
    let containers = pod
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| {
                    let mut resources = BTreeMap::new();
                    if let Some(r) = &c.resources {
                        // Limits win; extended resources must have equal requests anyway.
                        for map in [r.requests.as_ref(), r.limits.as_ref()]
                            .into_iter()
                            .flatten()
                        {
                            for (k, v) in map {
                                if let Some(n) = count(v) {
                                    resources.insert(k.clone(), n);
                                }
                            }
                        }
                    }
                    ContainerInfo {
                        name: c.name.clone(),
                        resources,
                    }
                })
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
