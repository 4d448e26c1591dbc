//! How many replicas of one pod the mirror would place now: the answer of
//! `tessera estimator` to Karmada's `MaxAvailableReplicas`.
//!
//! The count is made by the judge every placement goes through ([`Judging`]:
//! a node blocked or stale, no inventory, the node's countable resources, then
//! the core's judge), on scratch copies of the ledger and of the nodes'
//! countable-resource use: one replica after another goes to the best node as
//! [`Mirror::decide`] picks it (highest score, ties to the earlier node) and is
//! applied to the copies, until none fits or the limit is reached. The mirror
//! itself is left as it was. The queue's quota caps the count as admission
//! would admit the replicas one after another ([`Mirror::quota_replicas`]).
//!
//! Where the policy's scores depend on the node alone
//! ([`tessera_core::judge::cacheable`]), only the node that took the last
//! replica is judged again; otherwise every node is, each time.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rustc_hash::FxHashMap;
use tessera_core::NodeId;
use tessera_core::estimate::Estimate;
use tessera_core::explain::{Explanation, Reason};
use tessera_core::fit::NodeView;
use tessera_core::judge::{self, Verdict};
use tessera_core::ledger::{Ledger, LedgerError};
use tessera_core::placement::Placement;
use tessera_core::request::Request;

use super::Mirror;
use super::verdicts::Judging;
use crate::convert::NodeFacts;
use crate::hostfit::{self, HostAsk};

/// Scratch copies of what placement changes (the ledger and the nodes'
/// countable-resource use), so that several estimates can be made one after
/// another on one state: a Kueue workload's podSets must fit together
/// ([`crate::kueue`]). Made by [`Mirror::scratch`]; valid while the mirror is
/// not changed (the caller holds its lock from the scratch to its last use).
#[derive(Clone)]
pub struct Scratch {
    ledger: Ledger,
    host_used: FxHashMap<String, BTreeMap<String, u64>>,
    generation: u64,
}

/// Replicas placed before an estimate ([`Mirror::estimate_after`]): `replicas`
/// of one asking `req` and `host`, on the nodes `eligible` admits.
pub struct Assumed<'a> {
    pub req: &'a Request,
    pub host: &'a HostAsk,
    pub eligible: &'a dyn Fn(&NodeFacts) -> Result<(), String>,
    pub replicas: u32,
}

/// What [`Mirror::estimate_on`] counted, and why the next replica did not fit.
#[derive(Debug, Clone, PartialEq)]
pub struct Counted {
    pub estimate: Estimate,
    /// Why one more replica fits on no node (every node's reason, counted), as
    /// of the state after the counted replicas; `None` when the count stopped
    /// at the limit.
    pub short: Option<Explanation>,
}

impl Mirror {
    /// Replicas of `pod` (asking `req` of the core and `host` of the nodes'
    /// countable resources) placed one by one now on the nodes `eligible`
    /// admits, at most `limit`. `Err` only when the ledger refuses a placement
    /// the judge proposed (a bug, never "does not fit").
    pub fn estimate(
        &mut self,
        pod: &Pod,
        req: &Request,
        host: &HostAsk,
        eligible: impl Fn(&NodeFacts) -> Result<(), String>,
        limit: u32,
    ) -> Result<Estimate, LedgerError> {
        self.estimate_after(&[], pod, req, host, eligible, limit)
    }

