//! Whether a pod may go to a node at all in standalone mode, before any
//! resource is looked at (`nodeSelector`, required node affinity, taints and
//! tolerations, cordoned and not-ready nodes), and what this mode does not
//! evaluate (see the [`super`] module docs).

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, NodeSelectorTerm, Pod};

use crate::convert::{self, NodeFacts};

fn requirement_matches(req: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = req.values.as_deref().unwrap_or(&[]);
    match req.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => !value.is_some_and(|v| values.iter().any(|x| x == v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(x)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|x| x.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if req.operator == "Gt" { v > x } else { v < x }
        }
        _ => false,
    }
}

fn term_matches(term: &NodeSelectorTerm, node: &NodeFacts) -> bool {
    let exprs = term.match_expressions.as_deref().unwrap_or(&[]);
    let fields = term.match_fields.as_deref().unwrap_or(&[]);
    if exprs.is_empty() && fields.is_empty() {
        // An empty term matches nothing (Kubernetes semantics).
        return false;
    }
    exprs
        .iter()
        .all(|r| requirement_matches(r, node.labels.get(&r.key).map(String::as_str)))
        && fields.iter().all(|r| {
            let value = (r.key == "metadata.name").then_some(node.name.as_str());
            requirement_matches(r, value)
        })
}

/// Whether a node selector (a DRA allocation's `nodeSelector`) admits `node`:
/// any of its terms matches.
pub fn selector_matches(sel: &k8s_openapi::api::core::v1::NodeSelector, node: &NodeFacts) -> bool {
    sel.node_selector_terms
        .iter()
        .any(|t| term_matches(t, node))
}

/// Whether a pod may go to a node at all, before any resource is looked at:
/// `Err` carries the reason as it appears in the sentence.
pub fn node_allows(pod: &Pod, node: &NodeFacts) -> Result<(), String> {
    if node.unschedulable {
        return Err("node(s) were unschedulable (cordoned)".into());
    }
    if !node.ready {
        return Err("node(s) were not ready".into());
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Ok(());
    };
    if let Some(sel) = &spec.node_selector
        && sel.iter().any(|(k, v)| node.labels.get(k) != Some(v))
    {
        return Err("node(s) didn't match the pod's nodeSelector".into());
    }
    if let Some(required) = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        && !required
            .node_selector_terms
            .iter()
            .any(|t| term_matches(t, node))
    {
        return Err("node(s) didn't match the pod's required node affinity".into());
    }
    let tolerations = spec.tolerations.as_deref().unwrap_or(&[]);
    if node
        .taints
        .iter()
        .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
        .any(|t| !tolerations.iter().any(|tol| convert::tolerates(tol, t)))
    {
        return Err("node(s) had a taint the pod didn't tolerate".into());
    }
    Ok(())
}

/// What of `pod` [`node_allows`] reads (nodeSelector, required node affinity,
/// tolerations), as one string: pods with equal keys are allowed the same
/// nodes, so a verdict cached per request shape must be cached per key too.
pub fn node_constraints_key(pod: &Pod) -> String {
    let Some(spec) = pod.spec.as_ref() else {
        return String::new();
    };
    let required = spec
        .affinity
        .as_ref()
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|na| {
            na.required_during_scheduling_ignored_during_execution
                .as_ref()
        });
    serde_json::json!([spec.node_selector, required, spec.tolerations]).to_string()
}

/// What a pod asks that this mode does not evaluate (see the module docs).
pub fn unsupported(pod: &Pod) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    let mut what = Vec::new();
    let ports = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .flat_map(|c| c.ports.iter().flatten());
    if ports.clone().any(|p| p.host_port.is_some_and(|h| h > 0)) {
        what.push("host ports");
    }
    let aff = spec.affinity.as_ref();
    if aff
        .and_then(|a| a.pod_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|t| !t.is_empty())
    {
        what.push("required pod affinity");
    }
    if aff
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .is_some_and(|t| !t.is_empty())
    {
        what.push("required pod anti-affinity");
    }
    if spec
        .topology_spread_constraints
        .iter()
        .flatten()
        .any(|t| t.when_unsatisfiable == "DoNotSchedule")
    {
        what.push("topology spread constraints (DoNotSchedule)");
    }
    if spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.persistent_volume_claim.is_some() || v.ephemeral.is_some())
    {
        what.push("persistent volume claims");
    }
    (!what.is_empty()).then(|| {
        format!(
            "Tessera's standalone mode does not evaluate {} (kube-scheduler does: use the extender mode for such pods)",
            what.join(", ")
        )
    })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        Affinity, NodeAffinity, NodeSelector, PodSpec, Taint, Toleration,
    };

    use super::*;

    fn facts(labels: &[(&str, &str)], taints: Vec<Taint>) -> NodeFacts {
        NodeFacts {
            name: "n1".into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            taints,
            unschedulable: false,
            ready: true,
            allocatable: Default::default(),
        }
    }

    fn pod(spec: PodSpec) -> Pod {
        Pod {
            spec: Some(spec),
            ..Pod::default()
        }
    }

    #[test]
    fn selectors_affinity_and_taints() {
        let gpu = facts(&[("pool", "gpu"), ("zone", "a")], vec![]);
        let sel = pod(PodSpec {
            node_selector: Some([("pool".to_string(), "gpu".to_string())].into()),
            ..PodSpec::default()
        });
        assert_eq!(node_allows(&sel, &gpu), Ok(()));
        assert!(
            node_allows(&sel, &facts(&[("pool", "cpu")], vec![]))
                .unwrap_err()
                .contains("nodeSelector")
        );

        let affinity = |op: &str, values: &[&str]| {
            pod(PodSpec {
                affinity: Some(Affinity {
                    node_affinity: Some(NodeAffinity {
                        required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                            node_selector_terms: vec![NodeSelectorTerm {
                                match_expressions: Some(vec![NodeSelectorRequirement {
                                    key: "zone".into(),
                                    operator: op.into(),
                                    values: Some(values.iter().map(|v| v.to_string()).collect()),
                                }]),
                                match_fields: None,
                            }],
                        }),
                        ..NodeAffinity::default()
                    }),
                    ..Affinity::default()
                }),
                ..PodSpec::default()
            })
        };
        assert_eq!(node_allows(&affinity("In", &["a", "b"]), &gpu), Ok(()));
        assert!(
            node_allows(&affinity("NotIn", &["a"]), &gpu)
                .unwrap_err()
                .contains("affinity")
        );
        assert!(node_allows(&affinity("DoesNotExist", &[]), &gpu).is_err());

        let tainted = facts(
            &[],
            vec![Taint {
                key: "nvidia.com/gpu".into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            }],
        );
        let plain = pod(PodSpec::default());
        assert!(node_allows(&plain, &tainted).unwrap_err().contains("taint"));
        let tolerant = pod(PodSpec {
            tolerations: Some(vec![Toleration {
                key: Some("nvidia.com/gpu".into()),
                operator: Some("Exists".into()),
                ..Toleration::default()
            }]),
            ..PodSpec::default()
        });
        assert_eq!(node_allows(&tolerant, &tainted), Ok(()));
        let mut cordoned = gpu.clone();
        cordoned.unschedulable = true;
        assert_eq!(
            node_allows(&plain, &cordoned),
            Err("node(s) were unschedulable (cordoned)".into())
        );
    }
}
