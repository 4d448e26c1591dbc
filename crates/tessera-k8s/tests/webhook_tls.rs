//! The admission webhook end to end over HTTPS: a self-signed certificate made
//! at test time, `tls_config` + `serve_on` on 127.0.0.1:0, a real rustls client
//! that trusts only that certificate, and HTTP/1.1 from hyper's client.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use base64::Engine as _;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tessera_k8s::webhook::{TlsError, WebhookConfig, serve, serve_on, tls_config};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

const SCHEDULER_SA: &str = "system:serviceaccount:tessera-system:tessera-scheduler";
/// Bounds every network wait so a broken server fails the test instead of hanging it.
const LIMIT: Duration = Duration::from_secs(30);

/// A self-signed certificate for localhost / 127.0.0.1, written as PEM files.
struct Pki {
    dir: tempfile::TempDir,
    cert: PathBuf,
    key: PathBuf,
    cert_der: CertificateDer<'static>,
}

fn make_pki() -> Pki {
    let ck = rcgen::generate_simple_self_signed(vec!["localhost".into(), "127.0.0.1".into()])
        .expect("rcgen makes a certificate");
    let dir = tempfile::Builder::new()
        .prefix("tessera-webhook-tls-")
        .tempdir()
        .expect("temp dir");
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, ck.cert.pem()).expect("write cert");
    std::fs::write(&key, ck.signing_key.serialize_pem()).expect("write key");
    Pki {
        dir,
        cert,
        key,
        cert_der: ck.cert.der().clone(),
    }
}

struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), TlsError>>,
}

impl Server {
    /// Asks for a graceful shutdown and returns what `serve_on` returned.
    async fn shutdown(self) -> Result<(), TlsError> {
        let _ = self.stop.send(());
        tokio::time::timeout(LIMIT, self.task)
            .await
            .expect("the server stops after shutdown")
            .expect("server task did not panic")
    }
}

async fn start(pki: &Pki, config: WebhookConfig) -> Server {
    let tls = tls_config(&pki.cert, &pki.key).expect("tls_config accepts the generated PEM");
    let tcp = TcpListener::bind("127.0.0.1:0").await.expect("bind :0");
    let addr = tcp.local_addr().expect("local addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(serve_on(tcp, tls, Arc::new(config), async move {
        let _ = stopped.await;
    }));
    Server { addr, stop, task }
}

fn config() -> WebhookConfig {
    WebhookConfig {
        scheduler_name: Some("tessera".into()),
        set_scheduler_name: true,
        allocation_writers: vec![SCHEDULER_SA.into()],
        ..WebhookConfig::default()
    }
}

/// A rustls client (ring provider) whose only root is `root`.
fn connector(root: &CertificateDer<'static>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).expect("root certificate");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    TlsConnector::from(Arc::new(config))
}

/// One HTTP/1.1 request over a fresh TLS connection; any failure comes back as text.
async fn https(
    addr: SocketAddr,
    root: &CertificateDer<'static>,
    name: ServerName<'static>,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<(StatusCode, Bytes), String> {
    let exchange = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let tls = connector(root)
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        let conn = tokio::spawn(conn);
        let bytes = body.map(|b| b.to_string()).unwrap_or_default();
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(bytes)))
            .map_err(|e| format!("request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        drop(sender);
        let _ = conn.await;
        Ok((status, body))
    };
    tokio::time::timeout(LIMIT, exchange)
        .await
        .map_err(|_| format!("no answer from {addr} within {LIMIT:?}"))?
}

fn localhost() -> ServerName<'static> {
    ServerName::try_from("localhost").expect("server name")
}

/// POSTs an AdmissionReview for creating `pod` to /validate and returns the `response` part.
async fn admit(server: &Server, pki: &Pki, uid: &str, user: &str, pod: Value) -> Value {
    let request =
        json!({"uid": uid, "operation": "CREATE", "userInfo": {"username": user}, "object": pod});
    post_review(server, pki, "/validate", request).await
}

