//! `tessera estimator`'s capacity over a real TCP gRPC connection, with the
//! tonic client generated from Karmada's proto: the mirror is built the way a
//! fresh estimator process builds it (complete lists of nodes, `GpuNode`s and
//! bound pods carrying the scheduler's signed grants); before its sync gate
//! opens every RPC answers `UNAVAILABLE`; after, the answers for whole,
//! fractional and MIG requests, with node claims (selector, affinity,
//! tolerations), equal the number of pods the scheduler's own path (decide,
//! reserve) then actually places one by one.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{Node, Pod, Taint};
use prost::Message;
use tessera_api::GpuNode;
use tessera_core::allocation::ANNOTATION;
use tessera_estimator::proto::k8s::io::api::core::v1 as core_v1;
use tessera_estimator::{EstimatorClient, Service, pb};
use tessera_k8s::convert;
use tessera_k8s::estimator::{MirrorCapacity, replica_pod, serve};
use tessera_k8s::gate::{Kind, SyncGate};
use tessera_k8s::mirror::{Reservation, SharedMirror};
use tessera_k8s::standalone::node_allows;

/// Four GPU nodes: two pooled `shared`, one of them tainted for a team, a MIG node.
fn cluster() -> (Vec<Node>, Vec<GpuNode>) {
    let mut nodes = vec![
        kube_node("a100-8", "64", "512Gi"),
        kube_node("a100-4", "32", "256Gi"),
        kube_node("team-4", "32", "256Gi"),
        kube_node("mig-2", "32", "256Gi"),
    ];
    for n in &mut nodes[1..3] {
        n.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert("pool".into(), "shared".into());
    }
    nodes[2].spec = Some(k8s_openapi::api::core::v1::NodeSpec {
        taints: Some(vec![Taint {
            key: "team".into(),
            value: Some("vision".into()),
            effect: "NoSchedule".into(),
            ..Default::default()
        }]),
        ..Default::default()
    });
    let mut mig = gpu_node("mig-2", "A100-80GB", 81_920, 2);
    mig.spec.gpus[1].mig.enabled = true;
    mig.spec.gpus[1].mig.instances = vec![
        tessera_api::MigInstance {
            profile: "3g.40gb".into(),
            start: 4,
            size: 4,
            uuid: "MIG-mig-2-1-0".into(),
        },
        tessera_api::MigInstance {
            profile: "3g.40gb".into(),
            start: 0,
            size: 4,
            uuid: "MIG-mig-2-1-1".into(),
        },
    ];
    let inv = vec![
        gpu_node("a100-8", "A100-80GB", 81_920, 8),
        gpu_node("a100-4", "A100-80GB", 81_920, 4),
        gpu_node("team-4", "A100-80GB", 81_920, 4),
        mig,
    ];
    (nodes, inv)
}

/// Places `p` the way the scheduler does (decide on the nodes the pod allows,
/// then reserve, which signs the grant) and returns it as the API server holds
/// it once bound; `None` when nothing fits.
fn place(m: &SharedMirror, mut p: Pod) -> Option<Pod> {
    let mut g = m.lock();
    let asks = convert::pod_asks(&p, &g.cluster().catalog);
    let (req, host) = (asks.request.expect("request"), asks.host.expect("host"));
    let (placement, _) = g.decide(&req, &host, |f| node_allows(&p, f)).ok()?;
    let node = g.cluster().node(placement.node).name.clone();
    let Reservation::Write { annotation } = g.reserve(&p, &node).expect("decided, so it fits")
    else {
        panic!("a fresh pod")
    };
    if let Some(a) = annotation {
        p.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(ANNOTATION.to_string(), a);
    }
    p.spec.as_mut().unwrap().node_name = Some(node);
    g.upsert_pod(p.clone());
    Some(p)
}

