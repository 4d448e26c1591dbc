//! MPS control daemons started and supervised by the agent (issue 13): one
//! `nvidia-cuda-mps-control` per set of GPUs that MPS shares are served on.
//!
//! Why the agent runs them: without a control daemon behind the pipe directory an
//! MPS client silently runs without MPS, so the limits in its environment
//! (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`) are not
//! enforced and "soft isolation" is none. So `Allocate` answers an MPS share only
//! once the daemon for its GPUs has opened its control pipe, and fails the pod's
//! admission with the daemon's error otherwise.
//!
//! Why one per GPU (set): a fault in an MPS server takes down every client of that
//! server; per GPU, it takes down only the pods sharing that GPU. A client can
//! reach one server only (one `CUDA_MPS_PIPE_DIRECTORY`), so a share of several
//! GPUs gets a daemon of its own for exactly those GPUs, which then time-slices
//! with the one-GPU daemons on the same GPUs (the compute mode stays `DEFAULT`).
//!
//! Layout under the root (`--mps-root`, the same path on the host and in the
//! agent): `<key>/pipe` (the control pipe, mounted into clients) and `<key>/log`,
//! where `key` is the GPU's UUID or `set-<hash>` for several GPUs ([`daemon_key`]).
//! `shm/` beside them is the shared `/dev/shm` of daemons and clients.
//!
//! Supervision ([`MpsDaemons::supervise`], on the agent's reap tick): a daemon a live
//! decision holds that has exited is started again, with exponential backoff after
//! failures; a daemon no decision has held for the grace period is told to `quit`
//! (and killed if it does not). A restart of the agent restarts the daemons, and
//! their running clients lose their server: the documented price of supervising
//! them from the agent rather than from a DaemonSet of their own.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tessera_core::allocation::VerifyingKeys;
use tessera_core::request::Isolation;

use crate::deviceplugin::NodeView;
use crate::deviceplugin::allocate::PodInfo;

/// How the agent runs MPS daemons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpsDaemonConfig {
    /// The control binary (`nvidia-cuda-mps-control`, from `PATH` unless a path).
    pub binary: PathBuf,
    /// Host directory for the daemons' pipe and log directories.
    pub root: PathBuf,
    /// How long `Allocate` waits for a new daemon's control pipe.
    pub start_timeout: Duration,
    /// How long a daemon no decision holds is kept (a pod arriving soon reuses it).
    pub grace: Duration,
    /// Longest wait between restarts of a daemon that keeps failing.
    pub max_backoff: Duration,
}

impl Default for MpsDaemonConfig {
    fn default() -> Self {
        MpsDaemonConfig {
            binary: PathBuf::from("nvidia-cuda-mps-control"),
            root: PathBuf::from("/run/tessera/mps"),
            start_timeout: Duration::from_secs(10),
            grace: Duration::from_secs(60),
            max_backoff: Duration::from_secs(300),
        }
    }
}

/// Why a daemon is not serving.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error("cannot prepare the MPS directory {path}: {source}")]
    Dir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot start the MPS control daemon for {gpus} ({binary}): {source}")]
    Spawn {
        gpus: String,
        binary: String,
        source: std::io::Error,
    },
    #[error("the MPS control daemon for {gpus} exited at start ({status}){stderr}")]
    Exited {
        gpus: String,
        status: String,
        stderr: String,
    },
    #[error(
        "the MPS control daemon for {gpus} did not open its control pipe {pipe} within {timeout_ms} ms"
    )]
    NotReady {
        gpus: String,
        pipe: String,
        timeout_ms: u128,
    },
}

/// The directory name of the daemon for `gpus` (UUIDs): the UUID for one GPU,
/// `set-<16 hex digits>` (FNV-1a of the sorted UUIDs) for several, so that a name
/// stays short and the same set always meets the same daemon.
pub fn daemon_key(gpus: &[String]) -> String {
    let mut sorted: Vec<&str> = gpus.iter().map(String::as_str).collect();
    sorted.sort_unstable();
    sorted.dedup();
    let safe = |s: &str| -> String {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect()
    };
    match sorted.as_slice() {
        [one] if !one.is_empty() => safe(one),
        _ => {
            let mut h: u64 = 0xcbf2_9ce4_8422_2325;
            for b in sorted.join(",").bytes() {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            format!("set-{h:016x}")
        }
    }
}

/// The pipe directory of the daemon for `key` under `root`.
pub fn pipe_dir(root: &Path, key: &str) -> PathBuf {
    root.join(key).join("pipe")
}

/// One daemon's state, for logs, metrics and `tessera doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonStatus {
    pub key: String,
    pub gpus: Vec<String>,
    pub running: bool,
    pub pid: Option<u32>,
    /// Starts after the first (exits while held, failed starts).
    pub restarts: u32,
    pub last_exit: Option<String>,
}

