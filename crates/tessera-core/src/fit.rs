//! The filter: can this node take this request at all, and with which GPUs?
//!
//! Every policy shares this one filter, so a node is never rejected for
//! different reasons by different policies. The answer is either a [`Fit`] (the
//! GPUs that could each take the per-GPU ask) or the first [`Reason`] it fails.
//! Policies then pick among the usable GPUs; [`grants`] turns the pick into
//! ledger grants.
//!
//! MIG requests take an instance that exists on a GPU ([`free_mig_instance`]) and,
//! where the node allows dynamic MIG (`tessera.io/mig-dynamic`), one the node agent
//! will create ([`mig_layout::explicit_choice`]); elsewhere a free placement with no
//! instance behind it is worth nothing. Shares asked at an isolation level (`hard`,
//! `soft`, `any`) go through the same [`mig_layout::choose`], which picks the
//! mechanism per GPU and may plan a new instance where the node allows it.

use smallvec::SmallVec;

use crate::explain::Reason;
use crate::ledger::{Ledger, NodeUse};
use crate::model::{Catalog, Cluster, Health, Node, NodeId};
use crate::placement::{GpuGrant, Placement, Scored, request_class};
use crate::request::{GpuAsk, Request, Wish};

mod mig;
pub mod mig_layout;

use mig::pinned_here;
pub use mig::{free_mig_instance, instance_slot, mig_grant};

pub use crate::placement::GpuSet;

/// A node that can take the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fit {
    /// GPUs that can each take the per-GPU ask (all of one architecture when the pod wants that).
    pub usable: GpuSet,
    /// How many of them the pod needs.
    pub need: u32,
}

/// The node, its use and the catalog, borrowed together.
#[derive(Clone, Copy)]
pub struct NodeView<'a> {
    pub node: &'a Node,
    pub used: &'a NodeUse,
    pub catalog: &'a Catalog,
}

impl<'a> NodeView<'a> {
    /// Node `id` of `cluster`, with its use as `ledger` has it.
    pub fn of(cluster: &'a Cluster, ledger: &'a Ledger, id: NodeId) -> NodeView<'a> {
        NodeView {
            node: cluster.node(id),
            used: ledger.node(id),
            catalog: &cluster.catalog,
        }
    }
}

/// A cheap, conservative test from the ledger's per-node maxima: `true` only when
/// [`check_gpus`] would certainly reject the node. Used where no reason is needed.
pub fn cannot_fit(used: &NodeUse, req: &Request) -> bool {
    let s = &used.summary;
    match &req.gpu {
        GpuAsk::Whole { count } => u32::from(s.idle_gpus) < *count,
        GpuAsk::Shared {
            memory,
            cores_milli,
            ..
        } => {
            *cores_milli > s.max_free_cores_milli
                || matches!(memory, crate::request::GpuMemory::Mib(m) if *m > s.max_free_memory_mib)
        }
        GpuAsk::None | GpuAsk::Mig { .. } => false,
    }
}

/// Checks one node. CPU-only requests only check CPU and memory.
pub fn check(view: NodeView<'_>, req: &Request) -> Result<Fit, Reason> {
    check_host(view, req)?;
    check_gpus(view, req)
}

/// CPU and memory.
pub fn check_host(view: NodeView<'_>, req: &Request) -> Result<(), Reason> {
    if req.cpu_milli > view.used.free_cpu_milli {
        return Err(Reason::Cpu {
            want_milli: req.cpu_milli,
        });
    }
    if req.memory_mib > view.used.free_memory_mib {
        return Err(Reason::Memory {
            want_mib: req.memory_mib,
        });
    }
    Ok(())
}

