use super::*;
use crate::explain::Reason;
use crate::fit::{NodeView, check, grants};
use crate::ledger::{AllocId, Ledger};
use crate::model::{Catalog, Cluster, Node, NodeId, file::mig_instances};
use crate::placement::Placement;
use crate::request::IsolationLevel::{Any, Hard, Soft};

fn geo(model: &str) -> MigGeometry {
    let c = Catalog::default();
    c.spec(c.find(model).unwrap()).mig.clone().unwrap()
}

fn pi(geo: &MigGeometry, name: &str) -> u8 {
    geo.profile(name).unwrap().0 as u8
}

/// Every set of placements of the model, checked against the placement table the
/// slow way: allowed starts, disjoint slices, compute and instance limits.
fn valid_by_table(geo: &MigGeometry, layout: &[(u8, u8)]) -> bool {
    let mut slices = [false; 8];
    let mut compute = 0u32;
    for (k, &(p, s)) in layout.iter().enumerate() {
        let Some(prof) = geo.profiles.get(p as usize) else {
            return false;
        };
        if !prof.starts.contains(&s) || s + prof.memory_slices > geo.memory_slices.min(8) {
            return false;
        }
        for i in s..s + prof.memory_slices {
            if slices[i as usize] {
                return false;
            }
            slices[i as usize] = true;
        }
        compute += u32::from(prof.compute_slices);
        let same = layout[..=k].iter().filter(|(q, _)| *q == p).count();
        if same > prof.max_instances as usize {
            return false;
        }
    }
    compute <= u32::from(geo.compute_slices)
}

#[test]
fn validate_follows_the_placement_table() {
    let g = geo("A100-80GB");
    let (p1, p2, p3, p4, p7) = (
        pi(&g, "1g.10gb"),
        pi(&g, "2g.20gb"),
        pi(&g, "3g.40gb"),
        pi(&g, "4g.40gb"),
        pi(&g, "7g.80gb"),
    );
    // NVIDIA's balanced layout and 4g + 3g are valid; 3g may not start at 2; two 4g
    // cannot both start at 0; seven 1g plus a 2g exceed the compute slices.
    // A 1g may not start at slice 7 (only 7 compute slices, KEP-4815's diagram).
    assert!(matches!(
        validate(&g, &[(p3, 0), (p2, 4), (p1, 6), (p1, 7)]),
        Err(LayoutError::BadPlacement { .. })
    ));
    assert!(validate(&g, &[(p3, 4), (p2, 0), (p1, 2), (p1, 3)]).is_ok());
    assert!(validate(&g, &[(p4, 0), (p3, 4)]).is_ok());
    assert!(matches!(
        validate(&g, &[(p3, 2)]),
        Err(LayoutError::BadPlacement { .. })
    ));
    assert!(matches!(
        validate(&g, &[(p4, 0), (p3, 0)]),
        Err(LayoutError::Overlap { .. })
    ));
    assert!(matches!(
        validate(&g, &[(p7, 0), (p1, 0)]),
        Err(LayoutError::Overlap { .. })
    ));
    assert!(matches!(
        validate(&g, &[(9, 0)]),
        Err(LayoutError::NoSuchProfile(9))
    ));
    let sevens: Vec<(u8, u8)> = (0..7).map(|s| (p1, s)).collect();
    assert!(validate(&g, &sevens).is_ok());
    // The layouts `MigGeometry::layout` builds (what admins configure) validate.
    for names in [
        &["1g.10gb"; 7][..],
        &["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"],
        &["4g.40gb", "3g.40gb"],
        &["7g.80gb"],
    ] {
        assert!(validate(&g, &g.layout(names).unwrap()).is_ok(), "{names:?}");
    }
}

