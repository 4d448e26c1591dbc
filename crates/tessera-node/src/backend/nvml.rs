//! The NVML backend: real GPUs through `libnvidia-ml.so.1`.
//!
//! nvml-wrapper loads the library only in [`Nvml::init`], so the agent binary
//! starts on a machine without a driver and reports [`BackendError::NvmlUnavailable`]
//! instead of failing to link. The NVML handle lives for the whole process (it is
//! leaked once) so the XID event set, which borrows it, can be kept beside it.
//! MIG instances are created and destroyed through NVML's C API ([`mig`]).

mod mig;

use std::sync::Mutex;
use std::time::Duration;

use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{
    Clock, EccCounter, MemoryError, TemperatureSensor, TopologyLevel,
};
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, EventSet};
use tessera_core::model::spec::Catalog;

use super::{
    BackendError, EccCounters, GpuBackend, GpuInfo, GpuProcess, GpuReadings, LinkKind, MigInstance,
    PeerLink, Probe, XidEvent,
};

/// Most NVLinks a GPU has (NVML's `NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;
const MIB: u64 = 1024 * 1024;

/// The NVML backend.
pub struct Nvml {
    nvml: &'static nvml_wrapper::Nvml,
    events: Mutex<Option<EventSet<'static>>>,
    catalog: Catalog,
}

impl std::fmt::Debug for Nvml {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvml").finish_non_exhaustive()
    }
}

fn call_err(call: &'static str, gpu: impl Into<String>) -> impl FnOnce(NvmlError) -> BackendError {
    let gpu = gpu.into();
    move |e| BackendError::Nvml {
        call,
        gpu,
        message: e.to_string(),
    }
}

impl Nvml {
    /// Loads NVML. Fails cleanly (no panic) when there is no driver.
    pub fn init() -> Result<Nvml, BackendError> {
        let nvml =
            nvml_wrapper::Nvml::init().map_err(|e| BackendError::NvmlUnavailable(e.to_string()))?;
        let nvml: &'static nvml_wrapper::Nvml = Box::leak(Box::new(nvml));
        let events = Self::register_xid_events(nvml);
        Ok(Nvml {
            nvml,
            events: Mutex::new(events),
            catalog: Catalog::default(),
        })
    }

    /// Registers critical-XID events on every GPU that supports them. A GPU whose
    /// registration fails is only logged: its XIDs will not be seen, which the
    /// health loop reports through the probe instead.
    fn register_xid_events(nvml: &'static nvml_wrapper::Nvml) -> Option<EventSet<'static>> {
        let mut set = match nvml.create_event_set() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "NVML cannot create an event set: XID events will not be seen");
                return None;
            }
        };
        let count = nvml.device_count().unwrap_or(0);
        for i in 0..count {
            let Ok(dev) = nvml.device_by_index(i) else {
                continue;
            };
            let supported = dev.supported_event_types().unwrap_or(EventTypes::empty());
            let wanted = EventTypes::CRITICAL_XID_ERROR & supported;
            if wanted.is_empty() {
                tracing::warn!(gpu = i, "GPU does not report XID events");
                continue;
            }
            match dev.register_events(wanted, set) {
                Ok(s) => set = s,
                Err(e) => {
                    tracing::warn!(gpu = i, error = %e.error, "cannot register XID events");
                    match nvml.create_event_set() {
                        Ok(s) => set = s,
                        Err(_) => return None,
                    }
                }
            }
        }
        Some(set)
    }

    fn device(&self, uuid: &str) -> Result<Device<'static>, BackendError> {
        self.nvml
            .device_by_uuid(uuid)
            .map_err(|_| BackendError::UnknownGpu(uuid.to_string()))
    }

    fn mig_profile_name(&self, model: Option<&str>, slices: u32, memory_mib: u64) -> String {
        // Prefer the catalog's name for this geometry; otherwise build NVIDIA's form.
        let geometry = model
            .and_then(|m| self.catalog.find(m))
            .and_then(|id| self.catalog.spec(id).mig.clone());
        if let Some(p) = geometry.as_ref().and_then(|g| {
            g.profiles
                .iter()
                .filter(|p| u32::from(p.compute_slices) == slices && !p.name.contains('+'))
                .min_by_key(|p| p.memory_mib.abs_diff(memory_mib))
        }) {
            return p.name.clone();
        }
        format!("{slices}g.{}gb", (memory_mib + 512) / 1024)
    }
}

