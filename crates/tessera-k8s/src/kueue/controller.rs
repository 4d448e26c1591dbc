//! `tessera kueue-admission`: the admission-check controller as it runs.
//!
//! Watches `Workload`s (every namespace) and `AdmissionCheck`s, and the
//! cluster through [`crate::run::watch_placement_state`] into its own mirror.
//! A pass runs at every change of either, and at least every
//! [`RawKueueConfig::interval`]: it marks this controller's AdmissionChecks
//! `Active` (a ClusterQueue whose check is not Active admits nothing), then
//! judges every workload with quota reserved whose check of ours is
//! `Pending` ([`super::check::judge`]) and writes what changed. No pass runs
//! before the mirror's sync gate is open and both Kueue kinds are listed.
//!
//! Writes: a merge patch of the status subresource with
//! `metadata.resourceVersion` as the precondition (Kueue's own controllers
//! patch the status subresource too). The patch replaces
//! `status.admissionChecks` whole, every other check's entry as read; a 409
//! means the object changed since it was read, so it is read again and the
//! next pass judges the fresh object: a stale view never overwrites a newer one.
//!
//! One writer: two controllers would judge the same room twice. With
//! `--leader-elect` the replicas elect one on the Lease
//! `tessera-kueue-admission` (kube-scheduler's timings, [`crate::leader`]):
//! only the leader passes, and each write is made only while it still leads
//! (leadership is a deadline, so a replica that stopped renewing stops
//! writing before another may start). Without it, run one replica.

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;

use super::CONTROLLER_NAME;
use super::api::{AdmissionCheck, CheckState, Condition, Workload};
use super::check::{self, Decision, Started};
use crate::gate::SyncGate;
use crate::leader::{self, Leadership, LeaseConfig, LeaseRole};
use crate::mirror::SharedMirror;
use crate::run::{ConfigError, MirrorConfig, RawMirrorConfig};

/// `/healthz` and `/readyz`.
pub const DEFAULT_HEALTH_LISTEN: &str = "0.0.0.0:10361";

/// A pass at least this often, changes or not (a workload waiting for room
/// is judged again when pods leave; this bounds a missed wake-up).
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(10);

/// How many times one pass re-reads and re-judges after 409s.
const CONFLICT_ROUNDS: usize = 3;

/// The flags of `tessera kueue-admission`, every field optional.
#[derive(Debug, Clone, Default)]
pub struct RawKueueConfig {
    pub health_listen: Option<String>,
    /// The flags the scheduler shares: policy, keys, GPU-equivalents.
    pub mirror: RawMirrorConfig,
    /// Seconds between passes when nothing changes.
    pub interval_s: Option<u64>,
    /// Elect one writer among replicas on [`LEASE_NAME`] in `lease_namespace`.
    pub leader_elect: bool,
    /// This replica's identity on the Lease (the pod name; `$HOSTNAME`).
    pub identity: Option<String>,
    pub lease_namespace: Option<String>,
    /// The Lease's timings (tests); kube-scheduler's by default.
    pub lease_timings: Option<(Duration, Duration, Duration)>,
}

/// The Lease the replicas of `tessera kueue-admission` elect their writer on.
pub const LEASE_NAME: &str = "tessera-kueue-admission";

/// Validated configuration of `tessera kueue-admission`.
#[derive(Clone)]
pub struct KueueConfig {
    pub health_listen: SocketAddr,
    pub mirror: MirrorConfig,
    pub interval: Duration,
    /// `None`: one replica, always writing.
    pub lease: Option<LeaseConfig>,
}

impl RawKueueConfig {
    /// Checks every flag and reads the key files (before any socket is bound).
    pub fn resolve(self) -> Result<KueueConfig, ConfigError> {
        let health_s = self
            .health_listen
            .unwrap_or_else(|| DEFAULT_HEALTH_LISTEN.into());
        let health_listen: SocketAddr = health_s.parse().map_err(|e| ConfigError::Invalid {
            field: "health-listen",
            problem: format!("{health_s:?}: {e}"),
        })?;
        let interval = match self.interval_s {
            None => DEFAULT_INTERVAL,
            Some(0) => {
                return Err(ConfigError::Invalid {
                    field: "interval",
                    problem: "0: must be at least 1 second".into(),
                });
            }
            Some(s) => Duration::from_secs(s),
        };
        let lease = if self.leader_elect {
            let identity =
                self.identity
                    .filter(|s| !s.is_empty())
                    .ok_or_else(|| ConfigError::Invalid {
                        field: "identity",
                        problem:
                            "empty: --leader-elect needs this replica's name ($HOSTNAME in a pod)"
                                .into(),
                    })?;
            let namespace = self
                .lease_namespace
                .unwrap_or_else(|| "tessera-system".into());
            let mut l = LeaseConfig::new(&namespace, LEASE_NAME, &identity, LeaseRole::Elect);
            if let Some((duration, renew, retry)) = self.lease_timings {
                (l.duration, l.renew_deadline, l.retry_period) = (duration, renew, retry);
            }
            Some(l)
        } else {
            None
        };
        Ok(KueueConfig {
            health_listen,
            mirror: self.mirror.resolve()?,
            interval,
            lease,
        })
    }
}

