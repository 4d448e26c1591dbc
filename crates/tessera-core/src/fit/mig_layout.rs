//! MIG layouts and the per-GPU choice of isolation mechanism.
//!
//! A *layout* is the set of GPU instances on one GPU, each `(profile index, first
//! memory slice)`. It is valid for a model when every instance sits at a placement
//! its profile allows, no two share a memory slice, their compute slices fit the
//! GPU and no profile exceeds its instance limit ([`validate`]). A GPU whose
//! instances are partly held by allocations can still become any valid layout that
//! keeps the held instances where they are ([`can_become`]): instances nobody holds
//! may be destroyed, held ones never.
//!
//! For a share asked with `tessera.io/isolation: hard | soft | any`, [`choose`] says
//! what one GPU would give it: a share of a plain GPU (MPS or time slicing), the
//! whole GPU, or a MIG instance, either an existing free one or one to create in
//! free MIG space (after switching an idle GPU into MIG mode where the node allows
//! it). Where several placements are possible the one that leaves the most of the
//! GPU's free compute usable by later instances wins ([`best_start`]).

use crate::ledger::GpuUse;
use crate::model::{Gpu, GpuSpec, MigGeometry, Node};
use crate::placement::{GpuGrant, MigSlot};
use crate::request::{GpuAsk, Isolation, IsolationLevel, Request};

pub use crate::model::{LABEL_MIG_DYNAMIC, MigDynamic};

/// Why a layout is not valid for a model.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("no MIG profile with index {0}")]
    NoSuchProfile(u8),
    #[error("{profile} may not start at memory slice {start}")]
    BadPlacement { profile: String, start: u8 },
    #[error("{profile} at memory slice {start} overlaps another instance")]
    Overlap { profile: String, start: u8 },
    #[error("the instances need {want} compute slices, the GPU has {have}")]
    Compute { want: u32, have: u8 },
    #[error("more than {max} instances of {profile}")]
    TooMany { profile: String, max: u8 },
}

/// Checks a layout against the model's placement table.
pub fn validate(geo: &MigGeometry, instances: &[(u8, u8)]) -> Result<(), LayoutError> {
    let (mut taken, mut compute) = (0u8, 0u32);
    let mut counts = vec![0u8; geo.profiles.len()];
    for &(pi, start) in instances {
        let p = geo
            .profiles
            .get(pi as usize)
            .ok_or(LayoutError::NoSuchProfile(pi))?;
        let mask = geo
            .placement_mask(p, start)
            .ok_or_else(|| LayoutError::BadPlacement {
                profile: p.name.clone(),
                start,
            })?;
        if taken & mask != 0 {
            return Err(LayoutError::Overlap {
                profile: p.name.clone(),
                start,
            });
        }
        taken |= mask;
        compute += u32::from(p.compute_slices);
        counts[pi as usize] += 1;
        if counts[pi as usize] > p.max_instances {
            return Err(LayoutError::TooMany {
                profile: p.name.clone(),
                max: p.max_instances,
            });
        }
    }
    if compute > u32::from(geo.compute_slices) {
        return Err(LayoutError::Compute {
            want: compute,
            have: geo.compute_slices,
        });
    }
    Ok(())
}

/// Whether a GPU whose instances `held` are in use can be re-partitioned into
/// `target` without touching them: `target` is valid and keeps every held instance.
pub fn can_become(geo: &MigGeometry, held: &[(u8, u8)], target: &[(u8, u8)]) -> bool {
    validate(geo, target).is_ok() && held.iter().all(|h| target.contains(h))
}

/// What the held instances of one GPU occupy (from the ledger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Held {
    /// Memory slices in use (bit i = slice i).
    pub mask: u8,
    /// Compute slices in use.
    pub compute: u8,
    /// Instances in use per profile index.
    pub counts: [u8; 8],
}

impl Held {
    pub fn of(gu: &GpuUse) -> Held {
        Held {
            mask: gu.mig_memory_slices,
            compute: gu.mig_compute_slices,
            counts: gu.mig_instances,
        }
    }

    /// The memory mask of profile `pi` at `start` when it can be added without
    /// touching anything held.
    pub fn room_for(&self, geo: &MigGeometry, pi: usize, start: u8) -> Option<u8> {
        let p = geo.profiles.get(pi)?;
        let mask = geo.placement_mask(p, start)?;
        let count = *self.counts.get(pi)?;
        (mask & self.mask == 0
            && u16::from(self.compute) + u16::from(p.compute_slices)
                <= u16::from(geo.compute_slices)
            && count < p.max_instances)
            .then_some(mask)
    }

