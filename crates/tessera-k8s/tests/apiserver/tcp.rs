//! The double over TCP, for clients that should use their real connection
//! stack (kube-rs's hyper pool) rather than the in-process service: every
//! request runs on one session, exactly as [`ApiService`] serves it, and the
//! listener counts the TCP connections clients open.

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
    /// TCP connections accepted so far.
    pub connections: Arc<AtomicU64>,
    pub session: Session,
    task: JoinHandle<()>,
}

impl Listening {
    /// A kube client that reaches the double over TCP (plain HTTP), built as
    /// `kube::Client::try_default` builds one.
    pub fn client(&self) -> kube::Client {
        let url = format!("http://{}", self.addr)
            .parse()
            .expect("a loopback URL");
        kube::Client::try_from(kube::Config::new(url)).expect("a kube client")
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

impl ApiServer {
    /// Serves the double on 127.0.0.1 (a free port) until the handle drops.
    pub async fn listen(&self) -> Listening {
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
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Listening {
            addr,
            connections,
            session,
            task,
        }
    }
}
