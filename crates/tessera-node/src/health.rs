//! GPU health: XID classification and the per-GPU health state machine.
//!
//! The classification follows NVIDIA's device plugin (protocols.md §5.4): the
//! application-caused XIDs 13, 31, 43, 45, 68 and 109 leave the GPU in service;
//! every other XID fails it. Unlike the stock plugin, a failed GPU comes back
//! without restarting the agent: after a quiet period with no further fatal XID
//! while the backend does not report it failing, or at once when the backend
//! reports a repair ([`Probe::Recovered`]).
//!
//! [`XID_TABLE`] is also the knowledge base behind `tessera doctor <xid>`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use crate::backend::{Probe, XidEvent};

/// Who (or what) causes an XID.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XidCause {
    /// The application: a bug or a fault in user code; the GPU is fine.
    Application,
    /// GPU memory (ECC, page retirement, row remapping).
    Memory,
    /// NVLink, PCIe or the bus.
    Interconnect,
    /// Driver, GSP firmware or an on-chip micro-controller.
    DriverFirmware,
    /// Hardware other than memory.
    Hardware,
}

impl XidCause {
    pub fn name(self) -> &'static str {
        match self {
            XidCause::Application => "application",
            XidCause::Memory => "GPU memory (hardware)",
            XidCause::Interconnect => "NVLink/PCIe interconnect (hardware)",
            XidCause::DriverFirmware => "driver or GPU firmware",
            XidCause::Hardware => "GPU hardware",
        }
    }

    /// Whether the cause lies in the hardware or its firmware rather than the workload.
    pub fn is_hardware(self) -> bool {
        !matches!(self, XidCause::Application)
    }
}

/// What is known about one XID code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct XidInfo {
    pub code: u64,
    pub name: &'static str,
    pub cause: XidCause,
    /// Whether the default policy withdraws the GPU (NVIDIA device plugin semantics).
    pub fails_gpu: bool,
    /// What an operator should do.
    pub action: &'static str,
}

const fn x(
    code: u64,
    name: &'static str,
    cause: XidCause,
    fails_gpu: bool,
    action: &'static str,
) -> XidInfo {
    XidInfo {
        code,
        name,
        cause,
        fails_gpu,
        action,
    }
}

use XidCause::*;

