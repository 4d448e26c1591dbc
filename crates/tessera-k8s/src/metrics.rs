//! The scheduler's Prometheus metrics (prometheus-client, OpenMetrics text).
//!
//! Decision latency per verb; pending pods by reason (set by the standalone
//! loop); allocated and free GPU milli per node and model and FGD fragmentation
//! per node, and per `GpuQueue` its guarantee, holdings, fair share, borrowed
//! GPU-equivalents and waiting pods, recomputed from the mirror at each scrape
//! so they never drift from the ledger. A granted MIG instance counts as its share of the GPU's compute
//! slices (the ledger holds MIG grants that way: 3g of 7 is 428 milli-GPU).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tessera_core::frag::{FragNode, node_frag};

use crate::mirror::Mirror;

type Labels = Vec<(String, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 50 µs … ~1.6 s.
    Histogram::new(exponential_buckets(0.000_05, 2.0, 16))
}

/// All metrics of one scheduler process.
pub struct Metrics {
    registry: Registry,
    decision_seconds: HistogramFamily,
    pending: Family<Labels, Gauge>,
    allocated_milli: Family<Labels, Gauge>,
    free_milli: Family<Labels, Gauge>,
    fragmentation: Family<Labels, Gauge<f64, AtomicU64>>,
    cluster_fragmentation: Gauge<f64, AtomicU64>,
    leader: Gauge,
    election_errors: Gauge,
    synced: Gauge,
    learned_pods: Gauge,
    learned_generation: Gauge,
    /// Weight of each of the target workload's heaviest shapes.
    shape_weight: Family<Labels, Gauge<f64, AtomicU64>>,
    model_pressure: Family<Labels, Gauge<f64, AtomicU64>>,
    gpu_seconds: Family<Labels, Counter<f64, AtomicU64>>,
    gpu_capacity_seconds: Family<Labels, Counter<f64, AtomicU64>>,
    /// Per queue and kind (guaranteed, allocated, deserved, borrowed): GPU-equivalents.
    queue_gpus: Family<Labels, Gauge<f64, AtomicU64>>,
    queue_pending: Family<Labels, Gauge>,
    preemptions: Family<Labels, Counter>,
    preempted_gpu_seconds: Family<Labels, Counter<f64, AtomicU64>>,
    bind_failures: Counter,
    dra_problems: Gauge,
    problems: Gauge,
    /// Held while a scrape sets the cluster gauges ([`Metrics::apply_cluster`]).
    scrape: std::sync::Mutex<()>,
}

/// What a scrape reads off the mirror under its lock: copies only; the
/// fragmentation is computed from them afterwards ([`Metrics::apply_cluster`]).
pub struct ClusterFigures {
    nodes: Vec<NodeFigures>,
    workload: Arc<tessera_core::frag::TargetWorkload>,
    workload_report: crate::mirror::WorkloadReport,
    queues: Vec<crate::mirror::QueueFigures>,
}

struct NodeFigures {
    name: String,
    model: tessera_core::model::ModelId,
    model_name: String,
    /// Free compute per healthy GPU (0 for an unhealthy one), milli-GPU.
    free: Vec<u32>,
    used_milli: u64,
    free_cpu_milli: u64,
}