/// Why the controller stopped.
#[derive(Debug, thiserror::Error)]
pub enum KueueError {
    #[error("binding {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("serving /healthz and /readyz: {0}")]
    Health(std::io::Error),
}

/// The Kueue objects as the watches last showed them.
#[derive(Default)]
pub struct KueueObjects {
    workloads: BTreeMap<String, Workload>,
    checks: BTreeMap<String, AdmissionCheck>,
    workloads_listed: bool,
    checks_listed: bool,
}

impl KueueObjects {
    /// Both kinds listed once.
    pub fn listed(&self) -> bool {
        self.workloads_listed && self.checks_listed
    }
}

/// Shared between the watches and the loop.
pub type SharedObjects = Arc<Mutex<KueueObjects>>;

fn lock(o: &SharedObjects) -> std::sync::MutexGuard<'_, KueueObjects> {
    o.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

async fn feed<K>(
    api: Api<K>,
    objects: SharedObjects,
    wake: Arc<Notify>,
    apply: impl Fn(&mut KueueObjects, Option<Vec<K>>, Option<(K, bool)>),
) where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let mut stream = std::pin::pin!(stream.into_stream());
    let mut buffer: Vec<K> = Vec::new();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Init) => buffer.clear(),
            Ok(Event::InitApply(o)) => buffer.push(o),
            Ok(Event::InitDone) => {
                apply(&mut lock(&objects), Some(std::mem::take(&mut buffer)), None)
            }
            Ok(Event::Apply(o)) => apply(&mut lock(&objects), None, Some((o, true))),
            Ok(Event::Delete(o)) => apply(&mut lock(&objects), None, Some((o, false))),
            Err(e) => {
                tracing::warn!(error = %e, "kueue watch failed; retrying");
                continue;
            }
        }
        wake.notify_one();
    }
}

/// Spawns the watches of `Workload`s and `AdmissionCheck`s into `objects`.
pub fn watch_kueue(
    tasks: &mut tokio::task::JoinSet<()>,
    client: &kube::Client,
    objects: &SharedObjects,
    wake: &Arc<Notify>,
) {
    tasks.spawn(feed(
        Api::<Workload>::all(client.clone()),
        objects.clone(),
        wake.clone(),
        |o, all, one| {
            if let Some(all) = all {
                o.workloads = all.into_iter().map(|w| (w.key(), w)).collect();
                o.workloads_listed = true;
            }
            if let Some((w, present)) = one {
                if present {
                    o.workloads.insert(w.key(), w);
                } else {
                    o.workloads.remove(&w.key());
                }
            }
        },
    ));
    tasks.spawn(feed(
        Api::<AdmissionCheck>::all(client.clone()),
        objects.clone(),
        wake.clone(),
        |o, all, one| {
            let name = |c: &AdmissionCheck| c.metadata.name.clone().unwrap_or_default();
            if let Some(all) = all {
                o.checks = all.into_iter().map(|c| (name(&c), c)).collect();
                o.checks_listed = true;
            }
            if let Some((c, present)) = one {
                if present {
                    o.checks.insert(name(&c), c);
                } else {
                    o.checks.remove(&name(&c));
                }
            }
        },
    ));
}

fn now() -> String {
    let t = jiff::Timestamp::now();
    jiff::Timestamp::from_second(t.as_second())
        .unwrap_or(t)
        .to_string()
}

/// What one pass did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PassReport {
    /// Workloads whose check was written, `namespace/name` and the state.
    pub written: Vec<(String, CheckState)>,
    /// Writes refused with 409 (read again, judged at the next round).
    pub conflicts: usize,
    /// AdmissionChecks marked Active.
    pub activated: Vec<String>,
}

/// One pass: activate our AdmissionChecks, judge the workloads, write what
/// changed; re-read and re-judge after conflicts (a few rounds). Does nothing
/// (an empty report) before the gate is open and the Kueue kinds are listed.
pub async fn pass(
    client: &kube::Client,
    mirror: &SharedMirror,
    gate: &SyncGate,
    objects: &SharedObjects,
) -> PassReport {
    pass_leading(client, mirror, gate, objects, &Leadership::always()).await
}

