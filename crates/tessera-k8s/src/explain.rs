//! `tessera explain NAMESPACE/POD`: where a pod went and why, or why it is
//! pending, computed from the live cluster: a one-shot list of what the
//! scheduler's watches feed its mirror (nodes, `GpuNode`s, pods, `GpuQueue`s,
//! the namespaces' queue label and annotation, `PodGroup`s), fed through the
//! same mirror calls, so a pod its queue refuses or whose gang is short says so.
//! Nothing is written.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use serde::Serialize;
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_core::policy::{PolicyArgs, by_name};
use tessera_core::queue::GpuEquivalents;

use crate::convert;
use crate::mirror::{Mirror, WorkloadReport};
use crate::standalone::node_allows;

/// The answer for one pod.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase", tag = "state")]
pub enum Report {
    /// Bound: the node and, for GPU pods, the allocation annotation's content.
    Placed {
        pod: String,
        node: String,
        allocation: Option<Allocation>,
        note: Option<String>,
        /// For a share asked at an isolation level: why each GPU got its mechanism.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        why: Vec<String>,
    },
    /// Pending and its request does not parse.
    Invalid { pod: String, message: String },
    /// Pending: the sentence and the per-reason node counts.
    Pending {
        pod: String,
        sentence: String,
        reasons: BTreeMap<String, usize>,
        nodes: usize,
    },
    /// Pending because its queue may not take more now (whatever the nodes have free).
    WaitsForQueue { pod: String, message: String },
    /// Pending as a member of a gang: placed only together with the others.
    WaitsForGang {
        pod: String,
        gang: String,
        message: String,
    },
    /// Pending although a node fits now (the scheduler will place it on its next pass).
    WouldFit {
        pod: String,
        node: String,
        nodes_that_fit: usize,
    },
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Report::Placed {
                pod,
                node,
                allocation,
                note,
                why,
            } => {
                write!(f, "{pod} is on node {node}")?;
                if let Some(a) = allocation {
                    write!(
                        f,
                        ", placed by policy {} with isolation {}:",
                        a.policy,
                        a.isolation.name()
                    )?;
                    for g in &a.gpus {
                        write!(f, "\n  GPU {} {}: ", g.index, g.uuid)?;
                        // A MIG grant is an instance: name it first, then what it holds
                        // (its memory and its share of the GPU's compute slices).
                        if let Some(m) = &g.mig {
                            let last = u16::from(m.start) + u16::from(m.size.max(1)) - 1;
                            write!(f, "MIG {}", m.profile)?;
                            if !m.uuid.is_empty() {
                                write!(f, " {}", m.uuid)?;
                            }
                            write!(f, " at memory slices {}-{last}, ", m.start)?;
                        }
                        write!(
                            f,
                            "{} MiB, {}.{}% compute",
                            g.memory_mib,
                            g.cores_milli / 10,
                            g.cores_milli % 10
                        )?;
                    }
                } else {
                    write!(f, " (no Tessera GPU allocation)")?;
                }
                for w in why {
                    write!(f, "\n  why: {w}")?;
                }
                if let Some(n) = note {
                    write!(f, "\n  note: {n}")?;
                }
                Ok(())
            }
            Report::Invalid { pod, message } => {
                write!(f, "{pod} is pending: its GPU request is invalid: {message}")
            }
            Report::Pending { pod, sentence, .. } => write!(f, "{pod} is pending: {sentence}"),
            Report::WaitsForQueue { pod, message } => {
                write!(
                    f,
                    "{pod} is pending: it waits for its queue's quota: {message}"
                )
            }
            Report::WaitsForGang { pod, gang, message } => write!(
                f,
                "{pod} is pending: it is placed only with its gang {gang}: {message}"
            ),
            Report::WouldFit {
                pod,
                node,
                nodes_that_fit,
            } => write!(
                f,
                "{pod} is pending, but fits now on {nodes_that_fit} node(s); the best is {node} (the scheduler will place it on its next pass)"
            ),
        }
    }
}

