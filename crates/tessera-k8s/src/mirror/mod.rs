//! The cluster mirror: nodes, pods and `GpuNode` inventory as the watch
//! streams deliver them, with the core cluster, ledger and policy built on top.
//!
//! The API server is the only source of truth. Every allocation in the ledger
//! comes from a bound pod's signed `tessera.io/allocation` annotation (or, for a
//! bound pod without one, from its CPU and memory requests alone), so a fresh
//! process that lists the same pods rebuilds the same ledger. The only state of
//! our own is a reservation between deciding a bind and the watch stream
//! showing the bound pod; it is dropped if the bind fails.
//!
//! Inventory expires too: a node whose agent heartbeats but whose `GpuNode`
//! has not changed for [`INVENTORY_TTL`] takes no new pods until it changes
//! again ([`liveness`]).
//!
//! Reservations expire: one not confirmed by the API server within
//! [`RESERVATION_TTL`] is dropped (a caller that went away, a bind whose outcome
//! is unknown and never showed up in the watch), as kube-scheduler's assume
//! cache does. One the API accepted is kept until the watch shows the pod.
//!
//! A Node or GpuNode change that placement reads (labels, taints, cordon,
//! readiness, allocatable, the GPUs and their health) renumbers the core
//! cluster, so it marks the mirror dirty and the next decision rebuilds cluster
//! and ledger by replaying every held allocation (O(pods), and rare); status
//! churn (heartbeats, the agents' free-memory figures) is stored without a
//! rebuild. Pod changes apply to the ledger in place.
//!
//! Parts: [`ingest`] (watch events and holds), [`liveness`] (agents gone
//! quiet), [`reservations`] (assumed
//! placements with deadlines), [`verdicts`] (per-shape node judgements for the
//! extender and the standalone loop), [`queues`] (queues and quota admission),
//! [`groups`] (gangs), [`estimate`] (replicas that would fit now, for
//! `tessera estimator`), [`shared`] (the lock every task shares it through);
//! this file holds the state and its reads.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;
use tessera_api::GpuNode;
use tessera_core::allocation::KeyRing;
use tessera_core::ledger::NodeUse;
use tessera_core::model::Catalog;
use tessera_core::{Cluster, Ledger, NodeId, Policy};

use tokio::time::Instant;

use crate::convert::{self, NodeFacts};
use crate::hostfit::{self, HostAsk};

mod blocks;
mod claim_holds;
mod estimate;
mod foreign;
mod groups;
mod ingest;
mod learning;
mod liveness;
mod preemption;
mod queues;
mod reservations;
mod shared;
mod verdicts;

pub use blocks::{Block, Unread};
pub use estimate::{Assumed, Counted, Scratch};
pub use groups::gang_of;
pub use learning::{Shape, WorkloadReport};
pub use liveness::INVENTORY_TTL;
pub use preemption::{PreemptionPlan, Victim, may_preempt_for, victims_text};
pub use queues::{QueueFigures, QuotaCheck, queue_spec};
pub use reservations::{Held, RESERVATION_TTL, Reservation, ReserveError};
pub use shared::SharedMirror;
pub use verdicts::{FilterOutcome, resolvable};