    fn with(mut self, geo: &MigGeometry, pi: usize, start: u8) -> Held {
        if let Some(mask) = self.room_for(geo, pi, start) {
            self.mask |= mask;
            self.compute += geo.profiles[pi].compute_slices;
            self.counts[pi] += 1;
        }
        self
    }
}

/// Most compute slices any set of new instances can still use on top of `held`
/// (the free compute not stranded by the memory layout), and the compute slices of
/// the largest single instance that can still be created.
pub fn usable_compute(geo: &MigGeometry, held: Held) -> (u8, u8) {
    // Depth-first over the lowest undecided memory slice: leave it empty or start an
    // instance there. At most 8 slices deep, so this is a few hundred states.
    fn best(geo: &MigGeometry, held: Held, slice: u8) -> u8 {
        if slice >= geo.memory_slices.min(8) {
            return 0;
        }
        let mut top = best(geo, held, slice + 1);
        for pi in 0..geo.profiles.len().min(8) {
            // A profile of no memory slices (never in NVIDIA's tables) would not
            // advance the search; it cannot hold a share anyway.
            if geo.profiles[pi].memory_slices > 0 && held.room_for(geo, pi, slice).is_some() {
                let p = &geo.profiles[pi];
                let next = held.with(geo, pi, slice);
                top = top.max(p.compute_slices + best(geo, next, slice + p.memory_slices));
            }
        }
        top
    }
    let largest = (0..geo.profiles.len().min(8))
        .filter(|&pi| {
            geo.profiles[pi]
                .starts
                .iter()
                .any(|&s| held.room_for(geo, pi, s).is_some())
        })
        .map(|pi| geo.profiles[pi].compute_slices)
        .max()
        .unwrap_or(0);
    (best(geo, held, 0), largest)
}

/// What creating profile `pi` at `start` leaves of a GPU that holds `held`: the
/// terms a new instance's placement is ranked by, on one GPU ([`best_start`]) and
/// between GPUs (`least_fragmenting`; the DRA allocator ranks partitionable MIG
/// placements, and nodes, by the same terms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Leftover {
    /// Compute slices still free.
    pub free: u8,
    /// Of those, slices no set of new instances can use: the memory layout
    /// strands them (`free` − [`usable_compute`]).
    pub stranded: u8,
    /// Compute slices of the largest instance that can still be created.
    pub largest: u8,
}

/// [`Leftover`] of creating profile `pi` at `start` on top of `held`; `None`
/// when it does not fit there without touching a held instance.
pub fn leftover(geo: &MigGeometry, held: Held, pi: usize, start: u8) -> Option<Leftover> {
    held.room_for(geo, pi, start)?;
    let after = held.with(geo, pi, start);
    let free = geo.compute_slices.saturating_sub(after.compute);
    let (usable, largest) = usable_compute(geo, after);
    Some(Leftover {
        free,
        stranded: free - usable.min(free),
        largest,
    })
}

/// The placement of profile `pi` that leaves the GPU least fragmented: the most
/// compute still usable afterwards, then the largest instance still possible, then
/// the lowest start. `None` when it fits nowhere without touching held instances.
pub fn best_start(geo: &MigGeometry, held: Held, pi: usize) -> Option<u8> {
    let p = geo.profiles.get(pi)?;
    p.starts
        .iter()
        .copied()
        .filter(|&s| held.room_for(geo, pi, s).is_some())
        .max_by_key(|&s| {
            let (usable, largest) = usable_compute(geo, held.with(geo, pi, s));
            (usable, largest, std::cmp::Reverse(s))
        })
}

/// Profiles whose memory and compute both cover the ask, smallest first (fewest
/// compute slices, then fewest memory slices). Media-extension profiles (`+me`) are
/// left out: they exist once per GPU for pods that ask for them by name.
pub fn covering_profiles(geo: &MigGeometry, memory_mib: u64, cores_milli: u32) -> Vec<usize> {
    let mut v: Vec<usize> = (0..geo.profiles.len().min(8))
        .filter(|&pi| {
            let p = &geo.profiles[pi];
            !p.name.contains('+')
                && p.memory_mib >= memory_mib
                && geo.compute_milli(p) >= cores_milli
        })
        .collect();
    v.sort_by_key(|&pi| {
        let p = &geo.profiles[pi];
        (p.compute_slices, p.memory_slices, pi)
    });
    v
}

