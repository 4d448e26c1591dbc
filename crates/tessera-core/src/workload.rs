//! The cluster's workload as learned from the pods that arrive: the target that
//! fragmentation-aware policies ([`crate::policy::tessera`]) measure fragment against.
//!
//! A decayed histogram of pod shapes (CPU, GPU count, milli-GPU per GPU, allowed
//! models). Each arrival adds weight 1 at its own time; older arrivals fade with a
//! half-life counted in **arrivals, not seconds**: the core has no clock, and a quiet
//! cluster should not forget what it runs. The default half-life (4,096 arrivals) keeps
//! about 6,000 effective pods, so a shape with 0.5 % of the pods (a typical multi-GPU
//! shape on openb) is estimated from about 30 of them.
//!
//! Before anything arrives the histogram holds a **prior** of a given mass (in pods),
//! which fades like any arrival: either a generic cold-start prior
//! ([`LearnedWorkload::cold_start`], not derived from any trace) or what is known up
//! front (the trace's typical pods, as FGD is given).
//!
//! Policies compile the target once and cache scores per request shape, so the target
//! they see ([`LearnedWorkload::target`]) is a snapshot, replaced only when the
//! histogram has moved from it by at least `rebuild_distance` (total variation
//! distance). As the prior fades that happens at most 1/`rebuild_distance` times; after
//! that only when the mix of shapes really moves (or sampling noise in rare shapes adds
//! up to the distance).

use std::sync::Arc;

use rustc_hash::FxHashMap;

use crate::frag::{TargetWorkload, TypicalPod, typical_of};
use crate::model::ModelSet;
use crate::request::Request;

/// How the histogram learns.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LearnConfig {
    /// Arrivals after which an arrival weighs half as much as a new one.
    pub half_life_arrivals: f64,
    /// Weight of the prior, in pods.
    pub prior_mass: f64,
    /// Total variation distance between the histogram and the published snapshot at
    /// which the snapshot is replaced (0–1).
    pub rebuild_distance: f64,
}

impl Default for LearnConfig {
    fn default() -> Self {
        LearnConfig {
            half_life_arrivals: 4096.0,
            // Enough that a shape among the first few dozen pods cannot dominate the
            // target (and the model-pressure estimate built on it): on generated
            // variants, 16 let a few early model-constrained pods push 8-GPU pods off
            // the nodes that fit them (worst case 19 % behind FGD, 8 % with 256).
            prior_mass: 256.0,
            // A rebuild costs a rescoring of every node per request shape; 5 % of the
            // probability mass moving changes expected fragment by at most 5 %.
            rebuild_distance: 0.05,
        }
    }
}

/// The generic cold-start prior: no trace knowledge, only that GPU clusters run
/// whole-GPU pods, half and quarter shares and some CPU-only pods, each with a modest
/// CPU ask.
pub fn cold_start_prior() -> TargetWorkload {
    round_shapes(&[(1, 1000, 0.4), (1, 500, 0.2), (1, 250, 0.2), (0, 0, 0.2)])
}

/// Shapes `(gpus, milli per GPU, weight)` any model may take, each asking 4 cores.
pub(crate) fn round_shapes(shapes: &[(u32, u32, f64)]) -> TargetWorkload {
    TargetWorkload {
        pods: shapes
            .iter()
            .map(|&(gpus, milli, weight)| TypicalPod {
                cpu_milli: 4000,
                gpus,
                milli,
                models: ModelSet::ALL,
                weight,
            })
            .collect(),
    }
}

type Key = (u64, u32, u32, u64);

fn key(p: &TypicalPod) -> Key {
    (p.cpu_milli, p.gpus, p.milli, p.models.0)
}

/// A decayed histogram of the pod shapes that have arrived; see the module docs.
#[derive(Debug, Clone)]
pub struct LearnedWorkload {
    config: LearnConfig,
    shapes: Vec<TypicalPod>,
    /// Mass per shape, in units where the latest arrival weighs `unit`.
    mass: Vec<f64>,
    index: FxHashMap<Key, usize>,
    /// Weight of the next arrival; grows by 2^(1/half-life) per arrival instead of
    /// shrinking every mass, and everything is rescaled when it gets large.
    unit: f64,
    total: f64,
    arrivals: u64,
    snapshot: Arc<TargetWorkload>,
    generation: u64,
}

