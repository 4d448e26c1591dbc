//! Queues in the mirror: `GpuQueue` objects and the namespaces' queue labels,
//! the validated queue tree, what each queue's pods hold, and quota admission.
//!
//! - A namespace joins a queue with the label `tessera.io/queue`; a pod may name
//!   another queue with the annotation `tessera.io/queue` only if its namespace's
//!   annotation `tessera.io/queues` lists it. A pod in a namespace without a
//!   queue is not subject to quotas.
//! - Usage is counted from the held pods (bound, or reserved while their bind is
//!   in flight) by their real grants in GPU-equivalents, so a restart counts the
//!   same; GPUs held through DRA claims count too, as their holder computes
//!   them ([`Mirror::set_claim_holdings`]). An ask is checked at the most it
//!   can count on any GPU model it may land on
//!   ([`GpuEquivalents::request_upper_bound`]), so no placement takes a queue
//!   past its quota.
//! - A `GpuQueue` whose spec cannot be read, or a tree that does not hold
//!   together (a cycle, an unknown parent, children guaranteed more than their
//!   parent), is reported as a problem and the last tree that held is kept:
//!   a typo in one queue never lifts every quota.
//! - Where Kueue admits workloads (`--trust-kueue-admission`), a pod of a
//!   workload Kueue admitted ([`crate::kueue::admitted_by_kueue`]) is not
//!   judged again by its `GpuQueue`'s quota, since Kueue's ClusterQueue
//!   already reserved that quota for it: it is admitted (as borrowing when
//!   beyond the queue's guarantee or over its quota), and what it holds still
//!   counts in its queue's usage, so the queue's other pods see it. Without
//!   the flag both gates apply, which refuses a pod Kueue admitted once its
//!   GpuQueue is full (counted twice, by two quotas).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use tessera_api::GpuQueue;
use tessera_api::queue::{ALLOWED_QUEUES, QUEUE_ANNOTATION, QUEUE_LABEL, QueueResources};
use tessera_core::queue::admit::{Admission, QueueUsage, admit};
use tessera_core::queue::fair::{UsageHistory, fair_shares, order_key};
use tessera_core::queue::{GpuEquivalents, QueueId, QueueSpec, QueueTree, Resources};
use tessera_core::request::{self, Request};
use tokio::time::Instant;

use super::Mirror;
use crate::convert;

/// What a namespace says about queues.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct NamespaceQueues {
    queue: Option<String>,
    allowed: Vec<String>,
}

/// The queue state the mirror keeps.
#[derive(Debug, Default)]
pub(super) struct Queues {
    objects: BTreeMap<String, GpuQueue>,
    namespaces: BTreeMap<String, NamespaceQueues>,
    /// The last tree that held together; `None` before the first (no quotas).
    pub(super) tree: Option<QueueTree>,
    problems: Vec<String>,
    stale: bool,
    pub(super) ge: GpuEquivalents,
    /// Usage as of (ledger cursor, mirror generation, queue version).
    usage: Option<((u64, u64, u64), QueueUsage)>,
    version: u64,
    /// Time-decayed usage for the fair order, when configured (see [`Mirror::set_usage_history`]).
    history: Option<History>,
    /// Milli GPU-equivalents the pods' DRA claims hold, by pod uid (see
    /// [`Mirror::set_claim_holdings`]).
    claims: BTreeMap<String, u64>,
    /// Pods of workloads Kueue admitted pass the quota gate (see
    /// [`Mirror::set_trust_kueue`]).
    trust_kueue: bool,
}

/// Recent usage per queue, blended into the usage the fair order reads.
#[derive(Debug)]
struct History {
    decayed: UsageHistory,
    weight: f64,
    origin: Instant,
    /// The usage seen at the last fold (it held until now).
    last: Vec<Resources>,
    /// The tree's size when `decayed` was made (a new tree starts over).
    queues: usize,
}

/// One queue as of now (see [`Mirror::queue_report`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueFigures {
    pub name: String,
    pub parent: Option<String>,
    pub guaranteed: Resources,
    pub allocated: Resources,
    pub deserved: Resources,
    pub borrowed: Resources,
    /// Waiting pods whose queue this is (leaves only: a parent's pods are its children's).
    pub pending_pods: usize,
}

