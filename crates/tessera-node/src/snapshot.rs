//! `tessera doctor snapshot`: the state of a node's GPUs packed into one
//! archive for a bug report, like `nvidia-bug-report.sh` but small and about
//! what Tessera needs: GPU facts and readings through the [`GpuBackend`]
//! (NVML, or the fake in tests), driver and CUDA versions, the kernel's
//! `NVRM`/`Xid` lines with each XID named by the agent's own table
//! ([`crate::health`]), and the agent's state on the node (device-plugin
//! sockets, MPS directories, a metrics scrape).
//!
//! Collecting never fails: a reading that cannot be taken is recorded as an
//! error inside the snapshot, because a broken GPU is exactly when one is
//! wanted. Only writing the archive can fail.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::backend::{GpuBackend, GpuInfo, GpuReadings};
use crate::health::{XidPolicy, xid_info};

/// What the caller gathered outside the backend (the binary owns the I/O of
/// running `dmesg` and scraping metrics; tests pass text).
#[derive(Debug, Clone)]
pub struct Inputs {
    /// The kernel log (`dmesg` output or a file), whole; only NVRM/Xid lines are kept.
    pub kernel_log: Result<String, String>,
    /// The kubelet's device-plugin directory, to list the plugin sockets.
    pub device_plugin_dir: PathBuf,
    /// The MPS control daemon's host directory (holds `pipe/` and `shm/`).
    pub mps_root: PathBuf,
    /// The node agent's `/metrics` text, or why it could not be read.
    pub agent_metrics: Option<Result<String, String>>,
    /// When the snapshot was taken (RFC 3339), stamped by the caller.
    pub taken_at: String,
    pub node_name: String,
}

/// One GPU: its facts and readings, or why they could not be read.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuState {
    pub info: GpuInfo,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub readings: Option<GpuReadings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One kernel log line about the NVIDIA driver.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct KernelLine {
    pub line: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub xid: Option<u64>,
    /// The XID's name from the agent's table.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub meaning: Option<String>,
    /// Whether the agent's default policy withdraws the GPU for it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub withdraws_gpu: Option<bool>,
}

/// The agent's footprint on the node.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentState {
    pub device_plugin_dir: String,
    /// Sockets in the device-plugin directory (the kubelet's and each plugin's).
    pub device_plugin_sockets: Vec<String>,
    pub mps_root: String,
    pub mps_pipe_dir: bool,
    pub mps_shm_dir: bool,
    /// The agent's per-GPU MPS daemons (`--mps-daemons per-gpu`) by directory, with
    /// whether each has its control pipe open.
    pub mps_daemons: Vec<MpsDaemonDir>,
    /// Why the agent's metrics could not be scraped (the text itself is a file of the archive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metrics_error: Option<String>,
}

/// One per-GPU MPS daemon directory under the MPS root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MpsDaemonDir {
    /// The GPU's UUID, or `set-<hash>` for a daemon of several GPUs.
    pub key: String,
    /// `pipe/control` exists: a daemon is (or was, if it died without cleaning up) serving.
    pub control_pipe: bool,
}

/// The per-GPU daemon directories under `root`: those with a `pipe/` directory.
fn mps_daemon_dirs(root: &Path) -> Vec<MpsDaemonDir> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut out: Vec<MpsDaemonDir> = entries
        .flatten()
        .filter(|e| e.path().join("pipe").is_dir())
        .map(|e| MpsDaemonDir {
            key: e.file_name().to_string_lossy().into_owned(),
            control_pipe: e.path().join("pipe/control").exists(),
        })
        .collect();
    out.sort_by(|a, b| a.key.cmp(&b.key));
    out
}

/// The whole snapshot (`snapshot.json` in the archive).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Snapshot {
    pub taken_at: String,
    pub node_name: String,
    pub backend: String,
    pub driver_version: Option<String>,
    pub cuda_version: Option<String>,
    pub gpus: Vec<GpuState>,
    pub kernel_lines: Vec<KernelLine>,
    pub agent: AgentState,
    /// What could not be collected, and why.
    pub errors: Vec<String>,
}

