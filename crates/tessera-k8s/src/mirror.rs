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
//! Reservations expire: one not confirmed by the API server within
//! [`RESERVATION_TTL`] is dropped (a caller that went away, a bind whose outcome
//! is unknown and never showed up in the watch), as kube-scheduler's assume
//! cache does. One the API accepted is kept until the watch shows the pod.
//!
//! Node or inventory changes renumber the core cluster, so they mark the mirror
//! dirty and the next decision rebuilds cluster and ledger by replaying every
//! held allocation (O(pods), and rare). Pod changes apply to the ledger in place.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;
use tessera_api::GpuNode;
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_core::explain::{Explanation, Reason};
use tessera_core::fit::{self, NodeView};
use tessera_core::ledger::NodeUse;
use tessera_core::model::Catalog;
use tessera_core::placement::{Placement, Scored};
use tessera_core::request::{GpuAsk, Request, RequestError};
use tessera_core::{AllocId, Cluster, Ledger, NodeId, Policy};

use tokio::time::Instant;

use crate::convert::{self, NodeFacts};
use crate::hostfit::{self, HostAsk};

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

/// The per-node verdict of a filter, borrowing the caller's node names.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FilterOutcome<'a> {
    /// Nodes that fit, in input order.
    pub passed: Vec<&'a str>,
    /// Nodes rejected for want of free resources (preemption may help), in input order.
    pub failed: Vec<(&'a str, Arc<str>)>,
    /// Nodes that can never take the pod as it is, in input order.
    pub unresolvable: Vec<(&'a str, Arc<str>)>,
}

impl FilterOutcome<'_> {
    /// Why `node` was rejected, if it was.
    pub fn reason(&self, node: &str) -> Option<&str> {
        self.failed
            .iter()
            .chain(&self.unresolvable)
            .find(|(n, _)| *n == node)
            .map(|(_, m)| &**m)
    }
}

/// The rejection of a node the mirror has no inventory for.
static NO_INVENTORY: LazyLock<Arc<str>> =
    LazyLock::new(|| Arc::from("no GPU inventory (GpuNode) known for the node"));

/// Most request shapes whose verdicts are kept (the cache is dropped when full).
const MAX_SHAPES: usize = 128;

/// A node's verdict for one request shape.
#[derive(Debug, Clone)]
enum Verdict {
    Fit(f64),
    No { message: Arc<str>, resolvable: bool },
}

/// Verdicts of every node for one request shape, valid as of a ledger cursor.
///
/// Filter and prioritize of one pod, and the next pod of the same shape, only
/// re-judge the nodes the ledger logged as changed since (the core scheduler's
/// idea, applied to the extender's per-node answers). A rebuild of the cluster
/// bumps the mirror's generation and drops them all.
#[derive(Debug, Clone)]
struct ShapeCache {
    cursor: u64,
    generation: u64,
    verdicts: Vec<Option<Verdict>>,
}

/// Whether preemption could make room on a node rejected for `reason`.
pub fn resolvable(reason: &Reason) -> bool {
    !matches!(
        reason,
        Reason::TooFewGpus { .. }
            | Reason::ModelNotAllowed
            | Reason::Unhealthy
            | Reason::NoMigGpu { .. }
            | Reason::NoMigInstance { .. }
            | Reason::MixedArchitecture
            | Reason::Excluded { .. }
    )
}

