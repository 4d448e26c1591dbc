//! Wiring: configuration (raw → validated), the watchers that feed the mirror,
//! and the servers and loops of one scheduler process. [`run`] stops when its
//! shutdown future resolves; the binary owns signals, logging and exit codes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::events::Reporter;
use kube::runtime::watcher::{self, Event};
use tessera_api::{GpuNode, GpuQueue, PodGroup};
use tessera_core::policy::{self, PolicyArgs};
use tokio::sync::{Notify, watch};

use crate::binder::Binder;
use crate::events::Publisher;
use crate::extender::{ExtenderState, ops_router, router};
use crate::gate::{Kind, SyncGate};
use crate::leader::{self, Leadership};
use crate::metrics::Metrics;
use crate::mirror::{Mirror, SharedMirror};
use crate::standalone::Standalone;
use crate::tls::{TlsError, TlsListener};
use crate::webhook::{self};

mod config;
pub use config::{
    Config, ConfigError, MirrorConfig, Mode, RawConfig, RawMirrorConfig, VerifyKeyError,
    WebhookServe, parse_gpu_equivalents, read_verify_keys,
};

/// Why the scheduler stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving: {0}")]
    Serve(std::io::Error),
    #[error(transparent)]
    Webhook(#[from] TlsError),
    #[error(transparent)]
    Leader(#[from] leader::LeaderError),
}

/// A client from the in-cluster service account or the local kubeconfig
/// (HTTP/2 where the API server offers it, see [`crate::client`]).
pub async fn connect() -> Result<kube::Client, kube::Error> {
    crate::client::connect().await
}

/// Whether applying a change is worth a scheduling pass: `()` always is; a
/// `bool` says (false for updates placement does not read, such as the agents'
/// status republishing and nodes' heartbeats).
trait Wakes {
    fn wakes(self) -> bool;
}

impl Wakes for () {
    fn wakes(self) -> bool {
        true
    }
}

impl Wakes for bool {
    fn wakes(self) -> bool {
        self
    }
}

/// Feeds one kind of object into the mirror until the stream ends (it does not: the watcher retries).
async fn feed<K, F, W>(
    api: Api<K>,
    mirror: SharedMirror,
    wake: Arc<Notify>,
    gate: (SyncGate, Kind),
    apply: F,
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
    F: Fn(&mut Mirror, Change<K>) -> W,
    W: Wakes,
{
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream.into_stream());
    let mut buffer: Vec<K> = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => buffer.clear(),
            Ok(Event::InitApply(o)) => buffer.push(o),
            Ok(Event::InitDone) => {
                let all = std::mem::take(&mut buffer);
                let _ = apply(&mut mirror.lock(), Change::Replace(all));
                gate.0.mark(gate.1);
                wake.notify_one();
            }
            Ok(Event::Apply(o)) => {
                if apply(&mut mirror.lock(), Change::Upsert(o)).wakes() {
                    wake.notify_one();
                }
            }
            Ok(Event::Delete(o)) => {
                let _ = apply(&mut mirror.lock(), Change::Delete(o));
                wake.notify_one();
            }
            Err(e) => tracing::warn!(error = %e, "watch failed; retrying"),
        }
    }
}

/// One change from a watch stream.
/// Whether the API server serves a custom resource: false only on a 404 (the
/// CRD is not installed; Helm does not add new CRDs on upgrade). Any other
/// answer — including an error — leaves the watch to decide.
async fn served<K>(api: &Api<K>) -> bool
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let listed = api.list(&kube::api::ListParams::default().limit(1)).await;
    !matches!(listed, Err(kube::Error::Api(e)) if e.code == 404)
}

pub enum Change<K> {
    Replace(Vec<K>),
    Upsert(K),
    Delete(K),
}

fn slim(mut p: Pod) -> Pod {
    // Managed fields are large and never read.
    p.metadata.managed_fields = None;
    p
}

