//! GPU-equivalents: one quota unit across GPU models, shares and MIG instances.
//!
//! A team's quota is "12 GPUs" only when every GPU is the same. Here each model
//! has a factor (H100 = 1.0, A100 = 0.6, T4 = 0.1, as an operator sets them), and
//! a grant counts by the fraction of its GPU it takes times the factor. A share
//! (MPS or time-sliced) or a MIG instance takes the *larger* of its memory and
//! compute fractions: 20 GiB and 10 % of an 80 GiB GPU holds a quarter of what
//! others could use, not a tenth.

use serde::{Deserialize, Serialize};

use super::Resources;
use crate::model::{Cluster, ModelId, NodeId, spec::Catalog};
use crate::placement::{GpuGrant, Placement};
use crate::request::{GpuAsk, Request};

/// A factor per GPU model, in milli (1000 = one GPU-equivalent per whole GPU).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuEquivalents {
    /// Indexed by [`ModelId`]; models added to the catalog later count at `default_milli`.
    factor_milli: Vec<u32>,
    default_milli: u32,
}

/// A factor table that could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EquivError {
    #[error("gpuEquivalents: unknown GPU model {0:?} (not in the catalog)")]
    UnknownModel(String),
    #[error("gpuEquivalents.{model}: factor {factor} must be a finite number between 0 and 1000")]
    BadFactor { model: String, factor: f64 },
}

impl Default for GpuEquivalents {
    fn default() -> Self {
        GpuEquivalents::uniform()
    }
}

impl GpuEquivalents {
    /// Every model counts 1.0 per GPU.
    pub fn uniform() -> GpuEquivalents {
        GpuEquivalents {
            factor_milli: Vec::new(),
            default_milli: 1000,
        }
    }

    /// Factors by model name (canonical or alias); models not named count `default`.
    pub fn from_factors<'a>(
        catalog: &Catalog,
        factors: impl IntoIterator<Item = (&'a str, f64)>,
        default: f64,
    ) -> Result<GpuEquivalents, EquivError> {
        let milli = |model: &str, f: f64| {
            if f.is_finite() && (0.0..=1000.0).contains(&f) {
                Ok((f * 1000.0).round() as u32)
            } else {
                Err(EquivError::BadFactor {
                    model: model.to_string(),
                    factor: f,
                })
            }
        };
        let default_milli = milli("default", default)?;
        let mut factor_milli = vec![default_milli; catalog.specs().len()];
        for (name, f) in factors {
            let id = catalog
                .find(name)
                .ok_or_else(|| EquivError::UnknownModel(name.to_string()))?;
            factor_milli[id.0 as usize] = milli(name, f)?;
        }
        Ok(GpuEquivalents {
            factor_milli,
            default_milli,
        })
    }

    /// The factor of `model`, in milli.
    pub fn factor_milli(&self, model: ModelId) -> u32 {
        self.factor_milli
            .get(model.0 as usize)
            .copied()
            .unwrap_or(self.default_milli)
    }

    /// The fraction of its GPU a holding takes, in per-mille, whoever
    /// allocated it (a grant, a DRA claim): the largest of its `parts`, each
    /// `(part, whole)` of one thing it takes (memory, compute, MIG memory or
    /// compute slices), rounded up. No parts (`None` or empty), or a whole that
    /// is not positive, counts the whole GPU: what cannot be measured counts
    /// as much as it could be.
    pub fn fraction_milli(parts: Option<&[(i128, i128)]>) -> u32 {
        let Some(parts) = parts.filter(|p| !p.is_empty()) else {
            return 1000;
        };
        parts
            .iter()
            .map(|&(part, whole)| {
                if whole <= 0 {
                    return 1000;
                }
                let part = part.max(0);
                if part >= whole {
                    return 1000;
                }
                let (p, w) = match part.checked_mul(1000) {
                    Some(p) => (p, whole),
                    // Huge amounts (nano-units near i128's end): per-mille of
                    // the whole instead, rounded up all the same.
                    None => (part, whole / 1000),
                };
                let ceil = p / w + i128::from(p % w != 0);
                ceil.clamp(0, 1000) as u32
            })
            .max()
            .unwrap_or(1000)
    }

    /// The fraction of its GPU a grant holds, in per-mille
    /// ([`GpuEquivalents::fraction_milli`]): 1000 for a whole GPU; the larger of
    /// memory and compute fractions for a share or a MIG instance.
    pub fn grant_fraction_milli(catalog: &Catalog, model: ModelId, grant: &GpuGrant) -> u32 {
        if grant.exclusive {
            return Self::fraction_milli(None);
        }
        let spec = catalog.spec(model);
        if let (Some(slot), Some(geo)) = (grant.mig, spec.mig.as_ref()) {
            return Self::fraction_milli(Some(&[
                (i128::from(slot.size), i128::from(geo.memory_slices)),
                (i128::from(slot.compute), i128::from(geo.compute_slices)),
            ]));
        }
        Self::fraction_milli(Some(&[
            (i128::from(grant.memory_mib), i128::from(spec.memory_mib)),
            (i128::from(grant.cores_milli), 1000),
        ]))
    }

