//! `tessera estimator`: Karmada's scheduler-estimator for this cluster,
//! answered from a mirror of the cluster under its sync gate.
//!
//! karmada-scheduler asks each member cluster's estimator how many replicas of
//! a workload's `ReplicaRequirements` fit there (see [`tessera_estimator`]).
//! This process keeps its own [`Mirror`], fed by the same watchers as the
//! scheduler's ([`crate::run`]: nodes, `GpuNode`s, pods, namespaces,
//! `GpuQueue`s; it reads, never writes) and verifying the pods' signed grants
//! with the scheduler's key, so its ledger is the scheduler's. Each request is
//! turned into the pod one replica would be ([`replica_pod`]: the resource
//! requests as one container's, the node claim's selector, required affinity
//! and tolerations, the namespace and priority class), and that pod goes the
//! way a real one does: [`convert::pod_asks`] reads its asks,
//! [`node_allows`] its node constraints (standalone mode's check), the
//! namespace's queue caps the count by quota, and [`Mirror::estimate`] places
//! replicas one by one with the placement judge on a scratch copy of the
//! ledger. No second fit function.
//!
//! Until every watched kind has been listed once, every RPC answers
//! `UNAVAILABLE` naming what is missing ([`SyncGate`]): an answer from a
//! partial pod list would count GPUs other pods hold as free. The same gate
//! answers `/readyz` on the health port ([`health_router`]), so the pod is
//! Ready exactly when its answers are.

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use k8s_openapi::api::core::v1 as k8s;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::ObjectMeta;
use tessera_estimator::proto::k8s::io::api::core::v1 as core_v1;
use tessera_estimator::{Capacity, Service, TranslateError, pb};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tonic::Status;

use crate::convert;
use crate::gate::SyncGate;
use crate::mirror::{Assumed, SharedMirror};
use crate::run::{ConfigError, MirrorConfig, RawMirrorConfig};
use crate::standalone::node_allows;
use crate::tls::{self, TlsListener};

pub mod unschedulable;

/// Karmada's estimator port (karmada-scheduler's `--scheduler-estimator-port`).
pub const DEFAULT_LISTEN: &str = "0.0.0.0:10352";

/// `/healthz` and `/readyz` (Karmada's own estimator serves its health on 10351).
pub const DEFAULT_HEALTH_LISTEN: &str = "0.0.0.0:10351";

/// Most replicas one answer counts (each costs one placement): a larger
/// answer is this number, which is more than any workload asks.
pub const DEFAULT_REPLICA_LIMIT: u32 = 10_000;

/// The flags of `tessera estimator`, every field optional.
#[derive(Debug, Clone, Default)]
pub struct RawEstimatorConfig {
    pub listen: Option<String>,
    pub health_listen: Option<String>,
    pub cluster_name: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    /// The flags the scheduler shares: policy, keys, GPU-equivalents.
    pub mirror: RawMirrorConfig,
    pub replica_limit: Option<u32>,
}

/// Validated, immutable configuration of `tessera estimator`.
#[derive(Clone)]
pub struct EstimatorConfig {
    pub listen: SocketAddr,
    /// `/healthz` and `/readyz` ([`health_router`]).
    pub health_listen: SocketAddr,
    /// The member cluster's name in Karmada: requests naming another are refused.
    pub cluster_name: String,
    /// TLS on `listen` (HTTP/2 by ALPN, as gRPC clients demand), with client
    /// certificates required when a client CA was given.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    pub mirror: MirrorConfig,
    pub replica_limit: u32,
}

fn invalid(field: &'static str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        problem: problem.into(),
    }
}

