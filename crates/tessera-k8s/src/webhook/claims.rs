//! Pods whose ResourceClaims ask Tessera's device classes go to Tessera (issue
//! 41, defect 2).
//!
//! kube-scheduler's DRA plugin allocates the claims of every pod it schedules,
//! whatever their class: a `default-scheduler` pod with a `gpu.tessera.io`
//! claim is allocated by it while Tessera `--dra` allocates the same devices for
//! its own pods, and neither sees the other's writes in flight. So `/mutate`
//! (pod CREATE; a pod's `resourceClaims` cannot change after) reads the claims a
//! `default-scheduler` pod names — the ResourceClaim of `resourceClaimName`,
//! the ResourceClaimTemplate of `resourceClaimTemplateName`, in the pod's
//! namespace — and, when a request (or a `firstAvailable` alternative) names
//! one of Tessera's classes ([`WebhookConfig::dra_classes`]), gives the pod
//! Tessera's `schedulerName`. A claim that cannot be read is a denial naming it
//! (with `failurePolicy: Fail` the pod is refused rather than left to the
//! other allocator); a template not there yet is one too: create it first.
//!
//! [`WebhookConfig::dra_classes`]: super::WebhookConfig::dra_classes

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DynamicObject};
use serde::Deserialize;

use crate::dra::pod::{classes_of, is_our_class};
use crate::dra::types::{ClaimSpec, DeviceClass};
use crate::dra::watch::{classes_resource, resource};
use crate::dra::write::claims_resource;

/// A claim a pod names: its own ResourceClaim, or one made from a template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodClaim {
    Claim(String),
    Template(String),
}

impl std::fmt::Display for PodClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PodClaim::Claim(n) => write!(f, "ResourceClaim {n}"),
            PodClaim::Template(n) => write!(f, "ResourceClaimTemplate {n}"),
        }
    }
}

/// The claims `pod.spec.resourceClaims` names.
pub fn pod_claims(pod: &Pod) -> Vec<PodClaim> {
    pod.spec
        .as_ref()
        .and_then(|s| s.resource_claims.as_deref())
        .unwrap_or_default()
        .iter()
        .filter_map(|c| {
            c.resource_claim_name
                .clone()
                .map(PodClaim::Claim)
                .or_else(|| {
                    c.resource_claim_template_name
                        .clone()
                        .map(PodClaim::Template)
                })
        })
        .collect()
}

#[derive(Debug, Default, Deserialize)]
struct Template {
    #[serde(default)]
    spec: TemplateSpec,
}

#[derive(Debug, Default, Deserialize)]
struct TemplateSpec {
    #[serde(default)]
    spec: ClaimSpec,
}

/// The device classes of one claim the pod names, read from the API server.
pub async fn claim_classes(
    client: &kube::Client,
    namespace: &str,
    claim: &PodClaim,
) -> Result<Vec<String>, String> {
    let (res, name) = match claim {
        PodClaim::Claim(n) => (claims_resource(), n),
        PodClaim::Template(n) => (
            resource("ResourceClaimTemplate", "resourceclaimtemplates"),
            n,
        ),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &res);
    let obj = match api.get_opt(name).await {
        Ok(Some(o)) => o,
        Ok(None) => {
            return Err(format!(
                "{claim} not found in namespace {namespace}: create it before the pod, so the webhook can tell whether Tessera allocates it"
            ));
        }
        Err(e) => return Err(format!("cannot read {claim} in namespace {namespace}: {e}")),
    };
    let spec = match claim {
        PodClaim::Claim(_) => serde_json::from_value::<ClaimSpec>(obj.data["spec"].clone()),
        PodClaim::Template(_) => {
            serde_json::from_value::<Template>(obj.data.clone()).map(|t| t.spec.spec)
        }
    }
    .map_err(|e| format!("{claim} in namespace {namespace} does not read: {e}"))?;
    Ok(classes_of(&spec).into_iter().map(str::to_string).collect())
}

/// Whether Tessera allocates class `name` ([`is_our_class`]: the chart's
/// classes, or one whose selectors name our driver), reading the class when its
/// name does not say. A class that does not exist allocates nothing.
pub async fn ours(client: &kube::Client, name: &str) -> Result<bool, String> {
    if is_our_class(name, &[]) {
        return Ok(true);
    }
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &classes_resource());
    match api.get_opt(name).await {
        Ok(None) => Ok(false),
        Ok(Some(o)) => {
            let class: DeviceClass = serde_json::to_value(o)
                .and_then(serde_json::from_value)
                .map_err(|e| format!("DeviceClass {name} does not read: {e}"))?;
            Ok(is_our_class(name, &[class]))
        }
        Err(e) => Err(format!("cannot read DeviceClass {name}: {e}")),
    }
}

/// What the claims of a pod say about who allocates them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimRoute {
    /// Not looked up: no claims, no Tessera classes configured, no client, or
    /// not a pod the default scheduler would place.
    NotAsked,
    /// Looked up: whether some claim asks a Tessera class.
    Tessera(bool),
    /// A claim could not be read.
    Unreadable(String),
}

/// Looks up the classes of `pod`'s claims (none to look up: [`ClaimRoute::NotAsked`]).
pub async fn route(client: &kube::Client, pod: &Pod) -> ClaimRoute {
    let claims = pod_claims(pod);
    if claims.is_empty() {
        return ClaimRoute::NotAsked;
    }
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
    for c in &claims {
        let asked = match claim_classes(client, namespace, c).await {
            Ok(a) => a,
            Err(e) => return ClaimRoute::Unreadable(e),
        };
        for class in asked {
            match ours(client, &class).await {
                Ok(true) => return ClaimRoute::Tessera(true),
                Ok(false) => {}
                Err(e) => return ClaimRoute::Unreadable(e),
            }
        }
    }
    ClaimRoute::Tessera(false)
}