    /// Milli GPU-equivalents of a holding taking `fraction_milli` of a GPU of
    /// `model`; a model the catalog does not know (`None`) counts 1.0.
    pub fn held_milli(&self, model: Option<ModelId>, fraction_milli: u32) -> u64 {
        let factor = model.map_or(1000, |m| self.factor_milli(m));
        u64::from(fraction_milli) * u64::from(factor) / 1000
    }

    /// GPU-equivalents of one grant on `node`, in milli.
    pub fn grant_milli(&self, cluster: &Cluster, node: NodeId, grant: &GpuGrant) -> u64 {
        let Some(gpu) = cluster.node(node).gpus.get(usize::from(grant.gpu)) else {
            return 0;
        };
        let frac = Self::grant_fraction_milli(&cluster.catalog, gpu.model, grant);
        self.held_milli(Some(gpu.model), frac)
    }

    /// What a placement counts against its queue's quota.
    pub fn placement(&self, cluster: &Cluster, p: &Placement) -> Resources {
        Resources {
            gpu_eq_milli: p
                .grants
                .iter()
                .map(|g| self.grant_milli(cluster, p.node, g))
                .sum(),
            cpu_milli: p.cpu_milli,
            memory_mib: p.memory_mib,
        }
    }

    /// The most a request can count once placed, in milli GPU-equivalents: the
    /// largest over the models in `cluster` it may land on. Admission checks this
    /// bound before the node is known, so a queue never passes its quota whichever
    /// GPU the pod gets; usage then counts the real grant.
    pub fn request_upper_bound(&self, cluster: &Cluster, req: &Request) -> u64 {
        let count = u64::from(req.gpu.gpu_count());
        if count == 0 {
            return 0;
        }
        let mut models: Vec<ModelId> = cluster
            .nodes()
            .iter()
            .flat_map(|n| n.gpus.iter().map(|g| g.model))
            .filter(|m| req.constraints.model_set.contains(*m))
            .collect();
        models.sort_unstable();
        models.dedup();
        let per_gpu = models
            .iter()
            .map(|&m| {
                let spec = cluster.catalog.spec(m);
                let frac = match &req.gpu {
                    GpuAsk::None => 0,
                    GpuAsk::Whole { .. } => 1000,
                    GpuAsk::Shared {
                        memory,
                        cores_milli,
                        ..
                    } => Self::fraction_milli(Some(&[
                        (
                            i128::from(memory.resolve(spec.memory_mib)),
                            i128::from(spec.memory_mib),
                        ),
                        (i128::from(*cores_milli), 1000),
                    ])),
                    GpuAsk::Mig { profile } => spec
                        .mig
                        .as_ref()
                        .and_then(|geo| {
                            geo.profile(profile).map(|(_, p)| {
                                Self::fraction_milli(Some(&[
                                    (i128::from(p.memory_slices), i128::from(geo.memory_slices)),
                                    (i128::from(p.compute_slices), i128::from(geo.compute_slices)),
                                ]))
                            })
                        })
                        .unwrap_or(0),
                };
                self.held_milli(Some(m), frac)
            })
            .max()
            .unwrap_or(0);
        per_gpu * count
    }

