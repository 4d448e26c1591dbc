//! The extender's verbs over TLS with client certificates (issue 9, finding
//! 16: "where it must be reachable, TLS with client certificates"). A CA made
//! at test time signs the server's certificate and kube-scheduler's client
//! certificate, as an operator's PKI would; the scheduler runs (`run::run`)
//! against the API-server double with `--extender-cert/-key/-client-ca`.
//! A client with a certificate from that CA is answered; one without a
//! certificate, one with a certificate from another CA, and plain HTTP are
//! refused before any verb runs.

mod apiserver;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use http::{Request, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use serde_json::{Value, json};
use tessera_k8s::run::RawConfig;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use apiserver::cluster::{Shape, add_gpu_nodes, pod};
use apiserver::process::Process;
use apiserver::{ApiServer, Config, Resource};

const LIMIT: Duration = Duration::from_secs(20);

/// A CA, and certificates it signed, as DER and PEM files.
struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert_der: CertificateDer<'static>,
    cert_pem: String,
}

struct Leaf {
    cert_der: CertificateDer<'static>,
    cert_pem: String,
    key: KeyPair,
}

fn ca(name: &str) -> Ca {
    let key = KeyPair::generate().expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let cert = params.self_signed(&key).expect("CA certificate");
    Ca {
        cert_der: cert.der().clone(),
        cert_pem: cert.pem(),
        issuer: Issuer::new(params, key),
    }
}

fn leaf(ca: &Ca, names: &[&str]) -> Leaf {
    let key = KeyPair::generate().expect("leaf key");
    let params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
        .expect("leaf params");
    let cert = params.signed_by(&key, &ca.issuer).expect("signed leaf");
    Leaf {
        cert_der: cert.der().clone(),
        cert_pem: cert.pem(),
        key,
    }
}

fn write(dir: &Path, name: &str, content: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).expect("write PEM");
    p
}

fn connector(root: &CertificateDer<'static>, client: Option<&Leaf>) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(root.clone()).expect("root certificate");
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some(c) => builder
            .with_client_auth_cert(
                vec![c.cert_der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(c.key.serialize_der())),
            )
            .expect("client certificate"),
    };
    TlsConnector::from(Arc::new(config))
}

/// One POST over a fresh TLS connection, as kube-scheduler's extender client
/// sends it; any failure comes back as text.
async fn post(
    addr: SocketAddr,
    connector: TlsConnector,
    path: &str,
    body: &Value,
) -> Result<(StatusCode, Value), String> {
    let exchange = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let name = ServerName::try_from("localhost").expect("server name");
        let tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| format!("TLS handshake: {e}"))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
            .await
            .map_err(|e| format!("HTTP handshake: {e}"))?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method("POST")
            .uri(path)
            .header(header::HOST, "localhost")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .map_err(|e| format!("request: {e}"))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| format!("send: {e}"))?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?
            .to_bytes();
        let v = serde_json::from_slice(&bytes).map_err(|e| format!("decode: {e}"))?;
        Ok((status, v))
    };
    tokio::time::timeout(LIMIT, exchange)
        .await
        .map_err(|_| "timed out".to_string())?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_clients_with_a_certificate_from_the_configured_ca_reach_the_verbs() {
    only_certified_clients().await;
}

/// Issue 27 item 6: with the docs' "Existing kube-scheduler" flags (TLS,
/// listening beyond loopback) the Lease role defaulted to `follow`, which
/// leads only while a kube-scheduler *in this pod* holds its Lease: no replica
/// ever led, so nothing was bound or preempted and the log said nothing. Such an
/// extender now elects, and an explicit `follow` is refused naming the fix.
#[test]
fn an_extender_beyond_loopback_elects_its_leader() {
    let dir = tempfile::tempdir().expect("temp dir");
    let ours = ca("tessera-test-ca");
    let server_cert = leaf(&ours, &["tessera-scheduler.tessera-system.svc"]);
    let raw = |role: Option<&str>| RawConfig {
        mode: Some("extender".into()),
        listen: Some("0.0.0.0:8888".into()),
        extender_cert: Some(write(dir.path(), "tls.crt", &server_cert.cert_pem)),
        extender_key: Some(write(
            dir.path(),
            "tls.key",
            &server_cert.key.serialize_pem(),
        )),
        extender_client_ca: Some(write(dir.path(), "client-ca.crt", &ours.cert_pem)),
        signing_key_file: Some(write(
            dir.path(),
            "signing.key",
            "extender-tls-test-signing-key",
        )),
        identity: Some("tessera-0".into()),
        lease_role: role.map(str::to_string),
        ..RawConfig::default()
    };
    let c = raw(None).resolve().expect("valid");
    assert_eq!(
        c.lease.expect("elected").role,
        tessera_k8s::leader::LeaseRole::Elect
    );
    let e = raw(Some("follow"))
        .resolve()
        .err()
        .expect("follow refused")
        .to_string();
    assert!(
        e.starts_with("lease-role:") && e.contains("--lease-role=elect"),
        "{e}"
    );
    // On loopback (kube-scheduler in the pod) the default stays `follow`.
    let mut r = raw(None);
    r.listen = Some("127.0.0.1:8888".into());
    let c = r.resolve().expect("valid");
    assert_eq!(
        c.lease.expect("follows").role,
        tessera_k8s::leader::LeaseRole::Follow
    );
}

