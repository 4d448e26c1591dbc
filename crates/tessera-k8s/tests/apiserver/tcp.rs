//! The double over TCP, for clients that should use their real connection
//! stack (hyper's pool) rather than the in-process service: every request
//! runs on one session, exactly as [`ApiService`] serves it, and the listener
//! counts the TCP connections clients open. Plain HTTP/1.1, or TLS with a
//! certificate made at start offering HTTP/2 and HTTP/1.1 by ALPN, as
//! kube-apiserver does.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::response::IntoResponse;
use http::{Request, StatusCode};
use kube::client::Body as KubeBody;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tower::Service;

use super::{ApiServer, Session};

/// The double listening on a loopback port.
pub struct Listening {
    pub addr: SocketAddr,
    /// The server certificate (DER) when serving TLS.
    pub ca: Option<Vec<u8>>,
    /// TCP connections accepted so far.
    pub connections: Arc<AtomicU64>,
    pub session: Session,
    task: JoinHandle<()>,
}

impl Listening {
    /// The kube configuration that reaches the double (trusting its certificate).
    pub fn kube_config(&self) -> kube::Config {
        let scheme = if self.ca.is_some() { "https" } else { "http" };
        let url = format!("{scheme}://{}", self.addr)
            .parse()
            .expect("a loopback URL");
        let mut config = kube::Config::new(url);
        config.root_cert = self.ca.clone().map(|c| vec![c]);
        config
    }

    /// kube-rs's own client (HTTP/1.1 only), as `kube::Client::try_default` builds it.
    pub fn client(&self) -> kube::Client {
        kube::Client::try_from(self.kube_config()).expect("a kube client")
    }

    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Counting {
    tcp: TcpListener,
    connections: Arc<AtomicU64>,
}

impl axum::serve::Listener for Counting {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (TcpStream, SocketAddr) {
        loop {
            match self.tcp.accept().await {
                Ok((stream, addr)) => {
                    let _ = stream.set_nodelay(true);
                    self.connections.fetch_add(1, Ordering::Relaxed);
                    return (stream, addr);
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.tcp.local_addr()
    }
}

/// [`Counting`] with a TLS handshake (ALPN `h2`, `http/1.1`) per connection.
struct CountingTls {
    inner: Counting,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for CountingTls {
    type Io = tokio_rustls::server::TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, SocketAddr) {
        loop {
            let (stream, addr) = self.inner.accept().await;
            if let Ok(tls) = self.acceptor.accept(stream).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}

/// A self-signed certificate for 127.0.0.1 and a server configuration offering
/// HTTP/2 and HTTP/1.1.
fn tls_config() -> (Vec<u8>, Arc<rustls::ServerConfig>) {
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".into(), "localhost".into()])
        .expect("a certificate");
    let cert = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(rustls::pki_types::PrivatePkcs8KeyDer::from(
        ck.signing_key.serialize_der(),
    ));
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_no_client_auth()
    .with_single_cert(vec![cert.clone()], key)
    .expect("server configuration");
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (cert.to_vec(), Arc::new(config))
}

impl ApiServer {
    /// Serves the double on 127.0.0.1 (a free port), plain HTTP/1.1, until the handle drops.
    pub async fn listen(&self) -> Listening {
        self.listen_on(false).await
    }

    /// Serves the double over TLS with HTTP/2 (ALPN) until the handle drops.
    pub async fn listen_tls(&self) -> Listening {
        self.listen_on(true).await
    }

    async fn listen_on(&self, tls: bool) -> Listening {
        let tcp = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = tcp.local_addr().expect("local address");
        let connections = Arc::new(AtomicU64::new(0));
        let (service, session) = self.service();
        let app = Router::new().fallback(move |req: Request<Body>| {
            let mut service = service.clone();
            async move {
                let (parts, body) = req.into_parts();
                let bytes = match axum::body::to_bytes(body, usize::MAX).await {
                    Ok(b) => b,
                    Err(e) => return (StatusCode::BAD_REQUEST, e.to_string()).into_response(),
                };
                let req = Request::from_parts(parts, KubeBody::from(bytes.to_vec()));
                match service.call(req).await {
                    Ok(r) => r.into_response(),
                    Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
                }
            }
        });
        let listener = Counting {
            tcp,
            connections: connections.clone(),
        };
        let (ca, task) = if tls {
            let (cert, config) = tls_config();
            let listener = CountingTls {
                inner: listener,
                acceptor: tokio_rustls::TlsAcceptor::from(config),
            };
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            (Some(cert), task)
        } else {
            let task = tokio::spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            (None, task)
        };
        Listening {
            addr,
            ca,
            connections,
            session,
            task,
        }
    }
}
