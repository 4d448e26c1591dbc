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

use k8s_openapi::api::core::v1::Pod;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tessera_core::NodeId;
use tessera_core::estimate::Estimate;
use tessera_core::fit::NodeView;
use tessera_core::judge::{self, Verdict};
use tessera_core::ledger::LedgerError;
use tessera_core::placement::Placement;
use tessera_core::request::Request;

use super::Mirror;
use super::verdicts::Judging;
use crate::convert::NodeFacts;
use crate::hostfit::{self, HostAsk};

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
        self.refresh();
        self.expire_reservations();
        self.follow_supply();
        let limit = match self.quota_replicas(pod, req, limit) {
            Err(_) => 0,
            Ok(None) => limit,
            Ok(Some(n)) => n.min(limit),
        };
        let nodes: Vec<NodeId> = self
            .facts
            .iter()
            .enumerate()
            .take(self.cluster.len())
            .filter(|(_, f)| eligible(f).is_ok())
            .map(|(i, _)| NodeId(i as u32))
            .collect();
        let mut ledger = self.ledger.clone();
        let mut host_used = self.host_used.clone();
        // A fixed seed: the same state and request give the same answer.
        let mut rng = SmallRng::seed_from_u64(0);
        let node_local = judge::cacheable(self.policy.as_ref(), req);
        let mut verdicts: Vec<Verdict> = Vec::new();
        let mut last: Option<NodeId> = None;
        let mut replicas = 0u32;
        while replicas < limit {
            let mut j: Judging<'_> = self.judging_over(&ledger, &host_used, &mut rng);
            match last {
                Some(id) if node_local => {
                    if let Some(i) = nodes.iter().position(|n| *n == id) {
                        verdicts[i] = j.verdict(id, req, host);
                    }
                }
                _ => verdicts = nodes.iter().map(|&id| j.verdict(id, req, host)).collect(),
            }
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
            let placement =
                Placement::of(NodeView::of(&self.cluster, &ledger, id), req, id, scored);
            ledger.apply(&self.cluster, &placement)?;
            let name = &self.cluster.node(id).name;
            hostfit::account(host_used.entry(name.clone()).or_default(), host, true);
            last = Some(id);
            replicas += 1;
        }
        Ok(Estimate {
            replicas,
            capped: replicas == limit,
        })
    }
}