/// The cluster fragmented by shares of 0.3 and 0.6 and single GPUs (tolerating
/// the team taint, so every node takes some), as bound pods with their grants.
fn fragmented_pods() -> Vec<Pod> {
    let (nodes, inv) = cluster();
    let m = mirror("tessera", nodes, inv, vec![]);
    let fill: [&[(&str, &str)]; 4] = [
        &[
            ("cpu", "1"),
            ("tessera.io/gpu", "1"),
            ("tessera.io/gpu-milli", "300"),
        ],
        &[
            ("cpu", "1"),
            ("tessera.io/gpu", "1"),
            ("tessera.io/gpu-milli", "600"),
        ],
        &[("cpu", "2"), ("memory", "8Gi"), ("nvidia.com/gpu", "1")],
        &[
            ("cpu", "1"),
            ("tessera.io/gpu", "1"),
            ("tessera.io/gpu-milli", "300"),
        ],
    ];
    let mut bound = Vec::new();
    for i in 0..14 {
        let mut p = pod(
            "fill",
            &format!("fill-{i}"),
            &format!("uid-fill-{i}"),
            fill[i % 4],
        );
        p.spec.as_mut().unwrap().tolerations = Some(vec![k8s_openapi::api::core::v1::Toleration {
            operator: Some("Exists".into()),
            ..Default::default()
        }]);
        bound.push(place(&m, p).expect("the fill fits"));
    }
    bound
}

/// A fresh mirror of the fragmented cluster, as a new process lists it.
fn listed() -> SharedMirror {
    let (nodes, inv) = cluster();
    mirror("tessera", nodes, inv, fragmented_pods())
}

/// `ReplicaRequirements` as karmada-scheduler sends them (quantities as bytes).
fn requirements(
    resources: &[(&str, &str)],
    claim: Option<pb::NodeClaim>,
) -> pb::ReplicaRequirements {
    let bytes = tessera_estimator::request_bytes(resources.iter().copied());
    pb::ReplicaRequirements {
        resource_request_bytes: bytes,
        namespace: "default".into(),
        node_claim: claim,
        ..Default::default()
    }
}

/// The pool `shared` by selector, with the team taint tolerated or not.
fn shared_pool(tolerate: bool) -> pb::NodeClaim {
    let toleration = core_v1::Toleration {
        key: Some("team".into()),
        operator: Some("Equal".into()),
        value: Some("vision".into()),
        effect: Some("NoSchedule".into()),
        toleration_seconds: None,
    };
    pb::NodeClaim {
        node_selector: [("pool".to_string(), "shared".to_string())].into(),
        tolerations_bytes: if tolerate {
            vec![toleration.encode_to_vec()]
        } else {
            vec![]
        },
        ..Default::default()
    }
}

/// A required affinity keeping replicas off `not` (bytes, as karmada-scheduler sends it).
fn not_on(not: &str) -> pb::NodeClaim {
    let affinity = core_v1::NodeSelector {
        node_selector_terms: vec![core_v1::NodeSelectorTerm {
            match_expressions: vec![],
            match_fields: vec![core_v1::NodeSelectorRequirement {
                key: Some("metadata.name".into()),
                operator: Some("NotIn".into()),
                values: vec![not.into()],
            }],
        }],
    };
    pb::NodeClaim {
        node_affinity_bytes: affinity.encode_to_vec(),
        ..Default::default()
    }
}

/// Replicas of `reqs` placed for real, one by one, on a fresh listed mirror.
fn placed_one_by_one(reqs: &pb::ReplicaRequirements) -> i32 {
    let m = listed();
    let template = replica_pod(reqs).expect("a readable request");
    let mut n = 0;
    loop {
        let mut p = template.clone();
        p.metadata.name = Some(format!("replica-{n}"));
        p.metadata.uid = Some(format!("uid-replica-{n}"));
        if place(&m, p).is_none() {
            return n;
        }
        n += 1;
        assert!(n < 10_000, "runaway placement");
    }
}

/// A running estimator server (see [`serve_plain`]).
struct Served {
    stop: tokio::sync::oneshot::Sender<()>,
    server: tokio::task::JoinHandle<Result<(), tessera_k8s::estimator::EstimatorError>>,
}

impl Served {
    /// Stops the server and checks it stopped cleanly.
    async fn stop(self) {
        self.stop.send(()).unwrap();
        self.server.await.unwrap().unwrap();
    }
}