/// Everything about GPUs, without CPU and memory.
pub fn check_gpus(view: NodeView<'_>, req: &Request) -> Result<Fit, Reason> {
    let NodeView {
        node,
        used,
        catalog,
    } = view;
    let need = req.gpu.gpu_count();
    if need == 0 {
        return Ok(Fit {
            usable: GpuSet::new(),
            need: 0,
        });
    }
    let models = req.constraints.model_set;
    if !node.gpus.iter().any(|g| models.contains(g.model)) {
        return Err(Reason::ModelNotAllowed);
    }
    if (node.gpus.len() as u32) < need {
        return Err(Reason::TooFewGpus { want: need });
    }
    if node.gpus.iter().all(|g| g.health != Health::Healthy) {
        return Err(Reason::Unhealthy);
    }
    let pinned = &req.constraints.pinned_uuids;
    // Most rejections of a whole-GPU ask are settled by the ledger's summary
    // without the per-GPU pass: only idle GPUs can be granted, so too few idle
    // ones give the reason the pass would give (below 255: the summary saturates).
    if let GpuAsk::Whole { count } = req.gpu
        && pinned.is_empty()
        && used.summary.idle_gpus < u8::MAX
        && u32::from(used.summary.idle_gpus) < count
    {
        return Err(Reason::NotEnoughIdleGpus { want: count });
    }
    let mut usable = GpuSet::new();
    // Counts of GPUs that failed only on memory, only on compute: which reason to give.
    let (mut short_memory, mut short_cores, mut mode_ok) = (0u32, 0u32, 0u32);
    // MIG: a GPU offers the profile at all; an instance of it exists (free or not).
    let (mut any_mig, mut any_instance) = (false, false);
    for (i, (gpu, gu)) in node.gpus.iter().zip(&used.gpus).enumerate() {
        if gpu.health != Health::Healthy || !models.contains(gpu.model) {
            continue;
        }
        if !pinned_here(gpu, pinned) {
            continue;
        }
        let spec = catalog.spec(gpu.model);
        let ok = match &req.gpu {
            GpuAsk::None => false,
            GpuAsk::Whole { .. } => {
                if !gpu.mig_enabled {
                    mode_ok += 1;
                }
                !gpu.mig_enabled && gu.is_idle()
            }
            // A MIG instance served as a GPU (single strategy) is taken whole only.
            GpuAsk::Shared { .. } | GpuAsk::Mig { .. } if gpu.mig_instance => false,
            GpuAsk::Shared { .. } if req.level.is_some() => {
                mig_layout::choose(node, gpu, gu, spec, req).is_some()
            }
            GpuAsk::Shared {
                memory,
                cores_milli,
                ..
            } => {
                if mig_layout::in_mig_mode(gpu, gu) || gu.exclusive {
                    false
                } else {
                    mode_ok += 1;
                    let mem_ok = gu.free_memory_mib >= memory.resolve(spec.memory_mib);
                    let cores_ok = gu.free_cores_milli >= *cores_milli;
                    if !mem_ok {
                        short_memory += 1;
                    }
                    if mem_ok && !cores_ok {
                        short_cores += 1;
                    }
                    mem_ok && cores_ok
                }
            }
            GpuAsk::Mig { profile } => {
                if let (Some(geo), true) = (&spec.mig, gpu.mig_enabled)
                    && let Some((pi, _)) = geo.profile(profile)
                {
                    any_mig = true;
                    any_instance |= gpu.mig_instances.iter().any(|m| m.profile as usize == pi);
                }
                mig_layout::choose(node, gpu, gu, spec, req).is_some()
            }
        };
        if ok {
            usable.push(i as u8);
        }
    }
    if !pinned.is_empty() && (usable.len() as u32) < need {
        return Err(Reason::PinnedGpusUnavailable);
    }
    if (usable.len() as u32) < need {
        return Err(match &req.gpu {
            GpuAsk::Whole { count } => Reason::NotEnoughIdleGpus { want: *count },
            GpuAsk::Shared {
                count,
                memory,
                cores_milli,
            } => {
                if *count == 1 && mode_ok > 0 && short_memory == mode_ok {
                    let spec = node
                        .primary_model()
                        .map(|m| catalog.spec(m).memory_mib)
                        .unwrap_or(0);
                    Reason::NoGpuWithMemory {
                        want_mib: memory.resolve(spec),
                    }
                } else if *count == 1
                    && mode_ok > 0
                    && short_cores + short_memory == mode_ok
                    && short_cores > 0
                {
                    Reason::NoGpuWithCores {
                        want_milli: *cores_milli,
                    }
                } else {
                    Reason::NotEnoughSharedGpus { want: *count }
                }
            }
            GpuAsk::Mig { profile } if any_instance => Reason::NoMigSlot {
                profile: profile.clone(),
            },
            GpuAsk::Mig { profile } if any_mig => Reason::NoMigInstance {
                profile: profile.clone(),
            },
            GpuAsk::Mig { profile } => Reason::NoMigGpu {
                profile: profile.clone(),
            },
            GpuAsk::None => Reason::TooFewGpus { want: need },
        });
    }
    if need == 1 && mig_layout::ranks_mig_choices(req) {
        usable = mig_layout::least_fragmenting(view, req, &usable);
    }
    if req.constraints.single_architecture && need > 1 {
        usable = largest_architecture_group(node, catalog, &usable, need)
            .ok_or(Reason::MixedArchitecture)?;
    }
    if req.constraints.nvlink == Wish::Required
        && need > 1
        && nvlink_set(node, &usable, need).is_none()
    {
        return Err(Reason::NoNvlinkSet { want: need });
    }
    Ok(Fit { usable, need })
}