/// Nodes, pods and inventory, and the core state derived from them.
pub struct Mirror {
    /// Signs new decisions; verifies the annotations of bound pods with any of its keys.
    key: KeyRing,
    policy: Box<dyn Policy>,
    /// The workload a learning policy is built from (see [`learning`]).
    learning: learning::Learning,
    base_catalog: Catalog,
    kube_nodes: BTreeMap<String, KubeNode>,
    inventory: BTreeMap<String, GpuNode>,
    pods: HashMap<String, Pod>,
    held: HashMap<String, Held>,
    /// Rebuilt only when nodes or inventory change; shared with readers
    /// that work outside the lock (the web view).
    cluster: Arc<Cluster>,
    ledger: Ledger,
    facts: Vec<NodeFacts>,
    dirty: bool,
    rng: SmallRng,
    /// Per request shape, each node's verdict (see [`verdicts`]).
    verdicts: tessera_core::judge::Verdicts<verdicts::ShapeKey>,
    /// Node name to id, for the extender's name lists.
    by_name: FxHashMap<String, NodeId>,
    generation: u64,
    /// Things wrong with nodes, inventory or replays at the last rebuild.
    node_problems: Vec<String>,
    /// What the DRA view found wrong (standalone `--dra`), as of the last pass.
    dra_problems: Vec<String>,
    /// Per node name, the countable resources the held pods take.
    host_used: FxHashMap<String, BTreeMap<String, u64>>,
    /// No unconfirmed reservation expires before this (a scan of the holds is
    /// skipped until then: they are tens of thousands on a large cluster).
    next_expiry: Option<Instant>,
    /// How many times room may have been freed so far: holdings released
    /// (pods gone or done, binds refused, reservations expired), GpuNodes
    /// whose GPUs, health or held containers changed so that more may fit,
    /// Nodes changed for placement. A pod that failed before the last such
    /// change may fit now ([`Mirror::released`]).
    released: u64,
    /// Nodes whose bound pods' grants do not fit their GPUs (two schedulers
    /// raced, an annotation names a GPU that is gone): nothing more is placed
    /// there until the next rebuild finds them consistent, since the ledger
    /// could not count what they hold.
    blocked: FxHashMap<NodeId, Block>,
    /// Terminal pods still in the API, `uid` to `namespace/name`: the kubelet
    /// has taken their devices back, whatever the node agent last reported.
    finished: HashMap<String, String>,
    /// Pods (`namespace/name`) the node agents' PodResources reports list, as
    /// of the last rebuild: one of them ending changes what is counted.
    reported: HashSet<String>,
    /// Reservations past their deadline whose Binding had an unknown outcome:
    /// held until the pod is read back (see [`reservations`]).
    unsettled: HashSet<String>,
    /// Queues, namespaces' queue labels and quota usage (see [`queues`]).
    queues: queues::Queues,
    /// `PodGroup` specs by `namespace/name` (see [`groups`]).
    groups: BTreeMap<String, tessera_api::PodGroupSpec>,
    /// PodDisruptionBudgets (see [`preemption`]).
    disruption: preemption::Disruption,
    /// When the mirror last saw each `GpuNode` change, on its own clock (see [`liveness`]).
    inventory_changed: HashMap<String, Instant>,
    /// How long a heartbeating `GpuNode` may stay unchanged.
    inventory_ttl: std::time::Duration,
    /// Nodes (by name) whose `GpuNode` is stale: no new pods until it changes.
    /// Apart from `blocked`, which a rebuild clears: only a change lifts these.
    stale: HashMap<String, Block>,
    /// No `GpuNode` can turn stale before this (a scan is skipped until then).
    next_liveness: Option<Instant>,
    /// What allocated claims hold of GPUs, as the standalone loop last said
    /// (see [`claim_holds`]).
    claims_on_gpus: Vec<tessera_core::holdings::GpuHold>,
    /// The ledger's allocations that count those, as of the last rebuild.
    claim_allocs: HashSet<tessera_core::ledger::AllocId>,
}