/// The report with the target workload the policy scores against (what makes a
/// node's fragment, and so the choice, what it is).
#[derive(Debug, Clone, Serialize)]
pub struct Explained {
    #[serde(flatten)]
    pub report: Report,
    pub workload: WorkloadReport,
}

impl std::fmt::Display for Explained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\n{}", self.report, self.workload)
    }
}

/// Why explain could not answer.
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("reading {what} from the cluster: {source}")]
    List {
        what: &'static str,
        source: kube::Error,
    },
    #[error("pod {0} not found")]
    NotFound(String),
    #[error("policy: {0}")]
    Policy(String),
}

/// [`explain`] with a client from the service account or kubeconfig.
pub async fn explain_live(
    namespace: &str,
    name: &str,
    policy: &str,
    ge: GpuEquivalents,
) -> Result<Explained, ExplainError> {
    let client = kube::Client::try_default()
        .await
        .map_err(|source| ExplainError::List {
            what: "a connection",
            source,
        })?;
    explain(client, namespace, name, policy, ge).await
}

/// Explains `namespace/name` as of now, judging pending pods with `policy`
/// against the workload learned from the pods listed (as the scheduler rebuilds
/// it after a restart), and quotas with `ge` (the scheduler's `--gpu-equivalents`).
pub async fn explain(
    client: kube::Client,
    namespace: &str,
    name: &str,
    policy: &str,
    ge: GpuEquivalents,
) -> Result<Explained, ExplainError> {
    let policy =
        by_name(policy, &PolicyArgs::default()).map_err(|e| ExplainError::Policy(e.to_string()))?;
    let listed = |e: crate::view::ListFailed| ExplainError::List {
        what: e.what,
        source: e.source,
    };
    let (nodes, inventory, pods) = crate::view::read_cluster(&client).await.map_err(listed)?;
    let queues_and_gangs = crate::view::read_queues_and_gangs(&client)
        .await
        .map_err(listed)?;
    let key = format!("{namespace}/{name}");
    let target = convert::find_pod(&pods, namespace, name)
        .cloned()
        .ok_or_else(|| ExplainError::NotFound(key.clone()))?;
    // No key: annotations are read as the API holds them (display only).
    let mut mirror = Mirror::from_objects(policy, Vec::new(), nodes, inventory, pods);
    mirror.set_gpu_equivalents(ge);
    queues_and_gangs.feed(&mut mirror);
    Ok(Explained {
        report: report(&mut mirror, &target),
        workload: mirror.workload_report(),
    })
}

/// The report for one pod against a mirror (pure; tests call it directly).
pub fn report(mirror: &mut Mirror, pod: &Pod) -> Report {
    let key = convert::pod_key(pod);
    if let Some(node) = convert::pod_node(pod) {
        let raw = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION));
        let (allocation, note) = match raw.map(|v| Allocation::decode_unverified(v)) {
            None => (None, None),
            Some(Ok(a)) => (Some(a), None),
            Some(Err(e)) => (None, Some(e.to_string())),
        };
        let why = allocation
            .as_ref()
            .map(|a| why_mechanism(mirror, pod, node, a))
            .unwrap_or_default();
        return Report::Placed {
            pod: key,
            node: node.to_string(),
            allocation,
            note,
            why,
        };
    }
    let catalog = mirror.cluster().catalog.clone();
    let asks = convert::pod_asks(pod, &catalog);
    let req = match asks.request {
        Ok(r) => r,
        Err(e) => {
            return Report::Invalid {
                pod: key,
                message: e.to_string(),
            };
        }
    };
    let host = asks.host.unwrap_or_default();
    if let crate::mirror::QuotaCheck::Refused(message) = mirror.quota(pod, &req) {
        return Report::WaitsForQueue { pod: key, message };
    }
    if let Some(gang) = crate::mirror::gang_of(pod) {
        let message = match mirror.pod_group(&gang) {
            None => format!("PodGroup {gang} does not exist"),
            Some(spec) => {
                let min = spec.min_member.unwrap_or(1).max(1);
                let waiting = mirror
                    .waiting_pods()
                    .filter(|p| crate::mirror::gang_of(p).as_deref() == Some(gang.as_str()))
                    .count();
                format!(
                    "minMember {min}: {} placed, {waiting} waiting (members are placed all together, in one attempt)",
                    mirror.gang_held(&gang)
                )
            }
        };
        return Report::WaitsForGang {
            pod: key,
            gang,
            message,
        };
    }
    match mirror.decide(&req, &host, |facts| node_allows(pod, facts)) {
        Ok((p, e)) => Report::WouldFit {
            pod: key,
            node: mirror.cluster().node(p.node).name.clone(),
            nodes_that_fit: e.fit,
        },
        Err(e) => Report::Pending {
            pod: key,
            sentence: e.to_string(),
            reasons: e
                .ranked()
                .into_iter()
                .map(|(r, n)| (r.to_string(), n))
                .collect(),
            nodes: e.total,
        },
    }
}

