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
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Nodes,
        Kind::Inventory,
        Kind::Pods,
        Kind::Queues,
        Kind::Namespaces,
    ];

    fn bit(self) -> u8 {
        match self {
            Kind::Nodes => 1,
            Kind::Inventory => 2,
            Kind::Pods => 4,
            Kind::Queues => 8,
            Kind::Namespaces => 16,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::Nodes => "nodes",
            Kind::Inventory => "GpuNodes",
            Kind::Pods => "pods",
            Kind::Queues => "GpuQueues",
            Kind::Namespaces => "namespaces",
        }
    }
}

const ALL_BITS: u8 = 31;

/// Shared, cheap to clone.
#[derive(Debug, Clone)]
pub struct SyncGate {
    tx: Arc<watch::Sender<u8>>,
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
        }
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
        *self.tx.borrow() == ALL_BITS
    }

    /// The kinds not listed yet, for readiness and error messages.
    pub fn missing(&self) -> Vec<&'static str> {
        let bits = *self.tx.borrow();
        Kind::ALL
            .into_iter()
            .filter(|k| bits & k.bit() == 0)
            .map(Kind::name)
            .collect()
    }

    /// Waits until every kind is listed, at most `limit`; true when synced.
    pub async fn wait(&self, limit: Duration) -> bool {
        let mut rx = self.tx.subscribe();
        matches!(
            tokio::time::timeout(limit, rx.wait_for(|b| *b == ALL_BITS)).await,
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
}
