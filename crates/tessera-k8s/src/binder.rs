//! Applying a decision: one atomic write that binds the pod and carries its
//! signed allocation.
//!
//! The `pods/binding` subresource merges the Binding's `metadata.annotations`
//! into the pod in the same update that sets `nodeName`, and checks the
//! Binding's `metadata.uid` and `metadata.resourceVersion` as preconditions
//! (API server `BindingREST`; recorded in the v1.28 fixtures 01, 04, 12, 16).
//! So there is no state in which a pod has a grant but no node, or a node but
//! no grant, and a pod that was replaced, changed, deleted, gated or bound by
//! someone else since we decided is refused by the server itself.
//!
//! The decision and the reservation happen under the mirror's lock, so two
//! concurrent binds can never both take the same GPU share; the API call
//! happens outside it. What happens to the reservation after the call:
//! - accepted: kept until the watch shows the pod bound (or deleted);
//! - refused (a 4xx: 409, 404, 422, …): dropped at once;
//! - unknown (a 5xx such as 504 Timeout, which the API server may send after
//!   committing; timeout, connection lost): kept,
//!   because the write may still have landed. A 5xx is first answered by
//!   sending the same Binding again (twice at most, 200 and 400 ms later): its
//!   preconditions let at most one land, and a 409 is settled by reading the
//!   pod back. The watch settles it, or at its
//!   deadline (see `mirror::RESERVATION_TTL`) the pod is read back and the
//!   server's answer wins: bound, it is taken up with the grant it carries; not
//!   bound, its GPUs are free again. A failed read keeps it for the next try.
//!
//! A bind's caller going away (kube-scheduler's extender `httpTimeout`) does
//! not cut a write off: once reserved, the write runs on a task of its own to
//! its outcome, so that a refused Binding frees its room at once.
//!
//! Pods of other profiles (a shared kube-scheduler calls its extenders for
//! every profile) are bound through with a plain Binding and no grant, as
//! kube-scheduler's DefaultBinder would ([`Binder::bind`]).
//!
//! Fencing: leadership is checked right before the write, and leadership is a
//! deadline (see [`crate::leader`]), so a replica that stopped renewing its Lease
//! stops writing before another may start.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::api::{Api, ObjectMeta, PostParams};
use tessera_core::allocation::ANNOTATION;

use crate::convert;
use crate::gate::SyncGate;
use crate::leader::Leadership;
use crate::mirror::{Reservation, ReserveError, SharedMirror};

/// Why a bind failed.
#[derive(Debug, thiserror::Error)]
pub enum BindError {
    #[error("this replica is not the leader; only the leader binds")]
    NotLeader,
    #[error("{0}")]
    NotSynced(String),
    #[error("pod {pod} not found: {source}")]
    PodNotFound { pod: String, source: kube::Error },
    #[error("pod {pod} has UID {found}, not {expected} (it was replaced)")]
    UidMismatch {
        pod: String,
        expected: String,
        found: String,
    },
    #[error(
        "pod {pod} asks for {resource}, but its schedulerName {found:?} is not one this Tessera serves ({served:?}): Tessera's GPUs go only to pods it places (set schedulerName, or --serve-scheduler-name)"
    )]
    NotServed {
        pod: String,
        resource: String,
        found: String,
        served: Vec<String>,
    },
    #[error("pod {pod} is being deleted")]
    Deleting { pod: String },
    #[error(transparent)]
    Reserve(#[from] ReserveError),
    #[error("binding pod {pod} to node {node}: {source}")]
    Binding {
        pod: String,
        node: String,
        source: kube::Error,
    },
    #[error("binding pod {pod} to node {node}: refused by the API server: {message}")]
    Refused {
        pod: String,
        node: String,
        message: String,
    },
    #[error(
        "binding pod {pod} to node {node}: the API server answered {message}; the write may have landed, so its GPUs stay reserved until the watch shows the outcome"
    )]
    Unsettled {
        pod: String,
        node: String,
        message: String,
    },
    #[error(
        "binding pod {pod} to node {node}: no answer within {secs} s; its GPUs stay reserved until the watch shows the outcome"
    )]
    Timeout {
        pod: String,
        node: String,
        secs: u64,
    },
}

/// The least leadership left for a write to be started.
const MIN_WRITE_WINDOW: Duration = Duration::from_millis(500);

/// A Binding answered with a 5xx is sent again this many times at most…
const SERVER_ERROR_RETRIES: u32 = 2;
/// …after this pause (then twice it).
const SERVER_ERROR_PAUSE: Duration = Duration::from_millis(200);