impl Mirror {
    /// Whether the Node `name` says Tessera's agent serves `nvidia.com/gpu`
    /// there ([`tessera_api::gpunode::NVIDIA_GPU_LABEL`]).
    pub fn serves_nvidia_gpu(&self, name: &str) -> bool {
        self.kube_nodes
            .get(name)
            .and_then(|n| n.metadata.labels.as_ref())
            .and_then(|l| l.get(tessera_api::gpunode::NVIDIA_GPU_LABEL))
            .is_some_and(|v| v == tessera_api::gpunode::NVIDIA_GPU_SERVED)
    }
    /// An empty mirror deciding with `policy` and verifying annotations with `key`
    /// (one key, or a [`KeyRing`] with verify-only keys during a rotation).
    pub fn new(policy: Box<dyn Policy>, key: impl Into<KeyRing>) -> Mirror {
        let key = key.into();
        let cluster = Cluster::default();
        let ledger = Ledger::new(&cluster);
        let mut m = Mirror {
            key,
            policy,
            learning: Default::default(),
            base_catalog: Catalog::default(),
            kube_nodes: BTreeMap::new(),
            inventory: BTreeMap::new(),
            pods: HashMap::new(),
            held: HashMap::new(),
            cluster: Arc::new(cluster),
            ledger,
            facts: Vec::new(),
            dirty: false,
            rng: SmallRng::seed_from_u64(0x7e55e7a),
            verdicts: tessera_core::judge::Verdicts::new(verdicts::MAX_SHAPES),
            by_name: FxHashMap::default(),
            generation: 0,
            node_problems: Vec::new(),
            dra_problems: Vec::new(),
            host_used: FxHashMap::default(),
            next_expiry: None,
            released: 0,
            blocked: FxHashMap::default(),
            finished: HashMap::new(),
            reported: HashSet::new(),
            unsettled: HashSet::new(),
            queues: Default::default(),
            groups: BTreeMap::new(),
            disruption: Default::default(),
            inventory_changed: HashMap::new(),
            inventory_ttl: INVENTORY_TTL,
            stale: HashMap::new(),
            next_liveness: None,
            claims_on_gpus: Vec::new(),
            claim_allocs: HashSet::new(),
        };
        // A learning policy is built from the learned target (the cold-start prior
        // until pods arrive) from the start, whatever the caller built it from.
        m.rebuild_policy();
        m
    }

    /// A mirror built from complete lists of objects (what a fresh process sees on start).
    pub fn from_objects(
        policy: Box<dyn Policy>,
        key: impl Into<KeyRing>,
        nodes: impl IntoIterator<Item = KubeNode>,
        inventory: impl IntoIterator<Item = GpuNode>,
        pods: impl IntoIterator<Item = Pod>,
    ) -> Mirror {
        let mut m = Mirror::new(policy, key);
        m.replace_nodes(nodes);
        m.replace_inventory(inventory);
        m.replace_pods(pods);
        m.refresh();
        m
    }

