//! Binds the DRA driver's two sockets and serves them until shutdown.
//!
//! `dra.sock` is bound first and the registration socket last, so the kubelet,
//! which reacts to the registration socket appearing, never calls an endpoint
//! that is not listening yet. On shutdown the registration socket is removed
//! first: that is how a plugin deregisters.
//!
//! Requests are routed on their `:path` only. The kubelet's plugin-watcher
//! client may leave out `:authority` altogether; HTTP/2 makes it optional and
//! the server accepts such requests (tests `dra_grpc.rs` send one).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::net::UnixListener;
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use super::DraConfig;
use super::proto::pluginregistration::registration_server::RegistrationServer;
use super::proto::{v1, v1beta1};
use super::registration::{RegistrationService, RegistrationState};
use super::service::{ClaimPreparer, DraService};

/// Failures that stop the DRA driver.
#[derive(Debug, thiserror::Error)]
pub enum DraServerError {
    #[error("cannot create the DRA socket directory {path}: {source}")]
    Dir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot listen on {path}: {source}")]
    Listen {
        path: String,
        source: std::io::Error,
    },
    #[error("DRA gRPC server on {path} failed: {source}")]
    Serve {
        path: String,
        source: tonic::transport::Error,
    },
}

/// Removes a stale socket file and binds a fresh one, creating its directory.
fn bind(path: &Path) -> Result<UnixListener, DraServerError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| DraServerError::Dir {
            path: dir.display().to_string(),
            source: e,
        })?;
    }
    let _ = std::fs::remove_file(path);
    UnixListener::bind(path).map_err(|e| DraServerError::Listen {
        path: path.display().to_string(),
        source: e,
    })
}

/// The absolute path the kubelet is told (`GetInfo` must answer one).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// Serves the DRA service and the registration service until `shutdown`
/// resolves, then removes both sockets. The kubelet's verdict on the
/// registration goes to `state`.
pub async fn serve(
    config: &DraConfig,
    preparer: Arc<dyn ClaimPreparer>,
    state: watch::Sender<RegistrationState>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), DraServerError> {
    let dra_path = config.dra_socket();
    let reg_path = config.registration_socket();
    let dra_listener = bind(&dra_path)?;
    let reg_listener = match bind(&reg_path) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_file(&dra_path);
            return Err(e);
        }
    };
    let service = DraService::new(preparer);
    let registration = RegistrationService::new(absolute(&dra_path).display().to_string(), state);
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = |mut rx: watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let dra = Server::builder()
        .add_service(v1::dra_plugin_server::DraPluginServer::new(service.clone()))
        .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(service))
        .serve_with_incoming_shutdown(
            UnixListenerStream::new(dra_listener),
            stopped(stop_rx.clone()),
        );
    let reg = Server::builder()
        .add_service(RegistrationServer::new(registration))
        .serve_with_incoming_shutdown(UnixListenerStream::new(reg_listener), stopped(stop_rx));
    tracing::info!(registration = %reg_path.display(), endpoint = %dra_path.display(), "serving the DRA driver");
    let mut dra = std::pin::pin!(dra);
    let mut reg = std::pin::pin!(reg);
    let mut shutdown = std::pin::pin!(shutdown);
    // Either server failing ends both; so does shutdown.
    let failed = tokio::select! {
        r = &mut dra => r.err().map(|e| (dra_path.clone(), e)),
        r = &mut reg => r.err().map(|e| (reg_path.clone(), e)),
        _ = &mut shutdown => None,
    };
    // Deregister first: the kubelet stops calling once the registration socket is gone.
    let _ = std::fs::remove_file(&reg_path);
    let _ = stop_tx.send(true);
    let _ = tokio::join!(
        tokio::time::timeout(std::time::Duration::from_secs(2), &mut dra),
        tokio::time::timeout(std::time::Duration::from_secs(2), &mut reg),
    );
    let _ = std::fs::remove_file(&dra_path);
    match failed {
        Some((path, source)) => Err(DraServerError::Serve {
            path: path.display().to_string(),
            source,
        }),
        None => Ok(()),
    }
}
