//! Watch events into the mirror: Nodes, GpuNodes and Pods as the streams
//! deliver them, and the holds (bound pods and reservations) they add to or
//! take from the ledger.

use crate::convert::{self};
use crate::hostfit::{self, HostAsk};
use k8s_openapi::api::core::v1::{Node as KubeNode, Pod};
use std::collections::HashMap;
use tessera_api::GpuNode;
use tessera_api::gpunode::ContainerDevices;
use tessera_core::allocation::{ANNOTATION, Allocation};
use tessera_core::placement::Placement;
use tessera_core::request::{GpuAsk, Request};

use super::{Block, Held, Mirror, Unread};

/// Whether two versions of a Node place pods alike (see [`Mirror::upsert_node`]).
fn same_node_for_placement(a: &KubeNode, b: &KubeNode) -> bool {
    let allocatable = |n: &KubeNode| n.status.as_ref().and_then(|s| s.allocatable.clone());
    convert::node_facts(a) == convert::node_facts(b) && allocatable(a) == allocatable(b)
}

/// The containers the kubelet reported holding GPUs (the agent's PodResources
/// report); `None` while the agent has not reported them (not the same as none).
fn held_containers(g: &GpuNode) -> Option<&[ContainerDevices]> {
    g.status
        .as_ref()
        .and_then(|s| s.pod_resources.as_ref())
        .map(|r| r.containers.as_slice())
}

/// Whether any of `a`'s GPUs has another health in `b`.
fn health_changed(a: &GpuNode, b: &GpuNode) -> bool {
    a.spec.gpus.iter().any(|g| {
        a.spec.health_of(g.index, a.status.as_ref()) != b.spec.health_of(g.index, b.status.as_ref())
    })
}

/// Whether going from GpuNode `old` to `new` may free room: the GPUs or their
/// health changed, or a container the kubelet listed holding GPUs is no
/// longer listed (the agent's PodResources report lags a pod's deletion: the
/// deletion alone left its GPUs held, and the pod that waited for them slept
/// out its backoff, up to 60 s, on a real 1.36 control plane).
fn may_free_room(old: &GpuNode, new: &GpuNode) -> bool {
    let now = held_containers(new).unwrap_or_default();
    old.spec != new.spec
        || held_containers(old)
            .unwrap_or_default()
            .iter()
            .any(|c| !now.contains(c))
        || health_changed(old, new)
}

/// Whether two versions of a GpuNode place pods alike (see [`Mirror::upsert_inventory`]):
/// the same GPUs, health and devices the kubelet reports held (when it read them aside).
fn same_inventory_for_placement(a: &GpuNode, b: &GpuNode) -> bool {
    a.spec == b.spec && held_containers(a) == held_containers(b) && !health_changed(a, b)
}

