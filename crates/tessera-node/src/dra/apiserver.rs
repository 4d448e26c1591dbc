//! The DRA driver's API-server side: reading `ResourceClaim`s and publishing
//! the node's `ResourceSlice`s, in whichever `resource.k8s.io` version the
//! server serves (`v1` from Kubernetes 1.34, else `v1beta2`, else `v1beta1`).
//!
//! k8s-openapi in this workspace predates `resource.k8s.io/v1`, so both go
//! through [`DynamicObject`]. The version that answered is remembered; a 404
//! on a write (the server does not serve that version) moves to the next.
//! `v1beta1` nests a device's fields under `basic`; the others are `v1`'s shape.
//!
//! A claim is *not found* only when the 404 is about the object: the API
//! server's `Status` then names it in `details.name`. A 404 for a version it
//! does not serve names nothing (or is not a `Status` at all), and says nothing
//! about the claim; the sweep ([`super::sweep`]) relies on that difference.

use std::sync::Mutex;

use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde_json::Value;

use super::DRIVER_NAME;
use super::prepare::{ClaimError, ClaimSource, ResourceClaim};
use super::slice::ResourceSlice;

/// Served versions of `resource.k8s.io`, preferred first.
pub const VERSIONS: [&str; 3] = ["v1", "v1beta2", "v1beta1"];
/// Field manager of the slices' server-side apply.
pub const FIELD_MANAGER: &str = "tessera-node-agent-dra";

fn resource(version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("resource.k8s.io", version, kind),
        plural,
    )
}

fn not_served(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// A 404 for the object `name` itself (it does not exist), as opposed to one
/// for a path the server does not serve.
fn object_not_found(e: &kube::Error, name: &str) -> bool {
    matches!(e, kube::Error::Api(s)
        if s.code == 404 && s.details.as_ref().is_some_and(|d| d.name == name))
}

/// The versions to try: the one that worked last, then the rest in order.
fn order(known: Option<&'static str>) -> Vec<&'static str> {
    let mut v: Vec<&'static str> = known.into_iter().collect();
    v.extend(VERSIONS.iter().filter(|x| Some(**x) != known));
    v
}

/// A slice in the shape of `version`.
pub fn slice_for_version(slice: &ResourceSlice, version: &str) -> Value {
    let mut v = serde_json::to_value(slice).unwrap_or(Value::Null);
    v["apiVersion"] = Value::String(format!("resource.k8s.io/{version}"));
    if version == "v1beta1"
        && let Some(devices) = v["spec"]["devices"].as_array_mut()
    {
        for d in devices {
            if let Some(obj) = d.as_object_mut() {
                let name = obj.remove("name").unwrap_or(Value::Null);
                let basic = Value::Object(std::mem::take(obj));
                obj.insert("name".into(), name);
                obj.insert("basic".into(), basic);
            }
        }
    }
    v
}

/// Reads claims from the API server.
pub struct KubeClaims {
    client: kube::Client,
    version: Mutex<Option<&'static str>>,
}

impl KubeClaims {
    pub fn new(client: kube::Client) -> Self {
        KubeClaims {
            client,
            version: Mutex::new(None),
        }
    }
}

#[tonic::async_trait]
impl ClaimSource for KubeClaims {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, ClaimError> {
        let unreadable = ClaimError::Unreadable;
        let known = *self.version.lock().unwrap_or_else(|p| p.into_inner());
        for version in order(known) {
            let ar = resource(version, "ResourceClaim", "resourceclaims");
            let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), namespace, &ar);
            match api.get(name).await {
                Ok(obj) => {
                    *self.version.lock().unwrap_or_else(|p| p.into_inner()) = Some(version);
                    let v = serde_json::to_value(&obj).map_err(|e| unreadable(e.to_string()))?;
                    return serde_json::from_value(v).map_err(|e| {
                        unreadable(format!(
                            "resourceclaim {namespace}/{name} ({version}) is not understood: {e}"
                        ))
                    });
                }
                Err(e) if object_not_found(&e, name) => {
                    // The version is served (the server looked the object up).
                    *self.version.lock().unwrap_or_else(|p| p.into_inner()) = Some(version);
                    return Err(ClaimError::NotFound {
                        namespace: namespace.to_string(),
                        name: name.to_string(),
                    });
                }
                Err(e) if not_served(&e) => continue,
                Err(e) => {
                    return Err(unreadable(format!(
                        "cannot read resourceclaim {namespace}/{name}: {e}"
                    )));
                }
            }
        }
        // Every version answered 404 without naming the claim: none is served,
        // which says nothing about the claim.
        Err(unreadable(format!(
            "resourceclaim {namespace}/{name} not found (resource.k8s.io {})",
            VERSIONS.join(", ")
        )))
    }
}