/// `capacity` served as cluster `member-1` over a real TCP gRPC connection
/// (plaintext, a free loopback port), and a client generated from Karmada's
/// proto connected to it.
async fn serve_plain(
    capacity: MirrorCapacity,
) -> (EstimatorClient<tonic::transport::Channel>, Served) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve(
        listener,
        None,
        Service::new("member-1", capacity),
        async {
            let _ = stop_rx.await;
        },
    ));
    let client = EstimatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    (client, Served { stop, server })
}

async fn ask(
    client: &mut EstimatorClient<tonic::transport::Channel>,
    cluster: &str,
    reqs: pb::ReplicaRequirements,
) -> Result<i32, tonic::Status> {
    client
        .max_available_replicas(pb::MaxAvailableReplicasRequest {
            cluster: cluster.into(),
            replica_requirements: Some(reqs),
            assumed_workloads: Vec::new(),
        })
        .await
        .map(|r| r.into_inner().max_replicas)
}

#[tokio::test]
async fn unavailable_before_sync_then_answers_equal_pods_placed_one_by_one() {
    let gate = SyncGate::new();
    let capacity = MirrorCapacity::new(listed(), gate.clone(), 10_000);
    let (mut client, served) = serve_plain(capacity).await;
    let one_gpu: &[(&str, &str)] = &[("cpu", "4"), ("memory", "16Gi"), ("nvidia.com/gpu", "1")];

    // Before the initial lists are in: UNAVAILABLE, naming what is missing, for every RPC.
    gate.mark(Kind::Nodes);
    let early = ask(&mut client, "member-1", requirements(one_gpu, None))
        .await
        .unwrap_err();
    assert_eq!(early.code(), tonic::Code::Unavailable);
    assert!(early.message().contains("pods"), "{}", early.message());
    assert!(!early.message().contains("nodes,"), "{}", early.message());
    let early = client
        .get_unschedulable_replicas(pb::UnschedulableReplicasRequest {
            cluster: "member-1".into(),
            resource: None,
            unschedulable_threshold: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(early.code(), tonic::Code::Unavailable);
    for k in [Kind::Inventory, Kind::Pods, Kind::Queues, Kind::Namespaces] {
        gate.mark(k);
    }

    let cases: [(&str, &[(&str, &str)]); 6] = [
        ("1 whole GPU", one_gpu),
        (
            "4 whole GPUs",
            &[("cpu", "8"), ("memory", "32Gi"), ("nvidia.com/gpu", "4")],
        ),
        (
            "0.25 GPU",
            &[
                ("cpu", "1"),
                ("tessera.io/gpu", "1"),
                ("tessera.io/gpu-milli", "250"),
            ],
        ),
        (
            "0.7 GPU",
            &[
                ("cpu", "1"),
                ("tessera.io/gpu", "1"),
                ("tessera.io/gpu-milli", "700"),
            ],
        ),
        (
            "20 GiB of one GPU",
            &[
                ("cpu", "1"),
                ("tessera.io/gpu", "1"),
                ("tessera.io/gpu-memory", "20Gi"),
            ],
        ),
        (
            "MIG 3g.40gb",
            &[
                ("cpu", "1"),
                ("memory", "4Gi"),
                ("nvidia.com/mig-3g.40gb", "1"),
            ],
        ),
    ];
    let mut answers = Vec::new();
    for (what, resources) in cases {
        let claims = [
            ("no claim", None),
            ("shared pool, taint not tolerated", Some(shared_pool(false))),
            ("shared pool, taint tolerated", Some(shared_pool(true))),
            ("not on a100-8", Some(not_on("a100-8"))),
        ];
        let mut row = Vec::new();
        for (claim_what, claim) in claims {
            let reqs = requirements(resources, claim);
            let answer = ask(&mut client, "member-1", reqs.clone()).await.unwrap();
            assert_eq!(answer, placed_one_by_one(&reqs), "{what}, {claim_what}");
            eprintln!("{what}, {claim_what}: {answer}");
            row.push(answer);
        }
        // The claims narrow the nodes: never more than without one; the toleration opens the team node.
        assert!(row[1..].iter().all(|&c| c <= row[0]), "{what}: {row:?}");
        assert!(row[1] <= row[2], "{what}: {row:?}");
        answers.push(row);
    }
    // The cases show something: whole and fractional answers differ, the taint
    // and the affinity matter for some request.
    assert!(answers.iter().any(|r| r[0] > 0));
    assert!(
        answers.windows(2).any(|w| w[0][0] != w[1][0]),
        "{answers:?}"
    );
    assert!(answers.iter().any(|r| r[1] < r[2]), "{answers:?}");
    assert!(answers.iter().any(|r| r[3] < r[0]), "{answers:?}");
    // Asking twice gives the same answer: the estimate left the mirror as it was.
    let again = ask(&mut client, "member-1", requirements(cases[2].1, None))
        .await
        .unwrap();
    assert_eq!(again, answers[2][0]);

    // Another cluster's name, unreadable requests: refused with a status, no panic.
    let wrong = ask(&mut client, "member-2", requirements(one_gpu, None))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::InvalidArgument);
    assert!(wrong.message().contains("member-1"), "{}", wrong.message());
    let bad = ask(
        &mut client,
        "member-1",
        requirements(&[("tessera.io/gpu-milli", "5000")], None),
    )
    .await
    .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let mut odd = not_on("a100-8");
    let mut sel = core_v1::NodeSelector::decode(odd.node_affinity_bytes.as_slice()).unwrap();
    sel.node_selector_terms[0].match_fields[0].operator = Some("Near".into());
    odd.node_affinity_bytes = sel.encode_to_vec();
    let bad = ask(&mut client, "member-1", requirements(one_gpu, Some(odd)))
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    assert!(bad.message().contains("Near"), "{}", bad.message());
    let garbage = pb::NodeClaim {
        tolerations_bytes: vec![vec![0xff, 0xff, 0xff]],
        ..Default::default()
    };
    let bad = ask(
        &mut client,
        "member-1",
        requirements(one_gpu, Some(garbage)),
    )
    .await
    .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);

    served.stop().await;
}

