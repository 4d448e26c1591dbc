//! `tessera doctor snapshot`: runs on a node (or in the node agent's pod) and
//! writes one `.tar.gz` for a bug report ([`tessera_node::snapshot`]). This
//! module does the I/O the library leaves to the binary: choosing the backend,
//! running `dmesg` (or reading `--kernel-log`), scraping the agent's metrics,
//! stamping the time and writing the file.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use tessera_node::backend::GpuBackend;
use tessera_node::backend::fake::Fake;
use tessera_node::backend::nvml::Nvml;
use tessera_node::snapshot::{Inputs, collect, write_archive};

use crate::cmd::bad_input;
use crate::cmd::node_agent::BackendKind;
use crate::cmd::progress::Steps;

#[derive(Debug, clap::Args)]
pub struct SnapshotArgs {
    /// Where GPU facts come from.
    #[arg(long, value_enum, default_value = "nvml")]
    pub backend: BackendKind,
    /// YAML file describing the fake GPUs (with --backend fake).
    #[arg(long, value_name = "FILE")]
    pub fake_config: Option<PathBuf>,
    /// Read the kernel log from this file instead of running `dmesg`.
    #[arg(long, value_name = "FILE")]
    pub kernel_log: Option<PathBuf>,
    /// The kubelet's device-plugins directory.
    #[arg(
        long,
        default_value = "/var/lib/kubelet/device-plugins",
        value_name = "DIR"
    )]
    pub device_plugin_dir: PathBuf,
    /// Host directory of the MPS control daemon.
    #[arg(long, default_value = "/run/tessera/mps", value_name = "DIR")]
    pub mps_root: PathBuf,
    /// The node agent's metrics address to scrape ("off" to skip).
    #[arg(long, default_value = "127.0.0.1:9400", value_name = "ADDR")]
    pub agent_metrics: String,
    /// This node's name (defaults to $NODE_NAME, then the host name).
    #[arg(long)]
    pub node_name: Option<String>,
    /// The archive to write (default: tessera-snapshot-NODE.tar.gz in the current directory).
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
}

/// `/metrics` over plain HTTP/1.0 with short timeouts (the agent serves it on loopback).
fn scrape(addr: SocketAddr) -> Result<String, String> {
    let timeout = Duration::from_secs(2);
    let mut s = TcpStream::connect_timeout(&addr, timeout).map_err(|e| format!("{addr}: {e}"))?;
    s.set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .map_err(|e| format!("{addr}: {e}"))?;
    let mut body = Vec::new();
    s.take(16 << 20)
        .read_to_end(&mut body)
        .map_err(|e| format!("{addr}: {e}"))?;
    let text = String::from_utf8_lossy(&body);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let ok = head.starts_with("HTTP/1.") && head.split_whitespace().nth(1) == Some("200");
    if !ok {
        return Err(format!(
            "{addr}: {}",
            head.lines().next().unwrap_or("no HTTP answer")
        ));
    }
    Ok(body.to_string())
}

fn dmesg() -> Result<String, String> {
    let out = std::process::Command::new("dmesg")
        .output()
        .map_err(|e| format!("running dmesg: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "dmesg: {} (run as root, or pass --kernel-log FILE)",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn node_name(a: &SnapshotArgs) -> String {
    a.node_name
        .clone()
        .or_else(|| std::env::var("NODE_NAME").ok())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|s| s.trim().to_string())
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "node".to_string())
}