/// POSTs an AdmissionReview with `request` to `path` and returns the `response` part.
async fn post_review(server: &Server, pki: &Pki, path: &str, request: Value) -> Value {
    let uid = request["uid"].as_str().unwrap_or_default().to_string();
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request
    });
    let (status, body) = https(
        server.addr,
        &pki.cert_der,
        localhost(),
        "POST",
        path,
        Some(&review),
    )
    .await
    .unwrap_or_else(|e| panic!("admission request {uid}: {e}"));
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).expect("AdmissionReview JSON");
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], uid, "{v}");
    v["response"].clone()
}

fn pod(name: &str, requests: Value, annotations: Value) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml", "annotations": annotations},
        "spec": {"containers": [{"name": "c", "image": "x", "resources": {"requests": requests}}]}
    })
}

fn message(response: &Value) -> &str {
    response["status"]["message"]
        .as_str()
        .unwrap_or_else(|| panic!("a denial carries a message: {response}"))
}

#[tokio::test]
async fn admission_reviews_are_answered_over_https() {
    let pki = make_pki();
    let server = start(&pki, config()).await;

    // A malformed GPU request: denied with the parser's message naming the field and the pod.
    let r = admit(
        &server,
        &pki,
        "uid-bad",
        "alice",
        pod(
            "bad",
            json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory": "-4Gi"}),
            json!({}),
        ),
    )
    .await;
    assert_eq!(r["allowed"], false, "{r}");
    assert_eq!(r["status"]["code"], 403, "{r}");
    let m = message(&r);
    assert!(
        m.contains("tessera.io/gpu-memory") && m.contains("ml/bad"),
        "{m}"
    );

    // A pod that writes the allocation annotation itself: denied.
    let r = admit(
        &server,
        &pki,
        "uid-forged",
        "alice",
        pod(
            "forged",
            json!({"tessera.io/gpu": "1"}),
            json!({"tessera.io/allocation": "{\"gpus\":[0]}"}),
        ),
    )
    .await;
    assert_eq!(r["allowed"], false, "{r}");
    let m = message(&r);
    assert!(
        m.contains("may not set the tessera.io/allocation") && m.contains("ml/forged"),
        "{m}"
    );

    // The same annotation from the scheduler's own identity is allowed.
    let r = admit(
        &server,
        &pki,
        "uid-sched",
        SCHEDULER_SA,
        pod(
            "by-scheduler",
            json!({"tessera.io/gpu": "1"}),
            json!({"tessera.io/allocation": "{\"gpus\":[0]}"}),
        ),
    )
    .await;
    assert_eq!(r["allowed"], true, "{r}");

    // A good GPU pod: allowed by /validate (which never patches), and
    // (standalone mode) patched onto our scheduler by /mutate.
    let good = pod(
        "good",
        json!({"tessera.io/gpu": "1", "tessera.io/gpu-memory": "4Gi"}),
        json!({}),
    );
    let r = admit(&server, &pki, "uid-good", "alice", good.clone()).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r.get("status").is_none() && r.get("patch").is_none(), "{r}");
    let create = |uid: &str, object: &Value| json!({"uid": uid, "operation": "CREATE", "userInfo": {"username": "alice"}, "object": object});
    let r = post_review(&server, &pki, "/mutate", create("uid-mutate", &good)).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert_eq!(r["patchType"], "JSONPatch", "{r}");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(r["patch"].as_str().expect("patch"))
        .expect("base64 patch");
    let patch: Value = serde_json::from_slice(&patch).expect("JSON patch");
    assert_eq!(
        patch,
        json!([{"op": "add", "path": "/spec/schedulerName", "value": "tessera"}])
    );

    // A plain stock GPU pod stays with the default scheduler, unless its
    // namespace opted in (the webhook entry that posts to /mutate/all-gpu-pods).
    let stock = pod("stock", json!({"nvidia.com/gpu": "1"}), json!({}));
    let r = post_review(&server, &pki, "/mutate", create("uid-stock", &stock)).await;
    assert_eq!(r["allowed"], true, "{r}");
    assert!(r.get("patch").is_none(), "{r}");
    let r = post_review(
        &server,
        &pki,
        "/mutate/all-gpu-pods",
        create("uid-stock-ns", &stock),
    )
    .await;
    assert_eq!(r["patchType"], "JSONPatch", "{r}");

    // Removing the scheduler's annotation is refused as firmly as forging it.
    let granted = pod(
        "granted",
        json!({"tessera.io/gpu": "1"}),
        json!({"tessera.io/allocation": "{\"gpus\":[0]}"}),
    );
    let stripped = pod("granted", json!({"tessera.io/gpu": "1"}), json!({}));
    let r = post_review(
        &server,
        &pki,
        "/validate",
        json!({"uid": "uid-strip", "operation": "UPDATE", "userInfo": {"username": "alice"},
               "object": stripped, "oldObject": granted}),
    )
    .await;
    assert_eq!(r["allowed"], false, "{r}");
    assert!(
        message(&r).contains(
            "alice may not remove the tessera.io/allocation annotation of pod ml/granted"
        ),
        "{r}"
    );

    // A body that is not an AdmissionReview: 400 over the wire too.
    let (status, body) = https(
        server.addr,
        &pki.cert_der,
        localhost(),
        "POST",
        "/validate",
        Some(&json!("not a review")),
    )
    .await
    .expect("answer");
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        String::from_utf8_lossy(&body).contains("not an AdmissionReview"),
        "{body:?}"
    );

    // The certificate also verifies for the IP address, and /healthz answers.
    let ip = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
    let (status, body) = https(server.addr, &pki.cert_der, ip, "GET", "/healthz", None)
        .await
        .expect("healthz over https by IP");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], b"ok");

    server.shutdown().await.expect("serve_on returns Ok");
}

