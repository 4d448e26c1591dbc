//! MIG changes and MIG placements through NVML's C API.
//!
//! nvml-wrapper 0.13 switches MIG mode and lists MIG devices, but has no calls
//! for GPU instances and compute instances. This module calls those functions of
//! the library nvml-wrapper loaded (`Nvml::lib`) directly, the way `nvidia-smi
//! mig -cgi … -C` does: a GPU instance of the profile at the planned placement,
//! then one compute instance filling it (what a container is handed as a
//! `MIG-…` device). Every symbol is looked up before the call, so a driver
//! without one answers `NVML_ERROR_FUNCTION_NOT_FOUND` instead of the generated
//! binding's panic; every failure names NVML's return code, and a half-made
//! change is undone (a GPU instance whose compute instance could not be created
//! is destroyed again), so a refused change leaves the GPU as it was.
//!
//! Not yet run on a MIG-capable GPU by this project: `scripts/gpu-smoke.sh`
//! (`TESSERA_SMOKE_MIG=1`) drives exactly these calls through
//! `tessera node-agent mig` on one.

// The one module of the workspace with unsafe code (see tessera-node's Cargo.toml).
#![allow(unsafe_code)]

use std::os::raw::c_uint;

use nvml_wrapper::Device;
use nvml_wrapper_sys::bindings as sys;

use crate::backend::{BackendError, MigInstance};

const MIB: u64 = 1024 * 1024;

/// NVML's name for a return code (`nvml.h`, `nvmlReturn_t`).
pub(super) fn return_name(code: sys::nvmlReturn_t) -> &'static str {
    match code {
        0 => "NVML_SUCCESS",
        1 => "NVML_ERROR_UNINITIALIZED",
        2 => "NVML_ERROR_INVALID_ARGUMENT",
        3 => "NVML_ERROR_NOT_SUPPORTED",
        4 => "NVML_ERROR_NO_PERMISSION",
        5 => "NVML_ERROR_ALREADY_INITIALIZED",
        6 => "NVML_ERROR_NOT_FOUND",
        7 => "NVML_ERROR_INSUFFICIENT_SIZE",
        8 => "NVML_ERROR_INSUFFICIENT_POWER",
        9 => "NVML_ERROR_DRIVER_NOT_LOADED",
        10 => "NVML_ERROR_TIMEOUT",
        11 => "NVML_ERROR_IRQ_ISSUE",
        12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
        13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
        14 => "NVML_ERROR_CORRUPTED_INFOROM",
        15 => "NVML_ERROR_GPU_IS_LOST",
        16 => "NVML_ERROR_RESET_REQUIRED",
        17 => "NVML_ERROR_OPERATING_SYSTEM",
        18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
        19 => "NVML_ERROR_IN_USE",
        20 => "NVML_ERROR_MEMORY",
        21 => "NVML_ERROR_NO_DATA",
        22 => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
        23 => "NVML_ERROR_INSUFFICIENT_RESOURCES",
        24 => "NVML_ERROR_FREQ_NOT_SUPPORTED",
        25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
        26 => "NVML_ERROR_DEPRECATED",
        27 => "NVML_ERROR_NOT_READY",
        28 => "NVML_ERROR_GPU_NOT_FOUND",
        29 => "NVML_ERROR_INVALID_STATE",
        _ => "NVML_ERROR_UNKNOWN",
    }
}

/// What the driver says of a GPU-instance change, in words, for the codes it
/// gives for MIG calls (NVML API reference, "GPU instance management").
fn meaning(code: &str) -> &'static str {
    match code {
        "NVML_ERROR_INSUFFICIENT_RESOURCES" => {
            "the placement overlaps an existing instance or no compute is left"
        }
        "NVML_ERROR_INVALID_ARGUMENT" => "the driver refuses the profile or placement",
        "NVML_ERROR_NOT_SUPPORTED" => "the GPU is not in MIG mode or lacks the profile",
        "NVML_ERROR_NO_PERMISSION" => "the agent needs root (CAP_SYS_ADMIN) to change MIG",
        "NVML_ERROR_IN_USE" => "processes still run on the instance",
        "NVML_ERROR_FUNCTION_NOT_FOUND" => "the driver's NVML is too old for this call",
        _ => "",
    }
}

