//! The admission webhook (HTTPS, axum + rustls).
//!
//! Two webhooks share one server:
//!
//! * `/validate` (pod CREATE and UPDATE, never patches):
//!   * nobody but the scheduler's own identities may add, change or remove
//!     `tessera.io/allocation`: the annotation is the record of which GPUs a pod
//!     holds, and a Tessera restarted after a user removed it would hand that
//!     GPU out again;
//!   * a pod Tessera places whose GPU request does not parse is denied with the
//!     parser's message;
//!   * no pod may ask the container runtime for NVIDIA or Tessera devices in a
//!     `cdi.k8s.io/*` annotation (with CDI on, `nvidia.com/gpu=all` there reaches
//!     every GPU of the node, whoever scheduled the pod);
//!   * a pod Tessera places — it claims Tessera, or carries a `schedulerName`
//!     Tessera serves, `--serve-scheduler-name` included — may not choose its own
//!     devices ([`device_access`]: `NVIDIA_VISIBLE_DEVICES`, `CUDA_MPS_*`, … in
//!     `env` or through `envFrom`).
//! * `/mutate` (pod CREATE): pods that claim Tessera — a
//!   `tessera.io/*` resource, or a stock `nvidia.com/*` GPU resource with a
//!   Tessera request annotation or the label `tessera.io/schedule: "true"` —
//!   and left `schedulerName` at the default get ours. Plain stock GPU pods are
//!   left to the default scheduler and the stock device plugin, so a mixed
//!   cluster keeps working. `/mutate/all-gpu-pods` takes every GPU pod, stock
//!   resources too: the chart points a second webhook entry there whose
//!   `namespaceSelector` picks the namespaces that opted in as a whole. Those
//!   pods, and the ones that claim Tessera under a name it serves already, also
//!   get the configured tolerations ([`toleration`]) for the taint that keeps stock
//!   pods off Tessera's nodes.
//!
//! [`answer`] turns a request body into the reply without a socket; [`router`]
//! serves it over HTTP and [`serve`] adds TLS.

mod admit;
pub mod claims;
pub mod device_access;
mod tls;
pub mod toleration;

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tessera_core::model::Catalog;

pub use crate::tls::{TlsError, TlsListener};
pub use admit::{SCHEDULE_LABEL, claims_tessera, mutate, mutate_routed, validate};
pub use claims::ClaimRoute;
pub use tls::{serve, serve_on, tls_config};

/// What the webhook enforces.
#[derive(Debug, Clone, Default)]
pub struct WebhookConfig {
    /// Pods that carry this `schedulerName` are Tessera's to check.
    pub scheduler_name: Option<String>,
    /// More `schedulerName`s whose pods Tessera places (`--serve-scheduler-name`):
    /// checked like [`WebhookConfig::scheduler_name`]'s, never set on a pod.
    pub served_scheduler_names: Vec<String>,
    /// Whether `/mutate` sets `scheduler_name` on pods that claim Tessera and
    /// use the default scheduler.
    pub set_scheduler_name: bool,
    /// Users allowed to change the allocation annotation (the scheduler's service account).
    pub allocation_writers: Vec<String>,
    /// GPU models known to the parser (built-ins by default).
    pub catalog: Catalog,
    /// Taints `/mutate` makes the pods it hands to Tessera tolerate
    /// (`--pod-toleration`; [`toleration`]).
    pub tolerated_taints: Vec<k8s_openapi::api::core::v1::Taint>,
    /// With Tessera allocating claims (`--dra`): reads the claims, templates and
    /// classes a default-scheduler pod names, and `/mutate` gives it our
    /// `schedulerName` when one asks a class Tessera allocates ([`claims`]).
    /// None: claims are not looked at.
    pub claims_client: Option<ClaimsClient>,
}

/// The API client [`claims`] reads through.
#[derive(Clone)]
pub struct ClaimsClient(pub kube::Client);