impl Snapshot {
    /// GPUs whose backend probe reports them failing, or whose readings failed.
    pub fn failing_gpus(&self) -> Vec<&str> {
        self.gpus
            .iter()
            .filter(|g| {
                g.error.is_some()
                    || g.readings
                        .as_ref()
                        .is_some_and(|r| matches!(r.probe, crate::backend::Probe::Failing(_)))
            })
            .map(|g| g.info.uuid.as_str())
            .collect()
    }
}

/// Collects a snapshot. Never fails; see the module doc.
pub fn collect(backend: &dyn GpuBackend, inputs: &Inputs) -> (Snapshot, Option<String>) {
    let mut errors = Vec::new();
    let gpus = match backend.discover() {
        Ok(infos) => infos
            .into_iter()
            .map(|info| match backend.read(&info.uuid) {
                Ok(r) => GpuState {
                    info,
                    readings: Some(r),
                    error: None,
                },
                Err(e) => GpuState {
                    info,
                    readings: None,
                    error: Some(e.to_string()),
                },
            })
            .collect(),
        Err(e) => {
            errors.push(format!("GPU discovery ({}): {e}", backend.name()));
            Vec::new()
        }
    };
    let (kernel_lines, kernel_text) = match &inputs.kernel_log {
        Ok(text) => {
            let lines = nvidia_kernel_lines(text);
            let kept = lines
                .iter()
                .map(|l| l.line.as_str())
                .collect::<Vec<_>>()
                .join("\n");
            (lines, Some(kept))
        }
        Err(e) => {
            errors.push(format!("kernel log: {e}"));
            (Vec::new(), None)
        }
    };
    let mut agent = AgentState {
        device_plugin_dir: inputs.device_plugin_dir.display().to_string(),
        device_plugin_sockets: sockets_in(&inputs.device_plugin_dir, &mut errors),
        mps_root: inputs.mps_root.display().to_string(),
        mps_pipe_dir: inputs.mps_root.join("pipe").is_dir(),
        mps_shm_dir: inputs.mps_root.join("shm").is_dir(),
        mps_daemons: mps_daemon_dirs(&inputs.mps_root),
        metrics_error: None,
    };
    if let Some(Err(e)) = &inputs.agent_metrics {
        agent.metrics_error = Some(e.clone());
    }
    let snapshot = Snapshot {
        taken_at: inputs.taken_at.clone(),
        node_name: inputs.node_name.clone(),
        backend: backend.name().to_string(),
        driver_version: backend.driver_version(),
        cuda_version: backend.cuda_version(),
        gpus,
        kernel_lines,
        agent,
        errors,
    };
    (snapshot, kernel_text)
}

/// Lines of a kernel log that come from the NVIDIA driver (`NVRM`) or name an XID.
pub fn nvidia_kernel_lines(text: &str) -> Vec<KernelLine> {
    let policy = XidPolicy::default();
    text.lines()
        .filter(|l| l.contains("NVRM") || l.to_ascii_lowercase().contains("xid"))
        .map(|l| {
            let xid = xids_in(l).first().copied();
            KernelLine {
                line: l.trim_end().to_string(),
                xid,
                meaning: xid.and_then(xid_info).map(|i| i.name.to_string()),
                withdraws_gpu: xid.map(|x| policy.is_fatal(x)),
            }
        })
        .collect()
}

/// XID numbers in text such as `NVRM: Xid (PCI:0000:3b:00): 79, pid=…` or `XID 79`, in order.
pub fn xids_in(text: &str) -> Vec<u64> {
    let lower = text.to_ascii_lowercase();
    let mut out = Vec::new();
    let mut rest = lower.as_str();
    while let Some(i) = rest.find("xid") {
        rest = &rest[i + 3..];
        // Skip a "(PCI:…)" device tag, then separators, then read the number.
        let after = match rest.trim_start().strip_prefix('(') {
            Some(p) => p.split_once(')').map(|(_, r)| r).unwrap_or(""),
            None => rest,
        };
        let digits: String = after
            .trim_start_matches([' ', ':', '-', '_', '='])
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        if let Ok(n) = digits.parse::<u64>()
            && !out.contains(&n)
        {
            out.push(n);
        }
    }
    out
}

