//! One Tessera scheduler "process" in the test: `tessera_k8s::run::run` on its
//! own OS thread and tokio runtime, with its own kube client (a [`Session`] of
//! the double). Killing it drops the runtime and every task in it at once,
//! so all in-memory state is lost as with `kill -9`; the double's session is
//! dead from that instant, so nothing it had in flight lands afterwards.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use tessera_k8s::run::Config;
use tokio::sync::oneshot;

use super::{ApiServer, Fault, Session};

/// A loopback address free right now (the scheduler binds it a moment
/// later). Ports come from one counter per test process, so concurrent runs
/// in it never pick the same one; a port another program takes meanwhile
/// makes `run` fail with a bind error, which [`Process::kill`] returns.
pub fn free_addr() -> SocketAddr {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20_000 + (std::process::id() % 20_000) as u16;
    loop {
        let port = base.wrapping_add(NEXT.fetch_add(1, Ordering::Relaxed) % 20_000);
        if let Ok(l) = std::net::TcpListener::bind(("127.0.0.1", port)) {
            return l.local_addr().expect("bound address");
        }
    }
}

/// A running scheduler process.
pub struct Process {
    pub session: Session,
    /// Where its HTTP surface (extender, health) listens.
    pub addr: SocketAddr,
    /// Where its ops surface (health, metrics, forwarded binds) listens.
    pub ops_addr: SocketAddr,
    kill: Option<oneshot::Sender<()>>,
    graceful: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<Result<(), String>>>,
}

impl Process {
    /// Starts a scheduler with `config` (its `listen` and `metrics_listen`
    /// replaced by free ports where they name port 0) whose session faults as
    /// `faults` say.
    pub fn start(server: &ApiServer, mut config: Config, faults: &[(u64, Fault)]) -> Process {
        if config.listen.port() == 0 {
            config.listen = free_addr();
        }
        if config.metrics_listen.port() == 0 {
            config.metrics_listen = free_addr();
        }
        let addr = config.listen;
        let ops_addr = config.metrics_listen;
        let (session_tx, session_rx) = std::sync::mpsc::channel();
        let (kill_tx, kill_rx) = oneshot::channel::<()>();
        let (graceful_tx, graceful_rx) = oneshot::channel::<()>();
        let server = server.clone();
        let faults = faults.to_vec();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            let out = rt.block_on(async move {
                // The client's request buffer is a task of this runtime.
                let (client, session) = server.client();
                for (n, f) in faults {
                    session.fault(n, f);
                }
                let _ = session_tx.send(session.clone());
                let shutdown = async move {
                    let _ = graceful_rx.await;
                };
                tokio::select! {
                    r = tessera_k8s::run::run(config, client, shutdown) => r.map_err(|e| e.to_string()),
                    _ = session.died() => Ok(()),
                    _ = kill_rx => {
                        session.kill();
                        Ok(())
                    }
                }
            });
            rt.shutdown_background();
            out
        });
        let session = session_rx.recv().expect("the process thread started");
        Process {
            session,
            addr,
            ops_addr,
            kill: Some(kill_tx),
            graceful: Some(graceful_tx),
            thread: Some(thread),
        }
    }

    /// Kills the process (if it has not died already) and waits until its runtime is gone.
    pub fn kill(mut self) -> Result<(), String> {
        self.stop_now()
    }

    fn stop_now(&mut self) -> Result<(), String> {
        if let Some(k) = self.kill.take() {
            let _ = k.send(());
        }
        match self.thread.take() {
            Some(t) => t
                .join()
                .map_err(|_| "the scheduler thread panicked".to_string())?,
            None => Ok(()),
        }
    }

    /// Resolves `run`'s shutdown future (SIGTERM) and waits up to `limit` for it to return.
    pub async fn stop_gracefully(mut self, limit: Duration) -> Result<(), String> {
        if let Some(g) = self.graceful.take() {
            let _ = g.send(());
        }
        let deadline = tokio::time::Instant::now() + limit;
        while self.thread.as_ref().is_some_and(|t| !t.is_finished()) {
            if tokio::time::Instant::now() > deadline {
                return Err("run did not return after its shutdown future resolved".into());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        self.stop_now()
    }

    /// Whether the process ended by itself (`run` returned or the thread failed).
    pub fn exited(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.stop_now();
    }
}
