//! Reservations: a decided placement held in the ledger between the bind
//! decision and the watch showing the bound pod, with a deadline.

use crate::convert::{self};
use crate::hostfit::HostAsk;
use k8s_openapi::api::core::v1::Pod;
use std::time::Duration;
use tessera_core::AllocId;
use tessera_core::allocation::Allocation;
use tessera_core::fit::NodeView;
use tessera_core::placement::Placement;
use tessera_core::request::{GpuAsk, Request, RequestError};
use tokio::time::Instant;

use super::Mirror;

/// How long a reservation waits for the API server to accept its bind: longer
/// than the binder's request timeout and kube-scheduler's extender timeout.
pub const RESERVATION_TTL: Duration = Duration::from_secs(30);

/// One pod's hold on the cluster (bound, or reserved by a bind in flight).
#[derive(Debug, Clone)]
pub struct Held {
    pub pod: String,
    pub node: String,
    pub request: Request,
    /// The decision, when the pod has GPUs.
    pub allocation: Option<Allocation>,
    /// The ledger entry; `None` when the hold could not be replayed (reported in `problems`).
    pub id: Option<AllocId>,
    /// The watch stream has shown the pod bound (false: reserved by our bind, in flight).
    pub bound: bool,
    /// The signed annotation value: the one the binder writes (a reservation),
    /// or the one the pod carried when it was taken up (a bound pod). Another
    /// value on the server replaces the hold: the server wins.
    pub annotation: Option<String>,
    /// What was wrong with the pod's objects when it was taken up (bad request, forged annotation).
    pub problem: Option<String>,
    /// Countable node resources the pod takes (pod slot, device-plugin resources).
    pub host: HostAsk,
    /// A reservation not yet accepted by the API server is dropped at this time
    /// (one whose Binding was sent, only once the pod is read back unbound).
    pub expires: Option<Instant>,
    /// A bound pod that asks GPUs without a grant Tessera can read: what it
    /// holds is counted from the node agent's PodResources report, and its node
    /// blocked until the report lists it (see [`super::foreign`]).
    pub unread: Option<super::Unread>,
    /// The Binding was sent and its outcome is unknown: at its deadline the pod
    /// is read back before its GPUs are freed ([`Mirror::due_for_reread`]).
    pub sent: bool,
}

/// A reservation the binder must now write and bind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reservation {
    /// New (or an earlier bind that did not finish): write this annotation (if any), then bind.
    Write { annotation: Option<String> },
    /// The pod is already bound there: nothing to do.
    AlreadyBound,
}

/// Why a bind cannot be reserved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReserveError {
    #[error("pod {pod}: {source}")]
    Request { pod: String, source: RequestError },
    #[error("pod {pod}: node {node} is not known to Tessera")]
    UnknownNode { pod: String, node: String },
    #[error("pod {pod} does not fit on node {node}: {reason}")]
    DoesNotFit {
        pod: String,
        node: String,
        reason: String,
    },
    #[error("pod {pod} is already placed on node {held}, not {node}")]
    ElsewhereAlready {
        pod: String,
        node: String,
        held: String,
    },
    #[error("pod {pod}: {problem}")]
    Ledger { pod: String, problem: String },
    #[error("pod {pod} cannot go to node {node}: {why}")]
    NodeRefuses {
        pod: String,
        node: String,
        why: String,
    },
}

impl Mirror {
    /// Drops reservations the API server did not accept before their deadline,
    /// where no Binding was sent. One whose Binding was sent with an unknown
    /// outcome may have landed while the watch lags: it stays held until the
    /// pod is read back ([`Mirror::due_for_reread`], [`Mirror::settle`]).
    pub fn expire_reservations(&mut self) {
        let now = Instant::now();
        if self.next_expiry.is_none_or(|t| now < t) {
            return;
        }
        self.next_expiry = self
            .held
            .values()
            .filter(|h| !h.bound)
            .filter_map(|h| h.expires)
            .filter(|t| *t > now)
            .min();
        let expired: Vec<String> = self
            .held
            .iter()
            .filter(|(_, h)| !h.bound && h.expires.is_some_and(|t| t <= now))
            .map(|(u, _)| u.clone())
            .collect();
        for u in expired {
            if self.held[&u].sent {
                if self.unsettled.insert(u.clone()) {
                    tracing::warn!(pod = %self.held[&u].pod, "reservation past its deadline after a bind with an unknown outcome; the pod is read back before its GPUs are freed");
                }
                continue;
            }
            tracing::warn!(pod = %self.held[&u].pod, "reservation expired without a confirmed bind; its GPUs are free again");
            self.release(&u);
        }
    }