    /// [`Mirror::estimate`] once the `assumed` replicas are placed first, on
    /// the same scratch (Karmada's `assumedWorkloads`: replicas it has just
    /// sent here that are no pods yet). Each assumed set is placed as far as
    /// it fits; what does not fit takes nothing.
    pub fn estimate_after(
        &mut self,
        assumed: &[Assumed<'_>],
        pod: &Pod,
        req: &Request,
        host: &HostAsk,
        eligible: impl Fn(&NodeFacts) -> Result<(), String>,
        limit: u32,
    ) -> Result<Estimate, LedgerError> {
        self.refresh();
        self.expire_reservations();
        self.follow_supply();
        let limit = match self.quota_replicas(pod, req, limit) {
            Err(_) => 0,
            Ok(None) => limit,
            Ok(Some(n)) => n.min(limit),
        };
        let mut scratch = self.scratch();
        for a in assumed {
            self.estimate_on(&mut scratch, a.req, a.host, |f| (a.eligible)(f), a.replicas)?;
        }
        Ok(self
            .estimate_on(&mut scratch, req, host, eligible, limit)?
            .estimate)
    }

    /// Copies of the ledger and the nodes' countable-resource use as of now
    /// (after the same refresh an estimate makes), for [`Mirror::estimate_on`].
    pub fn scratch(&mut self) -> Scratch {
        self.refresh();
        self.expire_reservations();
        self.follow_supply();
        Scratch {
            ledger: self.ledger.clone(),
            host_used: self.host_used.clone(),
            generation: self.generation,
        }
    }

    /// [`Mirror::estimate`]'s count on `scratch`, which keeps the replicas
    /// placed (the next call counts around them), without a queue's quota:
    /// the caller says what admits the replicas (Kueue's quota, for
    /// [`crate::kueue`]). A scratch made before the mirror last changed counts
    /// nothing (its node ids may name other nodes now).
    pub fn estimate_on(
        &self,
        scratch: &mut Scratch,
        req: &Request,
        host: &HostAsk,
        eligible: impl Fn(&NodeFacts) -> Result<(), String>,
        limit: u32,
    ) -> Result<Counted, LedgerError> {
        let mut why = Explanation::new(self.cluster.len());
        if scratch.generation != self.generation {
            return Ok(Counted {
                estimate: Estimate::default(),
                short: Some(why),
            });
        }
        let mut nodes: Vec<NodeId> = Vec::new();
        for (i, f) in self.facts.iter().enumerate().take(self.cluster.len()) {
            match eligible(f) {
                Ok(()) => nodes.push(NodeId(i as u32)),
                Err(reason) => why.add(Reason::Excluded { why: reason }),
            }
        }
        let Scratch {
            ledger, host_used, ..
        } = scratch;
        // A fixed seed: the same state and request give the same answer.
        let mut rng = SmallRng::seed_from_u64(0);
        let node_local = judge::cacheable(self.policy.as_ref(), req);
        let mut verdicts: Vec<Verdict> = Vec::new();
        let mut last: Option<NodeId> = None;
        let mut replicas = 0u32;
        let mut judged = false;
        while replicas < limit {
            let mut j: Judging<'_> = self.judging_over(ledger, host_used, &mut rng);
            match last {
                Some(id) if node_local => {
                    if let Some(i) = nodes.iter().position(|n| *n == id) {
                        verdicts[i] = j.verdict(id, req, host);
                    }
                }
                _ => verdicts = nodes.iter().map(|&id| j.verdict(id, req, host)).collect(),
            }
            judged = true;
            let mut best: Option<(NodeId, f64)> = None;
            for (&id, v) in nodes.iter().zip(&verdicts) {
                if let Ok(score) = v
                    && best.is_none_or(|(_, b)| *score > b)
                {
                    best = Some((id, *score));
                }
            }
            // Judged once more for the GPUs it picks (the verdicts keep scores only).
            let Some((id, Ok(scored))) = best.map(|(id, _)| (id, j.node(id, req))) else {
                break;
            };
            let placement = Placement::of(NodeView::of(&self.cluster, ledger, id), req, id, scored);
            ledger.apply(&self.cluster, &placement)?;
            let name = &self.cluster.node(id).name;
            hostfit::account(host_used.entry(name.clone()).or_default(), host, true);
            last = Some(id);
            replicas += 1;
        }
        let capped = replicas == limit;
        let short = (!capped).then(|| {
            if judged {
                for v in &verdicts {
                    match v {
                        Ok(_) => why.fit += 1,
                        Err(r) => why.add(r.clone()),
                    }
                }
            }
            why
        });
        Ok(Counted {
            estimate: Estimate { replicas, capped },
            short,
        })
    }
}