impl GpuBackend for Nvml {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn driver_version(&self) -> Option<String> {
        self.nvml.sys_driver_version().ok()
    }

    fn cuda_version(&self) -> Option<String> {
        let v = self.nvml.sys_cuda_driver_version().ok()?;
        Some(format!(
            "{}.{}",
            nvml_wrapper::cuda_driver_version_major(v),
            nvml_wrapper::cuda_driver_version_minor(v)
        ))
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let count = self
            .nvml
            .device_count()
            .map_err(call_err("nvmlDeviceGetCount", "*"))?;
        let mut devices = Vec::new();
        for i in 0..count {
            let dev = self
                .nvml
                .device_by_index(i)
                .map_err(call_err("nvmlDeviceGetHandleByIndex", i.to_string()))?;
            devices.push(dev);
        }
        let mut out = Vec::new();
        for (i, dev) in devices.iter().enumerate() {
            let uuid = dev
                .uuid()
                .map_err(call_err("nvmlDeviceGetUUID", i.to_string()))?;
            let product = dev.name().unwrap_or_else(|_| "unknown".into());
            let memory_mib = dev.memory_info().map(|m| m.total / MIB).unwrap_or(0);
            let model = self
                .catalog
                .find_product(&product, memory_mib)
                .map(|id| self.catalog.spec(id).name.clone());
            let mig_mode = dev.mig_mode().ok();
            let mig_enabled = mig_mode.as_ref().is_some_and(|m| m.current == 1);
            let sm_count = dev
                .attributes()
                .ok()
                .map(|a| a.multiprocessor_count)
                .or_else(|| {
                    model
                        .as_deref()
                        .and_then(|m| self.catalog.find(m))
                        .map(|id| self.catalog.spec(id).sm_count)
                });
            let mut links = Vec::new();
            for (j, peer) in devices.iter().enumerate() {
                if i == j {
                    continue;
                }
                let Ok(peer_uuid) = peer.uuid() else { continue };
                // Count active NVLinks whose remote end is this peer.
                let peer_bus = peer.pci_info().map(|p| p.bus_id).unwrap_or_default();
                let mut nvlinks = 0;
                for l in 0..MAX_NVLINKS {
                    let link = dev.link_wrapper_for(l);
                    if link.is_active().unwrap_or(false)
                        && link
                            .remote_pci_info()
                            .is_ok_and(|r| !peer_bus.is_empty() && r.bus_id == peer_bus)
                    {
                        nvlinks += 1;
                    }
                }
                let kind = if nvlinks > 0 {
                    LinkKind::Nvlink
                } else {
                    match self.nvml.topology_common_ancestor(dev, peer) {
                        Ok(
                            TopologyLevel::Internal
                            | TopologyLevel::Single
                            | TopologyLevel::Multiple,
                        ) => LinkKind::PcieSwitch,
                        Ok(TopologyLevel::HostBridge | TopologyLevel::Node) => LinkKind::SameSocket,
                        _ => LinkKind::CrossSocket,
                    }
                };
                links.push(PeerLink {
                    peer_uuid,
                    kind,
                    nvlinks,
                });
            }
            let mut mig_instances = Vec::new();
            if mig_enabled {
                // NVML's own profile names and placements; the catalog's name for
                // the geometry where NVML cannot say (an older driver).
                let profiles = mig::gi_profiles(self.nvml.lib(), dev).unwrap_or_default();
                // The maximum count (nvmlDeviceGetMaxMigDeviceCount): indices may be empty.
                let max = dev.mig_device_count().unwrap_or(0);
                for m in 0..max {
                    let Ok(mig) = dev.mig_device_by_index(m) else {
                        continue;
                    };
                    let Ok(mig_uuid) = mig.uuid() else { continue };
                    let attrs = mig.attributes().ok();
                    let mem = attrs.as_ref().map(|a| a.memory_size_mb).unwrap_or(0);
                    let slices = attrs
                        .as_ref()
                        .map(|a| a.gpu_instance_slice_count)
                        .unwrap_or(0);
                    let placed = mig::placement_of(self.nvml.lib(), dev, &mig).ok();
                    let profile = placed
                        .and_then(|(id, _)| profiles.iter().find(|p| p.id == id))
                        .map(|p| p.name.clone())
                        .unwrap_or_else(|| self.mig_profile_name(model.as_deref(), slices, mem));
                    mig_instances.push(MigInstance {
                        uuid: mig_uuid,
                        profile,
                        start: placed.map(|(_, start)| start),
                        memory_mib: mem,
                        sm_count: attrs.map(|a| a.multiprocessor_count),
                    });
                }
            }
            out.push(GpuInfo {
                index: dev.index().unwrap_or(i as u32),
                uuid,
                product,
                model,
                memory_mib,
                sm_count,
                numa_node: dev.numa_node_id().ok(),
                pci_bus_id: dev.pci_info().map(|p| p.bus_id).unwrap_or_default(),
                compute_capability: dev
                    .cuda_compute_capability()
                    .ok()
                    .map(|c| (c.major.max(0) as u32, c.minor.max(0) as u32)),
                links,
                mig_enabled,
                mig_capable: mig_mode.is_some(),
                mig_instances,
            });
        }
        Ok(out)
    }

