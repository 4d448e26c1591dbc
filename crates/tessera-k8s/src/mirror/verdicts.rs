//! The extender's and the standalone loop's judgements of nodes: per request
//! shape, each node's verdict from the core's one cache
//! ([`tessera_core::judge::Verdicts`]), kept as of the ledger's change cursor.
//!
//! A verdict here is the core's judge after the checks only Kubernetes has: the
//! node's countable resources (pod slots, device-plugin resources; part of the
//! shape's key, and forgotten when the pods held on the node change), a node
//! blocked until the next rebuild or until its agent reports again (forgotten
//! when that changes), a node with no GPU inventory. A rebuild of the cluster,
//! or of a learning policy, drops every shape.

use crate::convert::{self, NodeFacts};
use crate::hostfit::{self, HostAsk};
use k8s_openapi::api::core::v1::Pod;
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock};
use tessera_core::explain::{Explanation, Reason};
use tessera_core::fit::NodeView;
use tessera_core::judge::{self, ShapeCache, Verdict, Verdicts};
use tessera_core::placement::{Placement, Scored};
use tessera_core::request::{GpuAsk, Request, RequestError};
use tessera_core::{Cluster, Ledger, NodeId, Policy};

use super::Mirror;

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

/// Most request shapes whose verdicts are kept.
pub(super) const MAX_SHAPES: usize = 128;

/// What a shape's verdicts are kept under: the whole request (host memory
/// included: the extender answers node by node) and the node resources the pod
/// counts against.
pub(super) type ShapeKey = (Request, HostAsk);

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

/// What judging a node reads, borrowed apart from the verdict cache.
pub(super) struct Judging<'m> {
    cluster: &'m Cluster,
    ledger: &'m Ledger,
    policy: &'m dyn Policy,
    blocked: &'m FxHashMap<NodeId, super::Block>,
    /// Nodes, by name, whose agent stopped reporting (see [`super::liveness`]).
    stale: &'m std::collections::HashMap<String, super::Block>,
    facts: &'m [NodeFacts],
    host_used: &'m FxHashMap<String, BTreeMap<String, u64>>,
    rng: &'m mut SmallRng,
}

impl Judging<'_> {
    /// The core's judge on node `id`, after the checks of a node blocked (until
    /// the next rebuild, or until its agent reports again) and of a GPU request
    /// on a node with no GPU inventory.
    pub(super) fn node(&mut self, id: NodeId, req: &Request) -> Result<Scored, Reason> {
        let stale = || {
            (!self.stale.is_empty())
                .then(|| self.stale.get(&self.cluster.node(id).name))
                .flatten()
        };
        if let Some(why) = self.blocked.get(&id).or_else(stale) {
            return Err(Reason::Excluded {
                why: why.to_string(),
            });
        }
        if req.gpu != GpuAsk::None && self.cluster.node(id).gpus.is_empty() {
            return Err(Reason::Excluded {
                why: "no GPUs known (no GpuNode inventory)".into(),
            });
        }
        judge::judge(
            self.policy,
            NodeView::of(self.cluster, self.ledger, id),
            req,
            self.rng,
        )
    }

    /// Node `id`'s verdict on a pod asking `req` and `host`: the node's countable
    /// resources first (device-plugin slots and the pod count: preemption can
    /// free them), then [`Judging::node`].
    pub(super) fn verdict(&mut self, id: NodeId, req: &Request, host: &HostAsk) -> Verdict {
        if let Some(f) = self.facts.get(id.0 as usize) {
            hostfit::check(&f.allocatable, self.host_used.get(&f.name), host)
                .map_err(|why| Reason::NodeResource { why })?;
        }
        self.node(id, req).map(|s| s.score)
    }

    /// `key`'s verdicts brought up to date, with `ids` judged (every node when `None`).
    fn verdicts<'v>(
        &mut self,
        cache: &'v mut Verdicts<ShapeKey>,
        key: &ShapeKey,
        ids: Option<&[Option<NodeId>]>,
    ) -> &'v ShapeCache {
        let (req, host) = key;
        let reuse = judge::cacheable(self.policy, req);
        let shape = cache.shape(key.clone(), self.ledger, self.cluster.len(), reuse);
        let mut judge = |id: NodeId| -> Verdict { self.verdict(id, req, host) };
        match ids {
            Some(ids) => shape.judge_each(ids.iter().flatten().copied(), &mut judge),
            None => shape.judge_all(&mut judge),
        }
        shape
    }
}

