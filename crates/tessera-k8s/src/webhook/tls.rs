//! The webhook's HTTPS listener: PEM files to a rustls configuration, and a
//! listener that runs TLS handshakes concurrently so one stalled client cannot
//! hold up the API server's other admission calls.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::{WebhookConfig, router};

/// Why the webhook could not start.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: no PEM certificate found")]
    NoCertificate { path: String },
    #[error("{path}: no PEM private key found")]
    NoKey { path: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A rustls server configuration from PEM files (checked before any socket is bound).
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let read = |p: &Path| {
        std::fs::read(p).map_err(|source| TlsError::Read {
            path: p.display().to_string(),
            source,
        })
    };
    let cert_pem = read(cert)?;
    let key_pem = read(key)?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut cert_pem.as_slice())
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: cert.display().to_string(),
        });
    }
    let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .ok()
        .flatten()
        .ok_or_else(|| TlsError::NoKey {
            path: key.display().to_string(),
        })?;
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_no_client_auth()
    .with_single_cert(certs, key_der)?;
    Ok(Arc::new(config))
}

/// Most TLS handshakes in flight at once; further connections wait in the kernel's backlog.
const MAX_HANDSHAKES: usize = 256;
/// How long a client may take to finish its TLS handshake.
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

type Handshake = (Result<TlsStream<tokio::net::TcpStream>, String>, SocketAddr);

/// A TCP listener that hands axum TLS streams. Handshakes run concurrently, each
/// in its own task, so a client that connects and stalls does not hold up the
/// API server's other admission calls; failures are logged and skipped.
pub struct TlsListener {
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    handshakes: tokio::task::JoinSet<Handshake>,
}

impl TlsListener {
    fn new(tcp: TcpListener, acceptor: TlsAcceptor) -> TlsListener {
        TlsListener {
            tcp,
            acceptor,
            handshakes: tokio::task::JoinSet::new(),
        }
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<tokio::net::TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let room = self.handshakes.len() < MAX_HANDSHAKES;
            tokio::select! {
                accepted = self.tcp.accept(), if room => match accepted {
                    Ok((stream, addr)) => {
                        let acceptor = self.acceptor.clone();
                        self.handshakes.spawn(async move {
                            let tls = match tokio::time::timeout(
                                HANDSHAKE_TIMEOUT,
                                acceptor.accept(stream),
                            )
                            .await
                            {
                                Ok(Ok(tls)) => Ok(tls),
                                Ok(Err(e)) => Err(e.to_string()),
                                Err(_) => Err("timed out".to_string()),
                            };
                            (tls, addr)
                        });
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "webhook accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next() => match done {
                    Ok((Ok(tls), addr)) => return (tls, addr),
                    Ok((Err(e), addr)) => tracing::debug!(%addr, error = %e, "TLS handshake failed"),
                    Err(e) => tracing::warn!(error = %e, "TLS handshake task failed"),
                },
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
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
    let listener = TlsListener::new(tcp, TlsAcceptor::from(tls));
    axum::serve(listener, router(config))
        .with_graceful_shutdown(shutdown)
        .await
        .map_err(|source| TlsError::Bind { addr, source })
}
