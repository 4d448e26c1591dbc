//! A Service over several Tessera replicas, as kube-proxy makes one: a TCP
//! address whose each new connection goes to one of the endpoints that were
//! Ready at the last readiness probe, round robin. Connections are forwarded
//! byte for byte (kube-scheduler's keep-alive connection stays on one
//! replica, as it does through kube-proxy's iptables rules); one whose
//! replica dies is closed. The probe is the chart's readiness probe (`GET
//! /readyz` on the metrics port) every [`PROBE_EVERY`]; a dead process is
//! taken out at its first failed probe (the kubelet sees a container exit at
//! once), and a connection that reaches it before that is refused, as
//! kube-proxy's rules would leave it.
//!
//! It runs on a thread of its own with its own runtime, so that the test's
//! blocking calls (kubectl, curl) never stall it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Result;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How often each endpoint's `/readyz` is probed (the chart probes every 2 s;
/// the kubelet's own view of a dead container is quicker).
pub const PROBE_EVERY: Duration = Duration::from_millis(500);

/// One endpoint: where its extender port is and where its probe answers.
#[derive(Debug, Clone, Copy)]
pub struct Endpoint {
    pub serve: SocketAddr,
    pub probe: SocketAddr,
}

/// The Service's address and its view of the endpoints; stops with its drop.
pub struct Service {
    pub addr: SocketAddr,
    ready: Arc<Mutex<Vec<bool>>>,
    connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
}

impl Service {
    /// Listens on a free loopback port and forwards to `endpoints`.
    pub fn start(endpoints: Vec<Endpoint>) -> Result<Service> {
        let std_listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        std_listener.set_nonblocking(true)?;
        let addr = std_listener.local_addr()?;
        let ready = Arc::new(Mutex::new(vec![false; endpoints.len()]));
        let connections = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (r, c, s) = (ready.clone(), connections.clone(), stop.clone());
        std::thread::Builder::new()
            .name("e2e-service".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .expect("a runtime for the Service");
                rt.block_on(serve(std_listener, endpoints, r, c, s));
            })?;
        Ok(Service {
            addr,
            ready,
            connections,
            stop,
        })
    }

    /// Which endpoints were Ready at the last probe.
    pub fn ready(&self) -> Vec<bool> {
        self.ready.lock().unwrap().clone()
    }

    /// Connections forwarded so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

async fn serve(
    listener: std::net::TcpListener,
    endpoints: Vec<Endpoint>,
    ready: Arc<Mutex<Vec<bool>>>,
    connections: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) {
    let listener = TcpListener::from_std(listener).expect("a tokio listener");
    let probes = endpoints.clone();
    let (pr, ps) = (ready.clone(), stop.clone());
    tokio::spawn(async move {
        while !ps.load(Ordering::Relaxed) {
            for (i, e) in probes.iter().enumerate() {
                let ok = probe(e.probe).await;
                pr.lock().unwrap()[i] = ok;
            }
            tokio::time::sleep(PROBE_EVERY).await;
        }
    });
    let mut next = 0usize;
    while !stop.load(Ordering::Relaxed) {
        let accepted = tokio::time::timeout(Duration::from_millis(200), listener.accept()).await;
        let Ok(Ok((mut client, _))) = accepted else {
            continue;
        };
        let up: Vec<usize> = {
            let r = ready.lock().unwrap();
            (0..r.len()).filter(|&i| r[i]).collect()
        };
        if up.is_empty() {
            // No endpoints: kube-proxy rejects the connection.
            drop(client);
            continue;
        }
        let target = endpoints[up[next % up.len()]].serve;
        next = next.wrapping_add(1);
        connections.fetch_add(1, Ordering::Relaxed);
        tokio::spawn(async move {
            match TcpStream::connect(target).await {
                Ok(mut backend) => {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut backend).await;
                }
                Err(_) => drop(client),
            }
        });
    }
}

/// `GET /readyz` answered 200 within a second.
async fn probe(addr: SocketAddr) -> bool {
    let attempt = async {
        let mut s = TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .ok()?;
        let mut buf = [0u8; 16];
        let n = s.read(&mut buf).await.ok()?;
        let line = std::str::from_utf8(&buf[..n]).ok()?;
        Some(line.starts_with("HTTP/1.1 200") || line.starts_with("HTTP/1.0 200"))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(1), attempt).await,
        Ok(Some(true))
    )
}