/// A namespace's queue caps the answer as admission would admit the replicas
/// one after another.
#[tokio::test]
async fn the_queue_quota_caps_the_answer() {
    let (nodes, inv) = cluster();
    let m = mirror("tessera", nodes, inv, vec![]);
    {
        let mut g = m.lock();
        let mut q = gpu_queue("team", None, "2");
        q.spec.borrow = Some(false);
        g.replace_queues(vec![q]);
        g.replace_namespaces(vec![queue_namespace("team-ns", "team")]);
    }
    let capacity = MirrorCapacity::new(m, SyncGate::synced(), 10_000);
    let (mut client, served) = serve_plain(capacity).await;
    // GPUs only: the queue guarantees no CPU or memory.
    let one_gpu: &[(&str, &str)] = &[("nvidia.com/gpu", "1")];
    let free = ask(&mut client, "member-1", requirements(one_gpu, None))
        .await
        .unwrap();
    let mut in_team = requirements(one_gpu, None);
    in_team.namespace = "team-ns".into();
    let capped = ask(&mut client, "member-1", in_team).await.unwrap();
    assert!(free > 2, "{free}");
    assert_eq!(capped, 2, "the queue's 2 GPUs, no borrowing");
    served.stop().await;
}

mod tls {
    //! The estimator over TLS with client certificates, as karmada-scheduler
    //! calls it with `--scheduler-estimator-ca-file/-cert-file/-key-file`: a CA
    //! made at test time signs the server's and the client's certificates; the
    //! gRPC client negotiates HTTP/2 by ALPN. A client without a certificate is
    //! refused.

    use std::net::SocketAddr;
    use std::sync::Arc;

    use hyper_util::rt::TokioIo;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
    use tessera_estimator::{EstimatorClient, Service};
    use tessera_k8s::estimator::{MirrorCapacity, RawEstimatorConfig, serve};
    use tessera_k8s::gate::SyncGate;
    use tokio_rustls::TlsConnector;

    use super::{listed, requirements};

    struct Pem {
        cert: String,
        key: String,
        der: CertificateDer<'static>,
        pkcs8: Vec<u8>,
    }