    /// Decides the pod's GPUs on `node` and reserves them (the binder then writes and binds).
    pub fn reserve(&mut self, pod: &Pod, node: &str) -> Result<Reservation, ReserveError> {
        self.refresh();
        self.expire_reservations();
        let uid = convert::pod_uid(pod).to_string();
        let key = convert::pod_key(pod);
        if let Some(h) = self.held.get(&uid) {
            if h.node != node {
                return Err(ReserveError::ElsewhereAlready {
                    pod: key,
                    node: node.to_string(),
                    held: h.node.clone(),
                });
            }
            // Accepted by the API (not yet seen in the watch) counts as bound: a retried bind is a no-op.
            if h.bound || h.expires.is_none() {
                return Ok(Reservation::AlreadyBound);
            }
            // The same Binding again: a fresh deadline, and no read settles the earlier one.
            let annotation = h.annotation.clone();
            let expires = Instant::now() + RESERVATION_TTL;
            if let Some(h) = self.held.get_mut(&uid) {
                h.expires = Some(expires);
            }
            self.unsettled.remove(&uid);
            self.next_expiry = Some(self.next_expiry.map_or(expires, |t| t.min(expires)));
            return Ok(Reservation::Write { annotation });
        }
        let asks = convert::pod_asks(pod, &self.cluster.catalog);
        let req = asks.request.map_err(|source| ReserveError::Request {
            pod: key.clone(),
            source,
        })?;
        // Every node a pod may go to is a Kubernetes node we mirror (GPU or not):
        // a bind to anything else is refused, not passed through.
        let Some(id) = self.cluster.node_id(node) else {
            return Err(ReserveError::UnknownNode {
                pod: key,
                node: node.to_string(),
            });
        };
        let refuses = |why: String| ReserveError::NodeRefuses {
            pod: key.clone(),
            node: node.to_string(),
            why,
        };
        let facts = &self.facts[id.0 as usize];
        // kube-scheduler checked these too; a bind is also judged on its own.
        crate::standalone::node_allows(pod, facts).map_err(refuses)?;
        let host = asks.host.map_err(refuses)?;
        self.host_fits(facts, &host).map_err(refuses)?;
        let placement = if req.gpu == GpuAsk::None {
            Placement {
                node: id,
                cpu_milli: req.cpu_milli,
                memory_mib: req.memory_mib,
                ..Placement::default()
            }
        } else {
            let scored = self
                .score_node(id, &req)
                .map_err(|r| ReserveError::DoesNotFit {
                    pod: key.clone(),
                    node: node.to_string(),
                    reason: r.to_string(),
                })?;
            Placement::of(
                NodeView::of(&self.cluster, &self.ledger, id),
                &req,
                id,
                scored,
            )
        };
        self.hold(pod, placement, req, host)
    }