/// Binds pods through the API server.
#[derive(Clone)]
pub struct Binder {
    client: kube::Client,
    mirror: SharedMirror,
    leader: Leadership,
    gate: SyncGate,
    /// The `schedulerName`s whose pods we bind; empty: any.
    scheduler_names: Arc<[String]>,
    /// Longest wait for the API's answer to a Binding.
    request_timeout: Duration,
}

/// Until the API call has started, dropping a bind (its caller went away)
/// releases the reservation; afterwards the outcome is unknown and the
/// reservation waits for its deadline or the watch.
struct Pending<'a> {
    mirror: &'a SharedMirror,
    uid: &'a str,
    armed: bool,
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        if self.armed {
            // Unless an earlier Binding of the same reservation is still unsettled.
            self.mirror.lock().unreserve_unsent(self.uid);
        }
    }
}

impl Binder {
    /// A binder with an open sync gate and no scheduler-name restriction (tests, tools).
    /// The API client binds (and standalone mode's evictions) go through.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    pub fn new(client: kube::Client, mirror: SharedMirror, leader: Leadership) -> Binder {
        Binder {
            client,
            mirror,
            leader,
            gate: SyncGate::synced(),
            scheduler_names: Arc::from([]),
            request_timeout: Duration::from_secs(10),
        }
    }

    /// Waits on `gate` before every bind.
    pub fn with_gate(mut self, gate: SyncGate) -> Binder {
        self.gate = gate;
        self
    }

    /// Binds only pods with one of these `schedulerName`s.
    pub fn with_scheduler_names(mut self, names: Vec<String>) -> Binder {
        self.scheduler_names = names.into();
        self
    }

    pub fn mirror(&self) -> &SharedMirror {
        &self.mirror
    }

    pub fn leadership(&self) -> &Leadership {
        &self.leader
    }

    /// Whether a pod is one this binder serves.
    pub fn serves(&self, pod: &Pod) -> bool {
        self.scheduler_names.is_empty()
            || self
                .scheduler_names
                .iter()
                .any(|n| n == convert::scheduler_name(pod))
    }

    /// Binds pod `namespace/name` (UID `uid`; empty means any) to `node`.
    pub async fn bind(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        node: &str,
    ) -> Result<(), BindError> {
        if !self.gate.wait(Duration::from_secs(5)).await {
            return Err(BindError::NotSynced(self.gate.not_synced_message()));
        }
        if !self.leader.is_leader() {
            return Err(BindError::NotLeader);
        }
        // Reservations of earlier binds with unknown outcomes, past their deadline.
        self.settle_expired().await;
        let key = format!("{namespace}/{name}");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let known = {
            let m = self.mirror.lock();
            if uid.is_empty() {
                m.pod_by_name(namespace, name).cloned()
            } else {
                m.pod(uid).cloned()
            }
        };
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
        let found = convert::pod_uid(&pod).to_string();
        if !uid.is_empty() && found != uid {
            return Err(BindError::UidMismatch {
                pod: key,
                expected: uid.to_string(),
                found,
            });
        }
        if pod.metadata.deletion_timestamp.is_some() {
            return Err(BindError::Deleting { pod: key });
        }
        if !self.serves(&pod) {
            // Bound without a grant, such a pod could never get its devices
            // (the node agent allocates Tessera's only against a grant).
            if let Some(resource) = tessera_resource(&pod) {
                return Err(BindError::NotServed {
                    pod: key,
                    resource,
                    found: convert::scheduler_name(&pod).to_string(),
                    served: self.scheduler_names.to_vec(),
                });
            }
            return self.pass_through(&api, &pod, node).await;
        }
        let reservation = { self.mirror.lock().reserve(&pod, node)? };
        match reservation {
            Reservation::AlreadyBound => Ok(()),
            Reservation::Write { annotation } => {
                // Once reserved, the write runs to its outcome on a task of its
                // own: kube-scheduler closes the connection at its extender
                // `httpTimeout` and the HTTP server then drops this future; a
                // write cut off there left its outcome unknown, and the pod's
                // room held for the reservation's deadline and a read-back,
                // after the API server had refused it (issue 41, defect 12).
                let (binder, to) = (self.clone(), node.to_string());
                tokio::spawn(async move { binder.write(&pod, &to, annotation).await })
                    .await
                    .unwrap_or_else(|e| {
                        Err(BindError::Unsettled {
                            pod: key,
                            node: node.to_string(),
                            message: format!("the bind task ended: {e}"),
                        })
                    })
            }
        }
    }

    /// Writes a reservation already made in the mirror (by [`Binder::bind`],
    /// or by the standalone scheduler right after deciding): the Binding with
    /// its annotation, fenced by leadership; the reservation is confirmed,
    /// dropped or kept by the outcome (see the module docs).
    pub async fn write(
        &self,
        pod: &Pod,
        node: &str,
        annotation: Option<String>,
    ) -> Result<(), BindError> {
        let key = convert::pod_key(pod);
        let found = convert::pod_uid(pod).to_string();
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let api: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
        let mut pending = Pending {
            mirror: &self.mirror,
            uid: &found,
            armed: true,
        };
        // Fencing: the last moment to find out we no longer lead. The write must
        // also finish while we still lead: a leader stops renewing-dependent work
        // at its deadline, 5 s before another replica may take over.
        let Some(mut budget) = self.write_budget(Duration::ZERO) else {
            return Err(BindError::NotLeader);
        };
        pending.armed = false;
        self.mirror.lock().mark_sent(&found);
        // A 5xx leaves the outcome unknown. The same Binding is sent again
        // after a short pause: its preconditions let at most one land, and if
        // the first did, the retry's 409 is settled by reading the pod back
        // (below). Without it, the pod's GPUs would stay reserved and the pod
        // unbound until the reservation's deadline whenever the first did not.
        let mut retries = 0;
        let outcome = loop {
            let call = self.post_binding(&api, pod, node, annotation.as_deref());
            let outcome = tokio::time::timeout(budget, call).await;
            let server_error = matches!(&outcome, Ok(Err(kube::Error::Api(s))) if s.code >= 500);
            if !server_error || retries == SERVER_ERROR_RETRIES {
                break outcome;
            }
            let pause = SERVER_ERROR_PAUSE * (retries + 1);
            // Fenced again: the retry, too, must finish while we lead.
            let Some(next) = self.write_budget(pause) else {
                break outcome;
            };
            tracing::debug!(pod = %key, node, "binding answered with a server error; sending it again");
            tokio::time::sleep(pause).await;
            budget = next;
            retries += 1;
        };
        match outcome {
            Ok(Ok(())) => {
                self.mirror.lock().mark_accepted(&found);
                Ok(())
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                // A retried bind whose first answer was lost looks like this too: check.
                match api.get_opt(name).await {
                    Ok(Some(now))
                        if convert::pod_uid(&now) == found
                            && convert::pod_node(&now) == Some(node)
                            && annotation_of(&now) == annotation.as_deref() =>
                    {
                        self.mirror.lock().mark_accepted(&found);
                        Ok(())
                    }
                    // Cannot tell whether an earlier write of ours landed: keep it.
                    Err(e) => Err(BindError::Unsettled {
                        pod: key,
                        node: node.to_string(),
                        message: format!(
                            "{} (409), and reading the pod back failed: {e}",
                            s.message
                        ),
                    }),
                    _ => {
                        self.mirror.lock().unreserve(&found);
                        Err(BindError::Refused {
                            pod: key,
                            node: node.to_string(),
                            message: s.message,
                        })
                    }
                }
            }
            Ok(Err(kube::Error::Api(s))) if s.code >= 500 => {
                // A 5xx (504 Timeout above all) may come after the write was
                // committed: freeing the GPUs now could hand them out twice.
                Err(BindError::Unsettled {
                    pod: key,
                    node: node.to_string(),
                    message: format!("{} ({})", s.message, s.code),
                })
            }
            Ok(Err(kube::Error::Api(s))) => {
                // A 4xx: the server refused; nothing was written.
                self.mirror.lock().unreserve(&found);
                Err(BindError::Refused {
                    pod: key,
                    node: node.to_string(),
                    message: format!("{} ({})", s.message, s.code),
                })
            }
            // Transport errors and timeouts: the write may have landed; keep the reservation.
            Ok(Err(source)) => Err(BindError::Binding {
                pod: key,
                node: node.to_string(),
                source,
            }),
            Err(_) => Err(BindError::Timeout {
                pod: key,
                node: node.to_string(),
                secs: budget.as_secs(),
            }),
        }
    }

    /// How long a write started `after` from now may take: the request
    /// timeout, within what is left of leadership; `None` when less than
    /// [`MIN_WRITE_WINDOW`] would be left then.
    pub(crate) fn write_budget(&self, after: Duration) -> Option<Duration> {
        match self.leader.remaining() {
            None => Some(self.request_timeout),
            Some(left) => {
                let left = left.checked_sub(after)?;
                (left >= MIN_WRITE_WINDOW).then(|| left.min(self.request_timeout))
            }
        }
    }

    /// Reads back the pods of reservations past their deadline whose Binding had
    /// an unknown outcome and settles each with the server's answer (see the
    /// module docs). A pod that cannot be read stays reserved for the next try.
    /// Called before every bind, and by the standalone loop on every pass (at
    /// least every 10 s); with nothing due it reads nothing.
    pub async fn settle_expired(&self) {
        let due = self.mirror.lock().due_for_reread();
        for (uid, namespace, name) in due {
            let api: Api<Pod> = Api::namespaced(self.client.clone(), &namespace);
            match api.get_opt(&name).await {
                Ok(read) => self.mirror.lock().settle(&uid, read),
                Err(e) => tracing::warn!(
                    pod = %format!("{namespace}/{name}"),
                    error = %e,
                    "could not read back a pod whose bind had an unknown outcome; its GPUs stay reserved"
                ),
            }
        }
    }

    /// Binds a pod of another profile (`extenders` in a KubeSchedulerConfiguration
    /// apply to every profile, so a shared kube-scheduler sends us its
    /// `default-scheduler` pods too): the plain Binding kube-scheduler's own
    /// DefaultBinder would post, with the pod's UID as precondition and no
    /// `tessera.io/allocation`, so the pod gets no grant and nothing is reserved
    /// in the mirror (its devices, if any, are another device plugin's; the
    /// node agent allocates nothing of Tessera's to a pod without a grant).
    /// Fenced by leadership like every write.
    async fn pass_through(&self, api: &Api<Pod>, pod: &Pod, node: &str) -> Result<(), BindError> {
        let key = convert::pod_key(pod);
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let Some(budget) = self.write_budget(Duration::ZERO) else {
            return Err(BindError::NotLeader);
        };
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                uid: pod.metadata.uid.clone().filter(|u| !u.is_empty()),
                ..ObjectMeta::default()
            },
            target: node_ref(node),
        };
        let params = PostParams::default();
        let call = api
            .create_subresource::<Binding, serde_json::Value>("binding", name, &params, &binding);
        match tokio::time::timeout(budget, call).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                // A retried bind whose first answer was lost: already where it was sent.
                match api.get_opt(name).await {
                    Ok(Some(now))
                        if convert::pod_uid(&now) == convert::pod_uid(pod)
                            && convert::pod_node(&now) == Some(node) =>
                    {
                        Ok(())
                    }
                    _ => Err(BindError::Refused {
                        pod: key,
                        node: node.to_string(),
                        message: format!("{} (409)", s.message),
                    }),
                }
            }
            Ok(Err(kube::Error::Api(s))) => Err(BindError::Refused {
                pod: key,
                node: node.to_string(),
                message: format!("{} ({})", s.message, s.code),
            }),
            Ok(Err(source)) => Err(BindError::Binding {
                pod: key,
                node: node.to_string(),
                source,
            }),
            Err(_) => Err(BindError::Timeout {
                pod: key,
                node: node.to_string(),
                secs: budget.as_secs(),
            }),
        }
    }

    /// POSTs the Binding with the allocation annotation and the pod's UID and
    /// resourceVersion as preconditions.
    async fn post_binding(
        &self,
        api: &Api<Pod>,
        pod: &Pod,
        node: &str,
        annotation: Option<&str>,
    ) -> Result<(), kube::Error> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let binding = Binding {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                uid: pod.metadata.uid.clone().filter(|u| !u.is_empty()),
                resource_version: pod.metadata.resource_version.clone(),
                annotations: annotation.map(|v| [(ANNOTATION.to_string(), v.to_string())].into()),
                ..ObjectMeta::default()
            },
            target: node_ref(node),
        };
        api.create_subresource::<Binding, serde_json::Value>(
            "binding",
            &name,
            &PostParams::default(),
            &binding,
        )
        .await
        .map(|_| ())
    }
}

/// The first `tessera.io/` resource `pod` asks for, if any.
pub fn tessera_resource(pod: &Pod) -> Option<String> {
    first_resource(pod, |name| name.starts_with("tessera.io/"))
}

/// The first stock NVIDIA GPU resource (`nvidia.com/gpu`, `nvidia.com/mig-*`)
/// the pod asks for, if any.
pub fn stock_gpu_resource(pod: &Pod) -> Option<String> {
    first_resource(pod, |name| {
        name == "nvidia.com/gpu" || name.starts_with("nvidia.com/mig-")
    })
}

/// The first resource name in the pod's limits or requests (containers, then
/// init containers) that `wanted` accepts.
fn first_resource(pod: &Pod, wanted: impl Fn(&str) -> bool) -> Option<String> {
    let spec = pod.spec.as_ref()?;
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .filter_map(|c| c.resources.as_ref())
        .flat_map(|r| {
            r.limits
                .iter()
                .chain(r.requests.iter())
                .flat_map(|m| m.keys())
        })
        .find(|name| wanted(name))
        .cloned()
}

fn node_ref(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.to_string()),
        ..ObjectReference::default()
    }
}

fn annotation_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .map(String::as_str)
}
