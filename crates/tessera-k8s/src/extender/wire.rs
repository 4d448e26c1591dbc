//! The kube-scheduler extender's JSON messages (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go structs have no `json:` tags, so the scheduler sends the Go field
//! names, capitalised (`Pod`, `NodeNames`, `FailedNodes`, …), and `null` for
//! nil pointers. We accept that form (and the lower-case one, as Go's decoder
//! would), treat `null` and absent alike, and always answer capitalised.
//! Nested Kubernetes objects keep their normal camelCase API JSON.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Pod};
use serde::{Deserialize, Deserializer, Serialize};

/// `MaxExtenderPriority`: the highest score an extender should give.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A `v1.NodeList` as the scheduler sends it (`{"metadata":{},"items":[…]}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeList {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "null_as_default")]
    pub items: Vec<Node>,
}

/// Request body of `filter` and `prioritize`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderArgs {
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Pod,
    /// Full node objects (when the extender is not `nodeCacheCapable`).
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Node names only (when it is).
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default
    )]
    pub node_names: Option<Vec<String>>,
}

impl ExtenderArgs {
    /// The candidate node names, whichever way they came.
    pub fn candidate_names(&self) -> Vec<String> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.clone(),
            (None, Some(list)) => list
                .items
                .iter()
                .filter_map(|n| n.metadata.name.clone())
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// Response body of `filter`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult {
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default
    )]
    pub node_names: Option<Vec<String>>,
    #[serde(
        rename = "FailedNodes",
        alias = "failedNodes",
        default,
        deserialize_with = "null_as_default"
    )]
    pub failed_nodes: BTreeMap<String, String>,
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        default,
        deserialize_with = "null_as_default"
    )]
    pub failed_and_unresolvable_nodes: BTreeMap<String, String>,
    #[serde(
        rename = "Error",
        alias = "error",
        default,
        deserialize_with = "null_as_default"
    )]
    pub error: String,
}

/// One entry of the `prioritize` response (a bare JSON array of these).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostPriority {
    #[serde(rename = "Host", alias = "host")]
    pub host: String,
    #[serde(rename = "Score", alias = "score")]
    pub score: i64,
}

/// Response body of `prioritize`.
pub type HostPriorityList = Vec<HostPriority>;

/// Request body of `bind`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingArgs {
    #[serde(rename = "PodName", alias = "podName", alias = "podname")]
    pub pod_name: String,
    #[serde(
        rename = "PodNamespace",
        alias = "podNamespace",
        alias = "podnamespace"
    )]
    pub pod_namespace: String,
    #[serde(rename = "PodUID", alias = "podUID", alias = "poduid", default)]
    pub pod_uid: String,
    #[serde(rename = "Node", alias = "node")]
    pub node: String,
}

/// Response body of `bind`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderBindingResult {
    #[serde(
        rename = "Error",
        alias = "error",
        default,
        deserialize_with = "null_as_default"
    )]
    pub error: String,
}

/// `MetaPod`: a victim named by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaPod {
    #[serde(rename = "UID", alias = "uid")]
    pub uid: String,
}

/// `MetaVictims`: victims on one node by UID.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaVictims {
    #[serde(
        rename = "Pods",
        alias = "pods",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pods: Vec<MetaPod>,
    #[serde(
        rename = "NumPDBViolations",
        alias = "numPDBViolations",
        alias = "numpdbviolations",
        default
    )]
    pub num_pdb_violations: i64,
}

/// `Victims`: victims on one node as full pods.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Victims {
    #[serde(
        rename = "Pods",
        alias = "pods",
        default,
        deserialize_with = "null_as_default"
    )]
    pub pods: Vec<Pod>,
    #[serde(
        rename = "NumPDBViolations",
        alias = "numPDBViolations",
        alias = "numpdbviolations",
        default
    )]
    pub num_pdb_violations: i64,
}

/// Request body of `preempt`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderPreemptionArgs {
    #[serde(rename = "Pod", alias = "pod")]
    pub pod: Pod,
    #[serde(rename = "NodeNameToVictims", alias = "nodeNameToVictims", default)]
    pub node_name_to_victims: Option<BTreeMap<String, Victims>>,
    #[serde(
        rename = "NodeNameToMetaVictims",
        alias = "nodeNameToMetaVictims",
        default
    )]
    pub node_name_to_meta_victims: Option<BTreeMap<String, MetaVictims>>,
}