/// A failed NVML call on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Failure {
    pub call: &'static str,
    pub code: &'static str,
    pub detail: String,
}

impl Failure {
    fn new(call: &'static str, code: &'static str) -> Failure {
        Failure {
            call,
            code,
            detail: String::new(),
        }
    }

    fn detail(mut self, detail: impl Into<String>) -> Failure {
        self.detail = detail.into();
        self
    }

    pub(super) fn into_backend(self, gpu: &str) -> BackendError {
        let why = meaning(self.code);
        let mut message = format!("{} failed", self.call);
        for part in [why, self.detail.as_str()] {
            if !part.is_empty() {
                message.push_str(": ");
                message.push_str(part);
            }
        }
        BackendError::Mig {
            gpu: gpu.to_string(),
            code: self.code,
            message,
        }
    }
}

/// Calls a function of the loaded NVML library, if the library has it, and turns
/// its return code into a [`Failure`] naming the call.
macro_rules! nvml_call {
    ($lib:expr, $f:ident ( $($arg:expr),* $(,)? )) => {{
        match $lib.$f.as_ref() {
            // SAFETY: the symbol was resolved from the driver's libnvidia-ml with the
            // signature nvml.h declares (nvml-wrapper-sys's generated bindings); the
            // arguments are handles NVML gave us and pointers to live locals.
            Ok(f) => {
                let code = unsafe { (*f)($($arg),*) };
                if code == sys::nvmlReturn_enum_NVML_SUCCESS {
                    Ok(())
                } else {
                    Err(Failure::new(stringify!($f), return_name(code)))
                }
            }
            Err(_) => Err(Failure::new(stringify!($f), "NVML_ERROR_FUNCTION_NOT_FOUND")),
        }
    }};
}

/// One GPU-instance profile the GPU offers, as NVML describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct GiProfile {
    /// The profile's ID for the create call.
    pub id: c_uint,
    /// NVIDIA's name without the `MIG ` prefix, e.g. `3g.40gb`, `1g.10gb+me`.
    pub name: String,
    pub slices: c_uint,
    pub memory_mib: u64,
}

/// The profile name NVML reports (`MIG 1g.10gb`), as Tessera names it (`1g.10gb`).
pub(super) fn profile_name(raw: &[std::os::raw::c_char]) -> String {
    let bytes: Vec<u8> = raw
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    let s = String::from_utf8_lossy(&bytes);
    s.trim().trim_start_matches("MIG ").trim().to_string()
}

/// `NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2)` from nvml.h.
fn gi_profile_info_v2_version() -> c_uint {
    std::mem::size_of::<sys::nvmlGpuInstanceProfileInfo_v2_t>() as c_uint | (2 << 24)
}

/// The GPU-instance profiles `dev` offers.
pub(super) fn gi_profiles(lib: &sys::NvmlLib, dev: &Device<'_>) -> Result<Vec<GiProfile>, Failure> {
    // SAFETY: only passed back to NVML.
    let handle = unsafe { dev.handle() };
    let mut out = Vec::new();
    let mut last = None;
    for index in 0..sys::NVML_GPU_INSTANCE_PROFILE_COUNT {
        // SAFETY: a plain C struct of integers and a char array; all-zero is valid.
        let mut info: sys::nvmlGpuInstanceProfileInfo_v2_t = unsafe { std::mem::zeroed() };
        info.version = gi_profile_info_v2_version();
        match nvml_call!(
            lib,
            nvmlDeviceGetGpuInstanceProfileInfoV(handle, index, &mut info)
        ) {
            Ok(()) => out.push(GiProfile {
                id: info.id,
                name: profile_name(&info.name),
                slices: info.sliceCount,
                memory_mib: info.memorySizeMB,
            }),
            // A profile this GPU does not have.
            Err(f)
                if f.code == "NVML_ERROR_NOT_SUPPORTED"
                    || f.code == "NVML_ERROR_INVALID_ARGUMENT" => {}
            Err(f) => last = Some(f),
        }
    }
    match (out.is_empty(), last) {
        (true, Some(f)) => Err(f),
        _ => Ok(out),
    }
}