/// Failures publishing slices.
#[derive(Debug, thiserror::Error)]
pub enum PublishError {
    #[error("the API server serves no resource.k8s.io version of {}", VERSIONS.join(", "))]
    NotServed,
    #[error("cannot apply ResourceSlice {name}: {source}")]
    Apply { name: String, source: kube::Error },
    #[error("cannot list this node's ResourceSlices: {0}")]
    List(kube::Error),
    #[error("cannot delete stale ResourceSlice {name}: {source}")]
    Delete { name: String, source: kube::Error },
}

/// Publishes one node's pool.
pub struct SlicePublisher {
    client: kube::Client,
    node: String,
    version: Option<&'static str>,
}

/// The names of `gpu.tessera.io` ResourceSlices that serve `node`, in the
/// first `resource.k8s.io` version the server serves; empty when it serves
/// none (a cluster without DRA). The device-plugin agent asks this before it
/// publishes a `GpuNode`: a node the DRA driver serves is not offered twice.
pub async fn driver_slices_on(
    client: &kube::Client,
    node: &str,
) -> Result<Vec<String>, kube::Error> {
    let lp =
        ListParams::default().fields(&format!("spec.nodeName={node},spec.driver={DRIVER_NAME}"));
    for version in VERSIONS {
        let ar = resource(version, "ResourceSlice", "resourceslices");
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        match api.list(&lp).await {
            Ok(list) => {
                let mut names: Vec<String> = list
                    .items
                    .into_iter()
                    .filter_map(|o| o.metadata.name)
                    .collect();
                names.sort();
                return Ok(names);
            }
            Err(e) if not_served(&e) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(Vec::new())
}

impl SlicePublisher {
    pub fn new(client: kube::Client, node: String) -> Self {
        SlicePublisher {
            client,
            node,
            version: None,
        }
    }

    /// The version the server took, once one did.
    pub fn version(&self) -> Option<&'static str> {
        self.version
    }

    /// Applies every slice (server-side apply), then deletes the driver's other
    /// slices of this node, each with its UID and resourceVersion as precondition.
    pub async fn publish(&mut self, slices: &[ResourceSlice]) -> Result<(), PublishError> {
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut served = None;
        'versions: for version in order(self.version) {
            let ar = resource(version, "ResourceSlice", "resourceslices");
            let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
            for s in slices {
                let body = slice_for_version(s, version);
                match api
                    .patch(&s.metadata.name, &params, &Patch::Apply(&body))
                    .await
                {
                    Ok(_) => {}
                    Err(e) if not_served(&e) => continue 'versions,
                    Err(e) => {
                        return Err(PublishError::Apply {
                            name: s.metadata.name.clone(),
                            source: e,
                        });
                    }
                }
            }
            served = Some((version, api));
            break;
        }
        let (version, api) = served.ok_or(PublishError::NotServed)?;
        self.version = Some(version);
        let lp = ListParams::default().fields(&format!(
            "spec.nodeName={},spec.driver={DRIVER_NAME}",
            self.node
        ));
        let existing = api.list(&lp).await.map_err(PublishError::List)?;
        for old in existing.items {
            let Some(name) = old.metadata.name.clone() else {
                continue;
            };
            if slices.iter().any(|s| s.metadata.name == name) {
                continue;
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: old.metadata.uid.clone(),
                    resource_version: old.metadata.resource_version.clone(),
                }),
                ..Default::default()
            };
            match api.delete(&name, &dp).await {
                Ok(_) => {}
                // Gone already, or changed since the list: the next publish sees it again.
                Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => {}
                Err(e) => return Err(PublishError::Delete { name, source: e }),
            }
        }
        Ok(())
    }
}