#[test]
fn smallest_covering_profile_and_least_fragmenting_start() {
    let g = geo("H100-80GB");
    let names = |v: Vec<usize>| -> Vec<String> {
        v.into_iter().map(|i| g.profiles[i].name.clone()).collect()
    };
    // 30 % of compute and 24 GiB: 3g.40gb is the smallest (2g has 20 GiB, 285 ‰).
    assert_eq!(
        names(covering_profiles(&g, 24_576, 300))[0],
        "3g.40gb".to_string()
    );
    // 10 % and 8 GiB: 1g.10gb; +me profiles are never chosen for a share.
    let c = names(covering_profiles(&g, 8_192, 100));
    assert_eq!(c[0], "1g.10gb");
    assert!(c.iter().all(|n| !n.contains('+')));
    assert!(covering_profiles(&g, 90_000, 100).is_empty());
    // With a 3g held at slices 0..3, slices 4..7 and 4 compute slices are free. A 1g
    // at 6 keeps room for a 2g at 4; a 1g at 4 would leave only 1g-sized holes.
    let p3 = pi(&g, "3g.40gb") as usize;
    let p1 = pi(&g, "1g.10gb") as usize;
    let held = Held::default().with(&g, p3, 0);
    assert_eq!(best_start(&g, held, p1), Some(6));
    // Either way 2 more compute slices are usable (slice 7 needs a 1g.20gb at 6),
    // but only the 1g at 6 leaves a 2g possible.
    assert_eq!(usable_compute(&g, held.with(&g, p1, 6)), (2, 2));
    assert_eq!(usable_compute(&g, held.with(&g, p1, 4)), (2, 1));
}

/// The terms a new instance is ranked by, on an A100-80GB (7 compute, 8 memory
/// slices): what is left free, how much of that the layout strands, and the
/// largest instance still possible.
#[test]
fn leftover_of_a_new_instance() {
    let g = geo("A100-80GB");
    let (p1, p3, p4) = (
        pi(&g, "1g.10gb") as usize,
        pi(&g, "3g.40gb") as usize,
        pi(&g, "4g.40gb") as usize,
    );
    let lo = |held, p, s| leftover(&g, held, p, s);
    let empty = Held::default();
    // A 3g at 4 on an empty GPU: 7 − 3 = 4 free, all usable by the 4g at 0.
    assert_eq!(
        lo(empty, p3, 4),
        Some(Leftover {
            free: 4,
            stranded: 0,
            largest: 4
        })
    );
    // A 3g at 0: 4 free, but slices 4-7 hold at most another 3g: 1 stranded.
    assert_eq!(
        lo(empty, p3, 0),
        Some(Leftover {
            free: 4,
            stranded: 1,
            largest: 3
        })
    );
    // Beside a held 4g at 0 the 3g at 4 fills the GPU exactly.
    let four = empty.with(&g, p4, 0);
    assert_eq!(
        lo(four, p3, 4),
        Some(Leftover {
            free: 0,
            stranded: 0,
            largest: 0
        })
    );
    // No room: overlapping the held 4g, a start the profile does not allow, an
    // unknown profile.
    assert_eq!(lo(four, p3, 0), None);
    assert_eq!(lo(empty, p3, 2), None);
    assert_eq!(lo(empty, 99, 0), None);
    // The same order `best_start` picks by: least stranded first.
    assert_eq!(best_start(&g, empty, p3), Some(4));
    assert_eq!(lo(four, p1, 4).map(|l| l.stranded), Some(0));
}

/// One node of two H100s under `label` for `tessera.io/mig-dynamic`; GPU 0 in
/// MIG mode with `layout`.
fn node_cluster(label: Option<&str>, layout: &[&str]) -> Cluster {
    model_node_cluster("H100-80GB", label, layout)
}

/// [`node_cluster`] of two GPUs of `model`.
fn model_node_cluster(model: &str, label: Option<&str>, layout: &[&str]) -> Cluster {
    let cat = Catalog::default();
    let h100 = cat.find(model).unwrap();
    let mut n = Node::uniform("n", 256_000, 1 << 21, h100, 2);
    if let Some(l) = label {
        n.labels.insert(LABEL_MIG_DYNAMIC.into(), l.into());
    }
    n.gpus[0].uuid = "GPU-0".into();
    if !layout.is_empty() {
        n.gpus[0].mig_enabled = true;
        n.gpus[0].mig_instances = mig_instances(&cat, h100, "GPU-0", layout).unwrap();
    }
    Cluster::new(cat, vec![n]).unwrap()
}

