//! The facts behind `tessera doctor pod`: the pod's row, its containers' states,
//! its events, its granted GPUs as `top` sees them, and for an MPS share the
//! node agent's daemon for its GPUs.

use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, ListParams};
use serde::Serialize;
use tessera_api::GpuNode;
use tessera_core::allocation::Allocation;

use super::{GpuRow, PodRow, ViewError, phase, pods_from, read_cluster, top_from};
use crate::convert;

/// Everything `tessera doctor pod` judges, for one pod.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodFacts {
    pub pod: PodRow,
    pub containers: Vec<ContainerFacts>,
    /// The pod's events, oldest first.
    pub events: Vec<EventFacts>,
    /// The pod's granted GPUs as `top` sees them (health, reason, other tenants).
    pub gpus: Vec<GpuRow>,
    /// For an MPS pod on a node whose agent runs the MPS daemons (its GpuNode status
    /// lists them): the daemon that serves its GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mps: Option<MpsFacts>,
}

/// The MPS control daemon an MPS pod's GPUs need, as the node agent reported it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsFacts {
    /// UUIDs of the pod's GPUs.
    pub gpus: Vec<String>,
    /// The agent's daemon for exactly these GPUs; `None`: it runs none for them.
    pub daemon: Option<tessera_api::MpsDaemonState>,
}

/// The daemon for `alloc`'s GPUs on `gpu_node`, when the pod is an MPS share and the
/// node's agent reports MPS daemons at all.
fn mps_facts(alloc: &Allocation, gpu_node: Option<&GpuNode>) -> Option<MpsFacts> {
    if alloc.isolation != tessera_core::request::Isolation::Mps {
        return None;
    }
    let gn = gpu_node?;
    let daemons = &gn.status.as_ref()?.mps_daemons;
    if daemons.is_empty() {
        return None;
    }
    let mut gpus: Vec<String> = alloc
        .gpus
        .iter()
        .filter_map(|g| {
            if g.uuid.is_empty() {
                gn.spec
                    .gpus
                    .iter()
                    .find(|d| d.index == g.index)
                    .map(|d| d.uuid.clone())
            } else {
                Some(g.uuid.clone())
            }
        })
        .collect();
    gpus.sort();
    gpus.dedup();
    let daemon = daemons
        .iter()
        .find(|d| {
            let mut have = d.gpus.clone();
            have.sort();
            have == gpus
        })
        .cloned();
    Some(MpsFacts { gpus, daemon })
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerFacts {
    pub name: String,
    /// `running`, `waiting`, `terminated` or `unknown`.
    pub state: String,
    pub reason: String,
    pub message: String,
    pub exit_code: Option<i32>,
    pub restarts: i32,
    /// The last termination (reason and message), which holds a crash-looping container's error.
    pub last_reason: String,
    pub last_message: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EventFacts {
    pub type_: String,
    pub reason: String,
    pub message: String,
    pub count: i32,
}

/// The facts about `namespace/name` from listed objects.
pub fn pod_facts_from(
    namespace: &str,
    name: &str,
    nodes: Vec<Node>,
    inventory: Vec<GpuNode>,
    pods: Vec<Pod>,
    events: Vec<Event>,
) -> Result<PodFacts, ViewError> {
    let key = format!("{namespace}/{name}");
    let target = crate::convert::find_pod(&pods, namespace, name)
        .cloned()
        .ok_or_else(|| ViewError::NotFound(key.clone()))?;
    let row = pods_from(std::slice::from_ref(&target))
        .pop()
        .unwrap_or_else(|| PodRow {
            namespace: namespace.to_string(),
            name: name.to_string(),
            phase: phase(&target),
            node: convert::pod_node(&target).map(str::to_string),
            requests: Vec::new(),
            allocation: None,
            problem: None,
        });
    let uid = target.metadata.uid.clone();
    let mut events: Vec<&Event> = events
        .iter()
        .filter(|e| {
            e.involved_object.name.as_deref() == Some(name)
                && e.involved_object
                    .namespace
                    .as_deref()
                    .is_none_or(|n| n == namespace)
                && (uid.is_none()
                    || e.involved_object.uid.is_none()
                    || e.involved_object.uid == uid)
        })
        .collect();
    events.sort_by_key(|e| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or(e.event_time.as_ref().map(|t| t.0))
    });
    let mps = match (&row.node, &row.allocation) {
        (Some(node), Some(a)) => mps_facts(
            a,
            inventory
                .iter()
                .find(|g| g.metadata.name.as_deref() == Some(node.as_str())),
        ),
        _ => None,
    };
    let gpus = match (&row.node, &row.allocation) {
        (Some(node), Some(a)) => {
            let rows = top_from(nodes, inventory, pods);
            rows.into_iter()
                .find(|r| &r.name == node)
                .map(|r| {
                    r.gpus
                        .into_iter()
                        .filter(|g| a.gpus.iter().any(|ag| ag.index == g.index))
                        .collect()
                })
                .unwrap_or_default()
        }
        _ => Vec::new(),
    };
    Ok(PodFacts {
        pod: row,
        containers: containers(&target),
        events: events
            .into_iter()
            .map(|e| EventFacts {
                type_: e.type_.clone().unwrap_or_default(),
                reason: e.reason.clone().unwrap_or_default(),
                message: e.message.clone().unwrap_or_default(),
                count: e.count.unwrap_or(1),
            })
            .collect(),
        gpus,
        mps,
    })
}

/// The facts for `doctor pod`, read from the cluster.
pub async fn pod_facts(
    client: &kube::Client,
    namespace: &str,
    name: &str,
) -> Result<PodFacts, ViewError> {
    let (nodes, inventory, pods) = read_cluster(client).await?;
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    let events = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&lp)
        .await
        .map_err(|source| ViewError::List {
            what: "events",
            source,
        })?;
    pod_facts_from(namespace, name, nodes, inventory, pods, events.items)
}

fn containers(p: &Pod) -> Vec<ContainerFacts> {
    let Some(statuses) = p
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
    else {
        return Vec::new();
    };
    statuses
        .iter()
        .map(|s| {
            let (state, reason, message, exit_code) = match &s.state {
                Some(st) if st.running.is_some() => ("running", None, None, None),
                Some(st) if st.waiting.is_some() => {
                    let w = st.waiting.as_ref();
                    (
                        "waiting",
                        w.and_then(|w| w.reason.clone()),
                        w.and_then(|w| w.message.clone()),
                        None,
                    )
                }
                Some(st) if st.terminated.is_some() => {
                    let t = st.terminated.as_ref();
                    (
                        "terminated",
                        t.and_then(|t| t.reason.clone()),
                        t.and_then(|t| t.message.clone()),
                        t.map(|t| t.exit_code),
                    )
                }
                _ => ("unknown", None, None, None),
            };
            let last = s.last_state.as_ref().and_then(|l| l.terminated.as_ref());
            ContainerFacts {
                name: s.name.clone(),
                state: state.to_string(),
                reason: reason.unwrap_or_default(),
                message: message.unwrap_or_default(),
                exit_code,
                restarts: s.restart_count,
                last_reason: last.and_then(|t| t.reason.clone()).unwrap_or_default(),
                last_message: last.and_then(|t| t.message.clone()).unwrap_or_default(),
            }
        })
        .collect()
}
