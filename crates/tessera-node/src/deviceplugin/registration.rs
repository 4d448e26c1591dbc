//! Serving the plugin sockets and registering them with the kubelet.
//!
//! The kubelet deletes every socket in the device-plugins directory when it
//! restarts and then creates a new `kubelet.sock` (protocols.md §2.5). The
//! manager polls the directory (every [`PluginConfig::poll`], one second by
//! default): when `kubelet.sock` is a new file (other inode or change time) or
//! one of the agent's own sockets has gone, it restarts its servers and
//! registers again. Polling needs no inotify dependency and reacts within
//! seconds, which is what the kubelet's five-minute grace period asks for.

use std::collections::BTreeMap;
use std::future::Future;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Endpoint, Server};

use super::allocate::Allocator;
use super::service::DevicePluginService;
use super::{API_VERSION, KUBELET_SOCKET, NodeView, Resource};
use crate::proto::deviceplugin as pb;
use crate::proto::deviceplugin::device_plugin_server::DevicePluginServer;
use crate::proto::deviceplugin::registration_client::RegistrationClient;

/// Failures while serving or registering.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot reach the kubelet at {path}: {message}")]
    Connect { path: String, message: String },
    #[error("the kubelet refused to register {resource}: {message}")]
    Refused { resource: String, message: String },
}

/// Where and how often.
#[derive(Debug, Clone)]
pub struct PluginConfig {
    /// The device-plugins directory (holds `kubelet.sock` and the plugins' sockets).
    pub dir: PathBuf,
    /// How often the directory is checked.
    pub poll: Duration,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            dir: super::DEVICE_PLUGIN_DIR.into(),
            poll: Duration::from_secs(1),
        }
    }
}

/// Calls `Register` on the kubelet socket for one resource.
pub async fn register(kubelet_socket: &Path, resource: &Resource) -> Result<(), RegistrationError> {
    let path = kubelet_socket.display().to_string();
    let connect_err = |e: &dyn std::fmt::Display| RegistrationError::Connect {
        path: path.clone(),
        message: e.to_string(),
    };
    let channel = Endpoint::from_shared(format!("unix://{path}"))
        .map_err(|e| connect_err(&e))?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(15))
        .connect()
        .await
        .map_err(|e| connect_err(&e))?;
    RegistrationClient::new(channel)
        .register(pb::RegisterRequest {
            version: API_VERSION.to_string(),
            endpoint: resource.socket_name(),
            resource_name: resource.name(),
            options: Some(DevicePluginService::options()),
        })
        .await
        .map_err(|s| RegistrationError::Refused {
            resource: resource.name(),
            message: s.message().to_string(),
        })?;
    Ok(())
}

/// A running plugin server.
struct Serving {
    socket: PathBuf,
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// Binds the resource's socket (replacing a stale file) and serves it.
fn serve(dir: &Path, service: DevicePluginService) -> Result<Serving, RegistrationError> {
    let socket = dir.join(service.resource.socket_name());
    let _ = std::fs::remove_file(&socket);
    let listener = UnixListener::bind(&socket).map_err(|e| RegistrationError::Listen {
        path: socket.display().to_string(),
        source: e,
    })?;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let result = Server::builder()
            .add_service(DevicePluginServer::new(service))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = result {
            tracing::error!(error = %e, "device plugin server stopped");
        }
    });
    Ok(Serving { socket, stop, task })
}

/// Identity of a file: a recreated socket has a new inode or change time.
fn identity(path: &Path) -> Option<(u64, u64, i64, i64)> {
    let m = std::fs::symlink_metadata(path).ok()?;
    Some((m.dev(), m.ino(), m.ctime(), m.ctime_nsec()))
}

/// Counts of what the manager did, for tests and the agent's status.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PluginStatus {
    /// Successful registrations per resource name, since start.
    pub registrations: BTreeMap<String, u64>,
    /// Last registration error, if the last attempt failed.
    pub last_error: Option<String>,
}

/// Serves every resource `offer` gives for the current GPUs and keeps it registered
/// until `shutdown` resolves. A resource that appears later (a MIG instance of a new
/// profile, created for a decision) gets its plugin started and registered without
/// touching the others; one whose last device goes keeps serving an empty list, as
/// the kubelet expects of a plugin that stays registered.
pub async fn run_plugins(
    config: PluginConfig,
    offer: impl Fn(&NodeView) -> Vec<Resource>,
    view: watch::Receiver<NodeView>,
    allocator: Arc<Allocator>,
    status: watch::Sender<PluginStatus>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RegistrationError> {
    let kubelet = config.dir.join(KUBELET_SOCKET);
    let mut shutdown = std::pin::pin!(shutdown);
    let mut servers: Vec<Serving> = Vec::new();
    let mut resources: Vec<Resource> = Vec::new();
    let mut warned_empty = false;
    // The kubelet socket we registered with; None → (re)start and register.
    let mut registered_with: Option<(u64, u64, i64, i64)> = None;
    loop {
        let known = resources.len();
        for r in offer(&view.borrow()) {
            if !resources.contains(&r) {
                resources.push(r);
            }
        }
        if resources.is_empty() {
            if !warned_empty {
                tracing::warn!("no GPU resources to advertise on this node (yet)");
                warned_empty = true;
            }
        } else {
            let current = identity(&kubelet);
            let own_gone = servers.iter().any(|s| !s.socket.exists());
            let kubelet_changed = current.is_some() && current != registered_with;
            let fresh = if kubelet_changed || own_gone || servers.is_empty() {
                if kubelet_changed && registered_with.is_some() {
                    tracing::info!(socket = %kubelet.display(), "kubelet socket recreated: re-registering");
                }
                if own_gone {
                    tracing::info!("a plugin socket was removed: restarting the plugin servers");
                }
                stop_all(&mut servers).await;
                registered_with = None;
                0
            } else {
                known
            };
            if fresh < resources.len() {
                for resource in &resources[fresh..] {
                    let svc =
                        DevicePluginService::new(resource.clone(), view.clone(), allocator.clone());
                    servers.push(serve(&config.dir, svc)?);
                }
                if current.is_some() {
                    let mut all_ok = true;
                    for resource in &resources[fresh..] {
                        match register(&kubelet, resource).await {
                            Ok(()) => {
                                tracing::info!(resource = %resource.name(), endpoint = %resource.socket_name(), "registered with the kubelet");
                                status.send_modify(|s| {
                                    *s.registrations.entry(resource.name()).or_default() += 1;
                                    s.last_error = None;
                                });
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "registration failed; will retry");
                                status.send_modify(|s| s.last_error = Some(e.to_string()));
                                all_ok = false;
                            }
                        }
                    }
                    // A failed registration, first or added, retries them all next tick.
                    registered_with = if all_ok && (fresh == 0 || registered_with.is_some()) {
                        current
                    } else {
                        None
                    };
                } else {
                    tracing::info!(socket = %kubelet.display(), "waiting for the kubelet socket");
                }
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(config.poll) => {}
        }
    }
    stop_all(&mut servers).await;
    Ok(())
}

async fn stop_all(servers: &mut Vec<Serving>) {
    for s in servers.drain(..) {
        let _ = s.stop.send(());
        // Graceful shutdown waits for open ListAndWatch streams, which never end on
        // their own: give them a moment, then cut them.
        let mut task = s.task;
        if tokio::time::timeout(Duration::from_secs(2), &mut task)
            .await
            .is_err()
        {
            task.abort();
        }
        let _ = std::fs::remove_file(&s.socket);
    }
}
