//! The kube-scheduler extender's JSON messages (`k8s.io/kube-scheduler/extender/v1`).
//!
//! The Go structs have no `json:` tags, so the scheduler sends the Go field
//! names, capitalised (`Pod`, `NodeNames`, `FailedNodes`, …), and `null` for
//! nil pointers. We accept that form (and the lower-case one, as Go's decoder
//! would), treat `null` and absent alike, and always answer capitalised.
//! Nested Kubernetes objects keep their normal camelCase API JSON.
//!
//! `filter` and `prioritize` carry one name per candidate node (thousands per
//! call), so their node names are [`Text`]: borrowed from the request body,
//! not copied, and the answers borrow them back. Their Pod is decoded without
//! its `metadata.managedFields` ([`pod_without_managed_fields`]), which nothing
//! reads and which was a third of the Pod's decode (issue 30).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::Deref;

use k8s_openapi::Resource;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `MaxExtenderPriority`: the highest score an extender should give.
pub const MAX_EXTENDER_PRIORITY: i64 = 10;

fn null_as_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A string of a message: borrowed from the bytes it was decoded from when it
/// has no escapes (node names never do), owned otherwise.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Text<'a>(pub Cow<'a, str>);

impl Deref for Text<'_> {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl<'a> From<&'a str> for Text<'a> {
    fn from(s: &'a str) -> Self {
        Text(Cow::Borrowed(s))
    }
}

impl From<String> for Text<'_> {
    fn from(s: String) -> Self {
        Text(Cow::Owned(s))
    }
}

impl PartialEq<str> for Text<'_> {
    fn eq(&self, other: &str) -> bool {
        *self.0 == *other
    }
}

impl PartialEq<&str> for Text<'_> {
    fn eq(&self, other: &&str) -> bool {
        *self.0 == **other
    }
}

impl Serialize for Text<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v.to_string())))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Node name to message, as a JSON object (`FailedNodes`). Kept as a list in
/// the order the nodes were judged: building a sorted map of thousands of
/// entries per call would cost more than the decision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMessages<'a>(pub Vec<(Text<'a>, Text<'a>)>);

impl NodeMessages<'_> {
    /// The message for `node`, if it has one.
    pub fn get(&self, node: &str) -> Option<&str> {
        self.0.iter().find(|(n, _)| **n == *node).map(|(_, m)| &**m)
    }
    pub fn len(&self) -> usize {
        self.0.len()
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Serialize for NodeMessages<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|(n, m)| (n, m)))
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for NodeMessages<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = NodeMessages<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of node name to message, or null")
            }
            fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(NodeMessages::default())
            }
            fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
                Ok(NodeMessages::default())
            }
            fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
                d.deserialize_map(self)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(entry) = map.next_entry::<Text<'de>, Text<'de>>()? {
                    out.push(entry);
                }
                Ok(NodeMessages(out))
            }
        }
        d.deserialize_option(V)
    }
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
pub struct ExtenderArgs<'a> {
    /// The pod, without its managed fields.
    #[serde(
        rename = "Pod",
        alias = "pod",
        deserialize_with = "pod_without_managed_fields"
    )]
    pub pod: Pod,
    /// Full node objects (when the extender is not `nodeCacheCapable`).
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    /// Node names only (when it is).
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default,
        borrow
    )]
    pub node_names: Option<Vec<Text<'a>>>,
}

impl ExtenderArgs<'_> {
    /// The candidate node names, whichever way they came (borrowed, not copied).
    pub fn candidate_names(&self) -> Vec<&str> {
        match (&self.node_names, &self.nodes) {
            (Some(names), _) => names.iter().map(|n| &**n).collect(),
            (None, Some(list)) => list
                .items
                .iter()
                .filter_map(|n| n.metadata.name.as_deref())
                .collect(),
            (None, None) => Vec::new(),
        }
    }
}