/// What one GPU gives a share asked at a level.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// A share of a plain GPU, by MPS or time slicing.
    Share,
    /// The whole GPU.
    Whole,
    /// A MIG instance at `slot`; `create` when it does not exist yet, and
    /// `enable_mig_mode` when the GPU must first be switched into MIG mode.
    Mig {
        slot: MigSlot,
        create: bool,
        enable_mig_mode: bool,
    },
}

/// Whether the GPU is in MIG mode as far as placement goes: switched on, or
/// holding an instance that a decision planned (the switch is under way).
pub fn in_mig_mode(gpu: &Gpu, gu: &GpuUse) -> bool {
    gpu.mig_enabled || gu.mig_memory_slices != 0
}

fn slot_of(geo: &MigGeometry, pi: usize, start: u8) -> MigSlot {
    let p = &geo.profiles[pi];
    MigSlot {
        profile: pi as u8,
        start,
        size: p.memory_slices,
        compute: p.compute_slices,
    }
}

/// The MIG instance `gpu` can give a share of `memory_mib` and `cores_milli`, if any.
fn mig_choice(
    dynamic: MigDynamic,
    gpu: &Gpu,
    gu: &GpuUse,
    geo: &MigGeometry,
    memory_mib: u64,
    cores_milli: u32,
) -> Option<Choice> {
    let covering = covering_profiles(geo, memory_mib, cores_milli);
    let smallest = *covering.first()?;
    let held = Held::of(gu);
    // Free existing instances that cover the ask, smallest first.
    let existing = || {
        let mut free: Vec<(u8, u8)> = gpu
            .mig_instances
            .iter()
            .filter(|_| gpu.mig_enabled)
            .filter(|m| covering.contains(&(m.profile as usize)))
            .filter(|m| held.room_for(geo, m.profile as usize, m.start).is_some())
            .map(|m| (m.profile, m.start))
            .collect();
        free.sort_by_key(|&(pi, s)| {
            let p = &geo.profiles[pi as usize];
            (p.compute_slices, p.memory_slices, s)
        });
        free
    };
    let free = existing();
    let same_size = |pi: u8| {
        let (a, b) = (&geo.profiles[pi as usize], &geo.profiles[smallest]);
        (a.compute_slices, a.memory_slices) == (b.compute_slices, b.memory_slices)
    };
    // An existing instance of the right size needs no re-partition.
    if let Some(&(pi, s)) = free.iter().find(|(pi, _)| same_size(*pi)) {
        return Some(Choice::Mig {
            slot: slot_of(geo, pi as usize, s),
            create: false,
            enable_mig_mode: false,
        });
    }
    if may_create(dynamic, gpu, gu) {
        for &pi in &covering {
            if let Some(s) = best_start(geo, held, pi) {
                return Some(Choice::Mig {
                    slot: slot_of(geo, pi, s),
                    create: !gpu
                        .mig_instances
                        .iter()
                        .any(|m| gpu.mig_enabled && m.profile as usize == pi && m.start == s),
                    enable_mig_mode: !gpu.mig_enabled,
                });
            }
        }
    }
    // A larger free instance than needed, when nothing may be created.
    free.first().map(|&(pi, s)| Choice::Mig {
        slot: slot_of(geo, pi as usize, s),
        create: false,
        enable_mig_mode: false,
    })
}

/// Whether the node lets the agent create an instance on `gpu` (see [`MigDynamic`]):
/// in free MIG space of a GPU in MIG mode, or on an idle GPU it may switch.
fn may_create(dynamic: MigDynamic, gpu: &Gpu, gu: &GpuUse) -> bool {
    if in_mig_mode(gpu, gu) {
        dynamic >= MigDynamic::Instances && (gpu.mig_enabled || dynamic == MigDynamic::Mode)
    } else {
        dynamic == MigDynamic::Mode && gu.is_idle()
    }
}

