//! How many replicas of one request the scheduler would place now: the answer a
//! federation engine asks of a member cluster (Karmada's `MaxAvailableReplicas`, a
//! MultiKueue dispatcher choosing a worker).
//!
//! There is no second fit function here: the count is made by the placement engine
//! itself. Inside a ledger checkpoint the scheduler places one replica after another
//! ([`Scheduler::place`], then [`Ledger::apply`]) until one does not fit or the limit
//! is reached; then everything is rolled back. So the estimate counts exactly what
//! placement counts: fractions, MIG layouts and profiles, GPU models, topology asks,
//! host CPU and memory, and the policy's own choice of GPUs (which decides whether the
//! next replica still fits). Why the checkpoint and not a copy of the ledger: the
//! scheduler's verdict cache is keyed by the ledger's change log, and a rollback logs
//! the nodes it restores, so the same scheduler keeps deciding correctly afterwards on
//! the real ledger (a copy would leave the cache ahead of the ledger it is used with).
//!
//! The cost is one placement per counted replica, so callers that only need to rank
//! clusters pass a `limit`.

use rand::RngCore;

use crate::Scheduler;
use crate::ledger::{Ledger, LedgerError};
use crate::model::{Cluster, NodeId};
use crate::placement::Placement;
use crate::request::Request;

/// What [`max_replicas`] counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    /// Replicas placed one after another before one failed or the limit was reached.
    pub replicas: u32,
    /// The count stopped at the limit: more may fit.
    pub capped: bool,
}

impl Estimate {
    /// Whether at least one replica fits.
    pub fn fits(&self) -> bool {
        self.replicas > 0
    }
}

/// Counts how many replicas of `req` `scheduler` would place on `cluster` now, one by
/// one, at most `limit`. `ledger` is returned exactly as it was (the placements are
/// made inside a checkpoint and rolled back). The RNG is the one a placement would
/// use: with the same RNG state, the first counted replica is the placement
/// [`Scheduler::place`] then makes.
///
/// `Err` only when the ledger refuses a placement the scheduler proposed or cannot
/// roll back (a bug, never a normal outcome); "does not fit" is a count of 0.
pub fn max_replicas(
    scheduler: &mut Scheduler,
    cluster: &Cluster,
    ledger: &mut Ledger,
    req: &Request,
    limit: u32,
    rng: &mut dyn RngCore,
) -> Result<Estimate, LedgerError> {
    count(cluster, ledger, limit, |ledger| {
        scheduler.place(cluster, ledger, req, rng)
    })
}

/// [`max_replicas`] on `nodes` only (the nodes a pod's node selector, affinity and
/// tolerations admit, as an adapter computes them): each replica is placed with
/// [`Scheduler::place_within`], the same judge without the score cache.
pub fn max_replicas_within(
    scheduler: &Scheduler,
    cluster: &Cluster,
    ledger: &mut Ledger,
    req: &Request,
    nodes: &[NodeId],
    limit: u32,
    rng: &mut dyn RngCore,
) -> Result<Estimate, LedgerError> {
    count(cluster, ledger, limit, |ledger| {
        scheduler.place_within(cluster, ledger, req, nodes, rng)
    })
}