/// The verdict on one pod's ask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QuotaCheck {
    /// The pod is in no queue: no quota applies.
    NoQueue,
    /// Within its queue's quota; `borrowing` when beyond the guarantee (reclaimable).
    Admitted { queue: String, borrowing: bool },
    /// Not now, and why (a sentence naming the queue).
    Refused(String),
}

/// Reads a queue's spec; errors name the queue and the field.
pub fn queue_spec(q: &GpuQueue) -> Result<QueueSpec, String> {
    let name = q.metadata.name.clone().unwrap_or_default();
    let read = |field: &str, r: &QueueResources, unset: u64| -> Result<Resources, String> {
        let at = |f: &str| format!("gpuqueue {name}: spec.{field}.{f}");
        let parse = |f: &str, v: &Option<String>, mib: bool| -> Result<u64, String> {
            match v {
                None => Ok(unset),
                Some(v) if mib => request::parse_memory_mib(&at(f), v).map_err(|e| e.to_string()),
                Some(v) => request::parse_cpu_milli(&at(f), v).map_err(|e| e.to_string()),
            }
        };
        Ok(Resources::new(
            parse("gpus", &r.gpus, false)?,
            parse("cpu", &r.cpu, false)?,
            parse("memory", &r.memory, true)?,
        ))
    };
    let s = &q.spec;
    Ok(QueueSpec {
        name: name.clone(),
        parent: s.parent.clone().filter(|p| !p.is_empty()),
        guaranteed: read("guaranteed", &s.guaranteed, 0)?,
        limit: s
            .limit
            .as_ref()
            .map(|l| read("limit", l, u64::MAX))
            .transpose()?,
        weight: s.weight.unwrap_or(1),
        lend: s.lend.unwrap_or(true),
        borrow: s.borrow.unwrap_or(true),
    })
}

impl Queues {
    fn rebuild(&mut self) {
        if !self.stale {
            return;
        }
        self.stale = false;
        self.version += 1;
        self.problems.clear();
        if self.objects.is_empty() {
            self.tree = None;
            return;
        }
        let mut specs = Vec::with_capacity(self.objects.len());
        for q in self.objects.values() {
            match queue_spec(q) {
                Ok(s) => specs.push(s),
                Err(e) => self.problems.push(e),
            }
        }
        if !self.problems.is_empty() {
            self.problems.push(
                "queues: keeping the last valid queue tree until every GpuQueue reads".into(),
            );
            return;
        }
        match QueueTree::new(specs) {
            Ok(t) => self.tree = Some(t),
            Err(e) => self
                .problems
                .push(format!("queues: {e}; keeping the last valid queue tree")),
        }
    }

    /// The queue a pod belongs to: `Ok(None)` when it is in none.
    pub(super) fn queue_of(&self, pod: &Pod) -> Result<Option<QueueId>, String> {
        let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
        let asked = pod
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(QUEUE_ANNOTATION))
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty());
        self.queue_for(ns, asked, &convert::pod_key(pod))
    }

    /// The queue of a pod in namespace `ns` that asks for `asked` (its annotation).
    fn queue_for(
        &self,
        ns: &str,
        asked: Option<String>,
        key: &str,
    ) -> Result<Option<QueueId>, String> {
        let Some(tree) = &self.tree else {
            return Ok(None);
        };
        let nsq = self.namespaces.get(ns).cloned().unwrap_or_default();
        let name = match asked {
            Some(q) if nsq.queue.as_deref() == Some(q.as_str()) || nsq.allowed.contains(&q) => q,
            Some(q) => {
                return Err(format!(
                    "pod {key} asks for queue {q}, which namespace {ns} does not allow (its annotation {ALLOWED_QUEUES} lists the queues it may name)"
                ));
            }
            None => match nsq.queue {
                Some(q) => q,
                None => return Ok(None),
            },
        };
        let id = tree
            .id(&name)
            .ok_or_else(|| format!("queue {name} does not exist (no GpuQueue of that name)"))?;
        if !tree.is_leaf(id) {
            return Err(format!(
                "queue {name} has child queues; pods go in queues without children"
            ));
        }
        Ok(Some(id))
    }
}

