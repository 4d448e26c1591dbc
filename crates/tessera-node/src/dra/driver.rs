//! The DRA driver as one task: discovery, a health probe, slice publishing
//! and the two gRPC sockets, until shutdown (what `tessera node-agent --dra`
//! runs).
//!
//! It runs *instead of* the device plugin on a node, never beside it: the two
//! paths would hand out the same GPUs. Health here is the backend's own probe
//! (`GpuBackend::read`) on every `health_interval`, turned into device taints
//! (or the device left out, see [`SliceOptions::device_taints`]); the XID
//! tracking, metrics and `GpuNode` inventory of the device-plugin agent
//! ([`crate::run`]) are not part of this mode yet.

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use super::DraConfig;
use super::apiserver::{KubeClaims, SlicePublisher};
use super::prepare::{ClaimSource, Preparer, ResourceClaim};
use super::registration::RegistrationState;
use super::server::{DraServerError, serve};
use super::slice::{DriverVersions, SliceOptions, resource_slices};
use crate::backend::{BackendError, GpuBackend, Probe};
use crate::deviceplugin::NodeView;
use crate::health::GpuHealth;

/// How long a failed publish waits before the next try.
const PUBLISH_RETRY: Duration = Duration::from_secs(10);

/// The driver's settings (validated by the binary).
#[derive(Debug, Clone)]
pub struct DriverConfig {
    pub node_name: String,
    pub sockets: DraConfig,
    /// Where the per-claim CDI specs are written (`/var/run/cdi`).
    pub cdi_dir: PathBuf,
    pub options: SliceOptions,
    pub health_interval: Duration,
}

/// Failures that stop the driver.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error(transparent)]
    Backend(#[from] BackendError),
    #[error(transparent)]
    Server(#[from] DraServerError),
}

/// Without an API server no claim can be read: every prepare says so.
struct NoApiServer;

#[tonic::async_trait]
impl ClaimSource for NoApiServer {
    async fn get(&self, namespace: &str, name: &str) -> Result<ResourceClaim, String> {
        Err(format!(
            "cannot read resourceclaim {namespace}/{name}: the agent runs without a Kubernetes API server"
        ))
    }
}

/// The node as the backend sees it now: GPUs, and the health its probe reports.
fn look(backend: &dyn GpuBackend) -> Result<NodeView, BackendError> {
    let gpus = backend.discover()?;
    let health = gpus
        .iter()
        .map(|g| {
            let h = match backend.read(&g.uuid).map(|r| r.probe) {
                Ok(Probe::Failing(reason)) => GpuHealth::Unhealthy { reason, xid: None },
                Ok(Probe::Ok | Probe::Recovered) => GpuHealth::Healthy,
                Err(e) => GpuHealth::Unhealthy {
                    reason: e.to_string(),
                    xid: None,
                },
            };
            (g.uuid.clone(), h)
        })
        .collect();
    Ok(NodeView { gpus, health })
}

/// Runs the driver until `shutdown` resolves.
pub async fn run_driver(
    config: DriverConfig,
    backend: Arc<dyn GpuBackend>,
    client: Option<kube::Client>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DriverError> {
    let b = backend.clone();
    let first = tokio::task::spawn_blocking(move || look(b.as_ref()))
        .await
        .unwrap_or_else(|e| {
            Err(BackendError::Nvml {
                call: "discover",
                gpu: String::new(),
                message: e.to_string(),
            })
        })?;
    tracing::info!(gpus = first.gpus.len(), "DRA driver: GPUs found");
    let versions = DriverVersions {
        driver: backend.driver_version(),
        cuda: backend.cuda_version(),
    };
    let (view_tx, view) = watch::channel(first);

    // Health and inventory: look again on every interval.
    let b = backend.clone();
    let interval = config.health_interval;
    let prober = tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            let b = b.clone();
            match tokio::task::spawn_blocking(move || look(b.as_ref())).await {
                Ok(Ok(now)) => {
                    view_tx.send_if_modified(|v| {
                        let changed = *v != now;
                        *v = now;
                        changed
                    });
                }
                Ok(Err(e)) => tracing::warn!(error = %e, "DRA driver: cannot read the GPUs"),
                Err(e) => tracing::warn!(error = %e, "DRA driver: probe task failed"),
            }
        }
    });

    // Slices: published at start and on every change of the view.
    let publisher = client.clone().map(|c| {
        let mut view = view.clone();
        let node = config.node_name.clone();
        let options = config.options;
        tokio::spawn(async move {
            let mut publisher = SlicePublisher::new(c, node.clone());
            // Generations must grow across restarts of the agent: start from the clock.
            let mut generation = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| i64::try_from(d.as_secs()).unwrap_or(1));
            loop {
                let slices = resource_slices(
                    &node,
                    &view.borrow_and_update(),
                    &versions,
                    generation,
                    options,
                );
                let published = publisher.publish(&slices).await;
                // Every attempt gets a new generation: a half-applied pool is never
                // completed with other contents under the same number.
                generation += 1;
                match published {
                    Ok(()) => {
                        tracing::info!(slices = slices.len(), generation = generation - 1, version = ?publisher.version(), "ResourceSlices published");
                        if view.changed().await.is_err() {
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot publish ResourceSlices; retrying");
                        tokio::time::sleep(PUBLISH_RETRY).await;
                    }
                }
            }
        })
    });

    let source: Arc<dyn ClaimSource> = match client {
        Some(c) => Arc::new(KubeClaims::new(c)),
        None => Arc::new(NoApiServer),
    };
    let preparer = Arc::new(Preparer::new(
        source,
        view,
        config.node_name.clone(),
        config.cdi_dir.clone(),
    ));
    let (state, _) = watch::channel(RegistrationState::Pending);
    let result = serve(&config.sockets, preparer, state, shutdown).await;
    prober.abort();
    if let Some(p) = publisher {
        p.abort();
    }
    Ok(result?)
}
