//! MIG in the filter: which existing instance a request can take, and its grant.
//!
//! An instance that exists is granted as it is; one the node agent is to create
//! (dynamic MIG) is planned in [`super::mig_layout`]. The ledger
//! tracks MIG use by memory slices, and instances never share slices, so an
//! instance is free exactly when none of its slices is in use.

use crate::ledger::GpuUse;
use crate::model::{Gpu, MigGeometry, MigInstance, MigProfile};
use crate::placement::{GpuGrant, MigSlot};

/// The ledger slot of an existing MIG instance, when its profile and placement are valid.
pub fn instance_slot(geo: &MigGeometry, instance: &MigInstance) -> Option<MigSlot> {
    let p = geo.profiles.get(instance.profile as usize)?;
    geo.placement_mask(p, instance.start)?;
    Some(MigSlot {
        profile: instance.profile,
        start: instance.start,
        size: p.memory_slices,
        compute: p.compute_slices,
    })
}

/// The first existing instance of profile `pi` on `gpu` that nobody holds, with its
/// slot. An instance is free when none of its memory slices is in use: instances
/// never share slices, so that is exactly "not granted". With `pinned` UUIDs, only
/// an instance named there (or any instance of a GPU named there) will do.
pub fn free_mig_instance<'g>(
    gpu: &'g Gpu,
    gu: &GpuUse,
    geo: &MigGeometry,
    pi: usize,
    pinned: &[String],
) -> Option<(&'g MigInstance, MigSlot)> {
    let p = geo.profiles.get(pi)?;
    if gu
        .mig_instances
        .get(pi)
        .is_none_or(|&n| n >= p.max_instances)
        || gu.mig_compute_slices + p.compute_slices > geo.compute_slices
    {
        return None;
    }
    let gpu_pinned = pinned.is_empty() || pinned.contains(&gpu.uuid);
    gpu.mig_instances
        .iter()
        .filter(|m| m.profile as usize == pi)
        .filter(|m| gpu_pinned || (!m.uuid.is_empty() && pinned.contains(&m.uuid)))
        .find_map(|m| {
            let slot = instance_slot(geo, m)?;
            (gu.mig_memory_slices & slot.mask() == 0).then_some((m, slot))
        })
}

/// Whether `gpu` is one the pinned UUIDs name: itself, or (for MIG) one of its instances.
pub(super) fn pinned_here(gpu: &Gpu, pinned: &[String]) -> bool {
    pinned.is_empty()
        || pinned.contains(&gpu.uuid)
        || gpu
            .mig_instances
            .iter()
            .any(|m| !m.uuid.is_empty() && pinned.contains(&m.uuid))
}

/// The grant of one MIG instance: its memory, and its share of the GPU's compute so
/// that the ledger, metrics and explanations count it like any other grant.
pub fn mig_grant(gpu: u8, geo: &MigGeometry, profile: &MigProfile, slot: MigSlot) -> GpuGrant {
    GpuGrant {
        gpu,
        memory_mib: profile.memory_mib,
        cores_milli: geo.compute_milli(profile),
        exclusive: false,
        mig: Some(slot),
    }
}

#[cfg(test)]
mod tests {
    use super::super::{NodeView, check, grants};
    use crate::explain::Reason;
    use crate::ledger::Ledger;
    use crate::model::NodeId;
    use crate::placement::{MigSlot, Placement};
    use crate::request::{GpuAsk, Request};

    fn view<'a>(c: &'a crate::model::Cluster, l: &'a Ledger, name: &str) -> NodeView<'a> {
        let id = c.node_id(name).unwrap();
        NodeView {
            node: c.node(id),
            used: l.node(id),
            catalog: &c.catalog,
        }
    }

    /// One A100-80GB node: GPU 0 in MIG mode with `layout`, GPU 1 plain.
    fn mig_cluster(layout: &[&str]) -> crate::model::Cluster {
        use crate::model::{Catalog, Cluster, Node, file::mig_instances};
        let cat = Catalog::default();
        let a100 = cat.find("A100-80GB").unwrap();
        let mut n = Node::uniform("n", 64_000, 1 << 20, a100, 2);
        n.gpus[0].uuid = "GPU-0".into();
        n.gpus[0].mig_enabled = true;
        n.gpus[0].mig_instances = mig_instances(&cat, a100, "GPU-0", layout).unwrap();
        Cluster::new(cat, vec![n]).unwrap()
    }

    fn mig(profile: &str) -> Request {
        Request {
            gpu: GpuAsk::Mig {
                profile: profile.into(),
            },
            ..Request::default()
        }
    }

    fn place(c: &crate::model::Cluster, l: &Ledger, req: &Request) -> Result<Placement, Reason> {
        let v = view(c, l, "n");
        let fit = check(v, req)?;
        Ok(Placement {
            node: NodeId(0),
            grants: grants(v, req, &fit.usable[..fit.need as usize]),
            ..Placement::default()
        })
    }