/// The placements (first memory slice, size) at which NVML allows profile `id`.
fn possible_placements(
    lib: &sys::NvmlLib,
    handle: sys::nvmlDevice_t,
    id: c_uint,
) -> Result<Vec<sys::nvmlGpuInstancePlacement_t>, Failure> {
    let mut buf = [sys::nvmlGpuInstancePlacement_t { start: 0, size: 0 }; 16];
    let mut count = buf.len() as c_uint;
    nvml_call!(
        lib,
        nvmlDeviceGetGpuInstancePossiblePlacements_v2(handle, id, buf.as_mut_ptr(), &mut count)
    )?;
    Ok(buf[..(count as usize).min(buf.len())].to_vec())
}

/// The GPU-instance ID of a MIG device.
fn gpu_instance_id(lib: &sys::NvmlLib, mig: &Device<'_>) -> Result<c_uint, Failure> {
    let mut id: c_uint = 0;
    // SAFETY: only passed back to NVML.
    let handle = unsafe { mig.handle() };
    nvml_call!(lib, nvmlDeviceGetGpuInstanceId(handle, &mut id))?;
    Ok(id)
}

/// Where an existing MIG device sits: its GPU instance's profile ID and first
/// memory slice.
pub(super) fn placement_of(
    lib: &sys::NvmlLib,
    parent: &Device<'_>,
    mig: &Device<'_>,
) -> Result<(c_uint, u8), Failure> {
    let gi_id = gpu_instance_id(lib, mig)?;
    // SAFETY: only passed back to NVML.
    let handle = unsafe { parent.handle() };
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    nvml_call!(lib, nvmlDeviceGetGpuInstanceById(handle, gi_id, &mut gi))?;
    // SAFETY: a plain C struct of a handle and integers; all-zero is valid.
    let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    nvml_call!(lib, nvmlGpuInstanceGetInfo(gi, &mut info))?;
    Ok((info.profileId, info.placement.start.min(255) as u8))
}

/// The MIG devices of `parent` with their UUIDs.
fn mig_devices<'n>(parent: &Device<'n>) -> Vec<(String, Device<'n>)> {
    // NVML's maximum count (nvmlDeviceGetMaxMigDeviceCount): indices may be empty.
    let max = parent.mig_device_count().unwrap_or(0);
    (0..max)
        .filter_map(|i| parent.mig_device_by_index(i).ok())
        .filter_map(|d| d.uuid().ok().map(|u| (u, d)))
        .collect()
}

/// The instance as the agent reports it.
fn instance(uuid: String, profile: &str, start: u8, mig: &Device<'_>) -> MigInstance {
    let attrs = mig.attributes().ok();
    MigInstance {
        uuid,
        profile: profile.to_string(),
        start: Some(start),
        memory_mib: attrs
            .as_ref()
            .map(|a| a.memory_size_mb)
            .or_else(|| mig.memory_info().ok().map(|m| m.total / MIB))
            .unwrap_or(0),
        sm_count: attrs.map(|a| a.multiprocessor_count),
    }
}

