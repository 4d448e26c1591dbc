//! The fake backend: GPUs described in a YAML file.
//!
//! Used by tests and demos. Everything NVML would report can be written in the
//! file, and tests change it while the agent runs: processes come and go,
//! utilisation moves, XID events arrive, a failed GPU recovers.
//!
//! ```yaml
//! driverVersion: "550.54.15"
//! gpus:
//!   - uuid: GPU-00000000-0000-0000-0000-000000000000
//!     product: NVIDIA A100-SXM4-80GB      # memory and SMs default from the catalog
//!     numaNode: 0
//!     nvlinks: { GPU-00000000-0000-0000-0000-000000000001: 12 }
//!     utilization: 40
//!     processes:
//!       - { pid: 4242, memoryMib: 2048, podUid: 6f1c..., container: abc }
//!     mig:
//!       enabled: true
//!       instances: [ { uuid: MIG-..., profile: 1g.10gb, start: 0 } ]
//! ```

mod mig;

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

use serde::Deserialize;
use tessera_core::model::spec::Catalog;

use super::{
    BackendError, EccCounters, GpuBackend, GpuInfo, GpuProcess, GpuReadings, LinkKind, MigInstance,
    PeerLink, Probe, ProcReader, XidEvent,
};

/// The YAML file's top level.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeConfig {
    #[serde(default)]
    pub driver_version: Option<String>,
    #[serde(default)]
    pub cuda_version: Option<String>,
    pub gpus: Vec<FakeGpu>,
}

/// One fake GPU.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeGpu {
    pub uuid: String,
    pub product: String,
    #[serde(default)]
    pub memory_mib: Option<u64>,
    #[serde(default)]
    pub sm_count: Option<u32>,
    #[serde(default)]
    pub numa_node: Option<u32>,
    #[serde(default)]
    pub pci_bus_id: Option<String>,
    /// `"8.0"`.
    #[serde(default)]
    pub compute_capability: Option<String>,
    /// NVLink count to each peer GPU (by UUID). Links are symmetric; one side suffices.
    #[serde(default)]
    pub nvlinks: BTreeMap<String, u32>,
    /// Peers behind the same PCIe switch.
    #[serde(default)]
    pub pcie_switch_peers: Vec<String>,
    #[serde(default)]
    pub mig: Option<FakeMig>,
    #[serde(default)]
    pub utilization: u32,
    #[serde(default)]
    pub temperature_c: Option<u32>,
    #[serde(default)]
    pub power_w: Option<f64>,
    #[serde(default)]
    pub sm_clock_mhz: Option<u32>,
    #[serde(default)]
    pub mem_clock_mhz: Option<u32>,
    #[serde(default)]
    pub ecc: EccCounters,
    #[serde(default)]
    pub processes: Vec<FakeProcess>,
    /// Set to a reason to make the backend itself report the GPU failing.
    #[serde(default)]
    pub failing: Option<String>,
}

/// MIG state of a fake GPU.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeMig {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub instances: Vec<FakeMigInstance>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeMigInstance {
    pub uuid: String,
    pub profile: String,
    #[serde(default)]
    pub start: Option<u8>,
}

/// A process on a fake GPU. `podUid` (and `container`) build a kubepods cgroup path;
/// `cgroup` gives the path verbatim; neither means a host process.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FakeProcess {
    pub pid: u32,
    pub memory_mib: u64,
    #[serde(default)]
    pub sm_util: Option<u32>,
    #[serde(default)]
    pub mig_uuid: Option<String>,
    #[serde(default)]
    pub pod_uid: Option<String>,
    #[serde(default)]
    pub container: Option<String>,
    #[serde(default)]
    pub cgroup: Option<String>,
}

impl FakeProcess {
    fn cgroup_text(&self) -> String {
        if let Some(c) = &self.cgroup {
            return c.clone();
        }
        match &self.pod_uid {
            Some(uid) => format!(
                "0::/kubepods/besteffort/pod{uid}/{}\n",
                self.container.as_deref().unwrap_or("container")
            ),
            None => "0::/system.slice/host-process.service\n".to_string(),
        }
    }
}

#[derive(Debug)]
struct State {
    config: FakeConfig,
    xids: VecDeque<XidEvent>,
    recovered: BTreeMap<String, bool>,
    /// MIG instances created so far (names the next one's UUID).
    mig_created: u64,
}

/// The fake backend. Cheap to clone; clones share state, so a test keeps one
/// handle and changes what the agent sees.
#[derive(Debug, Clone)]
pub struct Fake {
    inner: Arc<(Mutex<State>, Condvar)>,
    catalog: Arc<Catalog>,
}