    pub fn policy_name(&self) -> &'static str {
        self.policy.name()
    }

    /// Whether the node's countable resources (pod slots, device-plugin
    /// resources such as `tessera.io/gpu`) take `ask` besides what is held there.
    pub fn host_fits(&self, facts: &NodeFacts, ask: &HostAsk) -> Result<(), String> {
        hostfit::check(&facts.allocatable, self.host_used.get(&facts.name), ask)
    }

    /// Rebuilds the core cluster and ledger if nodes or inventory changed, and
    /// blocks the nodes whose `GpuNode` has turned stale meanwhile (every
    /// decision comes here first, so no other event is needed for that).
    pub fn refresh(&mut self) {
        if self.dirty {
            self.rebuild();
        }
        self.expire_inventory();
    }

    fn rebuild(&mut self) {
        self.dirty = false;
        self.generation += 1;
        self.node_problems.clear();
        let mut catalog = self.base_catalog.clone();
        let mut nodes = Vec::with_capacity(self.kube_nodes.len());
        let mut facts = Vec::with_capacity(self.kube_nodes.len());
        for (name, kn) in &self.kube_nodes {
            match convert::core_node(kn, self.inventory.get(name), &mut catalog) {
                Ok(n) => {
                    nodes.push(n);
                    facts.push(convert::node_facts(kn));
                }
                Err(e) => self.node_problems.push(e.to_string()),
            }
        }
        self.cluster = Arc::new(match Cluster::new(catalog, nodes) {
            Ok(c) => c,
            Err(e) => {
                self.node_problems.push(e.to_string());
                Cluster::default()
            }
        });
        self.facts = facts;
        self.by_name = self
            .cluster
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), NodeId(i as u32)))
            .collect();
        self.verdicts.clear();
        self.blocked.clear();
        self.ledger = Ledger::new(&self.cluster);
        // The GPU inventory is part of what a learning policy is built from.
        self.rebuild_policy();
        let mut uids: Vec<String> = self.held.keys().cloned().collect();
        // Replay in a fixed order so equal inputs give equal ledgers.
        uids.sort_by(|a, b| self.held[a].pod.cmp(&self.held[b].pod).then(a.cmp(b)));
        for u in uids {
            if let Some(h) = self.held.get_mut(&u) {
                h.id = None;
            }
            self.apply_held(&u);
        }
        // GPUs held outside Tessera's grants, as the kubelet reports them.
        self.count_foreign();
        // GPUs allocated ResourceClaims hold.
        self.count_claims_on_gpus();
    }

    // ---- reads ---------------------------------------------------------------------------

    /// How many times the cluster has been rebuilt from the watched objects.
    pub fn generation(&mut self) -> u64 {
        self.refresh();
        self.generation
    }

    /// The cluster as of now, to read without holding the mirror (a rebuild
    /// makes a new one; this one stays as it was).
    pub fn shared_cluster(&mut self) -> Arc<Cluster> {
        self.refresh();
        self.cluster.clone()
    }

    pub fn cluster(&mut self) -> &Cluster {
        self.refresh();
        &self.cluster
    }

    pub fn ledger(&mut self) -> &Ledger {
        self.refresh();
        &self.ledger
    }

    /// Per-node use, by node name (the comparable form of a ledger).
    pub fn usage(&mut self) -> BTreeMap<String, NodeUse> {
        self.refresh();
        self.cluster
            .nodes()
            .iter()
            .zip(self.ledger.nodes())
            .map(|(n, u)| {
                let mut u = u.clone();
                // Class counts are kept in arrival order; sort them so equal holdings compare equal.
                u.classes.sort_unstable();
                (n.name.clone(), u)
            })
            .collect()
    }

    pub fn pod(&self, uid: &str) -> Option<&Pod> {
        self.pods.get(uid)
    }

    pub fn pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.values()
    }

    /// Pods waiting for a node that nothing holds: unbound, not finished,
    /// not being deleted, with no reservation of ours.
    pub fn waiting_pods(&self) -> impl Iterator<Item = &Pod> {
        self.pods.values().filter(|p| self.is_waiting(p))
    }

    /// Whether `pod` is one of [`Mirror::waiting_pods`].
    pub fn is_waiting(&self, pod: &Pod) -> bool {
        convert::pod_node(pod).is_none()
            && !convert::is_terminal(pod)
            && pod.metadata.deletion_timestamp.is_none()
            && !self.held.contains_key(convert::pod_uid(pod))
    }

    pub fn held(&self, uid: &str) -> Option<&Held> {
        self.held.get(uid)
    }

    pub fn holds(&self) -> impl Iterator<Item = (&String, &Held)> {
        self.held.iter()
    }

    pub fn facts(&mut self, id: NodeId) -> &NodeFacts {
        self.refresh();
        &self.facts[id.0 as usize]
    }

    /// Everything wrong with the mirrored objects: nodes and inventory, replays, pods.
    pub fn problems(&self) -> Vec<String> {
        let mut v = self.node_problems.clone();
        let mut stale: Vec<String> = self
            .stale
            .iter()
            .map(|(node, block)| format!("node {node}: {block}"))
            .collect();
        stale.sort();
        v.extend(stale);
        let mut pods: Vec<&String> = self
            .held
            .values()
            .filter_map(|h| h.problem.as_ref())
            .collect();
        pods.sort();
        v.extend(pods.into_iter().cloned());
        v.extend(self.queues_problems_as_of_now());
        v.extend(self.dra_problems.iter().cloned());
        v
    }

    /// What the DRA view finds wrong ([`crate::dra::view::DraView::problems`]:
    /// claims and slices that do not read, devices left out of inventories),
    /// told at each standalone pass so that [`Mirror::problems`] lists them.
    pub fn set_dra_problems(&mut self, problems: Vec<String>) {
        self.dra_problems = problems;
    }

    /// The key new decisions are signed with.
    pub fn key(&self) -> &[u8] {
        self.key.signing()
    }

    /// A pod by namespace and name.
    pub fn pod_by_name(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods.values().find(|p| {
            p.metadata.name.as_deref() == Some(name)
                && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
        })
    }

    /// Whether a Kubernetes node of this name is mirrored.
    pub fn knows_node(&self, name: &str) -> bool {
        self.kube_nodes.contains_key(name)
    }
}