/// Known XIDs, by code. The "fails GPU" column is the device plugin's default
/// (protocols.md §5.4); the rest summarises NVIDIA's XID documentation.
pub const XID_TABLE: &[XidInfo] = &[
    x(
        8,
        "GPU stopped processing (channel timeout)",
        DriverFirmware,
        true,
        "Check for a hung kernel; if it repeats without an application cause, reset the GPU.",
    ),
    x(
        13,
        "Graphics Engine Exception",
        Application,
        false,
        "Application fault (out-of-range access, illegal instruction). Debug the application with compute-sanitizer; the GPU stays in service.",
    ),
    x(
        31,
        "GPU memory page fault",
        Application,
        false,
        "The application accessed an invalid address. Fix the application; the GPU stays in service.",
    ),
    x(
        32,
        "Invalid or corrupted push buffer stream",
        Interconnect,
        true,
        "Often PCIe trouble. Check PCIe link health and seating; reset the GPU.",
    ),
    x(
        38,
        "Driver firmware error",
        DriverFirmware,
        true,
        "Update the driver; reset the GPU. Report to NVIDIA if it repeats.",
    ),
    x(
        43,
        "GPU stopped processing",
        Application,
        false,
        "The application's channel was reset after a user fault. Restart the application; the GPU stays in service.",
    ),
    x(
        45,
        "Preemptive cleanup, due to previous errors",
        Application,
        false,
        "Follows other errors or a killed process. Look at the XID before it; the GPU stays in service.",
    ),
    x(
        48,
        "Double-bit ECC error",
        Memory,
        true,
        "Uncorrectable memory error. Drain the GPU and reset it; if it repeats, replace the board.",
    ),
    x(
        61,
        "Internal micro-controller breakpoint/warning",
        DriverFirmware,
        true,
        "Reset the GPU; update driver/firmware if it repeats.",
    ),
    x(
        62,
        "Internal micro-controller halt",
        DriverFirmware,
        true,
        "Reset the GPU; update driver/firmware if it repeats.",
    ),
    x(
        63,
        "ECC page retirement or row remapping recording event",
        Memory,
        true,
        "A memory row was retired/remapped. Reset the GPU (or reboot) to apply the remap.",
    ),
    x(
        64,
        "ECC page retirement or row remapper recording failure",
        Memory,
        true,
        "Remapping could not be recorded. Drain and reset; replace the board if it repeats.",
    ),
    x(
        68,
        "Video processor exception (NVDEC0)",
        Application,
        false,
        "Decoder fault from the application's stream. Restart the application; the GPU stays in service.",
    ),
    x(
        69,
        "Graphics Engine class error",
        Hardware,
        true,
        "Reset the GPU; report to NVIDIA if it repeats.",
    ),
    x(
        74,
        "NVLink error",
        Interconnect,
        true,
        "Check NVLink status (nvidia-smi nvlink -s) and cabling/NVSwitch; reset the GPU.",
    ),
    x(
        79,
        "GPU has fallen off the bus",
        Interconnect,
        true,
        "The GPU is unreachable. Drain the node; check power, cooling and PCIe seating; reboot.",
    ),
    x(
        92,
        "High single-bit ECC error rate",
        Memory,
        true,
        "Memory is degrading. Drain, reset, and plan a replacement if the rate stays high.",
    ),
    x(
        94,
        "Contained ECC error",
        Memory,
        true,
        "Memory error contained to one application. Restart the application; reset the GPU when convenient (withdrawn by default, as NVIDIA's plugin does).",
    ),
    x(
        95,
        "Uncontained ECC error",
        Memory,
        true,
        "Memory error that may have affected all work on the GPU. Drain and reset the GPU.",
    ),
    x(
        109,
        "Context switch timeout",
        Application,
        false,
        "Usually a long-running or hung kernel. Restart the application; NVIDIA's catalog suggests a reset if it repeats.",
    ),
    x(
        119,
        "GSP RPC timeout",
        DriverFirmware,
        true,
        "The GPU System Processor did not answer. Reset the GPU or reboot; update the driver.",
    ),
    x(
        120,
        "GSP error",
        DriverFirmware,
        true,
        "GPU System Processor error. Reset the GPU or reboot; update the driver.",
    ),
    x(
        121,
        "C2C (chip-to-chip) link error",
        Interconnect,
        true,
        "Grace-Hopper C2C link error. Reset; report to the vendor if it repeats.",
    ),
    x(
        140,
        "Unrecovered ECC error",
        Memory,
        true,
        "Drain and reset the GPU; replace the board if it repeats.",
    ),
    x(
        154,
        "GPU recovery action changed",
        DriverFirmware,
        true,
        "The driver asks for a recovery action (reset or reboot). Check nvidia-smi -q for the action and drain the GPU.",
    ),
];

/// Looks up an XID.
pub fn xid_info(code: u64) -> Option<&'static XidInfo> {
    XID_TABLE.iter().find(|i| i.code == code)
}

/// The application-level XIDs that do not fail a GPU by default (protocols.md §5.4).
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Which XIDs fail a GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XidPolicy {
    /// XIDs that leave the GPU in service.
    pub ignored: BTreeSet<u64>,
    /// XIDs that always fail the GPU, even if also in `ignored`.
    pub always_fatal: BTreeSet<u64>,
    /// No XID fails a GPU (health checking off).
    pub disabled: bool,
}

impl Default for XidPolicy {
    fn default() -> Self {
        XidPolicy {
            ignored: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            always_fatal: BTreeSet::new(),
            disabled: false,
        }
    }
}

impl XidPolicy {
    /// Whether `xid` withdraws the GPU.
    pub fn is_fatal(&self, xid: u64) -> bool {
        if self.always_fatal.contains(&xid) {
            return true;
        }
        !self.disabled && !self.ignored.contains(&xid)
    }

    /// Parses a comma-separated XID list such as `109,68`; names the bad entry.
    pub fn parse_list(text: &str) -> Result<BTreeSet<u64>, String> {
        text.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                s.parse::<u64>()
                    .map_err(|_| format!("{s:?} is not an XID number"))
            })
            .collect()
    }
}

