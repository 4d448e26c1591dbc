//! Issue 41, defect 2: a `default-scheduler` pod whose ResourceClaims ask
//! Tessera's device classes is allocated by kube-scheduler's DRA plugin while
//! Tessera `--dra` allocates the same devices. With `--dra`, `/mutate` reads the
//! claims, templates and classes the pod names (a kube client over a mock API
//! answering GETs as the API server does: the object, or a 404 Status) and
//! hands such a pod to Tessera; one whose claim cannot be read is denied.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine as _;
use http::{Request, Response};
use kube::client::Body;
use serde_json::{Value, json};
use tessera_k8s::webhook::{ClaimsClient, Hook, WebhookConfig, answer, answer_async};

/// A client whose API answers GETs from `objects` (path → object), 404 otherwise.
fn client(objects: BTreeMap<String, Value>) -> kube::Client {
    let (service, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let path = req.uri().path().to_string();
            let (code, body) = match objects.get(&path) {
                Some(o) => (200, o.clone()),
                None => (
                    404,
                    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                           "message": format!("{path} not found"), "reason": "NotFound", "code": 404}),
                ),
            };
            send.send_response(
                Response::builder()
                    .status(code)
                    .header("content-type", "application/json")
                    .body(Body::from(serde_json::to_vec(&body).unwrap()))
                    .unwrap(),
            );
        }
    });
    kube::Client::new(service, "default")
}

fn template(name: &str, class: &str) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
           "metadata": {"name": name, "namespace": "ml"},
           "spec": {"spec": {"devices": {"requests": [
               {"name": "gpu", "exactly": {"deviceClassName": class}}]}}}})
}

fn objects() -> BTreeMap<String, Value> {
    let t = "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaimtemplates";
    let mut m = BTreeMap::new();
    m.insert(
        format!("{t}/tessera"),
        template("tessera", "gpu.tessera.io"),
    );
    m.insert(format!("{t}/nic"), template("nic", "nic.example.com"));
    m.insert(format!("{t}/custom"), template("custom", "my-gpus"));
    m.insert(
        "/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/mine".into(),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
               "metadata": {"name": "mine", "namespace": "ml"},
               "spec": {"devices": {"requests": [{"name": "g", "firstAvailable": [
                   {"name": "a", "deviceClassName": "nic.example.com"},
                   {"name": "b", "deviceClassName": "mig.tessera.io"}]}]}}}),
    );
    // A class of the user's own that selects Tessera's driver.
    m.insert(
        "/apis/resource.k8s.io/v1/deviceclasses/my-gpus".into(),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
               "metadata": {"name": "my-gpus"},
               "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.tessera.io'"}}]}}),
    );
    m.insert(
        "/apis/resource.k8s.io/v1/deviceclasses/nic.example.com".into(),
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
               "metadata": {"name": "nic.example.com"},
               "spec": {"selectors": [{"cel": {"expression": "device.driver == 'nic.example.com'"}}]}}),
    );
    m
}

fn review(claims: Value, scheduler: Option<&str>) -> Vec<u8> {
    let mut spec = json!({"containers": [{"name": "c", "image": "x"}], "resourceClaims": claims});
    if let Some(s) = scheduler {
        spec["schedulerName"] = json!(s);
    }
    // A pod of a controller carries no namespace: the request's says.
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
           "request": {"uid": "u1", "operation": "CREATE", "namespace": "ml",
                       "userInfo": {"username": "bob"},
                       "object": {"apiVersion": "v1", "kind": "Pod",
                                  "metadata": {"name": "p"}, "spec": spec}}})
    .to_string()
    .into_bytes()
}

fn config(with_client: bool) -> WebhookConfig {
    WebhookConfig {
        scheduler_name: Some("tessera".into()),
        set_scheduler_name: true,
        claims_client: with_client.then(|| ClaimsClient(client(objects()))),
        ..WebhookConfig::default()
    }
}

/// The JSON patch of an allowed answer, or the denial's message.
fn outcome(v: &tessera_k8s::webhook::AdmissionReview) -> Result<Value, String> {
    let r = v.response.as_ref().unwrap();
    if !r.allowed {
        return Err(r.message().unwrap_or_default().to_string());
    }
    Ok(r.patch.as_ref().map_or(Value::Null, |p| {
        serde_json::from_slice(&base64::engine::general_purpose::STANDARD.decode(p).unwrap())
            .unwrap()
    }))
}

fn scheduler_name_set() -> Value {
    json!([{"op": "add", "path": "/spec/schedulerName", "value": "tessera"}])
}

#[tokio::test]
async fn default_scheduler_pods_whose_claims_ask_tessera_classes_go_to_tessera() {
    let c = Arc::new(config(true));
    let ask = |claims: Value, scheduler: Option<&'static str>| {
        let c = c.clone();
        async move {
            outcome(
                &answer_async(&c, Hook::Mutate, &review(claims, scheduler))
                    .await
                    .unwrap(),
            )
        }
    };
    // From a template of the chart's class, of a class selecting our driver,
    // a claim whose firstAvailable alternative is ours: Tessera's.
    for claims in [
        json!([{"name": "g", "resourceClaimTemplateName": "tessera"}]),
        json!([{"name": "g", "resourceClaimTemplateName": "custom"}]),
        json!([{"name": "n", "resourceClaimTemplateName": "nic"}, {"name": "g", "resourceClaimName": "mine"}]),
    ] {
        assert_eq!(
            ask(claims.clone(), None).await,
            Ok(scheduler_name_set()),
            "{claims}"
        );
        assert_eq!(
            ask(claims.clone(), Some("default-scheduler")).await,
            Ok(scheduler_name_set()),
            "{claims}"
        );
    }
    // Another driver's claims only: left alone.
    assert_eq!(
        ask(
            json!([{"name": "n", "resourceClaimTemplateName": "nic"}]),
            None
        )
        .await,
        Ok(Value::Null)
    );
    // Another scheduler's pod is not looked at.
    assert_eq!(
        ask(
            json!([{"name": "g", "resourceClaimTemplateName": "missing"}]),
            Some("volcano")
        )
        .await,
        Ok(Value::Null)
    );
    // A claim that cannot be read: denied, naming it (never left to the other allocator).
    let err = ask(
        json!([{"name": "g", "resourceClaimTemplateName": "missing"}]),
        None,
    )
    .await
    .unwrap_err();
    assert!(
        err.contains("ResourceClaimTemplate missing not found in namespace ml"),
        "{err}"
    );
    // No claims: no lookups, nothing changes.
    assert_eq!(ask(json!([]), None).await, Ok(Value::Null));
}

/// Without `--dra` (no client) the claims are not looked at: the pod keeps
/// the default scheduler, as before.
#[tokio::test]
async fn without_dra_claims_are_not_looked_at() {
    let c = config(false);
    let body = review(
        json!([{"name": "g", "resourceClaimTemplateName": "tessera"}]),
        None,
    );
    assert_eq!(
        outcome(&answer_async(&c, Hook::Mutate, &body).await.unwrap()),
        Ok(Value::Null)
    );
    assert_eq!(
        outcome(&answer(&c, Hook::Mutate, &body).unwrap()),
        Ok(Value::Null)
    );
}
