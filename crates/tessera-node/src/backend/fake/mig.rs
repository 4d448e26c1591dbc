//! The fake backend's MIG state machine: mode switches, GPU + compute instance
//! creation at a placement, destruction. It checks what the driver checks, with
//! the core's placement tables ([`mig_layout::validate`]), and answers with NVML's
//! error names; a refused change leaves the GPU exactly as it was.

use tessera_core::fit::mig_layout;
use tessera_core::model::MigGeometry;

use super::{BackendError, Fake, FakeGpu, FakeMig, FakeMigInstance, MigInstance};

fn refuse(gpu: &str, code: &'static str, message: impl Into<String>) -> BackendError {
    BackendError::Mig {
        gpu: gpu.to_string(),
        code,
        message: message.into(),
    }
}

fn geometry(fake: &Fake, gpu: &FakeGpu) -> Option<MigGeometry> {
    let id = fake
        .catalog
        .find_product(&gpu.product, gpu.memory_mib.unwrap_or(0))?;
    fake.catalog.spec(id).mig.clone()
}

/// The layout of a fake GPU's instances as `(profile index, start)`; an instance
/// the file gives no start takes its profile's first free one, as the driver
/// would have placed it.
fn layout(geo: &MigGeometry, mig: &FakeMig) -> Vec<(u8, u8)> {
    let mut taken = 0u8;
    let mut out = Vec::new();
    let placed = |i: &FakeMigInstance| geo.profile(&i.profile).map(|(pi, p)| (pi, p, i.start));
    for (pi, p, start) in mig.instances.iter().filter_map(placed) {
        let start = start.or_else(|| {
            p.starts
                .iter()
                .copied()
                .find(|&s| geo.placement_mask(p, s).is_some_and(|m| m & taken == 0))
        });
        if let Some(s) = start {
            taken |= geo.placement_mask(p, s).unwrap_or(0);
            out.push((pi as u8, s));
        }
    }
    out
}

pub(super) fn set_mode(fake: &Fake, uuid: &str, enabled: bool) -> Result<(), BackendError> {
    let catalog_geo = {
        let st = fake.state();
        let gpu = st
            .config
            .gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .ok_or_else(|| BackendError::UnknownGpu(uuid.to_string()))?;
        geometry(fake, gpu)
    };
    fake.with_gpu(uuid, |gpu| {
        if catalog_geo.is_none() {
            return Err(refuse(
                uuid,
                "NVML_ERROR_NOT_SUPPORTED",
                format!("{} does not support MIG", gpu.product),
            ));
        }
        if !gpu.processes.is_empty() {
            return Err(refuse(
                uuid,
                "NVML_ERROR_IN_USE",
                format!(
                    "{} processes run on the GPU; MIG mode changes need an idle GPU",
                    gpu.processes.len()
                ),
            ));
        }
        let mig = gpu.mig.get_or_insert(FakeMig {
            enabled: false,
            instances: Vec::new(),
        });
        if !enabled && !mig.instances.is_empty() {
            return Err(refuse(
                uuid,
                "NVML_ERROR_IN_USE",
                format!(
                    "{} MIG instances exist; destroy them first",
                    mig.instances.len()
                ),
            ));
        }
        mig.enabled = enabled;
        Ok(())
    })?
}

pub(super) fn create(
    fake: &Fake,
    uuid: &str,
    profile: &str,
    start: u8,
) -> Result<MigInstance, BackendError> {
    let mut st = fake.state();
    let serial = st.mig_created + 1;
    let gpu = st
        .config
        .gpus
        .iter_mut()
        .find(|g| g.uuid == uuid)
        .ok_or_else(|| BackendError::UnknownGpu(uuid.to_string()))?;
    let geo = geometry(fake, gpu).ok_or_else(|| {
        refuse(
            uuid,
            "NVML_ERROR_NOT_SUPPORTED",
            format!("{} does not support MIG", gpu.product),
        )
    })?;
    let Some(mig) = gpu.mig.as_mut().filter(|m| m.enabled) else {
        return Err(refuse(uuid, "NVML_ERROR_NOT_SUPPORTED", "MIG mode is off"));
    };
    let Some((pi, p)) = geo.profile(profile) else {
        return Err(refuse(
            uuid,
            "NVML_ERROR_NOT_SUPPORTED",
            format!("no GPU instance profile {profile:?} on this model"),
        ));
    };
    if geo.placement_mask(p, start).is_none() {
        return Err(refuse(
            uuid,
            "NVML_ERROR_INVALID_ARGUMENT",
            format!(
                "{profile} cannot be placed at memory slice {start} (allowed starts: {:?})",
                p.starts
            ),
        ));
    }
    let mut next = layout(&geo, mig);
    next.push((pi as u8, start));
    if let Err(e) = mig_layout::validate(&geo, &next) {
        return Err(refuse(
            uuid,
            "NVML_ERROR_INSUFFICIENT_RESOURCES",
            e.to_string(),
        ));
    }
    let id = uuid.strip_prefix("GPU-").unwrap_or(uuid);
    let inst = FakeMigInstance {
        uuid: format!("MIG-{id}-gi{serial}"),
        profile: profile.to_string(),
        start: Some(start),
    };
    mig.instances.push(inst.clone());
    let memory_mib = p.memory_mib;
    st.mig_created = serial;
    Ok(MigInstance {
        uuid: inst.uuid,
        profile: inst.profile,
        start: inst.start,
        memory_mib,
        sm_count: None,
    })
}