/// Places with `place` and applies, inside a checkpoint, until a placement fails or
/// `limit` are counted; then rolls back.
fn count(
    cluster: &Cluster,
    ledger: &mut Ledger,
    limit: u32,
    mut place: impl FnMut(&Ledger) -> Option<Placement>,
) -> Result<Estimate, LedgerError> {
    let cp = ledger.checkpoint();
    let mut replicas = 0u32;
    let mut failure = None;
    while replicas < limit {
        let Some(p) = place(ledger) else {
            break;
        };
        if let Err(e) = ledger.apply(cluster, &p) {
            failure = Some(e);
            break;
        }
        replicas += 1;
    }
    ledger.rollback(cluster, cp)?;
    match failure {
        Some(e) => Err(e),
        None => Ok(Estimate {
            replicas,
            capped: replicas == limit,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::demo::demo_cluster;
    use crate::policy::{self, PolicyArgs};
    use crate::request::{GpuAsk, Wish};
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    fn scheduler(name: &str) -> Scheduler {
        Scheduler::new(policy::by_name(name, &PolicyArgs::default()).unwrap())
    }

    fn mig(profile: &str) -> Request {
        Request {
            gpu: GpuAsk::Mig {
                profile: profile.into(),
            },
            cpu_milli: 1000,
            memory_mib: 4096,
            ..Request::default()
        }
    }

    fn nvlink(count: u32) -> Request {
        let mut r = Request::whole(count, 8000, 32768);
        r.constraints.nvlink = Wish::Required;
        r
    }

    /// The demo cluster (68 GPUs, 2 in MIG mode) fragmented by fractional and whole
    /// pods placed by `s` itself: shares of 0.3 and 0.6 and single GPUs, so that many
    /// GPUs are partly used and few 8-GPU nodes are empty.
    fn fragmented(s: &mut Scheduler) -> (Cluster, Ledger) {
        let cluster = demo_cluster();
        let mut ledger = Ledger::new(&cluster);
        let mut rng = SmallRng::seed_from_u64(3);
        let fill = [
            Request::share_milli(300, 2000, 4096),
            Request::share_milli(600, 2000, 4096),
            Request::whole(1, 4000, 16384),
            Request::share_milli(300, 2000, 4096),
        ];
        for i in 0..44 {
            if let Some(p) = s.place(&cluster, &ledger, &fill[i % fill.len()], &mut rng) {
                ledger.apply(&cluster, &p).unwrap();
            }
        }
        (cluster, ledger)
    }

    /// What the ledger holds, to check that an estimate leaves it as it was.
    fn held(l: &Ledger) -> (u64, usize, Vec<crate::ledger::NodeUse>) {
        (l.used_milli(), l.allocation_count(), l.nodes().to_vec())
    }

    /// Places `req` one by one with `s` until it fails, for real; the count.
    fn place_one_by_one(
        s: &mut Scheduler,
        c: &Cluster,
        l: &mut Ledger,
        req: &Request,
        rng: &mut SmallRng,
    ) -> u32 {
        let mut n = 0;
        while let Some(p) = s.place(c, l, req, rng) {
            l.apply(c, &p).unwrap();
            n += 1;
            assert!(n < 100_000, "runaway placement");
        }
        n
    }

    /// Whole, fractional, MIG and NVLink requests on a fragmented cluster: the estimate
    /// equals the number of pods the placement engine then actually places, one by
    /// one, and leaves the ledger as it was.
    #[test]
    fn estimate_equals_replicas_then_placed_one_by_one() {
        let requests = [
            ("1 GPU", Request::whole(1, 4000, 16384)),
            ("8 GPUs", Request::whole(8, 16000, 65536)),
            ("4 GPUs NVLink", nvlink(4)),
            ("0.25 GPU", Request::share_milli(250, 1000, 2048)),
            ("0.7 GPU", Request::share_milli(700, 1000, 2048)),
            ("MIG 1g.10gb", mig("1g.10gb")),
            ("MIG 3g.40gb", mig("3g.40gb")),
            ("CPU only, big", Request::cpu_only(64_000, 8192)),
        ];
        for name in ["tessera", "fgd", "binpack", "spread", "random"] {
            for (what, req) in &requests {
                let mut s = scheduler(name);
                let (cluster, mut ledger) = fragmented(&mut s);
                let before = held(&ledger);
                let mut rng = SmallRng::seed_from_u64(11);
                let est =
                    max_replicas(&mut s, &cluster, &mut ledger, req, u32::MAX, &mut rng).unwrap();
                assert!(!est.capped);
                assert_eq!(held(&ledger), before, "{name} {what}: ledger restored");
                // Same RNG state as the estimate started from, same scheduler (its cache
                // went through the estimate's rollback).
                let mut rng = SmallRng::seed_from_u64(11);
                let placed = place_one_by_one(&mut s, &cluster, &mut ledger, req, &mut rng);
                assert_eq!(est.replicas, placed, "{name} {what}");
            }
        }
    }

    /// The counts are the fragmented cluster's, not an integer view's: on the same
    /// cluster, 8-GPU pods fit fewer times than free GPUs / 8, and shares fit on
    /// partly used GPUs (more 0.25 shares than idle GPUs, which is all an integer view
    /// that rounds a share up to a whole GPU can count).
    #[test]
    fn counts_see_fragmentation() {
        let mut s = scheduler("tessera");
        let (cluster, mut ledger) = fragmented(&mut s);
        let idle: usize = ledger.nodes().iter().map(|n| n.idle_gpus()).sum();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut count = |req: &Request, s: &mut Scheduler, l: &mut Ledger| {
            max_replicas(s, &cluster, l, req, u32::MAX, &mut rng)
                .unwrap()
                .replicas
        };
        let eight = count(&Request::whole(8, 1000, 1024), &mut s, &mut ledger);
        let quarter = count(&Request::share_milli(250, 100, 256), &mut s, &mut ledger);
        let free_milli = cluster.gpu_count() as u64 * 1000 - ledger.used_milli();
        assert!(idle > 0 && free_milli > 0);
        // Every 8-GPU node here is a whole node's worth: at most idle / 8.
        assert!((eight as usize) <= idle / 8, "{eight} vs {idle} idle");
        assert!(
            (quarter as usize) > idle,
            "{quarter} shares vs {idle} idle GPUs"
        );
        assert!(u64::from(quarter) * 250 <= free_milli);
    }

    /// A limit stops the count and says so; the scheduler's next decision is the one a
    /// fresh scheduler makes (the cache followed the rollback).
    #[test]
    fn limit_caps_and_cache_stays_true() {
        let mut s = scheduler("tessera");
        let (cluster, mut ledger) = fragmented(&mut s);
        let req = Request::share_milli(250, 1000, 2048);
        let mut rng = SmallRng::seed_from_u64(1);
        let all = max_replicas(&mut s, &cluster, &mut ledger, &req, u32::MAX, &mut rng).unwrap();
        assert!(all.replicas > 3);
        let three = max_replicas(&mut s, &cluster, &mut ledger, &req, 3, &mut rng).unwrap();
        assert_eq!(
            three,
            Estimate {
                replicas: 3,
                capped: true
            }
        );
        let zero = max_replicas(&mut s, &cluster, &mut ledger, &req, 0, &mut rng).unwrap();
        assert!(zero.capped && !zero.fits());
        for req in [req, Request::whole(2, 1000, 1024), mig("2g.20gb")] {
            let mut fresh = scheduler("tessera");
            let a = s.place(&cluster, &ledger, &req, &mut rng);
            let b = fresh.place(&cluster, &ledger, &req, &mut rng);
            assert_eq!(a, b);
            if let Some(p) = a {
                ledger.apply(&cluster, &p).unwrap();
            }
        }
    }

    /// On a subset of the nodes (a node selector's), the count equals the pods then
    /// placed one by one on those nodes, and never exceeds the count on all nodes.
    #[test]
    fn within_nodes_equals_placed_one_by_one_there() {
        let mut s = scheduler("tessera");
        let (cluster, mut ledger) = fragmented(&mut s);
        let nodes: Vec<NodeId> = ["dgx-a100-2", "l4-1", "l4-2", "v100-1"]
            .iter()
            .map(|n| cluster.node_id(n).unwrap())
            .collect();
        for req in [
            Request::whole(1, 4000, 16384),
            Request::share_milli(250, 1000, 2048),
            mig("1g.10gb"),
        ] {
            let mut rng = SmallRng::seed_from_u64(2);
            let before = held(&ledger);
            let within =
                max_replicas_within(&s, &cluster, &mut ledger, &req, &nodes, u32::MAX, &mut rng)
                    .unwrap();
            assert_eq!(held(&ledger), before);
            let all =
                max_replicas(&mut s, &cluster, &mut ledger, &req, u32::MAX, &mut rng).unwrap();
            assert!(within.replicas <= all.replicas);
            let mut placed = 0;
            let mut l = ledger.clone();
            while let Some(p) = s.place_within(&cluster, &l, &req, &nodes, &mut rng) {
                assert!(nodes.contains(&p.node));
                l.apply(&cluster, &p).unwrap();
                placed += 1;
            }
            assert_eq!(within.replicas, placed, "{req:?}");
        }
    }

    /// Nothing fits: 0, not an error.
    #[test]
    fn nothing_fits_is_zero() {
        let mut s = scheduler("tessera");
        let cluster = demo_cluster();
        let mut ledger = Ledger::new(&cluster);
        let mut rng = SmallRng::seed_from_u64(1);
        let e = max_replicas(
            &mut s,
            &cluster,
            &mut ledger,
            &Request::whole(16, 0, 0),
            u32::MAX,
            &mut rng,
        )
        .unwrap();
        assert_eq!(e, Estimate::default());
    }
}