/// A Pod decoded exactly as k8s-openapi decodes it (the same fields, the same
/// refusals: a wrong `apiVersion` or `kind`, a value of the wrong type), except
/// that `metadata.managedFields` is skipped unread, whatever it holds, and left
/// `None`. kube-scheduler sends the pod whole, and its managed fields (a tree
/// of field paths per writer) are the largest part of its metadata; nothing in
/// Tessera reads them (the watch drops them too).
pub fn pod_without_managed_fields<'de, D: Deserializer<'de>>(d: D) -> Result<Pod, D::Error> {
    struct PodVisitor;
    impl<'de> Visitor<'de> for PodVisitor {
        type Value = Pod;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(Pod::KIND)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pod, A::Error> {
            let mut pod = Pod::default();
            let mut metadata = None;
            while let Some(key) = map.next_key::<Text<'de>>()? {
                match &*key {
                    "apiVersion" => {
                        let v: String = map.next_value()?;
                        if v != Pod::API_VERSION {
                            return Err(de::Error::invalid_value(
                                de::Unexpected::Str(&v),
                                &Pod::API_VERSION,
                            ));
                        }
                    }
                    "kind" => {
                        let v: String = map.next_value()?;
                        if v != Pod::KIND {
                            return Err(de::Error::invalid_value(
                                de::Unexpected::Str(&v),
                                &Pod::KIND,
                            ));
                        }
                    }
                    "metadata" => {
                        metadata = map.next_value::<Option<MetaWithoutManagedFields>>()?;
                    }
                    "spec" => pod.spec = map.next_value()?,
                    "status" => pod.status = map.next_value()?,
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
            }
            pod.metadata = metadata.map(|m| m.0).unwrap_or_default();
            Ok(pod)
        }
    }
    d.deserialize_struct(
        Pod::KIND,
        &["apiVersion", "kind", "metadata", "spec", "status"],
        PodVisitor,
    )
}

/// `ObjectMeta` as k8s-openapi decodes it, `managedFields` skipped.
struct MetaWithoutManagedFields(ObjectMeta);

impl<'de> Deserialize<'de> for MetaWithoutManagedFields {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct MetaVisitor;
        impl<'de> Visitor<'de> for MetaVisitor {
            type Value = MetaWithoutManagedFields;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("ObjectMeta")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                // Every field listed, so that a field k8s-openapi adds is a
                // compile error here rather than silently dropped.
                let ObjectMeta {
                    mut annotations,
                    mut creation_timestamp,
                    mut deletion_grace_period_seconds,
                    mut deletion_timestamp,
                    mut finalizers,
                    mut generate_name,
                    mut generation,
                    mut labels,
                    managed_fields: _,
                    mut name,
                    mut namespace,
                    mut owner_references,
                    mut resource_version,
                    mut self_link,
                    mut uid,
                } = ObjectMeta::default();
                while let Some(key) = map.next_key::<Text<'de>>()? {
                    match &*key {
                        "annotations" => annotations = map.next_value()?,
                        "creationTimestamp" => creation_timestamp = map.next_value()?,
                        "deletionGracePeriodSeconds" => {
                            deletion_grace_period_seconds = map.next_value()?
                        }
                        "deletionTimestamp" => deletion_timestamp = map.next_value()?,
                        "finalizers" => finalizers = map.next_value()?,
                        "generateName" => generate_name = map.next_value()?,
                        "generation" => generation = map.next_value()?,
                        "labels" => labels = map.next_value()?,
                        "name" => name = map.next_value()?,
                        "namespace" => namespace = map.next_value()?,
                        "ownerReferences" => owner_references = map.next_value()?,
                        "resourceVersion" => resource_version = map.next_value()?,
                        "selfLink" => self_link = map.next_value()?,
                        "uid" => uid = map.next_value()?,
                        // `managedFields` and keys k8s-openapi does not know.
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(MetaWithoutManagedFields(ObjectMeta {
                    annotations,
                    creation_timestamp,
                    deletion_grace_period_seconds,
                    deletion_timestamp,
                    finalizers,
                    generate_name,
                    generation,
                    labels,
                    managed_fields: None,
                    name,
                    namespace,
                    owner_references,
                    resource_version,
                    self_link,
                    uid,
                }))
            }
        }
        d.deserialize_struct(
            "ObjectMeta",
            &[
                "annotations",
                "creationTimestamp",
                "deletionGracePeriodSeconds",
                "deletionTimestamp",
                "finalizers",
                "generateName",
                "generation",
                "labels",
                "managedFields",
                "name",
                "namespace",
                "ownerReferences",
                "resourceVersion",
                "selfLink",
                "uid",
            ],
            MetaVisitor,
        )
    }
}

