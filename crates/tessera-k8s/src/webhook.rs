//! The admission webhook (HTTPS, axum + rustls).
//!
//! * A pod whose GPU request does not parse is denied with the parser's message.
//! * A pod may not write `tessera.io/allocation` itself: creating a pod with it,
//!   or changing it on update, is denied unless the request comes from one of
//!   the scheduler's own identities.
//! * Optionally, GPU pods that left `schedulerName` at the default get ours
//!   (standalone mode).
//!
//! [`router`] takes the state and no socket; [`serve`] adds TLS.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_core::allocation::ANNOTATION;
use tessera_core::model::Catalog;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use crate::convert;

/// What the webhook enforces.
#[derive(Debug, Clone, Default)]
pub struct WebhookConfig {
    /// Set `spec.schedulerName` to this on GPU pods that use the default scheduler.
    pub scheduler_name: Option<String>,
    /// Users allowed to change the allocation annotation (the scheduler's service account).
    pub allocation_writers: Vec<String>,
    /// GPU models known to the parser (built-ins by default).
    pub catalog: Catalog,
}

/// `admission.k8s.io/v1` `AdmissionReview`, the parts we read and write.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    #[serde(default)]
    pub api_version: String,
    #[serde(default)]
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<AdmissionRequest>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response: Option<AdmissionResponse>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    #[serde(default)]
    pub operation: String,
    #[serde(default)]
    pub user_info: UserInfo,
    #[serde(default)]
    pub object: Option<Value>,
    #[serde(default)]
    pub old_object: Option<Value>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UserInfo {
    #[serde(default)]
    pub username: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<String>,
    /// Base64 of a JSON Patch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

impl AdmissionResponse {
    fn deny(uid: &str, message: String) -> AdmissionResponse {
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: false,
            status: Some(json!({"code": 403, "reason": "Forbidden", "message": message})),
            ..AdmissionResponse::default()
        }
    }
    fn allow(uid: &str) -> AdmissionResponse {
        AdmissionResponse {
            uid: uid.to_string(),
            allowed: true,
            ..AdmissionResponse::default()
        }
    }
}

fn allocation_of(pod: &Pod) -> Option<&str> {
    pod.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION))
        .map(String::as_str)
}

/// The verdict on one admission request.
pub fn review(config: &WebhookConfig, req: &AdmissionRequest) -> AdmissionResponse {
    let uid = req.uid.as_str();
    let Some(object) = &req.object else {
        return AdmissionResponse::allow(uid);
    };
    let pod: Pod = match serde_json::from_value(object.clone()) {
        Ok(p) => p,
        Err(e) => {
            return AdmissionResponse::deny(
                uid,
                format!("Tessera: the object is not a valid Pod: {e}"),
            );
        }
    };
    let old: Option<Pod> = req
        .old_object
        .as_ref()
        .and_then(|o| serde_json::from_value(o.clone()).ok());
    let trusted = config.allocation_writers.contains(&req.user_info.username);
    let new_alloc = allocation_of(&pod);
    let old_alloc = old.as_ref().and_then(allocation_of);
    if new_alloc.is_some() && new_alloc != old_alloc && !trusted {
        return AdmissionResponse::deny(
            uid,
            format!(
                "Tessera: pod {} may not set the {ANNOTATION} annotation; only the Tessera scheduler writes it",
                convert::pod_key(&pod)
            ),
        );
    }
    if req.operation != "CREATE" || !convert::wants_gpu(&pod) {
        return AdmissionResponse::allow(uid);
    }
    if let Err(e) = convert::pod_request(&pod, &config.catalog) {
        return AdmissionResponse::deny(
            uid,
            format!(
                "Tessera: invalid GPU request in pod {}: {e}",
                convert::pod_key(&pod)
            ),
        );
    }
    let mut resp = AdmissionResponse::allow(uid);
    if let Some(name) = &config.scheduler_name
        && convert::scheduler_name(&pod) == "default-scheduler"
    {
        let patch = json!([{"op": "add", "path": "/spec/schedulerName", "value": name}]);
        resp.patch_type = Some("JSONPatch".into());
        resp.patch = Some(base64::engine::general_purpose::STANDARD.encode(patch.to_string()));
    }
    resp
}

/// The webhook's routes: `POST /validate` (and `/mutate`, the same handler), `GET /healthz`.
pub fn router(config: Arc<WebhookConfig>) -> Router {
    Router::new()
        .route("/validate", post(handle))
        .route("/mutate", post(handle))
        .route("/healthz", get(|| async { "ok" }))
        .with_state(config)
}