impl Mirror {
    /// How GPU models count against quotas (factor 1.0 each until set).
    pub fn set_gpu_equivalents(&mut self, ge: GpuEquivalents) {
        self.queues.ge = ge;
        self.queues.usage = None;
    }

    /// Whether pods of workloads Kueue admitted pass the quota gate (off
    /// until set; see the module's documentation).
    pub fn set_trust_kueue(&mut self, trust: bool) {
        self.queues.trust_kueue = trust;
    }

    /// How GPU models count against quotas.
    pub fn gpu_equivalents(&self) -> &GpuEquivalents {
        &self.queues.ge
    }

    /// What the pods' allocated DRA claims hold now, in milli GPU-equivalents
    /// by pod uid: counted in their queues' usage as grants are. Whoever holds
    /// the DRA view computes it ([`crate::dra::quota::pod_holdings`]), so the
    /// mirror never reads the view (whose lock comes after the mirror's).
    pub fn set_claim_holdings(&mut self, held: BTreeMap<String, u64>) {
        if self.queues.claims != held {
            self.queues.claims = held;
            self.queues.version += 1;
        }
    }

    /// What pod `uid`'s DRA claims hold, milli GPU-equivalents, as last told
    /// ([`Mirror::set_claim_holdings`], [`Mirror::hold_claims`]).
    pub fn claim_holding(&self, uid: &str) -> u64 {
        self.queues.claims.get(uid).copied().unwrap_or(0)
    }

    /// Pod `uid`'s claims now hold `gpu_eq_milli` (decided, before the
    /// watch shows them; the next [`Mirror::set_claim_holdings`] replaces it).
    pub fn hold_claims(&mut self, uid: &str, gpu_eq_milli: u64) {
        if self.queues.claims.get(uid) != Some(&gpu_eq_milli) {
            self.queues.claims.insert(uid.to_string(), gpu_eq_milli);
            self.queues.version += 1;
        }
    }

    pub fn replace_queues(&mut self, items: impl IntoIterator<Item = GpuQueue>) {
        self.queues.objects = items
            .into_iter()
            .filter_map(|q| q.metadata.name.clone().map(|n| (n, q)))
            .collect();
        self.queues.stale = true;
    }

    pub fn upsert_queue(&mut self, q: GpuQueue) {
        if let Some(name) = q.metadata.name.clone() {
            let same = self
                .queues
                .objects
                .get(&name)
                .is_some_and(|old| old.spec == q.spec);
            self.queues.objects.insert(name, q);
            self.queues.stale |= !same;
        }
    }

    pub fn remove_queue(&mut self, name: &str) {
        if self.queues.objects.remove(name).is_some() {
            self.queues.stale = true;
        }
    }

    pub fn replace_namespaces(&mut self, items: impl IntoIterator<Item = Namespace>) {
        self.queues.namespaces = items.into_iter().filter_map(namespace_queues).collect();
        self.queues.version += 1;
    }

    pub fn upsert_namespace(&mut self, ns: Namespace) {
        if let Some((name, q)) = namespace_queues(ns)
            && self.queues.namespaces.get(&name) != Some(&q)
        {
            self.queues.namespaces.insert(name, q);
            self.queues.version += 1;
        }
    }

    pub fn remove_namespace(&mut self, name: &str) {
        if self.queues.namespaces.remove(name).is_some() {
            self.queues.version += 1;
        }
    }

    /// Every `GpuQueue` object: name, resourceVersion and the status it carries.
    pub fn queue_objects(&self) -> Vec<(String, String, Option<tessera_api::GpuQueueStatus>)> {
        self.queues
            .objects
            .iter()
            .map(|(n, q)| {
                (
                    n.clone(),
                    q.metadata.resource_version.clone().unwrap_or_default(),
                    q.status.clone(),
                )
            })
            .collect()
    }