impl RawEstimatorConfig {
    /// Checks every flag and reads the key and certificate files (before any
    /// socket is bound).
    pub fn resolve(self) -> Result<EstimatorConfig, ConfigError> {
        let listen_s = self.listen.unwrap_or_else(|| DEFAULT_LISTEN.into());
        let listen: SocketAddr = listen_s
            .parse()
            .map_err(|e| invalid("listen", format!("{listen_s:?}: {e}")))?;
        let health_s = self
            .health_listen
            .unwrap_or_else(|| DEFAULT_HEALTH_LISTEN.into());
        let health_listen: SocketAddr = health_s
            .parse()
            .map_err(|e| invalid("health-listen", format!("{health_s:?}: {e}")))?;
        if health_listen.port() == listen.port() && listen.port() != 0 {
            return Err(invalid(
                "health-listen",
                format!("{health_s} has the port of --listen; use two ports"),
            ));
        }
        let cluster_name = self
            .cluster_name
            .filter(|n| !n.trim().is_empty())
            .ok_or_else(|| {
                invalid(
                    "cluster-name",
                    "is required: the member cluster's name in Karmada (`kubectl get clusters` on the Karmada control plane)",
                )
            })?;
        let tls = match (&self.tls_cert, &self.tls_key) {
            (None, None) => {
                if self.tls_client_ca.is_some() {
                    return Err(invalid(
                        "tls-client-ca",
                        "needs --tls-cert and --tls-key (client certificates are checked over TLS only)",
                    ));
                }
                None
            }
            (Some(cert), Some(key)) => {
                let base = tls::server_config(cert, key, self.tls_client_ca.as_deref()).map_err(
                    |source| ConfigError::Tls {
                        field: "tls-cert",
                        source,
                    },
                )?;
                let mut config = (*base).clone();
                // gRPC is HTTP/2 only; grpc-go clients refuse a server without ALPN h2.
                config.alpn_protocols = vec![b"h2".to_vec()];
                Some(Arc::new(config))
            }
            (Some(_), None) => return Err(invalid("tls-key", "is required with --tls-cert")),
            (None, Some(_)) => return Err(invalid("tls-cert", "is required with --tls-key")),
        };
        let replica_limit = self.replica_limit.unwrap_or(DEFAULT_REPLICA_LIMIT);
        if replica_limit == 0 || replica_limit > i32::MAX as u32 {
            return Err(invalid(
                "replica-limit",
                format!("{replica_limit}: must be between 1 and {}", i32::MAX),
            ));
        }
        Ok(EstimatorConfig {
            listen,
            health_listen,
            cluster_name: cluster_name.trim().to_string(),
            tls,
            mirror: self.mirror.resolve()?,
            replica_limit,
        })
    }
}

/// Why the estimator stopped.
#[derive(Debug, thiserror::Error)]
pub enum EstimatorError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving gRPC: {0}")]
    Serve(#[from] tonic::transport::Error),
    #[error("serving /healthz and /readyz: {0}")]
    Health(std::io::Error),
}

/// A request Karmada sent that cannot be turned into a pod.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplicaPodError {
    #[error(transparent)]
    Translate(#[from] TranslateError),
    #[error("nodeClaim: operator {0:?} is not In, NotIn, Exists, DoesNotExist, Gt or Lt")]
    Operator(String),
    #[error("nodeClaim: a node selector requirement has no key")]
    NoKey,
}