/// Spawns the watchers that feed `mirror` what placement reads (nodes,
/// `GpuNode`s, pods, namespaces and `GpuQueue`s; the queues' gate kind is
/// marked at once where the CRD is not installed), each marking its kind in
/// `gate` at its first complete list. The scheduler adds what it needs besides;
/// `tessera estimator` watches these only.
pub(crate) async fn watch_placement_state(
    tasks: &mut tokio::task::JoinSet<()>,
    client: &kube::Client,
    mirror: &SharedMirror,
    wake: &Arc<Notify>,
    gate: &SyncGate,
) {
    tasks.spawn(feed(
        Api::<Node>::all(client.clone()),
        mirror.clone(),
        wake.clone(),
        (gate.clone(), Kind::Nodes),
        |m, c| match c {
            Change::Replace(v) => {
                m.replace_nodes(v);
                true
            }
            Change::Upsert(n) => m.upsert_node(n),
            Change::Delete(n) => {
                m.remove_node(n.metadata.name.as_deref().unwrap_or(""));
                true
            }
        },
    ));
    tasks.spawn(feed(
        Api::<GpuNode>::all(client.clone()),
        mirror.clone(),
        wake.clone(),
        (gate.clone(), Kind::Inventory),
        |m, c| match c {
            Change::Replace(v) => {
                m.replace_inventory(v);
                true
            }
            Change::Upsert(n) => m.upsert_inventory(n),
            Change::Delete(n) => {
                m.remove_inventory(n.metadata.name.as_deref().unwrap_or(""));
                true
            }
        },
    ));
    tasks.spawn(feed(
        Api::<Pod>::all(client.clone()),
        mirror.clone(),
        wake.clone(),
        (gate.clone(), Kind::Pods),
        |m, c| match c {
            Change::Replace(v) => m.replace_pods(v.into_iter().map(slim)),
            Change::Upsert(p) => m.upsert_pod(slim(p)),
            Change::Delete(p) => m.remove_pod(p.metadata.uid.as_deref().unwrap_or("")),
        },
    ));
    tasks.spawn(feed(
        Api::<Namespace>::all(client.clone()),
        mirror.clone(),
        wake.clone(),
        (gate.clone(), Kind::Namespaces),
        |m, c| match c {
            Change::Replace(v) => m.replace_namespaces(v),
            Change::Upsert(n) => m.upsert_namespace(n),
            Change::Delete(n) => m.remove_namespace(n.metadata.name.as_deref().unwrap_or("")),
        },
    ));
    let queues = Api::<GpuQueue>::all(client.clone());
    if served(&queues).await {
        tasks.spawn(feed(
            queues,
            mirror.clone(),
            wake.clone(),
            (gate.clone(), Kind::Queues),
            |m, c| match c {
                Change::Replace(v) => m.replace_queues(v),
                Change::Upsert(q) => m.upsert_queue(q),
                Change::Delete(q) => m.remove_queue(q.metadata.name.as_deref().unwrap_or("")),
            },
        ));
    } else {
        tracing::warn!(
            "the GpuQueue CRD is not installed: no queue quotas (kubectl apply -f deploy/helm/tessera/crds/gpuqueues.tessera.io.yaml, then restart)"
        );
        gate.mark(Kind::Queues);
    }
}