fn sockets_in(dir: &Path, errors: &mut Vec<String>) -> Vec<String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            let mut v: Vec<String> = entries
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".sock"))
                .collect();
            v.sort();
            v
        }
        Err(e) => {
            errors.push(format!("device-plugin directory {}: {e}", dir.display()));
            Vec::new()
        }
    }
}

/// Writes the snapshot as a gzip-compressed tar: `snapshot.json`, `kernel-nvrm.log`
/// (when the kernel log was read), `agent-metrics.txt` (when scraped) and `README.txt`.
pub fn write_archive(
    snapshot: &Snapshot,
    kernel_text: Option<&str>,
    agent_metrics: Option<&str>,
    out: impl Write,
) -> std::io::Result<()> {
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let dir = format!("tessera-snapshot-{}", sanitise(&snapshot.node_name));
    let json = serde_json::to_vec_pretty(snapshot).map_err(std::io::Error::other)?;
    let readme = format!(
        "Tessera node snapshot of {node} taken {at}.\n\
         snapshot.json     GPUs (facts, readings, processes, ECC), driver/CUDA versions, NVRM/Xid lines with their meaning, agent state, collection errors\n\
         kernel-nvrm.log   the kernel's NVRM and Xid lines\n\
         agent-metrics.txt the node agent's /metrics\n\
         Explain a code: tessera doctor explain \"<line>\"\n",
        node = snapshot.node_name,
        at = snapshot.taken_at
    );
    let mut files: Vec<(&str, &[u8])> =
        vec![("README.txt", readme.as_bytes()), ("snapshot.json", &json)];
    if let Some(k) = kernel_text {
        files.push(("kernel-nvrm.log", k.as_bytes()));
    }
    if let Some(m) = agent_metrics {
        files.push(("agent-metrics.txt", m.as_bytes()));
    }
    for (name, bytes) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, format!("{dir}/{name}"), bytes)?;
    }
    tar.into_inner()?.finish()?.flush()
}

fn sanitise(s: &str) -> String {
    let s: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() { "node".to_string() } else { s }
}

#[cfg(test)]
mod tests {
    use std::io::Read;

    use super::*;
    use crate::backend::fake::Fake;

    const FAKE: &str = r#"
driverVersion: "550.54.15"
cudaVersion: "12.4"
gpus:
  - uuid: GPU-aaaa
    product: NVIDIA A100-SXM4-80GB
    utilization: 40
    processes:
      - { pid: 4242, memoryMib: 2048, podUid: 6f1c }
  - uuid: GPU-bbbb
    product: NVIDIA A100-SXM4-80GB
    failing: "fell off the bus"
"#;

    const DMESG: &str = "[    1.0] usb 1-1: new device\n\
[  100.5] NVRM: Xid (PCI:0000:07:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n\
[  101.0] NVRM: GPU 0000:07:00.0: GPU has fallen off the bus.\n\
[  200.0] NVRM: Xid (PCI:0000:08:00): 13, Graphics Exception\n\
[  300.0] eth0: link up\n";

