//! Partitionable MIG placements: which GPUs publish them, and which placement a
//! device name means. Pure; shared by [`super::slice`] (what is published) and
//! [`super::prepare`] (what a claim may ask to be created), so the two cannot
//! disagree.
//!
//! What the slices promise: a placement `gpu-<index>-mig-<profile>-<start>` is
//! published only for a GPU that is **already in MIG mode** (and MIG-capable, of
//! a model the catalog knows, with `partitionable-mig` on). The driver creates
//! the instance of an allocated placement at prepare, but never switches a GPU's
//! MIG mode: that needs an idle GPU (on some models a reset), which a claim for
//! one slice must not impose on the rest of the GPU. A GPU out of MIG mode is
//! published as a whole GPU only.

use tessera_core::model::MigGeometry;
use tessera_core::model::spec::Catalog;

use super::slice::{SliceOptions, mig_device_name};
use crate::backend::GpuInfo;

/// The MIG geometry whose placements `gpu` publishes, if it publishes any.
pub fn published_geometry(
    gpu: &GpuInfo,
    options: SliceOptions,
    catalog: &Catalog,
) -> Option<MigGeometry> {
    if !options.partitionable_mig || !gpu.mig_capable || !gpu.mig_enabled {
        return None;
    }
    let id = catalog.find(gpu.model.as_deref()?)?;
    catalog.spec(id).mig.clone()
}

/// A placement a device name means: a GPU instance of `profile` at memory slice
/// `start` on the GPU with `gpu_uuid`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub gpu_uuid: String,
    pub profile: String,
    pub start: u8,
    /// The instance's memory, as the catalog gives it.
    pub memory_mib: u64,
}

/// The published placement named `name`, if any (whether or not its instance exists).
pub fn find_placement(
    gpus: &[GpuInfo],
    name: &str,
    options: SliceOptions,
    catalog: &Catalog,
) -> Option<Placement> {
    for gpu in gpus {
        let Some(geo) = published_geometry(gpu, options, catalog) else {
            continue;
        };
        for p in &geo.profiles {
            for &start in &p.starts {
                if geo.placement_mask(p, start).is_some()
                    && mig_device_name(gpu, &p.name, &start.to_string()) == name
                {
                    return Some(Placement {
                        gpu_uuid: gpu.uuid.clone(),
                        profile: p.name.clone(),
                        start,
                        memory_mib: p.memory_mib,
                    });
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::GpuBackend;
    use crate::backend::fake::Fake;

    fn gpus(mig_on: bool) -> Vec<GpuInfo> {
        let mig = if mig_on { "{ enabled: true }" } else { "null" };
        let yaml = format!(
            "gpus:\n  - {{ uuid: GPU-a, product: NVIDIA A100-SXM4-80GB, mig: {mig} }}\n  - {{ uuid: GPU-t, product: Tesla T4 }}\n"
        );
        Fake::from_yaml(&yaml, "t").unwrap().discover().unwrap()
    }

    const ON: SliceOptions = SliceOptions {
        consumable_capacity: false,
        partitionable_mig: true,
        device_taints: false,
    };

    /// Names resolve to exactly the placements published: a GPU in MIG mode with
    /// the feature on; not a GPU out of MIG mode, not a model without MIG, not an
    /// unknown profile or a start the profile does not allow.
    #[test]
    fn names_resolve_to_published_placements_only() {
        let catalog = Catalog::default();
        let on = gpus(true);
        let p = find_placement(&on, "gpu-0-mig-3g40gb-4", ON, &catalog).unwrap();
        assert_eq!(
            (p.gpu_uuid.as_str(), p.profile.as_str(), p.start),
            ("GPU-a", "3g.40gb", 4)
        );
        // 3g.40gb may start at 0 or 4 only; no such profile; the T4; the option off.
        assert_eq!(
            find_placement(&on, "gpu-0-mig-3g40gb-2", ON, &catalog),
            None
        );
        assert_eq!(
            find_placement(&on, "gpu-0-mig-9g99gb-0", ON, &catalog),
            None
        );
        assert_eq!(
            find_placement(&on, "gpu-1-mig-1g10gb-0", ON, &catalog),
            None
        );
        let off = SliceOptions::default();
        assert_eq!(
            find_placement(&on, "gpu-0-mig-3g40gb-4", off, &catalog),
            None
        );
        // Out of MIG mode: nothing published, nothing to create.
        assert_eq!(
            find_placement(&gpus(false), "gpu-0-mig-3g40gb-4", ON, &catalog),
            None
        );
    }
}