fn requirements(
    rs: &[core_v1::NodeSelectorRequirement],
) -> Result<Option<Vec<k8s::NodeSelectorRequirement>>, ReplicaPodError> {
    if rs.is_empty() {
        return Ok(None);
    }
    rs.iter()
        .map(|r| {
            let operator = r.operator.clone().unwrap_or_default();
            if !matches!(
                operator.as_str(),
                "In" | "NotIn" | "Exists" | "DoesNotExist" | "Gt" | "Lt"
            ) {
                return Err(ReplicaPodError::Operator(operator));
            }
            let key = r.key.clone().filter(|k| !k.is_empty());
            Ok(k8s::NodeSelectorRequirement {
                key: key.ok_or(ReplicaPodError::NoKey)?,
                operator,
                values: (!r.values.is_empty()).then(|| r.values.clone()),
            })
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// The pod one replica of `req` would be: one container requesting the
/// resources, the node claim's selector, required node affinity and
/// tolerations, the namespace (`default` when empty) and priority class.
pub fn replica_pod(req: &pb::ReplicaRequirements) -> Result<k8s::Pod, ReplicaPodError> {
    let requests = tessera_estimator::resources(req)?
        .into_iter()
        .map(|(k, v)| (k, Quantity(v)))
        .collect();
    let mut spec = k8s::PodSpec {
        containers: vec![k8s::Container {
            name: "replica".into(),
            resources: Some(k8s::ResourceRequirements {
                requests: Some(requests),
                ..Default::default()
            }),
            ..Default::default()
        }],
        priority_class_name: (!req.priority_class_name.is_empty())
            .then(|| req.priority_class_name.clone()),
        ..Default::default()
    };
    if let Some(claim) = &req.node_claim {
        if !claim.node_selector.is_empty() {
            spec.node_selector = Some(claim.node_selector.clone().into_iter().collect());
        }
        if let Some(affinity) = tessera_estimator::node_affinity(claim)? {
            let terms = affinity
                .node_selector_terms
                .iter()
                .map(|t| {
                    Ok(k8s::NodeSelectorTerm {
                        match_expressions: requirements(&t.match_expressions)?,
                        match_fields: requirements(&t.match_fields)?,
                    })
                })
                .collect::<Result<Vec<_>, ReplicaPodError>>()?;
            spec.affinity = Some(k8s::Affinity {
                node_affinity: Some(k8s::NodeAffinity {
                    required_during_scheduling_ignored_during_execution: Some(k8s::NodeSelector {
                        node_selector_terms: terms,
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            });
        }
        let tolerations: Vec<k8s::Toleration> = tessera_estimator::tolerations(claim)?
            .into_iter()
            .map(|t| k8s::Toleration {
                key: t.key,
                operator: t.operator,
                value: t.value,
                effect: t.effect,
                toleration_seconds: t.toleration_seconds,
            })
            .collect();
        if !tolerations.is_empty() {
            spec.tolerations = Some(tolerations);
        }
    }
    let namespace = if req.namespace.is_empty() {
        "default".to_string()
    } else {
        req.namespace.clone()
    };
    Ok(k8s::Pod {
        metadata: ObjectMeta {
            name: Some("karmada-replica-estimate".into()),
            namespace: Some(namespace),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    })
}

/// The estimator's state: the mirror, its sync gate, and the most replicas one
/// answer counts.
pub struct MirrorCapacity {
    mirror: SharedMirror,
    gate: SyncGate,
    limit: u32,
    /// Where `GetUnschedulableReplicas` reads workloads and their pods
    /// ([`unschedulable`]); `None`: it answers 0.
    client: Option<kube::Client>,
}

impl MirrorCapacity {
    pub fn new(mirror: SharedMirror, gate: SyncGate, limit: u32) -> MirrorCapacity {
        MirrorCapacity {
            mirror,
            gate,
            limit,
            client: None,
        }
    }

    /// Answers `GetUnschedulableReplicas` from the API server behind `client`.
    pub fn with_client(mut self, client: kube::Client) -> MirrorCapacity {
        self.client = Some(client);
        self
    }
}

impl Capacity for MirrorCapacity {
    fn ready(&self) -> Result<(), Status> {
        if self.gate.is_synced() {
            Ok(())
        } else {
            Err(Status::unavailable(self.gate.not_synced_message()))
        }
    }

    fn max_available(
        &self,
        reqs: &pb::ReplicaRequirements,
        assumed: &[(pb::ReplicaRequirements, u32)],
    ) -> Result<u32, Status> {
        let mut m = self.mirror.lock();
        let catalog = m.cluster().catalog.clone();
        let read = |what: &str, r: &pb::ReplicaRequirements| {
            let pod =
                replica_pod(r).map_err(|e| Status::invalid_argument(format!("{what}: {e}")))?;
            let asks = convert::pod_asks(&pod, &catalog);
            let req = asks
                .request
                .map_err(|e| Status::invalid_argument(format!("{what}: {e}")))?;
            let host = asks
                .host
                .map_err(|e| Status::invalid_argument(format!("{what}: {e}")))?;
            Ok::<_, Status>((pod, req, host))
        };
        let (pod, req, host) = read("replicaRequirements", reqs)?;
        let before: Vec<_> = assumed
            .iter()
            .enumerate()
            .map(|(i, (r, n))| read(&format!("assumedWorkloads component {i}"), r).map(|a| (a, *n)))
            .collect::<Result<_, _>>()?;
        // One node check per assumed pod (the same closure, so one type).
        let allows: Vec<_> = before
            .iter()
            .map(|((p, _, _), _)| move |f: &crate::convert::NodeFacts| node_allows(p, f))
            .collect();
        let placed_first: Vec<Assumed<'_>> = before
            .iter()
            .zip(&allows)
            .map(|(((_, req, host), n), allows)| Assumed {
                req,
                host,
                eligible: allows,
                replicas: *n,
            })
            .collect();
        let estimate = m
            .estimate_after(
                &placed_first,
                &pod,
                &req,
                &host,
                |f| node_allows(&pod, f),
                self.limit,
            )
            .map_err(|e| Status::internal(format!("ledger: {e}")))?;
        Ok(estimate.replicas)
    }

    fn unschedulable_replicas<'a>(
        &'a self,
        resource: &'a pb::ObjectReference,
        threshold_ns: i64,
    ) -> Pin<Box<dyn Future<Output = Result<u32, Status>> + Send + 'a>> {
        Box::pin(async move {
            match &self.client {
                Some(c) => unschedulable::unschedulable_replicas(c, resource, threshold_ns).await,
                None => Ok(0),
            }
        })
    }
}

/// Runs the estimator until `shutdown` resolves: binds `config.listen` first
/// (a port in use fails before anything is watched), then watches the cluster
/// and serves.
pub async fn run(
    config: EstimatorConfig,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), EstimatorError> {
    let bind = |addr: SocketAddr| async move {
        TcpListener::bind(addr)
            .await
            .map_err(|source| EstimatorError::Bind { addr, source })
    };
    let addr = config.listen;
    let listener = bind(addr).await?;
    let health_listener = bind(config.health_listen).await?;
    let mirror = SharedMirror::new(config.mirror.mirror());
    let gate = SyncGate::new();
    let wake = Arc::new(Notify::new());
    let mut tasks = tokio::task::JoinSet::new();
    crate::run::watch_placement_state(&mut tasks, &client, &mirror, &wake, &gate).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let health = tokio::spawn(
        axum::serve(health_listener, health_router(gate.clone()))
            .with_graceful_shutdown(stopped())
            .into_future(),
    );
    tracing::info!(
        listen = %addr,
        health = %config.health_listen,
        cluster = %config.cluster_name,
        tls = config.tls.is_some(),
        policy = %config.mirror.policy,
        "serving Karmada's scheduler-estimator"
    );
    let service = Service::new(
        config.cluster_name,
        MirrorCapacity::new(mirror, gate, config.replica_limit).with_client(client.clone()),
    );
    let served = serve(listener, config.tls, service, shutdown).await;
    let _ = stop_tx.send(true);
    tasks.abort_all();
    served?;
    match health.await {
        Ok(r) => r.map_err(EstimatorError::Health),
        Err(e) => Err(EstimatorError::Health(std::io::Error::other(e))),
    }
}

/// `/healthz` (200 while the process runs) and `/readyz` (200 once `gate` is
/// open, 503 naming the kinds not listed yet: the RPCs answer `UNAVAILABLE`
/// until then). Needs no socket.
pub fn health_router(gate: SyncGate) -> axum::Router {
    use axum::http::StatusCode;
    use axum::routing::get;
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let gate = gate.clone();
                async move {
                    if gate.is_synced() {
                        (StatusCode::OK, "synced\n".to_string())
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not synced: {}\n", gate.not_synced_message()),
                        )
                    }
                }
            }),
        )
}

/// Serves `service` on `listener` (over TLS with `tls`) until `shutdown` resolves.
pub async fn serve<C: Capacity>(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    service: Service<C>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), EstimatorError> {
    let router = tonic::transport::Server::builder().add_service(service.server());
    match tls {
        None => {
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
        Some(tls) => {
            let listener = TlsListener::new(listener, tls, "estimator");
            let incoming = futures::stream::unfold(listener, |mut l| async move {
                let (io, _) = axum::serve::Listener::accept(&mut l).await;
                Some((Ok::<_, std::io::Error>(GrpcTls(io)), l))
            });
            router
                .serve_with_incoming_shutdown(incoming, shutdown)
                .await?
        }
    }
    Ok(())
}

/// A TLS connection as tonic takes it (tonic knows rustls streams only with its
/// own TLS features, which would bring a second TLS set-up).
struct GrpcTls(tokio_rustls::server::TlsStream<tokio::net::TcpStream>);

impl tonic::transport::server::Connected for GrpcTls {
    type ConnectInfo = Option<SocketAddr>;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().0.peer_addr().ok()
    }
}

impl AsyncRead for GrpcTls {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcTls {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}