pub fn run(a: SnapshotArgs) -> anyhow::Result<ExitCode> {
    // Validate everything before collecting anything.
    let metrics_addr = match a.agent_metrics.as_str() {
        "off" | "" => None,
        s => match s.to_socket_addrs().ok().and_then(|mut i| i.next()) {
            Some(addr) => Some(addr),
            None => {
                return bad_input(format!(
                    "--agent-metrics {s:?}: not an address like 127.0.0.1:9400"
                ));
            }
        },
    };
    let fake = match (a.backend, &a.fake_config) {
        (BackendKind::Fake, None) => return bad_input("--backend fake needs --fake-config FILE"),
        (BackendKind::Fake, Some(path)) => match Fake::from_file(path) {
            Ok(f) => Some(f),
            Err(e) => return bad_input(e),
        },
        (BackendKind::Nvml, Some(_)) => {
            return bad_input("--fake-config is only used with --backend fake");
        }
        (BackendKind::Nvml, None) => None,
    };
    // The input is valid: from here on, say what is under way.
    let steps = Steps::new("doctor snapshot");
    // Why NVML could not start: the first thing a bug report about a node whose GPUs
    // vanished needs, so it goes into the archive's errors.
    let mut backend_error = None;
    let backend: Box<dyn GpuBackend> = match fake {
        Some(f) => Box::new(f),
        None => {
            steps.step("starting NVML");
            match Nvml::init() {
                Ok(n) => Box::new(n),
                // No driver is a finding, not a reason to write nothing.
                Err(e) => {
                    backend_error = Some(format!("GPU backend: {e}"));
                    Box::new(tessera_node::backend::Unavailable {
                        reason: e.to_string(),
                    })
                }
            }
        }
    };
    steps.step("reading the kernel log");
    let kernel_log = match &a.kernel_log {
        Some(path) => std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display())),
        None => dmesg(),
    };
    let node = node_name(&a);
    let inputs = Inputs {
        kernel_log,
        device_plugin_dir: a.device_plugin_dir.clone(),
        mps_root: a.mps_root.clone(),
        agent_metrics: metrics_addr.map(|addr| {
            steps.step("scraping the node agent's metrics");
            scrape(addr)
        }),
        taken_at: jiff::Timestamp::now().to_string(),
        node_name: node.clone(),
    };
    steps.step("reading the GPUs");
    let (mut snap, kernel) = collect(backend.as_ref(), &inputs);
    if let Some(e) = backend_error {
        snap.errors.insert(0, e);
    }
    let metrics = match &inputs.agent_metrics {
        Some(Ok(m)) => Some(m.as_str()),
        _ => None,
    };
    let path = a
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("tessera-snapshot-{node}.tar.gz")));
    steps.step("writing the archive");
    let file =
        std::fs::File::create(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    write_archive(
        &snap,
        kernel.as_deref(),
        metrics,
        std::io::BufWriter::new(file),
    )
    .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    steps.finish();
    let xids = snap.kernel_lines.iter().filter(|l| l.xid.is_some()).count();
    println!(
        "wrote {}: {} GPU(s) via {}, driver {}, {} NVRM line(s) ({} with an XID), {} failing GPU(s)",
        path.display(),
        snap.gpus.len(),
        snap.backend,
        snap.driver_version.as_deref().unwrap_or("unknown"),
        snap.kernel_lines.len(),
        xids,
        snap.failing_gpus().len()
    );
    for e in &snap.errors {
        println!("  not collected: {e}");
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        args: SnapshotArgs,
    }

    fn code(args: &[&str]) -> String {
        let cli = Cli::try_parse_from(std::iter::once("snapshot").chain(args.iter().copied()))
            .expect("flags parse");
        format!("{:?}", run(cli.args).unwrap())
    }

    /// Runs the command with `args`, `dmesg` as the kernel log and no metrics scrape,
    /// into a temporary archive: the exit code and the archive's `snapshot.json`.
    fn snapshot(args: &[&str], dmesg: &str) -> (String, serde_json::Value) {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("dmesg.txt");
        std::fs::write(&log, dmesg).unwrap();
        let out = dir.path().join("s.tar.gz");
        let mut all = args.to_vec();
        all.extend([
            "--kernel-log",
            log.to_str().unwrap(),
            "--agent-metrics",
            "off",
            "-o",
            out.to_str().unwrap(),
        ]);
        let code = code(&all);
        let bytes = std::fs::read(&out).unwrap();
        let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(&bytes[..]));
        let mut json = String::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            if e.path().unwrap().ends_with("snapshot.json") {
                e.read_to_string(&mut json).unwrap();
            }
        }
        (code, serde_json::from_str(&json).unwrap())
    }

    /// With `--backend nvml` the archive is written either way: on a machine without a
    /// driver (CI) it says why NVML did not start; on a GPU machine it holds the GPUs.
    #[test]
    fn the_nvml_archive_says_why_there_are_no_gpus() {
        let (code, v) = snapshot(&["--backend", "nvml"], "");
        assert_eq!(code, format!("{:?}", ExitCode::SUCCESS));
        match Nvml::init() {
            Err(e) => {
                assert_eq!(v["gpus"].as_array().map(Vec::len), Some(0));
                assert_eq!(v["errors"][0], format!("GPU backend: {e}"), "{v}");
            }
            Ok(_) => {
                assert!(!v["gpus"].as_array().unwrap().is_empty(), "{v}");
                assert!(v["driverVersion"].is_string(), "{v}");
            }
        }
    }

    /// The whole command on the fake backend: the archive holds the GPUs and the XID lines.
    #[test]
    fn writes_an_archive_from_the_fake_backend() {
        let dir = tempfile::tempdir().unwrap();
        let fake = dir.path().join("fake.yaml");
        std::fs::write(
            &fake,
            "driverVersion: \"550.54.15\"\ngpus:\n  - { uuid: GPU-1, product: NVIDIA L4 }\n",
        )
        .unwrap();
        let (code, v) = snapshot(
            &[
                "--backend",
                "fake",
                "--fake-config",
                fake.to_str().unwrap(),
                "--node-name",
                "n1",
            ],
            "noise\nNVRM: Xid (PCI:0000:01:00): 48, pid=9, DBE\n",
        );
        assert_eq!(code, format!("{:?}", ExitCode::SUCCESS));
        assert_eq!(v["driverVersion"], "550.54.15");
        assert_eq!(v["gpus"][0]["info"]["uuid"], "GPU-1");
        assert_eq!(v["kernelLines"][0]["xid"], 48);
        assert_eq!(v["nodeName"], "n1");
    }

    #[test]
    fn bad_flags_exit_2() {
        let two = format!("{:?}", ExitCode::from(2));
        assert_eq!(code(&["--backend", "fake"]), two);
        assert_eq!(
            code(&["--backend", "fake", "--fake-config", "/nonexistent.yaml"]),
            two
        );
        assert_eq!(code(&["--agent-metrics", "not an address"]), two);
    }
}