async fn only_certified_clients() {
    let dir = tempfile::Builder::new()
        .prefix("tessera-extender-tls-")
        .tempdir()
        .expect("temp dir");
    let ours = ca("tessera-test-ca");
    let server_cert = leaf(&ours, &["localhost", "127.0.0.1"]);
    let scheduler = leaf(&ours, &["kube-scheduler"]);
    let stranger_ca = ca("someone-else");
    let stranger = leaf(&stranger_ca, &["kube-scheduler"]);
    let key_file = write(dir.path(), "signing.key", "extender-tls-test-signing-key");
    let config = RawConfig {
        mode: Some("extender".into()),
        listen: Some("127.0.0.1:0".into()),
        // Port 0: the harness picks a free one (the default 0.0.0.0:9090 is
        // taken as soon as two schedulers run at once).
        metrics_listen: Some("127.0.0.1:0".into()),
        extender_cert: Some(write(dir.path(), "tls.crt", &server_cert.cert_pem)),
        extender_key: Some(write(
            dir.path(),
            "tls.key",
            &server_cert.key.serialize_pem(),
        )),
        extender_client_ca: Some(write(dir.path(), "client-ca.crt", &ours.cert_pem)),
        signing_key_file: Some(key_file),
        scheduler_name: Some("tessera".into()),
        leader_elect: Some(false),
        ..RawConfig::default()
    }
    .resolve()
    .expect("valid TLS configuration");

    let api = ApiServer::new(Config::default());
    let nodes = add_gpu_nodes(&api, 2, 8);
    let p = api
        .create(
            Resource::Pods,
            &pod(
                "default",
                "share",
                "tessera",
                Shape::Share {
                    memory_gib: 4,
                    cores_pct: 20,
                },
                100,
                256,
                0,
            ),
        )
        .expect("pod created");
    let process = Process::start(&api, config, &[]);
    let deadline = tokio::time::Instant::now() + LIMIT;
    while TcpStream::connect(process.addr).await.is_err() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the extender never listened"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let args = json!({"Pod": p, "Nodes": null, "NodeNames": nodes});

    // kube-scheduler with its client certificate: judged by the verbs.
    let (status, answer) = post(
        process.addr,
        connector(&ours.cert_der, Some(&scheduler)),
        "/scheduler/filter",
        &args,
    )
    .await
    .expect("a client with a certificate from the CA is served");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(answer["Error"].as_str().unwrap_or_default(), "", "{answer}");
    assert_eq!(answer["NodeNames"], json!(nodes), "{answer}");

    // No client certificate, or one from another CA: refused in the handshake.
    for (who, client) in [("no certificate", None), ("another CA", Some(&stranger))] {
        let e = post(
            process.addr,
            connector(&ours.cert_der, client),
            "/scheduler/filter",
            &args,
        )
        .await
        .expect_err(who);
        eprintln!("{who}: {e}");
        assert!(
            !e.starts_with("connect") && !e.starts_with("decode"),
            "{who}: refused by TLS, not by chance: {e}"
        );
    }

    // Plain HTTP gets no HTTP answer.
    let mut tcp = TcpStream::connect(process.addr).await.expect("connect");
    let body = args.to_string();
    let req = format!(
        "POST /scheduler/bind HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(LIMIT, tcp.read_to_end(&mut buf)).await;
    assert!(
        !String::from_utf8_lossy(&buf).starts_with("HTTP/"),
        "plain HTTP was answered: {}",
        String::from_utf8_lossy(&buf)
    );
    assert!(
        api.objects::<Value>(Resource::Pods)
            .iter()
            .all(|p| p.pointer("/spec/nodeName").is_none()),
        "nothing was bound"
    );
    process.kill().expect("the scheduler ran until killed");
}