/// Nodes, pods and inventory, and the core state derived from them.
pub struct Mirror {
    key: Vec<u8>,
    policy: Box<dyn Policy>,
    base_catalog: Catalog,
    kube_nodes: BTreeMap<String, KubeNode>,
    inventory: BTreeMap<String, GpuNode>,
    pods: HashMap<String, Pod>,
    held: HashMap<String, Held>,
    cluster: Cluster,
    ledger: Ledger,
    facts: Vec<NodeFacts>,
    dirty: bool,
    rng: SmallRng,
    /// Per request shape, each node's verdict (see [`ShapeCache`]).
    shapes: HashMap<(Request, HostAsk), ShapeCache>,
    /// The verdicts of the last request a non-cacheable policy judged.
    uncached: Option<ShapeCache>,
    /// Node name to id, for the extender's name lists.
    by_name: FxHashMap<String, NodeId>,
    generation: u64,
    /// Things wrong with nodes, inventory or replays at the last rebuild.
    node_problems: Vec<String>,
    /// Per node name, the countable resources the held pods take.
    host_used: FxHashMap<String, BTreeMap<String, u64>>,
    /// No unconfirmed reservation expires before this (a scan of the holds is
    /// skipped until then: they are tens of thousands on a large cluster).
    next_expiry: Option<Instant>,
    /// Nodes whose bound pods' grants do not fit their GPUs (two schedulers
    /// raced, an annotation names a GPU that is gone): nothing more is placed
    /// there until the next rebuild finds them consistent, since the ledger
    /// could not count what they hold.
    blocked: FxHashMap<NodeId, String>,
}

/// Whether two versions of a Node place pods alike (see [`Mirror::upsert_node`]).
fn same_node_for_placement(a: &KubeNode, b: &KubeNode) -> bool {
    let allocatable = |n: &KubeNode| n.status.as_ref().and_then(|s| s.allocatable.clone());
    convert::node_facts(a) == convert::node_facts(b) && allocatable(a) == allocatable(b)
}

/// Whether two versions of a GpuNode place pods alike (see [`Mirror::upsert_inventory`]).
fn same_inventory_for_placement(a: &GpuNode, b: &GpuNode) -> bool {
    a.spec == b.spec
        && a.spec.gpus.iter().all(|g| {
            a.spec.health_of(g.index, a.status.as_ref())
                == b.spec.health_of(g.index, b.status.as_ref())
        })
}

impl Mirror {
    /// An empty mirror deciding with `policy` and verifying annotations with `key`.
    pub fn new(policy: Box<dyn Policy>, key: Vec<u8>) -> Mirror {
        let cluster = Cluster::default();
        let ledger = Ledger::new(&cluster);
        Mirror {
            key,
            policy,
            base_catalog: Catalog::default(),
            kube_nodes: BTreeMap::new(),
            inventory: BTreeMap::new(),
            pods: HashMap::new(),
            held: HashMap::new(),
            cluster,
            ledger,
            facts: Vec::new(),
            dirty: false,
            rng: SmallRng::seed_from_u64(0x7e55e7a),
            shapes: HashMap::new(),
            uncached: None,
            by_name: FxHashMap::default(),
            generation: 0,
            node_problems: Vec::new(),
            host_used: FxHashMap::default(),
            next_expiry: None,
            blocked: FxHashMap::default(),
        }
    }