fn place(c: &Cluster, l: &Ledger, req: &Request) -> Option<Placement> {
    let v = NodeView {
        node: c.node(NodeId(0)),
        used: l.node(NodeId(0)),
        catalog: &c.catalog,
    };
    let fit = check(v, req).ok()?;
    // The lowest usable GPU, so tests can say which GPU they expect.
    Some(Placement {
        node: NodeId(0),
        grants: grants(v, req, &fit.usable[..1]),
        ..Placement::default()
    })
}

#[test]
fn hard_soft_and_any_choose_per_gpu() {
    // Static layout, no dynamic MIG: a hard 30 % share takes the free 3g.40gb.
    let c = node_cluster(None, &["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"]);
    let mut l = Ledger::new(&c);
    let hard = Request::share_level(300, Hard, 0, 0);
    let p = place(&c, &l, &hard).unwrap();
    let slot = p.grants[0].mig.unwrap();
    assert_eq!((p.grants[0].gpu, slot.start, slot.size), (0, 4, 4));
    assert_eq!(mechanism(&hard, &p.grants[0]), Isolation::Mig);
    assert_eq!(mig_intent(&c.nodes()[0].gpus[0], &slot), (false, false));
    l.apply(&c, &p).unwrap();
    // The next hard 30 % share finds no 3g instance; the node may not create one, so
    // it gets the whole plain GPU 1.
    let p = place(&c, &l, &hard).unwrap();
    assert_eq!((p.grants[0].gpu, p.grants[0].exclusive), (1, true));
    assert_eq!(mechanism(&hard, &p.grants[0]), Isolation::Exclusive);
    // Soft goes to the plain GPU only; any takes the 1g instance on the MIG GPU
    // first (lowest GPU here), sized to the request.
    let soft = Request::share_level(100, Soft, 0, 0);
    assert_eq!(place(&c, &l, &soft).unwrap().grants[0].gpu, 1);
    let any = Request::share_level(100, Any, 0, 0);
    let p = place(&c, &l, &any).unwrap();
    let geo = geo("H100-80GB");
    assert_eq!(
        geo.profiles[p.grants[0].mig.unwrap().profile as usize].name,
        "1g.10gb"
    );
    // Explicit requests keep their old meaning: a plain MPS share never lands on MIG.
    let plain = Request::share_milli(100, 0, 0);
    assert_eq!(place(&c, &l, &plain).unwrap().grants[0].gpu, 1);
}

