//! Each `GpuQueue`'s figures (what it holds, deserves and borrows, and its
//! waiting pods): written to its status so that `kubectl get gpuqueues` shows
//! them, and computed from the cluster's objects for `kubectl tessera queues`
//! ([`read`]), which needs no scheduler.
//!
//! Only the leader writes, and only after the initial lists are in. Each write
//! is a merge patch of the status subresource carrying the object's
//! `resourceVersion` as seen by the watch: if someone changed the queue since,
//! the API server answers 409 and the next tick writes from the newer object.
//! A status equal to what the object already has is not written.

use std::time::Duration;

use kube::api::{Api, Patch, PatchParams};
use tessera_api::{GpuQueue, GpuQueueStatus, QueueResources};
use tessera_core::queue::Resources;

use crate::gate::SyncGate;
use crate::leader::Leadership;
use crate::mirror::QueueFigures;
use crate::mirror::{Mirror, SharedMirror};
use crate::view::ViewError;

/// How often statuses are refreshed.
pub const INTERVAL: Duration = Duration::from_secs(15);

/// Kubernetes quantities for an amount: GPU-equivalents and CPU as decimals
/// (`"2.5"`), memory in `Mi`.
pub fn quantities(r: &Resources) -> QueueResources {
    let dec = |milli: u64| {
        if milli.is_multiple_of(1000) {
            (milli / 1000).to_string()
        } else {
            format!("{milli}m")
        }
    };
    QueueResources {
        gpus: Some(dec(r.gpu_eq_milli)),
        cpu: Some(dec(r.cpu_milli)),
        memory: Some(format!("{}Mi", r.memory_mib)),
    }
}

/// The statuses that differ from what the objects carry: (name, resourceVersion, status).
pub fn changed(mirror: &mut Mirror) -> Vec<(String, String, GpuQueueStatus)> {
    let problems = mirror.queue_problems();
    let report = mirror.queue_report();
    let mut out = Vec::new();
    for (name, rv, current) in mirror.queue_objects() {
        let problem = problems.iter().find(|p| p.contains(&name)).cloned();
        let status = match report.iter().find(|q| q.name == name) {
            Some(q) => GpuQueueStatus {
                allocated: quantities(&q.allocated),
                deserved: quantities(&q.deserved),
                borrowed: quantities(&q.borrowed),
                pending_pods: u32::try_from(q.pending_pods).unwrap_or(u32::MAX),
                problem,
            },
            // Not in the tree in force (its spec does not read, or the tree does not hold).
            None => GpuQueueStatus {
                problem: problem.or_else(|| Some("not in the queue tree in force".into())),
                ..Default::default()
            },
        };
        if current.as_ref() != Some(&status) {
            out.push((name, rv, status));
        }
    }
    out
}

/// One round of writes; returns how many statuses were written.
pub async fn publish(client: &kube::Client, mirror: &SharedMirror) -> usize {
    let todo = changed(&mut mirror.lock());
    let api: Api<GpuQueue> = Api::all(client.clone());
    let mut written = 0;
    for (name, rv, status) in todo {
        let patch = serde_json::json!({
            "apiVersion": "tessera.io/v1alpha1",
            "kind": "GpuQueue",
            "metadata": {"resourceVersion": rv},
            "status": status,
        });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => written += 1,
            Err(kube::Error::Api(e)) if e.code == 409 => {
                tracing::debug!(queue = %name, "GpuQueue changed since it was read; next round")
            }
            Err(e) => tracing::warn!(queue = %name, error = %e, "writing GpuQueue status failed"),
        }
    }
    written
}

/// Publishes every [`INTERVAL`] while leading and synced, until `shutdown`.
pub async fn run(
    client: kube::Client,
    mirror: SharedMirror,
    leader: Leadership,
    gate: SyncGate,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut tick = tokio::time::interval(INTERVAL);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {
                if leader.is_leader() && gate.is_synced() {
                    publish(&client, &mirror).await;
                }
            }
        }
    }
}

/// Every queue's figures and the queue problems, computed from the objects a
/// read-only client lists (nodes, GpuNodes, pods, GpuQueues, namespaces), with
/// `ge` as the GPU-equivalent factors. No queues (or no CRD): an empty list.
pub async fn read(
    client: &kube::Client,
    ge: tessera_core::queue::GpuEquivalents,
) -> Result<(Vec<QueueFigures>, Vec<String>), ViewError> {
    let (queues, namespaces) = crate::view::read_queues(client).await?;
    if queues.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let (nodes, inventory, pods) = crate::view::read_cluster(client).await?;
    let mut m = crate::view::mirror(nodes, inventory, pods);
    m.set_gpu_equivalents(ge);
    m.replace_queues(queues);
    m.replace_namespaces(namespaces);
    Ok((m.queue_report(), m.queue_problems()))
}