impl ExtenderPreemptionArgs {
    /// Candidate victims by node as UIDs, whichever way they came.
    pub fn meta_victims(&self) -> BTreeMap<String, MetaVictims> {
        if let Some(m) = &self.node_name_to_meta_victims {
            return m.clone();
        }
        self.node_name_to_victims
            .iter()
            .flatten()
            .map(|(node, v)| {
                (
                    node.clone(),
                    MetaVictims {
                        pods: v
                            .pods
                            .iter()
                            .map(|p| MetaPod {
                                uid: p.metadata.uid.clone().unwrap_or_default(),
                            })
                            .collect(),
                        num_pdb_violations: v.num_pdb_violations,
                    },
                )
            })
            .collect()
    }
}

/// Response body of `preempt` (always by UID).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExtenderPreemptionResult {
    #[serde(
        rename = "NodeNameToMetaVictims",
        alias = "nodeNameToMetaVictims",
        default,
        deserialize_with = "null_as_default"
    )]
    pub node_name_to_meta_victims: BTreeMap<String, MetaVictims>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encodings upstream's `types_test.go` asserts.
    #[test]
    fn upstream_encodings() {
        let mut v = BTreeMap::new();
        v.insert(
            "foo".to_string(),
            MetaVictims {
                pods: vec![MetaPod {
                    uid: "myuid".into(),
                }],
                num_pdb_violations: 1,
            },
        );
        let r = ExtenderPreemptionResult {
            node_name_to_meta_victims: v,
        };
        assert_eq!(
            serde_json::to_string(&r).unwrap(),
            r#"{"NodeNameToMetaVictims":{"foo":{"Pods":[{"UID":"myuid"}],"NumPDBViolations":1}}}"#
        );
        let b = ExtenderBindingArgs {
            pod_name: "mypodname".into(),
            pod_namespace: "mypodnamespace".into(),
            pod_uid: "mypoduid".into(),
            node: "mynode".into(),
        };
        assert_eq!(
            serde_json::to_string(&b).unwrap(),
            r#"{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"}"#
        );
        assert_eq!(
            serde_json::to_string(&ExtenderBindingResult {
                error: "myerror".into()
            })
            .unwrap(),
            r#"{"Error":"myerror"}"#
        );
        assert_eq!(
            serde_json::to_string(&HostPriority {
                host: "myhost".into(),
                score: 1
            })
            .unwrap(),
            r#"{"Host":"myhost","Score":1}"#
        );
        let f = ExtenderFilterResult {
            nodes: None,
            node_names: Some(vec!["node1".into()]),
            failed_nodes: [("foo".to_string(), "bar".to_string())].into(),
            failed_and_unresolvable_nodes: [("baz".to_string(), "qux".to_string())].into(),
            error: "myerror".into(),
        };
        assert_eq!(
            serde_json::to_string(&f).unwrap(),
            r#"{"Nodes":null,"NodeNames":["node1"],"FailedNodes":{"foo":"bar"},"FailedAndUnresolvableNodes":{"baz":"qux"},"Error":"myerror"}"#
        );
    }

    /// Go decodes keys case-insensitively; upstream's `TestCompatibility` lower-cases payloads.
    #[test]
    fn lower_case_and_null_forms_are_accepted() {
        let f: ExtenderFilterResult =
            serde_json::from_str(r#"{"nodenames":["a"],"failedNodes":null,"error":null}"#).unwrap();
        assert_eq!(f.node_names, Some(vec!["a".to_string()]));
        assert!(f.failed_nodes.is_empty());
        let a: ExtenderArgs = serde_json::from_str(
            r#"{"pod":{"metadata":{"name":"p"}},"nodes":null,"nodenames":null}"#,
        )
        .unwrap();
        assert!(a.candidate_names().is_empty());
        let p: ExtenderPreemptionArgs = serde_json::from_str(
            r#"{"Pod":{},"NodeNameToVictims":{"n":{"Pods":[{"metadata":{"uid":"u1"}}],"NumPDBViolations":0}},"NodeNameToMetaVictims":null}"#,
        )
        .unwrap();
        assert_eq!(
            p.meta_victims()["n"].pods,
            vec![MetaPod { uid: "u1".into() }]
        );
    }
}