    fn issue(issuer: &Issuer<'static, KeyPair>, name: &str) -> Pem {
        let key = KeyPair::generate().expect("key");
        let cert = CertificateParams::new(vec![name.to_string()])
            .expect("params")
            .signed_by(&key, issuer)
            .expect("signed");
        Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
            der: cert.der().clone(),
            pkcs8: key.serialize_der(),
        }
    }

    fn connector(root: &CertificateDer<'static>, client: Option<&Pem>) -> TlsConnector {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(root.clone()).expect("root");
        let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots);
        let mut config = match client {
            None => builder.with_no_client_auth(),
            Some(c) => builder
                .with_client_auth_cert(
                    vec![c.der.clone()],
                    PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(c.pkcs8.clone())),
                )
                .expect("client certificate"),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        TlsConnector::from(Arc::new(config))
    }

    /// A gRPC channel whose connections are TLS made by `tls` (tonic is built
    /// without TLS of its own, as in the server).
    async fn channel(
        addr: SocketAddr,
        tls: TlsConnector,
    ) -> Result<tonic::transport::Channel, tonic::transport::Error> {
        tonic::transport::Endpoint::from_static("http://localhost")
            .connect_with_connector(tower::service_fn(move |_: http::Uri| {
                let tls = tls.clone();
                async move {
                    let tcp = tokio::net::TcpStream::connect(addr).await?;
                    let name = ServerName::try_from("localhost").expect("name");
                    let stream = tls.connect(name, tcp).await?;
                    // The server chose HTTP/2, as grpc-go demands of it.
                    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
                    Ok::<_, std::io::Error>(TokioIo::new(stream))
                }
            }))
            .await
    }

    #[tokio::test]
    async fn serves_grpc_over_tls_to_clients_with_a_certificate_only() {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = params.self_signed(&ca_key).expect("CA");
        let ca_der = ca_cert.der().clone();
        let issuer = Issuer::new(params, ca_key);
        let server = issue(&issuer, "localhost");
        let client = issue(&issuer, "karmada-scheduler");
        let dir = tempfile::tempdir().expect("dir");
        let file = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).expect("write");
            p
        };
        let config = RawEstimatorConfig {
            listen: Some("127.0.0.1:0".into()),
            cluster_name: Some("member-1".into()),
            tls_cert: Some(file("tls.crt", &server.cert)),
            tls_key: Some(file("tls.key", &server.key)),
            tls_client_ca: Some(file("ca.crt", &ca_cert.pem())),
            mirror: tessera_k8s::run::RawMirrorConfig {
                signing_key_file: Some(file("key", "0123456789abcdef0123")),
                ..Default::default()
            },
            ..Default::default()
        }
        .resolve()
        .expect("valid configuration");
        assert_eq!(config.cluster_name, "member-1");
        let listener = tokio::net::TcpListener::bind(config.listen).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let capacity = MirrorCapacity::new(listed(), SyncGate::synced(), config.replica_limit);
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(serve(
            listener,
            config.tls.clone(),
            Service::new(config.cluster_name.clone(), capacity),
            async {
                let _ = stop_rx.await;
            },
        ));

        let mut ok = EstimatorClient::new(
            channel(addr, connector(&ca_der, Some(&client)))
                .await
                .expect("a client with a certificate connects"),
        );
        let answer = super::ask(
            &mut ok,
            "member-1",
            requirements(&[("cpu", "1"), ("nvidia.com/gpu", "1")], None),
        )
        .await
        .expect("answered over TLS");
        assert!(answer > 0, "{answer}");

        // No client certificate: the handshake (or the first call) fails.
        let refused = match channel(addr, connector(&ca_der, None)).await {
            Err(_) => true,
            Ok(ch) => super::ask(
                &mut EstimatorClient::new(ch),
                "member-1",
                requirements(&[("nvidia.com/gpu", "1")], None),
            )
            .await
            .is_err(),
        };
        assert!(refused, "a client without a certificate was answered");

        stop_tx.send(()).unwrap();
        served.await.unwrap().unwrap();
    }

    /// Half a TLS configuration, or none with a client CA, is refused by name.
    #[test]
    fn tls_flags_are_checked() {
        let base = || RawEstimatorConfig {
            cluster_name: Some("member-1".into()),
            ..Default::default()
        };
        let err = |c: RawEstimatorConfig| c.resolve().err().expect("refused").to_string();
        assert!(
            err(RawEstimatorConfig {
                tls_cert: Some("/nope.crt".into()),
                ..base()
            })
            .starts_with("tls-key:")
        );
        assert!(
            err(RawEstimatorConfig {
                tls_client_ca: Some("/nope.crt".into()),
                ..base()
            })
            .starts_with("tls-client-ca:")
        );
        assert!(
            err(RawEstimatorConfig {
                tls_cert: Some("/nope.crt".into()),
                tls_key: Some("/nope.key".into()),
                ..base()
            })
            .contains("/nope.crt")
        );
        assert!(err(RawEstimatorConfig::default()).starts_with("cluster-name:"));
        assert!(
            err(RawEstimatorConfig {
                health_listen: Some("0.0.0.0:10352".into()),
                ..base()
            })
            .starts_with("health-listen:")
        );
        assert!(
            err(RawEstimatorConfig {
                listen: Some("nowhere".into()),
                ..base()
            })
            .starts_with("listen:")
        );
        assert!(
            err(RawEstimatorConfig {
                replica_limit: Some(0),
                ..base()
            })
            .starts_with("replica-limit:")
        );
    }
}