    #[test]
    fn kernel_lines_keep_the_driver_and_name_their_xids() {
        let lines = nvidia_kernel_lines(DMESG);
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].xid, Some(79));
        assert_eq!(lines[0].withdraws_gpu, Some(true));
        assert_eq!(
            lines[0].meaning.as_deref(),
            Some("GPU has fallen off the bus")
        );
        assert_eq!(lines[1].xid, None);
        assert_eq!(
            (lines[2].xid, lines[2].withdraws_gpu),
            (Some(13), Some(false))
        );
        assert_eq!(xids_in("XID 48 then xid: 63"), [48, 63]);
        assert!(xids_in("nothing here").is_empty());
    }

    /// The archive from the fake backend holds what was collected, and a failing
    /// GPU and an unreadable directory are recorded, not fatal.
    #[test]
    fn archive_from_the_fake_backend() {
        let fake = Fake::from_yaml(FAKE, "test").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("mps/pipe")).unwrap();
        std::fs::create_dir_all(dir.path().join("mps/GPU-aaaa/pipe")).unwrap();
        std::fs::write(dir.path().join("mps/GPU-aaaa/pipe/control"), "").unwrap();
        std::fs::create_dir_all(dir.path().join("mps/set-0123/pipe")).unwrap();
        std::fs::create_dir_all(dir.path().join("dp")).unwrap();
        std::fs::write(dir.path().join("dp/kubelet.sock"), "").unwrap();
        std::fs::write(dir.path().join("dp/tessera-gpu.sock"), "").unwrap();
        let inputs = Inputs {
            kernel_log: Ok(DMESG.to_string()),
            device_plugin_dir: dir.path().join("dp"),
            mps_root: dir.path().join("mps"),
            agent_metrics: Some(Err("connection refused".into())),
            taken_at: "2026-12-01T00:00:00Z".into(),
            node_name: "gpu-1".into(),
        };
        let (snap, kernel) = collect(&fake, &inputs);
        assert_eq!(snap.driver_version.as_deref(), Some("550.54.15"));
        assert_eq!(snap.cuda_version.as_deref(), Some("12.4"));
        assert_eq!(snap.gpus.len(), 2);
        let procs = &snap.gpus[0].readings.as_ref().unwrap().processes;
        assert_eq!((procs[0].pid, procs[0].used_memory_mib), (4242, 2048));
        assert_eq!(snap.failing_gpus(), ["GPU-bbbb"]);
        assert_eq!(
            snap.agent.device_plugin_sockets,
            ["kubelet.sock", "tessera-gpu.sock"]
        );
        assert!(snap.agent.mps_pipe_dir && !snap.agent.mps_shm_dir);
        let daemons: Vec<(&str, bool)> = snap
            .agent
            .mps_daemons
            .iter()
            .map(|d| (d.key.as_str(), d.control_pipe))
            .collect();
        assert_eq!(daemons, [("GPU-aaaa", true), ("set-0123", false)]);
        assert_eq!(
            snap.agent.metrics_error.as_deref(),
            Some("connection refused")
        );
        assert!(snap.errors.is_empty(), "{:?}", snap.errors);

        let mut bytes = Vec::new();
        write_archive(&snap, kernel.as_deref(), None, &mut bytes).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
        let mut files = std::collections::BTreeMap::new();
        for e in archive.entries().unwrap() {
            let mut e = e.unwrap();
            let name = e.path().unwrap().display().to_string();
            let mut text = String::new();
            e.read_to_string(&mut text).unwrap();
            files.insert(name, text);
        }
        let names: Vec<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "tessera-snapshot-gpu-1/README.txt",
                "tessera-snapshot-gpu-1/kernel-nvrm.log",
                "tessera-snapshot-gpu-1/snapshot.json",
            ]
        );
        let log = &files["tessera-snapshot-gpu-1/kernel-nvrm.log"];
        assert_eq!(log.lines().count(), 3);
        assert!(!log.contains("eth0"));
        let json: serde_json::Value =
            serde_json::from_str(&files["tessera-snapshot-gpu-1/snapshot.json"]).unwrap();
        assert_eq!(json["kernelLines"][0]["xid"], 79);
        assert_eq!(
            json["gpus"][1]["readings"]["probe"]["failing"],
            "fell off the bus"
        );

        // Nothing readable: still a snapshot, with the reasons.
        let bare = Inputs {
            kernel_log: Err("dmesg: read kernel buffer failed: Operation not permitted".into()),
            device_plugin_dir: dir.path().join("missing"),
            ..inputs
        };
        let (snap, kernel) = collect(&fake, &bare);
        assert!(kernel.is_none());
        assert_eq!(snap.errors.len(), 2, "{:?}", snap.errors);
        assert!(snap.errors[0].contains("Operation not permitted"));
    }
}