impl Mirror {
    /// A Node was added or changed. Only a change to what placement reads
    /// (labels, taints, cordon, readiness, allocatable) rebuilds the cluster;
    /// status heartbeats do not.
    /// Returns whether placement may have changed (a pass is worth running).
    pub fn upsert_node(&mut self, node: KubeNode) -> bool {
        let Some(name) = node.metadata.name.clone() else {
            return false;
        };
        let same = self
            .kube_nodes
            .get(&name)
            .is_some_and(|old| same_node_for_placement(old, &node));
        self.kube_nodes.insert(name, node);
        self.dirty |= !same;
        // Labels, taints, cordon, readiness or allocatable changed: it may
        // fit pods it did not (kube-scheduler requeues on such updates too).
        if !same {
            self.released += 1;
        }
        !same
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
    /// heartbeat period (free memory, timestamps); only a change to the GPUs
    /// themselves (spec) or to a GPU's health rebuilds the cluster. Any change
    /// restarts the node's staleness clock (see [`super::liveness`]).
    /// Returns whether placement may have changed: not for the agents' status
    /// republishing (83 a second at 5,000 nodes), which the standalone loop
    /// need not wake for, unless it lifts a staleness block.
    pub fn upsert_inventory(&mut self, gn: GpuNode) -> bool {
        let Some(name) = gn.metadata.name.clone() else {
            return false;
        };
        let old = self.inventory.remove(&name);
        let same = old
            .as_ref()
            .is_some_and(|old| same_inventory_for_placement(old, &gn));
        // A heartbeat is status churn, but one that ends a staleness block wakes a pass.
        let revived = self.saw_inventory(&name, old.as_ref(), &gn);
        if old.as_ref().is_none_or(|o| may_free_room(o, &gn)) || revived {
            self.released += 1;
        }
        self.inventory.insert(name, gn);
        self.dirty |= !same;
        if old.is_none() {
            self.learn_waiting();
        }
        !same || revived
    }

    pub fn remove_inventory(&mut self, name: &str) {
        if self.inventory.remove(name).is_some() {
            self.dirty = true;
        }
        self.forget_inventory_clock(name);
    }

    pub fn replace_inventory(&mut self, items: impl IntoIterator<Item = GpuNode>) {
        let old = std::mem::replace(
            &mut self.inventory,
            items
                .into_iter()
                .filter_map(|n| n.metadata.name.clone().map(|k| (k, n)))
                .collect(),
        );
        self.saw_inventory_list(&old);
        self.dirty = true;
        self.released += 1;
        self.learn_waiting();
    }

    /// A pod was added or changed.
    pub fn upsert_pod(&mut self, pod: Pod) {
        let uid = convert::pod_uid(&pod).to_string();
        if uid.is_empty() {
            return;
        }
        if convert::is_terminal(&pod) {
            let key = convert::pod_key(&pod);
            // The kubelet has its devices back: a report still listing it counts nothing.
            self.dirty |= self.reported.contains(&key);
            self.finished.insert(uid.clone(), key);
            self.pods.remove(&uid);
            self.unsee(&uid);
            self.release(&uid);
            return;
        }
        // A pod is learned on arrival, or (one without GPUs) once bound: only
        // those two events can make it learnable, so the updates in between
        // (status, mostly) skip learning.
        let arrives_or_binds = self.pods.get(&uid).is_none_or(|old| {
            convert::pod_node(old).is_none() && convert::pod_node(&pod).is_some()
        });
        if arrives_or_binds {
            self.learn_pods([&pod]);
        }
        let node = convert::pod_node(&pod).map(str::to_string);
        // The grant on the server, against the one we hold (what our Binding
        // carried, or what the pod carried when it was taken up).
        let landed = annotation_of(&pod).map(str::to_string);
        self.pods.insert(uid.clone(), pod);
        let Some(node) = node else { return };
        match self.held.get_mut(&uid) {
            Some(h) if h.node == node && landed == h.annotation => {
                h.bound = true;
                h.expires = None;
            }
            Some(_) => {
                // Bound somewhere other than we reserved, or with another grant
                // than we hold (an earlier bind of ours landed late, the
                // annotation was changed): the API server wins.
                self.release(&uid);
                self.adopt(&uid);
            }
            None => self.adopt(&uid),
        }
    }

    /// A pod was deleted.
    pub fn remove_pod(&mut self, uid: &str) {
        let key = self
            .pods
            .get(uid)
            .map(convert::pod_key)
            .or_else(|| self.finished.get(uid).cloned());
        self.finished.remove(uid);
        self.dirty |= key.is_some_and(|k| self.reported.contains(&k));
        self.pods.remove(uid);
        self.unsee(uid);
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
        // Pods new to us are learned oldest first, before they are taken up;
        // finished ones are not (learned on arrival, or never seen arrive):
        // they would be learned again on every relist.
        self.learn_pods(fresh.values().filter(|p| !convert::is_terminal(p)));
        // Which pods have finished is read again below; what the reports count may change.
        self.finished.clear();
        self.dirty |= !self.reported.is_empty();
        self.pods.clear();
        let mut uids: Vec<String> = fresh.keys().cloned().collect();
        uids.sort();
        let mut fresh = fresh;
        for u in uids {
            if let Some(p) = fresh.remove(&u) {
                self.upsert_pod(p);
            }
        }
        self.forget_gone();
    }

    /// Takes up a bound pod found in the API: its signed allocation, or CPU and memory only.
    pub(super) fn adopt(&mut self, uid: &str) {
        let Some(pod) = self.pods.get(uid) else {
            return;
        };
        let Some(node) = convert::pod_node(pod).map(str::to_string) else {
            return;
        };
        let key = convert::pod_key(pod);
        let mut problem = None;
        let asks = convert::pod_asks(pod, &self.base_catalog);
        let mut request = match asks.request {
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
        // A pod asking GPUs without a grant we can read holds GPUs we did not
        // give (another scheduler or device plugin), or under a grant signed
        // with another key: the node agent's report says which, until then its
        // node takes nothing new. One whose annotation never verified and that
        // got no GPU fails the kubelet's admission and ends.
        let unread = match (&allocation, &problem) {
            (Some(_), _) => None,
            _ if !convert::asks_gpu_device(pod) => None,
            (None, Some(p)) if has_annotation(pod) => Some(Unread::Invalid(p.clone())),
            (None, _) => Some(Unread::NoGrant),
        };
        let landed = annotation_of(pod).map(str::to_string);
        if allocation.is_none() {
            // Bound without our decision: the ledger gets its host resources; its
            // GPUs, if any, come from the node agent's report.
            request.gpu = GpuAsk::None;
        }
        let host = asks.host.unwrap_or_else(|e| {
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
                annotation: landed,
                problem,
                host,
                expires: None,
                unread: unread.clone(),
                sent: false,
            },
        );
        if unread.is_some() {
            // What it holds is counted (or its node blocked) by the rebuild.
            self.dirty = true;
        }
        if !self.dirty {
            self.apply_held(uid);
        }
    }

    pub(super) fn apply_held(&mut self, uid: &str) {
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
        // A grant made earlier is counted whatever its GPUs' health now: a GPU
        // that turned unhealthy under a running pod is still held by it.
        let result =
            match placement {
                Ok(p) => self.ledger.apply_existing(&self.cluster, &p).map_err(|e| {
                    Block::Overcommitted {
                        pod: h.pod.clone(),
                        problem: e.to_string(),
                    }
                }),
                Err(convert::ConvertError::GpuGone { pod, uuid, .. }) => {
                    Err(Block::GrantedGpuGone { pod, uuid })
                }
                Err(e) => Err(Block::Overcommitted {
                    pod: h.pod.clone(),
                    problem: e.to_string(),
                }),
            };
        match result {
            Ok(id) => {
                if let Some(h) = self.held.get_mut(uid) {
                    h.id = Some(id);
                }
            }
            Err(block) => {
                let (pod, node_name, granted) =
                    (h.pod.clone(), h.node.clone(), h.allocation.is_some());
                self.node_problems.push(format!("pod {pod}: {block}"));
                if granted {
                    // Its CPU and memory still count; what it holds of the GPUs is
                    // not in the ledger, so they would look free: block the node.
                    let host_only = Placement {
                        node,
                        cpu_milli: h.request.cpu_milli,
                        memory_mib: h.request.memory_mib,
                        ..Placement::default()
                    };
                    let id = self.ledger.apply_existing(&self.cluster, &host_only).ok();
                    if let Some(h) = self.held.get_mut(uid) {
                        h.id = id;
                    }
                    self.blocked.entry(node).or_insert(block);
                    self.host_changed(&node_name);
                }
            }
        }
    }

    pub(super) fn insert_held(&mut self, uid: String, h: Held) {
        hostfit::account(
            self.host_used.entry(h.node.clone()).or_default(),
            &h.host,
            true,
        );
        self.host_changed(&h.node);
        if let Some(old) = self.held.insert(uid, h) {
            // Replaced: what the old hold took is given back, ledger included.
            self.unaccount(&old);
            if let Some(id) = old.id
                && !self.dirty
            {
                let _ = self.ledger.release(id);
            }
            self.dirty |= old.unread.is_some();
        }
    }

    pub(super) fn unaccount(&mut self, h: &Held) {
        if let Some(used) = self.host_used.get_mut(&h.node) {
            hostfit::account(used, &h.host, false);
        }
        self.host_changed(&h.node);
    }

    /// The node's countable resources changed: its cached verdicts are stale
    /// (they include the host check), whether or not the ledger changed too.
    pub(super) fn host_changed(&mut self, node: &str) {
        let Some(id) = self.by_name.get(node).copied() else {
            return;
        };
        self.verdicts.forget(id);
    }

    /// How many times room may have been freed so far (a holding released, a
    /// GpuNode or Node change that may fit more): a change of it wakes pods
    /// that wait out a backoff.
    pub fn released(&self) -> u64 {
        self.released
    }

    pub(super) fn release(&mut self, uid: &str) {
        if let Some(h) = self.held.remove(uid) {
            self.released += 1;
            self.unaccount(&h);
            if let Some(id) = h.id
                && !self.dirty
            {
                let _ = self.ledger.release(id);
            }
            // A pod leaving a blocked node may make it consistent, and one whose
            // GPUs came from the report changes what is counted: replay everything.
            self.dirty |= h.unread.is_some();
            if self
                .cluster
                .node_id(&h.node)
                .is_some_and(|n| self.blocked.contains_key(&n))
            {
                self.dirty = true;
            }
        }
    }
}

/// The pod's allocation annotation as the API server has it.
pub(super) fn annotation_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .map(String::as_str)
}

fn has_annotation(pod: &Pod) -> bool {
    annotation_of(pod).is_some()
}