    /// The queue tree in force, if any queue is defined.
    pub fn queue_tree(&mut self) -> Option<&QueueTree> {
        self.queues.rebuild();
        self.queues.tree.as_ref()
    }

    /// Things wrong with the queue configuration.
    pub fn queue_problems(&mut self) -> Vec<String> {
        self.queues.rebuild();
        self.queues.problems.clone()
    }

    /// The queue problems found at the last rebuild (for [`Mirror::problems`], which reads only).
    pub(super) fn queues_problems_as_of_now(&self) -> Vec<String> {
        self.queues.problems.clone()
    }

    /// What every queue's pods hold now (held pods: bound, or reserved), except
    /// `skip_uid`'s (a pod being re-judged does not count against itself).
    pub fn queue_usage(&mut self, skip_uid: Option<&str>) -> Option<QueueUsage> {
        self.refresh();
        self.queues.rebuild();
        let tree = self.queues.tree.as_ref()?;
        let key = (
            self.ledger.change_cursor(),
            self.generation,
            self.queues.version,
        );
        if skip_uid.is_none()
            && let Some((k, u)) = &self.queues.usage
            && *k == key
        {
            return Some(u.clone());
        }
        let mut usage = QueueUsage::new(tree);
        for (uid, h) in &self.held {
            if Some(uid.as_str()) == skip_uid {
                continue;
            }
            let Some(p) = h.id.and_then(|id| self.ledger.allocation(id)) else {
                continue;
            };
            let Some(q) = self.held_queue_id(uid, h) else {
                continue;
            };
            usage.add(tree, q, self.queues.ge.placement(&self.cluster, p));
        }
        for (uid, milli) in &self.queues.claims {
            if Some(uid.as_str()) == skip_uid {
                continue;
            }
            let Some(q) = self
                .pods
                .get(uid)
                .and_then(|pod| self.queues.queue_of(pod).ok().flatten())
            else {
                continue;
            };
            usage.add(tree, q, Resources::new(*milli, 0, 0));
        }
        if skip_uid.is_none() {
            self.queues.usage = Some((key, usage.clone()));
        }
        Some(usage)
    }

    /// The queue a held pod counts against: from the pod object, or (a reservation
    /// made before the watch showed the pod) its namespace from the key.
    fn held_queue_id(&self, uid: &str, h: &super::Held) -> Option<QueueId> {
        let queue = match self.pods.get(uid) {
            Some(pod) => self.queues.queue_of(pod),
            None => {
                let ns = h.pod.split_once('/').map_or("default", |(ns, _)| ns);
                self.queues.queue_for(ns, None, &h.pod)
            }
        };
        queue.ok().flatten()
    }

    /// The name of the queue a held pod counts against, as quota counts it (none
    /// without queues; the tree as of the last [`Mirror::queue_tree`]).
    pub(crate) fn held_queue(&self, uid: &str, h: &super::Held) -> Option<&str> {
        let tree = self.queues.tree.as_ref()?;
        self.held_queue_id(uid, h)
            .map(|q| tree.spec(q).name.as_str())
    }

    /// Each pod's queue (if any), every queue's usage, and demand (usage plus
    /// the asks of `pods`, which are waiting), for fair shares.
    fn demand(
        &mut self,
        pods: &[&Pod],
    ) -> Option<(Vec<Option<QueueId>>, QueueUsage, Vec<Resources>)> {
        let usage = self.queue_usage(None)?;
        let queues: Vec<Option<QueueId>> = pods
            .iter()
            .map(|p| self.queues.queue_of(p).ok().flatten())
            .collect();
        let mut demand: Vec<Resources> = usage.all().to_vec();
        for (p, q) in pods.iter().zip(&queues) {
            let (Some(q), Ok(req)) = (q, convert::pod_request(p, &self.cluster.catalog)) else {
                continue;
            };
            demand[usize::from(q.0)] += Resources::new(
                self.queues.ge.request_upper_bound(&self.cluster, &req),
                req.cpu_milli,
                req.memory_mib,
            );
        }
        Some((queues, usage, demand))
    }