fn largest_architecture_group(
    node: &Node,
    catalog: &Catalog,
    usable: &GpuSet,
    need: u32,
) -> Option<GpuSet> {
    let arch = |i: u8| catalog.spec(node.gpus[i as usize].model).architecture;
    let first = arch(*usable.first()?);
    if usable.iter().all(|&i| arch(i) == first) {
        return Some(usable.clone());
    }
    let mut best: Option<GpuSet> = None;
    for &i in usable {
        let group: GpuSet = usable
            .iter()
            .copied()
            .filter(|&j| arch(j) == arch(i))
            .collect();
        if group.len() as u32 >= need && best.as_ref().is_none_or(|b| group.len() > b.len()) {
            best = Some(group);
        }
    }
    best
}

/// A set of `need` GPUs from `usable` that are pairwise NVLink-connected, if one exists.
pub fn nvlink_set(node: &Node, usable: &GpuSet, need: u32) -> Option<GpuSet> {
    fn extend(node: &Node, usable: &GpuSet, from: usize, chosen: &mut GpuSet, need: usize) -> bool {
        if chosen.len() == need {
            return true;
        }
        for k in from..usable.len() {
            let g = usable[k];
            if chosen
                .iter()
                .all(|&c| node.link(c as usize, g as usize).is_nvlink())
            {
                chosen.push(g);
                if extend(node, usable, k + 1, chosen, need) {
                    return true;
                }
                chosen.pop();
            }
        }
        false
    }
    let mut chosen = GpuSet::new();
    extend(node, usable, 0, &mut chosen, need as usize).then_some(chosen)
}

/// Quality of a GPU set's interconnect: the sum of pairwise link ranks, plus a bonus
/// when all GPUs share a NUMA node. Higher is better; a single GPU scores 0.
pub fn topology_quality(node: &Node, set: &[u8]) -> u32 {
    let mut sum = 0;
    for (a, &x) in set.iter().enumerate() {
        for &y in &set[a + 1..] {
            sum += node.link(x as usize, y as usize).rank();
        }
    }
    let numa = set.first().and_then(|&g| node.gpus[g as usize].numa);
    if set.len() > 1 && numa.is_some() && set.iter().all(|&g| node.gpus[g as usize].numa == numa) {
        sum += 50;
    }
    sum
}

