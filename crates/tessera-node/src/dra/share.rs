//! MPS for shares (consumable capacity): every share the driver prepares is an
//! MPS client, as on the device-plugin path's `mps` isolation, because MPS is
//! what enforces a share's compute and memory limits (time slicing enforces
//! neither).
//!
//! A share device's CDI edits carry the client's limits
//! (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`),
//! `CUDA_MPS_PIPE_DIRECTORY` and two mounts: the daemon's pipe directory and the
//! shared `/dev/shm` (`<mps root>/shm`), exactly as the device plugin answers
//! `Allocate` ([`crate::deviceplugin::response`]). They are device edits, not
//! claim edits, so only a container handed the share gets them.
//!
//! Which daemon: with per-GPU daemons ([`MpsConfig::per_gpu_daemons`],
//! `--mps-daemons per-gpu`) the driver runs one `nvidia-cuda-mps-control` per GPU
//! set ([`crate::mps::MpsDaemons`]), started before prepare answers and stopped
//! once no prepared claim uses it (after the same grace as on the device-plugin
//! path); a claim's shares form one set, since a client reaches one daemon.
//! Otherwise (`external`) one daemon someone else runs serves the node at
//! `<mps root>/pipe`.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde_json::{Value, json};

use crate::deviceplugin::allocate::MpsConfig;
use crate::mps::{MpsDaemons, daemon_key, pipe_dir};

/// How shares reach their MPS daemon.
#[derive(Debug, Clone, Default)]
pub struct ShareMps {
    pub config: MpsConfig,
    /// The daemons the driver runs (per-GPU mode only).
    pub daemons: Option<Arc<MpsDaemons>>,
}

impl ShareMps {
    /// The host pipe directory the clients of `gpus` (UUIDs) use.
    pub fn host_pipe(&self, gpus: &[String]) -> PathBuf {
        let root = Path::new(&self.config.host_root);
        if self.config.per_gpu_daemons {
            pipe_dir(root, &daemon_key(gpus))
        } else {
            root.join("pipe")
        }
    }

    /// The host directory mounted as the clients' `/dev/shm`.
    pub fn host_shm(&self) -> PathBuf {
        Path::new(&self.config.host_root).join("shm")
    }

    /// Makes sure the daemon for `gpus` serves and its shm directory exists (a
    /// bind mount of a missing path fails the container), when the driver runs
    /// the daemons; an external daemon's directories are its owner's.
    pub async fn ensure(&self, gpus: Vec<String>) -> Result<(), String> {
        let Some(daemons) = self.daemons.clone() else {
            return Ok(());
        };
        let shm = self.host_shm();
        std::fs::create_dir_all(&shm)
            .map_err(|e| format!("cannot create the MPS shm directory {}: {e}", shm.display()))?;
        tokio::task::spawn_blocking(move || daemons.ensure(&gpus).map(|_| ()))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())
    }

    /// One supervision pass: daemons `held` by prepared claims are restarted if
    /// they exited; the others are stopped once unheld for the grace period.
    pub async fn supervise(&self, held: BTreeSet<Vec<String>>) {
        let Some(daemons) = self.daemons.clone() else {
            return;
        };
        let done = tokio::task::spawn_blocking(move || daemons.supervise(&held, Instant::now()));
        match done.await {
            Ok(s) => {
                for (key, error) in s.failed {
                    tracing::warn!(daemon = %key, %error, "MPS control daemon not started");
                }
            }
            Err(e) => tracing::error!(error = %e, "MPS supervision failed"),
        }
    }
}

/// The percentage of SMs a client may use for a share of `compute_milli`
/// per-mille: rounded up, at least 1 (the device plugin's rule).
pub fn thread_percentage(compute_milli: u32) -> u32 {
    compute_milli.div_ceil(10).clamp(1, 100)
}

/// The CDI container edits of one share device: `env` first (the device's own
/// variables, then MPS's), and the two mounts. Pure.
pub fn share_edits(
    own_env: Vec<String>,
    config: &MpsConfig,
    host_pipe: &Path,
    host_shm: &Path,
    percentage: u32,
    memory_limits: &str,
) -> Value {
    let mut env = own_env;
    env.push(format!(
        "CUDA_MPS_PIPE_DIRECTORY={}",
        config.container_pipe_dir
    ));
    env.push(format!("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE={percentage}"));
    env.push(format!("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={memory_limits}"));
    json!({
        "env": env,
        "mounts": [
            {
                "hostPath": host_pipe.display().to_string(),
                "containerPath": config.container_pipe_dir,
                "options": ["rbind", "rw"],
            },
            {
                "hostPath": host_shm.display().to_string(),
                "containerPath": "/dev/shm",
                "options": ["rbind", "rw"],
            },
        ],
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_gpu_pipes_are_the_daemons_and_external_is_one() {
        let mut s = ShareMps::default();
        s.config.host_root = "/run/tessera/mps".into();
        assert_eq!(
            s.host_pipe(&["GPU-a".into()]),
            PathBuf::from("/run/tessera/mps/pipe")
        );
        s.config.per_gpu_daemons = true;
        assert_eq!(
            s.host_pipe(&["GPU-a".into()]),
            PathBuf::from("/run/tessera/mps/GPU-a/pipe")
        );
        assert_eq!(s.host_shm(), PathBuf::from("/run/tessera/mps/shm"));
    }

    /// 250 ‰ → 25 %; 1 ‰ still gets 1 %; 995 ‰ rounds up to 100 %.
    #[test]
    fn percentages_round_up() {
        assert_eq!(
            [250, 1, 995, 1000].map(thread_percentage),
            [25, 1, 100, 100]
        );
    }
}