pub(super) fn destroy(fake: &Fake, uuid: &str, mig_uuid: &str) -> Result<(), BackendError> {
    fake.with_gpu(uuid, |gpu| {
        let busy = gpu
            .processes
            .iter()
            .filter(|p| p.mig_uuid.as_deref() == Some(mig_uuid))
            .count();
        let Some(mig) = gpu.mig.as_mut() else {
            return Err(refuse(uuid, "NVML_ERROR_NOT_FOUND", "MIG mode is off"));
        };
        let Some(pos) = mig.instances.iter().position(|i| i.uuid == mig_uuid) else {
            return Err(refuse(
                uuid,
                "NVML_ERROR_NOT_FOUND",
                format!("no MIG instance {mig_uuid}"),
            ));
        };
        if busy > 0 {
            return Err(refuse(
                uuid,
                "NVML_ERROR_IN_USE",
                format!("{busy} processes run on {mig_uuid}"),
            ));
        }
        mig.instances.remove(pos);
        Ok(())
    })?
}

#[cfg(test)]
mod tests {
    use crate::backend::{BackendError, GpuBackend, fake::Fake};

    const ONE: &str = r#"
gpus:
  - uuid: GPU-m
    product: NVIDIA H100 80GB HBM3
  - uuid: GPU-t
    product: Tesla T4
"#;

    fn layout(fake: &Fake) -> Vec<(String, Option<u8>)> {
        let g = fake.discover().unwrap();
        g[0].mig_instances
            .iter()
            .map(|m| (m.profile.clone(), m.start))
            .collect()
    }

    fn code(e: BackendError) -> &'static str {
        match e {
            BackendError::Mig { code, .. } => code,
            other => panic!("expected a MIG error, got {other}"),
        }
    }

    #[test]
    fn create_advertise_destroy_and_refusals_change_nothing() {
        let fake = Fake::from_yaml(ONE, "test").unwrap();
        // Not in MIG mode yet; a T4 has no MIG at all.
        assert_eq!(
            code(fake.create_mig_instance("GPU-m", "3g.40gb", 4).unwrap_err()),
            "NVML_ERROR_NOT_SUPPORTED"
        );
        assert_eq!(
            code(fake.set_mig_mode("GPU-t", true).unwrap_err()),
            "NVML_ERROR_NOT_SUPPORTED"
        );
        fake.set_mig_mode("GPU-m", true).unwrap();
        assert!(fake.discover().unwrap()[0].mig_enabled);
        let a = fake.create_mig_instance("GPU-m", "3g.40gb", 4).unwrap();
        assert!(a.uuid.starts_with("MIG-"));
        assert_eq!(layout(&fake), [("3g.40gb".to_string(), Some(4))]);
        let before = layout(&fake);
        // Not an allowed start; overlapping the 3g; unknown profile: refused, unchanged.
        let e = fake.create_mig_instance("GPU-m", "3g.40gb", 2).unwrap_err();
        assert!(
            e.to_string().contains("cannot be placed at memory slice 2"),
            "{e}"
        );
        assert_eq!(code(e), "NVML_ERROR_INVALID_ARGUMENT");
        assert_eq!(
            code(fake.create_mig_instance("GPU-m", "2g.20gb", 4).unwrap_err()),
            "NVML_ERROR_INSUFFICIENT_RESOURCES"
        );
        assert_eq!(
            code(fake.create_mig_instance("GPU-m", "9g.99gb", 0).unwrap_err()),
            "NVML_ERROR_NOT_SUPPORTED"
        );
        assert_eq!(layout(&fake), before);
        // Mode off with an instance: in use. Destroy, then off.
        assert_eq!(
            code(fake.set_mig_mode("GPU-m", false).unwrap_err()),
            "NVML_ERROR_IN_USE"
        );
        let b = fake.create_mig_instance("GPU-m", "4g.40gb", 0).unwrap();
        assert_ne!(a.uuid, b.uuid);
        assert_eq!(layout(&fake).len(), 2);
        // 4g + 3g use all 7 compute slices: a 1g has no room left.
        assert_eq!(
            code(fake.create_mig_instance("GPU-m", "1g.10gb", 0).unwrap_err()),
            "NVML_ERROR_INSUFFICIENT_RESOURCES"
        );
        fake.destroy_mig_instance("GPU-m", &a.uuid).unwrap();
        assert_eq!(
            code(fake.destroy_mig_instance("GPU-m", &a.uuid).unwrap_err()),
            "NVML_ERROR_NOT_FOUND"
        );
        fake.destroy_mig_instance("GPU-m", &b.uuid).unwrap();
        fake.set_mig_mode("GPU-m", false).unwrap();
        assert!(!fake.discover().unwrap()[0].mig_enabled);
    }
}
