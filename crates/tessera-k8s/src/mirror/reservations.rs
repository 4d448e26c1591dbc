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
    /// The signed annotation value the binder writes (reservations only).
    pub annotation: Option<String>,
    /// What was wrong with the pod's objects when it was taken up (bad request, forged annotation).
    pub problem: Option<String>,
    /// Countable node resources the pod takes (pod slot, device-plugin resources).
    pub host: HostAsk,
    /// A reservation not yet accepted by the API server is dropped at this time.
    pub expires: Option<Instant>,
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
    /// Drops reservations the API server did not accept before their deadline.
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
            return Ok(if h.bound || h.expires.is_none() {
                Reservation::AlreadyBound
            } else {
                Reservation::Write {
                    annotation: h.annotation.clone(),
                }
            });
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
    pub fn hold(
        &mut self,
        pod: &Pod,
        placement: Placement,
        req: Request,
        host: HostAsk,
    ) -> Result<Reservation, ReserveError> {
        let uid = convert::pod_uid(pod).to_string();
        let key = convert::pod_key(pod);
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

    /// The API server accepted the reservation's bind: it no longer expires and
    /// stays until the watch shows the pod (bound, or deleted).
    pub fn mark_accepted(&mut self, uid: &str) {
        if let Some(h) = self.held.get_mut(uid) {
            h.expires = None;
        }
    }
}