/// Response body of `filter`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ExtenderFilterResult<'a> {
    #[serde(rename = "Nodes", alias = "nodes", default)]
    pub nodes: Option<NodeList>,
    #[serde(
        rename = "NodeNames",
        alias = "nodeNames",
        alias = "nodenames",
        default,
        borrow
    )]
    pub node_names: Option<Vec<Text<'a>>>,
    #[serde(rename = "FailedNodes", alias = "failedNodes", default, borrow)]
    pub failed_nodes: NodeMessages<'a>,
    #[serde(
        rename = "FailedAndUnresolvableNodes",
        alias = "failedAndUnresolvableNodes",
        default,
        borrow
    )]
    pub failed_and_unresolvable_nodes: NodeMessages<'a>,
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
pub struct HostPriority<'a> {
    #[serde(rename = "Host", alias = "host", borrow)]
    pub host: Text<'a>,
    #[serde(rename = "Score", alias = "score")]
    pub score: i64,
}

/// Response body of `prioritize`.
pub type HostPriorityList<'a> = Vec<HostPriority<'a>>;

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
pub(crate) mod tests {
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
            failed_nodes: NodeMessages(vec![("foo".into(), "bar".into())]),
            failed_and_unresolvable_nodes: NodeMessages(vec![("baz".into(), "qux".into())]),
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
        let f: ExtenderFilterResult<'_> =
            serde_json::from_str(r#"{"nodenames":["a"],"failedNodes":null,"error":null}"#).unwrap();
        assert_eq!(f.node_names, Some(vec![Text::from("a")]));
        assert!(f.failed_nodes.is_empty());
        let f: ExtenderFilterResult<'_> =
            serde_json::from_str(r#"{"FailedNodes":{"n\u0031":"full","n2":"no"}}"#).unwrap();
        assert_eq!(
            f.failed_nodes.get("n1"),
            Some("full"),
            "escaped names decode owned"
        );
        assert_eq!(f.failed_nodes.get("n2"), Some("no"));
        assert_eq!(f.failed_nodes.get("n3"), None);
        let a: ExtenderArgs<'_> = serde_json::from_str(
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

    /// The captured request bodies kube-scheduler v1.28 sent, where at hand.
    pub(crate) fn fixture_bodies() -> Vec<(&'static str, Vec<u8>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../../shared/fixtures/kube-scheduler-v1.28-extender");
        let bodies: Vec<_> = [
            "filter-request-ExtenderArgs-nodenames.json",
            "filter-request-ExtenderArgs-nodes.json",
            "prioritize-request-ExtenderArgs-nodes.json",
        ]
        .into_iter()
        .filter_map(|f| std::fs::read(dir.join(f)).ok().map(|b| (f, b)))
        .collect();
        if bodies.is_empty() {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "fixtures missing under CI: {}",
                dir.display()
            );
            eprintln!("skipping: no fixture under {}", dir.display());
        }
        bodies
    }

    /// `ExtenderArgs`' Pod decoded whole by k8s-openapi, as before issue 30.
    #[derive(Deserialize)]
    struct WholePod {
        #[serde(rename = "Pod", alias = "pod")]
        pod: Pod,
    }

    /// On kube-scheduler's own bodies, the Pod the verbs decode is the Pod
    /// k8s-openapi decodes, less its managed fields (which the bodies have).
    #[test]
    fn the_pod_is_decoded_whole_but_for_its_managed_fields() {
        for (name, body) in fixture_bodies() {
            let text = std::str::from_utf8(&body).expect("UTF-8");
            let whole: WholePod = serde_json::from_str(text).expect("decodes whole");
            let args: ExtenderArgs<'_> = serde_json::from_str(text).expect("decodes");
            assert!(
                whole
                    .pod
                    .metadata
                    .managed_fields
                    .as_ref()
                    .is_some_and(|m| !m.is_empty()),
                "{name}: the fixture has managed fields to skip"
            );
            let mut expected = whole.pod;
            expected.metadata.managed_fields = None;
            assert_eq!(args.pod, expected, "{name}");
        }
    }

    /// The trimmed decode refuses what k8s-openapi refuses, with the same
    /// message, and takes what it takes; only a malformed `managedFields` is
    /// let through (it is skipped unread).
    #[test]
    fn the_pod_decode_refuses_and_accepts_as_k8s_openapi_does() {
        let cases = [
            // Refused by both.
            r#"{"Pod":{"apiVersion":"v2"}}"#,
            r#"{"Pod":{"kind":"Node"}}"#,
            r#"{"Pod":{"apiVersion":null}}"#,
            r#"{"Pod":null}"#,
            r#"{"Pod":[]}"#,
            r#"{"Pod":"p"}"#,
            r#"{"Pod":{"metadata":[]}}"#,
            r#"{"Pod":{"metadata":{"name":5}}}"#,
            r#"{"Pod":{"metadata":{"labels":{"a":1}}}}"#,
            r#"{"Pod":{"metadata":{"creationTimestamp":"yesterday"}}}"#,
            r#"{"Pod":{"spec":"x"}}"#,
            r#"{"Pod":{"spec":{"containers":[{"resources":{"limits":{"cpu":1}}}]}}}"#,
            r#"{"Pod":{"status":{"phase":3}}}"#,
            r#"{"Pod":{"metadata":{"name":"p"}"#,
            r#"{}"#,
            // Taken by both.
            r#"{"Pod":{}}"#,
            r#"{"Pod":{"apiVersion":"v1","kind":"Pod","metadata":null,"spec":null,"status":null}}"#,
            r#"{"Pod":{"metadata":{"name":"a","name":"b","uid":"u","extra":{"x":[1]}},"other":1}}"#,
            r#"{"Pod":{"metadata":{"annotations":{"tessera.io/gpu-model":"H100-80GB"},"labels":{"q":"r"},"ownerReferences":[{"apiVersion":"v1","kind":"K","name":"n","uid":"u"}],"finalizers":["f"],"generation":2,"deletionGracePeriodSeconds":30,"deletionTimestamp":"2026-11-30T08:02:55Z","generateName":"g-","selfLink":"/s","resourceVersion":"9"}}}"#,
            r#"{"pod":{"metadata":{"name":"p\u0031"}},"nodenames":["n"]}"#,
        ];
        for body in cases {
            let whole = serde_json::from_str::<WholePod>(body)
                .map(|w| w.pod)
                .map_err(|e| e.to_string());
            let trimmed = serde_json::from_str::<ExtenderArgs<'_>>(body)
                .map(|a| a.pod)
                .map_err(|e| e.to_string());
            assert_eq!(trimmed, whole, "{body}");
        }
        // Skipped unread, whatever it holds.
        let a: ExtenderArgs<'_> =
            serde_json::from_str(r#"{"Pod":{"metadata":{"name":"p","managedFields":5}}}"#)
                .expect("managed fields are not read");
        assert_eq!(a.pod.metadata.name.as_deref(), Some("p"));
        assert_eq!(a.pod.metadata.managed_fields, None);
    }
}