    fn read(&self, uuid: &str) -> Result<GpuReadings, BackendError> {
        let dev = self.device(uuid)?;
        let mem = dev.memory_info().ok();
        let mut processes: Vec<GpuProcess> = dev
            .running_compute_processes()
            .unwrap_or_default()
            .into_iter()
            .chain(dev.running_graphics_processes().unwrap_or_default())
            .map(|p| GpuProcess {
                pid: p.pid,
                used_memory_mib: match p.used_gpu_memory {
                    UsedGpuMemory::Used(b) => b / MIB,
                    UsedGpuMemory::Unavailable => 0,
                },
                sm_util_pct: None,
                mig_uuid: None,
            })
            .collect();
        processes.sort_by_key(|p| p.pid);
        processes.dedup_by_key(|p| p.pid);
        if let Ok(samples) = dev.process_utilization_stats(None) {
            for s in samples {
                if let Some(p) = processes.iter_mut().find(|p| p.pid == s.pid) {
                    p.sm_util_pct = Some(p.sm_util_pct.unwrap_or(0).max(s.sm_util));
                }
            }
        }
        let ecc = |e: MemoryError, c: EccCounter| dev.total_ecc_errors(e, c).ok();
        let probe = match dev.utilization_rates() {
            Err(NvmlError::GpuLost) => Probe::Failing("GPU has fallen off the bus".into()),
            _ if dev.are_pages_pending_retired().unwrap_or(false) => {
                Probe::Failing("retired pages pending: the GPU needs a reset".into())
            }
            _ => Probe::Ok,
        };
        Ok(GpuReadings {
            uuid: uuid.to_string(),
            utilization_pct: dev.utilization_rates().ok().map(|u| u.gpu),
            memory_used_mib: mem.as_ref().map(|m| m.used / MIB),
            memory_free_mib: mem.as_ref().map(|m| m.free / MIB),
            temperature_c: dev.temperature(TemperatureSensor::Gpu).ok(),
            power_w: dev.power_usage().ok().map(|mw| f64::from(mw) / 1000.0),
            sm_clock_mhz: dev.clock_info(Clock::SM).ok(),
            mem_clock_mhz: dev.clock_info(Clock::Memory).ok(),
            ecc: EccCounters {
                sbe_volatile: ecc(MemoryError::Corrected, EccCounter::Volatile),
                dbe_volatile: ecc(MemoryError::Uncorrected, EccCounter::Volatile),
                sbe_aggregate: ecc(MemoryError::Corrected, EccCounter::Aggregate),
                dbe_aggregate: ecc(MemoryError::Uncorrected, EccCounter::Aggregate),
            },
            processes,
            probe,
        })
    }