/// Runs the scheduler until `shutdown` resolves.
pub async fn run(
    config: Config,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    let (stop_tx, stop_rx) = watch::channel(false);
    let stopped = move || {
        let mut rx = stop_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let policy = policy::by_name(&config.policy, &PolicyArgs::default())
        .unwrap_or_else(|_| unreachable!("policy validated in resolve"));
    let keys = tessera_core::allocation::KeyRing::new(config.signing_key.clone())
        .with_verify_only(config.verify_keys.clone());
    let mut m = Mirror::new(policy, keys);
    m.set_gpu_equivalents(config.gpu_equivalents.clone());
    m.set_inventory_ttl(config.gpunode_ttl);
    m.set_trust_kueue(config.trust_kueue_admission);
    if let Some((half_life, weight)) = config.usage_history {
        m.set_usage_history(half_life, weight);
    }
    let mirror = SharedMirror::new(m);
    let metrics = Arc::new(Metrics::new());
    let wake = Arc::new(Notify::new());
    let gate = if config.dra {
        SyncGate::with_dra()
    } else {
        SyncGate::new()
    };
    let leader = match &config.lease {
        None => Leadership::always(),
        Some(_) => Leadership::default(),
    };

    let mut tasks = tokio::task::JoinSet::new();
    watch_placement_state(&mut tasks, &client, &mirror, &wake, &gate).await;
    // PodDisruptionBudgets, for preemption: nothing is preempted until they are
    // listed (the mirror says so), so they need no place in the sync gate.
    tasks.spawn(feed(
        Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::all(client.clone()),
        mirror.clone(),
        wake.clone(),
        (SyncGate::synced(), Kind::Pods),
        |m, c| match c {
            Change::Replace(v) => m.replace_pdbs(v),
            Change::Upsert(p) => m.upsert_pdb(p),
            Change::Delete(p) => m.remove_pdb(&p),
        },
    ));
    // Gangs (scheduler-plugins' PodGroup): without its CRD, gang pods wait with
    // an event saying their PodGroup does not exist. PodGroups do not hold the
    // sync gate (hence a gate of their own, open): until a group is listed its
    // members only wait, nothing is placed wrongly.
    let groups = Api::<PodGroup>::all(client.clone());
    if served(&groups).await {
        let (group_gate, wake) = (SyncGate::synced(), wake.clone());
        tasks.spawn(feed(
            groups,
            mirror.clone(),
            wake,
            (group_gate, Kind::Pods),
            |m, c| match c {
                Change::Replace(v) => m.replace_pod_groups(v),
                Change::Upsert(g) => m.upsert_pod_group(g),
                Change::Delete(g) => m.remove_pod_group(&g),
            },
        ));
    } else {
        tracing::info!("no PodGroup CRD (scheduling.x-k8s.io): gangs are off");
    }

    // DRA (standalone `--dra`): claims, slices and classes, or why not.
    let dra = if config.dra {
        match crate::dra::watch::served(&client).await {
            Ok(()) => {
                let view = crate::dra::view::SharedDraView::new();
                crate::dra::watch::spawn(
                    &mut tasks,
                    &client,
                    view.clone(),
                    wake.clone(),
                    gate.clone(),
                );
                crate::standalone::Dra::On(view)
            }
            Err(why) => {
                tracing::error!(
                    reason = %why,
                    "--dra is set, but the API server does not serve resource.k8s.io/v1 (Kubernetes 1.34 or later): pods with ResourceClaims are refused with an event; every other pod is placed as before"
                );
                for k in Kind::DRA {
                    gate.mark(k);
                }
                crate::standalone::Dra::Unserved(why)
            }
        }
    } else {
        crate::standalone::Dra::Off
    };

    let binder = Binder::new(client.clone(), mirror.clone(), leader.clone())
        .with_gate(gate.clone())
        .with_scheduler_names(config.scheduler_names.clone());
    let state = ExtenderState {
        mirror: mirror.clone(),
        binder: Some(binder.clone()),
        metrics: metrics.clone(),
        leader: leader.clone(),
        gate: gate.clone(),
        scheduler_names: config.scheduler_names.clone().into(),
        // Behind a Service any replica may get `bind`: followers forward it to
        // the elected leader (extender mode; `follow` leads with its own
        // kube-scheduler, which calls it on loopback).
        peers: config
            .lease
            .as_ref()
            .filter(|l| config.mode == Mode::Extender && l.role == leader::LeaseRole::Elect)
            .map(|l| {
                crate::extender::forward::Peers::new(&config.signing_key)
                    .with_lease(l.duration, l.retry_period)
            }),
    };
    let bind = |addr: SocketAddr| async move {
        tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| RunError::Bind { addr, source })
    };
    let ops_listener = bind(config.metrics_listen).await?;
    let verbs_listener = match config.mode {
        Mode::Extender => Some(bind(config.listen).await?),
        Mode::Standalone => None,
    };
    tracing::info!(extender = ?verbs_listener.as_ref().map(|_| config.listen), metrics = %config.metrics_listen, mode = ?config.mode, policy = %config.policy, "serving");
    let ops = tokio::spawn(
        axum::serve(ops_listener, ops_router(state.clone()))
            .with_graceful_shutdown(stopped())
            .into_future(),
    );
    let http = verbs_listener.map(|l| match config.extender_tls.clone() {
        None => tokio::spawn(
            axum::serve(l, router(state))
                .with_graceful_shutdown(stopped())
                .into_future(),
        ),
        Some(tls) => tokio::spawn(
            axum::serve(TlsListener::new(l, tls, "extender"), router(state))
                .with_graceful_shutdown(stopped())
                .into_future(),
        ),
    });

    let hook = config.webhook.clone().map(|w| {
        tracing::info!(addr = %w.addr, "serving the admission webhook");
        // With --dra, default-scheduler pods whose claims ask Tessera's classes
        // are handed to Tessera: their claims are read to tell.
        let hook_config = if config.dra {
            let mut c = (*w.config).clone();
            c.claims_client = Some(webhook::ClaimsClient(client.clone()));
            Arc::new(c)
        } else {
            w.config
        };
        tokio::spawn(webhook::serve(w.addr, w.tls, hook_config, stopped()))
    });

    let election = config.lease.clone().map(|lease| {
        let (client, flag, stop) = (client.clone(), leader.clone(), stopped());
        tokio::spawn(async move { leader::run(client, lease, flag, stop).await })
    });

    tasks.spawn(crate::queue_status::run(
        client.clone(),
        mirror.clone(),
        leader.clone(),
        gate.clone(),
        stopped(),
    ));

    // Extender mode: kube-scheduler never calls `preempt` for tessera.io pods
    // (its dry run counts no victims for resources it ignores), so Tessera
    // preempts for the pods it marked unschedulable (see crate::preemptor).
    if config.mode == Mode::Extender {
        let recorder = Publisher::new(
            client.clone(),
            Reporter {
                controller: config.scheduler_name.clone(),
                instance: config.lease.as_ref().map(|l| l.identity.clone()),
            },
        );
        let mut preemptor = crate::preemptor::Preemptor::new(
            mirror.clone(),
            client.clone(),
            Some(crate::events::EventSink::spawn(recorder)),
        );
        preemptor.metrics = Some(metrics.clone());
        tasks.spawn(crate::preemptor::run_for_extender(
            preemptor,
            config.scheduler_names.clone(),
            leader.clone(),
            gate.clone(),
            std::time::Duration::from_secs(5),
            stopped(),
        ));
    }

    let standalone = (config.mode == Mode::Standalone).then(|| {
        let recorder = Publisher::new(
            client.clone(),
            Reporter {
                controller: config.scheduler_name.clone(),
                instance: config.lease.as_ref().map(|l| l.identity.clone()),
            },
        );
        let s = Standalone::new(
            config.scheduler_name.clone(),
            mirror.clone(),
            binder,
            leader.clone(),
            metrics.clone(),
            Some(recorder),
            wake.clone(),
        )
        .with_gate(gate.clone())
        .with_dra(dra);
        tokio::spawn(s.run(stopped()))
    });

    shutdown.await;
    tracing::info!("shutting down");
    let _ = stop_tx.send(true);
    tasks.abort_all();
    if let Some(s) = standalone {
        let _ = s.await;
    }
    if let Some(e) = election {
        match e.await {
            Ok(r) => r?,
            Err(e) => tracing::warn!(error = %e, "leader election task failed"),
        }
    }
    if let Some(h) = hook
        && let Ok(r) = h.await
    {
        r?;
    }
    for h in http.into_iter().chain([ops]) {
        match h.await {
            Ok(r) => r.map_err(RunError::Serve)?,
            Err(e) => return Err(RunError::Serve(std::io::Error::other(e))),
        }
    }
    Ok(())
}