/// Why each GPU of a pod asked at an isolation level got its mechanism.
fn why_mechanism(mirror: &mut Mirror, pod: &Pod, node: &str, a: &Allocation) -> Vec<String> {
    let cluster = mirror.cluster();
    let Ok(req) = convert::pod_asks(pod, &cluster.catalog).request else {
        return Vec::new();
    };
    let Some(n) = cluster.node_id(node).map(|id| cluster.node(id)) else {
        return Vec::new();
    };
    a.gpus
        .iter()
        .filter_map(|g| {
            let gpu = n.gpus.iter().find(|x| x.index == g.index)?;
            let spec = cluster.catalog.spec(gpu.model);
            tessera_core::fit::mig_layout::explain_allocated(
                spec,
                &req,
                a.isolation,
                g.mig.as_ref(),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::core::v1::{Container, PodSpec, ResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use tessera_api::GpuNode;
    use tessera_api::{GpuDevice, GpuNodeSpec};

    use super::*;

    fn node(name: &str) -> Node {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}
        }))
        .unwrap()
    }

    fn pod(name: &str, gpus: &str) -> Pod {
        Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ml".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "c".into(),
                    resources: Some(ResourceRequirements {
                        requests: Some(
                            [("tessera.io/gpu".to_string(), Quantity(gpus.into()))].into(),
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
    fn pending_pods_get_per_reason_counts() {
        let inv = GpuNode::new(
            "a",
            GpuNodeSpec {
                node_name: "a".into(),
                gpus: (0..2)
                    .map(|index| GpuDevice {
                        index,
                        model: "L4".into(),
                        memory_mib: 23_034,
                        ..Default::default()
                    })
                    .collect(),
            },
        );
        let policy = by_name("tessera", &PolicyArgs::default()).unwrap();
        let mut m = Mirror::from_objects(
            policy,
            Vec::new(),
            vec![node("a"), node("b")],
            vec![inv],
            vec![],
        );
        match report(&mut m, &pod("big", "4")) {
            Report::Pending {
                sentence,
                reasons,
                nodes,
                ..
            } => {
                assert_eq!(nodes, 2);
                assert_eq!(
                    sentence,
                    "0/2 nodes fit: 1 fewer than 4 GPUs in total, 1 no GPUs known (no GpuNode inventory)"
                );
                assert_eq!(reasons.get("fewer than 4 GPUs in total"), Some(&1));
            }
            r => panic!("expected pending, got {r:?}"),
        }
        match report(&mut m, &pod("small", "1")) {
            Report::WouldFit {
                node,
                nodes_that_fit,
                ..
            } => assert_eq!((node.as_str(), nodes_that_fit), ("a", 1)),
            r => panic!("expected would-fit, got {r:?}"),
        }
        let bad = report(&mut m, &pod("bad", "lots"));
        assert!(bad.to_string().contains("tessera.io/gpu"), "{bad}");
    }
    /// A bound MIG pod shows its instance, its memory and its share of the GPU's compute.
    #[test]
    fn a_mig_grant_shows_its_instance_and_compute_share() {
        let inv: GpuNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"nodeName": "a", "gpus": [{
                "index": 0, "uuid": "GPU-0", "model": "A100-80GB", "memoryMiB": 81920,
                "mig": {"enabled": true, "instances": [
                    {"profile": "3g.40gb", "start": 4, "size": 4, "uuid": "MIG-8a2f"}
                ]}
            }]}
        }))
        .unwrap();
        let policy = by_name("tessera", &PolicyArgs::default()).unwrap();
        let mut m = Mirror::from_objects(policy, b"k".to_vec(), vec![node("a")], vec![inv], vec![]);
        let mut p = pod("mig", "1");
        let res = p.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap();
        res.requests = Some([("tessera.io/mig-3g.40gb".to_string(), Quantity("1".into()))].into());
        let Ok(crate::mirror::Reservation::Write {
            annotation: Some(annotation),
        }) = m.reserve(&p, "a")
        else {
            panic!("the instance is free");
        };
        p.metadata.annotations = Some([(ANNOTATION.to_string(), annotation)].into());
        p.spec.as_mut().unwrap().node_name = Some("a".into());
        let text = report(&mut m, &p).to_string();
        assert!(!text.contains("why:"), "{text}");
        // 3 of 7 compute slices, rounded down to per-mille: 428, shown as 42.8 %.
        assert!(
            text.contains(
                "GPU 0 GPU-0: MIG 3g.40gb MIG-8a2f at memory slices 4-7, 40192 MiB, 42.8% compute"
            ),
            "{text}"
        );
    }

    /// A hard share on a node that allows dynamic MIG: the scheduler plans a MIG
    /// instance on a plain GPU, the annotation says to create it (switching MIG mode
    /// first), and explain says which mechanism and why.
    #[test]
    fn a_hard_share_gets_a_planned_instance_and_explain_says_why() {
        let inv: GpuNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"nodeName": "a", "gpus": [{
                "index": 0, "uuid": "GPU-0", "model": "H100-80GB", "memoryMiB": 81559
            }]}
        }))
        .unwrap();
        let mut n = node("a");
        n.metadata.labels = Some(
            [(
                tessera_core::fit::mig_layout::LABEL_MIG_DYNAMIC.to_string(),
                "mode".to_string(),
            )]
            .into(),
        );
        let policy = by_name("tessera", &PolicyArgs::default()).unwrap();
        let mut m = Mirror::from_objects(policy, b"k".to_vec(), vec![n], vec![inv], vec![]);
        let mut p = pod("hard", "1");
        let res = p.spec.as_mut().unwrap().containers[0]
            .resources
            .as_mut()
            .unwrap();
        res.requests = Some(
            [
                ("tessera.io/gpu".to_string(), Quantity("1".into())),
                ("tessera.io/gpu-milli".to_string(), Quantity("300".into())),
            ]
            .into(),
        );
        p.metadata.annotations =
            Some([("tessera.io/isolation".to_string(), "hard".to_string())].into());
        let Ok(crate::mirror::Reservation::Write {
            annotation: Some(annotation),
        }) = m.reserve(&p, "a")
        else {
            panic!("a hard share fits an idle H100 that may switch into MIG mode");
        };
        let a = Allocation::decode_unverified(&annotation).unwrap();
        assert_eq!(a.isolation, tessera_core::request::Isolation::Mig);
        let grant = a.gpus[0].mig.clone().unwrap();
        assert_eq!(
            (grant.profile.as_str(), grant.create, grant.enable_mig_mode),
            ("3g.40gb", true, true)
        );
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION.to_string(), annotation);
        p.spec.as_mut().unwrap().node_name = Some("a".into());
        let text = report(&mut m, &p).to_string();
        assert!(
            text.contains("why: hard isolation: MIG 3g.40gb, the smallest profile covering")
                && text.contains("switches the idle GPU into MIG mode"),
            "{text}"
        );
    }
}