/// The best-connected `need` GPUs of `usable` (exhaustive for up to 16 candidates, greedy above).
pub fn best_connected(node: &Node, usable: &GpuSet, need: u32, nvlink: Wish) -> GpuSet {
    let need = need as usize;
    if need <= 1 || usable.len() <= need {
        return usable
            .iter()
            .copied()
            .take(need.max(1).min(usable.len()))
            .collect();
    }
    if nvlink == Wish::Required
        && let Some(set) = nvlink_set(node, usable, need as u32)
        && set.len() == need
        && usable.len() > 16
    {
        return set;
    }
    if usable.len() <= 16 {
        let n = usable.len();
        let mut best: Option<(bool, u32, GpuSet)> = None;
        // Enumerate k-subsets by bitmask in increasing order (earlier GPUs win ties).
        for mask in 0u32..(1 << n) {
            if mask.count_ones() as usize != need {
                continue;
            }
            let set: GpuSet = (0..n)
                .filter(|i| mask & (1 << i) != 0)
                .map(|i| usable[i])
                .collect();
            let all_nv = set.iter().enumerate().all(|(a, &x)| {
                set[a + 1..]
                    .iter()
                    .all(|&y| node.link(x as usize, y as usize).is_nvlink())
            });
            if nvlink == Wish::Required && !all_nv {
                continue;
            }
            let q = topology_quality(node, &set);
            let better = match &best {
                None => true,
                Some((bnv, bq, _)) => (all_nv, q) > (*bnv, *bq),
            };
            if better {
                best = Some((all_nv, q, set));
            }
        }
        if let Some((_, _, set)) = best {
            return set;
        }
    }
    // Greedy: start from each GPU, add the one that raises quality most.
    let mut best: Option<(u32, GpuSet)> = None;
    for &seed in usable.iter() {
        let mut set: GpuSet = [seed].into_iter().collect();
        while set.len() < need {
            let next = usable
                .iter()
                .copied()
                .filter(|g| !set.contains(g))
                .max_by_key(|&g| {
                    let mut s = set.clone();
                    s.push(g);
                    topology_quality(node, &s)
                });
            match next {
                Some(g) => set.push(g),
                None => break,
            }
        }
        let q = topology_quality(node, &set);
        if best.as_ref().is_none_or(|(bq, _)| q > *bq) {
            best = Some((q, set));
        }
    }
    best.map(|(_, s)| s).unwrap_or_default()
}

impl Placement {
    /// The placement of `req` on node `id` (seen through `view`) with the GPUs
    /// and score a judge chose ([`crate::judge::judge`]).
    pub fn of(view: NodeView<'_>, req: &Request, id: NodeId, scored: Scored) -> Placement {
        Placement {
            node: id,
            grants: grants(view, req, &scored.gpus),
            cpu_milli: req.cpu_milli,
            memory_mib: req.memory_mib,
            class: request_class(req),
            score: scored.score,
            terms: scored.terms.to_vec(),
        }
    }
}