    /// Records a decided placement as a reservation and returns what to write.
    /// A pod already held is refused: its hold is given back only by its own
    /// outcome (a failed bind, the watch), never overwritten.
    pub fn hold(
        &mut self,
        pod: &Pod,
        placement: Placement,
        req: Request,
        host: HostAsk,
    ) -> Result<Reservation, ReserveError> {
        let uid = convert::pod_uid(pod).to_string();
        let key = convert::pod_key(pod);
        if let Some(h) = self.held.get(&uid) {
            return Err(ReserveError::ElsewhereAlready {
                pod: key,
                node: self.cluster.node(placement.node).name.clone(),
                held: h.node.clone(),
            });
        }
        let alloc_id =
            self.ledger
                .apply(&self.cluster, &placement)
                .map_err(|e| ReserveError::Ledger {
                    pod: key.clone(),
                    problem: e.to_string(),
                })?;
        let allocation = (!placement.grants.is_empty()).then(|| {
            convert::allocation_of(&placement, &self.cluster, pod, &req, self.policy.name())
        });
        let annotation = allocation
            .as_ref()
            .map(|a| a.encode_signed(self.key.signing()));
        self.insert_held(
            uid,
            Held {
                pod: key,
                node: self.cluster.node(placement.node).name.clone(),
                request: req,
                allocation,
                id: Some(alloc_id),
                bound: false,
                annotation: annotation.clone(),
                problem: None,
                host,
                expires: Some(Instant::now() + RESERVATION_TTL),
                unread: None,
                sent: false,
            },
        );
        let expires = Instant::now() + RESERVATION_TTL;
        self.next_expiry = Some(self.next_expiry.map_or(expires, |t| t.min(expires)));
        Ok(Reservation::Write { annotation })
    }

    /// Drops a reservation whose bind failed.
    pub fn unreserve(&mut self, uid: &str) {
        if self.held.get(uid).is_some_and(|h| !h.bound) {
            self.release(uid);
        }
    }

    /// Drops a reservation whose Binding was never sent (its caller went away
    /// first); one sent earlier with an unknown outcome stays until it is read back.
    pub fn unreserve_unsent(&mut self, uid: &str) {
        if self.held.get(uid).is_some_and(|h| !h.bound && !h.sent) {
            self.release(uid);
        }
    }

    /// The Binding is about to be sent: from now on its outcome may be unknown,
    /// and the reservation is freed at its deadline only once the pod is read
    /// back without it.
    pub fn mark_sent(&mut self, uid: &str) {
        if let Some(h) = self.held.get_mut(uid)
            && !h.bound
        {
            h.sent = true;
        }
    }

    /// Reservations past their deadline whose Binding was sent with an unknown
    /// outcome, as `(uid, namespace, name)`: the caller reads each pod back and
    /// hands the answer to [`Mirror::settle`].
    pub fn due_for_reread(&mut self) -> Vec<(String, String, String)> {
        self.expire_reservations();
        let held = &self.held;
        // Settled meanwhile by the watch (bound, accepted or gone): nothing to read.
        self.unsettled
            .retain(|u| held.get(u).is_some_and(|h| !h.bound && h.expires.is_some()));
        let mut due: Vec<(String, String, String)> = self
            .unsettled
            .iter()
            .filter_map(|u| {
                let (ns, name) = held[u].pod.split_once('/')?;
                Some((u.clone(), ns.to_string(), name.to_string()))
            })
            .collect();
        due.sort();
        due
    }

    /// Settles a reservation with the pod as the API server has it now (`None`:
    /// not found). The server wins: bound, the pod is taken up with the grant it
    /// carries; not bound (or gone, or replaced) 30 s after our Binding, the
    /// Binding did not land and the GPUs are free again.
    pub fn settle(&mut self, uid: &str, read: Option<Pod>) {
        // Only a reservation still waiting for a read: one the watch settled,
        // or whose bind is being retried (a fresh deadline), is left alone.
        if !self.unsettled.remove(uid) {
            return;
        }
        let Some(h) = self.held.get(uid) else { return };
        if h.bound || h.expires.is_none() {
            return;
        }
        match read {
            Some(pod) if convert::pod_uid(&pod) == uid && convert::pod_node(&pod).is_some() => {
                self.upsert_pod(pod)
            }
            Some(pod) if convert::pod_uid(&pod) == uid && convert::is_terminal(&pod) => {
                self.upsert_pod(pod)
            }
            _ => {
                tracing::warn!(pod = %h.pod, "reservation expired and the pod was read back without it; its GPUs are free again");
                self.release(uid);
            }
        }
    }

    /// The API server accepted the reservation's bind: it no longer expires and
    /// stays until the watch shows the pod (bound, or deleted).
    pub fn mark_accepted(&mut self, uid: &str) {
        if let Some(h) = self.held.get_mut(uid) {
            h.expires = None;
        }
    }
}