impl std::fmt::Debug for ClaimsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClaimsClient")
    }
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
    /// The object's namespace (a pod created by a controller may not carry it).
    #[serde(default)]
    pub namespace: String,
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
    /// The denial's message, if this is a denial that carries one.
    pub fn message(&self) -> Option<&str> {
        self.status.as_ref()?.get("message")?.as_str()
    }
}

/// Which webhook a review was sent to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    /// `/validate`: allow or deny, never patch.
    Validate,
    /// `/mutate`: our schedulerName for pods that claim Tessera.
    Mutate,
    /// `/mutate/all-gpu-pods`: our schedulerName for every GPU pod, stock
    /// resources too (a webhook entry whose `namespaceSelector` picks the
    /// namespaces that opted in).
    MutateAllGpuPods,
}

/// A request body the webhook cannot answer at all (HTTP 400).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("not an AdmissionReview: {0}")]
    Malformed(#[from] serde_json::Error),
    #[error("AdmissionReview has no request")]
    NoRequest,
}

/// The reply to one AdmissionReview body, without looking up claims.
pub fn answer(
    config: &WebhookConfig,
    hook: Hook,
    body: &[u8],
) -> Result<AdmissionReview, ReviewError> {
    let (api_version, req) = parse(body)?;
    Ok(reply(
        config,
        hook,
        api_version,
        &req,
        &ClaimRoute::NotAsked,
    ))
}

/// The reply to one AdmissionReview body, the claims of its pod looked up
/// where that decides who places it ([`claims`]).
pub async fn answer_async(
    config: &WebhookConfig,
    hook: Hook,
    body: &[u8],
) -> Result<AdmissionReview, ReviewError> {
    let (api_version, req) = parse(body)?;
    let route = match hook {
        Hook::Validate => ClaimRoute::NotAsked,
        Hook::Mutate | Hook::MutateAllGpuPods => claim_route(config, &req).await,
    };
    Ok(reply(config, hook, api_version, &req, &route))
}

/// The review's `apiVersion` and its request.
fn parse(body: &[u8]) -> Result<(String, AdmissionRequest), ReviewError> {
    let review: AdmissionReview = serde_json::from_slice(body)?;
    let req = review.request.ok_or(ReviewError::NoRequest)?;
    Ok((review.api_version, req))
}

/// Whether the pod of a CREATE review for the default scheduler asks one of
/// Tessera's device classes in its claims.
async fn claim_route(config: &WebhookConfig, req: &AdmissionRequest) -> ClaimRoute {
    let Some(client) = &config.claims_client else {
        return ClaimRoute::NotAsked;
    };
    if req.operation != "CREATE" || !config.set_scheduler_name {
        return ClaimRoute::NotAsked;
    }
    let Some(mut pod) = req
        .object
        .as_ref()
        .and_then(|o| serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(o.clone()).ok())
    else {
        return ClaimRoute::NotAsked;
    };
    if !admit::uses_default_scheduler(&pod) {
        return ClaimRoute::NotAsked;
    }
    if pod.metadata.namespace.as_deref().is_none_or(str::is_empty) {
        pod.metadata.namespace = Some(req.namespace.clone());
    }
    claims::route(&client.0, &pod).await
}

fn reply(
    config: &WebhookConfig,
    hook: Hook,
    api_version: String,
    req: &AdmissionRequest,
    route: &ClaimRoute,
) -> AdmissionReview {
    let response = match hook {
        Hook::Validate => validate(config, req),
        Hook::Mutate => mutate_routed(config, req, false, route),
        Hook::MutateAllGpuPods => mutate_routed(config, req, true, route),
    };
    if !response.allowed {
        tracing::info!(uid = %req.uid, message = response.message().unwrap_or(""), "admission denied");
    }
    AdmissionReview {
        api_version: if api_version.is_empty() {
            "admission.k8s.io/v1".into()
        } else {
            api_version
        },
        kind: "AdmissionReview".into(),
        request: None,
        response: Some(response),
    }
}

