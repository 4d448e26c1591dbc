//! Applying a decision: write the signed allocation annotation, then bind.
//!
//! The decision and the reservation happen under the mirror's lock, so two
//! concurrent binds can never both take the same GPU share; the API calls
//! happen outside it. The annotation is written before the Binding so that the
//! node agent, which reads it when the kubelet asks for devices, always finds
//! it. A failed call drops the reservation. A repeated bind of a pod that is
//! already bound where asked is answered without a second allocation.

use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;
use tessera_core::allocation::ANNOTATION;

use crate::leader::Leadership;
use crate::mirror::{Mirror, Reservation, ReserveError};

/// Why a bind failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("this replica is not the leader; only the leader binds")]
    NotLeader,
    #[error("pod {pod} not found: {source}")]
    PodNotFound { pod: String, source: kube::Error },
    #[error("pod {pod} has UID {found}, not {expected} (it was replaced)")]
    UidMismatch {
        pod: String,
        expected: String,
        found: String,
    },
    #[error(transparent)]
    Reserve(#[from] ReserveError),
    #[error("writing the allocation annotation of pod {pod}: {source}")]
    Annotate { pod: String, source: kube::Error },
    #[error("binding pod {pod} to node {node}: {source}")]
    Binding {
        pod: String,
        node: String,
        source: kube::Error,
    },
}

/// Binds pods through the API server.
#[derive(Clone)]
pub struct Binder {
    client: kube::Client,
    mirror: Arc<Mutex<Mirror>>,
    leader: Leadership,
}

/// Locks the mirror; a panic in another holder does not make the data unusable
/// (every mutation keeps the ledger consistent before it can panic).
pub fn lock(mirror: &Mutex<Mirror>) -> std::sync::MutexGuard<'_, Mirror> {
    mirror.lock().unwrap_or_else(|p| p.into_inner())
}

impl Binder {
    pub fn new(client: kube::Client, mirror: Arc<Mutex<Mirror>>, leader: Leadership) -> Binder {
        Binder {
            client,
            mirror,
            leader,
        }
    }

    /// Binds pod `namespace/name` (UID `uid`; empty means any) to `node`.
    pub async fn bind(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
    ) -> Result<(), BindError> {
        if !self.leader.is_leader() {
            return Err(BindError::NotLeader);
        }
        let key = format!("{namespace}/{name}");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let known = { lock(&self.mirror).pod(uid).cloned() };
        let pod = match known {
            Some(p) => p,
            None => api
                .get(name)
                .await
                .map_err(|source| BindError::PodNotFound {
                    pod: key.clone(),
                    source,
                })?,
        };
        let found = pod.metadata.uid.clone().unwrap_or_default();
        if !uid.is_empty() && found != uid {
            return Err(BindError::UidMismatch {
                pod: key,
                expected: uid.to_string(),
                found,
            });
        }
        let reservation = { lock(&self.mirror).reserve(&pod, node)? };
        let annotation = match reservation {
            Reservation::AlreadyBound => return Ok(()),
            Reservation::Write { annotation } => annotation,
        };
        let result = self
            .write_and_bind(&api, &key, name, &found, node, annotation)
            .await;
        let mut m = lock(&self.mirror);
        match result {
            Ok(()) => {
                m.mark_bound(&found);
                Ok(())
            }
            Err(e) => {
                m.unreserve(&found);
                Err(e)
            }
        }
    }

    async fn write_and_bind(
        &self,
        api: &Api<Pod>,
        key: &str,
        name: &str,
        uid: &str,
        node: &str,
        annotation: Option<String>,
    ) -> Result<(), BindError> {
        if let Some(value) = annotation {
            // The UID in the patch is a precondition: a pod recreated under the same name is refused.
            let patch = json!({"metadata": {"uid": uid, "annotations": {ANNOTATION: value}}});
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|source| BindError::Annotate {
                    pod: key.to_string(),
                    source,
                })?;
        }
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                uid: Some(uid.to_string()).filter(|u| !u.is_empty()),
                ..ObjectMeta::default()
            },
            target: ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Node".into()),
                name: Some(node.to_string()),
                ..ObjectReference::default()
            },
        };
        match api
            .create_subresource::<Binding, serde_json::Value>(
                "binding",
                name,
                &PostParams::default(),
                &binding,
            )
            .await
        {
            Ok(_) => Ok(()),
            // 409: already bound (a retried bind whose first answer was lost).
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
            Err(source) => Err(BindError::Binding {
                pod: key.to_string(),
                node: node.to_string(),
                source,
            }),
        }
    }
}
