//! The cache-sync gate: nothing is decided, bound or reported ready before the
//! mirror holds complete lists of nodes, `GpuNode`s, pods, `GpuQueue`s and
//! namespaces (quotas are judged on the queues and the namespaces' labels).
//!
//! A fresh process that answered `filter` before its pod list was in would see
//! every GPU free and hand out shares other pods hold (seen on a real control
//! plane: one GPU at 120 % within 20 ms of a restart). Each watcher marks its
//! kind synced at its first `InitDone`; the extender's handlers and the
//! standalone loop wait on [`SyncGate::wait`], readiness reports the kinds still
//! missing. A later relist does not close the gate: the mirror keeps its last
//! complete view until the new list is complete (kube-rs buffers it).
//!
//! With DRA on (`--dra`, standalone mode) the gate also waits for
//! `ResourceClaim`s, `ResourceSlice`s and `DeviceClass`es
//! ([`SyncGate::with_dra`]): a claim allocation decided before the claims were
//! listed would hand out devices other claims hold.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

/// The object kinds whose initial list must be in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Nodes,
    Inventory,
    Pods,
    /// `GpuQueue`s (marked at once when the CRD is not installed: no queues).
    Queues,
    /// Namespaces (their queue labels).
    Namespaces,
    /// `resource.k8s.io/v1` ResourceClaims (only with [`SyncGate::with_dra`]).
    ResourceClaims,
    /// `resource.k8s.io/v1` ResourceSlices (idem).
    ResourceSlices,
    /// `resource.k8s.io/v1` DeviceClasses (idem).
    DeviceClasses,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Nodes,
        Kind::Inventory,
        Kind::Pods,
        Kind::Queues,
        Kind::Namespaces,
        Kind::ResourceClaims,
        Kind::ResourceSlices,
        Kind::DeviceClasses,
    ];

    /// The DRA kinds, required only by a gate made [`SyncGate::with_dra`].
    pub const DRA: [Kind; 3] = [
        Kind::ResourceClaims,
        Kind::ResourceSlices,
        Kind::DeviceClasses,
    ];

    fn bit(self) -> u8 {
        match self {
            Kind::Nodes => 1,
            Kind::Inventory => 2,
            Kind::Pods => 4,
            Kind::Queues => 8,
            Kind::Namespaces => 16,
            Kind::ResourceClaims => 32,
            Kind::ResourceSlices => 64,
            Kind::DeviceClasses => 128,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Nodes => "nodes",
            Kind::Inventory => "GpuNodes",
            Kind::Pods => "pods",
            Kind::Queues => "GpuQueues",
            Kind::Namespaces => "namespaces",
            Kind::ResourceClaims => "ResourceClaims",
            Kind::ResourceSlices => "ResourceSlices",
            Kind::DeviceClasses => "DeviceClasses",
        }
    }
}

/// The kinds every gate waits for.
const BASE_BITS: u8 = 31;

/// Shared, cheap to clone.
#[derive(Debug, Clone)]
pub struct SyncGate {
    tx: Arc<watch::Sender<u8>>,
    /// The kinds this gate waits for (set before the gate is cloned).
    required: u8,
}

impl Default for SyncGate {
    fn default() -> Self {
        SyncGate::new()
    }
}

impl SyncGate {
    /// A closed gate: nothing listed yet.
    pub fn new() -> SyncGate {
        SyncGate {
            tx: Arc::new(watch::channel(0).0),
            required: BASE_BITS,
        }
    }

    /// A closed gate that also waits for the DRA kinds ([`Kind::DRA`]).
    pub fn with_dra() -> SyncGate {
        let mut g = SyncGate::new();
        g.required |= Kind::DRA.iter().map(|k| k.bit()).fold(0, |a, b| a | b);
        g
    }

    /// An open gate (tests and tools that build the mirror from complete lists).
    pub fn synced() -> SyncGate {
        let g = SyncGate::new();
        for k in Kind::ALL {
            g.mark(k);
        }
        g
    }

    /// The initial list of `kind` is in the mirror.
    pub fn mark(&self, kind: Kind) {
        self.tx.send_if_modified(|bits| {
            let before = *bits;
            *bits |= kind.bit();
            before != *bits
        });
    }

    pub fn is_synced(&self) -> bool {
        *self.tx.borrow() & self.required == self.required
    }

    /// The kinds not listed yet, for readiness and error messages.
    pub fn missing(&self) -> Vec<&'static str> {
        let bits = *self.tx.borrow();
        Kind::ALL
            .into_iter()
            .filter(|k| self.required & k.bit() != 0 && bits & k.bit() == 0)
            .map(Kind::name)
            .collect()
    }

    /// Waits until every kind is listed, at most `limit`; true when synced.
    pub async fn wait(&self, limit: Duration) -> bool {
        let mut rx = self.tx.subscribe();
        let required = self.required;
        matches!(
            tokio::time::timeout(limit, rx.wait_for(|b| *b & required == required)).await,
            Ok(Ok(_))
        )
    }

    /// The sentence a caller gets while the gate is closed.
    pub fn not_synced_message(&self) -> String {
        format!(
            "Tessera has not finished listing {} from the API server yet; try again",
            self.missing().join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn opens_only_when_every_kind_is_listed() {
        let g = SyncGate::new();
        assert!(!g.is_synced());
        assert_eq!(
            g.missing(),
            vec!["nodes", "GpuNodes", "pods", "GpuQueues", "namespaces"]
        );
        g.mark(Kind::Nodes);
        g.mark(Kind::Pods);
        g.mark(Kind::Queues);
        g.mark(Kind::Namespaces);
        assert!(!g.wait(Duration::from_millis(10)).await);
        assert_eq!(g.missing(), vec!["GpuNodes"]);
        let waiter = {
            let g = g.clone();
            tokio::spawn(async move { g.wait(Duration::from_secs(30)).await })
        };
        g.mark(Kind::Inventory);
        assert!(waiter.await.unwrap());
        assert!(g.is_synced());
        assert!(SyncGate::synced().is_synced());
    }

    #[test]
    fn a_dra_gate_also_waits_for_claims_slices_and_classes() {
        let g = SyncGate::with_dra();
        for k in [
            Kind::Nodes,
            Kind::Inventory,
            Kind::Pods,
            Kind::Queues,
            Kind::Namespaces,
        ] {
            g.mark(k);
        }
        assert!(!g.is_synced());
        assert_eq!(
            g.missing(),
            vec!["ResourceClaims", "ResourceSlices", "DeviceClasses"]
        );
        g.mark(Kind::ResourceClaims);
        g.mark(Kind::ResourceSlices);
        assert!(!g.is_synced());
        g.mark(Kind::DeviceClasses);
        assert!(g.is_synced());
    }
}
