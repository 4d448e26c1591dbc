//! TLS for Tessera's HTTP servers: PEM files to a rustls configuration
//! (optionally demanding client certificates from a CA), and a listener that
//! runs handshakes concurrently so one stalled client cannot hold up others.
//! The admission webhook serves server-authenticated TLS; the extender's verbs,
//! when they must be reachable beyond loopback, demand client certificates
//! (kube-scheduler's extender `tlsConfig.certFile` / `keyFile`).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Why a TLS listener could not start.
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
    #[error("{path}: no usable CA certificate for client authentication ({problem})")]
    ClientCa { path: String, problem: String },
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

fn read(p: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(p).map_err(|source| TlsError::Read {
        path: p.display().to_string(),
        source,
    })
}

fn certificates(p: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(p)?;
    let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice())
        .filter_map(Result::ok)
        .collect();
    if certs.is_empty() {
        return Err(TlsError::NoCertificate {
            path: p.display().to_string(),
        });
    }
    Ok(certs)
}

/// A rustls server configuration from PEM files (checked before any socket
/// is bound). With `client_ca`, every client must present a certificate
/// signed by one of the CAs in that file, or the handshake fails.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<rustls::ServerConfig>, TlsError> {
    let certs = certificates(cert)?;
    let key_pem = read(key)?;
    let key_der = rustls_pemfile::private_key(&mut key_pem.as_slice())
        .ok()
        .flatten()
        .ok_or_else(|| TlsError::NoKey {
            path: key.display().to_string(),
        })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?;
    let config = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let ca_error = |problem: String| TlsError::ClientCa {
                path: ca.display().to_string(),
                problem,
            };
            let mut roots = rustls::RootCertStore::empty();
            for c in certificates(ca)? {
                roots.add(c).map_err(|e| ca_error(e.to_string()))?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .map_err(|e| ca_error(e.to_string()))?;
            builder.with_client_cert_verifier(verifier)
        }
    }
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
/// others; failures (a client without an accepted certificate among them)
/// are logged and skipped.
pub struct TlsListener {
    tcp: TcpListener,
    what: &'static str,
    acceptor: TlsAcceptor,
    handshakes: tokio::task::JoinSet<Handshake>,
}

impl TlsListener {
    /// Hands out the TLS streams of the connections `tcp` accepts; `what`
    /// names the server in logs.
    pub fn new(
        tcp: TcpListener,
        tls: Arc<rustls::ServerConfig>,
        what: &'static str,
    ) -> TlsListener {
        TlsListener {
            tcp,
            what,
            acceptor: TlsAcceptor::from(tls),
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
                        tracing::warn!(server = self.what, error = %e, "accept failed");
                        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    }
                },
                Some(done) = self.handshakes.join_next() => match done {
                    Ok((Ok(tls), addr)) => return (tls, addr),
                    Ok((Err(e), addr)) => tracing::info!(server = self.what, %addr, error = %e, "TLS handshake failed"),
                    Err(e) => tracing::warn!(error = %e, "TLS handshake task failed"),
                },
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