/// What one supervision pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Supervised {
    pub started: Vec<String>,
    pub stopped: Vec<String>,
    pub failed: Vec<(String, String)>,
}

#[derive(Debug)]
struct Daemon {
    gpus: Vec<String>,
    child: Option<Child>,
    restarts: u32,
    retry_at: Option<Instant>,
    unheld_since: Option<Instant>,
    last_exit: Option<String>,
}

impl Daemon {
    /// Not started yet.
    fn new(gpus: &[String]) -> Daemon {
        Daemon {
            gpus: sorted(gpus),
            child: None,
            restarts: 0,
            retry_at: None,
            unheld_since: None,
            last_exit: None,
        }
    }
}

/// The agent's MPS control daemons.
#[derive(Debug)]
pub struct MpsDaemons {
    config: MpsDaemonConfig,
    daemons: Mutex<BTreeMap<String, Daemon>>,
}

impl MpsDaemons {
    pub fn new(config: MpsDaemonConfig) -> MpsDaemons {
        MpsDaemons {
            config,
            daemons: Mutex::new(BTreeMap::new()),
        }
    }

    pub fn config(&self) -> &MpsDaemonConfig {
        &self.config
    }

    /// Makes sure the daemon for `gpus` runs and has opened its control pipe, starting
    /// it if needed (a pod is being admitted: no backoff); returns its pipe directory.
    /// Blocking (it waits for the pipe): call it from a blocking task.
    pub fn ensure(&self, gpus: &[String]) -> Result<PathBuf, MpsError> {
        let key = daemon_key(gpus);
        let mut daemons = self.lock();
        let d = daemons
            .entry(key.clone())
            .or_insert_with(|| Daemon::new(gpus));
        d.unheld_since = None;
        reap_exit(d);
        if d.child.is_some() {
            return Ok(pipe_dir(&self.config.root, &key));
        }
        let first = d.last_exit.is_none() && d.restarts == 0;
        let result = self.start(&key, d);
        if result.is_err() || !first {
            d.restarts += 1;
        }
        result
    }

    /// One supervision pass: `held` are the GPU sets live MPS decisions hold. Held
    /// daemons that exited are started again (after their backoff); daemons held by
    /// nothing for the grace period are stopped. Blocking.
    pub fn supervise(&self, held: &BTreeSet<Vec<String>>, now: Instant) -> Supervised {
        let mut out = Supervised::default();
        let held_keys: BTreeMap<String, &Vec<String>> =
            held.iter().map(|g| (daemon_key(g), g)).collect();
        let mut daemons = self.lock();
        for (key, gpus) in &held_keys {
            let d = daemons
                .entry(key.clone())
                .or_insert_with(|| Daemon::new(gpus));
            d.unheld_since = None;
            if reap_exit(d) {
                tracing::warn!(gpus = ?d.gpus, exit = ?d.last_exit, "MPS control daemon exited while pods hold it");
            }
            if d.child.is_some() || d.retry_at.is_some_and(|t| t > now) {
                continue;
            }
            match self.start(key, d) {
                Ok(_) => {
                    if d.last_exit.is_some() {
                        d.restarts += 1;
                    }
                    d.retry_at = None;
                    out.started.push(key.clone());
                }
                Err(e) => {
                    d.restarts += 1;
                    d.retry_at = Some(now + self.backoff(d.restarts));
                    tracing::warn!(gpus = ?d.gpus, error = %e, restarts = d.restarts, "MPS control daemon not started");
                    out.failed.push((key.clone(), e.to_string()));
                }
            }
        }
        let unheld: Vec<String> = daemons
            .keys()
            .filter(|k| !held_keys.contains_key(*k))
            .cloned()
            .collect();
        for key in unheld {
            let Some(d) = daemons.get_mut(&key) else {
                continue;
            };
            let since = *d.unheld_since.get_or_insert(now);
            if now.duration_since(since) < self.config.grace {
                continue;
            }
            if let Some(d) = daemons.remove(&key) {
                self.stop(&key, d);
                out.stopped.push(key);
            }
        }
        out
    }

    /// Every daemon's state, by key.
    pub fn status(&self) -> Vec<DaemonStatus> {
        statuses(&mut self.lock())
    }

    /// [`MpsDaemons::status`], or `None` while a daemon is being started or stopped
    /// (for a metrics scrape, which must not wait for that).
    pub fn try_status(&self) -> Option<Vec<DaemonStatus>> {
        let mut guard = match self.daemons.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        Some(statuses(&mut guard))
    }

    /// Stops every daemon (the agent is shutting down).
    pub fn shutdown(&self) {
        let all = std::mem::take(&mut *self.lock());
        for (key, d) in all {
            self.stop(&key, d);
        }
    }

