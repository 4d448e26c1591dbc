//! Before the agent can serve: a GPU backend that does not start (NVML cannot
//! be loaded: the driver is not installed yet, the container lacks the
//! library, the driver is being upgraded) is retried, and the agent says so,
//! instead of running Ready with no GPUs. While it waits, its metrics port
//! answers `/healthz` 200 (the process is alive: no restart loop) and
//! `/readyz` 503 with the reason, so `kubectl get pods` shows the agent not
//! Ready and `kubectl describe` shows why.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;

use crate::backend::BackendError;

/// How a backend that does not start is retried: the pause doubles from
/// `first` to `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub first: Duration,
    pub max: Duration,
}

impl Default for Retry {
    /// 5 s doubling to 60 s: a driver container that installs the driver
    /// takes minutes; a minute's delay after it is done is acceptable.
    fn default() -> Self {
        Retry {
            first: Duration::from_secs(5),
            max: Duration::from_secs(60),
        }
    }
}

/// Why the agent cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    #[error(
        "cannot listen for /healthz and /readyz on {addr} while the backend is retried: {source}"
    )]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// Calls `init` (on a blocking thread) until it succeeds, pausing as `retry`
/// says and logging each failure with the next try's time. Meanwhile
/// `probe_addr` (the agent's metrics address) serves `/healthz` 200 and
/// `/readyz` 503 naming the failure; it is closed again before this returns,
/// so the agent's own server can take the port. `Ok(None)` when `shutdown`
/// resolves first.
pub async fn wait_for_backend<B, F>(
    what: &'static str,
    init: F,
    probe_addr: Option<SocketAddr>,
    retry: Retry,
    shutdown: impl Future<Output = ()>,
) -> Result<Option<B>, StartupError>
where
    B: Send + 'static,
    F: Fn() -> Result<B, BackendError> + Send + Sync + 'static,
{
    let init = Arc::new(init);
    let attempt = |init: Arc<F>| async move {
        tokio::task::spawn_blocking(move || init())
            .await
            .unwrap_or_else(|e| {
                Err(BackendError::NvmlUnavailable(format!(
                    "the {what} start panicked: {e}"
                )))
            })
    };
    let first = match attempt(init.clone()).await {
        Ok(b) => return Ok(Some(b)),
        Err(e) => e,
    };
    let reason = Arc::new(Mutex::new(String::new()));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = match probe_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| StartupError::Listen { addr, source })?;
            let app = probe_router(reason.clone());
            Some(tokio::spawn(async move {
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stop_rx.await;
                    })
                    .await;
            }))
        }
        None => None,
    };
    let mut error = first;
    let mut pause = retry.first;
    let mut tries = 1u32;
    tokio::pin!(shutdown);
    let outcome = loop {
        let text = format!(
            "backend {what}: {error}; serving no GPUs and not Ready; try {tries} failed, next in {} s",
            pause.as_secs_f64()
        );
        tracing::warn!("{text}");
        *reason.lock().unwrap_or_else(|p| p.into_inner()) = text;
        tokio::select! {
            _ = &mut shutdown => break None,
            _ = tokio::time::sleep(pause) => {}
        }
        tries += 1;
        match attempt(init.clone()).await {
            Ok(b) => {
                tracing::info!(tries, "backend {what} started");
                break Some(b);
            }
            Err(e) => error = e,
        }
        pause = (pause * 2).min(retry.max);
    };
    let _ = stop_tx.send(());
    if let Some(s) = server {
        let _ = s.await;
    }
    Ok(outcome)
}

fn probe_router(reason: Arc<Mutex<String>>) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(move || {
                let text = reason.lock().unwrap_or_else(|p| p.into_inner()).clone();
                async move { (StatusCode::SERVICE_UNAVAILABLE, format!("{text}\n")) }
            }),
        )
        // A scrape that succeeds (Prometheus's `up` stays 1) with no GPU series:
        // the chart's TesseraAgentWithoutGpus alert fires for such an agent.
        .route(
            "/metrics",
            get(|| async {
                (
                    [(
                        "content-type",
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    "# HELP tessera_agent_backend_up Whether the agent's GPU backend has started (0 while it is retried).\n\
                     # TYPE tessera_agent_backend_up gauge\n\
                     tessera_agent_backend_up 0\n\
                     # EOF\n",
                )
            }),
        )
}