/// Health of one GPU as the agent sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GpuHealth {
    Healthy,
    /// Withdrawn from service.
    Unhealthy {
        /// Human-readable reason, e.g. `XID 79 (GPU has fallen off the bus)`.
        reason: String,
        /// The last fatal XID, if an XID caused it.
        xid: Option<u64>,
    },
}

impl GpuHealth {
    pub fn is_healthy(&self) -> bool {
        matches!(self, GpuHealth::Healthy)
    }
}

/// A health transition, for logs and for the device plugin stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthChange {
    pub uuid: String,
    pub health: GpuHealth,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Last fatal XID and when it came; holds the GPU down for the quiet period.
    xid_hold: Option<(u64, Instant)>,
    /// The backend's own report that the GPU is failing.
    probe_failure: Option<String>,
    health: GpuHealth,
}

/// The per-GPU health state machine. Pure: time comes in as `now`.
#[derive(Debug, Clone)]
pub struct HealthTracker {
    policy: XidPolicy,
    quiet_period: Duration,
    gpus: BTreeMap<String, Entry>,
}

impl HealthTracker {
    pub fn new<I: IntoIterator<Item = String>>(
        uuids: I,
        policy: XidPolicy,
        quiet_period: Duration,
    ) -> Self {
        HealthTracker {
            policy,
            quiet_period,
            gpus: uuids
                .into_iter()
                .map(|u| {
                    (
                        u,
                        Entry {
                            xid_hold: None,
                            probe_failure: None,
                            health: GpuHealth::Healthy,
                        },
                    )
                })
                .collect(),
        }
    }

    pub fn health(&self, uuid: &str) -> GpuHealth {
        self.gpus
            .get(uuid)
            .map(|e| e.health.clone())
            .unwrap_or(GpuHealth::Unhealthy {
                reason: "unknown GPU".into(),
                xid: None,
            })
    }

    pub fn all(&self) -> BTreeMap<String, GpuHealth> {
        self.gpus
            .iter()
            .map(|(k, v)| (k.clone(), v.health.clone()))
            .collect()
    }

    /// Records an XID event. An event whose GPU the driver could not name fails every GPU,
    /// as NVIDIA's plugin does.
    pub fn on_xid(&mut self, event: &XidEvent, now: Instant) -> Vec<HealthChange> {
        if !self.policy.is_fatal(event.xid) {
            return Vec::new();
        }
        let targets: Vec<String> = if event.uuid.is_empty() {
            self.gpus.keys().cloned().collect()
        } else if self.gpus.contains_key(&event.uuid) {
            vec![event.uuid.clone()]
        } else {
            Vec::new()
        };
        for uuid in &targets {
            if let Some(e) = self.gpus.get_mut(uuid) {
                e.xid_hold = Some((event.xid, now));
            }
        }
        self.settle(now)
    }

    /// Records what the backend says about a GPU.
    pub fn on_probe(&mut self, uuid: &str, probe: &Probe, now: Instant) -> Vec<HealthChange> {
        if let Some(e) = self.gpus.get_mut(uuid) {
            match probe {
                Probe::Ok => e.probe_failure = None,
                Probe::Failing(reason) => e.probe_failure = Some(reason.clone()),
                Probe::Recovered => {
                    e.probe_failure = None;
                    e.xid_hold = None;
                }
            }
        }
        self.settle(now)
    }

    /// Ends quiet periods that have passed.
    pub fn tick(&mut self, now: Instant) -> Vec<HealthChange> {
        self.settle(now)
    }