    /// The order in which `pods` (waiting) should be tried, by their queues'
    /// fair shares: each pod's [`order_key`] (lower first; empty for a pod in no
    /// queue), or `None` when no queue is defined. Demand is what each queue
    /// holds plus its waiting pods' asks.
    pub fn queue_order(&mut self, pods: &[Pod]) -> Option<Vec<Vec<f64>>> {
        let refs: Vec<&Pod> = pods.iter().collect();
        let (queues, usage, demand) = self.demand(&refs)?;
        let tree = self.queues.tree.as_ref()?;
        let capacity = self.queues.ge.capacity(&self.cluster);
        let shares = fair_shares(tree, capacity, &demand);
        // With usage history, a queue that used much recently orders as if it
        // still held part of it, and yields first.
        let ordered_by: Vec<Resources> = match self.queues.history.as_mut() {
            None => usage.all().to_vec(),
            Some(h) => {
                if h.queues != tree.len() {
                    h.decayed = UsageHistory::new(tree.len(), h.decayed.half_life_s());
                    h.queues = tree.len();
                    h.last = usage.all().to_vec();
                }
                let now_s = h.origin.elapsed().as_secs();
                h.decayed.advance(now_s, &h.last);
                h.last = usage.all().to_vec();
                tree.ids()
                    .map(|q| h.decayed.blended(q, &usage.of(q), h.weight))
                    .collect()
            }
        };
        Some(
            queues
                .iter()
                .map(|q| q.map_or_else(Vec::new, |q| order_key(tree, &ordered_by, &shares, q)))
                .collect(),
        )
    }

    /// Orders queues by usage blended with their time-decayed usage: `(1 − w)·now
    /// + w·recent mean`, the mean decaying with `half_life` (off until called).
    pub fn set_usage_history(&mut self, half_life: std::time::Duration, weight: f64) {
        let n = self.queues.tree.as_ref().map_or(0, QueueTree::len);
        self.queues.history = Some(History {
            decayed: UsageHistory::new(n, half_life.as_secs()),
            weight: weight.clamp(0.0, 1.0),
            origin: Instant::now(),
            last: vec![Resources::ZERO; n],
            queues: n,
        });
    }

    /// Every queue as of now: guarantee, holdings, fair share, borrowed amount
    /// and waiting pods (for metrics, `GpuQueue` status and the operator's view).
    pub fn queue_report(&mut self) -> Vec<QueueFigures> {
        if self.queue_tree().is_none() {
            // No GpuQueue: nothing to report, and no copy of every waiting pod
            // (10,000 of them held the lock for ~150 ms on every scrape and
            // every web view tick).
            return Vec::new();
        }
        let waiting: Vec<Pod> = self.waiting_pods().cloned().collect();
        let refs: Vec<&Pod> = waiting.iter().collect();
        let Some((queues, usage, demand)) = self.demand(&refs) else {
            return Vec::new();
        };
        let Some(tree) = self.queues.tree.as_ref() else {
            return Vec::new();
        };
        let capacity = self.queues.ge.capacity(&self.cluster);
        let shares = fair_shares(tree, capacity, &demand);
        tree.ids()
            .map(|q| {
                let s = tree.spec(q);
                let held = usage.of(q);
                QueueFigures {
                    name: s.name.clone(),
                    parent: s.parent.clone(),
                    guaranteed: s.guaranteed,
                    allocated: held,
                    deserved: shares.deserved[usize::from(q.0)],
                    borrowed: held.saturating_sub(&s.guaranteed),
                    pending_pods: queues.iter().filter(|x| **x == Some(q)).count(),
                }
            })
            .collect()
    }

    /// May `pod` (asking `req`) take more of its queue's quota now?
    pub fn quota(&mut self, pod: &Pod, req: &Request) -> QuotaCheck {
        self.quota_with_claims(pod, req, 0)
    }

