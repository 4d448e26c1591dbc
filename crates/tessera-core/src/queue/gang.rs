//! Gangs: all-or-nothing placement of a group of pods (a scheduler-plugins
//! `PodGroup`, `scheduling.x-k8s.io/v1alpha1`, whose pods carry the label
//! [`POD_GROUP_LABEL`]).
//!
//! A distributed job whose workers start one by one holds GPUs idle until the
//! last worker fits, and two such jobs can each hold half the cluster and wait
//! for each other forever. [`place_gang`] instead decides a whole gang at once
//! on the ledger: it opens a [`crate::ledger::Checkpoint`], places members one by
//! one with the shared [`Scheduler`] (so later members see the GPUs earlier ones
//! took), and either commits all of them (at least `min_member`) or rolls the
//! ledger back to exactly where it was.
//!
//! **Deadlock freedom.** Gangs are decided one at a time and atomically: while
//! a gang waits it holds nothing, so the "hold and wait" condition for a
//! deadlock never arises and no two gangs can each hold half of what the other
//! needs. What remains is starvation (a large gang overtaken forever by small
//! pods); bounding that wait is the caller's job (the Kubernetes adapter's
//! PodGroup timeout, the simulator's queue), not the core's, which has no clock.
//!
//! **Topology.** A gang communicates among its members, so when the caller
//! names a node label (a rack, an NVLink domain) the gang is first tried inside
//! one domain (nodes sharing the label's value), tightest domain first so large
//! domains stay whole for large gangs; only if no single domain holds it, anywhere.
//!
//! Members are tried largest first (first-fit decreasing: big members are the
//! hard ones, and placing them first leaves the small ones the gaps).

use rand::RngCore;

use super::GangId;
use crate::explain::Explanation;
use crate::ledger::{AllocId, Ledger, LedgerError};
use crate::model::{Cluster, NodeId};
use crate::placement::Placement;
use crate::request::Request;
use crate::scheduler::Scheduler;

/// The label that ties a pod to its `PodGroup` (scheduler-plugins' coscheduling),
/// so manifests written for that plugin work unchanged.
pub const POD_GROUP_LABEL: &str = "scheduling.x-k8s.io/pod-group";

/// A gang to place: its members' requests and how many must run together.
#[derive(Debug, Clone, Copy)]
pub struct Gang<'a> {
    pub id: GangId,
    pub members: &'a [Request],
    /// The `PodGroup`'s `minMember`: at least this many members are placed, or
    /// none. Members beyond it are placed in the same decision when they fit.
    /// Values above `members.len()` are treated as all members (a gang can never
    /// place more pods than it has).
    pub min_member: usize,
}

impl Gang<'_> {
    fn needed(&self) -> usize {
        self.min_member.min(self.members.len())
    }
}

/// How a gang is placed.
#[derive(Debug, Clone, Copy, Default)]
pub struct GangOptions<'a> {
    /// A node label whose value names a topology domain (a rack, an NVLink
    /// domain); `None` places anywhere.
    pub topology_key: Option<&'a str>,
    /// Explain a refusal (costs one filter pass over every node).
    pub explain: bool,
}

/// One member placed.
#[derive(Debug, Clone, PartialEq)]
pub struct MemberPlacement {
    /// Index into [`Gang::members`].
    pub member: usize,
    pub alloc: AllocId,
    pub placement: Placement,
}

/// A gang placed and committed to the ledger.
#[derive(Debug, Clone, PartialEq)]
pub struct GangPlacement {
    pub gang: GangId,
    /// In member order.
    pub members: Vec<MemberPlacement>,
    /// Members beyond `min_member` that did not fit (they stay pending).
    pub left_out: Vec<usize>,
    /// The topology domain (the label's value) holding every member, if one did.
    pub domain: Option<String>,
}

/// Why a gang was not placed: the first member that found no node once the
/// members before it were (tentatively) placed.
#[derive(Debug, Clone, PartialEq)]
pub struct GangRefusal {
    pub gang: GangId,
    /// Index into [`Gang::members`] of the member that did not fit.
    pub member: usize,
    /// Members placed before it (and rolled back).
    pub placed_before: usize,
    /// Members that had to fit (`min_member`).
    pub needed: usize,
    /// Why that member fit nowhere, when [`GangOptions::explain`] asked.
    pub explanation: Option<Explanation>,
}