#[test]
fn dynamic_mig_creates_instances_and_switches_modes_only_where_allowed() {
    let hard = Request::share_level(300, Hard, 0, 0);
    // `mode`: an idle plain GPU is switched into MIG mode for a 3g.40gb.
    let c = node_cluster(Some("mode"), &[]);
    let mut l = Ledger::new(&c);
    let p = place(&c, &l, &hard).unwrap();
    let slot = p.grants[0].mig.unwrap();
    assert_eq!(mig_intent(&c.nodes()[0].gpus[0], &slot), (true, true));
    l.apply(&c, &p).unwrap();
    // A plain share may no longer use that GPU (a switch is under way); it goes to GPU 1.
    let p2 = place(&c, &l, &Request::share_milli(100, 0, 0)).unwrap();
    assert_eq!(p2.grants[0].gpu, 1);
    l.apply(&c, &p2).unwrap();
    // A second hard share is created next to the first, never over it.
    let p3 = place(&c, &l, &hard).unwrap();
    let s3 = p3.grants[0].mig.unwrap();
    assert_eq!(p3.grants[0].gpu, 0);
    assert_eq!(s3.mask() & slot.mask(), 0);
    l.apply(&c, &p3).unwrap();
    // Whole GPUs are refused on the switched GPU by the ledger too.
    let whole = Placement {
        node: NodeId(0),
        grants: [GpuGrant::shared(0, 1000, 10)].into_iter().collect(),
        ..Placement::default()
    };
    assert!(l.apply(&c, &whole).is_err());

    // `instances`: no mode switch, so the idle plain GPUs give a hard share whole.
    let c = node_cluster(Some("instances"), &[]);
    let l = Ledger::new(&c);
    let p = place(&c, &l, &hard).unwrap();
    assert!(p.grants[0].exclusive);
    // ... but not a share larger than the GPU.
    let mut huge = hard.clone();
    huge.gpu = GpuAsk::Shared {
        count: 1,
        memory: crate::request::GpuMemory::Mib(90_000),
        cores_milli: 100,
    };
    assert!(place(&c, &l, &huge).is_none());
    // Without the label the ledger refuses a planned switch outright.
    let c = node_cluster(None, &[]);
    let mut l = Ledger::new(&c);
    let forged = Placement {
        node: NodeId(0),
        grants: [super::super::mig_grant(
            0,
            &geo("H100-80GB"),
            &geo("H100-80GB").profiles[4],
            slot,
        )]
        .into_iter()
        .collect(),
        ..Placement::default()
    };
    assert!(l.apply(&c, &forged).is_err());

    // `instances` on a GPU in MIG mode with a free 1g: a 3g is created in free
    // space, and the explanation says so.
    let c = node_cluster(Some("instances"), &["1g.10gb"]);
    let l = Ledger::new(&c);
    let p = place(&c, &l, &hard).unwrap();
    let s = p.grants[0].mig.unwrap();
    assert_eq!((p.grants[0].gpu, s.start), (0, 4));
    assert_eq!(mig_intent(&c.nodes()[0].gpus[0], &s), (true, false));
    let spec = c.catalog.spec(c.nodes()[0].gpus[0].model);
    let why = describe(
        spec,
        &hard,
        choose(
            &c.nodes()[0],
            &c.nodes()[0].gpus[0],
            &l.node(NodeId(0)).gpus[0],
            spec,
            &hard,
        )
        .unwrap(),
    );
    assert!(why.contains("3g.40gb") && why.contains("creates"), "{why}");
    // The same sentence from the grant itself (before it is applied).
    let gpu = &c.nodes()[0].gpus[0];
    assert_eq!(explain_grant(gpu, spec, &hard, &p.grants[0]), Some(why));
    assert_eq!(
        explain_grant(gpu, spec, &Request::share_milli(300, 0, 0), &p.grants[0]),
        None
    );
}

#[test]
fn a_hard_share_goes_where_its_instance_strands_least() {
    // Both GPUs in MIG mode, instances may be created. GPU 0 holds a 3g at 4 (a
    // new 3g at 0 would strand the seventh compute slice); GPU 1 holds a 4g at 0
    // (a 3g at 4 fills it exactly). The lowest usable GPU is GPU 1.
    let cat = Catalog::default();
    let h100 = cat.find("H100-80GB").unwrap();
    let mut n = Node::uniform("n", 256_000, 1 << 21, h100, 2);
    n.labels
        .insert(LABEL_MIG_DYNAMIC.into(), "instances".into());
    n.gpus[0].mig_enabled = true;
    n.gpus[1].mig_enabled = true;
    let c = Cluster::new(cat, vec![n]).unwrap();
    let g = geo("H100-80GB");
    let mut l = Ledger::new(&c);
    for (gpu, name, start) in [(0u8, "3g.40gb", 4u8), (1, "4g.40gb", 0)] {
        let pi = pi(&g, name) as usize;
        let held = Placement {
            node: NodeId(0),
            grants: [super::super::mig_grant(
                gpu,
                &g,
                &g.profiles[pi],
                slot_of(&g, pi, start),
            )]
            .into_iter()
            .collect(),
            ..Placement::default()
        };
        l.apply(&c, &held).unwrap();
    }
    let hard = Request::share_level(300, Hard, 0, 0);
    let p = place(&c, &l, &hard).unwrap();
    let s = p.grants[0].mig.unwrap();
    assert_eq!((p.grants[0].gpu, s.start), (1, 4));
}