    /// The whole cluster's capacity in the same units (healthy or not: quota is
    /// about entitlement, not about today's failures).
    pub fn capacity(&self, cluster: &Cluster) -> Resources {
        let mut r = Resources::ZERO;
        for node in cluster.nodes() {
            r.cpu_milli += node.cpu_milli;
            r.memory_mib += node.memory_mib;
            r.gpu_eq_milli += node
                .gpus
                .iter()
                .map(|g| u64::from(self.factor_milli(g.model)))
                .sum::<u64>();
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Node;
    use crate::placement::MigSlot;

    fn cluster() -> Cluster {
        let catalog = Catalog::default();
        let h100 = catalog.find("H100-80GB").unwrap();
        let t4 = catalog.find("T4").unwrap();
        let nodes = vec![
            Node::uniform("h", 64_000, 512_000, h100, 8),
            Node::uniform("t", 16_000, 64_000, t4, 4),
        ];
        Cluster::new(catalog, nodes).unwrap()
    }

    #[test]
    fn factors_scale_whole_gpus_and_capacity() {
        let c = cluster();
        let ge = GpuEquivalents::from_factors(&c.catalog, [("H100-80GB", 1.0), ("T4", 0.1)], 0.5)
            .unwrap();
        // 8 × 1.0 + 4 × 0.1 = 8.4 GPU-equivalents.
        assert_eq!(ge.capacity(&c).gpu_eq_milli, 8_400);
        let whole = GpuGrant::whole(0, 81_920);
        assert_eq!(ge.grant_milli(&c, NodeId(0), &whole), 1_000);
        assert_eq!(ge.grant_milli(&c, NodeId(1), &whole), 100);
    }

    #[test]
    fn a_share_counts_by_its_larger_fraction() {
        let c = cluster();
        let ge = GpuEquivalents::uniform();
        let mem = c.catalog.spec(c.node(NodeId(0)).gpus[0].model).memory_mib;
        // A quarter of the memory and 10 % of compute → 250.
        let g = GpuGrant::shared(0, mem / 4, 100);
        assert_eq!(ge.grant_milli(&c, NodeId(0), &g), 250);
        // 1 MiB and 60 % of compute → 600.
        let g = GpuGrant::shared(0, 1, 600);
        assert_eq!(ge.grant_milli(&c, NodeId(0), &g), 600);
    }

    #[test]
    fn a_mig_instance_counts_by_its_slices() {
        let c = cluster();
        let ge = GpuEquivalents::uniform();
        // 3g: 3 of 7 compute slices (429 rounded up), 4 of 8 memory slices (500) → 500.
        let g = GpuGrant {
            gpu: 0,
            memory_mib: 40_000,
            cores_milli: 428,
            exclusive: false,
            mig: Some(MigSlot {
                profile: 0,
                start: 0,
                size: 4,
                compute: 3,
            }),
        };
        assert_eq!(ge.grant_milli(&c, NodeId(0), &g), 500);
    }

    #[test]
    fn the_upper_bound_takes_the_dearest_model_a_request_may_get() {
        let c = cluster();
        let ge = GpuEquivalents::from_factors(&c.catalog, [("H100-80GB", 1.0), ("T4", 0.1)], 0.5)
            .unwrap();
        // Two whole GPUs, any model: the H100 counts most → 2 × 1000.
        assert_eq!(ge.request_upper_bound(&c, &Request::whole(2, 0, 0)), 2_000);
        // Only T4 allowed → 2 × 100.
        let t4_only = Request::whole(2, 0, 0)
            .with_models(&["T4"], &c.catalog)
            .unwrap();
        assert_eq!(ge.request_upper_bound(&c, &t4_only), 200);
        // A 30 % share: 300 of an H100 (factor 1.0) beats 300 of a T4 (0.1).
        assert_eq!(
            ge.request_upper_bound(&c, &Request::share_milli(300, 0, 0)),
            300
        );
        assert_eq!(ge.request_upper_bound(&c, &Request::cpu_only(1000, 10)), 0);
    }

    /// One rule for every holding, a grant's or a claim's: the largest part,
    /// rounded up; what cannot be measured counts the whole GPU.
    #[test]
    fn a_holding_counts_by_its_largest_part_and_the_unmeasurable_counts_whole() {
        let f = GpuEquivalents::fraction_milli;
        assert_eq!(f(Some(&[(20, 80), (100, 1000)])), 250);
        assert_eq!(f(Some(&[(1, 3)])), 334, "rounded up");
        assert_eq!(f(Some(&[(-5, 10), (0, 10)])), 0);
        assert_eq!(f(Some(&[(90, 80)])), 1000, "at most the whole GPU");
        assert_eq!(f(None), 1000);
        assert_eq!(f(Some(&[])), 1000);
        assert_eq!(f(Some(&[(1, 10), (1, 0)])), 1000, "a whole of zero");
        assert_eq!(f(Some(&[(i128::MAX, i128::MAX)])), 1000, "no overflow");
        // Half, to within the rounding up of a per-mille of the whole.
        assert_eq!(f(Some(&[(i128::MAX / 2, i128::MAX)])), 501);
        let ge = GpuEquivalents::uniform();
        assert_eq!(ge.held_milli(None, 250), 250, "an unknown model counts 1.0");
    }

    #[test]
    fn bad_factor_tables_name_what_is_wrong() {
        let c = cluster();
        let e = GpuEquivalents::from_factors(&c.catalog, [("B999", 1.0)], 1.0).unwrap_err();
        assert!(e.to_string().contains("B999"), "{e}");
        let e = GpuEquivalents::from_factors(&c.catalog, [("T4", f64::NAN)], 1.0).unwrap_err();
        assert!(e.to_string().contains("T4"), "{e}");
        assert!(GpuEquivalents::from_factors(&c.catalog, [], -1.0).is_err());
    }
}