impl std::fmt::Display for GangRefusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "gang {}: member {} does not fit after {} of the {} needed were placed",
            self.gang.0, self.member, self.placed_before, self.needed
        )?;
        if let Some(e) = &self.explanation {
            write!(f, ": {e}")?;
        }
        Ok(())
    }
}

/// The outcome of one gang decision. "Does not fit" is a value, not an error.
#[derive(Debug, Clone, PartialEq)]
pub enum GangDecision {
    Placed(GangPlacement),
    Unschedulable(GangRefusal),
}

/// A fault while placing a gang (the ledger refused a placement the scheduler
/// made, or a checkpoint was misused): the ledger has been rolled back.
#[derive(Debug, thiserror::Error)]
pub enum GangError {
    #[error("gang {gang}: the ledger refused member {member}'s placement")]
    Apply {
        gang: u32,
        member: usize,
        #[source]
        source: LedgerError,
    },
    #[error("gang {gang}: checkpoint")]
    Checkpoint {
        gang: u32,
        #[source]
        source: LedgerError,
    },
}

/// Topology domains: nodes grouped by the value of `key`, in value order.
/// Nodes without the label belong to no domain.
pub fn domains(cluster: &Cluster, key: &str) -> Vec<(String, Vec<NodeId>)> {
    let mut by_value: std::collections::BTreeMap<&str, Vec<NodeId>> = Default::default();
    for id in cluster.ids() {
        if let Some(v) = cluster.node(id).labels.get(key) {
            by_value.entry(v.as_str()).or_default().push(id);
        }
    }
    by_value
        .into_iter()
        .map(|(v, ids)| (v.to_string(), ids))
        .collect()
}

/// Places `gang` all-or-nothing. On [`GangDecision::Placed`] the members are in
/// the ledger (committed); on [`GangDecision::Unschedulable`] and on `Err` the
/// ledger holds exactly what it held before.
pub fn place_gang(
    scheduler: &mut Scheduler,
    cluster: &Cluster,
    ledger: &mut Ledger,
    gang: &Gang<'_>,
    options: &GangOptions<'_>,
    rng: &mut dyn RngCore,
) -> Result<GangDecision, GangError> {
    let order = largest_first(gang.members);
    if let Some(key) = options.topology_key {
        let need_milli: u64 = order
            .iter()
            .take(gang.needed())
            .map(|&i| gang.members[i].gpu.total_milli())
            .sum();
        // Tightest first: the domain with the least free GPU that could still
        // hold the gang, so roomy domains stay whole for bigger gangs.
        let mut candidates: Vec<(u64, String, Vec<NodeId>)> = domains(cluster, key)
            .into_iter()
            .map(|(v, ids)| {
                let free: u64 = ids.iter().map(|id| free_milli(ledger, *id)).sum();
                (free, v, ids)
            })
            .filter(|(free, _, _)| *free >= need_milli)
            .collect();
        candidates.sort_by(|a, b| a.0.cmp(&b.0).then_with(|| a.1.cmp(&b.1)));
        for (_, value, ids) in candidates {
            if let Attempt::Placed(mut p) =
                attempt(scheduler, cluster, ledger, gang, &order, Some(&ids), rng)?
            {
                p.domain = Some(value);
                return Ok(GangDecision::Placed(p));
            }
        }
    }
    match attempt(scheduler, cluster, ledger, gang, &order, None, rng)? {
        Attempt::Placed(p) => Ok(GangDecision::Placed(p)),
        Attempt::Refused {
            member,
            placed_before,
        } => {
            // Explained against the ledger as it is again (the gang holds nothing):
            // when the member cannot fit even alone, the sentence says why; when it
            // fits alone, the sentence's count of fitting nodes shows the gang as a
            // whole is what is too big.
            let explanation = options
                .explain
                .then(|| scheduler.explain(cluster, ledger, &gang.members[member], rng));
            Ok(GangDecision::Unschedulable(GangRefusal {
                gang: gang.id,
                member,
                placed_before,
                needed: gang.needed(),
                explanation,
            }))
        }
    }
}

fn free_milli(ledger: &Ledger, id: NodeId) -> u64 {
    ledger.node(id).free_milli().map(u64::from).sum()
}

/// Member indices, largest GPU ask first (ties: member order, so the order is stable).
fn largest_first(members: &[Request]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by(|&a, &b| {
        let key = |r: &Request| (r.gpu.total_milli(), r.cpu_milli, r.memory_mib);
        key(&members[b]).cmp(&key(&members[a])).then(a.cmp(&b))
    });
    order
}