impl Fake {
    /// Reads and validates a YAML file.
    pub fn from_file(path: &std::path::Path) -> Result<Fake, BackendError> {
        let text = std::fs::read_to_string(path).map_err(|e| BackendError::FakeConfig {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_yaml(&text, &path.display().to_string())
    }

    /// Parses and validates YAML text; `origin` names it in errors.
    pub fn from_yaml(text: &str, origin: &str) -> Result<Fake, BackendError> {
        let config: FakeConfig =
            serde_saphyr::from_str(text).map_err(|e| BackendError::FakeConfig {
                path: origin.to_string(),
                message: e.to_string(),
            })?;
        Self::new(config, origin)
    }

    /// Validates a config and builds the backend.
    pub fn new(config: FakeConfig, origin: &str) -> Result<Fake, BackendError> {
        let bad = |message: String| BackendError::FakeConfig {
            path: origin.to_string(),
            message,
        };
        let mut seen = std::collections::BTreeSet::new();
        for (i, gpu) in config.gpus.iter().enumerate() {
            if !gpu.uuid.starts_with("GPU-") {
                return Err(bad(format!(
                    "gpus[{i}].uuid: {:?} must start with \"GPU-\"",
                    gpu.uuid
                )));
            }
            if !seen.insert(gpu.uuid.clone()) {
                return Err(bad(format!("gpus[{i}].uuid: {:?} appears twice", gpu.uuid)));
            }
            if gpu.utilization > 100 {
                return Err(bad(format!(
                    "gpus[{i}].utilization: {} is over 100",
                    gpu.utilization
                )));
            }
        }
        for (i, gpu) in config.gpus.iter().enumerate() {
            for peer in gpu.nvlinks.keys().chain(&gpu.pcie_switch_peers) {
                if !seen.contains(peer) || peer == &gpu.uuid {
                    return Err(bad(format!(
                        "gpus[{i}]: link to {peer:?}, which is not another GPU in the file"
                    )));
                }
            }
            if let Some(mig) = &gpu.mig {
                for (j, inst) in mig.instances.iter().enumerate() {
                    if !inst.uuid.starts_with("MIG-") {
                        return Err(bad(format!(
                            "gpus[{i}].mig.instances[{j}].uuid: {:?} must start with \"MIG-\"",
                            inst.uuid
                        )));
                    }
                }
            }
        }
        Ok(Fake {
            inner: Arc::new((
                Mutex::new(State {
                    config,
                    xids: VecDeque::new(),
                    recovered: BTreeMap::new(),
                    mig_created: 0,
                }),
                Condvar::new(),
            )),
            catalog: Arc::new(Catalog::default()),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock can only come from a test; keep going.
        self.inner.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn with_gpu<R>(
        &self,
        uuid: &str,
        f: impl FnOnce(&mut FakeGpu) -> R,
    ) -> Result<R, BackendError> {
        let mut st = self.state();
        let gpu = st
            .config
            .gpus
            .iter_mut()
            .find(|g| g.uuid == uuid)
            .ok_or_else(|| BackendError::UnknownGpu(uuid.to_string()))?;
        Ok(f(gpu))
    }

    /// Queues an XID event for `uuid`.
    pub fn inject_xid(&self, uuid: &str, xid: u64) {
        self.state().xids.push_back(XidEvent {
            uuid: uuid.to_string(),
            xid,
        });
        self.inner.1.notify_all();
    }

    /// Replaces the processes on a GPU.
    pub fn set_processes(&self, uuid: &str, procs: Vec<FakeProcess>) -> Result<(), BackendError> {
        self.with_gpu(uuid, |g| g.processes = procs)
    }

    /// Sets a GPU's utilisation in per cent.
    pub fn set_utilization(&self, uuid: &str, pct: u32) -> Result<(), BackendError> {
        self.with_gpu(uuid, |g| g.utilization = pct.min(100))
    }

    /// Makes the backend report the GPU failing (`Some(reason)`) or fine again (`None`).
    pub fn set_failing(&self, uuid: &str, reason: Option<String>) -> Result<(), BackendError> {
        self.with_gpu(uuid, |g| g.failing = reason)
    }

    /// Reports a repair (as after a GPU reset): the next read says `Recovered`.
    pub fn recover(&self, uuid: &str) -> Result<(), BackendError> {
        self.with_gpu(uuid, |g| g.failing = None)?;
        self.state().recovered.insert(uuid.to_string(), true);
        Ok(())
    }

    /// A [`ProcReader`] that answers from the processes in this fake.
    pub fn proc_reader(&self) -> FakeProcs {
        FakeProcs { fake: self.clone() }
    }

    fn info(&self, index: usize, gpu: &FakeGpu, all: &[FakeGpu]) -> GpuInfo {
        let model = self
            .catalog
            .find_product(&gpu.product, gpu.memory_mib.unwrap_or(0))
            .map(|id| self.catalog.spec(id).clone());
        let memory_mib = gpu
            .memory_mib
            .or(model.as_ref().map(|m| m.memory_mib))
            .unwrap_or(0);
        let mut links = Vec::new();
        for peer in all.iter().filter(|p| p.uuid != gpu.uuid) {
            let nvlinks = gpu
                .nvlinks
                .get(&peer.uuid)
                .or_else(|| peer.nvlinks.get(&gpu.uuid))
                .copied()
                .unwrap_or(0);
            let kind = if nvlinks > 0 {
                LinkKind::Nvlink
            } else if gpu.pcie_switch_peers.contains(&peer.uuid)
                || peer.pcie_switch_peers.contains(&gpu.uuid)
            {
                LinkKind::PcieSwitch
            } else if gpu.numa_node == peer.numa_node {
                LinkKind::SameSocket
            } else {
                LinkKind::CrossSocket
            };
            links.push(PeerLink {
                peer_uuid: peer.uuid.clone(),
                kind,
                nvlinks,
            });
        }
        let mig_geometry = model.as_ref().and_then(|m| m.mig.clone());
        let mig_instances = gpu
            .mig
            .as_ref()
            .filter(|m| m.enabled)
            .map(|m| {
                m.instances
                    .iter()
                    .map(|i| {
                        let profile = mig_geometry.as_ref().and_then(|g| g.profile(&i.profile));
                        MigInstance {
                            uuid: i.uuid.clone(),
                            profile: i.profile.clone(),
                            start: i.start,
                            memory_mib: profile.map(|(_, p)| p.memory_mib).unwrap_or(0),
                            sm_count: None,
                        }
                    })
                    .collect()
            })
            .unwrap_or_default();
        GpuInfo {
            index: index as u32,
            uuid: gpu.uuid.clone(),
            product: gpu.product.clone(),
            model: model.as_ref().map(|m| m.name.clone()),
            memory_mib,
            sm_count: gpu.sm_count.or(model.as_ref().map(|m| m.sm_count)),
            numa_node: gpu.numa_node,
            pci_bus_id: gpu
                .pci_bus_id
                .clone()
                .unwrap_or_else(|| format!("00000000:{:02X}:00.0", 0x10 + index)),
            compute_capability: gpu.compute_capability.as_deref().and_then(|s| {
                let (a, b) = s.split_once('.')?;
                Some((a.parse().ok()?, b.parse().ok()?))
            }),
            links,
            mig_enabled: gpu.mig.as_ref().is_some_and(|m| m.enabled),
            mig_capable: gpu.mig.is_some() || mig_geometry.is_some(),
            mig_instances,
        }
    }
}

impl GpuBackend for Fake {
    fn name(&self) -> &'static str {
        "fake"
    }

    fn driver_version(&self) -> Option<String> {
        self.state().config.driver_version.clone()
    }

    fn cuda_version(&self) -> Option<String> {
        self.state().config.cuda_version.clone()
    }

    fn discover(&self) -> Result<Vec<GpuInfo>, BackendError> {
        let st = self.state();
        let gpus = &st.config.gpus;
        Ok(gpus
            .iter()
            .enumerate()
            .map(|(i, g)| self.info(i, g, gpus))
            .collect())
    }

    fn read(&self, uuid: &str) -> Result<GpuReadings, BackendError> {
        let recovered = self.state().recovered.remove(uuid).unwrap_or(false);
        let total = self
            .discover()?
            .into_iter()
            .find(|g| g.uuid == uuid)
            .map(|g| g.memory_mib)
            .unwrap_or(0);
        self.with_gpu(uuid, |g| {
            let used: u64 = g.processes.iter().map(|p| p.memory_mib).sum();
            GpuReadings {
                uuid: g.uuid.clone(),
                utilization_pct: Some(g.utilization),
                memory_used_mib: Some(used),
                memory_free_mib: Some(total.saturating_sub(used)),
                temperature_c: g.temperature_c,
                power_w: g.power_w,
                sm_clock_mhz: g.sm_clock_mhz,
                mem_clock_mhz: g.mem_clock_mhz,
                ecc: g.ecc,
                processes: g
                    .processes
                    .iter()
                    .map(|p| GpuProcess {
                        pid: p.pid,
                        used_memory_mib: p.memory_mib,
                        sm_util_pct: p.sm_util,
                        mig_uuid: p.mig_uuid.clone(),
                    })
                    .collect(),
                probe: match (&g.failing, recovered) {
                    (Some(reason), _) => Probe::Failing(reason.clone()),
                    (None, true) => Probe::Recovered,
                    (None, false) => Probe::Ok,
                },
            }
        })
    }

    fn wait_xid_events(&self, timeout: Duration) -> Result<Vec<XidEvent>, BackendError> {
        let (lock, cvar) = &*self.inner;
        let st = lock.lock().unwrap_or_else(|p| p.into_inner());
        let (mut st, _) = cvar
            .wait_timeout_while(st, timeout, |s| s.xids.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        Ok(st.xids.drain(..).collect())
    }

    fn set_mig_mode(&self, gpu: &str, enabled: bool) -> Result<(), BackendError> {
        mig::set_mode(self, gpu, enabled)
    }

    fn create_mig_instance(
        &self,
        gpu: &str,
        profile: &str,
        start: u8,
    ) -> Result<MigInstance, BackendError> {
        mig::create(self, gpu, profile, start)
    }

    fn destroy_mig_instance(&self, gpu: &str, mig_uuid: &str) -> Result<(), BackendError> {
        mig::destroy(self, gpu, mig_uuid)
    }
}

/// Cgroups of the fake's processes.
#[derive(Debug, Clone)]
pub struct FakeProcs {
    fake: Fake,
}

impl ProcReader for FakeProcs {
    fn cgroup(&self, pid: u32) -> Option<String> {
        let st = self.fake.state();
        st.config
            .gpus
            .iter()
            .flat_map(|g| &g.processes)
            .find(|p| p.pid == pid)
            .map(FakeProcess::cgroup_text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TWO: &str = r#"
driverVersion: "550.54.15"
gpus:
  - uuid: GPU-a
    product: NVIDIA A100-SXM4-80GB
    numaNode: 0
    nvlinks: { GPU-b: 12 }
    utilization: 40
    processes:
      - { pid: 10, memoryMib: 1000, podUid: 11111111-2222-3333-4444-555555555555 }
  - uuid: GPU-b
    product: NVIDIA A100-SXM4-80GB
    numaNode: 1
"#;

    #[test]
    fn discovery_fills_model_facts_and_topology() {
        let fake = Fake::from_yaml(TWO, "test").unwrap();
        let gpus = fake.discover().unwrap();
        assert_eq!(gpus.len(), 2);
        assert_eq!(gpus[0].model.as_deref(), Some("A100-80GB"));
        assert_eq!(gpus[0].memory_mib, 81_920);
        assert_eq!(gpus[0].sm_count, Some(108));
        assert_eq!(gpus[1].links[0].kind, LinkKind::Nvlink);
        assert_eq!(gpus[1].links[0].nvlinks, 12);
        let r = fake.read("GPU-a").unwrap();
        assert_eq!(r.memory_used_mib, Some(1000));
        assert_eq!(r.memory_free_mib, Some(80_920));
        let cg = fake.proc_reader().cgroup(10).unwrap();
        assert_eq!(
            super::super::parse_cgroup(&cg).unwrap().pod_uid,
            "11111111-2222-3333-4444-555555555555"
        );
    }

    #[test]
    fn events_and_recovery_flow_through() {
        let fake = Fake::from_yaml(TWO, "test").unwrap();
        assert!(
            fake.wait_xid_events(Duration::from_millis(1))
                .unwrap()
                .is_empty()
        );
        fake.inject_xid("GPU-b", 79);
        let ev = fake.wait_xid_events(Duration::from_secs(5)).unwrap();
        assert_eq!(
            ev,
            vec![XidEvent {
                uuid: "GPU-b".into(),
                xid: 79
            }]
        );
        fake.set_failing("GPU-b", Some("fell off the bus".into()))
            .unwrap();
        assert!(matches!(
            fake.read("GPU-b").unwrap().probe,
            Probe::Failing(_)
        ));
        fake.recover("GPU-b").unwrap();
        assert_eq!(fake.read("GPU-b").unwrap().probe, Probe::Recovered);
        assert_eq!(fake.read("GPU-b").unwrap().probe, Probe::Ok);
    }

    #[test]
    fn bad_files_say_what_is_wrong() {
        let err = Fake::from_yaml("gpus: [ { uuid: 7 ", "f.yaml").unwrap_err();
        assert!(
            err.to_string().starts_with("fake backend config f.yaml:"),
            "{err}"
        );
        let err = Fake::from_yaml("gpus:\n  - { uuid: X, product: T4 }\n", "f.yaml").unwrap_err();
        assert!(err.to_string().contains("gpus[0].uuid"), "{err}");
        let err = Fake::from_yaml(
            "gpus:\n  - { uuid: GPU-1, product: T4, nvlinks: { GPU-2: 1 } }\n",
            "f",
        )
        .unwrap_err();
        assert!(err.to_string().contains("GPU-2"), "{err}");
        let err = Fake::from_yaml("gpus: []\nbogus: 1\n", "f").unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
    }
}