    fn set_mig_mode(&self, gpu: &str, enabled: bool) -> Result<(), BackendError> {
        let dev = self.device(gpu)?;
        let refuse = |code: &'static str, message: String| BackendError::Mig {
            gpu: gpu.to_string(),
            code,
            message,
        };
        if enabled
            && !dev
                .running_compute_processes()
                .unwrap_or_default()
                .is_empty()
        {
            return Err(refuse(
                "NVML_ERROR_IN_USE",
                "processes run on the GPU; MIG mode changes need an idle GPU".into(),
            ));
        }
        dev.set_mig_mode(enabled)
            .map_err(|e| refuse(nvml_error_name(&e), format!("nvmlDeviceSetMigMode: {e}")))?;
        // Some GPUs (A100 on bare metal without a reset) only take the new mode
        // after a GPU reset: the pending mode changed, the current did not.
        let mode = dev
            .mig_mode()
            .map_err(|e| refuse(nvml_error_name(&e), format!("nvmlDeviceGetMigMode: {e}")))?;
        if (mode.current == 1) != enabled {
            return Err(refuse(
                "NVML_ERROR_RESET_REQUIRED",
                format!(
                    "MIG mode {} is pending until the GPU is reset (nvidia-smi -r)",
                    if enabled { "on" } else { "off" }
                ),
            ));
        }
        Ok(())
    }

    fn create_mig_instance(
        &self,
        gpu: &str,
        profile: &str,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        let dev = self.device(gpu)?;
        mig::create(self.nvml.lib(), &dev, profile, start).map_err(|f| f.into_backend(gpu))
    }

    fn destroy_mig_instance(&self, gpu: &str, mig_uuid: &str) -> Result<(), BackendError> {
        let dev = self.device(gpu)?;
        mig::destroy(self.nvml.lib(), &dev, mig_uuid).map_err(|f| f.into_backend(gpu))
    }

    fn wait_xid_events(&self, timeout: Duration) -> Result<Vec<XidEvent>, BackendError> {
        let guard = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let Some(set) = guard.as_ref() else {
            drop(guard);
            std::thread::sleep(timeout);
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        let mut wait_ms = timeout.as_millis().min(u128::from(u32::MAX)) as u32;
        loop {
            match set.wait(wait_ms) {
                Ok(ev) => {
                    if !ev.event_type.contains(EventTypes::CRITICAL_XID_ERROR) {
                        continue;
                    }
                    let xid = match ev.event_data {
                        Some(XidError::Value(v)) => v,
                        _ => 0,
                    };
                    out.push(XidEvent {
                        uuid: ev.device.uuid().unwrap_or_default(),
                        xid,
                    });
                    // Drain whatever else is queued without waiting.
                    wait_ms = 0;
                }
                Err(NvmlError::Timeout) => break,
                Err(e) => {
                    return Err(BackendError::Nvml {
                        call: "nvmlEventSetWait",
                        gpu: "*".into(),
                        message: e.to_string(),
                    });
                }
            }
        }
        Ok(out)
    }
}

/// NVML's name for an error nvml-wrapper reports.
fn nvml_error_name(e: &NvmlError) -> &'static str {
    match e {
        NvmlError::InvalidArg => "NVML_ERROR_INVALID_ARGUMENT",
        NvmlError::NotSupported => "NVML_ERROR_NOT_SUPPORTED",
        NvmlError::NoPermission => "NVML_ERROR_NO_PERMISSION",
        NvmlError::NotFound => "NVML_ERROR_NOT_FOUND",
        NvmlError::GpuLost => "NVML_ERROR_GPU_IS_LOST",
        NvmlError::ResetRequired => "NVML_ERROR_RESET_REQUIRED",
        NvmlError::InUse => "NVML_ERROR_IN_USE",
        NvmlError::FunctionNotFound | NvmlError::FailedToLoadSymbol(_) => {
            "NVML_ERROR_FUNCTION_NOT_FOUND"
        }
        NvmlError::Uninitialized => "NVML_ERROR_UNINITIALIZED",
        _ => "NVML_ERROR_UNKNOWN",
    }
}