/// A node's CPU and memory: what it has and what is free now (the mirror's
/// holds counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRoom {
    pub cpu_milli: u64,
    pub memory_mib: u64,
    pub free_cpu_milli: u64,
    pub free_memory_mib: u64,
}

/// The nodes a DRA pod's host resources fit (with their host room), and the
/// policy to choose its devices by.
pub type HostFitting<'a> = (Vec<(NodeId, NodeFacts, HostRoom)>, &'a dyn Policy);

impl Mirror {
    /// The verdict cache apart from what judging reads, so both can be borrowed at once.
    fn split(&mut self) -> (&mut Verdicts<ShapeKey>, Judging<'_>) {
        (
            &mut self.verdicts,
            Judging {
                cluster: &self.cluster,
                ledger: &self.ledger,
                policy: self.policy.as_ref(),
                blocked: &self.blocked,
                stale: &self.stale,
                facts: &self.facts,
                host_used: &self.host_used,
                rng: &mut self.rng,
            },
        )
    }

    /// What judging reads, over `ledger` and `host_used` in place of the
    /// mirror's own (an estimate's scratch copies), drawing from `rng`.
    pub(super) fn judging_over<'m>(
        &'m self,
        ledger: &'m Ledger,
        host_used: &'m FxHashMap<String, BTreeMap<String, u64>>,
        rng: &'m mut SmallRng,
    ) -> Judging<'m> {
        Judging {
            cluster: &self.cluster,
            ledger,
            policy: self.policy.as_ref(),
            blocked: &self.blocked,
            stale: &self.stale,
            facts: &self.facts,
            host_used,
            rng,
        }
    }

    /// The judge on one node, without the node-resource check (a bind checks
    /// those apart, to say which refused).
    pub(super) fn score_node(&mut self, id: NodeId, req: &Request) -> Result<Scored, Reason> {
        self.split().1.node(id, req)
    }

    /// The verdicts of `key`'s shape, with `ids` judged (every node when `None`).
    fn judged(&mut self, key: &ShapeKey, ids: Option<&[Option<NodeId>]>) -> &ShapeCache {
        let (cache, mut judging) = self.split();
        judging.verdicts(cache, key, ids)
    }

    pub(super) fn ids_of(&self, names: &[&str]) -> Vec<Option<NodeId>> {
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
        self.follow_supply();
        let mut out = FilterOutcome::default();
        let asks = convert::pod_asks(pod, &self.cluster.catalog);
        let req = asks.request?;
        // A pod whose countable asks cannot even be read is judged by the API server's validation.
        let host = asks.host.unwrap_or_default();
        if req.gpu == GpuAsk::None {
            // No GPUs: kube-scheduler's own plugins judge CPU and memory.
            out.passed = names.to_vec();
            return Ok(out);
        }
        if let super::QuotaCheck::Refused(why) = self.quota(pod, &req) {
            // Its queue may not take more now: no node, whatever it has free.
            let why: Arc<str> = Arc::from(why);
            out.failed = names.iter().map(|n| (*n, why.clone())).collect();
            return Ok(out);
        }
        let ids = self.ids_of(names);
        let key = (req, host);
        let verdicts = self.judged(&key, Some(&ids));
        // Each distinct reason is worded once per answer (thousands of nodes share a handful).
        let reasons = verdicts.reasons();
        let mut texts: Vec<Option<Arc<str>>> = vec![None; reasons.len()];
        out.passed.reserve(names.len());
        for (name, id) in names.iter().zip(&ids) {
            match id.and_then(|id| verdicts.known_index(id)) {
                Some(Ok(_)) => out.passed.push(name),
                Some(Err(i)) if i < reasons.len() => {
                    let r = &reasons[i];
                    let into = if resolvable(r) {
                        &mut out.failed
                    } else {
                        &mut out.unresolvable
                    };
                    let text = texts[i].get_or_insert_with(|| Arc::from(r.to_string()));
                    into.push((name, text.clone()));
                }
                Some(Err(_)) | None => out.unresolvable.push((name, NO_INVENTORY.clone())),
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
        self.follow_supply();
        let asks = convert::pod_asks(pod, &self.cluster.catalog);
        let req = asks.request?;
        if req.gpu == GpuAsk::None {
            return Ok(names.iter().map(|n| (*n, 0)).collect());
        }
        let ids = self.ids_of(names);
        let key = (req, asks.host.unwrap_or_default());
        let verdicts = self.judged(&key, Some(&ids));
        let raw: Vec<(&'a str, f64)> = names
            .iter()
            .zip(&ids)
            .filter_map(
                |(name, id)| match id.and_then(|id| verdicts.known_index(id)) {
                    Some(Ok(s)) => Some((*name, s)),
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

    /// The nodes a pod whose devices come from DRA claims may go to (standalone
    /// mode, `--dra`): those `eligible` allows where its CPU, memory and
    /// countable resources fit, with the policy to choose devices by. The
    /// claims' own fit is judged by the caller ([`crate::dra::place`]); `Err`
    /// counts why no node passed.
    pub fn host_fitting(
        &mut self,
        req: &Request,
        host: &HostAsk,
        eligible: impl Fn(&NodeFacts) -> Result<(), String>,
    ) -> Result<HostFitting<'_>, Explanation> {
        let (fit, e) = self.judge_eligible(req, host, eligible);
        if fit.is_empty() {
            return Err(e);
        }
        let fit = fit
            .into_iter()
            .map(|(id, _)| {
                let node = &self.cluster.nodes()[id.0 as usize];
                let used = self.ledger.node(id);
                let room = HostRoom {
                    cpu_milli: node.cpu_milli,
                    memory_mib: node.memory_mib,
                    free_cpu_milli: used.free_cpu_milli,
                    free_memory_mib: used.free_memory_mib,
                };
                (id, self.facts[id.0 as usize].clone(), room)
            })
            .collect();
        Ok((fit, self.policy.as_ref()))
    }

    /// Brings the mirror up to date and judges every node for the shape
    /// (verdicts from the shape's cache): the nodes `eligible` allows where it
    /// fits, with their scores in node order, and the reasons for the rest
    /// (`eligible`'s counted too). Shared by [`Mirror::decide`] and
    /// [`Mirror::host_fitting`].
    fn judge_eligible(
        &mut self,
        req: &Request,
        host: &HostAsk,
        eligible: impl Fn(&NodeFacts) -> Result<(), String>,
    ) -> (Vec<(NodeId, f64)>, Explanation) {
        self.refresh();
        self.expire_reservations();
        self.follow_supply();
        let key = (req.clone(), host.clone());
        let (cache, mut judging) = self.split();
        let verdicts = judging.verdicts(cache, &key, None);
        let mut e = Explanation::new(judging.cluster.len());
        let mut fit = Vec::new();
        for (i, facts) in judging.facts.iter().enumerate().take(e.total) {
            let id = NodeId(i as u32);
            if let Err(why) = eligible(facts) {
                e.add(Reason::Excluded { why });
                continue;
            }
            match verdicts.known(id) {
                Some(Ok(score)) => {
                    e.fit += 1;
                    fit.push((id, score));
                }
                Some(Err(r)) => e.add(r.clone()),
                None => {}
            }
        }
        (fit, e)
    }

    /// Places a pod on the best node among those `eligible` allows (standalone
    /// mode): the placement and the per-node reasons, or why nothing fits (with
    /// `eligible`'s reasons counted). Node verdicts come from the shape's cache;
    /// `eligible` (the pod's selectors, affinity and tolerations) is the pod's own.
    pub fn decide(
        &mut self,
        req: &Request,
        host: &HostAsk,
        eligible: impl Fn(&NodeFacts) -> Result<(), String>,
    ) -> Result<(Placement, Explanation), Explanation> {
        let (fit, e) = self.judge_eligible(req, host, eligible);
        // Ties go to the earlier node, as in the core's order.
        let mut best: Option<(NodeId, f64)> = None;
        for (id, score) in fit {
            if best.is_none_or(|(_, b)| score > b) {
                best = Some((id, score));
            }
        }
        let (_, mut judging) = self.split();
        // Judged once more for the GPUs it picks (the cache keeps scores only).
        let Some((id, Ok(scored))) = best.map(|(id, _)| (id, judging.node(id, req))) else {
            return Err(e);
        };
        let view = NodeView::of(judging.cluster, judging.ledger, id);
        Ok((Placement::of(view, req, id, scored), e))
    }
}