#[tokio::test]
async fn a_client_that_does_not_trust_the_certificate_is_refused() {
    let pki = make_pki();
    let other = make_pki();
    let server = start(&pki, config()).await;
    let err = https(
        server.addr,
        &other.cert_der,
        localhost(),
        "GET",
        "/healthz",
        None,
    )
    .await
    .expect_err("a certificate from another issuer must not verify");
    assert!(err.starts_with("TLS handshake"), "{err}");
    // A name the certificate does not cover fails as well.
    let err = https(
        server.addr,
        &pki.cert_der,
        ServerName::try_from("tessera-webhook.tessera-system.svc").expect("name"),
        "GET",
        "/healthz",
        None,
    )
    .await
    .expect_err("the certificate covers only localhost and 127.0.0.1");
    assert!(err.starts_with("TLS handshake"), "{err}");
    server.shutdown().await.expect("serve_on returns Ok");
}

#[tokio::test]
async fn plain_http_gets_no_http_answer_and_the_server_keeps_serving() {
    let pki = make_pki();
    let server = start(&pki, config()).await;
    let review = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "plain", "operation": "CREATE", "userInfo": {"username": "alice"},
                    "object": pod("p", json!({"tessera.io/gpu": "1"}), json!({}))}
    })
    .to_string();
    let request = format!(
        "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{review}",
        review.len()
    );
    let mut tcp = TcpStream::connect(server.addr).await.expect("connect");
    // The write may already fail if the server closed first; either way no HTTP comes back.
    let _ = tcp.write_all(request.as_bytes()).await;
    let mut got = Vec::new();
    let read = tokio::time::timeout(LIMIT, tcp.read_to_end(&mut got))
        .await
        .expect("the server closes a plain-text connection instead of keeping it open");
    // A reset is as good as a close; what matters is what arrived before it:
    // nothing, or a TLS alert record (content type 21), never an HTTP answer.
    assert!(
        got.is_empty() || got[0] == 21,
        "plain HTTP got something other than a TLS alert ({read:?}): {:?}",
        String::from_utf8_lossy(&got)
    );
    assert!(!got.windows(5).any(|w| w == b"HTTP/"), "{got:?}");

    // The failed handshake did not take the listener down.
    let (status, body) = https(
        server.addr,
        &pki.cert_der,
        localhost(),
        "GET",
        "/healthz",
        None,
    )
    .await
    .expect("TLS still served after a plain-text client");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], b"ok");
    server.shutdown().await.expect("serve_on returns Ok");
}