async fn handle(State(config): State<Arc<WebhookConfig>>, body: Bytes) -> Response {
    let review_in: AdmissionReview = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("not an AdmissionReview: {e}\n"),
            )
                .into_response();
        }
    };
    let Some(req) = review_in.request else {
        return (StatusCode::BAD_REQUEST, "AdmissionReview has no request\n").into_response();
    };
    let response = review(&config, &req);
    if !response.allowed {
        tracing::info!(uid = %req.uid, message = ?response.status, "admission denied");
    }
    let out = AdmissionReview {
        api_version: if review_in.api_version.is_empty() {
            "admission.k8s.io/v1".into()
        } else {
            review_in.api_version
        },
        kind: "AdmissionReview".into(),
        request: None,
        response: Some(response),
    };
    axum::Json(out).into_response()
}

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

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(resources: Value, annotations: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml", "annotations": annotations},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": resources}}]}
        })
    }

    fn request(op: &str, object: Value, old: Option<Value>, user: &str) -> AdmissionRequest {
        AdmissionRequest {
            uid: "req-1".into(),
            operation: op.into(),
            user_info: UserInfo {
                username: user.into(),
            },
            object: Some(object),
            old_object: old,
        }
    }

    fn config() -> WebhookConfig {
        WebhookConfig {
            scheduler_name: None,
            allocation_writers: vec![
                "system:serviceaccount:tessera-system:tessera-scheduler".into(),
            ],
            catalog: Catalog::default(),
        }
    }

    fn message(r: &AdmissionResponse) -> String {
        r.status.as_ref().unwrap()["message"]
            .as_str()
            .unwrap()
            .to_string()
    }

    #[test]
    fn malformed_requests_are_denied_with_the_parser_message() {
        let c = config();
        let cases = [
            (json!({"tessera.io/gpu": "one"}), "tessera.io/gpu"),
            (
                json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory": "-1Gi"}),
                "tessera.io/gpu-memory",
            ),
            (
                json!({"tessera.io/mig-5g.99gb": "1"}),
                "unknown MIG profile",
            ),
            (
                json!({"tessera.io/gpu": "1", "tessera.io/gpu-cores": "150"}),
                "between 1 and 100",
            ),
        ];
        for (res, want) in cases {
            let r = review(
                &c,
                &request("CREATE", pod(res.clone(), json!({})), None, "alice"),
            );
            assert!(!r.allowed, "{res}");
            let m = message(&r);
            assert!(m.contains(want) && m.contains("ml/p"), "{res}: {m}");
        }
        let ok = review(
            &c,
            &request(
                "CREATE",
                pod(json!({"tessera.io/gpu": "1"}), json!({})),
                None,
                "alice",
            ),
        );
        assert!(ok.allowed);
        assert!(ok.patch.is_none());
    }

    #[test]
    fn only_the_scheduler_may_write_the_allocation() {
        let c = config();
        let with = pod(json!({}), json!({ANNOTATION: "{\"forged\":true}"}));
        let without = pod(json!({}), json!({}));
        let r = review(&c, &request("CREATE", with.clone(), None, "alice"));
        assert!(!r.allowed);
        assert!(message(&r).contains("may not set the tessera.io/allocation"));
        let r = review(
            &c,
            &request("UPDATE", with.clone(), Some(without.clone()), "alice"),
        );
        assert!(!r.allowed);
        let r = review(
            &c,
            &request(
                "UPDATE",
                with.clone(),
                Some(without),
                "system:serviceaccount:tessera-system:tessera-scheduler",
            ),
        );
        assert!(r.allowed);
        // An update that leaves the scheduler's annotation alone (e.g. a label change) passes.
        let r = review(&c, &request("UPDATE", with.clone(), Some(with), "alice"));
        assert!(r.allowed);
    }

    #[test]
    fn scheduler_name_is_set_on_gpu_pods_when_asked() {
        let mut c = config();
        c.scheduler_name = Some("tessera".into());
        let r = review(
            &c,
            &request(
                "CREATE",
                pod(json!({"tessera.io/gpu": "1"}), json!({})),
                None,
                "alice",
            ),
        );
        assert!(r.allowed);
        assert_eq!(r.patch_type.as_deref(), Some("JSONPatch"));
        let patch = base64::engine::general_purpose::STANDARD
            .decode(r.patch.unwrap())
            .unwrap();
        let patch: Value = serde_json::from_slice(&patch).unwrap();
        assert_eq!(
            patch,
            json!([{"op": "add", "path": "/spec/schedulerName", "value": "tessera"}])
        );
        // CPU-only pods are left alone.
        let r = review(
            &c,
            &request("CREATE", pod(json!({"cpu": "1"}), json!({})), None, "alice"),
        );
        assert!(r.patch.is_none());
    }

    #[tokio::test]
    async fn router_answers_an_admission_review() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let body = json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "abc", "operation": "CREATE", "userInfo": {"username": "bob"},
                        "object": pod(json!({"tessera.io/gpu-memory": "0"}), json!({}))}
        });
        let req = http::Request::post("/validate")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .unwrap();
        let resp = router(Arc::new(config())).oneshot(req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["response"]["uid"], "abc");
        assert_eq!(v["response"]["allowed"], false);
        assert!(
            v["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("tessera.io/gpu-memory")
        );
        let bad = http::Request::post("/validate")
            .body(axum::body::Body::from("[]"))
            .unwrap();
        let resp = router(Arc::new(config())).oneshot(bad).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    }
}