/// `/readyz` follows the sync gate the RPCs answer under; `/healthz` is always 200.
#[tokio::test]
async fn readyz_is_ready_exactly_when_the_rpcs_answer() {
    use tower::ServiceExt;
    let gate = SyncGate::new();
    let get = |path: &'static str| {
        let router = tessera_k8s::estimator::health_router(gate.clone());
        async move {
            let resp = router
                .oneshot(
                    http::Request::builder()
                        .uri(path)
                        .body(axum::body::Body::empty())
                        .unwrap(),
                )
                .await
                .unwrap();
            let status = resp.status();
            let body = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .unwrap()
                .to_bytes();
            (status.as_u16(), String::from_utf8_lossy(&body).into_owned())
        }
    };
    assert_eq!(get("/healthz").await.0, 200);
    let (code, body) = get("/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("nodes") && body.contains("pods"), "{body}");
    for k in [
        Kind::Nodes,
        Kind::Inventory,
        Kind::Pods,
        Kind::Queues,
        Kind::Namespaces,
    ] {
        gate.mark(k);
    }
    assert_eq!(get("/readyz").await.0, 200);
}

/// `GetUnschedulableReplicas` over a real TCP gRPC connection, the workload
/// read from an API double (tower-test) answering as the API server does:
/// of a Deployment's pods, those of its new ReplicaSet (same template but
/// for `pod-template-hash`, controlled by it) whose `PodScheduled` is False
/// with reason `Unschedulable` for longer than the threshold count, as in
/// Karmada's estimator; an old ReplicaSet's pods, another owner's, a recent
/// one, a scheduled one and a gated one do not. Another kind is refused
/// (UNIMPLEMENTED), a missing Deployment is NOT_FOUND.
#[tokio::test]
async fn unschedulable_replicas_are_the_new_replica_sets_pods_waiting_past_the_threshold() {
    use http::{Request, Response, StatusCode};
    use kube::client::Body;
    use serde_json::json;

    let now = k8s_openapi::jiff::Timestamp::now();
    let ago = |s: i64| {
        now.checked_sub(k8s_openapi::jiff::SignedDuration::from_secs(s))
            .unwrap()
            .strftime("%Y-%m-%dT%H:%M:%SZ")
            .to_string()
    };
    let owner = |kind: &str, name: &str, uid: &str| json!([{"apiVersion": "apps/v1", "kind": kind, "name": name, "uid": uid, "controller": true}]);
    let template = |image: &str, hash: Option<&str>| {
        let mut labels = json!({"app": "train"});
        if let Some(h) = hash {
            labels["pod-template-hash"] = h.into();
        }
        json!({"metadata": {"labels": labels}, "spec": {"containers": [{"name": "c", "image": image}]}})
    };
    let deployment = json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "train", "namespace": "ml", "uid": "d-1"},
        "spec": {"selector": {"matchLabels": {"app": "train"}}, "template": template("train:v2", None)},
    });
    let rs = |name: &str, uid: &str, owner_uid: &str, image: &str, hash: &str, created: i64| {
        json!({
            "metadata": {"name": name, "namespace": "ml", "uid": uid, "creationTimestamp": ago(created),
                         "ownerReferences": owner("Deployment", "train", owner_uid)},
            "spec": {"selector": {"matchLabels": {"app": "train", "pod-template-hash": hash}},
                     "template": template(image, Some(hash))},
        })
    };
    let sets = json!({"apiVersion": "apps/v1", "kind": "ReplicaSetList", "metadata": {"resourceVersion": "5"}, "items": [
        rs("train-old", "rs-old", "d-1", "train:v1", "aaa", 900),
        rs("train-new", "rs-new", "d-1", "train:v2", "bbb", 300),
        // The same template under another owner: not the Deployment's.
        rs("train-other", "rs-other", "d-9", "train:v2", "ccc", 600),
    ]});
    let pod = |name: &str, rs_uid: &str, status: &str, reason: &str, since: i64| {
        json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("u-{name}"), "labels": {"app": "train"},
                         "ownerReferences": owner("ReplicaSet", "x", rs_uid)},
            "spec": {"containers": [{"name": "c", "image": "train"}]},
            "status": {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": status, "reason": reason, "lastTransitionTime": ago(since)}
            ]},
        })
    };
    let pods = json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "6"}, "items": [
        pod("waits-long", "rs-new", "False", "Unschedulable", 600),
        pod("waits-long-2", "rs-new", "False", "Unschedulable", 120),
        pod("waits-short", "rs-new", "False", "Unschedulable", 10),
        pod("scheduled", "rs-new", "True", "", 600),
        pod("gated", "rs-new", "False", "SchedulingGated", 600),
        pod("old-rs", "rs-old", "False", "Unschedulable", 600),
        pod("other-owner", "rs-other", "False", "Unschedulable", 600),
    ]});
    let (mock, mut handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel::<String>();
    tokio::spawn(async move {
        while let Some((req, send)) = handle.next_request().await {
            let uri = req.uri().to_string();
            let (status, body) = match req.uri().path() {
                "/apis/apps/v1/namespaces/ml/deployments/train" => {
                    (StatusCode::OK, deployment.clone())
                }
                "/apis/apps/v1/namespaces/ml/replicasets" => (StatusCode::OK, sets.clone()),
                "/api/v1/namespaces/ml/pods" => (StatusCode::OK, pods.clone()),
                // As the API server words a missing object.
                _ => (
                    StatusCode::NOT_FOUND,
                    json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Failure", "message": "deployments.apps \"gone\" not found",
                    "reason": "NotFound", "details": {"name": "gone", "group": "apps", "kind": "deployments"}, "code": 404}),
                ),
            };
            let mut r = Response::new(Body::from(serde_json::to_vec(&body).unwrap()));
            *r.status_mut() = status;
            send.send_response(r);
            let _ = seen_tx.send(uri);
        }
    });
    let kube_client = kube::Client::new(mock, "default");
    let capacity =
        MirrorCapacity::new(listed(), SyncGate::synced(), 10_000).with_client(kube_client);
    let (mut client, served) = serve_plain(capacity).await;
    let ask = |kind: &str, name: &str, threshold_s: i64| pb::UnschedulableReplicasRequest {
        cluster: "member-1".into(),
        resource: Some(pb::ObjectReference {
            api_version: "apps/v1".into(),
            kind: kind.into(),
            namespace: "ml".into(),
            name: name.into(),
        }),
        unschedulable_threshold: threshold_s * 1_000_000_000,
    };
    let n = client
        .get_unschedulable_replicas(ask("Deployment", "train", 60))
        .await
        .unwrap()
        .into_inner()
        .unschedulable_replicas;
    assert_eq!(n, 2, "waits-long and waits-long-2, past 60 s");
    let n = client
        .get_unschedulable_replicas(ask("Deployment", "train", 300))
        .await
        .unwrap()
        .into_inner()
        .unschedulable_replicas;
    assert_eq!(n, 1, "only waits-long, past 300 s");
    let mut uris = Vec::new();
    while let Ok(u) = seen.try_recv() {
        uris.push(u);
    }
    assert!(
        uris.iter().any(
            |u| u.starts_with("/apis/apps/v1/namespaces/ml/replicasets?")
                && u.contains("labelSelector=app%3Dtrain")
        ),
        "ReplicaSets listed by the Deployment's selector: {uris:?}"
    );
    let e = client
        .get_unschedulable_replicas(ask("StatefulSet", "train", 60))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unimplemented, "{}", e.message());
    let e = client
        .get_unschedulable_replicas(ask("Deployment", "gone", 60))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{}", e.message());
    served.stop().await;
}