/// [`pass`] by a replica that writes only while `leader` says it leads
/// (checked before the pass and before each write).
pub async fn pass_leading(
    client: &kube::Client,
    mirror: &SharedMirror,
    gate: &SyncGate,
    objects: &SharedObjects,
    leader: &Leadership,
) -> PassReport {
    let mut report = PassReport::default();
    if !gate.is_synced() || !lock(objects).listed() || !leader.is_leader() {
        return report;
    }
    activate(client, objects, &mut report).await;
    for _ in 0..CONFLICT_ROUNDS {
        let conflicts = judge_and_write(client, mirror, objects, leader, &mut report).await;
        if conflicts == 0 {
            break;
        }
        report.conflicts += conflicts;
    }
    report
}

/// The names of the AdmissionChecks this controller answers.
fn our_checks(o: &KueueObjects) -> Vec<String> {
    o.checks
        .iter()
        .filter(|(_, c)| c.spec.controller_name == CONTROLLER_NAME)
        .map(|(n, _)| n.clone())
        .collect()
}

async fn activate(client: &kube::Client, objects: &SharedObjects, report: &mut PassReport) {
    let todo: Vec<(String, String, Vec<Condition>, Option<i64>)> = {
        let o = lock(objects);
        o.checks
            .values()
            .filter(|c| c.spec.controller_name == CONTROLLER_NAME)
            .filter(|c| {
                !c.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|k| k.type_ == "Active" && k.status == "True")
                })
            })
            .map(|c| {
                (
                    c.metadata.name.clone().unwrap_or_default(),
                    c.metadata.resource_version.clone().unwrap_or_default(),
                    c.status.clone().map(|s| s.conditions).unwrap_or_default(),
                    c.metadata.generation,
                )
            })
            .collect()
    };
    let api = Api::<AdmissionCheck>::all(client.clone());
    for (name, rv, mut conditions, generation) in todo {
        conditions.retain(|c| c.type_ != "Active");
        conditions.push(Condition {
            type_: "Active".into(),
            status: "True".into(),
            reason: "Active".into(),
            message: "Tessera answers this check with its placement engine".into(),
            last_transition_time: Some(now()),
            observed_generation: generation,
        });
        let patch = json!({
            "metadata": {"resourceVersion": rv},
            "status": {"conditions": conditions},
        });
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(c) => {
                lock(objects).checks.insert(name.clone(), c);
                report.activated.push(name);
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                report.conflicts += 1;
                if let Ok(c) = api.get_status(&name).await {
                    lock(objects).checks.insert(name, c);
                }
            }
            Err(e) => tracing::warn!(check = %name, error = %e, "marking AdmissionCheck Active"),
        }
    }
}

/// Workloads with quota reserved, not finished, listing one of `ours`:
/// those whose check is Ready (started) and those where it is Pending, the
/// latter in creation order (then by key).
fn select<'o>(o: &'o KueueObjects, ours: &[String]) -> (Vec<&'o Workload>, Vec<&'o Workload>) {
    let mut started = Vec::new();
    let mut pending = Vec::new();
    for w in o.workloads.values() {
        if !w.has_quota_reservation() || w.is_finished() {
            continue;
        }
        let states: Vec<CheckState> = ours
            .iter()
            .filter_map(|n| w.check(n))
            .map(|c| c.state)
            .collect();
        if states.contains(&CheckState::Pending) {
            pending.push(w);
        } else if states.contains(&CheckState::Ready) {
            started.push(w);
        }
    }
    pending.sort_by(|a, b| {
        let t = |w: &Workload| w.metadata.creation_timestamp.as_ref().map(|t| t.0);
        t(a).cmp(&t(b)).then_with(|| a.key().cmp(&b.key()))
    });
    (started, pending)
}

/// The merge patch that sets `decision` on the entries of `ours` that are
/// Pending, or `None` when every such entry says so already.
pub fn check_patch(w: &Workload, ours: &[String], decision: &Decision, at: &str) -> Option<Value> {
    let status = w.status.as_ref()?;
    if status
        .admission_checks
        .iter()
        .any(|e| e.state == CheckState::Unknown)
    {
        // The whole list is written back: never with a state we could not read.
        return None;
    }
    let mut changed = false;
    let mut entries = status.admission_checks.clone();
    for e in &mut entries {
        if !ours.contains(&e.name) || e.state != CheckState::Pending {
            continue;
        }
        if e.state == decision.state && e.message == decision.message {
            continue;
        }
        if e.state != decision.state {
            e.last_transition_time = at.to_string();
        }
        e.state = decision.state;
        e.message = decision.message.clone();
        changed = true;
    }
    changed.then(|| {
        json!({
            "metadata": {"resourceVersion": w.metadata.resource_version.clone().unwrap_or_default()},
            "status": {"admissionChecks": entries},
        })
    })
}