fn err_text(r: Result<Arc<rustls::ServerConfig>, TlsError>) -> (TlsError, String) {
    match r {
        Ok(_) => panic!("tls_config accepted bad input"),
        Err(e) => {
            let text = e.to_string();
            (e, text)
        }
    }
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

#[test]
fn tls_config_explains_bad_files() {
    let pki = make_pki();
    assert!(tls_config(&pki.cert, &pki.key).is_ok());
    let dir = pki.dir.path();

    // Missing files: a read error naming the path.
    let missing = dir.join("nope.crt");
    let (e, text) = err_text(tls_config(&missing, &pki.key));
    assert!(matches!(e, TlsError::Read { .. }), "{e:?}");
    assert!(text.contains(&shown(&missing)), "{text}");
    let missing_key = dir.join("nope.key");
    let (e, text) = err_text(tls_config(&pki.cert, &missing_key));
    assert!(matches!(e, TlsError::Read { .. }), "{e:?}");
    assert!(text.contains(&shown(&missing_key)), "{text}");

    // A key file holding only the certificate: no private key.
    let (e, text) = err_text(tls_config(&pki.cert, &pki.cert));
    assert!(matches!(e, TlsError::NoKey { .. }), "{e:?}");
    assert!(
        text.contains("no PEM private key") && text.contains(&shown(&pki.cert)),
        "{text}"
    );

    // A cert file holding only the key, or no PEM at all: no certificate.
    let (e, text) = err_text(tls_config(&pki.key, &pki.key));
    assert!(matches!(e, TlsError::NoCertificate { .. }), "{e:?}");
    assert!(
        text.contains("no PEM certificate") && text.contains(&shown(&pki.key)),
        "{text}"
    );
    let junk = dir.join("junk.pem");
    std::fs::write(&junk, "this is not PEM\n").expect("write");
    let (e, _) = err_text(tls_config(&junk, &pki.key));
    assert!(matches!(e, TlsError::NoCertificate { .. }), "{e:?}");
    let (e, _) = err_text(tls_config(&pki.cert, &junk));
    assert!(matches!(e, TlsError::NoKey { .. }), "{e:?}");

    // A key that belongs to another certificate: rustls refuses the pair.
    let other = pki_key_only();
    let wrong_key = dir.join("other.key");
    std::fs::write(&wrong_key, other).expect("write");
    let (e, text) = err_text(tls_config(&pki.cert, &wrong_key));
    assert!(matches!(e, TlsError::Config(_)), "{e:?}");
    assert!(text.starts_with("TLS configuration"), "{text}");
}

/// The private key of a second, unrelated certificate.
fn pki_key_only() -> String {
    rcgen::generate_simple_self_signed(vec!["localhost".into()])
        .expect("rcgen")
        .signing_key
        .serialize_pem()
}

#[tokio::test]
async fn serve_reports_an_address_in_use() {
    let pki = make_pki();
    let tls = tls_config(&pki.cert, &pki.key).expect("tls");
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let result = tokio::time::timeout(
        LIMIT,
        serve(addr, tls, Arc::new(config()), std::future::pending()),
    )
    .await
    .expect("serve fails at once on a taken port");
    let e = result.expect_err("the port is taken");
    assert!(matches!(e, TlsError::Bind { .. }), "{e:?}");
    assert!(e.to_string().contains(&addr.to_string()), "{e}");
}

/// A client that connects and never starts its handshake must not hold up the
/// others: handshakes run concurrently. (Before, one stalled client blocked
/// every admission call for the 10 s handshake timeout; the bound below is
/// half that, a liveness check, not a speed figure.)
#[tokio::test]
async fn a_stalled_client_does_not_block_other_handshakes() {
    let pki = make_pki();
    let server = start(&pki, config()).await;
    let stalled: Vec<TcpStream> = {
        let mut v = Vec::new();
        for _ in 0..3 {
            v.push(TcpStream::connect(server.addr).await.expect("connect"));
        }
        v
    };
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        https(
            server.addr,
            &pki.cert_der,
            localhost(),
            "GET",
            "/healthz",
            None,
        ),
    )
    .await
    .expect("served while three clients stall in their handshakes")
    .expect("TLS request");
    assert_eq!(answered.0, StatusCode::OK);
    drop(stalled);
    server.shutdown().await.expect("serve_on returns Ok");
}