    #[test]
    fn mig_takes_only_existing_free_instances() {
        // GPU 0: 1g.10gb at slice 0, 3g.40gb at slice 4 (the layout puts 3g at its first
        // free start after the 1g took slice 0: start 0 overlaps, so 4).
        let c = mig_cluster(&["1g.10gb", "3g.40gb"]);
        let mut l = Ledger::new(&c);
        let p = place(&c, &l, &mig("3g.40gb")).unwrap();
        let g = p.grants[0];
        assert_eq!(
            (g.gpu, g.mig.unwrap().start, g.mig.unwrap().size),
            (0, 4, 4)
        );
        // 40,192 MiB and 3 of 7 compute slices: 3000 / 7 = 428 per-mille.
        assert_eq!((g.memory_mib, g.cores_milli), (40_192, 428));
        l.apply(&c, &p).unwrap();
        assert_eq!(l.node(NodeId(0)).gpus[0].free_cores_milli, 1000 - 428);
        // Its one 3g instance is taken; a 4g.40gb would fit the free slices 0..3 but no
        // such instance exists, and Tessera does not create one.
        assert_eq!(
            place(&c, &l, &mig("3g.40gb")),
            Err(Reason::NoMigSlot {
                profile: "3g.40gb".into()
            })
        );
        assert_eq!(
            place(&c, &l, &mig("4g.40gb")),
            Err(Reason::NoMigInstance {
                profile: "4g.40gb".into()
            })
        );
        assert!(place(&c, &l, &mig("1g.10gb")).is_ok());
        // Whole GPUs and shares keep to the plain GPU 1.
        assert_eq!(
            place(&c, &l, &Request::whole(1, 0, 0)).unwrap().grants[0].gpu,
            1
        );
        assert_eq!(
            place(&c, &l, &Request::share_milli(300, 0, 0))
                .unwrap()
                .grants[0]
                .gpu,
            1
        );
        assert_eq!(
            place(&c, &l, &Request::whole(2, 0, 0)),
            Err(Reason::NotEnoughIdleGpus { want: 2 })
        );
    }

    #[test]
    fn a_pinned_mig_uuid_picks_that_instance() {
        let c = mig_cluster(&["3g.40gb", "3g.40gb"]);
        let l = Ledger::new(&c);
        let second = c.nodes()[0].gpus[0].mig_instances[1].clone();
        let mut req = mig("3g.40gb");
        req.constraints.pinned_uuids = vec![second.uuid.clone()];
        let p = place(&c, &l, &req).unwrap();
        assert_eq!(p.grants[0].mig.unwrap().start, second.start);
        req.constraints.pinned_uuids = vec!["MIG-elsewhere".into()];
        assert_eq!(place(&c, &l, &req), Err(Reason::PinnedGpusUnavailable));
    }

    proptest::proptest! {
        /// Whatever the layout and the order of asks and releases, every MIG grant is an
        /// existing instance, no instance is held twice, and an ask is refused only when
        /// no instance of its profile is free.
        #[test]
        fn mig_instances_are_granted_at_most_once(
            layout in 0usize..4,
            ops in proptest::collection::vec((0usize..4, proptest::bool::ANY), 1..40),
        ) {
            let layouts: [&[&str]; 4] = [
                &["3g.40gb", "3g.40gb"],
                &["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"],
                &["1g.10gb"; 7],
                &[],
            ];
            let profiles = ["1g.10gb", "2g.20gb", "3g.40gb", "7g.80gb"];
            let c = mig_cluster(layouts[layout]);
            let mut l = Ledger::new(&c);
            let mut live: Vec<(crate::ledger::AllocId, MigSlot)> = Vec::new();
            let instances = &c.nodes()[0].gpus[0].mig_instances;
            for (k, release) in ops {
                if release && !live.is_empty() {
                    let (id, _) = live.remove(k % live.len());
                    l.release(id).unwrap();
                    continue;
                }
                let profile = profiles[k];
                let free = instances.iter().filter(|m| {
                    c.catalog.spec(c.nodes()[0].gpus[0].model).mig.as_ref().unwrap()
                        .profiles[m.profile as usize].name == profile
                        && !live.iter().any(|(_, s)| s.start == m.start)
                }).count();
                match place(&c, &l, &mig(profile)) {
                    Ok(p) => {
                        let slot = p.grants[0].mig.unwrap();
                        proptest::prop_assert!(free > 0);
                        proptest::prop_assert!(instances.iter().any(|m| m.start == slot.start && m.profile == slot.profile));
                        proptest::prop_assert!(!live.iter().any(|(_, s)| s.start == slot.start));
                        live.push((l.apply(&c, &p).unwrap(), slot));
                    }
                    Err(_) => proptest::prop_assert_eq!(free, 0),
                }
            }
        }
    }
}