    fn backoff(&self, failures: u32) -> Duration {
        let secs = 1u64 << failures.saturating_sub(1).min(20);
        Duration::from_secs(secs).min(self.config.max_backoff)
    }

    /// Starts the daemon and waits for its control pipe.
    fn start(&self, key: &str, d: &mut Daemon) -> Result<PathBuf, MpsError> {
        let dir = self.config.root.join(key);
        let (pipe, log) = (dir.join("pipe"), dir.join("log"));
        for p in [&pipe, &log] {
            std::fs::create_dir_all(p).map_err(|source| MpsError::Dir {
                path: p.display().to_string(),
                source,
            })?;
        }
        // A pipe left by a daemon that died keeps its name: remove it, or the wait
        // below would see it and call a dead daemon ready.
        let _ = std::fs::remove_file(pipe.join("control"));
        let stderr_path = log.join("agent-stderr.log");
        let stderr = std::fs::File::create(&stderr_path).map_err(|source| MpsError::Dir {
            path: stderr_path.display().to_string(),
            source,
        })?;
        let gpus = d.gpus.join(",");
        let mut child = Command::new(&self.config.binary)
            .arg("-f")
            .env("CUDA_VISIBLE_DEVICES", &gpus)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|source| MpsError::Spawn {
                gpus: gpus.clone(),
                binary: self.config.binary.display().to_string(),
                source,
            })?;
        let deadline = Instant::now() + self.config.start_timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let text = std::fs::read_to_string(&stderr_path).unwrap_or_default();
                let text = text.trim();
                d.last_exit = Some(status.to_string());
                return Err(MpsError::Exited {
                    gpus,
                    status: status.to_string(),
                    stderr: if text.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", text.chars().take(500).collect::<String>())
                    },
                });
            }
            if pipe.join("control").exists() {
                break;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(MpsError::NotReady {
                    gpus,
                    pipe: pipe.display().to_string(),
                    timeout_ms: self.config.start_timeout.as_millis(),
                });
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        tracing::info!(gpus = %gpus, pid = child.id(), pipe = %pipe.display(), "MPS control daemon started");
        d.child = Some(child);
        Ok(pipe)
    }

    /// Asks the daemon to quit through its control pipe (as an operator would:
    /// `echo quit | nvidia-cuda-mps-control`), then kills it if it has not exited.
    fn stop(&self, key: &str, mut d: Daemon) {
        let Some(mut child) = d.child.take() else {
            return;
        };
        let pipe = pipe_dir(&self.config.root, key);
        let asked = Command::new(&self.config.binary)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .and_then(|mut client| {
                if let Some(mut stdin) = client.stdin.take() {
                    stdin.write_all(b"quit\n")?;
                }
                Ok(client)
            });
        let deadline = Instant::now() + Duration::from_secs(5);
        let exited = loop {
            match child.try_wait() {
                Ok(Some(_)) => break true,
                Err(_) => break false,
                Ok(None) if Instant::now() >= deadline => break false,
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        if !exited {
            let _ = child.kill();
            let _ = child.wait();
        }
        // The client blocks on a pipe nobody reads once the daemon is gone.
        if let Ok(mut client) = asked {
            if !matches!(client.try_wait(), Ok(Some(_))) {
                let _ = client.kill();
            }
            let _ = client.wait();
        }
        tracing::info!(gpus = ?d.gpus, quit = exited, "MPS control daemon stopped: no pod holds it");
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Daemon>> {
        self.daemons.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl Drop for MpsDaemons {
    fn drop(&mut self) {
        self.shutdown();
    }
}

fn statuses(daemons: &mut BTreeMap<String, Daemon>) -> Vec<DaemonStatus> {
    daemons
        .iter_mut()
        .map(|(key, d)| {
            reap_exit(d);
            DaemonStatus {
                key: key.clone(),
                gpus: d.gpus.clone(),
                running: d.child.is_some(),
                pid: d.child.as_ref().map(Child::id),
                restarts: d.restarts,
                last_exit: d.last_exit.clone(),
            }
        })
        .collect()
}

fn sorted(gpus: &[String]) -> Vec<String> {
    let mut v = gpus.to_vec();
    v.sort_unstable();
    v.dedup();
    v
}

/// Notes a daemon's exit; true when it had exited since last seen.
fn reap_exit(d: &mut Daemon) -> bool {
    let Some(child) = d.child.as_mut() else {
        return false;
    };
    match child.try_wait() {
        Ok(Some(status)) => {
            d.last_exit = Some(status.to_string());
            d.child = None;
            true
        }
        _ => false,
    }
}

/// The GPU sets (UUIDs) that live pods' verified MPS decisions hold on `node`.
pub fn held_sets<K: VerifyingKeys + ?Sized>(
    pods: &[PodInfo],
    key: &K,
    node: &str,
    view: &NodeView,
) -> BTreeSet<Vec<String>> {
    PodInfo::live_decisions(pods, key, node)
        .filter(|a| a.isolation == Isolation::Mps)
        .flat_map(|a| {
            // Each container is a client of the daemon for its own GPUs.
            let names: Vec<String> = if a.containers.is_empty() {
                vec![String::new()]
            } else {
                a.containers.iter().map(|c| c.name.clone()).collect()
            };
            names
                .iter()
                .filter_map(|n| a.gpus_of(n))
                .map(|gpus| {
                    let uuids: Vec<String> = gpus
                        .iter()
                        .filter_map(|g| {
                            if g.uuid.is_empty() {
                                view.grant_gpu(g).map(|x| x.uuid.clone())
                            } else {
                                Some(g.uuid.clone())
                            }
                        })
                        .collect();
                    sorted(&uuids)
                })
                .filter(|u| !u.is_empty())
                .collect::<Vec<_>>()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keys_name_one_gpu_or_a_stable_set() {
        let (a, b) = ("GPU-aaaa".to_string(), "GPU-bbbb".to_string());
        assert_eq!(daemon_key(std::slice::from_ref(&a)), "GPU-aaaa");
        let ab = daemon_key(&[a.clone(), b.clone()]);
        assert!(ab.starts_with("set-") && ab.len() == 4 + 16, "{ab}");
        // The same set in any order, or repeated, meets the same daemon.
        assert_eq!(ab, daemon_key(&[b.clone(), a.clone(), b.clone()]));
        assert_ne!(ab, daemon_key(&[a.clone(), "GPU-cccc".into()]));
        // Nothing from outside becomes a path component unchecked.
        assert_eq!(daemon_key(&["../x y".into()]), "___x_y");
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let d = MpsDaemons::new(MpsDaemonConfig {
            max_backoff: Duration::from_secs(20),
            ..MpsDaemonConfig::default()
        });
        let secs: Vec<u64> = (1..=7).map(|n| d.backoff(n).as_secs()).collect();
        // 1, 2, 4, 8, 16, then the 20 s cap.
        assert_eq!(secs, [1, 2, 4, 8, 16, 20, 20]);
    }

    fn daemons_with(body: &str, timeout: Duration) -> (tempfile::TempDir, MpsDaemons) {
        let root = tempfile::tempdir().unwrap();
        let binary = root.path().join("control");
        std::fs::write(&binary, body).unwrap();
        std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();
        let d = MpsDaemons::new(MpsDaemonConfig {
            binary,
            root: root.path().join("mps"),
            start_timeout: timeout,
            ..MpsDaemonConfig::default()
        });
        (root, d)
    }

    #[test]
    fn a_daemon_that_never_opens_its_pipe_is_killed_and_named() {
        let (_root, d) = daemons_with("#!/bin/sh\nexec sleep 30\n", Duration::from_millis(200));
        let err = d.ensure(&["GPU-a".into()]).unwrap_err();
        assert!(matches!(err, MpsError::NotReady { .. }), "{err}");
        assert!(err.to_string().contains("GPU-a"), "{err}");
        let s = d.status();
        assert_eq!(s.len(), 1);
        assert!(!s[0].running);
        assert_eq!(s[0].restarts, 1);
    }

    #[test]
    fn a_missing_binary_is_named() {
        let d = MpsDaemons::new(MpsDaemonConfig {
            binary: "/nonexistent/nvidia-cuda-mps-control".into(),
            root: tempfile::tempdir().unwrap().path().join("mps"),
            ..MpsDaemonConfig::default()
        });
        let err = d.ensure(&["GPU-a".into()]).unwrap_err().to_string();
        assert!(
            err.contains("/nonexistent/nvidia-cuda-mps-control"),
            "{err}"
        );
    }

    /// A held daemon that keeps failing is retried only after its backoff.
    #[test]
    fn supervision_backs_off_a_failing_daemon() {
        let (_root, d) = daemons_with("#!/bin/sh\nexit 1\n", Duration::from_secs(5));
        let held: BTreeSet<Vec<String>> = [vec!["GPU-a".to_string()]].into();
        let t0 = Instant::now();
        assert_eq!(d.supervise(&held, t0).failed.len(), 1);
        // Within the first backoff (1 s) nothing is tried; after it, once more.
        assert!(
            d.supervise(&held, t0 + Duration::from_millis(500))
                .failed
                .is_empty()
        );
        assert_eq!(
            d.supervise(&held, t0 + Duration::from_millis(1100))
                .failed
                .len(),
            1
        );
        assert_eq!(d.status()[0].restarts, 2);
    }
}
