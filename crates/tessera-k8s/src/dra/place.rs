//! Which node a pod with DRA claims goes to, and each claim's devices there.
//! Pure: the pod's claims, the candidate nodes (those its host checks
//! passed), the inventories and what is held in; a [`Plan`] or why not out.
//!
//! A claim already allocated pins the pod to its allocation's node selector.
//! Every claim still to allocate must be allocated on the same node; the
//! claims are allocated in the pod's order, each seeing the devices the
//! earlier ones took. The policy sees each node's CPU and memory as they are
//! (`hosts`; the first claim to allocate carries the pod's ask of them), so
//! the fragmentation it scores counts GPUs a node's CPU strands, as FGD's
//! measure does. The node with the highest summed allocator score wins;
//! ties go to the node whose name sorts first, so equal inputs give equal
//! plans.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelector;
use tessera_core::policy::Policy;

use super::allocate::{NodeAllocation, allocate};
use super::cel::Env;
use super::choose::Host;
use super::inventory::{DeviceKey, Hold, Holdings, NodeInventory, claim_consumer};
use super::pod::{PodClaim, Step};
use crate::convert::NodeFacts;

/// The chosen node and, per claim to allocate (by index into the pod's
/// claims), its devices there.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    pub node: String,
    pub score: f64,
    pub allocations: Vec<(usize, NodeAllocation)>,
}

/// Why no node takes the pod's claims: per reason, how many nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NoPlan {
    /// A claim cannot be allocated anywhere: its selectors fail to evaluate.
    Claim(String),
    Nodes {
        total: usize,
        reasons: BTreeMap<String, usize>,
    },
}

impl NoPlan {
    /// One sentence, like the device-plugin path's: `0/3 nodes can take …: 2 …, 1 …`.
    pub fn sentence(&self) -> String {
        match self {
            NoPlan::Claim(e) => e.clone(),
            NoPlan::Nodes { total, reasons } => {
                let mut rs: Vec<(&String, &usize)> = reasons.iter().collect();
                rs.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
                let parts: Vec<String> = rs.iter().map(|(r, n)| format!("{n} {r}")).collect();
                if parts.is_empty() {
                    format!("0/{total} nodes can take the pod's ResourceClaims: no candidate nodes")
                } else {
                    format!(
                        "0/{total} nodes can take the pod's ResourceClaims: {}",
                        parts.join("; ")
                    )
                }
            }
        }
    }
}

/// Adds `alloc`'s devices to `usage` as `claim`'s, as
/// [`super::inventory::claims_holdings`] counts the claim once written: a
/// result without consumed capacity holds its device whole.
fn hold(usage: &mut Holdings, claim: &PodClaim, alloc: &NodeAllocation) {
    let consumer = claim_consumer(&claim.claim);
    for c in alloc.results.iter().filter(|c| !c.admin_access) {
        let hold = if c.consumed.is_empty() {
            Hold::Whole
        } else {
            Hold::Share(c.consumed.clone())
        };
        usage.hold(&consumer, c.device.clone(), hold);
    }
}

/// Whether a node selector (an allocation's) admits `node`.
pub type SelectorCheck<'a> = &'a dyn Fn(&NodeSelector, &NodeFacts) -> bool;

/// Plans `claims` on the best of `nodes`; `hosts` has each node's CPU and
/// memory and the pod's ask of them ([`Host::PLENTY`] for a node it lacks).
#[allow(clippy::too_many_arguments)]
pub fn place(
    claims: &[PodClaim],
    nodes: &[NodeFacts],
    inventories: &BTreeMap<String, NodeInventory>,
    usage: &Holdings,
    policy: &dyn Policy,
    env: &Env,
    selects: SelectorCheck<'_>,
    hosts: &BTreeMap<String, Host>,
) -> Result<Plan, NoPlan> {
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut best: Option<Plan> = None;
    let mut order: Vec<&NodeFacts> = nodes.iter().collect();
    order.sort_by(|a, b| a.name.cmp(&b.name));
    let to_allocate = claims.iter().any(|c| matches!(c.step, Step::Allocate(_)));
    'nodes: for facts in order {
        // Claims allocated already (by anyone) pin the node.
        for c in claims
            .iter()
            .filter(|c| !matches!(c.step, Step::Allocate(_)))
        {
            let sel = c
                .claim
                .status
                .as_ref()
                .and_then(|s| s.allocation.as_ref())
                .and_then(|a| a.node_selector.as_ref());
            if sel.is_some_and(|s| !selects(s, facts)) {
                *reasons
                    .entry(format!(
                        "not the node of ResourceClaim {}'s allocation",
                        c.key
                    ))
                    .or_default() += 1;
                continue 'nodes;
            }
        }
        if !to_allocate {
            let plan = Plan {
                node: facts.name.clone(),
                score: 0.0,
                allocations: Vec::new(),
            };
            if best.is_none() {
                best = Some(plan);
            }
            continue;
        }
        let Some(inv) = inventories.get(&facts.name) else {
            *reasons
                .entry(format!("have no devices of {}", super::DRIVER))
                .or_default() += 1;
            continue;
        };
        let mut used = usage.clone();
        let mut score = 0.0;
        let mut allocations = Vec::new();
        let mut host = hosts.get(&facts.name).copied().unwrap_or(Host::PLENTY);
        for (i, c) in claims.iter().enumerate() {
            let Step::Allocate(ask) = &c.step else {
                continue;
            };
            let result = allocate(ask, inv, &used, policy, env, host);
            host = host.after_ask();
            match result {
                Err(e) => return Err(NoPlan::Claim(format!("ResourceClaim {}: {e}", c.key))),
                Ok(Err(unfit)) => {
                    *reasons
                        .entry(format!("ResourceClaim {}: {unfit}", c.key))
                        .or_default() += 1;
                    continue 'nodes;
                }
                Ok(Ok(a)) => {
                    hold(&mut used, c, &a);
                    score += a.score;
                    allocations.push((i, a));
                }
            }
        }
        if best.as_ref().is_none_or(|b| score > b.score) {
            best = Some(Plan {
                node: facts.name.clone(),
                score,
                allocations,
            });
        }
    }
    best.ok_or(NoPlan::Nodes {
        total: nodes.len(),
        reasons,
    })
}

/// The devices of `plan` (for messages and tests).
pub fn devices(plan: &Plan) -> Vec<&DeviceKey> {
    plan.allocations
        .iter()
        .flat_map(|(_, a)| a.results.iter().map(|c| &c.device))
        .collect()
}