/// Grants for the chosen GPUs.
pub fn grants(view: NodeView<'_>, req: &Request, chosen: &[u8]) -> SmallVec<[GpuGrant; 8]> {
    chosen
        .iter()
        .filter_map(|&g| {
            let gpu = &view.node.gpus[g as usize];
            let spec = view.catalog.spec(gpu.model);
            match &req.gpu {
                GpuAsk::None => None,
                GpuAsk::Whole { .. } => Some(GpuGrant::whole(g, spec.memory_mib)),
                GpuAsk::Shared { .. } if req.level.is_some() => {
                    let gu = view.used.gpus.get(g as usize)?;
                    let choice = mig_layout::choose(view.node, gpu, gu, spec, req)?;
                    mig_layout::choice_grant(g, spec, req, choice)
                }
                GpuAsk::Shared {
                    memory,
                    cores_milli,
                    ..
                } => Some(GpuGrant::shared(
                    g,
                    memory.resolve(spec.memory_mib),
                    *cores_milli,
                )),
                GpuAsk::Mig { .. } => {
                    let gu = view.used.gpus.get(g as usize)?;
                    let choice = mig_layout::choose(view.node, gpu, gu, spec, req)?;
                    mig_layout::choice_grant(g, spec, req, choice)
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::Ledger;
    use crate::model::NodeId;
    use crate::model::demo::demo_cluster;

    fn view<'a>(c: &'a crate::model::Cluster, l: &'a Ledger, name: &str) -> NodeView<'a> {
        let id = c.node_id(name).unwrap();
        NodeView {
            node: c.node(id),
            used: l.node(id),
            catalog: &c.catalog,
        }
    }

    #[test]
    fn reasons_for_gpu_asks() {
        let c = demo_cluster();
        let l = Ledger::new(&c);
        // t4-1 has 2 GPUs: 4 whole GPUs cannot fit.
        assert_eq!(
            check(view(&c, &l, "t4-1"), &Request::whole(4, 0, 0)),
            Err(Reason::TooFewGpus { want: 4 })
        );
        // A T4 has 15,360 MiB: a 20,000 MiB share fits no single GPU.
        let mut r = Request::share_milli(100, 0, 0);
        r.gpu = GpuAsk::Shared {
            count: 1,
            memory: crate::request::GpuMemory::Mib(20_000),
            cores_milli: 100,
        };
        assert_eq!(
            check(view(&c, &l, "t4-1"), &r),
            Err(Reason::NoGpuWithMemory { want_mib: 20_000 })
        );
        // dgx-a100-2 has GPUs 0 and 1 in MIG mode; whole GPUs use the other six.
        let fit = check(view(&c, &l, "dgx-a100-2"), &Request::whole(6, 0, 0)).unwrap();
        assert_eq!(fit.usable.as_slice(), &[2, 3, 4, 5, 6, 7]);
        assert!(check(view(&c, &l, "dgx-a100-2"), &Request::whole(7, 0, 0)).is_err());
        let mig = Request {
            gpu: GpuAsk::Mig {
                profile: "3g.40gb".into(),
            },
            ..Request::default()
        };
        assert_eq!(
            check(view(&c, &l, "dgx-a100-2"), &mig)
                .unwrap()
                .usable
                .as_slice(),
            &[0, 1]
        );
        assert_eq!(
            check(view(&c, &l, "dgx-a100-1"), &mig),
            Err(Reason::NoMigGpu {
                profile: "3g.40gb".into()
            })
        );
        let _ = NodeId(0);
    }

    #[test]
    fn nvlink_required_and_topology_pick() {
        let c = demo_cluster();
        let l = Ledger::new(&c);
        let mut r = Request::whole(2, 0, 0);
        r.constraints.nvlink = Wish::Required;
        // PCIe-only L4 box: no NVLink pair.
        assert_eq!(
            check(view(&c, &l, "l4-1"), &r),
            Err(Reason::NoNvlinkSet { want: 2 })
        );
        assert!(check(view(&c, &l, "dgx-h100-1"), &r).is_ok());
        // On the L4 box, the best pair shares a PCIe switch: (0,1) or (2,3), not (1,2).
        let v = view(&c, &l, "l4-1");
        let fit = check(v, &Request::whole(2, 0, 0)).unwrap();
        let pick = best_connected(v.node, &fit.usable, 2, Wish::Off);
        assert_eq!(pick.as_slice(), &[0, 1]);
    }

    proptest::proptest! {
        /// `cannot_fit` never rejects a node the full filter would accept.
        #[test]
        fn quick_reject_is_conservative(
            grants in proptest::collection::vec((0u8..4, 0u32..=1000, 0u64..90_000, proptest::bool::ANY), 0..10),
            ask in (1u32..4, 0u32..=1000, 0u64..90_000, 0u8..3),
        ) {
            use crate::model::{Catalog, Cluster, Node};
            use crate::placement::{GpuGrant, Placement};
            use crate::request::GpuMemory;
            let cat = Catalog::default();
            let a100 = cat.find("A100-80GB").unwrap();
            let c = Cluster::new(cat, vec![Node::uniform("n", 64_000, 1 << 20, a100, 4)]).unwrap();
            let mut l = Ledger::new(&c);
            for (gpu, cores, mem, whole) in grants {
                let g = if whole { GpuGrant::whole(gpu, 81_920) } else { GpuGrant::shared(gpu, mem, cores) };
                let _ = l.apply(&c, &Placement { node: NodeId(0), grants: [g].into_iter().collect(), ..Default::default() });
            }
            let (count, cores, mem, kind) = ask;
            let mut req = Request::whole(count, 0, 0);
            if kind > 0 {
                req.gpu = GpuAsk::Shared {
                    count,
                    memory: if kind == 1 { GpuMemory::Mib(mem) } else { GpuMemory::PerMille(cores) },
                    cores_milli: cores,
                };
            }
            let v = NodeView { node: c.node(NodeId(0)), used: l.node(NodeId(0)), catalog: &c.catalog };
            if cannot_fit(v.used, &req) {
                proptest::prop_assert!(check_gpus(v, &req).is_err());
            }
        }
    }
}