/// Creates a GPU instance of `profile` at memory slice `start` on `dev` (in MIG
/// mode) and one compute instance filling it; returns the new MIG device.
pub(super) fn create(
    lib: &sys::NvmlLib,
    dev: &Device<'_>,
    profile: &str,
    start: u8,
) -> Result<MigInstance, Failure> {
    // SAFETY: only passed back to NVML.
    let handle = unsafe { dev.handle() };
    let profiles = gi_profiles(lib, dev)?;
    let p = profiles.iter().find(|p| p.name == profile).ok_or_else(|| {
        let names: Vec<&str> = profiles.iter().map(|p| p.name.as_str()).collect();
        Failure::new(
            "nvmlDeviceGetGpuInstanceProfileInfoV",
            "NVML_ERROR_NOT_SUPPORTED",
        )
        .detail(format!(
            "the GPU has no profile {profile} (it has: {})",
            names.join(", ")
        ))
    })?;
    let placements = possible_placements(lib, handle, p.id)?;
    let placement = placements
        .iter()
        .find(|pl| pl.start == c_uint::from(start))
        .copied()
        .ok_or_else(|| {
            let starts: Vec<String> = placements.iter().map(|pl| pl.start.to_string()).collect();
            Failure::new(
                "nvmlDeviceGetGpuInstancePossiblePlacements_v2",
                "NVML_ERROR_INVALID_ARGUMENT",
            )
            .detail(format!(
                "{profile} may not start at memory slice {start} (allowed: {})",
                starts.join(", ")
            ))
        })?;
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    nvml_call!(
        lib,
        nvmlDeviceCreateGpuInstanceWithPlacement(handle, p.id, &placement, &mut gi)
    )
    .map_err(|f| f.detail(format!("{profile} at memory slice {start}")))?;
    // From here on a failure destroys the GPU instance again.
    let undo = |f: Failure| {
        if let Err(e) = nvml_call!(lib, nvmlGpuInstanceDestroy(gi)) {
            tracing::error!(
                call = e.call,
                code = e.code,
                "cannot undo a half-made MIG instance"
            );
        }
        f
    };
    let ci_profile = full_compute_profile(lib, gi, p.slices).map_err(undo)?;
    let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    nvml_call!(
        lib,
        nvmlGpuInstanceCreateComputeInstance(gi, ci_profile, &mut ci)
    )
    .map_err(undo)?;
    // SAFETY: a plain C struct of a handle and integers; all-zero is valid.
    let mut info: sys::nvmlGpuInstanceInfo_t = unsafe { std::mem::zeroed() };
    let found = nvml_call!(lib, nvmlGpuInstanceGetInfo(gi, &mut info)).and_then(|()| {
        mig_devices(dev)
            .into_iter()
            .find(|(_, d)| gpu_instance_id(lib, d).is_ok_and(|id| id == info.id))
            .ok_or_else(|| {
                Failure::new(
                    "nvmlDeviceGetMigDeviceHandleByIndex",
                    "NVML_ERROR_NOT_FOUND",
                )
                .detail("the new instance has no MIG device")
            })
    });
    match found {
        Ok((uuid, d)) => Ok(instance(uuid, profile, start, &d)),
        Err(f) => {
            if let Err(e) = nvml_call!(lib, nvmlComputeInstanceDestroy(ci)) {
                tracing::error!(
                    call = e.call,
                    code = e.code,
                    "cannot undo a compute instance"
                );
            }
            Err(undo(f))
        }
    }
}

/// The compute-instance profile that fills a GPU instance of `slices` slices.
fn full_compute_profile(
    lib: &sys::NvmlLib,
    gi: sys::nvmlGpuInstance_t,
    slices: c_uint,
) -> Result<c_uint, Failure> {
    for index in 0..sys::NVML_COMPUTE_INSTANCE_PROFILE_COUNT {
        // SAFETY: a plain C struct of integers; all-zero is valid.
        let mut info: sys::nvmlComputeInstanceProfileInfo_t = unsafe { std::mem::zeroed() };
        let ok = nvml_call!(
            lib,
            nvmlGpuInstanceGetComputeInstanceProfileInfo(
                gi,
                index,
                sys::NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED,
                &mut info
            )
        );
        if ok.is_ok() && info.sliceCount == slices {
            return Ok(info.id);
        }
    }
    Err(Failure::new(
        "nvmlGpuInstanceGetComputeInstanceProfileInfo",
        "NVML_ERROR_NOT_SUPPORTED",
    )
    .detail(format!("no compute-instance profile of {slices} slices")))
}

