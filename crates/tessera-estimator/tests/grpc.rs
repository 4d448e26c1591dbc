//! The estimator over a real TCP gRPC connection, with the tonic client generated from
//! Karmada's proto: on a fragmented cluster, the answers for whole, fractional and MIG
//! requests, with and without a node claim, equal the number of pods the placement
//! engine then actually places, one by one.

use prost::Message;
use rand::SeedableRng;
use rand::rngs::SmallRng;
use tessera_core::Scheduler;
use tessera_core::ledger::Ledger;
use tessera_core::model::demo::demo_cluster;
use tessera_core::model::{Cluster, NodeId};
use tessera_core::policy::{self, PolicyArgs};
use tessera_core::request::Request;
use tessera_estimator::proto::k8s::io::api::core::v1 as core_v1;
use tessera_estimator::proto::k8s::io::apimachinery::pkg::api::resource::Quantity;
use tessera_estimator::{CoreCapacity, EstimatorClient, Service, pb, translate};
use tokio_stream::wrappers::TcpListenerStream;

fn scheduler() -> Scheduler {
    Scheduler::new(policy::by_name("tessera", &PolicyArgs::default()).unwrap())
}

/// The demo cluster (68 GPUs, two in MIG mode) fragmented by shares and single GPUs
/// that `s` placed: the same state each call.
fn fragmented(s: &mut Scheduler) -> (Cluster, Ledger) {
    let demo = demo_cluster();
    // Label a pool for the node-claim cases: the two A100 nodes, the L4s and the V100.
    let mut nodes = demo.nodes().to_vec();
    for n in &mut nodes {
        let pool =
            if n.name.starts_with("dgx-a100") || n.name.starts_with("l4") || n.name == "v100-1" {
                "shared"
            } else {
                "exclusive"
            };
        n.labels.insert("pool".into(), pool.into());
    }
    let cluster = Cluster::new(demo.catalog.clone(), nodes).unwrap();
    let mut ledger = Ledger::new(&cluster);
    let mut rng = SmallRng::seed_from_u64(3);
    let fill = [
        Request::share_milli(300, 2000, 4096),
        Request::share_milli(600, 2000, 4096),
        Request::whole(1, 4000, 16384),
        Request::share_milli(300, 2000, 4096),
    ];
    for i in 0..44 {
        if let Some(p) = s.place(&cluster, &ledger, &fill[i % fill.len()], &mut rng) {
            ledger.apply(&cluster, &p).unwrap();
        }
    }
    (cluster, ledger)
}

/// `ReplicaRequirements` as karmada-scheduler sends them: each quantity as the bytes
/// of a protobuf `Quantity` (`resourceRequestBytes`).
fn requirements(resources: &[(&str, &str)]) -> pb::ReplicaRequirements {
    let bytes = tessera_estimator::request_bytes(resources.iter().copied());
    pb::ReplicaRequirements {
        resource_request_bytes: bytes,
        namespace: "default".into(),
        ..Default::default()
    }
}

/// Places `req` for real, one by one, until it fails (on the nodes of the pool
/// `pool` only, if given, minus `not`).
fn placed_one_by_one(req: &Request, pool: Option<&str>, not: &[&str]) -> i32 {
    let mut s = scheduler();
    let (cluster, mut ledger) = fragmented(&mut s);
    let mut rng = SmallRng::seed_from_u64(0);
    let nodes: Vec<NodeId> = cluster
        .ids()
        .filter(|&id| {
            let n = cluster.node(id);
            pool.is_none_or(|p| n.labels.get("pool").map(String::as_str) == Some(p))
                && !not.contains(&n.name.as_str())
        })
        .collect();
    let mut n = 0;
    loop {
        let p = match pool {
            None => s.place(&cluster, &ledger, req, &mut rng),
            Some(_) => s.place_within(&cluster, &ledger, req, &nodes, &mut rng),
        };
        let Some(p) = p else { break };
        assert!(nodes.contains(&p.node));
        ledger.apply(&cluster, &p).unwrap();
        n += 1;
    }
    n
}

/// A node claim: the pool by node selector, and a required affinity (bytes, as
/// karmada-scheduler sends it) that keeps the replicas off the nodes `not`.
fn claim(pool: &str, not: &[&str]) -> pb::NodeClaim {
    let affinity = core_v1::NodeSelector {
        node_selector_terms: vec![core_v1::NodeSelectorTerm {
            match_expressions: vec![core_v1::NodeSelectorRequirement {
                key: Some("pool".into()),
                operator: Some("Exists".into()),
                values: vec![],
            }],
            match_fields: vec![core_v1::NodeSelectorRequirement {
                key: Some("metadata.name".into()),
                operator: Some("NotIn".into()),
                values: not.iter().map(|s| s.to_string()).collect(),
            }],
        }],
    };
    pb::NodeClaim {
        node_selector: [("pool".to_string(), pool.to_string())].into(),
        node_affinity_bytes: affinity.encode_to_vec(),
        ..Default::default()
    }
}