/// Replicas of `reqs` placed one by one (the scheduler's own path) after the
/// `assumed` replicas were placed the same way, as far as they fit.
fn placed_after(
    assumed: &[(&pb::ReplicaRequirements, u32)],
    reqs: &pb::ReplicaRequirements,
) -> i32 {
    let m = listed();
    for (k, (r, n)) in assumed.iter().enumerate() {
        let template = replica_pod(r).expect("a readable assumed request");
        for i in 0..*n {
            let mut p = template.clone();
            p.metadata.name = Some(format!("assumed-{k}-{i}"));
            p.metadata.uid = Some(format!("uid-assumed-{k}-{i}"));
            if place(&m, p).is_none() {
                break;
            }
        }
    }
    let template = replica_pod(reqs).expect("a readable request");
    let mut n = 0;
    loop {
        let mut p = template.clone();
        p.metadata.name = Some(format!("replica-{n}"));
        p.metadata.uid = Some(format!("uid-replica-{n}"));
        if place(&m, p).is_none() {
            return n;
        }
        n += 1;
        assert!(n < 10_000, "runaway placement");
    }
}

/// Karmada's `assumedWorkloads` (replicas it has just sent here that are no
/// pods yet) are placed first: the answer equals the pods the scheduler then
/// places one by one after placing the assumed ones, whole GPUs and shares,
/// and it is smaller than the answer without them.
#[tokio::test]
async fn assumed_workloads_are_placed_before_the_count() {
    let capacity = MirrorCapacity::new(listed(), SyncGate::synced(), 10_000);
    let (mut client, served) = serve_plain(capacity).await;
    let whole = requirements(
        &[("cpu", "4"), ("memory", "16Gi"), ("nvidia.com/gpu", "1")],
        None,
    );
    let share = requirements(
        &[
            ("cpu", "1"),
            ("tessera.io/gpu", "1"),
            ("tessera.io/gpu-milli", "700"),
        ],
        None,
    );
    let component = |r: &pb::ReplicaRequirements, replicas: i32| pb::Component {
        name: "worker".into(),
        replica_requirements: Some(pb::ComponentReplicaRequirements {
            node_claim: r.node_claim.clone(),
            resource_request_bytes: r.resource_request_bytes.clone(),
            ..Default::default()
        }),
        replicas,
    };
    let with = |assumed: Vec<pb::AssumedWorkload>| pb::MaxAvailableReplicasRequest {
        cluster: "member-1".into(),
        replica_requirements: Some(whole.clone()),
        assumed_workloads: assumed,
    };
    let alone = client
        .max_available_replicas(with(Vec::new()))
        .await
        .unwrap()
        .into_inner()
        .max_replicas;
    assert_eq!(alone, placed_after(&[], &whole));
    let cases: [(&str, Vec<(&pb::ReplicaRequirements, u32)>); 3] = [
        ("3 whole GPUs", vec![(&whole, 3)]),
        ("2 shares of 0.7 GPU", vec![(&share, 2)]),
        ("1 whole and 1 share", vec![(&whole, 1), (&share, 1)]),
    ];
    for (what, assumed) in cases {
        let workload = pb::AssumedWorkload {
            namespace: "default".into(),
            components: assumed
                .iter()
                .map(|(r, n)| component(r, *n as i32))
                .chain([component(&share, 0)]) // no replicas: takes nothing
                .collect(),
        };
        let got = client
            .max_available_replicas(with(vec![workload]))
            .await
            .unwrap()
            .into_inner()
            .max_replicas;
        let want = placed_after(&assumed, &whole);
        println!(
            "whole GPUs after {what} assumed: {got} (alone {alone}), placed one by one {want}"
        );
        assert_eq!(got, want, "after {what} assumed");
        assert!(got < alone, "after {what} assumed: {got}, alone {alone}");
    }
    served.stop().await;
}
