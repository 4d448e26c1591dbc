//! The extender's and the standalone loop's judgements of nodes: per request
//! shape, each node's verdict, kept as of the ledger's change cursor.

use crate::convert::{self, NodeFacts};
use crate::hostfit::HostAsk;
use k8s_openapi::api::core::v1::Pod;
use std::sync::{Arc, LazyLock};
use tessera_core::NodeId;
use tessera_core::explain::{Explanation, Reason};
use tessera_core::fit::{self, NodeView};
use tessera_core::placement::{Placement, Scored};
use tessera_core::request::{GpuAsk, Request, RequestError};

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

/// Most request shapes whose verdicts are kept (the cache is dropped when full).
const MAX_SHAPES: usize = 128;

/// A node's verdict for one request shape.
#[derive(Debug, Clone)]
pub(super) enum Verdict {
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
pub(super) struct ShapeCache {
    pub(super) cursor: u64,
    pub(super) generation: u64,
    pub(super) verdicts: Vec<Option<Verdict>>,
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

impl Mirror {
    pub(super) fn score_node(&mut self, id: NodeId, req: &Request) -> Result<Scored, Reason> {
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
    pub(super) fn ensure_verdicts(&mut self, key: &(Request, HostAsk), ids: &[Option<NodeId>]) {
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

    pub(super) fn verdicts(&self, key: &(Request, HostAsk)) -> &[Option<Verdict>] {
        self.shapes
            .get(key)
            .or(self.uncached.as_ref())
            .map_or(&[], |c| c.verdicts.as_slice())
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
        let asks = convert::pod_asks(pod, &self.cluster.catalog);
        let req = asks.request?;
        if req.gpu == GpuAsk::None {
            return Ok(names.iter().map(|n| (*n, 0)).collect());
        }
        let ids = self.ids_of(names);
        let key = (req, asks.host.unwrap_or_default());
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
}