#[tokio::test]
async fn answers_over_tcp_equal_pods_placed_one_by_one() {
    let mut s = scheduler();
    let (cluster, ledger) = fragmented(&mut s);
    let catalog = cluster.catalog.clone();
    let service = Service::new("member-1", CoreCapacity::new(cluster, ledger, s));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service.server())
            .serve_with_incoming_shutdown(TcpListenerStream::new(listener), async {
                let _ = stop_rx.await;
            }),
    );
    let mut client = EstimatorClient::connect(format!("http://{addr}"))
        .await
        .unwrap();

    let cases: [(&str, &[(&str, &str)]); 7] = [
        (
            "1 whole GPU",
            &[("cpu", "4"), ("memory", "16Gi"), ("nvidia.com/gpu", "1")],
        ),
        (
            "8 whole GPUs",
            &[("cpu", "16"), ("memory", "64Gi"), ("nvidia.com/gpu", "8")],
        ),
        (
            "0.25 GPU",
            &[
                ("cpu", "1"),
                ("memory", "2Gi"),
                ("tessera.io/gpu", "1"),
                ("tessera.io/gpu-milli", "250"),
            ],
        ),
        (
            "0.7 GPU",
            &[
                ("cpu", "1"),
                ("memory", "2Gi"),
                ("tessera.io/gpu", "1"),
                ("tessera.io/gpu-milli", "700"),
            ],
        ),
        (
            "20 GiB of one GPU",
            &[
                ("cpu", "1"),
                ("memory", "2Gi"),
                ("tessera.io/gpu", "1"),
                ("tessera.io/gpu-memory", "20Gi"),
            ],
        ),
        (
            "MIG 1g.10gb",
            &[
                ("cpu", "1"),
                ("memory", "4Gi"),
                ("nvidia.com/mig-1g.10gb", "1"),
            ],
        ),
        (
            "MIG 3g.40gb",
            &[
                ("cpu", "1"),
                ("memory", "4Gi"),
                ("tessera.io/mig-3g.40gb", "1"),
            ],
        ),
    ];
    let mut answers = Vec::new();
    let mut claimed = Vec::new();
    for (what, resources) in cases {
        let reqs = requirements(resources);
        let req = translate(&reqs, &catalog).unwrap();
        let answer = client
            .max_available_replicas(pb::MaxAvailableReplicasRequest {
                cluster: "member-1".into(),
                replica_requirements: Some(reqs),
                assumed_workloads: Vec::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .max_replicas;
        assert_eq!(answer, placed_one_by_one(&req, None, &[]), "{what}");
        answers.push(answer);
        // The same request with a node claim: the pool `shared` minus one L4 node.
        let mut reqs = requirements(resources);
        reqs.node_claim = Some(claim("shared", &["l4-2"]));
        let within = client
            .max_available_replicas(pb::MaxAvailableReplicasRequest {
                cluster: "member-1".into(),
                replica_requirements: Some(reqs),
                assumed_workloads: Vec::new(),
            })
            .await
            .unwrap()
            .into_inner()
            .max_replicas;
        assert_eq!(
            within,
            placed_one_by_one(&req, Some("shared"), &["l4-2"]),
            "{what} with a node claim"
        );
        assert!(within <= answer);
        eprintln!("{what}: {answer} replicas, {within} with the node claim");
        claimed.push(within);
    }
    // The claim matters for some request (else the case shows nothing).
    assert!(
        claimed.iter().zip(&answers).any(|(c, a)| c < a),
        "{claimed:?} {answers:?}"
    );
    // The cluster is fragmented: whole and fractional answers differ, and some are 0
    // only where nothing fits (the answers are not all one number).
    assert!(answers.iter().any(|&a| a > 0));
    assert!(answers.windows(2).any(|w| w[0] != w[1]), "{answers:?}");
    // Asking twice gives the same answer: the estimate left the state as it was.
    let again = client
        .max_available_replicas(pb::MaxAvailableReplicasRequest {
            cluster: "member-1".into(),
            replica_requirements: Some(requirements(cases[2].1)),
            assumed_workloads: Vec::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .max_replicas;
    assert_eq!(again, answers[2]);

    // Another cluster's name, a malformed request: refused with a status, no panic.
    let wrong = client
        .max_available_replicas(pb::MaxAvailableReplicasRequest {
            cluster: "member-2".into(),
            replica_requirements: Some(requirements(cases[0].1)),
            assumed_workloads: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::InvalidArgument);
    let bad = client
        .max_available_replicas(pb::MaxAvailableReplicasRequest {
            cluster: "member-1".into(),
            replica_requirements: Some(requirements(&[("tessera.io/gpu-milli", "5000")])),
            assumed_workloads: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument);
    let unsched = client
        .get_unschedulable_replicas(pb::UnschedulableReplicasRequest {
            cluster: "member-1".into(),
            resource: Some(pb::ObjectReference {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: "default".into(),
                name: "train".into(),
            }),
            unschedulable_threshold: 300_000_000_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(unsched.unschedulable_replicas, 0);

    stop_tx.send(()).unwrap();
    server.await.unwrap().unwrap();
}

/// The deprecated `resourceRequest` map (older karmada-schedulers) means the same.
#[test]
fn deprecated_quantity_map_translates_the_same() {
    let catalog = demo_cluster().catalog.clone();
    let new = requirements(&[("nvidia.com/gpu", "2"), ("cpu", "500m")]);
    let old = pb::ReplicaRequirements {
        resource_request: [("nvidia.com/gpu", "2"), ("cpu", "500m")]
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    Quantity {
                        string: Some(v.to_string()),
                    },
                )
            })
            .collect(),
        ..Default::default()
    };
    let a = translate(&new, &catalog).unwrap();
    assert_eq!(a, translate(&old, &catalog).unwrap());
    assert_eq!(a.gpu.gpu_count(), 2);
    assert_eq!(a.cpu_milli, 500);
}