/// The webhook's routes: `POST /validate`, `POST /mutate`, `POST /mutate/all-gpu-pods`, `GET /healthz`.
pub fn router(config: Arc<WebhookConfig>) -> Router {
    Router::new()
        .route(
            "/validate",
            post(|s: State<Arc<WebhookConfig>>, b: Bytes| handle(s, Hook::Validate, b)),
        )
        .route(
            "/mutate",
            post(|s: State<Arc<WebhookConfig>>, b: Bytes| handle(s, Hook::Mutate, b)),
        )
        .route(
            "/mutate/all-gpu-pods",
            post(|s: State<Arc<WebhookConfig>>, b: Bytes| handle(s, Hook::MutateAllGpuPods, b)),
        )
        .route("/healthz", get(|| async { "ok" }))
        .with_state(config)
}

async fn handle(State(config): State<Arc<WebhookConfig>>, hook: Hook, body: Bytes) -> Response {
    match answer_async(&config, hook, &body).await {
        Ok(review) => axum::Json(review).into_response(),
        Err(e) => (StatusCode::BAD_REQUEST, format!("{e}\n")).into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn pod(resources: Value) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": resources}}]}
        })
    }

    async fn post(path: &str, body: String) -> (StatusCode, Value) {
        let req = http::Request::post(path)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body))
            .unwrap();
        let config = WebhookConfig {
            scheduler_name: Some("tessera".into()),
            set_scheduler_name: true,
            ..WebhookConfig::default()
        };
        let resp = router(Arc::new(config)).oneshot(req).await.unwrap();
        let status = resp.status();
        let bytes = resp.into_body().collect().await.unwrap().to_bytes();
        let v = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into()));
        (status, v)
    }

    fn review_of(object: Value) -> String {
        json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "abc", "operation": "CREATE", "userInfo": {"username": "bob"},
                        "object": object}
        })
        .to_string()
    }

    #[tokio::test]
    async fn router_answers_an_admission_review() {
        let (status, v) = post(
            "/validate",
            review_of(pod(json!({"tessera.io/gpu-memory": "0"}))),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["kind"], "AdmissionReview");
        assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(v["response"]["uid"], "abc");
        assert_eq!(v["response"]["allowed"], false);
        assert!(
            v["response"]["status"]["message"]
                .as_str()
                .unwrap()
                .contains("tessera.io/gpu-memory")
        );
        let (status, v) = post("/validate", r#"{"request": 7}"#.into()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(
            v.as_str().unwrap().starts_with("not an AdmissionReview"),
            "{v}"
        );
        let (status, v) = post("/validate", json!({"kind": "AdmissionReview"}).to_string()).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert!(v.as_str().unwrap().contains("has no request"), "{v}");
    }

    /// Each path reaches its own hook: only the mutating ones patch, and only
    /// the namespace-wide one takes a plain stock GPU pod.
    #[tokio::test]
    async fn each_path_is_its_own_hook() {
        let ours = review_of(pod(json!({"tessera.io/gpu": "1"})));
        let stock = review_of(pod(json!({"nvidia.com/gpu": "1"})));
        let patched = |v: &Value| v["response"]["patch"].is_string();
        let cases = [
            ("/validate", &ours, false),
            ("/mutate", &ours, true),
            ("/mutate/all-gpu-pods", &ours, true),
            ("/validate", &stock, false),
            ("/mutate", &stock, false),
            ("/mutate/all-gpu-pods", &stock, true),
        ];
        for (path, body, want) in cases {
            let (status, v) = post(path, body.clone()).await;
            assert_eq!(status, StatusCode::OK, "{path}: {v}");
            assert_eq!(v["response"]["allowed"], true, "{path}: {v}");
            assert_eq!(patched(&v), want, "{path} {body}: {v}");
        }
    }
}