    /// [`Mirror::quota`] for a pod whose DRA claims will also take
    /// `claims_gpu_eq_milli` (its claims already held are not counted against
    /// it: a pod being re-judged does not count against itself).
    pub fn quota_with_claims(
        &mut self,
        pod: &Pod,
        req: &Request,
        claims_gpu_eq_milli: u64,
    ) -> QuotaCheck {
        self.refresh();
        self.queues.rebuild();
        let queue = match self.queues.queue_of(pod) {
            Ok(Some(q)) => q,
            Ok(None) => return QuotaCheck::NoQueue,
            Err(e) => return QuotaCheck::Refused(e),
        };
        let uid = convert::pod_uid(pod).to_string();
        let skip = (self.held.contains_key(&uid) || self.queues.claims.contains_key(&uid))
            .then_some(uid.as_str());
        let Some(usage) = self.queue_usage(skip) else {
            return QuotaCheck::NoQueue;
        };
        let Some(tree) = self.queues.tree.as_ref() else {
            return QuotaCheck::NoQueue;
        };
        let ask = Resources::new(
            self.queues.ge.request_upper_bound(&self.cluster, req) + claims_gpu_eq_milli,
            req.cpu_milli,
            req.memory_mib,
        );
        let capacity = self.queues.ge.capacity(&self.cluster);
        let name = tree.spec(queue).name.clone();
        let admission = admit(tree, &usage, &capacity, queue, &ask);
        if self.queues.trust_kueue && crate::kueue::admitted_by_kueue(pod) {
            // Kueue's quota admitted it; ours only counts it.
            return QuotaCheck::Admitted {
                queue: name,
                borrowing: admission != Admission::Guaranteed,
            };
        }
        match admission {
            Admission::Guaranteed => QuotaCheck::Admitted {
                queue: name,
                borrowing: false,
            },
            Admission::Borrowing => QuotaCheck::Admitted {
                queue: name,
                borrowing: true,
            },
            Admission::Refused(r) => QuotaCheck::Refused(format!(
                "{r} (asks {} GPU-equivalents, {} CPU, {} MiB; holds {})",
                milli(ask.gpu_eq_milli),
                milli(ask.cpu_milli),
                ask.memory_mib,
                milli(usage.of(queue).gpu_eq_milli)
            )),
        }
    }
}

impl Mirror {
    /// How many replicas of `pod` (asking `req`) its queue admits one after
    /// another now, at most `limit`: each admitted one is counted against the
    /// queue at the GPU-equivalents it may take at most, as admission counts the
    /// next pod. `Ok(None)`: no queue governs the pod; `Err`: not even one (the
    /// sentence [`Mirror::quota`] gives).
    pub fn quota_replicas(
        &mut self,
        pod: &Pod,
        req: &Request,
        limit: u32,
    ) -> Result<Option<u32>, String> {
        let queue = match self.quota(pod, req) {
            QuotaCheck::Refused(why) => return Err(why),
            QuotaCheck::NoQueue => return Ok(None),
            QuotaCheck::Admitted { .. } => match self.queues.queue_of(pod) {
                Ok(Some(q)) => q,
                Ok(None) => return Ok(None),
                Err(e) => return Err(e),
            },
        };
        let Some(mut usage) = self.queue_usage(None) else {
            return Ok(None);
        };
        let Some(tree) = self.queues.tree.as_ref() else {
            return Ok(None);
        };
        let ask = Resources::new(
            self.queues.ge.request_upper_bound(&self.cluster, req),
            req.cpu_milli,
            req.memory_mib,
        );
        let capacity = self.queues.ge.capacity(&self.cluster);
        let mut n = 0;
        while n < limit {
            if let Admission::Refused(_) = admit(tree, &usage, &capacity, queue, &ask) {
                break;
            }
            usage.add(tree, queue, ask);
            n += 1;
        }
        Ok(Some(n))
    }
}

fn milli(v: u64) -> String {
    if v.is_multiple_of(1000) {
        (v / 1000).to_string()
    } else {
        format!("{:.3}", v as f64 / 1000.0)
    }
}

fn namespace_queues(ns: Namespace) -> Option<(String, NamespaceQueues)> {
    let name = ns.metadata.name?;
    let queue = ns
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(QUEUE_LABEL))
        .cloned()
        .filter(|q| !q.is_empty());
    let allowed = ns
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ALLOWED_QUEUES))
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    Some((name, NamespaceQueues { queue, allowed }))
}