enum Attempt {
    Placed(GangPlacement),
    Refused { member: usize, placed_before: usize },
}

/// One try, anywhere or within `within`: commits on success, rolls back otherwise.
fn attempt(
    scheduler: &mut Scheduler,
    cluster: &Cluster,
    ledger: &mut Ledger,
    gang: &Gang<'_>,
    order: &[usize],
    within: Option<&[NodeId]>,
    rng: &mut dyn RngCore,
) -> Result<Attempt, GangError> {
    let needed = gang.needed();
    let cp = ledger.checkpoint();
    let mut placed: Vec<MemberPlacement> = Vec::with_capacity(gang.members.len());
    let mut left_out = Vec::new();
    let mut refused = None;
    for &i in order {
        let req = &gang.members[i];
        let found = match within {
            Some(ids) => scheduler.place_within(cluster, ledger, req, ids, rng),
            None => scheduler.place(cluster, ledger, req, rng),
        };
        match found {
            Some(p) => match ledger.apply(cluster, &p) {
                Ok(alloc) => placed.push(MemberPlacement {
                    member: i,
                    alloc,
                    placement: p,
                }),
                Err(source) => {
                    ledger
                        .rollback(cluster, cp)
                        .map_err(|source| GangError::Checkpoint {
                            gang: gang.id.0,
                            source,
                        })?;
                    return Err(GangError::Apply {
                        gang: gang.id.0,
                        member: i,
                        source,
                    });
                }
            },
            // Members beyond the minimum are optional: skip, keep going.
            None if placed.len() >= needed => left_out.push(i),
            None => {
                refused = Some(i);
                break;
            }
        }
    }
    let checkpoint_err = |source| GangError::Checkpoint {
        gang: gang.id.0,
        source,
    };
    if let Some(member) = refused {
        ledger.rollback(cluster, cp).map_err(checkpoint_err)?;
        return Ok(Attempt::Refused {
            member,
            placed_before: placed.len(),
        });
    }
    ledger.commit(cp).map_err(checkpoint_err)?;
    placed.sort_by_key(|m| m.member);
    left_out.sort_unstable();
    Ok(Attempt::Placed(GangPlacement {
        gang: gang.id,
        members: placed,
        left_out,
        domain: None,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Catalog, Node};
    use crate::policy::{self, PolicyArgs};
    use proptest::prelude::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn scheduler() -> Scheduler {
        Scheduler::new(policy::by_name("bestfit", &PolicyArgs::default()).unwrap())
    }

    /// `gpus[i]` GPUs on node i, each node labelled `rack = racks[i]`.
    fn cluster(gpus: &[u32], racks: &[&str]) -> Cluster {
        let catalog = Catalog::default();
        let model = catalog.find("A100-80GB").unwrap();
        let nodes = gpus
            .iter()
            .enumerate()
            .map(|(i, &g)| {
                let mut n = Node::uniform(format!("n{i}"), 64_000, 512_000, model, g);
                if let Some(r) = racks.get(i) {
                    n.labels.insert("rack".into(), r.to_string());
                }
                n
            })
            .collect();
        Cluster::new(catalog, nodes).unwrap()
    }

    fn whole(n: u32) -> Request {
        Request::whole(n, 1_000, 1_024)
    }

    fn snapshot(l: &Ledger) -> (Vec<crate::ledger::NodeUse>, Vec<(AllocId, Placement)>) {
        let mut a: Vec<(AllocId, Placement)> =
            l.allocations().map(|(id, p)| (id, p.clone())).collect();
        a.sort_by_key(|x| x.0);
        (l.nodes().to_vec(), a)
    }

    #[test]
    fn a_gang_that_fits_is_placed_whole_and_one_that_does_not_leaves_no_trace() {
        // Two 8-GPU nodes = 16 GPUs.
        let c = cluster(&[8, 8], &[]);
        let mut l = Ledger::new(&c);
        let mut s = scheduler();
        let mut rng = SmallRng::seed_from_u64(1);
        // 3 × 4 GPUs = 12 ≤ 16: placed.
        let three = vec![whole(4); 3];
        let g = Gang {
            id: GangId(1),
            members: &three,
            min_member: 3,
        };
        let d = place_gang(&mut s, &c, &mut l, &g, &GangOptions::default(), &mut rng).unwrap();
        let GangDecision::Placed(p) = d else {
            panic!("{d:?}")
        };
        assert_eq!(p.members.len(), 3);
        assert_eq!(l.allocation_count(), 3);
        // 4 left; a gang of 2 × 4 needs 8: the first member fits, the second does not.
        let before = snapshot(&l);
        let two = vec![whole(4); 2];
        let g = Gang {
            id: GangId(2),
            members: &two,
            min_member: 2,
        };
        let opts = GangOptions {
            explain: true,
            ..GangOptions::default()
        };
        let d = place_gang(&mut s, &c, &mut l, &g, &opts, &mut rng).unwrap();
        let GangDecision::Unschedulable(r) = d else {
            panic!("{d:?}")
        };
        assert_eq!((r.member, r.placed_before, r.needed), (1, 1, 2));
        // Explained against the ledger with the gang rolled back: member 1 alone
        // fits on the node with 4 idle GPUs (1 of 2 nodes).
        assert_eq!(r.explanation.as_ref().map(|e| e.fit), Some(1));
        assert_eq!(snapshot(&l), before, "rolled back");
    }

    #[test]
    fn min_member_below_the_gang_size_places_the_minimum_and_reports_the_rest() {
        // 8 GPUs; 5 members × 2 GPUs = 10; minMember 3 needs 6.
        let c = cluster(&[8], &[]);
        let mut l = Ledger::new(&c);
        let five = vec![whole(2); 5];
        let g = Gang {
            id: GangId(3),
            members: &five,
            min_member: 3,
        };
        let mut rng = SmallRng::seed_from_u64(2);
        let d = place_gang(
            &mut scheduler(),
            &c,
            &mut l,
            &g,
            &GangOptions::default(),
            &mut rng,
        )
        .unwrap();
        let GangDecision::Placed(p) = d else {
            panic!("{d:?}")
        };
        // 4 × 2 = 8 fit; the fifth is left out (pending), not a refusal.
        assert_eq!(p.members.len(), 4);
        assert_eq!(p.left_out, vec![4]);
    }

    #[test]
    fn a_gang_prefers_one_rack_when_one_holds_it() {
        // Rack a: two 4-GPU nodes (8 GPUs); rack b: one 8-GPU node and one 2-GPU node (10).
        // A gang of 2 × 4 fits in either; a (8 free) is tighter than b (10 free), so a.
        let c = cluster(&[4, 8, 4, 2], &["a", "b", "a", "b"]);
        let mut l = Ledger::new(&c);
        let mut s = scheduler();
        let mut rng = SmallRng::seed_from_u64(3);
        let two = vec![whole(4); 2];
        let g = Gang {
            id: GangId(4),
            members: &two,
            min_member: 2,
        };
        let opts = GangOptions {
            topology_key: Some("rack"),
            explain: false,
        };
        let d = place_gang(&mut s, &c, &mut l, &g, &opts, &mut rng).unwrap();
        let GangDecision::Placed(p) = d else {
            panic!("{d:?}")
        };
        assert_eq!(p.domain.as_deref(), Some("a"));
        let nodes: Vec<u32> = p.members.iter().map(|m| m.placement.node.0).collect();
        assert!(nodes.iter().all(|n| *n == 0 || *n == 2), "{nodes:?}");
        // Next, 3 × 4 = 12: rack b has 10, rack a nothing; no rack holds it, so it
        // spreads: b's 8-GPU node takes two, nothing else has 4 → refused.
        let three = vec![whole(4); 3];
        let g = Gang {
            id: GangId(5),
            members: &three,
            min_member: 3,
        };
        let d = place_gang(&mut s, &c, &mut l, &g, &opts, &mut rng).unwrap();
        assert!(matches!(d, GangDecision::Unschedulable(_)), "{d:?}");
        // 2 × 4 + 1 × 2 = 10 fits b exactly.
        let mixed = vec![whole(4), whole(2), whole(4)];
        let g = Gang {
            id: GangId(6),
            members: &mixed,
            min_member: 3,
        };
        let d = place_gang(&mut s, &c, &mut l, &g, &opts, &mut rng).unwrap();
        let GangDecision::Placed(p) = d else {
            panic!("{d:?}")
        };
        assert_eq!(p.domain.as_deref(), Some("b"));
    }

    #[test]
    fn a_gang_spans_domains_only_when_no_single_one_holds_it() {
        // Racks of 4 GPUs each; a gang of 3 × 2 = 6 fits no rack, but fits across two.
        let c = cluster(&[4, 4], &["a", "b"]);
        let mut l = Ledger::new(&c);
        let three = vec![whole(2); 3];
        let g = Gang {
            id: GangId(7),
            members: &three,
            min_member: 3,
        };
        let opts = GangOptions {
            topology_key: Some("rack"),
            explain: false,
        };
        let mut rng = SmallRng::seed_from_u64(4);
        let d = place_gang(&mut scheduler(), &c, &mut l, &g, &opts, &mut rng).unwrap();
        let GangDecision::Placed(p) = d else {
            panic!("{d:?}")
        };
        assert_eq!(p.domain, None);
        assert_eq!(p.members.len(), 3);
    }

    #[test]
    fn an_empty_gang_is_trivially_placed() {
        let c = cluster(&[1], &[]);
        let mut l = Ledger::new(&c);
        let mut rng = SmallRng::seed_from_u64(5);
        // minMember above the member count is clamped to it: nothing to place.
        let g = Gang {
            id: GangId(8),
            members: &[],
            min_member: 2,
        };
        let d = place_gang(
            &mut scheduler(),
            &c,
            &mut l,
            &g,
            &GangOptions::default(),
            &mut rng,
        );
        assert!(matches!(d, Ok(GangDecision::Placed(ref p)) if p.members.is_empty()));
    }

    fn request() -> impl Strategy<Value = Request> {
        prop_oneof![
            (1u32..=8).prop_map(whole),
            (100u32..=1000).prop_map(|m| Request::share_milli(m, 500, 512)),
            Just(Request::cpu_only(2_000, 4_096)),
        ]
    }

    proptest! {
        /// Over random clusters, pre-filled ledgers and gangs: after `place_gang`
        /// either at least `min_member` members are in the ledger (all of them when
        /// `min_member` is the gang's size) or none, and a refusal leaves the ledger
        /// exactly as it was.
        #[test]
        fn no_gang_is_ever_partly_placed(
            gpus in proptest::collection::vec(1u32..=8, 1..6),
            racks in proptest::collection::vec(0u8..3, 6),
            fill in proptest::collection::vec(request(), 0..20),
            members in proptest::collection::vec(request(), 1..10),
            slack in 0usize..3,
            rack_aware in any::<bool>(),
            seed in any::<u64>(),
        ) {
            let names: Vec<String> = racks.iter().map(|r| format!("r{r}")).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let c = cluster(&gpus, &names);
            let mut l = Ledger::new(&c);
            let mut s = scheduler();
            let mut rng = SmallRng::seed_from_u64(seed);
            for r in &fill {
                if let Some(p) = s.place(&c, &l, r, &mut rng) {
                    l.apply(&c, &p).unwrap();
                }
            }
            let before = snapshot(&l);
            let min_member = members.len().saturating_sub(slack).max(1);
            let g = Gang { id: GangId(9), members: &members, min_member };
            let opts = GangOptions { topology_key: rack_aware.then_some("rack"), explain: true };
            let d = place_gang(&mut s, &c, &mut l, &g, &opts, &mut rng).unwrap();
            let new: Vec<AllocId> = l.allocations().map(|(id, _)| id)
                .filter(|id| !before.1.iter().any(|(b, _)| b == id)).collect();
            match d {
                GangDecision::Placed(p) => {
                    prop_assert!(p.members.len() >= min_member);
                    prop_assert_eq!(p.members.len() + p.left_out.len(), members.len());
                    prop_assert_eq!(new.len(), p.members.len());
                    for m in &p.members {
                        prop_assert_eq!(l.allocation(m.alloc), Some(&m.placement));
                    }
                    if min_member == members.len() {
                        prop_assert!(p.left_out.is_empty());
                    }
                    if let Some(dom) = &p.domain {
                        for m in &p.members {
                            prop_assert_eq!(c.node(m.placement.node).labels.get("rack"), Some(dom));
                        }
                    }
                }
                GangDecision::Unschedulable(r) => {
                    prop_assert!(new.is_empty());
                    prop_assert_eq!(snapshot(&l), before);
                    prop_assert!(r.member < members.len());
                    prop_assert!(r.placed_before < min_member);
                }
            }
        }
    }
}