impl ClusterFigures {
    /// Reads the figures (call it holding the mirror's lock; it is linear in
    /// the nodes and copies a few numbers each).
    pub fn read(mirror: &mut Mirror) -> ClusterFigures {
        mirror.refresh();
        let workload_report = mirror.workload_report();
        let workload = mirror.target_workload();
        let usage = mirror.usage();
        let cluster = mirror.cluster();
        let mut nodes = Vec::with_capacity(cluster.nodes().len());
        for node in cluster.nodes() {
            let Some(used) = usage.get(&node.name) else {
                continue;
            };
            let Some(model) = node.primary_model() else {
                continue;
            };
            nodes.push(NodeFigures {
                name: node.name.clone(),
                model,
                model_name: cluster.catalog.spec(model).name.clone(),
                free: node
                    .gpus
                    .iter()
                    .zip(used.gpus.iter())
                    .map(|(g, u)| {
                        if g.health == tessera_core::model::Health::Healthy {
                            u.free_cores_milli
                        } else {
                            0
                        }
                    })
                    .collect(),
                used_milli: used.used_milli(),
                free_cpu_milli: used.free_cpu_milli,
            });
        }
        let queues = mirror.queue_report();
        ClusterFigures {
            nodes,
            workload,
            workload_report,
            queues,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tessera");
        let decision_seconds: HistogramFamily = Family::new_with_constructor(latency_histogram);
        let pending = Family::<Labels, Gauge>::default();
        let allocated_milli = Family::<Labels, Gauge>::default();
        let free_milli = Family::<Labels, Gauge>::default();
        let fragmentation = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let cluster_fragmentation = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "decision_duration_seconds",
            "Time to answer one scheduling call (filter, prioritize, bind, preempt, standalone)",
            decision_seconds.clone(),
        );
        registry.register(
            "pending_pods",
            "Pods waiting for a placement, by reason",
            pending.clone(),
        );
        registry.register(
            "gpu_allocated_milli",
            "Allocated GPU compute in milli-GPU (a MIG instance: its share of the GPU's compute slices), per node and model",
            allocated_milli.clone(),
        );
        registry.register(
            "gpu_free_milli",
            "Free GPU compute in milli-GPU on healthy GPUs, per node and model",
            free_milli.clone(),
        );
        registry.register(
            "node_fragmentation_milli",
            "FGD fragmentation of a node against the target workload, in milli-GPU",
            fragmentation.clone(),
        );
        registry.register(
            "cluster_fragmentation_milli",
            "FGD fragmentation summed over nodes, in milli-GPU",
            cluster_fragmentation.clone(),
        );
        let leader = Gauge::default();
        let election_errors = Gauge::default();
        let synced = Gauge::default();
        registry.register(
            "leader",
            "1 while this replica leads (may bind), else 0",
            leader.clone(),
        );
        registry.register(
            "leader_election_errors",
            "Failed leader-election calls since start (a replica that cannot read its Lease never leads)",
            election_errors.clone(),
        );
        registry.register(
            "cache_synced",
            "1 once nodes, GpuNodes and pods have been listed (nothing is decided before)",
            synced.clone(),
        );
        let learned_pods = Gauge::default();
        let learned_generation = Gauge::default();
        let shape_weight = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let model_pressure = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let bind_failures = Counter::default();
        registry.register(
            "bind_failures",
            "Binds that failed (the API refused the Binding, a precondition no longer held, or this replica may not bind); the pod is retried",
            bind_failures.clone(),
        );
        registry.register(
            "learned_workload_pods",
            "Pods the target workload has learned since start (after a restart: the pods listed)",
            learned_pods.clone(),
        );
        registry.register(
            "learned_workload_generation",
            "Times the learned target moved enough to rebuild the policy",
            learned_generation.clone(),
        );
        registry.register(
            "workload_shape_weight",
            "Weight of the target workload's heaviest shapes (fragmentation is measured against it), per GPU count, milli-GPU per GPU, CPU milli and allowed models (empty: any)",
            shape_weight.clone(),
        );
        registry.register(
            "model_pressure",
            "Share of a model's GPUs that model-constrained shapes need, against the average (unconstrained pods pay to use a model under pressure)",
            model_pressure.clone(),
        );
        let gpu_seconds = Family::<Labels, Counter<f64, AtomicU64>>::default();
        let gpu_capacity_seconds = Family::<Labels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "gpu_seconds",
            "GPU time held by bound pods, in GPU-seconds (a share: its fraction of the GPU's compute; a MIG instance: its share of the compute slices), per namespace, GpuQueue (empty: none), model and mode (whole, share, mig)",
            gpu_seconds.clone(),
        );
        registry.register(
            "gpu_capacity_seconds",
            "Healthy GPU time offered, in GPU-seconds, per model (utilisation = gpu_seconds / gpu_capacity_seconds)",
            gpu_capacity_seconds.clone(),
        );
        let queue_gpus = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        let queue_pending = Family::<Labels, Gauge>::default();
        registry.register(
            "queue_gpu_equivalents",
            "GpuQueue quota and use in GPU-equivalents, by queue and kind (guaranteed, allocated, deserved = fair share now, borrowed = held beyond the guarantee)",
            queue_gpus.clone(),
        );
        registry.register(
            "queue_pending_pods",
            "Pods waiting for a node, by queue",
            queue_pending.clone(),
        );
        let preemptions = Family::<Labels, Counter>::default();
        let preempted_gpu_seconds = Family::<Labels, Counter<f64, AtomicU64>>::default();
        registry.register(
            "queue_evictions",
            "Pods Tessera evicted for others, by the victim's queue (empty: none) and kind (preempted by priority, reclaimed quota)",
            preemptions.clone(),
        );
        registry.register(
            "queue_evicted_gpu_seconds",
            "GPU time (GPU-equivalent seconds) the evicted pods had run, by the victim's queue",
            preempted_gpu_seconds.clone(),
        );
        let dra_problems = Gauge::default();
        registry.register(
            "dra_problems",
            "DRA objects that do not read and devices left out of nodes' inventories (standalone --dra; as of the last scheduling pass)",
            dra_problems.clone(),
        );
        let problems = Gauge::default();
        registry.register(
            "problems",
            "Problems the scheduler's mirror sees (nodes blocked because their agent is silent or their inventory does not read, grants that do not replay, queue trees that do not read), as of the web view's last tick; listed on the web view",
            problems.clone(),
        );
        Metrics {
            dra_problems,
            problems,
            preemptions,
            preempted_gpu_seconds,
            queue_gpus,
            queue_pending,
            gpu_seconds,
            gpu_capacity_seconds,
            registry,
            leader,
            election_errors,
            synced,
            decision_seconds,
            pending,
            allocated_milli,
            free_milli,
            fragmentation,
            cluster_fragmentation,
            learned_pods,
            learned_generation,
            shape_weight,
            model_pressure,
            bind_failures,
            scrape: std::sync::Mutex::new(()),
        }
    }

    /// Counts a failed bind (extender or standalone).
    pub fn bind_failed(&self) {
        self.bind_failures.inc();
    }

    /// How many problems the DRA view has ([`crate::dra::view::DraView::problems`]):
    /// a claim or slice that does not read, or a device left out, is
    /// otherwise seen only by the pods it makes wait or fail.
    pub fn set_dra_problems(&self, n: usize) {
        self.dra_problems.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// How many problems the mirror has ([`crate::mirror::Mirror::problems`]).
    pub fn set_problems(&self, n: usize) {
        self.problems.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Leadership, election errors and cache sync, as of now.
    pub fn set_state(&self, leader: bool, election_errors: u64, synced: bool) {
        self.leader.set(i64::from(leader));
        self.election_errors
            .set(i64::try_from(election_errors).unwrap_or(i64::MAX));
        self.synced.set(i64::from(synced));
    }

    pub fn observe_decision(&self, verb: &str, took: Duration) {
        self.decision_seconds
            .get_or_create(&vec![("verb".to_string(), verb.to_string())])
            .observe(took.as_secs_f64());
    }

    /// Replaces the pending-pod counts.
    pub fn set_pending<'a>(&self, by_reason: impl IntoIterator<Item = (&'a str, i64)>) {
        self.pending.clear();
        for (reason, n) in by_reason {
            self.pending
                .get_or_create(&vec![("reason".to_string(), reason.to_string())])
                .set(n);
        }
    }

    /// Recomputes the per-node GPU gauges from the mirror.
    pub fn update_cluster(&self, mirror: &mut Mirror) {
        self.apply_cluster(ClusterFigures::read(mirror));
    }

    /// Sets the cluster gauges from figures read off the mirror, computing
    /// each node's fragmentation here: call it without the mirror's lock (and
    /// off the async workers), since that is the costly part of a scrape.
    /// Concurrent scrapes take turns, so one scrape's gauges are never mixed
    /// with another's.
    pub fn apply_cluster(&self, figures: ClusterFigures) {
        let _turn = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        self.allocated_milli.clear();
        self.free_milli.clear();
        self.fragmentation.clear();
        self.update_workload(&figures.workload_report);
        let mut total = 0.0;
        for n in &figures.nodes {
            let labels = vec![
                ("node".to_string(), n.name.clone()),
                ("model".to_string(), n.model_name.clone()),
            ];
            self.allocated_milli
                .get_or_create(&labels)
                .set(n.used_milli as i64);
            self.free_milli
                .get_or_create(&labels)
                .set(n.free.iter().map(|&f| i64::from(f)).sum());
            let frag = node_frag(
                &FragNode {
                    free_milli: &n.free,
                    free_cpu_milli: n.free_cpu_milli,
                    model: Some(n.model),
                },
                &figures.workload,
            );
            total += frag;
            self.fragmentation
                .get_or_create(&vec![("node".to_string(), n.name.clone())])
                .set(frag);
        }
        self.cluster_fragmentation.set(total);
        self.queue_gpus.clear();
        self.queue_pending.clear();
        for q in &figures.queues {
            let queue = ("queue".to_string(), q.name.clone());
            for (kind, r) in [
                ("guaranteed", q.guaranteed),
                ("allocated", q.allocated),
                ("deserved", q.deserved),
                ("borrowed", q.borrowed),
            ] {
                self.queue_gpus
                    .get_or_create(&vec![queue.clone(), ("kind".to_string(), kind.to_string())])
                    .set(r.gpu_eq_milli as f64 / 1000.0);
            }
            self.queue_pending
                .get_or_create(&vec![queue])
                .set(i64::try_from(q.pending_pods).unwrap_or(i64::MAX));
        }
    }

    /// The target workload's figures ([`Mirror::workload_report`]).
    fn update_workload(&self, w: &crate::mirror::WorkloadReport) {
        self.learned_pods
            .set(i64::try_from(w.pods_learned).unwrap_or(i64::MAX));
        self.learned_generation
            .set(i64::try_from(w.generation).unwrap_or(i64::MAX));
        self.shape_weight.clear();
        for shape in &w.top {
            self.shape_weight
                .get_or_create(&vec![
                    ("gpus".to_string(), shape.gpus.to_string()),
                    ("gpu_milli".to_string(), shape.gpu_milli.to_string()),
                    ("cpu_milli".to_string(), shape.cpu_milli.to_string()),
                    ("models".to_string(), shape.models.join("|")),
                ])
                .set(shape.weight);
        }
        self.model_pressure.clear();
        for (model, p) in &w.pressure {
            self.model_pressure
                .get_or_create(&vec![("model".to_string(), model.clone())])
                .set(*p);
        }
    }

    /// Counts one eviction Tessera made for another pod.
    pub fn count_eviction(&self, queue: &str, reclaim: bool, gpu_milli_seconds: u64) {
        let kind = if reclaim { "reclaimed" } else { "preempted" };
        self.preemptions
            .get_or_create(&vec![
                ("queue".to_string(), queue.to_string()),
                ("kind".to_string(), kind.to_string()),
            ])
            .inc();
        self.preempted_gpu_seconds
            .get_or_create(&vec![("queue".to_string(), queue.to_string())])
            .inc_by(gpu_milli_seconds as f64 / 1000.0);
    }

    /// Adds what the chargeback meter just charged (milli-GPU × ms per
    /// account) and the capacity offered over the same interval.
    pub fn add_gpu_time(
        &self,
        charged: &std::collections::BTreeMap<tessera_core::chargeback::Account, u64>,
        capacity_milli: &std::collections::BTreeMap<String, u64>,
        interval_ms: u64,
    ) {
        use tessera_core::chargeback::MILLI_MS_PER_GPU_SECOND;
        for (a, &milli_ms) in charged {
            self.gpu_seconds
                .get_or_create(&vec![
                    ("namespace".to_string(), a.namespace.clone()),
                    ("queue".to_string(), a.queue.clone()),
                    ("model".to_string(), a.model.clone()),
                    ("mode".to_string(), a.mode.name().to_string()),
                ])
                .inc_by(milli_ms as f64 / MILLI_MS_PER_GPU_SECOND);
        }
        for (model, &milli) in capacity_milli {
            self.gpu_capacity_seconds
                .get_or_create(&vec![("model".to_string(), model.clone())])
                .inc_by((milli * interval_ms) as f64 / MILLI_MS_PER_GPU_SECOND);
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Node, Pod};
    use tessera_api::GpuNode;
    use tessera_core::policy::{PolicyArgs, by_name};

    use super::*;
    use crate::mirror::Reservation;

    /// The value of the sample `name{labels}` in an OpenMetrics text.
    fn sample(text: &str, name: &str, labels: &str) -> Option<i64> {
        let prefix = format!("{name}{{{labels}}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .and_then(|v| v.trim().parse().ok())
    }

    /// The chart's TesseraBindsFailing alert reads this counter (issue 27 item 10).
    #[test]
    fn failed_binds_are_counted() {
        let metrics = Metrics::new();
        let before = metrics.encode().unwrap();
        assert!(before.contains("tessera_bind_failures_total 0"), "{before}");
        metrics.bind_failed();
        metrics.bind_failed();
        let text = metrics.encode().unwrap();
        assert!(text.contains("tessera_bind_failures_total 2"), "{text}");
    }

    /// A granted MIG instance counts as its share of the GPU's compute.
    #[test]
    fn mig_instances_count_as_allocated_compute() {
        let node: Node = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi"}}
        }))
        .unwrap();
        // GPU 0 in MIG mode with one 3g.40gb instance; GPU 1 plain.
        let inv: GpuNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a"},
            "spec": {"nodeName": "a", "gpus": [
                {"index": 0, "uuid": "GPU-0", "model": "A100-80GB", "memoryMiB": 81920,
                 "mig": {"enabled": true, "instances": [
                     {"profile": "3g.40gb", "start": 4, "size": 4, "uuid": "MIG-8a2f"}]}},
                {"index": 1, "uuid": "GPU-1", "model": "A100-80GB", "memoryMiB": 81920}
            ]}
        }))
        .unwrap();
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"},
            "spec": {"containers": [{"name": "c", "resources": {
                "requests": {"tessera.io/mig-3g.40gb": "1"}}}]}
        }))
        .unwrap();
        let policy = by_name("tessera", &PolicyArgs::default()).unwrap();
        let mut m = Mirror::from_objects(policy, b"k".to_vec(), vec![node], vec![inv], vec![]);
        assert!(matches!(
            m.reserve(&pod, "a"),
            Ok(Reservation::Write {
                annotation: Some(_)
            })
        ));
        let metrics = Metrics::new();
        metrics.update_cluster(&mut m);
        let text = metrics.encode().unwrap();
        let labels = r#"node="a",model="A100-80GB""#;
        // 3 of 7 compute slices, rounded down: 3000 / 7 = 428 milli-GPU allocated,
        // leaving 1000 - 428 = 572 on GPU 0 and 1000 on GPU 1.
        assert_eq!(
            sample(&text, "tessera_gpu_allocated_milli", labels),
            Some(428),
            "{text}"
        );
        assert_eq!(
            sample(&text, "tessera_gpu_free_milli", labels),
            Some(572 + 1000),
            "{text}"
        );
    }
}