/// Destroys the MIG device `mig_uuid` of `dev`: its compute instance, then its
/// GPU instance. Refused while a process runs on it.
pub(super) fn destroy(lib: &sys::NvmlLib, dev: &Device<'_>, mig_uuid: &str) -> Result<(), Failure> {
    let Some((_, mig)) = mig_devices(dev).into_iter().find(|(u, _)| u == mig_uuid) else {
        return Err(Failure::new(
            "nvmlDeviceGetMigDeviceHandleByIndex",
            "NVML_ERROR_NOT_FOUND",
        )
        .detail(format!("the GPU has no MIG device {mig_uuid}")));
    };
    let running = mig
        .running_compute_processes()
        .map(|p| p.len())
        .unwrap_or(0);
    if running > 0 {
        return Err(
            Failure::new("nvmlDeviceGetComputeRunningProcesses", "NVML_ERROR_IN_USE")
                .detail(format!("{running} processes run on {mig_uuid}")),
        );
    }
    // SAFETY: only passed back to NVML.
    let (parent, handle) = unsafe { (dev.handle(), mig.handle()) };
    let gi_id = gpu_instance_id(lib, &mig)?;
    let mut ci_id: c_uint = 0;
    nvml_call!(lib, nvmlDeviceGetComputeInstanceId(handle, &mut ci_id))?;
    let mut gi: sys::nvmlGpuInstance_t = std::ptr::null_mut();
    nvml_call!(lib, nvmlDeviceGetGpuInstanceById(parent, gi_id, &mut gi))?;
    let mut ci: sys::nvmlComputeInstance_t = std::ptr::null_mut();
    nvml_call!(
        lib,
        nvmlGpuInstanceGetComputeInstanceById(gi, ci_id, &mut ci)
    )?;
    nvml_call!(lib, nvmlComputeInstanceDestroy(ci))?;
    nvml_call!(lib, nvmlGpuInstanceDestroy(gi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_names_lose_nvml_prefix_and_padding() {
        let mut raw = [0 as std::os::raw::c_char; 96];
        for (i, b) in b"MIG 1g.10gb+me".iter().enumerate() {
            raw[i] = *b as std::os::raw::c_char;
        }
        assert_eq!(profile_name(&raw), "1g.10gb+me");
        assert_eq!(profile_name(&[0; 4]), "");
    }

    #[test]
    fn return_codes_have_nvml_names_and_failures_say_why() {
        assert_eq!(
            return_name(sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES),
            "NVML_ERROR_INSUFFICIENT_RESOURCES"
        );
        assert_eq!(
            return_name(sys::nvmlReturn_enum_NVML_ERROR_IN_USE),
            "NVML_ERROR_IN_USE"
        );
        assert_eq!(return_name(12345), "NVML_ERROR_UNKNOWN");
        let e = Failure::new(
            "nvmlDeviceCreateGpuInstanceWithPlacement",
            return_name(sys::nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES),
        )
        .detail("3g.40gb at memory slice 4")
        .into_backend("GPU-1");
        let text = e.to_string();
        assert!(text.contains("GPU-1"), "{text}");
        assert!(text.contains("NVML_ERROR_INSUFFICIENT_RESOURCES"), "{text}");
        assert!(text.contains("overlaps an existing instance"), "{text}");
        assert!(text.contains("3g.40gb at memory slice 4"), "{text}");
    }

    #[test]
    fn the_struct_version_is_nvmls() {
        // nvml.h: NVML_STRUCT_VERSION(GpuInstanceProfileInfo, 2) = sizeof | 2 << 24,
        // the struct being 11 unsigned ints, an unsigned long long (aligned to 8:
        // offset 48) and 96 chars: 152 bytes.
        assert_eq!(gi_profile_info_v2_version(), 152 | (2 << 24));
    }
}