#[test]
fn parse_levels() {
    let p = |ann: &str, res: &[(&str, &str)]| {
        crate::request::parse(
            res.iter().copied(),
            [("tessera.io/isolation", ann)],
            &Catalog::default(),
        )
    };
    let r = p(
        "hard",
        &[
            ("tessera.io/gpu-memory", "20Gi"),
            ("tessera.io/gpu-cores", "30"),
        ],
    )
    .unwrap();
    assert_eq!(r.level, Some(Hard));
    assert_eq!(r.isolation, Isolation::Mps);
    assert_eq!(
        p("any", &[("tessera.io/gpu-milli", "300")]).unwrap().level,
        Some(Any)
    );
    assert_eq!(
        p("soft", &[("tessera.io/gpu-memory", "8Gi")])
            .unwrap()
            .isolation,
        Isolation::TimeSlice
    );
    // Whole GPUs are hard already; a share level on them or on CPU-only pods is an error.
    let w = p("hard", &[("tessera.io/gpu", "1")]).unwrap();
    assert_eq!((w.level, w.isolation), (None, Isolation::Exclusive));
    assert!(p("soft", &[("tessera.io/gpu", "1")]).is_err());
    assert!(p("any", &[]).is_err());
    // One mechanism per pod: hard and any only for a share of one GPU.
    let two = [("tessera.io/gpu", "2"), ("tessera.io/gpu-milli", "300")];
    assert!(p("hard", &two).is_err() && p("any", &two).is_err());
    assert_eq!(p("soft", &two).unwrap().level, Some(Soft));
    // The old values parse as before, with no level.
    let m = p("mps", &[("tessera.io/gpu-milli", "300")]).unwrap();
    assert_eq!((m.level, m.isolation), (None, Isolation::Mps));
}

#[derive(Debug, Clone)]
enum Op {
    Ask(u32, u8),
    Release(usize),
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (1u32..=1000, 0u8..3).prop_map(|(m, l)| Op::Ask(m, l)),
        1 => (0usize..64).prop_map(Op::Release),
    ]
}