/// Judges and writes once; returns the number of 409s.
async fn judge_and_write(
    client: &kube::Client,
    mirror: &SharedMirror,
    objects: &SharedObjects,
    leader: &Leadership,
    report: &mut PassReport,
) -> usize {
    let writes: Vec<(String, String, Value, CheckState)> = {
        let o = lock(objects);
        let ours = our_checks(&o);
        if ours.is_empty() {
            return 0;
        }
        let (started, pending) = select(&o, &ours);
        if pending.is_empty() {
            return 0;
        }
        let started: Vec<Started<'_>> = started
            .into_iter()
            .map(|workload| Started { workload })
            .collect();
        let decisions = check::judge(&mut mirror.lock(), &started, &pending);
        let at = now();
        pending
            .iter()
            .zip(&decisions)
            .filter_map(|(w, d)| {
                let patch = check_patch(w, &ours, d, &at)?;
                Some((
                    w.metadata
                        .namespace
                        .clone()
                        .unwrap_or_else(|| "default".into()),
                    w.metadata.name.clone().unwrap_or_default(),
                    patch,
                    d.state,
                ))
            })
            .collect()
    };
    let mut conflicts = 0;
    for (ns, name, patch, state) in writes {
        if !leader.is_leader() {
            tracing::info!("no longer leading: the rest of this pass is not written");
            break;
        }
        let api = Api::<Workload>::namespaced(client.clone(), &ns);
        match api
            .patch_status(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(w) => {
                tracing::info!(workload = %format!("{ns}/{name}"), state = state.as_str(), "admission check written");
                lock(objects).workloads.insert(w.key(), w);
                report.written.push((format!("{ns}/{name}"), state));
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {
                conflicts += 1;
                match api.get_status(&name).await {
                    Ok(w) => {
                        lock(objects).workloads.insert(w.key(), w);
                    }
                    Err(e) => {
                        tracing::warn!(workload = %format!("{ns}/{name}"), error = %e, "re-reading after a conflict")
                    }
                }
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {
                lock(objects).workloads.remove(&format!("{ns}/{name}"));
            }
            Err(e) => {
                tracing::warn!(workload = %format!("{ns}/{name}"), error = %e, "writing the admission check")
            }
        }
    }
    conflicts
}

/// Runs the controller until `shutdown` resolves: binds the health port
/// first, then watches and passes.
pub async fn run(
    config: KueueConfig,
    client: kube::Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), KueueError> {
    let addr = config.health_listen;
    let health_listener = TcpListener::bind(addr)
        .await
        .map_err(|source| KueueError::Bind { addr, source })?;
    let mirror = SharedMirror::new(config.mirror.mirror());
    let gate = SyncGate::new();
    let wake = Arc::new(Notify::new());
    let objects: SharedObjects = Arc::default();
    let mut tasks = tokio::task::JoinSet::new();
    crate::run::watch_placement_state(&mut tasks, &client, &mirror, &wake, &gate).await;
    watch_kueue(&mut tasks, &client, &objects, &wake);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut stopped = stop_rx.clone();
    let health = tokio::spawn(
        axum::serve(
            health_listener,
            crate::estimator::health_router(gate.clone()),
        )
        .with_graceful_shutdown(async move {
            let _ = stopped.wait_for(|s| *s).await;
        })
        .into_future(),
    );
    tracing::info!(health = %addr, controller = CONTROLLER_NAME, policy = %config.mirror.policy, elect = config.lease.is_some(), "answering Kueue admission checks");
    let leading = match &config.lease {
        None => Leadership::always(),
        Some(_) => Leadership::default(),
    };
    let election = config.lease.clone().map(|lease| {
        let (client, flag) = (client.clone(), leading.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            leader::run(client, lease, flag, async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await
        })
    });
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            () = wake.notified() => {}
            () = leading.changed() => {}
            () = tokio::time::sleep(config.interval) => {}
        }
        // Changes come in bursts (a list, a job's pods): let them settle.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let r = pass_leading(&client, &mirror, &gate, &objects, &leading).await;
        if r.conflicts > 0 {
            tracing::debug!(conflicts = r.conflicts, "stale workloads re-read");
        }
    }
    let _ = stop_tx.send(true);
    if let Some(e) = election {
        // The leader releases the Lease, so another replica takes over at once.
        if let Ok(Err(err)) = e.await {
            tracing::warn!(error = %err, "releasing the Lease");
        }
    }
    tasks.abort_all();
    match health.await {
        Ok(r) => r.map_err(KueueError::Health),
        Err(e) => Err(KueueError::Health(std::io::Error::other(e))),
    }
}