/// What `gpu` gives a pod that names MIG profile `pi` itself
/// (`tessera.io/mig-3g.40gb`, `nvidia.com/mig-3g.40gb`): a free instance of that
/// profile that exists, else, where the node allows dynamic MIG
/// ([`LABEL_MIG_DYNAMIC`]), one to create at the placement that leaves the GPU
/// least fragmented ([`best_start`]), as for a `hard` share. A new instance has no
/// UUID yet, so with pinned UUIDs only a pin on the GPU itself allows one.
pub fn explicit_choice(
    node: &Node,
    gpu: &Gpu,
    gu: &GpuUse,
    geo: &MigGeometry,
    pi: usize,
    pinned: &[String],
) -> Option<Choice> {
    if gpu.mig_enabled
        && let Some((_, slot)) = super::free_mig_instance(gpu, gu, geo, pi, pinned)
    {
        return Some(Choice::Mig {
            slot,
            create: false,
            enable_mig_mode: false,
        });
    }
    if !(pinned.is_empty() || pinned.contains(&gpu.uuid))
        || !may_create(MigDynamic::of(node), gpu, gu)
    {
        return None;
    }
    let start = best_start(geo, Held::of(gu), pi)?;
    let slot = slot_of(geo, pi, start);
    let (create, enable_mig_mode) = mig_intent(gpu, &slot);
    Some(Choice::Mig {
        slot,
        create,
        enable_mig_mode,
    })
}

/// What `gpu` can give `req`, a share asked at an isolation level or an explicit
/// MIG profile ([`explicit_choice`]); `None` when it can give it nothing (or the
/// request names another mechanism itself).
///
/// - `hard`: a MIG instance (an existing one of the smallest covering size, else one
///   created in free MIG space where the node allows it, else a larger free one),
///   or the whole GPU when it is idle, not in MIG mode and no instance will do.
/// - `soft`: a share of a plain GPU (MPS, or time slicing without a compute ask).
/// - `any`: a share on a plain GPU, an instance on a GPU in MIG mode; an idle GPU
///   becomes a MIG GPU only for a share that a plain GPU could not take anyway.
///   A share packs exactly while an instance rounds up to a profile, so this is the
///   choice that strands least.
pub fn choose(
    node: &Node,
    gpu: &Gpu,
    gu: &GpuUse,
    spec: &GpuSpec,
    req: &Request,
) -> Option<Choice> {
    // A MIG instance served as a GPU (single strategy) is taken whole only.
    if gpu.mig_instance {
        return None;
    }
    if let GpuAsk::Mig { profile } = &req.gpu {
        let geo = spec.mig.as_ref()?;
        let (pi, _) = geo.profile(profile)?;
        return explicit_choice(node, gpu, gu, geo, pi, &req.constraints.pinned_uuids);
    }
    let GpuAsk::Shared {
        memory,
        cores_milli,
        ..
    } = &req.gpu
    else {
        return None;
    };
    let level = req.level?;
    let memory_mib = memory.resolve(spec.memory_mib);
    let in_mig = in_mig_mode(gpu, gu);
    let share_ok = !in_mig
        && !gu.exclusive
        && gu.free_memory_mib >= memory_mib
        && gu.free_cores_milli >= *cores_milli;
    let mig = || {
        spec.mig.as_ref().and_then(|geo| {
            mig_choice(MigDynamic::of(node), gpu, gu, geo, memory_mib, *cores_milli)
        })
    };
    match level {
        IsolationLevel::Soft => share_ok.then_some(Choice::Share),
        // A whole GPU only when it holds the share at all.
        IsolationLevel::Hard => mig().or_else(|| {
            (!in_mig && gu.is_idle() && memory_mib <= spec.memory_mib).then_some(Choice::Whole)
        }),
        IsolationLevel::Any if in_mig => mig(),
        IsolationLevel::Any => {
            if share_ok {
                Some(Choice::Share)
            } else {
                mig()
            }
        }
    }
}

/// How good a choice is for the cluster, lower first: reuse an instance of the
/// right size; else create one on a GPU already in MIG mode, where it strands the
/// least compute and packs tightest; else a larger free instance; else switch an
/// idle GPU into MIG mode; a whole GPU last.
fn choice_rank(
    gpu: &Gpu,
    gu: &GpuUse,
    spec: &GpuSpec,
    req: &Request,
    choice: Choice,
) -> (u8, u8, u8) {
    match choice {
        Choice::Mig {
            create: false,
            slot,
            ..
        } => {
            let exact = match (&spec.mig, &req.gpu) {
                (
                    Some(geo),
                    GpuAsk::Shared {
                        memory,
                        cores_milli,
                        ..
                    },
                ) => covering_profiles(geo, memory.resolve(spec.memory_mib), *cores_milli)
                    .first()
                    .is_some_and(|&pi| {
                        let (a, b) = (&geo.profiles[pi], &geo.profiles[slot.profile as usize]);
                        (a.compute_slices, a.memory_slices) == (b.compute_slices, b.memory_slices)
                    }),
                // An explicit profile takes only instances of that profile.
                (_, GpuAsk::Mig { .. }) => true,
                _ => false,
            };
            (if exact { 0 } else { 2 }, 0, 0)
        }
        Choice::Mig {
            slot,
            enable_mig_mode: false,
            ..
        } => {
            // A planned slot always has room; one without is ranked last.
            match spec
                .mig
                .as_ref()
                .and_then(|geo| leftover(geo, Held::of(gu), slot.profile as usize, slot.start))
            {
                Some(l) => (1, l.stranded, l.free),
                None => (5, 0, 0),
            }
        }
        Choice::Mig { .. } => (3, 0, 0),
        Choice::Share => (1, 0, 0),
        Choice::Whole if gpu.mig_enabled => (5, 0, 0),
        Choice::Whole => (4, 0, 0),
    }
}