    fn settle(&mut self, now: Instant) -> Vec<HealthChange> {
        let mut changes = Vec::new();
        for (uuid, e) in &mut self.gpus {
            if let Some((_, at)) = e.xid_hold
                && now.saturating_duration_since(at) >= self.quiet_period
            {
                e.xid_hold = None;
            }
            let health = if let Some(reason) = &e.probe_failure {
                GpuHealth::Unhealthy {
                    reason: reason.clone(),
                    xid: e.xid_hold.map(|(x, _)| x),
                }
            } else if let Some((xid, _)) = e.xid_hold {
                let name = xid_info(xid).map(|i| i.name).unwrap_or("unlisted XID");
                GpuHealth::Unhealthy {
                    reason: format!("XID {xid} ({name})"),
                    xid: Some(xid),
                }
            } else {
                GpuHealth::Healthy
            };
            if health != e.health {
                e.health = health.clone();
                changes.push(HealthChange {
                    uuid: uuid.clone(),
                    health,
                });
            }
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(uuid: &str, xid: u64) -> XidEvent {
        XidEvent {
            uuid: uuid.into(),
            xid,
        }
    }

    #[test]
    fn classification_matches_the_device_plugin() {
        let p = XidPolicy::default();
        // Application XIDs (protocols.md §5.4 skip list) keep the GPU.
        for xid in [13, 31, 43, 45, 68, 109] {
            assert!(!p.is_fatal(xid), "xid {xid}");
            assert!(!xid_info(xid).unwrap().fails_gpu);
        }
        // Everything else fails it, listed or not.
        for xid in [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 999] {
            assert!(p.is_fatal(xid), "xid {xid}");
        }
        // The table agrees with the policy everywhere.
        for info in XID_TABLE {
            assert_eq!(info.fails_gpu, p.is_fatal(info.code), "xid {}", info.code);
            assert_eq!(
                info.cause.is_hardware(),
                info.fails_gpu,
                "xid {}",
                info.code
            );
        }
        let strict = XidPolicy {
            always_fatal: [109].into(),
            ..XidPolicy::default()
        };
        assert!(strict.is_fatal(109));
        assert_eq!(XidPolicy::parse_list(" 109, 68 ,"), Ok([68, 109].into()));
        assert!(XidPolicy::parse_list("1,x").is_err());
    }

    #[test]
    fn fatal_xid_withdraws_then_quiet_period_restores() {
        let t0 = Instant::now();
        let quiet = Duration::from_secs(60);
        let mut h = HealthTracker::new(
            ["GPU-a".into(), "GPU-b".into()],
            XidPolicy::default(),
            quiet,
        );
        assert!(
            h.on_xid(&ev("GPU-a", 13), t0).is_empty(),
            "app XID changes nothing"
        );
        let c = h.on_xid(&ev("GPU-a", 79), t0);
        assert_eq!(c.len(), 1);
        assert!(!c[0].health.is_healthy());
        assert!(h.health("GPU-b").is_healthy());
        // A second fatal XID restarts the quiet period (and updates the reason).
        let c = h.on_xid(&ev("GPU-a", 48), t0 + Duration::from_secs(30));
        assert!(matches!(
            c[0].health,
            GpuHealth::Unhealthy { xid: Some(48), .. }
        ));
        assert!(h.tick(t0 + Duration::from_secs(60)).is_empty());
        let c = h.tick(t0 + Duration::from_secs(90));
        assert_eq!(
            c,
            vec![HealthChange {
                uuid: "GPU-a".into(),
                health: GpuHealth::Healthy
            }]
        );
    }

    #[test]
    fn backend_failure_and_recovery() {
        let t0 = Instant::now();
        let mut h = HealthTracker::new(
            ["GPU-a".into()],
            XidPolicy::default(),
            Duration::from_secs(3600),
        );
        h.on_xid(&ev("GPU-a", 95), t0);
        // Quiet period not over, but the backend reports a repair.
        let c = h.on_probe("GPU-a", &Probe::Recovered, t0 + Duration::from_secs(1));
        assert_eq!(c.len(), 1);
        assert!(c[0].health.is_healthy());
        // The backend says it is failing: down until it stops saying so.
        h.on_probe("GPU-a", &Probe::Failing("lost".into()), t0);
        assert!(!h.health("GPU-a").is_healthy());
        assert!(h.tick(t0 + Duration::from_secs(7200)).is_empty());
        assert_eq!(h.on_probe("GPU-a", &Probe::Ok, t0).len(), 1);
        // An XID without a GPU fails every GPU.
        assert_eq!(h.on_xid(&ev("", 79), t0).len(), 1);
    }
}