impl LearnedWorkload {
    /// Starts from `prior` (weights summing to 1) holding `config.prior_mass` pods.
    pub fn new(prior: &TargetWorkload, config: LearnConfig) -> LearnedWorkload {
        let mut w = LearnedWorkload {
            config,
            shapes: Vec::new(),
            mass: Vec::new(),
            index: FxHashMap::default(),
            unit: 1.0,
            total: 0.0,
            arrivals: 0,
            snapshot: Arc::new(TargetWorkload::default()),
            generation: 0,
        };
        let sum: f64 = prior.pods.iter().map(|p| p.weight.max(0.0)).sum();
        if sum > 0.0 {
            for p in &prior.pods {
                w.add(p, config.prior_mass.max(0.0) * p.weight.max(0.0) / sum);
            }
        }
        w.publish();
        w
    }

    /// Starts from the generic [`cold_start_prior`].
    pub fn cold_start(config: LearnConfig) -> LearnedWorkload {
        LearnedWorkload::new(&cold_start_prior(), config)
    }

    /// Forgets everything but the prior and learns `pods` in arrival order (after a
    /// restart: the pods in the cluster, oldest first).
    pub fn rebuild<'a>(
        prior: &TargetWorkload,
        config: LearnConfig,
        pods: impl IntoIterator<Item = &'a Request>,
    ) -> LearnedWorkload {
        let mut w = LearnedWorkload::new(prior, config);
        for r in pods {
            w.learn(r);
        }
        w.publish();
        w
    }

    /// Learns one arrival. Returns `true` when the published target changed (callers
    /// holding a policy built from [`LearnedWorkload::target`] rebuild it).
    pub fn observe(&mut self, req: &Request) -> bool {
        self.learn(req);
        self.maybe_publish()
    }

    /// Takes back one arrival of `req`'s shape at today's weight (a pod observed twice,
    /// or one that never ran), never below zero. Returns `true` when the target changed.
    pub fn forget(&mut self, req: &Request) -> bool {
        let p = typical_of(req);
        if let Some(&i) = self.index.get(&key(&p)) {
            let take = self.unit.min(self.mass[i]);
            self.mass[i] -= take;
            self.total -= take;
        }
        self.maybe_publish()
    }

    /// The published target (weights sum to 1), what policies should be built from.
    pub fn target(&self) -> Arc<TargetWorkload> {
        self.snapshot.clone()
    }

    /// Bumped each time [`LearnedWorkload::target`] changes.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// How it learns (half-life, prior mass, rebuild distance).
    pub fn config(&self) -> LearnConfig {
        self.config
    }

    /// Arrivals learned (after the prior).
    pub fn arrivals(&self) -> u64 {
        self.arrivals
    }

    /// The histogram as it is now (weights sum to 1), shapes with no weight left out.
    pub fn current(&self) -> TargetWorkload {
        if self.total <= 0.0 {
            return TargetWorkload::default();
        }
        TargetWorkload {
            pods: self
                .shapes
                .iter()
                .zip(&self.mass)
                .filter(|(_, m)| **m > 0.0)
                .map(|(p, m)| TypicalPod {
                    weight: m / self.total,
                    ..*p
                })
                .collect(),
        }
    }

    fn learn(&mut self, req: &Request) {
        let mut p = typical_of(req);
        p.weight = 0.0;
        self.add(&p, self.unit);
        self.arrivals += 1;
        let h = self.config.half_life_arrivals;
        if h.is_finite() && h > 0.0 {
            self.unit *= 2f64.powf(1.0 / h);
            if self.unit > 1e100 {
                // Rescale so the masses stay finite; ratios are unchanged.
                let s = 1.0 / self.unit;
                self.mass.iter_mut().for_each(|m| *m *= s);
                self.total *= s;
                self.unit = 1.0;
            }
        }
    }

    fn add(&mut self, p: &TypicalPod, mass: f64) {
        let i = *self.index.entry(key(p)).or_insert_with(|| {
            self.shapes.push(TypicalPod { weight: 0.0, ..*p });
            self.mass.push(0.0);
            self.shapes.len() - 1
        });
        self.mass[i] += mass;
        self.total += mass;
    }

    /// Total variation distance between the histogram and the published snapshot.
    fn drift(&self) -> f64 {
        if self.total <= 0.0 {
            return if self.snapshot.pods.is_empty() {
                0.0
            } else {
                1.0
            };
        }
        let mut published: FxHashMap<Key, f64> = self
            .snapshot
            .pods
            .iter()
            .map(|p| (key(p), p.weight))
            .collect();
        let mut d = 0.0;
        for (p, m) in self.shapes.iter().zip(&self.mass) {
            let old = published.remove(&key(p)).unwrap_or(0.0);
            d += (m / self.total - old).abs();
        }
        d += published.values().sum::<f64>();
        d / 2.0
    }

    fn maybe_publish(&mut self) -> bool {
        if self.drift() >= self.config.rebuild_distance {
            self.publish();
            true
        } else {
            false
        }
    }

    fn publish(&mut self) {
        self.snapshot = Arc::new(self.current());
        self.generation += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight_of(wl: &TargetWorkload, gpus: u32, milli: u32) -> f64 {
        wl.pods
            .iter()
            .filter(|p| p.gpus == gpus && p.milli == milli)
            .map(|p| p.weight)
            .sum()
    }

    #[test]
    fn half_life_halves_an_arrivals_weight() {
        let config = LearnConfig {
            half_life_arrivals: 10.0,
            prior_mass: 0.0,
            rebuild_distance: 0.0,
        };
        let mut w = LearnedWorkload::new(&TargetWorkload::default(), config);
        w.observe(&Request::whole(8, 1000, 0));
        for _ in 0..10 {
            w.observe(&Request::whole(1, 1000, 0));
        }
        // The 8-GPU pod is 10 arrivals old: weight ½ against ten 1-GPU pods of weights
        // 2^(1/10)…2^(10/10) (relative to it at its arrival, 1).
        let ones: f64 = (1..=10).map(|k| 2f64.powf(f64::from(k) / 10.0)).sum();
        let unit = 2f64.powf(1.0);
        let want = 1.0 / unit / (1.0 / unit + ones / unit);
        let got = weight_of(&w.current(), 8, 1000);
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }

    #[test]
    fn prior_fades_and_target_follows_the_arrivals() {
        let mut w = LearnedWorkload::cold_start(LearnConfig::default());
        let g0 = w.generation();
        assert!((weight_of(&w.target(), 1, 1000) - 0.4).abs() < 1e-12);
        let mut changes = 0;
        for _ in 0..20_000 {
            changes += usize::from(w.observe(&Request::share_milli(810, 3000, 0)));
        }
        // 256 prior pods, faded by 2^(-20000/4096) to about 9, against about 5,900
        // effective arrivals: the share dominates the histogram, and the published
        // target is within the rebuild distance of it.
        let now = weight_of(&w.current(), 1, 810);
        assert!(now > 0.99, "{now}");
        assert!(now - weight_of(&w.target(), 1, 810) < 0.05);
        assert_eq!(w.generation() - g0, changes as u64);
        // Each rebuild moves the target by at least the rebuild distance (0.05) and the
        // prior holds at most all of the mass, so at most 1/0.05 = 20 rebuilds.
        assert!(changes > 0 && changes <= 20, "{changes}");
    }

    #[test]
    fn forget_undoes_observe_and_rebuild_equals_replay() {
        let config = LearnConfig::default();
        let prior = TargetWorkload::default();
        let reqs = [
            Request::whole(1, 8000, 0),
            Request::share_milli(500, 4000, 0),
            Request::whole(1, 8000, 0),
        ];
        let rebuilt = LearnedWorkload::rebuild(&prior, config, &reqs);
        let mut live = LearnedWorkload::new(&prior, config);
        for r in &reqs {
            live.observe(r);
        }
        assert_eq!(live.current(), rebuilt.current());
        assert_eq!(live.target(), rebuilt.target());
        let extra = Request::whole(8, 64000, 0);
        live.observe(&extra);
        assert!(weight_of(&live.current(), 8, 1000) > 0.0);
        live.forget(&extra);
        assert_eq!(weight_of(&live.current(), 8, 1000), 0.0);
        // Forgetting a shape never seen changes nothing.
        let before = live.current();
        live.forget(&Request::whole(4, 1000, 0));
        assert_eq!(live.current(), before);
    }
}