/// Whether the GPUs (and nodes) that can take `req` are ranked by what they would
/// do for it ([`choice_rank`]): a `hard` share, and an explicit MIG profile, which
/// takes an instance that exists before one is created, and creates one on a GPU
/// already in MIG mode before it switches an idle GPU.
pub fn ranks_mig_choices(req: &Request) -> bool {
    req.level == Some(IsolationLevel::Hard) || matches!(req.gpu, GpuAsk::Mig { .. })
}

/// For a one-GPU hard share or MIG profile: the usable GPUs whose choice ranks best
/// ([`choice_rank`]), so that every policy picks among those only.
pub(super) fn least_fragmenting(
    view: super::NodeView<'_>,
    req: &Request,
    usable: &super::GpuSet,
) -> super::GpuSet {
    let ranked: Vec<(u8, (u8, u8, u8))> = usable
        .iter()
        .filter_map(|&g| {
            let gpu = view.node.gpus.get(g as usize)?;
            let gu = view.used.gpus.get(g as usize)?;
            let spec = view.catalog.spec(gpu.model);
            let c = choose(view.node, gpu, gu, spec, req)?;
            Some((g, choice_rank(gpu, gu, spec, req, c)))
        })
        .collect();
    let Some(best) = ranked.iter().map(|(_, r)| *r).min() else {
        return usable.clone();
    };
    ranked
        .into_iter()
        .filter(|(_, r)| *r == best)
        .map(|(g, _)| g)
        .collect()
}

/// Score one step of an isolation tier is worth ([`hard_rank_penalty`]): far
/// beyond any policy's score range, so the tier decides before the policy does.
/// The DRA allocator weighs a MIG placement's tier by it too, so that a pod's
/// claims sum on one scale.
pub const TIER_SCORE: f64 = 1.0e9;

/// Score subtracted from a node's policy score for a one-GPU `hard` share, so that
/// nodes rank first by their best GPU's [`choice_rank`] tier (reuse an instance,
/// create one on a GPU in MIG mode, a larger instance, switch an idle GPU, a whole
/// GPU) and only then by the policy: a policy sees a share of, say, 30 % and
/// cannot tell that one node would hand it a whole GPU where another has a free
/// instance. 0 for every other request, so their scores are the policy's own.
pub fn hard_rank_penalty(view: super::NodeView<'_>, req: &Request, fit: &super::Fit) -> f64 {
    if fit.need != 1 || !ranks_mig_choices(req) {
        return 0.0;
    }
    // After [`least_fragmenting`] every usable GPU has the node's best rank.
    let tier = fit.usable.first().and_then(|&g| {
        let gpu = view.node.gpus.get(g as usize)?;
        let gu = view.used.gpus.get(g as usize)?;
        let spec = view.catalog.spec(gpu.model);
        let c = choose(view.node, gpu, gu, spec, req)?;
        Some(choice_rank(gpu, gu, spec, req, c).0)
    });
    f64::from(tier.unwrap_or(0)) * TIER_SCORE
}

/// The grant for a choice on GPU position `g`.
pub fn choice_grant(g: u8, spec: &GpuSpec, req: &Request, choice: Choice) -> Option<GpuGrant> {
    match (choice, &req.gpu) {
        (
            Choice::Share,
            GpuAsk::Shared {
                memory,
                cores_milli,
                ..
            },
        ) => Some(GpuGrant::shared(
            g,
            memory.resolve(spec.memory_mib),
            *cores_milli,
        )),
        (Choice::Whole, _) => Some(GpuGrant::whole(g, spec.memory_mib)),
        (Choice::Mig { slot, .. }, _) => {
            let geo = spec.mig.as_ref()?;
            let p = geo.profiles.get(slot.profile as usize)?;
            Some(super::mig_grant(g, geo, p, slot))
        }
        (Choice::Share, _) => None,
    }
}

