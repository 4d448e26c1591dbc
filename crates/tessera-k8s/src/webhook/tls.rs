//! The webhook's HTTPS server, on the shared [`crate::tls`] listener.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;

use super::{WebhookConfig, router};
use crate::tls::{TlsError, TlsListener};

/// The webhook's rustls configuration from PEM files (no client certificates:
/// the API server authenticates the webhook, not the other way round).
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    crate::tls::server_config(cert, key, None)
}

/// Serves the webhook over HTTPS until `shutdown` resolves.
pub async fn serve(
    addr: SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    config: Arc<WebhookConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TlsError> {
    let tcp = TcpListener::bind(addr)
        .await
        .map_err(|source| TlsError::Bind { addr, source })?;
    serve_on(tcp, tls, config, shutdown).await
}

/// [`serve`] on a listener that is already bound (e.g. to port 0, whose
/// address the caller reads back with `local_addr`).
pub async fn serve_on(
    tcp: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    config: Arc<WebhookConfig>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), TlsError> {
    let addr = tcp.local_addr().map_err(|source| TlsError::Bind {
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        source,
    })?;
    let listener = TlsListener::new(tcp, tls, "webhook");
    axum::serve(listener, router(config))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| TlsError::Bind { addr, source })
}