    /// A mirror built from complete lists of objects (what a fresh process sees on start).
    pub fn from_objects(
        policy: Box<dyn Policy>,
        key: Vec<u8>,
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

    // ---- watch events ------------------------------------------------------------------

    /// A Node was added or changed. Only a change to what placement reads
    /// (labels, taints, cordon, readiness, allocatable) rebuilds the cluster;
    /// status heartbeats do not.
    pub fn upsert_node(&mut self, node: KubeNode) {
        if let Some(name) = node.metadata.name.clone() {
            let same = self
                .kube_nodes
                .get(&name)
                .is_some_and(|old| same_node_for_placement(old, &node));
            self.kube_nodes.insert(name, node);
            self.dirty |= !same;
        }
    }

    pub fn remove_node(&mut self, name: &str) {
        if self.kube_nodes.remove(name).is_some() {
            self.dirty = true;
        }
    }

    pub fn replace_nodes(&mut self, nodes: impl IntoIterator<Item = KubeNode>) {
        self.kube_nodes = nodes
            .into_iter()
            .filter_map(|n| n.metadata.name.clone().map(|k| (k, n)))
            .collect();
        self.dirty = true;
    }

    /// A GpuNode was added or changed. The agents republish status every
    /// minute (free memory, timestamps); only a change to the GPUs themselves
    /// (spec) or to a GPU's health rebuilds the cluster.
    pub fn upsert_inventory(&mut self, gn: GpuNode) {
        if let Some(name) = gn.metadata.name.clone() {
            let same = self
                .inventory
                .get(&name)
                .is_some_and(|old| same_inventory_for_placement(old, &gn));
            self.inventory.insert(name, gn);
            self.dirty |= !same;
        }
    }

    pub fn remove_inventory(&mut self, name: &str) {
        if self.inventory.remove(name).is_some() {
            self.dirty = true;
        }
    }

    pub fn replace_inventory(&mut self, items: impl IntoIterator<Item = GpuNode>) {
        self.inventory = items
            .into_iter()
            .filter_map(|n| n.metadata.name.clone().map(|k| (k, n)))
            .collect();
        self.dirty = true;
    }

    /// A pod was added or changed.
    pub fn upsert_pod(&mut self, pod: Pod) {
        let uid = convert::pod_uid(&pod).to_string();
        if uid.is_empty() {
            return;
        }
        if convert::is_terminal(&pod) {
            self.pods.remove(&uid);
            self.release(&uid);
            return;
        }
        let node = convert::pod_node(&pod).map(str::to_string);
        self.pods.insert(uid.clone(), pod);
        let Some(node) = node else { return };
        match self.held.get_mut(&uid) {
            Some(h) if h.node == node => {
                h.bound = true;
                h.expires = None;
            }
            Some(_) => {
                // Bound somewhere other than we reserved: the API server wins.
                self.release(&uid);
                self.adopt(&uid);
            }
            None => self.adopt(&uid),
        }
    }

    /// A pod was deleted.
    pub fn remove_pod(&mut self, uid: &str) {
        self.pods.remove(uid);
        self.release(uid);
    }

    /// Replaces all pods (a relist): holds of pods that vanished are released
    /// (bound, or accepted by the API), reservations of binds in flight are
    /// kept until their deadline.
    pub fn replace_pods(&mut self, pods: impl IntoIterator<Item = Pod>) {
        let fresh: HashMap<String, Pod> = pods
            .into_iter()
            .map(|p| (convert::pod_uid(&p).to_string(), p))
            .filter(|(u, _)| !u.is_empty())
            .collect();
        let gone: Vec<String> = self
            .held
            .iter()
            .filter(|(u, h)| (h.bound || h.expires.is_none()) && !fresh.contains_key(*u))
            .map(|(u, _)| u.clone())
            .collect();
        for u in gone {
            self.release(&u);
        }
        self.pods.clear();
        let mut uids: Vec<String> = fresh.keys().cloned().collect();
        uids.sort();
        let mut fresh = fresh;
        for u in uids {
            if let Some(p) = fresh.remove(&u) {
                self.upsert_pod(p);
            }
        }
    }

    /// Takes up a bound pod found in the API: its signed allocation, or CPU and memory only.
    fn adopt(&mut self, uid: &str) {
        let Some(pod) = self.pods.get(uid) else {
            return;
        };
        let Some(node) = convert::pod_node(pod).map(str::to_string) else {
            return;
        };
        let key = convert::pod_key(pod);
        let mut problem = None;
        let mut request = match convert::pod_request(pod, &self.base_catalog) {
            Ok(r) => r,
            Err(e) => {
                problem = Some(format!("pod {key}: {e}"));
                Request::default()
            }
        };
        let allocation = match pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION))
        {
            // An empty key means a read-only tool (`tessera explain`) that trusts the API's annotations.
            Some(v) if self.key.is_empty() => Allocation::decode_unverified(v)
                .map_err(|e| problem = Some(format!("pod {key}: {e}; its GPUs are not counted")))
                .ok(),
            Some(v) => match Allocation::decode_verified(v, &self.key, uid, &node) {
                Ok(a) => Some(a),
                Err(e) => {
                    problem = Some(format!("pod {key}: {e}; its GPUs are not counted"));
                    None
                }
            },
            None => None,
        };
        if allocation.is_none() {
            // Bound without our decision (another scheduler, or no GPUs): count host resources only.
            request.gpu = GpuAsk::None;
        }
        let host = hostfit::host_ask(pod).unwrap_or_else(|e| {
            problem.get_or_insert(format!("pod {key}: {e}"));
            HostAsk([("pods".to_string(), 1)].into())
        });
        self.insert_held(
            uid.to_string(),
            Held {
                pod: key,
                node,
                request,
                allocation,
                id: None,
                bound: true,
                annotation: None,
                problem,
                host,
                expires: None,
            },
        );
        if !self.dirty {
            self.apply_held(uid);
        }
    }

    fn apply_held(&mut self, uid: &str) {
        let Some(h) = self.held.get(uid) else { return };
        let Some(node) = self.cluster.node_id(&h.node) else {
            self.node_problems.push(format!(
                "pod {}: bound to node {} that Tessera does not know",
                h.pod, h.node
            ));
            return;
        };
        let placement = match &h.allocation {
            Some(a) => convert::placement_of(a, &self.cluster, node, &h.request),
            None => Ok(Placement {
                node,
                cpu_milli: h.request.cpu_milli,
                memory_mib: h.request.memory_mib,
                ..Placement::default()
            }),
        };
        let result = placement.map_err(|e| e.to_string()).and_then(|p| {
            self.ledger
                .apply(&self.cluster, &p)
                .map_err(|e| e.to_string())
        });
        match result {
            Ok(id) => {
                if let Some(h) = self.held.get_mut(uid) {
                    h.id = Some(id);
                }
            }
            Err(e) => {
                let (pod, node_name, granted) =
                    (h.pod.clone(), h.node.clone(), h.allocation.is_some());
                self.node_problems.push(format!("pod {pod}: {e}"));
                if granted {
                    // What this pod holds is not in the ledger: the node's GPUs would look free.
                    self.blocked.entry(node).or_insert_with(|| {
                        format!("bound pods hold more than its GPUs have (pod {pod}: {e}); nothing more is placed here until they leave")
                    });
                    self.host_changed(&node_name);
                }
            }
        }
    }

    fn insert_held(&mut self, uid: String, h: Held) {
        hostfit::account(
            self.host_used.entry(h.node.clone()).or_default(),
            &h.host,
            true,
        );
        self.host_changed(&h.node);
        if let Some(old) = self.held.insert(uid, h) {
            self.unaccount(&old);
        }
    }

    fn unaccount(&mut self, h: &Held) {
        if let Some(used) = self.host_used.get_mut(&h.node) {
            hostfit::account(used, &h.host, false);
        }
        self.host_changed(&h.node);
    }

    /// The node's countable resources changed: its cached verdicts are stale
    /// (they include the host check), whether or not the ledger changed too.
    fn host_changed(&mut self, node: &str) {
        let Some(id) = self.by_name.get(node).copied() else {
            return;
        };
        for c in self.shapes.values_mut().chain(self.uncached.as_mut()) {
            if let Some(v) = c.verdicts.get_mut(id.0 as usize) {
                *v = None;
            }
        }
    }

    fn release(&mut self, uid: &str) {
        if let Some(h) = self.held.remove(uid) {
            self.unaccount(&h);
            if let Some(id) = h.id
                && !self.dirty
            {
                let _ = self.ledger.release(id);
            }
            // A pod leaving a blocked node may make it consistent: replay everything.
            if self
                .cluster
                .node_id(&h.node)
                .is_some_and(|n| self.blocked.contains_key(&n))
            {
                self.dirty = true;
            }
        }
    }

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

    /// Whether the node's countable resources (pod slots, device-plugin
    /// resources such as `tessera.io/gpu`) take `ask` besides what is held there.
    pub fn host_fits(&self, facts: &NodeFacts, ask: &HostAsk) -> Result<(), String> {
        hostfit::check(&facts.allocatable, self.host_used.get(&facts.name), ask)
    }

    /// Rebuilds the core cluster and ledger if nodes or inventory changed.
    pub fn refresh(&mut self) {
        if !self.dirty {
            return;
        }
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
        self.cluster = match Cluster::new(catalog, nodes) {
            Ok(c) => c,
            Err(e) => {
                self.node_problems.push(e.to_string());
                Cluster::default()
            }
        };
        self.facts = facts;
        self.by_name = self
            .cluster
            .nodes()
            .iter()
            .enumerate()
            .map(|(i, n)| (n.name.clone(), NodeId(i as u32)))
            .collect();
        self.shapes.clear();
        self.uncached = None;
        self.blocked.clear();
        self.ledger = Ledger::new(&self.cluster);
        let mut uids: Vec<String> = self.held.keys().cloned().collect();
        // Replay in a fixed order so equal inputs give equal ledgers.
        uids.sort_by(|a, b| self.held[a].pod.cmp(&self.held[b].pod).then(a.cmp(b)));
        for u in uids {
            if let Some(h) = self.held.get_mut(&u) {
                h.id = None;
            }
            self.apply_held(&u);
        }
    }

    // ---- reads ---------------------------------------------------------------------------

    /// How many times the cluster has been rebuilt from the watched objects.
    pub fn generation(&mut self) -> u64 {
        self.refresh();
        self.generation
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
        let mut pods: Vec<&String> = self
            .held
            .values()
            .filter_map(|h| h.problem.as_ref())
            .collect();
        pods.sort();
        v.extend(pods.into_iter().cloned());
        v
    }

    pub fn key(&self) -> &[u8] {
        &self.key
    }

    // ---- decisions -------------------------------------------------------------------------

    fn score_node(&mut self, id: NodeId, req: &Request) -> Result<Scored, Reason> {
        if let Some(why) = self.blocked.get(&id) {
            return Err(Reason::Excluded { why: why.clone() });
        }
        if req.gpu != GpuAsk::None && self.cluster.node(id).gpus.is_empty() {
            return Err(Reason::Excluded {
                why: "no GPUs known (no GpuNode inventory)".into(),
            });
        }
        let view = NodeView {
            node: self.cluster.node(id),
            used: self.ledger.node(id),
            catalog: &self.cluster.catalog,
        };
        let fit = fit::check(view, req)?;
        self.policy
            .score(view, req, &fit, &mut self.rng)
            .ok_or_else(|| Reason::PolicyDeclined {
                policy: self.policy.name().to_string(),
            })
    }

    /// Fills the verdict cache of `req`'s shape for `ids`, refreshing only the
    /// nodes the ledger changed since the shape was last asked (see [`ShapeCache`]).
    fn ensure_verdicts(&mut self, key: &(Request, HostAsk), ids: &[Option<NodeId>]) {
        let req = &key.0;
        let cacheable = self.policy.cacheable() && req.constraints.pinned_uuids.is_empty();
        let cursor = self.ledger.change_cursor();
        let mut cache = match self.shapes.remove(key) {
            Some(c) if cacheable && c.generation == self.generation => c,
            _ => ShapeCache {
                cursor,
                generation: self.generation,
                verdicts: vec![None; self.cluster.len()],
            },
        };
        match self.ledger.changes_since(cache.cursor) {
            Some(changed) => {
                for id in changed {
                    cache.verdicts[id.0 as usize] = None;
                }
            }
            None => cache.verdicts.iter_mut().for_each(|v| *v = None),
        }
        cache.cursor = cursor;
        for id in ids.iter().flatten() {
            if cache.verdicts[id.0 as usize].is_none() {
                let host = self.host_fits(&self.facts[id.0 as usize], &key.1);
                let v = match host.map(|()| self.score_node(*id, req)) {
                    // Device-plugin slots, pod count: preemption can free them.
                    Err(why) => Verdict::No {
                        message: why.into(),
                        resolvable: true,
                    },
                    Ok(Ok(s)) => Verdict::Fit(s.score),
                    Ok(Err(r)) => Verdict::No {
                        message: r.to_string().into(),
                        resolvable: resolvable(&r),
                    },
                };
                cache.verdicts[id.0 as usize] = Some(v);
            }
        }
        if cacheable {
            if self.shapes.len() >= MAX_SHAPES {
                self.shapes.clear();
            }
            self.shapes.insert(key.clone(), cache);
        } else {
            self.uncached = Some(cache);
        }
    }

    fn verdicts(&self, key: &(Request, HostAsk)) -> &[Option<Verdict>] {
        self.shapes
            .get(key)
            .or(self.uncached.as_ref())
            .map_or(&[], |c| c.verdicts.as_slice())
    }

    fn ids_of(&self, names: &[&str]) -> Vec<Option<NodeId>> {
        names
            .iter()
            .map(|n| self.by_name.get(*n).copied())
            .collect()
    }

    /// The extender's filter: which of `names` can take the pod.
    pub fn filter<'a>(
        &mut self,
        pod: &Pod,
        names: &[&'a str],
    ) -> Result<FilterOutcome<'a>, RequestError> {
        self.refresh();
        self.expire_reservations();
        let mut out = FilterOutcome::default();
        let req = convert::pod_request(pod, &self.cluster.catalog)?;
        // A pod whose countable asks cannot even be read is judged by the API server's validation.
        let host = hostfit::host_ask(pod).unwrap_or_default();
        if req.gpu == GpuAsk::None {
            // No GPUs: kube-scheduler's own plugins judge CPU and memory.
            out.passed = names.to_vec();
            return Ok(out);
        }
        let ids = self.ids_of(names);
        let key = (req, host);
        self.ensure_verdicts(&key, &ids);
        let verdicts = self.verdicts(&key);
        out.passed.reserve(names.len());
        for (name, id) in names.iter().zip(&ids) {
            match id
                .and_then(|id| verdicts.get(id.0 as usize))
                .and_then(Option::as_ref)
            {
                Some(Verdict::Fit(_)) => out.passed.push(name),
                Some(Verdict::No {
                    message,
                    resolvable,
                }) => {
                    let into = if *resolvable {
                        &mut out.failed
                    } else {
                        &mut out.unresolvable
                    };
                    into.push((name, message.clone()));
                }
                None => out.unresolvable.push((name, NO_INVENTORY.clone())),
            }
        }
        Ok(out)
    }

    /// The extender's prioritize: scores 0..=10 for the nodes of `names` that fit,
    /// the best node 10, the worst that fits 0 (linear in the policy's score).
    pub fn prioritize<'a>(
        &mut self,
        pod: &Pod,
        names: &[&'a str],
    ) -> Result<Vec<(&'a str, i64)>, RequestError> {
        self.refresh();
        let req = convert::pod_request(pod, &self.cluster.catalog)?;
        if req.gpu == GpuAsk::None {
            return Ok(names.iter().map(|n| (*n, 0)).collect());
        }
        let ids = self.ids_of(names);
        let key = (req, hostfit::host_ask(pod).unwrap_or_default());
        self.ensure_verdicts(&key, &ids);
        let verdicts = self.verdicts(&key);
        let raw: Vec<(&'a str, f64)> = names
            .iter()
            .zip(&ids)
            .filter_map(
                |(name, id)| match id.and_then(|id| verdicts.get(id.0 as usize)) {
                    Some(Some(Verdict::Fit(s))) => Some((*name, *s)),
                    _ => None,
                },
            )
            .collect();
        let (lo, hi) = raw
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (_, s)| {
                (lo.min(*s), hi.max(*s))
            });
        Ok(raw
            .into_iter()
            .map(|(n, s)| {
                let score = if hi > lo {
                    ((s - lo) / (hi - lo) * 10.0).round() as i64
                } else {
                    10
                };
                (n, score)
            })
            .collect())
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
        let req = convert::pod_request(pod, &self.cluster.catalog).map_err(|source| {
            ReserveError::Request {
                pod: key.clone(),
                source,
            }
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
        let host = hostfit::host_ask(pod).map_err(refuses)?;
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
            let view = NodeView {
                node: self.cluster.node(id),
                used: self.ledger.node(id),
                catalog: &self.cluster.catalog,
            };
            Placement {
                node: id,
                grants: fit::grants(view, &req, &scored.gpus),
                cpu_milli: req.cpu_milli,
                memory_mib: req.memory_mib,
                class: tessera_core::placement::request_class(&req),
                score: scored.score,
                terms: scored.terms.to_vec(),
            }
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
        let annotation = allocation.as_ref().map(|a| a.encode_signed(&self.key));
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

    /// A pod by namespace and name.
    pub fn pod_by_name(&self, namespace: &str, name: &str) -> Option<&Pod> {
        self.pods.values().find(|p| {
            p.metadata.name.as_deref() == Some(name)
                && p.metadata.namespace.as_deref().unwrap_or("default") == namespace
        })
    }

    /// Places a pod on the best node among those `eligible` allows (standalone
    /// mode): the placement and the per-node reasons, or why nothing fits (with
    /// `eligible`'s reasons counted).
    pub fn decide(
        &mut self,
        req: &Request,
        host: &HostAsk,
        eligible: impl Fn(&NodeFacts) -> Result<(), String>,
    ) -> Result<(Placement, Explanation), Explanation> {
        self.refresh();
        self.expire_reservations();
        let mut e = Explanation::new(self.cluster.len());
        let mut best: Option<(NodeId, Scored)> = None;
        for i in 0..self.cluster.len() {
            let id = NodeId(i as u32);
            if let Err(why) =
                eligible(&self.facts[i]).and_then(|()| self.host_fits(&self.facts[i], host))
            {
                e.add(Reason::Excluded { why });
                continue;
            }
            match self.score_node(id, req) {
                Ok(s) => {
                    e.fit += 1;
                    if best.as_ref().is_none_or(|(_, b)| s.score > b.score) {
                        best = Some((id, s));
                    }
                }
                Err(r) => e.add(r),
            }
        }
        let Some((id, scored)) = best else {
            return Err(e);
        };
        let view = NodeView {
            node: self.cluster.node(id),
            used: self.ledger.node(id),
            catalog: &self.cluster.catalog,
        };
        Ok((
            Placement {
                node: id,
                grants: fit::grants(view, req, &scored.gpus),
                cpu_milli: req.cpu_milli,
                memory_mib: req.memory_mib,
                class: tessera_core::placement::request_class(req),
                score: scored.score,
                terms: scored.terms.to_vec(),
            },
            e,
        ))
    }

    /// Whether a Kubernetes node of this name is mirrored.
    pub fn knows_node(&self, name: &str) -> bool {
        self.kube_nodes.contains_key(name)
    }

    /// Preemption check: the candidate nodes on which the pod would fit once the
    /// named victims (by UID) are gone. Victims we do not hold free nothing.
    pub fn preempt<'a>(
        &mut self,
        pod: &Pod,
        candidates: impl IntoIterator<Item = (&'a String, &'a crate::extender::wire::MetaVictims)>,
    ) -> Result<Vec<String>, RequestError> {
        self.refresh();
        let req = convert::pod_request(pod, &self.cluster.catalog)?;
        let mut kept = Vec::new();
        for (node, victims) in candidates {
            let Some(id) = self.cluster.node_id(node) else {
                continue;
            };
            if req.gpu == GpuAsk::None {
                kept.push(node.clone());
                continue;
            }
            let cp = self.ledger.checkpoint();
            for v in &victims.pods {
                if let Some(aid) = self
                    .held
                    .get(&v.uid)
                    .filter(|h| h.node == *node)
                    .and_then(|h| h.id)
                {
                    let _ = self.ledger.release(aid);
                }
            }
            let fits = self.score_node(id, &req).is_ok();
            if let Err(e) = self.ledger.rollback(&self.cluster, cp) {
                // Cannot happen with a balanced checkpoint; rebuild from the API objects to be safe.
                self.node_problems
                    .push(format!("preemption check on {node}: {e}"));
                self.dirty = true;
                self.refresh();
            }
            if fits {
                kept.push(node.clone());
            }
        }
        Ok(kept)
    }
}