/// The mechanism a grant stands for: what the allocation annotation records.
pub fn mechanism(req: &Request, grant: &GpuGrant) -> Isolation {
    if grant.mig.is_some() {
        Isolation::Mig
    } else if grant.exclusive {
        Isolation::Exclusive
    } else {
        match req.isolation {
            i @ (Isolation::Mps | Isolation::TimeSlice) => i,
            _ if grant.cores_milli > 0 => Isolation::Mps,
            _ => Isolation::TimeSlice,
        }
    }
}

/// What the node agent must do for a MIG grant on `gpu` as the inventory shows it:
/// `(create the instance, switch the GPU into MIG mode first)`.
pub fn mig_intent(gpu: &Gpu, slot: &MigSlot) -> (bool, bool) {
    let exists = gpu.mig_enabled
        && gpu
            .mig_instances
            .iter()
            .any(|m| m.profile == slot.profile && m.start == slot.start);
    (!exists, !gpu.mig_enabled)
}

/// Why a grant on `gpu` (before it is applied) has its mechanism, for a request
/// asked at an isolation level (`None` for one that named a mechanism).
pub fn explain_grant(gpu: &Gpu, spec: &GpuSpec, req: &Request, grant: &GpuGrant) -> Option<String> {
    req.level?;
    let choice = match grant.mig {
        Some(slot) => {
            let (create, enable_mig_mode) = mig_intent(gpu, &slot);
            Choice::Mig {
                slot,
                create,
                enable_mig_mode,
            }
        }
        None if grant.exclusive => Choice::Whole,
        None => Choice::Share,
    };
    Some(describe(spec, req, choice))
}

/// Why an allocated GPU got its mechanism, from the allocation annotation, for a
/// request asked at an isolation level (`None` for one that named a mechanism).
pub fn explain_allocated(
    spec: &GpuSpec,
    req: &Request,
    isolation: Isolation,
    mig: Option<&crate::allocation::MigGrant>,
) -> Option<String> {
    req.level?;
    let choice = match mig {
        Some(m) => {
            let geo = spec.mig.as_ref()?;
            let (pi, _) = geo.profile(&m.profile)?;
            Choice::Mig {
                slot: slot_of(geo, pi, m.start),
                create: m.create,
                enable_mig_mode: m.enable_mig_mode,
            }
        }
        None if isolation == Isolation::Exclusive => Choice::Whole,
        None => Choice::Share,
    };
    Some(describe(spec, req, choice))
}

/// One sentence on why the grant on this GPU is what it is (for `tessera explain`).
pub fn describe(spec: &GpuSpec, req: &Request, choice: Choice) -> String {
    let level = req.level.map_or("", IsolationLevel::name);
    let (memory_mib, cores_milli) = match &req.gpu {
        GpuAsk::Shared {
            memory,
            cores_milli,
            ..
        } => (memory.resolve(spec.memory_mib), *cores_milli),
        _ => (0, 0),
    };
    let ask = format!(
        "{memory_mib} MiB and {}.{}% compute",
        cores_milli / 10,
        cores_milli % 10
    );
    match choice {
        Choice::Share => format!(
            "{level} isolation: {} share of a plain {} ({ask}); a share packs exactly where a MIG instance would round up to a profile",
            req.isolation.name(),
            spec.name
        ),
        Choice::Whole => format!(
            "{level} isolation: the whole {} (no MIG instance covering {ask} is free or may be created on it)",
            spec.name
        ),
        Choice::Mig {
            slot,
            create,
            enable_mig_mode,
        } => {
            let name = spec
                .mig
                .as_ref()
                .and_then(|g| g.profiles.get(slot.profile as usize))
                .map_or("?", |p| p.name.as_str());
            let how = match (create, enable_mig_mode) {
                (false, _) => "takes the free instance",
                (true, false) => "creates an instance in free MIG space:",
                (true, true) => "switches the idle GPU into MIG mode and creates",
            };
            format!(
                "{level} isolation: MIG {name}, the smallest profile covering {ask}; {how} {name} at memory slice {} of a {}",
                slot.start, spec.name
            )
        }
    }
}

#[cfg(test)]
mod tests;