proptest::proptest! {
    /// Whatever the starting layout, node policy and order of hard/soft/any asks and
    /// releases: every layout the core produces (the held instances of each GPU) is
    /// valid by the placement table, and a new instance never touches one an
    /// allocation holds (it keeps every held instance where it was).
    #[test]
    fn layouts_stay_valid_and_held_instances_untouched(
        a30 in proptest::bool::ANY,
        start in 0usize..4,
        label in 0usize..3,
        ops in proptest::collection::vec(op(), 1..60),
    ) {
        // The 7-by-8 GH100 geometry, and the A30's 4-by-4.
        let (model, layouts): (&str, [&[&str]; 4]) = if a30 {
            ("A30", [
                &[],
                &["1g.6gb"; 4],
                &["2g.12gb", "1g.6gb", "1g.6gb"],
                &["1g.6gb", "2g.12gb"],
            ])
        } else {
            ("H100-80GB", [
                &[],
                &["1g.10gb"; 7],
                &["2g.20gb", "1g.10gb", "1g.10gb", "3g.40gb"],
                &["4g.40gb", "1g.10gb"],
            ])
        };
        let labels = [None, Some("instances"), Some("mode")];
        let c = model_node_cluster(model, labels[label], layouts[start]);
        let g = geo(model);
        let mut l = Ledger::new(&c);
        let mut live: Vec<AllocId> = Vec::new();
        let held = |l: &Ledger, gpu: u8| -> Vec<(u8, u8)> {
            l.allocations()
                .flat_map(|(_, p)| p.grants.iter())
                .filter(|gr| gr.gpu == gpu)
                .filter_map(|gr| gr.mig.map(|s| (s.profile, s.start)))
                .collect()
        };
        for op in ops {
            match op {
                Op::Release(i) => {
                    if !live.is_empty() {
                        let id = live.swap_remove(i % live.len());
                        l.release(id).unwrap();
                    }
                }
                Op::Ask(milli, lv) => {
                    let level = [Hard, Soft, Any][lv as usize];
                    let req = Request::share_level(milli, level, 0, 0);
                    let before: Vec<Vec<(u8, u8)>> = (0..2).map(|gpu| held(&l, gpu)).collect();
                    if let Some(p) = place(&c, &l, &req) {
                        let gr = p.grants[0];
                        if let Some(slot) = gr.mig {
                            let mut after = before[gr.gpu as usize].clone();
                            after.push((slot.profile, slot.start));
                            // The re-partition keeps every held instance and is valid.
                            proptest::prop_assert!(can_become(&g, &before[gr.gpu as usize], &after));
                            proptest::prop_assert!(valid_by_table(&g, &after));
                            // Only a hard or any share gets MIG, and it covers the ask.
                            proptest::prop_assert!(level != Soft);
                            let prof = &g.profiles[slot.profile as usize];
                            proptest::prop_assert!(g.compute_milli(prof) >= milli);
                            // A created instance needs a node that allows it.
                            let (create, switch) = mig_intent(&c.nodes()[0].gpus[gr.gpu as usize], &slot);
                            if create { proptest::prop_assert!(label >= 1); }
                            if switch { proptest::prop_assert_eq!(label, 2); }
                        }
                        live.push(l.apply(&c, &p).unwrap());
                    }
                    for gpu in 0..2u8 {
                        let now = held(&l, gpu);
                        proptest::prop_assert!(validate(&g, &now).is_ok());
                        proptest::prop_assert!(valid_by_table(&g, &now));
                        proptest::prop_assert!(before[gpu as usize].iter().all(|h| now.contains(h)));
                    }
                }
            }
        }
    }

    /// `validate` agrees with the table on arbitrary sets of placements.
    #[test]
    fn validate_agrees_with_the_table(
        a30 in proptest::bool::ANY,
        layout in proptest::collection::vec((0u8..7, 0u8..8), 0..9),
    ) {
        let g = geo(if a30 { "A30" } else { "A100-40GB" });
        proptest::prop_assert_eq!(validate(&g, &layout).is_ok(), valid_by_table(&g, &layout));
    }
}

/// Across nodes, a hard share goes where it gets a free instance before any node
/// that would hand it a whole GPU, whatever the policy thinks of a 30 % share.
#[test]
fn nodes_rank_by_isolation_tier_before_the_policy() {
    use crate::policy::{PolicyArgs, by_name};
    use crate::scheduler::{Decision, Scheduler};
    use rand::SeedableRng;
    let c = crate::model::demo::demo_cluster();
    let l = Ledger::new(&c);
    let hard = Request::share_level(300, Hard, 0, 0);
    for policy in ["tessera", "bestfit", "binpack", "spread"] {
        let mut s = Scheduler::new(by_name(policy, &PolicyArgs::default()).unwrap());
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let Decision::Place(p) = s.decide(&c, &l, &hard, &mut rng) else {
            panic!("{policy}: a hard share fits the demo cluster");
        };
        assert_eq!(c.node(p.node).name, "dgx-a100-2", "{policy}");
        assert!(p.grants[0].mig.is_some(), "{policy}");
        // Requests without a level keep the policy's own scores.
        let plain = Request::share_milli(300, 0, 0);
        let Decision::Place(q) = s.decide(&c, &l, &plain, &mut rng) else {
            panic!("{policy}: a share fits");
        };
        assert!(
            q.terms.iter().all(|t| t.name != "isolation-tier"),
            "{policy}"
        );
    }
}

