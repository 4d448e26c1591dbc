//! The pods on this node, from the Kubernetes API (the production [`PodSource`]).
//!
//! One watch per agent (field selector `spec.nodeName=<node>`) fills a
//! reflector store; `Allocate`, the metrics, the MIG reaper and the status
//! report read the store. A LIST per read would be about 1,000 consistent
//! LISTs a second at 5,000 nodes (issue 28). The watch starts from the API
//! server's watch cache (`resourceVersion=0`) and re-lists only when it falls
//! out of it. A read waits for the store's first sync, so "no pods" never
//! means "not read yet".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::api::Api;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};

use crate::deviceplugin::allocate::{Container, ContainerKind, PodInfo, PodSource, PodSourceError};

/// How long a read waits for the watch's first sync before it fails.
pub const SYNC_WAIT: Duration = Duration::from_secs(30);

/// This node's pods, from one watch.
#[derive(Clone)]
pub struct KubePods {
    node: String,
    store: Store<Pod>,
    sync_wait: Duration,
    /// Ends the watch when the last clone is dropped.
    _watch: Arc<AbortOnDrop>,
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl std::fmt::Debug for KubePods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubePods")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

/// A watch of the objects `fields` selects, served from the API server's
/// watch cache: any-semantic and unpaged, so its LIST keeps
/// `resourceVersion=0` (a paged LIST drops it and reads etcd: one quorum read
/// per agent start, 5,000 at once after a control-plane restart). For the
/// agent's own small selections: its node's pods (a few hundred at most), its
/// Node.
pub(crate) fn watch_cache_config(fields: &str) -> watcher::Config {
    let mut config = watcher::Config::default().fields(fields).any_semantic();
    config.page_size = None;
    config
}

impl KubePods {
    /// Starts watching the pods bound to `node` (on the current tokio runtime).
    pub fn watch(client: kube::Client, node: &str) -> Self {
        let api: Api<Pod> = Api::all(client);
        let config = watch_cache_config(&format!("spec.nodeName={node}"));
        let (store, writer) = reflector::store();
        let node_name = node.to_string();
        let stream = watcher(api, config)
            // Managed fields are most of a pod's bytes and nothing here reads them.
            .modify(|p| p.metadata.managed_fields = None)
            .default_backoff()
            .reflect(writer);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Err(e) = event {
                    tracing::warn!(node = %node_name, error = %e, "pod watch failed; retrying");
                }
            }
        });
        KubePods {
            node: node.to_string(),
            store,
            sync_wait: SYNC_WAIT,
            _watch: Arc::new(AbortOnDrop(task)),
        }
    }

    /// How long a read waits for the first sync (default [`SYNC_WAIT`]).
    pub fn with_sync_wait(mut self, wait: Duration) -> Self {
        self.sync_wait = wait;
        self
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
            if node != self.node {
                return Err(PodSourceError(format!(
                    "this agent watches node {}, not {node}",
                    self.node
                )));
            }
            match tokio::time::timeout(self.sync_wait, self.store.wait_until_ready()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return Err(PodSourceError("the pod watch has stopped".into())),
                Err(_) => {
                    return Err(PodSourceError(format!(
                        "the pod watch of node {node} has not synced within {:?}",
                        self.sync_wait
                    )));
                }
            }
            Ok(self
                .store
                .state()
                .iter()
                .filter_map(|p| pod_info(p))
                .collect())
        })
    }
}