/// A pod that names a profile itself (`tessera.io/mig-3g.40gb`) on a node that
/// allows dynamic MIG gets an instance planned like a hard share's: at a valid
/// placement, in free MIG space, never over a held one; an instance that exists
/// comes first. Without the label the old reason stands: none exists.
#[test]
fn explicit_profile_plans_an_instance_where_mig_is_dynamic() {
    let mig = |profile: &str| Request {
        gpu: GpuAsk::Mig {
            profile: profile.into(),
        },
        isolation: Isolation::Mig,
        ..Request::default()
    };
    let g = geo("H100-80GB");
    let p3 = pi(&g, "3g.40gb");
    let reason = |c: &Cluster, l: &Ledger, req: &Request| {
        check(
            NodeView {
                node: c.node(NodeId(0)),
                used: l.node(NodeId(0)),
                catalog: &c.catalog,
            },
            req,
        )
        .err()
    };

    // Not dynamic: GPU 0 in MIG mode with a 1g only: no 3g exists, none is planned.
    let c = node_cluster(None, &["1g.10gb"]);
    let l = Ledger::new(&c);
    assert_eq!(
        reason(&c, &l, &mig("3g.40gb")),
        Some(Reason::NoMigInstance {
            profile: "3g.40gb".into()
        })
    );

    // `instances`: the same GPU gets a 3g in its free slices 4..7 (a 3g may start
    // at 0 or 4; the 1g holds slice 0), created by the node agent.
    let c = node_cluster(Some("instances"), &["1g.10gb"]);
    let mut l = Ledger::new(&c);
    let p = place(&c, &l, &mig("3g.40gb")).unwrap();
    let slot = p.grants[0].mig.unwrap();
    assert_eq!(
        (p.grants[0].gpu, slot.profile, slot.start, slot.size),
        (0, p3, 4, 4)
    );
    assert!(valid_by_table(&g, &[(pi(&g, "1g.10gb"), 0), (p3, 4)]));
    assert_eq!(mig_intent(&c.nodes()[0].gpus[0], &slot), (true, false));
    // 40,448 MiB and 3 of 7 compute slices, as for an existing 3g.
    assert_eq!(
        (p.grants[0].memory_mib, p.grants[0].cores_milli),
        (40_448, 428)
    );
    l.apply(&c, &p).unwrap();
    // The second 3g would need slices 0..3, where the free 1g lies: the plan takes
    // slices nobody holds only, so it is planned at 0 and the agent replaces the 1g.
    let p2 = place(&c, &l, &mig("3g.40gb")).unwrap();
    let s2 = p2.grants[0].mig.unwrap();
    assert_eq!((s2.start, s2.mask() & slot.mask()), (0, 0));
    l.apply(&c, &p2).unwrap();
    // A third has no room left (both planned 3g are held), and no 3g exists yet.
    assert_eq!(
        reason(&c, &l, &mig("3g.40gb")),
        Some(Reason::NoMigInstance {
            profile: "3g.40gb".into()
        })
    );
    // `instances` never switches the plain GPU 1 into MIG mode.
    assert!(p2.grants.iter().all(|g| g.gpu == 0));

    // An instance that exists is taken before one is created: a free 3g at 4.
    let c = node_cluster(Some("instances"), &["3g.40gb"]);
    let l = Ledger::new(&c);
    let p = place(&c, &l, &mig("3g.40gb")).unwrap();
    let s = p.grants[0].mig.unwrap();
    assert_eq!(mig_intent(&c.nodes()[0].gpus[0], &s), (false, false));

    // `mode`: with no GPU in MIG mode, an idle GPU is switched and given the 3g.
    let c = node_cluster(Some("mode"), &[]);
    let l = Ledger::new(&c);
    let p = place(&c, &l, &mig("3g.40gb")).unwrap();
    let s = p.grants[0].mig.unwrap();
    assert_eq!(mig_intent(&c.nodes()[0].gpus[0], &s), (true, true));
    assert!(g.profiles[s.profile as usize].starts.contains(&s.start));

    // A pin on an instance UUID cannot be met by a new instance; a pin on the GPU can.
    let c = node_cluster(Some("instances"), &["1g.10gb"]);
    let l = Ledger::new(&c);
    let mut pinned = mig("3g.40gb");
    pinned.constraints.pinned_uuids = vec!["MIG-elsewhere".into()];
    assert!(place(&c, &l, &pinned).is_none());
    pinned.constraints.pinned_uuids = vec!["GPU-0".into()];
    assert_eq!(place(&c, &l, &pinned).unwrap().grants[0].gpu, 0);
}
